//! What the controller sees each period: per managed cgroup (CPU time and memory per node,
//! migration and remote-access evidence, current cpuset, admission constraints) and per node
//! (CPU busy, free memory and hugepages). Plain data, filled by the sampler / cgroup readers and
//! by hand in tests; nothing here does I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

/// Admission constraints of one workload, kept with it for its whole life so a later move never
/// breaks what admission promised. The admission code fills it; the default is "anything goes".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Constraints {
    /// Nodes the workload may use at all (policy, device affinity); `None` = every node.
    pub allowed_nodes: Option<CpuSet>,
    /// Guaranteed container with exclusive CPUs: `exclusive_cpus` CPUs, moved as whole cores
    /// and only when `controller.move_exclusive` is set.
    pub exclusive: bool,
    /// Number of exclusive CPUs (0 = keep the current count).
    pub exclusive_cpus: u32,
    /// Uses hugepages: a target must have free hugepages for what would migrate.
    pub needs_hugepages: bool,
    /// Topology policy single-numa-node: a target is always exactly one node.
    pub single_numa_node: bool,
    /// At most this many nodes (`None` = no limit besides what the workload needs).
    pub max_nodes: Option<u32>,
    /// Pinned by the operator (or adopted from an external writer): never moved.
    pub pinned: bool,
    /// The operator owns cpuset.cpus (a cgroup we did not admit): only its memory moves (to
    /// `allowed_nodes`, where its threads may run); its CPUs are never narrowed or widened, so
    /// a thread's later sched_setaffinity to any CPU of the cgroup keeps working.
    #[serde(default)]
    pub keep_cpus: bool,
    /// A move of this cgroup is still being applied (its migration runs on a writer thread):
    /// it is not planned again until that move is done.
    #[serde(default)]
    pub moving: bool,
}

/// One managed cgroup's measurements over the last period.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupObs {
    /// The cgroup's path relative to the hierarchy root; its identity everywhere.
    pub id: String,
    /// On-CPU nanoseconds per node during the period (eBPF deltas).
    pub cpu_ns_per_node: BTreeMap<u32, u64>,
    /// Resident memory per node (memory.numa_stat anon + file), bytes.
    pub mem_bytes_per_node: BTreeMap<u32, u64>,
    /// Hugetlb memory per node, bytes (separate: it needs free hugepages on the target).
    pub hugepage_bytes_per_node: BTreeMap<u32, u64>,
    /// Scheduler migrations across nodes during the period.
    pub cross_node_migrations: u64,
    /// NUMA-balancing task moves/swaps during the period.
    pub numa_moves: u64,
    /// NUMA hinting faults on remote / local pages, when the kernel lets us count them.
    pub remote_faults: Option<u64>,
    pub local_faults: Option<u64>,
    /// PMU remote / local DRAM access samples, where the hardware has such events.
    pub remote_events: Option<u64>,
    pub local_events: Option<u64>,
    /// Bytes written per node of the page since the cgroup's last visit by the soft-dirty
    /// source (one period, or a pass over many cgroups: see `crate::written`); empty when not
    /// measured this period.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub written_bytes_per_node: BTreeMap<u32, u64>,
    /// Nanoseconds its tasks waited on each node's run queues during the period, where this
    /// cgroup's own wait was measured (the daemon: `crate::runwait`, its threads' run delays
    /// split over the nodes it ran on; the simulator knows it); empty where not measured. With it, what the workload wants is exact
    /// ([`Observations::wanted_exact`]); without, it is estimated from its node's queue.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub wait_ns_per_node: BTreeMap<u32, u64>,
    /// Current cpuset.cpus / cpuset.mems.
    pub cpus: CpuSet,
    pub mems: CpuSet,
    pub constraints: Constraints,
    /// Its threads moved themselves to another node since the last window
    /// ([`CgroupObs::follow_recent`]): `cpu_ns_per_node` is where they run now, and its score
    /// restarts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shifted: bool,
}

impl CgroupObs {
    pub fn total_cpu_ns(&self) -> u64 {
        self.cpu_ns_per_node
            .values()
            .fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Memory (normal + hugepages) on `node`, bytes.
    pub fn mem_on(&self, node: u32) -> u64 {
        self.mem_bytes_per_node
            .get(&node)
            .copied()
            .unwrap_or(0)
            .saturating_add(
                self.hugepage_bytes_per_node
                    .get(&node)
                    .copied()
                    .unwrap_or(0),
            )
    }

    /// All memory (normal + hugepages), bytes.
    pub fn total_mem(&self) -> u64 {
        self.mem_bytes_per_node
            .values()
            .chain(self.hugepage_bytes_per_node.values())
            .fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// CPU time where its threads may run now: the period's time on nodes outside `runnable`
    /// (the nodes of its cpuset) was spent before an operator's re-pin or a move, and says
    /// nothing about where the
    /// workload runs from now on. That time is counted on `runnable` instead, in proportion to
    /// the time already there (evenly when none was), so the first round after a re-pin sees
    /// the workload where it now runs instead of waiting a period for its CPU time to follow.
    /// The total is kept (the workload's demand did not change). Returns whether anything was
    /// moved. An empty `runnable` (nothing known) changes nothing.
    pub fn project_cpu_to(&mut self, runnable: &CpuSet) -> bool {
        if runnable.is_empty() {
            return false;
        }
        let stale: u64 = self
            .cpu_ns_per_node
            .iter()
            .filter(|(n, _)| !runnable.contains(**n))
            .fold(0u64, |a, (_, &v)| a.saturating_add(v));
        if stale == 0 {
            return false;
        }
        self.cpu_ns_per_node.retain(|n, _| runnable.contains(*n));
        let here: u64 = self
            .cpu_ns_per_node
            .values()
            .fold(0u64, |a, &v| a.saturating_add(v));
        // Shares of `stale` per runnable node; the remainder of the integer split goes to the
        // first ones, so the total is exact.
        let weights: Vec<(u32, u64)> = if here > 0 {
            self.cpu_ns_per_node.iter().map(|(&n, &v)| (n, v)).collect()
        } else {
            runnable.iter().map(|n| (n, 1)).collect()
        };
        for (n, s) in split(stale, &weights) {
            let e = self.cpu_ns_per_node.entry(n).or_default();
            *e = e.saturating_add(s);
        }
        true
    }

    /// CPU time where it runs now, when its threads moved themselves (or were moved) to
    /// another node since the last window: `before` is its CPU time per node in the last
    /// round's window (as that round counted it), `recent` its latest (the part of this window
    /// after a mark taken between the rounds, see `rounds`, or the whole window). When
    /// it had settled on one node before (at least [`SHIFT_SETTLED`] of at least
    /// [`SHIFT_MIN_BEFORE_NS`] of CPU time there), runs mostly elsewhere now (its largest share
    /// is on another node, of at least [`SHIFT_MIN_CPU_NS`]: a few samples cannot say) and
    /// more than [`SHIFT_SHARE`] of its time moved between the two (the total variation
    /// distance of the distributions over nodes), the window's CPU time is counted in
    /// `recent`'s proportions (the total is kept) and `shifted` is set: its score restarts
    /// ([`super::CgroupState`]), as an operator's re-pin restarts it, so the round that sees
    /// the move acts on it instead of averaging it with the placement it left. Returns whether
    /// it did.
    ///
    /// Against the last window, not the earlier part of this one: for a workload settled
    /// wholly on one node, a move in the first three quarters of a window is seen in that
    /// window's part after a halfway mark, a later one in the next window, all on the new node,
    /// against that one, still mostly where it was. (One settled less wholly can be missed in
    /// both when it moves near the mark.) A workload with no last window that said where it
    /// ran (idle until now, or new: from its second round, the first to have a mark of it)
    /// is compared with the part of this window before the mark instead, once, while its
    /// score is young (`rounds`, [`ShiftGuard::FRESH`]: a fresh workload that spreads
    /// after the mark can be said to move, its window then counted as it runs now). A
    /// workload spread over nodes (no node with
    /// [`SHIFT_SETTLED`] of its time) is not said to have moved by a few recent samples that
    /// all fell on one of its nodes; it is only when its last window happened to show
    /// [`SHIFT_SETTLED`] on one node (see [`SHIFT_MIN_BEFORE_NS`]).
    pub fn follow_recent(
        &mut self,
        before: &BTreeMap<u32, u64>,
        recent: &BTreeMap<u32, u64>,
    ) -> bool {
        self.follow(before, recent, ShiftGuard::REFERENCE)
    }

    /// [`CgroupObs::follow_recent`] with the tests `guard` says ([`ShiftGuard::FRESH`] for a
    /// workload with no last window).
    pub fn follow(
        &mut self,
        before: &BTreeMap<u32, u64>,
        recent: &BTreeMap<u32, u64>,
        guard: ShiftGuard,
    ) -> bool {
        let sum = |m: &BTreeMap<u32, u64>| m.values().fold(0u64, |a, &b| a.saturating_add(b));
        let (b, r) = (sum(before), sum(recent));
        if b < guard.min_before_ns || r < guard.min_recent_ns {
            return false;
        }
        // The node with the most time (the lowest id of equals).
        let top = |m: &BTreeMap<u32, u64>| {
            m.iter()
                .max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0)))
                .map(|(&n, &v)| (n, v))
        };
        let (Some((home, at_home)), Some((now, _))) = (top(before), top(recent)) else {
            return false;
        };
        if now == home || (at_home as f64) < guard.settled * b as f64 {
            return false;
        }
        let share = |m: &BTreeMap<u32, u64>, n: &u32, t: u64| {
            m.get(n).copied().unwrap_or(0) as f64 / t as f64
        };
        let moved: f64 = recent
            .keys()
            .map(|n| (share(recent, n, r) - share(before, n, b)).max(0.0))
            .sum();
        if moved <= SHIFT_SHARE {
            return false;
        }
        let weights: Vec<(u32, u64)> = recent
            .iter()
            .filter(|(_, &v)| v > 0)
            .map(|(&n, &v)| (n, v))
            .collect();
        self.cpu_ns_per_node = split(self.total_cpu_ns(), &weights).into_iter().collect();
        self.shifted = true;
        true
    }

    /// Nodes holding any of its memory or running any of its CPU time.
    pub fn touched_nodes(&self) -> CpuSet {
        self.cpu_ns_per_node
            .iter()
            .chain(&self.mem_bytes_per_node)
            .chain(&self.hugepage_bytes_per_node)
            .filter(|(_, &v)| v > 0)
            .map(|(&n, _)| n)
            .collect()
    }
}

/// One node's state over the last period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeObs {
    /// Fraction of the node's CPU time busy, 0..=1.
    pub cpu_busy: f64,
    /// MemFree of the node, bytes.
    pub free_bytes: u64,
    /// Free hugepages of the node (all sizes), bytes.
    pub free_hugepage_bytes: u64,
    /// CPUs' worth of runnable demand per CPU of the node (running + waiting on the run
    /// queue), ≥ `cpu_busy`; above 1 the node's tasks wait for a CPU. `None`: not measured
    /// (the planner then takes `cpu_busy`). The simulator measures it; the daemon reads it from
    /// the run-queue lengths its eBPF cpu-clock samples read (`ebpf::runq`), where they run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runnable: Option<f64>,
}

/// Below this busy share a node's run queue is too thin to scale demand by (noise).
const MIN_STRETCH_BUSY: f64 = 0.05;

impl NodeObs {
    /// How many times the CPU time its tasks received they wanted to run: runnable / busy
    /// where the run queue was measured (tasks waiting behind the running ones), within
    /// 1..=64; 1 where it was not, or where the node is nearly idle. The kernel reports CPU
    /// time received, the run queue counts the waiting too: this puts both in one unit.
    pub fn wait_stretch(&self) -> f64 {
        let b = self.busy();
        if !self.runnable_measured() || b < MIN_STRETCH_BUSY {
            return 1.0;
        }
        (self.pressure() / b).clamp(1.0, 64.0)
    }

    /// The busy share, sane: within 0..=1, and 1 (full) when not a number.
    pub fn busy(&self) -> f64 {
        if self.cpu_busy.is_finite() {
            self.cpu_busy.clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    /// Whether the run queue was measured: a finite, non-negative `runnable` (anything else
    /// reads as not measured, and [`NodeObs::pressure`] falls back to the busy share).
    pub fn runnable_measured(&self) -> bool {
        self.runnable.is_some_and(|r| r.is_finite() && r >= 0.0)
    }

    /// Runnable demand per CPU where measured (at least the busy share, at most 64), else the
    /// busy share.
    pub fn pressure(&self) -> f64 {
        let b = self.busy();
        self.runnable
            .filter(|r| r.is_finite() && *r >= 0.0)
            .map_or(b, |r| r.clamp(b, 64.0))
    }
}

/// Everything observed in one period.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observations {
    /// Length of the period the deltas cover, ns (CPU demand = on-CPU ns / period).
    pub period_ns: u64,
    /// Managed cgroups; order does not matter (the planner sorts by id).
    pub cgroups: Vec<CgroupObs>,
    /// Per node, keyed by node id; a node missing here is treated as full and idle-unknown.
    pub nodes: BTreeMap<u32, NodeObs>,
    /// CPUs never handed to workloads.
    pub reserved_cpus: CpuSet,
}

impl Observations {
    /// CPU demand of a cgroup in CPUs (1.0 = one CPU fully busy): the CPU time it received.
    pub fn cpu_demand(&self, cg: &CgroupObs) -> f64 {
        if self.period_ns == 0 {
            return 0.0;
        }
        cg.total_cpu_ns() as f64 / self.period_ns as f64
    }

    /// CPUs' worth of run-queue demand `cg` puts on `node`: the CPU time it received there plus
    /// the time its tasks waited, where its own wait was measured; else the time received
    /// times how much more its node's tasks wanted on average ([`NodeObs::wait_stretch`]). On
    /// a node whose queue holds twice its CPUs a task gets half the time it wants, so taking
    /// the workload off frees twice what it ran, and it asks as much of the node it joins. The
    /// average misjudges a workload whose share differs from its node's (cgroups share by
    /// weight, not by thread): only [`Observations::wanted_exact`] figures may decide a move
    /// into a queue.
    pub fn wanted_on(&self, cg: &CgroupObs, node: u32) -> f64 {
        if self.period_ns == 0 {
            return 0.0;
        }
        let ns = cg.cpu_ns_per_node.get(&node).copied().unwrap_or(0) as f64;
        if self.wanted_exact(cg) {
            let wait = cg.wait_ns_per_node.get(&node).copied().unwrap_or(0) as f64;
            return (ns + wait) / self.period_ns as f64;
        }
        ns / self.period_ns as f64 * self.nodes.get(&node).map_or(1.0, NodeObs::wait_stretch)
    }

    /// Whether `cg`'s own wait on the run queues was measured (`CgroupObs::wait_ns_per_node`),
    /// so [`Observations::wanted_on`] is what it wants, not an estimate from its node.
    pub fn wanted_exact(&self, cg: &CgroupObs) -> bool {
        !cg.wait_ns_per_node.is_empty()
    }

    /// [`Observations::wanted_on`] summed over the nodes `cg` ran on.
    pub fn wanted_demand(&self, cg: &CgroupObs) -> f64 {
        cg.cpu_ns_per_node
            .keys()
            .map(|&n| self.wanted_on(cg, n))
            .sum()
    }
}

/// Share of a cgroup's CPU time that must be exceeded by what moved to other nodes between
/// the last window and the latest part of this one for [`CgroupObs::follow_recent`] to follow it.
pub const SHIFT_SHARE: f64 = 0.5;

/// Share of the last window's CPU time a cgroup must have had on one node to be said to have
/// moved from it ([`CgroupObs::follow_recent`]). 0.7, not more: a move at 70 % of a window
/// leaves 70 % of it on the old node, and the next window (all on the new one) is compared with
/// it; a move earlier in a window is seen in that window's latest part.
pub const SHIFT_SETTLED: f64 = 0.7;

/// CPU time the latest part of a window needs before [`CgroupObs::follow_recent`] reads it (5
/// samples at the default 99 Hz: a busy thread given half a CPU over an event's 200 ms settle
/// delay has them).
pub const SHIFT_MIN_CPU_NS: u64 = 50_000_000;

/// CPU time the last window needs to say where a cgroup had settled (50 samples at 99 Hz: a
/// workload spread evenly over two nodes shows 70 % on one in about one such window of 150,
/// and far less with more samples; a busy thread has it in a fifth of the default period).
pub const SHIFT_MIN_BEFORE_NS: u64 = 500_000_000;

/// A cgroup whose score has folded this many periods is not fresh (its history, restored at
/// a restart or built since, is not risked on [`ShiftGuard::FRESH`]'s fewer samples).
pub const FRESH_MAX_PERIODS: u64 = 8;

/// What [`CgroupObs::follow`] asks of the readings it compares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShiftGuard {
    /// CPU time the earlier reading needs.
    pub min_before_ns: u64,
    /// Share of it one node must hold (the node it is said to have moved from).
    pub settled: f64,
    /// CPU time the latest reading needs.
    pub min_recent_ns: u64,
}

impl ShiftGuard {
    /// Against the last window that said where it ran: a workload with a history, whose
    /// score a few samples must not restart.
    pub const REFERENCE: ShiftGuard = ShiftGuard {
        min_before_ns: SHIFT_MIN_BEFORE_NS,
        settled: SHIFT_SETTLED,
        min_recent_ns: SHIFT_MIN_CPU_NS,
    };
    /// Against the part of this window before the mark, for a workload with no last window
    /// (a fresh one: it touched its memory, then moved itself, often before it had 500 ms on
    /// any node, and partly already on the new one; in the guest benchmark, 0.44–0.49 s before the
    /// mark, 61–81 % on the first node). Its score has little history to keep, so no node
    /// need have held 70 % before; more samples on both sides instead: 20 before, 15 since
    /// at the default 99 Hz (independent samples of a workload split evenly over two nodes
    /// then pass the > 0.5 moved share with the largest share on another node about once in
    /// 400 tries, over three nodes once in 250, four once in 120; fewer at a lower
    /// `ebpf.sample_hz`). The engine tries it once per cgroup, while its score is young
    /// ([`FRESH_MAX_PERIODS`]): later windows have a reference.
    pub const FRESH: ShiftGuard = ShiftGuard {
        min_before_ns: 200_000_000,
        settled: 0.0,
        min_recent_ns: 150_000_000,
    };
}

/// `total` split in proportion to `weights` (whose sum is not 0); the remainder of the integer
/// split goes to the first ones, so the parts add up to `total` exactly.
fn split(total: u64, weights: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let wsum: u128 = weights.iter().map(|(_, w)| u128::from(*w)).sum();
    if wsum == 0 {
        return Vec::new();
    }
    let mut given = 0u64;
    let mut shares: Vec<(u32, u64)> = weights
        .iter()
        .map(|&(n, w)| {
            let s = (u128::from(total) * u128::from(w) / wsum) as u64;
            given += s;
            (n, s)
        })
        .collect();
    let mut rest = total - given;
    for (_, s) in shares.iter_mut() {
        if rest == 0 {
            break;
        }
        *s += 1;
        rest -= 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cg(cpu: &[(u32, u64)]) -> CgroupObs {
        CgroupObs {
            cpu_ns_per_node: cpu.iter().copied().collect(),
            ..Default::default()
        }
    }

    fn set(ids: &[u32]) -> CpuSet {
        ids.iter().copied().collect()
    }

    /// vm-bench w3: a workload whose threads moved themselves from node 0 to node 1 (no
    /// cpuset change) is seen where it runs now, its whole window's CPU time kept, whether the
    /// move came early in the window (its latest part is elsewhere) or late (the next window
    /// is compared with the last, still mostly on the old node); a workload spread over nodes,
    /// or one with too few samples on either side, is left as the window saw it.
    #[test]
    fn a_workload_that_moved_itself_is_seen_where_it_runs_now() {
        const MS: u64 = 1_000_000;
        let m = |v: &[(u32, u64)]| -> BTreeMap<u32, u64> { v.iter().copied().collect() };
        // Settled on node 0; this window 1.5 s on node 0 and 0.5 s on node 1, of which the
        // 0.2 s after the mark all on node 1.
        let mut c = cg(&[(0, 1500 * MS), (1, 500 * MS)]);
        assert!(c.follow_recent(&m(&[(0, 2000 * MS)]), &m(&[(1, 200 * MS)])));
        assert!(c.shifted);
        assert_eq!(c.cpu_ns_per_node, m(&[(1, 2000 * MS)]), "the total is kept");
        // It moved late in the last window (72 % of it on node 0); this one all on node 1.
        let mut c = cg(&[(1, 2000 * MS)]);
        assert!(c.follow_recent(&m(&[(0, 1440 * MS), (1, 560 * MS)]), &m(&[(1, 2000 * MS)])));
        // Two thirds of its time moved to two other nodes: counted in the recent proportions,
        // the integer split exact.
        let mut c = cg(&[(0, 1001 * MS), (1, 1000 * MS), (2, 1000 * MS)]);
        assert!(c.follow_recent(
            &m(&[(0, 1000 * MS)]),
            &m(&[(0, 100 * MS), (1, 100 * MS), (2, 200 * MS)])
        ));
        assert_eq!(c.total_cpu_ns(), 3001 * MS);
        assert!(c.cpu_ns_per_node[&2].abs_diff(2 * c.cpu_ns_per_node[&1]) <= 2);
        // Its largest share still on the node it settled on: not a move, however much moved.
        let mut c = cg(&[(0, 1000 * MS)]);
        assert!(!c.follow_recent(
            &m(&[(0, 1000 * MS)]),
            &m(&[(0, 400 * MS), (1, 300 * MS), (2, 300 * MS)])
        ));
        // More than half moved is a move; its largest share elsewhere with less than half
        // moved is not (80/20, then 40/60: 40 % moved).
        assert!(c.follow_recent(&m(&[(0, 1000 * MS)]), &m(&[(0, 490 * MS), (1, 510 * MS)])));
        let mut c = cg(&[(0, 1000 * MS)]);
        assert!(!c.follow_recent(
            &m(&[(0, 800 * MS), (1, 200 * MS)]),
            &m(&[(0, 400 * MS), (1, 600 * MS)])
        ));
        // A workload spread over two nodes (no node with 70 % of its time) whose few recent
        // samples all fell on one, or whose shares wobble: not a move.
        let mut c = cg(&[(0, 1200 * MS), (1, 800 * MS)]);
        let before = c.clone();
        assert!(!c.follow_recent(&m(&[(0, 690 * MS), (1, 310 * MS)]), &m(&[(1, 50 * MS)])));
        assert!(!c.follow_recent(
            &m(&[(0, 500 * MS), (1, 500 * MS)]),
            &m(&[(0, 100 * MS), (1, 900 * MS)])
        ));
        assert_eq!(c, before);
        // Settled at 71 %: a move.
        assert!(c
            .clone()
            .follow_recent(&m(&[(0, 710 * MS), (1, 290 * MS)]), &m(&[(1, 50 * MS)])));
        // Too few samples now, or in the last window: nothing is said.
        assert!(!c.follow_recent(&m(&[(0, 1000 * MS)]), &m(&[(1, 49 * MS)])));
        assert!(!c.follow_recent(&m(&[(0, 499 * MS)]), &m(&[(1, 1000 * MS)])));
        assert!(!c.follow_recent(&m(&[]), &m(&[(1, 1000 * MS)])));
        assert_eq!(c, before);
    }

    /// A fresh workload (no last window) compared with the part of its window before the
    /// mark (in the guest benchmark, w3 had 0.3–0.4 s on its first node and some already on the
    /// second before the pins' mark): no settled node needed, more samples on both sides.
    #[test]
    fn a_fresh_workload_that_moved_itself_is_seen_from_fewer_samples() {
        const MS: u64 = 1_000_000;
        let m = |v: &[(u32, u64)]| -> BTreeMap<u32, u64> { v.iter().copied().collect() };
        let fresh = ShiftGuard::FRESH;
        let (before, recent) = (m(&[(0, 283 * MS), (1, 182 * MS)]), m(&[(1, 222 * MS)]));
        let mut c = cg(&[(0, 283 * MS), (1, 404 * MS)]);
        assert!(
            !c.clone().follow_recent(&before, &recent),
            "a reference needs more"
        );
        assert!(c.follow(&before, &recent, fresh));
        assert_eq!(c.cpu_ns_per_node, m(&[(1, 687 * MS)]));
        let mut c = cg(&[(0, 500 * MS), (1, 500 * MS)]);
        let was = c.clone();
        // Too few samples on either side.
        assert!(!c.follow(&m(&[(0, 199 * MS)]), &m(&[(1, 500 * MS)]), fresh));
        assert!(!c.follow(&m(&[(0, 300 * MS)]), &m(&[(1, 149 * MS)]), fresh));
        // A spread workload's wobble: its largest share elsewhere, half or less moved.
        assert!(!c.follow(
            &m(&[(0, 300 * MS), (1, 200 * MS)]),
            &m(&[(0, 60 * MS), (1, 90 * MS)]),
            fresh
        ));
        assert!(!c.follow(
            &m(&[(0, 250 * MS), (1, 250 * MS)]),
            &m(&[(1, 150 * MS)]),
            fresh
        ));
        assert_eq!(c, was);
    }

    #[test]
    fn cpu_time_outside_where_threads_may_run_is_counted_where_they_may() {
        // Re-pinned from node 1 to node 0: all its time counts on node 0.
        let mut c = cg(&[(1, 900), (0, 100)]);
        assert!(c.project_cpu_to(&set(&[0])));
        assert_eq!(c.cpu_ns_per_node, [(0, 1000)].into_iter().collect());
        // Moved to nodes 2 and 3 where it has not run yet: evenly, the total exact.
        let mut c = cg(&[(1, 1001)]);
        assert!(c.project_cpu_to(&set(&[2, 3])));
        assert_eq!(
            c.cpu_ns_per_node,
            [(2, 501), (3, 500)].into_iter().collect()
        );
        // Some time already on the runnable nodes: in proportion to it.
        let mut c = cg(&[(0, 300), (1, 100), (2, 400)]);
        assert!(c.project_cpu_to(&set(&[0, 1])));
        assert_eq!(
            c.cpu_ns_per_node,
            [(0, 600), (1, 200)].into_iter().collect()
        );
        // Nothing stale, or nothing known: unchanged.
        let mut c = cg(&[(0, 300), (1, 100)]);
        assert!(!c.project_cpu_to(&set(&[0, 1, 2])));
        assert!(!c.project_cpu_to(&CpuSet::new()));
        assert_eq!(
            c.cpu_ns_per_node,
            [(0, 300), (1, 100)].into_iter().collect()
        );
        // Large values do not overflow the split.
        let mut c = cg(&[(0, u64::MAX / 2), (1, u64::MAX / 2)]);
        assert!(c.project_cpu_to(&set(&[0])));
        assert_eq!(c.total_cpu_ns(), u64::MAX / 2 * 2);
    }

    /// A workload re-pinned away from its memory scores as remote in the first round after
    /// the pin, not one period later.
    #[test]
    fn a_re_pinned_workload_scores_remote_at_once() {
        let mut c = cg(&[(1, 950), (0, 50)]);
        c.mem_bytes_per_node = [(1, 1 << 30)].into_iter().collect();
        let before = crate::controller::locality::instant(&c).unwrap().0;
        assert!(before > 0.9, "{before}");
        c.project_cpu_to(&set(&[0]));
        let after = crate::controller::locality::instant(&c).unwrap().0;
        assert!(after < 0.01, "{after}");
    }
}

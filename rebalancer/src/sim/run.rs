//! The discrete-time simulation: one run of a workload under one policy.
//!
//! Each step (1 s by default): departures are released from the real [`Allocator`], arrivals
//! are admitted by it (refusals counted), phases advance, the policy acts before the kernel
//! (the oracle re-places), then the kernel model runs — threads spread over the cpuset's
//! nodes weighted by how loaded each node was, new pages land by first touch on the nodes the
//! threads run on, bounded by mems and free memory — the cost model measures the step, and the
//! policy acts after it (AutoNUMA-like migration; the real planner every controller period, its
//! moves applied to cpus/mems with the memory outside the new mems migrated).

use std::collections::BTreeMap;

use serde::Serialize;

use super::baselines;
use super::model::{self, CostModel, Pair};
use super::workload::{Task, Workload};
use crate::config::{ControllerConfig, PlacementConfig, TopologyPolicy};
use crate::controller::{Constraints, ControllerState};
use crate::cpuset::CpuSet;
use crate::placement::admission::{AdmittedContainer, Allocator, Overuse};
use crate::topology::Topology;

/// Everything a run needs besides the trace and the machine.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub step_ms: u64,
    pub model: CostModel,
    pub placement: PlacementConfig,
    pub controller: ControllerConfig,
    /// Points of the remote-fraction timeline.
    pub timeline_points: usize,
    /// Diagnostics: record every move the Rebalancer makes in `PolicyReport::move_log`.
    pub log_moves: bool,
    /// Diagnostics (a counterfactual): workloads the Rebalancer's planner sees as pinned, so
    /// it never moves them — the run "as if these had not been moved".
    pub frozen: std::collections::BTreeSet<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            step_ms: 1000,
            model: CostModel::default(),
            placement: PlacementConfig::default(),
            controller: ControllerConfig::default(),
            timeline_points: 10,
            log_moves: false,
            frozen: Default::default(),
        }
    }
}

/// What drives placement after admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SimPolicy {
    /// kubelet-like: Guaranteed integer-CPU containers get exclusive CPUs from the real
    /// allocator, every other container the whole shared pool and every node's memory.
    Kubelet,
    /// kubelet-like placement with AutoNUMA-like balancing: threads lean toward the node with
    /// most of their memory, pages follow threads at a fixed rate.
    Autonuma,
    /// The rebalancer's admission only (NUMA-aware shared pools), no dynamic control.
    Static,
    /// Admission, then the real planner every controller period.
    Rebalancer,
    /// Clairvoyant greedy placement at every arrival, departure and phase change.
    Oracle,
}

/// Results of one policy's run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyReport {
    pub policy: SimPolicy,
    /// Share of memory accesses that were local, over the whole run.
    pub mean_locality: f64,
    /// Remote-access fraction per equal slice of the run.
    pub remote_timeline: Vec<f64>,
    /// Work-weighted slowdown vs all-local, uncontended (1.0), migration CPU time included.
    pub slowdown: f64,
    pub bytes_migrated: u64,
    /// 4 KiB-page equivalents of `bytes_migrated`.
    pub pages_migrated: u64,
    pub migration_cpu_s: f64,
    pub moves: u64,
    /// Cross-node scheduler migrations of all workloads (their CPU time is in `slowdown`).
    #[serde(default)]
    pub cross_node_migrations: u64,
    /// Of `moves`, the page-moving rounds of staged moves (see `controller::Stage`).
    #[serde(default)]
    pub staged_rounds: u64,
    /// Moves back to the mems the cgroup had before its previous move.
    pub move_reversals: u64,
    pub admitted: u64,
    pub rejections: u64,
    pub planner_rounds: u64,
    /// Candidate decisions the planner skipped, by reason, summed over rounds.
    pub planner_skips: BTreeMap<String, u64>,
    /// Moves the simulator refused (empty cpuset, reserved or unknown CPUs): should be 0.
    pub invariant_violations: u64,
    /// Every move made, with what the planner priced (`SimConfig::log_moves` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub move_log: Vec<MoveRecord>,
}

/// One move of the Rebalancer as the planner priced it, with what the trace knows it would
/// not: how long the workload had left to live (diagnostics, `SimConfig::log_moves`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MoveRecord {
    pub t_s: f64,
    pub cgroup: String,
    pub trigger: String,
    pub from_mems: String,
    pub to_mems: String,
    pub staged: bool,
    pub bytes: u64,
    /// The workload's age at the move and the rest of its life (`None`: to the end of the run).
    pub age_s: f64,
    pub left_s: Option<f64>,
    /// The chosen option's figures (`None` for a continued stage, which is not re-priced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priced: Option<crate::controller::Considered>,
    /// First-order realized contention saving, CPU-s, over the planner's horizon (or the
    /// workload's life): at every step after the move, the CPU time every task loses to
    /// contention (Σ D × max(1, D / C)) had this workload's demand stayed spread as before the
    /// move, less as it is — the rest of the trajectory held as it was.
    pub realized_relief: f64,
}

/// One live workload in the simulated machine.
#[derive(Clone, Debug)]
pub(super) struct Live {
    pub task: usize,
    pub cpus: CpuSet,
    pub mems: CpuSet,
    /// Bytes resident per node.
    pub mem: BTreeMap<u32, u64>,
    pub pending_initial: u64,
    /// Thread share per node this step.
    pub threads: BTreeMap<u32, f64>,
    pub constraints: Constraints,
    pub device_node: Option<u32>,
    pub phase: usize,
    /// CPU ns per node since the last planner round.
    pub cpu_ns_acc: BTreeMap<u32, u64>,
    /// Ns its threads waited on each node's run queue since the last planner round.
    pub wait_ns_acc: BTreeMap<u32, u64>,
    /// Cross-node scheduler migrations since the last planner round.
    pub migrations_acc: f64,
    /// mems before the last move (to count reversals).
    pub prev_mems: Option<CpuSet>,
}

impl Live {
    pub fn total_mem(&self) -> u64 {
        self.mem.values().sum()
    }
}

/// The simulated machine and everything that changes during a run.
pub(super) struct World<'a> {
    pub topo: &'a Topology,
    pub trace: &'a Workload,
    pub cfg: &'a SimConfig,
    pub ncpus: BTreeMap<u32, usize>,
    pub mem_cap: BTreeMap<u32, u64>,
    pub huge_cap: BTreeMap<u32, u64>,
    pub alloc: Allocator,
    pub live: BTreeMap<String, Live>,
    /// CPUs wanted per node in the previous step.
    pub demand: BTreeMap<u32, f64>,
    pub busy_acc: BTreeMap<u32, f64>,
    /// Runnable demand per CPU (unclamped: above 1 the node's threads wait), summed over the
    /// steps since the last planner round.
    pub runnable_acc: BTreeMap<u32, f64>,
    pub acc_steps: u64,
    pub state: ControllerState,
    /// What the last planner round measured beyond the books (`Allocator::overuse`), which
    /// orders the shared pools admission chooses between, as in the daemon. Only the
    /// Rebalancer measures: under the other policies it stays empty (requests only).
    pub overuse: Overuse,
    pub stats: Stats,
    /// Shared containers get the whole shared pool (kubelet-like policies).
    pub kubelet_like: bool,
    /// Kernel NUMA balancing on (task placement toward memory, pages toward threads).
    pub autonuma: bool,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Stats {
    pub work: f64,
    pub weighted_slowdown: f64,
    pub access: f64,
    pub local: f64,
    pub slices: Vec<(f64, f64)>,
    pub bytes_migrated: u64,
    pub cross_node_migrations: f64,
    pub moves: u64,
    pub staged: u64,
    pub reversals: u64,
    pub admitted: u64,
    pub rejections: u64,
    pub planner_rounds: u64,
    pub skips: BTreeMap<String, u64>,
    pub violations: u64,
    pub move_log: Vec<MoveRecord>,
    /// Moves whose realized relief is being counted: log index, thread shares before, until.
    pub tracking: Vec<(usize, BTreeMap<u32, f64>, u64)>,
}

fn hugepage_bytes(node: &crate::topology::Node) -> u64 {
    node.hugepages
        .iter()
        .map(|(size, h)| {
            let kb: u64 = size.trim_end_matches("kB").parse().unwrap_or(0);
            kb * 1024 * h.total
        })
        .sum()
}

impl<'a> World<'a> {
    fn new(
        topo: &'a Topology,
        trace: &'a Workload,
        cfg: &'a SimConfig,
        policy: SimPolicy,
    ) -> Result<World<'a>, crate::placement::admission::PlacementError> {
        Ok(World {
            kubelet_like: matches!(policy, SimPolicy::Kubelet | SimPolicy::Autonuma),
            autonuma: policy == SimPolicy::Autonuma,
            topo,
            trace,
            cfg,
            ncpus: topo.nodes.iter().map(|n| (n.id, n.cpus.len())).collect(),
            mem_cap: topo
                .nodes
                .iter()
                .map(|n| (n.id, n.memory_free_bytes))
                .collect(),
            huge_cap: topo
                .nodes
                .iter()
                .map(|n| (n.id, hugepage_bytes(n)))
                .collect(),
            alloc: Allocator::new(topo, &cfg.placement)?,
            live: BTreeMap::new(),
            demand: BTreeMap::new(),
            busy_acc: BTreeMap::new(),
            runnable_acc: BTreeMap::new(),
            acc_steps: 0,
            state: ControllerState::default(),
            overuse: Overuse::default(),
            stats: Stats {
                slices: vec![(0.0, 0.0); cfg.timeline_points.max(1)],
                ..Default::default()
            },
        })
    }

    pub fn task(&self, l: &Live) -> &'a Task {
        &self.trace.tasks[l.task]
    }

    /// CPUs the workload can use now: its phase's demand, at most its cpuset.
    pub fn demand_of(&self, l: &Live) -> f64 {
        self.task(l).phases[l.phase].cpus.min(l.cpus.len() as f64)
    }

    /// Bytes in use per node by normal (or hugetlb) memory.
    pub fn used(&self, huge: bool) -> BTreeMap<u32, u64> {
        let mut u: BTreeMap<u32, u64> = BTreeMap::new();
        for l in self.live.values() {
            if self.task(l).hugepages == huge {
                for (&n, &b) in &l.mem {
                    *u.entry(n).or_default() += b;
                }
            }
        }
        u
    }

    pub fn free(&self, huge: bool) -> BTreeMap<u32, u64> {
        let used = self.used(huge);
        let cap = if huge { &self.huge_cap } else { &self.mem_cap };
        cap.iter()
            .map(|(&n, &c)| (n, c.saturating_sub(used.get(&n).copied().unwrap_or(0))))
            .collect()
    }

    /// Thread share per node for `cpus`: CPUs on the node, divided by 1 + how loaded the node
    /// was last step (the scheduler's load balancing pulls threads toward idle nodes).
    pub fn threads_for(&self, cpus: &CpuSet, exclusive: bool) -> BTreeMap<u32, f64> {
        self.threads_pref(cpus, exclusive, None)
    }

    /// As [`World::threads_for`], with a NUMA-balancing preferred node weighted ×8 (the kernel's
    /// task placement pulls a task toward the node holding most of its memory).
    pub fn threads_pref(
        &self,
        cpus: &CpuSet,
        exclusive: bool,
        preferred: Option<u32>,
    ) -> BTreeMap<u32, f64> {
        let mut w: BTreeMap<u32, f64> = BTreeMap::new();
        for cpu in cpus.iter() {
            if let Some(n) = self.topo.node_of_cpu(cpu) {
                *w.entry(n).or_default() += 1.0;
            }
        }
        if !exclusive {
            for (n, x) in w.iter_mut() {
                let load = self.demand.get(n).copied().unwrap_or(0.0)
                    / self.ncpus.get(n).copied().unwrap_or(1).max(1) as f64;
                *x /= 1.0 + load;
            }
        }
        if let Some(x) = preferred.and_then(|p| w.get_mut(&p)) {
            *x *= 8.0;
        }
        normalise(w)
    }

    /// Nearest node of `set` to `from` (distance, then id).
    fn nearest_in(&self, from: u32, set: &CpuSet) -> Option<u32> {
        set.iter().min_by_key(|&m| (self.topo.distance(from, m), m))
    }

    /// First touch: `bytes` land where the threads run, mapped into mems, bounded by free
    /// memory (overflow to the mems node with most room). Returns bytes placed.
    pub fn touch(&mut self, uid: &str, bytes: u64) -> u64 {
        let Some(l) = self.live.get(uid) else {
            return 0;
        };
        let huge = self.task(l).hugepages;
        let mut target: BTreeMap<u32, f64> = BTreeMap::new();
        for (&n, &s) in &l.threads {
            if let Some(m) = self.nearest_in(n, &l.mems) {
                *target.entry(m).or_default() += s;
            }
        }
        let target = normalise(target);
        let mems = l.mems.clone();
        let mut free = self.free(huge);
        let mut placed: BTreeMap<u32, u64> = BTreeMap::new();
        let mut left = bytes;
        for (&n, &s) in &target {
            let want = ((bytes as f64 * s) as u64).min(left);
            let f = free.entry(n).or_default();
            let got = want.min(*f);
            *f -= got;
            left -= got;
            *placed.entry(n).or_default() += got;
        }
        while left > 0 {
            let Some((n, f)) = mems
                .iter()
                .map(|n| (n, free.get(&n).copied().unwrap_or(0)))
                .filter(|&(_, f)| f > 0)
                .max_by_key(|&(n, f)| (f, std::cmp::Reverse(n)))
            else {
                break;
            };
            let got = left.min(f);
            free.insert(n, f - got);
            left -= got;
            *placed.entry(n).or_default() += got;
        }
        let l = self.live.get_mut(uid).expect("checked above");
        for (n, b) in placed {
            *l.mem.entry(n).or_default() += b;
        }
        bytes - left
    }

    /// Moves memory of `uid` from nodes outside `keep` into `keep`, by `shares` (renormalised
    /// over `keep`), bounded by free memory. Returns bytes moved.
    pub fn evacuate(&mut self, uid: &str, keep: &CpuSet, shares: &BTreeMap<u32, f64>) -> u64 {
        self.evacuate_upto(uid, keep, shares, u64::MAX)
    }

    /// Like [`World::evacuate`], moving at most `limit` bytes (a staged move's round).
    pub fn evacuate_upto(
        &mut self,
        uid: &str,
        keep: &CpuSet,
        shares: &BTreeMap<u32, f64>,
        limit: u64,
    ) -> u64 {
        let Some(l) = self.live.get(uid) else {
            return 0;
        };
        let huge = self.task(l).hugepages;
        let outside: u64 = l
            .mem
            .iter()
            .filter(|(n, _)| !keep.contains(**n))
            .map(|(_, b)| b)
            .sum::<u64>()
            .min(limit);
        if outside == 0 {
            return 0;
        }
        let mut to: BTreeMap<u32, f64> = keep
            .iter()
            .map(|n| (n, shares.get(&n).copied().unwrap_or(0.0)))
            .collect();
        if to.values().sum::<f64>() <= 0.0 {
            to = keep.iter().map(|n| (n, 1.0)).collect();
        }
        let dest = self.spread(&normalise(to), outside, huge);
        let moved: u64 = dest.values().sum();
        let l = self.live.get_mut(uid).expect("checked above");
        take_from(&mut l.mem, |n| !keep.contains(n), moved);
        for (n, b) in dest {
            *l.mem.entry(n).or_default() += b;
        }
        moved
    }

    /// Splits `bytes` over `shares` within free memory.
    pub fn spread(
        &self,
        shares: &BTreeMap<u32, f64>,
        bytes: u64,
        huge: bool,
    ) -> BTreeMap<u32, u64> {
        let free = self.free(huge);
        shares
            .iter()
            .map(|(&n, &s)| {
                let want = (bytes as f64 * s) as u64;
                (n, want.min(free.get(&n).copied().unwrap_or(0)))
            })
            .filter(|&(_, b)| b > 0)
            .collect()
    }

    pub fn count_migration(&mut self, bytes: u64) {
        self.stats.bytes_migrated = self.stats.bytes_migrated.saturating_add(bytes);
    }

    /// Constraints admission promised (the daemon engine's mapping, for a simulated binding).
    fn constraints(&self, ac: &AdmittedContainer) -> Constraints {
        let p = &ac.placement;
        let mut c = Constraints {
            exclusive: p.exclusive,
            exclusive_cpus: if p.exclusive { p.cpus.len() as u32 } else { 0 },
            needs_hugepages: ac.memory.is_some(),
            ..Default::default()
        };
        match self.cfg.placement.policy {
            TopologyPolicy::SingleNumaNode => c.single_numa_node = true,
            TopologyPolicy::Restricted => c.allowed_nodes = p.affinity.map(|m| m.to_cpuset()),
            _ => {}
        }
        if !p.devices.is_empty() {
            c.allowed_nodes = p.affinity.map(|m| m.to_cpuset());
        }
        c
    }

    fn depart(&mut self, t: u64) -> bool {
        let gone: Vec<String> = self
            .live
            .iter()
            .filter(|(_, l)| self.task(l).leave_s.is_some_and(|x| x <= t))
            .map(|(u, _)| u.clone())
            .collect();
        for u in &gone {
            self.live.remove(u);
            self.alloc.release(u);
        }
        !gone.is_empty()
    }

    fn arrive(&mut self, t: u64, step_s: u64) -> bool {
        let mut any = false;
        for (i, task) in self.trace.tasks.iter().enumerate() {
            if task.arrive_s < t || task.arrive_s >= t + step_s {
                continue;
            }
            match self
                .alloc
                .admit_seeing(self.topo, &self.cfg.placement, &task.pod, &self.overuse)
            {
                Ok(placements) => {
                    let ac = &self.alloc.pods[task.uid()].containers[0];
                    let p = &placements[0];
                    let device_node = p
                        .devices
                        .iter()
                        .filter_map(|a| self.topo.devices.iter().find(|d| &d.address == a))
                        .find_map(|d| d.node);
                    let (cpus, mems) = if self.kubelet_like && !p.exclusive {
                        (self.shared_pool(), self.topo.node_ids().collect())
                    } else {
                        let cpus = self.alloc.current_cpus(task.uid(), &p.container);
                        (cpus.unwrap_or_else(|| p.cpus.clone()), p.mems.clone())
                    };
                    let live = Live {
                        task: i,
                        cpus,
                        mems,
                        mem: BTreeMap::new(),
                        pending_initial: task.initial_mem_bytes,
                        threads: BTreeMap::new(),
                        constraints: self.constraints(ac),
                        device_node,
                        phase: 0,
                        cpu_ns_acc: BTreeMap::new(),
                        wait_ns_acc: BTreeMap::new(),
                        migrations_acc: 0.0,
                        prev_mems: None,
                    };
                    self.live.insert(task.uid().to_string(), live);
                    self.stats.admitted += 1;
                    any = true;
                }
                Err(_) => self.stats.rejections += 1,
            }
        }
        any
    }

    /// Advances phases; true when any changed.
    fn phases(&mut self, t: u64) -> bool {
        let mut changed = false;
        let trace = self.trace;
        for l in self.live.values_mut() {
            let task = &trace.tasks[l.task];
            let p = task.phase_index(t.saturating_sub(task.arrive_s));
            changed |= p != l.phase;
            l.phase = p;
        }
        changed
    }

    /// Online CPUs minus reserved and exclusively held ones.
    pub fn shared_pool(&self) -> CpuSet {
        self.topo
            .online_cpus()
            .difference(&self.alloc.reserved_cpus)
            .difference(&self.alloc.exclusive_cpus())
    }

    /// The kernel: thread placement, initial memory, growth.
    fn kernel(&mut self, step_s: f64) {
        if self.kubelet_like {
            // kubelet shrinks / grows shared containers' cpusets as exclusive CPUs come and go
            let pool = self.shared_pool();
            for l in self.live.values_mut() {
                if !l.constraints.exclusive && !pool.is_empty() {
                    l.cpus = pool.clone();
                }
            }
        }
        let uids: Vec<String> = self.live.keys().cloned().collect();
        for u in &uids {
            let l = &self.live[u];
            // AutoNUMA-like task placement: toward the node with most of its memory
            let preferred = self
                .autonuma
                .then(|| {
                    l.mem
                        .iter()
                        .max_by_key(|(n, b)| (**b, std::cmp::Reverse(**n)))
                })
                .flatten()
                .map(|(n, _)| *n);
            let th = self.threads_pref(&l.cpus, l.constraints.exclusive, preferred);
            let l = self.live.get_mut(u).expect("listed");
            l.threads = th;
            let initial = std::mem::take(&mut l.pending_initial);
            let task = &self.trace.tasks[l.task];
            let grow = task.phases[l.phase].grow_bytes_per_s as f64 * step_s;
            // A pod at its memory limit (every container limited: the pod's memcg) reclaims
            // its own pages instead of growing. Hugetlb pages are not charged to the memcg
            // (their bound is the pod's hugepage request).
            let room = if task.hugepages {
                u64::MAX
            } else {
                memory_limit(&task.pod).map_or(u64::MAX, |lim| lim.saturating_sub(l.total_mem()))
            };
            self.touch(u, (initial + grow as u64).min(room));
        }
    }

    /// Measures one step with the cost model.
    fn measure(&mut self, t: u64, step_s: f64) {
        let m = &self.cfg.model;
        let mut demand: BTreeMap<u32, f64> = BTreeMap::new();
        let mut traffic: BTreeMap<u32, f64> = BTreeMap::new();
        for l in self.live.values() {
            let d = self.demand_of(l);
            let ph = &self.task(l).phases[l.phase];
            let tot = l.total_mem().max(1) as f64;
            for (&n, &s) in &l.threads {
                *demand.entry(n).or_default() += d * s;
            }
            for (&n, &b) in &l.mem {
                *traffic.entry(n).or_default() += m.traffic(d, ph.mem_intensity) * b as f64 / tot;
            }
        }
        let slice =
            ((t as f64 / self.trace.duration_s as f64) * self.stats.slices.len() as f64) as usize;
        let slice = slice.min(self.stats.slices.len() - 1);
        for l in self.live.values() {
            let d = self.demand_of(l);
            if d <= 0.0 {
                continue;
            }
            let ph = &self.task(l).phases[l.phase];
            let tot = l.total_mem() as f64;
            let mut pairs = Vec::new();
            let mut contention = 0.0;
            let mut dev = 0.0;
            for (&n, &s) in &l.threads {
                let nc = self.ncpus.get(&n).copied().unwrap_or(1);
                contention += s * CostModel::contention(demand[&n], nc);
                dev += s * l
                    .device_node
                    .map_or(10.0, |dn| f64::from(self.topo.distance(n, dn)));
                for (&mn, &b) in &l.mem {
                    if tot > 0.0 && b > 0 {
                        pairs.push(Pair {
                            weight: s * b as f64 / tot,
                            distance: self.topo.distance(n, mn),
                            mem_saturation: m.saturation(traffic[&mn]),
                        });
                    }
                }
            }
            let sd = m.slowdown(ph.mem_intensity, ph.io_intensity, &pairs, dev, contention);
            // Threads on several nodes cross between them; each crossing costs CPU time.
            let spread = l.threads.values().filter(|&&s| s > 1e-9).count() > 1;
            let migrations = if spread {
                ph.cross_node_migrations_per_s.max(0.0) * step_s
            } else {
                0.0
            };
            self.stats.cross_node_migrations += migrations;
            self.stats.work += d * step_s;
            self.stats.weighted_slowdown +=
                d * step_s * sd + migrations * m.cross_node_migration_us * 1e-6;
            if let Some(loc) = model::locality(&pairs) {
                let a = d * ph.mem_intensity * step_s;
                self.stats.access += a;
                self.stats.local += a * loc;
                self.stats.slices[slice].0 += a;
                self.stats.slices[slice].1 += a * loc;
            }
        }
        // accumulate for the planner's observations
        let step_ns = self.cfg.step_ms * 1_000_000;
        let uids: Vec<String> = self.live.keys().cloned().collect();
        for u in uids {
            let d = self.demand_of(&self.live[&u]);
            let rate = self.task(&self.live[&u]).phases[self.live[&u].phase]
                .cross_node_migrations_per_s
                .max(0.0);
            let l = self.live.get_mut(&u).expect("listed");
            if d > 0.0 && l.threads.values().filter(|&&s| s > 1e-9).count() > 1 {
                l.migrations_acc += rate * step_s;
            }
            // What the kernel reports: the CPU time received, the demand shrunk by the
            // node's contention (the run queue, `runnable_acc`, counts the waiting).
            for (&n, &s) in &l.threads {
                let stretch = CostModel::contention(
                    demand.get(&n).copied().unwrap_or(0.0),
                    self.ncpus.get(&n).copied().unwrap_or(1),
                );
                let want = d * s * step_ns as f64;
                let got = want / stretch;
                *l.cpu_ns_acc.entry(n).or_default() += got as u64;
                // Its own wait, as a per-task account (schedstat's run_delay) would give it.
                *l.wait_ns_acc.entry(n).or_default() += (want - got) as u64;
            }
        }
        for (&n, &c) in &self.ncpus {
            let busy = demand.get(&n).copied().unwrap_or(0.0) / c.max(1) as f64;
            *self.busy_acc.entry(n).or_default() += busy.min(1.0);
            *self.runnable_acc.entry(n).or_default() += busy;
        }
        self.acc_steps += 1;
        let now_ms = t * 1000;
        let stretched = |d: f64, c: usize| {
            if c > 0 {
                d * (d / c as f64).max(1.0)
            } else {
                0.0
            }
        };
        let mut tracking = std::mem::take(&mut self.stats.tracking);
        tracking.retain(|(k, before, until)| {
            let Some(l) = self.live.get(&self.stats.move_log[*k].cgroup) else {
                return false;
            };
            let d = self.demand_of(l);
            let mut cf = demand.clone();
            for (&n, &s) in &l.threads {
                *cf.entry(n).or_default() -= d * s;
            }
            for (&n, &s) in before {
                *cf.entry(n).or_default() += d * s;
            }
            let mut gain = 0.0;
            for (&n, &c) in &self.ncpus {
                let a = demand.get(&n).copied().unwrap_or(0.0);
                let b = cf.get(&n).copied().unwrap_or(0.0).max(0.0);
                gain += stretched(b, c) - stretched(a, c);
            }
            self.stats.move_log[*k].realized_relief += gain * step_s;
            now_ms < *until
        });
        self.stats.tracking = tracking;
        self.demand = demand;
    }

    fn report(&self, policy: SimPolicy) -> PolicyReport {
        let s = &self.stats;
        let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 1.0 };
        let migration_cpu_s = self.cfg.model.migration_cost_s(s.bytes_migrated);
        PolicyReport {
            policy,
            mean_locality: round(ratio(s.local, s.access)),
            remote_timeline: s
                .slices
                .iter()
                .map(|&(a, l)| round(if a > 0.0 { 1.0 - l / a } else { 0.0 }))
                .collect(),
            slowdown: round(ratio(s.weighted_slowdown + migration_cpu_s, s.work)),
            bytes_migrated: s.bytes_migrated,
            pages_migrated: s.bytes_migrated / 4096,
            migration_cpu_s: round(migration_cpu_s),
            moves: s.moves,
            cross_node_migrations: s.cross_node_migrations.round() as u64,
            staged_rounds: s.staged,
            move_reversals: s.reversals,
            admitted: s.admitted,
            rejections: s.rejections,
            planner_rounds: s.planner_rounds,
            planner_skips: s.skips.clone(),
            invariant_violations: s.violations,
            move_log: s.move_log.clone(),
        }
    }
}

fn round(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// Scales weights to sum to 1 (empty stays empty).
pub(super) fn normalise(mut w: BTreeMap<u32, f64>) -> BTreeMap<u32, f64> {
    let s: f64 = w.values().sum();
    if s > 0.0 {
        w.values_mut().for_each(|x| *x /= s);
    } else {
        w.clear();
    }
    w
}

/// Removes `bytes` from the nodes of `mem` selected by `from`, proportionally (lowest ids
/// absorb the rounding).
pub(super) fn take_from(mem: &mut BTreeMap<u32, u64>, from: impl Fn(u32) -> bool, bytes: u64) {
    let total: u64 = mem.iter().filter(|(n, _)| from(**n)).map(|(_, b)| b).sum();
    if total == 0 {
        return;
    }
    let mut left = bytes.min(total);
    let nodes: Vec<u32> = mem.keys().copied().filter(|&n| from(n)).collect();
    for &n in &nodes {
        let b = mem[&n];
        let share = ((bytes as u128 * b as u128) / total as u128) as u64;
        let t = share.min(b).min(left);
        mem.insert(n, b - t);
        left -= t;
    }
    for &n in &nodes {
        if left == 0 {
            break;
        }
        let b = mem[&n];
        let t = b.min(left);
        mem.insert(n, b - t);
        left -= t;
    }
    mem.retain(|_, b| *b > 0);
}

/// The pod's memory limit when every container, init containers too, has one (as kubelet
/// sets the pod's memcg): the larger of its containers' sum and its largest init container.
fn memory_limit(pod: &crate::placement::pod::Pod) -> Option<u64> {
    let limit = |c: &crate::placement::pod::Container| {
        (c.memory_limit_bytes > 0).then_some(c.memory_limit_bytes)
    };
    let app = pod
        .containers
        .iter()
        .map(limit)
        .try_fold(0u64, |a, b| Some(a.saturating_add(b?)))?;
    let init = pod
        .init_containers
        .iter()
        .map(limit)
        .try_fold(0u64, |a, b| Some(a.max(b?)))?;
    Some(app.max(init)).filter(|&b| b > 0)
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("building the allocator: {0}")]
    Placement(#[from] crate::placement::admission::PlacementError),
}

/// Runs `trace` on `topo` (already with the trace's machine additions) under `policy`.
pub fn run_policy(
    topo: &Topology,
    trace: &Workload,
    cfg: &SimConfig,
    policy: SimPolicy,
) -> Result<PolicyReport, SimError> {
    let mut w = World::new(topo, trace, cfg, policy)?;
    let step_ms = cfg.step_ms.max(1);
    let step_s = step_ms as f64 / 1000.0;
    let period = cfg.controller.period_ms.max(step_ms);
    let mut t_ms = 0;
    while t_ms < trace.duration_s * 1000 {
        let t = t_ms / 1000;
        let whole_second = t_ms % 1000 == 0;
        let mut event = false;
        if whole_second {
            event |= w.depart(t);
            event |= w.arrive(t, 1);
        }
        event |= w.phases(t);
        if policy == SimPolicy::Oracle && event {
            baselines::oracle_place(&mut w);
        }
        w.kernel(step_s);
        w.measure(t, step_s);
        match policy {
            SimPolicy::Autonuma => baselines::autonuma_step(&mut w, step_s),
            SimPolicy::Rebalancer if t_ms > 0 && (t_ms + step_ms).is_multiple_of(period) => {
                baselines::rebalancer_round(&mut w, t_ms + step_ms)
            }
            _ => {}
        }
        t_ms += step_ms;
    }
    Ok(w.report(policy))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod whose containers all have memory limits grows no further than their sum (its
    /// memcg reclaims its own pages); one container without a limit lifts it.
    #[test]
    fn a_pod_grows_no_further_than_its_memory_limit() {
        use crate::placement::pod::{Container, Pod};
        const MIB: u64 = 1 << 20;
        let topo = crate::topology::TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 2,
            threads_per_core: 1,
            memory_per_node_bytes: 8 << 30,
            hugepages_2m_per_node: 2048,
            ..Default::default()
        }
        .build();
        let limited = |limits: &[u64]| super::super::workload::Task {
            pod: Pod {
                uid: "p".into(),
                containers: limits
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| Container {
                        name: format!("c{i}"),
                        cpu_request_millis: 500,
                        memory_bytes: 64 * MIB,
                        memory_limit_bytes: l,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            arrive_s: 0,
            leave_s: None,
            initial_mem_bytes: 100 * MIB,
            hugepages: false,
            phases: vec![super::super::workload::Phase {
                at_s: 0,
                cpus: 1.0,
                mem_intensity: 0.5,
                io_intensity: 0.0,
                grow_bytes_per_s: 50 * MIB,
                cross_node_migrations_per_s: 0.0,
            }],
        };
        assert_eq!(
            memory_limit(&limited(&[128 * MIB, 128 * MIB]).pod),
            Some(256 * MIB)
        );
        assert_eq!(memory_limit(&limited(&[128 * MIB, 0]).pod), None);
        let mut with_init = limited(&[128 * MIB]).pod;
        with_init.init_containers = vec![Container {
            name: "init".into(),
            memory_limit_bytes: 512 * MIB,
            ..Default::default()
        }];
        assert_eq!(memory_limit(&with_init), Some(512 * MIB));
        with_init.init_containers[0].memory_limit_bytes = 0;
        assert_eq!(memory_limit(&with_init), None);
        // (limits, hugetlb memory, most it holds after 20 s of 50 MiB/s from 100 MiB)
        for (limits, huge, most) in [
            (vec![128 * MIB, 128 * MIB], false, 256 * MIB),
            (vec![128 * MIB, 0], false, 100 * MIB + 20 * 50 * MIB),
            // Hugetlb pages are not the memcg's: no cap by the memory limit.
            (vec![128 * MIB, 128 * MIB], true, 100 * MIB + 20 * 50 * MIB),
        ] {
            let mut task = limited(&limits);
            task.hugepages = huge;
            let trace = Workload {
                name: "grow".into(),
                seed: 0,
                duration_s: 20,
                machine: Default::default(),
                tasks: vec![task],
            };
            let cfg = SimConfig::default();
            let mut w = World::new(&topo, &trace, &cfg, SimPolicy::Static).unwrap();
            w.arrive(0, 1);
            for _ in 0..20 {
                w.kernel(1.0);
            }
            let total: u64 = w.live.values().map(|l| l.total_mem()).sum();
            assert_eq!(total, most, "limits {limits:?}");
        }
    }

    #[test]
    fn take_from_is_exact() {
        type Case<'a> = (&'a [(u32, u64)], u64, &'a [(u32, u64)]);
        let cases: [Case; 4] = [
            (&[(0, 10), (1, 10), (2, 5)], 10, &[(0, 5), (1, 5), (2, 5)]),
            (&[(0, 3), (1, 3)], 3, &[(0, 1), (1, 2)]),
            (&[(0, 3), (1, 3)], 100, &[]),
            (&[(0, 7)], 0, &[(0, 7)]),
        ];
        for (mem, bytes, want) in cases {
            let mut m: BTreeMap<u32, u64> = mem.iter().copied().collect();
            take_from(&mut m, |n| n < 2, bytes);
            let want: BTreeMap<u32, u64> = want.iter().copied().collect();
            assert_eq!(m, want, "{mem:?} - {bytes}");
        }
    }
}

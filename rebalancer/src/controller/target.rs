//! Target options for one candidate cgroup, and the round's projected machine state.
//!
//! For every allowed node with CPUs the planner seeds a node set and grows it with the nearest
//! nodes (SLIT distance, then id) until it has the CPUs the workload needs; each distinct set is
//! then checked against the constraints and the projected free CPUs, memory, hugepages and load,
//! and priced (locality after, bytes to migrate, gain, saving — locality points weighted by how
//! far its remote memory is, plus the CPU time of the cross-node scheduler migrations that
//! consolidating its CPUs avoids —, cost). A round prices tens of thousands of sets, most of
//! them one node for a candidate on shared CPUs: those take a short way from the node's and the
//! candidate's figures (`Projection::price_single`, property-tested equal to the general code).
//! The [`Projection`] is updated after every accepted move so two moves of one round never
//! count the same room twice.

use super::locality;
use super::observe::{CgroupObs, NodeObs, Observations};
use super::plan_types::{Considered, TargetRejection, Trigger};
use super::ControllerState;
use crate::config::ControllerConfig;
use smallvec::SmallVec;

use crate::cpuset::CpuSet;
use crate::topology::Topology;

const GIB: f64 = (1u64 << 30) as f64;

/// The machine as this round's accepted moves leave it. Per-node values are arrays indexed
/// by the node's position in `topo.nodes` (see [`NodeIndex`]): the planner reads them for
/// every option of every candidate. A node id outside the topology reads as no CPUs, no free
/// memory, full and without demand; what is recorded for one is never read.
pub(super) struct Projection<'t> {
    topo: &'t Topology,
    reserved: CpuSet,
    index: NodeIndex,
    free: Vec<u64>,
    free_huge: Vec<u64>,
    busy: Vec<f64>,
    /// Runnable demand per node, in CPUs (running + waiting; may exceed the node's CPUs).
    demand: Vec<f64>,
    ncpus: Vec<usize>,
    /// Whether the node's run-queue demand was measured (`NodeObs::runnable`).
    measured: Vec<bool>,
    /// CPUs held exclusively by some workload.
    excl_held: CpuSet,
    /// Nodes without memory, where some node has memory (sizes known): a move to them writes
    /// the nearest memory nodes into cpuset.mems instead (see [`Projection::mems_of`]).
    without_memory: CpuSet,
    /// Shared pool per node with CPUs: node CPUs − reserved − exclusively held (`None` for a
    /// node without CPUs), and its size.
    pool: Vec<Option<CpuSet>>,
    pool_len: Vec<usize>,
    /// Ids of the nodes with CPUs, ascending.
    cpu_nodes: Vec<u32>,
    /// Per node with CPUs, ascending ids: the node and the other nodes with CPUs, nearest
    /// first (distance, id), each with its position (see [`NodeIndex`]).
    nearest: Vec<(NodeAt, Vec<NodeAt>)>,
    /// Length of the observed period, ns (rates per second).
    period_ns: u64,
    /// Per node, how long it has been overloaded (pressure ≥ `overload_busy`) without a break,
    /// this period included, at most the horizon: how long the relief of a move off it is
    /// counted (what has lasted that long is expected to last about as long again).
    overload_ms: Vec<u64>,
    /// Per node, `peak[i][k]` = the highest pressure of the last k + 1 periods (newest first;
    /// empty without a history): the load a target may go back to within a window.
    peak: Vec<Vec<f64>>,
    pub budget_left: u64,
    pub moves_left: u32,
    /// Set once a move was accepted: later candidates are re-evaluated.
    pub dirty: bool,
    /// Every option priced by the general code (`price`), the oracle of the short ways.
    #[cfg(test)]
    general_only: bool,
}

/// Per option of a candidate, what turning it into a move needs besides its [`Considered`],
/// index for index with its decision's `considered`. Plain lists (no per-option value that
/// needs a drop): a round prices tens of thousands of options.
#[derive(Clone, Debug, Default)]
pub(super) struct Picks {
    /// The cgroup keeps its current (narrower) shared cpuset on the same nodes.
    keep_cpus: Vec<bool>,
    /// The cpuset to write for exclusive CPUs: picked whole cores, one per option. Empty for
    /// a shared workload, whose cpuset is the target's shared pool (see
    /// [`Projection::to_cpus`]).
    picked: Vec<CpuSet>,
}

impl Picks {
    /// Option `k` of `considered` (the list these picks were priced with).
    pub fn option<'a>(&'a self, considered: &'a [Considered], k: usize) -> TargetOption<'a> {
        TargetOption {
            considered: &considered[k],
            picked: self.picked.get(k),
            keep_cpus: self.keep_cpus[k],
        }
    }
}

/// One option with what is needed to turn it into a move and to update the projection.
#[derive(Clone, Copy, Debug)]
pub(super) struct TargetOption<'a> {
    pub considered: &'a Considered,
    picked: Option<&'a CpuSet>,
    keep_cpus: bool,
}

/// What pricing one candidate's options needs that does not depend on the option: computed
/// once per candidate, not for each of its (up to one per node) options.
struct Fixed<'a> {
    trigger: &'a Trigger,
    before: Option<f64>,
    need_cpus: u32,
    max_nodes: u32,
    own_excl: CpuSet,
    demand: f64,
    remote_weight: f64,
    lived_ms: u64,
    normal_total: u64,
    huge_total: u64,
    /// Whether the run-queue demand of every node the cgroup ran on was measured.
    sources_measured: bool,
    /// Whether the cgroup's own wait was measured (`Observations::wanted_exact`).
    wanted_exact: bool,
    /// Overload trigger: the busy share of the nodes it runs on, by its CPU time there.
    src_busy: f64,
    /// Overload trigger: how long its overloaded nodes have been so (the shortest).
    lasted_ms: u64,
    /// Nodes its CPUs span (0 when it has no cross-node migrations: not needed then).
    cpu_nodes: usize,
    horizon_ms: u64,
    /// The cgroup's per-node values as short lists in node order (a linear scan of a few
    /// entries on the stack instead of a map lookup per option): CPU demand (CPUs) of every
    /// node in its CPU time map, memory and hugepage bytes.
    cpu: Entries<f64>,
    mem: Entries<u64>,
    huge: Entries<u64>,
    /// The position of each node of `cpu`, index for index.
    cpu_at: SmallVec<[Option<usize>; 4]>,
    /// The contention each node of `cpu` sheds when the workload leaves it (its term of
    /// [`Projection::contention_delta`]), index for index: the same for every option that
    /// does not hold the node.
    leave: SmallVec<[f64; 4]>,
    /// The nodes of `cpu`, `mem` and `huge`: a node outside them has none of its CPU time,
    /// memory or hugepages (no lists to scan for it).
    own_nodes: CpuSet,
}

/// What an option's figures take from its node set (see [`Projection::finish`]).
struct Shape {
    /// Nodes in the set.
    nodes: usize,
    after: f64,
    normal_need: u64,
    huge_need: u64,
    /// A rejection found while spreading the load (overload), before the others are checked.
    rejected: Option<TargetRejection>,
    picked: Option<CpuSet>,
    pool_len: usize,
    keep_cpus: bool,
    unchanged: bool,
    delta: f64,
    relief: f64,
    relief_ms: u64,
    free: u64,
    free_huge: u64,
}

/// The figures of an option that follow from its set's size, locality after, bytes to
/// migrate, whether it keeps its CPUs and its relief (see [`Projection::figures`]): for a
/// single node, from its bytes and whether it keeps its CPUs alone, the same for nearly
/// every node of a candidate.
#[derive(Clone, Copy)]
struct Figures {
    bytes: u64,
    keep_cpus: bool,
    gain: f64,
    avoided: f64,
    lived_ms: u64,
    saving: f64,
    cost: f64,
}

/// A node id and its position in `topo.nodes` (see [`NodeIndex`]).
type NodeAt = (u32, Option<usize>);

/// A target's nodes with their positions, inline for ≤ 4 nodes.
type Nodes = SmallVec<[NodeAt; 4]>;

/// A cgroup's per-node values (node, value), ascending node ids, inline for ≤ 4 nodes.
type Entries<T> = SmallVec<[(u32, T); 4]>;

/// The value of `node` in `e`, if it has one.
fn entry<T: Copy>(e: &[(u32, T)], node: u32) -> Option<T> {
    e.iter().find(|x| x.0 == node).map(|x| x.1)
}

/// `cpu_after` of one option: (node, share after, demand there now), inline for ≤ 4 nodes.
type Shares = SmallVec<[(u32, f64, f64); 4]>;

impl<'t> Projection<'t> {
    pub fn new(
        topo: &'t Topology,
        obs: &Observations,
        state: &ControllerState,
        cfg: &ControllerConfig,
    ) -> Self {
        let index = NodeIndex::new(topo);
        let k = topo.nodes.len();
        let (mut free, mut free_huge) = (vec![0; k], vec![0; k]);
        let (mut busy, mut demand) = (vec![1.0; k], vec![0.0; k]);
        let (mut ncpus, mut measured) = (vec![0; k], vec![false; k]);
        for n in &topo.nodes {
            let Some(i) = index.get(n.id) else { continue };
            let o = obs.nodes.get(&n.id);
            free[i] = o.map_or(0, |o| o.free_bytes);
            free_huge[i] = o.map_or(0, |o| o.free_hugepage_bytes);
            busy[i] = o.map_or(1.0, NodeObs::busy);
            demand[i] = o.map_or(1.0, NodeObs::pressure) * n.cpus.len() as f64;
            ncpus[i] = n.cpus.len();
            measured[i] = o.is_some_and(NodeObs::runnable_measured);
        }
        // The node's runnable demand is at least what the managed cgroups ran there (per
        // node position; `None` where none ran).
        let mut managed: Vec<Option<f64>> = vec![None; k];
        for cg in &obs.cgroups {
            for (&n, &ns) in &cg.cpu_ns_per_node {
                if let Some(i) = index.get(n) {
                    *managed[i].get_or_insert(0.0) += Self::ns_demand(obs, ns);
                }
            }
        }
        for (d, m) in demand.iter_mut().zip(managed) {
            if let Some(m) = m {
                *d = d.max(m);
            }
        }
        let excl_held = obs
            .cgroups
            .iter()
            .filter(|c| c.constraints.exclusive)
            .fold(CpuSet::new(), |acc, c| acc.union(&c.cpus));
        let mut cpu_nodes: Vec<u32> = topo
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.id)
            .collect();
        cpu_nodes.sort_unstable();
        cpu_nodes.dedup();
        let at = |n: u32| (n, index.get(n));
        let nearest = cpu_nodes
            .iter()
            .map(|&s| {
                let mut others: Vec<u32> = cpu_nodes.iter().copied().filter(|&n| n != s).collect();
                // Each distance looked up once (a lookup walks the node list).
                others.sort_by_cached_key(|&n| (topo.distance(s, n), n));
                (at(s), others.into_iter().map(at).collect())
            })
            .collect();
        let mut overload = vec![0; k];
        let mut peak = vec![Vec::new(); k];
        for n in &topo.nodes {
            if let Some(i) = index.get(n.id) {
                overload[i] = overload_ms(obs, state, cfg, n.id);
                if let Some(h) = state.node_pressure.get(&n.id) {
                    let mut hi = f64::NEG_INFINITY;
                    peak[i] = h
                        .iter()
                        .rev()
                        .map(|&p| {
                            hi = hi.max(p);
                            hi
                        })
                        .collect();
                }
            }
        }
        let without_memory = if topo.nodes.iter().any(|n| n.memory_total_bytes > 0) {
            (topo.nodes.iter())
                .filter(|n| n.memory_total_bytes == 0)
                .map(|n| n.id)
                .collect()
        } else {
            CpuSet::new()
        };
        let mut p = Projection {
            without_memory,
            overload_ms: overload,
            peak,
            topo,
            reserved: obs.reserved_cpus.clone(),
            index,
            free,
            free_huge,
            busy,
            demand,
            ncpus,
            measured,
            excl_held,
            pool: Vec::new(),
            pool_len: Vec::new(),
            cpu_nodes,
            nearest,
            period_ns: obs.period_ns,
            budget_left: cfg.migration_budget_mib.saturating_mul(1 << 20),
            moves_left: super::MAX_MOVES_PER_ROUND,
            dirty: false,
            #[cfg(test)]
            general_only: false,
        };
        p.refresh_pools();
        p
    }

    fn refresh_pools(&mut self) {
        let taken = self.reserved.union(&self.excl_held);
        let k = self.topo.nodes.len();
        self.pool = vec![None; k];
        self.pool_len = vec![0; k];
        for n in self.topo.nodes.iter().filter(|n| !n.cpus.is_empty()) {
            if let Some(i) = self.index.get(n.id) {
                let p = n.cpus.difference(&taken);
                self.pool_len[i] = p.len();
                self.pool[i] = Some(p);
            }
        }
    }

    /// The shared pool of `node`, when it has CPUs.
    fn pool(&self, node: u32) -> Option<&CpuSet> {
        self.index.get(node).and_then(|i| self.pool[i].as_ref())
    }

    fn pool_len(&self, node: u32) -> usize {
        self.index.get(node).map_or(0, |i| self.pool_len[i])
    }

    fn ncpus(&self, node: u32) -> usize {
        self.index.get(node).map_or(0, |i| self.ncpus[i])
    }

    fn demand(&self, node: u32) -> f64 {
        self.index.get(node).map_or(0.0, |i| self.demand[i])
    }

    /// Runnable demand of `node` at its highest over the last `window_ms` (this round's moves
    /// included): the load a target may go back to within the window a relief is counted for.
    fn peak_demand(&self, node: u32, window_ms: u64) -> f64 {
        let Some(i) = self.index.get(node) else {
            return 0.0;
        };
        let period_ms = (self.period_ns / 1_000_000).max(1);
        let r = &self.peak[i];
        if r.is_empty() {
            return self.demand[i];
        }
        let k = (window_ms.div_ceil(period_ms) as usize).clamp(1, r.len());
        // This period's demand as this round's moves left it, raised by how much higher the
        // node's pressure was at its peak than now.
        let raise = (r[k - 1] - r[0]).max(0.0) * self.ncpus[i] as f64;
        self.demand[i] + raise
    }

    /// Whether the run-queue demand of `node` was measured.
    fn measured(&self, obs: &Observations, node: u32) -> bool {
        match self.index.get(node) {
            Some(i) => self.measured[i],
            None => obs.nodes.get(&node).is_some_and(NodeObs::runnable_measured),
        }
    }

    pub fn busy(&self, node: u32) -> f64 {
        self.index.get(node).map_or(1.0, |i| self.busy[i])
    }

    /// Run-queue demand `cg` puts on `node` ([`Observations::wanted_on`]).
    fn demand_on(obs: &Observations, cg: &CgroupObs, node: u32) -> f64 {
        obs.wanted_on(cg, node)
    }

    /// CPUs' worth of `ns` on-CPU nanoseconds over the period.
    fn ns_demand(obs: &Observations, ns: u64) -> f64 {
        if obs.period_ns == 0 {
            return 0.0;
        }
        ns as f64 / obs.period_ns as f64
    }

    /// The trigger that makes `cg` a candidate, if any.
    pub fn trigger(
        &self,
        cg: &CgroupObs,
        smoothed: Option<f64>,
        cfg: &ControllerConfig,
    ) -> Option<Trigger> {
        let total = cg.total_cpu_ns();
        if total > 0 {
            let is_hot = |(&n, &ns): (&u32, &u64)| ns > 0 && self.busy(n) >= cfg.overload_busy;
            let hot_ns = cg
                .cpu_ns_per_node
                .iter()
                .filter(|&e| is_hot(e))
                .fold(0u64, |a, (_, &ns)| a.saturating_add(ns));
            if hot_ns > 0
                && hot_ns.saturating_mul(2) >= total
                && self
                    .cpu_nodes
                    .iter()
                    .any(|&n| self.busy(n) < cfg.overload_busy && self.allowed(cg, n))
            {
                let nodes = cg
                    .cpu_ns_per_node
                    .iter()
                    .filter(|&e| is_hot(e))
                    .map(|(&n, _)| n)
                    .collect();
                return Some(Trigger::Overloaded { nodes });
            }
        }
        match smoothed {
            Some(s) if s < cfg.locality_threshold => return Some(Trigger::PoorLocality),
            None => return None,
            _ => {}
        }
        // Threads crossing nodes: only where the planner may narrow the CPUs.
        let per_s = self.cross_node_rate(cg);
        let movable = !cg.constraints.keep_cpus && !cg.constraints.exclusive;
        (movable && per_s >= super::MIGRATION_TRIGGER_PER_S && self.cpu_nodes(cg) >= 2)
            .then_some(Trigger::Migrating { per_s })
    }

    /// Cross-node migrations per second of `cg` over the last period.
    fn cross_node_rate(&self, cg: &CgroupObs) -> f64 {
        if self.period_ns == 0 {
            return 0.0;
        }
        cg.cross_node_migrations as f64 / (self.period_ns as f64 / 1e9)
    }

    /// Nodes the cgroup's CPUs span.
    fn cpu_nodes(&self, cg: &CgroupObs) -> usize {
        self.topo
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_disjoint(&cg.cpus))
            .count()
    }

    /// Cross-node migrations per second a move to `nodes` avoids: all of them when its CPUs
    /// end on one node, none when they keep spanning as many nodes (`keep_cpus`: the CPUs stay),
    /// in proportion in between (the migrations are taken to spread evenly over node pairs
    /// crossed). `now`: the nodes its CPUs span today (`cpu_nodes`, once per candidate).
    fn migrations_avoided(&self, cg: &CgroupObs, now: usize, nodes: usize, keep_cpus: bool) -> f64 {
        let rate = self.cross_node_rate(cg);
        if rate <= 0.0 || keep_cpus {
            return 0.0;
        }
        if now < 2 || nodes >= now {
            return 0.0;
        }
        let left = (nodes.max(1) - 1) as f64 / (now - 1) as f64;
        rate * (1.0 - left)
    }

    /// Every distinct target option for `cg`, priced and checked: what the decision records
    /// (`considered`, in seed order) and, per option, what turning it into a move needs.
    pub fn options(
        &self,
        obs: &Observations,
        cg: &CgroupObs,
        trigger: &Trigger,
        before: Option<f64>,
        cfg: &ControllerConfig,
        lived_ms: u64,
    ) -> (Vec<Considered>, Picks) {
        let c = &cg.constraints;
        // Priced at what it wants; sized by it too where that is its own measure, else by
        // what it ran (its node's average would misjudge it, and a single-node workload asked
        // to fit a guess larger than any node would be stranded).
        let demand = obs.wanted_demand(cg);
        let ran = if obs.wanted_exact(cg) {
            demand
        } else {
            obs.cpu_demand(cg)
        };
        let own_excl = if c.exclusive {
            cg.cpus.clone()
        } else {
            CpuSet::new()
        };
        let max_nodes = if c.single_numa_node {
            1
        } else {
            c.max_nodes.unwrap_or(u32::MAX).max(1)
        };
        let at_least = |x: f64| (x.ceil() as u32).max(1);
        let need_cpus: u32 = if c.exclusive {
            if c.exclusive_cpus > 0 {
                c.exclusive_cpus
            } else {
                cg.cpus.len().max(1) as u32
            }
        } else if c.keep_cpus {
            // The operator's CPUs stay whatever it wants: only its memory can follow them.
            at_least(ran).min(cg.cpus.len().max(1) as u32)
        } else if max_nodes == 1 {
            // A want past the largest node it may use is no reason to strand a single-node
            // workload: it asks for that node, never for less than it ran.
            let largest = self
                .nearest
                .iter()
                .map(|e| e.0 .0)
                .filter(|&n| self.allowed(cg, n))
                .map(|n| self.pool_len(n) as u32)
                .max()
                .unwrap_or(0);
            at_least(ran).min(largest.max(at_least(obs.cpu_demand(cg))))
        } else {
            at_least(ran)
        };
        let fixed = self.fixed(obs, cg, trigger, before, cfg, lived_ms);
        let mut fixed = Fixed {
            need_cpus,
            max_nodes,
            own_excl,
            demand,
            ..fixed
        };
        fixed.leave = (fixed.cpu.iter().zip(&fixed.cpu_at))
            .map(|(&(_, own), &i)| self.contention_term(i, own, 0.0))
            .collect();
        let capacity = |(n, i): NodeAt| -> usize {
            if c.keep_cpus {
                // The operator's CPUs stay: what the node offers is the part of them on it.
                return self
                    .topo
                    .node(n)
                    .map_or(0, |node| node.cpus.intersection(&cg.cpus).len());
            }
            let pool = i.map_or(0, |i| self.pool_len[i]);
            let own = if fixed.own_excl.is_empty() {
                0
            } else {
                self.topo
                    .node(n)
                    .map_or(0, |node| node.cpus.intersection(&fixed.own_excl).len())
            };
            pool + own
        };
        // Priced as shared CPUs and not for an overload: a single node may take the short way.
        let shared = !c.exclusive && !c.keep_cpus && !matches!(trigger, Trigger::Overloaded { .. });
        #[cfg(test)]
        let shared = shared && !self.general_only;
        // The figures of the last single node priced the short way (see `price_single`).
        let mut last: Option<Figures> = None;
        // Each distinct set is priced as soon as it is grown (in seed order).
        let mut considered: Vec<Considered> = Vec::with_capacity(self.nearest.len());
        let mut picks = Picks {
            keep_cpus: Vec::with_capacity(self.nearest.len()),
            picked: Vec::new(),
        };
        for (seed, nearest) in &self.nearest {
            if !self.allowed(cg, seed.0) {
                continue;
            }
            let mut cap = capacity(*seed);
            // A seed that holds what the workload needs is its own set, and new (the seeds
            // are distinct): the usual option, priced the short way where it may be.
            if let (true, Some(i)) = (cap >= need_cpus as usize, seed.1) {
                if shared && !self.without_memory.contains(seed.0) && self.pool[i].is_some() {
                    let t = CpuSet::one(seed.0);
                    let at = (seed.0, i);
                    self.price_single(
                        cg,
                        cfg,
                        &fixed,
                        t,
                        at,
                        &mut last,
                        &mut considered,
                        &mut picks,
                    );
                    continue;
                }
            }
            let mut t = CpuSet::one(seed.0);
            // The set's nodes with their positions, as grown; ascending once grown.
            let mut tn: Nodes = SmallVec::new();
            tn.push(*seed);
            for &n in nearest {
                if cap >= need_cpus as usize {
                    break;
                }
                if self.allowed(cg, n.0) {
                    t.insert(n.0);
                    tn.push(n);
                    cap += capacity(n);
                }
            }
            // Every set holds its own seed and the seeds are distinct, so a single node set
            // is new; only a grown one can repeat an earlier set.
            if tn.len() == 1 || !considered.iter().any(|c| c.nodes == t) {
                tn.sort_unstable_by_key(|e| e.0);
                self.price(obs, cg, cfg, &fixed, t, &tn, &mut considered, &mut picks);
            }
        }
        (considered, picks)
    }

    /// What pricing `cg`'s options needs that no option changes (`need_cpus`, `max_nodes`,
    /// `own_excl` and `demand` are filled by the caller).
    fn fixed<'a>(
        &self,
        obs: &Observations,
        cg: &CgroupObs,
        trigger: &'a Trigger,
        before: Option<f64>,
        cfg: &ControllerConfig,
        lived_ms: u64,
    ) -> Fixed<'a> {
        let (src_busy, lasted_ms) = match trigger {
            Trigger::Overloaded { nodes } => {
                // No run-queue measure: the busy share it leaves (see `price`).
                let total = cg.total_cpu_ns().max(1) as f64;
                let src: f64 = cg
                    .cpu_ns_per_node
                    .iter()
                    .map(|(&n, &ns)| ns as f64 / total * self.busy(n))
                    .sum();
                let lasted = nodes
                    .iter()
                    .map(|n| self.index.get(n).map_or(0, |i| self.overload_ms[i]))
                    .min()
                    .unwrap_or(0);
                (src, lasted)
            }
            Trigger::PoorLocality | Trigger::Migrating { .. } => (0.0, 0),
        };
        Fixed {
            trigger,
            before,
            need_cpus: 0,
            max_nodes: 0,
            own_excl: CpuSet::new(),
            demand: 0.0,
            // Per candidate, not per option: what a locality point is worth for it.
            remote_weight: self.remote_weight(cg),
            lived_ms,
            normal_total: sat_sum(cg.mem_bytes_per_node.values()),
            huge_total: sat_sum(cg.hugepage_bytes_per_node.values()),
            sources_measured: cg.cpu_ns_per_node.keys().all(|&n| self.measured(obs, n)),
            wanted_exact: obs.wanted_exact(cg),
            src_busy,
            lasted_ms,
            cpu_nodes: if self.cross_node_rate(cg) > 0.0 {
                self.cpu_nodes(cg)
            } else {
                0
            },
            horizon_ms: cfg.horizon_ms,
            cpu: cg
                .cpu_ns_per_node
                .keys()
                .map(|&n| (n, Self::demand_on(obs, cg, n)))
                .collect(),
            cpu_at: cg
                .cpu_ns_per_node
                .keys()
                .map(|&n| self.index.get(n))
                .collect(),
            leave: SmallVec::new(),
            own_nodes: (cg.cpu_ns_per_node.keys())
                .chain(cg.mem_bytes_per_node.keys())
                .chain(cg.hugepage_bytes_per_node.keys())
                .copied()
                .collect(),
            mem: cg
                .mem_bytes_per_node
                .iter()
                .map(|(&n, &b)| (n, b))
                .collect(),
            huge: cg
                .hugepage_bytes_per_node
                .iter()
                .map(|(&n, &b)| (n, b))
                .collect(),
        }
    }

    /// The nodes of `t` (ascending) with their positions (see [`NodeIndex`]).
    fn positions(&self, t: &CpuSet) -> Nodes {
        let mut out = SmallVec::new();
        for n in t.iter() {
            out.push((n, self.index.get(n)));
        }
        out
    }

    /// Prices one target node set `t` of `cg` (see [`Fixed`] for what is per candidate) into
    /// `considered`, and into `picks` the whole cores picked for exclusive CPUs and whether
    /// the cgroup keeps its current CPUs.
    #[allow(clippy::too_many_arguments)]
    fn price(
        &self,
        obs: &Observations,
        cg: &CgroupObs,
        cfg: &ControllerConfig,
        fx: &Fixed<'_>,
        t: CpuSet,
        tn: &[NodeAt],
        considered: &mut Vec<Considered>,
        picks: &mut Picks,
    ) {
        let demand = fx.demand;
        // `tn`: the set's nodes (ascending, as `t.iter()`) with their positions, walked once:
        // every per-node value below is read by position, not looked up again.
        // Memory lands on the nodes a move there writes into cpuset.mems: `t`, or for a node
        // without memory the nearest memory nodes, where it is never local to the CPUs on it
        // (what runs there is remote whatever moves).
        let mems_t = self.mems_of(&t);
        let mn_owned;
        let mn: &[NodeAt] = match &mems_t {
            std::borrow::Cow::Borrowed(_) => tn,
            std::borrow::Cow::Owned(m) => {
                mn_owned = self.positions(m);
                &mn_owned
            }
        };
        // A single node with memory: all local after the move (what `expected_after` and
        // `with_memory_share` give for it, without walking the cgroup's maps).
        let after = match tn {
            [(n, _)] if !self.without_memory.contains(*n) => 1.0,
            _ => locality::expected_after(cg, &t) * self.with_memory_share(cg, &t),
        };
        let normal_in = mn
            .iter()
            .filter_map(|&(n, _)| entry(&fx.mem, n))
            .fold(0u64, u64::saturating_add);
        let huge_in = mn
            .iter()
            .filter_map(|&(n, _)| entry(&fx.huge, n))
            .fold(0u64, u64::saturating_add);
        let normal_need = fx.normal_total.saturating_sub(normal_in);
        let huge_need = fx.huge_total.saturating_sub(huge_in);

        // CPU share per target node after the move (and its demand there now), once: the
        // demand first (one lookup per node), then the shares from it as `cpu_after` does.
        let mut shares = Shares::new();
        for &(n, _) in tn {
            shares.push((n, 0.0, entry(&fx.cpu, n).unwrap_or(0.0)));
        }
        let on_t: f64 = shares.iter().map(|s| s.2).sum();
        let k = tn.len().max(1) as f64;
        for s in &mut shares {
            s.1 = if on_t > 0.0 { s.2 / on_t } else { 1.0 / k };
        }
        // The load it adds there: none when its threads keep their CPUs (the operator's pin
        // or their own affinity), whose node is not the move's doing.
        let mut rejected = None;
        let mut dst_busy: f64 = 0.0;
        for (&(n, share, own), &(_, i)) in shares.iter().zip(tn) {
            let ncpu = i.map_or(0, |i| self.ncpus[i]).max(1) as f64;
            let added = if cg.constraints.keep_cpus {
                0.0
            } else {
                ((demand * share - own) / ncpu).max(0.0)
            };
            let busy_after = i.map_or(1.0, |i| self.busy[i]) + added;
            dst_busy = dst_busy.max(busy_after);
            if added > 1e-12 && busy_after > cfg.overload_busy && rejected.is_none() {
                rejected = Some(TargetRejection::Overloaded {
                    node: n,
                    busy_after,
                });
            }
        }
        // Exclusive CPUs: whole free cores; shared: the pool of the target nodes.
        let picked = cg
            .constraints
            .exclusive
            .then(|| self.pick_cores(&t, fx.need_cpus, &fx.own_excl));
        let pool_len: usize = tn
            .iter()
            .map(|&(_, i)| i.map_or(0, |i| self.pool_len[i]))
            .sum();
        // The operator's CPUs (`keep_cpus`), or already on these nodes with a narrower shared
        // cpuset (admission's choice): keep them.
        // The target's pool, built (or borrowed) once, and only for the nodes it is on.
        // (by the mems a move there writes: on a node without memory, those stand in for it)
        let same_nodes = *mems_t == cg.mems;
        let pool_t = same_nodes.then(|| self.pool_ref(&t));
        let keep_cpus = picked.is_none()
            && !cg.cpus.is_empty()
            && (cg.constraints.keep_cpus || pool_t.as_ref().is_some_and(|p| cg.cpus.is_subset(p)));
        let horizon_ms = fx.horizon_ms;
        // The contention the move adds (> 0) or takes away (< 0), CPUs; none when the threads
        // keep their CPUs (the operator's, or the same nodes' narrower cpuset).
        let delta = if keep_cpus {
            0.0
        } else {
            self.contention_delta(fx, &t, tn, &shares, demand)
        };
        let measured = fx.sources_measured
            && tn.iter().all(|&(n, i)| match i {
                Some(i) => self.measured[i],
                None => self.measured(obs, n),
            });
        let mut delta = delta;
        let (relief, relief_ms) = match fx.trigger {
            Trigger::Overloaded { .. } => {
                // Counted for as long as the overload has lasted so far (and the workload has
                // lived): what has lasted that long is expected to last about as long again.
                let lasted = fx.lasted_ms.min(fx.lived_ms).min(horizon_ms);
                if measured && !keep_cpus {
                    // Over that same window a target may go back to the load it had: a node
                    // it joins is priced at its peak of the window, not at this period (one
                    // quiet period on a node that is usually busy is no room to move into).
                    let before = |n| {
                        if entry(&fx.cpu, n).is_some() {
                            self.demand(n)
                        } else {
                            self.peak_demand(n, lasted)
                        }
                    };
                    delta = self.contention_delta_by(&fx.cpu, &t, &shares, demand, before);
                    // Past `overload_busy` is no reason to stay where it is worse. Not for
                    // whole cores (exclusive): they leave the target's shared pool, which
                    // per-node pressure does not see.
                    if delta < 0.0
                        && fx.wanted_exact
                        && picked.is_none()
                        && matches!(rejected, Some(TargetRejection::Overloaded { .. }))
                        && self.balances(&fx.cpu, &t, &shares, demand, before)
                    {
                        rejected = None;
                    }
                }
                let relief = if measured {
                    // The contention model's own answer: the CPU time every task on the
                    // sources stops waiting, less what the targets start to, per CPU moved.
                    if demand > 0.0 {
                        (-delta).max(0.0) / demand
                    } else {
                        0.0
                    }
                } else {
                    // No run-queue measure: the busy share it leaves minus the one it joins.
                    fx.src_busy - dst_busy
                };
                (relief, lasted)
            }
            Trigger::PoorLocality | Trigger::Migrating { .. } => (0.0, 0),
        };

        let free = mn.iter().fold(0u64, |a, &(_, i)| {
            a.saturating_add(i.map_or(0, |i| self.free[i]))
        });
        let free_huge = mn.iter().fold(0u64, |a, &(_, i)| {
            a.saturating_add(i.map_or(0, |i| self.free_huge[i]))
        });
        let unchanged = same_nodes
            && match &picked {
                Some(p) => *p == cg.cpus,
                None => keep_cpus || pool_t.as_ref().is_some_and(|p| cg.cpus == **p),
            };
        let shape = Shape {
            nodes: tn.len(),
            after,
            normal_need,
            huge_need,
            rejected,
            picked,
            pool_len,
            keep_cpus,
            unchanged,
            delta,
            relief,
            relief_ms,
            free,
            free_huge,
        };
        let figures = self.figures(
            cg,
            cfg,
            fx,
            shape.nodes,
            after,
            normal_need.saturating_add(huge_need),
            keep_cpus,
            relief,
            relief_ms,
        );
        self.finish(cg, fx, t, shape, figures, considered, picks);
    }

    /// [`Projection::price`] of a single node `n` (at position `i`, with memory and a shared
    /// pool) for a candidate that is priced as shared CPUs (not exclusive, not the operator's)
    /// and not for an overload: what the general code computes for such a set, read straight
    /// from the node's figures (no lists, no set operations besides the two the decision
    /// needs). Most options of a round are these (`target_props` checks both agree).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn price_single(
        &self,
        cg: &CgroupObs,
        cfg: &ControllerConfig,
        fx: &Fixed<'_>,
        t: CpuSet,
        (n, i): (u32, usize),
        last: &mut Option<Figures>,
        considered: &mut Vec<Considered>,
        picks: &mut Picks,
    ) {
        let demand = fx.demand;
        let mine = fx.own_nodes.contains(n);
        let own = if mine { entry(&fx.cpu, n) } else { None }.unwrap_or(0.0);
        // As `cpu_after` spreads it over one node: its demand there over the set's sum of it
        // (1, computed as there: the same bits however odd the demand).
        let on_t = own;
        let share = if on_t > 0.0 { own / on_t } else { 1.0 };
        let ncpu = self.ncpus[i].max(1) as f64;
        let added = ((demand * share - own) / ncpu).max(0.0);
        let busy_after = self.busy[i] + added;
        let rejected = (added > 1e-12 && busy_after > cfg.overload_busy).then_some(
            TargetRejection::Overloaded {
                node: n,
                busy_after,
            },
        );
        let pool = self.pool[i].as_ref();
        let same_nodes = t == cg.mems;
        let keep_cpus =
            same_nodes && !cg.cpus.is_empty() && pool.is_some_and(|p| cg.cpus.is_subset(p));
        let delta = if keep_cpus {
            0.0
        } else {
            self.contention_delta(fx, &t, &[(n, Some(i))], &[(n, share, own)], demand)
        };
        let (normal_in, huge_in) = if mine {
            (entry(&fx.mem, n), entry(&fx.huge, n))
        } else {
            (None, None)
        };
        let normal_need = fx.normal_total.saturating_sub(normal_in.unwrap_or(0));
        let huge_need = fx.huge_total.saturating_sub(huge_in.unwrap_or(0));
        let bytes = normal_need.saturating_add(huge_need);
        // The same for every node the candidate has as much memory on (all but a few): kept
        // from the last single node priced.
        let figures = match *last {
            Some(f) if f.bytes == bytes && f.keep_cpus == keep_cpus => f,
            _ => *last.insert(self.figures(cg, cfg, fx, 1, 1.0, bytes, keep_cpus, 0.0, 0)),
        };
        let shape = Shape {
            nodes: 1,
            after: 1.0,
            normal_need,
            huge_need,
            rejected,
            picked: None,
            pool_len: self.pool_len[i],
            keep_cpus,
            unchanged: same_nodes && (keep_cpus || pool.is_some_and(|p| cg.cpus == *p)),
            delta,
            relief: 0.0,
            relief_ms: 0,
            free: self.free[i],
            free_huge: self.free_huge[i],
        };
        self.finish(cg, fx, t, shape, figures, considered, picks);
    }

    /// The figures of an option that follow from its set's size, locality after, memory to
    /// migrate, whether it keeps its CPUs and its relief (see [`Figures`]).
    #[allow(clippy::too_many_arguments)]
    fn figures(
        &self,
        cg: &CgroupObs,
        cfg: &ControllerConfig,
        fx: &Fixed<'_>,
        nodes: usize,
        after: f64,
        bytes: u64,
        keep_cpus: bool,
        relief: f64,
        relief_ms: u64,
    ) -> Figures {
        let demand = fx.demand;
        let horizon_ms = fx.horizon_ms;
        let locality_gain = after - fx.before.unwrap_or(after);
        // Scheduler migrations the move avoids, as CPU share of the workload they cost.
        let avoided = self.migrations_avoided(cg, fx.cpu_nodes, nodes, keep_cpus);
        let migration_points = if demand > 0.0 {
            avoided * super::CROSS_NODE_MIGRATION_COST_US * 1e-6 / demand
        } else {
            0.0
        };
        let gain = locality_gain + relief + migration_points;
        // Locality points are worth what a remote access costs here (relief and migrations
        // avoided are CPU time already). What the move saves is counted for as long as the
        // workload has lived so far, the relief as long as the overload has lasted; what it
        // costs (migration, contention added) in full.
        let priced = locality_gain * fx.remote_weight + migration_points;
        let lived_ms = fx.lived_ms.min(horizon_ms);
        let saving = priced * demand * lived_ms as f64 / 1000.0
            + relief * demand * relief_ms as f64 / 1000.0;
        let cost = bytes as f64 / GIB * cfg.migration_cost_per_gib;
        Figures {
            bytes,
            keep_cpus,
            gain,
            avoided,
            lived_ms,
            saving,
            cost,
        }
    }

    /// An option from its [`Shape`] and [`Figures`]: the contention it adds, the first
    /// rejection that applies; pushed onto `considered` and `picks`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        cg: &CgroupObs,
        fx: &Fixed<'_>,
        t: CpuSet,
        shape: Shape,
        figures: Figures,
        considered: &mut Vec<Considered>,
        picks: &mut Picks,
    ) {
        let Shape {
            nodes,
            after,
            normal_need,
            huge_need,
            rejected,
            picked,
            pool_len,
            keep_cpus,
            unchanged,
            delta,
            relief,
            relief_ms,
            free,
            free_huge,
        } = shape;
        let Figures {
            bytes,
            gain,
            avoided,
            lived_ms,
            saving,
            cost,
            ..
        } = figures;
        let horizon_s = fx.horizon_ms as f64 / 1000.0;
        let n_cpus = match &picked {
            Some(p) => p.len(),
            None if keep_cpus => cg.cpus.len(),
            None => pool_len,
        };
        // The operator's CPUs stay: the threads run where they ran, only memory moves.
        let contention = if keep_cpus || delta <= 1e-6 {
            0.0
        } else {
            delta * horizon_s
        };
        let (need_cpus, max_nodes) = (fx.need_cpus, fx.max_nodes);
        let pre = if nodes as u32 > max_nodes {
            Some(TargetRejection::TooManyNodes {
                need: nodes as u32,
                max: max_nodes,
            })
        } else if n_cpus < need_cpus as usize || n_cpus == 0 {
            Some(TargetRejection::NoCpus {
                need: need_cpus,
                free: n_cpus as u32,
            })
        } else if normal_need > free {
            Some(TargetRejection::NoMemory {
                need: normal_need,
                free,
            })
        } else if huge_need > free_huge {
            Some(TargetRejection::NoHugepages {
                need: huge_need,
                free: free_huge,
            })
        } else if unchanged {
            Some(TargetRejection::Unchanged)
        } else {
            None
        };
        picks.keep_cpus.push(keep_cpus);
        // Some for every option of an exclusive workload, None for every other's.
        if let Some(p) = picked {
            picks.picked.push(p);
        }
        // Written in place (a round prices tens of thousands of these).
        considered.push(Considered {
            nodes: t,
            locality_after: after,
            bytes_to_migrate: bytes,
            gain,
            relief,
            horizon_ms: lived_ms,
            relief_horizon_ms: relief_ms,
            migrations_avoided_per_s: avoided,
            saving,
            cost,
            contention,
            net: saving - cost - contention,
            rejected: pre.or(rejected),
        });
    }

    /// CPUs' worth of slowdown the move of `cg` to `t` adds machine-wide through CPU
    /// contention (negative: takes away). A node with runnable demand D on C CPUs does
    /// D × max(1, D / C) CPU-time of work per unit of useful work (every runnable task is
    /// stretched by D / C once D > C); the move takes the workload's demand off its current
    /// nodes and puts it on `t` as `cpu_after` spreads it (`shares`). The same sum as
    /// [`Projection::contention_delta_by`] at each node's demand now, in the same order, with
    /// every node read by its position (`tn`: the target's, index for index with `shares`) and
    /// the terms of the nodes it leaves computed once per candidate (`fx.leave`): it runs for
    /// every option of every candidate.
    #[inline(always)]
    fn contention_delta(
        &self,
        fx: &Fixed<'_>,
        t: &CpuSet,
        tn: &[NodeAt],
        shares: &[(u32, f64, f64)],
        demand: f64,
    ) -> f64 {
        let mut delta = 0.0;
        for (&(_, share, own), &(_, i)) in shares.iter().zip(tn) {
            delta += self.contention_term(i, own, demand * share);
        }
        for (&(n, _), &leave) in fx.cpu.iter().zip(&fx.leave) {
            if !t.contains(n) {
                delta += leave;
            }
        }
        // Below a millionth of a CPU it is rounding, not contention.
        if delta.abs() > 1e-6 {
            delta
        } else {
            0.0
        }
    }

    /// The contention a node (at position `i`, at its demand now) gains when the workload's
    /// demand there goes from `own_now` to `own_after` (see [`Projection::contention_delta_by`]).
    #[inline(always)]
    fn contention_term(&self, i: Option<usize>, own_now: f64, own_after: f64) -> f64 {
        let stretched = |d: f64, c: f64| if c > 0.0 { d * (d / c).max(1.0) } else { 0.0 };
        let (c, d0) = i.map_or((0.0, 0.0), |i| (self.ncpus[i] as f64, self.demand[i]));
        let d1 = (d0 - own_now + own_after).max(0.0);
        stretched(d1, c) - stretched(d0, c)
    }

    /// Whether a relief move that takes contention away (`contention_delta_by` < 0 with the
    /// same `d`) may push its targets past `overload_busy`: every target node, at its demand
    /// `d` plus what the move adds, is less pressed (runnable demand per CPU) than the most
    /// pressed node the workload leaves is now. The target is then still the lesser of the
    /// two loads, so the reverse move could not pass this test on the same loads (no trading
    /// the workload back and forth), and the machine's stretched work is lower. Only for a
    /// workload whose own wait was measured (`Observations::wanted_exact`, checked by the
    /// caller): priced from its node's average queue, a workload that gets less than its
    /// neighbours (cgroups share by weight, not by thread) would be misjudged, and the next
    /// round could see the mirror image and move it back.
    fn balances(
        &self,
        cpu: &[(u32, f64)],
        t: &CpuSet,
        shares: &[(u32, f64, f64)],
        demand: f64,
        d: impl Fn(u32) -> f64,
    ) -> bool {
        let pressure = |n: u32, dem: f64| dem / self.ncpus(n).max(1) as f64;
        let source = cpu
            .iter()
            .filter(|e| !t.contains(e.0) && e.1 > 0.0)
            .map(|&(n, _)| pressure(n, self.demand(n)))
            .fold(0.0, f64::max);
        shares.iter().all(|&(n, share, own)| {
            self.ncpus(n) > 0 && pressure(n, (d(n) - own + demand * share).max(0.0)) < source
        })
    }

    /// [`Projection::contention_delta`] with each node's demand before the move from `d`.
    fn contention_delta_by(
        &self,
        cpu: &[(u32, f64)],
        t: &CpuSet,
        shares: &[(u32, f64, f64)],
        demand: f64,
        d: impl Fn(u32) -> f64,
    ) -> f64 {
        let stretched = |d: f64, c: f64| if c > 0.0 { d * (d / c).max(1.0) } else { 0.0 };
        let mut delta = 0.0;
        let mut node = |n: u32, own_now: f64, own_after: f64| {
            let c = self.ncpus(n) as f64;
            let d0 = d(n);
            let d1 = (d0 - own_now + own_after).max(0.0);
            delta += stretched(d1, c) - stretched(d0, c);
        };
        for &(n, share, own) in shares {
            node(n, own, demand * share);
        }
        for &(n, own) in cpu.iter().filter(|e| !t.contains(e.0)) {
            node(n, own, 0.0);
        }
        // Below a millionth of a CPU it is rounding, not contention.
        if delta.abs() > 1e-6 {
            delta
        } else {
            0.0
        }
    }

    /// What one point of locality is worth for `cg`: how much more its remote accesses cost
    /// than local ones, from the SLIT distance between where its CPU time and its memory are,
    /// averaged over (CPU node, memory node) pairs weighted by CPU share × memory share, as
    /// (d − 10) / 11 — 1.0 at the common two-socket distance 21, 0.09 between sub-NUMA clusters
    /// (11), 2.0 at 32. 1.0 when nothing is remote (or nothing is known).
    fn remote_weight(&self, cg: &CgroupObs) -> f64 {
        let cpu_total = cg.total_cpu_ns() as f64;
        let mem_total = cg.total_mem() as f64;
        if cpu_total <= 0.0 || mem_total <= 0.0 {
            return 1.0;
        }
        let (mut w, mut wd) = (0.0, 0.0);
        let mut mem_nodes: SmallVec<[u32; 8]> = cg
            .mem_bytes_per_node
            .keys()
            .chain(cg.hugepage_bytes_per_node.keys())
            .copied()
            .collect();
        mem_nodes.sort_unstable();
        mem_nodes.dedup();
        for (&c, &ns) in &cg.cpu_ns_per_node {
            for &m in &mem_nodes {
                if m == c {
                    continue;
                }
                let x = ns as f64 / cpu_total * cg.mem_on(m) as f64 / mem_total;
                w += x;
                wd += x * f64::from(self.topo.distance(c, m));
            }
        }
        if w <= 0.0 {
            return 1.0;
        }
        ((wd / w - 10.0) / 11.0).max(0.0)
    }

    /// [`Projection::pool_of`], borrowed for one node (no copy of a node's CPU set).
    fn pool_ref(&self, t: &CpuSet) -> std::borrow::Cow<'_, CpuSet> {
        match t
            .first()
            .filter(|_| t.len() == 1)
            .and_then(|n| self.pool(n))
        {
            Some(p) => std::borrow::Cow::Borrowed(p),
            None => std::borrow::Cow::Owned(self.pool_of(t)),
        }
    }

    fn pool_of(&self, t: &CpuSet) -> CpuSet {
        t.iter()
            .filter_map(|n| self.pool(n))
            .fold(CpuSet::new(), |a, p| a.union(p))
    }

    /// The cpuset.mems a move to nodes `t` writes: `t`, unless it names a node without memory,
    /// which the kernel refuses there; then [`Topology::memory_nodes`] (the nearest memory
    /// nodes stand in for it, as admission writes them).
    pub fn mems_of<'a>(&self, t: &'a CpuSet) -> std::borrow::Cow<'a, CpuSet> {
        if t.is_disjoint(&self.without_memory) {
            std::borrow::Cow::Borrowed(t)
        } else {
            std::borrow::Cow::Owned(self.topo.memory_nodes(t))
        }
    }

    /// The share of `cg`'s CPU time on `t` that would run on nodes of `t` with memory (as
    /// `locality::expected_after` spreads it: like today's time there, uniformly when it has
    /// none); 1.0 when all of `t` has memory.
    fn with_memory_share(&self, cg: &CgroupObs, t: &CpuSet) -> f64 {
        if t.is_disjoint(&self.without_memory) {
            return 1.0;
        }
        let on = |n: u32| cg.cpu_ns_per_node.get(&n).copied().unwrap_or(0);
        let total = t.iter().fold(0u64, |a, n| a.saturating_add(on(n)));
        let with: Vec<u32> = t
            .iter()
            .filter(|n| !self.without_memory.contains(*n))
            .collect();
        if total == 0 {
            return with.len() as f64 / t.len().max(1) as f64;
        }
        with.iter().fold(0u64, |a, &n| a.saturating_add(on(n))) as f64 / total as f64
    }

    /// The cpuset a chosen option writes.
    pub fn to_cpus(&self, cg: &CgroupObs, opt: TargetOption<'_>) -> CpuSet {
        match opt.picked {
            Some(p) => p.clone(),
            None if opt.keep_cpus => cg.cpus.clone(),
            None => self.pool_of(&opt.considered.nodes),
        }
    }

    /// `need` CPUs of free whole cores in `nodes` (own exclusive CPUs count as free), lowest
    /// ids first; the last core may be used in part when `need` is not a multiple of its size.
    fn pick_cores(&self, nodes: &CpuSet, need: u32, own: &CpuSet) -> CpuSet {
        let free = nodes
            .iter()
            .filter_map(|n| self.topo.node(n))
            .fold(CpuSet::new(), |a, node| {
                a.union(
                    &node
                        .cpus
                        .difference(&self.reserved)
                        .difference(&self.excl_held.difference(own)),
                )
            });
        let mut out = CpuSet::new();
        let mut left = need as usize;
        for cpu in free.iter() {
            if left == 0 {
                break;
            }
            if out.contains(cpu) {
                continue;
            }
            let sib = self
                .topo
                .cpu(cpu)
                .map_or_else(|| CpuSet::from_iter([cpu]), |c| c.siblings.clone());
            if !sib.is_subset(&free) {
                continue;
            }
            for s in sib.iter().take(left) {
                out.insert(s);
            }
            left = need as usize - out.len().min(need as usize);
        }
        out
    }

    /// Records an accepted move: memory, hugepages, load, exclusive CPUs, budget, count.
    pub fn accept(&mut self, obs: &Observations, cg: &CgroupObs, opt: TargetOption<'_>) {
        let t = &opt.considered.nodes;
        let mut normal_out = 0u64;
        let mut huge_out = 0u64;
        for (&n, &b) in &cg.mem_bytes_per_node {
            if !t.contains(n) {
                if let Some(i) = self.index.get(n) {
                    self.free[i] = self.free[i].saturating_add(b);
                }
                normal_out = normal_out.saturating_add(b);
            }
        }
        for (&n, &b) in &cg.hugepage_bytes_per_node {
            if !t.contains(n) {
                if let Some(i) = self.index.get(n) {
                    self.free_huge[i] = self.free_huge[i].saturating_add(b);
                }
                huge_out = huge_out.saturating_add(b);
            }
        }
        let demand = obs.wanted_demand(cg);
        for (&n, &ns) in &cg.cpu_ns_per_node {
            let Some(i) = self.index.get(n) else { continue };
            let ncpu = self.ncpus[i].max(1) as f64;
            // What it wanted leaves the run queue. The busy share: where the queue was
            // measured, the tasks left fill the CPUs up to their queue; elsewhere the CPU time
            // it ran leaves it.
            self.demand[i] = (self.demand[i] - Self::demand_on(obs, cg, n)).max(0.0);
            self.busy[i] = if self.measured[i] {
                (self.demand[i] / ncpu).min(self.busy[i])
            } else {
                (self.busy[i] - Self::ns_demand(obs, ns) / ncpu).max(0.0)
            };
        }
        for (n, share, _) in cpu_after(obs, cg, t) {
            let Some(i) = self.index.get(n) else { continue };
            let ncpu = self.ncpus[i].max(1) as f64;
            self.busy[i] += demand * share / ncpu;
            self.demand[i] += demand * share;
            self.free[i] = self.free[i].saturating_sub((normal_out as f64 * share) as u64);
            self.free_huge[i] = self.free_huge[i].saturating_sub((huge_out as f64 * share) as u64);
        }
        if cg.constraints.exclusive {
            let to = self.to_cpus(cg, opt);
            self.excl_held = self.excl_held.difference(&cg.cpus).union(&to);
            self.refresh_pools();
        }
        self.budget_left = self
            .budget_left
            .saturating_sub(opt.considered.bytes_to_migrate);
        self.moves_left = self.moves_left.saturating_sub(1);
        self.dirty = true;
    }

    /// Records a round of a staged move: `bytes` of memory move to `toward` (spread evenly;
    /// the sources' free memory is not credited until it shows), budget, count.
    pub fn accept_pages(&mut self, toward: &CpuSet, bytes: u64) {
        let k = toward.len().max(1) as u64;
        for n in toward.iter() {
            if let Some(i) = self.index.get(n) {
                self.free[i] = self.free[i].saturating_sub(bytes / k);
            }
        }
        self.budget_left = self.budget_left.saturating_sub(bytes);
        self.moves_left = self.moves_left.saturating_sub(1);
        self.dirty = true;
    }

    /// Whether `cg` may use `node`: its allowed nodes, and for a cgroup whose CPUs are the
    /// operator's (`keep_cpus`), only nodes holding some of those CPUs.
    fn allowed(&self, cg: &CgroupObs, node: u32) -> bool {
        cg.constraints
            .allowed_nodes
            .as_ref()
            .is_none_or(|a| a.contains(node))
            && (!cg.constraints.keep_cpus
                || self
                    .topo
                    .node(node)
                    .is_some_and(|n| !n.cpus.is_disjoint(&cg.cpus)))
    }
}

#[cfg(test)]
#[path = "target_props.rs"]
mod props;

/// Node id → position in `topo.nodes` (the last one, should an id repeat): a table indexed by
/// id for the small ids machines have, a sorted list otherwise.
struct NodeIndex {
    dense: Vec<u32>,
    sparse: Vec<(u32, usize)>,
}

impl NodeIndex {
    const DENSE_MAX: u32 = 4096;
    const NONE: u32 = u32::MAX;

    fn new(topo: &Topology) -> Self {
        let max = topo.nodes.iter().map(|n| n.id).max();
        if max.is_some_and(|m| m < Self::DENSE_MAX) {
            let mut dense = vec![Self::NONE; max.map_or(0, |m| m as usize + 1)];
            for (i, n) in topo.nodes.iter().enumerate() {
                dense[n.id as usize] = i as u32;
            }
            return NodeIndex {
                dense,
                sparse: Vec::new(),
            };
        }
        let mut sparse: Vec<(u32, usize)> = Vec::with_capacity(topo.nodes.len());
        for (i, n) in topo.nodes.iter().enumerate() {
            sparse.push((n.id, i));
        }
        // Stable: of a repeated id, the last position stays last and is kept.
        sparse.sort_by_key(|e| e.0);
        let mut uniq: Vec<(u32, usize)> = Vec::with_capacity(sparse.len());
        for e in sparse {
            match uniq.last_mut() {
                Some(l) if l.0 == e.0 => *l = e,
                _ => uniq.push(e),
            }
        }
        NodeIndex {
            dense: Vec::new(),
            sparse: uniq,
        }
    }

    #[inline]
    fn get(&self, id: u32) -> Option<usize> {
        if self.sparse.is_empty() {
            return match self.dense.get(id as usize) {
                Some(&i) if i != Self::NONE => Some(i as usize),
                _ => None,
            };
        }
        self.sparse
            .binary_search_by_key(&id, |e| e.0)
            .ok()
            .map(|k| self.sparse[k].1)
    }
}

/// How long `node` has been overloaded (pressure — runnable demand per CPU where measured,
/// else the busy share — at or above `overload_busy`) without a break, this period included, at
/// most the horizon: from the state's pressure history (which `observe` extended with this
/// period), or this period alone when the state has none for the node.
fn overload_ms(
    obs: &Observations,
    state: &ControllerState,
    cfg: &ControllerConfig,
    node: u32,
) -> u64 {
    let hot = |p: f64| p >= cfg.overload_busy;
    let periods = match state.node_pressure.get(&node).filter(|h| !h.is_empty()) {
        Some(h) => h.iter().rev().take_while(|&&p| hot(p)).count() as u64,
        None => u64::from(hot(obs.nodes.get(&node).map_or(1.0, NodeObs::pressure))),
    };
    (periods.saturating_mul(obs.period_ns) / 1_000_000).min(cfg.horizon_ms)
}

/// Sum that saturates instead of overflowing on absurd input.
fn sat_sum<'a>(it: impl Iterator<Item = &'a u64>) -> u64 {
    it.fold(0u64, |a, &b| a.saturating_add(b))
}

/// CPU share per target node after a move (sums to 1): today's time on those nodes,
/// renormalised, or uniform when it has none there; with the demand it has there today.
fn cpu_after<'a>(
    obs: &'a Observations,
    cg: &'a CgroupObs,
    t: &'a CpuSet,
) -> impl Iterator<Item = (u32, f64, f64)> + 'a {
    let on_t: f64 = t.iter().map(|n| Projection::demand_on(obs, cg, n)).sum();
    let k = t.len().max(1) as f64;
    t.iter().map(move |n| {
        let own = Projection::demand_on(obs, cg, n);
        let share = if on_t > 0.0 { own / on_t } else { 1.0 / k };
        (n, share, own)
    })
}

//! CPU Manager static policy: exclusive whole CPUs taken by topology (kubelet's
//! `cpu_assignment.go` `takeByTopologyNUMAPacked` / `takeByTopologyNUMADistributed` and
//! `policy_static.go` `allocateCPUs` / `generateCPUTopologyHints`), with the options
//! full-pcpus-only, distribute-cpus-across-numa, align-by-socket and
//! prefer-align-cpus-by-uncorecache, and TAP's topology-cluster-affinity (`take_clusters`: whole
//! CPU clusters first, a remainder inside one cluster). Pure and deterministic: every order is
//! by (free count, id).
//!
//! The shared (Burstable / BestEffort) pools live in `shared.rs`.

use std::collections::BTreeMap;

use crate::cpuset::CpuSet;
use crate::placement::cpu_take::{self, CpuInfo, CpuTopology, Strategy, TakeError};
use crate::placement::{NodeMask, TopologyHint};
use crate::topology::Topology;

/// Why exclusive CPUs could not be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuError {
    /// kubelet's `SMTAlignmentError` (full-pcpus-only).
    #[error("SMT alignment error: requested {requested} CPUs not a multiple of {per_core} CPUs per core, or not enough free whole cores ({free_cores_cpus} CPUs in free cores)")]
    SmtAlignment {
        requested: usize,
        per_core: usize,
        free_cores_cpus: usize,
    },
    #[error("not enough CPUs available to satisfy request: requested={requested}, available={available}")]
    Insufficient { requested: usize, available: usize },
    /// kubelet's take failed otherwise (its "failed to allocate cpus" / accounting errors).
    #[error("{0}")]
    Take(TakeError),
}

impl From<TakeError> for CpuError {
    fn from(e: TakeError) -> CpuError {
        match e {
            TakeError::NotEnough {
                requested,
                available,
            } => CpuError::Insufficient {
                requested,
                available,
            },
            other => CpuError::Take(other),
        }
    }
}

/// Options of the static policy (kubelet `--cpu-manager-policy-options`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StaticOptions {
    pub full_pcpus_only: bool,
    pub distribute_across_numa: bool,
    /// distribute-cpus-across-cores: one CPU per core before any core's second thread.
    pub distribute_across_cores: bool,
    pub align_by_socket: bool,
    pub prefer_align_by_uncorecache: bool,
    /// TAP topology-cluster-affinity: pack into as few whole CPU clusters as possible.
    pub cluster_affinity: bool,
}

impl StaticOptions {
    /// The options as the placement config sets them (kubelet's policy options).
    pub fn of(cfg: &crate::config::PlacementConfig) -> Self {
        StaticOptions {
            full_pcpus_only: cfg.full_pcpus_only,
            distribute_across_numa: cfg.distribute_cpus_across_numa,
            distribute_across_cores: cfg.distribute_cpus_across_cores,
            align_by_socket: cfg.align_by_socket,
            prefer_align_by_uncorecache: cfg.prefer_align_cpus_by_uncorecache,
            cluster_affinity: cfg.topology_cluster_affinity,
        }
    }
}

/// Read-only index of the online CPUs by node, socket, core and L3 group.
#[derive(Clone, Debug)]
pub struct CpuView {
    pub online: CpuSet,
    node_of: BTreeMap<u32, u32>,
    socket_of: BTreeMap<u32, u32>,
    core_of: BTreeMap<u32, u32>,
    l3_of: BTreeMap<u32, u32>,
    pub nodes: BTreeMap<u32, CpuSet>,
    pub sockets: BTreeMap<u32, CpuSet>,
    pub cores: BTreeMap<u32, CpuSet>,
    pub l3s: BTreeMap<u32, CpuSet>,
    /// CPU clusters (cores sharing an L2 / L3 tag) by their first CPU; empty without clusters.
    pub clusters: BTreeMap<u32, CpuSet>,
    /// (socket, die) → CPUs.
    pub dies: BTreeMap<(u32, u32), CpuSet>,
    pub cpus_per_core: usize,
    /// The same CPUs as kubelet's `CPUTopology`, for the take (`cpu_take`).
    pub kubelet: CpuTopology,
}

impl CpuView {
    /// Indexes the online CPUs that belong to a node. A core is keyed by its smallest sibling
    /// id; an L3 group by the topology's `l3` id (or the node when unknown).
    pub fn new(topo: &Topology) -> CpuView {
        let mut v = CpuView {
            online: CpuSet::new(),
            node_of: BTreeMap::new(),
            socket_of: BTreeMap::new(),
            core_of: BTreeMap::new(),
            l3_of: BTreeMap::new(),
            nodes: BTreeMap::new(),
            sockets: BTreeMap::new(),
            cores: BTreeMap::new(),
            l3s: BTreeMap::new(),
            clusters: BTreeMap::new(),
            dies: BTreeMap::new(),
            cpus_per_core: 1,
            kubelet: CpuTopology::new([]),
        };
        let mut infos = Vec::new();
        for c in topo.cpus.iter().filter(|c| c.online) {
            let Some(node) = c.node else { continue };
            let core = c.siblings.first().unwrap_or(c.id).min(c.id);
            let l3 = c.l3.unwrap_or(u32::MAX - node);
            v.online.insert(c.id);
            v.node_of.insert(c.id, node);
            v.socket_of.insert(c.id, c.socket);
            v.core_of.insert(c.id, core);
            v.l3_of.insert(c.id, l3);
            v.nodes.entry(node).or_default().insert(c.id);
            v.sockets.entry(c.socket).or_default().insert(c.id);
            v.cores.entry(core).or_default().insert(c.id);
            v.l3s.entry(l3).or_default().insert(c.id);
            if let Some(k) = c.cluster {
                v.clusters.entry(k).or_default().insert(c.id);
            }
            v.dies.entry((c.socket, c.die)).or_default().insert(c.id);
            // kubelet's discovery: a core by its lowest thread id, the uncore cache by the L3
            // id or, without one, the socket
            infos.push(CpuInfo {
                cpu: c.id,
                core,
                socket: c.socket,
                numa: node,
                uncore: c.l3.unwrap_or(c.socket),
            });
        }
        v.kubelet = CpuTopology::new(infos);
        v.cpus_per_core = v.cores.values().map(|s| s.len()).max().unwrap_or(1).max(1);
        v
    }

    pub fn node_of(&self, cpu: u32) -> Option<u32> {
        self.node_of.get(&cpu).copied()
    }

    /// Nodes that own at least one CPU, as a mask.
    pub fn node_mask(&self) -> NodeMask {
        NodeMask::from_ids(self.nodes.keys().copied()).unwrap_or_default()
    }

    /// Nodes of a set of CPUs.
    pub fn nodes_of(&self, cpus: &CpuSet) -> NodeMask {
        NodeMask::from_ids(cpus.iter().filter_map(|c| self.node_of(c))).unwrap_or_default()
    }

    /// CPUs of the nodes in `mask`.
    pub fn cpus_of_mask(&self, mask: NodeMask) -> CpuSet {
        let mut cpus = CpuSet::new();
        for s in mask.ids().filter_map(|n| self.nodes.get(&n)) {
            cpus.union_with(s);
        }
        cpus
    }

    /// CPUs in fully free cores of `available`.
    pub fn free_core_cpus(&self, available: &CpuSet) -> CpuSet {
        self.cores
            .values()
            .filter(|c| c.len() == self.cpus_per_core && c.is_subset(available))
            .fold(CpuSet::new(), |mut a, s| {
                a.union_with(s);
                a
            })
    }

    fn sockets_first(&self) -> bool {
        // kubelet: NUMA first when sockets >= NUMA nodes (a node spans whole sockets).
        self.sockets.len() < self.nodes.len()
    }
}

/// Ids of groups sorted like kubelet's `sort`: available CPUs ascending, then id.
fn sorted<K: Copy + Ord>(groups: impl Iterator<Item = (K, usize)>) -> Vec<K> {
    let mut v: Vec<(usize, K)> = groups.filter(|g| g.1 > 0).map(|(k, n)| (n, k)).collect();
    v.sort();
    v.into_iter().map(|(_, k)| k).collect()
}

/// kubelet's `cpuAccumulator`.
struct Acc<'a> {
    v: &'a CpuView,
    avail: CpuSet,
    need: usize,
    result: CpuSet,
}

impl<'a> Acc<'a> {
    fn new(v: &'a CpuView, available: &CpuSet, need: usize) -> Self {
        Acc {
            v,
            avail: available.intersection(&v.online),
            need,
            result: CpuSet::new(),
        }
    }

    fn take(&mut self, cpus: &CpuSet) {
        let cpus = cpus.intersection(&self.avail);
        self.result = self.result.union(&cpus);
        self.avail = self.avail.difference(&cpus);
        self.need = self.need.saturating_sub(cpus.len());
    }

    fn satisfied(&self) -> bool {
        self.need == 0
    }

    fn count(&self, s: &CpuSet) -> usize {
        s.intersection(&self.avail).len()
    }

    fn sorted_sockets(&self) -> Vec<u32> {
        if self.v.sockets_first() {
            sorted(self.v.sockets.iter().map(|(k, s)| (*k, self.count(s))))
        } else {
            let mut out = Vec::new();
            for n in self.sorted_nodes() {
                let ns = &self.v.nodes[&n];
                let socks = sorted(
                    self.v
                        .sockets
                        .iter()
                        .filter(|(_, s)| !s.is_disjoint(ns))
                        .map(|(k, s)| (*k, self.count(s))),
                );
                for s in socks {
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
            }
            out
        }
    }

    fn sorted_nodes(&self) -> Vec<u32> {
        if self.v.sockets_first() {
            let mut out = Vec::new();
            for s in self.sorted_sockets() {
                let ss = &self.v.sockets[&s];
                out.extend(sorted(
                    self.v
                        .nodes
                        .iter()
                        .filter(|(_, n)| !n.is_disjoint(ss))
                        .map(|(k, n)| (*k, self.count(n))),
                ));
            }
            out
        } else {
            sorted(self.v.nodes.iter().map(|(k, s)| (*k, self.count(s))))
        }
    }

    fn cores_within(&self, within: &CpuSet) -> Vec<u32> {
        sorted(
            self.v
                .cores
                .iter()
                .filter(|(_, c)| c.is_subset(within) || !c.is_disjoint(within))
                .map(|(k, c)| (*k, self.count(c))),
        )
    }

    fn sorted_cores(&self) -> Vec<u32> {
        let parents: Vec<CpuSet> = if self.v.sockets_first() {
            self.sorted_nodes()
                .iter()
                .map(|n| self.v.nodes[n].clone())
                .collect()
        } else {
            self.sorted_sockets()
                .iter()
                .map(|s| self.v.sockets[s].clone())
                .collect()
        };
        let mut out = Vec::new();
        for p in parents {
            for c in self.cores_within(&p) {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        out
    }

    fn sorted_cpus(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for c in self.sorted_cores() {
            out.extend(self.v.cores[&c].intersection(&self.avail).iter());
        }
        out
    }

    fn take_full_nodes(&mut self) {
        for n in self.sorted_nodes() {
            let all = self.v.nodes[&n].clone();
            if self.count(&all) == all.len() && self.need >= all.len() {
                self.take(&all);
            }
        }
    }

    fn take_full_sockets(&mut self) {
        for s in self.sorted_sockets() {
            let all = self.v.sockets[&s].clone();
            if self.count(&all) == all.len() && self.need >= all.len() {
                self.take(&all);
            }
        }
    }

    fn take_full_cores(&mut self) {
        for c in self.sorted_cores() {
            let all = self.v.cores[&c].clone();
            if all.len() == self.v.cpus_per_core
                && self.count(&all) == all.len()
                && self.need >= all.len()
            {
                self.take(&all);
            }
        }
    }

    fn take_remaining(&mut self) {
        for cpu in self.sorted_cpus() {
            if self.satisfied() {
                return;
            }
            self.take(&std::iter::once(cpu).collect());
        }
    }

    /// prefer-align-cpus-by-uncorecache: whole free L3 groups while the need is at least one
    /// group, then the rest inside a single L3 group that can hold it (whole cores first).
    fn take_uncore(&mut self) {
        let order: Vec<u32> = {
            let mut out = Vec::new();
            for n in self.sorted_nodes() {
                let ns = &self.v.nodes[&n];
                for l in sorted(
                    self.v
                        .l3s
                        .iter()
                        .filter(|(_, l)| l.is_subset(ns))
                        .map(|(k, l)| (*k, self.count(l))),
                ) {
                    if !out.contains(&l) {
                        out.push(l);
                    }
                }
            }
            out
        };
        for &l in &order {
            let all = self.v.l3s[&l].clone();
            if self.count(&all) == all.len() && self.need >= all.len() {
                self.take(&all);
            }
            if self.satisfied() {
                return;
            }
        }
        for &l in &order {
            let all = self.v.l3s[&l].clone();
            let free = all.intersection(&self.avail);
            if free.len() < self.need {
                continue;
            }
            let full = self.v.free_core_cpus(&free);
            if full.len() < self.need && self.need.is_multiple_of(self.v.cpus_per_core) {
                // would split cores although whole cores were asked for
                continue;
            }
            let sub = take_packed(self.v, &free, self.need, false).unwrap_or_default();
            self.take(&sub);
            return;
        }
    }
}

impl Acc<'_> {
    /// Clusters in take order: by node (kubelet's node order), then fewest free CPUs first.
    fn sorted_clusters(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for n in self.sorted_nodes() {
            let ns = &self.v.nodes[&n];
            for k in sorted(
                self.v
                    .clusters
                    .iter()
                    .filter(|(_, c)| !c.is_disjoint(ns))
                    .map(|(k, c)| (*k, self.count(c))),
            ) {
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        out
    }

    /// TAP topology-cluster-affinity: whole free clusters while the need is at least one
    /// cluster; the rest inside the single cluster with the fewest free CPUs that holds it
    /// (best fit, so whole clusters stay whole); failing that, within the first node that can
    /// hold the rest, from the clusters with the most free CPUs first (as few clusters as
    /// possible). Whole cores first inside a cluster (`take_packed`).
    fn take_clusters(&mut self) {
        let order = self.sorted_clusters();
        for &k in &order {
            let all = self.v.clusters[&k].clone();
            if self.count(&all) == all.len() && self.need >= all.len() {
                self.take(&all);
            }
            if self.satisfied() {
                return;
            }
        }
        let whole_cores = self.need.is_multiple_of(self.v.cpus_per_core);
        let best_fit = order
            .iter()
            .map(|k| self.v.clusters[k].intersection(&self.avail))
            .filter(|free| free.len() >= self.need)
            .filter(|free| !whole_cores || self.v.free_core_cpus(free).len() >= self.need)
            .min_by_key(|free| free.len());
        if let Some(free) = best_fit {
            let sub = take_packed(self.v, &free, self.need, false).unwrap_or_default();
            self.take(&sub);
            return;
        }
        for n in self.sorted_nodes() {
            let ns = self.v.nodes[&n].clone();
            if self.count(&ns) < self.need {
                continue;
            }
            let mut within: Vec<CpuSet> = order
                .iter()
                .map(|k| {
                    self.v.clusters[k]
                        .intersection(&ns)
                        .intersection(&self.avail)
                })
                .filter(|free| !free.is_empty())
                .collect();
            // most free first; the stable sort keeps the take order among equals
            within.sort_by_key(|free| std::cmp::Reverse(free.len()));
            for free in within {
                let k = free.len().min(self.need);
                let sub = take_packed(self.v, &free, k, false).unwrap_or_default();
                self.take(&sub);
                if self.satisfied() {
                    return;
                }
            }
            return;
        }
    }
}

/// kubelet's `takeByTopologyNUMAPacked`.
pub fn take_packed(
    v: &CpuView,
    available: &CpuSet,
    n: usize,
    prefer_uncore: bool,
) -> Result<CpuSet, CpuError> {
    take_packed_with(v, available, n, prefer_uncore, false)
}

/// [`take_packed`], with TAP's cluster packing (`clusters`) after whole sockets and nodes and
/// before the L3 groups, cores and single CPUs.
pub fn take_packed_with(
    v: &CpuView,
    available: &CpuSet,
    n: usize,
    prefer_uncore: bool,
    clusters: bool,
) -> Result<CpuSet, CpuError> {
    let mut acc = Acc::new(v, available, n);
    if acc.satisfied() {
        return Ok(acc.result);
    }
    if acc.need > acc.avail.len() {
        return Err(CpuError::Insufficient {
            requested: n,
            available: acc.avail.len(),
        });
    }
    if v.sockets_first() {
        acc.take_full_sockets();
        if !acc.satisfied() {
            acc.take_full_nodes();
        }
    } else {
        acc.take_full_nodes();
        if !acc.satisfied() {
            acc.take_full_sockets();
        }
    }
    if !acc.satisfied() && clusters && !v.clusters.is_empty() {
        acc.take_clusters();
    }
    if !acc.satisfied() && prefer_uncore {
        acc.take_uncore();
    }
    if !acc.satisfied() {
        acc.take_full_cores();
    }
    if !acc.satisfied() {
        acc.take_remaining();
    }
    if !acc.satisfied() {
        return Err(CpuError::Insufficient {
            requested: n,
            available: available.len(),
        });
    }
    Ok(acc.result)
}

fn std_dev(xs: &[i64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let m = xs.iter().sum::<i64>() as f64 / xs.len() as f64;
    let m = (m * 1000.0).round() / 1000.0;
    let s = (xs.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / xs.len() as f64).sqrt();
    (s * 1000.0).round() / 1000.0
}

/// Calls `f` on every k-subset of `items` in lexicographic order.
fn combinations(items: &[u32], k: usize, f: &mut dyn FnMut(&[u32])) {
    fn go(items: &[u32], k: usize, start: usize, acc: &mut Vec<u32>, f: &mut dyn FnMut(&[u32])) {
        if acc.len() == k {
            f(acc);
            return;
        }
        for i in start..items.len() {
            if items.len() - i < k - acc.len() {
                break;
            }
            acc.push(items[i]);
            go(items, k, i + 1, acc, f);
            acc.pop();
        }
    }
    if k >= 1 && k <= items.len() {
        go(items, k, 0, &mut Vec::new(), f);
    }
}

/// kubelet's `takeByTopologyNUMADistributed`: spread evenly (in groups of `group`) over the
/// fewest NUMA nodes that can hold the request, choosing the most balanced combination; falls
/// back to packing when no combination balances.
pub fn take_distributed(
    v: &CpuView,
    available: &CpuSet,
    n: usize,
    group: usize,
    clusters: bool,
) -> Result<CpuSet, CpuError> {
    let acc = Acc::new(v, available, n);
    if n == 0 {
        return Ok(CpuSet::new());
    }
    if n > acc.avail.len() {
        return Err(CpuError::Insufficient {
            requested: n,
            available: acc.avail.len(),
        });
    }
    let group = group.max(1);
    let numas = acc.sorted_nodes();
    let free = |id: u32| acc.count(&v.nodes[&id]) as i64;
    let num_nodes = v.nodes.len().max(1);
    let groups_total = (v.online.len().max(1) - 1) / group + 1;
    let groups_per_node = (groups_total - 1) / num_nodes + 1;
    let groups_needed = (n - 1) / group + 1;
    let min_k = (groups_needed - 1) / groups_per_node + 1;
    let max_k = groups_needed.min(numas.len());
    let g = group as i64;
    for k in min_k..=max_k {
        let mut best: Option<(f64, Vec<u32>, Vec<u32>)> = None;
        combinations(&numas, k, &mut |combo: &[u32]| {
            if best.as_ref().is_some_and(|b| b.0 == 0.0) {
                return;
            }
            let total: i64 = combo.iter().map(|&c| free(c)).sum();
            if total < n as i64 {
                return;
            }
            let groups: i64 = combo.iter().map(|&c| free(c) / g).sum();
            if groups * g < n as i64 {
                return;
            }
            let dist = (n as i64 / combo.len() as i64 / g) * g;
            if combo.iter().any(|&c| free(c) < dist) {
                return;
            }
            let mut after: BTreeMap<u32, i64> = numas.iter().map(|&c| (c, free(c))).collect();
            for c in combo {
                *after.get_mut(c).expect("combo node") -= dist;
            }
            let remainder = n as i64 - dist * combo.len() as i64;
            let rem_combo: Vec<u32> = combo.iter().copied().filter(|c| after[c] >= g).collect();
            let mut local: Option<(f64, Vec<u32>)> = None;
            if remainder == 0 {
                local = Some((
                    std_dev(&after.values().copied().collect::<Vec<_>>()),
                    vec![],
                ));
            }
            let mut kk = rem_combo.len();
            while remainder > 0 && kk >= 1 {
                combinations(&rem_combo, kk, &mut |subset: &[u32]| {
                    let mut after = after.clone();
                    if subset.iter().map(|c| after[c]).sum::<i64>() < remainder {
                        return;
                    }
                    let mut r = remainder;
                    while r > 0 {
                        let before = r;
                        for c in subset {
                            if r == 0 {
                                break;
                            }
                            if after[c] < g {
                                continue;
                            }
                            *after.get_mut(c).expect("subset node") -= g;
                            r -= g;
                        }
                        if r == before {
                            return;
                        }
                    }
                    let bal = std_dev(&after.values().copied().collect::<Vec<_>>());
                    if local.as_ref().is_none_or(|l| bal < l.0) {
                        local = Some((bal, subset.to_vec()));
                    }
                });
                kk -= 1;
            }
            if let Some((bal, rem)) = local {
                if best.as_ref().is_none_or(|b| bal < b.0) {
                    best = Some((bal, combo.to_vec(), rem));
                }
            }
        });
        let Some((_, combo, rem)) = best else {
            continue;
        };
        let mut result = CpuSet::new();
        let mut left = available.intersection(&v.online);
        let dist = (n / combo.len() / group) * group;
        for c in &combo {
            let got = take_packed_with(v, &left.intersection(&v.nodes[c]), dist, false, clusters)?;
            left = left.difference(&got);
            result = result.union(&got);
        }
        let mut remainder = n - dist * combo.len();
        while remainder > 0 {
            let before = remainder;
            for c in &rem {
                if remainder == 0 {
                    break;
                }
                let take = group.min(remainder);
                let got =
                    take_packed_with(v, &left.intersection(&v.nodes[c]), take, false, clusters)?;
                left = left.difference(&got);
                result = result.union(&got);
                remainder -= take;
            }
            if before == remainder {
                break;
            }
        }
        if result.len() == n {
            return Ok(result);
        }
    }
    take_packed_with(v, available, n, false, clusters)
}

/// kubelet's `takeByTopology` dispatch on the options: `cpu_take`, the very code
/// `rebalancer hints cpu` runs. TAP's topology-cluster-affinity, which kubelet does not have,
/// keeps its own cluster packing where the machine has CPU clusters.
pub fn take_by_topology(
    v: &CpuView,
    available: &CpuSet,
    n: usize,
    opts: &StaticOptions,
) -> Result<CpuSet, CpuError> {
    let available = available.intersection(&v.online);
    if opts.cluster_affinity && !v.clusters.is_empty() {
        if opts.distribute_across_numa {
            let group = if opts.full_pcpus_only {
                v.cpus_per_core
            } else {
                1
            };
            return take_distributed(v, &available, n, group, true);
        }
        return take_packed_with(v, &available, n, opts.prefer_align_by_uncorecache, true);
    }
    let strategy = if opts.distribute_across_cores {
        Strategy::Spread
    } else {
        Strategy::Packed
    };
    let got = if opts.distribute_across_numa {
        // kubelet's cpuGroupSize: CPUs per core under full-pcpus-only, else 1
        let group = if opts.full_pcpus_only {
            v.kubelet.cpus_per_core().max(1)
        } else {
            1
        };
        cpu_take::take_distributed(&v.kubelet, &available, n, group, strategy)
    } else {
        cpu_take::take_packed(
            &v.kubelet,
            &available,
            n,
            strategy,
            opts.prefer_align_by_uncorecache,
        )
    };
    Ok(got?)
}

/// kubelet's `allocateCPUs`: checks full-pcpus-only, then takes from the CPUs aligned with
/// `affinity` first (its nodes, or with align-by-socket their whole sockets), the rest anywhere.
pub fn allocate_exclusive(
    v: &CpuView,
    available: &CpuSet,
    n: usize,
    affinity: Option<NodeMask>,
    opts: &StaticOptions,
) -> Result<CpuSet, CpuError> {
    let available = available.intersection(&v.online);
    if opts.full_pcpus_only {
        let free_cores = v.free_core_cpus(&available).len();
        if !n.is_multiple_of(v.cpus_per_core) || n > free_cores {
            return Err(CpuError::SmtAlignment {
                requested: n,
                per_core: v.cpus_per_core,
                free_cores_cpus: free_cores,
            });
        }
    }
    if n > available.len() {
        return Err(CpuError::Insufficient {
            requested: n,
            available: available.len(),
        });
    }
    let mut result = CpuSet::new();
    if let Some(mask) = affinity {
        let nodes = v.cpus_of_mask(mask);
        // kubelet's getAlignedCPUs: the affinity's NUMA nodes, or with align-by-socket every
        // socket they touch, whole (so a container can get CPUs of its socket off its memory's
        // nodes while those have room, as kubelet gives them)
        let aligned = if opts.align_by_socket {
            (v.sockets.values())
                .filter(|s| !s.is_disjoint(&nodes))
                .fold(CpuSet::new(), |a, s| a.union(s))
        } else {
            nodes
        }
        .intersection(&available);
        result = take_by_topology(v, &aligned, aligned.len().min(n), opts)?;
    }
    let rest = take_by_topology(v, &available.difference(&result), n - result.len(), opts)?;
    Ok(result.union(&rest))
}

/// Masks over the CPU nodes to enumerate for hints: all of them (kubelet's
/// `IterateBitMasks`) for up to `FULL_ENUMERATION_NODES` nodes; past that only masks up to the
/// narrowest satisfying width plus one, and the all-nodes mask (wider masks are never
/// preferred and the merge only reaches them through the all-nodes fallback).
pub const FULL_ENUMERATION_NODES: usize = 12;

/// All non-empty sub-masks of `nodes` in (popcount, value) order, limited as described at
/// [`FULL_ENUMERATION_NODES`] with `fits(mask)` telling whether a mask could ever satisfy.
pub fn candidate_masks(nodes: NodeMask, fits: &dyn Fn(NodeMask) -> bool) -> Vec<NodeMask> {
    let ids: Vec<u32> = nodes.ids().collect();
    let mut out = Vec::new();
    let max_w = if ids.len() <= FULL_ENUMERATION_NODES {
        ids.len()
    } else {
        let mut w = ids.len();
        for k in 1..=ids.len() {
            let mut any = false;
            combinations(&ids, k, &mut |c: &[u32]| {
                if !any {
                    any = fits(NodeMask::from_ids(c.iter().copied()).unwrap_or_default());
                }
            });
            if any {
                w = (k + 1).min(ids.len());
                break;
            }
        }
        w
    };
    for k in 1..=max_w {
        combinations(&ids, k, &mut |c: &[u32]| {
            out.push(NodeMask::from_ids(c.iter().copied()).unwrap_or_default())
        });
    }
    if max_w < ids.len() {
        out.push(nodes);
    }
    out
}

/// kubelet's `generateCPUTopologyHints`: a hint for every node mask whose available CPUs,
/// with the pod's `reusable` ones (its init containers' CPUs, kubelet's `cpusToReuse`), can
/// hold `request`; a mask missing a node of a reusable CPU is no hint at all, as in kubelet.
/// Preferred when its width is the minimal width that could hold the request on an empty
/// machine (or, with align-by-socket, when it is socket-aligned at that width).
pub fn exclusive_hints(
    v: &CpuView,
    available: &CpuSet,
    reusable: &CpuSet,
    request: usize,
    align_by_socket: bool,
) -> Vec<TopologyHint> {
    let all = v.node_mask();
    let total = |m: NodeMask| v.cpus_of_mask(m).len();
    let mut masks = candidate_masks(all, &|m| total(m) >= request);
    // Past FULL_ENUMERATION_NODES the candidates stop at the narrowest width + 1, which may drop
    // every mask holding all the nodes of the reusable CPUs (then no hint but all-nodes).
    // kubelet, enumerating every mask, offers the narrowest of them: those nodes themselves.
    let reuse_nodes = v.nodes_of(reusable);
    if !reuse_nodes.is_empty() && !masks.contains(&reuse_nodes) {
        let at = masks
            .iter()
            .position(|m| m.count() > reuse_nodes.count())
            .unwrap_or(masks.len());
        masks.insert(at, reuse_nodes);
    }
    let min_width = masks
        .iter()
        .filter(|m| total(**m) >= request)
        .map(|m| m.count())
        .min()
        .unwrap_or(all.count());
    let nodes_per_socket = v.nodes.len() / v.sockets.len().max(1);
    let mut hints = Vec::new();
    let free = available.difference(reusable);
    for m in masks {
        let in_mask = v.cpus_of_mask(m);
        if !reusable.difference(&in_mask).is_empty()
            || in_mask.intersection(&free).len() + reusable.len() < request
        {
            continue;
        }
        // kubelet's isHintSocketAligned: spans exactly the minimal number of sockets.
        let socket_aligned = align_by_socket && nodes_per_socket > 0 && {
            let min_sockets = (min_width as usize).div_ceil(nodes_per_socket);
            let cpus = v.cpus_of_mask(m);
            v.sockets.values().filter(|s| !s.is_disjoint(&cpus)).count() == min_sockets
        };
        let preferred = m.count() == min_width || socket_aligned;
        hints.push(TopologyHint::new(Some(m), preferred));
    }
    hints
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
mod tests;

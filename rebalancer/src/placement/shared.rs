//! Shared CPU pools for containers without exclusive CPUs (Burstable, fractional Guaranteed,
//! BestEffort), after the Kunpeng TAP policies:
//! - `numa-aware`: a cpuset of whole NUMA node(s) (their shared CPUs), least-allocated node
//!   first, adding nodes until the request fits;
//! - `topology-aware`: the tightest pool of the socket → die → NUMA → L3 tree that fits.
//!
//! With TAP's topology-cluster-affinity (`cluster_affinity`) containers go to CPU clusters
//! first, as TAP's guide says ("preferentially allocated at the cluster level"): topology-aware
//! has the clusters as its smallest pools, and numa-aware narrows a one-node pool to the
//! fewest whole clusters of that node (least allocated first) that carry the request.
//!
//! Requests are charged as millicores spread over the chosen CPUs; a node may be charged up to
//! `overcommit_ratio` × 1000 × its shared CPUs. BestEffort gets the whole shared pool.
//!
//! What *fits* is decided by the charges alone (requests, as kubelet's admission counts them);
//! which of the pools that fit comes *first* also counts the [`Overuse`] the daemon last
//! measured (tasks running and waiting beyond what was charged on a node): among nodes that
//! can carry a request, the one that is really less loaded gets it.

use std::collections::BTreeMap;

use crate::cpuset::CpuSet;
use crate::placement::cpu::CpuView;
use crate::placement::NodeMask;

/// Millicores charged per CPU.
pub type Charges = BTreeMap<u32, u64>;

/// Load measured beyond the books: per node, the millicores its tasks ran or waited to run
/// above what was booked there (shared charges plus 1000 per exclusive CPU) at the last
/// measurement (`Allocator::overuse`). Not persisted: a fresh daemon has measured nothing, and
/// admission then orders by the charges alone. Empty = nothing measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overuse {
    pub by_node: BTreeMap<u32, u64>,
}

impl Overuse {
    /// Nothing measured: admission balances by requests only.
    pub const NONE: &'static Overuse = &Overuse {
        by_node: BTreeMap::new(),
    };
}

/// A view of the shared pool: CPUs not reserved and not exclusive, and their current charges.
pub struct SharedPools<'a> {
    pub view: &'a CpuView,
    pub shared: CpuSet,
    pub load: &'a Charges,
    pub overcommit_ratio: f64,
    /// TAP topology-cluster-affinity (see the module header).
    pub cluster_affinity: bool,
    /// Measured load beyond the charges: orders the pools that fit, never decides a fit.
    pub overuse: &'a Overuse,
}

/// Spreads `millis` over `cpus` (ascending ids get the remainder first).
pub fn spread(cpus: &CpuSet, millis: u64) -> Charges {
    let n = cpus.len() as u64;
    if n == 0 || millis == 0 {
        return Charges::new();
    }
    let (base, rem) = (millis / n, millis % n);
    cpus.iter()
        .enumerate()
        .map(|(i, c)| (c, base + u64::from((i as u64) < rem)))
        .filter(|(_, m)| *m > 0)
        .collect()
}

impl SharedPools<'_> {
    /// Millicores charged on `cpus`.
    pub fn load_of(&self, cpus: &CpuSet) -> u64 {
        cpus.iter().filter_map(|c| self.load.get(&c)).sum()
    }

    /// Millicores charged on `cpus` plus their part of the measured [`Overuse`] (each node's
    /// overuse shared over its shared CPUs): what orders the pools that fit.
    pub fn seen_load_of(&self, cpus: &CpuSet) -> u64 {
        let mut over = 0u128;
        for (n, &o) in &self.overuse.by_node {
            let Some(node) = self.view.nodes.get(n) else {
                continue;
            };
            let node_shared = node.intersection(&self.shared).len() as u128;
            if node_shared == 0 || o == 0 {
                continue;
            }
            let part = cpus.intersection(node).intersection(&self.shared).len() as u128;
            over += u128::from(o) * part / node_shared;
        }
        self.load_of(cpus)
            .saturating_add(u64::try_from(over).unwrap_or(u64::MAX))
    }

    /// Most millicores `cpus`' shared CPUs may carry.
    pub fn capacity_of(&self, cpus: &CpuSet) -> u64 {
        (cpus.intersection(&self.shared).len() as f64 * 1000.0 * self.overcommit_ratio) as u64
    }

    /// Whether charging `extra` keeps every node within its capacity.
    pub fn fits(&self, extra: &Charges) -> bool {
        let mut touched: BTreeMap<u32, u64> = BTreeMap::new();
        for (&c, &m) in extra {
            if let Some(n) = self.view.node_of(c) {
                *touched.entry(n).or_default() += m;
            }
        }
        touched.iter().all(|(n, m)| {
            let cpus = &self.view.nodes[n];
            self.load_of(cpus) + m <= self.capacity_of(cpus)
        })
    }

    fn node_ratio_key(&self, n: u32, seen: bool) -> (u128, u128) {
        let cpus = &self.view.nodes[&n];
        let load = if seen {
            self.seen_load_of(cpus)
        } else {
            self.load_of(cpus)
        };
        (load as u128, self.capacity_of(cpus).max(1) as u128)
    }

    fn eligible(&self, cpus: &CpuSet, millis: u64, affinity: Option<NodeMask>) -> bool {
        let sh = cpus.intersection(&self.shared);
        !sh.is_empty()
            && sh.len() as u64 * 1000 >= millis
            && affinity.is_none_or(|a| self.view.nodes_of(&sh).is_subset_of(a))
            && self.fits(&spread(&sh, millis))
    }

    /// TAP numa-aware: shared CPUs of whole nodes, least-allocated ((charge + measured
    /// overuse) / capacity) first, as few nodes as fit (by the charges). `None` when nothing
    /// fits. The measured order never refuses what the charges' order admits: when no prefix
    /// of it fits (a node full by its charges taken first into a multi-node pool), the
    /// charges' order is tried.
    pub fn numa_aware(&self, millis: u64, affinity: Option<NodeMask>) -> Option<CpuSet> {
        self.numa_aware_by(millis, affinity, true).or_else(|| {
            (!self.overuse.by_node.is_empty())
                .then(|| self.numa_aware_by(millis, affinity, false))
                .flatten()
        })
    }

    fn numa_aware_by(&self, millis: u64, affinity: Option<NodeMask>, seen: bool) -> Option<CpuSet> {
        let mut nodes: Vec<u32> = self
            .view
            .nodes
            .iter()
            .filter(|(id, cpus)| {
                !cpus.is_disjoint(&self.shared) && affinity.is_none_or(|a| a.contains(**id))
            })
            .map(|(id, _)| *id)
            .collect();
        nodes.sort_by(|a, b| {
            let (la, ca) = self.node_ratio_key(*a, seen);
            let (lb, cb) = self.node_ratio_key(*b, seen);
            // least allocated, then most free millicores, then lowest id
            let free = |l: u128, c: u128| c.saturating_sub(l);
            (la * cb)
                .cmp(&(lb * ca))
                .then(free(lb, cb).cmp(&free(la, ca)))
                .then(a.cmp(b))
        });
        let mut cpus = CpuSet::new();
        for (i, n) in nodes.into_iter().enumerate() {
            cpus = cpus.union(&self.view.nodes[&n].intersection(&self.shared));
            if self.eligible(&cpus, millis, affinity) {
                if i == 0 && self.cluster_affinity {
                    return Some(
                        self.clusters_within(&cpus, millis, affinity)
                            .unwrap_or(cpus),
                    );
                }
                return Some(cpus);
            }
        }
        None
    }

    /// The fewest whole clusters of `pool` (least allocated first, then lowest CPU) whose
    /// shared CPUs carry `millis`; `None` without clusters or when only the whole pool does.
    fn clusters_within(
        &self,
        pool: &CpuSet,
        millis: u64,
        affinity: Option<NodeMask>,
    ) -> Option<CpuSet> {
        let mut clusters: Vec<CpuSet> = self
            .view
            .clusters
            .values()
            .map(|c| c.intersection(pool))
            .filter(|c| !c.is_empty())
            .collect();
        clusters.sort_by(|a, b| {
            let (la, ca) = (
                self.seen_load_of(a) as u128,
                self.capacity_of(a).max(1) as u128,
            );
            let (lb, cb) = (
                self.seen_load_of(b) as u128,
                self.capacity_of(b).max(1) as u128,
            );
            (la * cb).cmp(&(lb * ca)).then(a.first().cmp(&b.first()))
        });
        let mut cpus = CpuSet::new();
        for c in clusters {
            cpus.union_with(&c);
            if &cpus == pool {
                return None;
            }
            if self.eligible(&cpus, millis, affinity) {
                return Some(cpus);
            }
        }
        None
    }

    /// TAP topology-aware: the smallest pool (L3 group, node, die, socket, machine) whose shared
    /// CPUs can carry the request; ties go to the least allocated, then the lowest CPU.
    pub fn topology_aware(&self, millis: u64, affinity: Option<NodeMask>) -> Option<CpuSet> {
        let v = self.view;
        let clusters = v.clusters.values().filter(|_| self.cluster_affinity);
        let mut pools: Vec<CpuSet> = clusters
            .chain(v.l3s.values())
            .chain(v.nodes.values())
            .chain(v.dies.values())
            .chain(v.sockets.values())
            .chain(std::iter::once(&v.online))
            .map(|p| p.intersection(&self.shared))
            .filter(|p| !p.is_empty())
            .collect();
        pools.sort_by(|a, b| {
            let (la, ca) = (
                self.seen_load_of(a) as u128,
                self.capacity_of(a).max(1) as u128,
            );
            let (lb, cb) = (
                self.seen_load_of(b) as u128,
                self.capacity_of(b).max(1) as u128,
            );
            a.len()
                .cmp(&b.len())
                .then((la * cb).cmp(&(lb * ca)))
                .then(a.first().cmp(&b.first()))
        });
        pools.dedup();
        pools
            .into_iter()
            .find(|p| self.eligible(p, millis, affinity))
    }

    /// BestEffort: the shared pool, limited to `affinity`'s nodes when that leaves CPUs.
    pub fn best_effort(&self, affinity: Option<NodeMask>) -> Option<CpuSet> {
        let pool = match affinity {
            Some(a) => self.shared.intersection(&self.view.cpus_of_mask(a)),
            None => self.shared.clone(),
        };
        (!pool.is_empty()).then_some(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Topology, TopologyBuilder};

    /// 2 nodes x 4 cores x 2 threads, an L3 per 2 cores: node0 = 0-3,8-11 (L3 0-1,8-9 and
    /// 2-3,10-11), node1 = 4-7,12-15.
    fn small_smt() -> Topology {
        TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 4,
            threads_per_core: 2,
            cores_per_l3: 2,
            ..Default::default()
        }
        .build()
    }

    fn pools(load: &Charges, shared: &str, ratio: f64, f: impl FnOnce(&SharedPools) -> String) {
        let t = small_smt();
        let v = CpuView::new(&t);
        let p = SharedPools {
            view: &v,
            shared: CpuSet::parse(shared).unwrap(),
            load,
            overcommit_ratio: ratio,
            cluster_affinity: false,
            overuse: Overuse::NONE,
        };
        let _ = f(&p);
    }

    fn check(load: &[(u32, u64)], shared: &str, millis: u64, numa: &str, topo: &str) {
        let load: Charges = load.iter().copied().collect();
        let show = |s: Option<CpuSet>| s.map_or("none".to_string(), |s| s.to_string());
        pools(&load, shared, 1.0, |p| {
            assert_eq!(
                show(p.numa_aware(millis, None)),
                numa,
                "numa-aware {millis}"
            );
            assert_eq!(
                show(p.topology_aware(millis, None)),
                topo,
                "topology-aware {millis}"
            );
            String::new()
        });
    }

    #[test]
    fn shared_policies_pick_least_allocated_and_tightest() {
        // machine: node0 = 0-3,8-11 (L3 0-1,8-9 and 2-3,10-11), node1 = 4-7,12-15
        check(&[], "0-15", 500, "0-3,8-11", "0-1,8-9");
        check(&[(0, 4000)], "0-15", 500, "4-7,12-15", "2-3,10-11");
        check(&[], "0-15", 9000, "0-15", "0-15");
        check(&[], "0-15", 17000, "none", "none");
        // exclusive CPUs leave node 0 with 2 shared CPUs
        check(&[], "2,3,4-7,12-15", 2500, "4-7,12-15", "4-5,12-13");
        check(&[(4, 7000)], "4-7,12-15", 1500, "none", "none");
    }

    /// 1 socket, 2 nodes × 8 single-thread cores, clusters of 4, one L3 per node:
    /// node0 = 0-7 (clusters 0-3, 4-7), node1 = 8-15 (8-11, 12-15).
    fn clustered(load: &[(u32, u64)], shared: &str, on: bool, millis: u64) -> (String, String) {
        let t = TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 8,
            threads_per_core: 1,
            cores_per_l3: 8,
            cores_per_cluster: 4,
            ..Default::default()
        }
        .build();
        let v = CpuView::new(&t);
        let load: Charges = load.iter().copied().collect();
        let p = SharedPools {
            view: &v,
            shared: CpuSet::parse(shared).unwrap(),
            load: &load,
            overcommit_ratio: 1.0,
            cluster_affinity: on,
            overuse: Overuse::NONE,
        };
        let show = |s: Option<CpuSet>| s.map_or("none".to_string(), |s| s.to_string());
        (
            show(p.numa_aware(millis, None)),
            show(p.topology_aware(millis, None)),
        )
    }

    #[test]
    fn topology_cluster_affinity_narrows_shared_pools_to_clusters() {
        let c = |load: &[(u32, u64)], shared, on, millis, numa: &str, topo: &str| {
            let got = clustered(load, shared, on, millis);
            assert_eq!(
                (got.0.as_str(), got.1.as_str()),
                (numa, topo),
                "{millis}m on {shared}, clusters {on}"
            );
        };
        c(&[], "0-15", true, 2000, "0-3", "0-3");
        c(&[], "0-15", false, 2000, "0-7", "0-7");
        // least allocated cluster first
        c(&[(0, 3000)], "0-15", true, 2000, "8-11", "4-7");
        // more than a cluster but within a node: two clusters are the whole node
        c(&[], "0-15", true, 6000, "0-7", "0-7");
        // more than a node: no narrowing
        c(&[], "0-15", true, 9000, "0-15", "0-15");
        // exclusive CPUs 1-3 split cluster 0-3: node 1 has the most free millicores
        c(&[], "0,4-15", true, 2000, "8-11", "4-7");
        c(&[], "0,4-15", true, 1000, "8-11", "0");
    }

    /// The measured overuse orders the pools that fit and nothing else: it sends a request to
    /// the node that is less loaded in fact, never to one whose charges cannot carry it, never
    /// outside the affinity, and never turns a fit into a refusal.
    #[test]
    fn measured_overuse_orders_the_pools_that_fit_and_never_decides_a_fit() {
        // machine: node0 = 0-3,8-11 (L3 0-1,8-9 and 2-3,10-11), node1 = 4-7,12-15
        let t = small_smt();
        let v = CpuView::new(&t);
        let show = |s: Option<CpuSet>| s.map_or("none".to_string(), |s| s.to_string());
        // (numa-aware, topology-aware) for `millis` within `aff`
        let run = |load: &[(u32, u64)], over: &[(u32, u64)], millis, aff: Option<NodeMask>| {
            let load: Charges = load.iter().copied().collect();
            let overuse = Overuse {
                by_node: over.iter().copied().collect(),
            };
            let p = SharedPools {
                view: &v,
                shared: CpuSet::parse("0-15").unwrap(),
                load: &load,
                overcommit_ratio: 1.0,
                cluster_affinity: false,
                overuse: &overuse,
            };
            (
                show(p.numa_aware(millis, aff)),
                show(p.topology_aware(millis, aff)),
            )
        };
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        let node0 = NodeMask::from_ids([0]);
        // the tie (no charges) goes to node 0 by requests, to node 1 once node 0 is seen busy
        assert_eq!(run(&[], &[], 500, None), pair("0-3,8-11", "0-1,8-9"));
        assert_eq!(
            run(&[], &[(0, 3000)], 500, None),
            pair("4-7,12-15", "4-5,12-13")
        );
        // by requests node 1 (no charge) comes first; seen 4000m over, node 0 (3000m) does
        assert_eq!(run(&[(0, 3000)], &[], 500, None).0, "4-7,12-15");
        assert_eq!(run(&[(0, 3000)], &[(1, 4000)], 500, None).0, "0-3,8-11");
        // node 0 is seen less loaded but is full by its charges (7800m of 8000m): neither it
        // nor a pool starting with it can carry 500m, so the charges' order answers (node 1)
        assert_eq!(
            run(&[(0, 7800)], &[(1, 20_000)], 500, None),
            pair("4-7,12-15", "4-5,12-13")
        );
        // the affinity holds however loaded its nodes are seen
        assert_eq!(
            run(&[], &[(0, 20_000)], 500, node0),
            pair("0-3,8-11", "0-1,8-9")
        );
        // what the charges refuse stays refused
        assert_eq!(
            run(&[(0, 7000)], &[(1, 50_000)], 9000, None),
            pair("none", "none")
        );
        assert_eq!(
            run(&[(4, 8000)], &[(0, 50_000)], 9000, None),
            pair("none", "none")
        );
    }

    #[test]
    fn spread_charges_every_millicore() {
        let c = spread(&CpuSet::parse("0-2").unwrap(), 1001);
        assert_eq!(c.values().sum::<u64>(), 1001);
        assert_eq!(c[&0], 334);
        assert!(spread(&CpuSet::new(), 5).is_empty());
    }
}

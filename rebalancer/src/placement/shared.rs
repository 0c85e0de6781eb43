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

use std::collections::BTreeMap;

use crate::cpuset::CpuSet;
use crate::placement::cpu::CpuView;
use crate::placement::NodeMask;

/// Millicores charged per CPU.
pub type Charges = BTreeMap<u32, u64>;

/// A view of the shared pool: CPUs not reserved and not exclusive, and their current charges.
pub struct SharedPools<'a> {
    pub view: &'a CpuView,
    pub shared: CpuSet,
    pub load: &'a Charges,
    pub overcommit_ratio: f64,
    /// TAP topology-cluster-affinity (see the module header).
    pub cluster_affinity: bool,
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

    fn node_ratio_key(&self, n: u32) -> (u128, u128) {
        let cpus = &self.view.nodes[&n];
        (
            self.load_of(cpus) as u128,
            self.capacity_of(cpus).max(1) as u128,
        )
    }

    fn eligible(&self, cpus: &CpuSet, millis: u64, affinity: Option<NodeMask>) -> bool {
        let sh = cpus.intersection(&self.shared);
        !sh.is_empty()
            && sh.len() as u64 * 1000 >= millis
            && affinity.is_none_or(|a| self.view.nodes_of(&sh).is_subset_of(a))
            && self.fits(&spread(&sh, millis))
    }

    /// TAP numa-aware: shared CPUs of whole nodes, least-allocated (charge / capacity) first,
    /// as few nodes as fit. `None` when nothing fits.
    pub fn numa_aware(&self, millis: u64, affinity: Option<NodeMask>) -> Option<CpuSet> {
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
            let ((la, ca), (lb, cb)) = (self.node_ratio_key(*a), self.node_ratio_key(*b));
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
            let (la, ca) = (self.load_of(a) as u128, self.capacity_of(a).max(1) as u128);
            let (lb, cb) = (self.load_of(b) as u128, self.capacity_of(b).max(1) as u128);
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
            let (la, ca) = (self.load_of(a) as u128, self.capacity_of(a).max(1) as u128);
            let (lb, cb) = (self.load_of(b) as u128, self.capacity_of(b).max(1) as u128);
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
    use crate::topology::TopologyBuilder;

    fn pools(load: &Charges, shared: &str, ratio: f64, f: impl FnOnce(&SharedPools) -> String) {
        let t = TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 4,
            threads_per_core: 2,
            cores_per_l3: 2,
            ..Default::default()
        }
        .build();
        let v = CpuView::new(&t);
        let p = SharedPools {
            view: &v,
            shared: CpuSet::parse(shared).unwrap(),
            load,
            overcommit_ratio: ratio,
            cluster_affinity: false,
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

    #[test]
    fn spread_charges_every_millicore() {
        let c = spread(&CpuSet::parse("0-2").unwrap(), 1001);
        assert_eq!(c.values().sum::<u64>(), 1001);
        assert_eq!(c[&0], 334);
        assert!(spread(&CpuSet::new(), 5).is_empty());
    }
}

//! Adoption of a container that already runs (a start without usable books, NRI Synchronize):
//! the exclusive CPUs it runs on now, kept where the books allow them, instead of the CPUs a
//! fresh admission picked — a pinned workload is not moved by a restart of its manager.
//!
//! ```text
//! Allocator::adopt_live_cpus(topo, cfg, uid, container, live) -> Option<CpuSet>
//! ```
use super::{
    admission::Allocator,
    cpu::{CpuView, StaticOptions},
};
use crate::{config::PlacementConfig, cpuset::CpuSet, topology::Topology};

impl Allocator {
    /// Books `live` as the CPUs of the admitted exclusive container `container` of `uid` in
    /// place of those its admission picked, when the books allow it: as many CPUs, all online,
    /// none reserved, none exclusive to another placement (or held, or in flight), all on the
    /// nodes of its placement's mems (its NUMA affinity), whole cores where
    /// `full_pcpus_only` asks, and every shared container left at least one CPU. Returns the
    /// CPUs booked; None (nothing changed) otherwise, for a shared container, a container of a
    /// pod admitted one container at a time (pod scope), or when it already runs on its
    /// placement's CPUs.
    pub fn adopt_live_cpus(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        uid: &str,
        container: &str,
        live: &CpuSet,
    ) -> Option<CpuSet> {
        // a member of a pod admitted one container at a time runs within its pod's hold
        let p = (self.pods.get(uid))
            .filter(|p| p.hold.is_none())?
            .containers
            .iter()
            .map(|c| &c.placement)
            .find(|p| p.container == container)?;
        if !p.exclusive || p.cpus == *live || p.cpus.len() != live.len() {
            return None;
        }
        let view = CpuView::new(topo);
        let others = self.exclusive_cpus().difference(&p.cpus);
        let on_its_nodes = live
            .iter()
            .all(|c| view.node_of(c).is_some_and(|n| p.mems.contains(n)));
        let whole_cores =
            !StaticOptions::of(cfg).full_pcpus_only || view.free_core_cpus(live) == *live;
        if !live.is_subset(&view.online)
            || !live.is_disjoint(&others)
            || !live.is_disjoint(&self.reserved_cpus)
            || !on_its_nodes
            || !whole_cores
        {
            return None;
        }
        let mut next = self.clone();
        next.record_move_cpus(uid, container, live);
        let excl = next.exclusive_cpus();
        let starved = next.placements().filter(|p| !p.exclusive).any(|p| {
            p.cpus
                .difference(&excl)
                .intersection(&view.online)
                .is_empty()
        });
        if starved {
            return None;
        }
        *self = next;
        Some(live.clone())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{
        config::TopologyPolicy,
        placement::pod::{Container, Pod},
        topology::TopologyBuilder,
    };

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    fn pod(uid: &str, millis: u64, guaranteed: bool) -> Pod {
        Pod {
            uid: uid.into(),
            containers: vec![Container {
                name: "c".into(),
                cpu_request_millis: millis,
                cpu_limit_millis: if guaranteed { millis } else { 0 },
                memory_bytes: if guaranteed { 64 << 20 } else { 0 },
                memory_limit_bytes: if guaranteed { 64 << 20 } else { 0 },
                ..Default::default()
            }],
            init_containers: Vec::new(),
        }
    }

    fn cfg() -> PlacementConfig {
        PlacementConfig {
            policy: TopologyPolicy::SingleNumaNode,
            ..Default::default()
        }
    }

    /// node 0 = CPUs 0-3,8-11, node 1 = 4-7,12-15 (siblings i and i+8).
    #[test]
    fn an_exclusive_container_is_adopted_where_it_runs_when_the_books_allow() {
        let topo = TopologyBuilder::default().build();
        let mut a = Allocator::new(&topo, &cfg()).unwrap();
        let g = a.admit(&topo, &cfg(), &pod("g", 2000, true)).unwrap();
        assert_eq!(
            g[0].cpus,
            set("0,8"),
            "a fresh admission packs from the low end"
        );
        // it ran on 3,11 (node 0, the placement's node): kept there
        assert_eq!(
            a.adopt_live_cpus(&topo, &cfg(), "g", "c", &set("3,11")),
            Some(set("3,11"))
        );
        assert_eq!(a.exclusive_cpus(), set("3,11"));
        let h = a.admit(&topo, &cfg(), &pod("h", 2000, true)).unwrap();
        assert!(h[0].cpus.is_disjoint(&set("3,11")), "{}", h[0].cpus);
        // h ran on g's CPUs: not adopted there, its admission's CPUs stay
        let before = a.clone();
        assert_eq!(
            a.adopt_live_cpus(&topo, &cfg(), "h", "c", &set("3,11")),
            None
        );
        assert_eq!(a, before);
        // off its placement's node, a different count, unplaced (every CPU), a shared
        // container: nothing changes
        for live in ["4,12", "8", "0-15"] {
            assert_eq!(a.adopt_live_cpus(&topo, &cfg(), "h", "c", &set(live)), None);
        }
        a.admit(&topo, &cfg(), &pod("b", 500, false)).unwrap();
        let before = a.clone();
        assert_eq!(a.adopt_live_cpus(&topo, &cfg(), "b", "c", &set("0")), None);
        assert_eq!(a, before);
    }

    #[test]
    fn reserved_cpus_and_split_cores_are_not_adopted() {
        let topo = TopologyBuilder::default().build();
        let mut c = cfg();
        c.reserved_cpus = set("0");
        c.full_pcpus_only = true;
        let mut a = Allocator::new(&topo, &c).unwrap();
        let g = a.admit(&topo, &c, &pod("g", 2000, true)).unwrap();
        assert_eq!(g[0].cpus.len(), 2);
        for live in ["0,8", "2-3"] {
            assert_eq!(
                a.adopt_live_cpus(&topo, &c, "g", "c", &set(live)),
                None,
                "{live}"
            );
        }
        let whole = if g[0].cpus == set("3,11") {
            "2,10"
        } else {
            "3,11"
        };
        assert_eq!(
            a.adopt_live_cpus(&topo, &c, "g", "c", &set(whole)),
            Some(set(whole))
        );
    }

    proptest! {
        /// Whatever the live CPUs, an adoption keeps the books sound: exclusive placements
        /// pairwise disjoint and off the reserved CPUs, the container's CPU count, and a CPU
        /// for every shared container; a refusal changes nothing.
        #[test]
        fn adoption_never_breaks_the_books(
            pods in prop::collection::vec((1u64..=4, any::<bool>()), 1..8),
            lives in prop::collection::vec((any::<u8>(), any::<bool>()), 8),
            reserved in any::<u16>(),
        ) {
            let topo = TopologyBuilder::default().build();
            let mut c = cfg();
            c.reserved_cpus = (0..16).filter(|i| reserved & (1 << i) != 0 && *i % 5 == 0).collect();
            let mut a = Allocator::new(&topo, &c).unwrap();
            let mut uids = Vec::new();
            for (i, (n, g)) in pods.iter().enumerate() {
                let uid = format!("p{i}");
                let millis = if *g { n * 1000 } else { n * 300 };
                if a.admit(&topo, &c, &pod(&uid, millis, *g)).is_ok() {
                    uids.push(uid);
                }
            }
            let view = CpuView::new(&topo);
            for (uid, (k, own_nodes)) in uids.iter().zip(&lives) {
                let before = a.clone();
                let p = &before.pods[uid].containers[0].placement;
                let n = p.cpus.len();
                // as many CPUs as it has, from its own nodes or anywhere, taken at a random
                // offset: often another's, a reserved one, a split core
                let from: Vec<u32> = if *own_nodes {
                    p.mems.iter().flat_map(|node| view.nodes[&node].iter()).collect()
                } else {
                    (0..16).collect()
                };
                let live: CpuSet = (0..n).map(|i| from[(*k as usize + i) % from.len()]).collect();
                match a.adopt_live_cpus(&topo, &c, uid, "c", &live) {
                    None => prop_assert_eq!(&a, &before),
                    Some(got) => {
                        prop_assert_eq!(&got, &live);
                        prop_assert_eq!(live.len(), n);
                        prop_assert_eq!(&a.pods[uid].containers[0].placement.cpus, &live);
                    }
                }
                let mut seen = CpuSet::new();
                for p in a.placements().filter(|p| p.exclusive) {
                    prop_assert!(p.cpus.is_disjoint(&seen), "{} overlaps {}", p.cpus, seen);
                    prop_assert!(p.cpus.is_disjoint(&c.reserved_cpus));
                    seen.union_with(&p.cpus);
                }
                for p in a.placements().filter(|p| !p.exclusive) {
                    prop_assert!(!p.cpus.difference(&seen).is_empty(), "a shared container lost every CPU");
                }
            }
        }
    }
}

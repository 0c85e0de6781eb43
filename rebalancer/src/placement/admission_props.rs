//! Property test: random configs and random admit / release sequences on the EPYC-NPS4-like
//! machine keep every placement invariant, refusals change nothing and release is an exact
//! inverse of admission.
use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
enum Kind {
    GuaranteedWhole,
    GuaranteedFraction,
    Burstable,
    BestEffort,
}

#[derive(Clone, Debug)]
struct Spec {
    kind: Kind,
    cpus: u64,
    mem_gib: u64,
    huge_2m_256mib: u64,
    gpu: bool,
    containers: usize,
}

#[derive(Clone, Debug)]
enum Op {
    Admit(Spec),
    Release(usize),
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![
            Just(Kind::GuaranteedWhole),
            Just(Kind::GuaranteedFraction),
            Just(Kind::Burstable),
            Just(Kind::BestEffort)
        ],
        1u64..=20,
        1u64..=24,
        0u64..=3,
        prop::bool::weighted(0.15),
        1usize..=2,
    )
        .prop_map(
            |(kind, cpus, mem_gib, huge_2m_256mib, gpu, containers)| Spec {
                kind,
                cpus,
                mem_gib,
                huge_2m_256mib,
                gpu,
                containers,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![4 => spec().prop_map(Op::Admit), 1 => (0usize..64).prop_map(Op::Release)]
}

fn config() -> impl Strategy<Value = PlacementConfig> {
    (
        prop_oneof![
            Just(TopologyPolicy::None),
            Just(TopologyPolicy::BestEffort),
            Just(TopologyPolicy::Restricted),
            Just(TopologyPolicy::SingleNumaNode)
        ],
        prop::bool::ANY,
        prop_oneof![
            Just(AllocationStrategy::Kubelet),
            Just(AllocationStrategy::LeastAllocated),
            Just(AllocationStrategy::MostAllocated)
        ],
        prop::bool::ANY,
        (
            prop::bool::ANY,
            prop::bool::ANY,
            prop::bool::ANY,
            prop::bool::ANY,
        ),
    )
        .prop_map(
            |(policy, pod_scope, strategy, topo_aware, (full, dist, sock, l3))| PlacementConfig {
                policy,
                scope: if pod_scope {
                    TopologyScope::Pod
                } else {
                    TopologyScope::Container
                },
                numa_allocation_strategy: strategy,
                shared_cpu_policy: if topo_aware {
                    SharedCpuPolicy::TopologyAware
                } else {
                    SharedCpuPolicy::NumaAware
                },
                full_pcpus_only: full,
                distribute_cpus_across_numa: dist,
                // the config refuses align-by-socket with single-numa-node, as kubelet does
                align_by_socket: sock && policy != TopologyPolicy::SingleNumaNode,
                prefer_align_cpus_by_uncorecache: l3,
                reserved_cpus: CpuSet::parse("0,64").unwrap(),
                strict_cpu_reservation: sock,
                reserved_memory: vec![crate::config::ReservedMemory {
                    node: 0,
                    memory_bytes: G,
                    hugepages_2mi_bytes: 0,
                    hugepages_1gi_bytes: 0,
                }],
                ..Default::default()
            },
        )
}

fn make_pod(uid: &str, s: &Spec) -> Pod {
    let containers = (0..s.containers)
        .map(|i| {
            let name = format!("c{i}");
            let mut c = match s.kind {
                Kind::GuaranteedWhole => guaranteed(&name, s.cpus * 1000, s.mem_gib * G),
                Kind::GuaranteedFraction => guaranteed(&name, s.cpus * 1000 - 500, s.mem_gib * G),
                Kind::Burstable => Container {
                    name: name.clone(),
                    cpu_request_millis: s.cpus * 250,
                    cpu_limit_millis: s.cpus * 1000,
                    memory_bytes: s.mem_gib * G / 2,
                    ..Default::default()
                },
                Kind::BestEffort => Container {
                    name: name.clone(),
                    ..Default::default()
                },
            };
            if !matches!(s.kind, Kind::BestEffort) {
                c.hugepages_2mi_bytes = s.huge_2m_256mib * (256 << 20);
            }
            if s.gpu && i == 0 {
                c.devices.insert("nvidia.com/gpu".into(), 1);
            }
            c
        })
        .collect();
    Pod {
        uid: uid.into(),
        containers,
        init_containers: Vec::new(),
    }
}

/// Every invariant of the state, as an error message naming the first one broken.
fn invariants(t: &Topology, c: &PlacementConfig, a: &Allocator) -> Result<(), String> {
    let view = CpuView::new(t);
    let reserved = c.reserved_cpus.clone();
    let mut seen = CpuSet::new();
    for (uid, p) in &a.pods {
        for ac in &p.containers {
            let pl = &ac.placement;
            let who = format!("{uid}/{}", pl.container);
            if pl.cpus.is_empty() || pl.mems.is_empty() {
                return Err(format!("{who}: empty cpuset {pl:?}"));
            }
            // reserved CPUs: never exclusive; shared only without strict-cpu-reservation
            if (pl.exclusive || c.strict_cpu_reservation) && !pl.cpus.is_disjoint(&reserved) {
                return Err(format!("{who}: reserved CPU handed out: {}", pl.cpus));
            }
            if !pl.cpus.is_subset(&view.online) {
                return Err(format!("{who}: CPU outside the machine"));
            }
            if pl.exclusive {
                if !pl.cpus.is_disjoint(&seen) {
                    return Err(format!("{who}: exclusive CPUs overlap: {}", pl.cpus));
                }
                seen = seen.union(&pl.cpus);
            } else if a
                .current_cpus(uid, &pl.container)
                .is_none_or(|s| s.is_empty())
            {
                return Err(format!("{who}: shared container left without a CPU"));
            }
            let aligned = matches!(
                c.policy,
                TopologyPolicy::Restricted | TopologyPolicy::SingleNumaNode
            );
            let mems = NodeMask::from_ids(pl.mems.iter()).unwrap();
            // align-by-socket aligns at the sockets of the affinity's nodes, as kubelet does
            let within = if c.align_by_socket {
                let nodes = view.cpus_of_mask(mems);
                (view.sockets.values())
                    .filter(|s| !s.is_disjoint(&nodes))
                    .fold(CpuSet::new(), |a, s| a.union(s))
            } else {
                view.cpus_of_mask(mems)
            };
            if aligned && pl.exclusive && !pl.cpus.is_subset(&within) {
                return Err(format!("{who}: cpus {} outside mems {}", pl.cpus, pl.mems));
            }
            if aligned && !pl.exclusive && !view.nodes_of(&pl.cpus).is_subset_of(mems) {
                return Err(format!("{who}: cpus {} outside mems {}", pl.cpus, pl.mems));
            }
            if c.policy == TopologyPolicy::SingleNumaNode && pl.exclusive && mems.count() != 1 {
                return Err(format!("{who}: single-numa-node spans {}", pl.mems));
            }
            if let Some(m) = &ac.memory {
                for id in m.nodes.ids() {
                    let n = a.memory.nodes.iter().find(|n| n.id == id).unwrap();
                    if n.cells != m.nodes {
                        return Err(format!(
                            "{who}: node {id} serves {:?} not {:?}",
                            n.cells, m.nodes
                        ));
                    }
                }
            }
        }
    }
    // CPUs held for a pod's containers still to come (pod scope, one container at a time) are
    // exclusive too: in no container's and no other hold's set, never reserved
    for (uid, p) in &a.pods {
        if let Some(h) = &p.hold {
            if !h.cpus.is_disjoint(&seen) || !h.cpus.is_disjoint(&reserved) {
                return Err(format!(
                    "{uid}: held CPUs {} overlap or are reserved",
                    h.cpus
                ));
            }
            if !h.cpus.is_subset(&view.online) {
                return Err(format!("{uid}: held CPU outside the machine"));
            }
            seen = seen.union(&h.cpus);
        }
    }
    // memory groups never overlap and never exceed capacity
    for n in &a.memory.nodes {
        for o in &a.memory.nodes {
            if n.assignments > 0
                && o.assignments > 0
                && n.cells != o.cells
                && !n.cells.and(o.cells).is_empty()
            {
                return Err(format!("groups {:?} and {:?} overlap", n.cells, o.cells));
            }
        }
        for (r, b) in &n.blocks {
            if b.reserved > b.allocatable || b.free + b.reserved != b.allocatable {
                return Err(format!("node {} {r:?} over capacity: {b:?}", n.id));
            }
        }
    }
    // CPU requests within allocatable; shared charges within each node's overcommit capacity
    let alloc = view.online.difference(&reserved).len() as u64 * 1000;
    let used: u64 = a.pods.values().map(|p| p.cpu_request_millis).sum();
    if used > alloc {
        return Err(format!("{used}m CPU admitted over {alloc}m"));
    }
    let pools = SharedPools {
        view: &view,
        shared: a.shared_pool(&view),
        load: &a.shared_load,
        overcommit_ratio: c.overcommit_ratio,
        cluster_affinity: false,
        overuse: crate::placement::shared::Overuse::NONE,
    };
    for (id, cpus) in &view.nodes {
        if pools.load_of(cpus) > pools.capacity_of(cpus) {
            return Err(format!("node {id} shared CPUs overcommitted"));
        }
    }
    let gpus = a.devices.assigned.len();
    if gpus > 1 {
        return Err(format!("{gpus} devices handed out, machine has 1"));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn random_pod_sequences_keep_the_invariants(
        c in config(),
        ops in prop::collection::vec(op(), 1..28),
    ) {
        let t = epyc();
        let mut a = Allocator::new(&t, &c).unwrap();
        let mut live: Vec<String> = Vec::new();
        for (i, o) in ops.iter().enumerate() {
            match o {
                Op::Admit(s) => {
                    let uid = format!("p{i}");
                    let before = a.clone();
                    match a.admit(&t, &c, &make_pod(&uid, s)) {
                        Ok(pl) => {
                            prop_assert_eq!(pl.len(), s.containers);
                            let mut probe = a.clone();
                            prop_assert!(probe.release(&uid));
                            prop_assert!(probe == before, "release is not the inverse of admit");
                            live.push(uid);
                        }
                        Err(_) => prop_assert!(a == before, "a refused pod changed the state"),
                    }
                }
                Op::Release(k) => {
                    if !live.is_empty() {
                        let uid = live.remove(k % live.len());
                        prop_assert!(a.release(&uid));
                    }
                }
            }
            if let Err(e) = invariants(&t, &c, &a) {
                prop_assert!(false, "after op {} ({:?}) with {:?}: {}", i, o, c, e);
            }
        }
        for uid in live {
            a.release(&uid);
        }
        prop_assert!(a == Allocator::new(&t, &c).unwrap(), "releasing everything restores the empty state");
    }
}

#[derive(Clone, Debug)]
enum MemberOp {
    /// A container of pod `pod` (of 4) arrives; its pod's totals are twice the first one's.
    Arrive(usize, Spec),
    /// The k-th container of pod `pod` goes away.
    Leave(usize, usize),
    /// Pod `pod` is gone.
    Gone(usize),
}

fn member_op() -> impl Strategy<Value = MemberOp> {
    let one = spec().prop_map(|s| Spec {
        containers: 1,
        gpu: false,
        ..s
    });
    prop_oneof![
        4 => (0usize..4, one).prop_map(|(p, s)| MemberOp::Arrive(p, s)),
        2 => (0usize..4, 0usize..4).prop_map(|(p, k)| MemberOp::Leave(p, k)),
        1 => (0usize..4).prop_map(MemberOp::Gone),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Pod scope one container at a time: whatever the order of arrivals, departures and
    /// pods gone, the invariants hold (held CPUs included), a refusal changes nothing, and
    /// once every pod is gone the state is the empty one.
    #[test]
    fn random_member_sequences_keep_the_invariants(
        c in config(),
        ops in prop::collection::vec(member_op(), 1..32),
    ) {
        let c = PlacementConfig { scope: TopologyScope::Pod, ..c };
        let t = epyc();
        let mut a = Allocator::new(&t, &c).unwrap();
        let mut totals: BTreeMap<usize, Container> = BTreeMap::new();
        for (i, o) in ops.iter().enumerate() {
            match o {
                MemberOp::Arrive(p, s) => {
                    let uid = format!("pod{p}");
                    let mut ctr = make_pod(&uid, s).containers.remove(0);
                    ctr.name = format!("c{i}");
                    let tot = totals.entry(*p).or_insert_with(|| Container {
                        name: "pod".into(),
                        cpu_request_millis: ctr.cpu_request_millis * 2,
                        cpu_limit_millis: ctr.cpu_limit_millis * 2,
                        memory_bytes: ctr.memory_bytes * 2,
                        memory_limit_bytes: ctr.memory_limit_bytes * 2,
                        ..Default::default()
                    }).clone();
                    let before = a.clone();
                    let m = PodMember { pod_uid: &uid, totals: &tot, container: &ctr };
                    if a.admit_member(&t, &c, m).is_err() {
                        prop_assert!(a == before, "a refused container changed the state");
                        if !a.pods.contains_key(&uid) {
                            totals.remove(p);
                        }
                    }
                }
                MemberOp::Leave(p, k) => {
                    let uid = format!("pod{p}");
                    let name = a.pods.get(&uid).and_then(|pod| {
                        let n = pod.containers.len();
                        (n > 0).then(|| pod.containers[k % n].placement.container.clone())
                    });
                    if let Some(name) = name {
                        prop_assert!(a.remove_member(&t, &c, &uid, &name));
                    }
                }
                MemberOp::Gone(p) => {
                    a.release(&format!("pod{p}"));
                    totals.remove(p);
                }
            }
            if let Err(e) = invariants(&t, &c, &a) {
                prop_assert!(false, "after op {} ({:?}) with {:?}: {}", i, o, c, e);
            }
        }
        for p in 0..4 {
            a.release(&format!("pod{p}"));
        }
        prop_assert!(a == Allocator::new(&t, &c).unwrap(), "every pod gone restores the empty state");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Measured overuse only orders the shared pools that fit: from the same state, a pod
    /// admitted by requests alone is admitted seeing any overuse too, with the same affinity,
    /// exclusive CPUs, Memory Manager memory and devices for every container; a refusal
    /// changes nothing; the invariants hold along a sequence admitted seeing the overuse.
    #[test]
    fn measured_overuse_never_overrides_a_fit_or_a_policy_rule(
        c in config(),
        ops in prop::collection::vec(op(), 1..28),
        over in prop::collection::btree_map(0u32..8, 0u64..40_000, 0..8),
    ) {
        let t = epyc();
        let overuse = crate::placement::shared::Overuse { by_node: over };
        let mut a = Allocator::new(&t, &c).unwrap();
        let mut live: Vec<String> = Vec::new();
        for (i, o) in ops.iter().enumerate() {
            match o {
                Op::Admit(s) => {
                    let uid = format!("p{i}");
                    let p = make_pod(&uid, s);
                    let mut plain = a.clone();
                    let by_requests = plain.admit(&t, &c, &p);
                    let before = a.clone();
                    let seeing = a.admit_seeing(&t, &c, &p, &overuse);
                    match (&by_requests, &seeing) {
                        (Ok(p0), Ok(p1)) => {
                            prop_assert_eq!(p0.len(), p1.len());
                            for (x, y) in p0.iter().zip(p1) {
                                prop_assert_eq!(x.exclusive, y.exclusive);
                                prop_assert_eq!(x.affinity, y.affinity);
                                prop_assert_eq!(&x.devices, &y.devices);
                                if x.exclusive {
                                    prop_assert_eq!(&x.cpus, &y.cpus);
                                    prop_assert_eq!(&x.mems, &y.mems);
                                }
                            }
                            let memory = |al: &Allocator| -> Vec<_> {
                                al.pods[&uid].containers.iter().map(|c| c.memory.clone()).collect()
                            };
                            prop_assert_eq!(memory(&plain), memory(&a));
                            live.push(uid);
                        }
                        (Ok(_), Err(e)) => {
                            prop_assert!(false, "admitted by requests, refused seeing {:?}: {:?}", overuse, e);
                        }
                        (Err(_), Ok(_)) => live.push(uid),
                        (Err(_), Err(_)) => prop_assert!(a == before, "a refused pod changed the state"),
                    }
                }
                Op::Release(k) => {
                    if !live.is_empty() {
                        let uid = live.remove(k % live.len());
                        prop_assert!(a.release(&uid));
                    }
                }
            }
            if let Err(e) = invariants(&t, &c, &a) {
                prop_assert!(false, "after op {} ({:?}) with {:?}: {}", i, o, c, e);
            }
        }
    }
}

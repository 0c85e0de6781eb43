//! Admission tests on an EPYC-NPS4-like machine: scenario table, atomicity, release, and a
//! property test over random pod sequences checking the placement invariants.
use super::*;
use crate::topology::{DeviceClass, PciDevice, TopologyBuilder};

pub(crate) const G: u64 = 1 << 30;
pub(crate) const GPU: &str = "0000:c1:00.0";

/// 2 sockets × 4 nodes × 8 cores × 2 threads (node n: CPUs 8n..8n+7 and 64+8n..64+8n+7),
/// L3 per 4 cores, 16 GiB + 512 × 2 MiB + 2 × 1 GiB per node, one GPU on node 5.
pub(crate) fn epyc() -> Topology {
    let mut t = TopologyBuilder {
        sockets: 2,
        nodes_per_socket: 4,
        cores_per_node: 8,
        threads_per_core: 2,
        cores_per_l3: 4,
        memory_per_node_bytes: 16 * G,
        hugepages_2m_per_node: 512,
        hugepages_1g_per_node: 2,
        ..Default::default()
    }
    .build();
    t.devices.push(PciDevice {
        address: GPU.into(),
        class: DeviceClass::Gpu,
        node: Some(5),
        vendor: None,
        device: None,
    });
    t
}

pub(crate) fn guaranteed(name: &str, cpu_millis: u64, mem: u64) -> Container {
    Container {
        name: name.into(),
        cpu_request_millis: cpu_millis,
        cpu_limit_millis: cpu_millis,
        memory_bytes: mem,
        memory_limit_bytes: mem,
        ..Default::default()
    }
}

fn pod(uid: &str, containers: Vec<Container>) -> Pod {
    Pod {
        uid: uid.into(),
        containers,
        init_containers: Vec::new(),
    }
}

fn cfg(policy: TopologyPolicy) -> PlacementConfig {
    PlacementConfig {
        policy,
        ..Default::default()
    }
}

/// What a scenario step expects: the first container's "cpus|mems|exclusive" or a reason.
fn show(r: &Result<Vec<ContainerPlacement>, Rejection>) -> String {
    match r {
        Ok(p) => format!(
            "{}|{}|{}",
            p[0].cpus,
            p[0].mems,
            if p[0].exclusive { "x" } else { "s" }
        ),
        Err(e) => e.reason.to_string(),
    }
}

/// Admits the pods in order on a fresh EPYC allocator and compares each answer.
fn check(c: &PlacementConfig, steps: &[(Pod, &str)]) {
    let t = epyc();
    let mut a = Allocator::new(&t, c).unwrap();
    for (p, want) in steps {
        let got = show(&a.admit(&t, c, p));
        assert_eq!(&got, want, "pod {}", p.uid);
    }
}

#[test]
fn guaranteed_pods_get_aligned_exclusive_cpus() {
    let c = cfg(TopologyPolicy::Restricted);
    check(
        &c,
        &[
            (pod("a", vec![guaranteed("c", 4000, G)]), "0-1,64-65|0|x"),
            (pod("b", vec![guaranteed("c", 4000, G)]), "2-3,66-67|0|x"),
            (pod("c", vec![guaranteed("c", 16000, G)]), "8-15,72-79|1|x"),
            (
                pod("d", vec![guaranteed("c", 20000, G)]),
                "TopologyAffinityError",
            ),
            // 20 GiB needs two nodes' memory while one CPU fits one node: nothing preferred
            (
                pod("e", vec![guaranteed("c", 1000, 20 * G)]),
                "TopologyAffinityError",
            ),
        ],
    );
    let mut be = cfg(TopologyPolicy::BestEffort);
    be.full_pcpus_only = true;
    check(
        &be,
        &[
            (pod("d", vec![guaranteed("c", 20000, G)]), "0-9,64-73|0-1|x"),
            (
                pod("s", vec![guaranteed("c", 3000, G)]),
                "SMTAlignmentError",
            ),
            (
                pod("m", vec![guaranteed("c", 1000, 20 * G)]),
                "SMTAlignmentError",
            ),
        ],
    );
}

#[test]
fn strategies_balance_or_pack() {
    let mut c = cfg(TopologyPolicy::SingleNumaNode);
    let steps = |second: &'static str| {
        vec![
            (pod("a", vec![guaranteed("c", 4000, G)]), "0-1,64-65|0|x"),
            (pod("b", vec![guaranteed("c", 4000, G)]), second),
        ]
    };
    check(&c, &steps("2-3,66-67|0|x"));
    c.numa_allocation_strategy = AllocationStrategy::LeastAllocated;
    check(&c, &steps("8-9,72-73|1|x"));
    c.numa_allocation_strategy = AllocationStrategy::MostAllocated;
    check(&c, &steps("2-3,66-67|0|x"));
}

#[test]
fn shared_pools_devices_and_reserved_cpus() {
    let mut c = cfg(TopologyPolicy::Restricted);
    c.reserved_cpus = CpuSet::parse("0,64").unwrap();
    c.strict_cpu_reservation = true;
    let burst = |name: &str, millis| Container {
        name: name.into(),
        cpu_request_millis: millis,
        memory_bytes: G,
        ..Default::default()
    };
    let mut gpu = guaranteed("c", 2000, G);
    gpu.devices.insert("nvidia.com/gpu".into(), 1);
    let mut gpu2 = gpu.clone();
    gpu2.name = "d".into();
    check(
        &c,
        &[
            (pod("g", vec![gpu]), "40,104|5|x"),
            // the GPU is taken: no device hint can be preferred
            (pod("g2", vec![gpu2]), "TopologyAffinityError"),
            // least allocated, then most free: node 0 lost 2 reserved CPUs, node 5 two exclusive
            (pod("b", vec![burst("c", 500)]), "8-15,72-79|1|s"),
            (pod("b2", vec![burst("c", 500)]), "16-23,80-87|2|s"),
            (
                pod(
                    "be",
                    vec![Container {
                        name: "c".into(),
                        ..Default::default()
                    }],
                ),
                "1-39,41-63,65-103,105-127|0-7|s",
            ),
            (pod("huge", vec![burst("c", 130_000)]), "InsufficientCPU"),
        ],
    );
    c.shared_cpu_policy = SharedCpuPolicy::TopologyAware;
    // the L3 group that lost the reserved CPUs is the tightest pool; TAP leaves mems alone
    check(&c, &[(pod("b", vec![burst("c", 2500)]), "1-3,65-67|0-7|s")]);
}

#[test]
fn refusal_changes_nothing_and_release_restores() {
    let t = epyc();
    let c = cfg(TopologyPolicy::Restricted);
    let mut a = Allocator::new(&t, &c).unwrap();
    let empty = a.clone();
    a.admit(&t, &c, &pod("a", vec![guaranteed("c", 2000, G)]))
        .unwrap();
    let after_a = a.clone();
    let bad = pod(
        "b",
        vec![guaranteed("ok", 2000, G), guaranteed("too-big", 20000, G)],
    );
    let err = a.admit(&t, &c, &bad).unwrap_err();
    assert_eq!(err.reason, RejectionReason::TopologyAffinityError);
    assert_eq!(a, after_a, "a refused pod leaves no trace");
    let dup = a.admit(&t, &c, &pod("a", vec![guaranteed("c", 1000, G)]));
    assert_eq!(dup.unwrap_err().reason, RejectionReason::AlreadyAdmitted);
    assert!(a.release("a"));
    assert!(!a.release("a"));
    assert_eq!(a, empty, "release restores the state exactly");
}

#[test]
fn pod_scope_gives_every_container_the_pod_hint() {
    let t = epyc();
    let mut c = cfg(TopologyPolicy::SingleNumaNode);
    c.scope = TopologyScope::Pod;
    let mut a = Allocator::new(&t, &c).unwrap();
    let p = pod(
        "p",
        vec![guaranteed("a", 6000, G), guaranteed("b", 6000, G)],
    );
    let got = a.admit(&t, &c, &p).unwrap();
    assert_eq!(got[0].affinity, Some(NodeMask::single(0)));
    assert_eq!(got[1].affinity, Some(NodeMask::single(0)));
    assert!(got[0].cpus.is_disjoint(&got[1].cpus));
    // 12 + 12 CPUs do not fit one node together, though each container would
    let q = pod(
        "q",
        vec![guaranteed("a", 12000, G), guaranteed("b", 12000, G)],
    );
    assert_eq!(
        a.admit(&t, &c, &q).unwrap_err().reason,
        RejectionReason::TopologyAffinityError
    );
}

#[test]
fn state_round_trips_through_json() {
    let t = epyc();
    let c = cfg(TopologyPolicy::BestEffort);
    let mut a = Allocator::new(&t, &c).unwrap();
    let mut g = guaranteed("c", 2000, G);
    g.hugepages_2mi_bytes = 64 << 20;
    g.device_addresses.push(GPU.into());
    a.admit(&t, &c, &pod("a", vec![g])).unwrap();
    a.admit(
        &t,
        &c,
        &pod(
            "b",
            vec![Container {
                name: "x".into(),
                cpu_request_millis: 300,
                ..Default::default()
            }],
        ),
    )
    .unwrap();
    let json = serde_json::to_string(&a).unwrap();
    let back: Allocator = serde_json::from_str(&json).unwrap();
    assert_eq!(back, a);
}

#[path = "admission_props.rs"]
mod props;

#[test]
fn guaranteed_pods_go_elsewhere_rather_than_starve_a_confined_burstable_pod() {
    // A Burstable pod is confined (numa-aware shared pool) to node 0 (CPUs 0-7,64-71) and
    // charges 12 CPUs' worth there (16 shared CPUs × 1.5 overcommit carry 24). Guaranteed pods
    // pack from node 0: once node 0 is down to what the Burstable pod needs, they must move on
    // to node 1, never be refused while the machine is nearly empty.
    let t = epyc();
    let c = cfg(TopologyPolicy::BestEffort);
    let mut a = Allocator::new(&t, &c).unwrap();
    let burst = Container {
        name: "c".into(),
        cpu_request_millis: 12_000,
        memory_bytes: G,
        ..Default::default()
    };
    let b = a.admit(&t, &c, &pod("b", vec![burst])).unwrap();
    assert_eq!(b[0].cpus.to_cpulist(), "0-7,64-71");
    let mut nodes_used = std::collections::BTreeSet::new();
    for i in 0..12 {
        let g = a
            .admit(
                &t,
                &c,
                &pod(&format!("g{i}"), vec![guaranteed("c", 1000, G)]),
            )
            .unwrap_or_else(|e| panic!("g{i} refused: {e}"));
        nodes_used.insert(g[0].mems.to_cpulist());
        let shared_on_0 = a
            .current_cpus("b", "c")
            .unwrap()
            .intersection(&CpuSet::parse("0-7,64-71").unwrap());
        // 12 000m at 1.5× overcommit needs 8 shared CPUs on node 0.
        assert!(shared_on_0.len() >= 8, "after g{i}: {shared_on_0}");
    }
    assert!(nodes_used.len() > 1, "{nodes_used:?}");
}

fn offline(t: &Topology, cpus: &CpuSet) -> Topology {
    let mut t = t.clone();
    for c in t.cpus.iter_mut() {
        if cpus.contains(c.id) {
            c.online = false;
        }
    }
    t
}

/// Hotplug: a Guaranteed container keeps its CPU count, on its node while the node has room,
/// never on another container's exclusive CPUs; shared placements are untouched.
#[test]
fn exclusive_cpus_that_go_offline_are_replaced() {
    let t = epyc();
    let c = cfg(TopologyPolicy::SingleNumaNode);
    let mut a = Allocator::new(&t, &c).unwrap();
    let g1 = a
        .admit(&t, &c, &pod("g1", vec![guaranteed("c", 4000, G)]))
        .unwrap()[0]
        .clone();
    let g2 = a
        .admit(&t, &c, &pod("g2", vec![guaranteed("c", 2000, G)]))
        .unwrap()[0]
        .clone();
    let mut b = guaranteed("b", 500, G);
    b.cpu_limit_millis = 0;
    let shared = a.admit(&t, &c, &pod("b", vec![b])).unwrap()[0].clone();
    assert!(g1.exclusive && g2.exclusive && !shared.exclusive);
    let node = |cpus: &CpuSet| -> std::collections::BTreeSet<u32> {
        cpus.iter().filter_map(|x| t.node_of_cpu(x)).collect()
    };

    // One core of g1 goes offline.
    let core: CpuSet = t.cpu(g1.cpus.first().unwrap()).unwrap().siblings.clone();
    let t1 = offline(&t, &core);
    let r = a.replace_offline(&t1, &c);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].pod_uid, "g1");
    assert_eq!(r[0].lost, core);
    assert_eq!(r[0].added.len(), core.len());
    let now = a.current_cpus("g1", "c").unwrap();
    assert_eq!(now, r[0].cpus);
    assert_eq!(now.len(), g1.cpus.len(), "CPU count kept");
    assert!(now.is_subset(&t1.online_cpus()));
    assert_eq!(node(&now), node(&g1.cpus), "same node while it has room");
    assert!(
        now.is_disjoint(&g2.cpus),
        "another container's exclusive CPUs"
    );
    assert_eq!(a.current_cpus("g2", "c").unwrap(), g2.cpus);
    assert!(a.replace_offline(&t1, &c).is_empty(), "nothing more to do");

    // g1's whole node goes: its CPUs come from elsewhere.
    let n: u32 = *node(&now).iter().next().unwrap();
    let t2 = offline(&t1, &t.node(n).unwrap().cpus);
    let r = a.replace_offline(&t2, &c);
    let g1r = r.iter().find(|x| x.pod_uid == "g1").unwrap();
    assert_eq!(g1r.cpus.len(), g1.cpus.len());
    assert!(g1r.cpus.is_subset(&t2.online_cpus()));
    assert!(a.exclusive_cpus().is_subset(&t2.online_cpus()), "{r:?}");
    let excl: Vec<CpuSet> = a
        .placements()
        .filter(|p| p.exclusive)
        .map(|p| p.cpus.clone())
        .collect();
    for (i, x) in excl.iter().enumerate() {
        for y in &excl[i + 1..] {
            assert!(x.is_disjoint(y), "exclusive CPUs overlap: {x} / {y}");
        }
    }
}

/// Nothing left to give: the container keeps its online CPUs, and is reported short.
#[test]
fn a_replacement_short_of_cpus_keeps_what_is_online() {
    let t = TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 1,
        cores_per_node: 4,
        threads_per_core: 1,
        memory_per_node_bytes: 16 * G,
        ..Default::default()
    }
    .build();
    let c = cfg(TopologyPolicy::None);
    let mut a = Allocator::new(&t, &c).unwrap();
    let g = a
        .admit(&t, &c, &pod("g", vec![guaranteed("c", 2000, G)]))
        .unwrap()[0]
        .clone();
    let mut b = guaranteed("b", 500, G);
    b.cpu_limit_millis = 0;
    a.admit(&t, &c, &pod("b", vec![b])).unwrap();
    // Two CPUs go offline: one of g's and one of the two left; the last one stays shared (a
    // Burstable container runs there).
    let lost = CpuSet::from_iter([g.cpus.first().unwrap()]);
    let other = t.online_cpus().difference(&g.cpus).first().unwrap();
    let t1 = offline(&t, &lost.union(&CpuSet::from_iter([other])));
    let r = a.replace_offline(&t1, &c);
    assert_eq!(r.len(), 1);
    assert!(
        r[0].added.is_empty(),
        "the last shared CPU is not taken: {r:?}"
    );
    assert_eq!(r[0].cpus, g.cpus.difference(&lost));
    assert_eq!(a.current_cpus("g", "c").unwrap(), r[0].cpus);
}

/// Hotplug takes a CPU an app container reuses from its pod's init container: the app (the one
/// that keeps running) is made whole first, the init container after it, here with nothing
/// left for it.
#[test]
fn an_offline_cpu_reused_from_an_init_container_is_replaced_for_the_app() {
    let t = TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 1,
        cores_per_node: 4,
        threads_per_core: 1,
        memory_per_node_bytes: 16 * G,
        ..Default::default()
    }
    .build();
    let c = cfg(TopologyPolicy::None);
    let mut a = Allocator::new(&t, &c).unwrap();
    let p = Pod {
        uid: "p".into(),
        containers: vec![guaranteed("a", 2000, G)],
        init_containers: vec![guaranteed("i", 2000, G)],
    };
    let app = a.admit(&t, &c, &p).unwrap()[0].clone();
    let init = a.pods["p"].containers[0].placement.clone();
    assert_eq!(app.cpus, init.cpus, "the app reuses the init's CPUs");
    let mut b = guaranteed("b", 500, G);
    b.cpu_limit_millis = 0;
    a.admit(&t, &c, &pod("b", vec![b])).unwrap();
    // One of them goes offline; the pool can spare one CPU and keep one shared.
    let lost = CpuSet::from_iter([app.cpus.first().unwrap()]);
    let t1 = offline(&t, &lost);
    let r = a.replace_offline(&t1, &c);
    let of = |name: &str| r.iter().find(|x| x.container == name).unwrap();
    assert_eq!(of("a").added.len(), 1, "the app is made whole: {r:?}");
    assert!(of("i").added.is_empty(), "the init after it: {r:?}");
    assert_eq!(a.current_cpus("p", "a").unwrap().len(), 2);
}

/// A checkpoint with a shared container of ours whose CPUs are empty (no path of ours writes
/// one) would make the starvation guard refuse every exclusive admission; restore repairs it.
#[test]
fn a_restored_shared_container_without_cpus_gets_the_shared_pool() {
    let t = epyc();
    let c = cfg(TopologyPolicy::BestEffort);
    let mut a = Allocator::new(&t, &c).unwrap();
    let mut b = guaranteed("b", 500, G);
    b.cpu_limit_millis = 0;
    a.admit(&t, &c, &pod("b", vec![b])).unwrap();
    a.pods.get_mut("b").unwrap().containers[0].placement.cpus = CpuSet::new();
    let mut torn = a.clone();
    let g = pod("g", vec![guaranteed("c", 2000, G)]);
    let e = torn.admit(&t, &c, &g).unwrap_err();
    assert_eq!(e.reason, RejectionReason::InsufficientCpu, "{e}");
    assert_eq!(a.repair_empty_shared(&t), vec!["b/b".to_string()]);
    assert!(!a.current_cpus("b", "b").unwrap().is_empty());
    assert!(a.repair_empty_shared(&t).is_empty(), "nothing more to do");
    let placed = a.admit(&t, &c, &g).unwrap();
    assert!(placed[0].exclusive);
}

/// A move re-books a Memory Manager container's memory on its new nodes; one that holds
/// memory reused from its init container (booked by the init, not by itself) is not re-booked.
#[test]
fn memory_reused_from_an_init_container_is_not_re_booked_by_a_move() {
    let t = epyc();
    let c = cfg(TopologyPolicy::Restricted);
    let mut a = Allocator::new(&t, &c).unwrap();
    let p = Pod {
        uid: "p".into(),
        containers: vec![guaranteed("a", 1000, 8 * G)],
        init_containers: vec![guaranteed("i", 1000, 12 * G)],
    };
    a.admit(&t, &c, &p).unwrap();
    a.admit(&t, &c, &pod("q", vec![guaranteed("c", 1000, 2 * G)]))
        .unwrap();
    let mem = |uid: &str, name: &str| {
        (a.pods[uid].containers.iter())
            .find(|x| x.placement.container == name)
            .and_then(|x| x.memory.clone())
            .unwrap()
    };
    let (app, own) = (mem("p", "a"), mem("q", "c"));
    assert_eq!(app.nodes, NodeMask::single(0), "{app:?}");
    let other = NodeMask::single(1);
    assert!(
        rebook_memory(a.memory.clone(), &app, other).is_none(),
        "{app:?}"
    );
    let (_, moved) = rebook_memory(a.memory.clone(), &own, other).expect("its own booking moves");
    assert_eq!(moved.nodes, other);
}

#[test]
fn a_restored_state_is_checked_against_the_machine_like_kubelet_start() {
    let t = epyc();
    let mut c = cfg(TopologyPolicy::BestEffort);
    c.reserved_memory = vec![crate::config::ReservedMemory {
        node: 0,
        memory_bytes: G,
        hugepages_2mi_bytes: 0,
        hugepages_1gi_bytes: 0,
    }];
    let mut a = Allocator::new(&t, &c).unwrap();
    let mut big = guaranteed("c", 1500, 20 * G);
    big.hugepages_1gi_bytes = G;
    a.admit(&t, &c, &pod("a", vec![big])).unwrap();
    a.admit(&t, &c, &pod("b", vec![guaranteed("c", 2000, G)]))
        .unwrap();
    assert_eq!(a.check_restored(&t, &c), Ok(()));
    // the reservation changed since
    let mut other = c.clone();
    other.reserved_memory[0].memory_bytes = 2 * G;
    let e = a.check_restored(&t, &other).unwrap_err().to_string();
    assert!(e.contains("different from the real one"), "{e}");
    // a node lost memory
    let mut small = t.clone();
    small.nodes[3].memory_total_bytes -= G;
    assert!(a.check_restored(&small, &c).is_err());
    // the stored counters do not add up
    let mut bad = a.clone();
    bad.memory.nodes[1].assignments += 1;
    assert!(bad.check_restored(&t, &c).is_err());
    // released pods leave a state that still matches
    a.release("a");
    assert_eq!(a.check_restored(&t, &c), Ok(()));
}

/// One row per kubelet / TAP option: the option's setting, a pod, the answer for its first
/// container ("cpus|mems|x or s", or the rejection reason), on a fresh EPYC allocator.
#[test]
fn kubelet_and_tap_options_table() {
    use crate::config::{CpuManagerPolicy, MemoryManagerPolicy};
    let burst = |millis| Container {
        name: "c".into(),
        cpu_request_millis: millis,
        memory_bytes: G,
        ..Default::default()
    };
    let best_effort = Container {
        name: "c".into(),
        ..Default::default()
    };
    type Set = fn(&mut PlacementConfig);
    let rows: &[(&str, Set, Container, &str)] = &[
        // reserved CPUs: off exclusive allocations always, off the shared pool only when strict
        (
            "reserved, non-strict (kubelet default)",
            |c| c.reserved_cpus = CpuSet::parse("0-7,64-71").unwrap(),
            best_effort.clone(),
            "0-127|0-7|s",
        ),
        (
            "strict-cpu-reservation",
            |c| {
                c.reserved_cpus = CpuSet::parse("0-7,64-71").unwrap();
                c.strict_cpu_reservation = true;
            },
            best_effort.clone(),
            "8-63,72-127|1-7|s",
        ),
        (
            "reserved, non-strict: exclusive CPUs still avoid them",
            |c| c.reserved_cpus = CpuSet::parse("0-7,64-71").unwrap(),
            guaranteed("c", 2000, G),
            "8,72|1|x",
        ),
        // CPU Manager policy none: a Guaranteed integer-CPU container shares
        (
            "cpu-manager-policy static",
            |_| {},
            guaranteed("c", 2000, G),
            "0,64|0|x",
        ),
        (
            "cpu-manager-policy none",
            |c| c.cpu_manager_policy = CpuManagerPolicy::None,
            guaranteed("c", 2000, G),
            "0-7,64-71|0|s",
        ),
        // Memory Manager policy None: no memory group, mems follow the CPUs
        (
            "memory-manager-policy static: 20 GiB spans two nodes",
            |c| c.policy = TopologyPolicy::BestEffort,
            guaranteed("c", 2000, 20 * G),
            "0,64|0-1|x",
        ),
        (
            "memory-manager-policy None",
            |c| {
                c.policy = TopologyPolicy::BestEffort;
                c.memory_manager_policy = MemoryManagerPolicy::None;
            },
            guaranteed("c", 2000, 20 * G),
            "0,64|0|x",
        ),
        // distribute-cpus-across-cores: one thread per core
        (
            "packed (default): whole cores",
            |_| {},
            guaranteed("c", 4000, G),
            "0-1,64-65|0|x",
        ),
        (
            "distribute-cpus-across-cores",
            |c| c.distribute_cpus_across_cores = true,
            guaranteed("c", 4000, G),
            "0-3|0|x",
        ),
        // TAP memory topology: mems left alone unless enabled
        (
            "TAP, memory topology off (default)",
            |c| c.shared_cpu_policy = SharedCpuPolicy::TopologyAware,
            burst(2500),
            "0-3,64-67|0-7|s",
        ),
        (
            "TAP, memory topology on",
            |c| {
                c.shared_cpu_policy = SharedCpuPolicy::TopologyAware;
                c.tap_memory_topology = true;
            },
            burst(2500),
            "0-3,64-67|0|s",
        ),
    ];
    for (name, set, container, want) in rows {
        let mut c = cfg(TopologyPolicy::Restricted);
        set(&mut c);
        let t = epyc();
        let mut a = Allocator::new(&t, &c).unwrap();
        let got = show(&a.admit(&t, &c, &pod("p", vec![container.clone()])));
        assert_eq!(&got, want, "{name}");
    }
}

#[test]
fn max_allowable_numa_nodes_is_enforced_like_kubelet() {
    let t = epyc(); // 8 nodes
    let mut c = cfg(TopologyPolicy::Restricted);
    assert!(Allocator::new(&t, &c).is_ok(), "8 nodes, default limit 8");
    let big = TopologyBuilder {
        sockets: 2,
        nodes_per_socket: 8,
        cores_per_node: 2,
        threads_per_core: 1,
        ..Default::default()
    }
    .build();
    let e = Allocator::new(&big, &c).unwrap_err();
    assert!(
        matches!(
            e,
            PlacementError::TooManyNodes {
                nodes: 16,
                max: 8,
                ..
            }
        ),
        "{e}"
    );
    c.max_allowable_numa_nodes = 16;
    assert!(Allocator::new(&big, &c).is_ok());
    c.max_allowable_numa_nodes = 8;
    c.policy = TopologyPolicy::None;
    assert!(Allocator::new(&big, &c).is_ok(), "policy none has no limit");
}

/// Init and sidecar containers (kubelet's cpusToReuse / initContainersReusableMemory and the
/// KEP 753 effective requests): one row per pod shape, the containers' CPUs in allocation order,
/// the regular memory reserved on node 0, and the pod's effective CPU and memory requests.
#[test]
fn init_containers_hand_on_and_sidecars_keep_their_cpus_and_memory() {
    let init = |name: &str, cpu, mem| guaranteed(name, cpu, mem);
    let sidecar = |name: &str, cpu, mem| Container {
        restart_policy: Some("Always".into()),
        ..guaranteed(name, cpu, mem)
    };
    // (what, init containers, app containers, CPUs in allocation order, memory reserved on
    // node 0, effective CPU millis, effective memory)
    type Row<'a> = (
        &'a str,
        Vec<Container>,
        Vec<Container>,
        &'a str,
        u64,
        u64,
        u64,
    );
    let rows: Vec<Row> = vec![
        (
            "init's CPUs reused by the app container",
            vec![init("i", 4000, G)],
            vec![guaranteed("a", 2000, G)],
            "i:0-1,64-65 a:0,64",
            G,
            4000,
            G,
        ),
        (
            "a sidecar reuses the init's CPUs and keeps them: the app gets others",
            vec![init("i", 2000, G), sidecar("s", 2000, G)],
            vec![guaranteed("a", 2000, G)],
            "i:0,64 s:0,64 a:1,65",
            2 * G,
            4000,
            2 * G,
        ),
        (
            "init memory larger than the app's: the app reserves nothing new",
            vec![init("i", 1000, 8 * G)],
            vec![guaranteed("a", 1000, 4 * G)],
            "i:0 a:0",
            8 * G,
            1000,
            8 * G,
        ),
        (
            "the init took all of node 0: the app's hints still count its CPUs (kubelet's reuse)",
            vec![init("i", 16000, G)],
            vec![guaranteed("a", 4000, G)],
            "i:0-7,64-71 a:0-1,64-65",
            G,
            16000,
            G,
        ),
        (
            "the app fits only by reusing the init's memory (free 4 GiB after it, app 8 GiB)",
            vec![init("i", 1000, 12 * G)],
            vec![guaranteed("a", 1000, 8 * G)],
            "i:0 a:0",
            12 * G,
            1000,
            12 * G,
        ),
        (
            "sidecar memory held: init 4, sidecar 2, app 3 GiB reserve 5 GiB",
            vec![init("i", 1000, 4 * G), sidecar("s", 1000, 2 * G)],
            vec![guaranteed("a", 1000, 3 * G)],
            "i:0 s:0 a:64",
            5 * G,
            2000,
            5 * G,
        ),
    ];
    let c = cfg(TopologyPolicy::Restricted);
    let t = epyc();
    for (name, inits, apps, cpus, reserved, eff_cpu, eff_mem) in rows {
        let mut a = Allocator::new(&t, &c).unwrap();
        let p = Pod {
            uid: "p".into(),
            containers: apps,
            init_containers: inits,
        };
        let placed = a
            .admit(&t, &c, &p)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            placed.len(),
            p.containers.len(),
            "{name}: app placements answered"
        );
        let got: Vec<String> = a.pods["p"]
            .containers
            .iter()
            .map(|x| format!("{}:{}", x.placement.container, x.placement.cpus))
            .collect();
        assert_eq!(got.join(" "), cpus, "{name}");
        let node0 = a.memory.nodes[0].blocks[&MemoryResource::Memory];
        assert_eq!(node0.reserved, reserved, "{name}: reserved on node 0");
        assert_eq!(
            a.pods["p"].cpu_request_millis, eff_cpu,
            "{name}: effective CPU"
        );
        assert_eq!(
            a.pods["p"].memory_request[&MemoryResource::Memory],
            eff_mem,
            "{name}: effective memory"
        );
        assert_eq!(a.check_restored(&t, &c), Ok(()), "{name}: state adds up");
        let empty = Allocator::new(&t, &c).unwrap();
        a.release("p");
        assert_eq!(a, empty, "{name}: release undoes everything");
    }
    // an init container's peak counts for capacity: 120 CPUs while it runs
    let mut be = cfg(TopologyPolicy::BestEffort);
    be.policy = TopologyPolicy::BestEffort;
    let mut a = Allocator::new(&t, &be).unwrap();
    let big = Pod {
        uid: "big".into(),
        containers: vec![guaranteed("a", 2000, G)],
        init_containers: vec![init("i", 120_000, G)],
    };
    a.admit(&t, &be, &big).unwrap();
    let e = a
        .admit(&t, &be, &pod("next", vec![guaranteed("c", 10_000, G)]))
        .unwrap_err();
    assert_eq!(e.reason, RejectionReason::InsufficientCpu, "{e}");
    // sidecars only as init containers; restart_policy only "Always"
    let mut bad = pod("x", vec![sidecar("a", 1000, G)]);
    assert!(bad.validate().unwrap_err().contains("only allowed on init"));
    bad.init_containers = vec![Container {
        restart_policy: Some("OnFailure".into()),
        ..init("i", 1000, G)
    }];
    bad.containers = vec![guaranteed("a", 1000, G)];
    assert!(bad.validate().unwrap_err().contains("must be"));
}

/// TAP topology-cluster-affinity on the Kunpeng 920 fixture (tests/fixtures/sysfs/kunpeng920:
/// 2 sockets × 2 nodes × 24 single-thread cores in clusters of 4), with CPU 0
/// reserved: the split cluster 0-3 is left to small requests, a 4-CPU container gets a whole
/// cluster and a 3-CPU one the rest of the split cluster, a Burstable one a cluster pool of the
/// freer node; off, the CPUs follow kubelet's order (1-4 spans two clusters) and
/// the Burstable container gets the whole node.
#[test]
fn topology_cluster_affinity_on_a_kunpeng_like_machine() {
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/kunpeng920");
    let t = Topology::from_sysfs(&root).unwrap();
    assert_eq!(CpuView::new(&t).clusters.len(), 24);
    let run = |on: bool| -> Vec<String> {
        let c = PlacementConfig {
            policy: TopologyPolicy::SingleNumaNode,
            reserved_cpus: CpuSet::parse("0").unwrap(),
            topology_cluster_affinity: on,
            ..Default::default()
        };
        let mut a = Allocator::new(&t, &c).unwrap();
        let burstable = Container {
            name: "b".into(),
            cpu_request_millis: 1500,
            ..Default::default()
        };
        [
            pod("four", vec![guaranteed("c", 4000, G)]),
            pod("three", vec![guaranteed("c", 3000, G)]),
            pod("burst", vec![burstable]),
        ]
        .iter()
        .map(|p| show(&a.admit(&t, &c, p)))
        .collect()
    };
    assert_eq!(run(true), ["4-7|0|x", "1-3|0|x", "24-27|1|s"]);
    assert_eq!(run(false), ["1-4|0|x", "5-7|0|x", "24-47|1|s"]);
}

/// Load measured beyond the books: what each node ran (and waited to run) above its shared
/// charges and its exclusive CPUs.
#[test]
fn overuse_is_the_measured_load_beyond_the_books() {
    let t = epyc();
    let c = cfg(TopologyPolicy::BestEffort);
    let mut a = Allocator::new(&t, &c).unwrap();
    let burst = |millis| Container {
        name: "c".into(),
        cpu_request_millis: millis,
        memory_bytes: G,
        ..Default::default()
    };
    assert_eq!(
        show(&a.admit(&t, &c, &pod("b", vec![burst(1000)]))),
        "0-7,64-71|0|s"
    );
    assert_eq!(
        show(&a.admit(&t, &c, &pod("g", vec![guaranteed("c", 2000, G)]))),
        "0,64|0|x"
    );
    // node 0: 0.5 per CPU × 16 CPUs = 8000m, booked 1000m + 2 exclusive CPUs; node 1 under its
    // books (nothing booked, nothing over); node 2 not a number; node 3 1000m over nothing
    let pressure: BTreeMap<u32, f64> = [(0, 0.5), (1, 0.0), (2, f64::NAN), (3, 0.0625)]
        .into_iter()
        .collect();
    let got = a.overuse(&t, &pressure);
    let want: BTreeMap<u32, u64> = [(0, 5000), (3, 1000)].into_iter().collect();
    assert_eq!(got.by_node, want);
    // measured under the books: nothing over
    let low: BTreeMap<u32, f64> = [(0, 0.1)].into_iter().collect();
    assert!(a.overuse(&t, &low).by_node.is_empty());
}

/// Among the nodes that fit and that the rules leave open, the measured load decides; the
/// kubelet-exact parts (hints, exclusive CPUs, Memory Manager memory) never see it.
#[test]
fn admission_sees_measured_load_only_among_the_choices_the_rules_leave() {
    let t = epyc();
    let c = cfg(TopologyPolicy::BestEffort);
    let base = Allocator::new(&t, &c).unwrap();
    let burst = Container {
        name: "c".into(),
        cpu_request_millis: 500,
        memory_bytes: G,
        ..Default::default()
    };
    let b = pod("b", vec![burst]);
    // nodes 0-2 seen busy: a Burstable pod goes to the first idle node, not to node 0
    let busy = Overuse {
        by_node: [(0, 6000), (1, 3000), (2, 500)].into_iter().collect(),
    };
    assert_eq!(show(&base.clone().admit(&t, &c, &b)), "0-7,64-71|0|s");
    assert_eq!(
        show(&base.clone().admit_seeing(&t, &c, &b, &busy)),
        "24-31,88-95|3|s"
    );
    // every other node seen busier than node 1: it is the one
    let all_but_1 = Overuse {
        by_node: (0..8).filter(|&n| n != 1).map(|n| (n, 2000)).collect(),
    };
    assert_eq!(
        show(&base.clone().admit_seeing(&t, &c, &b, &all_but_1)),
        "8-15,72-79|1|s"
    );
    // exclusive CPUs, hints and memory are the same whatever is measured: whole pods compared
    for p in [
        pod("g", vec![guaranteed("c", 4000, G)]),
        // fractional Guaranteed: Memory Manager memory on node 0 (kubelet's lowest mask), its
        // shared CPUs confined there however busy node 0 is seen
        pod("f", vec![guaranteed("c", 1500, G)]),
    ] {
        let (mut plain, mut seeing) = (base.clone(), base.clone());
        let overloaded = Overuse {
            by_node: [(0, 100_000)].into_iter().collect(),
        };
        let r1 = plain.admit(&t, &c, &p);
        let r2 = seeing.admit_seeing(&t, &c, &p, &overloaded);
        assert_eq!(show(&r1), show(&r2), "pod {}", p.uid);
        assert_eq!(plain, seeing, "pod {}", p.uid);
    }
    // single-numa-node: the affinity and the node that fits stay as they are
    let snn = cfg(TopologyPolicy::SingleNumaNode);
    let f = pod("f", vec![guaranteed("c", 1500, G)]);
    let seen = base.clone().admit_seeing(
        &t,
        &snn,
        &f,
        &Overuse {
            by_node: [(0, 100_000)].into_iter().collect(),
        },
    );
    assert_eq!(show(&seen), "0-7,64-71|0|s");
}

/// The starvation guard skips kubelet's Memory Manager entries without CPUs (pods
/// under the reserved uid prefix) and nothing else: a shared container of ours booked without
/// CPUs (no path does so today) makes an exclusive admission refused, not silently allowed.
#[test]
fn the_starvation_guard_skips_only_kubelets_entries_without_cpus() {
    let t = epyc();
    let c = cfg(TopologyPolicy::BestEffort);
    let burst = Container {
        name: "c".into(),
        cpu_request_millis: 500,
        memory_bytes: G,
        ..Default::default()
    };
    for (uid, refused) in [("b", true), ("kubelet:b", false)] {
        let mut a = Allocator::new(&t, &c).unwrap();
        a.admit(&t, &c, &pod("b", vec![burst.clone()])).unwrap();
        let mut p = a.pods.remove("b").unwrap();
        p.containers[0].placement.cpus = CpuSet::new();
        a.pods.insert(uid.into(), p);
        let g = a.admit(&t, &c, &pod("g", vec![guaranteed("c", 1000, G)]));
        match g {
            Err(e) if refused => {
                assert_eq!(e.reason, R::InsufficientCpu, "{uid}: {e}");
                assert!(e.to_string().contains("without a CPU"), "{uid}: {e}");
            }
            Ok(_) if !refused => {}
            other => panic!("{uid}: {}", show(&other)),
        }
    }
}

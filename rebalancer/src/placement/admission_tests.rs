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
    // the L3 group that lost the reserved CPUs is the tightest pool
    check(&c, &[(pod("b", vec![burst("c", 2500)]), "1-3,65-67|0|s")]);
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

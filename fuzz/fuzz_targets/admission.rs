//! The admission API body: `serde_json::from_slice::<Pod>` + `validate()` + `Allocator::admit`
//! on a small synthetic machine (2 sockets × 2 nodes × 4 cores × 2 threads, one GPU) under each
//! topology policy and scope, with one pod already admitted. Never a panic; a refused pod
//! leaves the allocator unchanged; an admitted one gets non-empty cpusets inside the machine,
//! never reserved CPUs, exclusive CPUs overlapping nobody's, and releasing it restores the state.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebalancer::{
    config::{PlacementConfig, TopologyPolicy, TopologyScope},
    cpuset::CpuSet,
    placement::admission::{Allocator, Container, Pod},
    topology::{DeviceClass, PciDevice, Topology, TopologyBuilder},
};

const G: u64 = 1 << 30;

fn machine() -> Topology {
    let mut t = TopologyBuilder {
        sockets: 2,
        nodes_per_socket: 2,
        cores_per_node: 4,
        threads_per_core: 2,
        memory_per_node_bytes: 8 * G,
        hugepages_2m_per_node: 64,
        hugepages_1g_per_node: 1,
        ..Default::default()
    }
    .build();
    t.devices.push(PciDevice {
        address: "0000:c1:00.0".into(),
        class: DeviceClass::Gpu,
        node: Some(3),
        vendor: None,
        device: None,
    });
    t
}

fn configs() -> Vec<PlacementConfig> {
    let policies = [
        TopologyPolicy::None,
        TopologyPolicy::BestEffort,
        TopologyPolicy::Restricted,
        TopologyPolicy::SingleNumaNode,
    ];
    let mut out = Vec::new();
    for (i, policy) in policies.into_iter().enumerate() {
        out.push(PlacementConfig {
            policy,
            scope: if i % 2 == 0 {
                TopologyScope::Container
            } else {
                TopologyScope::Pod
            },
            reserved_cpus: CpuSet::parse("0").unwrap(),
            full_pcpus_only: i == 3,
            ..Default::default()
        });
    }
    out
}

fn resident() -> Pod {
    Pod {
        uid: "resident".into(),
        containers: vec![Container {
            name: "c".into(),
            cpu_request_millis: 2000,
            cpu_limit_millis: 2000,
            memory_bytes: G,
            memory_limit_bytes: G,
            ..Default::default()
        }],
        init_containers: Vec::new(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(pod) = serde_json::from_slice::<Pod>(data) else {
        return;
    };
    let valid = pod.validate().is_ok();
    let topo = machine();
    let online = topo.online_cpus();
    for cfg in configs() {
        let mut a = Allocator::new(&topo, &cfg).expect("allocator");
        a.admit(&topo, &cfg, &resident())
            .expect("resident pod fits");
        let before = a.clone();
        let reserved = cfg.reserved_cpus.clone();
        match a.admit(&topo, &cfg, &pod) {
            Err(_) => assert_eq!(a, before, "a refused pod changed the allocator"),
            Ok(placements) => {
                assert!(valid, "an invalid pod was admitted");
                assert_eq!(placements.len(), pod.containers.len());
                for p in &placements {
                    assert!(!p.cpus.is_empty(), "empty cpuset for {p:?}");
                    assert!(!p.mems.is_empty(), "empty mems for {p:?}");
                    assert!(p.cpus.is_subset(&online), "cpus outside the machine: {p:?}");
                    if p.exclusive {
                        assert!(
                            p.cpus.is_disjoint(&reserved),
                            "reserved CPU handed out: {p:?}"
                        );
                    }
                }
                let mut seen = CpuSet::new();
                for p in a.placements().filter(|p| p.exclusive) {
                    assert!(p.cpus.is_disjoint(&seen), "exclusive CPUs overlap: {p:?}");
                    seen = seen.union(&p.cpus);
                }
                assert!(a.release(&pod.uid));
                assert_eq!(a, before, "release did not undo the admission");
            }
        }
    }
});

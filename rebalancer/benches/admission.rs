//! Admission time per pod on the 8-node EPYC-NPS4-like synthetic machine (2 sockets × 4 nodes ×
//! 8 cores × 2 threads, one GPU on node 5): one Guaranteed / Burstable / BestEffort / GPU pod
//! admitted into a half-full allocator, then released (the release is part of the iteration).
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rebalancer::checkpoint;
use rebalancer::config::{PlacementConfig, TopologyPolicy};
use rebalancer::placement::admission::{Allocator, Container, Pod};
use rebalancer::topology::{DeviceClass, PciDevice, Topology, TopologyBuilder};

const G: u64 = 1 << 30;

fn epyc() -> Topology {
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
        address: "0000:c1:00.0".into(),
        class: DeviceClass::Gpu,
        node: Some(5),
        vendor: None,
        device: None,
    });
    t
}

fn guaranteed(name: &str, millis: u64, mem: u64) -> Container {
    Container {
        name: name.into(),
        cpu_request_millis: millis,
        cpu_limit_millis: millis,
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

fn bench(c: &mut Criterion) {
    let t = epyc();
    for policy in [TopologyPolicy::BestEffort, TopologyPolicy::Restricted] {
        let cfg = PlacementConfig {
            policy,
            reserved_cpus: rebalancer::cpuset::CpuSet::parse("0,64").unwrap(),
            ..Default::default()
        };
        // half-full machine: four 8-CPU Guaranteed pods and four Burstable pods
        let mut base = Allocator::new(&t, &cfg).expect("allocator");
        // Guaranteed first: exclusive CPUs taken after a Burstable pod is pinned to a node may
        // not leave that pod without CPUs (the allocator refuses), so warm up in kubelet's order
        // of a node filling up.
        for i in 0..4 {
            base.admit(
                &t,
                &cfg,
                &pod(&format!("g{i}"), vec![guaranteed("c", 8000, 4 * G)]),
            )
            .expect("warm-up guaranteed");
        }
        for i in 0..4 {
            let b = Container {
                name: "c".into(),
                cpu_request_millis: 2000,
                memory_bytes: 2 * G,
                ..Default::default()
            };
            base.admit(&t, &cfg, &pod(&format!("b{i}"), vec![b]))
                .expect("warm-up burstable");
        }
        let mut gpu = guaranteed("c", 4000, 8 * G);
        gpu.devices.insert("nvidia.com/gpu".into(), 1);
        gpu.hugepages_2mi_bytes = 256 << 20;
        let cases = [
            (
                "guaranteed-4cpu",
                pod("x", vec![guaranteed("c", 4000, 2 * G)]),
            ),
            (
                "guaranteed-2x-containers",
                pod(
                    "x",
                    vec![guaranteed("a", 2000, G), guaranteed("b", 6000, G)],
                ),
            ),
            (
                "burstable",
                pod(
                    "x",
                    vec![Container {
                        name: "c".into(),
                        cpu_request_millis: 1500,
                        memory_bytes: G,
                        ..Default::default()
                    }],
                ),
            ),
            (
                "besteffort",
                pod(
                    "x",
                    vec![Container {
                        name: "c".into(),
                        ..Default::default()
                    }],
                ),
            ),
            ("gpu-hugepages", pod("x", vec![gpu])),
        ];
        if policy == TopologyPolicy::BestEffort {
            // The checkpoint every admission writes before it answers: the half-full
            // allocator's state, to tmpfs (so the figure is CPU, not the disk's fsync).
            let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs dir");
            c.bench_function("checkpoint/save-half-full", |bch| {
                bch.iter(|| checkpoint::save(dir.path(), black_box(&base)).expect("save"))
            });
        }
        for (name, p) in cases {
            let mut a = base.clone();
            c.bench_function(&format!("admit/{policy:?}/{name}"), |bch| {
                bch.iter(|| {
                    let r = a.admit(&t, &cfg, black_box(&p));
                    assert!(r.is_ok(), "{name}: {r:?}");
                    a.release("x");
                })
            });
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);

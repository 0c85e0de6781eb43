//! One planner round at 100 / 1,000 / 10,000 cgroups on synthetic 256-CPU machines with 2, 8
//! and 32 NUMA nodes. Target (PRODUCT.md): < 5 ms at 1,000 cgroups on 8 nodes, n log n growth.
//!
//! `cargo bench -p rebalancer --bench planner` (short runs: 10 samples, 2 s each).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rebalancer::config::ControllerConfig;
use rebalancer::controller::{plan, CgroupObs, ControllerState, NodeObs, Observations};
use rebalancer::cpuset::CpuSet;
use rebalancer::topology::{Topology, TopologyBuilder};

const PERIOD: u64 = 1_000_000_000;

/// Deterministic xorshift, so every run plans the same world.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn machine(nodes: u32) -> Topology {
    // 256 CPUs whatever the node count, so only the node count varies.
    let (sockets, per_socket) = match nodes {
        2 => (2, 1),
        8 => (2, 4),
        _ => (4, nodes / 4),
    };
    TopologyBuilder {
        sockets,
        nodes_per_socket: per_socket,
        cores_per_node: 128 / nodes,
        threads_per_core: 2,
        ..Default::default()
    }
    .build()
}

/// `n` cgroups, about a third of them badly placed (CPU on one node, most memory on another),
/// some spread over two nodes, a few exclusive; one node overloaded.
fn world(topo: &Topology, n: usize) -> Observations {
    let nodes = topo.nodes.len() as u64;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ n as u64 ^ (nodes << 32));
    let cgroups = (0..n)
        .map(|i| {
            let home = rng.below(nodes) as u32;
            let other = ((home as u64 + 1 + rng.below(nodes - 1)) % nodes) as u32;
            let demand = (1 + rng.below(40)) as f64 / 10.0;
            let mem = (64 + rng.below(2048)) << 20;
            let mut cg = CgroupObs {
                id: format!("kubepods/pod{:05}/c{}", i, i % 3),
                ..Default::default()
            };
            let (cpu_node, mems) = match i % 3 {
                0 => {
                    // misplaced: runs on `home`, memory mostly on `other`
                    cg.mem_bytes_per_node.insert(other, mem * 9 / 10);
                    cg.mem_bytes_per_node.insert(home, mem / 10);
                    (home, CpuSet::from_iter([home, other]))
                }
                1 => {
                    cg.mem_bytes_per_node.insert(home, mem);
                    (home, CpuSet::from_iter([home]))
                }
                _ => {
                    cg.mem_bytes_per_node.insert(home, mem / 2);
                    cg.mem_bytes_per_node.insert(other, mem / 2);
                    cg.cpu_ns_per_node
                        .insert(other, (demand / 2.0 * PERIOD as f64) as u64);
                    (home, CpuSet::from_iter([home, other]))
                }
            };
            *cg.cpu_ns_per_node.entry(cpu_node).or_default() +=
                (demand / 2.0 * PERIOD as f64) as u64;
            if i % 50 == 7 {
                cg.constraints.exclusive = true;
                let c = topo.nodes[home as usize]
                    .cpus
                    .iter()
                    .nth(i % 8)
                    .unwrap_or(0);
                cg.cpus = topo.cpu(c).map(|c| c.siblings.clone()).unwrap_or_default();
            } else {
                cg.cpus = topo.cpus_of_nodes(&mems);
            }
            cg.mems = mems;
            cg
        })
        .collect();
    Observations {
        period_ns: PERIOD,
        cgroups,
        nodes: topo
            .nodes
            .iter()
            .map(|nd| {
                (
                    nd.id,
                    NodeObs {
                        cpu_busy: if nd.id == 0 {
                            0.95
                        } else {
                            0.2 + 0.05 * (nd.id % 8) as f64
                        },
                        free_bytes: 32 << 30,
                        free_hugepage_bytes: 0,
                        runnable: None,
                    },
                )
            })
            .collect(),
        reserved_cpus: CpuSet::from_iter([0, 128]),
    }
}

fn bench(c: &mut Criterion) {
    let cfg = ControllerConfig::default();
    let mut g = c.benchmark_group("planner_round");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for nodes in [2u32, 8, 32] {
        let topo = machine(nodes);
        for n in [100usize, 1_000, 10_000] {
            let obs = world(&topo, n);
            let mut state = ControllerState::default();
            state.observe(&obs, rebalancer::controller::EWMA_ALPHA);
            let p = plan(&topo, &obs, &state, &cfg, 1_000_000);
            assert!(!p.moves.is_empty(), "synthetic world plans no move");
            g.bench_with_input(
                BenchmarkId::new(format!("{nodes}nodes"), n),
                &obs,
                |b, obs| b.iter(|| plan(&topo, black_box(obs), &state, &cfg, 1_000_000)),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

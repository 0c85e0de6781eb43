//! Control-loop cost at scale, on synthetic machines of 2, 8 and 32 nodes (16 cores × 2
//! threads per node) with 100 / 1,000 / 10,000 managed cgroups:
//! - `planner_round`: `ControllerState::observe_scored` + one `controller::plan_scored` (a
//!   fifth of the cgroups are candidates: poor locality, memory split over two nodes), the
//!   pair the daemon's round runs, the planner on a copy of the state as the daemon's is;
//!   `planner_round_cpu` is the same round measured in the process's CPU time (every thread's):
//!   on a machine loaded by other work, wall time is mostly waiting for a CPU;
//! - `observe_build`: folding raw eBPF map contents (`ebpf::sample::fold`, what the daemon
//!   does after the map read) into samples, and building the `Observations` from them;
//! - `state_memory` (printed once, not timed): heap bytes held by the controller state, the
//!   observations and a plan at 10,000 cgroups on 8 nodes (counting allocator), and their
//!   serialized JSON sizes.
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rebalancer::config::ControllerConfig;
use rebalancer::controller::{self, CgroupObs, ControllerState, NodeObs, Observations};
use rebalancer::cpuset::CpuSet;
use rebalancer::ebpf::sample::{fold, RawMaps};
use rebalancer::topology::{Topology, TopologyBuilder};
use rebalancer_common::{CgEvents, CgNodeKey};

/// Counts live heap bytes (for the state-size figure).
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const GIB: u64 = 1 << 30;
const PERIOD_NS: u64 = 5_000_000_000;

fn machine(nodes: u32) -> Topology {
    let (sockets, per) = match nodes {
        2 => (2, 1),
        8 => (2, 4),
        _ => (4, nodes / 4),
    };
    TopologyBuilder {
        sockets,
        nodes_per_socket: per,
        cores_per_node: 16,
        threads_per_core: 2,
        memory_per_node_bytes: 512 * GIB,
        ..Default::default()
    }
    .build()
}

/// A deterministic population: cgroup i lives on node i % nodes; every fifth has half its
/// memory on the next node (locality ≈ 0.5, a candidate).
fn observations(topo: &Topology, n: usize) -> Observations {
    let nodes = topo.nodes.len() as u32;
    let cgroups = (0..n)
        .map(|i| {
            let home = i as u32 % nodes;
            let other = (home + 1) % nodes;
            let mem = (64 + (i as u64 % 7) * 32) << 20;
            let mut mem_per_node = BTreeMap::from([(home, mem)]);
            if i % 5 == 0 {
                mem_per_node.insert(home, mem / 2);
                mem_per_node.insert(other, mem / 2);
            }
            let cpus = topo.nodes[home as usize].cpus.clone();
            CgroupObs {
                id: format!("kubepods/burstable/pod{i:05}/c"),
                cpu_ns_per_node: BTreeMap::from([(home, PERIOD_NS / 20)]),
                mem_bytes_per_node: mem_per_node,
                cpus,
                mems: CpuSet::from_iter([home]),
                ..Default::default()
            }
        })
        .collect();
    Observations {
        period_ns: PERIOD_NS,
        cgroups,
        nodes: topo
            .nodes
            .iter()
            .map(|nd| {
                let o = NodeObs {
                    cpu_busy: 0.5,
                    free_bytes: 256 * GIB,
                    free_hugepage_bytes: 0,
                    runnable: None,
                };
                (nd.id, o)
            })
            .collect(),
        reserved_cpus: CpuSet::new(),
    }
}

/// The process's CPU time (every thread's, `CLOCK_PROCESS_CPUTIME_ID`), in nanoseconds.
struct ProcessCpu;

fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ProcessCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        process_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        process_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds, printed as wall time is.
        WallTime.formatter()
    }
}

fn planner_round(c: &mut Criterion) {
    planner_round_in(c, "planner_round");
}

fn planner_round_cpu(c: &mut Criterion<ProcessCpu>) {
    planner_round_in(c, "planner_round_cpu");
}

fn planner_round_in<M: Measurement>(c: &mut Criterion<M>, name: &str) {
    let cfg = ControllerConfig::default();
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for nodes in [2u32, 8, 32] {
        let topo = machine(nodes);
        for n in [100usize, 1_000, 10_000] {
            let obs = observations(&topo, n);
            let mut state = ControllerState::default();
            state.observe(&obs, controller::EWMA_ALPHA);
            g.bench_with_input(BenchmarkId::new(format!("{nodes}n"), n), &n, |b, _| {
                b.iter(|| {
                    // As the daemon's round does (`Daemon::observe`, then `rounds::plan`):
                    // observe folds the period into the state, the planner runs on a copy
                    // of it (taken under the lock there) with the scores observe folded in,
                    // and the copy and the plan are dropped.
                    let scores = state.observe_scored(black_box(&obs), controller::EWMA_ALPHA);
                    let copy = state.clone();
                    let plan = controller::plan_scored(&topo, &obs, &scores, &copy, &cfg, 60_000);
                    (plan, copy)
                })
            });
        }
    }
    g.finish();
}

/// Raw map contents as the sampler reads them: one cpu_time and one events entry per
/// (cgroup, node it ran on).
fn raw_maps(nodes: u32, n: usize) -> RawMaps {
    let mut raw = RawMaps::default();
    for i in 0..n as u64 {
        for node in [i as u32 % nodes, (i as u32 + 1) % nodes] {
            let key = CgNodeKey {
                cgroup_id: 1000 + i,
                node,
                ..Default::default()
            };
            raw.cpu_time.push((key, 1_000_000 + i));
            raw.events.push((
                key,
                CgEvents {
                    migrations: 3,
                    cross_node_migrations: 1,
                    ..Default::default()
                },
            ));
        }
    }
    raw
}

fn observe_build(c: &mut Criterion) {
    let mut g = c.benchmark_group("observe_build");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let names = BTreeMap::new();
    for nodes in [2u32, 8, 32] {
        let topo = machine(nodes);
        for n in [100usize, 1_000, 10_000] {
            let raw = raw_maps(nodes, n);
            let paths: BTreeMap<u64, String> = (0..n as u64)
                .map(|i| (1000 + i, format!("kubepods/burstable/pod{i:05}/c")))
                .collect();
            let template = observations(&topo, n);
            g.bench_with_input(BenchmarkId::new(format!("{nodes}n"), n), &n, |b, _| {
                b.iter(|| {
                    let samples = fold(black_box(&raw), |c| topo.node_of_cpu(c), &names, false);
                    let cgroups: Vec<CgroupObs> = template
                        .cgroups
                        .iter()
                        .zip(samples.iter())
                        .map(|(t, (id, s))| CgroupObs {
                            id: paths[id].clone(),
                            cpu_ns_per_node: s.cpu_ns.clone(),
                            cross_node_migrations: s.cross_node_migrations,
                            mem_bytes_per_node: t.mem_bytes_per_node.clone(),
                            cpus: t.cpus.clone(),
                            mems: t.mems.clone(),
                            ..Default::default()
                        })
                        .collect();
                    Observations {
                        cgroups,
                        ..template.clone()
                    }
                })
            });
        }
    }
    g.finish();
}

fn state_memory(_c: &mut Criterion) {
    let cfg = ControllerConfig::default();
    let topo = machine(8);
    for n in [1_000usize, 10_000] {
        let before = LIVE.load(Ordering::Relaxed);
        let obs = observations(&topo, n);
        let after_obs = LIVE.load(Ordering::Relaxed);
        let mut state = ControllerState::default();
        state.observe(&obs, controller::EWMA_ALPHA);
        let after_state = LIVE.load(Ordering::Relaxed);
        let plan = controller::plan(&topo, &obs, &state, &cfg, 60_000);
        let after_plan = LIVE.load(Ordering::Relaxed);
        let json = |v: &dyn erased::Ser| v.size();
        eprintln!(
            "state_memory/8n/{n}: heap observations {} KiB, controller state {} KiB, plan {} KiB; \
             JSON observations {} KiB, state {} KiB, plan {} KiB",
            (after_obs - before) / 1024,
            (after_state - after_obs) / 1024,
            (after_plan - after_state) / 1024,
            json(&obs) / 1024,
            json(&state) / 1024,
            json(&plan) / 1024,
        );
        black_box((obs, state, plan));
    }
}

mod erased {
    pub trait Ser {
        fn size(&self) -> usize;
    }
    impl<T: serde::Serialize> Ser for T {
        fn size(&self) -> usize {
            serde_json::to_vec(self).map_or(0, |v| v.len())
        }
    }
}

criterion_group!(benches, state_memory, planner_round, observe_build);
criterion_group! {
    name = cpu_benches;
    config = Criterion::default().with_measurement(ProcessCpu);
    targets = planner_round_cpu
}
criterion_main!(benches, cpu_benches);

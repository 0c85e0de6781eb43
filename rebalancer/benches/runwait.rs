//! What measuring each workload's own wait costs a round (`runwait`, `controller.own_wait`):
//! one `OwnWait::sample` over a "cgroup" of 1,000 and of 10,000 threads (parked threads of
//! this process, the tids read from `/proc/self/task`), each thread's `run_delay` read from
//! `/proc/<tid>/schedstat` — the per-thread part of the cost; the cgroup files read per cgroup
//! (`cgroup.threads`, `cpu.stat` and its ancestors') come on top, a few per cgroup.

use std::{collections::BTreeMap, hint::black_box, path::Path, sync::mpsc};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rebalancer::runwait::{read_task, Measured, OwnWait, WaitSource};

struct SelfThreads(Vec<u32>);

impl WaitSource for SelfThreads {
    fn threads(&mut self, _: &str) -> Option<Vec<u32>> {
        Some(self.0.clone())
    }
    fn throttling(&mut self, _: &str, _: &[u32]) -> Option<u64> {
        Some(0)
    }
    fn task(&mut self, tid: u32) -> Option<(u64, u64)> {
        read_task(Path::new("/proc"), tid)
    }
}

fn tids() -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("runwait_sample");
    g.sample_size(10);
    let mut parked = Vec::new();
    for n in [1_000usize, 10_000] {
        while tids().len() < n {
            let (tx, rx) = mpsc::channel::<()>();
            let h = std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn(move || {
                    let _ = rx.recv();
                })
                .unwrap();
            parked.push((tx, h));
        }
        let mut src = SelfThreads(tids().into_iter().take(n).collect());
        let managed = vec!["w".to_string()];
        let mut t = OwnWait::default();
        let mut now = 0;
        t.sample(&managed, &mut src, usize::MAX, now);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                now += 1;
                let out: BTreeMap<String, Measured> = t.sample(&managed, &mut src, usize::MAX, now);
                black_box(out)
            })
        });
    }
    g.finish();
    for (tx, h) in parked {
        drop(tx);
        let _ = h.join();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! /proc parsers: /proc/stat, the Cpus_allowed_list of /proc/<pid>/status, task stat fields,
//! and /proc/<pid>/numa_maps and maps (staged moves), with the steal-time factors.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebalancer::{ebpf::steal, pages, procfs};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(a) = procfs::parse_stat(&text) {
        let _ = procfs::busy_between(&a, &a);
        let r = steal::CpuReading {
            stat: a,
            samples: Default::default(),
        };
        let nodes = r.stat.keys().map(|c| (*c, c % 2)).collect();
        let f = steal::node_factors(&Default::default(), &r, &nodes, steal::OnCpuClock::Exact, 1);
        assert!(f.values().all(|x| (0.0..=1.0).contains(x)));
    }
    let _ = procfs::parse_cpus_allowed(&text);
    let _ = procfs::parse_last_cpu(&text);
    let _ = procfs::parse_task_cpu(&text);
    for m in pages::parse_numa_maps(&text) {
        // (the product never sums these counts; a plain sum here overflowed on fuzz input)
        let _ = m.pages.values().fold(0u64, |a, b| a.saturating_add(*b));
    }
    for (a, b) in pages::parse_maps(&text) {
        assert!(a < b);
        assert!(pages::chunks(a, b)
            .take(4)
            .all(|(x, y)| a <= x && x < y && y <= b));
    }
});

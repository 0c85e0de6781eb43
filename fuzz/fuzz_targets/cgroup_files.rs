//! cgroup interface-file parsers: cpu.max, cfs quota/period (split at the first newline),
//! memory.max, cgroup.procs, /proc/<pid>/cgroup.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rebalancer::cgroup::files;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let p = Path::new("/sys/fs/cgroup/x/file");
    if let Ok(m) = files::parse_cpu_max(p, &text) {
        let _ = m.cpus();
    }
    let (q, per) = text.split_once('\n').unwrap_or((&text, ""));
    if let Ok(m) = files::parse_cfs(p, q, p, per) {
        let _ = m.cpus();
    }
    let _ = files::parse_memory_max(p, &text);
    let _ = files::parse_procs(p, &text);
    let _ = files::parse_proc_cgroup(p, &text);
    if data.len() >= 8 {
        let shares = u64::from_le_bytes(data[..8].try_into().unwrap());
        let w = files::shares_to_weight(shares);
        assert!((1..=10000).contains(&w), "weight {w} for shares {shares}");
    }
});

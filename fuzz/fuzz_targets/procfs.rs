//! /proc parsers: /proc/stat, the Cpus_allowed_list of /proc/<pid>/status, task stat fields.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebalancer::procfs;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(a) = procfs::parse_stat(&text) {
        let _ = procfs::busy_between(&a, &a);
    }
    let _ = procfs::parse_cpus_allowed(&text);
    let _ = procfs::parse_last_cpu(&text);
    let _ = procfs::parse_task_cpu(&text);
});

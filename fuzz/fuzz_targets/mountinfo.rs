//! /proc/self/mountinfo → cgroup mounts and mode.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rebalancer::cgroup::mode::Mounts;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let p = Path::new("/proc/self/mountinfo");
    for root in ["/sys/fs/cgroup", "/"] {
        if let Ok(m) = Mounts::parse_mountinfo(p, &text, Path::new(root)) {
            let _ = m.mode();
        }
    }
});

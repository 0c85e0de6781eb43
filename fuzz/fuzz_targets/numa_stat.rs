//! memory.numa_stat (v2 and v1, with page size from the first byte) and hugetlb numa_stat.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rebalancer::cgroup::files;

fuzz_target!(|data: &[u8]| {
    let (page_size, rest) = match data.split_first() {
        Some((b, rest)) => (1u64 << (b % 64), rest),
        None => (4096, data),
    };
    let text = String::from_utf8_lossy(rest);
    let p = Path::new("/sys/fs/cgroup/x/memory.numa_stat");
    let _ = files::parse_numa_stat_v2(p, &text);
    let _ = files::parse_numa_stat_v1(p, &text, page_size);
    let _ = files::parse_hugetlb_numa_stat(p, &text);
});

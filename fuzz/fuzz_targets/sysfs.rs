//! Topology sysfs parsers: node meminfo, distance rows (first line = kernel node order, second =
//! wanted order, rest = the row), PCI class classification.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rebalancer::topology::sysfs;

fn ids(line: &str) -> Vec<u32> {
    line.split_whitespace()
        .filter_map(|t| t.parse().ok())
        .take(64)
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let p = Path::new("/sys/devices/system/node/node0/meminfo");
    if let Ok((total, free)) = sysfs::parse_meminfo(p, &text) {
        let _ = (total, free);
    }
    let mut lines = text.splitn(3, '\n');
    let kernel = ids(lines.next().unwrap_or(""));
    let wanted = ids(lines.next().unwrap_or(""));
    let row = lines.next().unwrap_or("");
    let d = Path::new("/sys/devices/system/node/node0/distance");
    if let Ok(v) = sysfs::parse_distance_row(d, row, &kernel, &wanted) {
        assert_eq!(v.len(), wanted.len());
    }
    let _ = sysfs::parse_distance_row(d, &text, &[0, 1], &[1, 0]);
    if data.len() >= 4 {
        let class = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let _ = sysfs::classify_pci(class);
    }
});

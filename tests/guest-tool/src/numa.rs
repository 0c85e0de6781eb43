//! Pure parsing and arithmetic for the guest tool: cpulists, `numa_maps` lines, `maps` lines
//! and `pagemap` entries with the frame → node map, and locality (the fraction of a process's
//! pages that sit on the nodes where its threads may run).
use std::collections::BTreeMap;

/// Parses a kernel cpulist ("0-3,8,10-11"; empty or "\n" is the empty list).
pub fn parse_list(s: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let a: u32 = a.trim().parse().map_err(|_| format!("bad cpulist {s:?}"))?;
        let b: u32 = b.trim().parse().map_err(|_| format!("bad cpulist {s:?}"))?;
        if b < a {
            return Err(format!("bad range {part:?} in cpulist {s:?}"));
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Pages per node of one `numa_maps` line (`N0=12 N1=3` fields); `anon_only` skips lines without
/// `anon=` (file mappings: the binary, libraries).
pub fn numa_maps_line(line: &str, anon_only: bool) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    if anon_only && !line.split_whitespace().any(|f| f.starts_with("anon=")) {
        return m;
    }
    for f in line.split_whitespace() {
        let Some((k, v)) = f.split_once('=') else {
            continue;
        };
        let (Some(node), Ok(pages)) = (k.strip_prefix('N'), v.parse::<u64>()) else {
            continue;
        };
        if let Ok(node) = node.parse::<u32>() {
            *m.entry(node).or_insert(0) += pages;
        }
    }
    m
}

/// Sums the per-node pages of a whole `numa_maps` file.
pub fn numa_maps(text: &str, anon_only: bool) -> BTreeMap<u32, u64> {
    let mut total = BTreeMap::new();
    for line in text.lines() {
        for (n, p) in numa_maps_line(line, anon_only) {
            *total.entry(n).or_insert(0) += p;
        }
    }
    total
}

/// Pages on `local` nodes.
pub fn local_pages(per_node: &BTreeMap<u32, u64>, local: &[u32]) -> u64 {
    per_node
        .iter()
        .filter(|(n, _)| local.contains(n))
        .map(|(_, p)| p)
        .sum()
}

/// Fraction of pages on `local` nodes (0 when there are no pages).
pub fn locality(per_node: &BTreeMap<u32, u64>, local: &[u32]) -> f64 {
    let total: u64 = per_node.values().sum();
    if total == 0 {
        return 0.0;
    }
    local_pages(per_node, local) as f64 / total as f64
}

/// The address range of one `/proc/PID/maps` line worth counting: anonymous memory (no
/// backing inode: the heap, the stack, anonymous mmaps) unless `all`; never the kernel's
/// special mappings ([vvar], [vdso], [vsyscall]), which have no pages of the process.
pub fn maps_range(line: &str, all: bool) -> Option<(u64, u64)> {
    let mut f = line.split_whitespace();
    let (range, _perms, _off, _dev, inode) =
        (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let path = f.next().unwrap_or("");
    if matches!(path, "[vvar]" | "[vvar_vclock]" | "[vdso]" | "[vsyscall]") {
        return None;
    }
    if !all && inode != "0" {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    let (a, b) = (
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    );
    (b > a).then_some((a, b))
}

/// The page frame of a `/proc/PID/pagemap` entry: bit 63 present, bits 0–54 the frame (0 for a
/// reader without CAP_SYS_ADMIN). A page the NUMA balancer made PROT_NONE to take a hinting
/// fault is still present, with its frame: no manager is flattered by its own scanning.
pub fn pagemap_pfn(entry: u64) -> Option<u64> {
    (entry >> 63 == 1).then_some(entry & ((1 << 55) - 1))
}

/// Page frame → node, from the memory blocks each node lists (`nodeN/memoryM` in sysfs, each
/// block `block_bytes` long).
#[derive(Debug, Default)]
pub struct FrameNodes {
    block_pages: u64,
    blocks: BTreeMap<u64, u32>,
}

impl FrameNodes {
    pub fn new(block_bytes: u64, blocks: BTreeMap<u64, u32>, page: u64) -> Self {
        FrameNodes {
            block_pages: (block_bytes / page).max(1),
            blocks,
        }
    }

    /// The node of frame `pfn` (None: in no block any node lists).
    pub fn node(&self, pfn: u64) -> Option<u32> {
        self.blocks.get(&(pfn / self.block_pages)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pagemap_pieces() {
        let anon = "7f0000000000-7f0000400000 rw-p 00000000 00:00 0 ";
        assert_eq!(
            maps_range(anon, false),
            Some((0x7f00_0000_0000, 0x7f00_0040_0000))
        );
        let heap = "55d000001000-55d000022000 rw-p 00000000 00:00 0          [heap]";
        assert!(maps_range(heap, false).is_some());
        let file = "55d000000000-55d000001000 r--p 00000000 fd:01 1234   /bin/guest-tool";
        assert_eq!(maps_range(file, false), None);
        assert!(maps_range(file, true).is_some());
        let vdso = "7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0  [vdso]";
        assert_eq!(maps_range(vdso, true), None);
        assert_eq!(maps_range("garbage", true), None);
        assert_eq!(pagemap_pfn(1 << 63 | 0x1234), Some(0x1234));
        assert_eq!(pagemap_pfn(1 << 62 | 0x1234), None, "swapped: not present");
        assert_eq!(pagemap_pfn(0), None);
        // 128 MiB blocks: 32768 pages each; block 3 on node 1.
        let f = FrameNodes::new(128 << 20, BTreeMap::from([(0, 0), (3, 1)]), 4096);
        assert_eq!(f.node(100), Some(0));
        assert_eq!(f.node(3 * 32768 + 5), Some(1));
        assert_eq!(f.node(32768), None);
    }

    fn check(list: &str, want: Result<Vec<u32>, ()>) {
        assert_eq!(parse_list(list).map_err(|_| ()), want, "cpulist {list:?}");
    }

    #[test]
    fn cpulists() {
        check("", Ok(vec![]));
        check("\n", Ok(vec![]));
        check("0-1", Ok(vec![0, 1]));
        check("0-1,4,6-7\n", Ok(vec![0, 1, 4, 6, 7]));
        check("3,1", Ok(vec![1, 3]));
        check("2-1", Err(()));
        check("a", Err(()));
    }

    #[test]
    fn numa_maps_sums_anon_pages_only_when_asked() {
        let text = "\
7f0000000000 default anon=65536 dirty=65536 N0=100 N1=65436 kernelpagesize_kB=4
55d0 default file=/bin/guest-tool mapped=10 N0=10 kernelpagesize_kB=4
7ffd default stack anon=3 dirty=3 N1=3 kernelpagesize_kB=4";
        let anon = numa_maps(text, true);
        assert_eq!(anon, BTreeMap::from([(0, 100), (1, 65439)]));
        let all = numa_maps(text, false);
        assert_eq!(all, BTreeMap::from([(0, 110), (1, 65439)]));
        assert!((locality(&anon, &[1]) - 65439.0 / 65539.0).abs() < 1e-9);
        assert_eq!(local_pages(&anon, &[1]), 65439);
        assert_eq!(local_pages(&anon, &[0, 1]), 65539);
        assert_eq!(locality(&BTreeMap::new(), &[0]), 0.0);
    }
}

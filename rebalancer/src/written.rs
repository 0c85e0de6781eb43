//! Written pages per node: a measured locality source that needs neither a PMU nor AutoNUMA.
//!
//! The share model assumes every resident page is touched alike; a workload whose hot set is
//! a minority of its memory (32 MiB written on a remote node, 224 MiB idle on the local one)
//! looks 87% local to it while nearly all its traffic is remote. The kernel's soft-dirty bits
//! say which pages were written: `4` written to `/proc/<pid>/clear_refs` clears them (and
//! write-protects the page tables, so the next write to each page takes one minor fault that
//! sets the bit again); bit 55 of each `/proc/<pid>/pagemap` entry then tells which pages were
//! written since. Their nodes come from move_pages(2) in query mode. Per cgroup this gives
//! bytes written per node over one control period, and locality weights the share model by
//! them instead of by resident memory (`controller::locality`, evidence `written-pages`).
//!
//! Why soft-dirty: DAMON (CONFIG_DAMON_VADDR) and idle page tracking (CONFIG_IDLE_PAGE_TRACKING)
//! would see reads too, but Debian's cloud kernel, for one, has neither; CONFIG_MEM_SOFT_DIRTY
//! is on in Debian, Ubuntu, RHEL and Fedora kernels (CRIU needs it). Writes only: a read-only
//! hot set is invisible (the share model then stays in charge when nothing was written).
//!
//! On by default (`controller.written_pages`) where [`probe`] finds the kernel tracks the bits;
//! where it does not, `probe` and `status` say why and the share model decides. Its cost is
//! bounded twice: the daemon reads only cgroups whose memory is on two nodes or more (on one
//! node the written pages are where the resident ones are, so weighting by them changes
//! nothing), and a period reads at most [`PERIOD_PAGES`] pagemap entries over all cgroups
//! (processes past it are neither read nor cleared, so they take no extra faults). What is
//! left is one minor fault per written page per period and the pagemap read (BENCHMARKS.md,
//! "Measured access": per GiB of resident memory, from the test `written_root`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    io,
    os::unix::fs::FileExt,
    path::Path,
};

const PAGE: u64 = 4096;
/// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
pub const PM_SOFT_DIRTY: u64 = 1 << 55;
pub const PM_PRESENT: u64 = 1 << 63;
/// pagemap entries read at once (512 KiB).
const BATCH: u64 = 65_536;
/// Most pages looked at per process per period (64 GiB of mappings).
const MAX_PAGES: u64 = 16 << 20;
/// Most pagemap entries one period reads over every process (2 GiB of mappings). Measured on
/// the build VM (`written_root`): the scan costs about 17 ms of CPU per GiB and the node lookup
/// of written pages about 60 ms per GiB written, so the pages cost a period at most about
/// 150 ms (3% of a CPU at the default 5 s period) when all were written, 34 ms when none
/// were. What each process costs besides its pages (its maps read, pagemap opened,
/// clear_refs) is not counted against it: about 83 µs a process, 0.6 s of CPU per period at
/// 10,000 one-process cgroups (BENCHMARKS.md, "Planner scale").
pub const PERIOD_PAGES: u64 = 512 << 10;
/// Fewer written bytes than this in a period is no evidence (the share model decides).
pub const MIN_WRITTEN_BYTES: u64 = 64 * PAGE;

/// Private writable mappings of `/proc/<pid>/maps` text (where a process's own data is:
/// heap, stacks, anonymous mmaps, .data/.bss), as `[start, end)`. Shared mappings (page cache,
/// shmem) and `[vsyscall]` are left out.
pub fn private_writable(maps: &str) -> Vec<(u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let mut it = line.split_ascii_whitespace();
            let range = it.next()?;
            let perms = it.next()?;
            let b = perms.as_bytes();
            if b.len() < 4 || b[1] != b'w' || b[3] != b'p' || line.ends_with("[vsyscall]") {
                return None;
            }
            let (a, e) = range.split_once('-')?;
            let (a, e) = (
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            (a < e).then_some((a, e))
        })
        .collect()
}

/// Addresses of the pages written since the last clear among `entries` (pagemap entries of
/// consecutive pages from `start`): present and soft-dirty.
pub fn written_pages(entries: &[u64], start: u64) -> impl Iterator<Item = u64> + '_ {
    entries
        .iter()
        .enumerate()
        .filter(|(_, &e)| e & PM_PRESENT != 0 && e & PM_SOFT_DIRTY != 0)
        .map(move |(i, _)| start + i as u64 * PAGE)
}

/// Clears the soft-dirty bits of every page of `pid`.
pub fn clear(proc_root: &Path, pid: u32) -> io::Result<()> {
    std::fs::write(proc_root.join(pid.to_string()).join("clear_refs"), b"4")
}

fn read_entries(pagemap: &File, start: u64, n: u64) -> io::Result<Vec<u64>> {
    let mut buf = vec![0u8; (n * 8) as usize];
    let got = pagemap.read_at(&mut buf, start / PAGE * 8)?;
    Ok(buf[..got - got % 8]
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Addresses of `pid`'s pages written since the last [`clear`], and how many pagemap entries
/// were read for them (at most `limit`, and at most [`MAX_PAGES`]).
pub fn written_addresses(proc_root: &Path, pid: u32, limit: u64) -> io::Result<(Vec<u64>, u64)> {
    let dir = proc_root.join(pid.to_string());
    let maps = std::fs::read_to_string(dir.join("maps"))?;
    let pagemap = File::open(dir.join("pagemap"))?;
    let mut out = Vec::new();
    let limit = limit.min(MAX_PAGES);
    let mut left = limit;
    for (start, end) in private_writable(&maps) {
        let mut a = start;
        while a < end && left > 0 {
            let n = ((end - a) / PAGE).min(BATCH).min(left);
            let entries = read_entries(&pagemap, a, n)?;
            if entries.is_empty() {
                break;
            }
            out.extend(written_pages(&entries, a));
            left -= entries.len() as u64;
            a += entries.len() as u64 * PAGE;
        }
    }
    Ok((out, limit - left))
}

/// Bytes of `pid` written since the last [`clear`], per node of the page now, and the pagemap
/// entries read for them (at most `limit`).
pub fn written_per_node(
    proc_root: &Path,
    pid: u32,
    limit: u64,
) -> io::Result<(BTreeMap<u32, u64>, u64)> {
    let (addrs, read) = written_addresses(proc_root, pid, limit)?;
    let mut out = BTreeMap::new();
    for chunk in addrs.chunks(4096) {
        for node in crate::pages::query_nodes(pid, chunk)? {
            if let Ok(n) = u32::try_from(node) {
                *out.entry(n).or_default() += PAGE;
            }
        }
    }
    Ok((out, read))
}

/// Whether this kernel tracks soft-dirty bits, tried on a page of our own: cleared by
/// clear_refs, set again by a write. The error says why not.
pub fn probe(proc_root: &Path) -> Result<(), String> {
    let me = std::process::id();
    // One page of our own, written so it is present.
    let mut page = vec![0u8; 2 * PAGE as usize];
    let base = page.as_mut_ptr() as u64;
    let addr = base.div_ceil(PAGE) * PAGE;
    let off = (addr - base) as usize;
    let touch = |p: &mut Vec<u8>, v: u8| {
        // SAFETY: off < PAGE, inside the buffer; volatile so the write happens.
        unsafe { std::ptr::write_volatile(p.as_mut_ptr().add(off), v) };
    };
    touch(&mut page, 1);
    let entry = || -> Result<u64, String> {
        let f = File::open(proc_root.join(me.to_string()).join("pagemap"))
            .map_err(|e| format!("cannot open pagemap: {e}"))?;
        read_entries(&f, addr, 1)
            .map_err(|e| format!("cannot read pagemap: {e}"))?
            .first()
            .copied()
            .ok_or_else(|| "pagemap returned nothing".to_string())
    };
    clear(proc_root, me).map_err(|e| {
        format!("cannot write clear_refs (CONFIG_PROC_PAGE_MONITOR off, or not allowed): {e}")
    })?;
    if entry()? & PM_SOFT_DIRTY != 0 {
        return Err("soft-dirty bit still set after clear_refs: bits not tracked".into());
    }
    touch(&mut page, 2);
    if entry()? & PM_SOFT_DIRTY == 0 {
        return Err(
            "a written page has no soft-dirty bit: kernel without CONFIG_MEM_SOFT_DIRTY".into(),
        );
    }
    std::hint::black_box(&page);
    Ok(())
}

/// Per-round bookkeeping: a process's first read would report every page it ever wrote, so
/// a pid is only cleared the first time it is seen and read from the next period on. The
/// round's pagemap budget ([`PERIOD_PAGES`] unless set) is spent in the order cgroups are
/// sampled; a process reached once it is spent is left alone (not read, not cleared) and
/// counted in `skipped`. One left cleared from an earlier period and read later reports the
/// writes of those periods together: still where its writes go, over a longer window.
#[derive(Debug)]
pub struct WrittenPages {
    cleared: BTreeSet<u32>,
    seen: BTreeSet<u32>,
    /// Pagemap entries one round may read.
    pub budget: u64,
    left: u64,
    /// Processes of this round left alone for want of budget.
    pub skipped: u64,
}

impl Default for WrittenPages {
    fn default() -> Self {
        WrittenPages::with_budget(PERIOD_PAGES)
    }
}

impl WrittenPages {
    /// A tracker that reads at most `budget` pagemap entries per round.
    pub fn with_budget(budget: u64) -> Self {
        WrittenPages {
            cleared: BTreeSet::new(),
            seen: BTreeSet::new(),
            budget,
            left: budget,
            skipped: 0,
        }
    }

    /// Bytes per node the processes `pids` wrote since the last period, then cleared for the
    /// next; `None` when none of them was cleared a period ago (no measurement yet). A process
    /// that exits meanwhile is skipped.
    pub fn sample(&mut self, proc_root: &Path, pids: &[u32]) -> Option<BTreeMap<u32, u64>> {
        let mut out: Option<BTreeMap<u32, u64>> = None;
        for &pid in pids {
            self.seen.insert(pid);
            if self.left == 0 {
                self.skipped += 1;
                continue;
            }
            if self.cleared.contains(&pid) {
                match written_per_node(proc_root, pid, self.left) {
                    Ok((m, read)) => {
                        self.left = self.left.saturating_sub(read);
                        let o = out.get_or_insert_with(BTreeMap::new);
                        for (n, b) in m {
                            *o.entry(n).or_default() += b;
                        }
                    }
                    Err(e) => tracing::debug!(pid, error = %e, "written pages not read"),
                }
            }
            match clear(proc_root, pid) {
                Ok(()) => {
                    self.cleared.insert(pid);
                }
                Err(e) => {
                    self.cleared.remove(&pid);
                    tracing::debug!(pid, error = %e, "clear_refs failed");
                }
            }
        }
        out
    }

    /// Forgets processes not seen since the last call (they exited or left the cgroups) and
    /// gives the next round its budget again.
    pub fn end_round(&mut self) {
        let seen = std::mem::take(&mut self.seen);
        self.cleared.retain(|p| seen.contains(p));
        self.left = self.budget;
        self.skipped = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_writable_mappings_only() {
        let maps = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0010000000 rw-p 00000000 00:00 0
7f0010000000-7f0010001000 r--p 00000000 08:01 123                        /usr/lib/libc.so.6
7f0020000000-7f0020400000 rw-s 00000000 00:01 77                         /dev/shm/x
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
garbage
7f0030000000-7f0030000000 rw-p 00000000 00:00 0
";
        assert_eq!(
            private_writable(maps),
            vec![
                (0x55d0c0000000, 0x55d0c0021000),
                (0x7f0000000000, 0x7f0010000000)
            ]
        );
    }

    #[test]
    fn written_means_present_and_soft_dirty() {
        let e = [
            PM_PRESENT | PM_SOFT_DIRTY | 7,
            PM_PRESENT | 8,
            PM_SOFT_DIRTY, // swapped-out or not present: not counted
            PM_PRESENT | PM_SOFT_DIRTY,
        ];
        let got: Vec<u64> = written_pages(&e, 0x1000).collect();
        assert_eq!(got, vec![0x1000, 0x4000]);
    }

    /// The real thing on this kernel: our own page, cleared and written. Skips (with the
    /// reason printed) where the kernel does not track the bits.
    #[test]
    fn probe_and_sample_our_own_writes() {
        let proc_root = Path::new("/proc");
        if let Err(why) = probe(proc_root) {
            eprintln!("SKIP: soft-dirty tracking unavailable here: {why}");
            return;
        }
        let me = std::process::id();
        let mut t = WrittenPages::default();
        assert_eq!(t.sample(proc_root, &[me]), None, "first period only clears");
        let mut buf = vec![0u8; 64 * PAGE as usize];
        for i in (0..buf.len()).step_by(PAGE as usize) {
            // SAFETY: in bounds; volatile so every page is written.
            unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 1) };
        }
        let Some(w) = t.sample(proc_root, &[me]) else {
            panic!("second period has a measurement");
        };
        let total: u64 = w.values().sum();
        // Our 64 pages at least (other threads of the test binary write too).
        assert!(total >= 64 * PAGE, "{w:?}");
        std::hint::black_box(&buf);
        t.end_round();
        t.end_round();
        assert_eq!(
            t.sample(proc_root, &[me]),
            None,
            "forgotten after a round unseen"
        );
    }

    /// A round's budget spent: the processes past it are neither read nor cleared (no faults
    /// for pages nobody will read), and the next round has its budget again.
    #[test]
    fn a_spent_budget_leaves_the_rest_alone() {
        let proc_root = Path::new("/proc");
        if let Err(why) = probe(proc_root) {
            eprintln!("SKIP: soft-dirty tracking unavailable here: {why}");
            return;
        }
        let me = std::process::id();
        let mut t = WrittenPages::with_budget(0);
        assert_eq!(t.sample(proc_root, &[me]), None);
        assert_eq!(t.skipped, 1);
        assert!(t.cleared.is_empty(), "not cleared past the budget");
        t.end_round();
        assert_eq!(t.skipped, 0);
        // A budget of a few entries: read (so cleared and measured), then spent.
        let mut t = WrittenPages::with_budget(8);
        assert_eq!(t.sample(proc_root, &[me]), None, "first period only clears");
        t.end_round();
        assert!(t.sample(proc_root, &[me]).is_some());
        assert_eq!(
            t.left, 0,
            "8 entries read of a process with far more mapped"
        );
        assert_eq!(t.sample(proc_root, &[me]), None);
        assert_eq!(t.skipped, 1);
    }
}

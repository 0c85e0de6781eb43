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
//! Pages that appeared in a window were written there by their first touch: they say where
//! memory was allocated, not where the workload writes, so a window's writes are counted less
//! its memory's growth per node (`memory.numa_stat`, [`first_touches`]).
//!
//! Why soft-dirty: DAMON (CONFIG_DAMON_VADDR) and idle page tracking (CONFIG_IDLE_PAGE_TRACKING)
//! would see reads too, but Debian's cloud kernel, for one, has neither; CONFIG_MEM_SOFT_DIRTY
//! is on in Debian, Ubuntu, RHEL and Fedora kernels (CRIU needs it). Writes only: a read-only
//! hot set is invisible (the share model then stays in charge when nothing was written).
//!
//! On by default (`controller.written_pages`) where [`probe`] finds the kernel tracks the bits;
//! where it does not, `probe` and `status` say why and the share model decides. Its cost is
//! bounded twice: the daemon reads only cgroups whose memory is on two nodes or more
//! ([`spans_nodes`]: on one node the written pages are where the resident ones are, so
//! weighting by them changes nothing) and a new workload's first window (the round that first
//! finds it: still allocating, its memory may span nodes only a moment later), and a period spends at most [`PERIOD_PAGES`] pagemap-entry equivalents over all
//! of them, each cgroup's `cgroup.procs` read and each process charged at its measured cost
//! besides its pages ([`PROCS_READ_COST`], [`PROCESS_COST`]), whatever the number of cgroups
//! and processes. Periods go round the candidates (`WrittenPages`): the next starts where the
//! last stopped, so each is read within a bounded number of periods; processes past the
//! budget are neither read nor cleared, so they take no extra faults. What is left is one
//! minor fault per written page per window and the pagemap read (BENCHMARKS.md,
//! "Measured access": per GiB of resident memory, from the test `written_root`). A cgroup's
//! first window — a new candidate, or one re-pinned (restarted at the pin's event) — is read
//! within its round ([`QUICK_WINDOW`]), not a period later.

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
/// What one period spends, in pagemap-entry equivalents (2 GiB of mappings when all of it is
/// pages). Measured on the build VM (`written_root`): the scan costs about 17 ms of CPU per
/// GiB, 65 ns an entry, so the budget is about 34 ms when nothing was written; the node lookup
/// of written pages adds about 60 ms per GiB written, at most about 150 ms a period (3% of a
/// CPU at the default 5 s period) when all 2 GiB were.
pub const PERIOD_PAGES: u64 = 512 << 10;
/// What a process costs besides its pages (its maps read, pagemap opened, clear_refs), in
/// pagemap entries: 83 µs measured per one-process cgroup at 10,000 (`written_root`, 0.6 s a
/// period less the cgroup.procs reads, over 5,891 processes) / 65 ns an entry.
pub const PROCESS_COST: u64 = 1_280;
/// What reading a cgroup's `cgroup.procs` costs, in pagemap entries: 116-121 ms over 10,000
/// cgroups (`written_root`), 12 µs / 65 ns an entry.
pub const PROCS_READ_COST: u64 = 185;
/// Fewer written bytes than this in a window is no evidence (the share model decides).
pub const MIN_WRITTEN_BYTES: u64 = 64 * PAGE;
/// Whether a cgroup whose memory is `bytes_per_node` is worth reading: at least two nodes
/// hold [`MIN_WRITTEN_BYTES`] of it each. On one node the written pages are where the resident
/// ones are, so weighting by them changes nothing. A node holding less than that (a few pages
/// left by a first touch or a move) does not make the cgroup one to read every period (and to
/// wait for at a re-pin): writes confined to it are fewer than the floor a window needs to
/// count, and a workload whose writes are mostly there is left to the share model.
pub fn spans_nodes(bytes_per_node: impl IntoIterator<Item = u64>) -> bool {
    (bytes_per_node.into_iter())
        .filter(|&b| b >= MIN_WRITTEN_BYTES)
        .count()
        >= 2
}

/// How long a cgroup's first window may wait for evidence ([`WrittenPages::quick`]): its
/// first visit clears its bits and the same round reads them from [`QUICK_STEP`] on, so a
/// new candidate, or one an operator re-pinned, is decided on what it writes now rather than
/// a whole period later. Long enough for a busy writer to touch [`MIN_WRITTEN_BYTES`] many
/// times over (a page a few microseconds, its first write a minor fault), short enough to add
/// little to the round that waits for it.
pub const QUICK_WINDOW: std::time::Duration = std::time::Duration::from_millis(250);
/// How often a first window is read while it waits ([`WrittenPages::quick`]): it is decided
/// at the first read with [`MIN_WRITTEN_BYTES`] written that is not an allocation's.
pub const QUICK_STEP: std::time::Duration = std::time::Duration::from_millis(50);
/// The most a round waits for its new candidates' first windows, allocations included: a
/// window whose writes were mostly to pages that appeared in it (first touches: they show
/// where the memory was allocated, not where the workload writes) is started again once the
/// allocation settles, until this long after the period. A workload still allocating then is
/// left to its next visit.
pub const FIRST_WINDOWS_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

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
///
/// The page is a mapping of its own between two inaccessible guard pages: on the heap, another
/// thread's write to the same transparent huge page, or a mapping merged into the page's
/// (a merged mapping is marked soft-dirty whole), set the bit between the clear and the read
/// and the probe refused a kernel that tracks the bits (one boot of a 2-node guest in about
/// twenty). A bit still set after a clear is tried twice more.
pub fn probe(proc_root: &Path) -> Result<(), String> {
    let mut last = Ok(());
    for _ in 0..3 {
        last = probe_once(proc_root);
        match &last {
            Err(Probe::StillSet) => continue,
            _ => break,
        }
    }
    last.map_err(|e| match e {
        Probe::StillSet => "soft-dirty bit still set after clear_refs: bits not tracked".into(),
        Probe::Other(why) => why,
    })
}

enum Probe {
    StillSet,
    Other(String),
}

/// Three pages mapped, the outer two inaccessible (guards: no mapping merges with the middle
/// one); unmapped on drop.
struct GuardedPage {
    base: *mut libc::c_void,
}

impl GuardedPage {
    fn new() -> Result<GuardedPage, String> {
        let len = 3 * PAGE as usize;
        // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("mmap: {}", io::Error::last_os_error()));
        }
        let g = GuardedPage { base };
        // SAFETY: the middle page lies within the mapping just made.
        let r = unsafe {
            libc::mprotect(
                g.addr() as *mut libc::c_void,
                PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if r != 0 {
            return Err(format!("mprotect: {}", io::Error::last_os_error()));
        }
        Ok(g)
    }

    fn addr(&self) -> u64 {
        self.base as u64 + PAGE
    }

    fn write(&self, v: u8) {
        // SAFETY: the middle page is mapped read-write; volatile so the write happens.
        unsafe { std::ptr::write_volatile(self.addr() as *mut u8, v) };
    }
}

impl Drop for GuardedPage {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base, 3 * PAGE as usize) };
    }
}

fn probe_once(proc_root: &Path) -> Result<(), Probe> {
    let me = std::process::id();
    let page = GuardedPage::new().map_err(Probe::Other)?;
    page.write(1);
    let entry = || -> Result<u64, Probe> {
        let f = File::open(proc_root.join(me.to_string()).join("pagemap"))
            .map_err(|e| Probe::Other(format!("cannot open pagemap: {e}")))?;
        read_entries(&f, page.addr(), 1)
            .map_err(|e| Probe::Other(format!("cannot read pagemap: {e}")))?
            .first()
            .copied()
            .ok_or_else(|| Probe::Other("pagemap returned nothing".to_string()))
    };
    clear(proc_root, me).map_err(|e| {
        Probe::Other(format!(
            "cannot write clear_refs (CONFIG_PROC_PAGE_MONITOR off, or not allowed): {e}"
        ))
    })?;
    if entry()? & PM_SOFT_DIRTY != 0 {
        return Err(Probe::StillSet);
    }
    page.write(2);
    if entry()? & PM_SOFT_DIRTY == 0 {
        return Err(Probe::Other(
            "a written page has no soft-dirty bit: kernel without CONFIG_MEM_SOFT_DIRTY".into(),
        ));
    }
    Ok(())
}

/// Where a period's reads come from: a cgroup's processes, a process's written pages, its
/// bits cleared. [`Live`] reads /proc and cgroupfs; tests count calls.
pub trait Source {
    /// The processes of `cgroup` (`cgroup.procs`); empty when it cannot be read.
    fn procs(&mut self, cgroup: &str) -> Vec<u32>;
    /// [`written_per_node`]: bytes written per node and the pagemap entries read (≤ `limit`).
    fn read(&mut self, pid: u32, limit: u64) -> io::Result<(BTreeMap<u32, u64>, u64)>;
    /// [`clear`].
    fn clear(&mut self, pid: u32) -> io::Result<()>;
    /// The bytes `pid` has resident now (`/proc/<pid>/statm`); `None` when unknown (its
    /// windows are then never taken for an allocation's).
    fn resident(&mut self, pid: u32) -> Option<u64> {
        let _ = pid;
        None
    }
    /// `cgroup`'s anonymous memory per node (`memory.numa_stat`); `None` when unknown (its
    /// windows' first touches are then not told from its writes).
    fn anon_per_node(&mut self, cgroup: &str) -> Option<BTreeMap<u32, u64>> {
        let _ = cgroup;
        None
    }
}

/// Per node, the bytes of a window's writes that were first touches, from the cgroup's
/// anonymous memory per node at the window's clear (`before`) and now: the net growth,
/// shared among the nodes that grew in proportion to their growth. A page that appeared in
/// the window was written there (first touch), and shows where it was allocated, not where
/// the workload writes; pages that only moved between nodes (a migration) add nothing net and
/// are not taken for first touches. Where a migration and an allocation overlap, the growth
/// may be put on the node the pages moved to. The kernel flushes the cgroup's counters
/// lazily (a few hundred KiB per CPU may be pending): first touches are then undercounted,
/// never overcounted.
pub fn first_touches(before: &BTreeMap<u32, u64>, now: &BTreeMap<u32, u64>) -> BTreeMap<u32, u64> {
    let total = |m: &BTreeMap<u32, u64>| m.values().fold(0u64, |a, &b| a.saturating_add(b));
    let net = total(now).saturating_sub(total(before));
    let grew: BTreeMap<u32, u64> = now
        .iter()
        .map(|(n, b)| (*n, b.saturating_sub(before.get(n).copied().unwrap_or(0))))
        .filter(|(_, g)| *g > 0)
        .collect();
    let all = total(&grew);
    if net == 0 || all == 0 {
        return BTreeMap::new();
    }
    grew.into_iter()
        .map(|(n, g)| (n, (g as u128 * net as u128 / all as u128) as u64))
        .collect()
}

/// `written` less the window's first touches ([`first_touches`]), per node, those taken at
/// most `own_growth` in all: the growth of the processes whose writes were read. The cgroup's
/// figure counts every process in it (one forked in the window, one left unread for want of
/// budget, a child cgroup's); what those allocated must not erase the writes of the others.
fn less_first_touches(
    written: &mut BTreeMap<u32, u64>,
    touches: &BTreeMap<u32, u64>,
    own_growth: u64,
) {
    let all = touches.values().fold(0u64, |a, &b| a.saturating_add(b));
    for (n, t) in touches {
        let t = if all > own_growth {
            (*t as u128 * own_growth as u128 / all as u128) as u64
        } else {
            *t
        };
        if let Some(w) = written.get_mut(n) {
            *w = w.saturating_sub(t);
        }
    }
    written.retain(|_, w| *w > 0);
}

/// What a window's clear left to tell its first touches by ([`first_touches`]).
#[derive(Debug)]
struct Baseline {
    /// The cgroup's anonymous memory per node at the clear.
    anon: BTreeMap<u32, u64>,
    /// What the processes cleared then had resident.
    resident: u64,
}

/// The bytes `pid` has resident (`/proc/<pid>/statm`, its second field, in pages).
pub fn resident(proc_root: &Path, pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(proc_root.join(pid.to_string()).join("statm")).ok()?;
    let pages: u64 = statm.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(pages * PAGE)
}

/// The real source: `cgroup.procs` of the cpuset hierarchy, `/proc/<pid>/…`.
pub struct Live<'a> {
    pub cgroups: &'a crate::cgroup::Cgroups,
    pub proc_root: &'a Path,
}

impl Source for Live<'_> {
    fn procs(&mut self, cgroup: &str) -> Vec<u32> {
        (self
            .cgroups
            .procs(crate::cgroup::Controller::Cpuset, cgroup))
        .unwrap_or_default()
    }
    fn read(&mut self, pid: u32, limit: u64) -> io::Result<(BTreeMap<u32, u64>, u64)> {
        written_per_node(self.proc_root, pid, limit)
    }
    fn clear(&mut self, pid: u32) -> io::Result<()> {
        clear(self.proc_root, pid)
    }
    fn anon_per_node(&mut self, cgroup: &str) -> Option<BTreeMap<u32, u64>> {
        self.cgroups.numa_stat(cgroup).ok().map(|s| s.anon)
    }
    fn resident(&mut self, pid: u32) -> Option<u64> {
        resident(self.proc_root, pid)
    }
}

/// Where a period starts in `candidates` (sorted): at the first one not before `cursor`, the
/// ones before it after, so a pass goes round the whole order whatever joined or left.
pub fn rotation<'a>(
    candidates: &'a [String],
    cursor: Option<&str>,
) -> impl Iterator<Item = &'a String> + 'a {
    let start = cursor.map_or(0, |c| candidates.partition_point(|x| x.as_str() < c));
    candidates[start..].iter().chain(&candidates[..start])
}

/// The period's bookkeeping. A process's first read would report every page it ever wrote,
/// so a process is cleared at one visit of its cgroup and read at the next (then cleared
/// again): what a read reports is the pages written between two visits.
///
/// Each period spends a budget ([`PERIOD_PAGES`] unless set) in pagemap-entry equivalents:
/// [`PROCS_READ_COST`] per cgroup visited, [`PROCESS_COST`] per process, and the entries read.
/// It goes round the candidates (`rotation`): the next period starts at the first cgroup this
/// one did not finish, so every candidate is visited within about (their total cost / budget)
/// periods plus one, and a cgroup's cleared processes are read at its next visit, before they
/// are cleared again. Processes past the budget are neither read nor cleared (no faults for
/// pages nobody will read); one cleared earlier keeps its bits for its next visit.
///
/// The window between two visits is one period at small scale and a pass at large scale; the
/// count is not normalised per second because the decision uses it as shares between nodes
/// (the same whatever the window) and [`MIN_WRITTEN_BYTES`] as a floor on how many distinct
/// pages were seen (a page written again counts once whatever the window, so a rate would
/// call a steady hot set smaller the longer the pass).
///
/// A cgroup's first window is short: a visit that finds nothing cleared before (a new
/// candidate, or one whose CPUs changed since its last visit: [`WrittenPages::placed`]) only
/// clears, and [`WrittenPages::quick`] reads it (without clearing) from [`QUICK_STEP`] later
/// in the same round, out of what is left of the period's budget. A re-pin restarts the window because
/// what was written before it belongs to the placement it left (a workload that allocated
/// its cold memory locally and then writes a remote hot set would look local for a period).
#[derive(Debug)]
pub struct WrittenPages {
    /// Per candidate cgroup, its processes cleared at its last visit.
    cleared: BTreeMap<String, BTreeSet<u32>>,
    /// Per candidate cgroup, its memory when its processes were last cleared: a window's
    /// first touches are told from its writes by the growth since ([`first_touches`]).
    baseline: BTreeMap<String, Baseline>,
    /// Per candidate cgroup, its CPUs at its last visit ([`WrittenPages::placed`]).
    cpus: BTreeMap<String, crate::cpuset::CpuSet>,
    /// Cgroups of the last period whose visit only cleared, for [`WrittenPages::quick`].
    fresh: Vec<Fresh>,
    /// What restarts at events ([`WrittenPages::restart`]) spent since the last period, taken
    /// off the next period's budget.
    owed: u64,
    /// The cgroup the next period starts from; `None`: the first.
    cursor: Option<String>,
    /// Pagemap-entry equivalents one period may spend.
    pub budget: u64,
    left: u64,
    /// Processes of the last period's visited cgroups left alone for want of budget.
    pub skipped: u64,
    /// Cgroups the last period visited (read, or cleared for the next), of its candidates.
    pub visited: usize,
}

/// A first window waiting to be read ([`WrittenPages::quick`]).
#[derive(Debug)]
struct Fresh {
    cgroup: String,
    /// When it was cleared, counted from the end of the period that cleared it first.
    opened: std::time::Duration,
    /// What its cleared processes had resident then.
    resident: u64,
    /// Its last read saw an allocation: it is not read again until its processes stop
    /// growing (what they have resident at the last look is `seen`), then cleared anew.
    settling: bool,
    seen: u64,
}

impl Default for WrittenPages {
    fn default() -> Self {
        WrittenPages::with_budget(PERIOD_PAGES)
    }
}

impl WrittenPages {
    /// A tracker that spends at most `budget` pagemap-entry equivalents per period.
    pub fn with_budget(budget: u64) -> Self {
        WrittenPages {
            cleared: BTreeMap::new(),
            baseline: BTreeMap::new(),
            cpus: BTreeMap::new(),
            fresh: Vec::new(),
            owed: 0,
            cursor: None,
            budget,
            left: budget,
            skipped: 0,
            visited: 0,
        }
    }

    /// One period over `candidates` (sorted; the cgroups whose memory spans nodes, and new
    /// workloads): bytes written per node since its last visit, less the window's first
    /// touches ([`first_touches`]), for each cgroup visited with a process cleared then.
    /// Cgroups no longer candidates are forgotten.
    pub fn period(
        &mut self,
        src: &mut impl Source,
        candidates: &[String],
    ) -> BTreeMap<String, BTreeMap<u32, u64>> {
        self.cleared
            .retain(|cg, _| candidates.binary_search(cg).is_ok());
        self.baseline
            .retain(|cg, _| candidates.binary_search(cg).is_ok());
        self.cpus
            .retain(|cg, _| candidates.binary_search(cg).is_ok());
        self.left = self.budget.saturating_sub(std::mem::take(&mut self.owed));
        self.skipped = 0;
        self.visited = 0;
        self.fresh.clear();
        let mut out = BTreeMap::new();
        let mut next = None;
        let mut order = rotation(candidates, self.cursor.as_deref()).peekable();
        while let Some(cg) = order.next() {
            if self.left < PROCS_READ_COST + PROCESS_COST {
                next = Some(cg.clone());
                break;
            }
            self.left -= PROCS_READ_COST;
            self.visited += 1;
            let first = !self.cleared.contains_key(cg.as_str());
            let (written, done) = self.visit(src, cg);
            if let Some(w) = written {
                out.insert(cg.clone(), w);
            } else if let Some(pids) = self
                .cleared
                .get(cg.as_str())
                .filter(|c| first && !c.is_empty())
            {
                let resident = pids.iter().filter_map(|&p| src.resident(p)).sum();
                self.fresh.push(Fresh {
                    cgroup: cg.clone(),
                    opened: std::time::Duration::ZERO,
                    resident,
                    settling: false,
                    seen: resident,
                });
            }
            if !done {
                // Its remaining processes come first next period; one that does not fit a
                // whole period's budget is left where it stopped, so the pass goes on.
                next = if self.visited == 1 {
                    order.peek().cloned().cloned()
                } else {
                    Some(cg.clone())
                };
                break;
            }
        }
        if next.is_some() {
            self.cursor = next;
        }
        out
    }

    /// Notes `cgroup`'s CPUs now, before a period: when they changed since its last visit
    /// (an operator's or the daemon's re-pin), its cleared bits are dropped, so its next
    /// visit starts a fresh window (and [`WrittenPages::quick`] reads it in the same round).
    pub fn placed(&mut self, cgroup: &str, cpus: &crate::cpuset::CpuSet) {
        match self.cpus.get(cgroup) {
            Some(c) if c == cpus => return,
            Some(_) => {
                self.cleared.remove(cgroup);
            }
            None => {}
        }
        self.cpus.insert(cgroup.to_string(), cpus.clone());
    }

    /// An operator re-pinned `cgroup` (its CPUs now `cpus`): when it is a candidate and its
    /// CPUs changed, its window restarts now — its processes cleared at the event, not at the
    /// event's round — so the round (`event_settle_ms` later) reads a window all after the
    /// pin without waiting [`QUICK_WINDOW`]. What it costs is taken off the next period's
    /// budget ([`WrittenPages::clear_now`]). Whether the window restarted (a process of it
    /// cleared now).
    pub fn restart(
        &mut self,
        src: &mut impl Source,
        cgroup: &str,
        cpus: &crate::cpuset::CpuSet,
    ) -> bool {
        match self.cpus.get_mut(cgroup) {
            Some(c) if c != cpus => *c = cpus.clone(),
            _ => return false,
        }
        // Its last window belongs to the placement it left, cleared now or not.
        self.cleared.remove(cgroup);
        self.clear_now(src, cgroup)
    }

    /// An operator re-pinned `cgroup`, which no period has seen as a candidate yet (a new
    /// workload) but whose memory spans nodes: it becomes one, and its first window starts
    /// now as a known candidate's restarts ([`WrittenPages::restart`]), not in the event's
    /// round after its settle delay. Whether it started (not when already a candidate).
    pub fn start(
        &mut self,
        src: &mut impl Source,
        cgroup: &str,
        cpus: &crate::cpuset::CpuSet,
    ) -> bool {
        if self.cpus.contains_key(cgroup) {
            return false;
        }
        self.cpus.insert(cgroup.to_string(), cpus.clone());
        self.clear_now(src, cgroup)
    }

    /// Whether `cgroup` is a candidate already (its CPUs noted at a period).
    pub fn knows(&self, cgroup: &str) -> bool {
        self.cpus.contains_key(cgroup)
    }

    /// `cgroup`'s processes cleared now, out of the next period's budget. Events take at most
    /// half of it, so a stream of re-pins leaves every period half for its own visits (the
    /// other candidates are not starved); a process past that is left for the round. Whether
    /// any process was cleared: when none was (no budget left, no process), nothing is noted,
    /// and the round's visit is the cgroup's first (cleared, then read `QUICK_WINDOW` later).
    fn clear_now(&mut self, src: &mut impl Source, cgroup: &str) -> bool {
        let cap = self.budget / 2;
        if self.owed + PROCS_READ_COST + PROCESS_COST > cap {
            return false;
        }
        let mut spent = self.owed + PROCS_READ_COST;
        let mut now = BTreeSet::new();
        let mut resident = 0;
        for pid in src.procs(cgroup) {
            if spent + PROCESS_COST > cap {
                break;
            }
            spent += PROCESS_COST;
            match src.clear(pid) {
                Ok(()) => {
                    resident += src.resident(pid).unwrap_or(0);
                    now.insert(pid);
                }
                Err(e) => tracing::debug!(pid, error = %e, "clear_refs failed"),
            }
        }
        if now.is_empty() {
            self.owed = spent;
            return false;
        }
        // Its memory per node at the clear, when the events' share of the budget allows.
        let anon = (spent + PROCS_READ_COST <= cap)
            .then(|| src.anon_per_node(cgroup))
            .flatten();
        if anon.is_some() {
            spent += PROCS_READ_COST;
        }
        self.owed = spent;
        self.set_baseline(cgroup, anon, resident);
        self.cleared.insert(cgroup.to_string(), now);
        true
    }

    /// Whether a first window the last period opened is still to be read (see
    /// [`WrittenPages::quick`]): the round then waits [`QUICK_STEP`] and calls it.
    pub fn has_fresh(&self) -> bool {
        !self.fresh.is_empty()
    }

    /// The first windows' reads, `waited` after the period: each cgroup the last period only
    /// cleared (its first visit, or its first since a re-pin) is read again, not cleared
    /// (`peek`), out of what is left of the period's budget (so the period's spending stays
    /// bounded by it). A window is reported once it holds [`MIN_WRITTEN_BYTES`] written, or
    /// once it is [`QUICK_WINDOW`] old; until then it stays open for the next call. One whose
    /// writes were mostly first touches — its processes' resident memory grew by half of what
    /// they wrote or more — saw an allocation (the cold memory a workload first-touches
    /// locally before it writes its remote hot set, say), not where the workload writes: its
    /// processes' resident memory is then watched (no pagemap read) until it grows by less
    /// than [`MIN_WRITTEN_BYTES`] between two calls, and the window cleared and read anew,
    /// until [`FIRST_WINDOWS_LIMIT`]; one still allocating then is left to its next visit.
    /// What is reported are the pages written since the window's clear less its first touches
    /// (whether it saw an allocation is judged on all it wrote); the cgroup's next visit reads
    /// them again with what follows.
    pub fn quick(
        &mut self,
        src: &mut impl Source,
        waited: std::time::Duration,
    ) -> BTreeMap<String, BTreeMap<u32, u64>> {
        let last = waited >= FIRST_WINDOWS_LIMIT;
        let mut out = BTreeMap::new();
        for mut f in std::mem::take(&mut self.fresh) {
            if self.left < PROCS_READ_COST + PROCESS_COST {
                break;
            }
            self.left -= PROCS_READ_COST;
            if f.settling {
                // Its resident memory only (no pagemap read) until it grows by less than
                // the evidence floor between two looks; still growing at the limit, it is
                // left to its next visit.
                let now = self.resident_of(src, &f.cgroup);
                if now.saturating_sub(f.seen) >= MIN_WRITTEN_BYTES {
                    if !last {
                        f.seen = now;
                        self.fresh.push(f);
                    }
                    continue;
                }
                if let Some(resident) = self.clear_again(src, &f.cgroup).filter(|_| !last) {
                    self.fresh.push(Fresh {
                        opened: waited,
                        resident,
                        settling: false,
                        seen: resident,
                        ..f
                    });
                }
                continue;
            }
            let Some((mut w, resident)) = self.peek(src, &f.cgroup) else {
                continue;
            };
            // Whether it saw an allocation is judged on all it wrote, first touches included.
            let written: u64 = w.values().sum();
            let allocating = resident.saturating_sub(f.resident) * 2 >= written && written > 0;
            self.less_growth(src, &f.cgroup, &mut w, resident);
            let written: u64 = w.values().sum();
            if !last && allocating {
                tracing::debug!(cgroup = %f.cgroup, written, "written pages: a first window saw an allocation; read again once it settles");
                self.fresh.push(Fresh {
                    settling: true,
                    seen: resident,
                    ..f
                });
                continue;
            } else if !last && written < MIN_WRITTEN_BYTES && waited - f.opened < QUICK_WINDOW {
                self.fresh.push(f);
                continue;
            }
            tracing::debug!(cgroup = %f.cgroup, written = ?w, grown = resident.saturating_sub(f.resident), ms = (waited - f.opened).as_millis() as u64, "written pages: a first window read");
            out.insert(f.cgroup, w);
        }
        out
    }

    /// The pages written by `cg`'s processes cleared at its last visit, read without clearing
    /// them again (its window stays open until its next visit, which reads it whole: a clear
    /// costs a walk of every page table and a minor fault on each page written after it), and
    /// what those it read have resident. First touches are left in (see
    /// [`WrittenPages::less_growth`]).
    fn peek(&mut self, src: &mut impl Source, cg: &str) -> Option<(BTreeMap<u32, u64>, u64)> {
        let cleared = self.cleared.get(cg)?.clone();
        let mut out: Option<(BTreeMap<u32, u64>, u64)> = None;
        for pid in src.procs(cg).into_iter().filter(|p| cleared.contains(p)) {
            if self.left <= PROCESS_COST {
                self.skipped += 1;
                continue;
            }
            self.left -= PROCESS_COST;
            let resident = src.resident(pid);
            match src.read(pid, self.left) {
                Ok((m, read)) => {
                    self.left = self.left.saturating_sub(read);
                    let o = out.get_or_insert_with(Default::default);
                    for (n, b) in m {
                        *o.0.entry(n).or_default() += b;
                    }
                    o.1 += resident.unwrap_or(0);
                }
                Err(e) => tracing::debug!(pid, error = %e, "written pages not read"),
            }
        }
        out
    }

    /// What `cg`'s processes cleared at its last visit have resident now.
    fn resident_of(&mut self, src: &mut impl Source, cg: &str) -> u64 {
        let pids = self.cleared.get(cg).cloned().unwrap_or_default();
        pids.into_iter().filter_map(|p| src.resident(p)).sum()
    }

    /// `cg`'s processes cleared at its last visit cleared again, out of the period's budget:
    /// what those cleared have resident, or `None` when none was (its window then stays as it
    /// is).
    fn clear_again(&mut self, src: &mut impl Source, cg: &str) -> Option<u64> {
        let cleared = self.cleared.get(cg)?.clone();
        let mut now = BTreeSet::new();
        let mut resident = 0;
        for pid in cleared {
            if self.left <= PROCESS_COST {
                break;
            }
            self.left -= PROCESS_COST;
            if src.clear(pid).is_ok() {
                resident += src.resident(pid).unwrap_or(0);
                now.insert(pid);
            }
        }
        if now.is_empty() {
            return None;
        }
        // A process not cleared again keeps bits from before: not read in this window.
        let anon = self.anon_now(src, cg);
        self.set_baseline(cg, anon, resident);
        self.cleared.insert(cg.to_string(), now);
        Some(resident)
    }

    /// One cgroup's processes: read those cleared at its last visit, clear them all, while
    /// the budget lasts. Whether every process was reached.
    fn visit(&mut self, src: &mut impl Source, cg: &str) -> (Option<BTreeMap<u32, u64>>, bool) {
        let before = self.cleared.remove(cg).unwrap_or_default();
        let mut now = BTreeSet::new();
        let mut out: Option<BTreeMap<u32, u64>> = None;
        let mut done = true;
        // What the processes read, and those cleared, have resident now.
        let (mut read_resident, mut cleared_resident) = (0, 0);
        for pid in src.procs(cg) {
            if self.left <= PROCESS_COST {
                done = false;
                self.skipped += 1;
                if before.contains(&pid) {
                    now.insert(pid);
                }
                continue;
            }
            self.left -= PROCESS_COST;
            let resident = src.resident(pid).unwrap_or(0);
            if before.contains(&pid) {
                match src.read(pid, self.left) {
                    Ok((m, read)) => {
                        self.left = self.left.saturating_sub(read);
                        let o = out.get_or_insert_with(BTreeMap::new);
                        for (n, b) in m {
                            *o.entry(n).or_default() += b;
                        }
                        read_resident += resident;
                    }
                    Err(e) => tracing::debug!(pid, error = %e, "written pages not read"),
                }
            }
            match src.clear(pid) {
                Ok(()) => {
                    cleared_resident += resident;
                    now.insert(pid);
                }
                Err(e) => tracing::debug!(pid, error = %e, "clear_refs failed"),
            }
        }
        // One read of its memory per node: the growth over the window that ends, and the
        // baseline of the one that starts.
        let anon = if out.is_some() || !now.is_empty() {
            self.anon_now(src, cg)
        } else {
            None
        };
        if let (Some(w), Some(a)) = (&mut out, &anon) {
            self.less_since_baseline(cg, w, a, read_resident);
        }
        self.set_baseline(cg, anon, cleared_resident);
        self.cleared.insert(cg.to_string(), now);
        (out, done)
    }

    /// `cg`'s anonymous memory per node now (`memory.numa_stat`), out of the period's budget
    /// (charged as a `cgroup.procs` read); `None` when the source has no such figure or the
    /// budget no room for the read.
    fn anon_now(&mut self, src: &mut impl Source, cg: &str) -> Option<BTreeMap<u32, u64>> {
        if self.left < PROCS_READ_COST {
            return None;
        }
        let a = src.anon_per_node(cg)?;
        self.left -= PROCS_READ_COST;
        Some(a)
    }

    /// Notes what a clear of `cg`'s processes (who have `resident` now) leaves to tell the
    /// next window's first touches by; without its memory per node, that window's writes are
    /// taken as they are.
    fn set_baseline(&mut self, cg: &str, anon: Option<BTreeMap<u32, u64>>, resident: u64) {
        match anon {
            Some(anon) => self
                .baseline
                .insert(cg.to_string(), Baseline { anon, resident }),
            None => self.baseline.remove(cg),
        };
    }

    /// `written` (of `cg`'s window, read from processes that have `resident` now) less the
    /// window's first touches ([`first_touches`]): its memory's growth per node since the
    /// window's clear, at most what the processes read grew by ([`less_first_touches`]).
    fn less_since_baseline(
        &self,
        cg: &str,
        written: &mut BTreeMap<u32, u64>,
        anon: &BTreeMap<u32, u64>,
        resident: u64,
    ) {
        if let Some(b) = self.baseline.get(cg) {
            let touches = first_touches(&b.anon, anon);
            less_first_touches(written, &touches, resident.saturating_sub(b.resident));
        }
    }

    /// [`WrittenPages::less_since_baseline`] with its memory per node read now.
    fn less_growth(
        &mut self,
        src: &mut impl Source,
        cg: &str,
        written: &mut BTreeMap<u32, u64>,
        resident: u64,
    ) {
        if !self.baseline.contains_key(cg) {
            return;
        }
        if let Some(a) = self.anon_now(src, cg) {
            self.less_since_baseline(cg, written, &a, resident);
        }
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

    /// This process as the one process of cgroup "me".
    struct Me;
    impl Source for Me {
        fn procs(&mut self, _: &str) -> Vec<u32> {
            vec![std::process::id()]
        }
        fn read(&mut self, pid: u32, limit: u64) -> io::Result<(BTreeMap<u32, u64>, u64)> {
            written_per_node(Path::new("/proc"), pid, limit)
        }
        fn clear(&mut self, pid: u32) -> io::Result<()> {
            clear(Path::new("/proc"), pid)
        }
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
        let me = vec!["me".to_string()];
        let mut t = WrittenPages::default();
        assert!(t.period(&mut Me, &me).is_empty(), "first visit only clears");
        let mut buf = vec![0u8; 64 * PAGE as usize];
        for i in (0..buf.len()).step_by(PAGE as usize) {
            // SAFETY: in bounds; volatile so every page is written.
            unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 1) };
        }
        let w = t.period(&mut Me, &me);
        let total: u64 = w["me"].values().sum();
        // Our 64 pages at least (other threads of the test binary write too).
        assert!(total >= 64 * PAGE, "{w:?}");
        std::hint::black_box(&buf);
        t.period(&mut Me, &[]);
        assert!(
            t.period(&mut Me, &me).is_empty(),
            "forgotten once not a candidate"
        );
    }

    /// Counts what a period asks of its source: cgroup `cN` holds `procs[N]` processes
    /// (pids N*100+k), each with `entries` pagemap entries, one page written.
    #[derive(Default)]
    struct Fake {
        procs: Vec<u32>,
        entries: u64,
        log: Vec<(char, u32)>,
        /// Bytes each read reports written on node 0 (one page when 0).
        written: u64,
        /// What each process has resident.
        resident: u64,
        /// The cgroups' anonymous memory per node (`None`: unknown).
        anon: Option<BTreeMap<u32, u64>>,
    }
    impl Source for Fake {
        fn procs(&mut self, cg: &str) -> Vec<u32> {
            let i: u32 = cg[1..].parse().unwrap();
            self.log.push(('p', i));
            (0..self.procs[i as usize]).map(|k| i * 100 + k).collect()
        }
        fn read(&mut self, pid: u32, limit: u64) -> io::Result<(BTreeMap<u32, u64>, u64)> {
            self.log.push(('r', pid));
            Ok((
                [(0, self.written.max(PAGE))].into(),
                self.entries.min(limit),
            ))
        }
        fn clear(&mut self, pid: u32) -> io::Result<()> {
            self.log.push(('c', pid));
            Ok(())
        }
        fn resident(&mut self, _: u32) -> Option<u64> {
            Some(self.resident)
        }
        fn anon_per_node(&mut self, _: &str) -> Option<BTreeMap<u32, u64>> {
            self.anon.clone()
        }
    }

    /// First touches are the net growth, on the nodes that grew; a migration is none.
    #[test]
    fn first_touches_are_the_net_growth_where_it_grew() {
        let m = |e: &[(u32, u64)]| e.iter().map(|&(n, b)| (n, b * M)).collect();
        let ft = |b: &[(u32, u64)], a: &[(u32, u64)]| first_touches(&m(b), &m(a));
        // 224 MiB allocated on node 0 beside 32 MiB on node 1.
        assert_eq!(
            ft(&[(0, 10), (1, 32)], &[(0, 234), (1, 32)]),
            m(&[(0, 224)])
        );
        // 32 MiB migrated from node 1 to node 0: nothing new.
        assert!(ft(&[(0, 224), (1, 32)], &[(0, 256), (1, 0)]).is_empty());
        // The same migration while 14 MiB more were allocated on node 0: those 14.
        assert_eq!(ft(&[(0, 224), (1, 32)], &[(0, 270), (1, 0)]), m(&[(0, 14)]));
        // Growth on two nodes (a node absent before), shrinking memory, nothing known.
        assert_eq!(ft(&[], &[(0, 30), (1, 10)]), m(&[(0, 30), (1, 10)]));
        assert!(ft(&[(0, 30)], &[(0, 10)]).is_empty());
        assert!(ft(&[], &[]).is_empty());
        let mut w = m(&[(0, 16), (1, 32)]);
        less_first_touches(&mut w, &m(&[(0, 14), (2, 5)]), u64::MAX);
        assert_eq!(w, m(&[(0, 2), (1, 32)]));
        less_first_touches(&mut w, &m(&[(0, 14)]), u64::MAX);
        assert_eq!(
            w,
            m(&[(1, 32)]),
            "a node left with nothing written is dropped"
        );
        // At most what the processes read grew by, shared as the touches are.
        let mut w = m(&[(0, 40), (1, 40)]);
        less_first_touches(&mut w, &m(&[(0, 30), (1, 10)]), 20 * M);
        assert_eq!(w, m(&[(0, 25), (1, 35)]));
    }

    const M: u64 = 1 << 20;

    /// One process writing 32 MiB on node 0, 10 MiB resident (and in its cgroup), after the
    /// first visit of its cgroup `c0` (which only clears).
    fn one_writer_cleared() -> (Fake, WrittenPages) {
        let mut src = Fake {
            procs: vec![1],
            entries: 10,
            written: 32 * M,
            anon: Some([(0, 10 * M)].into()),
            resident: 10 * M,
            ..Default::default()
        };
        let mut t = WrittenPages::with_budget(1 << 20);
        assert!(
            t.period(&mut src, &names(1)).is_empty(),
            "the first visit clears"
        );
        (src, t)
    }

    /// A first window's quick read leaves its first touches out too, and judges whether it
    /// saw an allocation on all it wrote.
    #[test]
    fn a_first_window_read_leaves_out_its_first_touches() {
        let (mut src, mut t) = one_writer_cleared();
        // 2 MiB allocated: no allocation's window (2 × 2 < 32), 30 MiB of writes.
        src.anon = Some([(0, 12 * M)].into());
        src.resident = 12 * M;
        let w = t.quick(&mut src, QUICK_STEP);
        assert_eq!(w["c0"], [(0, 30 * M)].into());
        // Another first window that grew by 20 MiB of its 32 written: an allocation's, read
        // again once it settles rather than reported as 12 MiB of writes.
        let (mut src, mut t) = one_writer_cleared();
        src.anon = Some([(0, 30 * M)].into());
        src.resident = 30 * M;
        assert!(t.quick(&mut src, QUICK_STEP).is_empty());
        assert!(t.has_fresh(), "watched until it settles");
    }

    /// A window's writes exclude the pages that appeared in it (its memory's growth): what an
    /// allocation first-touched says where it was allocated, not where the workload writes.
    #[test]
    fn a_window_leaves_out_its_first_touches() {
        let (mut src, mut t) = one_writer_cleared();
        // 30 MiB allocated on node 0 in the window: 2 MiB of the 32 written are writes.
        src.anon = Some([(0, 40 * M)].into());
        src.resident = 40 * M;
        assert_eq!(t.period(&mut src, &names(1))["c0"], [(0, 2 * M)].into());
        // Nothing allocated since: every written page counts.
        assert_eq!(t.period(&mut src, &names(1))["c0"], [(0, 32 * M)].into());
        // The cgroup grew by 30 MiB, but not the process read (another one, forked in the
        // window or in a child cgroup, allocated them): its writes stay whole.
        src.anon = Some([(0, 70 * M)].into());
        assert_eq!(t.period(&mut src, &names(1))["c0"], [(0, 32 * M)].into());
        // Where the memory per node is unknown, the writes are taken as they are.
        src.anon = None;
        assert_eq!(t.period(&mut src, &names(1))["c0"], [(0, 32 * M)].into());
        src.anon = Some([(0, 200 * M)].into());
        assert_eq!(
            t.period(&mut src, &names(1))["c0"],
            [(0, 32 * M)].into(),
            "no figure at the clear: nothing to compare with"
        );
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    #[test]
    fn rotation_starts_at_the_cursor_and_wraps() {
        let c = names(4); // c0 c1 c2 c3
        let r = |cursor| rotation(&c, cursor).cloned().collect::<Vec<_>>();
        assert_eq!(r(None), ["c0", "c1", "c2", "c3"]);
        assert_eq!(r(Some("c2")), ["c2", "c3", "c0", "c1"]);
        // A cursor that left: from the next one after it.
        assert_eq!(r(Some("c1x")), ["c2", "c3", "c0", "c1"]);
        assert_eq!(r(Some("c9")), ["c0", "c1", "c2", "c3"]);
    }

    /// Each cgroup's cgroup.procs read, each process and each entry read are charged.
    #[test]
    fn every_cgroup_and_process_is_charged() {
        let mut src = Fake {
            procs: vec![2],
            entries: 100,
            ..Default::default()
        };
        let mut t = WrittenPages::with_budget(1 << 20);
        assert!(
            t.period(&mut src, &names(1)).is_empty(),
            "the first visit clears"
        );
        assert_eq!(t.budget - t.left, PROCS_READ_COST + 2 * PROCESS_COST);
        let w = t.period(&mut src, &names(1));
        assert_eq!(w["c0"], [(0, 2 * PAGE)].into());
        assert_eq!(
            t.budget - t.left,
            PROCS_READ_COST + 2 * (PROCESS_COST + 100)
        );
        // A period it was no candidate in forgets it: its next visit only clears.
        t.period(&mut src, &[]);
        assert!(t.period(&mut src, &names(1)).is_empty());
    }

    /// 10,000 candidates: a period visits what its budget pays for, not all of them.
    #[test]
    fn the_budget_bounds_a_period_whatever_the_count() {
        let mut src = Fake {
            procs: vec![1; 10_000],
            entries: 89,
            ..Default::default()
        };
        let c = names(10_000);
        let mut t = WrittenPages::default();
        for _ in 0..3 {
            src.log.clear();
            t.period(&mut src, &c);
            let spent = t.budget - t.left;
            assert!(spent <= PERIOD_PAGES);
            let visits = src.log.iter().filter(|e| e.0 == 'p').count();
            assert_eq!(visits, t.visited);
            assert!(visits as u64 <= PERIOD_PAGES / (PROCS_READ_COST + PROCESS_COST));
            assert!(visits as u64 >= PERIOD_PAGES / (PROCS_READ_COST + PROCESS_COST + 89) - 1);
        }
    }

    /// Rotation: every candidate is visited within a bounded number of periods, and a
    /// process cleared at one visit is read at the next before it is cleared again.
    #[test]
    fn rotation_visits_all_and_reads_before_clearing_again() {
        let n = 10;
        let mut src = Fake {
            procs: vec![1; n],
            entries: 50,
            ..Default::default()
        };
        let c = names(n);
        // Three one-process cgroups a period.
        let mut t = WrittenPages::with_budget(3 * (PROCS_READ_COST + PROCESS_COST + 50) + 10);
        let mut measured = BTreeSet::new();
        for _ in 0..2 * n.div_ceil(3) {
            measured.extend(t.period(&mut src, &c).into_keys());
            assert_eq!(t.visited, 3);
        }
        assert_eq!(
            measured.len(),
            n,
            "each measured within two passes: {measured:?}"
        );
        // Per process: clear, then read and clear, alternately (never cleared twice unread).
        for pid in (0..n as u32).map(|i| i * 100) {
            let ops: String = (src.log.iter())
                .filter(|e| e.1 == pid && e.0 != 'p')
                .map(|e| e.0)
                .collect();
            assert!(ops.starts_with("crc"), "{pid}: {ops}");
            assert!(!ops.contains("cc"), "{pid} cleared twice unread: {ops}");
        }
    }

    /// A cgroup cut short by the budget starts the next period (its remaining processes are
    /// read then); one that is cut short even at the start does not stall the pass.
    #[test]
    fn a_cut_cgroup_goes_first_and_a_huge_one_does_not_stall() {
        let mut src = Fake {
            procs: vec![1, 3, 1, 50],
            entries: 0,
            ..Default::default()
        };
        let c = names(4);
        let mut t = WrittenPages::with_budget(2 * PROCS_READ_COST + 3 * PROCESS_COST + 1);
        let period = |t: &mut WrittenPages, src: &mut Fake| {
            t.period(src, &c);
            (t.visited, t.skipped, t.cursor.clone().unwrap_or_default())
        };
        // c0, then two of c1's three processes: c1 goes first next time.
        assert_eq!(period(&mut t, &mut src), (2, 1, "c1".into()));
        assert_eq!(period(&mut t, &mut src), (1, 0, "c2".into()));
        // c2, then two of c3's 50.
        assert_eq!(period(&mut t, &mut src), (2, 48, "c3".into()));
        // c3 does not fit a whole period: the pass goes on without its tail.
        assert_eq!(period(&mut t, &mut src), (1, 47, "c0".into()));
        assert_eq!(period(&mut t, &mut src), (2, 1, "c1".into()));
        // c1's third process, cleared two periods ago and left alone since, is read now.
        assert!(!src.log.contains(&('r', 102)));
        assert_eq!(period(&mut t, &mut src), (1, 0, "c2".into()));
        assert!(src.log.contains(&('r', 102)));
        // A process past the budget is neither read nor cleared.
        assert!(src.log.contains(&('r', 300)) && src.log.contains(&('c', 302)));
        assert!(!src.log.iter().any(|e| e.1 == 303 && e.0 != 'p'));
    }
    /// A first visit only clears; the quick read of the same round then reads the cgroup,
    /// out of what the period left of its budget. A cgroup read before is not read twice.
    #[test]
    fn a_first_visit_is_read_again_in_the_same_round() {
        let mut src = Fake {
            procs: vec![1, 2],
            entries: 100,
            ..Default::default()
        };
        let mut t = WrittenPages::with_budget(1 << 20);
        assert!(t.period(&mut src, &names(1)).is_empty());
        assert!(t.has_fresh());
        let spent = t.budget - t.left;
        src.log.clear();
        assert_eq!(
            t.quick(&mut src, QUICK_WINDOW),
            [("c0".into(), [(0, PAGE)].into())].into()
        );
        assert_eq!(
            t.budget - t.left,
            spent + PROCS_READ_COST + PROCESS_COST + 100,
            "charged to the period's budget"
        );
        assert_eq!(src.log, [('p', 0), ('r', 0)], "read, not cleared again");
        assert!(
            !t.has_fresh() && t.quick(&mut src, QUICK_WINDOW).is_empty(),
            "once"
        );
        // c0 known, c1 new: the period reads c0 and clears c1; the quick read reads c1 only.
        src.log.clear();
        let w = t.period(&mut src, &names(2));
        assert_eq!(w.keys().collect::<Vec<_>>(), ["c0"]);
        let q = t.quick(&mut src, QUICK_WINDOW);
        assert_eq!(q["c1"], [(0, 2 * PAGE)].into());
        assert_eq!(q.len(), 1);
        let reads = |log: &[(char, u32)]| log.iter().filter(|e| e.0 == 'r').count();
        assert_eq!(reads(&src.log), 1 + 2);
    }

    /// A first window is reported at its first read with enough written; one with less stays
    /// open until it is `QUICK_WINDOW` old, then reported whatever it holds.
    #[test]
    fn a_first_window_waits_for_evidence_until_its_time() {
        let mut src = Fake {
            procs: vec![1, 1],
            written: MIN_WRITTEN_BYTES,
            ..Default::default()
        };
        let mut t = WrittenPages::with_budget(1 << 20);
        t.period(&mut src, &names(1));
        assert_eq!(
            t.quick(&mut src, QUICK_STEP)["c0"],
            [(0, MIN_WRITTEN_BYTES)].into()
        );
        assert!(!t.has_fresh());
        src.written = PAGE;
        t.period(&mut src, &names(2));
        let mut at = QUICK_STEP;
        while at < QUICK_WINDOW {
            assert!(t.quick(&mut src, at).is_empty(), "at {at:?}");
            assert!(t.has_fresh());
            at += QUICK_STEP;
        }
        assert_eq!(t.quick(&mut src, at)["c1"], [(0, PAGE)].into());
        assert!(!t.has_fresh());
    }

    /// A first window whose processes grew by half of what they wrote or more saw an
    /// allocation: it is not read again (only their resident memory looked at) while they
    /// keep growing by the evidence floor or more between two calls, then cleared and read
    /// anew — reported once they write without growing — and one still allocating at
    /// `FIRST_WINDOWS_LIMIT` is left to its next visit.
    #[test]
    fn a_first_window_that_saw_an_allocation_is_read_again_once_it_settles() {
        let written = 64 * MIN_WRITTEN_BYTES;
        let mut src = Fake {
            procs: vec![1],
            written,
            resident: 0,
            ..Default::default()
        };
        let mut t = WrittenPages::with_budget(1 << 20);
        t.period(&mut src, &names(1));
        src.log.clear();
        src.resident = written / 2;
        assert!(t.quick(&mut src, QUICK_STEP).is_empty());
        assert_eq!(src.log, [('p', 0), ('r', 0)], "read once");
        // still growing: neither read nor cleared
        src.log.clear();
        src.resident += MIN_WRITTEN_BYTES;
        assert!(t.quick(&mut src, 2 * QUICK_STEP).is_empty());
        assert!(src.log.is_empty(), "{:?}", src.log);
        // settled: cleared, and read at the next call
        src.resident += MIN_WRITTEN_BYTES - PAGE;
        assert!(t.quick(&mut src, 3 * QUICK_STEP).is_empty());
        assert_eq!(src.log, [('c', 0)]);
        assert_eq!(
            t.quick(&mut src, 4 * QUICK_STEP)["c0"],
            [(0, written)].into()
        );
        assert!(!t.has_fresh());
        // still allocating at the limit: nothing reported, left to the next visit
        t.placed("c0", &"0".parse().unwrap());
        t.placed("c0", &"1".parse().unwrap());
        t.period(&mut src, &names(1));
        assert!(t.has_fresh());
        let mut at = QUICK_STEP;
        while at < FIRST_WINDOWS_LIMIT {
            src.resident += written;
            assert!(t.quick(&mut src, at).is_empty(), "at {at:?}");
            at += QUICK_STEP;
        }
        src.resident += written;
        assert!(t.quick(&mut src, at).is_empty());
        assert!(!t.has_fresh());
        assert!(
            t.period(&mut src, &names(1)).contains_key("c0"),
            "read at its next visit"
        );
    }

    /// CPUs that changed since the last visit restart the window: the next period only clears
    /// (what was written before the re-pin is not read) and its quick read reads it.
    #[test]
    fn a_re_pin_restarts_the_window() {
        let mut src = Fake {
            procs: vec![1],
            entries: 0,
            ..Default::default()
        };
        let c = names(1);
        let (all, node0): (crate::cpuset::CpuSet, crate::cpuset::CpuSet) =
            ("0-7".parse().unwrap(), "0-1".parse().unwrap());
        let mut t = WrittenPages::with_budget(1 << 20);
        t.placed("c0", &all);
        t.period(&mut src, &c);
        t.quick(&mut src, QUICK_WINDOW);
        t.placed("c0", &all);
        assert!(t.period(&mut src, &c).contains_key("c0"), "same CPUs: read");
        assert!(!t.has_fresh());
        t.placed("c0", &node0);
        src.log.clear();
        assert!(t.period(&mut src, &c).is_empty(), "re-pinned: only cleared");
        assert_eq!(src.log, [('p', 0), ('c', 0)]);
        assert!(t.quick(&mut src, QUICK_WINDOW).contains_key("c0"));
        t.placed("c0", &node0);
        assert!(t.period(&mut src, &c).contains_key("c0"));
    }

    /// The quick read spends only what the period left: with the budget spent it reads
    /// nothing, and the cgroup keeps its cleared bits for its next visit.
    #[test]
    fn the_quick_read_stays_within_the_budget() {
        let mut src = Fake {
            procs: vec![1, 1],
            entries: 0,
            ..Default::default()
        };
        // Two first visits fit, no more.
        let mut t = WrittenPages::with_budget(2 * (PROCS_READ_COST + PROCESS_COST) + 1);
        t.period(&mut src, &names(2));
        assert_eq!(t.visited, 2);
        assert!(t.has_fresh());
        src.log.clear();
        assert!(t.quick(&mut src, QUICK_WINDOW).is_empty());
        assert!(src.log.is_empty(), "{:?}", src.log);
        // The next period reads both, their bits cleared by the first.
        assert_eq!(t.period(&mut src, &names(2)).len(), 2);
    }
    /// A re-pin seen at its event restarts a candidate's window there: its processes are
    /// cleared at once, the event's round reads them (no first-window wait), and what the
    /// restart cost comes off that period's budget. Not a candidate, or the same CPUs:
    /// nothing.
    #[test]
    fn a_re_pin_at_its_event_restarts_the_window_then() {
        let mut src = Fake {
            procs: vec![2],
            entries: 10,
            ..Default::default()
        };
        let c = names(1);
        let (all, node0): (crate::cpuset::CpuSet, crate::cpuset::CpuSet) =
            ("0-7".parse().unwrap(), "0-1".parse().unwrap());
        let mut t = WrittenPages::with_budget(1 << 20);
        assert!(!t.restart(&mut src, "c0", &node0), "not a candidate yet");
        assert!(src.log.is_empty());
        t.placed("c0", &all);
        t.period(&mut src, &c);
        t.quick(&mut src, QUICK_WINDOW);
        assert!(!t.restart(&mut src, "c0", &all), "the same CPUs");
        src.log.clear();
        assert!(t.restart(&mut src, "c0", &node0));
        assert_eq!(src.log, [('p', 0), ('c', 0), ('c', 1)]);
        // The round: the same CPUs now, a window open since the event — read, not only cleared.
        t.placed("c0", &node0);
        src.log.clear();
        let w = t.period(&mut src, &c);
        assert_eq!(w["c0"], [(0, 2 * PAGE)].into());
        assert!(!t.has_fresh());
        let restart = PROCS_READ_COST + 2 * PROCESS_COST;
        let visit = PROCS_READ_COST + 2 * (PROCESS_COST + 10);
        assert_eq!(
            t.budget - t.left,
            restart + visit,
            "the restart's cost is the period's"
        );
        // Owed once: the next period has its whole budget.
        t.period(&mut src, &c);
        assert_eq!(t.budget - t.left, visit);
    }

    /// Memory read for its writes only where two nodes hold enough of it to hold a hot set
    /// that counts: a few pages on a second node do not make a candidate.
    #[test]
    fn a_candidate_has_evidence_sized_memory_on_two_nodes() {
        assert!(!spans_nodes([]));
        assert!(!spans_nodes([1 << 30]));
        assert!(!spans_nodes([1 << 30, 4 * PAGE]));
        assert!(!spans_nodes([1 << 30, 0, MIN_WRITTEN_BYTES - 1]));
        assert!(spans_nodes([1 << 30, 0, MIN_WRITTEN_BYTES]));
        assert!(spans_nodes([32 << 20, 224 << 20]));
    }

    /// Events spend at most half a period's budget: past it a re-pin clears nothing, notes
    /// nothing (its round's visit is a first one, read in the same round), and the period
    /// keeps the other half for every candidate.
    #[test]
    fn re_pins_take_at_most_half_a_period_and_leave_the_rest() {
        let mut src = Fake {
            procs: vec![1, 1, 1, 1],
            entries: 10,
            ..Default::default()
        };
        let c = names(4);
        let one = PROCS_READ_COST + PROCESS_COST;
        // Room for two restarts within half the budget, not three.
        let mut t = WrittenPages::with_budget(2 * (2 * one + one / 2));
        let node0: crate::cpuset::CpuSet = "0-1".parse().unwrap();
        assert!(t.start(&mut src, "c0", &node0));
        assert!(t.start(&mut src, "c1", &node0));
        src.log.clear();
        assert!(!t.start(&mut src, "c2", &node0), "past half the budget");
        assert!(src.log.is_empty(), "nothing read or cleared: {:?}", src.log);
        assert!(!t.knows("c3"));
        assert!(t.owed <= t.budget / 2);
        let w = t.period(&mut src, &c);
        assert!(w.contains_key("c0") && w.contains_key("c1"), "{w:?}");
        assert!(
            !w.contains_key("c2"),
            "not cleared at its event: a first visit"
        );
    }

    /// A workload re-pinned before any period saw its memory span nodes starts its window at
    /// the event too: cleared there, read (not only cleared) by the event's round; one already
    /// a candidate is left to `restart`.
    #[test]
    fn a_new_workload_re_pinned_starts_its_window_at_the_event() {
        let mut src = Fake {
            procs: vec![2],
            entries: 10,
            ..Default::default()
        };
        let c = names(1);
        let node0: crate::cpuset::CpuSet = "0-1".parse().unwrap();
        let mut t = WrittenPages::with_budget(1 << 20);
        assert!(!t.knows("c0"));
        assert!(t.start(&mut src, "c0", &node0));
        assert_eq!(src.log, [('p', 0), ('c', 0), ('c', 1)]);
        assert!(t.knows("c0"));
        assert!(!t.start(&mut src, "c0", &node0), "a candidate already");
        t.placed("c0", &node0);
        src.log.clear();
        let w = t.period(&mut src, &c);
        assert_eq!(w["c0"], [(0, 2 * PAGE)].into());
        assert!(!t.has_fresh());
    }
}

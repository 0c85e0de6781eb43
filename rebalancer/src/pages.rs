//! Moving a process's pages to other NUMA nodes with move_pages(2), a budget at a time: the
//! I/O edge of staged moves (see `controller::Stage`).
//!
//! `/proc/<pid>/numa_maps` tells which mappings hold pages on which nodes ([`parse_numa_maps`],
//! pure); `/proc/<pid>/maps` gives their ends ([`parse_maps`]). Each candidate mapping is walked
//! in 2 MiB-aligned chunks of 512 pages ([`Walk`]): one move_pages call asks where the pages of
//! several chunks are, one per chunk moves those on other nodes (one target node per chunk,
//! round-robin), and its status array counts the pages that arrived. A transparent huge page is
//! 2 MiB-aligned, so it lies in one chunk and is counted whole; chunks are taken only while
//! their pages fit the budget left, so a walk never moves more than the budget. A [`Walk`]
//! resumes where its last call stopped, so a writer moving a cgroup's pages a step at a time
//! reads each process's numa_maps once per pass and queries each chunk once. Hugetlb mappings are left alone (their pages move when mems narrow).
//! Pages shared with processes outside the request are not moved by the kernel and not counted.

use std::collections::BTreeMap;

use crate::cpuset::CpuSet;

const PAGE: u64 = 4096;
/// Pages per chunk: one 2 MiB transparent huge page.
const CHUNK: u64 = 512;
const MPOL_MF_MOVE: libc::c_int = 1 << 1;

/// One mapping of numa_maps: its start, pages per node, and whether it is hugetlb.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaMap {
    pub start: u64,
    pub pages: BTreeMap<u32, u64>,
    pub hugetlb: bool,
}

/// Parses `/proc/<pid>/numa_maps` (`<start> <policy> [key=value | flag]…`, pages per node as
/// `N<node>=<pages>`). Lines that do not start with a hex address are skipped.
pub fn parse_numa_maps(text: &str) -> Vec<NumaMap> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.split_ascii_whitespace();
            let start = u64::from_str_radix(it.next()?, 16).ok()?;
            let mut m = NumaMap {
                start,
                ..Default::default()
            };
            for tok in it {
                if tok == "huge" {
                    m.hugetlb = true;
                } else if let Some((k, v)) = tok.split_once('=') {
                    let node = k.strip_prefix('N').and_then(|n| n.parse::<u32>().ok());
                    if let (Some(node), Ok(v)) = (node, v.parse::<u64>()) {
                        m.pages.insert(node, v);
                    }
                }
            }
            Some(m)
        })
        .collect()
}

/// Parses `/proc/<pid>/maps` into start → end.
pub fn parse_maps(text: &str) -> BTreeMap<u64, u64> {
    text.lines()
        .filter_map(|line| {
            let range = line.split_ascii_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            );
            (a < b).then_some((a, b))
        })
        .collect()
}

/// The 2 MiB-aligned chunks of `[start, end)`, clipped to it.
pub fn chunks(start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> {
    let span = CHUNK * PAGE;
    let first = start - start % span;
    (0u64..)
        .map_while(move |i| first.checked_add(i.checked_mul(span)?))
        .take_while(move |&a| a < end)
        .map(move |a| (a.max(start), a.saturating_add(span).min(end)))
}

/// move_pages(2) on `pid`: with `nodes` it moves, without it only fills `status`.
fn move_pages(
    pid: u32,
    addrs: &[u64],
    nodes: Option<&[libc::c_int]>,
    status: &mut [libc::c_int],
) -> std::io::Result<()> {
    let ptrs: Vec<*mut libc::c_void> = addrs.iter().map(|&a| a as *mut libc::c_void).collect();
    // SAFETY: the arrays have addrs.len() elements; the kernel reads `ptrs` and `nodes`
    // and writes `status`; the addresses are in the other process and only looked up.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            pid as libc::c_int,
            ptrs.len() as libc::c_ulong,
            ptrs.as_ptr(),
            nodes.map_or(std::ptr::null(), |n| n.as_ptr()),
            status.as_mut_ptr(),
            if nodes.is_some() { MPOL_MF_MOVE } else { 0 },
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The node of each of `pid`'s pages at `addrs` (move_pages(2) in query mode): a node id, or
/// a negative errno for a page that is not there.
pub fn query_nodes(pid: u32, addrs: &[u64]) -> std::io::Result<Vec<libc::c_int>> {
    let mut status = vec![0; addrs.len()];
    if !addrs.is_empty() {
        move_pages(pid, addrs, None, &mut status)?;
    }
    Ok(status)
}

/// Moves at most `max_bytes` of the pages of `pids` off nodes outside `toward`; returns the
/// bytes moved. `members` re-reads the cgroup's processes: pids are pinned (pidfd) a batch at a
/// time, and only those still members after the pin are moved, so a pid that exited and was
/// reused by a process elsewhere after `pids` was read is never touched. One whole pass (see
/// [`Walk`] for the resuming form).
pub fn move_pids_pages(
    pids: &[u32],
    toward: &CpuSet,
    max_bytes: u64,
    members: impl Fn() -> std::io::Result<Vec<u32>>,
) -> std::io::Result<u64> {
    let mut walk = Walk::default();
    walk.step("", toward, max_bytes, || Ok(pids.to_vec()), members)
}

/// 2 MiB chunks per query call of a [`Walk`].
const BATCH_CHUNKS: usize = 8;

/// A cgroup's page walk that resumes where the last call stopped: the writer of a move calls
/// [`Walk::step`] again and again with a step of budget (so it can look for a re-pin or a stop
/// between steps), and each call goes on from the process and address where the one before
/// stopped, rather than reading every process's numa_maps and querying every chunk again from
/// the start. A pass reads the cgroup's processes once and each process's `numa_maps`/`maps`
/// once; only the mappings that then held pages elsewhere are walked. When a pass ends the next
/// call starts a new one (pages that could not move, or memory mapped meanwhile); a whole pass
/// that moves nothing returns 0.
///
/// Per batch of up to [`BATCH_CHUNKS`] 2 MiB chunks: one query call (where each page is; cheap:
/// no LRU drain), then per chunk one move call for its pages elsewhere, to one target node
/// (round-robin over `toward`: a huge page is never sent to two nodes; and the 6.1 kernel
/// gives up the rest of a call at the first page it fails to migrate). Chunks are taken whole
/// while their pages fit the budget left, so a step never moves more than its budget. The move
/// call's status array says where each page went: a page now on a target node counts as moved,
/// and so does one reported busy (-EBUSY: the kernel reports the tail pages of a huge page it
/// has just isolated that way, and counting a page that did not move errs toward the budget).
#[derive(Default)]
pub struct Walk {
    /// The cgroup and target this walk is for; another pair starts afresh.
    key: Option<(String, CpuSet)>,
    /// The pass's pids not yet pinned.
    pids: std::collections::VecDeque<u32>,
    /// Pinned pids that were members after the pin, not yet walked.
    pinned: std::collections::VecDeque<Pinned>,
    /// The process being walked and its ranges left (start, end).
    cur: Option<(Pinned, std::collections::VecDeque<(u64, u64)>)>,
    in_pass: bool,
    rr: usize,
}

impl Walk {
    /// Moves at most `max_bytes` of the cgroup's pages off nodes outside `toward`, resuming the
    /// walk (see the type's doc); returns the bytes moved. `pids` lists the cgroup's processes
    /// when a pass starts; `members` re-reads them after a batch is pinned.
    pub fn step(
        &mut self,
        cgroup: &str,
        toward: &CpuSet,
        max_bytes: u64,
        pids: impl FnOnce() -> std::io::Result<Vec<u32>>,
        members: impl Fn() -> std::io::Result<Vec<u32>>,
    ) -> std::io::Result<u64> {
        let key = (cgroup.to_string(), toward.clone());
        if self.key.as_ref() != Some(&key) {
            *self = Walk {
                key: Some(key),
                ..Walk::default()
            };
        }
        let targets: Vec<libc::c_int> = toward.iter().map(|n| n as libc::c_int).collect();
        let max_pages = max_bytes / PAGE;
        if targets.is_empty() || max_pages < CHUNK {
            return Ok(0);
        }
        let mut pids = Some(pids);
        let mut fresh = false;
        let mut moved = 0u64;
        loop {
            if !self.in_pass {
                let Some(list) = pids.take() else {
                    // A second pass in one call: only after one that moved nothing, and a
                    // new pass that moves nothing ends the call.
                    return Ok(moved * PAGE);
                };
                self.pids = list()?.into();
                self.pinned.clear();
                self.cur = None;
                self.in_pass = true;
                fresh = true;
            }
            if max_pages - moved < CHUNK {
                return Ok(moved * PAGE);
            }
            if self.cur.is_none() && !self.next_process(toward, &members)? {
                // The pass is over. A call that resumed a pass and moved nothing in it looks
                // once more from the start (pages that failed, memory mapped meanwhile); a
                // fresh pass that moved nothing has nothing left to move: 0.
                self.in_pass = false;
                if fresh || moved > 0 {
                    return Ok(moved * PAGE);
                }
                continue;
            }
            let n = self.batch(toward, &targets, max_pages - moved)?;
            moved += n;
        }
    }

    /// Makes the next member process current (its ranges read); false when the pass has none
    /// left.
    fn next_process(
        &mut self,
        toward: &CpuSet,
        members: &impl Fn() -> std::io::Result<Vec<u32>>,
    ) -> std::io::Result<bool> {
        while let Some(p) = self.next_pinned(members)? {
            let Some(ranges) = ranges_off(p.pid, toward)? else {
                continue; // exited
            };
            if !ranges.is_empty() {
                self.cur = Some((p, ranges));
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The pass's next process, pinned, a member after the pin, alive; `None` when the pass
    /// has none left.
    fn next_pinned(
        &mut self,
        members: &impl Fn() -> std::io::Result<Vec<u32>>,
    ) -> std::io::Result<Option<Pinned>> {
        loop {
            if self.pinned.is_empty() {
                if self.pids.is_empty() {
                    return Ok(None);
                }
                // A batch bounds the pidfds held at once.
                let n = self.pids.len().min(64);
                let batch: Vec<Pinned> = self.pids.drain(..n).filter_map(Pinned::open).collect();
                if batch.is_empty() {
                    continue;
                }
                let now: std::collections::BTreeSet<u32> = members()?.into_iter().collect();
                self.pinned = batch.into_iter().filter(|p| now.contains(&p.pid)).collect();
                continue;
            }
            let p = self.pinned.pop_front().expect("not empty");
            if p.alive() {
                return Ok(Some(p));
            }
        }
    }

    /// Like [`Walk::step`], but each process's pages are moved whole by the kernel's own walk
    /// of its mm (migrate_pages(2): every node outside `toward` → `toward`, the same walk a
    /// narrowing `cpuset.mems` write makes, in this thread instead of the kernel's one ordered
    /// cpuset workqueue, but only the pages the process alone maps: see [`WithoutSysNice`];
    /// the shared ones are [`Walk::step_all`]'s), processes one after the other until at least `max_bytes` moved: a
    /// process is never cut, so this is for a move whose bytes are all budgeted (not a stage).
    /// Returns the bytes moved (each process's pages off `toward` before less after, from its
    /// numa_maps).
    pub fn step_whole(
        &mut self,
        cgroup: &str,
        toward: &CpuSet,
        max_bytes: u64,
        pids: impl FnOnce() -> std::io::Result<Vec<u32>>,
        members: impl Fn() -> std::io::Result<Vec<u32>>,
    ) -> std::io::Result<u64> {
        self.whole(cgroup, toward, max_bytes, pids, members, false)
    }

    /// Like [`Walk::step_whole`], but every page of each process off `toward`, those it shares
    /// with other processes too (`MPOL_MF_MOVE_ALL`, the thread's CAP_SYS_NICE kept): exactly
    /// what a narrowing `cpuset.mems` write would migrate in the kernel's cpuset workqueue,
    /// moved in this thread instead, right before that write, so the write finds nothing to
    /// migrate and every other cpuset write (an admission's) has nothing to wait for. One
    /// pass over the cgroup's processes; returns the bytes moved.
    pub fn step_all(
        &mut self,
        cgroup: &str,
        toward: &CpuSet,
        pids: impl FnOnce() -> std::io::Result<Vec<u32>>,
        members: impl Fn() -> std::io::Result<Vec<u32>>,
    ) -> std::io::Result<u64> {
        self.whole(cgroup, toward, u64::MAX, pids, members, true)
    }

    fn whole(
        &mut self,
        cgroup: &str,
        toward: &CpuSet,
        max_bytes: u64,
        pids: impl FnOnce() -> std::io::Result<Vec<u32>>,
        members: impl Fn() -> std::io::Result<Vec<u32>>,
        shared_too: bool,
    ) -> std::io::Result<u64> {
        let kind = if shared_too { "all" } else { "whole" };
        let key = (format!("{kind}:{cgroup}"), toward.clone());
        if self.key.as_ref() != Some(&key) {
            *self = Walk {
                key: Some(key),
                ..Walk::default()
            };
        }
        if toward.is_empty() || max_bytes == 0 {
            return Ok(0);
        }
        let mut pids = Some(pids);
        let mut fresh = false;
        let mut moved = 0u64;
        loop {
            if !self.in_pass {
                let Some(list) = pids.take() else {
                    return Ok(moved * PAGE);
                };
                self.pids = list()?.into();
                self.pinned.clear();
                self.cur = None;
                self.in_pass = true;
                fresh = true;
            }
            if moved * PAGE >= max_bytes {
                return Ok(moved * PAGE);
            }
            let Some(p) = self.next_pinned(&members)? else {
                self.in_pass = false;
                if fresh || moved > 0 {
                    return Ok(moved * PAGE);
                }
                continue;
            };
            let Some((before, from)) = pages_off(p.pid, toward)? else {
                continue;
            };
            if before == 0 || from.is_empty() || !p.alive() {
                continue;
            }
            let started = std::time::Instant::now();
            let failed = match migrate_pages(p.pid, &from, toward, shared_too) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                Err(e) => return Err(e),
            };
            let call_ms = started.elapsed().as_millis() as u64;
            let after = pages_off(p.pid, toward)?.map_or(0, |(n, _)| n);
            moved += before.saturating_sub(after);
            // What a slow migration is made of: the kernel's walk, its failures, what is left.
            tracing::debug!(
                cgroup,
                pid = p.pid,
                off_before = before,
                off_after = after,
                not_moved = failed,
                shared_too,
                call_ms,
                total_ms = started.elapsed().as_millis() as u64,
                "migrate_pages of one process"
            );
        }
    }

    /// One batch of the current process: returns the pages moved (at most `left`). Drops the
    /// process when its ranges are done or it exited.
    fn batch(
        &mut self,
        toward: &CpuSet,
        targets: &[libc::c_int],
        left: u64,
    ) -> std::io::Result<u64> {
        // The process stays pinned (its pidfd open) until its last call: it is put back below
        // while it has ranges left.
        let Some((p, mut ranges)) = self.cur.take() else {
            return Ok(0);
        };
        let pid = p.pid;
        if !p.alive() {
            return Ok(0);
        }
        let chunks_of = front_chunks(&ranges, BATCH_CHUNKS);
        let addrs: Vec<u64> = chunks_of
            .iter()
            .flat_map(|&(a, b)| (a..b).step_by(PAGE as usize))
            .collect();
        let mut status = vec![0; addrs.len()];
        match move_pages(pid, &addrs, None, &mut status) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(0),
            Err(e) => return Err(e),
        }
        let (picks, upto) = take_chunks(
            &chunks_of,
            &addrs,
            &status,
            toward,
            targets,
            &mut self.rr,
            left,
        );
        if let Some(to) = upto {
            consume(&mut ranges, to);
        }
        // One move call per chunk: the kernel (6.1) gives up the rest of a call at the first
        // page it fails to migrate, so a failure costs at most the rest of one chunk.
        let mut moved = 0;
        for (node, pick) in picks {
            if !p.alive() {
                return Ok(moved);
            }
            // Entries the kernel does not reach keep a value that counts as nothing.
            let mut st = vec![libc::c_int::MIN; pick.len()];
            let nodes = vec![node; pick.len()];
            match move_pages(pid, &pick, Some(&nodes), &mut st) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(moved),
                // Some pages could not be moved (busy, shared …): counted below.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
            moved += arrived(&st, toward);
        }
        if !ranges.is_empty() {
            self.cur = Some((p, ranges));
        }
        Ok(moved)
    }
}

/// `pid`'s pages on nodes outside `toward` (every mapping, from one read of its numa_maps) and
/// those nodes; `None` when the process is gone.
fn pages_off(pid: u32, toward: &CpuSet) -> std::io::Result<Option<(u64, CpuSet)>> {
    let numa = match std::fs::read_to_string(format!("/proc/{pid}/numa_maps")) {
        Ok(n) => parse_numa_maps(&n),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut from = CpuSet::new();
    let mut off = 0u64;
    for m in &numa {
        for (&n, &p) in &m.pages {
            if p > 0 && !toward.contains(n) {
                off += p;
                from.insert(n);
            }
        }
    }
    Ok(Some((off, from)))
}

/// A node mask for migrate_pages(2): 64-bit words and the `maxnode` to pass.
fn node_mask(s: &CpuSet) -> (Vec<u64>, libc::c_ulong) {
    let words = s.iter().max().map_or(1, |m| m as usize / 64 + 1);
    let mut w = vec![0u64; words];
    for n in s.iter() {
        w[n as usize / 64] |= 1 << (n % 64);
    }
    // The kernel reads maxnode - 1 bits.
    (w, (words * 64 + 1) as libc::c_ulong)
}

/// CAP_SYS_NICE, bit 23 of the first capability word.
const CAP_SYS_NICE_BIT: u32 = 1 << 23;
/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn capget() -> Option<[CapData; 2]> {
    let mut h = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut d = [CapData::default(); 2];
    // SAFETY: a v3 header and two data words, as the kernel expects; pid 0 is this thread.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    (r == 0).then_some(d)
}

fn capset(d: &[CapData; 2]) -> bool {
    let mut h = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    // SAFETY: as in `capget`; capset with pid 0 changes this thread's credentials only.
    unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) == 0 }
}

/// While it lives, this thread runs without CAP_SYS_NICE in its effective set (kept in the
/// permitted set and put back on drop; capabilities are per thread, so the daemon's other
/// threads keep theirs). migrate_pages(2) moves every page of the process, those it shares
/// with other processes too (`MPOL_MF_MOVE_ALL`), when the caller has CAP_SYS_NICE, and only
/// the pages it alone maps (`MPOL_MF_MOVE`, as move_pages(2) does here) otherwise: the shared
/// ones (a binary's or a library's text, mapped by the workloads of other cgroups) are not
/// the move's to take, and migrating them unmaps them from every process that runs them, one
/// TLB shootdown per mapping. A writer moving them for each of several workloads at once sent
/// the same pages back and forth between the targets: in the multi-NUMA guest that made one
/// 256 MiB migrate_pages(2) call last 7–22 s instead of 1.5–2.5 s (its writer and the other
/// migrations seen in `rmap_walk_file` → `flush_tlb_mm_range`; BENCHMARKS.md).
struct WithoutSysNice {
    saved: Option<[CapData; 2]>,
}

impl WithoutSysNice {
    fn new() -> WithoutSysNice {
        let saved = capget().filter(|d| d[0].effective & CAP_SYS_NICE_BIT != 0);
        if let Some(d) = saved {
            let mut less = d;
            less[0].effective &= !CAP_SYS_NICE_BIT;
            if !capset(&less) {
                return WithoutSysNice { saved: None };
            }
        }
        WithoutSysNice { saved }
    }
}

impl Drop for WithoutSysNice {
    fn drop(&mut self) {
        if let Some(d) = &self.saved {
            if !capset(d) {
                tracing::warn!(
                    "could not restore CAP_SYS_NICE to a writer thread after its page moves"
                );
            }
        }
    }
}

/// This thread's CPU affinity (`pid` 0) or a process's; `None` when it cannot be read.
fn affinity(pid: u32) -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes into `set`.
    let r = unsafe {
        libc::sched_getaffinity(
            pid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut set,
        )
    };
    (r == 0).then_some(set)
}

/// Whether `cpu` is in `set`.
fn has_cpu(set: &libc::cpu_set_t, cpu: usize) -> bool {
    // SAFETY: CPU_ISSET checks `cpu` against the set's size before it reads.
    cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, set) }
}

/// `cpu` added to `set` (ignored past its size).
fn add_cpu(set: &mut libc::cpu_set_t, cpu: usize) {
    if cpu < libc::CPU_SETSIZE as usize {
        // SAFETY: `cpu` is within the set.
        unsafe { libc::CPU_SET(cpu, set) };
    }
}

fn set_affinity(set: &libc::cpu_set_t) -> bool {
    // SAFETY: pid 0 is this thread; the kernel reads the whole set.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) == 0 }
}

/// While it lives, this thread runs on the CPUs the process `pid` may run on (those of them
/// it may use itself), and its own affinity comes back on drop. Page migration unmaps each
/// page and flushes its TLB entry on every CPU that runs the process's mm: one IPI per page
/// to the workload's CPU when the migration runs elsewhere (Linux 6.1 does not batch these
/// flushes for migration). Run on the workload's own CPUs, the writer (nice -10) takes them
/// while it copies: the mm is not active on a CPU the writer holds, so a single-threaded
/// workload on a one-CPU node costs no IPI, and the copy is paid where AutoNUMA's would be
/// (the faulting task migrates its own page). In the multi-NUMA guest, 8,558 pages moved in
/// 938 ms from another node's CPU (BENCHMARKS.md, "Measured access").
struct OnItsCpus {
    saved: Option<libc::cpu_set_t>,
}

impl OnItsCpus {
    fn new(pid: u32) -> OnItsCpus {
        let (Some(mine), Some(its)) = (affinity(0), affinity(pid)) else {
            return OnItsCpus { saved: None };
        };
        // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
        let mut both: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let mut any = false;
        for cpu in 0..libc::CPU_SETSIZE as usize {
            if has_cpu(&mine, cpu) && has_cpu(&its, cpu) {
                add_cpu(&mut both, cpu);
                any = true;
            }
        }
        // None in common (the daemon's own cpuset leaves it no CPU of the workload's): the
        // migration runs where the thread is.
        if !any || !set_affinity(&both) {
            return OnItsCpus { saved: None };
        }
        OnItsCpus { saved: Some(mine) }
    }
}

impl Drop for OnItsCpus {
    fn drop(&mut self) {
        if let Some(s) = &self.saved {
            if !set_affinity(s) {
                tracing::warn!(
                    "could not restore a writer thread's CPU affinity after its page moves"
                );
            }
        }
    }
}

/// migrate_pages(2) of `pid`: its pages on `from` to `toward` (the kernel's walk of the mm),
/// only those the process alone maps ([`WithoutSysNice`]), or with `shared_too` those it
/// shares as well (the thread's CAP_SYS_NICE kept: `MPOL_MF_MOVE_ALL`). Pages that could not
/// be moved are not an error (the caller counts what moved): their number is returned, as the
/// kernel does.
fn migrate_pages(
    pid: u32,
    from: &CpuSet,
    toward: &CpuSet,
    shared_too: bool,
) -> std::io::Result<u64> {
    let (mut old, n1) = node_mask(from);
    let (mut new, n2) = node_mask(toward);
    let words = old.len().max(new.len());
    old.resize(words, 0);
    new.resize(words, 0);
    let maxnode = n1.max(n2);
    let _own_pages_only = (!shared_too).then(WithoutSysNice::new);
    let _on_its_cpus = OnItsCpus::new(pid);
    // SAFETY: both masks have `words` 64-bit words, maxnode - 1 = words × 64 bits.
    let r = unsafe {
        libc::syscall(
            libc::SYS_migrate_pages,
            pid as libc::c_int,
            maxnode,
            old.as_ptr(),
            new.as_ptr(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as u64)
}

/// Up to `n` 2 MiB-aligned chunks from the front of `ranges` (not consumed).
fn front_chunks(ranges: &std::collections::VecDeque<(u64, u64)>, n: usize) -> Vec<(u64, u64)> {
    ranges
        .iter()
        .flat_map(|&(a, b)| chunks(a, b))
        .take(n)
        .collect()
}

/// Of `chunks` (whose pages are `addrs`, where `status` says each page is), the pages on nodes
/// outside `toward`, whole chunks while they fit `left`: per chunk with such pages, its target
/// node (round-robin from `rr`: the pages of a huge page must not be sent to two nodes) and its
/// pages; and the end of the last chunk taken (`None` when none fit).
fn take_chunks(
    chunks: &[(u64, u64)],
    addrs: &[u64],
    status: &[libc::c_int],
    toward: &CpuSet,
    targets: &[libc::c_int],
    rr: &mut usize,
    left: u64,
) -> (Vec<(libc::c_int, Vec<u64>)>, Option<u64>) {
    let off = |s: libc::c_int| s >= 0 && !toward.contains(s as u32);
    let mut picks = Vec::new();
    let mut taken = 0u64;
    let mut upto = None;
    let mut i = 0usize;
    for &(a, b) in chunks {
        let n = ((b - a) / PAGE) as usize;
        let here: Vec<u64> = (i..(i + n).min(addrs.len()))
            .filter(|&k| off(status[k]))
            .map(|k| addrs[k])
            .collect();
        if taken + here.len() as u64 > left {
            break;
        }
        taken += here.len() as u64;
        if !here.is_empty() {
            let node = targets[*rr % targets.len()];
            *rr = rr.wrapping_add(1);
            picks.push((node, here));
        }
        upto = Some(b);
        i += n;
    }
    (picks, upto)
}

/// Drops `[.., to)` from the front of `ranges`.
fn consume(ranges: &mut std::collections::VecDeque<(u64, u64)>, to: u64) {
    while let Some(&(a, b)) = ranges.front() {
        if b <= to {
            ranges.pop_front();
        } else {
            if a < to {
                ranges[0].0 = to;
            }
            break;
        }
    }
}

/// Pages a move call's status array reports arrived: on a node of `toward`, or busy (-EBUSY:
/// how the kernel reports the tail pages of a huge page it has just isolated; counting a page
/// that did not move errs toward the budget).
fn arrived(status: &[libc::c_int], toward: &CpuSet) -> u64 {
    status
        .iter()
        .filter(|&&s| (s >= 0 && toward.contains(s as u32)) || s == -libc::EBUSY)
        .count() as u64
}

/// The ranges (start, end) of `pid`'s mappings that hold pages on nodes outside `toward` (not
/// hugetlb), from one read of its numa_maps and maps; `None` when the process is gone.
fn ranges_off(
    pid: u32,
    toward: &CpuSet,
) -> std::io::Result<Option<std::collections::VecDeque<(u64, u64)>>> {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}"));
    let (numa, maps) = match (read("numa_maps"), read("maps")) {
        (Ok(n), Ok(m)) => (parse_numa_maps(&n), parse_maps(&m)),
        (Err(e), _) | (_, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        (Err(e), _) | (_, Err(e)) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    Ok(Some(
        numa.iter()
            .filter(|m| !m.hugetlb && m.pages.iter().any(|(n, p)| *p > 0 && !toward.contains(*n)))
            .filter_map(|m| maps.get(&m.start).map(|&end| (m.start, end)))
            .collect(),
    ))
}

/// A process pinned by a pidfd (Linux 5.3+): while it is open, the pid cannot name another
/// process unless this one has exited, which [`Pinned::alive`] tells. Without pidfd_open
/// (older kernels) the pid is used as is and `alive` always says yes.
struct Pinned {
    pid: u32,
    fd: Option<std::os::fd::OwnedFd>,
}

impl Pinned {
    /// None when the process is gone already.
    fn open(pid: u32) -> Option<Pinned> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        if fd >= 0 {
            // SAFETY: a fresh fd we own.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) };
            return Some(Pinned { pid, fd: Some(fd) });
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ESRCH) => None,
            _ => Some(Pinned { pid, fd: None }),
        }
    }

    /// True while the pinned process has not exited (signal 0 through the pidfd).
    fn alive(&self) -> bool {
        use std::os::fd::AsRawFd;
        let Some(fd) = &self.fd else {
            return true;
        };
        // SAFETY: signal 0 checks existence only; the fd is open.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        r == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_maps_lines() {
        let text = "\
55d0c0a00000 default file=/usr/bin/x mapped=3 N0=3 kernelpagesize_kB=4
7f0000000000 bind:1 anon=16384 dirty=16384 N0=100 N1=16284 kernelpagesize_kB=4
7f1000000000 default file=/anon_hugepage\\040(deleted) huge anon=2 dirty=2 N1=2 kernelpagesize_kB=2048
garbage line
";
        let m = parse_numa_maps(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].start, 0x7f00_0000_0000);
        assert_eq!(m[1].pages, BTreeMap::from([(0, 100), (1, 16284)]));
        assert!(!m[1].hugetlb && m[2].hugetlb);
    }

    #[test]
    fn maps_lines() {
        let text = "55d0c0a00000-55d0c0a03000 r--p 00000000 fd:01 123 /usr/bin/x\n\
                    7f0000000000-7f0004000000 rw-p 00000000 00:00 0\nbad\n";
        let m = parse_maps(text);
        assert_eq!(m[&0x55d0_c0a0_0000], 0x55d0_c0a0_3000);
        assert_eq!(m[&0x7f00_0000_0000], 0x7f00_0400_0000);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn a_pinned_process_that_exited_is_not_alive_and_non_members_are_skipped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let p = Pinned::open(pid).expect("a live child");
        assert!(p.alive());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!p.alive(), "reaped: its pid may now be reused");
        assert!(Pinned::open(pid).is_none() || !p.alive());
        // A pid no longer listed in its cgroup (reused elsewhere) is never moved.
        let me = std::process::id();
        let nodes = CpuSet::parse("0").unwrap();
        assert_eq!(
            move_pids_pages(&[me], &nodes, 1 << 30, || Ok(vec![me + 1])).unwrap(),
            0
        );
    }

    #[test]
    fn chunks_are_2m_aligned_and_clipped() {
        let mib = 1 << 20;
        let c: Vec<_> = chunks(3 * mib, 7 * mib + PAGE).collect();
        assert_eq!(
            c,
            vec![
                (3 * mib, 4 * mib),
                (4 * mib, 6 * mib),
                (6 * mib, 7 * mib + PAGE),
            ]
        );
        assert_eq!(chunks(0, PAGE).count(), 1);
        // The top of the address space: no overflow.
        let top: Vec<_> = chunks(u64::MAX - PAGE, u64::MAX).collect();
        assert_eq!(top, vec![(u64::MAX - PAGE, u64::MAX)]);
    }

    #[test]
    fn a_batch_takes_whole_chunks_within_the_budget_and_resumes_after_them() {
        let span = CHUNK * PAGE;
        // Two mappings: 3 chunks (the first unaligned) and one.
        let mut ranges: std::collections::VecDeque<(u64, u64)> =
            [(span / 2, 3 * span), (10 * span, 11 * span)].into();
        let front = front_chunks(&ranges, 3);
        assert_eq!(
            front,
            vec![(span / 2, span), (span, 2 * span), (2 * span, 3 * span)]
        );
        let addrs: Vec<u64> = front
            .iter()
            .flat_map(|&(a, b)| (a..b).step_by(PAGE as usize))
            .collect();
        assert_eq!(addrs.len() as u64, CHUNK / 2 + 2 * CHUNK);
        // Node 1 everywhere but: the second chunk already on node 0, one page of the first
        // not present.
        let mut status: Vec<libc::c_int> = vec![1; addrs.len()];
        for s in &mut status[(CHUNK / 2) as usize..(CHUNK / 2 + CHUNK) as usize] {
            *s = 0;
        }
        status[3] = -libc::ENOENT;
        let to = CpuSet::parse("0").unwrap();
        let mut rr = 0;
        // Budget for the first chunk's off pages and the (empty) second, not for the third.
        let (picks, upto) = take_chunks(&front, &addrs, &status, &to, &[0], &mut rr, CHUNK - 1);
        assert_eq!(picks.len(), 1, "the second chunk has nothing to move");
        assert_eq!((picks[0].0, picks[0].1.len() as u64), (0, CHUNK / 2 - 1));
        assert!(!picks[0].1.contains(&addrs[3]), "not present: not picked");
        assert_eq!(
            upto,
            Some(2 * span),
            "the third chunk did not fit: it is next"
        );
        consume(&mut ranges, 2 * span);
        assert_eq!(ranges.front(), Some(&(2 * span, 3 * span)));
        consume(&mut ranges, 3 * span);
        assert_eq!(ranges, [(10 * span, 11 * span)]);
        // Two targets: one node per chunk, in turn.
        let to2 = CpuSet::parse("0,2").unwrap();
        let status = vec![1; addrs.len()];
        let (picks, _) = take_chunks(&front, &addrs, &status, &to2, &[0, 2], &mut rr, u64::MAX);
        let sizes: Vec<usize> = picks.iter().map(|(_, p)| p.len()).collect();
        assert_eq!(sizes, [CHUNK as usize / 2, CHUNK as usize, CHUNK as usize]);
        assert_ne!(picks[0].0, picks[1].0);
        assert_ne!(picks[1].0, picks[2].0);
    }

    #[test]
    fn node_masks_for_migrate_pages() {
        let (w, maxnode) = node_mask(&CpuSet::parse("0,2,65").unwrap());
        assert_eq!(w, vec![0b101, 0b10]);
        assert_eq!(maxnode, 129, "the kernel reads maxnode - 1 bits");
        assert_eq!(node_mask(&CpuSet::new()), (vec![0], 65));
    }

    /// On any machine: our own memory is all on allowed nodes, so the kernel's walk has
    /// nothing to move, and a pid no longer in the cgroup is never touched.
    #[test]
    fn whole_process_moves_move_nothing_already_in_place() {
        let v = vec![1u8; 8 << 20];
        let all = CpuSet::parse(
            std::fs::read_to_string("/sys/devices/system/node/online")
                .unwrap_or_else(|_| "0".into())
                .trim(),
        )
        .unwrap();
        let me = std::process::id();
        let mut w = Walk::default();
        let n = w
            .step_whole("cg", &all, 1 << 30, || Ok(vec![me]), || Ok(vec![me]))
            .unwrap();
        assert_eq!(n, 0);
        let mut w = Walk::default();
        let n = w
            .step_whole("cg", &all, 1 << 30, || Ok(vec![me]), || Ok(vec![me + 1]))
            .unwrap();
        assert_eq!(n, 0);
        assert_eq!(pages_off(me, &all).unwrap().map(|(n, _)| n), Some(0));
        drop(v);
    }

    #[test]
    fn arrived_pages_are_those_on_a_target_or_busy() {
        let to = CpuSet::parse("0-1").unwrap();
        let st = [
            0,
            1,
            2,
            -libc::EBUSY,
            -libc::ENOENT,
            -libc::EACCES,
            0,
            libc::c_int::MIN,
        ];
        assert_eq!(
            arrived(&st, &to),
            4,
            "not reached by the kernel: not counted"
        );
    }

    /// On any machine: our own pages are all on allowed nodes, so asking to move them to every
    /// node there is moves nothing, and the budget floor stops the walk.
    #[test]
    fn own_pages_already_on_the_target_move_nothing() {
        let v = vec![1u8; 8 << 20];
        let all = CpuSet::parse(
            std::fs::read_to_string("/sys/devices/system/node/online")
                .unwrap_or_else(|_| "0".into())
                .trim(),
        )
        .unwrap();
        let me = std::process::id();
        let members = || Ok(vec![me]);
        assert_eq!(move_pids_pages(&[me], &all, 1 << 30, members).unwrap(), 0);
        assert_eq!(
            move_pids_pages(&[me], &all, (CHUNK - 1) * PAGE, members).unwrap(),
            0
        );
        assert_eq!(
            move_pids_pages(&[u32::MAX - 1], &all, 1 << 30, || Ok(vec![])).unwrap(),
            0
        );
        drop(v);
    }

    /// The writer's migrate_pages(2) runs without CAP_SYS_NICE (so the kernel moves only the
    /// pages the process alone maps), in that thread only, and gets it back after.
    #[test]
    fn page_moves_drop_sys_nice_in_their_own_thread_only_and_get_it_back() {
        let before = capget().expect("capget");
        let had = before[0].effective & CAP_SYS_NICE_BIT != 0;
        if !had {
            eprintln!("note: this test runs without CAP_SYS_NICE; only the no-op path is checked");
        }
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel::<u32>();
        let other = std::thread::spawn(move || {
            asked.recv().unwrap();
            tell.send(capget().unwrap()[0].effective).unwrap();
        });
        {
            let _g = WithoutSysNice::new();
            let during = capget().unwrap();
            assert_eq!(during[0].effective & CAP_SYS_NICE_BIT, 0);
            assert_eq!(
                during[0].effective | (before[0].effective & CAP_SYS_NICE_BIT),
                before[0].effective,
                "only CAP_SYS_NICE is dropped"
            );
            assert_eq!(during[0].permitted, before[0].permitted);
            ask.send(()).unwrap();
            assert_eq!(
                told.recv().unwrap(),
                before[0].effective,
                "another thread keeps it"
            );
        }
        other.join().unwrap();
        assert_eq!(capget().unwrap()[0].effective, before[0].effective);
    }
    /// Page moves run on the CPUs of the process they move, in their own thread only, and
    /// the thread gets its own affinity back after.
    #[test]
    fn page_moves_run_on_the_processs_cpus_and_give_them_back() {
        fn cpus_of(s: &libc::cpu_set_t) -> Vec<usize> {
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| has_cpu(s, c))
                .collect()
        }
        let cpus = cpus_of(&affinity(0).expect("own affinity"));
        // A process allowed only our last CPU (as `taskset -c` starts it).
        let last = *cpus.last().expect("a CPU");
        // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        add_cpu(&mut one, last);
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: sched_setaffinity is async-signal-safe; the set was built before the fork.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                if set_affinity(&one) {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let mut child = cmd.spawn().expect("spawn sleep");
        let pid = child.id();
        assert_eq!(cpus_of(&affinity(pid).unwrap()), [last]);
        // A thread started before (a new one inherits the affinity of the thread that starts it).
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            asked.recv().unwrap();
            cpus_of(&affinity(0).unwrap())
        });
        {
            let _g = OnItsCpus::new(pid);
            assert_eq!(cpus_of(&affinity(0).unwrap()), [last], "on its CPU");
            ask.send(()).unwrap();
            assert_eq!(other.join().unwrap(), cpus, "another thread keeps its own");
        }
        assert_eq!(cpus_of(&affinity(0).unwrap()), cpus, "given back");
        let _ = child.kill();
        let _ = child.wait();
    }
}

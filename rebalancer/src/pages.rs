//! Moving a process's pages to other NUMA nodes with move_pages(2), a budget at a time: the
//! I/O edge of staged moves (see `controller::Stage`).
//!
//! `/proc/<pid>/numa_maps` tells which mappings hold pages on which nodes ([`parse_numa_maps`],
//! pure); `/proc/<pid>/maps` gives their ends ([`parse_maps`]). Each candidate mapping is walked
//! in 2 MiB-aligned chunks of 512 pages: one move_pages call asks where each page is, one moves
//! those on other nodes (one target node per chunk, round-robin), one asks again and counts the
//! pages that arrived. A transparent huge page is 2 MiB-aligned, so it lies in one chunk and is
//! counted whole; the walk stops while at least a chunk of budget is left, so it never moves
//! more than the budget. Hugetlb mappings are left alone (their pages move when mems narrow).
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

/// Moves at most `max_pages` of `pid`'s pages that are on nodes outside `toward` to `toward`;
/// returns the pages moved. A process that exited meanwhile has moved 0.
pub fn move_process_pages(pid: u32, toward: &CpuSet, max_pages: u64) -> std::io::Result<u64> {
    match Pinned::open(pid) {
        Some(p) => move_pinned_pages(&p, toward, max_pages),
        None => Ok(0),
    }
}

/// [`move_process_pages`] on a pinned process: stops as soon as it has exited, so its pid,
/// reused by another process, is never the target of a later call.
fn move_pinned_pages(p: &Pinned, toward: &CpuSet, max_pages: u64) -> std::io::Result<u64> {
    let pid = p.pid;
    let targets: Vec<libc::c_int> = toward.iter().map(|n| n as libc::c_int).collect();
    if targets.is_empty() || max_pages < CHUNK {
        return Ok(0);
    }
    let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}"));
    let (numa, maps) = match (read("numa_maps"), read("maps")) {
        (Ok(n), Ok(m)) => (parse_numa_maps(&n), parse_maps(&m)),
        (Err(e), _) | (_, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    let mut moved = 0u64;
    let mut rr = 0usize;
    for m in numa
        .iter()
        .filter(|m| !m.hugetlb && m.pages.iter().any(|(n, p)| *p > 0 && !toward.contains(*n)))
    {
        let Some(&end) = maps.get(&m.start) else {
            continue;
        };
        for (a, b) in chunks(m.start, end) {
            if max_pages - moved < CHUNK {
                return Ok(moved);
            }
            if !p.alive() {
                return Ok(moved);
            }
            let addrs: Vec<u64> = (a..b).step_by(PAGE as usize).collect();
            let mut status = vec![0; addrs.len()];
            match move_pages(pid, &addrs, None, &mut status) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(moved),
                Err(e) => return Err(e),
            }
            let off = |s: libc::c_int| s >= 0 && !toward.contains(s as u32);
            let pick: Vec<u64> = addrs
                .iter()
                .zip(&status)
                .filter(|(_, s)| off(**s))
                .map(|(a, _)| *a)
                .collect();
            if pick.is_empty() {
                continue;
            }
            // One node per chunk: the pages of a huge page must not be sent to two nodes.
            let nodes = vec![targets[rr % targets.len()]; pick.len()];
            rr = rr.wrapping_add(1);
            let mut st = vec![0; pick.len()];
            if !p.alive() {
                return Ok(moved);
            }
            match move_pages(pid, &pick, Some(&nodes), &mut st) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(moved),
                // Some pages could not be moved (busy, shared …): count what arrived below.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
            match move_pages(pid, &pick, None, &mut st) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(moved),
                Err(e) => return Err(e),
            }
            moved += st
                .iter()
                .filter(|&&s| s >= 0 && toward.contains(s as u32))
                .count() as u64;
        }
    }
    Ok(moved)
}

/// Moves at most `max_bytes` of the pages of `pids` off nodes outside `toward`; returns the
/// bytes moved. `members` re-reads the cgroup's processes: pids are pinned (pidfd) a batch at a
/// time, and only those still members after the pin are moved, so a pid that exited and was
/// reused by a process elsewhere after `pids` was read is never touched.
pub fn move_pids_pages(
    pids: &[u32],
    toward: &CpuSet,
    max_bytes: u64,
    members: impl Fn() -> std::io::Result<Vec<u32>>,
) -> std::io::Result<u64> {
    let mut left = max_bytes / PAGE;
    // A batch bounds the pidfds held at once.
    'batches: for batch in pids.chunks(64) {
        let pinned: Vec<Pinned> = batch.iter().filter_map(|&p| Pinned::open(p)).collect();
        if pinned.is_empty() {
            continue;
        }
        let now: std::collections::BTreeSet<u32> = members()?.into_iter().collect();
        for p in pinned.iter().filter(|p| now.contains(&p.pid)) {
            left -= move_pinned_pages(p, toward, left)?.min(left);
            if left < CHUNK {
                break 'batches;
            }
        }
    }
    Ok((max_bytes / PAGE - left) * PAGE)
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
        assert_eq!(move_process_pages(me, &all, 1 << 20).unwrap(), 0);
        assert_eq!(move_process_pages(me, &all, CHUNK - 1).unwrap(), 0);
        assert_eq!(
            move_pids_pages(&[u32::MAX - 1], &all, 1 << 30, || Ok(vec![])).unwrap(),
            0
        );
        drop(v);
    }
}

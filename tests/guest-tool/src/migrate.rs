//! `guest-tool migrate`: moves another process's memory to one node by a chosen method and
//! reports how fast, for the `migrate-rate` scenario (which migration path is fastest in the
//! guest, and under which conditions).
//!
//! - `move-pages`: move_pages(2) over every page of the mappings that hold pages elsewhere, in
//!   calls of `batch` pages; with `query` each call is bracketed by two query calls (what the
//!   daemon's writer did per 2 MiB chunk before the resume-and-no-requery mover).
//! - `migrate-pages`: one migrate_pages(2) call (every other node → the target): the kernel's
//!   own one-pass walk of the mm (the cpuset path's `do_migrate_pages`) in this thread.
//!
//! Pages moved are counted by /proc/vmstat `pgmigrate_success` (4 KiB units), so a THP moved
//! whole counts 512.
use std::time::Instant;

use anyhow::{bail, Context, Result};

const PAGE: u64 = 4096;
const MPOL_MF_MOVE: libc::c_int = 1 << 1;

/// Pages migrated system-wide so far (/proc/vmstat pgmigrate_success; 4 KiB units).
pub fn pgmigrate() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("pgmigrate_success ")?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// (start, end) of `pid`'s mappings that hold pages on a node other than `to` (not hugetlb).
fn ranges(pid: i32, to: u32) -> Result<Vec<(u64, u64)>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).context("maps")?;
    let numa = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).context("numa_maps")?;
    let ends: std::collections::BTreeMap<u64, u64> = maps
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect();
    Ok(numa
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let start = u64::from_str_radix(it.next()?, 16).ok()?;
            let rest: Vec<&str> = it.collect();
            if rest.contains(&"huge") {
                return None;
            }
            let off = rest.iter().any(|t| {
                t.strip_prefix('N')
                    .and_then(|t| t.split_once('='))
                    .is_some_and(|(n, p)| n.parse::<u32>().ok() != Some(to) && p != "0")
            });
            off.then(|| ends.get(&start).map(|&e| (start, e)))?
        })
        .collect())
}

fn move_pages(pid: i32, addrs: &[u64], node: Option<libc::c_int>) -> std::io::Result<()> {
    let ptrs: Vec<*mut libc::c_void> = addrs.iter().map(|&a| a as *mut libc::c_void).collect();
    let nodes = node.map(|n| vec![n; addrs.len()]);
    let mut status = vec![0 as libc::c_int; addrs.len()];
    // SAFETY: the arrays have addrs.len() elements; the kernel reads ptrs/nodes, writes status.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            pid,
            ptrs.len() as libc::c_ulong,
            ptrs.as_ptr(),
            nodes.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
            status.as_mut_ptr(),
            if node.is_some() { MPOL_MF_MOVE } else { 0 },
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        // Some pages could not be moved (busy, shared): not an error of the method.
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    Ok(())
}

fn migrate_pages(pid: i32, to: u32) -> std::io::Result<i64> {
    let all: u64 = std::fs::read_to_string("/sys/devices/system/node/online")
        .ok()
        .and_then(|s| {
            crate::numa::parse_list(s.trim()).ok().map(|ns| {
                ns.iter()
                    .filter(|&&n| n < 64)
                    .fold(0u64, |m, &n| m | (1 << n))
            })
        })
        .unwrap_or(u64::MAX);
    let new: u64 = 1 << to;
    let old: u64 = all & !new;
    // SAFETY: two one-word node masks of 64 bits.
    let r = unsafe {
        libc::syscall(
            libc::SYS_migrate_pages,
            pid,
            65 as libc::c_ulong,
            &old as *const u64,
            &new as *const u64,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// Runs one migration and prints `MIGRATE method=… batch=… query=… pages=… seconds=… calls=…
/// rate=…` (pages/s).
pub fn run(pid: i32, to: u32, method: &str, batch: u64, query: bool) -> Result<()> {
    if to >= 64 {
        bail!("node {to} out of range");
    }
    let m0 = pgmigrate();
    let t0 = Instant::now();
    let mut calls = 0u64;
    match method {
        "move-pages" => {
            let batch = batch.max(1) as usize;
            let mut addrs = Vec::with_capacity(batch);
            let mut flush = |addrs: &mut Vec<u64>| -> Result<()> {
                if addrs.is_empty() {
                    return Ok(());
                }
                if query {
                    move_pages(pid, addrs, None)?;
                    calls += 1;
                }
                move_pages(pid, addrs, Some(to as libc::c_int))?;
                calls += 1;
                if query {
                    move_pages(pid, addrs, None)?;
                    calls += 1;
                }
                addrs.clear();
                Ok(())
            };
            for (a, b) in ranges(pid, to)? {
                let mut p = a;
                while p < b {
                    addrs.push(p);
                    if addrs.len() == batch {
                        flush(&mut addrs)?;
                    }
                    p += PAGE;
                }
            }
            flush(&mut addrs)?;
        }
        "migrate-pages" => {
            let left = migrate_pages(pid, to).context("migrate_pages")?;
            calls = 1;
            if left > 0 {
                eprintln!("migrate_pages: {left} pages not moved");
            }
        }
        other => bail!("unknown method {other:?} (move-pages, migrate-pages)"),
    }
    let secs = t0.elapsed().as_secs_f64();
    let pages = pgmigrate().saturating_sub(m0);
    println!(
        "MIGRATE method={method} batch={batch} query={} pages={pages} seconds={secs:.2} calls={calls} rate={:.0}",
        u8::from(query),
        pages as f64 / secs.max(1e-6)
    );
    Ok(())
}

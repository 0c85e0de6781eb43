//! `first-move`: when the first pages of a set of cgroups arrive on a node. The benchmark starts
//! it just before an event (an operator's pin) and reads the time of the first migration toward
//! the new node apart from the time to 95% local: decision latency apart from copy time, for
//! any manager (the kernel's AutoNUMA as well as the daemon), from `memory.numa_stat`.
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context, Result};

/// Bytes of anonymous memory on `node` in a `memory.numa_stat` text (`anon N0=… N1=…`).
pub fn anon_on(numa_stat: &str, node: u32) -> Option<u64> {
    let key = format!("N{node}=");
    numa_stat
        .lines()
        .find(|l| l.starts_with("anon "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix(&key))?
        .parse()
        .ok()
}

fn read_anon(cg: &Path, node: u32) -> Result<u64> {
    let p = cg.join("memory.numa_stat");
    let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    anon_on(&s, node).with_context(|| format!("{} has no anon N{node}=", p.display()))
}

/// /proc/uptime's first field: the clock the guest scripts stamp with.
fn uptime() -> Result<f64> {
    let s = std::fs::read_to_string("/proc/uptime").context("reading /proc/uptime")?;
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .context("/proc/uptime is not a number")
}

/// Reads each cgroup's anonymous memory on `node`, prints `FIRST-MOVE-READY`, then polls every
/// `poll_ms` until one of them holds `bytes` more than at the start: prints
/// `FIRST-MOVE uptime=<s> cgroup=<dir> grew=<bytes>`, or `FIRST-MOVE never` after `seconds`.
pub fn run(cgroups: &[PathBuf], node: u32, bytes: u64, poll_ms: u64, seconds: f64) -> Result<()> {
    if cgroups.is_empty() {
        bail!("no --cgroup");
    }
    let base: Vec<u64> = cgroups
        .iter()
        .map(|c| read_anon(c, node))
        .collect::<Result<_>>()?;
    println!("FIRST-MOVE-READY uptime={:.2}", uptime()?);
    let end = uptime()? + seconds;
    loop {
        for (cg, b) in cgroups.iter().zip(&base) {
            let now = read_anon(cg, node)?;
            if now >= b + bytes {
                println!(
                    "FIRST-MOVE uptime={:.2} cgroup={} grew={}",
                    uptime()?,
                    cg.display(),
                    now - b
                );
                return Ok(());
            }
        }
        if uptime()? > end {
            println!("FIRST-MOVE never");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(poll_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anon_bytes_per_node() {
        let s = "anon N0=4096 N1=268435456 N2=0\nfile N0=1 N1=2\n";
        assert_eq!(anon_on(s, 1), Some(268435456));
        assert_eq!(anon_on(s, 2), Some(0));
        assert_eq!(anon_on(s, 3), None);
        assert_eq!(anon_on("file N0=1\n", 0), None);
    }
}

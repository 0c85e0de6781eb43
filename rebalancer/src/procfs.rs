//! Readers of /proc (root passed in): per-CPU busy time from `/proc/stat`, and per task the CPUs
//! it may run on (`Cpus_allowed_list`) and the CPU it last ran on (`stat` field 39).
//!
//! These serve the controller's node CPU-busy figures, its "never fight the operator's affinity"
//! rule, and the no-eBPF fallback for where a cgroup's threads run. Parsers are pure functions.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use crate::cpuset::CpuSet;

#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Malformed { path: PathBuf, message: String },
}

/// Busy and total jiffies of one CPU since boot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub busy: u64,
    pub total: u64,
    /// Time the hypervisor ran something else while this virtual CPU wanted to run (part of
    /// `busy` and `total`; 0 on bare metal).
    pub steal: u64,
}

/// Parses the `cpuN ...` lines of /proc/stat (idle + iowait count as idle).
pub fn parse_stat(text: &str) -> Result<BTreeMap<u32, CpuTimes>, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cpu") else {
            continue;
        };
        let mut it = rest.split_ascii_whitespace();
        let Some(id) = it.next() else { continue };
        let Ok(id) = id.parse::<u32>() else { continue }; // the aggregate "cpu" line
        let vals: Vec<u64> = it
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("bad number in line {line:?}"))
            })
            .collect::<Result<_, _>>()?;
        if vals.len() < 4 {
            return Err(format!("too few fields in line {line:?}"));
        }
        // user nice system idle iowait irq softirq steal (guest time is already in user)
        let overflow = || format!("counters overflow u64 in line {line:?}");
        let total = vals
            .iter()
            .take(8)
            .try_fold(0u64, |acc, v| acc.checked_add(*v))
            .ok_or_else(overflow)?;
        let idle = vals[3]
            .checked_add(vals.get(4).copied().unwrap_or(0))
            .ok_or_else(overflow)?;
        out.insert(
            id,
            CpuTimes {
                busy: total.saturating_sub(idle),
                total,
                steal: vals.get(7).copied().unwrap_or(0),
            },
        );
    }
    Ok(out)
}

/// Reads `<proc>/stat`.
pub fn read_stat(proc_root: &Path) -> Result<BTreeMap<u32, CpuTimes>, ProcError> {
    let path = proc_root.join("stat");
    let text = std::fs::read_to_string(&path).map_err(|source| ProcError::Io {
        path: path.clone(),
        source,
    })?;
    parse_stat(&text).map_err(|message| ProcError::Malformed { path, message })
}

/// Busy fraction per CPU between two readings (CPUs missing from either are left out).
pub fn busy_between(
    before: &BTreeMap<u32, CpuTimes>,
    after: &BTreeMap<u32, CpuTimes>,
) -> BTreeMap<u32, f64> {
    after
        .iter()
        .filter_map(|(cpu, a)| {
            let b = before.get(cpu)?;
            let total = a.total.saturating_sub(b.total);
            let busy = a.busy.saturating_sub(b.busy);
            Some((
                *cpu,
                if total == 0 {
                    0.0
                } else {
                    (busy as f64 / total as f64).clamp(0.0, 1.0)
                },
            ))
        })
        .collect()
}

/// `Cpus_allowed_list` of a /proc/<pid>/status text.
pub fn parse_cpus_allowed(status: &str) -> Option<CpuSet> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|v| CpuSet::parse(v.trim()).ok())
}

/// The CPU a task last ran on: field 39 of /proc/<pid>/stat (the comm field may hold spaces and
/// parentheses, so fields are counted after the last ')').
pub fn parse_last_cpu(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    // after ')' come fields 3.. ; field 39 is index 36 of that list.
    after.split_ascii_whitespace().nth(36)?.parse().ok()
}

/// Cumulative CPU time (utime + stime, clock ticks; fields 14-15) and last CPU (field 39) of a
/// /proc/<pid>/task/<tid>/stat text.
pub fn parse_task_cpu(stat: &str) -> Option<(u64, u32)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_ascii_whitespace().collect();
    // after ')': index 0 is field 3, so field N is index N - 3.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let cpu: u32 = f.get(36)?.parse().ok()?;
    Some((utime.checked_add(stime)?, cpu))
}

/// Nanoseconds per clock tick of /proc times.
pub fn ns_per_tick() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        1_000_000_000 / hz as u64
    } else {
        10_000_000
    }
}

/// CPU ticks and last CPU of every thread of `pid`, keyed by tid.
pub fn thread_cpu(proc_root: &Path, pid: u32) -> BTreeMap<u32, (u64, u32)> {
    let base = proc_root.join(pid.to_string()).join("task");
    threads(proc_root, pid)
        .into_iter()
        .filter_map(|tid| {
            let s = std::fs::read_to_string(base.join(tid.to_string()).join("stat")).ok()?;
            Some((tid, parse_task_cpu(&s)?))
        })
        .collect()
}

/// The threads of a process (`<proc>/<pid>/task/*`), including the main thread.
pub fn threads(proc_root: &Path, pid: u32) -> Vec<u32> {
    let dir = proc_root.join(pid.to_string()).join("task");
    let mut tids: Vec<u32> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// Where a process's threads may run and last ran. `None` when the process is gone.
pub fn task_placement(proc_root: &Path, pid: u32) -> Option<(CpuSet, Vec<u32>)> {
    let base = proc_root.join(pid.to_string());
    let allowed = parse_cpus_allowed(&std::fs::read_to_string(base.join("status")).ok()?)?;
    let last = threads(proc_root, pid)
        .into_iter()
        .filter_map(|tid| {
            std::fs::read_to_string(base.join("task").join(tid.to_string()).join("stat")).ok()
        })
        .filter_map(|s| parse_last_cpu(&s))
        .collect();
    Some((allowed, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 60 0 20 400 20 0 0 0 0 0\ncpu1 40 0 30 400 30 0 0 0 0 0\nintr 1 2 3\nctxt 99\n";

    /// Fuzzing finding (target `procfs`): utime + stime, and the /proc/stat sums, overflowed
    /// u64 and panicked on a hostile or corrupt stat text; now the line is refused.
    #[test]
    fn task_cpu_and_stat_overflow_are_refused_not_panics() {
        let max = u64::MAX;
        let task = format!("1 (x) S {}{max} {max} {}", "0 ".repeat(10), "0 ".repeat(24));
        assert_eq!(parse_task_cpu(&task), None);
        let ok = format!("1 (x) S {}5 7 {}", "0 ".repeat(10), "0 ".repeat(24));
        assert_eq!(parse_task_cpu(&ok), Some((12, 0)));
        let e = parse_stat(&format!("cpu0 {max} 1 0 0\n")).unwrap_err();
        assert!(e.contains("overflow"), "{e}");
        let e = parse_stat(&format!("cpu0 0 0 0 {max} 1\n")).unwrap_err();
        assert!(e.contains("overflow"), "{e}");
    }

    #[test]
    fn stat_and_busy_fraction() {
        let a = parse_stat(STAT).unwrap();
        assert_eq!(
            a[&0],
            CpuTimes {
                busy: 80,
                total: 500,
                steal: 0,
            }
        );
        let v = parse_stat("cpu0 10 0 5 80 0 0 0 5 0 0\n").unwrap();
        assert_eq!(v[&0].steal, 5, "8th field is steal");
        let b = parse_stat("cpu0 160 0 20 400 20 0 0 0\ncpu1 40 0 30 500 30 0 0 0\n").unwrap();
        let busy = busy_between(&a, &b);
        assert!((busy[&0] - 1.0).abs() < 1e-9);
        assert!(busy[&1].abs() < 1e-9);
        assert!(parse_stat("cpu0 1 2\n").is_err());
        assert!(parse_stat("cpu0 1 2 x 4\n").is_err());
    }

    #[test]
    fn task_fields() {
        let status = "Name:\tx\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n";
        assert_eq!(parse_cpus_allowed(status).unwrap().to_string(), "0-1");
        // comm with spaces and a ')' inside
        let mut stat = String::from("1234 (a b) c) S");
        for i in 4..=52 {
            stat.push_str(&format!(" {}", if i == 39 { 7 } else { 0 }));
        }
        assert_eq!(parse_last_cpu(&stat), Some(7));
        let mut stat2 = String::from("9 (w) R");
        for i in 4..=52 {
            stat2.push_str(&format!(
                " {}",
                match i {
                    14 => 30,
                    15 => 12,
                    39 => 3,
                    _ => 0,
                }
            ));
        }
        assert_eq!(parse_task_cpu(&stat2), Some((42, 3)));
        assert_eq!(parse_last_cpu("1 (x) S 1 2"), None);
    }

    #[test]
    fn reads_this_process() {
        let (allowed, last) = task_placement(Path::new("/proc"), std::process::id()).unwrap();
        assert!(!allowed.is_empty());
        assert!(!last.is_empty());
        assert!(!read_stat(Path::new("/proc")).unwrap().is_empty());
    }
}

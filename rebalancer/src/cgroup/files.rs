//! Pure parsers for cgroup interface files (v1 and v2 formats), normalised to one model:
//! CPU bandwidth, CPU weight, memory limit, per-node memory in bytes, and process lists.
use std::{collections::BTreeMap, path::Path};

use super::CgroupError;

/// Bytes per NUMA node.
pub type NodeBytes = BTreeMap<u32, u64>;

/// Per-node memory of a cgroup, in bytes. Maps are empty where the kernel gives no figure
/// (v1 has no THP split; hugetlb comes from `hugetlb.<size>.numa_stat` when that exists).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NumaStat {
    pub anon: NodeBytes,
    pub file: NodeBytes,
    /// Anonymous transparent huge pages (v2 `anon_thp`), included in `anon`.
    pub anon_thp: NodeBytes,
    /// hugetlbfs pages, summed over page sizes.
    pub hugetlb: NodeBytes,
}

/// CPU bandwidth limit: `quota_us` per `period_us`, `None` quota for unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CpuMax {
    pub quota_us: Option<u64>,
    pub period_us: u64,
}

impl CpuMax {
    /// The limit in CPUs (e.g. 2.5), `None` when unlimited.
    pub fn cpus(&self) -> Option<f64> {
        self.quota_us
            .map(|q| q as f64 / self.period_us.max(1) as f64)
    }
}

fn bad(path: &Path, message: impl Into<String>) -> CgroupError {
    CgroupError::Malformed {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn num(path: &Path, t: &str) -> Result<u64, CgroupError> {
    t.trim()
        .parse()
        .map_err(|_| bad(path, format!("expected a number, found {:?}", t.trim())))
}

/// v2 `cpu.max`: `"max 100000"` or `"200000 100000"`.
pub fn parse_cpu_max(path: &Path, text: &str) -> Result<CpuMax, CgroupError> {
    let mut it = text.split_whitespace();
    let (Some(q), Some(p), None) = (it.next(), it.next(), it.next()) else {
        return Err(bad(
            path,
            format!("expected \"QUOTA PERIOD\", found {:?}", text.trim()),
        ));
    };
    let quota_us = if q == "max" {
        None
    } else {
        Some(num(path, q)?)
    };
    Ok(CpuMax {
        quota_us,
        period_us: num(path, p)?,
    })
}

/// v1 `cpu.cfs_quota_us` (-1 = unlimited) and `cpu.cfs_period_us`.
pub fn parse_cfs(
    quota_path: &Path,
    quota: &str,
    period_path: &Path,
    period: &str,
) -> Result<CpuMax, CgroupError> {
    let q: i64 = quota.trim().parse().map_err(|_| {
        bad(
            quota_path,
            format!("expected a number, found {:?}", quota.trim()),
        )
    })?;
    Ok(CpuMax {
        quota_us: u64::try_from(q).ok(),
        period_us: num(period_path, period)?,
    })
}

/// v1 `cpu.shares` (2..262144, default 1024) to v2 `cpu.weight` (1..10000, default 100), by the
/// conversion runc and systemd use.
pub fn shares_to_weight(shares: u64) -> u64 {
    let s = shares.clamp(2, 262_144);
    1 + ((s - 2) * 9999) / 262_142
}

/// v2 `memory.max` (`"max"` or bytes) or v1 `memory.limit_in_bytes` (a huge page-rounded
/// `LONG_MAX` for unlimited). `None` = unlimited.
pub fn parse_memory_max(path: &Path, text: &str) -> Result<Option<u64>, CgroupError> {
    let t = text.trim();
    if t == "max" {
        return Ok(None);
    }
    let v = num(path, t)?;
    // v1 prints PAGE_COUNTER_MAX * PAGE_SIZE (LONG_MAX rounded down to a page) for "no limit".
    Ok(if v >= (i64::MAX as u64) & !0xFFFF {
        None
    } else {
        Some(v)
    })
}

/// Parses `N0=123 N1=456` tokens into a map, scaled by `unit`.
fn node_values(path: &Path, tokens: &[&str], unit: u64) -> Result<NodeBytes, CgroupError> {
    let mut out = NodeBytes::new();
    for tok in tokens {
        let (n, v) = tok
            .strip_prefix('N')
            .and_then(|r| r.split_once('='))
            .ok_or_else(|| bad(path, format!("expected N<node>=<value>, found {tok:?}")))?;
        let node: u32 = n
            .parse()
            .map_err(|_| bad(path, format!("bad node id in {tok:?}")))?;
        out.insert(node, num(path, v)?.saturating_mul(unit));
    }
    Ok(out)
}

/// v2 `memory.numa_stat`: lines `"anon N0=4096 N1=0"`, values in bytes.
pub fn parse_numa_stat_v2(path: &Path, text: &str) -> Result<NumaStat, CgroupError> {
    let mut s = NumaStat::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let slot = match tokens[0] {
            "anon" => &mut s.anon,
            "file" => &mut s.file,
            "anon_thp" => &mut s.anon_thp,
            _ => continue,
        };
        *slot = node_values(path, &tokens[1..], 1)?;
    }
    Ok(s)
}

/// v1 `memory.numa_stat`: lines `"anon=91 N0=91 N1=0"`, values in pages of `page_size` bytes.
/// The cgroup's own (not `hierarchical_`) figures are taken.
pub fn parse_numa_stat_v1(
    path: &Path,
    text: &str,
    page_size: u64,
) -> Result<NumaStat, CgroupError> {
    let mut s = NumaStat::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let key = tokens[0]
            .split_once('=')
            .map(|(k, _)| k)
            .unwrap_or(tokens[0]);
        let slot = match key {
            "anon" => &mut s.anon,
            "file" => &mut s.file,
            _ => continue,
        };
        *slot = node_values(path, &tokens[1..], page_size)?;
    }
    Ok(s)
}

/// `hugetlb.<size>.numa_stat` (v1 and v2): `"total=2097152 N0=2097152 N1=0"`, in bytes.
pub fn parse_hugetlb_numa_stat(path: &Path, text: &str) -> Result<NodeBytes, CgroupError> {
    let line = text
        .lines()
        .find(|l| l.starts_with("total="))
        .ok_or_else(|| bad(path, "no total= line"))?;
    let tokens: Vec<&str> = line.split_whitespace().collect();
    node_values(path, &tokens[1..], 1)
}

/// How much a `cpu.stat` (v1 and v2) says its cgroup was throttled: `nr_throttled` (periods
/// still throttled when the period timer fired) plus `throttled_usec` (v2) or `throttled_time`
/// (v1, ns), which grows at every unthrottle — only its growth means anything; 0 without the
/// lines (no CPU limit).
pub fn parse_throttling(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            matches!(k, "nr_throttled" | "throttled_usec" | "throttled_time")
                .then(|| v.trim().parse::<u64>().ok())?
        })
        .fold(0u64, u64::wrapping_add)
}

/// `cgroup.procs` / `tasks`: one pid per line.
pub fn parse_procs(path: &Path, text: &str) -> Result<Vec<u32>, CgroupError> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.trim()
                .parse()
                .map_err(|_| bad(path, format!("expected a pid, found {:?}", l.trim())))
        })
        .collect()
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controller-list:path` (v2: `0::/path`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcCgroup {
    pub hierarchy: u32,
    /// v1 controllers of the hierarchy (`name=systemd` included as written); empty for v2.
    pub controllers: Vec<String>,
    pub path: String,
}

/// Parses `/proc/<pid>/cgroup`.
pub fn parse_proc_cgroup(path: &Path, text: &str) -> Result<Vec<ProcCgroup>, CgroupError> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut it = l.splitn(3, ':');
            let (Some(h), Some(c), Some(p)) = (it.next(), it.next(), it.next()) else {
                return Err(bad(
                    path,
                    format!("expected ID:CONTROLLERS:PATH, found {l:?}"),
                ));
            };
            Ok(ProcCgroup {
                hierarchy: h
                    .parse()
                    .map_err(|_| bad(path, format!("bad hierarchy id in {l:?}")))?,
                controllers: c
                    .split(',')
                    .filter(|x| !x.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: p.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nb(pairs: &[(u32, u64)]) -> NodeBytes {
        pairs.iter().copied().collect()
    }

    #[test]
    fn numa_stat_v2_and_v1_normalise_to_bytes() {
        let p = Path::new("memory.numa_stat");
        let v2 = "anon N0=8192 N1=4096\nfile N0=0 N1=12288\nkernel_stack N0=16384 N1=0\n\
                  shmem N0=0 N1=0\nanon_thp N0=0 N1=2097152\n";
        let s = parse_numa_stat_v2(p, v2).unwrap();
        assert_eq!(s.anon, nb(&[(0, 8192), (1, 4096)]));
        assert_eq!(s.file, nb(&[(0, 0), (1, 12288)]));
        assert_eq!(s.anon_thp, nb(&[(0, 0), (1, 2097152)]));
        let v1 = "total=12440 N0=12440\nfile=8056 N0=8056\nanon=374 N0=370 N2=4\n\
                  unevictable=4010 N0=4010\nhierarchical_anon=91421 N0=91421\n";
        let s = parse_numa_stat_v1(p, v1, 4096).unwrap();
        assert_eq!(s.anon, nb(&[(0, 370 * 4096), (2, 4 * 4096)]));
        assert_eq!(s.file, nb(&[(0, 8056 * 4096)]));
        assert!(s.anon_thp.is_empty());
        for bad_text in ["anon N0=x\n", "anon M0=1\n", "anon N=1\n"] {
            let e = parse_numa_stat_v2(p, bad_text).unwrap_err().to_string();
            assert!(e.contains("memory.numa_stat"), "{e}");
        }
        let h = parse_hugetlb_numa_stat(
            p,
            "total=4194304 N0=2097152 N1=2097152\nhierarchical_total=0 N0=0 N1=0\n",
        )
        .unwrap();
        assert_eq!(h, nb(&[(0, 2097152), (1, 2097152)]));
    }

    #[test]
    fn proc_cgroup_lines() {
        let p = Path::new("/proc/1/cgroup");
        let text =
            "9:name=systemd:/\n4:memory:/process_api/ae09\n3:cpuset:/\n1:cpu,cpuacct:/a:b\n0::/\n";
        let v = parse_proc_cgroup(p, text).unwrap();
        assert_eq!(v.len(), 5);
        assert_eq!(v[1].controllers, vec!["memory"]);
        assert_eq!(v[1].path, "/process_api/ae09");
        assert_eq!(v[3].path, "/a:b");
        assert!(v[4].controllers.is_empty());
        assert!(parse_proc_cgroup(p, "x:cpu:/\n").is_err());
        assert!(parse_proc_cgroup(p, "3\n").is_err());
    }

    #[test]
    fn cpu_and_memory_limits() {
        let p = Path::new("f");
        assert_eq!(
            parse_cpu_max(p, "max 100000\n").unwrap(),
            CpuMax {
                quota_us: None,
                period_us: 100000
            }
        );
        let m = parse_cpu_max(p, "250000 100000\n").unwrap();
        assert_eq!(m.cpus(), Some(2.5));
        assert!(parse_cpu_max(p, "max\n").is_err());
        assert!(parse_cpu_max(p, "1 2 3\n").is_err());
        assert_eq!(parse_cfs(p, "-1\n", p, "100000\n").unwrap().quota_us, None);
        assert_eq!(
            parse_cfs(p, "50000\n", p, "100000\n").unwrap().cpus(),
            Some(0.5)
        );
        assert_eq!(parse_memory_max(p, "max\n").unwrap(), None);
        assert_eq!(parse_memory_max(p, "9223372036854771712\n").unwrap(), None);
        assert_eq!(parse_memory_max(p, "1073741824\n").unwrap(), Some(1 << 30));
        assert!(parse_memory_max(p, "lots\n").is_err());
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(parse_procs(p, "1\n42\n").unwrap(), vec![1, 42]);
        assert!(parse_procs(p, "1\nx\n").is_err());
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(text in "[ -~\\n]{0,200}") {
            let p = Path::new("f");
            let _ = parse_cpu_max(p, &text);
            let _ = parse_memory_max(p, &text);
            let _ = parse_numa_stat_v1(p, &text, 4096);
            let _ = parse_numa_stat_v2(p, &text);
            let _ = parse_hugetlb_numa_stat(p, &text);
            let _ = parse_procs(p, &text);
        }
    }
}

//! Steal-time correction of on-CPU time.
//!
//! Both on-CPU sources measure wall-clock time while a task is `current`: a cpu-clock sample
//! credits one hrtimer period, exact mode credits the ktime between two switches. On a virtual
//! machine part of that wall time was stolen: the hypervisor ran something else and the vCPU
//! did not run at all. The kernel's own accounting (rusage, cpu.stat) leaves stolen time out,
//! so uncorrected samples overstate a workload's CPU time by the steal share (measured: 13% on
//! a busy CI host).
//!
//! [`StealCorrection`] scales each read interval's new on-CPU time of a node by the share of
//! that node's CPU time that was not stolen (`steal` column of /proc/stat over the same
//! interval) and keeps the corrected cumulative values, so [`super::Sampler::read`] still
//! returns cumulative samples. Pure: /proc/stat is read by the caller.
use std::collections::{BTreeMap, HashMap};

use super::Sample;
use crate::procfs::CpuTimes;

/// Per node, the share of its CPUs' time between two /proc/stat readings that was not stolen
/// (1.0 for a node whose CPUs did not advance, or are missing from either reading).
pub fn unstolen_share(
    before: &BTreeMap<u32, CpuTimes>,
    after: &BTreeMap<u32, CpuTimes>,
    cpu_node: &BTreeMap<u32, u32>,
) -> BTreeMap<u32, f64> {
    let mut sums: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (cpu, a) in after {
        let (Some(b), Some(node)) = (before.get(cpu), cpu_node.get(cpu)) else {
            continue;
        };
        let e = sums.entry(*node).or_default();
        e.0 = e.0.saturating_add(a.steal.saturating_sub(b.steal));
        e.1 = e.1.saturating_add(a.total.saturating_sub(b.total));
    }
    sums.into_iter()
        .map(|(node, (steal, total))| {
            let share = if total == 0 {
                1.0
            } else {
                1.0 - (steal as f64 / total as f64).clamp(0.0, 1.0)
            };
            (node, share)
        })
        .collect()
}

/// Turns raw cumulative on-CPU time into steal-corrected cumulative time, read after read.
#[derive(Debug, Default)]
pub struct StealCorrection {
    prev_stat: Option<BTreeMap<u32, CpuTimes>>,
    /// Raw cumulative ns per (cgroup, node) at the previous read.
    raw: HashMap<(u64, u32), u64>,
    /// Corrected cumulative ns per (cgroup, node).
    corrected: HashMap<(u64, u32), u64>,
    /// Steal share of all CPUs over the last interval (for reports).
    last_steal_share: f64,
}

impl StealCorrection {
    /// Starts from a /proc/stat reading taken when the samplers were attached.
    pub fn new(stat: Option<BTreeMap<u32, CpuTimes>>) -> Self {
        StealCorrection {
            prev_stat: stat,
            ..Default::default()
        }
    }

    /// Share of all CPUs' time stolen over the last interval (0 on bare metal).
    pub fn last_steal_share(&self) -> f64 {
        self.last_steal_share
    }

    /// Rewrites `samples[..].cpu_ns` (raw cumulative) in place into corrected cumulative
    /// values. `stat` is /proc/stat read now (None when unreadable: no correction this
    /// interval). A raw counter that went back (an evicted entry counting again) adds nothing
    /// for that interval, as [`Sample::delta`] does; cgroups absent from `samples` are forgotten.
    pub fn apply(
        &mut self,
        stat: Option<BTreeMap<u32, CpuTimes>>,
        cpu_node: &BTreeMap<u32, u32>,
        samples: &mut BTreeMap<u64, Sample>,
    ) {
        let share = match (&self.prev_stat, &stat) {
            (Some(b), Some(a)) => {
                let all: BTreeMap<u32, u32> = a.keys().map(|c| (*c, 0)).collect();
                self.last_steal_share = 1.0 - unstolen_share(b, a, &all).get(&0).unwrap_or(&1.0);
                unstolen_share(b, a, cpu_node)
            }
            _ => BTreeMap::new(),
        };
        if stat.is_some() {
            self.prev_stat = stat;
        }
        let mut raw = HashMap::with_capacity(self.raw.len());
        let mut corrected = HashMap::with_capacity(self.corrected.len());
        for (cg, s) in samples.iter_mut() {
            for (node, ns) in s.cpu_ns.iter_mut() {
                let key = (*cg, *node);
                let last = self.raw.get(&key).copied().unwrap_or(0);
                let new = ns.saturating_sub(last);
                let f = share.get(node).copied().unwrap_or(1.0);
                let add = (new as f64 * f).round() as u64;
                let c = self.corrected.get(&key).copied().unwrap_or(0);
                let c = c.saturating_add(add);
                raw.insert(key, *ns);
                corrected.insert(key, c);
                *ns = c;
            }
        }
        self.raw = raw;
        self.corrected = corrected;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(rows: &[(u32, u64, u64)]) -> BTreeMap<u32, CpuTimes> {
        rows.iter()
            .map(|&(cpu, total, steal)| {
                (
                    cpu,
                    CpuTimes {
                        busy: total / 2,
                        total,
                        steal,
                    },
                )
            })
            .collect()
    }

    fn sample(ns: &[(u32, u64)]) -> Sample {
        Sample {
            cpu_ns: ns.iter().copied().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn share_per_node_from_steal_deltas() {
        let nodes = BTreeMap::from([(0, 0), (1, 0), (2, 1), (3, 1)]);
        let a = stat(&[(0, 100, 10), (1, 100, 0), (2, 100, 0), (3, 100, 0)]);
        let b = stat(&[(0, 200, 30), (1, 200, 20), (2, 200, 0), (3, 100, 0)]);
        let s = unstolen_share(&a, &b, &nodes);
        assert!((s[&0] - 0.8).abs() < 1e-9, "{s:?}"); // 40 of 200 stolen
        assert!((s[&1] - 1.0).abs() < 1e-9, "{s:?}");
        // a node whose CPUs did not advance is not corrected
        let s = unstolen_share(&a, &a, &nodes);
        assert_eq!(s[&0], 1.0);
    }

    #[test]
    fn corrects_each_interval_and_stays_cumulative() {
        let nodes = BTreeMap::from([(0, 0), (1, 1)]);
        let mut c = StealCorrection::new(Some(stat(&[(0, 0, 0), (1, 0, 0)])));
        // interval 1: node 0 had 25% steal, node 1 none
        let mut s = BTreeMap::from([(7, sample(&[(0, 1000), (1, 1000)]))]);
        c.apply(Some(stat(&[(0, 100, 25), (1, 100, 0)])), &nodes, &mut s);
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 750), (1, 1000)]));
        assert!((c.last_steal_share() - 0.125).abs() < 1e-9);
        // interval 2: no steal; raw grew by 400 on node 0
        let mut s = BTreeMap::from([(7, sample(&[(0, 1400), (1, 1000)]))]);
        c.apply(Some(stat(&[(0, 200, 25), (1, 200, 0)])), &nodes, &mut s);
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 1150), (1, 1000)]));
        // a counter that went back adds nothing; /proc/stat unreadable: no correction
        let mut s = BTreeMap::from([(7, sample(&[(0, 100), (1, 1100)]))]);
        c.apply(None, &nodes, &mut s);
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 1150), (1, 1100)]));
        // a vanished cgroup is forgotten: when its id counts again it starts from 0
        c.apply(
            Some(stat(&[(0, 300, 25), (1, 300, 0)])),
            &nodes,
            &mut BTreeMap::new(),
        );
        let mut s = BTreeMap::from([(7, sample(&[(0, 10)]))]);
        c.apply(Some(stat(&[(0, 400, 75), (1, 400, 0)])), &nodes, &mut s);
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 5)]));
    }
}

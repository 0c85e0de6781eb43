//! Run-queue pressure per node from the cpu-clock samples (pure arithmetic, no I/O).
//!
//! Each cpu-clock sample also reads its CPU's `rq->nr_running` (tasks running or waiting,
//! every scheduling class) into two per-CPU counters: readings and the sum of the lengths
//! read. Between two reads of those counters, a node's runnable demand per CPU is the mean
//! length its CPUs' samples saw: Σ Δsum / Σ Δreadings over the node's CPUs. The samples fire
//! on a timer whether a CPU is busy or idle, so this is a time average of the queue — 1.0 is
//! every CPU running one task, 2.0 every CPU with one task waiting behind the running one —
//! what the planner's contention model takes as `NodeObs::runnable`. Unlike schedstat's
//! `run_delay` (added to when a waiting task finally runs), a reading counts the queue at the
//! instant, so a round sees its own interval.

use std::collections::BTreeMap;

/// Cumulative counters of one CPU: cpu-clock samples that read the run queue, and the sum of
/// the lengths they read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunqCount {
    pub readings: u64,
    pub sum: u64,
}

/// Readings per CPU in an interval below which a node is not measured (a sampler that just
/// started, a round right after the previous one).
pub const MIN_READINGS_PER_CPU: u64 = 4;

/// Runnable demand per CPU of each node between two readings of the counters (`cpu_node`:
/// the node of each CPU). A node is measured when at least half of its CPUs have counters in
/// both readings that did not go backwards (a reloaded sampler restarts them) and those CPUs
/// took [`MIN_READINGS_PER_CPU`] readings each on average; the others are left out (the
/// planner then takes the busy share). Saturating, never NaN.
pub fn runnable_between(
    before: &BTreeMap<u32, RunqCount>,
    now: &BTreeMap<u32, RunqCount>,
    cpu_node: &BTreeMap<u32, u32>,
) -> BTreeMap<u32, f64> {
    // node → (CPUs, CPUs with a usable delta, Δreadings, Δsum)
    let mut acc: BTreeMap<u32, (u64, u64, u64, u64)> = BTreeMap::new();
    for (&cpu, &node) in cpu_node {
        let a = acc.entry(node).or_default();
        a.0 += 1;
        let (Some(b), Some(n)) = (before.get(&cpu), now.get(&cpu)) else {
            continue;
        };
        if n.readings < b.readings || n.sum < b.sum {
            continue;
        }
        a.1 += 1;
        a.2 = a.2.saturating_add(n.readings - b.readings);
        a.3 = a.3.saturating_add(n.sum - b.sum);
    }
    acc.into_iter()
        .filter(|&(_, (cpus, used, readings, _))| {
            used > 0 && used * 2 >= cpus && readings >= used.saturating_mul(MIN_READINGS_PER_CPU)
        })
        .map(|(node, (_, _, readings, sum))| (node, sum as f64 / readings as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(v: &[(u32, u64, u64)]) -> BTreeMap<u32, RunqCount> {
        v.iter()
            .map(|&(c, readings, sum)| (c, RunqCount { readings, sum }))
            .collect()
    }

    /// CPUs 0-1 on node 0, 2-3 on node 1.
    fn two_nodes() -> BTreeMap<u32, u32> {
        [(0, 0), (1, 0), (2, 1), (3, 1)].into_iter().collect()
    }

    #[test]
    fn the_mean_queue_length_of_each_node() {
        let before = counts(&[(0, 100, 100), (1, 100, 0), (2, 0, 0), (3, 50, 150)]);
        // node 0: CPU 0 held 3 tasks at every sample, CPU 1 was idle → 1.5 per CPU;
        // node 1: CPU 2 ran one task, CPU 3 one running and one waiting → 1.5 per CPU.
        let now = counts(&[(0, 200, 400), (1, 200, 0), (2, 100, 100), (3, 150, 350)]);
        let got = runnable_between(&before, &now, &two_nodes());
        assert_eq!(got, [(0, 1.5), (1, 1.5)].into_iter().collect());
        // an idle machine reads 0, not "unmeasured"
        let idle = counts(&[(0, 200, 100), (1, 200, 0), (2, 100, 0), (3, 150, 150)]);
        let got = runnable_between(&before, &idle, &two_nodes());
        assert_eq!(got, [(0, 0.0), (1, 0.0)].into_iter().collect());
    }

    #[test]
    fn a_node_without_enough_readings_is_not_measured() {
        let before = counts(&[(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)]);
        // node 0: 7 readings over 2 CPUs (< 4 each); node 1: only CPU 2 read (half: enough)
        let now = counts(&[(0, 4, 4), (1, 3, 3), (2, 10, 20)]);
        let got = runnable_between(&before, &now, &two_nodes());
        assert_eq!(got, [(1, 2.0)].into_iter().collect());
        // nothing before (the sampler's first round): nothing measured
        assert!(runnable_between(&BTreeMap::new(), &now, &two_nodes()).is_empty());
    }

    #[test]
    fn counters_that_went_back_are_left_out() {
        let before = counts(&[(0, 100, 100), (1, 100, 100), (2, 100, 100), (3, 100, 100)]);
        // node 0: both CPUs restarted (a reloaded sampler) → not measured; node 1: CPU 3
        // restarted, CPU 2 alone (half the CPUs) measures it
        let now = counts(&[(0, 5, 5), (1, 5, 5), (2, 200, 300), (3, 10, 10)]);
        let got = runnable_between(&before, &now, &two_nodes());
        assert_eq!(got, [(1, 2.0)].into_iter().collect());
    }

    #[test]
    fn a_quarter_of_the_cpus_is_not_enough_and_huge_counters_do_not_overflow() {
        let map: BTreeMap<u32, u32> = (0..4).map(|c| (c, 0)).collect();
        let before = counts(&[(0, 0, 0)]);
        let now = counts(&[(0, 1000, 1000)]);
        assert!(runnable_between(&before, &now, &map).is_empty());
        let before = counts(&[(0, 0, 0), (1, 0, 0)]);
        let now = counts(&[(0, u64::MAX, u64::MAX), (1, u64::MAX, u64::MAX)]);
        let got = runnable_between(&before, &now, &map);
        assert_eq!(got.len(), 1);
        assert!(
            got[&0].is_finite() && (got[&0] - 1.0).abs() < 1e-9,
            "{got:?}"
        );
    }
}

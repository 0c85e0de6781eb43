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

/// Readings a CPU must have taken in an interval to count (a sampler that just started, a
/// round right after the previous one, a CPU onlined after the sampler attached).
pub const MIN_READINGS_PER_CPU: u64 = 4;

/// Rounds a node's last measured value stands in for rounds too short to measure it.
pub const CARRY_ROUNDS: u32 = 2;

/// Runnable demand per CPU of each node between two readings of the counters (`cpu_node`:
/// the node of each CPU). A CPU counts when its counters are in both readings, did not go
/// backwards (a reloaded sampler restarts them) and took [`MIN_READINGS_PER_CPU`] readings;
/// a node is measured when at least half of its CPUs count. Saturating, never NaN.
pub fn runnable_between(
    before: &BTreeMap<u32, RunqCount>,
    now: &BTreeMap<u32, RunqCount>,
    cpu_node: &BTreeMap<u32, u32>,
) -> BTreeMap<u32, f64> {
    // node → (CPUs, CPUs that count, Δreadings, Δsum)
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
        let readings = n.readings - b.readings;
        if readings < MIN_READINGS_PER_CPU {
            continue;
        }
        a.1 += 1;
        a.2 = a.2.saturating_add(readings);
        a.3 = a.3.saturating_add(n.sum - b.sum);
    }
    acc.into_iter()
        .filter(|&(_, (cpus, used, _, _))| used > 0 && used * 2 >= cpus)
        .map(|(node, (_, _, readings, sum))| (node, sum as f64 / readings as f64))
        .collect()
}

/// The daemon's window over the counters, round after round.
#[derive(Clone, Debug, Default)]
pub struct RunqWindow {
    /// The counters when the window opened.
    start: BTreeMap<u32, RunqCount>,
    /// Each node's last measured value, its busy share then, and the rounds it has stood in
    /// since.
    last: BTreeMap<u32, (f64, f64, u32)>,
}

impl RunqWindow {
    /// Run-queue pressure per node since the window opened, given the counters `now`. A round
    /// too soon after the last to measure any node (too few readings) leaves the window open,
    /// so the next round covers the longer interval, and a node's last measured value stands
    /// in for up to [`CARRY_ROUNDS`] such rounds, scaled by how the node's busy share (`busy`,
    /// this round's) changed since — its queue per running task is what is carried, so a node
    /// that emptied meanwhile does not read as queued: the planner's pressure history does not
    /// flip between the run queue and the busy share with the spacing of rounds. Counters that
    /// went backwards, or a first call, open a new window.
    pub fn update(
        &mut self,
        now: BTreeMap<u32, RunqCount>,
        cpu_node: &BTreeMap<u32, u32>,
        busy: &BTreeMap<u32, f64>,
    ) -> BTreeMap<u32, f64> {
        let got = runnable_between(&self.start, &now, cpu_node);
        let went_back = now.iter().any(|(c, n)| {
            self.start
                .get(c)
                .is_some_and(|b| n.readings < b.readings || n.sum < b.sum)
        });
        if !got.is_empty() || self.start.is_empty() || went_back {
            self.start = now;
        }
        let busy_of = |n: &u32| busy.get(n).copied().filter(|b| b.is_finite());
        let mut out = got.clone();
        self.last.retain(|n, (v, then, carried)| {
            if let Some(&g) = got.get(n) {
                (*v, *then, *carried) = (g, busy_of(n).unwrap_or(f64::NAN), 0);
                return true;
            }
            if *carried >= CARRY_ROUNDS {
                return false;
            }
            *carried += 1;
            let carried_value = match busy_of(n) {
                Some(b) if *then >= 0.05 => (*v * b / *then).max(b),
                _ => *v,
            };
            out.insert(*n, carried_value);
            true
        });
        for (n, v) in got {
            self.last
                .entry(n)
                .or_insert((v, busy_of(&n).unwrap_or(f64::NAN), 0));
        }
        out
    }
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
        // node 0: CPU 1 took 3 readings (< 4), CPU 0 alone is half the node: measured by it;
        // node 1: CPU 2 read, CPU 3 none (a CPU without a sampler): half, measured
        let now = counts(&[(0, 4, 4), (1, 3, 30), (2, 10, 20), (3, 0, 0)]);
        let got = runnable_between(&before, &now, &two_nodes());
        assert_eq!(got, [(0, 1.0), (1, 2.0)].into_iter().collect());
        // both CPUs of node 0 short: not measured
        let now = counts(&[(0, 3, 3), (1, 3, 3), (2, 10, 20)]);
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

    #[test]
    fn a_short_round_keeps_the_window_open_and_carries_the_last_value() {
        let map = two_nodes();
        let c = |r: u64, s: u64| counts(&[(0, r, s), (1, r, s), (2, r, 2 * s), (3, r, 2 * s)]);
        let mut w = RunqWindow::default();
        let busy: BTreeMap<u32, f64> = [(0, 1.0), (1, 1.0)].into_iter().collect();
        assert!(
            w.update(c(100, 100), &map, &busy).is_empty(),
            "the first call opens the window"
        );
        let full = [(0, 1.0), (1, 2.0)].into_iter().collect::<BTreeMap<_, _>>();
        assert_eq!(w.update(c(200, 200), &map, &busy), full);
        // two rounds in a row too short to measure: the last values stand in
        assert_eq!(w.update(c(202, 210), &map, &busy), full);
        assert_eq!(w.update(c(203, 220), &map, &busy), full);
        // the window stayed open at 200: 6 readings since, node 0 read 30 / 6 = 5.0
        assert_eq!(
            w.update(c(206, 230), &map, &busy),
            [(0, 5.0), (1, 10.0)].into_iter().collect()
        );
        // the stand-in lasts CARRY_ROUNDS rounds, not for ever
        for _ in 0..CARRY_ROUNDS {
            assert_eq!(w.update(c(206, 230), &map, &busy).len(), 2);
        }
        assert!(w.update(c(206, 230), &map, &busy).is_empty());
        // counters that went back (a reloaded sampler) open a new window
        assert!(w.update(c(5, 5), &map, &busy).is_empty());
        assert_eq!(w.update(c(105, 105), &map, &busy), full);
    }

    #[test]
    fn a_carried_value_follows_the_busy_share() {
        let map = two_nodes();
        let c = |r: u64, s: u64| counts(&[(0, r, s), (1, r, s), (2, r, s), (3, r, s)]);
        let at = |b0: f64| -> BTreeMap<u32, f64> { [(0, b0), (1, 1.0)].into_iter().collect() };
        let mut w = RunqWindow::default();
        w.update(c(0, 0), &map, &at(1.0));
        let both = [(0, 2.0), (1, 2.0)].into_iter().collect::<BTreeMap<_, _>>();
        assert_eq!(w.update(c(100, 200), &map, &at(1.0)), both);
        // node 0 emptied to a tenth busy during a short round: its queue scales down with it,
        // never below the busy share; node 1 unchanged
        let got = w.update(c(101, 202), &map, &at(0.1));
        assert!((got[&0] - 0.2).abs() < 1e-12 && got[&1] == 2.0, "{got:?}");
        // no busy share known: the value as it was
        assert_eq!(w.update(c(102, 204), &map, &BTreeMap::new()), both);
    }
}

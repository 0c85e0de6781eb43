//! Each workload's own wait on the run queues: per thread, `run_delay` of
//! `/proc/<tid>/schedstat` (nanoseconds it was runnable but not running, kept by the scheduler
//! under CONFIG_SCHED_INFO), summed per cgroup between two control rounds.
//!
//! A cgroup's CPU time is what it received; on a crowded node its threads also wait, and what
//! it wants is both. The node's run queue (`ebpf::runq`) gives that only on average, and
//! cgroups share CPU by weight, not by thread, so only a workload's own wait may decide a move
//! into a queue (`controller::Observations::wanted_exact`). The wait has no node; it is split
//! over the nodes the workload ran on in proportion to its CPU time there ([`split`]).
//!
//! What is not counted, so a workload's want is under- rather than over-stated: a thread's wait
//! before the round it was first seen (its first round is a baseline), and the wait of threads
//! that ended between rounds. A workload throttled by a CPU limit (its own `cpu.max` or an
//! ancestor's) in the period waited on its quota, not on the node: that period it is not
//! measured. Cost: one read of `cgroup.threads` and of `cpu.stat` (and its ancestors') per
//! cgroup and one small `/proc` read per thread each round, at most [`MAX_THREADS`] threads.

use std::{collections::BTreeMap, path::Path};

use crate::cpuset::CpuSet;

/// Most threads read per round, all cgroups together; cgroups past it are not measured that
/// round (their demand is then estimated from their node's queue).
pub const MAX_THREADS: usize = 10_000;

/// `exec_runtime run_delay pcount` of a `/proc/<tid>/schedstat`: (on-CPU ns, waiting ns).
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut it = text.split_ascii_whitespace();
    let exec = it.next()?.parse().ok()?;
    let delay = it.next()?.parse().ok()?;
    Some((exec, delay))
}

/// Whether this kernel keeps per-thread run delays: `/proc/self/schedstat` exists and counts
/// this process's own run time (without sched_info, as with delay accounting off on older
/// kernels, it reads all zeros).
pub fn probe(proc_root: &Path) -> Result<(), String> {
    let p = proc_root.join("self").join("schedstat");
    let text = std::fs::read_to_string(&p).map_err(|e| {
        format!(
            "cannot read {} ({e}): a kernel without CONFIG_SCHED_INFO",
            p.display()
        )
    })?;
    match parse_schedstat(&text) {
        Some((exec, _)) if exec > 0 => Ok(()),
        Some(_) => Err(format!(
            "{} reads no run time: the kernel does not keep sched_info (CONFIG_SCHEDSTATS off, delay accounting off)",
            p.display()
        )),
        None => Err(format!("{}: unexpected format {text:?}", p.display())),
    }
}

/// `run_delay` of thread `tid` now; None when it is gone.
pub fn run_delay(proc_root: &Path, tid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(proc_root.join(tid.to_string()).join("schedstat")).ok()?;
    parse_schedstat(&text).map(|(_, d)| d)
}

/// `wait` ns split over nodes in proportion to `cpu_ns_per_node` (where the workload ran); a
/// workload that did not run at all waited on the nodes of its CPUs, `nodes`, in equal parts.
/// Exact in total (the rounding remainder goes to the first node of the largest share).
pub fn split(
    wait: u64,
    cpu_ns_per_node: &BTreeMap<u32, u64>,
    nodes: &CpuSet,
) -> BTreeMap<u32, u64> {
    let ran: BTreeMap<u32, u64> = cpu_ns_per_node
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(&n, &v)| (n, v))
        .collect();
    let weights: BTreeMap<u32, u64> = if ran.is_empty() {
        nodes.iter().map(|n| (n, 1)).collect()
    } else {
        ran
    };
    let total: u128 = weights.values().map(|&v| v as u128).sum();
    if total == 0 {
        return BTreeMap::new();
    }
    let mut out: BTreeMap<u32, u64> = weights
        .iter()
        .map(|(&n, &v)| (n, (wait as u128 * v as u128 / total) as u64))
        .collect();
    let rest = wait - out.values().sum::<u64>();
    if let Some((&n, _)) = weights
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
    {
        *out.entry(n).or_default() += rest;
    }
    out
}

/// Run delays of the managed cgroups' threads at the last round.
#[derive(Debug, Default)]
pub struct Tracker {
    /// cgroup → (throttled periods, tid → run_delay) at the last round it was measured.
    last: BTreeMap<String, (u64, BTreeMap<u32, u64>)>,
    /// Whether the last round stopped at [`MAX_THREADS`].
    pub truncated: bool,
}

/// How a round reads the machine (the daemon's: [`crate::cgroup::Cgroups`] and /proc).
pub trait WaitSource {
    /// The cgroup's threads now; None when it cannot be read (gone).
    fn threads(&mut self, cg: &str) -> Option<Vec<u32>>;
    /// Cumulative periods the cgroup or an ancestor was throttled by a CPU limit.
    fn throttled(&mut self, cg: &str) -> u64;
    /// Cumulative `run_delay` of a thread; None when it is gone.
    fn run_delay(&mut self, tid: u32) -> Option<u64>;
}

impl Tracker {
    /// Wait ns of each of `managed` since the last call, for the cgroups measured then and now,
    /// not throttled in between, within [`MAX_THREADS`] (`max_threads` in tests) threads.
    /// Threads seen for the first time, and those gone since, add nothing.
    pub fn sample(
        &mut self,
        managed: &[String],
        src: &mut dyn WaitSource,
        max_threads: usize,
    ) -> BTreeMap<String, u64> {
        let mut next = BTreeMap::new();
        let mut out = BTreeMap::new();
        let mut left = max_threads;
        self.truncated = false;
        for cg in managed {
            let Some(tids) = src.threads(cg) else {
                continue;
            };
            if tids.len() > left {
                self.truncated = true;
                continue;
            }
            left -= tids.len();
            let throttled = src.throttled(cg);
            let now: BTreeMap<u32, u64> = tids
                .into_iter()
                .filter_map(|t| Some((t, src.run_delay(t)?)))
                .collect();
            if let Some((thr_before, before)) = self.last.get(cg) {
                if throttled == *thr_before {
                    let wait = now
                        .iter()
                        .filter_map(|(t, &d)| Some(d.saturating_sub(*before.get(t)?)))
                        .fold(0u64, u64::saturating_add);
                    out.insert(cg.clone(), wait);
                }
            }
            next.insert(cg.clone(), (throttled, now));
        }
        self.last = next;
        out
    }
}

/// The daemon's [`WaitSource`]: cgroupfs and /proc.
pub struct Live<'a> {
    pub cgroups: &'a crate::cgroup::Cgroups,
    pub proc_root: &'a Path,
}

impl WaitSource for Live<'_> {
    fn threads(&mut self, cg: &str) -> Option<Vec<u32>> {
        self.cgroups
            .threads(crate::cgroup::Controller::Cpuset, cg)
            .ok()
    }
    fn throttled(&mut self, cg: &str) -> u64 {
        self.cgroups.nr_throttled(cg)
    }
    fn run_delay(&mut self, tid: u32) -> Option<u64> {
        run_delay(self.proc_root, tid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines_parse() {
        assert_eq!(parse_schedstat("367776 96800 2\n"), Some((367776, 96800)));
        assert_eq!(parse_schedstat("1 2"), Some((1, 2)));
        assert_eq!(parse_schedstat("1"), None);
        assert_eq!(parse_schedstat("x 2 3"), None);
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn a_probe_needs_a_schedstat_that_counts() {
        let d = tempfile::tempdir().unwrap();
        let err = probe(d.path()).unwrap_err();
        assert!(err.contains("CONFIG_SCHED_INFO"), "{err}");
        std::fs::create_dir(d.path().join("self")).unwrap();
        std::fs::write(d.path().join("self/schedstat"), "0 0 0\n").unwrap();
        assert!(probe(d.path()).unwrap_err().contains("sched_info"));
        std::fs::write(d.path().join("self/schedstat"), "garbage\n").unwrap();
        assert!(probe(d.path()).unwrap_err().contains("unexpected format"));
        std::fs::write(d.path().join("self/schedstat"), "5 0 1\n").unwrap();
        assert_eq!(probe(d.path()), Ok(()));
    }

    #[test]
    fn wait_splits_by_cpu_time_and_sums_exactly() {
        let m = |v: &[(u32, u64)]| v.iter().copied().collect::<BTreeMap<_, _>>();
        let nodes = CpuSet::parse("0-1").unwrap();
        assert_eq!(
            split(100, &m(&[(0, 3), (1, 1)]), &nodes),
            m(&[(0, 75), (1, 25)])
        );
        // Rounding: the remainder to the largest share (lowest node on a tie).
        assert_eq!(
            split(10, &m(&[(0, 1), (1, 1), (2, 1)]), &nodes),
            m(&[(0, 4), (1, 3), (2, 3)])
        );
        // Nodes it did not run on are left out; a zero entry counts as not run.
        assert_eq!(split(7, &m(&[(0, 0), (1, 5)]), &nodes), m(&[(1, 7)]));
        // Did not run: equal parts over its nodes; no nodes, nothing.
        assert_eq!(split(9, &m(&[]), &nodes), m(&[(0, 5), (1, 4)]));
        assert_eq!(split(9, &m(&[]), &CpuSet::new()), m(&[]));
        // No wait measured is still a measurement (zeros where it ran).
        assert_eq!(split(0, &m(&[(1, 5)]), &nodes), m(&[(1, 0)]));
        assert_eq!(
            split(u64::MAX, &m(&[(0, u64::MAX), (1, u64::MAX)]), &nodes)
                .values()
                .fold(0u128, |a, &b| a + b as u128),
            u64::MAX as u128
        );
    }

    #[derive(Default)]
    struct Fake {
        threads: BTreeMap<String, Vec<u32>>,
        throttled: BTreeMap<String, u64>,
        delay: BTreeMap<u32, u64>,
    }
    impl WaitSource for Fake {
        fn threads(&mut self, cg: &str) -> Option<Vec<u32>> {
            self.threads.get(cg).cloned()
        }
        fn throttled(&mut self, cg: &str) -> u64 {
            self.throttled.get(cg).copied().unwrap_or(0)
        }
        fn run_delay(&mut self, tid: u32) -> Option<u64> {
            self.delay.get(&tid).copied()
        }
    }

    #[test]
    fn a_cgroups_wait_is_the_growth_of_the_threads_it_kept() {
        let managed = vec!["a".to_string(), "b".to_string()];
        let mut f = Fake::default();
        f.threads.insert("a".into(), vec![1, 2]);
        f.threads.insert("b".into(), vec![3]);
        f.delay.extend([(1, 100), (2, 1000), (3, 5)]);
        let mut t = Tracker::default();
        // The first round is a baseline: nothing measured yet.
        assert!(t.sample(&managed, &mut f, MAX_THREADS).is_empty());
        // Thread 2 ended, 4 started (its past wait is not this period's), 1 waited 50 more.
        f.threads.insert("a".into(), vec![1, 4]);
        f.delay.extend([(1, 150), (4, 9999)]);
        f.delay.remove(&2);
        let got = t.sample(&managed, &mut f, MAX_THREADS);
        assert_eq!(got, [("a".into(), 50), ("b".into(), 0)].into());
        // Now 4 is known: its growth counts. A tid reused with a smaller delay adds nothing.
        f.delay.extend([(1, 150), (4, 10_099)]);
        f.delay.insert(3, 1);
        let got = t.sample(&managed, &mut f, MAX_THREADS);
        assert_eq!(got, [("a".into(), 100), ("b".into(), 0)].into());
        // A cgroup gone is forgotten; one unmanaged is not read.
        f.threads.remove("b");
        let got = t.sample(&managed[..1], &mut f, MAX_THREADS);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["a"]);
        assert!(!t.last.contains_key("b"));
    }

    #[test]
    fn a_throttled_period_is_not_a_measurement() {
        let managed = vec!["a".to_string()];
        let mut f = Fake::default();
        f.threads.insert("a".into(), vec![1]);
        f.delay.insert(1, 0);
        let mut t = Tracker::default();
        t.sample(&managed, &mut f, MAX_THREADS);
        f.delay.insert(1, 500);
        f.throttled.insert("a".into(), 3);
        assert!(t.sample(&managed, &mut f, MAX_THREADS).is_empty());
        // Not throttled since: measured again, from the throttled round's baseline.
        f.delay.insert(1, 800);
        assert_eq!(
            t.sample(&managed, &mut f, MAX_THREADS),
            [("a".into(), 300)].into()
        );
    }

    #[test]
    fn past_the_thread_budget_a_cgroup_is_not_measured() {
        let managed: Vec<String> = ["big", "small"].map(String::from).into();
        let mut f = Fake::default();
        f.threads.insert("big".into(), (1..=10).collect());
        f.threads.insert("small".into(), vec![20]);
        for tid in (1..=10).chain([20]) {
            f.delay.insert(tid, 0);
        }
        let mut t = Tracker::default();
        t.sample(&managed, &mut f, 5);
        assert!(t.truncated);
        for tid in (1..=10).chain([20]) {
            f.delay.insert(tid, 7);
        }
        // "big" never fits; "small" does, after it.
        assert_eq!(t.sample(&managed, &mut f, 5), [("small".into(), 7)].into());
        assert!(t.truncated);
        assert_eq!(
            t.sample(&managed, &mut f, 11),
            [("small".into(), 0)].into(),
            "big's first round in budget is its baseline"
        );
        assert!(!t.truncated);
    }
}

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
//! What is not counted: a thread's wait before the round it was first seen (its first round
//! is a baseline) and the wait of threads that ended between rounds. Where the threads read at
//! both rounds ran less than [`MIN_COVERAGE`] of the cgroup's CPU time (short-lived threads or
//! processes, failed reads) the cgroup is not measured that round, rather than measured as
//! waiting nothing. A round in which a CPU limit throttled it (the `cpu.stat` counters of its
//! CPU cgroup or an ancestor grew since the last round's reads began) is not measured either:
//! it waited on its quota, not on the node. (A throttle that ends just before a round's reads
//! and whose waiting threads run only after them still lands in the next round.) `run_delay` is added when a waiting task
//! gets the CPU, so a long wait lands in one lump: no thread is counted more wait than the
//! interval less what it ran. Still over-stated: on a VM, time the hypervisor took from a
//! vCPU while a task was queued (steal) counts as wait. Cost: per cgroup a read of
//! `cgroup.threads`, of `cpu.stat` at each level of its CPU cgroup's path (twice), and on v1
//! with separate hierarchies of one thread's `/proc/<tid>/cgroup`; per thread one small
//! `/proc` read (about 10 µs), at most [`MAX_THREADS`] threads a round, the cgroups with the
//! fewest threads first.

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

/// `(exec_runtime, run_delay)` of thread `tid` now; None when it is gone.
pub fn read_task(proc_root: &Path, tid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(proc_root.join(tid.to_string()).join("schedstat")).ok()?;
    parse_schedstat(&text)
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

/// One cgroup's measurement between two rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// Wait of the threads read at both rounds, each capped at the interval less what it ran.
    pub wait_ns: u64,
    /// On-CPU time of those same threads: how much of the cgroup's CPU time they account for.
    pub exec_ns: u64,
    /// Time between the two reads.
    pub interval_ns: u64,
}

/// Threads that ran less than this share of the cgroup's CPU time (from the on-CPU source)
/// do not speak for it: short-lived threads or processes, reads that failed, tids of another
/// pid namespace. Its wait is then not measured (rather than measured as nothing).
pub const MIN_COVERAGE: f64 = 0.8;

/// The cgroup's wait over a round of `period_ns` in which the on-CPU source saw it run `cpu_ns`:
/// `m`'s wait scaled from its own interval to the period; None when `m`'s threads account for
/// less than [`MIN_COVERAGE`] of that CPU time (a workload that hardly ran, under 1% of a CPU,
/// needs no coverage).
pub fn wait_for_period(m: &Measured, cpu_ns: u64, period_ns: u64) -> Option<u64> {
    if m.interval_ns == 0 || period_ns == 0 {
        return None;
    }
    let ran = cpu_ns as f64 / period_ns as f64;
    let covered = m.exec_ns as f64 / m.interval_ns as f64;
    if ran >= 0.01 && covered < MIN_COVERAGE * ran {
        return None;
    }
    Some((m.wait_ns as u128 * period_ns as u128 / m.interval_ns as u128) as u64)
}

/// The last reads of one cgroup.
#[derive(Debug, Default)]
struct Last {
    at_ns: u64,
    throttling: u64,
    /// tid → (exec_runtime, run_delay)
    tasks: BTreeMap<u32, (u64, u64)>,
}

/// Run delays of the managed cgroups' threads at the last round.
#[derive(Debug, Default)]
pub struct OwnWait {
    last: BTreeMap<String, Last>,
    /// Whether the last round left cgroups out at its thread budget.
    pub truncated: bool,
}

/// How a round reads the machine (the daemon's: [`crate::cgroup::Cgroups`] and /proc).
pub trait WaitSource {
    /// The cgroup's threads now; None when it cannot be read (gone).
    fn threads(&mut self, cg: &str) -> Option<Vec<u32>>;
    /// A counter that grows whenever a CPU limit throttles the cgroup (its own or an
    /// ancestor's, in the CPU hierarchy its threads `tids` are in); None when that cannot be
    /// known.
    fn throttling(&mut self, cg: &str, tids: &[u32]) -> Option<u64>;
    /// Cumulative `(exec_runtime, run_delay)` of a thread; None when it is gone.
    fn task(&mut self, tid: u32) -> Option<(u64, u64)>;
}

impl OwnWait {
    /// Each of `managed`'s wait since the last call (at `now_ns`, a monotonic clock), for the
    /// cgroups read then and now with no throttling in between or during the reads. Within
    /// `max_threads` ([`MAX_THREADS`] in the daemon) threads, the cgroups with the fewest
    /// threads first (one large tenant cannot leave every other workload unmeasured); the
    /// rest are not read. A thread seen for the first time, or gone since, adds nothing.
    pub fn sample(
        &mut self,
        managed: &[String],
        src: &mut dyn WaitSource,
        max_threads: usize,
        now_ns: u64,
    ) -> BTreeMap<String, Measured> {
        let mut lists: Vec<(String, Vec<u32>)> = managed
            .iter()
            .filter_map(|cg| Some((cg.clone(), src.threads(cg)?)))
            .collect();
        lists.sort_by(|a, b| a.1.len().cmp(&b.1.len()).then(a.0.cmp(&b.0)));
        let mut next = BTreeMap::new();
        let mut out = BTreeMap::new();
        let mut left = max_threads;
        self.truncated = false;
        for (cg, tids) in lists {
            if tids.len() > left {
                self.truncated = true;
                break;
            }
            let Some(before) = src.throttling(&cg, &tids) else {
                continue;
            };
            left -= tids.len();
            let tasks: BTreeMap<u32, (u64, u64)> = tids
                .iter()
                .filter_map(|&t| Some((t, src.task(t)?)))
                .collect();
            let Some(after) = src.throttling(&cg, &tids) else {
                continue;
            };
            if let Some(last) = self.last.get(&cg) {
                let interval_ns = now_ns.saturating_sub(last.at_ns);
                // The counter never goes down: unchanged from the last round's start to
                // this one's end, nothing throttled it in between.
                if after == last.throttling && interval_ns > 0 {
                    let mut m = Measured {
                        interval_ns,
                        ..Default::default()
                    };
                    for (t, &(exec, delay)) in &tasks {
                        let Some(&(exec0, delay0)) = last.tasks.get(t) else {
                            continue;
                        };
                        // A reused tid reads less than its predecessor: nothing to count.
                        let (ran, waited) =
                            (exec.saturating_sub(exec0), delay.saturating_sub(delay0));
                        // No thread waits longer than the time it did not run (a wait
                        // summed in one lump from before the last read, for one).
                        m.exec_ns = m.exec_ns.saturating_add(ran);
                        m.wait_ns = m
                            .wait_ns
                            .saturating_add(waited.min(interval_ns.saturating_sub(ran)));
                    }
                    out.insert(cg.clone(), m);
                }
            }
            next.insert(
                cg,
                Last {
                    at_ns: now_ns,
                    // From before the reads: a throttle that ends during them lands its
                    // lumps of wait after them, in the next interval, which must not count.
                    throttling: before,
                    tasks,
                },
            );
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
    fn throttling(&mut self, cg: &str, tids: &[u32]) -> Option<u64> {
        use crate::cgroup::Controller;
        let (Ok((cpu, _)), Ok((cpuset, _))) = (
            self.cgroups.hierarchy(Controller::Cpu),
            self.cgroups.hierarchy(Controller::Cpuset),
        ) else {
            // No CPU controller: nothing can throttle it.
            return Some(0);
        };
        if cpu == cpuset {
            // One hierarchy (cgroup v2, or v1 co-mounted): its CPU cgroup is this one.
            return Some(self.cgroups.throttling(cg));
        }
        // The CPU hierarchy may be laid out otherwise: where its first thread is (threads of
        // one cpuset cgroup in several CPU cgroups are not looked for).
        let Some(&tid) = tids.first() else {
            return Some(0);
        };
        let path = self
            .cgroups
            .cgroup_of_pid(self.proc_root, tid, Controller::Cpu)
            .ok()?;
        Some(self.cgroups.throttling(&path))
    }
    fn task(&mut self, tid: u32) -> Option<(u64, u64)> {
        read_task(self.proc_root, tid)
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
        /// Throttling counter per cgroup; each read returns the next value of the list
        /// (the last one repeats).
        throttling: BTreeMap<String, Vec<u64>>,
        /// tid → (exec, delay)
        task: BTreeMap<u32, (u64, u64)>,
    }
    impl WaitSource for Fake {
        fn threads(&mut self, cg: &str) -> Option<Vec<u32>> {
            self.threads.get(cg).cloned()
        }
        fn throttling(&mut self, cg: &str, _: &[u32]) -> Option<u64> {
            let Some(v) = self.throttling.get_mut(cg) else {
                return Some(0);
            };
            if v.len() > 1 {
                Some(v.remove(0))
            } else {
                v.first().copied()
            }
        }
        fn task(&mut self, tid: u32) -> Option<(u64, u64)> {
            self.task.get(&tid).copied()
        }
    }

    const S: u64 = 1_000_000_000;

    fn m(wait_ns: u64, exec_ns: u64, interval_ns: u64) -> Measured {
        Measured {
            wait_ns,
            exec_ns,
            interval_ns,
        }
    }

    #[test]
    fn a_cgroups_wait_is_the_growth_of_the_threads_it_kept() {
        let managed = vec!["a".to_string(), "b".to_string()];
        let mut f = Fake::default();
        f.threads.insert("a".into(), vec![1, 2]);
        f.threads.insert("b".into(), vec![3]);
        f.task.extend([(1, (0, 100)), (2, (0, 1000)), (3, (0, 5))]);
        let mut t = OwnWait::default();
        // The first round is a baseline: nothing measured yet.
        assert!(t.sample(&managed, &mut f, MAX_THREADS, 0).is_empty());
        // Thread 2 ended, 4 started (its past wait is not this period's), 1 ran 10 and
        // waited 50 more.
        f.threads.insert("a".into(), vec![1, 4]);
        f.task.extend([(1, (10, 150)), (4, (0, 9999))]);
        f.task.remove(&2);
        let got = t.sample(&managed, &mut f, MAX_THREADS, S);
        assert_eq!(
            got,
            [("a".into(), m(50, 10, S)), ("b".into(), m(0, 0, S))].into()
        );
        // Now 4 is known: its growth counts. A tid reused with smaller counters adds nothing.
        f.task.extend([(4, (5, 10_099))]);
        f.task.insert(3, (0, 1));
        let got = t.sample(&managed, &mut f, MAX_THREADS, 3 * S);
        assert_eq!(got["a"], m(100, 5, 2 * S));
        assert_eq!(got["b"], m(0, 0, 2 * S));
        // A cgroup gone is forgotten; one unmanaged is not read.
        f.threads.remove("b");
        let got = t.sample(&managed[..1], &mut f, MAX_THREADS, 4 * S);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["a"]);
        assert!(!t.last.contains_key("b"));
    }

    #[test]
    fn no_thread_waits_longer_than_it_did_not_run() {
        let managed = vec!["a".to_string()];
        let mut f = Fake::default();
        f.threads.insert("a".into(), vec![1]);
        f.task.insert(1, (0, 0));
        let mut t = OwnWait::default();
        t.sample(&managed, &mut f, MAX_THREADS, 0);
        // A starved thread's whole wait of three periods lands in this one, which it also
        // ran a quarter of: three quarters of it count.
        f.task.insert(1, (S / 4, 3 * S));
        assert_eq!(
            t.sample(&managed, &mut f, MAX_THREADS, S)["a"],
            m(3 * S / 4, S / 4, S)
        );
    }

    #[test]
    fn a_throttled_period_is_not_a_measurement() {
        let managed = vec!["a".to_string()];
        let mut f = Fake::default();
        f.threads.insert("a".into(), vec![1]);
        f.task.insert(1, (0, 0));
        let mut t = OwnWait::default();
        t.sample(&managed, &mut f, MAX_THREADS, 0);
        // Throttled between the rounds.
        f.task.insert(1, (1, 500));
        f.throttling.insert("a".into(), vec![3]);
        assert!(t.sample(&managed, &mut f, MAX_THREADS, S).is_empty());
        // Not throttled since: measured again, from the throttled round's reads.
        f.task.insert(1, (2, 800));
        assert_eq!(
            t.sample(&managed, &mut f, MAX_THREADS, 2 * S)["a"],
            m(300, 1, S)
        );
        // Throttled while its threads were read (before 3, after 4): not measured, nor the
        // next round (its lumps of wait land after these reads), then measured again.
        f.throttling.insert("a".into(), vec![3, 4]);
        f.task.insert(1, (3, 900));
        assert!(t.sample(&managed, &mut f, MAX_THREADS, 3 * S).is_empty());
        f.task.insert(1, (4, 950));
        assert!(t.sample(&managed, &mut f, MAX_THREADS, 4 * S).is_empty());
        f.task.insert(1, (5, 960));
        assert_eq!(
            t.sample(&managed, &mut f, MAX_THREADS, 5 * S)["a"],
            m(10, 1, S)
        );
        // Where throttling cannot be known, nothing is measured.
        struct Unknown(Fake);
        impl WaitSource for Unknown {
            fn threads(&mut self, cg: &str) -> Option<Vec<u32>> {
                self.0.threads(cg)
            }
            fn throttling(&mut self, _: &str, _: &[u32]) -> Option<u64> {
                None
            }
            fn task(&mut self, tid: u32) -> Option<(u64, u64)> {
                self.0.task(tid)
            }
        }
        let mut u = Unknown(f);
        assert!(t.sample(&managed, &mut u, MAX_THREADS, 6 * S).is_empty());
        assert!(t.sample(&managed, &mut u, MAX_THREADS, 7 * S).is_empty());
    }

    #[test]
    fn the_thread_budget_goes_to_the_smallest_cgroups_first() {
        // "a-big" sorts first by name but holds most threads: it is the one left out.
        let managed: Vec<String> = ["a-big", "b", "c"].map(String::from).into();
        let mut f = Fake::default();
        f.threads.insert("a-big".into(), (1..=10).collect());
        f.threads.insert("b".into(), vec![20]);
        f.threads.insert("c".into(), vec![21, 22]);
        for tid in (1..=10).chain([20, 21, 22]) {
            f.task.insert(tid, (0, 0));
        }
        let mut t = OwnWait::default();
        t.sample(&managed, &mut f, 5, 0);
        assert!(t.truncated);
        for tid in (1..=10).chain([20, 21, 22]) {
            f.task.insert(tid, (0, 7));
        }
        let got = t.sample(&managed, &mut f, 5, S);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["b", "c"]);
        assert!(t.truncated);
        let got = t.sample(&managed, &mut f, 13, 2 * S);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            ["b", "c"],
            "a-big's first round in budget is its baseline"
        );
        assert!(!t.truncated);
    }

    #[test]
    fn threads_that_ran_too_little_of_the_cgroups_time_do_not_speak_for_it() {
        let p = S;
        // Its threads ran 0.9 of the 1.0 CPU the on-CPU source saw: measured, and scaled
        // from the tracker's 2 s interval to the 1 s period.
        assert_eq!(
            wait_for_period(&m(2 * S, 18 * S / 10, 2 * S), S, p),
            Some(S)
        );
        // Short-lived threads: the ones read twice ran a tenth of it. Not "waited nothing".
        assert_eq!(wait_for_period(&m(0, S / 10, S), S, p), None);
        // A workload that hardly ran needs no coverage.
        assert_eq!(wait_for_period(&m(0, 0, S), S / 200, p), Some(0));
        assert_eq!(wait_for_period(&m(5, 0, 0), 0, p), None);
        assert_eq!(wait_for_period(&m(5, 0, S), 0, 0), None);
    }
}

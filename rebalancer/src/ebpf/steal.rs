//! Steal-time correction of on-CPU time.
//!
//! On a virtual machine part of the wall time was stolen: the hypervisor ran something else
//! and the vCPU did not run at all. The kernel's own accounting (rusage, cpu.stat) leaves
//! stolen time out; the on-CPU sources do not:
//! - exact mode credits the ktime between two switches, steal included: the share of the
//!   node's time not stolen, `(W - S) / W`, scales it back;
//! - a cpu-clock sample credits one period. A steal shorter than the period leaves the sample
//!   count as it was (too much credited); a longer one makes the hrtimer skip the periods it
//!   missed (about right). Both regimes are covered by scaling the credited time `N·p` to the
//!   time the CPUs actually had, `(W - S) / (N·p)`, never above 1.
//!
//! `W` is the node's CPU time between two reads and `S` its steal (/proc/stat), `N` the
//! node's samples (per-CPU `ClockSamples`, idle ones included) and `p` the period. Without
//! steal nothing is scaled. [`StealCorrection`] applies the factor to each read interval's
//! new on-CPU time and keeps corrected cumulative values, so [`super::Sampler::read`] still
//! returns cumulative samples. Pure: the caller reads /proc/stat and the maps.
use std::collections::BTreeMap;

use super::Sample;
use crate::procfs::CpuTimes;

/// What one on-CPU credit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnCpuClock {
    /// cpu-clock samples of `period_ns` each.
    Sampled { period_ns: u64 },
    /// ktime between switches.
    Exact,
}

/// Per-CPU counters at one read: /proc/stat times and (sampled mode) cumulative sample counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuReading {
    pub stat: BTreeMap<u32, CpuTimes>,
    pub samples: BTreeMap<u32, u64>,
}

/// Per node, the factor that turns credited on-CPU time between two readings into the time
/// the CPUs had. Nodes without steal (or without data) are absent: factor 1.
pub fn node_factors(
    before: &CpuReading,
    after: &CpuReading,
    cpu_node: &BTreeMap<u32, u32>,
    clock: OnCpuClock,
    ns_per_tick: u64,
) -> BTreeMap<u32, f64> {
    // (wall ticks, steal ticks, samples) per node
    let mut sums: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for (cpu, a) in &after.stat {
        let (Some(b), Some(node)) = (before.stat.get(cpu), cpu_node.get(cpu)) else {
            continue;
        };
        let n = |r: &CpuReading| r.samples.get(cpu).copied().unwrap_or(0);
        let e = sums.entry(*node).or_default();
        e.0 = e.0.saturating_add(a.total.saturating_sub(b.total));
        e.1 = e.1.saturating_add(a.steal.saturating_sub(b.steal));
        e.2 = e.2.saturating_add(n(after).saturating_sub(n(before)));
    }
    sums.into_iter()
        .filter(|(_, (w, s, _))| *w > 0 && *s > 0)
        .filter_map(|(node, (w, s, n))| {
            let had = w.saturating_sub(s) as f64 * ns_per_tick as f64;
            let credited = match clock {
                OnCpuClock::Exact => w as f64 * ns_per_tick as f64,
                OnCpuClock::Sampled { period_ns } => n as f64 * period_ns as f64,
            };
            (credited > 0.0).then(|| (node, (had / credited).clamp(0.0, 1.0)))
        })
        .collect()
}

/// Share of all CPUs' time stolen between two readings.
pub fn steal_share(before: &CpuReading, after: &CpuReading) -> f64 {
    let (mut w, mut s) = (0u64, 0u64);
    for (cpu, a) in &after.stat {
        if let Some(b) = before.stat.get(cpu) {
            w = w.saturating_add(a.total.saturating_sub(b.total));
            s = s.saturating_add(a.steal.saturating_sub(b.steal));
        }
    }
    if w == 0 {
        0.0
    } else {
        (s as f64 / w as f64).clamp(0.0, 1.0)
    }
}

/// One (cgroup, node)'s on-CPU time as [`StealCorrection`] last saw it.
#[derive(Debug)]
struct Counted {
    key: (u64, u32),
    /// Raw cumulative ns (the baseline of the next read).
    raw: u64,
    /// Corrected cumulative ns.
    corrected: u64,
}

/// Turns raw cumulative on-CPU time into steal-corrected cumulative time, read after read.
#[derive(Debug)]
pub struct StealCorrection {
    clock: OnCpuClock,
    ns_per_tick: u64,
    prev: Option<CpuReading>,
    /// Per (cgroup, node), sorted by it: the raw cumulative ns at the previous read and the
    /// corrected cumulative ns. The samples come in the same order, so a read walks both in
    /// step (no lookup per entry).
    counted: Vec<Counted>,
    last_steal_share: f64,
    /// The per-node factors applied at the last read (nodes without steal absent).
    last_factors: BTreeMap<u32, f64>,
}

impl StealCorrection {
    /// Starts from a reading taken when the samplers were attached.
    pub fn new(clock: OnCpuClock, ns_per_tick: u64, first: Option<CpuReading>) -> Self {
        StealCorrection {
            clock,
            ns_per_tick,
            prev: first,
            counted: Vec::new(),
            last_steal_share: 0.0,
            last_factors: BTreeMap::new(),
        }
    }

    /// Starts the next interval at `reading` (the first reading, once the maps exist).
    pub fn reset(&mut self, reading: Option<CpuReading>) {
        self.prev = reading;
    }

    /// Share of all CPUs' time stolen over the last interval (0 on bare metal).
    pub fn last_steal_share(&self) -> f64 {
        self.last_steal_share
    }

    /// Per node, the factor the last read applied to its new on-CPU time (absent: 1).
    pub fn last_factors(&self) -> &BTreeMap<u32, f64> {
        &self.last_factors
    }

    /// Rewrites `samples[..].cpu_ns` (raw cumulative) in place into corrected cumulative
    /// values. `now` is the reading taken with the maps (None when unreadable: no correction
    /// this interval). A total that went back adds nothing that interval: by at most exact
    /// mode's pending time (flushed between the reads of the on-CPU counters and `SWITCH_STATE`: under
    /// `SWITCH_FLUSH_NS` per CPU of that node), it
    /// adds nothing until it passes its highest value again; by more (an evicted hash map
    /// entry made again, without a watch list), it counts on from its new value.
    /// Cgroups absent from `samples` are forgotten.
    pub fn apply(
        &mut self,
        now: Option<CpuReading>,
        cpu_node: &BTreeMap<u32, u32>,
        samples: &mut BTreeMap<u64, Sample>,
    ) {
        let factors = match (&self.prev, &now) {
            (Some(b), Some(a)) => {
                self.last_steal_share = steal_share(b, a);
                node_factors(b, a, cpu_node, self.clock, self.ns_per_tick)
            }
            _ => BTreeMap::new(),
        };
        if now.is_some() {
            self.prev = now;
        }
        let mut node_cpus: BTreeMap<u32, u64> = BTreeMap::new();
        for n in cpu_node.values() {
            *node_cpus.entry(*n).or_default() += 1;
        }
        let mut counted = Vec::with_capacity(self.counted.len());
        let mut before_read = self.counted.iter().peekable();
        for (cg, s) in samples.iter_mut() {
            for (node, ns) in s.cpu_ns.iter_mut() {
                let key = (*cg, *node);
                // Keys of the last read that this one lacks are passed (forgotten).
                while before_read.next_if(|c| c.key < key).is_some() {}
                let (before, corrected) = before_read
                    .next_if(|c| c.key == key)
                    .map_or((0, 0), |c| (c.raw, c.corrected));
                let new = ns.saturating_sub(before);
                let add = match factors.get(node) {
                    Some(f) => (new as f64 * f).round() as u64,
                    None => new,
                };
                let c = corrected.saturating_add(add);
                // A dip no deeper than exact mode's pending time (under `SWITCH_FLUSH_NS` per
                // CPU) is time a flush between the two reads left out: the baseline stays, so
                // it is not counted twice when it shows again. A deeper one is an entry made
                // again (without a watch list nothing undoes evictions): the new value is the
                // baseline.
                let dip_bound = rebalancer_common::SWITCH_FLUSH_NS
                    .saturating_mul(node_cpus.get(node).copied().unwrap_or(1).max(1));
                let base = if before > *ns && before - *ns > dip_bound {
                    *ns
                } else {
                    (*ns).max(before)
                };
                counted.push(Counted {
                    key,
                    raw: base,
                    corrected: c,
                });
                *ns = c;
            }
        }
        self.counted = counted;
        self.last_factors = factors;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reading from (cpu, total ticks, steal ticks, samples).
    fn reading(rows: &[(u32, u64, u64, u64)]) -> CpuReading {
        CpuReading {
            stat: rows
                .iter()
                .map(|&(cpu, total, steal, _)| {
                    let t = CpuTimes {
                        busy: total / 2,
                        total,
                        steal,
                    };
                    (cpu, t)
                })
                .collect(),
            samples: rows.iter().map(|&(cpu, _, _, n)| (cpu, n)).collect(),
        }
    }

    fn sample(ns: &[(u32, u64)]) -> Sample {
        Sample {
            cpu_ns: ns.iter().copied().collect(),
            ..Default::default()
        }
    }

    const MS: u64 = 1_000_000;
    const TICK: u64 = 10 * MS;

    #[test]
    fn exact_mode_takes_the_stolen_share_out() {
        let nodes = BTreeMap::from([(0, 0), (1, 0), (2, 1), (3, 1)]);
        let a = reading(&[
            (0, 100, 10, 0),
            (1, 100, 0, 0),
            (2, 100, 0, 0),
            (3, 100, 0, 0),
        ]);
        let b = reading(&[
            (0, 200, 30, 0),
            (1, 200, 20, 0),
            (2, 200, 0, 0),
            (3, 100, 0, 0),
        ]);
        let f = node_factors(&a, &b, &nodes, OnCpuClock::Exact, TICK);
        assert!((f[&0] - 0.8).abs() < 1e-9, "{f:?}"); // 40 of 200 ticks stolen
        assert!(!f.contains_key(&1), "no steal on node 1: {f:?}");
        assert!(node_factors(&a, &a, &nodes, OnCpuClock::Exact, TICK).is_empty());
        assert!((steal_share(&a, &b) - 40.0 / 300.0).abs() < 1e-9);
    }

    #[test]
    fn sampled_mode_covers_short_and_long_steals() {
        let nodes = BTreeMap::from([(0, 0)]);
        let clock = OnCpuClock::Sampled { period_ns: MS };
        // 1 s of wall time (100 ticks), 100 ms stolen.
        let a = reading(&[(0, 0, 0, 0)]);
        // Short steals inside periods: all 1000 samples fired, 1 s credited for 0.9 s had.
        let short = reading(&[(0, 100, 10, 1000)]);
        let f = node_factors(&a, &short, &nodes, clock, TICK);
        assert!((f[&0] - 0.9).abs() < 1e-9, "{f:?}");
        // Long steals: the hrtimer skipped the 100 missed periods; nothing to take out.
        let long = reading(&[(0, 100, 10, 900)]);
        let f = node_factors(&a, &long, &nodes, clock, TICK);
        assert!((f[&0] - 1.0).abs() < 1e-9, "{f:?}");
        // Fewer samples than the time had (an hrtimer held off): never scaled up.
        let few = reading(&[(0, 100, 10, 500)]);
        assert_eq!(node_factors(&a, &few, &nodes, clock, TICK)[&0], 1.0);
        // No samples at all: nothing to scale.
        let none = reading(&[(0, 100, 10, 0)]);
        assert!(node_factors(&a, &none, &nodes, clock, TICK).is_empty());
    }

    #[test]
    fn corrects_each_interval_and_stays_cumulative() {
        let nodes = BTreeMap::from([(0, 0), (1, 1)]);
        let start = reading(&[(0, 0, 0, 0), (1, 0, 0, 0)]);
        let mut c = StealCorrection::new(OnCpuClock::Exact, TICK, Some(start));
        // interval 1: node 0 had 25% steal, node 1 none
        let mut s = BTreeMap::from([(7, sample(&[(0, 1000), (1, 1000)]))]);
        c.apply(
            Some(reading(&[(0, 100, 25, 0), (1, 100, 0, 0)])),
            &nodes,
            &mut s,
        );
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 750), (1, 1000)]));
        assert!((c.last_steal_share() - 0.125).abs() < 1e-9);
        assert_eq!(c.last_factors(), &BTreeMap::from([(0, 0.75)]));
        // interval 2: no steal; raw grew by 400 on node 0
        let mut s = BTreeMap::from([(7, sample(&[(0, 1400), (1, 1000)]))]);
        c.apply(
            Some(reading(&[(0, 200, 25, 0), (1, 200, 0, 0)])),
            &nodes,
            &mut s,
        );
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 1150), (1, 1000)]));
        // a total that went back adds nothing; /proc/stat unreadable: no correction
        let mut s = BTreeMap::from([(7, sample(&[(0, 100), (1, 1100)]))]);
        c.apply(None, &nodes, &mut s);
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 1150), (1, 1100)]));
        // ... and nothing until it passes its highest value (1400) again: a dip within the
        // pending bound was time not yet seen, not new time
        let mut s = BTreeMap::from([(7, sample(&[(0, 1450), (1, 1100)]))]);
        c.apply(None, &nodes, &mut s);
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 1200), (1, 1100)]));
        // a dip past the pending bound (node 0's CPU × 1 ms) is an entry made again: it counts on
        // from its new value, not only once past its old highest
        let deep = 1450 + 5_000_000;
        let mut s = BTreeMap::from([(7, sample(&[(0, deep), (1, 1100)]))]);
        c.apply(None, &nodes, &mut s);
        let mut s = BTreeMap::from([(7, sample(&[(0, 100), (1, 1100)]))]);
        c.apply(None, &nodes, &mut s);
        let mut s = BTreeMap::from([(7, sample(&[(0, 400), (1, 1100)]))]);
        c.apply(None, &nodes, &mut s);
        assert_eq!(s[&7].cpu_ns[&0], 1200 + (deep - 1450) + 300);
        // a vanished cgroup is forgotten: when its id counts again it starts from 0
        let r3 = reading(&[(0, 300, 25, 0), (1, 300, 0, 0)]);
        c.apply(Some(r3), &nodes, &mut BTreeMap::new());
        let mut s = BTreeMap::from([(7, sample(&[(0, 10)]))]);
        let r4 = reading(&[(0, 400, 75, 0), (1, 400, 0, 0)]);
        c.apply(Some(r4), &nodes, &mut s);
        assert_eq!(s[&7].cpu_ns, BTreeMap::from([(0, 5)]));
    }
}

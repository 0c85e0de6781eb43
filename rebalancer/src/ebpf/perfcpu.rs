//! The per-CPU perf events of the perf_event programs, kept in step with CPU hotplug.
//!
//! A perf_event program samples a CPU only through an event opened on that CPU, and the kernel
//! does not carry such events across hotplug (kernel/events/core.c, 6.1 and later alike):
//! taking a CPU offline runs `perf_event_exit_cpu_context`, whose `__perf_event_exit_context`
//! removes every event of the CPU's context (`__perf_remove_from_context(.., DETACH_GROUP)` →
//! `list_del_event`: out of the context, state OFF); bringing it online again
//! (`perf_event_init_cpu`) only marks the context online, nothing puts the events back; and
//! `perf_event_open` on an offline CPU fails with ENODEV. So after an offline the CPU's events
//! are dead for good, and a CPU that came (back) online has none.
//!
//! [`PerfCpus`] keeps each attached program's link per CPU. [`PerfCpus::sync`] (the daemon
//! calls it when the topology was rebuilt, and while some CPU is still without its events)
//! closes the links of CPUs no longer online, opens events on online CPUs without them, and
//! reopens those of CPUs found dead. A CPU that goes offline and back between two topology
//! checks changes no `cpu/online` file; the cpu-clock sampler fires on every online CPU, idle
//! ones included, so a CPU whose sample count stands still over [`SILENT_SAMPLES`] periods is
//! taken as dead ([`PerfCpus::check_clock`]). A CPU that fails to attach is logged (at its 1st,
//! 2nd, 4th, … failure), keeps none of its group's events, and is tried again at the next sync;
//! the other CPUs keep theirs (all or nothing holds only for the first load). The set
//! arithmetic is pure ([`plan`], [`silent`]) and unit-tested.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use aya::{
    programs::{
        perf_event::{PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy},
        PerfEvent,
    },
    Ebpf,
};

/// Periods without a single cpu-clock sample after which an online CPU's events count as dead.
pub const SILENT_SAMPLES: u64 = 20;

/// What one sync does to one group: the CPUs whose events are closed (no longer online, or
/// dead) and those on which events are opened (online without them, or dead).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuPlan {
    pub detach: BTreeSet<u32>,
    pub attach: BTreeSet<u32>,
}

/// The sync of one group: `attached` the CPUs with events, `online` the CPUs online now,
/// `dead` CPUs whose events no longer count (closed and opened again while online).
pub fn plan(attached: &BTreeSet<u32>, online: &BTreeSet<u32>, dead: &BTreeSet<u32>) -> CpuPlan {
    CpuPlan {
        detach: attached
            .iter()
            .filter(|c| !online.contains(c) || dead.contains(c))
            .copied()
            .collect(),
        attach: online
            .iter()
            .filter(|c| !attached.contains(c) || dead.contains(c))
            .copied()
            .collect(),
    }
}

/// CPUs of `judged` whose cpu-clock sample count did not move from `before` to `now`, though
/// `elapsed_ns` at one sample per `period_ns` should have given at least [`SILENT_SAMPLES`].
/// A CPU missing from either reading is not judged.
pub fn silent(
    before: &BTreeMap<u32, u64>,
    now: &BTreeMap<u32, u64>,
    judged: &BTreeSet<u32>,
    elapsed_ns: u64,
    period_ns: u64,
) -> BTreeSet<u32> {
    if period_ns == 0 || elapsed_ns / period_ns < SILENT_SAMPLES {
        return BTreeSet::new();
    }
    judged
        .iter()
        .filter(|c| matches!((before.get(c), now.get(c)), (Some(b), Some(n)) if n == b))
        .copied()
        .collect()
}

/// One perf_event program attached on a set of CPUs, one event (link) per CPU.
#[derive(Debug)]
pub struct PerfProg {
    pub prog: &'static str,
    pub config: PerfEventConfig,
    /// Sample period (ns for the cpu-clock, events for the PMU).
    pub period: u64,
    links: BTreeMap<u32, PerfEventLinkId>,
}

impl PerfProg {
    pub fn new(
        prog: &'static str,
        config: PerfEventConfig,
        period: u64,
        links: BTreeMap<u32, PerfEventLinkId>,
    ) -> Self {
        PerfProg {
            prog,
            config,
            period,
            links,
        }
    }
}

/// Programs that run together on a CPU: the cpu-clock sampler alone, or the DRAM pair (a
/// ratio needs both sides). On each CPU all of a group's programs have events, or none.
#[derive(Debug)]
pub struct PerfGroup {
    /// The source it serves (`loader::SOURCES`), for logs.
    pub source: &'static str,
    pub progs: Vec<PerfProg>,
}

impl PerfGroup {
    /// CPUs where any program of the group has an event.
    fn any_cpus(&self) -> BTreeSet<u32> {
        self.progs
            .iter()
            .flat_map(|p| p.links.keys().copied())
            .collect()
    }

    /// CPUs where every program of the group has an event.
    fn full_cpus(&self) -> BTreeSet<u32> {
        let mut it = self.progs.iter();
        let Some(first) = it.next() else {
            return BTreeSet::new();
        };
        let mut s: BTreeSet<u32> = first.links.keys().copied().collect();
        for p in it {
            s.retain(|c| p.links.contains_key(c));
        }
        s
    }

    fn detach(&mut self, ebpf: &mut Ebpf, cpu: u32) {
        for p in &mut self.progs {
            let Some(id) = p.links.remove(&cpu) else {
                continue;
            };
            match perf_program(ebpf, p.prog) {
                Ok(prog) => {
                    if let Err(e) = prog.detach(id) {
                        tracing::debug!(program = p.prog, cpu, error = %e, "closing a perf event failed");
                    }
                }
                Err(e) => {
                    tracing::debug!(program = p.prog, cpu, error = %e, "perf event left open")
                }
            }
        }
    }

    /// Opens the group's events on `cpu`, all or none.
    fn attach(&mut self, ebpf: &mut Ebpf, cpu: u32) -> Result<(), String> {
        for i in 0..self.progs.len() {
            let p = &self.progs[i];
            let r = perf_program(ebpf, p.prog).and_then(|prog| {
                prog.attach(
                    p.config,
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(p.period),
                    false,
                )
                .map_err(|e| format!("{}: {}", p.prog, super::loader::error_chain(&e)))
            });
            match r {
                Ok(id) => {
                    self.progs[i].links.insert(cpu, id);
                }
                Err(e) => {
                    self.detach(ebpf, cpu);
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

fn perf_program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut PerfEvent, String> {
    ebpf.program_mut(name)
        .ok_or_else(|| format!("program {name} missing"))?
        .try_into()
        .map_err(|e| format!("{name}: {e}"))
}

/// What a sync changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// (source, CPU) whose events were opened.
    pub attached: Vec<(&'static str, u32)>,
    /// (source, CPU) whose events were closed.
    pub detached: Vec<(&'static str, u32)>,
    /// (source, CPU, reason) that could not be opened (tried again at the next sync).
    pub failed: Vec<(&'static str, u32, String)>,
}

/// The attached perf_event programs' events per CPU.
#[derive(Debug, Default)]
pub struct PerfCpus {
    groups: Vec<PerfGroup>,
    /// CPUs online at the last sync (or the load).
    online: BTreeSet<u32>,
    /// CPUs found dead since the last sync (reopened by the next).
    dead: BTreeSet<u32>,
    /// Failed attempts per (source, CPU) in a row.
    failures: BTreeMap<(&'static str, u32), u32>,
    /// cpu-clock samples per CPU at the [`PerfCpus::check_clock`] silence is judged from
    /// (none right after a sync).
    clock_seen: Option<(Instant, BTreeMap<u32, u64>)>,
}

impl PerfCpus {
    /// The groups attached at load, on the CPUs online then.
    pub fn new(groups: Vec<PerfGroup>, online: BTreeSet<u32>) -> Self {
        PerfCpus {
            groups,
            online,
            ..Default::default()
        }
    }

    /// Some online CPU lacks its events (a failed attach to retry) or was found dead.
    pub fn pending(&self) -> bool {
        !self.dead.is_empty()
            || self
                .groups
                .iter()
                .any(|g| self.online.difference(&g.full_cpus()).next().is_some())
    }

    /// CPUs where every group has its events.
    pub fn attached_cpus(&self) -> BTreeSet<u32> {
        let mut it = self.groups.iter();
        let Some(first) = it.next() else {
            return BTreeSet::new();
        };
        let mut s = first.full_cpus();
        for g in it {
            let f = g.full_cpus();
            s.retain(|c| f.contains(c));
        }
        s
    }

    /// Notes the cpu-clock sample count per CPU (`samples`, cumulative); CPUs online and
    /// attached whose count did not move since the last note at least [`SILENT_SAMPLES`]
    /// periods ago are marked dead (a note sooner than that keeps the older one). Without the
    /// cpu-clock sampler (exact mode) nothing is judged.
    pub fn check_clock(&mut self, samples: &BTreeMap<u32, u64>, now: Instant) {
        let Some(period) = self
            .groups
            .iter()
            .find(|g| g.source == "on_cpu:cpu_clock")
            .and_then(|g| g.progs.first())
            .map(|p| p.period)
        else {
            return;
        };
        if let Some((then, before)) = &self.clock_seen {
            let elapsed = now.saturating_duration_since(*then).as_nanos() as u64;
            if period == 0 || elapsed / period < SILENT_SAMPLES {
                return; // too soon to judge: the baseline stays (reads in quick succession)
            }
            let judged: BTreeSet<u32> = self
                .attached_cpus()
                .intersection(&self.online)
                .copied()
                .collect();
            let dead = silent(before, samples, &judged, elapsed, period);
            if !dead.is_empty() {
                tracing::warn!(
                    cpus = ?dead,
                    "no cpu-clock sample on these online CPUs since the last read: their perf events died (offline and back between two topology checks?); reopening them"
                );
                self.dead.extend(dead);
            }
        }
        self.clock_seen = Some((now, samples.clone()));
    }

    /// Brings every group's events in step with `online`: closes those of CPUs no longer
    /// online and of dead CPUs, opens them on online CPUs without them (and dead ones).
    pub fn sync(&mut self, ebpf: &mut Ebpf, online: &BTreeSet<u32>) -> SyncReport {
        let mut report = SyncReport::default();
        for g in &mut self.groups {
            let any = g.any_cpus();
            let full = g.full_cpus();
            // A CPU with part of a group (cannot happen through `attach`) is reopened whole.
            let dead: BTreeSet<u32> = self.dead.union(&(&any - &full)).copied().collect();
            let p = plan(&any, online, &dead);
            for &cpu in &p.detach {
                g.detach(ebpf, cpu);
                report.detached.push((g.source, cpu));
            }
            for &cpu in &p.attach {
                match g.attach(ebpf, cpu) {
                    Ok(()) => {
                        self.failures.remove(&(g.source, cpu));
                        report.attached.push((g.source, cpu));
                    }
                    Err(why) => {
                        let n = self.failures.entry((g.source, cpu)).or_insert(0);
                        *n += 1;
                        if n.is_power_of_two() {
                            tracing::warn!(source = g.source, cpu, failures = *n, reason = %why, "cannot open the perf event on a CPU that is online; it is not sampled, tried again next round");
                        }
                        report.failed.push((g.source, cpu, why));
                    }
                }
            }
        }
        self.failures.retain(|(_, cpu), _| online.contains(cpu));
        self.dead.clear();
        self.online = online.clone();
        // A reopened event starts counting now: judge silence from the next read on.
        self.clock_seen = None;
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    fn check(attached: &[u32], online: &[u32], dead: &[u32], detach: &[u32], attach: &[u32]) {
        let p = plan(&set(attached), &set(online), &set(dead));
        assert_eq!(
            (p.detach, p.attach),
            (set(detach), set(attach)),
            "attached {attached:?} online {online:?} dead {dead:?}"
        );
    }

    #[test]
    fn plan_follows_hotplug() {
        // attached, online, dead → detach, attach
        check(&[0, 1, 2, 3], &[0, 1, 2, 3], &[], &[], &[]);
        // CPU 3 went offline: its dead event is closed
        check(&[0, 1, 2, 3], &[0, 1, 2], &[], &[3], &[]);
        // and came back: a new one is opened
        check(&[0, 1, 2], &[0, 1, 2, 3], &[], &[], &[3]);
        // offline and back between two checks (found dead): closed and opened again
        check(&[0, 1, 2, 3], &[0, 1, 2, 3], &[3], &[3], &[3]);
        // offline at start, online now
        check(&[0, 1], &[0, 1, 2, 3], &[], &[], &[2, 3]);
        // a dead CPU that is offline by now is only closed
        check(&[0, 1, 2, 3], &[0, 1, 2], &[3], &[3], &[]);
        // a failed CPU (online, without events) is tried again
        check(&[0, 1, 3], &[0, 1, 2, 3], &[], &[], &[2]);
        // nothing online (cannot happen) closes everything
        check(&[0, 1], &[], &[], &[0, 1], &[]);
    }

    #[test]
    fn silent_cpus_are_those_whose_count_stood_still() {
        let before: BTreeMap<u32, u64> = [(0, 100), (1, 50), (2, 7), (3, 9)].into();
        let now: BTreeMap<u32, u64> = [(0, 199), (1, 50), (2, 7), (3, 60)].into();
        let judged = set(&[0, 1, 3]);
        let period = 10_101_010; // 99 Hz
                                 // 1 s: about 99 samples expected; CPU 1 took none (CPU 2 took none but is not judged:
                                 // offline or not attached)
        assert_eq!(
            silent(&before, &now, &judged, 1_000_000_000, period),
            set(&[1])
        );
        // too short an interval to judge
        assert!(silent(&before, &now, &judged, 19 * period, period).is_empty());
        assert_eq!(
            silent(&before, &now, &judged, 20 * period, period),
            set(&[1])
        );
        // a CPU missing from a reading is not judged
        let partial: BTreeMap<u32, u64> = [(0, 199)].into();
        assert!(silent(&before, &partial, &judged, 1_000_000_000, period).is_empty());
        assert!(silent(&before, &now, &judged, 1_000_000_000, 0).is_empty());
    }

    #[test]
    fn check_clock_marks_dead_only_cpus_online_and_attached() {
        let g = PerfGroup {
            source: "on_cpu:cpu_clock",
            progs: vec![PerfProg::new(
                "on_cpu_sample",
                PerfEventConfig::Software(aya::programs::perf_event::SoftwareEvent::CpuClock),
                1_000_000,
                BTreeMap::new(),
            )],
        };
        let mut p = PerfCpus::new(vec![g], set(&[0, 1]));
        // no links: online CPUs lack events, so a sync is pending; nothing is judged
        assert!(p.pending());
        let t0 = Instant::now();
        p.check_clock(&[(0, 5), (1, 5)].into(), t0);
        p.check_clock(
            &[(0, 5), (1, 5)].into(),
            t0 + std::time::Duration::from_secs(1),
        );
        assert!(p.dead.is_empty(), "CPUs without events are not judged");
    }
}

//! Control rounds, on their own thread: find the managed cgroups, observe them and the nodes,
//! run the pure planner, hand its moves to the writer threads, and publish scores, decisions
//! and metrics. The daemon's state is reached only through `Daemon::lock` and `Shared`'s
//! methods, as admissions reach it; the books change only through `Admission`.
//!
//! Constraints protect what others decided: a cgroup whose threads' own affinity, or whose
//! cpuset written by someone else, covers fewer nodes than the machine keeps its CPUs there —
//! we then move its memory to its CPUs, never its CPUs away from an operator's pin.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use crate::{
    cgroup::{Cgroups, Controller},
    config::Config,
    controller::{self, Observations, Outcome, Plan},
    daemon::{admission::Admission, apply::Applier, nri_updates::Runtime, Daemon, Io},
    ebpf::Sample,
    serve::metrics::{EvidenceLabel, NodeLabel, ReasonLabel},
    topology::Topology,
};

mod observe;
pub mod source;
pub mod thread;
pub mod trigger;
pub mod writer;

pub use observe::node_free_bytes;
pub use source::{CpuTimeSource, EbpfCpuTime, ProcCpuTime};
pub use writer::OwnedWriter;

/// The control loop's long-lived I/O state.
pub struct Engine {
    pub cgroups: Cgroups,
    pub cpu_source: Box<dyn CpuTimeSource>,
    proc_root: PathBuf,
    prev_stat: Option<BTreeMap<u32, crate::procfs::CpuTimes>>,
    /// The run-queue counters' window (see [`crate::ebpf::runq::RunqWindow`]).
    runq: crate::ebpf::runq::RunqWindow,
    prev: BTreeMap<String, Sample>,
    last_round: Option<Instant>,
    /// A reading of the managed cgroups' counters taken between two rounds ([`Engine::mark`]):
    /// the next round reads the part of its window after it, to see a workload whose threads
    /// moved to another node since the last window (`CgroupObs::follow_recent`).
    mark: Option<BTreeMap<String, Sample>>,
    /// Each managed cgroup's CPU time per node in the last window that said where it ran (as
    /// that round counted it): what `CgroupObs::follow_recent` compares the latest with.
    ran: BTreeMap<String, BTreeMap<u32, u64>>,
    /// Managed cgroups compared once with the part of a window before its mark
    /// (`ShiftGuard::FRESH`): that is for a fresh workload, once.
    fresh_tried: BTreeSet<String>,
    /// Rounds skipped since the last one that observed (see [`Engine::skipped_in_a_row`]).
    skipped_in_a_row: u32,
    /// Online CPUs and nodes at the last topology check (see [`Engine::refresh_topology`]).
    topo_fingerprint: Option<String>,
    /// Written-pages sampling (`controller.written_pages`): `None` until first checked, then
    /// the tracker, or the reason this kernel cannot do it.
    written: Option<Result<crate::written::WrittenPages, String>>,
    /// When a re-pin last restarted written-pages windows, and whose (`Engine::repinned`).
    written_restarted: Option<(Instant, BTreeSet<String>)>,
    /// Each workload's own run-queue wait (`controller.own_wait`): `None` until first
    /// checked, then the tracker, or the reason this kernel cannot measure it.
    own_wait: Option<Result<crate::runwait::OwnWait, String>>,
    /// Whether the thread budget of `runwait` was reported reached.
    own_wait_truncated: bool,
    /// The monotonic clock of `runwait`'s intervals starts here.
    epoch: Instant,
    /// NRI mode: moves of the runtime's containers are told to the runtime (`OwnedWriter`).
    runtime: Option<Arc<Runtime>>,
    /// The writer threads of the moves (started at the first round).
    applier: Option<Applier>,
    /// The cgroups managed at the last round.
    last_managed: Vec<String>,
    /// The cgroups the last round's walk found where cgroups are managed, with processes or
    /// not (the trigger watches their cpuset.cpus): a cgroup made empty under a configured
    /// root, then started and pinned within a period, is watched before its first process.
    last_watchable: Vec<String>,
    /// The watcher's containers whose last resize was refused, with the limits refused
    /// (`watcher::policy::resized`).
    resize_refused: BTreeMap<String, crate::placement::pod::Container>,
}

impl Engine {
    /// Moves of the runtime's containers are sent to the runtime as NRI container updates.
    pub fn with_runtime(mut self, rt: Arc<Runtime>) -> Engine {
        self.runtime = Some(rt);
        self
    }

    pub fn new(cgroups: Cgroups, cpu_source: Box<dyn CpuTimeSource>, proc_root: &Path) -> Engine {
        Engine {
            cgroups,
            cpu_source,
            proc_root: proc_root.to_path_buf(),
            prev_stat: None,
            runq: Default::default(),
            prev: BTreeMap::new(),
            last_round: None,
            mark: None,
            ran: BTreeMap::new(),
            fresh_tried: Default::default(),
            skipped_in_a_row: 0,
            topo_fingerprint: None,
            written: None,
            written_restarted: None,
            own_wait: None,
            own_wait_truncated: false,
            epoch: Instant::now(),
            runtime: None,
            applier: None,
            last_managed: Vec::new(),
            last_watchable: Vec::new(),
            resize_refused: BTreeMap::new(),
        }
    }

    /// Reads the counters of the cgroups managed at the last round, for the next round to
    /// see where each ran since (see [`Engine::mark`]'s field): the round loop takes one at the
    /// first event of a burst (the event round then sees where each workload runs since the
    /// event) and halfway through a period without one. A failed read leaves no mark.
    pub fn mark(&mut self, io: &mut Io, adm: &Admission) {
        if self.last_round.is_none()
            || self.last_managed.is_empty()
            || !self.cpu_source.sees_moves()
        {
            return;
        }
        let topo = adm.daemon.lock(io).topology().clone();
        self.mark = self
            .cpu_source
            .reread(&self.cgroups, &self.last_managed, &topo);
    }

    /// Whether a mark was taken since the last round.
    pub fn marked(&self) -> bool {
        self.mark.is_some()
    }

    /// Rounds skipped in a row (the cgroup walk or the samples' read failed): the round loop
    /// does not report itself healthy for those, so a failure that lasts makes the daemon exit
    /// and restart (health) instead of running on with nothing observed.
    pub fn skipped_in_a_row(&self) -> u32 {
        self.skipped_in_a_row
    }

    fn skipped(&mut self, d: &Daemon, reason: &str) -> usize {
        self.skipped_in_a_row += 1;
        let reason = reason.into();
        d.metrics
            .rounds_skipped
            .get_or_create(&ReasonLabel { reason })
            .inc();
        0
    }

    pub fn managed_now(&self) -> &[String] {
        &self.last_managed
    }

    /// The cpuset.cpus files of the cgroups the last round's walk found where cgroups are
    /// managed (with processes or not yet), with their cgroups.
    pub fn watch_files(&self) -> Vec<(String, PathBuf)> {
        self.last_watchable
            .iter()
            .filter_map(|cg| {
                let (dir, _) = self.cgroups.dir(Controller::Cpuset, cg).ok()?;
                Some((cg.clone(), dir.join("cpuset.cpus")))
            })
            .collect()
    }

    /// Waits for the moves still being applied (none is started after a stop) and ends the
    /// writer threads.
    pub fn finish(&mut self) {
        if let Some(a) = self.applier.take() {
            a.finish();
        }
    }

    /// Runs one round. Returns the number of moves handed to the writer threads.
    pub fn round(&mut self, io: &mut Io, adm: &Admission) -> usize {
        let d = &adm.daemon;
        let t0 = Instant::now();
        tracing::debug!("round start");
        d.rounds.round_started();
        test_hook_hold_round(io, adm);
        self.follow_books(io, adm);
        let (cfg, topo, reserved_cpus) = d.lock(io).round_inputs();
        // A hierarchy that cannot be walked is no round: observing "no cgroups" would forget
        // every cgroup's cooldown, staging and CPU-time baseline.
        let Some((managed, watchable)) = self.walk(&cfg) else {
            return self.skipped(d, "cgroup-walk");
        };
        // Watched from this round on, whatever becomes of the rest of it.
        self.last_watchable = watchable;
        // Moves of earlier rounds still migrating: their cgroups are not planned again; their
        // bytes, and those of the moves that ended within the last period, come off this
        // round's budget (a rate: event rounds get no fresh budget).
        let applier = self.applier(d);
        let (moving, _) = applier.in_flight(io);
        let budget_used = applier.budget_used(io);
        self.cpu_source
            .containers_first(&source::containers_of(&cfg, &managed));
        let Some(mut cumulative) = self.cpu_source.cumulative(&self.cgroups, &managed, &topo)
        else {
            return self.skipped(d, "sample-read");
        };
        self.skipped_in_a_row = 0;
        source::carry_forward(&mut cumulative, &self.prev, &managed);
        if let Some(why) = self.cpu_source.take_pmu_drop() {
            pmu_dropped(io, d, &why);
        }
        let observing = Instant::now();
        let mut obs = self.observe(io, d, &cfg, &topo, &managed, cumulative, &moving);
        obs.reserved_cpus = reserved_cpus;
        let observe_ms = observing.elapsed().as_millis() as u64;
        let now_ms = crate::daemon::boot_ms();
        let planning = Instant::now();
        let plan = plan(io, d, &cfg, &topo, &obs, budget_used, now_ms);
        let plan_ms = planning.elapsed().as_millis() as u64;
        // Handed to the writer threads; the round does not wait for their migrations.
        let queued = (self.applier(d))
            .submit(io, &plan.moves, now_ms, cfg.daemon.dry_run)
            .queued;
        self.last_managed = managed;
        self.publish(io, d, &plan, obs);
        d.metrics.round_duration.observe(t0.elapsed().as_secs_f64());
        // Give freed heap back to the kernel once a round: the daemon's threads (watcher,
        // checkpointer, runtime workers) each get a malloc arena, and under cgroup churn their
        // high-water marks otherwise stay resident (RSS creeping up by a few % without a leak).
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
        tracing::debug!(
            managed = self.last_managed.len(),
            moves = plan.moves.len(),
            queued,
            in_flight = moving.len(),
            source = self.cpu_source.name(),
            // Where a round's time goes (the decision latency after an event is settle +
            // the round up to its plan).
            ms = t0.elapsed().as_millis() as u64,
            observe_ms,
            plan_ms,
            "round done"
        );
        queued
    }

    /// What a round does through the admission service before it observes: follow the
    /// topology, kubelet's state files, the fences, and the watcher's resized containers.
    fn follow_books(&mut self, io: &mut Io, adm: &Admission) {
        self.follow_topology(io, adm);
        adm.refresh_kubelet(io);
        adm.refence(io);
        crate::daemon::watcher::policy::resized(io, adm, &self.cgroups, &mut self.resize_refused);
    }

    /// The moves' writer threads, started at the first round.
    fn applier(&mut self, d: &Daemon) -> &mut Applier {
        self.applier.get_or_insert_with(|| {
            let (cgroups, runtime) = (self.cgroups.clone(), self.runtime.clone());
            let writer = move || {
                Box::new(OwnedWriter {
                    cgroups: cgroups.clone(),
                    runtime: runtime.clone(),
                    walk: Default::default(),
                }) as Box<dyn controller::CgroupWriter>
            };
            Applier::new(d.clone(), Arc::new(writer))
        })
    }

    /// The round's decisions and observations published for `explain` and `top`, the books
    /// checkpointed, and the round's metrics set.
    fn publish(&mut self, io: &mut Io, d: &Daemon, plan: &Plan, obs: Observations) {
        let mut scores = Vec::new();
        let mut by_evidence: BTreeMap<&str, i64> = ["hinting-faults", "pmu", "share-model", "none"]
            .into_iter()
            .map(|e| (e, 0))
            .collect();
        for dc in &plan.decisions {
            let ev = dc.evidence.map_or("none", |e| e.as_str());
            *by_evidence.entry(ev).or_default() += 1;
            if matches!(dc.outcome, Outcome::Moved { .. }) {
                let evidence = ev.into();
                let label = EvidenceLabel { evidence };
                d.metrics.moves_by_evidence.get_or_create(&label).inc();
            }
            if let Outcome::Skipped(skip) = &dc.outcome {
                let reason = serde_json::to_value(skip)
                    .ok()
                    .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
                    .unwrap_or_else(|| "other".into());
                let label = ReasonLabel { reason };
                d.metrics.moves_skipped.get_or_create(&label).inc();
            }
            if let Some(l) = dc.smoothed.or(dc.locality) {
                scores.push((dc.cgroup.clone(), l, 1.0 - l));
            }
        }
        for (ev, n) in by_evidence {
            let label = EvidenceLabel {
                evidence: ev.into(),
            };
            d.metrics.cgroups_by_evidence.get_or_create(&label).set(n);
        }
        for (id, n) in &obs.nodes {
            let l = NodeLabel {
                node: id.to_string(),
            };
            d.metrics.node_cpu_busy.get_or_create(&l).set(n.cpu_busy);
            match n.runnable {
                Some(r) => {
                    d.metrics.node_runnable.get_or_create(&l).set(r);
                }
                None => {
                    d.metrics.node_runnable.remove(&l);
                }
            }
            (d.metrics.node_memory_free.get_or_create(&l)).set(n.free_bytes as i64);
        }
        let kube_root = {
            let mut s = d.lock(io);
            s.publish_round(&plan.decisions, obs);
            s.config().cgroups.kubernetes_root.clone()
        };
        if let Err(e) = d.checkpoint(io) {
            tracing::warn!(error = %e, "checkpoint failed");
        }
        d.metrics.set_cgroup_scores(&scores, kube_root.as_deref());
        (d.metrics.managed_cgroups).set(self.last_managed.len() as i64);
        if let Some((n, stale, deleted)) = self.cpu_source.map_entries() {
            d.metrics.ebpf_map_entries.set(n as i64);
            d.metrics.ebpf_map_stale_entries.set(stale as i64);
            d.metrics.ebpf_map_deleted_entries.inc_by(deleted as u64);
        }
    }
}

/// The round's moves: the observations folded into the controller's state, and the pure
/// planner run on a copy of it (outside the lock) within what is left of the budget.
fn plan(
    io: &mut Io,
    d: &Daemon,
    cfg: &Config,
    topo: &Topology,
    obs: &Observations,
    budget_used: u64,
    now_ms: u64,
) -> Plan {
    let (scores, ctl) = d.lock(io).observe(obs, &cfg.controller);
    let mut plan_cfg = cfg.controller.clone();
    plan_cfg.migration_budget_mib = plan_cfg
        .migration_budget_mib
        .saturating_sub(budget_used.div_ceil(1 << 20));
    controller::plan_scored(topo, obs, &scores, &ctl, &plan_cfg, now_ms)
}

/// The PMU DRAM counters were dropped (stuck or implausible, see `ebpf::pmu::PmuHealth`): the
/// source shows as unavailable with the reason in `status` and in the metrics.
fn pmu_dropped(io: &mut Io, d: &Daemon, why: &str) {
    d.metrics.pmu_dropped.inc();
    let st = crate::ebpf::SourceStatus::skipped(
        "dram_access:pmu",
        format!("dropped while running: {why}"),
    );
    report_source(io, d, st);
}

/// Reports a source probed at its first use or dropped: `status` lists it (with the reason
/// where it is absent) and /metrics says whether it is available.
pub(crate) fn report_source(io: &mut Io, d: &Daemon, st: crate::ebpf::SourceStatus) {
    let label = crate::serve::metrics::SourceLabel {
        source: st.name.clone(),
    };
    (d.metrics.ebpf_source_available.get_or_create(&label)).set(st.available as i64);
    d.lock(io).set_source(st);
}

/// Debug builds only, and only with `REBALANCER_TEST_HOOKS=1` in the environment: while
/// `<state_dir>/test-hold-round` exists (at most 30 s), a round waits right after its start
/// (logging "test hook: round held"), so the root tests can signal a daemon mid-round without
/// racing its rounds (`tests/faults_root.rs`). Release builds compile it to nothing.
fn test_hook_hold_round(io: &mut Io, adm: &Admission) {
    if !cfg!(debug_assertions) || std::env::var_os("REBALANCER_TEST_HOOKS").is_none_or(|v| v != "1")
    {
        return;
    }
    let hold = adm.daemon.lock(io).state_dir().join("test-hold-round");
    if !hold.exists() {
        return;
    }
    tracing::info!("test hook: round held");
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while hold.exists() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests;

//! One control round, with its I/O: find the managed cgroups, observe them (CPU time per node,
//! memory per node, current cpusets, constraints), observe the nodes, run the pure planner,
//! apply its moves through the real cgroup writer, and publish scores, decisions and metrics.
//!
//! CPU time per node comes from the eBPF sampler when it runs, otherwise from /proc (each
//! thread's utime+stime delta charged to the node of the CPU it last ran on).
//!
//! Constraints protect what others decided: a cgroup whose threads' own affinity, or whose
//! cpuset written by someone else, covers fewer nodes than the machine keeps its CPUs there —
//! we then move its memory to its CPUs, never its CPUs away from an operator's pin.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Instant,
};

use crate::{
    cgroup::{classify_in, CgroupError, CgroupKind, Cgroups, Controller},
    config::Config,
    controller::{
        self,
        observe::{ShiftGuard, FRESH_MAX_PERIODS, SHIFT_MIN_BEFORE_NS, SHIFT_MIN_CPU_NS},
        CgroupFile, CgroupObs, CgroupWriteError, CgroupWriter, Constraints, NodeObs, Observations,
        Outcome,
    },
    cpuset::CpuSet,
    ebpf::Sample,
    procfs,
    serve::metrics::{EvidenceLabel, NodeLabel, ReasonLabel},
    topology::{sysfs, Topology},
};

use super::{admission::Admission, Daemon};

/// Where per-node CPU time (and the kernel's migration / NUMA counters) of each cgroup come from.
pub trait CpuTimeSource: Send {
    /// Cumulative samples of the managed cgroups this read found (keys are relative cgroup
    /// paths). A cgroup left out was not read this time (its counts are not known to be 0):
    /// the round carries its previous reading forward. None: the read failed as a whole, and
    /// the round is skipped rather than seeing every cgroup idle and, next time, every count
    /// since the start as one period's.
    fn cumulative(
        &mut self,
        cgroups: &Cgroups,
        managed: &[String],
        topo: &Topology,
    ) -> Option<BTreeMap<String, Sample>>;
    /// A reading between two rounds ([`Engine::mark`]): the same counters as
    /// [`Self::cumulative`], without what only a round needs to do (the eBPF watch list
    /// follows the rounds' cgroups).
    fn reread(
        &mut self,
        cgroups: &Cgroups,
        managed: &[String],
        topo: &Topology,
    ) -> Option<BTreeMap<String, Sample>> {
        self.cumulative(cgroups, managed, topo)
    }
    fn name(&self) -> &'static str;
    /// Whether its CPU time per node is where the threads ran when they ran (the eBPF
    /// sampler), so that a change of it between windows is a move of the workload
    /// (`CgroupObs::follow_recent`). The /proc fallback charges each thread's time since the
    /// last read to the CPU it is on at the read: a workload of one or two threads the
    /// scheduler moves would read as moving from node to node.
    fn sees_moves(&self) -> bool {
        true
    }
    /// The managed cgroups that are Kubernetes containers, for the next read: the eBPF watch
    /// list takes them (and the cgroups below them) before the others.
    fn containers_first(&mut self, _containers: &[String]) {}
    /// Entries in the eBPF per-cgroup maps after the last read, how many of them belong to
    /// cgroups already gone, and how many the reads since the last call deleted (None without
    /// eBPF).
    fn map_entries(&mut self) -> Option<(usize, usize, usize)> {
        None
    }
    /// Once, the reason the PMU DRAM counters were dropped at the last read.
    fn take_pmu_drop(&mut self) -> Option<String> {
        None
    }
    /// Cumulative run-queue counters per CPU (see [`crate::ebpf::runq`]); None without them.
    fn runq(&self) -> Option<BTreeMap<u32, crate::ebpf::runq::RunqCount>> {
        None
    }
    /// CPUs went online or offline (`topo` is the rebuilt topology), or [`Self::cpus_pending`]:
    /// per-CPU sources follow (see [`crate::ebpf::Sampler::sync_cpus`]).
    fn sync_cpus(&mut self, _topo: &Topology) {}
    /// Some online CPU is not sampled yet (a failed attach to retry).
    fn cpus_pending(&self) -> bool {
        false
    }
}

/// The eBPF samplers. Their cgroup ids are cgroup v2 ids. Where the cpuset hierarchy is v2
/// they describe every managed cgroup directly. On hybrid hosts (cpuset on v1, a cgroup2 mount
/// beside it) a container runtime such as runc also creates each container's cgroup at the same
/// path in the unified hierarchy: cgroups with such a twin are read from eBPF, the others from
/// `fallback` (/proc).
pub struct EbpfCpuTime {
    pub sampler: crate::ebpf::Sampler,
    pub fallback: Option<ProcCpuTime>,
    /// Every cgroup's CPU time from /proc, the other counters from eBPF: no on-CPU program
    /// attached (both refused, or a CPU went offline during the first attach), and the maps
    /// would read 0 CPU for every workload for good.
    pub cpu_from_proc: Option<ProcCpuTime>,
    /// The managed Kubernetes containers (see [`CpuTimeSource::containers_first`]).
    pub containers: Vec<String>,
}

/// Whether the eBPF sources that attached count CPU time (`on_cpu:*`): without one, CPU time
/// must come from /proc (see [`EbpfCpuTime::cpu_from_proc`]).
pub fn ebpf_counts_cpu(statuses: &[crate::ebpf::SourceStatus]) -> bool {
    statuses
        .iter()
        .any(|s| s.available && s.name.starts_with("on_cpu:"))
}

impl EbpfCpuTime {
    /// [`CpuTimeSource::cumulative`]; `rewatch`: the programs' watch list follows `managed`
    /// first (a round's read, not a mark's).
    fn read(
        &mut self,
        cgroups: &Cgroups,
        managed: &[String],
        topo: &Topology,
        rewatch: bool,
    ) -> Option<BTreeMap<String, Sample>> {
        let mut ids = BTreeMap::new();
        let mut rest = Vec::new();
        for cg in managed {
            match cgroups.cgroup_id(cg) {
                Ok(id) => {
                    ids.insert(cg.clone(), id);
                }
                Err(_) => rest.push(cg.clone()),
            }
        }
        // The programs count the managed cgroups only, each with the cgroups below it (a
        // container's processes may live in sub-cgroups: systemd in a container, or a runtime
        // that must, under cgroup v2's no-internal-processes rule) counted under its id: no
        // other cgroup's events can fill the maps and evict theirs. A cgroup watched from now
        // has its first counts at the next read.
        if rewatch {
            let first: Vec<u64> = self
                .containers
                .iter()
                .filter_map(|cg| ids.get(cg).copied())
                .collect();
            let watch = watch_list(cgroups, &ids);
            if let Err(e) = self.sampler.watch_only(&watch, &first) {
                tracing::warn!(error = %e, "eBPF watch list not updated");
            }
        }
        let all = match self.sampler.read() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, rewatch, "reading the eBPF maps failed: this round is skipped (or, between rounds, no mark is taken)");
                return None;
            }
        };
        let mut out = BTreeMap::new();
        for (cg, id) in &ids {
            // No entry: not sampled yet (or evicted): left out, not read as 0.
            if let Some(s) = all.get(id) {
                out.insert(cg.clone(), s.clone());
            }
        }
        if let Some(proc) = &mut self.cpu_from_proc {
            // Every managed cgroup's, not only those with eBPF entries: a pinned workload
            // that never migrates or faults has none.
            let resolved: Vec<String> = ids.keys().cloned().collect();
            with_cpu_of(&mut out, proc.cumulative(cgroups, &resolved, topo)?);
        }
        if let Some(proc) = &mut self.fallback {
            out.extend(proc.cumulative(cgroups, &rest, topo)?);
        }
        Some(out)
    }
}

impl CpuTimeSource for EbpfCpuTime {
    fn cumulative(
        &mut self,
        cgroups: &Cgroups,
        managed: &[String],
        topo: &Topology,
    ) -> Option<BTreeMap<String, Sample>> {
        self.read(cgroups, managed, topo, true)
    }

    fn reread(
        &mut self,
        cgroups: &Cgroups,
        managed: &[String],
        topo: &Topology,
    ) -> Option<BTreeMap<String, Sample>> {
        self.read(cgroups, managed, topo, false)
    }

    fn containers_first(&mut self, containers: &[String]) {
        self.containers = containers.to_vec();
    }

    fn name(&self) -> &'static str {
        if self.fallback.is_some() || self.cpu_from_proc.is_some() {
            "ebpf+procfs"
        } else {
            "ebpf"
        }
    }

    fn map_entries(&mut self) -> Option<(usize, usize, usize)> {
        Some((
            self.sampler.map_entries(),
            self.sampler.stale_entries(),
            self.sampler.take_deleted_entries(),
        ))
    }

    fn sees_moves(&self) -> bool {
        // CPU time from /proc (every cgroup's, or, on hybrid hosts, some): see the trait.
        self.cpu_from_proc.is_none() && self.fallback.is_none()
    }

    fn take_pmu_drop(&mut self) -> Option<String> {
        self.sampler.take_pmu_drop()
    }

    fn runq(&self) -> Option<BTreeMap<u32, crate::ebpf::runq::RunqCount>> {
        self.sampler.runq()
    }

    fn sync_cpus(&mut self, topo: &Topology) {
        self.sampler.sync_cpus(topo);
    }

    fn cpus_pending(&self) -> bool {
        self.sampler.cpus_pending()
    }
}

/// Puts each cgroup's CPU time from `cpu` (the /proc source) into `out` (the eBPF source's
/// other counters), adding the cgroups eBPF had no entry for.
pub fn with_cpu_of(out: &mut BTreeMap<String, Sample>, cpu: BTreeMap<String, Sample>) {
    for (cg, s) in cpu {
        out.entry(cg).or_default().cpu_ns = s.cpu_ns;
    }
}

/// Cgroups below one managed cgroup the eBPF programs count under it, at most (a tenant that
/// makes more has the rest uncounted, logged): the watch list holds 16,384.
pub const WATCH_BELOW: usize = 64;

/// The eBPF watch list: each managed cgroup's id counted under itself, and the cgroups below it
/// (up to [`WATCH_BELOW`]) under it too. A cgroup below two managed ones (a pod's container
/// below a managed pod) is counted under the deepest.
pub fn watch_list(cgroups: &Cgroups, ids: &BTreeMap<String, u64>) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    // Shallowest first, so a deeper managed cgroup's own entries overwrite its ancestor's.
    let mut by_depth: Vec<(&String, &u64)> = ids.iter().collect();
    by_depth.sort_by_key(|(cg, _)| cg.matches('/').count());
    for (cg, id) in by_depth {
        match cgroups.descendant_ids(cg, WATCH_BELOW) {
            Ok((below, truncated)) => {
                if truncated {
                    tracing::warn!(cgroup = %cg, limit = WATCH_BELOW, "more cgroups below a managed cgroup than are sampled: the rest are not counted");
                }
                for b in below {
                    out.insert(b, *id);
                }
            }
            Err(e) => tracing::debug!(cgroup = %cg, error = %e, "cgroups below not listed"),
        }
    }
    for id in ids.values() {
        out.insert(*id, *id);
    }
    out
}

/// The Kubernetes containers of `managed` (the others are under configured roots, where a
/// delegated user may make any number): the eBPF watch list takes them and the cgroups below
/// them first (see `ebpf::sample::plan_watch`).
pub fn containers_of(cfg: &Config, managed: &[String]) -> Vec<String> {
    managed
        .iter()
        .filter(|p| {
            matches!(
                classify_in(
                    p,
                    cfg.cgroups.kubernetes_root.as_deref(),
                    &cfg.cgroups.roots
                ),
                CgroupKind::Container { .. }
            )
        })
        .cloned()
        .collect()
}

/// Gives each managed cgroup a read did not find its previous reading: a zero period now,
/// and the right baseline for the next (a missing cgroup read as 0 would make its next period
/// everything counted since the sampler started).
pub fn carry_forward(
    now: &mut BTreeMap<String, Sample>,
    prev: &BTreeMap<String, Sample>,
    managed: &[String],
) {
    for cg in managed {
        if !now.contains_key(cg) {
            if let Some(p) = prev.get(cg) {
                now.insert(cg.clone(), p.clone());
            }
        }
    }
}

/// /proc fallback: per-thread utime+stime charged to the node of the thread's last CPU.
pub struct ProcCpuTime {
    proc_root: PathBuf,
    ns_per_tick: u64,
    /// (cgroup, tid) → (last cumulative ticks); ns per node accumulate in `totals`.
    last: BTreeMap<(String, u32), u64>,
    totals: BTreeMap<String, Sample>,
}

impl ProcCpuTime {
    pub fn new(proc_root: &Path) -> Self {
        ProcCpuTime {
            proc_root: proc_root.to_path_buf(),
            ns_per_tick: procfs::ns_per_tick(),
            last: BTreeMap::new(),
            totals: BTreeMap::new(),
        }
    }
}

impl CpuTimeSource for ProcCpuTime {
    fn cumulative(
        &mut self,
        cgroups: &Cgroups,
        managed: &[String],
        topo: &Topology,
    ) -> Option<BTreeMap<String, Sample>> {
        let mut seen = BTreeSet::new();
        for cg in managed {
            let pids = cgroups.procs(Controller::Cpuset, cg).unwrap_or_default();
            let total = &mut self.totals.entry(cg.clone()).or_default().cpu_ns;
            for pid in pids {
                for (tid, (ticks, cpu)) in procfs::thread_cpu(&self.proc_root, pid) {
                    let key = (cg.clone(), tid);
                    let prev = self.last.insert(key.clone(), ticks);
                    seen.insert(key);
                    // A thread seen for the first time has no period to charge yet.
                    let Some(prev) = prev else { continue };
                    let ns = ticks.saturating_sub(prev).saturating_mul(self.ns_per_tick);
                    if let Some(node) = topo.node_of_cpu(cpu) {
                        *total.entry(node).or_default() += ns;
                    }
                }
            }
        }
        self.last.retain(|k, _| seen.contains(k));
        self.totals.retain(|cg, _| managed.contains(cg));
        Some(self.totals.clone())
    }

    fn name(&self) -> &'static str {
        "procfs"
    }

    fn sees_moves(&self) -> bool {
        false
    }
}

/// The moves' writer of one apply thread (`apply::Applier`), and of the one-after-the-other
/// path: cgroupfs through the validated, read-back writes of [`Cgroups`] (reads are the
/// *effective* sets), page moves resuming this thread's walk, and — in NRI mode with
/// `kubernetes.nri_runtime_updates` — every cpuset write told to the runtime once it is in
/// cgroupfs ([`super::nri_updates::Runtime::written`]). Page moves are the daemon's own in
/// both modes (the runtime is told nothing of them).
pub struct OwnedWriter {
    pub cgroups: Cgroups,
    pub runtime: Option<std::sync::Arc<super::nri_updates::Runtime>>,
    /// The page walk of this thread's move, resumed from step to step.
    pub walk: crate::pages::Walk,
}

impl OwnedWriter {
    /// The cgroupfs writer alone (watcher mode; the root tests).
    pub fn new(cgroups: Cgroups) -> OwnedWriter {
        OwnedWriter {
            cgroups,
            runtime: None,
            walk: Default::default(),
        }
    }
}

fn wrap(cgroup: &str, file: CgroupFile, e: CgroupError) -> CgroupWriteError {
    match e {
        CgroupError::Io { source, .. } => CgroupWriteError::from_io(cgroup, file, "", source),
        CgroupError::Write { source, value, .. } => {
            CgroupWriteError::from_io(cgroup, file, &value, source)
        }
        CgroupError::OutsideParent { value, .. } => CgroupWriteError::NoSpace {
            cgroup: cgroup.into(),
            file,
            value,
        },
        CgroupError::Empty { .. } => CgroupWriteError::Invalid {
            cgroup: cgroup.into(),
            file,
            value: String::new(),
        },
        other => CgroupWriteError::Io {
            cgroup: cgroup.into(),
            file,
            source: std::io::Error::other(other.to_string()),
        },
    }
}

impl CgroupWriter for OwnedWriter {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        (self.cgroups.effective_cpus(cg)).map_err(|e| wrap(cg, CgroupFile::Cpus, e))
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        (self.cgroups.effective_mems(cg)).map_err(|e| wrap(cg, CgroupFile::Mems, e))
    }
    fn write_cpus(&mut self, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
        super::writer::io_edge();
        (self.cgroups.write_cpus(cg, cpus)).map_err(|e| wrap(cg, CgroupFile::Cpus, e))?;
        if let Some(rt) = &self.runtime {
            rt.written(cg, Some(cpus), None, || None);
        }
        Ok(())
    }
    fn write_mems(&mut self, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
        super::writer::io_edge();
        (self.cgroups.write_mems(cg, mems)).map_err(|e| wrap(cg, CgroupFile::Mems, e))?;
        if let Some(rt) = &self.runtime {
            rt.written(cg, None, Some(mems), || self.read_cpus(cg).ok());
        }
        Ok(())
    }
    fn needs_memory_migrate(&self) -> bool {
        (self.cgroups.hierarchy(Controller::Cpuset))
            .is_ok_and(|(_, v)| v == crate::cgroup::Version::V1)
    }
    fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
        let (dir, _) = (self.cgroups.dir(Controller::Cpuset, cg))
            .map_err(|e| wrap(cg, CgroupFile::MemoryMigrate, e))?;
        let p = dir.join("cpuset.memory_migrate");
        std::fs::read_to_string(&p)
            .map(|s| s.trim() == "1")
            .map_err(|e| CgroupWriteError::from_io(cg, CgroupFile::MemoryMigrate, "", e))
    }
    fn set_memory_migrate(&mut self, cg: &str, on: bool) -> Result<(), CgroupWriteError> {
        (self.cgroups.set_memory_migrate(cg, on))
            .map_err(|e| wrap(cg, CgroupFile::MemoryMigrate, e))
    }
    /// A step of move_pages(2), continuing this thread's walk (see [`crate::pages::Walk`]).
    fn move_pages(
        &mut self,
        cg: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError> {
        super::writer::io_edge();
        let cgroups = &self.cgroups;
        let procs = || procs_of(cgroups, cg);
        (self.walk.step(cg, toward, max_bytes, procs, procs))
            .map_err(|e| CgroupWriteError::from_io(cg, CgroupFile::Pages, "", e))
    }
    /// migrate_pages(2) of whole processes, continuing this thread's walk
    /// ([`crate::pages::Walk::step_whole`]).
    fn migrate_pages(
        &mut self,
        cg: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError> {
        super::writer::io_edge();
        let cgroups = &self.cgroups;
        let procs = || procs_of(cgroups, cg);
        (self.walk.step_whole(cg, toward, max_bytes, procs, procs))
            .map_err(|e| CgroupWriteError::from_io(cg, CgroupFile::Pages, "", e))
    }
    fn left_behind(&self, cg: &str, toward: &CpuSet) -> Option<u64> {
        let numa = self.cgroups.numa_stat(cg).ok()?;
        Some(
            numa.anon
                .iter()
                .chain(&numa.file)
                .chain(&numa.hugetlb)
                .filter(|(n, _)| !toward.contains(**n))
                .fold(0u64, |a, (_, &b)| a.saturating_add(b)),
        )
    }
}

/// The processes of cgroup `cg` (its cpuset hierarchy), for a page walk.
fn procs_of(cgroups: &Cgroups, cg: &str) -> std::io::Result<Vec<u32>> {
    cgroups.procs(Controller::Cpuset, cg).map_err(|e| match e {
        CgroupError::Io { source, .. } => source,
        other => std::io::Error::other(other.to_string()),
    })
}

/// Reports a /proc source probed at its first use: `status` lists it (with the reason where it
/// is absent) and /metrics says whether it is available.
fn report_source(d: &Daemon, st: crate::ebpf::SourceStatus) {
    d.metrics
        .ebpf_source_available
        .get_or_create(&crate::serve::metrics::SourceLabel {
            source: st.name.clone(),
        })
        .set(st.available as i64);
    if let Ok(v) = serde_json::to_value(st) {
        d.lock().sources.push(v);
    }
}

/// The control loop's long-lived I/O state.
pub struct Engine {
    pub cgroups: Cgroups,
    pub cpu_source: Box<dyn CpuTimeSource>,
    proc_root: PathBuf,
    prev_stat: Option<BTreeMap<u32, procfs::CpuTimes>>,
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
    fresh_tried: std::collections::BTreeSet<String>,
    /// Rounds skipped since the last one that observed (see [`Engine::skipped_in_a_row`]).
    skipped_in_a_row: u32,
    /// Online CPUs and nodes at the last topology check (see [`Engine::refresh_topology`]).
    topo_fingerprint: Option<String>,
    /// Written-pages sampling (`controller.written_pages`): `None` until first checked, then
    /// the tracker, or the reason this kernel cannot do it.
    written: Option<Result<crate::written::Tracker, String>>,
    /// Each workload's own run-queue wait (`controller.own_wait`): `None` until first
    /// checked, then the tracker, or the reason this kernel cannot measure it.
    own_wait: Option<Result<crate::runwait::Tracker, String>>,
    /// Whether the thread budget of `runwait` was reported reached.
    own_wait_truncated: bool,
    /// The monotonic clock of `runwait`'s intervals starts here.
    epoch: Instant,
    /// NRI mode: moves of the runtime's containers are told to the runtime
    /// (`OwnedWriter`).
    runtime: Option<std::sync::Arc<super::nri_updates::Runtime>>,
    /// The writer threads of the moves (started at the first round).
    applier: Option<super::apply::Applier>,
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
    pub fn with_runtime(mut self, rt: std::sync::Arc<super::nri_updates::Runtime>) -> Engine {
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
    pub fn mark(&mut self, adm: &Admission) {
        if self.last_round.is_none()
            || self.last_managed.is_empty()
            || !self.cpu_source.sees_moves()
        {
            return;
        }
        let topo = adm.daemon.lock().topo.clone();
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

    fn skipped(&mut self, d: &Daemon, reason: &str) {
        self.skipped_in_a_row += 1;
        d.metrics
            .rounds_skipped
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
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
                self.cgroups
                    .dir(Controller::Cpuset, cg)
                    .ok()
                    .map(|(dir, _)| (cg.clone(), dir.join("cpuset.cpus")))
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

    /// The clock of the controller's times (last move, cooldown): milliseconds of
    /// CLOCK_BOOTTIME, which keeps counting across daemon restarts (and suspend), so times
    /// restored from the checkpoint mean what they meant (see [`super::boot_ms`]).
    pub fn now_ms(&self) -> u64 {
        super::boot_ms()
    }

    /// Each of `managed`'s own wait on the run queues since the last round (`crate::runwait`)
    /// when `controller.own_wait` is on and this kernel keeps run delays; the first call probes
    /// and reports the source in `status` (with the reason, when it is absent).
    fn own_waits(
        &mut self,
        d: &Daemon,
        on: bool,
        managed: &[String],
    ) -> BTreeMap<String, crate::runwait::Measured> {
        if !on {
            // Turned off by a reload: the baselines would span the rounds it was off.
            if let Some(Ok(t)) = &mut self.own_wait {
                *t = Default::default();
            }
            return BTreeMap::new();
        }
        if self.own_wait.is_none() {
            const NAME: &str = "own_wait:schedstat";
            let probed = crate::runwait::probe(&self.proc_root);
            let st = match &probed {
                Ok(()) => crate::ebpf::SourceStatus::ok(
                    NAME,
                    "each workload's threads' run_delay (/proc/<tid>/schedstat), per round",
                ),
                Err(why) => {
                    tracing::warn!(reason = %why, "controller.own_wait is on but this kernel keeps no run delays; a workload's demand on a crowded node is estimated from its node's queue and no move passes overload_busy");
                    crate::ebpf::SourceStatus::skipped(NAME, why.clone())
                }
            };
            report_source(d, st);
            self.own_wait = Some(probed.map(|()| Default::default()));
        }
        let Some(Ok(t)) = &mut self.own_wait else {
            return BTreeMap::new();
        };
        let mut src = crate::runwait::Live {
            cgroups: &self.cgroups,
            proc_root: &self.proc_root,
        };
        let now_ns = self.epoch.elapsed().as_nanos() as u64;
        let out = t.sample(managed, &mut src, crate::runwait::MAX_THREADS, now_ns);
        if t.truncated && !self.own_wait_truncated {
            tracing::warn!(
                max_threads = crate::runwait::MAX_THREADS,
                "the managed cgroups hold more threads than one round reads for their own wait; those past it are estimated from their node's queue"
            );
        }
        self.own_wait_truncated = t.truncated;
        out
    }

    /// The written-pages tracker when `controller.written_pages` is on and this kernel tracks
    /// soft-dirty bits; the first call probes and reports the source in `status` (loudly, with
    /// the reason, when it is absent).
    fn written_tracker(&mut self, d: &Daemon, on: bool) -> Option<&mut crate::written::Tracker> {
        if !on {
            return None;
        }
        if self.written.is_none() {
            const NAME: &str = "written_pages:soft_dirty";
            let probed = crate::written::probe(&self.proc_root);
            let st = match &probed {
                Ok(()) => {
                    tracing::info!("written-pages sampling on: locality weighted by the pages each workload writes (soft-dirty bits)");
                    crate::ebpf::SourceStatus::ok(
                        NAME,
                        "soft-dirty bits via clear_refs + pagemap, nodes via move_pages",
                    )
                }
                Err(why) => {
                    tracing::warn!(reason = %why, "controller.written_pages is on but this kernel cannot track written pages; locality falls back to the other evidence");
                    crate::ebpf::SourceStatus::skipped(NAME, why.clone())
                }
            };
            report_source(d, st);
            self.written = Some(probed.map(|()| crate::written::Tracker::default()));
        }
        self.written.as_mut().and_then(|w| w.as_mut().ok())
    }

    /// Managed cgroups: Kubernetes containers (when enabled) and cgroups with processes at or
    /// below a configured root, sorted. Paths are relative, without a leading '/'.
    pub fn managed(&self, cfg: &Config) -> Option<Vec<String>> {
        self.walk(cfg).map(|(managed, _)| managed)
    }

    /// The managed cgroups (see [`Engine::managed`]) and every cgroup that would be one with
    /// processes in it (a configured root's empty cgroups).
    fn walk(&self, cfg: &Config) -> Option<(Vec<String>, Vec<String>)> {
        // Only under kubelet's root and the configured roots: the rest of the hierarchy (users'
        // delegated subtrees, any number of cgroups) is never managed, so never walked.
        let mut roots = Vec::new();
        if cfg.cgroups.kubernetes {
            roots = crate::cgroup::kube::kubernetes_roots(cfg.cgroups.kubernetes_root.as_deref());
        }
        roots.extend(cfg.cgroups.roots.iter().cloned());
        let all = match self.cgroups.walk_roots(Controller::Cpuset, &roots) {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "cannot walk the cpuset hierarchy: this round is skipped");
                return None;
            }
        };
        let mut managed = Vec::new();
        let mut watchable = Vec::new();
        for p in all {
            let p = p.trim_start_matches('/').to_string();
            let kind = classify_in(
                &p,
                cfg.cgroups.kubernetes_root.as_deref(),
                &cfg.cgroups.roots,
            );
            let populated = match kind {
                CgroupKind::Container { .. } if cfg.cgroups.kubernetes => true,
                CgroupKind::Configured { .. } => (self.cgroups)
                    .procs(Controller::Cpuset, &p)
                    .is_ok_and(|v| !v.is_empty()),
                _ => continue,
            };
            if populated {
                managed.push(p.clone());
            }
            watchable.push(p);
        }
        Some((managed, watchable))
    }

    fn node_obs(&mut self, cfg: &Config, topo: &Topology) -> BTreeMap<u32, NodeObs> {
        let stat = procfs::read_stat(&self.proc_root).ok();
        let busy = match (&self.prev_stat, &stat) {
            (Some(a), Some(b)) => procfs::busy_between(a, b),
            _ => BTreeMap::new(),
        };
        self.prev_stat = stat;
        let node_busy = |n: &crate::topology::Node| {
            let cpus: Vec<f64> = n
                .cpus
                .iter()
                .filter_map(|c| busy.get(&c).copied())
                .collect();
            if cpus.is_empty() {
                0.0
            } else {
                cpus.iter().sum::<f64>() / cpus.len() as f64
            }
        };
        let busy_by_node: BTreeMap<u32, f64> =
            topo.nodes.iter().map(|n| (n.id, node_busy(n))).collect();
        // Run queues over the window since the last round that measured them (nodes without
        // enough readings: None, and the planner takes the busy share).
        let runq_now = self.cpu_source.runq().unwrap_or_default();
        let cpu_node = topo.cpu_node_map();
        let runnable = self.runq.update(runq_now, &cpu_node, &busy_by_node);
        let node_dir = cfg.daemon.sysfs_root.join("devices/system/node");
        topo.nodes
            .iter()
            .map(|n| {
                let cpu_busy = busy_by_node.get(&n.id).copied().unwrap_or(0.0);
                let free = node_free_bytes(&node_dir, n.id).unwrap_or(n.memory_free_bytes);
                let free_hp: u64 = n
                    .hugepages
                    .iter()
                    .map(|(size, hp)| {
                        hp.free * size.trim_end_matches("kB").parse::<u64>().unwrap_or(0) * 1024
                    })
                    .sum();
                (
                    n.id,
                    NodeObs {
                        cpu_busy,
                        free_bytes: free,
                        free_hugepage_bytes: free_hp,
                        runnable: runnable.get(&n.id).copied(),
                    },
                )
            })
            .collect()
    }

    /// Constraints of one cgroup: admission's promises for bound containers, and the operator's
    /// pins (task affinity, or a cpuset we did not write) for everything else. Takes the
    /// shared lock only for the binding lookup (the /proc reads run without it, so the watcher
    /// is never held up by a round).
    fn constraints(&self, d: &Daemon, topo: &Topology, cg: &str, eff_cpus: &CpuSet) -> Constraints {
        if let Some(c) = bound_constraints(&d.lock(), cg) {
            return c;
        }
        let mut c = Constraints {
            keep_cpus: true,
            ..Default::default()
        };
        // Not ours: the threads' own affinity and the cgroup's cpuset are the operator's choice.
        let mut allowed = CpuSet::new();
        for pid in self
            .cgroups
            .procs(Controller::Cpuset, cg)
            .unwrap_or_default()
        {
            if let Some((aff, _)) = procfs::task_placement(&self.proc_root, pid) {
                allowed = allowed.union(&aff);
            }
        }
        let pinned_cpus = if allowed.is_empty() {
            eff_cpus.clone()
        } else {
            allowed.intersection(eff_cpus)
        };
        let nodes: CpuSet = pinned_cpus
            .iter()
            .filter_map(|cpu| topo.node_of_cpu(cpu))
            .collect();
        let all_nodes: CpuSet = topo
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.id)
            .collect();
        if !nodes.is_empty() && nodes != all_nodes {
            c.allowed_nodes = Some(nodes);
        }
        c
    }

    /// Rebuilds the topology when CPUs or nodes went online or offline since the last check
    /// (a node taken offline, CPU hotplug): `cpu/online` and `node/online` are compared each
    /// round, and on a change the whole sysfs tree is read again and replaces the shared
    /// topology, so the planner only targets CPUs and nodes that exist. Returns true when the
    /// topology was rebuilt (the round then has the CPU-time source follow it: the eBPF
    /// sampler's per-CPU perf events and `CPU_NODE`). A tree that cannot be read keeps the old
    /// topology (and is tried again next round).
    pub fn refresh_topology(&mut self, adm: &Admission) -> bool {
        let d = &adm.daemon;
        let root = d.lock().cfg.daemon.sysfs_root.clone();
        let now = topology_fingerprint(&root);
        let Some(before) = self.topo_fingerprint.replace(now.clone()) else {
            return false;
        };
        if before == now {
            return false;
        }
        let topo = match sysfs::read(&root) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "CPUs or nodes changed but the topology cannot be read again; keeping the old one");
                self.topo_fingerprint = Some(before);
                return false;
            }
        };
        {
            let mut s = d.lock();
            let online = topo.online_cpus();
            tracing::warn!(
                nodes_before = s.topo.nodes.len(),
                nodes = topo.nodes.len(),
                cpus_before = %s.topo.online_cpus(),
                cpus = %online,
                "CPUs or NUMA nodes went online/offline; topology rebuilt"
            );
            s.topo = topo;
        }
        adm.replace_offline();
        true
    }

    /// A round's topology check: [`Self::refresh_topology`], then, when the topology was
    /// rebuilt or the CPU-time source still misses some online CPU, the source follows the
    /// current topology (the eBPF sampler opens and closes per-CPU perf events: syscalls, made
    /// with no lock held). Returns whether the topology was rebuilt.
    pub fn follow_topology(&mut self, adm: &Admission) -> bool {
        let changed = self.refresh_topology(adm);
        if changed || self.cpu_source.cpus_pending() {
            let topo = adm.daemon.lock().topo.clone();
            self.cpu_source.sync_cpus(&topo);
        }
        changed
    }

    /// Runs one round. Returns the number of moves handed to the writer threads.
    pub fn round(&mut self, adm: &Admission) -> usize {
        let d = &adm.daemon;
        let t0 = Instant::now();
        tracing::debug!("round start");
        test_hook_hold_round(adm);
        self.follow_topology(adm);
        adm.refresh_kubelet();
        adm.refence();
        super::watcher::policy::resized(adm, &self.cgroups, &mut self.resize_refused);
        let (cfg, topo, reserved_cpus) = {
            let s = d.lock();
            (
                s.cfg.clone(),
                s.topo.clone(),
                s.state.allocator.reserved_cpus.clone(),
            )
        };
        // A hierarchy that cannot be walked is no round: observing "no cgroups" would forget
        // every cgroup's cooldown, staging and CPU-time baseline.
        let Some((managed, watchable)) = self.walk(&cfg) else {
            self.skipped(d, "cgroup-walk");
            return 0;
        };
        // Watched from this round on, whatever becomes of the rest of it.
        self.last_watchable = watchable;
        let applier = self.applier.get_or_insert_with(|| {
            let (cgroups, runtime) = (self.cgroups.clone(), self.runtime.clone());
            super::apply::Applier::new(
                d.clone(),
                std::sync::Arc::new(move || {
                    Box::new(OwnedWriter {
                        cgroups: cgroups.clone(),
                        runtime: runtime.clone(),
                        walk: Default::default(),
                    })
                }),
            )
        });
        // Moves of earlier rounds still migrating: their cgroups are not planned again; their
        // bytes, and those of the moves that ended within the last period, come off this
        // round's budget (a rate: event rounds get no fresh budget).
        let (moving, _) = applier.in_flight();
        let budget_used = applier.budget_used();
        self.cpu_source
            .containers_first(&containers_of(&cfg, &managed));
        let Some(mut cumulative) = self.cpu_source.cumulative(&self.cgroups, &managed, &topo)
        else {
            self.skipped(d, "sample-read");
            return 0;
        };
        self.skipped_in_a_row = 0;
        carry_forward(&mut cumulative, &self.prev, &managed);
        if let Some(why) = self.cpu_source.take_pmu_drop() {
            pmu_dropped(d, &why);
        }
        let period_ns = self
            .last_round
            .map_or(cfg.controller.period_ms * 1_000_000, |t| {
                t.elapsed().as_nanos() as u64
            });
        self.last_round = Some(Instant::now());
        let nodes = self.node_obs(&cfg, &topo);
        let waits = self.own_waits(d, cfg.controller.own_wait, &managed);
        // Taken for this round's window only (a failed read above leaves it for the next).
        let mark = self.mark.take();
        let mark = mark.as_ref();
        let sees_moves = self.cpu_source.sees_moves();
        let mut ran = BTreeMap::new();
        // The managed cgroups compared with the part of a window before its mark so far.
        let mut fresh_tried: std::collections::BTreeSet<String> = managed
            .iter()
            .filter(|cg| self.fresh_tried.contains(*cg))
            .cloned()
            .collect();

        let mut obs = Observations {
            period_ns,
            cgroups: Vec::new(),
            nodes,
            // The allocator's: the reservations in force (see `admission::reconfigure`).
            reserved_cpus,
        };
        // Probed (and reported in `status`) at the first round, whether or not a cgroup needs it.
        let _ = self.written_tracker(d, cfg.controller.written_pages);
        {
            for cg in &managed {
                let (Ok(cpus), Ok(mems)) = (
                    self.cgroups.effective_cpus(cg),
                    self.cgroups.effective_mems(cg),
                ) else {
                    continue;
                };
                let numa = self.cgroups.numa_stat(cg).unwrap_or_default();
                let now = cumulative.get(cg).cloned().unwrap_or_default();
                let prev = self.prev.get(cg);
                let delta = now.delta(prev.unwrap_or(&Sample::default()));
                let cpu_ns_per_node = delta
                    .cpu_ns
                    .iter()
                    .filter(|(_, v)| **v > 0)
                    .map(|(n, v)| (*n, *v))
                    .collect();
                d.metrics
                    .cross_node_migrations
                    .inc_by(delta.cross_node_migrations);
                d.metrics.numa_balancing_moves.inc_by(delta.numa_moves);
                let mut mem = numa.anon.clone();
                for (n, b) in &numa.file {
                    *mem.entry(*n).or_default() += b;
                }
                let mut constraints = self.constraints(d, &topo, cg, &cpus);
                constraints.moving = moving.contains(cg);
                let mut o = CgroupObs {
                    id: cg.clone(),
                    cpu_ns_per_node,
                    mem_bytes_per_node: mem,
                    hugepage_bytes_per_node: numa.hugetlb.clone(),
                    cross_node_migrations: delta.cross_node_migrations,
                    numa_moves: delta.numa_moves,
                    cpus,
                    mems,
                    constraints,
                    ..Default::default()
                };
                delta.access().fill(&mut o);
                // Threads that moved themselves to another node since the last window: the
                // window's CPU time is counted where they run now (before the projection
                // below, which keeps it within the cpuset). Where they run now: since the
                // mark, where one was taken and saw enough of it, else the whole window.
                let at_mark = mark.and_then(|m| m.get(cg));
                let since_mark = at_mark
                    .map(|m| now.delta(m).cpu_ns)
                    .filter(|r| r.values().sum::<u64>() >= SHIFT_MIN_CPU_NS);
                let recent = since_mark.as_ref().unwrap_or(&o.cpu_ns_per_node).clone();
                // Compared with its last window that said where it ran; a workload with none
                // (managed at the last round but idle until now: a fresh task that moved
                // itself right after touching its memory) with the part of this window
                // before the mark, and since the mark (not the whole window, which holds
                // that part), with the tests for a fresh workload (`ShiftGuard::FRESH`). Not
                // in the round after a shift (its entry is then empty, see below).
                // Once per cgroup (a light workload that never has a reference window is
                // not tested every round), and only while its score is young (not a history
                // restored at a restart).
                let prev_or_zero = prev.cloned().unwrap_or_default();
                let grew = |a: &Sample, b: &Sample| {
                    a.cpu_ns
                        .iter()
                        .all(|(n, &v)| b.cpu_ns.get(n).copied().unwrap_or(0) >= v)
                };
                let earlier = at_mark
                    .filter(|_| !self.ran.contains_key(cg) && !self.fresh_tried.contains(cg))
                    // Counters that went back (the cgroup re-created at its path since the
                    // last round or the mark) say nothing of where it ran.
                    .filter(|m| grew(&prev_or_zero, m) && grew(m, &now))
                    .filter(|_| {
                        d.lock()
                            .state
                            .controller
                            .cgroups
                            .get(cg)
                            .is_none_or(|s| s.periods < FRESH_MAX_PERIODS)
                    })
                    .map(|m| m.delta(&prev_or_zero).cpu_ns);
                let (before, guard) = match self.ran.get(cg) {
                    Some(r) => (Some(r), ShiftGuard::REFERENCE),
                    None => (
                        earlier.as_ref().filter(|_| since_mark.is_some()),
                        ShiftGuard::FRESH,
                    ),
                };
                if guard == ShiftGuard::FRESH && before.is_some() && sees_moves {
                    fresh_tried.insert(cg.clone());
                }
                if let Some(before) = before.filter(|_| sees_moves) {
                    if o.follow(before, &recent, guard) {
                        tracing::debug!(cgroup = %cg, ?before, ?recent, "its threads moved to another node: its score restarts where they run now");
                    } else {
                        tracing::trace!(cgroup = %cg, ?before, ?recent, "CPU time in the last window and now");
                    }
                } else if sees_moves {
                    tracing::trace!(cgroup = %cg, ?recent, marked = at_mark.is_some(), "CPU time now; no last window to compare with");
                }
                // Where its threads may run now (the nodes of its cpuset, which bounds every
                // thread): CPU time spent elsewhere this period predates a re-pin or a move
                // and is counted there. Not the threads' affinity (read from each process's
                // main thread only, it would move its workers' time too) nor admission's
                // allowed nodes (where it may be placed, not where it runs).
                let runnable: CpuSet = o
                    .cpus
                    .iter()
                    .filter_map(|cpu| topo.node_of_cpu(cpu))
                    .collect();
                o.project_cpu_to(&runnable);
                // Where it ran, for the next round: a window with enough of its time;
                // otherwise the last one still says it. Empty after a shift: that window is
                // partly the placement it left (or, for a workload whose last window merely
                // looked settled, a few samples), and a shift is not followed by another at
                // once (a workload flipping its threads' affinity restarts its score at most
                // every other round).
                let kept = if o.shifted {
                    Some(BTreeMap::new())
                } else if o.total_cpu_ns() >= SHIFT_MIN_BEFORE_NS {
                    Some(o.cpu_ns_per_node.clone())
                } else {
                    // An empty entry (the shift's) holds for one round only.
                    self.ran.remove(cg).filter(|r| !r.is_empty())
                };
                if let Some(r) = kept {
                    ran.insert(cg.clone(), r);
                }
                if let Some(wait) = waits
                    .get(cg)
                    .and_then(|m| crate::runwait::wait_for_period(m, o.total_cpu_ns(), period_ns))
                {
                    o.wait_ns_per_node = crate::runwait::split(wait, &o.cpu_ns_per_node, &runnable);
                }
                // Only where its memory is on two nodes or more: on one node its written
                // pages are where its resident ones are, and weighting by them changes nothing.
                let mem_nodes = o.mem_bytes_per_node.values().filter(|&&b| b > 0).count();
                if cfg.controller.written_pages && mem_nodes >= 2 {
                    let proc_root = self.proc_root.clone();
                    let pids = self
                        .cgroups
                        .procs(Controller::Cpuset, cg)
                        .unwrap_or_default();
                    if let Some(t) = self.written_tracker(d, true) {
                        o.written_bytes_per_node = t.sample(&proc_root, &pids).unwrap_or_default();
                    }
                }
                obs.cgroups.push(o);
            }
        }
        self.prev = cumulative;
        self.ran = ran;
        self.fresh_tried = fresh_tried;
        if let Some(Ok(t)) = &mut self.written {
            if t.skipped > 0 {
                tracing::debug!(
                    processes = t.skipped,
                    budget_pages = t.budget,
                    "written pages: the period's pagemap budget ran out; the processes past it keep the share model"
                );
            }
            t.end_round();
        }
        // Memory the Memory Manager promised Guaranteed containers and they have not touched
        // yet is free to the kernel but not to moves: the planner sees it as taken.
        {
            let s = d.lock();
            for (node, bytes) in promised_unused(&s, &obs) {
                if let Some(n) = obs.nodes.get_mut(&node) {
                    n.free_bytes = n.free_bytes.saturating_sub(bytes);
                }
            }
        }

        let now_ms = self.now_ms();
        // The planner runs on a copy of the controller's state, outside the lock.
        let (scores, ctl) = {
            let mut s = d.lock();
            let scores = s.observe(&obs, &cfg.controller);
            (scores, s.state.controller.clone())
        };
        let mut plan_cfg = cfg.controller.clone();
        plan_cfg.migration_budget_mib = plan_cfg
            .migration_budget_mib
            .saturating_sub(budget_used.div_ceil(1 << 20));
        let plan = controller::plan_scored(&topo, &obs, &scores, &ctl, &plan_cfg, now_ms);

        // Handed to the writer threads; the round does not wait for their migrations.
        let queued = match &mut self.applier {
            Some(a) => a.submit(&plan.moves, now_ms, cfg.daemon.dry_run).queued,
            None => 0,
        };
        self.last_managed = managed.clone();

        // Publish.
        let mut scores = Vec::new();
        {
            let mut s = d.lock();
            s.decisions = plan
                .decisions
                .iter()
                .map(|dc| (dc.cgroup.clone(), dc.clone()))
                .collect();
            let mut by_evidence: BTreeMap<&str, i64> =
                ["hinting-faults", "pmu", "share-model", "none"]
                    .into_iter()
                    .map(|e| (e, 0))
                    .collect();
            for dc in &plan.decisions {
                let ev = dc.evidence.map_or("none", |e| e.as_str());
                *by_evidence.entry(ev).or_default() += 1;
                if matches!(dc.outcome, Outcome::Moved { .. }) {
                    d.metrics
                        .moves_by_evidence
                        .get_or_create(&EvidenceLabel {
                            evidence: ev.into(),
                        })
                        .inc();
                }
                if let Outcome::Skipped(skip) = &dc.outcome {
                    let reason = serde_json::to_value(skip)
                        .ok()
                        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
                        .unwrap_or_else(|| "other".into());
                    d.metrics
                        .moves_skipped
                        .get_or_create(&ReasonLabel { reason })
                        .inc();
                }
                if let Some(l) = dc.smoothed.or(dc.locality) {
                    scores.push((dc.cgroup.clone(), l, 1.0 - l));
                }
            }
            s.last_obs = Some(obs.clone());
            for (ev, n) in by_evidence {
                d.metrics
                    .cgroups_by_evidence
                    .get_or_create(&EvidenceLabel {
                        evidence: ev.into(),
                    })
                    .set(n);
            }
        }
        if let Err(e) = d.checkpoint() {
            tracing::warn!(error = %e, "checkpoint failed");
        }
        let kube_root = d.lock().cfg.cgroups.kubernetes_root.clone();
        d.metrics.set_cgroup_scores(&scores, kube_root.as_deref());
        d.metrics.managed_cgroups.set(managed.len() as i64);
        if let Some((n, stale, deleted)) = self.cpu_source.map_entries() {
            d.metrics.ebpf_map_entries.set(n as i64);
            d.metrics.ebpf_map_stale_entries.set(stale as i64);
            d.metrics.ebpf_map_deleted_entries.inc_by(deleted as u64);
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
            d.metrics
                .node_memory_free
                .get_or_create(&l)
                .set(n.free_bytes as i64);
        }
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
            managed = managed.len(),
            moves = plan.moves.len(),
            queued,
            in_flight = moving.len(),
            source = self.cpu_source.name(),
            "round done"
        );
        queued
    }
}

/// The PMU DRAM counters were dropped (stuck or implausible, see `ebpf::pmu::Health`): the
/// source shows as unavailable with the reason in `status` and in the metrics.
fn pmu_dropped(d: &Daemon, why: &str) {
    const NAME: &str = "dram_access:pmu";
    d.metrics.pmu_dropped.inc();
    d.metrics
        .ebpf_source_available
        .get_or_create(&crate::serve::metrics::SourceLabel {
            source: NAME.into(),
        })
        .set(0);
    let st = crate::ebpf::SourceStatus::skipped(NAME, format!("dropped while running: {why}"));
    let mut s = d.lock();
    s.sources
        .retain(|v| v.get("name").and_then(|n| n.as_str()) != Some(NAME));
    if let Ok(v) = serde_json::to_value(st) {
        s.sources.push(v);
    }
}

/// `cpu/online` and `node/online` under a sysfs root: what changes when CPUs or nodes go
/// online or offline.
fn topology_fingerprint(root: &Path) -> String {
    ["devices/system/cpu/online", "devices/system/node/online"]
        .iter()
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("|")
}

/// Per node, the Memory Manager memory admitted Guaranteed containers were promised there and
/// do not use (yet): their blocks' `taken` bytes minus what the round observed in their cgroups
/// on that node (a container not observed counts as using none).
pub(crate) fn promised_unused(s: &super::Shared, obs: &Observations) -> BTreeMap<u32, u64> {
    let used: BTreeMap<&str, &BTreeMap<u32, u64>> = obs
        .cgroups
        .iter()
        .map(|c| (c.id.as_str(), &c.mem_bytes_per_node))
        .collect();
    let mut out = BTreeMap::new();
    for cg in s.state.bindings.keys() {
        let Some(mem) = super::admission::bound_container(s, cg).and_then(|c| c.memory.as_ref())
        else {
            continue;
        };
        let mut promised: BTreeMap<u32, u64> = BTreeMap::new();
        for &(node, r, t) in &mem.taken {
            if r == crate::placement::memory::MemoryResource::Memory {
                *promised.entry(node).or_default() += t;
            }
        }
        for (node, p) in promised {
            let u = used
                .get(cg.as_str())
                .and_then(|m| m.get(&node))
                .copied()
                .unwrap_or(0);
            *out.entry(node).or_default() += p.saturating_sub(u);
        }
    }
    out
}

/// Constraints of a cgroup bound to an admitted container (None when not bound).
pub(crate) fn bound_constraints(s: &super::Shared, cg: &str) -> Option<Constraints> {
    if super::kubelet::pinned(s, cg) || super::annotations::pinned(s, cg) {
        // kubelet's static managers placed it, or its pod asks not to be moved: never moved
        return Some(Constraints {
            pinned: true,
            ..Default::default()
        });
    }
    let b = s.state.bindings.get(cg)?;
    let mut c = Constraints::default();
    if let Some(pod) = s.state.allocator.pods.get(&b.pod_uid) {
        if let Some(ac) = pod
            .containers
            .iter()
            .find(|c| c.placement.container == b.container)
        {
            c.exclusive = ac.placement.exclusive;
            c.exclusive_cpus = if c.exclusive {
                ac.placement.cpus.len() as u32
            } else {
                0
            };
            c.needs_hugepages = ac.memory.is_some();
            use crate::config::TopologyPolicy::*;
            match s.cfg.placement.policy {
                SingleNumaNode => c.single_numa_node = true,
                Restricted => c.allowed_nodes = ac.placement.affinity.map(|m| m.to_cpuset()),
                _ => {}
            }
            if !ac.placement.devices.is_empty() {
                c.allowed_nodes = ac.placement.affinity.map(|m| m.to_cpuset());
            }
            // Memory Manager memory stays in its group (the nodes it was booked on).
            if let Some(mem) = &ac.memory {
                let group = mem.nodes.to_cpuset();
                c.allowed_nodes = Some(match c.allowed_nodes.take() {
                    Some(a) => a.intersection(&group),
                    Option::None => group,
                });
            }
        }
    }
    Some(c)
}

/// MemFree of a node now, in bytes (node meminfo is in kB).
pub fn node_free_bytes(node_dir: &Path, node: u32) -> Option<u64> {
    let p = node_dir.join(format!("node{node}/meminfo"));
    let text = std::fs::read_to_string(&p).ok()?;
    sysfs::parse_meminfo(&p, &text)
        .ok()
        .map(|(_, free_kb)| free_kb.saturating_mul(1024))
}

/// Debug builds only, and only with `REBALANCER_TEST_HOOKS=1` in the environment: while
/// `<state_dir>/test-hold-round` exists (at most 30 s), a round waits right after its start
/// (logging "test hook: round held"), so the root tests can signal a daemon mid-round without
/// racing its rounds (`tests/faults_root.rs`). Release builds compile it to nothing.
fn test_hook_hold_round(adm: &Admission) {
    if !cfg!(debug_assertions) || std::env::var_os("REBALANCER_TEST_HOOKS").is_none_or(|v| v != "1")
    {
        return;
    }
    let hold = adm
        .daemon
        .lock()
        .cfg
        .daemon
        .state_dir
        .join("test-hold-round");
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
mod tests {
    use super::*;

    /// Regression: node free memory was taken in kB as if it were bytes, so every target looked
    /// full ("no-memory", free 452784 for 442 MiB) and the controller never moved memory.
    #[test]
    fn node_free_memory_is_in_bytes_like_the_topology() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/epyc-nps4");
        let topo = sysfs::read(&root).unwrap();
        let node_dir = root.join("devices/system/node");
        for n in &topo.nodes {
            assert_eq!(
                node_free_bytes(&node_dir, n.id),
                Some(n.memory_free_bytes),
                "node {}",
                n.id
            );
        }
        assert!(topo.nodes[0].memory_free_bytes > 1 << 30);
    }
}

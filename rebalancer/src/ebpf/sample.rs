//! [`Sampler`]: owns the loaded programs; each [`Sampler::read`] folds the maps into a
//! cumulative [`Sample`] per cgroup id, maps ids to cgroup v2 paths (id = inode of the cgroup's
//! directory), deletes map entries of cgroups that no longer exist, and takes the hypervisor's
//! steal time out of on-CPU time (`steal`). The folding is pure ([`fold`]) and unit-tested.
use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::AsFd,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, PerCpuValues},
    Ebpf,
};
use rebalancer_common::{CgEvents, CgNodeKey, CgReasonKey, Stat, SwitchState};

use super::{
    loader,
    monotone::{IdSet, MonotoneMaps},
    perfcpu::{PerfCpus, SyncReport},
    pmu::{self, EventPair},
    probe,
    steal::{CpuReading, OnCpuClock, StealCorrection},
    EbpfError, Sample, SourceStatus,
};
use crate::{config::EbpfConfig, procfs, topology::Topology};

/// Kernel accounting of one program (needs `kernel.bpf_stats_enabled`, see
/// [`Sampler::enable_kernel_stats`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProgStat {
    pub name: String,
    pub run_time_ns: u64,
    pub run_count: u64,
}

/// Map contents (`pending` is per CPU by nature; the per-cgroup maps are shared).
#[derive(Clone, Debug, Default)]
pub struct RawMaps {
    pub cpu_time: Vec<(CgNodeKey, u64)>,
    /// (cpu, state) of exact mode: time not yet flushed into `cpu_time`.
    pub pending: Vec<(u32, SwitchState)>,
    pub events: Vec<(CgNodeKey, CgEvents)>,
    pub reasons: Vec<(CgReasonKey, u64)>,
    /// Every hash map was read by batches (bucket by bucket): a key a read did not find was not
    /// in the map. Entry by entry, a walk can skip keys when an entry it stands on is evicted.
    pub exhaustive: bool,
}

/// Saturating sum of per-CPU counters.
pub fn sum_u64(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0, u64::saturating_add)
}

/// Folds map contents into one cumulative sample per cgroup id. `cpu_node` maps a CPU to its
/// node (for pending exact-mode time); the DRAM events in the maps count PMU samples, scaled
/// per cgroup by each side's period (`pmu::scale`; `local_includes_remote` for an event pair
/// whose local event counts every DRAM read); `Sample::pmu` is left false (the sampler sets
/// it); reasons without a name are called `reason<N>`.
///
/// The entries are sorted by cgroup id (the maps return them in hash order) and walked once:
/// each sample is built whole and the map is built from sorted pairs in one go, instead of a
/// search of the map per entry (tens of thousands a read). Sums saturate, so their order does
/// not matter.
pub fn fold(
    raw: &RawMaps,
    cpu_node: impl Fn(u32) -> Option<u32>,
    reason_names: &BTreeMap<u32, String>,
    local_includes_remote: bool,
) -> BTreeMap<u64, Sample> {
    let mut cpu: Vec<(u64, u32, u64)> = Vec::with_capacity(raw.cpu_time.len() + raw.pending.len());
    cpu.extend(
        raw.cpu_time
            .iter()
            .map(|(k, ns)| (k.cgroup_id, k.node, *ns)),
    );
    cpu.extend(
        raw.pending
            .iter()
            .filter(|(_, st)| st.pending_ns != 0 && st.cgroup_id != 0)
            .map(|(c, st)| (st.cgroup_id, cpu_node(*c).unwrap_or(0), st.pending_ns)),
    );
    cpu.sort_unstable_by_key(|&(cg, node, _)| (cg, node));
    let mut events: Vec<(u64, &CgEvents)> =
        raw.events.iter().map(|(k, e)| (k.cgroup_id, e)).collect();
    events.sort_unstable_by_key(|&(cg, _)| cg);
    let mut reasons: Vec<(u64, u32, u64)> = raw
        .reasons
        .iter()
        .map(|(k, pages)| (k.cgroup_id, k.reason, *pages))
        .collect();
    reasons.sort_unstable_by_key(|&(cg, reason, _)| (cg, reason));

    let (mut c, mut e, mut r) = (0, 0, 0);
    let mut out: Vec<(u64, Sample)> = Vec::new();
    while let Some(id) = [
        cpu.get(c).map(|x| x.0),
        events.get(e).map(|x| x.0),
        reasons.get(r).map(|x| x.0),
    ]
    .into_iter()
    .flatten()
    .min()
    {
        let mut s = Sample::default();
        let mut nodes: Vec<(u32, u64)> = Vec::new();
        while let Some(&(_, node, ns)) = cpu.get(c).filter(|x| x.0 == id) {
            match nodes.last_mut() {
                Some((n, sum)) if *n == node => *sum = sum.saturating_add(ns),
                _ => nodes.push((node, ns)),
            }
            c += 1;
        }
        s.cpu_ns = nodes.into_iter().collect();
        while let Some(&(_, ev)) = events.get(e).filter(|x| x.0 == id) {
            let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
            add(&mut s.migrations, ev.migrations);
            add(&mut s.cross_node_migrations, ev.cross_node_migrations);
            add(&mut s.numa_moves, ev.numa_moves);
            add(&mut s.numa_stuck, ev.numa_stuck);
            add(&mut s.pages_migrated, ev.pages_migrated);
            add(&mut s.local_faults, ev.local_faults);
            add(&mut s.remote_faults, ev.remote_faults);
            add(&mut s.local_samples, ev.local_events);
            add(&mut s.remote_samples, ev.remote_events);
            e += 1;
        }
        (s.local_events, s.remote_events) =
            pmu::scale(local_includes_remote, s.local_samples, s.remote_samples);
        while let Some(&(_, reason, pages)) = reasons.get(r).filter(|x| x.0 == id) {
            let name = reason_names
                .get(&reason)
                .cloned()
                .unwrap_or_else(|| format!("reason{reason}"));
            let v = s.pages_by_reason.entry(name).or_default();
            *v = v.saturating_add(pages);
            r += 1;
        }
        out.push((id, s));
    }
    out.into_iter().collect()
}

/// What [`Sampler::read`] makes of map contents: [`fold`], then the PMU pair's health checked
/// on the machine-wide totals, then every sample's DRAM events marked as evidence or not
/// (`pmu`: the attached pair, None when it did not attach). Returns the reason when this read
/// dropped the pair.
pub fn fold_read(
    raw: &RawMaps,
    cpu_node: impl Fn(u32) -> Option<u32>,
    reason_names: &BTreeMap<u32, String>,
    pmu: Option<&EventPair>,
    health: &mut pmu::PmuHealth,
    cpu_nodes: usize,
) -> (BTreeMap<u64, Sample>, Option<String>) {
    let mut out = fold(
        raw,
        cpu_node,
        reason_names,
        pmu.is_some_and(|p| p.local_includes_remote),
    );
    let dropped = pmu.and_then(|_| health.check(pmu_totals(&out), cpu_nodes));
    mark_pmu(&mut out, pmu.is_some() && health.trusted());
    (out, dropped)
}

/// Machine-wide PMU sample counts and on-CPU time of folded samples (every cgroup).
pub fn pmu_totals(samples: &BTreeMap<u64, Sample>) -> pmu::Totals {
    samples
        .values()
        .fold(pmu::Totals::default(), |t, s| pmu::Totals {
            local_samples: t.local_samples.saturating_add(s.local_samples),
            remote_samples: t.remote_samples.saturating_add(s.remote_samples),
            cpu_ns: t.cpu_ns.saturating_add(s.total_cpu_ns()),
        })
}

/// Marks every sample's PMU events as evidence (`trusted`) or not.
pub fn mark_pmu(samples: &mut BTreeMap<u64, Sample>, trusted: bool) {
    for s in samples.values_mut() {
        s.pmu = trusted;
    }
}

/// What fits in a watch list of `cap` entries out of `ids` (cgroup id → id counted under):
/// the managed cgroups of `first` in its order (the daemon puts Kubernetes containers there),
/// then the cgroups below them — a first one of each before a second of any — and only then
/// the other managed cgroups (under configured roots, where a delegated user may make any
/// number) by id, then the cgroups below those. A tenant's sub-cgroups or a user's many
/// cgroups cannot take the slots of containers admitted later.
pub fn plan_watch(ids: &BTreeMap<u64, u64>, first: &[u64], cap: usize) -> BTreeMap<u64, u64> {
    let managed = |id: &u64| ids.get(id) == Some(id);
    let mut below: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (&id, &to) in ids.iter().filter(|(id, to)| id != to) {
        below.entry(to).or_default().push(id);
    }
    let firsts: Vec<u64> = first.iter().copied().filter(managed).collect();
    let named: BTreeSet<u64> = firsts.iter().copied().collect();
    let rest: Vec<u64> = ids
        .keys()
        .copied()
        .filter(|id| managed(id) && !named.contains(id))
        .collect();
    let mut plan = BTreeMap::new();
    for group in [firsts, rest] {
        let mut added = Vec::new();
        for id in group {
            if plan.len() < cap && plan.insert(id, id).is_none() {
                added.push(id);
            }
        }
        let mut rank = 0;
        while plan.len() < cap {
            let mut any = false;
            for to in &added {
                if let Some(sub) = below.get(to).and_then(|v| v.get(rank)) {
                    any = true;
                    if plan.len() < cap {
                        plan.insert(*sub, *to);
                    }
                }
            }
            if !any {
                break;
            }
            rank += 1;
        }
    }
    plan
}

/// The cgroup id of every per-cgroup map entry in `raw` (repeated per entry).
fn raw_ids(raw: &RawMaps) -> impl Iterator<Item = u64> + '_ {
    raw.cpu_time
        .iter()
        .map(|(k, _)| k.cgroup_id)
        .chain(raw.events.iter().map(|(k, _)| k.cgroup_id))
        .chain(raw.reasons.iter().map(|(k, _)| k.cgroup_id))
}

/// Entries of the per-cgroup maps in `raw` (the per-CPU `pending` array is not per cgroup).
pub fn raw_entries(raw: &RawMaps) -> usize {
    raw.cpu_time.len() + raw.events.len() + raw.reasons.len()
}

/// Walks a cgroup v2 hierarchy: id (directory inode) → path relative to the root ("/" is the
/// root). Unreadable subtrees are skipped (a cgroup may vanish during the walk).
pub fn scan_cgroup_ids(root: &Path) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(md) = std::fs::metadata(&dir) else {
            continue;
        };
        let rel = dir.strip_prefix(root).unwrap_or(&dir);
        out.insert(md.ino(), format!("/{}", rel.display()));
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    out
}

/// The running samplers.
pub struct Sampler {
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    cpu_node: BTreeMap<u32, u32>,
    v2_root: Option<PathBuf>,
    reason_names: BTreeMap<u32, String>,
    /// The DRAM event pair, when both sides attached.
    pmu: Option<EventPair>,
    pmu_health: pmu::PmuHealth,
    /// A drop of the pair not yet taken by [`Sampler::take_pmu_drop`].
    pmu_drop: Option<String>,
    /// Nodes with CPUs (one node has no remote DRAM).
    cpu_nodes: usize,
    paths: BTreeMap<u64, String>,
    /// The only ids the programs count under ([`Sampler::watch_only`]); None: every cgroup.
    watched: Option<IdSet<u64>>,
    /// `CFG_WATCHED_ONLY` is set in the programs' config.
    flag_watched_only: bool,
    /// The `first` of the last [`Sampler::watch_only`] (a reload can reclassify cgroups).
    watching_first: Vec<u64>,
    /// `WATCHED` as last written (cgroup id → id counted under); None: not yet, or the last
    /// write fell short and is retried at the next call.
    watching: Option<BTreeMap<u64, u64>>,
    /// Ids in the maps but not in the hierarchy at the previous read.
    missing_before: IdSet<u64>,
    /// Entries left in the per-cgroup maps after the last read's pruning.
    entries: usize,
    /// Of those, entries of cgroups no longer in the hierarchy (deleted at the next read).
    stale: usize,
    /// Entries the reads deleted since [`Sampler::take_deleted_entries`] (cgroups gone, or no
    /// longer watched).
    deleted: usize,
    stats_fd: Option<std::os::fd::OwnedFd>,
    /// On-CPU time minus the hypervisor's steal (see [`StealCorrection`]).
    steal: StealCorrection,
    /// Raw map values made monotone key by key (evicted entries; see [`super::monotone`]).
    monotone: MonotoneMaps,
    /// Entries each per-cgroup map holds ([`loader::cg_map_entries`]).
    cg_entries: u32,
    /// The perf_event programs' events per CPU (see [`Sampler::sync_cpus`]).
    perf: PerfCpus,
    /// Where the last [`Sampler::read`]'s time went.
    read_times: ReadTimes,
}

/// Wall and CPU time of each step of one [`Sampler::read`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadTimes {
    /// The maps read (`read_raw`) and the CPU counters (/proc/stat, per-CPU samples).
    pub maps: StepTime,
    /// Entries of cgroups gone or no longer watched found and deleted.
    pub prune: StepTime,
    /// Raw values made monotone key by key.
    pub monotone: StepTime,
    /// [`fold_read`] and the samples of cgroups not kept dropped.
    pub fold: StepTime,
    /// The steal correction.
    pub steal: StepTime,
}

/// Wall time of a step, and the CPU time the reading thread spent in it (on a loaded machine
/// the wall time is mostly waiting for a CPU; the CPU time is the step's own cost).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepTime {
    pub wall: std::time::Duration,
    pub cpu: std::time::Duration,
}

/// Starts timing a step.
struct Stopwatch {
    wall: std::time::Instant,
    cpu: std::time::Duration,
}

impl Stopwatch {
    fn start() -> Self {
        Self {
            wall: std::time::Instant::now(),
            cpu: thread_cpu_time(),
        }
    }
    fn stop(self) -> StepTime {
        StepTime {
            wall: self.wall.elapsed(),
            cpu: thread_cpu_time().saturating_sub(self.cpu),
        }
    }
}

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`; zero if the clock fails).
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Nodes of `topo` with CPUs.
fn cpu_nodes(topo: &Topology) -> usize {
    topo.nodes.iter().filter(|n| !n.cpus.is_empty()).count()
}

impl Sampler {
    /// Loads and attaches every source this kernel supports. Returns no sampler when nothing
    /// could be attached; the statuses say why, source by source.
    pub fn start(topo: &Topology, cfg: &EbpfConfig) -> (Option<Sampler>, Vec<SourceStatus>) {
        Self::start_with(topo, cfg, false)
    }

    /// Folds raw map contents the way [`Sampler::read`] does (without pruning).
    pub fn fold_raw(&self, raw: &RawMaps) -> BTreeMap<u64, Sample> {
        let mut out = fold(
            raw,
            |c| self.cpu_node.get(&c).copied(),
            &self.reason_names,
            self.pmu.as_ref().is_some_and(|p| p.local_includes_remote),
        );
        mark_pmu(&mut out, self.pmu_trusted());
        out
    }

    /// Both DRAM events attached and still trusted.
    pub fn pmu_trusted(&self) -> bool {
        self.pmu.is_some() && self.pmu_health.trusted()
    }

    /// The DRAM event pair in use (None when it did not attach).
    pub fn pmu_events(&self) -> Option<&EventPair> {
        self.pmu.as_ref()
    }

    /// The reason, once, when the last read dropped the DRAM event pair.
    pub fn take_pmu_drop(&mut self) -> Option<String> {
        self.pmu_drop.take()
    }

    /// Like [`Sampler::start`]; `both_on_cpu` attaches both on-CPU sources (for probing only:
    /// they add into the same map).
    pub fn start_with(
        topo: &Topology,
        cfg: &EbpfConfig,
        both_on_cpu: bool,
    ) -> (Option<Sampler>, Vec<SourceStatus>) {
        let loaded = loader::load(topo, cfg, both_on_cpu);
        let statuses = loaded.statuses;
        let Some(mut ebpf) = loaded.ebpf else {
            return (None, statuses);
        };
        if !statuses.iter().any(|s| s.available) {
            return (None, statuses);
        }
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::debug!(error = %e, "eBPF logger not started");
                None
            }
        };
        let v2_root = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|m| probe::cgroup2_mount(&m));
        let exact = statuses
            .iter()
            .any(|s| s.name == "on_cpu:sched_switch" && s.available);
        let clock = if exact {
            OnCpuClock::Exact
        } else {
            OnCpuClock::Sampled {
                period_ns: loaded.sample_period_ns,
            }
        };
        let cpu_node = topo
            .cpus
            .iter()
            .filter_map(|c| Some((c.id, c.node?)))
            .collect();
        let cpu_nodes = cpu_nodes(topo);
        let mut s = Sampler {
            ebpf,
            logger,
            cpu_node,
            v2_root,
            reason_names: loaded.reason_names,
            pmu: loaded.pmu,
            pmu_health: pmu::PmuHealth::default(),
            pmu_drop: None,
            cpu_nodes,
            paths: BTreeMap::new(),
            watched: None,
            flag_watched_only: false,
            watching_first: Vec::new(),
            watching: None,
            missing_before: IdSet::default(),
            entries: 0,
            stale: 0,
            deleted: 0,
            stats_fd: None,
            steal: StealCorrection::new(clock, procfs::ns_per_tick(), None),
            monotone: MonotoneMaps::default(),
            cg_entries: loaded.cg_entries,
            perf: loaded.perf,
            read_times: ReadTimes::default(),
        };
        // The first interval starts now (the reading needs the loaded STATS map).
        s.steal.reset(s.cpu_reading());
        s.refresh_paths();
        (Some(s), statuses)
    }

    /// Brings the sampler in step with a rebuilt topology (CPUs or nodes went online or
    /// offline): `CPU_NODE` and the CPU → node map rewritten for its CPUs, the perf events of
    /// CPUs no longer online closed, events opened on online CPUs without them (and on CPUs
    /// found dead: see [`super::perfcpu`]). A CPU that fails is logged and tried again at the
    /// next call ([`Sampler::cpus_pending`]); the others keep sampling.
    pub fn sync_cpus(&mut self, topo: &Topology) -> SyncReport {
        if let Err(e) = loader::write_cpu_node(&mut self.ebpf, topo) {
            tracing::warn!(error = %e, "CPU_NODE not updated: migrations on the new CPUs are attributed to node 0");
        }
        // CPUs gone offline keep their node: exact mode's pending time of such a CPU is
        // still folded.
        for c in &topo.cpus {
            if let Some(n) = c.node {
                self.cpu_node.insert(c.id, n);
            }
        }
        self.cpu_nodes = cpu_nodes(topo);
        let online = topo.online_cpus().iter().collect();
        let report = self.perf.sync(&mut self.ebpf, &online);
        if !report.attached.is_empty() || !report.detached.is_empty() {
            tracing::info!(
                opened = ?report.attached,
                closed = ?report.detached,
                sampled_cpus = %self.sampled_cpus(),
                "perf events follow the online CPUs"
            );
        }
        report
    }

    /// Some online CPU still lacks its perf events (a failed open to retry), or was found dead.
    pub fn cpus_pending(&self) -> bool {
        self.perf.pending()
    }

    /// CPUs with every attached perf_event program's event.
    pub fn sampled_cpus(&self) -> crate::cpuset::CpuSet {
        self.perf.attached_cpus().into_iter().collect()
    }

    /// The cgroup v2 mount the ids refer to, if any.
    pub fn cgroup2_root(&self) -> Option<&Path> {
        self.v2_root.as_deref()
    }

    /// Path (relative to the v2 root) of a cgroup id seen at the last read.
    pub fn cgroup_path(&self, id: u64) -> Option<&str> {
        self.paths.get(&id).map(String::as_str)
    }

    fn refresh_paths(&mut self) {
        if let Some(root) = &self.v2_root {
            self.paths = scan_cgroup_ids(root);
        }
    }

    /// Reads every map: cumulative samples per cgroup id since the sampler started. Cgroups not
    /// in the v2 hierarchy are left out; their map entries are deleted once they are missing at
    /// two reads in a row (a cgroup created between the hierarchy walk and the map read is
    /// found by the next walk and keeps its counts).
    pub fn read(&mut self) -> Result<BTreeMap<u64, Sample>, EbpfError> {
        if let Some(l) = &mut self.logger {
            l.flush();
        }
        if self.watched.is_none() {
            self.refresh_paths();
        }
        let t = Stopwatch::start();
        let mut raw = self.read_raw()?;
        let reading = self.cpu_reading();
        if let Some(r) = &reading {
            self.perf.check_clock(&r.samples, std::time::Instant::now());
        }
        let maps = t.stop();
        let t = Stopwatch::start();
        let (deleted, stale) = if self.paths.is_empty() && self.watched.is_none() {
            (0, 0)
        } else {
            self.prune(&raw)?
        };
        self.entries = raw_entries(&raw).saturating_sub(deleted);
        self.stale = stale;
        // Summed until taken: a mark's read between two rounds deletes entries too.
        self.deleted = self.deleted.saturating_add(deleted);
        let prune = t.stop();
        let t = Stopwatch::start();
        // The counts of a watched cgroup survive the eviction of its entries. Without a watch
        // list (`rebalancer sample`, a daemon whose watch list could not be written) the maps'
        // raw values are used as read: no state for a tenant's every cgroup that ever ran.
        let watched = &self.watched;
        self.monotone.apply(&mut raw, |id| {
            watched.as_ref().is_some_and(|w| w.contains(&id))
        });
        let monotone = t.stop();
        let t = Stopwatch::start();
        let (mut out, dropped) = fold_read(
            &raw,
            |c| self.cpu_node.get(&c).copied(),
            &self.reason_names,
            self.pmu.as_ref(),
            &mut self.pmu_health,
            self.cpu_nodes,
        );
        if let Some(why) = dropped {
            tracing::warn!(reason = %why, "PMU DRAM counters dropped: locality falls back to hinting faults or the share model");
            self.pmu_drop = Some(why);
        }
        if let Some(w) = &self.watched {
            out.retain(|id, _| w.contains(id));
        } else if !self.paths.is_empty() {
            out.retain(|id, _| self.paths.contains_key(id));
        }
        let fold = t.stop();
        let t = Stopwatch::start();
        self.steal.apply(reading, &self.cpu_node, &mut out);
        self.read_times = ReadTimes {
            maps,
            prune,
            monotone,
            fold,
            steal: t.stop(),
        };
        Ok(out)
    }

    /// Where the last [`Sampler::read`]'s time went.
    pub fn last_read_times(&self) -> ReadTimes {
        self.read_times
    }

    /// /proc/stat and the per-CPU cpu-clock sample counts now (None when /proc/stat is
    /// unreadable: that interval is not steal-corrected).
    fn cpu_reading(&self) -> Option<CpuReading> {
        let stat = procfs::read_stat(Path::new("/proc")).ok()?;
        let a: PerCpuArray<&MapData, u64> = self.map("STATS").ok()?;
        let samples = a
            .get(&(Stat::ClockSamples as u32), 0)
            .map(|v| (0u32..).zip(v.iter().copied()).collect())
            .unwrap_or_default();
        Some(CpuReading { stat, samples })
    }

    /// Share of all CPUs' time the hypervisor stole between the last two reads (0 on bare
    /// metal); on-CPU time in [`Sampler::read`] is already corrected for it.
    pub fn steal_share(&self) -> f64 {
        self.steal.last_steal_share()
    }

    /// Entries in the per-cgroup maps (CPU_TIME, EVENTS, MIGRATE_REASONS) after the last
    /// [`Sampler::read`] pruned those of vanished cgroups: after churn it returns to the
    /// number for the live cgroups within two reads (see [`Sampler::read`]).
    pub fn map_entries(&self) -> usize {
        self.entries
    }

    /// Entries, after the last read, of cgroups gone from the hierarchy: they are deleted at
    /// the next read (a cgroup must be missing at two reads in a row), so this is 0 two reads
    /// after the last cgroup went away. Anything else would be a leak.
    pub fn stale_entries(&self) -> usize {
        self.stale
    }

    /// Entries the reads since the last call deleted (of cgroups gone from the hierarchy for
    /// two reads, or, watching, of ids no longer watched); the count starts again from 0.
    pub fn take_deleted_entries(&mut self) -> usize {
        std::mem::take(&mut self.deleted)
    }

    /// Reads the maps without folding (for benchmarks): the hash maps by batches
    /// (`batch::read_hash`), or entry by entry where the kernel has no batch lookup.
    pub fn read_raw(&self) -> Result<RawMaps, EbpfError> {
        self.read_raw_with(true)
    }

    /// [`Self::read_raw`], with `batched = false` always entry by entry (aya's iteration:
    /// one get_next_key + one lookup syscall per entry), for comparison.
    pub fn read_raw_with(&self, batched: bool) -> Result<RawMaps, EbpfError> {
        // CPU_TIME before SWITCH_STATE: a flush between the two reads then loses a little
        // instead of counting twice.
        let (cpu_time, b1) = self.read_hash::<CgNodeKey, u64>("CPU_TIME", batched)?;
        let st: PerCpuArray<&MapData, SwitchState> = self.map("SWITCH_STATE")?;
        let vals: PerCpuValues<SwitchState> = st.get(&0, 0).map_err(|source| EbpfError::Map {
            map: "SWITCH_STATE",
            source,
        })?;
        let pending = vals
            .iter()
            .enumerate()
            .map(|(cpu, s)| (cpu as u32, *s))
            .collect();
        let (events, b2) = self.read_hash::<CgNodeKey, CgEvents>("EVENTS", batched)?;
        let (reasons, b3) = self.read_hash::<CgReasonKey, u64>("MIGRATE_REASONS", batched)?;
        let raw = RawMaps {
            cpu_time,
            pending,
            events,
            reasons,
            exhaustive: b1 && b2 && b3,
        };
        Ok(raw)
    }

    /// Every entry of a shared hash map, one per key, and whether it was read by batches.
    fn read_hash<K: aya::Pod + Ord, V: aya::Pod>(
        &self,
        name: &'static str,
        batched: bool,
    ) -> Result<(Vec<(K, V)>, bool), EbpfError> {
        let m: HashMap<&MapData, K, V> = self.map(name)?;
        if batched {
            let fd = aya::maps::IterableMap::<K, V>::map(&m).fd().as_fd();
            match super::batch::read_hash::<K, V>(fd) {
                // The batch walk goes on from the bucket it stopped at: no key twice (and
                // `monotone` counts a key once if it ever were).
                Ok(Some(all)) => return Ok((all, true)),
                Ok(None) => {} // no batch lookup in this kernel: entry by entry
                Err(e) => {
                    return Err(EbpfError::Map {
                        map: name,
                        source: aya::maps::MapError::from(aya::sys::SyscallError {
                            call: "BPF_MAP_LOOKUP_BATCH",
                            io_error: e,
                        }),
                    })
                }
            }
        }
        // The kernel restarts a walk whose current key was evicted meanwhile: bound it (an
        // error, the round skipped), and keep one value per key.
        let bound = 2 * self.cg_entries as usize;
        let all = m
            .iter()
            .take(bound + 1)
            .map(|item| item.map_err(|source| EbpfError::Map { map: name, source }))
            .collect::<Result<Vec<_>, _>>()?;
        if all.len() > bound {
            return Err(EbpfError::Map {
                map: name,
                source: aya::maps::MapError::from(aya::sys::SyscallError {
                    call: "BPF_MAP_GET_NEXT_KEY",
                    io_error: std::io::Error::other(
                        "the walk kept restarting (entries evicted while read): read not complete",
                    ),
                }),
            });
        }
        Ok((super::batch::last_per_key(all), false))
    }

    fn map<'a, M>(&'a self, name: &'static str) -> Result<M, EbpfError>
    where
        M: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
    {
        let m = self.ebpf.map(name).ok_or(EbpfError::MissingMap(name))?;
        M::try_from(m).map_err(|source| EbpfError::Map { map: name, source })
    }

    fn map_mut<'a, M>(&'a mut self, name: &'static str) -> Result<M, EbpfError>
    where
        M: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
    {
        let m = self.ebpf.map_mut(name).ok_or(EbpfError::MissingMap(name))?;
        M::try_from(m).map_err(|source| EbpfError::Map { map: name, source })
    }

    /// Deletes the entries of cgroup ids absent from the v2 hierarchy at this read and the one
    /// before. Returns how many entries it deleted, and how many of cgroups missing only at this
    /// read it kept.
    fn prune(&mut self, raw: &RawMaps) -> Result<(usize, usize), EbpfError> {
        let (watched, paths) = (&self.watched, &self.paths);
        let missing: IdSet<u64> = raw_ids(raw)
            .filter(|id| match watched {
                Some(w) => !w.contains(id),
                None => !paths.contains_key(id),
            })
            .collect();
        let before = std::mem::replace(&mut self.missing_before, missing);
        let missing = &self.missing_before;
        // Watching: an id the daemon no longer watches gets no new counts; delete it at once.
        // The look-ups go to the (usually empty) set of missing ids, not to the watch list.
        let gone = |id: &u64| missing.contains(id) && (watched.is_some() || before.contains(id));
        let cpu: Vec<CgNodeKey> = raw
            .cpu_time
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| gone(&k.cgroup_id))
            .collect();
        let ev: Vec<CgNodeKey> = raw
            .events
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| gone(&k.cgroup_id))
            .collect();
        let rs: Vec<CgReasonKey> = raw
            .reasons
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| gone(&k.cgroup_id))
            .collect();
        let dead: IdSet<u64> = cpu
            .iter()
            .map(|k| k.cgroup_id)
            .chain(ev.iter().map(|k| k.cgroup_id))
            .collect();
        if !dead.is_empty() {
            tracing::debug!(
                cgroups = dead.len(),
                "deleting map entries of vanished cgroups"
            );
        }
        let mut m: HashMap<&mut MapData, CgNodeKey, u64> = self.map_mut("CPU_TIME")?;
        for k in &cpu {
            let _ = m.remove(k); // may have been evicted meanwhile
        }
        let mut m: HashMap<&mut MapData, CgNodeKey, CgEvents> = self.map_mut("EVENTS")?;
        for k in &ev {
            let _ = m.remove(k);
        }
        let mut m: HashMap<&mut MapData, CgReasonKey, u64> = self.map_mut("MIGRATE_REASONS")?;
        for k in &rs {
            let _ = m.remove(k);
        }
        let deleted = cpu.len() + ev.len() + rs.len();
        let missing_entries = if self.missing_before.is_empty() {
            0
        } else {
            raw_ids(raw)
                .filter(|id| self.missing_before.contains(id))
                .count()
        };
        Ok((deleted, missing_entries.saturating_sub(deleted)))
    }

    /// From now on the programs count only the cgroups of `ids` (cgroup id → the id its events
    /// are counted under: itself for a managed cgroup, its container for a cgroup below one;
    /// see `CFG_WATCHED_ONLY`): `WATCHED` is brought in step (entries first, then the flag, so
    /// no watched event is dropped), entries of ids no longer counted under are deleted at the
    /// next read, and reads no longer walk the cgroup hierarchy. Returns how many ids did not
    /// fit in `WATCHED` (uncounted; logged).
    pub fn watch_only(
        &mut self,
        ids: &BTreeMap<u64, u64>,
        first: &[u64],
    ) -> Result<usize, EbpfError> {
        if self.watching.as_ref() == Some(ids) && self.watching_first == first {
            return Ok(0);
        }
        self.watching_first = first.to_vec();
        let plan = plan_watch(ids, first, rebalancer_common::CG_MAP_ENTRIES as usize);
        // What reads keep from now on, even if writing the list below fails: a cgroup dropped
        // here is dropped by the engine too, and must leave no counts behind to come back with
        // (its entries are deleted at the next read).
        self.watched = Some(plan.values().copied().collect());
        let mut m: HashMap<&mut MapData, u64, u64> = self.map_mut("WATCHED")?;
        // Anything short of the whole plan written is retried at the next call (`watching` is
        // not set), not taken for done while the ids stay the same.
        let mut failed = false;
        let mut present = BTreeMap::new();
        for item in m.iter() {
            match item {
                Ok((id, to)) => {
                    present.insert(id, to);
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        // Removals first: the slots they free are the new entries'.
        for id in present.keys().filter(|id| !plan.contains_key(id)) {
            match m.remove(id) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(_) => failed = true,
            }
        }
        let mut refused = ids.len() - plan.len();
        for (id, to) in plan.iter().filter(|(id, to)| present.get(id) != Some(to)) {
            if m.insert(id, to, 0).is_err() {
                refused += 1;
                failed = true;
            }
        }
        if refused > 0 {
            tracing::warn!(
                refused,
                capacity = rebalancer_common::CG_MAP_ENTRIES,
                "more cgroups to watch than the eBPF watch list holds: these are not sampled"
            );
        }
        if !self.flag_watched_only {
            let mut c: aya::maps::Array<&mut MapData, rebalancer_common::ProgConfig> =
                self.map_mut("CONFIG")?;
            let mut pc = c.get(&0, 0).map_err(|source| EbpfError::Map {
                map: "CONFIG",
                source,
            })?;
            pc.flags |= rebalancer_common::CFG_WATCHED_ONLY;
            c.set(0, pc, 0).map_err(|source| EbpfError::Map {
                map: "CONFIG",
                source,
            })?;
            self.flag_watched_only = true;
        }
        self.watching = (!failed).then(|| ids.clone());
        Ok(refused)
    }

    /// The per-cgroup maps as the kernel describes them (`/proc/self/fdinfo` of each map's
    /// fd): name, `map_type` and `memlock` bytes. Their memory must not grow with the number
    /// of possible CPUs (a per-CPU LRU map preallocates every entry on each of them).
    pub fn map_footprint(&self) -> Vec<(&'static str, u32, u64)> {
        ["CPU_TIME", "EVENTS", "MIGRATE_REASONS"]
            .into_iter()
            .filter_map(|name| {
                let data = match self.ebpf.map(name)? {
                    aya::maps::Map::LruHashMap(d)
                    | aya::maps::Map::HashMap(d)
                    | aya::maps::Map::PerCpuLruHashMap(d)
                    | aya::maps::Map::PerCpuHashMap(d) => d,
                    _ => return None,
                };
                let raw = std::os::fd::AsRawFd::as_raw_fd(&data.fd().as_fd());
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{raw}")).ok()?;
                let field = |k: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(k))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                };
                Some((name, field("map_type:")? as u32, field("memlock:")?))
            })
            .collect()
    }

    /// Benchmark helper: fills CPU_TIME and EVENTS from userspace with `n` synthetic cgroup ids
    /// (starting at `first_id`) on every node of `nodes`, as the programs would.
    pub fn bench_fill(&mut self, first_id: u64, n: u64, nodes: &[u32]) -> Result<(), EbpfError> {
        let mut cpu: HashMap<&mut MapData, CgNodeKey, u64> = self.map_mut("CPU_TIME")?;
        for id in first_id..first_id + n {
            for &node in nodes {
                let k = CgNodeKey {
                    cgroup_id: id,
                    node,
                    _pad: 0,
                };
                cpu.insert(k, 1_000u64, 0)
                    .map_err(|source| EbpfError::Map {
                        map: "CPU_TIME",
                        source,
                    })?;
            }
        }
        let mut ev: HashMap<&mut MapData, CgNodeKey, CgEvents> = self.map_mut("EVENTS")?;
        for id in first_id..first_id + n {
            let k = CgNodeKey {
                cgroup_id: id,
                node: nodes.first().copied().unwrap_or(0),
                _pad: 0,
            };
            let e = CgEvents {
                migrations: 1,
                ..CgEvents::default()
            };
            ev.insert(k, e, 0).map_err(|source| EbpfError::Map {
                map: "EVENTS",
                source,
            })?;
        }
        Ok(())
    }

    /// Test helper: deletes the `CPU_TIME` and `EVENTS` entries of (`id`, `node`), as the LRU
    /// maps evict entries when full.
    pub fn bench_evict(&mut self, id: u64, node: u32) {
        let k = CgNodeKey {
            cgroup_id: id,
            node,
            _pad: 0,
        };
        if let Ok(mut m) = self.map_mut::<HashMap<&mut MapData, CgNodeKey, u64>>("CPU_TIME") {
            let _ = m.remove(&k);
        }
        if let Ok(mut m) = self.map_mut::<HashMap<&mut MapData, CgNodeKey, CgEvents>>("EVENTS") {
            let _ = m.remove(&k);
        }
    }

    /// The run-queue counters of each CPU (cumulative since the sampler started; see
    /// [`super::runq`]). `None` when the map cannot be read; CPUs whose sampler never read its
    /// run queue (no offsets, exact mode) have zero readings.
    pub fn runq(&self) -> Option<BTreeMap<u32, super::runq::RunqCount>> {
        let a: PerCpuArray<&MapData, u64> = self.map("RUNQ").ok()?;
        let readings = a.get(&rebalancer_common::RUNQ_SAMPLES, 0).ok()?;
        let sums = a.get(&rebalancer_common::RUNQ_SUM, 0).ok()?;
        Some(
            (0u32..)
                .zip(readings.iter().zip(sums.iter()))
                .map(|(cpu, (&readings, &sum))| (cpu, super::runq::RunqCount { readings, sum }))
                .collect(),
        )
    }

    /// Program statistics (`Stat`), summed over CPUs.
    pub fn stats(&self) -> Result<Vec<(&'static str, u64)>, EbpfError> {
        let a: PerCpuArray<&MapData, u64> = self.map("STATS")?;
        Stat::ALL
            .iter()
            .map(|s| {
                let v = a.get(&(*s as u32), 0).map_err(|source| EbpfError::Map {
                    map: "STATS",
                    source,
                })?;
                Ok((s.name(), sum_u64(v.iter().copied())))
            })
            .collect()
    }

    /// Turns on the kernel's run-time accounting of BPF programs while the sampler lives
    /// (same as `sysctl kernel.bpf_stats_enabled=1`).
    pub fn enable_kernel_stats(&mut self) -> Result<(), String> {
        let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| e.to_string())?;
        self.stats_fd = Some(fd);
        Ok(())
    }

    /// run_time_ns / run_cnt of every loaded program, from the kernel.
    pub fn prog_stats(&self) -> Vec<ProgStat> {
        self.ebpf
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                Some(ProgStat {
                    name: name.to_string(),
                    run_time_ns: info.run_time().as_nanos() as u64,
                    run_count: info.run_count(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant's sub-cgroups filled the watch list and containers admitted later
    /// were not counted at all.
    #[test]
    fn managed_cgroups_are_watched_before_any_sub_cgroup() {
        // A tenant's container 1 with 10 sub-cgroups (ids 100..110), containers 2 and 3 with
        // one each, and container 4 admitted last with none.
        let mut ids: BTreeMap<u64, u64> = (100..110).map(|s| (s, 1)).collect();
        ids.extend([(1, 1), (2, 2), (3, 3), (4, 4), (200, 2), (300, 3)]);
        let plan = plan_watch(&ids, &[], 7);
        for m in 1..=4 {
            assert_eq!(plan.get(&m), Some(&m), "managed {m} watched");
        }
        assert_eq!(plan.len(), 7);
        // Then the first sub-cgroup of each before a second of any.
        assert_eq!(plan.get(&100), Some(&1));
        assert_eq!(plan.get(&200), Some(&2));
        assert_eq!(plan.get(&300), Some(&3));
        // Room for all: all of them.
        assert_eq!(plan_watch(&ids, &[], 100), ids);
        // Less room than managed cgroups: managed ones only.
        assert!(plan_watch(&ids, &[], 3).iter().all(|(id, to)| id == to));
        // Those named first before the others (a delegated user's cgroups under a
        // configured root ahead of Kubernetes containers by id).
        assert_eq!(
            plan_watch(&ids, &[4, 3, 99], 2),
            BTreeMap::from([(3, 3), (4, 4)]),
            "an id in `first` that is not managed is ignored"
        );
        // Those named first and the cgroups below them before any other managed
        // cgroup (a container whose processes live in a sub-cgroup reads as idle without it).
        assert_eq!(
            plan_watch(&ids, &[2], 4),
            BTreeMap::from([(2, 2), (200, 2), (1, 1), (3, 3)])
        );
        // Every sub-cgroup of those named first before a configured cgroup (the
        // daemon passed every managed id as `first`, and a user's cgroups took the slots).
        let mut ids: BTreeMap<u64, u64> = (100..110).map(|s| (s, 1)).collect();
        ids.extend([(1, 1), (2, 2), (200, 2), (201, 2)]);
        assert_eq!(
            plan_watch(&ids, &[2], 3),
            BTreeMap::from([(2, 2), (200, 2), (201, 2)])
        );
        // A sub-cgroup of a managed cgroup that did not fit is not watched.
        let p = plan_watch(&BTreeMap::from([(1, 1), (2, 2), (9, 2)]), &[], 1);
        assert_eq!(p, BTreeMap::from([(1, 1)]));
    }

    fn key(cg: u64, node: u32) -> CgNodeKey {
        CgNodeKey {
            cgroup_id: cg,
            node,
            _pad: 0,
        }
    }

    #[test]
    fn fold_sums_nodes_pending_events_and_reasons() {
        let raw = RawMaps {
            cpu_time: vec![(key(10, 0), 100), (key(10, 1), 50), (key(20, 0), 7)],
            pending: vec![
                (
                    3,
                    SwitchState {
                        last_ns: 1,
                        cgroup_id: 10,
                        pending_ns: 5,
                    },
                ),
                (0, SwitchState::default()),
            ],
            events: vec![
                (
                    key(10, 1),
                    CgEvents {
                        migrations: 4,
                        cross_node_migrations: 1,
                        remote_events: 2,
                        ..Default::default()
                    },
                ),
                (
                    key(10, 0),
                    CgEvents {
                        migrations: 1,
                        local_faults: 3,
                        remote_faults: 9,
                        ..Default::default()
                    },
                ),
            ],
            reasons: vec![
                (
                    CgReasonKey {
                        cgroup_id: 20,
                        reason: 5,
                        _pad: 0,
                    },
                    512,
                ),
                (
                    CgReasonKey {
                        cgroup_id: 20,
                        reason: 14,
                        _pad: 0,
                    },
                    1,
                ),
            ],
            exhaustive: true,
        };
        let names = BTreeMap::from([(5, "numa_misplaced".to_string())]);
        let node_of = |cpu: u32| (cpu == 3).then_some(1);
        let out = fold(&raw, node_of, &names, false);
        let a = &out[&10];
        assert_eq!(a.cpu_ns, BTreeMap::from([(0, 100), (1, 55)]));
        assert_eq!(a.migrations, 5);
        assert_eq!(a.cross_node_migrations, 1);
        assert_eq!(a.remote_events, 2 * pmu::REMOTE_PERIOD, "samples × period");
        assert_eq!(
            (a.remote_samples, a.local_samples, a.local_events),
            (2, 0, 0)
        );
        assert!(
            !a.pmu,
            "the sampler, not fold, says whether the pair is trusted"
        );
        assert_eq!((a.local_faults, a.remote_faults), (3, 9));
        let b = &out[&20];
        assert_eq!(b.total_cpu_ns(), 7);
        assert_eq!(b.pages_by_reason["numa_misplaced"], 512);
        assert_eq!(b.pages_by_reason["reason14"], 1);
        assert_eq!(out.len(), 2);
    }

    /// The fold as it was (a map search per entry): the oracle the sorted walk must equal.
    fn fold_by_search(
        raw: &RawMaps,
        cpu_node: impl Fn(u32) -> Option<u32>,
        reason_names: &BTreeMap<u32, String>,
        local_includes_remote: bool,
    ) -> BTreeMap<u64, Sample> {
        let mut out: BTreeMap<u64, Sample> = BTreeMap::new();
        let mut add_ns = |cg: u64, node: u32, ns: u64| {
            let e = out.entry(cg).or_default().cpu_ns.entry(node).or_default();
            *e = e.saturating_add(ns);
        };
        for (k, ns) in &raw.cpu_time {
            add_ns(k.cgroup_id, k.node, *ns);
        }
        for (cpu, st) in &raw.pending {
            if st.pending_ns != 0 && st.cgroup_id != 0 {
                add_ns(st.cgroup_id, cpu_node(*cpu).unwrap_or(0), st.pending_ns);
            }
        }
        for (k, e) in &raw.events {
            let s = out.entry(k.cgroup_id).or_default();
            let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
            add(&mut s.migrations, e.migrations);
            add(&mut s.cross_node_migrations, e.cross_node_migrations);
            add(&mut s.numa_moves, e.numa_moves);
            add(&mut s.numa_stuck, e.numa_stuck);
            add(&mut s.pages_migrated, e.pages_migrated);
            add(&mut s.local_faults, e.local_faults);
            add(&mut s.remote_faults, e.remote_faults);
            add(&mut s.local_samples, e.local_events);
            add(&mut s.remote_samples, e.remote_events);
        }
        for s in out.values_mut() {
            (s.local_events, s.remote_events) =
                pmu::scale(local_includes_remote, s.local_samples, s.remote_samples);
        }
        for (k, pages) in &raw.reasons {
            let name = reason_names
                .get(&k.reason)
                .cloned()
                .unwrap_or_else(|| format!("reason{}", k.reason));
            let v = out
                .entry(k.cgroup_id)
                .or_default()
                .pages_by_reason
                .entry(name)
                .or_default();
            *v = v.saturating_add(*pages);
        }
        out
    }

    /// Values near `u64::MAX` half the time (saturation), small ones otherwise.
    fn count() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![0u64..1_000, (u64::MAX - 1_000)..=u64::MAX]
    }

    proptest::proptest! {
        /// The sorted walk folds any map contents (repeated keys, ids present in one map
        /// only, pending time on CPUs with and without a node, unnamed reasons, saturating
        /// sums) exactly as a map search per entry does.
        #[test]
        fn fold_equals_a_search_per_entry(
            cpu in proptest::collection::vec((0u64..40, 0u32..4, count()), 0..120),
            pending in proptest::collection::vec((0u32..6, 0u64..40, count()), 0..8),
            events in proptest::collection::vec((0u64..40, 0u32..4, [count(), count(), count()]), 0..80),
            reasons in proptest::collection::vec((0u64..40, 0u32..4, count()), 0..40),
            lir: bool,
        ) {
            let raw = RawMaps {
                cpu_time: cpu.iter().map(|&(cg, n, v)| (key(cg, n), v)).collect(),
                pending: pending
                    .iter()
                    .map(|&(c, cg, ns)| (c, SwitchState { last_ns: 0, cgroup_id: cg, pending_ns: ns }))
                    .collect(),
                events: events
                    .iter()
                    .map(|&(cg, n, [a, b, c])| {
                        let e = CgEvents {
                            migrations: a,
                            numa_moves: b,
                            remote_faults: c,
                            local_events: a,
                            remote_events: c,
                            ..Default::default()
                        };
                        (key(cg, n), e)
                    })
                    .collect(),
                reasons: reasons
                    .iter()
                    .map(|&(cg, reason, v)| (CgReasonKey { cgroup_id: cg, reason, _pad: 0 }, v))
                    .collect(),
                exhaustive: true,
            };
            let names = BTreeMap::from([(1, "numa_misplaced".to_string())]);
            let node_of = |cpu: u32| (cpu < 4).then_some(cpu % 2);
            proptest::prop_assert_eq!(
                fold(&raw, node_of, &names, lir),
                fold_by_search(&raw, node_of, &names, lir)
            );
        }
    }

    /// Without eBPF the daemon gets no sampler and a reason for every source.
    #[test]
    fn disabled_by_config_reports_every_source_skipped() {
        let topo = crate::topology::TopologyBuilder::default().build();
        let cfg = EbpfConfig {
            enabled: false,
            ..EbpfConfig::default()
        };
        let (s, st) = Sampler::start(&topo, &cfg);
        assert!(s.is_none());
        assert_eq!(st.len(), loader::SOURCES.len());
        assert!(st
            .iter()
            .all(|s| !s.available && s.reason.contains("ebpf.enabled = false")));
    }

    #[test]
    fn per_cpu_sums_saturate() {
        assert_eq!(sum_u64([u64::MAX, 5]), u64::MAX);
    }

    #[test]
    fn scan_maps_inodes_to_paths() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        let ids = scan_cgroup_ids(d.path());
        let ino = std::fs::metadata(d.path().join("a/b")).unwrap().ino();
        assert_eq!(ids[&ino], "/a/b");
        assert_eq!(ids.len(), 3);
        assert!(scan_cgroup_ids(Path::new("/nonexistent/x")).is_empty());
    }
}

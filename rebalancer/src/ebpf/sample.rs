//! [`Sampler`]: owns the loaded programs; each [`Sampler::read`] folds the maps into a
//! cumulative [`Sample`] per cgroup id, maps ids to cgroup v2 paths (id = inode of the cgroup's
//! directory), deletes map entries of cgroups that no longer exist, and takes the hypervisor's
//! steal time out of on-CPU time (`steal`). The folding is pure ([`fold`]) and unit-tested.
use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    os::fd::AsFd,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, PerCpuValues},
    Ebpf,
};
use rebalancer_common::{
    CgEvents, CgNodeKey, CgReasonKey, SlotEvents, Stat, SwitchState, MAX_MIGRATE_REASONS, SLOTS,
};

use super::{
    loader,
    perfcpu::{PerfCpus, SyncReport},
    pmu::{self, EventPair},
    probe,
    slots::{Mapped, Slots, EVENT_WORDS},
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
    let dropped = pmu_check(&mut out, pmu, health, cpu_nodes);
    (out, dropped)
}

/// The PMU pair's health checked on the machine-wide totals of `samples`, then every sample's
/// DRAM events marked as evidence or not (`pmu`: the attached pair, None when it did not
/// attach). Returns the reason when this read dropped the pair.
pub fn pmu_check(
    samples: &mut BTreeMap<u64, Sample>,
    pmu: Option<&EventPair>,
    health: &mut pmu::PmuHealth,
    cpu_nodes: usize,
) -> Option<String> {
    let dropped = pmu.and_then(|_| health.check(pmu_totals(samples), cpu_nodes));
    mark_pmu(samples, pmu.is_some() && health.trusted());
    dropped
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

/// The samples of the watched cgroups from their slots (`owners`: managed cgroup id → slot, in
/// id order): an indexed walk, no search and no sort. `cpu(i)` is word `i` of `SLOT_CPU` (a
/// slot's node `n` at `slot * slot_nodes + n`), `events(i)` word `i` of `SLOT_EVENTS` (a
/// [`SlotEvents`] per slot: [`CgEvents`]'s fields in order, then the pages per reason);
/// `reason_names[r]` names reason `r`. Nodes and reasons that counted nothing are left out,
/// and so are cgroups that counted nothing at all (not sampled yet: no entry, as the hash
/// maps would have none). DRAM events are scaled as [`fold`] scales them; `Sample::pmu` is
/// left false.
pub fn fold_slots(
    owners: &BTreeMap<u64, u32>,
    cpu: impl Fn(usize) -> u64,
    events: impl Fn(usize) -> u64,
    slot_nodes: u32,
    reason_names: &[String],
    local_includes_remote: bool,
) -> BTreeMap<u64, Sample> {
    let stride = slot_nodes as usize;
    let mut out = Vec::with_capacity(owners.len());
    for (&id, &slot) in owners {
        let slot = slot as usize;
        let mut s = Sample::default();
        let mut any = false;
        let nodes = (0..stride).filter_map(|n| {
            let ns = cpu(slot * stride + n);
            (ns != 0).then_some((n as u32, ns))
        });
        s.cpu_ns = nodes.collect();
        any |= !s.cpu_ns.is_empty();
        let e = slot * EVENT_WORDS;
        let mut field = |i: usize| {
            let v = events(e + i);
            any |= v != 0;
            v
        };
        s.migrations = field(0);
        s.cross_node_migrations = field(1);
        s.numa_moves = field(2);
        s.numa_stuck = field(3);
        s.pages_migrated = field(4);
        s.local_faults = field(5);
        s.remote_faults = field(6);
        s.remote_samples = field(7);
        s.local_samples = field(8);
        for (r, name) in reason_names
            .iter()
            .enumerate()
            .take(MAX_MIGRATE_REASONS as usize)
        {
            let pages = field(EVENT_FIELDS + r);
            if pages != 0 {
                s.pages_by_reason.insert(name.clone(), pages);
            }
        }
        if !any {
            continue;
        }
        (s.local_events, s.remote_events) =
            pmu::scale(local_includes_remote, s.local_samples, s.remote_samples);
        out.push((id, s));
    }
    out.into_iter().collect()
}

/// u64 fields of [`CgEvents`], the first words of a [`SlotEvents`].
const EVENT_FIELDS: usize = std::mem::size_of::<CgEvents>() / 8;
const _: () =
    assert!(EVENT_FIELDS == 9 && EVENT_WORDS == EVENT_FIELDS + MAX_MIGRATE_REASONS as usize);

/// Adds exact mode's time not yet flushed (per CPU: the cgroup running there and its time) to
/// the samples of the cgroups it is counted under (`watch_list`: cgroup id → managed id), on
/// its CPU's node; time of cgroups not watched is dropped. A cgroup with pending time only
/// gets a sample.
pub fn add_pending(
    out: &mut BTreeMap<u64, Sample>,
    pending: &[(u32, SwitchState)],
    watch_list: &BTreeMap<u64, u64>,
    cpu_node: impl Fn(u32) -> Option<u32>,
) {
    for (cpu, st) in pending {
        if st.pending_ns == 0 || st.cgroup_id == 0 {
            continue;
        }
        let Some(to) = watch_list.get(&st.cgroup_id) else {
            continue;
        };
        let ns = out
            .entry(*to)
            .or_default()
            .cpu_ns
            .entry(cpu_node(*cpu).unwrap_or(0))
            .or_default();
        *ns = ns.saturating_add(st.pending_ns);
    }
}

/// Names of reasons `0..MAX_MIGRATE_REASONS` (`reason<N>` when the format file has none).
fn reason_slots(names: &BTreeMap<u32, String>) -> Vec<String> {
    (0..MAX_MIGRATE_REASONS)
        .map(|r| {
            names
                .get(&r)
                .cloned()
                .unwrap_or_else(|| format!("reason{r}"))
        })
        .collect()
}

/// `SLOT_CPU` and `SLOT_EVENTS` mapped into this process.
struct SlotMaps {
    cpu: Mapped,
    events: Mapped,
    /// Node ids per slot in `SLOT_CPU`.
    slot_nodes: u32,
}

impl SlotMaps {
    fn new(ebpf: &Ebpf, slot_nodes: u32) -> Result<Self, EbpfError> {
        let map = |name: &'static str, bytes: usize| -> Result<Mapped, EbpfError> {
            let m = ebpf.map(name).ok_or(EbpfError::MissingMap(name))?;
            let aya::maps::Map::Array(data) = m else {
                return Err(EbpfError::MissingMap(name));
            };
            Mapped::new(data.fd().as_fd(), bytes)
                .map_err(|source| EbpfError::Mmap { map: name, source })
        };
        let slots = SLOTS as usize;
        Ok(Self {
            cpu: map("SLOT_CPU", slots * slot_nodes as usize * 8)?,
            events: map("SLOT_EVENTS", slots * std::mem::size_of::<SlotEvents>())?,
            slot_nodes,
        })
    }

    /// Zeroes `slot`'s counters.
    fn zero(&self, slot: u32) {
        let (slot, stride) = (slot as usize, self.slot_nodes as usize);
        self.cpu.zero(slot * stride, (slot + 1) * stride);
        self.events
            .zero(slot * EVENT_WORDS, (slot + 1) * EVENT_WORDS);
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
    /// `CFG_WATCHED_ONLY` is set in the programs' config: the programs count the watched
    /// cgroups in their slots, and reads walk the slots.
    flag_watched_only: bool,
    /// Which managed cgroup owns which counter slot.
    slots: Slots,
    /// `SLOT_CPU` and `SLOT_EVENTS` mapped into this process (None: the mapping failed; the
    /// programs then count every cgroup in the hash maps, see [`Sampler::watch_only`]).
    mapped: Option<SlotMaps>,
    /// The last watch list (cgroup id → the managed id it is counted under).
    watch_list: BTreeMap<u64, u64>,
    /// `WATCHED` as last written (cgroup id → slot); None: unknown after a failed write, read
    /// from the kernel at the next call.
    kernel_watched: Option<BTreeMap<u64, u32>>,
    /// The origin of the times the slots' rest is measured in.
    epoch: std::time::Instant,
    /// Name of each migrate reason, by number.
    reason_slots: Vec<String>,
    /// The `first` of the last [`Sampler::watch_only`] (a reload can reclassify cgroups).
    watching_first: Vec<u64>,
    /// `WATCHED` as last written (cgroup id → id counted under); None: not yet, or the last
    /// write fell short and is retried at the next call.
    watching: Option<BTreeMap<u64, u64>>,
    /// Ids in the maps but not in the hierarchy at the previous read.
    missing_before: HashSet<u64>,
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
    /// The maps read by syscalls: the hash maps (`read_raw`), or, watching, exact mode's
    /// pending time only; and the CPU counters (/proc/stat, per-CPU samples).
    pub maps: StepTime,
    /// Entries of cgroups gone found and deleted (the hash maps only).
    pub prune: StepTime,
    /// The samples built: [`fold`] of the hash maps, or, watching, the slots' walk
    /// ([`fold_slots`]); the PMU pair's check.
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

impl StepTime {
    fn plus(self, o: StepTime) -> StepTime {
        StepTime {
            wall: self.wall + o.wall,
            cpu: self.cpu + o.cpu,
        }
    }
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
        let mapped = match SlotMaps::new(&ebpf, loaded.slot_nodes) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(error = %e, "the counter slots could not be mapped: every cgroup is counted in the hash maps");
                None
            }
        };
        let reason_slots = reason_slots(&loaded.reason_names);
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
            flag_watched_only: false,
            slots: Slots::new(SLOTS),
            mapped,
            watch_list: BTreeMap::new(),
            kernel_watched: Some(BTreeMap::new()),
            epoch: std::time::Instant::now(),
            reason_slots,
            watching_first: Vec::new(),
            watching: None,
            missing_before: HashSet::new(),
            entries: 0,
            stale: 0,
            deleted: 0,
            stats_fd: None,
            steal: StealCorrection::new(clock, procfs::ns_per_tick(), None),
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

    /// Reads every map: cumulative samples per cgroup id since the sampler started. Watching
    /// ([`Sampler::watch_only`]): the watched cgroups' slots, walked in id order. Otherwise
    /// the hash maps: cgroups not in the v2 hierarchy are left out; their map entries are
    /// deleted once they are missing at two reads in a row (a cgroup created between the
    /// hierarchy walk and the map read is found by the next walk and keeps its counts).
    pub fn read(&mut self) -> Result<BTreeMap<u64, Sample>, EbpfError> {
        if let Some(l) = &mut self.logger {
            l.flush();
        }
        if self.flag_watched_only {
            if let Some(m) = &self.mapped {
                let t = Stopwatch::start();
                let mut out = fold_slots(
                    self.slots.owners(),
                    |i| m.cpu.load(i),
                    |i| m.events.load(i),
                    m.slot_nodes,
                    &self.reason_slots,
                    self.pmu.as_ref().is_some_and(|p| p.local_includes_remote),
                );
                let fold = t.stop();
                // After the slots: time flushed between the two reads is lost for this read
                // rather than counted twice.
                let t = Stopwatch::start();
                let pending = self.read_pending()?;
                let reading = self.cpu_reading();
                if let Some(r) = &reading {
                    self.perf.check_clock(&r.samples, std::time::Instant::now());
                }
                let maps = t.stop();
                let t = Stopwatch::start();
                add_pending(&mut out, &pending, &self.watch_list, |c| {
                    self.cpu_node.get(&c).copied()
                });
                self.check_pmu(&mut out);
                let fold = fold.plus(t.stop());
                let t = Stopwatch::start();
                self.steal.apply(reading, &self.cpu_node, &mut out);
                self.read_times = ReadTimes {
                    maps,
                    prune: StepTime::default(),
                    fold,
                    steal: t.stop(),
                };
                return Ok(out);
            }
        }
        self.refresh_paths();
        let t = Stopwatch::start();
        let raw = self.read_raw()?;
        let reading = self.cpu_reading();
        if let Some(r) = &reading {
            self.perf.check_clock(&r.samples, std::time::Instant::now());
        }
        let maps = t.stop();
        let t = Stopwatch::start();
        let (deleted, stale) = if self.paths.is_empty() {
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
        // Without a watch list (`rebalancer sample`, `top`, a daemon whose slots could not be
        // mapped) the maps' values are used as read: an evicted entry counts from 0 again.
        let mut out = fold(
            &raw,
            |c| self.cpu_node.get(&c).copied(),
            &self.reason_names,
            self.pmu.as_ref().is_some_and(|p| p.local_includes_remote),
        );
        self.check_pmu(&mut out);
        if !self.paths.is_empty() {
            out.retain(|id, _| self.paths.contains_key(id));
        }
        let fold = t.stop();
        let t = Stopwatch::start();
        self.steal.apply(reading, &self.cpu_node, &mut out);
        self.read_times = ReadTimes {
            maps,
            prune,
            fold,
            steal: t.stop(),
        };
        Ok(out)
    }

    /// The PMU pair's health checked on the machine-wide totals of `out`, and every sample's
    /// DRAM events marked as evidence or not.
    fn check_pmu(&mut self, out: &mut BTreeMap<u64, Sample>) {
        if let Some(why) = pmu_check(out, self.pmu.as_ref(), &mut self.pmu_health, self.cpu_nodes) {
            tracing::warn!(reason = %why, "PMU DRAM counters dropped: locality falls back to hinting faults or the share model");
            self.pmu_drop = Some(why);
        }
    }

    /// Exact mode's per-CPU time not yet flushed (cpu, state).
    fn read_pending(&self) -> Result<Vec<(u32, SwitchState)>, EbpfError> {
        let st: PerCpuArray<&MapData, SwitchState> = self.map("SWITCH_STATE")?;
        let vals: PerCpuValues<SwitchState> = st.get(&0, 0).map_err(|source| EbpfError::Map {
            map: "SWITCH_STATE",
            source,
        })?;
        Ok(vals
            .iter()
            .enumerate()
            .map(|(cpu, s)| (cpu as u32, *s))
            .collect())
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

    /// Per node, the steal factor the last read applied to new on-CPU time (absent: 1).
    pub fn steal_factors(&self) -> &BTreeMap<u32, f64> {
        self.steal.last_factors()
    }

    /// Entries in the per-cgroup maps (CPU_TIME, EVENTS, MIGRATE_REASONS) after the last
    /// [`Sampler::read`] pruned those of vanished cgroups: after churn it returns to the
    /// number for the live cgroups within two reads (see [`Sampler::read`]). Watching: the
    /// entries of `WATCHED` (the ids counted in slots) after the last [`Sampler::watch_only`].
    pub fn map_entries(&self) -> usize {
        self.entries
    }

    /// Entries, after the last read, of cgroups gone from the hierarchy: they are deleted at
    /// the next read (a cgroup must be missing at two reads in a row), so this is 0 two reads
    /// after the last cgroup went away. Anything else would be a leak. Watching: 0 (an id no
    /// longer watched loses its entry at once).
    pub fn stale_entries(&self) -> usize {
        self.stale
    }

    /// Entries deleted since the last call (by reads, of cgroups gone from the hierarchy for
    /// two reads; watching, from `WATCHED`, of ids no longer watched); the count starts again
    /// from 0.
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
        let cpu_time = self.read_hash::<CgNodeKey, u64>("CPU_TIME", batched)?;
        let pending = self.read_pending()?;
        let events = self.read_hash::<CgNodeKey, CgEvents>("EVENTS", batched)?;
        let reasons = self.read_hash::<CgReasonKey, u64>("MIGRATE_REASONS", batched)?;
        Ok(RawMaps {
            cpu_time,
            pending,
            events,
            reasons,
        })
    }

    /// Every entry of a shared hash map, one per key.
    fn read_hash<K: aya::Pod + Ord, V: aya::Pod>(
        &self,
        name: &'static str,
        batched: bool,
    ) -> Result<Vec<(K, V)>, EbpfError> {
        let m: HashMap<&MapData, K, V> = self.map(name)?;
        if batched {
            let fd = aya::maps::IterableMap::<K, V>::map(&m).fd().as_fd();
            match super::batch::read_hash::<K, V>(fd) {
                // The batch walk goes on from the bucket it stopped at: no key twice.
                Ok(Some(all)) => return Ok(all),
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
        Ok(super::batch::last_per_key(all))
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
        let paths = &self.paths;
        let missing: HashSet<u64> = raw_ids(raw).filter(|id| !paths.contains_key(id)).collect();
        let before = std::mem::replace(&mut self.missing_before, missing);
        let missing = &self.missing_before;
        let gone = |id: &u64| missing.contains(id) && before.contains(id);
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
        let dead: HashSet<u64> = cpu
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
    /// see `CFG_WATCHED_ONLY`), each managed cgroup in its own slot ([`Slots`]): `WATCHED` is
    /// brought in step (entries of ids no longer counted deleted, the slots given at this call
    /// zeroed, then the new entries written, then the flag, so no watched event is dropped and
    /// a new owner starts from 0), and reads walk the slots instead of the hash maps. Returns
    /// how many ids are not counted (more than `WATCHED` holds; logged). A managed cgroup that
    /// finds no free slot yet (freed slots rest first) waits for a later call.
    pub fn watch_only(
        &mut self,
        ids: &BTreeMap<u64, u64>,
        first: &[u64],
    ) -> Result<usize, EbpfError> {
        if self.watching.as_ref() == Some(ids) && self.watching_first == first {
            return Ok(0);
        }
        if self.mapped.is_none() {
            return Err(EbpfError::MissingMap("SLOT_CPU (not mapped)"));
        }
        self.watching_first = first.to_vec();
        let plan = plan_watch(ids, first, rebalancer_common::CG_MAP_ENTRIES as usize);
        let slots = self.slots.assign(&plan, self.epoch.elapsed());
        // What reads report from now on, even if writing `WATCHED` below falls short (a cgroup
        // dropped here is dropped by the engine too; one whose entry is not written counts
        // nothing until the next call writes it).
        self.watch_list = plan;
        let mut failed = false;
        let present = match self.kernel_watched.take() {
            Some(p) => p,
            None => {
                let m: HashMap<&MapData, u64, u32> = self.map("WATCHED")?;
                let mut present = BTreeMap::new();
                for item in m.iter() {
                    match item {
                        Ok((id, slot)) => {
                            present.insert(id, slot);
                        }
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
                present
            }
        };
        let mut written = present.clone();
        let mut m: HashMap<&mut MapData, u64, u32> = self.map_mut("WATCHED")?;
        // Removals first: an id no longer counted (or counted elsewhere) adds nothing more to
        // its old slot, and the room is the new entries'.
        let mut removed = 0;
        for (id, slot) in &present {
            if slots.entries.get(id) == Some(slot) {
                continue;
            }
            match m.remove(id) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {
                    written.remove(id);
                    removed += 1;
                }
                Err(_) => failed = true,
            }
        }
        // A slot given at this call rested since its last owner's entries went: zeroed now,
        // before any id points at it.
        if let Some(mapped) = &self.mapped {
            for &slot in &slots.zero {
                mapped.zero(slot);
            }
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let mut refused = ids.len() - self.watch_list.len();
        let mut m: HashMap<&mut MapData, u64, u32> = self.map_mut("WATCHED")?;
        for (id, slot) in &slots.entries {
            if written.get(id) == Some(slot) {
                continue;
            }
            if m.insert(id, slot, 0).is_ok() {
                written.insert(*id, *slot);
            } else {
                refused += 1;
                failed = true;
            }
        }
        self.deleted = self.deleted.saturating_add(removed);
        self.entries = written.len();
        self.stale = 0;
        self.kernel_watched = (!failed).then_some(written);
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
        if slots.waiting > 0 {
            tracing::debug!(
                waiting = slots.waiting,
                resting = self.slots.unowned_used(),
                "managed cgroups wait for a freed counter slot to rest"
            );
        }
        // Anything short of the whole plan written, or a cgroup waiting for a slot, is tried
        // again at the next call, not taken for done while the ids stay the same.
        self.watching = (!failed && slots.waiting == 0).then(|| ids.clone());
        Ok(refused)
    }

    /// Where the programs count per cgroup and how reads get it, for `probe`.
    pub fn counters(&self) -> String {
        let hash = "every cgroup (no watch list: `sample`, `top`) in LRU hash maps, read by \
                    BPF_MAP_LOOKUP_BATCH (entry by entry before Linux 5.6)";
        match &self.mapped {
            Some(m) => format!(
                "the daemon's watched cgroups in {SLOTS} slots of mmapable arrays \
                 (BPF_F_MMAPABLE, Linux 5.5+; {} node id(s) per slot), read from this \
                 process's mapping without syscalls; {hash}",
                m.slot_nodes
            ),
            None => format!("the counter slots could not be mapped: {hash} (the daemon too)"),
        }
    }

    /// The slot a managed cgroup's counts are in (watching).
    pub fn slot_of(&self, id: u64) -> Option<u32> {
        self.slots.owners().get(&id).copied()
    }

    /// `WATCHED` as the kernel holds it (cgroup id → slot), read entry by entry (for tests
    /// and diagnostics).
    pub fn watched_in_kernel(&self) -> Result<BTreeMap<u64, u32>, EbpfError> {
        let m: HashMap<&MapData, u64, u32> = self.map("WATCHED")?;
        m.iter()
            .map(|item| {
                item.map_err(|source| EbpfError::Map {
                    map: "WATCHED",
                    source,
                })
            })
            .collect()
    }

    /// The per-cgroup maps as the kernel describes them (`/proc/self/fdinfo` of each map's
    /// fd): name, `map_type`, `map_flags` and `memlock` bytes. Their memory must not grow with
    /// the number of possible CPUs (a per-CPU LRU map preallocates every entry on each of them).
    pub fn map_footprint(&self) -> Vec<(&'static str, u32, u32, u64)> {
        [
            "CPU_TIME",
            "EVENTS",
            "MIGRATE_REASONS",
            "WATCHED",
            "SLOT_CPU",
            "SLOT_EVENTS",
        ]
        .into_iter()
        .filter_map(|name| {
            let data = match self.ebpf.map(name)? {
                aya::maps::Map::LruHashMap(d)
                | aya::maps::Map::HashMap(d)
                | aya::maps::Map::PerCpuLruHashMap(d)
                | aya::maps::Map::PerCpuHashMap(d)
                | aya::maps::Map::Array(d) => d,
                _ => return None,
            };
            let raw = std::os::fd::AsRawFd::as_raw_fd(&data.fd().as_fd());
            let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{raw}")).ok()?;
            let field = |k: &str| {
                let v = info.lines().find_map(|l| l.strip_prefix(k))?.trim();
                match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok(),
                    None => v.parse::<u64>().ok(),
                }
            };
            Some((
                name,
                field("map_type:")? as u32,
                field("map_flags:")? as u32,
                field("memlock:")?,
            ))
        })
        .collect()
    }

    /// Benchmark helper: adds to the counters of `n` synthetic cgroup ids (starting at
    /// `first_id`) as the programs would, 1,000 ns on every node of `nodes` and one migration:
    /// into their slots when watching (ids without one are not counted), else into CPU_TIME
    /// and EVENTS (their entries set to those values).
    pub fn bench_fill(&mut self, first_id: u64, n: u64, nodes: &[u32]) -> Result<(), EbpfError> {
        if self.flag_watched_only {
            if let Some(m) = &self.mapped {
                let stride = m.slot_nodes as usize;
                for id in first_id..first_id + n {
                    let Some(&slot) = self.slots.owners().get(&id) else {
                        continue;
                    };
                    let slot = slot as usize;
                    for &node in nodes.iter().filter(|&&node| (node as usize) < stride) {
                        m.cpu.add(slot * stride + node as usize, 1_000);
                    }
                    m.events.add(slot * EVENT_WORDS, 1);
                }
                return Ok(());
            }
        }
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
                };
            let names = BTreeMap::from([(1, "numa_misplaced".to_string())]);
            let node_of = |cpu: u32| (cpu < 4).then_some(cpu % 2);
            proptest::prop_assert_eq!(
                fold(&raw, node_of, &names, lir),
                fold_by_search(&raw, node_of, &names, lir)
            );
        }
    }

    proptest::proptest! {
        /// The slots' indexed walk gives every cgroup what the hash maps' fold gives for the
        /// same counts (one entry per non-zero (cgroup, node), events and reason): on-CPU time
        /// per node, each event field, pages per named and unnamed reason, scaled DRAM events;
        /// cgroups that counted nothing are absent from both.
        #[test]
        fn fold_slots_equals_the_fold_of_the_same_counts(
            slots in proptest::collection::btree_map(0u64..1_000, 0u32..8, 0..8),
            cpu in proptest::collection::vec(
                proptest::prop_oneof![proptest::strategy::Just(0u64), count()],
                8 * 3,
            ),
            events in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(0u64),
                    proptest::strategy::Just(0u64),
                    count()
                ],
                8 * EVENT_WORDS,
            ),
            lir: bool,
        ) {
            // Slots owned once each (a slot has one owner).
            let mut owners = BTreeMap::new();
            let mut taken = BTreeSet::new();
            for (id, slot) in slots {
                if taken.insert(slot) {
                    owners.insert(id, slot);
                }
            }
            let nodes = 3usize;
            let names = BTreeMap::from([(1, "numa_misplaced".to_string())]);
            let mut raw = RawMaps::default();
            for (&id, &slot) in &owners {
                let slot = slot as usize;
                for n in 0..nodes {
                    let v = cpu[slot * nodes + n];
                    if v != 0 {
                        raw.cpu_time.push((key(id, n as u32), v));
                    }
                }
                let w = &events[slot * EVENT_WORDS..(slot + 1) * EVENT_WORDS];
                let e = CgEvents {
                    migrations: w[0],
                    cross_node_migrations: w[1],
                    numa_moves: w[2],
                    numa_stuck: w[3],
                    pages_migrated: w[4],
                    local_faults: w[5],
                    remote_faults: w[6],
                    remote_events: w[7],
                    local_events: w[8],
                };
                if e != CgEvents::default() {
                    raw.events.push((key(id, 0), e));
                }
                for (r, &pages) in w[9..].iter().enumerate() {
                    if pages != 0 {
                        raw.reasons.push((CgReasonKey { cgroup_id: id, reason: r as u32, _pad: 0 }, pages));
                    }
                }
            }
            let got = fold_slots(
                &owners,
                |i| cpu[i],
                |i| events[i],
                nodes as u32,
                &reason_slots(&names),
                lir,
            );
            proptest::prop_assert_eq!(got, fold(&raw, |_| None, &names, lir));
        }
    }

    /// Exact mode's time not yet flushed counts for the cgroup it is counted under (a
    /// sub-cgroup's for its container), on its CPU's node; an unwatched cgroup's is dropped.
    #[test]
    fn pending_time_goes_to_the_cgroup_counted_under() {
        let st = |cg, ns| SwitchState {
            last_ns: 1,
            cgroup_id: cg,
            pending_ns: ns,
        };
        let mut out = BTreeMap::from([(10, Sample::default())]);
        out.get_mut(&10).unwrap().cpu_ns.insert(1, 100);
        let watch = BTreeMap::from([(10, 10), (11, 10), (20, 20)]);
        let pending = [
            (0, st(11, 5)),
            (1, st(10, 7)),
            (2, st(99, 1_000)),
            (3, st(20, 0)),
            (4, st(20, 3)),
        ];
        add_pending(&mut out, &pending, &watch, |c| Some(c % 2));
        assert_eq!(out[&10].cpu_ns, BTreeMap::from([(0, 5), (1, 107)]));
        assert_eq!(out[&20].cpu_ns, BTreeMap::from([(0, 3)]));
        assert_eq!(out.len(), 2, "the unwatched cgroup's time is dropped");
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

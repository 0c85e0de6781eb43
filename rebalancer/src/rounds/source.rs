//! Where each managed cgroup's CPU time per node (and the kernel's migration and NUMA counters)
//! come from: the eBPF sampler when it runs, otherwise /proc (each thread's utime+stime delta
//! charged to the node of the CPU it last ran on).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use crate::{
    cgroup::{classify_in, CgroupKind, Cgroups, Controller},
    config::Config,
    daemon::{Daemon, Io},
    ebpf::Sample,
    procfs,
    topology::Topology,
};

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

/// Starts the eBPF samplers (when enabled), records every source's status, and picks the
/// per-cgroup CPU-time source: eBPF where the cpuset hierarchy is v2 (its ids are v2 ids),
/// /proc otherwise.
pub fn start(io: &mut Io, d: &Daemon, cgroups: &Cgroups) -> Box<dyn CpuTimeSource> {
    let (topo, ebpf_cfg) = {
        let s = d.lock(io);
        (s.topology().clone(), s.config().ebpf.clone())
    };
    let proc_source = || Box::new(ProcCpuTime::new("/proc".as_ref())) as Box<dyn CpuTimeSource>;
    if !ebpf_cfg.enabled {
        tracing::info!(
            "eBPF disabled by config (ebpf.enabled = false); running on memory.numa_stat and /proc"
        );
        return proc_source();
    }
    let (sampler, statuses) = crate::ebpf::Sampler::start(&topo, &ebpf_cfg);
    for st in &statuses {
        let attached = if st.available { "attached" } else { "skipped" };
        tracing::info!(source = %st.name, reason = %st.reason, "eBPF source {attached}");
        super::report_source(io, d, st.clone());
    }
    let v2 = cgroups
        .hierarchy(Controller::Cpuset)
        .is_ok_and(|(_, v)| v == crate::cgroup::Version::V2);
    let unified = cgroups.mounts().v2.is_some();
    let cpu_from_proc = (sampler.is_some() && !ebpf_counts_cpu(&statuses)).then(|| {
        tracing::warn!("no eBPF on-CPU source attached: per-cgroup CPU time comes from /proc, the other counters from eBPF");
        ProcCpuTime::new("/proc".as_ref())
    });
    match sampler {
        Some(sampler) if v2 => Box::new(EbpfCpuTime {
            sampler,
            fallback: None,
            cpu_from_proc,
            containers: Vec::new(),
        }),
        Some(sampler) if unified => {
            tracing::info!("cpuset is on cgroup v1 here and eBPF ids are v2 ids: cgroups with a twin in the unified hierarchy (as runc makes them) are read from eBPF, the others from /proc");
            Box::new(EbpfCpuTime {
                sampler,
                fallback: Some(ProcCpuTime::new("/proc".as_ref())),
                cpu_from_proc,
                containers: Vec::new(),
            })
        }
        Some(_) => {
            tracing::info!("cpuset is on cgroup v1 and there is no cgroup2 mount for the eBPF ids; per-cgroup CPU time comes from /proc");
            proc_source()
        }
        None => {
            tracing::warn!(
                "no eBPF source could be attached; running on memory.numa_stat and /proc"
            );
            proc_source()
        }
    }
}

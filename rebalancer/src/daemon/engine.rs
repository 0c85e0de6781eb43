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
    cgroup::{classify_with_roots, CgroupError, CgroupKind, Cgroups, Controller},
    config::Config,
    controller::{
        self, CgroupFile, CgroupObs, CgroupWriteError, CgroupWriter, Constraints, NodeObs,
        Observations, Outcome,
    },
    cpuset::CpuSet,
    ebpf::Sample,
    procfs,
    serve::metrics::{NodeLabel, ReasonLabel},
    topology::{sysfs, Topology},
};

use super::Daemon;

/// Where per-node CPU time (and the kernel's migration / NUMA counters) of each cgroup come from.
pub trait CpuTimeSource: Send {
    /// Cumulative samples for each managed cgroup (keys are relative cgroup paths).
    fn cumulative(
        &mut self,
        cgroups: &Cgroups,
        managed: &[String],
        topo: &Topology,
    ) -> BTreeMap<String, Sample>;
    fn name(&self) -> &'static str;
    /// Entries in the eBPF per-cgroup maps after the last read, and how many of them belong
    /// to cgroups already gone (None without eBPF).
    fn map_entries(&self) -> Option<(usize, usize)> {
        None
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
}

impl CpuTimeSource for EbpfCpuTime {
    fn cumulative(
        &mut self,
        cgroups: &Cgroups,
        managed: &[String],
        topo: &Topology,
    ) -> BTreeMap<String, Sample> {
        let all = match self.sampler.read() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "reading the eBPF maps failed");
                BTreeMap::new()
            }
        };
        let mut out = BTreeMap::new();
        let mut rest = Vec::new();
        for cg in managed {
            match cgroups.cgroup_id(cg) {
                Ok(id) => {
                    out.insert(cg.clone(), all.get(&id).cloned().unwrap_or_default());
                }
                Err(_) => rest.push(cg.clone()),
            }
        }
        if let Some(proc) = &mut self.fallback {
            out.extend(proc.cumulative(cgroups, &rest, topo));
        }
        out
    }

    fn name(&self) -> &'static str {
        if self.fallback.is_some() {
            "ebpf+procfs"
        } else {
            "ebpf"
        }
    }

    fn map_entries(&self) -> Option<(usize, usize)> {
        Some((self.sampler.map_entries(), self.sampler.stale_entries()))
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
    ) -> BTreeMap<String, Sample> {
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
        self.totals.clone()
    }

    fn name(&self) -> &'static str {
        "procfs"
    }
}

/// The real cgroup writer over the cgroup layer (reads are the *effective* sets).
pub struct RealWriter<'a>(pub &'a Cgroups);

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

impl CgroupWriter for RealWriter<'_> {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        self.0
            .effective_cpus(cg)
            .map_err(|e| wrap(cg, CgroupFile::Cpus, e))
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        self.0
            .effective_mems(cg)
            .map_err(|e| wrap(cg, CgroupFile::Mems, e))
    }
    fn write_cpus(&mut self, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
        self.0
            .write_cpus(cg, cpus)
            .map_err(|e| wrap(cg, CgroupFile::Cpus, e))
    }
    fn write_mems(&mut self, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
        self.0
            .write_mems(cg, mems)
            .map_err(|e| wrap(cg, CgroupFile::Mems, e))
    }
    fn needs_memory_migrate(&self) -> bool {
        self.0
            .hierarchy(Controller::Cpuset)
            .is_ok_and(|(_, v)| v == crate::cgroup::Version::V1)
    }
    fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
        let (dir, _) = self
            .0
            .dir(Controller::Cpuset, cg)
            .map_err(|e| wrap(cg, CgroupFile::MemoryMigrate, e))?;
        let p = dir.join("cpuset.memory_migrate");
        std::fs::read_to_string(&p)
            .map(|s| s.trim() == "1")
            .map_err(|e| CgroupWriteError::from_io(cg, CgroupFile::MemoryMigrate, "", e))
    }
    fn set_memory_migrate(&mut self, cg: &str, on: bool) -> Result<(), CgroupWriteError> {
        self.0
            .set_memory_migrate(cg, on)
            .map_err(|e| wrap(cg, CgroupFile::MemoryMigrate, e))
    }
    fn move_pages(
        &mut self,
        cg: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError> {
        let pids = self
            .0
            .procs(Controller::Cpuset, cg)
            .map_err(|e| wrap(cg, CgroupFile::Pages, e))?;
        crate::pages::move_pids_pages(&pids, toward, max_bytes)
            .map_err(|e| CgroupWriteError::from_io(cg, CgroupFile::Pages, "", e))
    }
}

/// The control loop's long-lived I/O state.
pub struct Engine {
    pub cgroups: Cgroups,
    pub cpu_source: Box<dyn CpuTimeSource>,
    proc_root: PathBuf,
    prev_stat: Option<BTreeMap<u32, procfs::CpuTimes>>,
    prev: BTreeMap<String, Sample>,
    last_round: Option<Instant>,
    started: Instant,
    /// Online CPUs and nodes at the last topology check (see [`Engine::refresh_topology`]).
    topo_fingerprint: Option<String>,
}

impl Engine {
    pub fn new(cgroups: Cgroups, cpu_source: Box<dyn CpuTimeSource>, proc_root: &Path) -> Engine {
        Engine {
            cgroups,
            cpu_source,
            proc_root: proc_root.to_path_buf(),
            prev_stat: None,
            prev: BTreeMap::new(),
            last_round: None,
            started: Instant::now(),
            topo_fingerprint: None,
        }
    }

    /// Managed cgroups: Kubernetes containers (when enabled) and cgroups with processes at or
    /// below a configured root. Paths are relative, without a leading '/'.
    pub fn managed(&self, cfg: &Config) -> Vec<String> {
        let Ok(all) = self.cgroups.walk(Controller::Cpuset, "") else {
            return Vec::new();
        };
        all.into_iter()
            .map(|p| p.trim_start_matches('/').to_string())
            .filter(|p| match classify_with_roots(p, &cfg.cgroups.roots) {
                CgroupKind::Container { .. } => cfg.cgroups.kubernetes,
                CgroupKind::Configured { .. } => self
                    .cgroups
                    .procs(Controller::Cpuset, p)
                    .is_ok_and(|v| !v.is_empty()),
                _ => false,
            })
            .collect()
    }

    fn node_obs(&mut self, cfg: &Config, topo: &Topology) -> BTreeMap<u32, NodeObs> {
        let stat = procfs::read_stat(&self.proc_root).ok();
        let busy = match (&self.prev_stat, &stat) {
            (Some(a), Some(b)) => procfs::busy_between(a, b),
            _ => BTreeMap::new(),
        };
        self.prev_stat = stat;
        let node_dir = cfg.daemon.sysfs_root.join("devices/system/node");
        topo.nodes
            .iter()
            .map(|n| {
                let cpus: Vec<f64> = n
                    .cpus
                    .iter()
                    .filter_map(|c| busy.get(&c).copied())
                    .collect();
                let cpu_busy = if cpus.is_empty() {
                    0.0
                } else {
                    cpus.iter().sum::<f64>() / cpus.len() as f64
                };
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
                        runnable: None,
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
    /// topology was rebuilt. A tree that cannot be read keeps the old topology (and is tried
    /// again next round).
    pub fn refresh_topology(&mut self, d: &Daemon) -> bool {
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
        super::watcher::replace_offline(&mut s, &self.cgroups);
        true
    }

    /// Runs one round. Returns the number of moves applied.
    pub fn round(&mut self, d: &Daemon) -> usize {
        let t0 = Instant::now();
        tracing::debug!("round start");
        self.refresh_topology(d);
        let (cfg, topo) = {
            let s = d.lock();
            (s.cfg.clone(), s.topo.clone())
        };
        let managed = self.managed(&cfg);
        let cumulative = self.cpu_source.cumulative(&self.cgroups, &managed, &topo);
        let period_ns = self
            .last_round
            .map_or(cfg.controller.period_ms * 1_000_000, |t| {
                t.elapsed().as_nanos() as u64
            });
        self.last_round = Some(Instant::now());
        let nodes = self.node_obs(&cfg, &topo);

        let mut obs = Observations {
            period_ns,
            cgroups: Vec::new(),
            nodes,
            reserved_cpus: cfg.reserved_cpus(),
        };
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
                let delta = now.delta(self.prev.get(cg).unwrap_or(&Sample::default()));
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
                let faults = delta.local_faults + delta.remote_faults > 0;
                let mut mem = numa.anon.clone();
                for (n, b) in &numa.file {
                    *mem.entry(*n).or_default() += b;
                }
                let constraints = self.constraints(d, &topo, cg, &cpus);
                obs.cgroups.push(CgroupObs {
                    id: cg.clone(),
                    cpu_ns_per_node,
                    mem_bytes_per_node: mem,
                    hugepage_bytes_per_node: numa.hugetlb.clone(),
                    cross_node_migrations: delta.cross_node_migrations,
                    numa_moves: delta.numa_moves,
                    remote_faults: faults.then_some(delta.remote_faults),
                    local_faults: faults.then_some(delta.local_faults),
                    remote_events: (delta.remote_events > 0).then_some(delta.remote_events),
                    cpus,
                    mems,
                    constraints,
                    ..Default::default()
                });
            }
        }
        self.prev = cumulative;

        let now_ms = self.started.elapsed().as_millis() as u64;
        let plan = {
            let mut s = d.lock();
            s.state.controller.observe(&obs, cfg.controller.ewma_alpha);
            controller::plan(&topo, &obs, &s.state.controller, &cfg.controller, now_ms)
        };

        let applied = {
            let cgroups = &self.cgroups;
            super::apply::apply_moves_concurrently(
                d,
                || RealWriter(cgroups),
                cfg.controller.apply_threads as usize,
                &plan.moves,
                now_ms,
                cfg.daemon.dry_run,
            )
            .applied
        };

        // Publish.
        let mut scores = Vec::new();
        {
            let mut s = d.lock();
            s.decisions = plan
                .decisions
                .iter()
                .map(|dc| (dc.cgroup.clone(), dc.clone()))
                .collect();
            for dc in &plan.decisions {
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
        }
        if let Err(e) = d.checkpoint() {
            tracing::warn!(error = %e, "checkpoint failed");
        }
        d.metrics.set_cgroup_scores(&scores);
        d.metrics.managed_cgroups.set(managed.len() as i64);
        if let Some((n, stale)) = self.cpu_source.map_entries() {
            d.metrics.ebpf_map_entries.set(n as i64);
            d.metrics.ebpf_map_stale_entries.set(stale as i64);
        }
        for (id, n) in &obs.nodes {
            let l = NodeLabel {
                node: id.to_string(),
            };
            d.metrics.node_cpu_busy.get_or_create(&l).set(n.cpu_busy);
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
            applied,
            source = self.cpu_source.name(),
            "round done"
        );
        applied
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

/// Constraints of a cgroup bound to an admitted container (None when not bound).
fn bound_constraints(s: &super::Shared, cg: &str) -> Option<Constraints> {
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

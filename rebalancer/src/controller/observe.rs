//! What the controller sees each period: per managed cgroup (CPU time and memory per node,
//! migration and remote-access evidence, current cpuset, admission constraints) and per node
//! (CPU busy, free memory and hugepages). Plain data, filled by the sampler / cgroup readers and
//! by hand in tests; nothing here does I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

/// Admission constraints of one workload, kept with it for its whole life so a later move never
/// breaks what admission promised. The admission code fills it; the default is "anything goes".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Constraints {
    /// Nodes the workload may use at all (policy, device affinity); `None` = every node.
    pub allowed_nodes: Option<CpuSet>,
    /// Guaranteed container with exclusive CPUs: `exclusive_cpus` CPUs, moved as whole cores
    /// and only when `controller.move_exclusive` is set.
    pub exclusive: bool,
    /// Number of exclusive CPUs (0 = keep the current count).
    pub exclusive_cpus: u32,
    /// Uses hugepages: a target must have free hugepages for what would migrate.
    pub needs_hugepages: bool,
    /// Topology policy single-numa-node: a target is always exactly one node.
    pub single_numa_node: bool,
    /// At most this many nodes (`None` = no limit besides what the workload needs).
    pub max_nodes: Option<u32>,
    /// Pinned by the operator (or adopted from an external writer): never moved.
    pub pinned: bool,
    /// The operator owns cpuset.cpus (a cgroup we did not admit): only its memory moves (to
    /// `allowed_nodes`, where its threads may run); its CPUs are never narrowed or widened, so
    /// a thread's later sched_setaffinity to any CPU of the cgroup keeps working.
    #[serde(default)]
    pub keep_cpus: bool,
    /// A move of this cgroup is still being applied (its migration runs on a writer thread):
    /// it is not planned again until that move is done.
    #[serde(default)]
    pub moving: bool,
}

/// One managed cgroup's measurements over the last period.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupObs {
    /// The cgroup's path relative to the hierarchy root; its identity everywhere.
    pub id: String,
    /// On-CPU nanoseconds per node during the period (eBPF deltas).
    pub cpu_ns_per_node: BTreeMap<u32, u64>,
    /// Resident memory per node (memory.numa_stat anon + file), bytes.
    pub mem_bytes_per_node: BTreeMap<u32, u64>,
    /// Hugetlb memory per node, bytes (separate: it needs free hugepages on the target).
    pub hugepage_bytes_per_node: BTreeMap<u32, u64>,
    /// Scheduler migrations across nodes during the period.
    pub cross_node_migrations: u64,
    /// NUMA-balancing task moves/swaps during the period.
    pub numa_moves: u64,
    /// NUMA hinting faults on remote / local pages, when the kernel lets us count them.
    pub remote_faults: Option<u64>,
    pub local_faults: Option<u64>,
    /// PMU remote / local DRAM access samples, where the hardware has such events.
    pub remote_events: Option<u64>,
    pub local_events: Option<u64>,
    /// Bytes written during the period per node of the page (soft-dirty sampling, see
    /// `crate::written`); empty when not measured.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub written_bytes_per_node: BTreeMap<u32, u64>,
    /// Current cpuset.cpus / cpuset.mems.
    pub cpus: CpuSet,
    pub mems: CpuSet,
    pub constraints: Constraints,
}

impl CgroupObs {
    pub fn total_cpu_ns(&self) -> u64 {
        self.cpu_ns_per_node
            .values()
            .fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Memory (normal + hugepages) on `node`, bytes.
    pub fn mem_on(&self, node: u32) -> u64 {
        self.mem_bytes_per_node
            .get(&node)
            .copied()
            .unwrap_or(0)
            .saturating_add(
                self.hugepage_bytes_per_node
                    .get(&node)
                    .copied()
                    .unwrap_or(0),
            )
    }

    /// All memory (normal + hugepages), bytes.
    pub fn total_mem(&self) -> u64 {
        self.mem_bytes_per_node
            .values()
            .chain(self.hugepage_bytes_per_node.values())
            .fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Nodes holding any of its memory or running any of its CPU time.
    pub fn touched_nodes(&self) -> CpuSet {
        self.cpu_ns_per_node
            .iter()
            .chain(&self.mem_bytes_per_node)
            .chain(&self.hugepage_bytes_per_node)
            .filter(|(_, &v)| v > 0)
            .map(|(&n, _)| n)
            .collect()
    }
}

/// One node's state over the last period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeObs {
    /// Fraction of the node's CPU time busy, 0..=1.
    pub cpu_busy: f64,
    /// MemFree of the node, bytes.
    pub free_bytes: u64,
    /// Free hugepages of the node (all sizes), bytes.
    pub free_hugepage_bytes: u64,
    /// CPUs' worth of runnable demand per CPU of the node (running + waiting on the run
    /// queue), ≥ `cpu_busy`; above 1 the node's tasks wait for a CPU. `None`: not measured
    /// (the planner then takes `cpu_busy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runnable: Option<f64>,
}

impl NodeObs {
    /// The busy share, sane: within 0..=1, and 1 (full) when not a number.
    pub fn busy(&self) -> f64 {
        if self.cpu_busy.is_finite() {
            self.cpu_busy.clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    /// Runnable demand per CPU where measured (at least the busy share, at most 64), else the
    /// busy share.
    pub fn pressure(&self) -> f64 {
        let b = self.busy();
        self.runnable
            .filter(|r| r.is_finite() && *r >= 0.0)
            .map_or(b, |r| r.clamp(b, 64.0))
    }
}

/// Everything observed in one period.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observations {
    /// Length of the period the deltas cover, ns (CPU demand = on-CPU ns / period).
    pub period_ns: u64,
    /// Managed cgroups; order does not matter (the planner sorts by id).
    pub cgroups: Vec<CgroupObs>,
    /// Per node, keyed by node id; a node missing here is treated as full and idle-unknown.
    pub nodes: BTreeMap<u32, NodeObs>,
    /// CPUs never handed to workloads.
    pub reserved_cpus: CpuSet,
}

impl Observations {
    /// CPU demand of a cgroup in CPUs (1.0 = one CPU fully busy).
    pub fn cpu_demand(&self, cg: &CgroupObs) -> f64 {
        if self.period_ns == 0 {
            return 0.0;
        }
        cg.total_cpu_ns() as f64 / self.period_ns as f64
    }
}

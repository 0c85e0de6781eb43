//! Configuration: TOML parsed with `deny_unknown_fields` into a validated [`Config`].
//!
//! The documented default (`config/rebalancer.toml`) is embedded in the binary, so `rebalancer
//! run` needs no file; a file given with `--config` is parsed on its own (every key optional,
//! defaults from the code, which a test keeps equal to the documented file). Errors name the
//! file, the line and the key.

use std::path::{Path, PathBuf};

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

/// The documented default configuration, embedded.
pub const DEFAULT_TOML: &str = include_str!("../../config/rebalancer.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}:{line}:{column}: {message}")]
    Parse {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{origin}: invalid value for `{key}`: {message}")]
    Invalid {
        origin: String,
        key: &'static str,
        message: String,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub cgroups: CgroupConfig,
    pub ebpf: EbpfConfig,
    pub placement: PlacementConfig,
    pub controller: ControllerConfig,
    pub server: ServerConfig,
    pub kubernetes: KubernetesConfig,
}

/// Which door admits Kubernetes containers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdmissionMode {
    /// NRI when its socket exists at start, else the cgroup watcher.
    #[default]
    Auto,
    /// The NRI plugin: placement before the container's first instruction, real refusals.
    Nri,
    /// The inotify cgroup watcher (runtimes without NRI).
    Watcher,
    /// Neither (the admission API only).
    Off,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    pub admission: AdmissionMode,
    /// The runtime's NRI socket (containerd / CRI-O default).
    pub nri_socket: PathBuf,
    /// The plugin's NRI index: two digits, plugins are called in ascending order.
    pub nri_plugin_index: String,
    /// NRI mode: send the changes made outside the runtime's hooks (control-round moves,
    /// CPU-hotplug replacement, API admissions' shrink) to the runtime as unsolicited
    /// UpdateContainers as they are made (they are written to cgroupfs first either way;
    /// when off, they ride the runtime's next hook answers instead). `auto` (default): on
    /// only for a runtime known to be fixed — containerd ≥ 2.4.0 (earlier ones deadlock:
    /// containerd/containerd#13733; containerd 2.0.x, which names itself "v2", included) —
    /// and off for everything else: CRI-O (its NRI deadlock fix cri-o/cri-o#9835 is not
    /// merged, so no version is known to be fixed; set `true` to force them), an unknown
    /// runtime, or a version that does not parse (see
    /// `daemon::nri_updates::runtime_updates_safe`).
    pub nri_runtime_updates: RuntimeUpdates,
    /// kubelet's root directory: its `cpu_manager_state` / `memory_manager_state` under a
    /// static policy are adopted (exclusive, never re-placed). Empty: not read.
    pub kubelet_state_dir: PathBuf,
    /// Keep this node's NodeResourceTopology object (topology.node.k8s.io/v1alpha2, read by
    /// the scheduler plugin NodeResourceTopologyMatch) equal to the books. Off by default.
    pub export_topology: bool,
    /// The API server for the export: a kubeconfig file (its current context); empty: the
    /// pod's service account (in-cluster).
    pub kubeconfig: PathBuf,
    /// The node's name (the object's name); empty: `$NODE_NAME`, else the hostname.
    pub node_name: String,
    /// The least time between two writes of the object (changes in between are coalesced).
    pub export_interval_ms: u64,
}

/// `kubernetes.nri_runtime_updates`: `"auto"`, `true` or `false`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RuntimeUpdates {
    #[default]
    Auto,
    On,
    Off,
}

impl Serialize for RuntimeUpdates {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RuntimeUpdates::Auto => s.serialize_str("auto"),
            RuntimeUpdates::On => s.serialize_bool(true),
            RuntimeUpdates::Off => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for RuntimeUpdates {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            B(bool),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::B(true) => Ok(RuntimeUpdates::On),
            Raw::B(false) => Ok(RuntimeUpdates::Off),
            Raw::S(s) if s == "auto" => Ok(RuntimeUpdates::Auto),
            Raw::S(s) => Err(serde::de::Error::custom(format!(
                "nri_runtime_updates = {s:?}: expected \"auto\", true or false"
            ))),
        }
    }
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            admission: AdmissionMode::Auto,
            nri_socket: "/var/run/nri/nri.sock".into(),
            nri_plugin_index: "50".into(),
            nri_runtime_updates: RuntimeUpdates::Auto,
            kubelet_state_dir: "/var/lib/kubelet".into(),
            export_topology: false,
            kubeconfig: PathBuf::new(),
            node_name: String::new(),
            export_interval_ms: 1000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Stands for `/sys`: topology is read below it.
    pub sysfs_root: PathBuf,
    /// Where the daemon keeps its checkpoint (tmpfs by default: it lives as long as cgroupfs).
    pub state_dir: PathBuf,
    /// Compute and log everything, write nothing to cgroupfs.
    pub dry_run: bool,
    /// tracing filter, e.g. "info" or "rebalancer=debug".
    pub log_level: String,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            sysfs_root: "/sys".into(),
            state_dir: "/run/rebalancer/state".into(),
            dry_run: false,
            log_level: "info".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupConfig {
    /// Mount point of the cgroup filesystem(s).
    pub mount: PathBuf,
    /// Roots (relative to the hierarchy) whose children are managed, besides the Kubernetes
    /// kubepods hierarchy and systemd slices found automatically.
    pub roots: Vec<String>,
    /// Manage the Kubernetes kubepods hierarchy when present.
    pub kubernetes: bool,
    /// Where kubelet puts pod cgroups (its `--cgroup-root` + kubepods, relative to the
    /// hierarchy root, e.g. `/kubelet.slice/kubelet-kubepods.slice`). Unset: `kubepods` or
    /// `kubepods.slice` directly under the hierarchy root. Kubepods-looking cgroups anywhere
    /// else are never admitted (a delegated user subtree could make them).
    pub kubernetes_root: Option<String>,
}

impl Default for CgroupConfig {
    fn default() -> Self {
        Self {
            mount: "/sys/fs/cgroup".into(),
            roots: Vec::new(),
            kubernetes: true,
            kubernetes_root: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EbpfConfig {
    /// Load the eBPF programs; when false (or when the kernel refuses), the daemon runs on
    /// memory.numa_stat and /proc alone.
    pub enabled: bool,
    /// Raw PMU event (perf `config` value, hex or decimal string) counting remote-DRAM accesses;
    /// set together with `pmu_local_raw_event` (a ratio needs both sides), they replace the
    /// pair chosen for the CPU family (see `ebpf::pmu`).
    pub pmu_raw_event: Option<String>,
    /// Raw PMU event counting local-DRAM accesses (e.g. Intel MEM_LOAD_L3_MISS_RETIRED.LOCAL_DRAM
    /// `0x01d3` with REMOTE_DRAM `0x02d3` as `pmu_raw_event`).
    pub pmu_local_raw_event: Option<String>,
    /// Sampling frequency (Hz per CPU) of the timer-driven on-CPU sampler.
    pub sample_hz: u32,
    /// On-CPU time source: the cpu-clock sampler (cheap) or exact sched_switch accounting.
    pub on_cpu_source: OnCpuSource,
    /// Each cpu-clock sample also reads its CPU's run-queue length, so the planner sees tasks
    /// waiting for a CPU, not only the busy share (`ebpf::runq`). Off: the busy share alone.
    pub run_queue: bool,
}

/// How on-CPU time per (cgroup, node) is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnCpuSource {
    /// A perf_event program on the software cpu-clock at `sample_hz` per CPU.
    Sampled,
    /// A sched_switch tracepoint program timing every switch.
    Exact,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            pmu_raw_event: None,
            pmu_local_raw_event: None,
            sample_hz: 99,
            on_cpu_source: OnCpuSource::Sampled,
            run_queue: true,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyPolicy {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyScope {
    Container,
    Pod,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocationStrategy {
    Kubelet,
    LeastAllocated,
    MostAllocated,
}

/// CPU Manager policy (kubelet `--cpu-manager-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuManagerPolicy {
    /// No exclusive CPUs: every container runs on the shared pool, no CPU hints.
    None,
    /// Exclusive CPUs for Guaranteed containers with integer CPU requests.
    Static,
}

/// Memory Manager policy (kubelet `--memory-manager-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryManagerPolicy {
    /// No memory hints or reservations; cpuset.mems follows the CPUs.
    None,
    /// Guaranteed pods' memory and hugepages reserved on a NUMA group.
    Static,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SharedCpuPolicy {
    NumaAware,
    TopologyAware,
}

/// Memory reserved for the system on one node (Memory Manager `--reserved-memory`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservedMemory {
    pub node: u32,
    #[serde(default)]
    pub memory_bytes: u64,
    #[serde(default)]
    pub hugepages_2mi_bytes: u64,
    #[serde(default)]
    pub hugepages_1gi_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementConfig {
    pub policy: TopologyPolicy,
    pub scope: TopologyScope,
    pub prefer_closest_numa_nodes: bool,
    pub max_allowable_numa_nodes: u32,
    pub numa_allocation_strategy: AllocationStrategy,
    /// CPUs never handed to workloads: a cpulist in the file ("0-3,8"), checked as it is
    /// parsed (an error names the key).
    #[serde(with = "reserved_cpulist")]
    pub reserved_cpus: CpuSet,
    /// kubelet CPU Manager option strict-cpu-reservation: reserved CPUs are kept off the
    /// shared pool too (default: only off exclusive allocations).
    pub strict_cpu_reservation: bool,
    pub cpu_manager_policy: CpuManagerPolicy,
    pub memory_manager_policy: MemoryManagerPolicy,
    /// kubelet CPU Manager option distribute-cpus-across-cores.
    pub distribute_cpus_across_cores: bool,
    /// TAP memory topology: also bind Burstable containers' cpuset.mems to their pool's nodes
    /// under shared_cpu_policy "topology-aware" (off: mems left alone).
    pub tap_memory_topology: bool,
    /// TAP topology-cluster-affinity: exclusive CPUs packed into as few whole CPU clusters
    /// (cores sharing an L2 / L3 tag) as possible, shared pools narrowed to clusters.
    pub topology_cluster_affinity: bool,
    pub full_pcpus_only: bool,
    pub distribute_cpus_across_numa: bool,
    pub align_by_socket: bool,
    pub prefer_align_cpus_by_uncorecache: bool,
    /// Burstable containers: "numa-aware" (whole nodes, least allocated) or "topology-aware".
    pub shared_cpu_policy: SharedCpuPolicy,
    /// How far Burstable requests may overcommit a node's CPUs (1.0 = no overcommit).
    pub overcommit_ratio: f64,
    pub reserved_memory: Vec<ReservedMemory>,
    /// Extended resource name → device class, e.g. "nvidia.com/gpu" = "gpu".
    pub device_resources: std::collections::BTreeMap<String, crate::topology::DeviceClass>,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        let mut device_resources = std::collections::BTreeMap::new();
        device_resources.insert(
            "nvidia.com/gpu".to_string(),
            crate::topology::DeviceClass::Gpu,
        );
        device_resources.insert("amd.com/gpu".to_string(), crate::topology::DeviceClass::Gpu);
        Self {
            policy: TopologyPolicy::BestEffort,
            scope: TopologyScope::Container,
            prefer_closest_numa_nodes: false,
            max_allowable_numa_nodes: 8,
            numa_allocation_strategy: AllocationStrategy::Kubelet,
            reserved_cpus: CpuSet::new(),
            strict_cpu_reservation: false,
            cpu_manager_policy: CpuManagerPolicy::Static,
            memory_manager_policy: MemoryManagerPolicy::Static,
            distribute_cpus_across_cores: false,
            tap_memory_topology: false,
            topology_cluster_affinity: false,
            full_pcpus_only: false,
            distribute_cpus_across_numa: false,
            align_by_socket: false,
            prefer_align_cpus_by_uncorecache: false,
            shared_cpu_policy: SharedCpuPolicy::NumaAware,
            overcommit_ratio: 1.5,
            reserved_memory: Vec::new(),
            device_resources,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerConfig {
    /// Length of one control period.
    pub period_ms: u64,
    /// Cgroups whose smoothed locality is below this are candidates for a move.
    pub locality_threshold: f64,
    /// Minimum expected gain (locality points) before a move is worth it (hysteresis).
    pub min_gain: f64,
    /// No second move of a cgroup within this time.
    pub cooldown_ms: u64,
    /// Most memory migrated per `period_ms`, all cgroups together: a rate (the moves under way
    /// and those that ended within the last period count against every round).
    pub migration_budget_mib: u64,
    /// Writer threads applying moves at the same time (1 = one after the other). A round hands
    /// its moves to them and does not wait for their migrations.
    pub apply_threads: u32,
    /// Nice value of the writer threads while they migrate a workload's pages (-20..=19). A
    /// workload pays its migration either way (AutoNUMA migrates in the faulting task, which
    /// waits for it); ahead of the workloads' own threads the migration ends sooner and the
    /// workload runs local sooner. Absolute: 0 = the normal priority. Nice orders threads
    /// within one CPU cgroup only (pods in another get CPU by their cgroup's `cpu.weight`).
    pub apply_nice: i32,
    /// An operator's write to a managed cgroup's cpuset.cpus, or a new container's placement,
    /// starts a round this long after the last event of a burst (at most 4× after the first),
    /// so one round sees the whole burst; 0 = rounds on the period only.
    pub event_settle_ms: u64,
    /// Cost of migrating one GiB, in the same units as the saving (remote-access ns avoided).
    pub migration_cost_per_gib: f64,
    /// Horizon over which a move's saving is counted.
    pub horizon_ms: u64,
    /// Admission sees a node's measured load beyond its books once it has lasted this many
    /// control periods (the node's lowest pressure over them, `Allocator::overuse`): it then
    /// orders the shared pools that fit. 0 (the default: in the simulator's table every value
    /// tried lost more runs than it won, BENCHMARKS.md): admission balances by requests only.
    pub admission_load_periods: u32,
    /// Move Guaranteed (exclusive-CPU) containers too (as whole cores).
    pub move_exclusive: bool,
    /// A node at or above this CPU busy fraction is overloaded: its workloads become candidates
    /// (a relief move takes one to a node with room) and no move may push a node past it — except a relief move that takes contention away
    /// and leaves the node less pressed (runnable per CPU) than the most pressed node it
    /// leaves, where run queues (`ebpf::runq`) and the workload's own wait (`own_wait`) are
    /// measured.
    pub overload_busy: f64,
    /// Measure each workload's own wait on the run queues (`crate::runwait`: its threads'
    /// `run_delay`, summed per cgroup each round), so its demand on a crowded node is what it
    /// wants, not an estimate from its node's queue.
    pub own_wait: bool,
    /// What to do about kernel AutoNUMA (kernel.numa_balancing) when it is on.
    pub autonuma: AutoNuma,
    /// Sample which pages each managed workload writes (soft-dirty bits: /proc/PID/clear_refs
    /// and pagemap) and weight its locality by them instead of by resident memory (on by
    /// default; see `written` for what it reads). Costs one minor fault per written page per
    /// period; needs CONFIG_MEM_SOFT_DIRTY (checked at start, skipped with the reason in
    /// `status` and `probe` where absent).
    pub written_pages: bool,
    /// Removed keys (see [`REMOVED_CONTROLLER_KEYS`]): accepted so that an older file still
    /// loads, their value ignored; `Config::removed_keys` names the ones a file set.
    #[serde(default, skip_serializing, rename = "ewma_alpha")]
    pub removed_ewma_alpha: IgnoredAny,
    #[serde(default, skip_serializing, rename = "max_moves_per_round")]
    pub removed_max_moves_per_round: IgnoredAny,
    #[serde(default, skip_serializing, rename = "cross_node_migration_cost_us")]
    pub removed_cross_node_migration_cost_us: IgnoredAny,
    #[serde(default, skip_serializing, rename = "migration_trigger_per_s")]
    pub removed_migration_trigger_per_s: IgnoredAny,
}

/// `[controller]` keys that no longer exist: on the generated machines of the tune half
/// (`rebalancer simulate --machines N --half tune`) every other value tried decided as the
/// default did, so the default is now the controller's constant (`controller::EWMA_ALPHA`,
/// `MAX_MOVES_PER_ROUND`, `CROSS_NODE_MIGRATION_COST_US`, `MIGRATION_TRIGGER_PER_S`).
pub const REMOVED_CONTROLLER_KEYS: [&str; 4] = [
    "ewma_alpha",
    "max_moves_per_round",
    "cross_node_migration_cost_us",
    "migration_trigger_per_s",
];

/// Coexistence with the kernel's own NUMA balancing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AutoNuma {
    /// Leave it as it is and say nothing.
    Leave,
    /// Leave it, and warn at start that it moves pages behind our placements.
    Warn,
    /// Turn it off while the daemon runs (restored on exit).
    Disable,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            period_ms: 5000,
            locality_threshold: 0.8,
            min_gain: 0.1,
            cooldown_ms: 30_000,
            migration_budget_mib: 1024,
            apply_threads: 4,
            apply_nice: default_apply_nice(),
            event_settle_ms: 200,
            migration_cost_per_gib: 1.0,
            horizon_ms: 60_000,
            admission_load_periods: 0,
            move_exclusive: false,
            overload_busy: 0.9,
            own_wait: true,
            autonuma: AutoNuma::Warn,
            written_pages: true,
            removed_ewma_alpha: IgnoredAny,
            removed_max_moves_per_round: IgnoredAny,
            removed_cross_node_migration_cost_us: IgnoredAny,
            removed_migration_trigger_per_s: IgnoredAny,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Admission API unix socket (mode 0600).
    pub socket: PathBuf,
    /// Prometheus /metrics and /healthz listener.
    pub metrics_listen: String,
    /// A group whose members may also use the admission socket (root always may).
    pub socket_group: Option<String>,
    /// Admission API requests per second per client uid (with one second of burst); past it a
    /// client gets 429 Too Many Requests. 0: no limit.
    pub requests_per_second: u32,
    /// Open connections per listener (metrics, admission socket); past it the oldest connection
    /// without a request in flight is closed (at most a quarter of the fd limit each).
    pub max_connections: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            socket: "/run/rebalancer/rebalancer.sock".into(),
            metrics_listen: "127.0.0.1:9717".into(),
            socket_group: None,
            requests_per_second: 2000,
            max_connections: 256,
        }
    }
}

/// `placement.reserved_cpus` in the file: a cpulist string ("0-3,8") <-> [`CpuSet`].
mod reserved_cpulist {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::cpuset::CpuSet;

    pub fn serialize<S: Serializer>(set: &CpuSet, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(set)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CpuSet, D::Error> {
        let text = String::deserialize(d)?;
        CpuSet::parse(&text)
            .map_err(|e| serde::de::Error::custom(format!("placement.reserved_cpus {text:?}: {e}")))
    }
}

impl Config {
    /// Parses TOML text; `origin` names it in errors (a path or "<embedded default>").
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
            ConfigError::Parse {
                origin: origin.to_string(),
                line,
                column,
                message: e.message().to_string(),
            }
        })?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// The removed keys `text` sets (`controller.<key>`, see [`REMOVED_CONTROLLER_KEYS`]): the
    /// file loads, and the caller logs each as ignored. Empty when `text` is not TOML (then
    /// `parse` reports the error).
    pub fn removed_keys(text: &str) -> Vec<String> {
        let Ok(table) = toml::from_str::<toml::Table>(text) else {
            return Vec::new();
        };
        let Some(ctl) = table.get("controller").and_then(|c| c.as_table()) else {
            return Vec::new();
        };
        REMOVED_CONTROLLER_KEYS
            .iter()
            .filter(|k| ctl.contains_key(**k))
            .map(|k| format!("controller.{k}"))
            .collect()
    }

    /// Logs a warning for each removed key the file at `path` sets (nothing for the embedded
    /// default or an unreadable file: `load` reports that).
    pub fn warn_removed_keys(path: Option<&Path>) {
        let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
            return;
        };
        for key in Self::removed_keys(&text) {
            tracing::warn!(
                file = %path.map_or(String::new(), |p| p.display().to_string()),
                key,
                "configuration key removed: its value is ignored (the controller's constant \
                 decides); delete it from the file"
            );
        }
    }

    /// Loads `path`, or the embedded default when `None`.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            None => Config::parse(DEFAULT_TOML, "<embedded default>"),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                Config::parse(&text, &p.display().to_string())
            }
        }
    }

    /// The reserved CPUs as a set.
    pub fn reserved_cpus(&self) -> CpuSet {
        self.placement.reserved_cpus.clone()
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |key: &'static str, message: String| ConfigError::Invalid {
            origin: origin.to_string(),
            key,
            message,
        };
        let idx = self.kubernetes.nri_plugin_index.as_bytes();
        if idx.len() != 2 || !idx.iter().all(u8::is_ascii_digit) {
            return Err(bad(
                "kubernetes.nri_plugin_index",
                "must be two digits, e.g. \"50\"".into(),
            ));
        }
        if self.kubernetes.export_interval_ms == 0 {
            return Err(bad(
                "kubernetes.export_interval_ms",
                "must be at least 1 (the API server is written at most this often)".into(),
            ));
        }
        if self.placement.max_allowable_numa_nodes < 8 {
            return Err(bad(
                "placement.max_allowable_numa_nodes",
                "must be at least 8 (kubelet's minimum)".into(),
            ));
        }
        if !(self.placement.overcommit_ratio >= 1.0 && self.placement.overcommit_ratio <= 64.0) {
            return Err(bad(
                "placement.overcommit_ratio",
                "must be between 1.0 and 64.0".into(),
            ));
        }
        if !(1..=64).contains(&self.controller.apply_threads) {
            return Err(bad(
                "controller.apply_threads",
                "must be between 1 and 64".into(),
            ));
        }
        if !(-20..=19).contains(&self.controller.apply_nice) {
            return Err(bad(
                "controller.apply_nice",
                "must be between -20 and 19".into(),
            ));
        }
        if self.controller.event_settle_ms > 10_000 {
            return Err(bad(
                "controller.event_settle_ms",
                "must be at most 10000 (0 = rounds on the period only)".into(),
            ));
        }
        if self.controller.period_ms < 100 {
            return Err(bad("controller.period_ms", "must be at least 100".into()));
        }
        if !(0.0..=1.0).contains(&self.controller.locality_threshold) {
            return Err(bad(
                "controller.locality_threshold",
                "must be in [0, 1]".into(),
            ));
        }
        if !(0.0..=1.0).contains(&self.controller.min_gain) {
            return Err(bad("controller.min_gain", "must be in [0, 1]".into()));
        }
        if self.controller.migration_cost_per_gib < 0.0
            || !self.controller.migration_cost_per_gib.is_finite()
        {
            return Err(bad(
                "controller.migration_cost_per_gib",
                "must be a finite number >= 0".into(),
            ));
        }
        if !(self.controller.overload_busy > 0.0 && self.controller.overload_busy <= 1.0) {
            return Err(bad("controller.overload_busy", "must be in (0, 1]".into()));
        }
        if self.ebpf.sample_hz == 0 || self.ebpf.sample_hz > 10_000 {
            return Err(bad("ebpf.sample_hz", "must be between 1 and 10000".into()));
        }
        for (key, ev) in [
            ("ebpf.pmu_raw_event", &self.ebpf.pmu_raw_event),
            ("ebpf.pmu_local_raw_event", &self.ebpf.pmu_local_raw_event),
        ] {
            if let Some(ev) = ev {
                if parse_u64(ev).is_none() {
                    return Err(bad(
                        key,
                        format!("{ev:?} is not a decimal or 0x-hex number"),
                    ));
                }
            }
        }
        if self.ebpf.pmu_raw_event.is_some() != self.ebpf.pmu_local_raw_event.is_some() {
            return Err(bad(
                "ebpf.pmu_raw_event",
                "set pmu_raw_event (remote DRAM) and pmu_local_raw_event (local DRAM) together: \
                 one side alone gives no local/remote ratio"
                    .into(),
            ));
        }
        if self
            .server
            .metrics_listen
            .parse::<std::net::SocketAddr>()
            .is_err()
        {
            return Err(bad(
                "server.metrics_listen",
                format!("{:?} is not an address:port", self.server.metrics_listen),
            ));
        }
        if self.placement.distribute_cpus_across_cores && self.placement.full_pcpus_only {
            // kubelet refuses the two static policy options together
            return Err(bad(
                "placement.distribute_cpus_across_cores",
                "cannot be used with full_pcpus_only (kubelet refuses the pair)".into(),
            ));
        }
        if self.placement.align_by_socket && self.placement.policy == TopologyPolicy::SingleNumaNode
        {
            // kubelet refuses it too: one NUMA node per container cannot be socket-aligned
            return Err(bad(
                "placement.align_by_socket",
                "cannot be used with policy = \"single-numa-node\" (kubelet refuses the pair)"
                    .into(),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for r in &self.placement.reserved_memory {
            if !seen.insert(r.node) {
                return Err(bad(
                    "placement.reserved_memory",
                    format!("node {} listed twice", r.node),
                ));
            }
        }
        for root in &self.cgroups.roots {
            if root.split('/').any(|c| c == "..") {
                return Err(bad("cgroups.roots", format!("{root:?} contains `..`")));
            }
        }
        if let Some(k) = &self.cgroups.kubernetes_root {
            if k.split('/').any(|c| c == "..") || k.trim_matches('/').is_empty() {
                return Err(bad(
                    "cgroups.kubernetes_root",
                    format!("{k:?} must name a cgroup below the hierarchy root, without `..`"),
                ));
            }
        }
        Ok(())
    }
}

/// Parses "123" or "0x7b".
pub fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, column)
}

fn default_apply_nice() -> i32 {
    -10
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_file_parses_and_equals_code_defaults() {
        let cfg = Config::parse(DEFAULT_TOML, "config/rebalancer.toml").unwrap();
        assert_eq!(
            cfg,
            Config::default(),
            "config/rebalancer.toml and Config::default() drifted apart"
        );
    }

    #[test]
    fn a_removed_key_loads_as_the_default_and_is_named() {
        let old = "[controller]\newma_alpha = 0.3\nmax_moves_per_round = 9\n\
                   cross_node_migration_cost_us = 1.0\nmigration_trigger_per_s = 0.0\n";
        assert_eq!(Config::parse(old, "old.toml").unwrap(), Config::default());
        assert_eq!(
            Config::removed_keys(old),
            REMOVED_CONTROLLER_KEYS.map(|k| format!("controller.{k}"))
        );
        assert!(Config::removed_keys(DEFAULT_TOML).is_empty());
        // Removed from [controller] only: elsewhere the name is as unknown as any other.
        let err = Config::parse("[daemon]\newma_alpha = 0.3\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("ewma_alpha"), "{err}");
    }

    #[test]
    fn empty_file_is_all_defaults() {
        assert_eq!(Config::parse("", "x").unwrap(), Config::default());
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let err = Config::parse("[daemon]\ndry_run = true\nperiodd = 3\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.toml:3:"), "{err}");
        assert!(err.contains("periodd"), "{err}");
    }

    #[test]
    fn wrong_type_names_line() {
        let err = Config::parse("[controller]\n\nperiod_ms = \"fast\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.toml:3:"), "{err}");
    }

    #[test]
    fn reserved_cpus_is_a_cpuset_read_from_a_cpulist_and_written_back_as_one() {
        let cfg = Config::parse("[placement]\nreserved_cpus = \"0-3,8\"\n", "t.toml").unwrap();
        assert_eq!(cfg.placement.reserved_cpus, CpuSet::parse("0-3,8").unwrap());
        let text = toml::to_string(&cfg).unwrap();
        assert!(text.contains("reserved_cpus = \"0-3,8\""), "{text}");
        assert_eq!(Config::parse(&text, "round trip").unwrap(), cfg);
        let err = Config::parse("[placement]\nreserved_cpus = \"3-1\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.toml:2:"), "{err}");
        assert!(err.contains("placement.reserved_cpus \"3-1\""), "{err}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        for (text, key) in [
            (
                "[placement]\nreserved_cpus = \"0-\"",
                "placement.reserved_cpus",
            ),
            (
                "[placement]\nmax_allowable_numa_nodes = 4",
                "placement.max_allowable_numa_nodes",
            ),
            ("[controller]\nperiod_ms = 1", "controller.period_ms"),
            (
                "[server]\nmetrics_listen = \"nowhere\"",
                "server.metrics_listen",
            ),
            ("[cgroups]\nroots = [\"a/../../etc\"]", "cgroups.roots"),
            ("[ebpf]\npmu_raw_event = \"zz\"", "ebpf.pmu_raw_event"),
            (
                "[placement]\nfull_pcpus_only = true\ndistribute_cpus_across_cores = true",
                "placement.distribute_cpus_across_cores",
            ),
            (
                "[placement]\npolicy = \"single-numa-node\"\nalign_by_socket = true",
                "placement.align_by_socket",
            ),
            (
                "[placement]\ncpu_manager_policy = \"dynamic\"",
                "unknown variant `dynamic`",
            ),
            (
                "[ebpf]\npmu_raw_event = \"0x2d3\"\npmu_local_raw_event = \"x\"",
                "ebpf.pmu_local_raw_event",
            ),
            ("[ebpf]\npmu_raw_event = \"0x2d3\"", "pmu_local_raw_event"),
        ] {
            let err = Config::parse(text, "t.toml").unwrap_err().to_string();
            assert!(err.contains(key), "{text:?} gave {err}");
        }
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let err = Config::load(Some(Path::new("/nonexistent/rebalancer.toml")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/rebalancer.toml"), "{err}");
    }
}

//! Prometheus metrics (prometheus-client): one `Metrics` value shared by the control loop, the
//! admission API and the watcher, rendered in the OpenMetrics text format on `/metrics`.
//!
//! Names are prefixed `rebalancer_`, carry their unit, and counters end in `_total`. Per-cgroup
//! series are bounded: only the `top_n` worst-locality cgroups of the last round are exported.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

/// A per-cgroup series' labels: the cgroup, and the Kubernetes names where the daemon knows
/// them, to join with kube-state-metrics (`namespace`, `pod`, `container` from NRI; `pod_uid`
/// from the cgroup path, for the watcher too). Empty where unknown (Prometheus drops empty
/// labels).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CgroupLabel {
    pub cgroup: String,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub container: String,
}

/// What the runtime said a container cgroup is (NRI): its pod's namespace and name, its name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadNames {
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub container: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HugepageLabel {
    pub node: String,
    pub size: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// One more event of `reason` in a family counted by reason.
pub fn count(family: &Family<ReasonLabel, Counter>, reason: impl Into<String>) {
    family
        .get_or_create(&ReasonLabel {
            reason: reason.into(),
        })
        .inc();
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ComponentLabel {
    pub component: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerReasonLabel {
    pub listener: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvidenceLabel {
    pub evidence: String,
}

type FGauge = Gauge<f64, AtomicU64>;

/// Every metric the daemon exports. Cheap to clone (handles share their values).
#[derive(Clone)]
pub struct Metrics {
    registry: std::sync::Arc<Registry>,
    pub top_n: usize,
    /// Container cgroup → its Kubernetes names, as the NRI plugin learnt them (one entry per
    /// container the runtime runs: added at CreateContainer and Synchronize, removed with the
    /// container or its pod), for the per-cgroup series' labels.
    names: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, WorkloadNames>>>,
    pub cgroup_locality: Family<CgroupLabel, FGauge>,
    pub cgroup_remote_access: Family<CgroupLabel, FGauge>,
    pub cross_node_migrations: Counter,
    pub numa_balancing_moves: Counter,
    pub pages_migrated: Counter,
    pub moves_applied: Family<ReasonLabel, Counter>,
    /// Of `moves_applied`, those that ended without the narrowing cpuset.mems write (their
    /// pages moved; what was left is what others map: `daemon::apply`).
    pub moves_mems_left_wide: Counter,
    pub moves_skipped: Family<ReasonLabel, Counter>,
    pub admission_requests: Family<ResultLabel, Counter>,
    pub admission_rejections: Family<ReasonLabel, Counter>,
    /// Containers a dry run let start that it would have refused (NRI CreateContainer).
    pub dry_run_refusals: Counter,
    pub admission_duration: Histogram,
    pub round_duration: Histogram,
    /// Control rounds that observed nothing, by reason (`cgroup-walk`, `sample-read`).
    pub rounds_skipped: Family<ReasonLabel, Counter>,
    pub node_cpu_busy: Family<NodeLabel, FGauge>,
    /// Tasks running or waiting per CPU of a node over the last period (absent: not measured).
    pub node_runnable: Family<NodeLabel, FGauge>,
    pub node_memory_free: Family<NodeLabel, Gauge>,
    pub node_hugepages_free: Family<HugepageLabel, Gauge>,
    pub ebpf_source_available: Family<SourceLabel, Gauge>,
    pub ebpf_map_entries: Gauge,
    pub ebpf_map_stale_entries: Gauge,
    pub ebpf_map_deleted_entries: Counter,
    pub pmu_dropped: Counter,
    pub cgroups_by_evidence: Family<EvidenceLabel, Gauge>,
    pub moves_by_evidence: Family<EvidenceLabel, Counter>,
    pub moves_failed: Family<ReasonLabel, Counter>,
    pub managed_cgroups: Gauge,
    /// Managed cgroups whose cpuset.cpus the round trigger does not watch, by reason
    /// (`operator-writable`, `watch-limit`).
    pub trigger_unwatched: Family<ReasonLabel, Gauge>,
    /// inotify events of writes to watched cpuset.cpus files (about two per write), by whose
    /// content they show (`own`: the daemon's last write, no round; `other`: a round).
    pub trigger_writes: Family<ReasonLabel, Counter>,
    /// Liveness of the daemon's components (its `rebalancer_component_up` family).
    pub health: crate::health::Health,
    pub http_connections: Family<ListenerLabel, Gauge>,
    pub http_connections_closed: Family<ListenerReasonLabel, Counter>,
    pub inotify_watch_failures: Family<ReasonLabel, Counter>,
    /// 1 while the NRI plugin is registered with the runtime.
    pub nri_connected: Gauge,
    /// Container updates sent to the runtime outside its hooks, by result (applied, failed).
    pub nri_updates: Family<ReasonLabel, Counter>,
    /// NRI mode: container cpuset changes written to cgroupfs directly, by reason.
    pub nri_direct_writes: Family<ReasonLabel, Counter>,
    /// kubelet state files not adopted, by reason (read, parse, checksum, invalid, ...), and
    /// kubelet assignments refused (`refused`: CPUs offline or another placement's).
    pub kubelet_state_errors: Family<ReasonLabel, Counter>,
    /// Containers whose kubelet static assignments are adopted.
    pub kubelet_adopted: Gauge,
    /// Shared containers the last attempt could not set to their pool (still on CPUs that
    /// became exclusive): retried every round.
    pub shared_pool_pending: Gauge,
    /// Bound containers found running elsewhere than booked and set back (`daemon::reconcile`).
    pub books_repairs: Counter,
}

impl Metrics {
    pub fn new(top_n: usize) -> Metrics {
        let mut r = Registry::with_prefix("rebalancer");
        let m = Metrics {
            registry: Default::default(),
            top_n,
            names: Default::default(),
            cgroup_locality: Family::default(),
            cgroup_remote_access: Family::default(),
            cross_node_migrations: Counter::default(),
            numa_balancing_moves: Counter::default(),
            pages_migrated: Counter::default(),
            moves_applied: Family::default(),
            moves_mems_left_wide: Counter::default(),
            moves_skipped: Family::default(),
            admission_requests: Family::default(),
            admission_rejections: Family::default(),
            dry_run_refusals: Counter::default(),
            admission_duration: Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25,
            ]),
            round_duration: Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
            ]),
            rounds_skipped: Family::default(),
            node_cpu_busy: Family::default(),
            node_runnable: Family::default(),
            node_memory_free: Family::default(),
            node_hugepages_free: Family::default(),
            ebpf_source_available: Family::default(),
            ebpf_map_entries: Gauge::default(),
            ebpf_map_stale_entries: Gauge::default(),
            ebpf_map_deleted_entries: Counter::default(),
            pmu_dropped: Counter::default(),
            cgroups_by_evidence: Family::default(),
            moves_by_evidence: Family::default(),
            moves_failed: Family::default(),
            managed_cgroups: Gauge::default(),
            trigger_unwatched: Family::default(),
            trigger_writes: Family::default(),
            health: Default::default(),
            http_connections: Family::default(),
            http_connections_closed: Family::default(),
            inotify_watch_failures: Family::default(),
            nri_connected: Gauge::default(),
            nri_updates: Family::default(),
            nri_direct_writes: Family::default(),
            kubelet_state_errors: Family::default(),
            kubelet_adopted: Gauge::default(),
            shared_pool_pending: Gauge::default(),
            books_repairs: Counter::default(),
        };
        let component_up = Family::<ComponentLabel, Gauge>::default();
        r.register(
            "component_up",
            "1 while a daemon component (watcher, checkpointer, rounds, ...) is alive, 0 once dead",
            component_up.clone(),
        );
        let component_degraded = Family::<ComponentLabel, Gauge>::default();
        r.register(
            "component_degraded",
            "1 while a component works but not fully (e.g. the NodeResourceTopology export while the API server is down or refuses; /healthz says why)",
            component_degraded.clone(),
        );
        r.register(
            "http_connections",
            "Open connections per listener (metrics, api)",
            m.http_connections.clone(),
        );
        r.register(
            "http_connections_closed",
            "Connections closed by the daemon, by listener and reason (evicted, refused, idle, request_timeout)",
            m.http_connections_closed.clone(),
        );
        r.register(
            "inotify_watch_failures",
            "Cgroup directories the watcher could not watch, by errno (ENOSPC: fs.inotify.max_user_watches)",
            m.inotify_watch_failures.clone(),
        );
        r.register(
            "cgroup_locality_ratio",
            "Smoothed fraction of a cgroup's CPU time on nodes holding its memory (top-N worst)",
            m.cgroup_locality.clone(),
        );
        r.register(
            "cgroup_remote_access_ratio",
            "Estimated fraction of a cgroup's memory accesses that are remote (top-N worst)",
            m.cgroup_remote_access.clone(),
        );
        r.register(
            "cross_node_migrations",
            "Scheduler migrations of managed tasks across NUMA nodes",
            m.cross_node_migrations.clone(),
        );
        r.register(
            "numa_balancing_moves",
            "Kernel NUMA-balancing task moves/swaps seen by eBPF",
            m.numa_balancing_moves.clone(),
        );
        r.register(
            "pages_migrated",
            "Pages migrated by rebalancer's moves (what page moves reported, 0 when the pages were already in place; the planned figure where the cpuset.mems write migrates)",
            m.pages_migrated.clone(),
        );
        r.register(
            "moves_applied",
            "Placement moves applied, by reason",
            m.moves_applied.clone(),
        );
        r.register(
            "moves_mems_left_wide",
            "Moves applied that left cpuset.mems wider than their target: pages moved, only pages other processes map left behind",
            m.moves_mems_left_wide.clone(),
        );
        r.register(
            "moves_skipped",
            "Candidate moves not made, by reason",
            m.moves_skipped.clone(),
        );
        r.register(
            "admission_requests",
            "Admission requests, by result",
            m.admission_requests.clone(),
        );
        r.register(
            "admission_rejections",
            "Admission rejections, by reason",
            m.admission_rejections.clone(),
        );
        r.register(
            "dry_run_refusals",
            "Containers a dry run let start as the runtime made them that it would have refused",
            m.dry_run_refusals.clone(),
        );
        r.register_with_unit(
            "admission_duration",
            "Time to answer one admission",
            Unit::Seconds,
            m.admission_duration.clone(),
        );
        r.register_with_unit(
            "control_round_duration",
            "Time of one control round",
            Unit::Seconds,
            m.round_duration.clone(),
        );
        r.register(
            "control_rounds_skipped",
            "Control rounds skipped: the cgroup walk or the samples' read failed (nothing observed, moved or forgotten); the round loop stops reporting healthy after 10 periods of it",
            m.rounds_skipped.clone(),
        );
        r.register(
            "node_cpu_busy_ratio",
            "Fraction of a node's CPU time busy in the last period",
            m.node_cpu_busy.clone(),
        );
        r.register(
            "node_runnable_per_cpu",
            "Tasks running or waiting per CPU of a node in the last period, from the run queue \
             the eBPF cpu-clock samples read (absent where not measured: the planner then \
             takes the busy share)",
            m.node_runnable.clone(),
        );
        r.register_with_unit(
            "node_memory_free",
            "Free memory per node",
            Unit::Bytes,
            m.node_memory_free.clone(),
        );
        r.register(
            "node_hugepages_free",
            "Free hugepages per node and size",
            m.node_hugepages_free.clone(),
        );
        r.register(
            "ebpf_source_available",
            "1 when the eBPF/PMU source is loaded and attached",
            m.ebpf_source_available.clone(),
        );
        r.register(
            "pmu_dropped",
            "PMU DRAM counter pairs dropped as stuck at zero or implausible (locality then comes from other evidence)",
            m.pmu_dropped.clone(),
        );
        r.register(
            "cgroups_by_evidence",
            "Managed cgroups whose last round's locality score came from this evidence (hinting-faults, pmu, share-model, none)",
            m.cgroups_by_evidence.clone(),
        );
        r.register(
            "moves_by_evidence",
            "Moves planned, by the evidence the cgroup's locality score came from in that round",
            m.moves_by_evidence.clone(),
        );
        r.register(
            "ebpf_map_entries",
            "Entries of the eBPF watch list (cgroup ids counted in slots; without one, of the per-cgroup hash maps) after the last round",
            m.ebpf_map_entries.clone(),
        );
        r.register(
            "ebpf_map_stale_entries",
            "Of those, entries of cgroups already removed (0 with a watch list: deleted at once)",
            m.ebpf_map_stale_entries.clone(),
        );
        r.register(
            "ebpf_map_deleted_entries",
            "eBPF watch list entries deleted by the daemon: of cgroups gone, or no longer managed",
            m.ebpf_map_deleted_entries.clone(),
        );
        r.register(
            "moves_failed",
            "Moves that failed and were rolled back (or found their cgroup gone), by reason",
            m.moves_failed.clone(),
        );
        r.register(
            "trigger_writes",
            "inotify events of writes to managed cgroups' cpuset.cpus seen by the round trigger (about two per write), by whose content (own: what the daemon wrote there last; other: anything else, which brings a round forward)",
            m.trigger_writes.clone(),
        );
        r.register(
            "trigger_unwatched",
            "Managed cgroups whose cpuset.cpus the round trigger does not watch (their changes wait for the period), by reason",
            m.trigger_unwatched.clone(),
        );
        r.register(
            "managed_cgroups",
            "Cgroups under management",
            m.managed_cgroups.clone(),
        );
        r.register(
            "nri_connected",
            "1 while the NRI plugin is registered with the container runtime, else 0",
            m.nri_connected.clone(),
        );
        r.register(
            "nri_updates",
            "Container cpuset changes made outside the NRI hooks (moves, hotplug, API admissions) that the runtime applied or failed, by reason",
            m.nri_updates.clone(),
        );
        r.register(
            "nri_direct_writes",
            "NRI mode: container cpuset changes written to cgroupfs directly (not connected, or not a container of the runtime), by reason",
            m.nri_direct_writes.clone(),
        );
        r.register(
            "kubelet_state_errors",
            "kubelet CPU / Memory Manager state files not adopted (unreadable, unparsable, bad checksum, invalid), and assignments refused (refused: offline CPUs or another placement's), by reason",
            m.kubelet_state_errors.clone(),
        );
        r.register(
            "kubelet_adopted_containers",
            "Containers whose kubelet static CPU / Memory Manager assignments are adopted as exclusive",
            m.kubelet_adopted.clone(),
        );
        r.register(
            "shared_pool_pending_containers",
            "Shared containers whose cpuset the last attempt could not set to their pool (a failed write: they may still run on CPUs that became exclusive); retried every round",
            m.shared_pool_pending.clone(),
        );
        r.register(
            "books_repairs",
            "Bound containers found running on another cpuset than the books give them (an NRI answer the runtime did not wait for, a runtime write after ours, a failed write) and set back",
            m.books_repairs.clone(),
        );
        let m = Metrics {
            registry: std::sync::Arc::new(r),
            health: crate::health::Health::new(component_up, component_degraded),
            ..m
        };
        m.init_known_series();
        m
    }

    /// Creates, at 0, the series of every labelled counter whose label values are known in
    /// advance, as Prometheus client libraries advise: a family with no series is absent from
    /// a scrape, so `rate()` and `increase()` on it (alerts, panels) see no data instead of 0
    /// until its first event, and the first event's increase is lost. The values are those
    /// the code counts under (each list says where they come from); a value not listed still
    /// appears on its first use.
    fn init_known_series(&self) {
        let reasons = |f: &Family<ReasonLabel, Counter>, values: &[&str]| {
            for v in values {
                let _ = f.get_or_create(&ReasonLabel {
                    reason: v.to_string(),
                });
            }
        };
        // `daemon::apply::trigger_name`
        reasons(
            &self.moves_applied,
            &["poor-locality", "overloaded", "migrating"],
        );
        // `daemon::apply`: the budget, a blocked writer, the books' refusals (`move_allowed`)
        reasons(
            &self.moves_skipped,
            &[
                "budget",
                "blocked",
                "books-exclusive",
                "books-memory",
                "books-reserved",
                "books-shared-starved",
            ],
        );
        // `controller::actuator::ApplyError::reason` and the cgroup write's errno classes
        reasons(
            &self.moves_failed,
            &[
                "busy",
                "invalid",
                "no-space",
                "permission",
                "io",
                "vanished",
                "stale",
                "read",
                "verify",
                "empty-target",
                "rollback-failed",
                "stopped",
                "panic",
            ],
        );
        // `rounds`: a round that observed nothing
        reasons(&self.rounds_skipped, &["cgroup-walk", "sample-read"]);
        // `daemon::watcher`: errno of a watch that could not be added
        reasons(
            &self.inotify_watch_failures,
            &["ENOSPC", "ENOMEM", "EACCES", "other"],
        );
        // `daemon::nri_updates`: unsolicited updates' results
        reasons(&self.nri_updates, &["applied", "failed", "timeout"]);
        // `daemon::nri_updates::Direct::label`
        reasons(
            &self.nri_direct_writes,
            &["not-connected", "not-runtime-container"],
        );
        // `kubelet_files::KubeletStateError::reason`, and assignments refused
        reasons(
            &self.kubelet_state_errors,
            &[
                "read",
                "parse",
                "checksum",
                "invalid",
                "unverified",
                "unsupported",
                "kind",
                "size",
                "refused",
            ],
        );
        // kubelet's rejection reasons the allocator gives (`placement`)
        reasons(
            &self.admission_rejections,
            &[
                "TopologyAffinityError",
                "InsufficientCPU",
                "InsufficientMemory",
                "InsufficientDevices",
                "SMTAlignmentError",
                "MemoryNUMAGroupError",
            ],
        );
        // `daemon::admission::Admission::count`
        for result in ["admitted", "rejected", "invalid", "write_failed", "timeout"] {
            let _ = self.admission_requests.get_or_create(&ResultLabel {
                result: result.into(),
            });
        }
        // `rounds`: the evidence a moved cgroup's score came from
        for evidence in ["hinting-faults", "pmu", "share-model", "none"] {
            let _ = self.moves_by_evidence.get_or_create(&EvidenceLabel {
                evidence: evidence.into(),
            });
        }
    }

    fn names(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, WorkloadNames>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the Kubernetes names of container cgroup `cgroup`.
    pub fn name_workload(&self, cgroup: &str, names: WorkloadNames) {
        self.names().insert(cgroup.to_string(), names);
    }

    /// Forgets the names of `cgroup`, or of every container of pod `pod_uid`.
    pub fn forget_workload(&self, cgroup: Option<&str>, pod_uid: Option<&str>) {
        let mut n = self.names();
        if let Some(cg) = cgroup {
            n.remove(cg);
        }
        if let Some(uid) = pod_uid {
            n.retain(|_, w| w.pod_uid != uid);
        }
    }

    /// Forgets every name (the runtime lists all it runs again).
    pub fn forget_workloads(&self) {
        self.names().clear();
    }

    /// Replaces the per-cgroup series with the `top_n` lowest-locality cgroups, labelled with
    /// their Kubernetes names where known (`kubernetes_root`: kubelet's cgroup root, to read a
    /// pod's uid from a cgroup path).
    pub fn set_cgroup_scores(&self, scores: &[(String, f64, f64)], kubernetes_root: Option<&str>) {
        self.cgroup_locality.clear();
        self.cgroup_remote_access.clear();
        let mut sorted: Vec<&(String, f64, f64)> = scores.iter().collect();
        sorted.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let names = self.names();
        for (cg, locality, remote) in sorted.into_iter().take(self.top_n) {
            let known = names
                .get(cg.trim_start_matches('/'))
                .cloned()
                .unwrap_or_default();
            let pod_uid = crate::cgroup::kube::classify_in(cg, kubernetes_root, &[])
                .pod_uid()
                .map(str::to_string)
                .unwrap_or(known.pod_uid);
            let l = CgroupLabel {
                cgroup: cg.clone(),
                namespace: known.namespace,
                pod: known.pod,
                pod_uid,
                container: known.container,
            };
            self.cgroup_locality.get_or_create(&l).set(*locality);
            self.cgroup_remote_access.get_or_create(&l).set(*remote);
        }
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        // Silent components turn dead at the scrape, not only at the next /healthz.
        let _ = self.health.dead();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_with_units_and_totals() {
        let m = Metrics::new(2);
        m.pages_migrated.inc_by(5);
        m.admission_duration.observe(0.001);
        m.node_memory_free
            .get_or_create(&NodeLabel { node: "0".into() })
            .set(42);
        let uid = "8d5c3f2e-1b4a-4c6d-9e8f-7a6b5c4d3e2f";
        let b = format!("kubepods/burstable/pod{uid}/{}", "b".repeat(64));
        m.name_workload(
            &b,
            WorkloadNames {
                namespace: "shop".into(),
                pod: "db-0".into(),
                pod_uid: uid.into(),
                container: "postgres".into(),
            },
        );
        m.set_cgroup_scores(
            &[
                ("a".into(), 0.9, 0.1),
                (b.clone(), 0.2, 0.8),
                ("c".into(), 0.5, 0.5),
            ],
            None,
        );
        let text = m.render();
        for want in [
            "rebalancer_pages_migrated_total 5",
            "rebalancer_admission_duration_seconds_count 1",
            "rebalancer_node_memory_free_bytes{node=\"0\"} 42",
            &format!("rebalancer_cgroup_locality_ratio{{cgroup=\"{b}\",namespace=\"shop\",pod=\"db-0\",pod_uid=\"{uid}\",container=\"postgres\"}} 0.2"),
            "rebalancer_cgroup_locality_ratio{cgroup=\"c\",namespace=\"\",pod=\"\",pod_uid=\"\",container=\"\"} 0.5",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        // the watcher's view: no names, the pod's uid from the path; forgotten with its pod
        m.forget_workload(None, Some(uid));
        m.set_cgroup_scores(&[(b.clone(), 0.2, 0.8)], None);
        let text = m.render();
        let want = format!("rebalancer_cgroup_remote_access_ratio{{cgroup=\"{b}\",namespace=\"\",pod=\"\",pod_uid=\"{uid}\",container=\"\"}} 0.8");
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
        assert!(
            !text.contains("cgroup=\"a\""),
            "top-N must bound the cgroup series"
        );
    }
}

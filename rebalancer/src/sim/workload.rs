//! A workload trace (JSON): machine additions (synthetic devices, hugepages) and tasks — a real
//! admission [`Pod`] plus when it arrives and leaves, its initial memory and its phases
//! (CPU demand, memory and device intensity, memory growth).

use serde::{Deserialize, Serialize};

use crate::placement::pod::Pod;
use crate::topology::{HugePages, PciDevice, Topology};

const GIB: u64 = 1 << 30;

/// Why a workload file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("workload JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("task {task}: {msg}")]
    Task { task: String, msg: String },
    #[error("workload has duration_s = 0")]
    NoDuration,
}

/// A whole trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub name: String,
    /// Seed it was generated with (informational; the run is deterministic anyway).
    #[serde(default)]
    pub seed: u64,
    pub duration_s: u64,
    #[serde(default)]
    pub machine: MachineAdditions,
    pub tasks: Vec<Task>,
}

/// What the trace adds to the fixture's machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineAdditions {
    /// Synthetic PCI devices (e.g. GPUs on an EPYC fixture that has none); node `i` is the
    /// machine's `i`-th node with CPUs, wrapped modulo their count.
    #[serde(default)]
    pub devices: Vec<PciDevice>,
    /// 1 GiB hugepages reserved per node (replaces the fixture's count).
    #[serde(default)]
    pub hugepages_1g_per_node: Option<u64>,
}

/// One workload: a single-container pod and its behaviour over time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    pub pod: Pod,
    pub arrive_s: u64,
    /// Leaves at this time (absolute); `None` = stays to the end.
    #[serde(default)]
    pub leave_s: Option<u64>,
    /// Memory touched right after start, bytes.
    pub initial_mem_bytes: u64,
    /// Its memory is hugetlb (needs free hugepages; not moved by AutoNUMA).
    #[serde(default)]
    pub hugepages: bool,
    /// At least one; `at_s` relative to arrival, ascending, the first at 0.
    pub phases: Vec<Phase>,
}

/// Behaviour from `at_s` (after arrival) until the next phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub at_s: u64,
    /// CPUs it wants (1.0 = one CPU busy).
    pub cpus: f64,
    /// Fraction of all-local time stalled on memory, 0..=1.
    pub mem_intensity: f64,
    /// Fraction of time waiting on its device, 0..=1.
    #[serde(default)]
    pub io_intensity: f64,
    /// Memory growth, bytes per second.
    #[serde(default)]
    pub grow_bytes_per_s: u64,
    /// Cross-node scheduler migrations per second of its threads while its threads run on
    /// more than one node (a thread-spreading workload: many threads that sleep and wake).
    #[serde(default)]
    pub cross_node_migrations_per_s: f64,
}

impl Task {
    pub fn uid(&self) -> &str {
        &self.pod.uid
    }

    /// The phase in force `since_arrival_s` after arrival.
    pub fn phase_at(&self, since_arrival_s: u64) -> &Phase {
        let i = self
            .phases
            .partition_point(|p| p.at_s <= since_arrival_s)
            .max(1);
        &self.phases[i - 1]
    }

    /// Index of that phase (to notice phase changes).
    pub fn phase_index(&self, since_arrival_s: u64) -> usize {
        self.phases
            .partition_point(|p| p.at_s <= since_arrival_s)
            .max(1)
            - 1
    }
}

impl Workload {
    pub fn from_json(text: &str) -> Result<Workload, WorkloadError> {
        let w: Workload = serde_json::from_str(text)?;
        w.validate()?;
        Ok(w)
    }

    /// Phases present and ordered, sane numbers, unique uids, valid pods.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.duration_s == 0 {
            return Err(WorkloadError::NoDuration);
        }
        let mut seen = std::collections::BTreeSet::new();
        for t in &self.tasks {
            let bad = |msg: String| WorkloadError::Task {
                task: t.pod.uid.clone(),
                msg,
            };
            t.pod.validate().map_err(bad)?;
            if !seen.insert(t.uid()) {
                return Err(bad("uid used twice".into()));
            }
            if t.phases.first().map(|p| p.at_s) != Some(0) {
                return Err(bad("needs a first phase at 0".into()));
            }
            if t.phases.windows(2).any(|w| w[0].at_s >= w[1].at_s) {
                return Err(bad("phases must be in ascending at_s".into()));
            }
            if t.leave_s.is_some_and(|l| l <= t.arrive_s) {
                return Err(bad("leaves before it arrives".into()));
            }
            for p in &t.phases {
                let ok = |x: f64| x.is_finite() && x >= 0.0;
                if !ok(p.cpus) || !(0.0..=1.0).contains(&p.mem_intensity) || !ok(p.io_intensity) {
                    return Err(bad(format!("phase at {}s: bad numbers", p.at_s)));
                }
            }
        }
        Ok(())
    }

    /// The fixture's machine with this trace's additions.
    pub fn machine(&self, base: &Topology) -> Topology {
        let mut t = base.clone();
        // Devices sit on nodes with CPUs (a PCI device is never on a memory-only node).
        let ids: Vec<u32> = t
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.id)
            .collect();
        let n = ids.len().max(1) as u32;
        for d in &self.machine.devices {
            let mut d = d.clone();
            d.node = d
                .node
                .map(|x| ids.get((x % n) as usize).copied().unwrap_or(x));
            t.devices.retain(|o| o.address != d.address);
            t.devices.push(d);
        }
        t.devices.sort_by(|a, b| a.address.cmp(&b.address));
        if let Some(pages) = self.machine.hugepages_1g_per_node {
            for node in &mut t.nodes {
                // As the kernel reserves them: out of the node's free memory, as many as fit
                // (a small node gets fewer than asked; kubelet refuses a machine whose
                // hugepages exceed its memory).
                let pages = pages.min(node.memory_free_bytes / GIB);
                node.memory_free_bytes -= pages * GIB;
                node.hugepages.insert(
                    "1048576kB".into(),
                    HugePages {
                        total: pages,
                        free: pages,
                    },
                );
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str, want_err: Option<&str>) {
        match (Workload::from_json(json), want_err) {
            (Ok(_), None) => {}
            (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{json}: {e}"),
            (r, w) => panic!("{json}: got {r:?}, want error {w:?}"),
        }
    }

    const POD: &str = r#"{"uid":"a","containers":[{"name":"c","cpu_request_millis":1000}]}"#;

    #[test]
    fn workload_validation() {
        let task = |phases: &str, extra: &str| {
            format!(
                r#"{{"name":"w","duration_s":10,"tasks":[{{"pod":{POD},"arrive_s":0,"initial_mem_bytes":1{extra},"phases":{phases}}}]}}"#
            )
        };
        check(
            &task(r#"[{"at_s":0,"cpus":1,"mem_intensity":0.5}]"#, ""),
            None,
        );
        check(&task("[]", ""), Some("first phase at 0"));
        check(
            &task(
                r#"[{"at_s":0,"cpus":1,"mem_intensity":0.5},{"at_s":0,"cpus":1,"mem_intensity":0.5}]"#,
                "",
            ),
            Some("ascending"),
        );
        check(
            &task(r#"[{"at_s":0,"cpus":1,"mem_intensity":1.5}]"#, ""),
            Some("bad numbers"),
        );
        check(
            &task(
                r#"[{"at_s":0,"cpus":1,"mem_intensity":0.5}]"#,
                r#","leave_s":0"#,
            ),
            Some("leaves before"),
        );
        check(
            &task(r#"[{"at_s":0,"cpus":1,"mem_intensity":0.5,"x":1}]"#, ""),
            Some("unknown field"),
        );
        check(
            r#"{"name":"w","duration_s":0,"tasks":[]}"#,
            Some("duration_s"),
        );
    }

    #[test]
    fn phase_lookup() {
        let ph = |at_s| Phase {
            at_s,
            cpus: at_s as f64,
            mem_intensity: 0.0,
            cross_node_migrations_per_s: 0.0,
            io_intensity: 0.0,
            grow_bytes_per_s: 0,
        };
        let t = Task {
            pod: serde_json::from_str(POD).unwrap(),
            arrive_s: 5,
            leave_s: None,
            initial_mem_bytes: 0,
            hugepages: false,
            phases: vec![ph(0), ph(10), ph(20)],
        };
        for (s, want) in [(0, 0), (9, 0), (10, 1), (19, 1), (20, 2), (99, 2)] {
            assert_eq!(t.phase_index(s), want, "at {s}");
            assert_eq!(t.phase_at(s).at_s, [0, 10, 20][want]);
        }
    }
}

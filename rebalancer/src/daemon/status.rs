//! The status document (`GET /v1/status`, `rebalancer status`): one serde type built by the
//! daemon from its state and read by the CLI client, so the two sides cannot drift apart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Binding, Shared};
use crate::{
    controller::Decision,
    cpuset::CpuSet,
    placement::pod::{ContainerPlacement, Qos},
};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusDoc {
    pub nodes: Vec<StatusNode>,
    pub pods: Vec<StatusPod>,
    pub exclusive_cpus: CpuSet,
    pub reserved_cpus: CpuSet,
    /// cgroup path → admitted container.
    pub bindings: BTreeMap<String, Binding>,
    /// eBPF / PMU sources and why each runs or not (`ebpf::SourceStatus` as JSON).
    pub sources: Vec<serde_json::Value>,
    pub controller: StatusCounters,
    /// The last round's decision per cgroup.
    pub decisions: Vec<Decision>,
    pub dry_run: bool,
    /// Which door admits Kubernetes containers, and the NRI plugin's connection.
    #[serde(default)]
    pub admission: StatusAdmission,
    /// The NodeResourceTopology export (absent when off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_export: Option<crate::nrt::export::ExportStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusAdmission {
    pub mode: crate::config::AdmissionMode,
    pub nri_connected: bool,
    pub nri_socket: std::path::PathBuf,
    /// The runtime that configured the NRI plugin, and whether it gets unsolicited updates.
    #[serde(default)]
    pub nri_runtime: NriRuntime,
    /// kubelet's static assignments adopted, and the state files' errors.
    #[serde(default)]
    pub kubelet: super::kubelet::Status,
}

/// The runtime that answered the NRI plugin's Configure.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NriRuntime {
    pub name: String,
    pub version: String,
    /// Whether the daemon's own changes are also sent as unsolicited UpdateContainers
    /// (`kubernetes.nri_runtime_updates`), and why.
    pub unsolicited_updates: bool,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusNode {
    pub id: u32,
    pub cpus: CpuSet,
    pub memory_free_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusPod {
    pub uid: String,
    pub qos: Qos,
    pub containers: Vec<ContainerPlacement>,
    /// Pod scope, a pod admitted one container at a time: its totals' CPU (millicores) and the
    /// exclusive CPUs it holds for its containers still to come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<StatusHold>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusHold {
    pub totals_cpu_millis: u64,
    pub cpus: CpuSet,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusCounters {
    pub rounds: u64,
    pub moves_total: u64,
    pub bytes_migrated_total: u64,
    pub failed_moves_total: u64,
}

impl StatusDoc {
    /// The document for the daemon's state now.
    pub fn of(s: &Shared) -> StatusDoc {
        let a = &s.state.allocator;
        let c = &s.state.controller;
        StatusDoc {
            nodes: s
                .topo
                .nodes
                .iter()
                .map(|n| StatusNode {
                    id: n.id,
                    cpus: n.cpus.clone(),
                    memory_free_bytes: n.memory_free_bytes,
                })
                .collect(),
            pods: a
                .pods
                .iter()
                .map(|(uid, p)| StatusPod {
                    uid: uid.to_string(),
                    qos: p.qos,
                    containers: p.containers.iter().map(|c| c.placement.clone()).collect(),
                    hold: p.hold.as_ref().map(|h| StatusHold {
                        totals_cpu_millis: h
                            .totals
                            .cpu_limit_millis
                            .max(h.totals.cpu_request_millis),
                        cpus: h.cpus.clone(),
                    }),
                })
                .collect(),
            exclusive_cpus: a.exclusive_cpus(),
            reserved_cpus: a.reserved_cpus.clone(),
            bindings: s.state.bindings.clone(),
            sources: s.sources.clone(),
            controller: StatusCounters {
                rounds: c.rounds,
                moves_total: c.moves_total,
                bytes_migrated_total: c.bytes_migrated_total,
                failed_moves_total: c.failed_moves_total,
            },
            decisions: s.decisions.values().cloned().collect(),
            dry_run: s.cfg.daemon.dry_run,
            admission: StatusAdmission {
                mode: s.admission,
                nri_connected: s.nri_connected,
                nri_socket: s.cfg.kubernetes.nri_socket.clone(),
                nri_runtime: s.nri_runtime.clone(),
                kubelet: s.kubelet.clone(),
            },
            topology_export: s.topology_export.clone(),
        }
    }

    /// The readable form (`rebalancer status` without `--json`).
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let c = &self.controller;
        let _ = writeln!(
            s,
            "rounds {}  moves {}  migrated {} MiB  failed {}  dry-run {}",
            c.rounds,
            c.moves_total,
            c.bytes_migrated_total >> 20,
            c.failed_moves_total,
            self.dry_run
        );
        let _ = writeln!(
            s,
            "exclusive cpus: {}  reserved: {}",
            self.exclusive_cpus, self.reserved_cpus
        );
        if let Some(e) = &self.topology_export {
            let _ = writeln!(
                s,
                "topology export: {} (node {}, server {}, {} writes){}",
                e.state,
                e.node,
                e.server,
                e.writes,
                if e.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", e.reason)
                }
            );
        }
        for w in &self.admission.kubelet.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        for e in &self.admission.kubelet.errors {
            let _ = writeln!(s, "kubelet state error: {e}");
        }
        let _ = writeln!(
            s,
            "{:<38} {:<12} {:<16} {:<10} {:<9}",
            "pod/container", "qos", "cpus", "mems", "exclusive"
        );
        for p in &self.pods {
            for c in &p.containers {
                let _ = writeln!(
                    s,
                    "{:<38} {:<12} {:<16} {:<10} {:<9}",
                    format!("{}/{}", p.uid, c.container),
                    format!("{:?}", p.qos),
                    c.cpus,
                    c.mems,
                    c.exclusive
                );
            }
        }
        let _ = writeln!(
            s,
            "{:<60} {:>9} {:>9}  outcome",
            "cgroup", "locality", "smoothed"
        );
        let f = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
        for d in &self.decisions {
            let outcome = serde_json::to_string(&d.outcome).unwrap_or_default();
            let _ = writeln!(
                s,
                "{:<60} {:>9} {:>9}  {}",
                d.cgroup,
                f(d.locality),
                f(d.smoothed),
                outcome
            );
        }
        for src in &self.sources {
            let _ = writeln!(s, "source {src}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Config, topology::TopologyBuilder};

    #[test]
    fn the_document_round_trips_through_json_and_renders() {
        let topo = TopologyBuilder::default().build();
        let mut s = Shared::fresh(topo, Config::default()).unwrap();
        let pod = crate::daemon::admission::tests::pod("p", 2000, 64 << 20, true);
        let (topo, cfg) = (s.topo.clone(), s.cfg.placement.clone());
        s.state.allocator.admit(&topo, &cfg, &pod).unwrap();
        let doc = StatusDoc::of(&s);
        let back: StatusDoc = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
        assert_eq!(back, doc);
        assert_eq!(doc.pods.len(), 1);
        assert_eq!(doc.exclusive_cpus.len(), 2);
        let t = doc.table();
        assert!(t.contains("p/c"), "{t}");
        assert!(
            t.contains(&format!("exclusive cpus: {}", doc.exclusive_cpus)),
            "{t}"
        );
    }
}

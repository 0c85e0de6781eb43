//! The admission request body: a pod and its containers' requests and limits, the QoS class
//! kubelet derives from them, and the per-container placement / rejection answer types.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;
pub use crate::placement::memory::ContainerKind;
use crate::placement::NodeMask;

/// A pod to admit. Unknown fields are refused so typos fail loudly.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pod {
    pub uid: String,
    pub containers: Vec<Container>,
    /// Init containers in their start order; one with `restart_policy: "Always"` is a sidecar
    /// (restartable init container) that keeps running beside the app containers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<Container>,
}

/// One container. A zero request with a non-zero limit takes the limit as request (as
/// Kubernetes defaults it); zero means unset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Container {
    pub name: String,
    #[serde(default)]
    pub cpu_request_millis: u64,
    #[serde(default)]
    pub cpu_limit_millis: u64,
    /// Memory request.
    #[serde(default)]
    pub memory_bytes: u64,
    #[serde(default)]
    pub memory_limit_bytes: u64,
    #[serde(default)]
    pub hugepages_2mi_bytes: u64,
    #[serde(default)]
    pub hugepages_1gi_bytes: u64,
    /// Extended resources, e.g. {"nvidia.com/gpu": 1}.
    #[serde(default)]
    pub devices: BTreeMap<String, u32>,
    /// Specific PCI devices by address, e.g. ["0000:41:00.0"].
    #[serde(default)]
    pub device_addresses: Vec<String>,
    /// PCI devices the runtime already gave the container (its device nodes, resolved through
    /// sysfs at the NRI door): the device provider's hints come from them as from
    /// `device_addresses`, but they are not assigned, so containers that share a device (a
    /// GPU shared by design, a sidecar beside its app) are never refused as busy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attached_devices: Vec<String>,
    /// `"Always"` on an init container makes it a sidecar; nothing else is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
}

/// Kubernetes QoS class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Container {
    pub fn cpu_request(&self) -> u64 {
        if self.cpu_request_millis == 0 {
            self.cpu_limit_millis
        } else {
            self.cpu_request_millis
        }
    }

    pub fn memory_request(&self) -> u64 {
        if self.memory_bytes == 0 {
            self.memory_limit_bytes
        } else {
            self.memory_bytes
        }
    }

    fn guaranteed(&self) -> bool {
        self.cpu_limit_millis > 0
            && self.memory_limit_bytes > 0
            && self.cpu_request() == self.cpu_limit_millis
            && self.memory_request() == self.memory_limit_bytes
    }

    fn best_effort(&self) -> bool {
        self.cpu_request() == 0 && self.memory_request() == 0
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("container name is empty".into());
        }
        if self.cpu_limit_millis > 0 && self.cpu_request() > self.cpu_limit_millis {
            return Err(format!(
                "container {}: cpu request {}m above limit {}m",
                self.name, self.cpu_request_millis, self.cpu_limit_millis
            ));
        }
        if self.memory_limit_bytes > 0 && self.memory_request() > self.memory_limit_bytes {
            return Err(format!(
                "container {}: memory request above limit",
                self.name
            ));
        }
        if !self.hugepages_2mi_bytes.is_multiple_of(2 << 20)
            || !self.hugepages_1gi_bytes.is_multiple_of(1 << 30)
        {
            return Err(format!(
                "container {}: hugepages must be a multiple of the page size",
                self.name
            ));
        }
        Ok(())
    }
}

/// Uids with this prefix are the daemon's own (kubelet's adopted pods): never admitted.
pub const RESERVED_UID_PREFIX: &str = "kubelet:";

impl Pod {
    /// kubelet's `GetPodQOS` over cpu and memory: BestEffort when nothing is requested or
    /// limited, Guaranteed when every container has cpu and memory limits equal to requests.
    /// Init containers count as kubelet counts them.
    pub fn qos(&self) -> Qos {
        let all = || self.containers.iter().chain(&self.init_containers);
        if all().all(Container::best_effort) {
            Qos::BestEffort
        } else if !self.containers.is_empty() && all().all(Container::guaranteed) {
            Qos::Guaranteed
        } else {
            Qos::Burstable
        }
    }

    /// A non-empty uid not in the reserved `kubelet:` namespace (the daemon's adopted kubelet
    /// pods, `daemon::kubelet::KEY_PREFIX`), at least one container, unique container names,
    /// sane numbers.
    pub fn validate(&self) -> Result<(), String> {
        if self.uid.is_empty() {
            return Err("pod uid is empty".into());
        }
        if self.uid.starts_with(RESERVED_UID_PREFIX) {
            return Err(format!(
                "pod uid {:?}: the prefix {RESERVED_UID_PREFIX:?} is reserved for pods adopted from kubelet's state files",
                self.uid
            ));
        }
        if self.containers.is_empty() {
            return Err(format!("pod {} has no containers", self.uid));
        }
        let all: Vec<&Container> = self
            .init_containers
            .iter()
            .chain(&self.containers)
            .collect();
        for (i, c) in all.iter().enumerate() {
            c.validate()?;
            if all[..i].iter().any(|o| o.name == c.name) {
                return Err(format!("container name {} used twice", c.name));
            }
        }
        for c in &self.containers {
            if c.restart_policy.is_some() {
                return Err(format!(
                    "container {}: restart_policy is only allowed on init containers",
                    c.name
                ));
            }
        }
        for c in &self.init_containers {
            if c.restart_policy.as_deref().is_some_and(|p| p != "Always") {
                return Err(format!(
                    "init container {}: restart_policy must be \"Always\" (a sidecar) or absent",
                    c.name
                ));
            }
        }
        Ok(())
    }

    /// The containers in kubelet's allocation order (init containers, then app containers),
    /// each with its kind.
    pub fn in_order(&self) -> impl Iterator<Item = (&Container, ContainerKind)> {
        self.init_containers
            .iter()
            .map(|c| (c, c.kind_as_init()))
            .chain(self.containers.iter().map(|c| (c, ContainerKind::App)))
    }

    /// kubelet's effective pod request of one quantity (KEP 753): the larger of the
    /// init-container peak (each regular init container plus the sidecars started before it)
    /// and the long-running total (app containers plus sidecars).
    pub fn effective(&self, f: impl Fn(&Container) -> u64) -> u64 {
        let (mut peak, mut sidecars) = (0u64, 0u64);
        for c in &self.init_containers {
            if c.kind_as_init() == ContainerKind::Sidecar {
                sidecars = sidecars.saturating_add(f(c));
            } else {
                peak = peak.max(sidecars.saturating_add(f(c)));
            }
        }
        let apps = self
            .containers
            .iter()
            .map(&f)
            .fold(0u64, u64::saturating_add);
        let long = apps.saturating_add(sidecars);
        long.max(peak)
    }
}

impl Container {
    /// The kind of this container when it is one of the pod's init containers.
    pub fn kind_as_init(&self) -> ContainerKind {
        if self.restart_policy.as_deref() == Some("Always") {
            ContainerKind::Sidecar
        } else {
            ContainerKind::Init
        }
    }
}

/// Where one container goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerPlacement {
    pub container: String,
    /// cpuset.cpus (for a shared container: the pool at admission time).
    pub cpus: CpuSet,
    /// cpuset.mems.
    pub mems: CpuSet,
    /// The merged topology hint's affinity (`None` under policy none).
    pub affinity: Option<NodeMask>,
    /// Whether `cpus` are exclusive to this container.
    pub exclusive: bool,
    /// PCI addresses of the devices given to the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// The Topology Manager decision behind `affinity` (each provider's hints, the merged
    /// hint); None under policy none and for placements adopted from kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<crate::placement::decision::HintDecision>,
}

/// Why a pod was refused (kubelet's reason names where kubelet has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RejectionReason {
    /// Topology Manager: no preferred merged hint under restricted / single-numa-node.
    TopologyAffinityError,
    /// CPU Manager full-pcpus-only.
    #[serde(rename = "SMTAlignmentError")]
    SmtAlignmentError,
    #[serde(rename = "InsufficientCPU")]
    InsufficientCpu,
    InsufficientMemory,
    /// Memory Manager: the chosen nodes would mix single- and cross-node groups.
    #[serde(rename = "MemoryNUMAGroupError")]
    MemoryNumaGroupError,
    InsufficientDevices,
    UnknownDevice,
    InvalidPod,
    AlreadyAdmitted,
}

impl fmt::Display for RejectionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&s)
    }
}

/// A refused pod: the reason and a readable explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{reason}: {details}")]
pub struct Rejection {
    pub reason: RejectionReason,
    pub details: String,
}

impl Rejection {
    pub fn new(reason: RejectionReason, details: impl Into<String>) -> Self {
        Rejection {
            reason,
            details: details.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(cpu_req: u64, cpu_lim: u64, mem_req: u64, mem_lim: u64) -> Container {
        Container {
            name: "c".into(),
            cpu_request_millis: cpu_req,
            cpu_limit_millis: cpu_lim,
            memory_bytes: mem_req,
            memory_limit_bytes: mem_lim,
            ..Default::default()
        }
    }

    #[test]
    fn qos_is_derived_like_kubelet() {
        let cases = [
            (c(0, 0, 0, 0), Qos::BestEffort),
            (c(1000, 1000, 1, 1), Qos::Guaranteed),
            (c(0, 2000, 0, 5), Qos::Guaranteed),
            (c(500, 1000, 1, 1), Qos::Burstable),
            (c(1000, 1000, 1, 0), Qos::Burstable),
            (c(100, 0, 0, 0), Qos::Burstable),
        ];
        for (cont, want) in cases {
            let p = Pod {
                uid: "u".into(),
                containers: vec![cont.clone()],
                init_containers: Vec::new(),
            };
            assert_eq!(p.qos(), want, "{cont:?}");
        }
    }

    #[test]
    fn bad_pods_are_refused_and_unknown_fields_fail() {
        let p = Pod {
            uid: "u".into(),
            containers: vec![c(2000, 1000, 0, 0)],
            init_containers: Vec::new(),
        };
        assert!(p.validate().unwrap_err().contains("above limit"));
    }

    /// The adopted kubelet pods' key prefix cannot be admitted (its pods would be
    /// released by the next kubelet reload while their containers run on).
    #[test]
    fn the_kubelet_uid_prefix_is_reserved() {
        let mut p = Pod {
            uid: "kubelet:x".into(),
            containers: vec![Container {
                name: "a".into(),
                cpu_request_millis: 1000,
                cpu_limit_millis: 1000,
                ..Default::default()
            }],
            init_containers: vec![],
        };
        let e = p.validate().unwrap_err();
        assert!(e.contains("reserved"), "{e}");
        p.uid = "x".into();
        p.validate().unwrap();
        let err = serde_json::from_str::<Pod>(r#"{"uid":"u","containers":[{"name":"a","cpu":1}]}"#)
            .unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
        assert_eq!(
            RejectionReason::SmtAlignmentError.to_string(),
            "SMTAlignmentError"
        );
    }
}

//! Device provider (kubelet devicemanager `topology_hints.go` + `filterByAffinity`): hints from
//! the PCI NUMA node of requested devices — by extended resource name (mapped to a device class
//! by `placement.device_resources`) or by PCI address — and allocation of specific devices,
//! aligned devices first, so a GPU pod lands beside its GPU.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::placement::cpu::candidate_masks;
use crate::placement::{NodeMask, TopologyHint};
use crate::topology::{DeviceClass, PciDevice, Topology};

/// Who holds a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceOwner {
    pub pod: String,
    pub container: String,
}

/// Devices handed out, by PCI address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    pub assigned: BTreeMap<String, DeviceOwner>,
}

/// What a container (or a pod, summed) asks for.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRequest<'a> {
    pub by_resource: &'a BTreeMap<String, u32>,
    pub addresses: &'a [String],
    /// Devices the container already has (hints only, never assigned): see
    /// `Container::attached_devices`.
    pub attached: &'a [String],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("resource {resource:?} is not mapped to a device class in placement.device_resources")]
    UnknownResource { resource: String },
    #[error("no PCI device at address {address}")]
    UnknownAddress { address: String },
    #[error("device {address} is already assigned to {pod}/{container}")]
    Busy {
        address: String,
        pod: String,
        container: String,
    },
    #[error("not enough free {resource} devices: requested {requested}, available {available}")]
    Insufficient {
        resource: String,
        requested: u32,
        available: u32,
    },
}

impl DeviceState {
    fn free<'t>(&self, topo: &'t Topology, class: DeviceClass) -> Vec<&'t PciDevice> {
        topo.devices
            .iter()
            .filter(|d| d.class == class && !self.assigned.contains_key(&d.address))
            .collect()
    }

    /// Hints per requested resource (and per requested or attached address, keyed
    /// `pci:<address>`).
    /// A resource none of whose devices has a NUMA node gets `None` (no preference), as in
    /// kubelet; devices without a node count in no mask.
    /// `None` overall when nothing is requested.
    #[allow(clippy::type_complexity)]
    pub fn hints(
        &self,
        topo: &Topology,
        classes: &BTreeMap<String, DeviceClass>,
        req: DeviceRequest,
    ) -> Result<Option<BTreeMap<String, Option<Vec<TopologyHint>>>>, DeviceError> {
        let mut out = BTreeMap::new();
        let all = NodeMask::from_ids(topo.node_ids()).unwrap_or_default();
        for (res, &count) in req.by_resource.iter().filter(|(_, c)| **c > 0) {
            let class = *classes
                .get(res)
                .ok_or_else(|| DeviceError::UnknownResource {
                    resource: res.clone(),
                })?;
            let every: Vec<&PciDevice> = topo.devices.iter().filter(|d| d.class == class).collect();
            // kubelet's deviceHasTopologyAlignment: no device of the resource has a node
            if every.iter().all(|d| d.node.is_none()) {
                out.insert(res.clone(), None);
                continue;
            }
            let free = self.free(topo, class);
            let in_mask = |devs: &[&PciDevice], m: NodeMask| {
                devs.iter()
                    .filter(|d| d.node.is_some_and(|n| m.contains(n)))
                    .count() as u32
            };
            let masks = candidate_masks(all, &|m| in_mask(&every, m) >= count);
            let min_width = masks
                .iter()
                .filter(|m| in_mask(&every, **m) >= count)
                .map(|m| m.count())
                .min()
                .unwrap_or(all.count());
            let hints = masks
                .into_iter()
                .filter(|m| in_mask(&free, *m) >= count)
                .map(|m| TopologyHint::new(Some(m), m.count() == min_width))
                .collect();
            out.insert(res.clone(), Some(hints));
        }
        for a in req.addresses.iter().chain(req.attached) {
            let d = topo
                .devices
                .iter()
                .find(|d| &d.address == a)
                .ok_or_else(|| DeviceError::UnknownAddress { address: a.clone() })?;
            let hints = d
                .node
                .map(|n| vec![TopologyHint::new(Some(NodeMask::single(n)), true)]);
            out.insert(format!("pci:{a}"), hints);
        }
        Ok((!out.is_empty()).then_some(out))
    }

    /// Assigns the requested devices to `owner`: named addresses as given, resources from the
    /// free devices of their class — those on `affinity`'s nodes first, then those without a
    /// node, then the rest, each by address. Attached devices are not assigned (the runtime
    /// gave them). Atomic: on error nothing is assigned.
    pub fn allocate(
        &mut self,
        topo: &Topology,
        classes: &BTreeMap<String, DeviceClass>,
        req: DeviceRequest,
        affinity: Option<NodeMask>,
        owner: &DeviceOwner,
    ) -> Result<Vec<String>, DeviceError> {
        let mut next = self.clone();
        let mut got = Vec::new();
        for a in req.addresses {
            if !topo.devices.iter().any(|d| &d.address == a) {
                return Err(DeviceError::UnknownAddress { address: a.clone() });
            }
            if let Some(o) = next.assigned.get(a) {
                return Err(DeviceError::Busy {
                    address: a.clone(),
                    pod: o.pod.clone(),
                    container: o.container.clone(),
                });
            }
            next.assigned.insert(a.clone(), owner.clone());
            got.push(a.clone());
        }
        for (res, &count) in req.by_resource.iter().filter(|(_, c)| **c > 0) {
            let class = *classes
                .get(res)
                .ok_or_else(|| DeviceError::UnknownResource {
                    resource: res.clone(),
                })?;
            let mut free = next.free(topo, class);
            let rank = |d: &PciDevice| match (d.node, affinity) {
                (Some(n), Some(a)) if a.contains(n) => 0,
                (None, _) => 1,
                _ => 2,
            };
            free.sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.address.cmp(&b.address)));
            if (free.len() as u32) < count {
                return Err(DeviceError::Insufficient {
                    resource: res.clone(),
                    requested: count,
                    available: free.len() as u32,
                });
            }
            let chosen: Vec<String> = free
                .iter()
                .take(count as usize)
                .map(|d| d.address.clone())
                .collect();
            for a in chosen {
                next.assigned.insert(a.clone(), owner.clone());
                got.push(a);
            }
        }
        *self = next;
        Ok(got)
    }

    /// Frees every device of a pod.
    pub fn release(&mut self, pod: &str) {
        self.assigned.retain(|_, o| o.pod != pod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologyBuilder;

    fn machine() -> Topology {
        let mut t = TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 4,
            ..Default::default()
        }
        .build();
        for (addr, class, node) in [
            ("0000:41:00.0", DeviceClass::Gpu, Some(2)),
            ("0000:42:00.0", DeviceClass::Gpu, Some(2)),
            ("0000:c1:00.0", DeviceClass::Gpu, Some(3)),
            ("0000:01:00.0", DeviceClass::Nic, None),
            ("0000:02:00.0", DeviceClass::Gpu, None),
        ] {
            t.devices.push(PciDevice {
                address: addr.into(),
                class,
                node,
                vendor: None,
                device: None,
            });
        }
        t
    }

    fn classes() -> BTreeMap<String, DeviceClass> {
        [
            ("nvidia.com/gpu".to_string(), DeviceClass::Gpu),
            ("example.com/nic".to_string(), DeviceClass::Nic),
        ]
        .into_iter()
        .collect()
    }

    fn show(h: &Option<Vec<TopologyHint>>) -> String {
        match h {
            None => "nil".into(),
            Some(l) => l
                .iter()
                .map(|h| {
                    let ids: String = h.affinity.unwrap().ids().map(|i| i.to_string()).collect();
                    format!("{ids}{}", if h.preferred { "P" } else { "" })
                })
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// (resource, count, taken addresses, expected hints)
    fn check(cases: &[(&str, u32, &[&str], &str)]) {
        let t = machine();
        for (res, count, taken, want) in cases {
            let mut s = DeviceState::default();
            for a in *taken {
                s.assigned.insert(
                    a.to_string(),
                    DeviceOwner {
                        pod: "other".into(),
                        container: "c".into(),
                    },
                );
            }
            let by: BTreeMap<String, u32> = [(res.to_string(), *count)].into_iter().collect();
            let req = DeviceRequest {
                by_resource: &by,
                addresses: &[],
                attached: &[],
            };
            let h = s.hints(&t, &classes(), req).unwrap().unwrap();
            let got: String = masks_only(show(&h[*res]));
            assert_eq!(got, *want, "{res} x{count} with {taken:?} taken");
        }
    }

    /// Keeps only the masks of width <= 2 to keep the table short.
    fn masks_only(s: String) -> String {
        if s == "nil" {
            return s;
        }
        s.split(' ')
            .filter(|m| m.trim_end_matches('P').len() <= 2)
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn hints_follow_the_pci_node() {
        check(&[
            ("nvidia.com/gpu", 1, &[], "2P 3P 02 03 12 13 23"),
            ("nvidia.com/gpu", 2, &[], "2P 02 12 23"),
            ("nvidia.com/gpu", 2, &["0000:41:00.0"], "23"),
            ("nvidia.com/gpu", 3, &[], "23P"),
            // the GPU without a node counts in no mask; a fourth GPU is impossible
            ("nvidia.com/gpu", 4, &[], ""),
            ("example.com/nic", 1, &[], "nil"),
        ]);
    }

    #[test]
    fn allocation_is_aligned_atomic_and_released() {
        let t = machine();
        let mut s = DeviceState::default();
        let by: BTreeMap<String, u32> = [("nvidia.com/gpu".to_string(), 1)].into_iter().collect();
        let owner = |p: &str| DeviceOwner {
            pod: p.into(),
            container: "c".into(),
        };
        let req = DeviceRequest {
            by_resource: &by,
            addresses: &[],
            attached: &[],
        };
        let got = s
            .allocate(&t, &classes(), req, Some(NodeMask::single(3)), &owner("a"))
            .unwrap();
        assert_eq!(got, vec!["0000:c1:00.0"]);
        let addr = vec!["0000:c1:00.0".to_string()];
        let busy = DeviceRequest {
            by_resource: &by,
            addresses: &addr,
            attached: &[],
        };
        let before = s.clone();
        assert!(matches!(
            s.allocate(&t, &classes(), busy, None, &owner("b")),
            Err(DeviceError::Busy { .. })
        ));
        assert_eq!(s, before, "a refused allocation assigns nothing");
        let addr = vec!["0000:99:00.0".to_string()];
        let unknown = DeviceRequest {
            by_resource: &by,
            addresses: &addr,
            attached: &[],
        };
        assert!(s.hints(&t, &classes(), unknown).is_err());
        s.release("a");
        assert!(s.assigned.is_empty());
    }
}

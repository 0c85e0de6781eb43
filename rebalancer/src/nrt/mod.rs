//! NodeResourceTopology export: the node's `topology.node.k8s.io/v1alpha2` object, which the
//! scheduler plugin NodeResourceTopologyMatch (kubernetes-sigs/scheduler-plugins) reads to
//! place pods on nodes whose NUMA zones can fit them. The object is built here from the books
//! (topology + allocator + placement config) and nothing else, so it says what admission will
//! do: a zone per NUMA node (`type: Node`, `name: node-N`, the name the plugin parses the NUMA
//! id from) with `cpu`, `memory`, each hugepage size and each device resource — capacity (the
//! node's), allocatable (less what is reserved for the system), available (less what is
//! admitted or adopted from kubelet) — the SLIT distances as the zone's costs, and the
//! Topology Manager policy and scope as the object's attributes.
//!
//! `build` is pure; `client` speaks HTTPS to the API server; `export` is the thread that keeps
//! the object equal to the books.

pub mod client;
pub mod export;

use serde_json::{json, Value};

use crate::{
    config::{PlacementConfig, TopologyPolicy, TopologyScope},
    placement::admission::Allocator,
    topology::Topology,
};

pub const API_VERSION: &str = "topology.node.k8s.io/v1alpha2";
pub const KIND: &str = "NodeResourceTopology";
/// The collection path (the CRD is cluster-scoped).
pub const COLLECTION: &str = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies";

/// One resource of one zone, as the CRD's ResourceInfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    pub capacity: u64,
    pub allocatable: u64,
    pub available: u64,
}

/// One NUMA node's zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zone {
    pub node: u32,
    pub resources: Vec<Resource>,
    /// (other node, SLIT distance), this node included.
    pub costs: Vec<(u32, u32)>,
}

/// The zones of the books now.
pub fn zones(topo: &Topology, alloc: &Allocator, cfg: &PlacementConfig) -> Vec<Zone> {
    let exclusive = alloc.exclusive_cpus();
    topo.nodes
        .iter()
        .map(|n| {
            let allocatable = n.cpus.difference(&alloc.reserved_cpus);
            let available = allocatable.difference(&exclusive);
            let mut resources = vec![Resource {
                name: "cpu".into(),
                capacity: n.cpus.len() as u64,
                allocatable: allocatable.len() as u64,
                available: available.len() as u64,
            }];
            if let Some(mem) = alloc.memory.node(n.id) {
                for (r, b) in &mem.blocks {
                    if b.total == 0 && r.name() != "memory" {
                        continue;
                    }
                    resources.push(Resource {
                        name: r.name().into(),
                        capacity: b.total,
                        allocatable: b.allocatable,
                        available: b.free,
                    });
                }
            }
            for (resource, class) in &cfg.device_resources {
                let on_node: Vec<&str> = topo
                    .devices
                    .iter()
                    .filter(|d| d.node == Some(n.id) && d.class == *class)
                    .map(|d| d.address.as_str())
                    .collect();
                if on_node.is_empty() {
                    continue;
                }
                let taken = on_node
                    .iter()
                    .filter(|a| alloc.devices.assigned.contains_key(**a))
                    .count();
                let count = on_node.len() as u64;
                resources.push(Resource {
                    name: resource.clone(),
                    capacity: count,
                    allocatable: count,
                    available: count - taken as u64,
                });
            }
            Zone {
                node: n.id,
                resources,
                costs: topo
                    .nodes
                    .iter()
                    .map(|m| (m.id, topo.distance(n.id, m.id)))
                    .collect(),
            }
        })
        .collect()
}

/// kubelet's spelling of its `--topology-manager-policy`.
pub fn policy_name(p: TopologyPolicy) -> &'static str {
    match p {
        TopologyPolicy::None => "none",
        TopologyPolicy::BestEffort => "best-effort",
        TopologyPolicy::Restricted => "restricted",
        TopologyPolicy::SingleNumaNode => "single-numa-node",
    }
}

fn scope_name(s: TopologyScope) -> &'static str {
    match s {
        TopologyScope::Container => "container",
        TopologyScope::Pod => "pod",
    }
}

/// The object's body (without `metadata.resourceVersion`, which the writer adds).
pub fn object(node_name: &str, zones: &[Zone], cfg: &PlacementConfig) -> Value {
    let zone_name = |id: u32| format!("node-{id}");
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": node_name,
            "labels": {"app.kubernetes.io/managed-by": "rebalancer"},
        },
        "attributes": [
            {"name": "topologyManagerPolicy", "value": policy_name(cfg.policy)},
            {"name": "topologyManagerScope", "value": scope_name(cfg.scope)},
        ],
        "zones": zones.iter().map(|z| json!({
            "name": zone_name(z.node),
            "type": "Node",
            "costs": z.costs.iter().map(|(to, d)| json!({"name": zone_name(*to), "value": d})).collect::<Vec<_>>(),
            "resources": z.resources.iter().map(|r| json!({
                "name": r.name,
                "capacity": r.capacity.to_string(),
                "allocatable": r.allocatable.to_string(),
                "available": r.available.to_string(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cpuset::CpuSet,
        placement::pod::{Container, Pod},
        topology::TopologyBuilder,
    };

    fn resource<'a>(z: &'a Zone, name: &str) -> &'a Resource {
        z.resources.iter().find(|r| r.name == name).unwrap()
    }

    #[test]
    fn zones_follow_reserved_and_admitted_cpus_and_memory() {
        let topo = TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 4,
            threads_per_core: 1,
            ..TopologyBuilder::default()
        }
        .build();
        let mut cfg = PlacementConfig {
            reserved_cpus: CpuSet::parse("0").unwrap(),
            ..PlacementConfig::default()
        };
        cfg.reserved_memory.clear();
        let mut alloc = Allocator::new(&topo, &cfg).unwrap();
        let before = zones(&topo, &alloc, &cfg);
        assert_eq!(before.len(), 2);
        let cpu0 = resource(&before[0], "cpu");
        assert_eq!((cpu0.capacity, cpu0.allocatable, cpu0.available), (4, 3, 3));
        let cpu1 = resource(&before[1], "cpu");
        assert_eq!((cpu1.capacity, cpu1.allocatable, cpu1.available), (4, 4, 4));
        let mem_before: u64 = before.iter().map(|z| resource(z, "memory").available).sum();

        let gib = 1 << 30;
        let pod = Pod {
            uid: "g".into(),
            containers: vec![Container {
                name: "c".into(),
                cpu_request_millis: 2000,
                cpu_limit_millis: 2000,
                memory_bytes: gib,
                memory_limit_bytes: gib,
                ..Default::default()
            }],
            init_containers: Vec::new(),
        };
        let placed = alloc.admit(&topo, &cfg, &pod).unwrap();
        let node = placed[0].mems.iter().next().unwrap();
        let after = zones(&topo, &alloc, &cfg);
        let z = after.iter().find(|z| z.node == node).unwrap();
        let was = before.iter().find(|z| z.node == node).unwrap();
        assert_eq!(
            resource(z, "cpu").available,
            resource(was, "cpu").available - 2
        );
        assert_eq!(
            resource(z, "memory").available,
            resource(was, "memory").available - gib
        );
        let mem_after: u64 = after.iter().map(|z| resource(z, "memory").available).sum();
        assert_eq!(mem_after, mem_before - gib);
        assert_eq!(z.costs.iter().find(|c| c.0 == node).unwrap().1, 10);

        alloc.release("g");
        assert_eq!(zones(&topo, &alloc, &cfg), before);
    }

    #[test]
    fn the_object_has_what_the_scheduler_plugin_reads() {
        let topo = TopologyBuilder::default().build();
        let cfg = PlacementConfig {
            policy: TopologyPolicy::SingleNumaNode,
            scope: TopologyScope::Pod,
            ..PlacementConfig::default()
        };
        let alloc = Allocator::new(&topo, &cfg).unwrap();
        let o = object("n1", &zones(&topo, &alloc, &cfg), &cfg);
        assert_eq!(o["apiVersion"], API_VERSION);
        assert_eq!(o["metadata"]["name"], "n1");
        assert_eq!(o["attributes"][0]["value"], "single-numa-node");
        assert_eq!(o["attributes"][1]["name"], "topologyManagerScope");
        assert_eq!(o["attributes"][1]["value"], "pod");
        assert_eq!(o["zones"][0]["name"], "node-0");
        assert_eq!(o["zones"][0]["type"], "Node");
        assert_eq!(o["zones"][0]["resources"][0]["name"], "cpu");
        assert!(o["zones"][0]["resources"][0]["available"].is_string());
    }
}

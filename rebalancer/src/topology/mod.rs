//! The machine's topology as an immutable value: NUMA nodes, CPUs and PCI devices.
//!
//! Built either from a sysfs tree (`sysfs::read`, root passed in) or synthetically with
//! [`TopologyBuilder`] (tests, simulator, benchmarks). On hotplug the daemon rebuilds it rather
//! than mutating it. Serialises to the JSON shape of `rebalancer topology --json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

pub mod devnode;
pub mod sysfs;

/// Hugepage counts for one page size on one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HugePages {
    pub total: u64,
    pub free: u64,
}

/// One NUMA node. `distances` is this node's SLIT row, in the order of `Topology::nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub id: u32,
    /// Online CPUs of the node (empty for a memory-only node, e.g. CXL).
    pub cpus: CpuSet,
    pub memory_total_bytes: u64,
    pub memory_free_bytes: u64,
    /// Keyed by the kernel's size name, e.g. "2048kB", "1048576kB".
    pub hugepages: BTreeMap<String, HugePages>,
    pub distances: Vec<u32>,
}

/// One logical CPU. Ids of socket/die/core/l3 are as the kernel numbers them; `l3` is the
/// smallest CPU id sharing this CPU's L3 cache (the kernel has no L3 id on every machine);
/// `cluster` the smallest CPU id of its CPU cluster (cores sharing an L2 or an L3 tag:
/// `topology/cluster_cpus_list`, on arm64 and on x86 from Linux 5.16), `None` without one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cpu {
    pub id: u32,
    /// `None` when the CPU belongs to no node (offline CPU on some kernels).
    pub node: Option<u32>,
    pub socket: u32,
    pub die: u32,
    pub core: u32,
    pub l3: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<u32>,
    pub online: bool,
    /// SMT siblings including this CPU.
    pub siblings: CpuSet,
}

/// Coarse class of a PCI device, from its class code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    Gpu,
    Nic,
    Nvme,
    Other,
}

/// A PCI device and the NUMA node it is attached to (`None` for numa_node = -1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDevice {
    pub address: String,
    pub class: DeviceClass,
    pub node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// The whole machine. Nodes and CPUs are sorted by id; devices by address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub nodes: Vec<Node>,
    pub cpus: Vec<Cpu>,
    pub devices: Vec<PciDevice>,
}

impl Topology {
    /// Reads the machine below `root` (a directory standing for `/sys`); see [`sysfs::read`].
    pub fn from_sysfs(root: &std::path::Path) -> Result<Self, sysfs::TopologyError> {
        sysfs::read(root)
    }

    pub fn node(&self, id: u32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    pub fn cpu(&self, id: u32) -> Option<&Cpu> {
        self.cpus
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|i| &self.cpus[i])
    }

    pub fn node_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes.iter().map(|n| n.id)
    }

    /// The memory nodes for a cpuset.mems that would be `nodes`: the kernel refuses a node with
    /// no memory in cpuset.mems (a CPU node whose memory is all on other nodes), so those are
    /// left out, and where none of `nodes` has memory, the nearest nodes that have take their
    /// place (as the kernel's own allocations fall back). A topology that reports no memory on
    /// any node (sizes unknown) leaves `nodes` as they are.
    pub fn memory_nodes(&self, nodes: &CpuSet) -> CpuSet {
        let with_memory: CpuSet = self
            .nodes
            .iter()
            .filter(|n| n.memory_total_bytes > 0)
            .map(|n| n.id)
            .collect();
        if with_memory.is_empty() {
            return nodes.clone();
        }
        let kept: CpuSet = nodes.iter().filter(|n| with_memory.contains(*n)).collect();
        if !kept.is_empty() || nodes.is_empty() {
            return kept;
        }
        let distance = |m: u32| nodes.iter().map(|n| self.distance(n, m)).min();
        let nearest = with_memory.iter().filter_map(distance).min();
        with_memory
            .iter()
            .filter(|m| distance(*m) == nearest)
            .collect()
    }

    /// All online CPUs.
    pub fn online_cpus(&self) -> CpuSet {
        self.cpus
            .iter()
            .filter(|c| c.online)
            .map(|c| c.id)
            .collect()
    }

    /// SLIT distance between two nodes (10 on the diagonal when the row is missing).
    pub fn distance(&self, from: u32, to: u32) -> u32 {
        let idx = |id| self.nodes.iter().position(|n| n.id == id);
        match (idx(from), idx(to)) {
            (Some(i), Some(j)) => self.nodes[i]
                .distances
                .get(j)
                .copied()
                .unwrap_or(if i == j { 10 } else { 20 }),
            _ => u32::MAX,
        }
    }

    /// Online CPUs of a set of nodes.
    pub fn cpus_of_nodes(&self, nodes: &CpuSet) -> CpuSet {
        self.nodes
            .iter()
            .filter(|n| nodes.contains(n.id))
            .fold(CpuSet::new(), |acc, n| acc.union(&n.cpus))
    }

    /// The nodes with a CPU in `cpus`.
    pub fn nodes_of_cpus(&self, cpus: &CpuSet) -> CpuSet {
        (self.nodes.iter())
            .filter(|n| !n.cpus.is_disjoint(cpus))
            .map(|n| n.id)
            .collect()
    }

    /// Node of a CPU, if known.
    pub fn node_of_cpu(&self, cpu: u32) -> Option<u32> {
        self.cpu(cpu).and_then(|c| c.node)
    }

    /// The node of each CPU of a node (CPU → node).
    pub fn cpu_node_map(&self) -> BTreeMap<u32, u32> {
        self.nodes
            .iter()
            .flat_map(|n| n.cpus.iter().map(move |c| (c, n.id)))
            .collect()
    }
}

/// Builds synthetic, regular machines: `sockets × nodes_per_socket` nodes, each with
/// `cores_per_node` cores of `threads_per_core` threads, one L3 per `cores_per_l3` cores, one
/// CPU cluster per `cores_per_cluster` cores (0: no clusters, as on most x86 machines).
/// Distances: 10 local, `near` within a socket, `far` across sockets.
#[derive(Clone, Debug)]
pub struct TopologyBuilder {
    pub sockets: u32,
    pub nodes_per_socket: u32,
    pub cores_per_node: u32,
    pub threads_per_core: u32,
    pub cores_per_l3: u32,
    pub cores_per_cluster: u32,
    pub memory_per_node_bytes: u64,
    pub hugepages_2m_per_node: u64,
    pub hugepages_1g_per_node: u64,
    pub near: u32,
    pub far: u32,
}

impl Default for TopologyBuilder {
    fn default() -> Self {
        Self {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 4,
            threads_per_core: 2,
            cores_per_l3: 4,
            cores_per_cluster: 0,
            memory_per_node_bytes: 64 << 30,
            hugepages_2m_per_node: 0,
            hugepages_1g_per_node: 0,
            near: 12,
            far: 32,
        }
    }
}

impl TopologyBuilder {
    /// Numbering follows Linux on x86: all first threads of every core first, then the
    /// second threads (cpu N and N + cores_total are siblings).
    pub fn build(&self) -> Topology {
        let nodes_total = self.sockets * self.nodes_per_socket;
        let cores_total = nodes_total * self.cores_per_node;
        let mut cpus = Vec::new();
        for t in 0..self.threads_per_core.max(1) {
            for core in 0..cores_total {
                let id = t * cores_total + core;
                let node = core / self.cores_per_node.max(1);
                let socket = node / self.nodes_per_socket.max(1);
                let siblings = (0..self.threads_per_core.max(1))
                    .map(|s| s * cores_total + core)
                    .collect();
                let l3_first_core = core - core % self.cores_per_l3.max(1);
                let cluster =
                    (self.cores_per_cluster > 0).then(|| core - core % self.cores_per_cluster);
                cpus.push(Cpu {
                    id,
                    node: Some(node),
                    socket,
                    die: socket,
                    core: core % (self.nodes_per_socket * self.cores_per_node).max(1),
                    l3: Some(l3_first_core),
                    cluster,
                    online: true,
                    siblings,
                });
            }
        }
        cpus.sort_by_key(|c| c.id);
        let nodes = (0..nodes_total)
            .map(|n| {
                let mut hugepages = BTreeMap::new();
                hugepages.insert(
                    "2048kB".to_string(),
                    HugePages {
                        total: self.hugepages_2m_per_node,
                        free: self.hugepages_2m_per_node,
                    },
                );
                hugepages.insert(
                    "1048576kB".to_string(),
                    HugePages {
                        total: self.hugepages_1g_per_node,
                        free: self.hugepages_1g_per_node,
                    },
                );
                Node {
                    id: n,
                    cpus: cpus
                        .iter()
                        .filter(|c| c.node == Some(n))
                        .map(|c| c.id)
                        .collect(),
                    memory_total_bytes: self.memory_per_node_bytes,
                    memory_free_bytes: self.memory_per_node_bytes,
                    hugepages,
                    distances: (0..nodes_total)
                        .map(|m| {
                            if m == n {
                                10
                            } else if m / self.nodes_per_socket == n / self.nodes_per_socket {
                                self.near
                            } else {
                                self.far
                            }
                        })
                        .collect(),
                }
            })
            .collect();
        Topology {
            nodes,
            cpus,
            devices: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_makes_a_regular_machine() {
        let t = TopologyBuilder {
            sockets: 2,
            nodes_per_socket: 4,
            cores_per_node: 16,
            threads_per_core: 2,
            ..Default::default()
        }
        .build();
        assert_eq!(t.nodes.len(), 8);
        assert_eq!(t.cpus.len(), 256);
        assert_eq!(t.nodes[0].cpus.len(), 32);
        assert_eq!(t.cpu(0).unwrap().siblings.to_string(), "0,128");
        assert_eq!(t.distance(0, 1), 12);
        assert_eq!(t.distance(0, 4), 32);
        assert_eq!(t.node_of_cpu(200), Some((200 - 128) / 16));
        assert!(t.cpus.iter().all(|c| c.cluster.is_none()));
    }

    /// A CPU node without memory is never a memory node: the kernel refuses it in cpuset.mems.
    /// Its place is taken by the nearest node with memory; nodes with memory pass unchanged.
    #[test]
    fn memory_nodes_leave_out_nodes_without_memory() {
        let mut t = TopologyBuilder {
            sockets: 2,
            nodes_per_socket: 2,
            cores_per_node: 2,
            ..Default::default()
        }
        .build();
        let set = |s: &str| CpuSet::parse(s).unwrap();
        // sizes unknown everywhere: as given
        for n in &mut t.nodes {
            n.memory_total_bytes = 0;
        }
        assert_eq!(t.memory_nodes(&set("1")), set("1"));
        for n in &mut t.nodes {
            n.memory_total_bytes = if n.id == 1 { 0 } else { 1 << 30 };
        }
        assert_eq!(t.memory_nodes(&set("0-1")), set("0"));
        assert_eq!(t.memory_nodes(&set("2-3")), set("2-3"));
        // node 1 alone: node 0 is its socket sibling (12), nodes 2 and 3 are 32 away
        assert_eq!(t.memory_nodes(&set("1")), set("0"));
        assert_eq!(t.memory_nodes(&CpuSet::default()), CpuSet::default());
    }

    #[test]
    fn builder_clusters_group_cores_with_their_threads() {
        let t = TopologyBuilder {
            cores_per_node: 8,
            cores_per_cluster: 4,
            ..Default::default()
        }
        .build();
        // 16 cores, threads N and N + 16: core 5 and its sibling 21 are in the cluster of core 4
        assert_eq!(t.cpu(5).unwrap().cluster, Some(4));
        assert_eq!(t.cpu(21).unwrap().cluster, Some(4));
        assert_eq!(t.cpu(12).unwrap().cluster, Some(12));
    }
}

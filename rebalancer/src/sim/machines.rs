//! Seeded machines for measuring the controller on hardware the tuning never saw: 2–16 NUMA
//! nodes, one to eight sockets, sub-NUMA clustering (SNC) pairs and quads, CPU-less
//! memory-only (CXL-like) nodes, asymmetric SLIT distances and offline CPUs. The same seed
//! always gives the same machine; the fixtures under tests/fixtures/sysfs are the machines the
//! defaults were first tuned on, these are the others.

use std::collections::BTreeMap;

use super::generate::Rng;
use crate::cpuset::CpuSet;
use crate::topology::{Cpu, HugePages, Node, Topology};

const GIB: u64 = 1 << 30;

/// One generated machine and a short description of its shape (for tables).
#[derive(Clone, Debug)]
pub struct Machine {
    pub seed: u64,
    pub name: String,
    pub topology: Topology,
}

/// The machine of `seed`.
pub fn machine(seed: u64) -> Machine {
    let mut rng = Rng::new(seed ^ 0x4D41_4348_494E_4521);
    let sockets = [1u32, 2, 2, 4, 8][rng.range(0, 4) as usize];
    let mut per_socket = [1u32, 2, 2, 4][rng.range(0, 3) as usize];
    while sockets * per_socket > 16 {
        per_socket /= 2;
    }
    if sockets * per_socket < 2 {
        per_socket = 2;
    }
    let cpu_nodes = sockets * per_socket;
    let memory_only = (rng.range(0, 2) as u32).min(16 - cpu_nodes);
    let threads_per_core = rng.range(1, 2) as u32;
    // 64–160 logical CPUs in all, at least two cores per node: the traces are sized for it.
    let target = rng.range(64, 160) as u32;
    let cores_per_node = (target / (cpu_nodes * threads_per_core)).max(2);
    let cores_total = cpu_nodes * cores_per_node;
    let offline: CpuSet = if rng.range(0, 1) == 1 {
        let total = cores_total * threads_per_core;
        (0..rng.range(1, 3))
            .map(|_| rng.range(1, u64::from(total) - 1) as u32)
            .collect()
    } else {
        CpuSet::new()
    };

    let mut cpus = Vec::new();
    for t in 0..threads_per_core {
        for core in 0..cores_total {
            let id = t * cores_total + core;
            let node = core / cores_per_node;
            cpus.push(Cpu {
                id,
                node: Some(node),
                socket: node / per_socket,
                die: node / per_socket,
                core: core % (per_socket * cores_per_node),
                l3: (!offline.contains(id)).then_some(node * cores_per_node),
                cluster: None,
                online: !offline.contains(id),
                siblings: (0..threads_per_core)
                    .map(|s| s * cores_total + core)
                    .collect(),
            });
        }
    }
    cpus.sort_by_key(|c| c.id);

    // SLIT: 10 local; within a socket (SNC) 11–12; across sockets 20–32, more for a farther
    // socket on 4- and 8-socket machines; a memory-only node hangs off one socket, 14–20 from
    // its nodes and farther from the rest. Asymmetric machines add 0–3 to one direction.
    let near = rng.range(11, 12) as u32;
    let far = rng.range(20, 32) as u32;
    let n = (cpu_nodes + memory_only) as usize;
    let socket_of = |id: u32, home: &[u32]| {
        if id < cpu_nodes {
            id / per_socket
        } else {
            home[(id - cpu_nodes) as usize]
        }
    };
    let home: Vec<u32> = (0..memory_only)
        .map(|_| rng.range(0, u64::from(sockets) - 1) as u32)
        .collect();
    let cxl = rng.range(14, 20) as u32;
    let asymmetric = rng.range(0, 1) == 1;
    let mut dist = vec![vec![10u32; n]; n];
    #[allow(clippy::needless_range_loop)] // a symmetric matrix: both [i][j] and [j][i] are set
    for i in 0..n {
        for j in (i + 1)..n {
            let (a, b) = (i as u32, j as u32);
            let (sa, sb) = (socket_of(a, &home), socket_of(b, &home));
            let hops = sa.abs_diff(sb).min(sockets - sa.abs_diff(sb)).max(1);
            let mut d = match (a < cpu_nodes, b < cpu_nodes) {
                (true, true) if sa == sb => near,
                (true, true) => far + 6 * (hops - 1),
                _ if sa == sb => cxl,
                _ => far + cxl - 10 + 6 * (hops - 1),
            };
            dist[i][j] = d;
            if asymmetric {
                d += rng.range(0, 3) as u32;
            }
            dist[j][i] = d;
        }
    }

    let mut nodes = Vec::new();
    for id in 0..n as u32 {
        let memory = if id < cpu_nodes {
            rng.range(2, 8) * 16 * GIB
        } else {
            rng.range(4, 16) * 16 * GIB
        };
        let node_cpus: CpuSet = cpus
            .iter()
            .filter(|c| c.online && c.node == Some(id))
            .map(|c| c.id)
            .collect();
        let none = HugePages { total: 0, free: 0 };
        nodes.push(Node {
            id,
            cpus: node_cpus,
            memory_total_bytes: memory,
            memory_free_bytes: memory,
            hugepages: BTreeMap::from([
                ("2048kB".to_string(), none),
                ("1048576kB".to_string(), none),
            ]),
            distances: dist[id as usize].clone(),
        });
    }
    let name = format!(
        "m{seed}: {sockets}s×{per_socket}{}{} {}c{}",
        if memory_only > 0 {
            format!("+{memory_only}mem")
        } else {
            String::new()
        },
        if asymmetric { " asym" } else { "" },
        cpus.iter().filter(|c| c.online).count(),
        if offline.is_empty() {
            String::new()
        } else {
            format!(" ({} off)", offline.len())
        },
    );
    Machine {
        seed,
        name,
        topology: Topology {
            nodes,
            cpus,
            devices: Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_cover_the_shapes_and_are_valid() {
        let ms: Vec<Machine> = (0..64).map(machine).collect();
        let nodes: Vec<usize> = ms.iter().map(|m| m.topology.nodes.len()).collect();
        assert!(nodes.iter().all(|&n| (2..=16).contains(&n)), "{nodes:?}");
        assert!(nodes.contains(&2) && nodes.iter().any(|&n| n >= 10));
        let t = |f: &dyn Fn(&Topology) -> bool| ms.iter().filter(|m| f(&m.topology)).count();
        assert!(t(&|t| t.nodes.iter().any(|n| n.cpus.is_empty())) > 5);
        assert!(t(&|t| t.cpus.iter().any(|c| !c.online)) > 5);
        assert!(t(&|t| t.nodes.iter().any(|n| n.distances.contains(&11))) > 5);
        let asym = |t: &Topology| {
            let n = t.nodes.len();
            (0..n).any(|i| (0..n).any(|j| t.nodes[i].distances[j] != t.nodes[j].distances[i]))
        };
        assert!(t(&asym) > 5);
        for m in &ms {
            let t = &m.topology;
            assert_eq!(machine(m.seed).topology, *t, "seeded");
            for (i, n) in t.nodes.iter().enumerate() {
                assert_eq!(n.distances.len(), t.nodes.len());
                assert_eq!(n.distances[i], 10);
                assert!(n.cpus.iter().all(|c| t.cpu(c).is_some_and(|c| c.online)));
            }
            assert!(t.nodes.iter().filter(|n| !n.cpus.is_empty()).count() >= 2);
        }
    }
}

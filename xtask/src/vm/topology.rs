//! Emulated NUMA machines for the guest tests: each is a value from which both the QEMU command
//! line and the facts the guest must report are derived, so the two cannot drift apart.

/// One guest NUMA node: its CPUs (empty = memory-only node) and memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDef {
    pub cpus: Vec<u32>,
    pub mem_mib: u64,
}

/// A guest machine: nodes (ids 0..n) and the full distance matrix, row = from, column = to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmTopology {
    pub name: &'static str,
    pub about: &'static str,
    pub nodes: Vec<NodeDef>,
    pub distances: Vec<Vec<u32>>,
}

/// Names booted when no `--topology` is given, in run order.
pub const NAMES: &[&str] = &["2node", "4node-asym", "memonly"];

/// Further names `--topology` accepts, not booted by default: machines the defaults were not
/// tuned on, for the benchmarks.
pub const MORE: &[&str] = &["snc", "cxl"];

/// Every name `--topology` accepts, for error messages.
pub fn known() -> String {
    NAMES
        .iter()
        .chain(MORE)
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

fn nodes(spec: &[(u32, u64)]) -> Vec<NodeDef> {
    let mut next = 0;
    spec.iter()
        .map(|&(ncpus, mem_mib)| {
            let cpus = (next..next + ncpus).collect();
            next += ncpus;
            NodeDef { cpus, mem_mib }
        })
        .collect()
}

/// The topology called `name`.
pub fn by_name(name: &str) -> Option<VmTopology> {
    Some(match name {
        "2node" => VmTopology {
            name: "2node",
            about: "2 nodes x 2 CPUs, distance 21",
            nodes: nodes(&[(2, 512), (2, 512)]),
            distances: vec![vec![10, 21], vec![21, 10]],
        },
        // A line of four nodes (10/16/22/28), and one pair that differs by direction (3->0 is 26,
        // 0->3 is 28) so a reader that transposes the matrix is caught.
        "4node-asym" => VmTopology {
            name: "4node-asym",
            about: "4 nodes x 1 CPU, distances 10/16/22/28, 0->3 != 3->0",
            nodes: nodes(&[(1, 512), (1, 512), (1, 512), (1, 512)]),
            distances: vec![
                vec![10, 16, 22, 28],
                vec![16, 10, 16, 22],
                vec![22, 16, 10, 16],
                vec![26, 22, 16, 10],
            ],
        },
        "memonly" => VmTopology {
            name: "memonly",
            about: "2 nodes x 2 CPUs + node 2 with memory only (distance 31)",
            nodes: nodes(&[(2, 512), (2, 512), (0, 512)]),
            distances: vec![vec![10, 21, 31], vec![21, 10, 31], vec![31, 31, 10]],
        },
        // Two sockets of two sub-NUMA clusters: near pairs (12) and far pairs (32).
        "snc" => VmTopology {
            name: "snc",
            about: "2 sockets x 2 sub-NUMA clusters x 1 CPU, 12 within a socket, 32 across",
            nodes: nodes(&[(1, 512), (1, 512), (1, 512), (1, 512)]),
            distances: vec![
                vec![10, 12, 32, 32],
                vec![12, 10, 32, 32],
                vec![32, 32, 10, 12],
                vec![32, 32, 12, 10],
            ],
        },
        // Two CPU nodes, each with a CPU-less memory expander beside it (CXL-like: near 14, far
        // 26, expander to expander 28).
        "cxl" => VmTopology {
            name: "cxl",
            about: "2 nodes x 2 CPUs + a memory-only node near each (14 near, 26 far)",
            nodes: nodes(&[(2, 512), (2, 512), (0, 512), (0, 512)]),
            distances: vec![
                vec![10, 20, 14, 26],
                vec![20, 10, 26, 14],
                vec![14, 26, 10, 28],
                vec![26, 14, 28, 10],
            ],
        },
        _ => return None,
    })
}

/// Formats ids as a kernel cpulist ("0-1,4").
pub fn cpulist(ids: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    out.join(",")
}

impl VmTopology {
    pub fn ncpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.cpus.len() as u32).sum()
    }

    pub fn mem_mib(&self) -> u64 {
        self.nodes.iter().map(|n| n.mem_mib).sum()
    }

    /// Ids of nodes that have CPUs.
    pub fn cpu_nodes(&self) -> Vec<u32> {
        (0..self.nodes.len() as u32)
            .filter(|&i| !self.nodes[i as usize].cpus.is_empty())
            .collect()
    }

    /// Structural checks: a square matrix with 10 on the diagonal and > 10 elsewhere, CPU ids
    /// 0..n without gaps, at least one CPU node, every CPU node of the same size (QEMU's
    /// sockets x cores must tile the nodes).
    pub fn validate(&self) -> Result<(), String> {
        let n = self.nodes.len();
        if self.distances.len() != n || self.distances.iter().any(|r| r.len() != n) {
            return Err(format!("{}: distance matrix is not {n}x{n}", self.name));
        }
        for (i, row) in self.distances.iter().enumerate() {
            for (j, &d) in row.iter().enumerate() {
                if (i == j && d != 10) || (i != j && d <= 10) {
                    return Err(format!("{}: distance {i}->{j} = {d} is invalid", self.name));
                }
            }
        }
        let cpus: Vec<u32> = self.nodes.iter().flat_map(|n| n.cpus.clone()).collect();
        if cpus != (0..cpus.len() as u32).collect::<Vec<_>>() || cpus.is_empty() {
            return Err(format!("{}: CPU ids must be 0..n in node order", self.name));
        }
        let sizes: Vec<usize> = self
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.cpus.len())
            .collect();
        if sizes.windows(2).any(|w| w[0] != w[1]) {
            return Err(format!("{}: CPU nodes differ in size", self.name));
        }
        Ok(())
    }

    /// QEMU arguments describing the machine (CPUs, memory backends, nodes, distances); the
    /// caller adds accelerator, kernel, initrd and console.
    pub fn qemu_args(&self) -> Vec<String> {
        let cpu_nodes = self.cpu_nodes();
        let cores = self.ncpus() / cpu_nodes.len().max(1) as u32;
        let mut a = vec![
            "-m".to_string(),
            format!("{}M", self.mem_mib()),
            "-smp".to_string(),
            format!(
                "{},sockets={},cores={cores},threads=1",
                self.ncpus(),
                cpu_nodes.len()
            ),
        ];
        for (i, n) in self.nodes.iter().enumerate() {
            a.push("-object".into());
            a.push(format!("memory-backend-ram,id=m{i},size={}M", n.mem_mib));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            a.push("-numa".into());
            a.push(if n.cpus.is_empty() {
                format!("node,nodeid={i},memdev=m{i}")
            } else {
                format!("node,nodeid={i},cpus={},memdev=m{i}", cpulist(&n.cpus))
            });
        }
        for (i, row) in self.distances.iter().enumerate() {
            for (j, &d) in row.iter().enumerate() {
                if i != j {
                    a.push("-numa".into());
                    a.push(format!("dist,src={i},dst={j},val={d}"));
                }
            }
        }
        a
    }

    /// Shell variables for the guest scripts (`. /vm/topology.env`).
    pub fn env(&self) -> String {
        let ids = |v: &[u32]| {
            v.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let all: Vec<u32> = (0..self.nodes.len() as u32).collect();
        let cpu_nodes = self.cpu_nodes();
        let mem_only: Vec<u32> = all
            .iter()
            .copied()
            .filter(|i| !cpu_nodes.contains(i))
            .collect();
        let mut s = format!(
            "TOPOLOGY={}\nNODES=\"{}\"\nCPU_NODES=\"{}\"\nMEM_ONLY_NODES=\"{}\"\nNCPUS={}\n",
            self.name,
            ids(&all),
            ids(&cpu_nodes),
            ids(&mem_only),
            self.ncpus()
        );
        for (i, n) in self.nodes.iter().enumerate() {
            s += &format!("NODE{i}_CPUS=\"{}\"\n", cpulist(&n.cpus));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_topology_is_valid() {
        for name in NAMES.iter().chain(MORE) {
            let t = by_name(name).expect("listed name resolves");
            assert_eq!(t.name, *name);
            t.validate().unwrap();
        }
        assert!(by_name("nope").is_none());
    }

    #[test]
    fn validate_catches_bad_matrices() {
        let mut t = by_name("2node").unwrap();
        t.distances[0][1] = 10;
        assert!(t.validate().is_err());
        let mut t = by_name("2node").unwrap();
        t.distances.pop();
        assert!(t.validate().is_err());
        let mut t = by_name("2node").unwrap();
        t.nodes[1].cpus = vec![3, 4];
        assert!(t.validate().is_err());
    }

    #[test]
    fn qemu_line_lists_each_direction_and_memory_only_nodes_without_cpus() {
        let a = by_name("memonly").unwrap().qemu_args().join(" ");
        assert!(a.contains("-smp 4,sockets=2,cores=2,threads=1"), "{a}");
        assert!(a.contains("-m 1536M"), "{a}");
        assert!(a.contains("-numa node,nodeid=1,cpus=2-3,memdev=m1"), "{a}");
        assert!(a.contains("-numa node,nodeid=2,memdev=m2 "), "{a}");
        let a = by_name("4node-asym").unwrap().qemu_args().join(" ");
        assert!(a.contains("dist,src=0,dst=3,val=28"), "{a}");
        assert!(a.contains("dist,src=3,dst=0,val=26"), "{a}");
        assert_eq!(a.matches("dist,").count(), 12, "{a}");
    }

    #[test]
    fn cpulists_and_env() {
        assert_eq!(cpulist(&[]), "");
        assert_eq!(cpulist(&[0, 1, 2, 4, 6, 7]), "0-2,4,6-7");
        let env = by_name("memonly").unwrap().env();
        assert!(env.contains("CPU_NODES=\"0 1\"\n"), "{env}");
        assert!(env.contains("MEM_ONLY_NODES=\"2\"\n"), "{env}");
        assert!(env.contains("NODE2_CPUS=\"\"\n"), "{env}");
    }
}

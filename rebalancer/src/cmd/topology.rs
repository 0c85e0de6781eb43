//! `rebalancer topology`: print the machine's topology as a table or JSON.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;

use crate::topology::{sysfs, Topology};

#[derive(Debug, clap::Args)]
pub struct TopologyArgs {
    /// Directory standing for /sys (e.g. a fixture tree).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: TopologyArgs) -> anyhow::Result<ExitCode> {
    let topo = sysfs::read(&a.sysfs_root)
        .with_context(|| format!("reading topology under {}", a.sysfs_root.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&topo)?);
    } else {
        print!("{}", table(&topo));
    }
    Ok(ExitCode::SUCCESS)
}

/// A readable table: one line per node (sockets, L3 groups, memory, CPUs), hugepages where
/// any are reserved, offline CPUs, the distance matrix, then devices.
pub fn table(t: &Topology) -> String {
    use std::{collections::BTreeSet, fmt::Write};
    let mut s = String::new();
    let online = t.cpus.iter().filter(|c| c.online).count();
    let _ = writeln!(
        s,
        "{} NUMA node(s), {} CPU(s) ({} online), {} PCI device(s)",
        t.nodes.len(),
        t.cpus.len(),
        online,
        t.devices.len()
    );
    let _ = writeln!(
        s,
        "{:<5} {:<7} {:<16} {:>9} {:>9}  cpus",
        "node", "socket", "L3 groups", "mem MiB", "free MiB"
    );
    let mut hugepages: Vec<String> = Vec::new();
    for n in &t.nodes {
        let hp: Vec<String> = n
            .hugepages
            .iter()
            .map(|(k, v)| format!("{k}: {}/{}", v.free, v.total))
            .collect();
        let cpus: Vec<_> = t
            .cpus
            .iter()
            .filter(|c| c.online && n.cpus.contains(c.id))
            .collect();
        let sockets: BTreeSet<u32> = cpus.iter().map(|c| c.socket).collect();
        let l3s: BTreeSet<u32> = cpus.iter().filter_map(|c| c.l3).collect();
        let join = |set: &BTreeSet<u32>| -> String {
            set.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let (cpu_text, l3_text) = if n.cpus.is_empty() {
            ("(memory only)".to_string(), "-".to_string())
        } else if l3s.is_empty() {
            (n.cpus.to_string(), "none".to_string())
        } else {
            // "2: 0,4" — how many L3s the node's CPUs use, each named by its first CPU.
            (n.cpus.to_string(), format!("{}: {}", l3s.len(), join(&l3s)))
        };
        let sockets = if sockets.is_empty() {
            "-".to_string()
        } else {
            join(&sockets)
        };
        let _ = writeln!(
            s,
            "{:<5} {:<7} {:<16} {:>9} {:>9}  {}",
            n.id,
            sockets,
            l3_text,
            n.memory_total_bytes >> 20,
            n.memory_free_bytes >> 20,
            cpu_text,
        );
        if n.hugepages.values().any(|h| h.total > 0) {
            hugepages.push(format!("node {}: {}", n.id, hp.join(", ")));
        }
    }
    for line in &hugepages {
        let _ = writeln!(s, "hugepages (free/total) {line}");
    }
    // CPU clusters (cores sharing an L2 / L3 tag), counted per node, where the kernel has them.
    let clusters: Vec<String> = t
        .nodes
        .iter()
        .filter_map(|n| {
            let ids: BTreeSet<u32> = t
                .cpus
                .iter()
                .filter(|c| c.online && n.cpus.contains(c.id))
                .filter_map(|c| c.cluster)
                .collect();
            (!ids.is_empty()).then(|| format!("node {}: {}", n.id, ids.len()))
        })
        .collect();
    if !clusters.is_empty() {
        let _ = writeln!(s, "CPU clusters {}", clusters.join(", "));
    }
    let offline: Vec<String> = t
        .cpus
        .iter()
        .filter(|c| !c.online)
        .map(|c| match c.node {
            Some(n) => format!("{} (node {n})", c.id),
            None => format!("{} (node unknown)", c.id),
        })
        .collect();
    if !offline.is_empty() {
        let _ = writeln!(s, "offline CPUs: {}", offline.join(", "));
    }
    let _ = write!(s, "distances:");
    for n in &t.nodes {
        let _ = write!(s, " {:>4}", n.id);
    }
    let _ = writeln!(s);
    for n in &t.nodes {
        let _ = write!(s, "{:>10}", n.id);
        for d in &n.distances {
            let _ = write!(s, " {:>4}", d);
        }
        let _ = writeln!(s);
    }
    for d in &t.devices {
        let node = d.node.map_or("-".to_string(), |n| n.to_string());
        let class = serde_json::to_value(d.class)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(s, "device {} {:<5} node {}", d.address, class, node);
    }
    s
}

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

/// A readable table: one line per node, then the distance matrix, then devices.
pub fn table(t: &Topology) -> String {
    use std::fmt::Write;
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
        "{:<5} {:<24} {:>12} {:>12}  hugepages (free/total)",
        "node", "cpus", "mem MiB", "free MiB"
    );
    for n in &t.nodes {
        let hp: Vec<String> = n
            .hugepages
            .iter()
            .map(|(k, v)| format!("{k}: {}/{}", v.free, v.total))
            .collect();
        let cpus = if n.cpus.is_empty() {
            "(memory only)".to_string()
        } else {
            n.cpus.to_string()
        };
        let _ = writeln!(
            s,
            "{:<5} {:<24} {:>12} {:>12}  {}",
            n.id,
            cpus,
            n.memory_total_bytes >> 20,
            n.memory_free_bytes >> 20,
            hp.join(", ")
        );
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
        let _ = writeln!(s, "device {} {:?} node {}", d.address, d.class, node);
    }
    s
}

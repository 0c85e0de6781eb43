//! The `top` view: nodes × workloads from the last control round — per node its CPU busy share
//! and free memory; per workload (the busiest `limit` managed cgroups) its CPU demand and memory
//! and how they split across nodes, and its locality. Built by the daemon (`GET /v1/top`) from
//! its last [`Observations`], rendered by `rebalancer top`. Both halves are pure.

use std::{collections::BTreeMap, fmt::Write};

use serde::{Deserialize, Serialize};

use crate::{
    controller::{Decision, Observations},
    cpuset::CpuSet,
    topology::Topology,
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopView {
    /// Control rounds so far; 0 means no round has run yet (the view is empty).
    pub rounds: u64,
    /// Length of the period the figures cover, seconds.
    pub period_s: f64,
    pub dry_run: bool,
    pub nodes: Vec<TopNode>,
    /// The busiest workloads, most CPU first.
    pub workloads: Vec<TopWorkload>,
    /// Managed workloads not shown (past `limit`).
    pub hidden: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopNode {
    pub id: u32,
    pub cpus: CpuSet,
    /// Fraction of the node's CPU time busy over the period, 0..=1.
    pub busy: f64,
    pub mem_total_bytes: u64,
    pub mem_free_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopWorkload {
    pub cgroup: String,
    pub cpus: CpuSet,
    pub mems: CpuSet,
    /// CPU demand over the period, in CPUs.
    pub cpu: f64,
    /// Share of its on-CPU time per node (sums to 1 when it ran).
    pub cpu_share: BTreeMap<u32, f64>,
    /// Its threads' wait on the run queues over the period, in CPUs' worth (what it wanted
    /// beyond what it got); None where not measured (`crate::runwait`).
    #[serde(default)]
    pub wait: Option<f64>,
    pub mem_bytes: u64,
    /// Share of its memory per node.
    pub mem_share: BTreeMap<u32, f64>,
    /// The controller's (smoothed) locality score, 0..=1.
    pub locality: Option<f64>,
}

fn shares(per_node: &BTreeMap<u32, u64>) -> BTreeMap<u32, f64> {
    let total: u64 = per_node.values().sum();
    per_node
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(&n, &v)| (n, v as f64 / total as f64))
        .collect()
}

/// What the view is built from: plain data, no daemon state.
#[derive(Clone, Copy, Debug)]
pub struct TopInput<'a> {
    pub topo: &'a Topology,
    /// The last round's observations (None before the first round).
    pub obs: Option<&'a Observations>,
    /// The last round's decision per cgroup.
    pub decisions: &'a BTreeMap<String, Decision>,
    pub rounds: u64,
    pub dry_run: bool,
}

/// The view of the last round's observations on the machine, the `limit` busiest workloads.
pub fn build(input: TopInput<'_>, limit: usize) -> TopView {
    let empty = Observations::default();
    let obs = input.obs.unwrap_or(&empty);
    let nodes = input
        .topo
        .nodes
        .iter()
        .map(|n| {
            let o = obs.nodes.get(&n.id).copied().unwrap_or_default();
            TopNode {
                id: n.id,
                cpus: n.cpus.clone(),
                busy: o.cpu_busy,
                mem_total_bytes: n.memory_total_bytes,
                mem_free_bytes: if obs.nodes.contains_key(&n.id) {
                    o.free_bytes
                } else {
                    n.memory_free_bytes
                },
            }
        })
        .collect();
    let period_ns = obs.period_ns.max(1) as f64;
    let mut workloads: Vec<TopWorkload> = obs
        .cgroups
        .iter()
        .map(|c| {
            let decision = input.decisions.get(&c.id);
            TopWorkload {
                cgroup: c.id.clone(),
                cpus: c.cpus.clone(),
                mems: c.mems.clone(),
                cpu: c.cpu_ns_per_node.values().sum::<u64>() as f64 / period_ns,
                cpu_share: shares(&c.cpu_ns_per_node),
                wait: (!c.wait_ns_per_node.is_empty())
                    .then(|| c.wait_ns_per_node.values().sum::<u64>() as f64 / period_ns),
                mem_bytes: c.mem_bytes_per_node.values().sum(),
                mem_share: shares(&c.mem_bytes_per_node),
                locality: decision.and_then(|d| d.smoothed.or(d.locality)),
            }
        })
        .collect();
    workloads.sort_by(|a, b| {
        b.cpu
            .total_cmp(&a.cpu)
            .then(b.mem_bytes.cmp(&a.mem_bytes))
            .then(a.cgroup.cmp(&b.cgroup))
    });
    let hidden = workloads.len().saturating_sub(limit);
    workloads.truncate(limit);
    TopView {
        rounds: input.rounds,
        period_s: obs.period_ns as f64 / 1e9,
        dry_run: input.dry_run,
        nodes,
        workloads,
        hidden,
    }
}

fn mib(b: u64) -> String {
    if b >= 10 << 30 {
        format!("{}G", b >> 30)
    } else {
        format!("{}M", b >> 20)
    }
}

/// Keeps the end of a long cgroup path (the container part is what tells workloads apart).
fn tail(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    let keep: String = s.chars().skip(n - (width - 1)).collect();
    format!("…{keep}")
}

fn pct(x: Option<&f64>) -> String {
    match x {
        Some(v) => format!("{:.0}", v * 100.0),
        None => "-".into(),
    }
}

/// The text screen: a node table, then one row per workload with its CPU% / memory% on each
/// node (the nodes × workloads matrix). `width` bounds the cgroup column.
pub fn render(v: &TopView, width: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "rebalancer top — round {}, period {:.1} s{}",
        v.rounds,
        v.period_s,
        if v.dry_run { ", DRY-RUN" } else { "" }
    );
    let _ = writeln!(
        s,
        "\n{:<5} {:<16} {:>5} {:>9} {:>9}",
        "NODE", "CPUS", "BUSY", "MEM-FREE", "MEM"
    );
    for n in &v.nodes {
        let _ = writeln!(
            s,
            "{:<5} {:<16} {:>4.0}% {:>9} {:>9}",
            n.id,
            tail(&n.cpus.to_cpulist(), 16),
            n.busy * 100.0,
            mib(n.mem_free_bytes),
            mib(n.mem_total_bytes)
        );
    }
    if v.rounds == 0 {
        let _ = writeln!(
            s,
            "\n(no control round yet: workloads appear after the first one)"
        );
        return s;
    }
    let name_w = width.clamp(12, 60);
    let _ = write!(
        s,
        "\n{:<name_w$} {:>6} {:>6} {:>7} {:>6}",
        "WORKLOAD", "CPU", "WAIT", "MEM", "LOCAL"
    );
    for n in &v.nodes {
        let _ = write!(s, " {:>9}", format!("n{}", n.id));
    }
    let _ = writeln!(s);
    for w in &v.workloads {
        let _ = write!(
            s,
            "{:<name_w$} {:>6.2} {:>6} {:>7} {:>6}",
            tail(&w.cgroup, name_w),
            w.cpu,
            w.wait.map_or("-".to_string(), |x| format!("{x:.2}")),
            mib(w.mem_bytes),
            w.locality
                .map_or("-".to_string(), |l| format!("{:.0}%", l * 100.0))
        );
        for n in &v.nodes {
            let cell = format!(
                "{}/{}",
                pct(w.cpu_share.get(&n.id)),
                pct(w.mem_share.get(&n.id))
            );
            let _ = write!(s, " {cell:>9}");
        }
        let _ = writeln!(s);
    }
    if v.workloads.is_empty() {
        let _ = writeln!(s, "(no managed workloads)");
    } else {
        let _ = writeln!(
            s,
            "(WAIT: CPUs' worth its threads waited on run queues, - where not measured; per node: % of the workload's CPU time / % of its memory there, - for none)"
        );
    }
    if v.hidden > 0 {
        let _ = writeln!(s, "… and {} more (raise --limit)", v.hidden);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> TopView {
        TopView {
            rounds: 7,
            period_s: 5.0,
            dry_run: false,
            nodes: vec![
                TopNode {
                    id: 0,
                    cpus: CpuSet::parse("0-3").unwrap(),
                    busy: 0.5,
                    mem_total_bytes: 8 << 30,
                    mem_free_bytes: 3 << 30,
                },
                TopNode {
                    id: 1,
                    cpus: CpuSet::parse("4-7").unwrap(),
                    busy: 0.25,
                    mem_total_bytes: 8 << 30,
                    mem_free_bytes: 6 << 30,
                },
            ],
            workloads: vec![TopWorkload {
                cgroup: "kubepods.slice/kubepods-pod1.slice/cri-containerd-abcdef.scope".into(),
                cpus: CpuSet::parse("0-3").unwrap(),
                mems: CpuSet::parse("0").unwrap(),
                cpu: 1.5,
                cpu_share: [(0, 1.0)].into(),
                wait: Some(0.25),
                mem_bytes: 512 << 20,
                mem_share: [(0, 0.75), (1, 0.25)].into(),
                locality: Some(0.75),
            }],
            hidden: 3,
        }
    }

    #[test]
    fn renders_nodes_and_the_workload_matrix() {
        let out = render(&view(), 30);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].contains("round 7, period 5.0 s"), "{out}");
        let node0 = lines.iter().find(|l| l.starts_with("0 ")).unwrap();
        assert!(node0.contains("50%") && node0.contains("3072M"), "{node0}");
        let row = lines.iter().find(|l| l.contains("abcdef")).unwrap();
        assert!(row.starts_with('…'), "long paths keep their tail: {row}");
        assert!(
            row.contains("1.50")
                && row.contains("0.25")
                && row.contains("512M")
                && row.contains("75%"),
            "{row}"
        );
        // node 0: all of its CPU, three quarters of its memory; node 1: none / a quarter
        assert!(row.contains("100/75") && row.contains("-/25"), "{row}");
        assert!(out.contains("and 3 more"), "{out}");
    }

    #[test]
    fn before_the_first_round_says_so() {
        let mut v = view();
        v.rounds = 0;
        v.workloads.clear();
        assert!(render(&v, 30).contains("no control round yet"));
    }

    #[test]
    fn shares_ignore_zero_nodes_and_sum_to_one() {
        let s = shares(&[(0, 3), (1, 1), (2, 0)].into());
        assert_eq!(s, [(0, 0.75), (1, 0.25)].into());
        assert!(shares(&BTreeMap::new()).is_empty());
    }
}

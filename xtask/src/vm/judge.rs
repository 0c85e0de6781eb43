//! Host-side judges: scenarios whose guest part prints data blocks (JSON, sysfs facts) that the
//! host compares with the topology it booted — stronger than a check inside the guest, which has
//! no jq. Pure: a console section and a topology in, verdicts out.
use std::collections::BTreeMap;

use serde_json::Value;

use super::{
    topology::VmTopology,
    verdict::{Section, Status, Verdict},
};

fn parse_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
        out.extend(a..=b);
    }
    Some(out)
}

/// Memory the guest reports for a node must be within 70–100% of what QEMU gave it (the kernel
/// keeps some for itself, more on node 0).
fn memory_ok(topo: &VmTopology, node: usize, bytes: u64) -> bool {
    let want = topo.nodes[node].mem_mib << 20;
    bytes <= want && bytes * 10 >= want * 7
}

/// Compares facts per node (`cpus`, `distances`, memory bytes) with the topology; `what` names
/// the source in messages. Returns the problems found.
fn compare_nodes(
    topo: &VmTopology,
    got: &BTreeMap<u32, (Vec<u32>, Vec<u32>, u64)>,
    what: &str,
) -> Vec<String> {
    let mut bad = Vec::new();
    let want_ids: Vec<u32> = (0..topo.nodes.len() as u32).collect();
    let got_ids: Vec<u32> = got.keys().copied().collect();
    if got_ids != want_ids {
        bad.push(format!("{what}: nodes {got_ids:?}, want {want_ids:?}"));
    }
    for (&id, (cpus, dist, mem)) in got {
        let Some(n) = topo.nodes.get(id as usize) else {
            continue;
        };
        if *cpus != n.cpus {
            bad.push(format!(
                "{what}: node {id} cpus {cpus:?}, want {:?}",
                n.cpus
            ));
        }
        if *dist != topo.distances[id as usize] {
            bad.push(format!(
                "{what}: node {id} distances {dist:?}, want {:?}",
                topo.distances[id as usize]
            ));
        }
        if !memory_ok(topo, id as usize, *mem) {
            bad.push(format!(
                "{what}: node {id} memory {} MiB, want about {} MiB",
                mem >> 20,
                n.mem_mib
            ));
        }
    }
    bad
}

/// The guest's own /sys numbers (`node=0 cpus=0-1 memtotal_kb=N distance=10,21` lines).
fn judge_sysfs(text: &str, topo: &VmTopology) -> Verdict {
    let mut got = BTreeMap::new();
    for line in text.lines() {
        let f: BTreeMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .collect();
        let Some(id) = f.get("node").and_then(|v| v.parse::<u32>().ok()) else {
            continue;
        };
        let cpus = f
            .get("cpus")
            .and_then(|v| parse_list(v))
            .unwrap_or_default();
        let dist = f
            .get("distance")
            .map(|v| v.split(',').filter_map(|d| d.parse().ok()).collect())
            .unwrap_or_default();
        let mem = f
            .get("memtotal_kb")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            << 10;
        got.insert(id, (cpus, dist, mem));
    }
    let bad = compare_nodes(topo, &got, "guest sysfs");
    if bad.is_empty() {
        Verdict::new(
            "topology/sysfs",
            Status::Pass,
            format!(
                "guest /sys matches the QEMU line: {} nodes, cpus {:?}, distances {:?}",
                topo.nodes.len(),
                topo.nodes.iter().map(|n| n.cpus.len()).collect::<Vec<_>>(),
                topo.distances
            ),
        )
    } else {
        Verdict::new("topology/sysfs", Status::Fail, bad.join("; "))
    }
}

fn u32s(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_u64().map(|x| x as u32))
        .collect()
}

/// `rebalancer topology --json` against the topology.
fn judge_reader(text: &str, rc: i32, topo: &VmTopology) -> Verdict {
    const NAME: &str = "topology";
    if rc != 0 {
        let msg = text.lines().last().unwrap_or("").trim();
        return if text.contains("not written yet") {
            Verdict::new(NAME, Status::Skip, format!("reader not written yet: {msg}"))
        } else {
            Verdict::new(NAME, Status::Fail, format!("exit code {rc}: {msg}"))
        };
    }
    let json: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Verdict::new(NAME, Status::Fail, format!("output is not JSON: {e}")),
    };
    let mut got = BTreeMap::new();
    let mut bad = Vec::new();
    for n in json["nodes"].as_array().into_iter().flatten() {
        let (Some(id), Some(cpus), Some(dist)) =
            (n["id"].as_u64(), u32s(&n["cpus"]), u32s(&n["distances"]))
        else {
            bad.push(format!("malformed node entry {n}"));
            continue;
        };
        let mem = n["memory_total_bytes"].as_u64().unwrap_or(0);
        got.insert(id as u32, (cpus, dist, mem));
    }
    bad.extend(compare_nodes(topo, &got, "rebalancer"));
    let cpus = json["cpus"].as_array().cloned().unwrap_or_default();
    if cpus.len() != topo.ncpus() as usize {
        bad.push(format!("{} cpus listed, want {}", cpus.len(), topo.ncpus()));
    }
    for c in &cpus {
        let (id, node) = (c["id"].as_u64(), c["node"].as_u64());
        let want = id.and_then(|id| {
            topo.nodes
                .iter()
                .position(|n| n.cpus.contains(&(id as u32)))
                .map(|p| p as u64)
        });
        if want.is_none() || node != want {
            bad.push(format!("cpu {id:?} on node {node:?}, want {want:?}"));
        }
    }
    if bad.is_empty() {
        Verdict::new(
            NAME,
            Status::Pass,
            format!(
                "rebalancer topology matches: {} nodes, {} cpus, memory-only nodes {:?}",
                topo.nodes.len(),
                topo.ncpus(),
                (0..topo.nodes.len())
                    .filter(|&i| topo.nodes[i].cpus.is_empty())
                    .collect::<Vec<_>>()
            ),
        )
    } else {
        Verdict::new(NAME, Status::Fail, bad.join("; "))
    }
}

/// Scenario `topology`: two verdicts, the guest's own sysfs (independent of our reader) and
/// `rebalancer topology --json`.
pub fn topology(s: &Section, topo: &VmTopology) -> Vec<Verdict> {
    let sysfs = match s.data("sysfs") {
        Some((text, _)) => judge_sysfs(&text, topo),
        None => Verdict::new("topology/sysfs", Status::Fail, "no sysfs data block"),
    };
    let reader = match s.data("reader") {
        Some((text, 0)) => judge_reader(&text, 0, topo),
        Some((text, rc)) => {
            let err = s.data("reader-stderr").map(|e| e.0).unwrap_or_default();
            judge_reader(format!("{text}\n{err}").trim(), rc, topo)
        }
        None => Verdict::new("topology", Status::Fail, "no reader data block"),
    };
    vec![sysfs, reader]
}

/// The `vmtest-span` row of a `rebalancer sample --json` report: (cpu ns per node, cross-node
/// migrations).
fn span_row(text: &str) -> Result<(BTreeMap<u32, u64>, u64), String> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let row = json["cgroups"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("vmtest-span"))
        })
        .or_else(|| match json["cgroups"].as_array() {
            // `--cgroup` filters the report to that one cgroup even when its path is unknown.
            Some(rows) if rows.len() == 1 => rows.first(),
            _ => None,
        })
        .ok_or("no row for cgroup vmtest-span")?;
    let cpu: BTreeMap<u32, u64> = row["cpu_ns"]
        .as_object()
        .ok_or("row has no cpu_ns map")?
        .iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64()?)))
        .collect();
    let mig = row["cross_node_migrations"]
        .as_u64()
        .ok_or("row has no cross_node_migrations")?;
    Ok((cpu, mig))
}

/// Scenario `sampling`: a cgroup spanning every CPU node has on-CPU time on each of them and
/// cross-node migrations; once its cpuset pins it to the first CPU node, only that node and no
/// cross-node migrations.
pub fn sampling(s: &Section, topo: &VmTopology) -> Vec<Verdict> {
    const NAME: &str = "sampling";
    let cpu_nodes = topo.cpu_nodes();
    let pin = cpu_nodes[0];
    let mut bad = Vec::new();
    let mut detail = Vec::new();
    for key in ["span", "pinned"] {
        let Some((text, rc)) = s.data(key) else {
            bad.push(format!("{key}: no data block"));
            continue;
        };
        if rc != 0 {
            let err = s
                .data(&format!("{key}-stderr"))
                .map(|e| e.0)
                .unwrap_or_default();
            bad.push(format!(
                "{key}: rebalancer sample exit code {rc}: {}",
                err.trim().lines().last().unwrap_or("")
            ));
            continue;
        }
        let (cpu, mig) = match span_row(&text) {
            Ok(r) => r,
            Err(e) => {
                bad.push(format!("{key}: {e}"));
                continue;
            }
        };
        let ns = |n: u32| cpu.get(&n).copied().unwrap_or(0);
        detail.push(format!(
            "{key}: cpu ms per node {:?}, cross-node migrations {mig}",
            cpu_nodes
                .iter()
                .map(|&n| ns(n) / 1_000_000)
                .collect::<Vec<_>>()
        ));
        if key == "span" {
            bad.extend(
                cpu_nodes
                    .iter()
                    .filter(|&&n| ns(n) == 0)
                    .map(|n| format!("span: no on-CPU time on node {n}")),
            );
            if mig == 0 {
                bad.push("span: no cross-node migrations".into());
            }
        } else {
            if ns(pin) == 0 {
                bad.push(format!("pinned: no on-CPU time on node {pin}"));
            }
            bad.extend(
                cpu.iter()
                    .filter(|(&n, &v)| n != pin && v > 0)
                    .map(|(n, v)| format!("pinned: {v} ns on node {n}")),
            );
            if mig != 0 {
                bad.push(format!("pinned: {mig} cross-node migrations"));
            }
        }
    }
    let status = if bad.is_empty() {
        Status::Pass
    } else {
        Status::Fail
    };
    let mut all = bad;
    all.extend(detail);
    vec![
        Verdict::new(NAME, status, all.join("; ")),
        sampling_runq(s, topo),
    ]
}

/// The run-queue reading of the same two samples (`runnable_per_cpu`): spanning, every CPU
/// node holds at least one spinner per CPU (≥ 0.75 per CPU); pinned, the first CPU node holds
/// all `ncpus` spinners on its CPUs (≥ 0.75 × ncpus / its CPUs: above 1 where the busy share
/// cannot go) and the other CPU nodes none of them (≤ 0.5). The guest kernel's BTF must let the
/// cpu-clock sampler read its run queue (`runq:cpu_clock` available).
fn sampling_runq(s: &Section, topo: &VmTopology) -> Verdict {
    const NAME: &str = "sampling-runq";
    let cpu_nodes = topo.cpu_nodes();
    let pin = cpu_nodes[0];
    let ncpus = topo.ncpus() as f64;
    let pin_cpus = topo.nodes[pin as usize].cpus.len().max(1) as f64;
    let mut bad = Vec::new();
    let mut detail = Vec::new();
    for key in ["span", "pinned"] {
        let Some((text, 0)) = s.data(key) else {
            bad.push(format!("{key}: no sample"));
            continue;
        };
        let Ok(json) = serde_json::from_str::<Value>(&text) else {
            bad.push(format!("{key}: not JSON"));
            continue;
        };
        let runq = json["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == "runq:cpu_clock");
        if let Some(r) = runq.filter(|r| r["available"] != true) {
            bad.push(format!("{key}: run queue not read: {}", r["reason"]));
            continue;
        }
        let per: BTreeMap<u32, f64> = json["runnable_per_cpu"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_f64()?)))
            .collect();
        detail.push(format!("{key}: runnable per CPU {per:?}"));
        for &n in &cpu_nodes {
            let Some(&r) = per.get(&n) else {
                bad.push(format!("{key}: node {n} not measured"));
                continue;
            };
            let (lo, hi) = match (key, n == pin) {
                ("span", _) => (0.75, f64::INFINITY),
                (_, true) => (0.75 * ncpus / pin_cpus, f64::INFINITY),
                _ => (0.0, 0.5),
            };
            if !(lo..=hi).contains(&r) {
                bad.push(format!(
                    "{key}: node {n} read {r:.2} per CPU, wanted {lo:.2}..={hi}"
                ));
            }
        }
    }
    let status = if bad.is_empty() {
        Status::Pass
    } else {
        Status::Fail
    };
    bad.extend(detail);
    Verdict::new(NAME, status, bad.join("; "))
}

#[cfg(test)]
mod tests {
    use super::super::{topology::by_name, verdict::parse};
    use super::*;

    fn section(body: &str) -> Section {
        let text = format!("SCENARIO-BEGIN t\n{body}\nSCENARIO-END t rc=0\n");
        parse(&text).sections.remove(0)
    }

    fn block(key: &str, rc: i32, text: &str) -> String {
        format!("DATA-BEGIN {key}\n{text}\nDATA-END {key} rc={rc}")
    }

    const SYSFS_2NODE: &str = "\
node=0 cpus=0-1 memtotal_kb=480000 distance=10,21
node=1 cpus=2-3 memtotal_kb=500000 distance=21,10";

    fn reader_json(dist01: u32, cpu3_node: u32) -> String {
        serde_json::json!({
            "nodes": [
                {"id": 0, "cpus": [0, 1], "memory_total_bytes": 480_000u64 << 10,
                 "distances": [10, dist01]},
                {"id": 1, "cpus": [2, 3], "memory_total_bytes": 500_000u64 << 10,
                 "distances": [21, 10]}],
            "cpus": [{"id": 0, "node": 0}, {"id": 1, "node": 0}, {"id": 2, "node": 1},
                     {"id": 3, "node": cpu3_node}],
            "devices": []
        })
        .to_string()
    }

    fn check_topology(sysfs: &str, reader: (i32, &str), want: [Status; 2]) {
        let t = by_name("2node").unwrap();
        let body = format!(
            "{}\n{}",
            block("sysfs", 0, sysfs),
            block("reader", reader.0, reader.1)
        );
        let v = topology(&section(&body), &t);
        assert_eq!([v[0].status, v[1].status], want, "{v:?}");
    }

    #[test]
    fn topology_judge() {
        let good = reader_json(21, 1);
        check_topology(SYSFS_2NODE, (0, &good), [Status::Pass, Status::Pass]);
        // wrong distance, wrong cpu node, not JSON, errors
        check_topology(
            SYSFS_2NODE,
            (0, &reader_json(20, 1)),
            [Status::Pass, Status::Fail],
        );
        check_topology(
            SYSFS_2NODE,
            (0, &reader_json(21, 0)),
            [Status::Pass, Status::Fail],
        );
        check_topology(SYSFS_2NODE, (0, "nope"), [Status::Pass, Status::Fail]);
        let todo =
            "rebalancer: error: reading topology under /sys: /sys: sysfs reader not written yet";
        check_topology(SYSFS_2NODE, (1, todo), [Status::Pass, Status::Skip]);
        check_topology(
            SYSFS_2NODE,
            (1, "error: boom"),
            [Status::Pass, Status::Fail],
        );
        // the guest's sysfs disagreeing with QEMU's line fails on its own
        let one_node = "node=0 cpus=0-3 memtotal_kb=900000 distance=10";
        check_topology(one_node, (0, &good), [Status::Fail, Status::Pass]);
        let small = SYSFS_2NODE.replace("500000", "100000");
        check_topology(&small, (0, &good), [Status::Fail, Status::Pass]);
    }

    fn sample_json(cpu: &[(u32, u64)], mig: u64) -> String {
        let cpu: serde_json::Map<String, Value> = cpu
            .iter()
            .map(|(n, v)| (n.to_string(), Value::from(*v)))
            .collect();
        serde_json::json!({"seconds": 3.0, "cgroups": [
            {"cgroup_id": 7, "path": "/other", "cpu_ns": {"0": 5}, "cross_node_migrations": 0},
            {"cgroup_id": 9, "path": "/vmtest-span", "cpu_ns": cpu, "cross_node_migrations": mig}
        ]})
        .to_string()
    }

    fn runq_json(per: &[(u32, f64)], available: bool) -> String {
        let per: serde_json::Map<String, Value> = per
            .iter()
            .map(|(n, v)| (n.to_string(), Value::from(*v)))
            .collect();
        serde_json::json!({"seconds": 3.0, "cgroups": [],
            "sources": [{"name": "runq:cpu_clock", "available": available, "reason": "r"}],
            "runnable_per_cpu": per})
        .to_string()
    }

    #[test]
    fn sampling_runq_judge() {
        // 2node: 2 CPUs per node, 4 in all; pinned, node 0 holds 4 spinners on 2 CPUs (2.0)
        let t = by_name("2node").unwrap();
        let check = |span: String, pinned: String, want: Status| {
            let body = format!(
                "{}\n{}",
                block("span", 0, &span),
                block("pinned", 0, &pinned)
            );
            let v = sampling(&section(&body), &t);
            assert_eq!(v[1].name, "sampling-runq");
            assert_eq!(v[1].status, want, "{v:?}");
        };
        let span = || runq_json(&[(0, 1.2), (1, 1.1)], true);
        check(span(), runq_json(&[(0, 2.0), (1, 0.1)], true), Status::Pass);
        // the busy share's ceiling (1.0) on the pinned node is not a run queue
        check(span(), runq_json(&[(0, 1.0), (1, 0.1)], true), Status::Fail);
        check(span(), runq_json(&[(0, 2.0), (1, 0.9)], true), Status::Fail);
        check(
            runq_json(&[(0, 1.2), (1, 0.2)], true),
            runq_json(&[(0, 2.0), (1, 0.0)], true),
            Status::Fail,
        );
        check(span(), runq_json(&[(0, 2.0)], true), Status::Fail);
        check(
            span(),
            runq_json(&[(0, 2.0), (1, 0.0)], false),
            Status::Fail,
        );
    }

    fn check_sampling(span: String, pinned: String, want: Status) {
        let t = by_name("memonly").unwrap();
        let body = format!(
            "{}\n{}",
            block("span", 0, &span),
            block("pinned", 0, &pinned)
        );
        let v = sampling(&section(&body), &t);
        assert_eq!(v[0].status, want, "{v:?}");
    }

    #[test]
    fn sampling_judge() {
        let span = || sample_json(&[(0, 9_000_000), (1, 8_000_000)], 12);
        let pinned = || sample_json(&[(0, 9_000_000), (1, 0)], 0);
        check_sampling(span(), pinned(), Status::Pass);
        check_sampling(sample_json(&[(0, 9), (1, 0)], 12), pinned(), Status::Fail);
        check_sampling(sample_json(&[(0, 9), (1, 9)], 0), pinned(), Status::Fail);
        check_sampling(span(), sample_json(&[(0, 9), (1, 1)], 0), Status::Fail);
        check_sampling(span(), sample_json(&[(0, 9)], 1), Status::Fail);
        check_sampling(span(), "{}".into(), Status::Fail);
        let t = by_name("2node").unwrap();
        let v = sampling(&section("nothing"), &t);
        assert_eq!(v[0].status, Status::Fail);
    }
}

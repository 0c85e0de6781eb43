//! `rebalancer plan`: admit a list of pods in order on a (fixture) machine and print each
//! placement or rejection — a dry, offline admission tool. Nothing is written anywhere.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use serde::Serialize;

use crate::config::{Config, PlacementConfig};
use crate::placement::admission::{Allocator, ContainerPlacement, Pod, Qos, Rejection};
use crate::topology::{sysfs, Topology};

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Directory standing for /sys (e.g. a fixture tree).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// JSON file holding an array of pods, admitted in order.
    #[arg(long, value_name = "FILE")]
    pub pods: PathBuf,
    /// Config file for the [placement] settings (default: the embedded defaults).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print one JSON object per pod instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The answer for one pod.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanLine {
    pub uid: String,
    pub qos: Qos,
    pub admitted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placements: Option<Vec<ContainerPlacement>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Rejection>,
}

pub fn run(a: PlanArgs) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(a.config.as_deref())?.placement;
    let topo = sysfs::read(&a.sysfs_root)
        .with_context(|| format!("reading topology under {}", a.sysfs_root.display()))?;
    let text = std::fs::read_to_string(&a.pods)
        .with_context(|| format!("reading {}", a.pods.display()))?;
    let pods = parse_pods(&text).with_context(|| format!("in {}", a.pods.display()))?;
    let lines = plan(&topo, &cfg, &pods)?;
    if a.json {
        for l in &lines {
            println!("{}", serde_json::to_string(l)?);
        }
    } else {
        print!("{}", render(&lines));
    }
    Ok(ExitCode::SUCCESS)
}

/// Parses a JSON array of pods; an error names the index of the bad pod.
pub fn parse_pods(text: &str) -> anyhow::Result<Vec<Pod>> {
    let values: Vec<serde_json::Value> =
        serde_json::from_str(text).context("expected a JSON array of pods")?;
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| serde_json::from_value(v).with_context(|| format!("pod at index {i}")))
        .collect()
}

/// Admits `pods` in order on an empty allocator.
pub fn plan(topo: &Topology, cfg: &PlacementConfig, pods: &[Pod]) -> anyhow::Result<Vec<PlanLine>> {
    let mut alloc = Allocator::new(topo, cfg)?;
    Ok(pods
        .iter()
        .map(|p| {
            let r = alloc.admit(topo, cfg, p);
            PlanLine {
                uid: p.uid.clone(),
                qos: p.qos(),
                admitted: r.is_ok(),
                rejection: r.as_ref().err().cloned(),
                placements: r.ok(),
            }
        })
        .collect())
}

/// Human-readable lines: one per pod, one per container.
pub fn render(lines: &[PlanLine]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for l in lines {
        match (&l.placements, &l.rejection) {
            (Some(ps), _) => {
                let _ = writeln!(s, "pod {} ({:?}): admitted", l.uid, l.qos);
                for p in ps {
                    let aff = p
                        .affinity
                        .map_or("-".to_string(), |a| a.to_cpuset().to_string());
                    let _ = write!(
                        s,
                        "  {}: cpus {} mems {} affinity {} {}",
                        p.container,
                        p.cpus,
                        p.mems,
                        aff,
                        if p.exclusive { "exclusive" } else { "shared" }
                    );
                    if !p.devices.is_empty() {
                        let _ = write!(s, " devices {}", p.devices.join(","));
                    }
                    let _ = writeln!(s);
                }
            }
            (None, Some(r)) => {
                let _ = writeln!(s, "pod {} ({:?}): rejected: {}", l.uid, l.qos, r);
            }
            (None, None) => {}
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TopologyPolicy;
    use crate::topology::TopologyBuilder;

    #[test]
    fn plan_prints_placements_and_rejections() {
        let t = TopologyBuilder::default().build();
        let cfg = PlacementConfig {
            policy: TopologyPolicy::SingleNumaNode,
            ..Default::default()
        };
        let pods = parse_pods(
            r#"[
              {"uid":"a","containers":[{"name":"c","cpu_limit_millis":2000,"memory_limit_bytes":1073741824}]},
              {"uid":"b","containers":[{"name":"c","cpu_limit_millis":12000,"memory_limit_bytes":1073741824}]},
              {"uid":"c","containers":[{"name":"c"}]}
            ]"#,
        )
        .unwrap();
        let out = render(&plan(&t, &cfg, &pods).unwrap());
        assert_eq!(
            out,
            "pod a (Guaranteed): admitted\n  c: cpus 0,8 mems 0 affinity 0 exclusive\n\
             pod b (Guaranteed): rejected: TopologyAffinityError: no preferred NUMA affinity under policy SingleNumaNode (best merged hint None; hints: cpu: cpu [0-1 preferred]; memory: memory [0 preferred, 1 preferred])\n\
             pod c (BestEffort): admitted\n  c: cpus 1-7,9-15 mems 0-1 affinity - shared\n"
        );
        let err = parse_pods(r#"[{"uid":"a","containers":[]},{"uid":"b","bogus":1}]"#).unwrap_err();
        assert!(format!("{err:#}").contains("pod at index 1"), "{err:#}");
    }

    #[test]
    fn plan_on_the_epyc_fixture_with_the_restricted_config() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        let t = sysfs::read(&root.join("sysfs/epyc-nps4")).unwrap();
        let cfg = Config::load(Some(&root.join("pods/restricted.toml")))
            .unwrap()
            .placement;
        let text = std::fs::read_to_string(root.join("pods/epyc-mix.json")).unwrap();
        let lines = plan(&t, &cfg, &parse_pods(&text).unwrap()).unwrap();
        let outcome: Vec<String> = lines
            .iter()
            .map(|l| match (&l.placements, &l.rejection) {
                (Some(p), _) => format!("{}:{}|{}", l.uid, p[0].cpus, p[0].mems),
                (None, Some(r)) => format!("{}:{}", l.uid, r.reason),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            outcome,
            [
                "db:1-4,65-68|0",
                "web:8-15,72-79|1",
                // the reserved CPUs 0 and 64 stay in the shared pool (no strict-cpu-reservation)
                "batch:0,5-64,69-127|0-7",
                "dpdk:8-9,72-73|1",
                "big:TopologyAffinityError",
                "huge:InsufficientMemory",
                "gpu:InsufficientDevices",
                "odd:SMTAlignmentError",
                "ml:24-31,88-95|3",
            ]
        );
        let exclusive: Vec<&ContainerPlacement> = lines
            .iter()
            .flat_map(|l| l.placements.iter().flatten())
            .filter(|p| p.exclusive)
            .collect();
        for (i, a) in exclusive.iter().enumerate() {
            assert!(
                !a.cpus.contains(0) && !a.cpus.contains(64),
                "reserved CPU given"
            );
            for b in &exclusive[i + 1..] {
                assert!(a.cpus.is_disjoint(&b.cpus), "{a:?} overlaps {b:?}");
            }
        }
    }
}

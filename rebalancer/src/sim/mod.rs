//! The simulator (pure, no I/O): drives the REAL placement engine (admission) and the REAL
//! planner over a workload trace on a fixture or synthetic machine, with a NUMA cost model, and
//! compares the rebalancer with a static, an AutoNUMA-like and an oracle baseline.
//!
//! - `model`: the cost model (latency by SLIT distance, bandwidth saturation, contention,
//!   migration cost);
//! - `workload`: the trace format; `generate`: seeded trace generators;
//! - `run`: the discrete-time loop and the kernel model; `baselines`: what each policy does;
//! - `machines`: seeded machines the tuning never saw; `heldout`: the tune / held-out measure
//!   over them (the share of the oracle's gain over Static a policy captures).

use serde::Serialize;

pub mod baselines;
pub mod generate;
pub mod heldout;
pub mod machines;
pub mod model;
pub mod run;
pub mod workload;

pub use generate::{generate, Kind};
pub use model::CostModel;
pub use run::{run_policy, PolicyReport, SimConfig, SimError, SimPolicy};
pub use workload::{Workload, WorkloadError};

use crate::topology::Topology;

/// One simulation: every requested policy over the same trace and machine.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub workload: String,
    pub seed: u64,
    pub topology: String,
    pub nodes: usize,
    pub cpus: usize,
    pub duration_s: u64,
    pub tasks: usize,
    pub policies: Vec<PolicyReport>,
    /// Rebalancer relative to the oracle, when both ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_oracle: Option<VsOracle>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VsOracle {
    /// Rebalancer's mean locality / oracle's.
    pub locality_ratio: f64,
    /// Rebalancer's migrated bytes / oracle's (`None` when the oracle migrated nothing).
    pub migration_ratio: Option<f64>,
}

/// Runs `policies` (each from the same start) and compares.
pub fn simulate(
    base: &Topology,
    topology_name: &str,
    trace: &Workload,
    cfg: &SimConfig,
    policies: &[SimPolicy],
) -> Result<Report, SimError> {
    let topo = trace.machine(base);
    let mut reports = Vec::new();
    for &p in policies {
        reports.push(run_policy(&topo, trace, cfg, p)?);
    }
    let find = |p| reports.iter().find(|r: &&PolicyReport| r.policy == p);
    let vs_oracle = match (find(SimPolicy::Rebalancer), find(SimPolicy::Oracle)) {
        (Some(r), Some(o)) => Some(VsOracle {
            locality_ratio: if o.mean_locality > 0.0 {
                (r.mean_locality / o.mean_locality * 1e4).round() / 1e4
            } else {
                1.0
            },
            migration_ratio: (o.bytes_migrated > 0)
                .then(|| (r.bytes_migrated as f64 / o.bytes_migrated as f64 * 1e4).round() / 1e4),
        }),
        _ => None,
    };
    Ok(Report {
        workload: trace.name.clone(),
        seed: trace.seed,
        topology: topology_name.to_string(),
        nodes: topo.nodes.len(),
        cpus: topo.cpus.len(),
        duration_s: trace.duration_s,
        tasks: trace.tasks.len(),
        policies: reports,
        vs_oracle,
    })
}

/// The report as a Markdown table (as pasted into BENCHMARKS.md).
pub fn table(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} (seed {}, {} tasks, {} s) on {} ({} nodes, {} CPUs)\n",
        r.workload, r.seed, r.tasks, r.duration_s, r.topology, r.nodes, r.cpus
    );
    let _ = writeln!(
        s,
        "| policy | locality | remote % over time | slowdown | oracle's gain captured | moves (reversals) | migrated GiB | pages migrated | cross-node sched migrations | admitted / rejected |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    let slowdown = |q| {
        r.policies
            .iter()
            .find(|p| p.policy == q)
            .map(|p| p.slowdown)
    };
    let (stat, oracle) = (slowdown(SimPolicy::Static), slowdown(SimPolicy::Oracle));
    for p in &r.policies {
        let tl: Vec<String> = p
            .remote_timeline
            .iter()
            .map(|x| format!("{:.0}", x * 100.0))
            .collect();
        let _ = writeln!(
            s,
            "| {:?} | {:.3} | {} | {:.3} | {} | {} ({}) | {:.2} | {} | {} | {} / {} |",
            p.policy,
            p.mean_locality,
            tl.join(" "),
            p.slowdown,
            match (stat, oracle) {
                (Some(st), Some(o)) => heldout::captured(st, p.slowdown, o)
                    .map_or("-".into(), |c| format!("{:.0}%", c * 100.0)),
                _ => "-".into(),
            },
            p.moves,
            p.move_reversals,
            p.bytes_migrated as f64 / (1u64 << 30) as f64,
            p.pages_migrated,
            p.cross_node_migrations,
            p.admitted,
            p.rejections
        );
        if p.invariant_violations > 0 {
            let _ = writeln!(
                s,
                "| ^ {} INVARIANT VIOLATIONS | | | | | | | | |",
                p.invariant_violations
            );
        }
    }
    for p in r.policies.iter().filter(|p| !p.planner_skips.is_empty()) {
        let skips: Vec<String> = p
            .planner_skips
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(
            s,
            "\n{:?}: {} planner rounds; {} of the moves were staged rounds; skipped candidates: {}",
            p.policy,
            p.planner_rounds,
            p.staged_rounds,
            skips.join(", ")
        );
    }
    if let Some(v) = &r.vs_oracle {
        let _ = writeln!(
            s,
            "\nrebalancer / oracle: locality {:.3}, migrations {}",
            v.locality_ratio,
            v.migration_ratio
                .map_or("n/a (oracle migrated nothing)".into(), |m| format!(
                    "{m:.3}"
                ))
        );
    }
    s
}

#[cfg(test)]
mod tests;

//! `rebalancer simulate`: run a workload trace on a fixture machine under the rebalancer and
//! the static / AutoNUMA-like / oracle baselines (see `sim`), or `--generate` a seeded trace,
//! or `--machines N`: every trace kind on N generated machines, the tune / held-out measure
//! (`sim::heldout`).
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use crate::config::Config;
use crate::sim::heldout::{self, Half};
use crate::sim::{self, Kind, SimConfig, SimPolicy, Workload};
use crate::topology::sysfs;

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// A sysfs tree (directory standing for /sys) or a fixture name under
    /// tests/fixtures/sysfs (epyc-nps4, intel-snc, gpu-nic, kunpeng920, …).
    #[arg(
        long,
        value_name = "DIR|NAME",
        required_unless_present_any = ["generate", "machines", "machine"]
    )]
    pub topology: Option<String>,
    /// Instead of --topology: the generated machine of this seed (see --machines).
    #[arg(long, value_name = "SEED", conflicts_with = "topology")]
    pub machine: Option<u64>,
    /// The workload trace (JSON, as printed by --generate); "-" reads stdin.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present_any = ["generate", "machines"]
    )]
    pub workload: Option<PathBuf>,
    /// Instead of one trace: every trace kind on this many generated machines (seeds from
    /// --first-machine), Static, Rebalancer and Oracle on each, with the share of the
    /// oracle's gain the rebalancer captures per case and summed per half.
    #[arg(long, value_name = "N", conflicts_with_all = ["topology", "workload", "generate"])]
    pub machines: Option<u64>,
    /// Seed of the first generated machine of --machines.
    #[arg(long, default_value_t = 1000, requires = "machines")]
    pub first_machine: u64,
    /// Which half of --machines to run: even machine seeds are the tune half, odd ones are
    /// held out.
    #[arg(long, value_enum, default_value = "both", requires = "machines")]
    pub half: Half,
    /// Print a generated trace of this kind on stdout instead of simulating.
    #[arg(long, value_enum, value_name = "KIND")]
    pub generate: Option<Kind>,
    /// Seed of --generate.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Policies to run (comma-separated); default all five.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub policy: Vec<SimPolicy>,
    /// Rebalancer config (its [placement] and [controller] sections are used); default the
    /// embedded one.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Diagnostics: list every move of the Rebalancer with what the planner priced (saving,
    /// cost, contention, horizons) and the workload's age and remaining life in the trace.
    #[arg(long)]
    pub moves: bool,
    /// Diagnostics: for each workload the Rebalancer moved, run it again with that workload
    /// never moved, and print how much the slowdown changes (> 0: its moves cost overall).
    #[arg(long)]
    pub attribute: bool,
}

pub fn run(a: SimulateArgs) -> anyhow::Result<ExitCode> {
    if let Some(kind) = a.generate {
        let w = sim::generate(kind, a.seed);
        println!("{}", serde_json::to_string_pretty(&w)?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(n) = a.machines {
        return sweep(&a, n);
    }
    let Some(wl) = a.workload.as_deref() else {
        bail!("--workload is required unless --generate or --machines is given");
    };
    let (topo, name) = match (a.topology.as_deref(), a.machine) {
        (_, Some(seed)) => {
            let m = sim::machines::machine(seed);
            (m.topology, m.name)
        }
        (Some(arg), None) => {
            let root = fixture_dir(arg)?;
            let topo = sysfs::read(&root)
                .with_context(|| format!("reading topology under {}", root.display()))?;
            let name = Path::new(arg)
                .file_name()
                .map_or(arg.to_string(), |n| n.to_string_lossy().into_owned());
            (topo, name)
        }
        (None, None) => bail!("--topology or --machine is required unless --generate is given"),
    };
    let text = if wl == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading the workload from stdin")?
    } else {
        std::fs::read_to_string(wl).with_context(|| format!("reading {}", wl.display()))?
    };
    let trace = Workload::from_json(&text).with_context(|| format!("in {}", wl.display()))?;
    let mut cfg = Config::load(a.config.as_deref())?;
    // A machine with more nodes than kubelet's default limit: as its operator would, raise it.
    let limit = &mut cfg.placement.max_allowable_numa_nodes;
    *limit = (*limit).max(topo.nodes.len() as u32);
    let sc = SimConfig {
        placement: cfg.placement,
        controller: cfg.controller,
        log_moves: a.moves || a.attribute,
        ..SimConfig::default()
    };
    let mut policies = if a.policy.is_empty() {
        vec![
            SimPolicy::Rebalancer,
            SimPolicy::Static,
            SimPolicy::Kubelet,
            SimPolicy::Autonuma,
            SimPolicy::Oracle,
        ]
    } else {
        a.policy.clone()
    };
    policies.dedup();
    let report = sim::simulate(&topo, &name, &trace, &sc, &policies)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", sim::table(&report));
    }
    if a.moves || a.attribute {
        diagnose(&topo, &name, &trace, &sc, &report, a.attribute)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--machines`: the tune / held-out measure, one row per case as it finishes (stderr), the
/// table and the per-half summary on stdout.
fn sweep(a: &SimulateArgs, n: u64) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(a.config.as_deref())?;
    let sc = SimConfig {
        placement: cfg.placement,
        controller: cfg.controller,
        ..SimConfig::default()
    };
    let mut results = Vec::new();
    for (case, kind) in heldout::cases(a.first_machine, n, a.half) {
        let r = heldout::run_case(case, kind, &sc)
            .with_context(|| format!("machine {} trace {}", case.machine, case.kind))?;
        eprintln!(
            "{} {}: static {:.4} rebalancer {:.4} oracle {:.4}",
            r.machine_name, case.kind, r.static_slowdown, r.rebalancer_slowdown, r.oracle_slowdown
        );
        results.push(r);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{}", heldout::table(&results));
    }
    Ok(ExitCode::SUCCESS)
}

/// The Rebalancer's moves (and, with `attribute`, each moved workload's share of the
/// slowdown: the run again with it never moved), on stderr.
fn diagnose(
    topo: &crate::topology::Topology,
    name: &str,
    trace: &Workload,
    sc: &SimConfig,
    report: &sim::Report,
    attribute: bool,
) -> anyhow::Result<()> {
    let Some(r) = report
        .policies
        .iter()
        .find(|p| p.policy == SimPolicy::Rebalancer)
    else {
        bail!("--moves / --attribute need the rebalancer policy");
    };
    eprintln!("\nRebalancer moves (slowdown {}):", r.slowdown);
    eprintln!("| t s | cgroup | trigger | mems | staged | MiB | age s | left s | gain | relief | horizon / relief ms | saving | cost | contention | net | realized relief |");
    eprintln!("|---:|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|");
    for m in &r.move_log {
        let p = m.priced.as_ref();
        let f = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
        eprintln!(
            "| {} | {} | {} | {} → {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} |",
            m.t_s,
            m.cgroup,
            m.trigger,
            m.from_mems,
            m.to_mems,
            m.staged,
            m.bytes as f64 / (1u64 << 20) as f64,
            m.age_s,
            m.left_s.map_or("end".into(), |x| format!("{x:.0}")),
            f(p.map(|c| c.gain)),
            f(p.map(|c| c.relief)),
            p.map_or("-".into(), |c| format!("{} / {}", c.horizon_ms, c.relief_horizon_ms)),
            f(p.map(|c| c.saving)),
            f(p.map(|c| c.cost)),
            f(p.map(|c| c.contention)),
            f(p.map(|c| c.net)),
            m.realized_relief,
        );
    }
    if !attribute {
        return Ok(());
    }
    let moved: std::collections::BTreeSet<&str> =
        r.move_log.iter().map(|m| m.cgroup.as_str()).collect();
    eprintln!("\nEach moved workload never moved (Δ = slowdown with its moves − without):");
    eprintln!("| cgroup | moves | slowdown without | moves without | Δ |");
    eprintln!("|---|---:|---:|---:|---:|");
    for c in moved {
        let mut one = sc.clone();
        one.log_moves = false;
        one.frozen = [c.to_string()].into();
        let without = sim::simulate(topo, name, trace, &one, &[SimPolicy::Rebalancer])?;
        let (s, k) = (without.policies[0].slowdown, without.policies[0].moves);
        let n = r.move_log.iter().filter(|m| m.cgroup == c).count();
        eprintln!("| {c} | {n} | {s} | {k} | {:+.4} |", r.slowdown - s);
    }
    Ok(())
}

/// A directory as given, or a fixture name looked up under tests/fixtures/sysfs (from the
/// current directory, then from the source tree the binary was built from).
fn fixture_dir(arg: &str) -> anyhow::Result<PathBuf> {
    let p = PathBuf::from(arg);
    if p.is_dir() {
        return Ok(p);
    }
    let candidates = [
        PathBuf::from("tests/fixtures/sysfs").join(arg),
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/sysfs")
            .join(arg),
    ];
    candidates
        .into_iter()
        .find(|c| c.is_dir())
        .with_context(|| format!("--topology {arg}: neither a directory nor a fixture name"))
}

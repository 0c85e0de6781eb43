//! `cargo xtask vm-test`: proves NUMA behaviour in real kernels with emulated multi-node
//! topologies. For each topology: pack an initramfs (busybox, tests/vm/init, the scenario scripts,
//! static rebalancer + guest-tool), boot it under QEMU TCG, read the serial console and judge.
//!
//! - `topology`: the emulated machines (QEMU line + expected facts from one definition).
//! - `scenario`: the registry of guest scenarios (scripts in tests/vm/scenarios/).
//! - `verdict`: the console protocol (SCENARIO-BEGIN/END, DATA blocks, VERDICT, VM-DONE).
//! - `judge`: host-side judges for scenarios that print data.
//! - `assets`: packages, kernel cache, static builds, initramfs; `qemu`: boot and console.
//! - `bench`: `cargo xtask vm-bench`, the side-by-side benchmark (no manager, AutoNUMA, numad,
//!   rebalancer) in one boot.
pub mod assets;
mod bench;
mod judge;
mod qemu;
mod scenario;
mod topology;
mod verdict;

use std::{fs, process::Command, time::Duration};

use anyhow::{bail, Context, Result};

pub use bench::{vm_bench, VmBenchArgs};
use scenario::Scenario;
use topology::VmTopology;
use verdict::{Status, Verdict};

#[derive(Debug, clap::Args)]
pub struct VmTestArgs {
    /// Topology to boot (repeatable; default: all of 2node, 4node-asym, memonly).
    #[arg(long, value_name = "NAME")]
    pub topology: Vec<String>,
    /// Scenario to run (repeatable; default: every default scenario).
    #[arg(long, value_name = "NAME")]
    pub scenario: Vec<String>,
    /// Keep the staged initramfs tree (target/vm/<topology>/root) after a passing run.
    #[arg(long)]
    pub keep: bool,
    /// Host-side limit per boot in seconds (default: 60 + the scenarios' own limits).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Test this rebalancer binary instead of building one (e.g. another branch's build; a
    /// dynamically linked one gets its shared libraries copied into the guest).
    #[arg(long, value_name = "PATH")]
    pub rebalancer_bin: Option<std::path::PathBuf>,
    /// Give every node of the selected topologies at least this much memory (MiB), e.g. 1536
    /// for scenario round-latency's 1 GiB workload.
    #[arg(long, value_name = "MIB")]
    pub node_mem_mib: Option<u64>,
    /// List the topologies and scenarios, then exit.
    #[arg(long)]
    pub list: bool,
    /// Debian suite of the guest's cloud kernel: bookworm (6.1, the default) or trixie (6.12).
    #[arg(long, value_name = "SUITE", default_value = "bookworm")]
    pub kernel_suite: String,
}

impl Default for VmTestArgs {
    fn default() -> Self {
        VmTestArgs {
            topology: Vec::new(),
            scenario: Vec::new(),
            keep: false,
            timeout: None,
            rebalancer_bin: None,
            node_mem_mib: None,
            list: false,
            kernel_suite: "bookworm".into(),
        }
    }
}

fn list() {
    println!("topologies:");
    for n in topology::NAMES.iter().chain(topology::MORE) {
        if let Some(t) = topology::by_name(n) {
            let d = if topology::MORE.contains(n) {
                " (not run by default)"
            } else {
                ""
            };
            println!("  {:<12} {}{d}", t.name, t.about);
        }
    }
    println!("scenarios:");
    for s in scenario::ALL {
        let d = if !s.default {
            " (not run by default)".to_string()
        } else if !s.topologies.is_empty() {
            format!(" (by default on {} only)", s.topologies.join(", "))
        } else {
            String::new()
        };
        println!("  {:<18} {}{d}", s.name, s.about);
    }
}

struct Outcome {
    topology: &'static str,
    seconds: f64,
    verdicts: Vec<Verdict>,
    log: std::path::PathBuf,
}

fn now_stamp() -> String {
    Command::new("date")
        .args(["-u", "+%Y%m%dT%H%M%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "now".into())
}

fn select(a: &VmTestArgs) -> Result<(Vec<VmTopology>, Vec<&'static Scenario>)> {
    let topo_names: Vec<&str> = if a.topology.is_empty() {
        topology::NAMES.to_vec()
    } else {
        a.topology.iter().map(String::as_str).collect()
    };
    let topos = topo_names
        .iter()
        .map(|n| {
            let t = topology::by_name(n)
                .with_context(|| format!("unknown topology {n:?}; known: {}", topology::known()))?;
            let mut t = t;
            if let Some(mib) = a.node_mem_mib {
                for n in &mut t.nodes {
                    n.mem_mib = n.mem_mib.max(mib);
                }
            }
            t.validate().map_err(anyhow::Error::msg)?;
            Ok(t)
        })
        .collect::<Result<Vec<_>>>()?;
    let scenarios = if a.scenario.is_empty() {
        scenario::ALL.iter().filter(|s| s.default).collect()
    } else {
        a.scenario
            .iter()
            .map(|n| {
                scenario::by_name(n).with_context(|| {
                    let known: Vec<&str> = scenario::ALL.iter().map(|s| s.name).collect();
                    format!("unknown scenario {n:?}; known: {}", known.join(", "))
                })
            })
            .collect::<Result<Vec<_>>>()?
    };
    Ok((topos, scenarios))
}

fn run_one(
    topo: &VmTopology,
    scenarios: &[&'static Scenario],
    assets: &assets::Assets,
    a: &VmTestArgs,
) -> Result<Outcome> {
    let dir = assets::vm_dir().join(topo.name);
    fs::create_dir_all(&dir)?;
    let initrd = assets::initramfs(&dir, assets, topo, scenarios)?;
    let args = qemu::command_line(topo, &assets.kernel, &initrd);
    fs::write(
        dir.join("boot.sh"),
        format!("#!/bin/sh\nexec qemu-system-x86_64 {}\n", args.join(" ")),
    )?;
    let logs = assets::vm_dir().join("logs");
    fs::create_dir_all(&logs)?;
    let log = logs.join(format!("{}-{}.log", topo.name, now_stamp()));
    let timeout = a.timeout.unwrap_or_else(|| {
        60 + scenarios
            .iter()
            .map(|s| u64::from(s.timeout_s))
            .sum::<u64>()
    });
    println!(
        "=== vm-test: booting {} ({}), scenarios: {}",
        topo.name,
        topo.about,
        scenarios
            .iter()
            .map(|s| s.name)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let boot = qemu::boot(
        &args,
        &log,
        Duration::from_secs(timeout),
        &format!("[{}]", topo.name),
    )?;
    let console = verdict::parse(&boot.console);
    let mut verdicts: Vec<Verdict> = scenarios
        .iter()
        .flat_map(|s| {
            let sec = console.sections.iter().find(|x| x.name == s.name);
            s.verdicts(sec, topo)
        })
        .collect();
    if boot.timed_out {
        verdicts.push(Verdict::new(
            "vm",
            Status::Fail,
            format!("host timeout after {timeout}s"),
        ));
    } else if !console.done {
        verdicts.push(Verdict::new(
            "vm",
            Status::Fail,
            "guest ended without VM-DONE",
        ));
    }
    if !a.keep && verdict::worst(&verdicts) != Status::Fail {
        let _ = fs::remove_dir_all(dir.join("root"));
    }
    Ok(Outcome {
        topology: topo.name,
        seconds: boot.seconds,
        verdicts,
        log,
    })
}

pub fn vm_test(a: &VmTestArgs) -> Result<()> {
    if a.list {
        list();
        return Ok(());
    }
    let failed = run(a, None)?;
    if !failed.is_empty() {
        bail!(
            "vm-test: {} verdict(s) FAIL; guest logs listed above",
            failed.len()
        );
    }
    Ok(())
}

/// The test command's guest run: every default scenario on every topology, and the harness's
/// self-test in the same 2node boot (no boot of its own): the always-failing `selftest-fail`
/// must be counted as the one FAIL, which proves a failing scenario fails the run.
pub fn test_run() -> Result<()> {
    const SELFTEST: (&str, &str) = ("2node", "selftest-fail");
    let failed = run(&VmTestArgs::default(), Some(SELFTEST))?;
    let (expected, other): (Vec<_>, Vec<_>) = failed
        .into_iter()
        .partition(|(t, v)| (*t, v.as_str()) == SELFTEST);
    if !other.is_empty() {
        bail!(
            "vm-test: {} verdict(s) FAIL; guest logs listed above",
            other.len()
        );
    }
    if expected.is_empty() {
        bail!("vm-test self-test: scenario selftest-fail on 2node did not fail the run");
    }
    println!("=== vm-test self-test passed: selftest-fail's FAIL was counted");
    Ok(())
}

/// Boots each selected topology with its scenarios (plus `extra`: a scenario added to one
/// topology's boot), prints the summary and returns the failed verdicts as (topology, name).
fn run(a: &VmTestArgs, extra: Option<(&str, &str)>) -> Result<Vec<(&'static str, String)>> {
    let (topos, scenarios) = select(a)?;
    let t0 = std::time::Instant::now();
    let assets = assets::prepare(a.rebalancer_bin.as_deref(), &a.kernel_suite)?;
    let prep = t0.elapsed().as_secs_f64();
    let mut outcomes = Vec::new();
    for t in &topos {
        // Without --scenario, a scenario restricted to some topologies boots only on those.
        let mut here: Vec<&'static Scenario> = scenarios
            .iter()
            .copied()
            .filter(|s| !a.scenario.is_empty() || s.by_default_on(t.name))
            .collect();
        if let Some((topology, name)) = extra {
            if topology == t.name {
                here.push(scenario::by_name(name).context("no such scenario")?);
            }
        }
        if here.is_empty() {
            continue;
        }
        outcomes.push(run_one(t, &here, &assets, a)?);
    }
    println!("\n=== vm-test summary (preparation {prep:.0}s)");
    let mut failed = Vec::new();
    for o in &outcomes {
        println!(
            "--- {}: {:.0}s, {}  log: {}",
            o.topology,
            o.seconds,
            verdict::worst(&o.verdicts),
            o.log.display()
        );
        for v in &o.verdicts {
            println!("  {:<4} {:<20} {}", v.status, v.name, v.detail);
            if v.status == Status::Fail {
                failed.push((o.topology, v.name.to_string()));
            }
        }
    }
    println!("=== vm-test total {:.0}s", t0.elapsed().as_secs_f64());
    Ok(failed)
}

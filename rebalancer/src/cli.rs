//! Command line: clap definitions of every subcommand and the dispatch to `cmd::*`.
//!
//! Each subcommand's arguments live beside its code in `cmd/`; this file only lists them.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cmd;

/// eBPF-assisted dynamic NUMA rebalancer: Topology-Manager-exact admission of containers, then
/// measured, cost-bounded re-placement of their cpuset.cpus / cpuset.mems.
#[derive(Debug, Parser)]
#[command(name = "rebalancer", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: sample, admit, rebalance (root; stops cleanly on SIGINT/SIGTERM).
    ///
    /// Kubernetes: containers are admitted by the NRI plugin or the cgroup watcher
    /// (`[kubernetes] admission`). Kubelet's Topology Manager should be `none`; if kubelet's
    /// CPU / Memory Manager run a static policy, their state files in
    /// `[kubernetes] kubelet_state_dir` (default /var/lib/kubelet) are adopted at start and on
    /// SIGHUP: those CPUs and that memory are kubelet's, its pods are never admitted or moved.
    /// `[kubernetes] nri_runtime_updates` ("auto" | true | false) says whether the daemon's own
    /// changes are also sent to the runtime as NRI updates ("auto": only to containerd >= 2.4.0;
    /// earlier containerd deadlock, containerd#13733; CRI-O and unknown runtimes: off). See the embedded default config (config/rebalancer.toml).
    Run(cmd::run::RunArgs),
    /// Print the machine's NUMA topology (nodes, CPUs, caches, distances, PCI devices).
    Topology(cmd::topology::TopologyArgs),
    /// Report which eBPF and PMU sources this kernel supports, and the cgroup mode.
    Probe(cmd::probe::ProbeArgs),
    /// Sample per-cgroup, per-node on-CPU time, migrations and NUMA signals with eBPF (root).
    Sample(cmd::sample::SampleArgs),
    /// Ask the running daemon to admit (or --release) a pod; prints per-container placements.
    Admit(cmd::admit::AdmitArgs),
    /// Show the running daemon's pods, placements, scores and decisions.
    Status(cmd::admit::StatusArgs),
    /// Explain the running daemon's last decision about one cgroup.
    Explain(cmd::admit::ExplainArgs),
    /// Live view of the running daemon: nodes × workloads (CPU share, memory share, locality).
    Top(cmd::top::TopArgs),
    /// Topology-hint tools (kubelet Topology Manager model).
    #[command(subcommand)]
    Hints(cmd::hints::HintsCommand),
    /// Admit a list of pods in order on a (fixture) machine and print each placement (dry).
    Plan(cmd::plan::PlanArgs),
    /// Simulate a workload trace on a fixture machine: rebalancer vs static, AutoNUMA, oracle.
    Simulate(cmd::simulate::SimulateArgs),
    /// Hand every managed container cgroup its parent's cpuset.cpus / cpuset.mems back and
    /// restore kernel.numa_balancing as it was before the daemon (root; the daemon stopped).
    ///
    /// Stop the daemon first: while one holds the state directory's lock this refuses (unless
    /// --force). Managed containers: the checkpoint's bindings and the Kubernetes containers
    /// under kubelet's cgroup root, except pods kubelet's static managers placed. See
    /// docs/operations.md.
    Uninstall(cmd::uninstall::UninstallArgs),
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Topology(a) => cmd::topology::run(a),
        Command::Probe(a) => cmd::probe::run(a),
        Command::Sample(a) => cmd::sample::run(a),
        Command::Hints(c) => cmd::hints::run(c),
        Command::Admit(a) => cmd::admit::admit(a),
        Command::Status(a) => cmd::admit::status(a),
        Command::Explain(a) => cmd::admit::explain(a),
        Command::Top(a) => cmd::top::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Simulate(a) => cmd::simulate::run(a),
        Command::Uninstall(a) => cmd::uninstall::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rebalancer: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Initialises tracing to stderr; `RUST_LOG` overrides `default_filter`.
pub fn init_tracing(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}

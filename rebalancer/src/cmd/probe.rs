//! `rebalancer probe`: which eBPF / PMU sources this kernel supports, and the cgroup mode.
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: ProbeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("probe is not written yet (issue 4)")
}

//! `rebalancer hints merge`: the Topology Manager merge as a command (conformance contract).
use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum HintsCommand {
    /// Merge provider hints under a policy: one case object on stdin, or an array with --file.
    Merge {
        /// A JSON file holding an array of cases (one result line per case, same order).
        #[arg(long)]
        file: Option<std::path::PathBuf>,
    },
}

pub fn run(_c: HintsCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("hints merge is not written yet (issue 3)")
}

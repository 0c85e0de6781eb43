//! `rebalancer run`: the daemon. Loads config (embedded default when no file), then hands over
//! to `daemon::run`.
use std::{path::PathBuf, process::ExitCode};

use crate::{cli::init_tracing, config::Config};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Config file (TOML). Without it the embedded default (config/rebalancer.toml) is used.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Compute and log every decision but write nothing to cgroupfs (overrides the config).
    #[arg(long)]
    pub dry_run: bool,
    /// Directory standing for /sys (overrides daemon.sysfs_root).
    #[arg(long, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
    /// Address of /metrics and /healthz (overrides server.metrics_listen), e.g. the node's IP
    /// from the Kubernetes downward API: `--metrics-listen $(NODE_IP):9717`.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Stop after this many control periods (0 = run until signalled). For tests.
    #[arg(long, default_value_t = 0)]
    pub rounds: u64,
}

pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = Config::load(a.config.as_deref())?;
    if a.dry_run {
        cfg.daemon.dry_run = true;
    }
    if let Some(root) = a.sysfs_root.clone() {
        cfg.daemon.sysfs_root = root;
    }
    if let Some(listen) = a.metrics_listen.clone() {
        cfg.server.metrics_listen = listen;
    }
    init_tracing(&cfg.daemon.log_level);
    Config::warn_removed_keys(a.config.as_deref());
    // Two workers: the listeners (API, /metrics, /healthz) never queue behind each other; the
    // control rounds, the watcher and fsyncs run on their own threads, never on these.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rebalancer-rt")
        .enable_all()
        .build()?;
    rt.block_on(crate::daemon::run::run(cfg, a.config, a.rounds))?;
    Ok(ExitCode::SUCCESS)
}

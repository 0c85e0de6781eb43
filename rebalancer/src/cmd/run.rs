//! `rebalancer run`: the daemon. Loads config (embedded default when no file), discovers the
//! machine, then runs one `tokio::select!` loop over the control tick and signals until
//! SIGINT/SIGTERM.
use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};

use crate::{cli::init_tracing, config::Config, serve, topology::sysfs};

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
    init_tracing(&cfg.daemon.log_level);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(daemon(cfg, a.rounds))?;
    Ok(ExitCode::SUCCESS)
}

async fn daemon(cfg: Config, max_rounds: u64) -> anyhow::Result<()> {
    let topo = sysfs::read(&cfg.daemon.sysfs_root)
        .with_context(|| format!("reading topology under {}", cfg.daemon.sysfs_root.display()))?;
    tracing::info!(
        nodes = topo.nodes.len(),
        cpus = topo.cpus.len(),
        devices = topo.devices.len(),
        dry_run = cfg.daemon.dry_run,
        "rebalancer starting"
    );
    let metrics = serve::Metrics::default();
    let cancel = tokio_util::sync::CancellationToken::new();
    let listen = cfg.server.metrics_listen.parse()?;
    let (metrics_addr, metrics_task) =
        serve::spawn_metrics(listen, metrics.clone(), cancel.clone())
            .await
            .with_context(|| format!("binding the metrics listener on {listen}"))?;
    tracing::info!(%metrics_addr, "serving /metrics and /healthz");
    let (mut sampler, sources) = crate::ebpf::Sampler::start(&topo, &cfg.ebpf);
    for s in &sources {
        tracing::info!(source = %s.name, available = s.available, reason = %s.reason, "eBPF source");
    }
    if sampler.is_none() {
        tracing::warn!("running without eBPF sampling (see the source reasons above)");
    }
    let mut last_sample = std::collections::BTreeMap::new();
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.controller.period_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rounds = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                rounds += 1;
                tracing::debug!(round = rounds, "control round");
                if let Some(sm) = sampler.as_mut() {
                    match sm.read() {
                        Ok(now) => {
                            let delta = crate::ebpf::delta_all(&now, &last_sample);
                            for (id, d) in &delta {
                                tracing::debug!(
                                    cgroup_id = id,
                                    path = sm.cgroup_path(*id).unwrap_or("?"),
                                    cpu_ns = ?d.cpu_ns,
                                    migrations = d.migrations,
                                    cross_node = d.cross_node_migrations,
                                    numa_moves = d.numa_moves,
                                    pages_migrated = d.pages_migrated,
                                    "eBPF sample"
                                );
                            }
                            last_sample = now;
                        }
                        Err(e) => tracing::warn!(error = %e, "reading eBPF maps failed"),
                    }
                }
                if max_rounds != 0 && rounds >= max_rounds {
                    tracing::info!(rounds, "round limit reached, stopping");
                    break;
                }
            }
            _ = sigint.recv() => { tracing::info!("SIGINT received, stopping"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM received, stopping"); break; }
        }
    }
    cancel.cancel();
    let _ = metrics_task.await;
    tracing::info!("rebalancer stopped cleanly");
    Ok(())
}

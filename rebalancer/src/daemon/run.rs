//! The daemon's main task: discover the machine, restore the checkpoint, start the listeners,
//! the watcher and the control-round thread, then one `tokio::select!` loop over SIGHUP (config
//! reload), SIGINT/SIGTERM and the round limit. The runtime only listens: control rounds
//! (which read /proc, write cgroupfs and wait for the kernel to migrate pages — seconds) run on
//! their own thread ([`spawn_rounds`]), so the API, `/metrics` and `/healthz` answer while a
//! round migrates.
use std::{
    path::PathBuf,
    sync::{mpsc, Arc},
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::{admission::Admission, engine, writer::CgroupCpusetWriter, Daemon, Persisted, Shared};
use crate::{
    checkpoint,
    config::Config,
    controller::ControllerState,
    placement::admission::Allocator,
    serve::{self, socket},
    topology::sysfs,
};

/// Loads the checkpoint, or starts empty (with a warning when one existed but was unusable).
/// Its times are CLOCK_BOOTTIME milliseconds (see `daemon::boot_ms`): they keep their meaning
/// across the restart; any from the future (an earlier boot) are clamped to now.
pub(crate) fn restore(cfg: &Config, topo: &crate::topology::Topology) -> anyhow::Result<Persisted> {
    let fresh = || -> anyhow::Result<Persisted> {
        Ok(Persisted {
            allocator: Allocator::new(topo, &cfg.placement)
                .context("building the allocator from config")?,
            bindings: Default::default(),
            controller: ControllerState::default(),
        })
    };
    match checkpoint::load::<Persisted>(&cfg.daemon.state_dir) {
        Ok(Some(mut p)) => {
            let clamped = p.controller.clamp_times(super::boot_ms());
            if clamped > 0 {
                tracing::warn!(
                    clamped,
                    "checkpoint times from the future (an earlier boot?) set to now"
                );
            }
            tracing::info!(
                pods = p.allocator.pods.len(),
                bindings = p.bindings.len(),
                "checkpoint restored"
            );
            Ok(p)
        }
        Ok(None) => fresh(),
        Err(e @ checkpoint::CheckpointError::Version { .. }) => Err(e.into()),
        Err(e) => {
            tracing::warn!(error = %e, "checkpoint unusable; rebuilding from the live cgroups");
            fresh()
        }
    }
}

pub async fn run(cfg: Config, config_path: Option<PathBuf>, max_rounds: u64) -> anyhow::Result<()> {
    // First, so a signal during start-up (restore, reconcile, eBPF load) is a clean stop, not
    // the default action's kill.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let topo = sysfs::read(&cfg.daemon.sysfs_root)
        .with_context(|| format!("reading topology under {}", cfg.daemon.sysfs_root.display()))?;
    tracing::info!(
        nodes = topo.nodes.len(),
        cpus = topo.cpus.len(),
        devices = topo.devices.len(),
        dry_run = cfg.daemon.dry_run,
        "rebalancer starting"
    );
    log_topology(&topo);
    let cgroups =
        crate::cgroup::Cgroups::detect(&cfg.cgroups.mount, "/proc/self/mountinfo".as_ref())
            .with_context(|| format!("detecting cgroups under {}", cfg.cgroups.mount.display()))?;
    let cpuset = cgroups
        .hierarchy(crate::cgroup::Controller::Cpuset)
        .map(|(p, v)| format!("{v:?} at {}", p.display()))
        .unwrap_or_else(|e| e.to_string());
    tracing::info!(mode = %cgroups.mode(), cpuset = %cpuset, "cgroups");
    let autonuma_restore = coexist_with_autonuma(cfg.controller.autonuma);
    let mut cfg = cfg;
    let mut persisted = restore(&cfg, &topo)?;
    match super::admission::reconfigure(&mut persisted.allocator, &topo, &cfg.placement) {
        Ok(true) => {
            tracing::info!(reserved_cpus = %persisted.allocator.reserved_cpus, "changed reservations applied to the restored allocator")
        }
        Ok(false) => {}
        Err(e) => {
            tracing::error!(error = %e, reserved_cpus = %persisted.allocator.reserved_cpus,
                "the configured reservations are not in force; the checkpoint's stay until the pods holding them are released and the daemon restarted or reloaded");
            cfg.placement.reserved_cpus = persisted.allocator.reserved_cpus.clone();
        }
    }
    let metrics = serve::Metrics::default();
    let daemon = Daemon::new(Shared::new(topo, cfg.clone(), persisted), metrics.clone());
    let admission = Admission::new(
        daemon.clone(),
        Arc::new(CgroupCpusetWriter(cgroups.clone())),
    );

    let cancel = CancellationToken::new();
    let listen = cfg.server.metrics_listen.parse()?;
    let (metrics_addr, metrics_task) =
        serve::spawn_metrics(listen, metrics.clone(), cancel.clone())
            .await
            .with_context(|| format!("binding the metrics listener on {listen}"))?;
    tracing::info!(%metrics_addr, "serving /metrics and /healthz");

    let gid = cfg
        .server
        .socket_group
        .as_deref()
        .map(socket::group_id)
        .transpose()?;
    let listener = socket::bind(&cfg.server.socket, gid)?;
    let api_task = socket::spawn(
        listener,
        super::api::router(admission.clone()),
        socket::Access { allowed_gid: gid },
        cfg.server.requests_per_second,
        cancel.clone(),
    );
    tracing::info!(socket = %cfg.server.socket.display(), "admission API listening");

    for o in super::watcher::reconcile(&admission, &cgroups) {
        tracing::info!(outcome = ?o, "reconciled at start");
    }
    match super::watcher::spawn(admission.clone(), cgroups.clone()) {
        Ok(_) => tracing::info!("cgroup watcher running (inotify)"),
        Err(e) => {
            tracing::warn!(error = %e, "cgroup watcher unavailable; new cgroups are admitted at the next restart only")
        }
    }
    let cpu_source = cpu_time_source(&daemon, &cgroups);
    tracing::info!(
        source = cpu_source.name(),
        "per-cgroup, per-node CPU time source"
    );
    let engine = engine::Engine::new(cgroups, cpu_source, "/proc".as_ref());
    let (limit_tx, mut limit_rx) = tokio::sync::oneshot::channel::<u64>();
    let (rounds_tx, rounds_thread) = spawn_rounds(engine, admission.clone(), max_rounds, limit_tx)?;
    loop {
        tokio::select! {
            n = &mut limit_rx => {
                match n {
                    Ok(rounds) => tracing::info!(rounds, "round limit reached, stopping"),
                    Err(_) => tracing::error!("the control-round thread stopped, stopping"),
                }
                break;
            }
            _ = sighup.recv() => {
                let d = daemon.clone();
                let path = config_path.clone();
                let _ = tokio::task::spawn_blocking(move || reload(&d, path.as_deref())).await;
                let _ = rounds_tx.send(RoundCmd::Reload);
            }
            _ = sigint.recv() => { tracing::info!("SIGINT received, stopping"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM received, stopping"); break; }
        }
    }
    // A round under way finishes first (no half-applied move).
    let _ = rounds_tx.send(RoundCmd::Stop);
    let _ = tokio::task::spawn_blocking(move || rounds_thread.join()).await;
    cancel.cancel();
    let _ = metrics_task.await;
    let _ = api_task.await;
    let _ = std::fs::remove_file(&cfg.server.socket);
    let d = daemon.clone();
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || d.checkpoint()).await {
        tracing::warn!(error = %e, "final checkpoint failed");
    }
    if let Some(old) = autonuma_restore {
        let _ = std::fs::write(NUMA_BALANCING, old);
    }
    tracing::info!("rebalancer stopped cleanly");
    Ok(())
}

/// What the main task tells the control-round thread.
#[derive(Debug)]
enum RoundCmd {
    /// The config was reloaded: the next round is due `period_ms` (the new one) after the
    /// last round started.
    Reload,
    /// Finish the round under way, if any, and stop.
    Stop,
}

/// Starts the control-round thread: a round at once, then one every `controller.period_ms`
/// (read from the live config, so a reload applies), measured start to start; a round longer
/// than the period is followed by the next at once. After `max_rounds` rounds (0: no limit)
/// it reports on `limit` and stops.
fn spawn_rounds(
    mut engine: engine::Engine,
    adm: Admission,
    max_rounds: u64,
    limit: tokio::sync::oneshot::Sender<u64>,
) -> std::io::Result<(mpsc::Sender<RoundCmd>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<RoundCmd>();
    let h = std::thread::Builder::new()
        .name("control-rounds".into())
        .spawn(move || {
            let mut rounds = 0u64;
            loop {
                let started = Instant::now();
                engine.round(&adm);
                rounds += 1;
                if max_rounds != 0 && rounds >= max_rounds {
                    let _ = limit.send(rounds);
                    return;
                }
                loop {
                    let period = Duration::from_millis(adm.daemon.lock().cfg.controller.period_ms);
                    let wait = (started + period).saturating_duration_since(Instant::now());
                    match rx.recv_timeout(wait) {
                        Ok(RoundCmd::Reload) => continue,
                        Ok(RoundCmd::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                    }
                }
            }
        })?;
    Ok((tx, h))
}

/// Starts the eBPF samplers (when enabled), records every source's status, and picks the
/// per-cgroup CPU-time source: eBPF where the cpuset hierarchy is v2 (its ids are v2 ids),
/// /proc otherwise.
fn cpu_time_source(d: &Daemon, cgroups: &crate::cgroup::Cgroups) -> Box<dyn engine::CpuTimeSource> {
    let (topo, ebpf_cfg) = {
        let s = d.lock();
        (s.topo.clone(), s.cfg.ebpf.clone())
    };
    let proc_source =
        || Box::new(engine::ProcCpuTime::new("/proc".as_ref())) as Box<dyn engine::CpuTimeSource>;
    if !ebpf_cfg.enabled {
        tracing::info!(
            "eBPF disabled by config (ebpf.enabled = false); running on memory.numa_stat and /proc"
        );
        return proc_source();
    }
    let (sampler, statuses) = crate::ebpf::Sampler::start(&topo, &ebpf_cfg);
    for st in &statuses {
        let l = crate::serve::metrics::SourceLabel {
            source: st.name.clone(),
        };
        d.metrics
            .ebpf_source_available
            .get_or_create(&l)
            .set(st.available as i64);
        if st.available {
            tracing::info!(source = %st.name, reason = %st.reason, "eBPF source attached");
        } else {
            tracing::info!(source = %st.name, reason = %st.reason, "eBPF source skipped");
        }
    }
    d.lock().sources = statuses
        .iter()
        .filter_map(|s| serde_json::to_value(s).ok())
        .collect();
    let v2 = cgroups
        .hierarchy(crate::cgroup::Controller::Cpuset)
        .is_ok_and(|(_, v)| v == crate::cgroup::Version::V2);
    let unified = cgroups.mounts().v2.is_some();
    match sampler {
        Some(sampler) if v2 => Box::new(engine::EbpfCpuTime {
            sampler,
            fallback: None,
        }),
        Some(sampler) if unified => {
            tracing::info!("cpuset is on cgroup v1 here and eBPF ids are v2 ids: cgroups with a twin in the unified hierarchy (as runc makes them) are read from eBPF, the others from /proc");
            Box::new(engine::EbpfCpuTime {
                sampler,
                fallback: Some(engine::ProcCpuTime::new("/proc".as_ref())),
            })
        }
        Some(_) => {
            tracing::info!("cpuset is on cgroup v1 and there is no cgroup2 mount for the eBPF ids; per-cgroup CPU time comes from /proc");
            proc_source()
        }
        None => {
            tracing::warn!(
                "no eBPF source could be attached; running on memory.numa_stat and /proc"
            );
            proc_source()
        }
    }
}

const NUMA_BALANCING: &str = "/proc/sys/kernel/numa_balancing";

/// Detects kernel AutoNUMA and follows `controller.autonuma`. Returns the value to restore on
/// exit when it was turned off.
fn coexist_with_autonuma(choice: crate::config::AutoNuma) -> Option<String> {
    use crate::config::AutoNuma;
    let Ok(cur) = std::fs::read_to_string(NUMA_BALANCING) else {
        tracing::info!("kernel NUMA balancing not present (no {NUMA_BALANCING})");
        return None;
    };
    let cur = cur.trim().to_string();
    if cur == "0" {
        tracing::info!("kernel NUMA balancing (AutoNUMA) is off");
        return None;
    }
    match choice {
        AutoNuma::Leave => None,
        AutoNuma::Warn => {
            tracing::warn!(value = %cur, "kernel NUMA balancing (AutoNUMA) is on: it migrates pages toward threads on its own and can undo placements; set controller.autonuma = \"disable\" to turn it off while rebalancer runs");
            None
        }
        AutoNuma::Disable => match std::fs::write(NUMA_BALANCING, "0") {
            Ok(()) => {
                tracing::info!(was = %cur, "kernel NUMA balancing turned off while rebalancer runs");
                Some(cur)
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not turn kernel NUMA balancing off");
                None
            }
        },
    }
}

/// SIGHUP: re-read the config; a bad file is reported and the running config kept. The
/// controller section (period included: the round thread reads it before each wait) and
/// dry-run apply at once; the placement section applies when its reservations can be applied
/// to the allocator (`admission::reconfigure`), else it is refused with the reason. Settings
/// that need a restart (listeners, state dir, sysfs root) are reported as such.
pub(crate) fn reload(d: &Daemon, path: Option<&std::path::Path>) {
    let new = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "config reload failed; keeping the running config");
            return;
        }
    };
    let _order = d.order();
    let mut s = d.lock();
    if new.server != s.cfg.server
        || new.daemon.state_dir != s.cfg.daemon.state_dir
        || new.daemon.sysfs_root != s.cfg.daemon.sysfs_root
    {
        tracing::warn!("server / state_dir / sysfs_root changes take effect at the next restart");
    }
    s.cfg.controller = new.controller;
    s.cfg.daemon.dry_run = new.daemon.dry_run;
    let sh = &mut *s;
    let placed = match super::admission::reconfigure(
        &mut sh.state.allocator,
        &sh.topo,
        &new.placement,
    ) {
        Ok(changed) => {
            sh.cfg.placement = new.placement;
            if changed {
                tracing::info!(reserved_cpus = %sh.state.allocator.reserved_cpus, "reservations changed");
            }
            changed
        }
        Err(e) => {
            tracing::error!(error = %e, "config reload: the [placement] section is not applied; the running one stays");
            false
        }
    };
    drop(s);
    if placed {
        if let Err(e) = d.checkpoint() {
            tracing::warn!(error = %e, "checkpoint after the reload failed");
        }
    }
    tracing::info!("config reloaded");
}

/// One log line per node: CPUs, sockets, L3 groups, memory, distances.
fn log_topology(topo: &crate::topology::Topology) {
    for n in &topo.nodes {
        let online: Vec<_> = topo
            .cpus
            .iter()
            .filter(|c| c.online && n.cpus.contains(c.id))
            .collect();
        let sockets: std::collections::BTreeSet<u32> = online.iter().map(|c| c.socket).collect();
        let l3: std::collections::BTreeSet<u32> = online.iter().filter_map(|c| c.l3).collect();
        tracing::info!(
            node = n.id,
            cpus = %n.cpus,
            sockets = ?sockets,
            l3_groups = l3.len(),
            memory_mib = n.memory_total_bytes >> 20,
            distances = ?n.distances,
            "numa node"
        );
    }
    let offline = topo.cpus.iter().filter(|c| !c.online).count();
    if offline > 0 {
        tracing::info!(offline, "offline CPUs");
    }
}

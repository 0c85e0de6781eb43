//! The daemon's main task: discover the machine, restore the checkpoint, start the listeners,
//! then one `tokio::select!` loop over the control tick, SIGHUP (config reload), SIGINT/SIGTERM.
use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::{engine, trigger, Daemon, Persisted, Shared};
use crate::{
    checkpoint,
    config::Config,
    controller::ControllerState,
    placement::admission::Allocator,
    serve::{self, socket},
    topology::sysfs,
};

/// Loads the checkpoint, or starts empty (with a warning when one existed but was unusable).
fn restore(cfg: &Config, topo: &crate::topology::Topology) -> anyhow::Result<Persisted> {
    let fresh = || -> anyhow::Result<Persisted> {
        Ok(Persisted {
            allocator: Allocator::new(topo, &cfg.placement)
                .context("building the allocator from config")?,
            bindings: Default::default(),
            controller: ControllerState::default(),
        })
    };
    match checkpoint::load::<Persisted>(&cfg.daemon.state_dir) {
        Ok(Some(p)) => {
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
    let persisted = restore(&cfg, &topo)?;
    let metrics = serve::Metrics::default();
    let daemon = Daemon::new(Shared::new(topo, cfg.clone(), persisted), metrics.clone());

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
        serve::api::router(daemon.clone()),
        socket::Access { allowed_gid: gid },
        cfg.server.requests_per_second,
        cancel.clone(),
    );
    tracing::info!(socket = %cfg.server.socket.display(), "admission API listening");

    for o in super::watcher::reconcile(&daemon, &cgroups) {
        tracing::info!(outcome = ?o, "reconciled at start");
    }
    match super::watcher::spawn(daemon.clone(), cgroups.clone()) {
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
    let mut engine = engine::Engine::new(cgroups, cpu_source, "/proc".as_ref());
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    // Rounds: the first at once (it only takes the CPU-time baseline), the second soon after
    // (the first with per-node CPU time), then every period — and at once, at most every
    // MIN_GAP, when the trigger (an operator's cpuset.cpus write) or the watcher (a new
    // cgroup placed) wakes the loop.
    let trigger = match trigger::CpusetTrigger::spawn(daemon.wake.clone()) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "cpuset trigger unavailable; rounds run on the period only");
            None
        }
    };
    const FIRST_GAP: Duration = Duration::from_millis(500);
    const MIN_GAP: Duration = Duration::from_millis(200);
    let period = |d: &Daemon| Duration::from_millis(d.lock().cfg.controller.period_ms.max(1));
    let mut next = tokio::time::Instant::now();
    let mut last = None::<tokio::time::Instant>;
    let mut rounds = 0u64;
    loop {
        let woken = tokio::select! {
            _ = tokio::time::sleep_until(next) => false,
            _ = daemon.wake.notified() => true,
            _ = sighup.recv() => { reload(&daemon, config_path.as_deref()); continue; }
            _ = sigint.recv() => { tracing::info!("SIGINT received, stopping"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM received, stopping"); break; }
        };
        if woken {
            if let Some(l) = last.filter(|l| l.elapsed() < MIN_GAP) {
                // Too soon after the last round: run when the gap is over (not later than planned).
                next = next.min(l + MIN_GAP);
                continue;
            }
            tracing::debug!("round triggered by an event");
        }
        rounds += 1;
        engine.round(&daemon);
        let now = tokio::time::Instant::now();
        last = Some(now);
        next = now
            + if rounds == 1 {
                FIRST_GAP.min(period(&daemon))
            } else {
                period(&daemon)
            };
        if let Some(t) = &trigger {
            let ids: Vec<String> = daemon.lock().decisions.keys().cloned().collect();
            t.watch(ids.iter().filter_map(|id| {
                engine
                    .cgroups
                    .dir(crate::cgroup::Controller::Cpuset, id)
                    .ok()
                    .map(|(dir, _)| dir.join("cpuset.cpus"))
            }));
        }
        if max_rounds != 0 && rounds >= max_rounds {
            tracing::info!(rounds, "round limit reached, stopping");
            break;
        }
    }
    cancel.cancel();
    let _ = metrics_task.await;
    let _ = api_task.await;
    let _ = std::fs::remove_file(&cfg.server.socket);
    if let Err(e) = daemon.checkpoint() {
        tracing::warn!(error = %e, "final checkpoint failed");
    }
    if let Some(old) = autonuma_restore {
        let _ = std::fs::write(NUMA_BALANCING, old);
    }
    tracing::info!("rebalancer stopped cleanly");
    Ok(())
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

/// SIGHUP: re-read the config; a bad file is reported and the running config kept. Settings
/// that need a restart (listeners, state dir, sysfs root) are reported as such.
fn reload(d: &Daemon, path: Option<&std::path::Path>) {
    let new = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "config reload failed; keeping the running config");
            return;
        }
    };
    let mut s = d.lock();
    if new.server != s.cfg.server
        || new.daemon.state_dir != s.cfg.daemon.state_dir
        || new.daemon.sysfs_root != s.cfg.daemon.sysfs_root
    {
        tracing::warn!("server / state_dir / sysfs_root changes take effect at the next restart");
    }
    s.cfg.controller = new.controller;
    s.cfg.placement = new.placement;
    s.cfg.daemon.dry_run = new.daemon.dry_run;
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

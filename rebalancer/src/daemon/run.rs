//! The daemon's main task: discover the machine, restore the checkpoint, start the listeners,
//! the watcher and the control-round thread, then one `tokio::select!` loop over SIGHUP (config
//! reload), SIGINT/SIGTERM and the round limit. The runtime only listens: control rounds
//! (which read /proc, write cgroupfs and wait for the kernel to migrate pages — seconds) run on
//! their own thread (`rounds::thread`), so the API, `/metrics` and `/healthz` answer while a
//! round migrates.
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::{admission::Admission, writer::CgroupCpusetWriter, Daemon, Io, Persisted, Shared};
use crate::{
    checkpoint,
    config::{AdmissionMode, Config},
    rounds::{self, Engine},
    serve::{self, socket},
    topology::sysfs,
};

/// Loads the checkpoint, or starts empty (with a warning when one existed but was unusable).
/// Its times are CLOCK_BOOTTIME milliseconds (see `daemon::boot_ms`): they keep their meaning
/// across the restart; any from the future (an earlier boot) are clamped to now.
pub(crate) fn restore(cfg: &Config, topo: &crate::topology::Topology) -> anyhow::Result<Persisted> {
    let fresh = || Persisted::fresh(topo, cfg).context("building the allocator from config");
    match checkpoint::load::<Persisted>(&cfg.daemon.state_dir) {
        // kubelet's Memory Manager Start: the stored memory state must match this machine
        Ok(Some(p)) if let Err(e) = p.allocator.check_restored(topo, &cfg.placement) => {
            tracing::warn!(error = %e, "checkpoint does not match this machine; rebuilding from the live cgroups");
            fresh()
        }
        Ok(Some(mut p)) => {
            let orphans = release_unbound_containers(&mut p);
            if orphans > 0 {
                tracing::warn!(
                    orphans,
                    "checkpoint held container admissions without their cgroup (written mid-admission); released"
                );
            }
            let repaired = p.allocator.repair_empty_shared(topo);
            if !repaired.is_empty() {
                tracing::warn!(
                    containers = ?repaired,
                    "checkpoint held shared containers without CPUs; given the shared pool"
                );
            }
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

/// A container admission (key `<pod uid>/<container>`, from the watcher or NRI) is bound to
/// its cgroup as soon as its cpuset is written; a checkpoint taken between the two (the
/// checkpointer does not wait for an admission to finish) holds it unbound, and nothing would
/// ever release it: released here, so its CPUs and memory are not lost. Pods admitted whole
/// (the API's bare uids, pod-scope holds, `kubelet:` adoptions) legitimately wait unbound.
/// Returns how many were released.
pub(crate) fn release_unbound_containers(p: &mut Persisted) -> usize {
    let bound: std::collections::BTreeSet<&str> =
        p.bindings.values().map(|b| b.pod_uid.as_str()).collect();
    let orphans: Vec<String> = (p.allocator.pods.keys())
        .filter(|k| k.is_container() && !bound.contains(k.as_str()))
        .map(|k| k.to_string())
        .collect();
    for k in &orphans {
        p.allocator.release(k);
    }
    orphans.len()
}

pub async fn run(cfg: Config, config_path: Option<PathBuf>, max_rounds: u64) -> anyhow::Result<()> {
    // First, so a signal during start-up (restore, reconcile, eBPF load) is a clean stop, not
    // the default action's kill.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    // Then the instance lock: a second daemon on the same state changes nothing (not even
    // AutoNUMA) and names the first.
    let _instance = super::lock::acquire(&cfg.daemon.state_dir)?;
    // Descriptors: the soft limit up to the hard one before anything opens them (the
    // listeners' connection budgets are a share of it).
    let nofile = serve::conn::raise_nofile();
    tracing::debug!(nofile = ?nofile, "RLIMIT_NOFILE");
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
    let mut cfg = cfg;
    let mut persisted = restore(&cfg, &topo)?;
    match persisted.allocator.reconfigure(&topo, &cfg.placement) {
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
    let kubelet_files = super::kubelet::read_files(&cfg.kubernetes.kubelet_state_dir);
    super::kubelet::install_files(&mut daemon.lock(&mut Io::new()), kubelet_files, &metrics);
    let mode = super::nri::resolve_mode(&cfg.kubernetes);
    // NRI mode: the plugin's runtime link. The other threads' changes to the runtime's
    // containers (moves, hotplug, API admissions' shrink) are written to cgroupfs and told to
    // the runtime — in the next hook answers, or as unsolicited updates where
    // `kubernetes.nri_runtime_updates` allows them — so its specs never fall behind cgroupfs
    // (a spec left behind is written back at the runtime's next update of the container).
    let runtime = (mode == AdmissionMode::Nri)
        .then(|| Arc::new(super::nri_updates::Runtime::new(metrics.clone())));
    let updates = runtime.as_ref();
    let writer = Arc::new(CgroupCpusetWriter::telling(
        cgroups.clone(),
        updates.cloned(),
    ));
    let admission = Admission::new(daemon.clone(), writer);

    let cancel = CancellationToken::new();
    let listen = cfg.server.metrics_listen.parse()?;
    let limits = serve::conn::Limits::new(cfg.server.max_connections as usize);
    let (metrics_addr, metrics_task) =
        serve::spawn_metrics(listen, metrics.clone(), limits, cancel.clone())
            .await
            .with_context(|| format!("binding the metrics listener on {listen}"))?;
    tracing::info!(%metrics_addr, "serving /metrics and /healthz");

    let gid = cfg
        .server
        .socket_group
        .as_deref()
        .map(socket::group_id)
        .transpose()?;
    // Bound now (a second daemon on the socket fails here, before touching anything), served
    // once start-up is over (below): a client that connects meanwhile waits in the backlog and
    // its first answer already shows the start-up reconcile's state.
    let listener = socket::bind(&cfg.server.socket, gid)?;

    // Only once nothing can fail at start any more: an early error must not leave it off.
    let autonuma_restore = coexist_with_autonuma(cfg.controller.autonuma, &cfg.daemon.state_dir);
    daemon.lock(&mut Io::new()).admission = mode;
    let nri_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    match mode {
        AdmissionMode::Nri => {
            tracing::info!(socket = %cfg.kubernetes.nri_socket.display(), "admission: NRI plugin (placement at container creation)");
            if cfg.placement.scope == crate::config::TopologyScope::Pod {
                tracing::info!("placement.scope = \"pod\": each container is admitted as one container of its pod, within the affinity its pod's first container computes from the pod's totals (the sandbox's pod_resources, as kubelet >= 1.26 sets them; without them, the containers seen so far)");
            }
            let rt = runtime.clone().expect("made for NRI mode");
            super::nri::spawn(
                &mut Io::new(),
                daemon.clone(),
                cgroups.clone(),
                rt,
                nri_stop.clone(),
            )
            .context("starting the NRI plugin thread")?;
        }
        AdmissionMode::Watcher | AdmissionMode::Auto => {
            tracing::info!(nri_socket = %cfg.kubernetes.nri_socket.display(), "admission: cgroup watcher (no NRI socket, or chosen)");
            // the containers met here already run: adopted where they run (`Admission::adopting`)
            for o in super::watcher::reconcile(&mut Io::new(), &admission.adopting(), &cgroups) {
                tracing::info!(outcome = ?o, "reconciled at start");
            }
            super::watcher::supervise(admission.clone(), cgroups.clone())
                .context("starting the cgroup watcher's supervisor thread")?;
        }
        AdmissionMode::Off => tracing::info!("admission: off (admission API only)"),
    }
    if cfg.kubernetes.export_topology {
        crate::nrt::export::spawn(daemon.clone())
            .context("starting the NodeResourceTopology export thread")?;
    }
    let cpu_source = rounds::source::start(&mut Io::new(), &daemon, &cgroups);
    tracing::info!(
        source = cpu_source.name(),
        "per-cgroup, per-node CPU time source"
    );
    let mut engine = Engine::new(cgroups, cpu_source, "/proc".as_ref());
    if let Some(rt) = updates {
        engine = engine.with_runtime(rt.clone());
    }
    let (limit_tx, mut limit_rx) = tokio::sync::oneshot::channel::<u64>();
    let (rounds_tx, rounds_thread) = rounds::thread::spawn(
        &mut Io::new(),
        engine,
        admission.clone(),
        max_rounds,
        limit_tx,
    )?;
    let reloads = {
        let rounds_tx = rounds_tx.clone();
        Reloader::spawn(daemon.clone(), config_path.clone(), move || {
            let _ = rounds_tx.send(rounds::thread::RoundCmd::Reload);
        })
    };
    let api_task = socket::spawn(
        listener,
        super::api::router(admission.clone()),
        socket::Access { allowed_gid: gid },
        cfg.server.requests_per_second,
        limits,
        metrics.clone(),
        cancel.clone(),
    );
    tracing::info!(socket = %cfg.server.socket.display(), "admission API listening");
    let mut health_tick = tokio::time::interval(Duration::from_millis(500));
    let mut failure: Option<String> = None;
    // systemd (Type=notify): READY once the admission door is up — the NRI plugin registered
    // with the runtime, or the watcher / API running —, then WATCHDOG while no component is dead.
    let notifier = crate::sdnotify::Notifier::from_env();
    let mut ready_sent = false;
    loop {
        tokio::select! {
            n = &mut limit_rx => {
                match n {
                    Ok(rounds) => tracing::info!(rounds, "round limit reached, stopping"),
                    Err(_) => {
                        tracing::error!("the control-round thread stopped, stopping");
                        failure = Some("the control-round thread stopped".into());
                    }
                }
                break;
            }
            _ = sighup.recv() => reloads.request(),
            _ = health_tick.tick() => {
                // A component dead for a while: exit non-zero so systemd / the DaemonSet
                // restarts the daemon (a restart reconciles from the live cgroups).
                let dead = metrics.health.dead();
                if let Some(dead) = dead.iter().find(|d| d.restart && d.for_ >= crate::health::EXIT_AFTER) {
                    let msg = format!("component {} dead for {:.1?} ({}); exiting to be restarted", dead.component, dead.for_, dead.reason);
                    tracing::error!("{msg}");
                    failure = Some(msg);
                    break;
                }
                if notifier.enabled() {
                    if !ready_sent && (mode != AdmissionMode::Nri || metrics.nri_connected.get() == 1) {
                        ready_sent = true;
                        if let Err(e) = notifier.send("READY=1") {
                            tracing::warn!(error = %e, "sd_notify READY=1 failed");
                        }
                    }
                    if ready_sent && !dead.iter().any(|d| d.restart) {
                        let _ = notifier.send("WATCHDOG=1");
                    }
                }
            }
            _ = sigint.recv() => { tracing::info!("SIGINT received, stopping"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM received, stopping"); break; }
        }
    }
    // Whatever clients, rounds or disks do, the daemon is gone (AutoNUMA restored) within 5 s.
    shutdown_watchdog(autonuma_restore.clone(), SHUTDOWN_BOUND);
    // The listeners close at once; a round under way finishes (no half-applied move).
    cancel.cancel();
    daemon.request_stop();
    let _ = rounds_tx.send(rounds::thread::RoundCmd::Stop);
    let _ = tokio::task::spawn_blocking(move || rounds_thread.join()).await;
    nri_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // Each listener closes at once and drops what is left after its grace (see serve::conn).
    let drained = tokio::time::timeout(Duration::from_secs(3), async {
        let _ = metrics_task.await;
        let _ = api_task.await;
    })
    .await;
    if drained.is_err() {
        tracing::warn!("listeners did not drain within 3 s; stopping anyway");
    }
    let _ = std::fs::remove_file(&cfg.server.socket);
    let d = daemon.clone();
    match tokio::task::spawn_blocking(move || d.checkpoint(&mut Io::new())).await {
        Ok(Ok(())) => tracing::info!("final checkpoint written"),
        Ok(Err(e)) => tracing::warn!(error = %e, "final checkpoint failed"),
        Err(e) => tracing::warn!(error = %e, "final checkpoint not written: its task failed"),
    }
    if let Some(old) = autonuma_restore {
        if std::fs::write(NUMA_BALANCING, old).is_ok() {
            let _ = std::fs::remove_file(cfg.daemon.state_dir.join(NUMA_BALANCING_RECORD));
        }
    }
    if let Some(msg) = failure {
        anyhow::bail!(msg);
    }
    tracing::info!("rebalancer stopped cleanly");
    Ok(())
}

/// Runs SIGHUP reloads off the main loop, one at a time: a reload waits for the state lock,
/// and the loop must keep polling
/// SIGTERM meanwhile. A SIGHUP while one is running queues one more (it re-reads the file, so
/// any number of SIGHUPs in the meantime are one reload); `after` runs after each.
struct Reloader {
    tx: tokio::sync::mpsc::Sender<()>,
}

impl Reloader {
    fn spawn(d: Daemon, path: Option<PathBuf>, after: impl Fn() + Send + 'static) -> Reloader {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        tokio::spawn(async move {
            while rx.recv().await.is_some() {
                let (d, path) = (d.clone(), path.clone());
                let _ = tokio::task::spawn_blocking(move || {
                    reload(&mut Io::new(), &d, path.as_deref())
                })
                .await;
                after();
            }
        });
        Reloader { tx }
    }

    /// Never waits: a full queue means a reload is already due.
    fn request(&self) {
        let _ = self.tx.try_send(());
    }
}

/// From the stop signal to the process' end, at most.
pub(crate) const SHUTDOWN_BOUND: Duration = Duration::from_millis(4500);

/// A thread that, if the orderly stop has not ended the process within `bound`, restores
/// AutoNUMA and exits with status 1 (a hung disk or a stuck task must not leave the kernel's
/// NUMA balancing off, nor wait for systemd's SIGKILL).
fn shutdown_watchdog(autonuma_restore: Option<String>, bound: Duration) {
    let _ = std::thread::Builder::new()
        .name("shutdown-watchdog".into())
        .spawn(move || {
            std::thread::sleep(bound);
            tracing::error!(?bound, "shutdown did not finish in time; exiting now");
            if let Some(old) = autonuma_restore {
                let _ = std::fs::write(NUMA_BALANCING, old);
            }
            std::process::exit(1);
        });
}

pub const NUMA_BALANCING: &str = "/proc/sys/kernel/numa_balancing";

/// The file in the state directory that holds `kernel.numa_balancing` as it was before the
/// daemon turned it off; removed once restored. A daemon that dies without restoring it
/// (SIGKILL, a crash) leaves it for the next daemon and for `rebalancer uninstall`.
pub const NUMA_BALANCING_RECORD: &str = "numa_balancing.before";

/// Detects kernel AutoNUMA and follows `controller.autonuma`. Returns the value to restore on
/// exit when it was turned off (recorded in `state_dir` first).
fn coexist_with_autonuma(choice: crate::config::AutoNuma, state_dir: &Path) -> Option<String> {
    use crate::config::AutoNuma;
    let Ok(cur) = std::fs::read_to_string(NUMA_BALANCING) else {
        tracing::info!("kernel NUMA balancing not present (no {NUMA_BALANCING})");
        return None;
    };
    let cur = cur.trim().to_string();
    let record = state_dir.join(NUMA_BALANCING_RECORD);
    if cur == "0" {
        // Off because an earlier daemon turned it off and died before restoring it: the record
        // says what the operator had, which this daemon restores in its place.
        let before = std::fs::read_to_string(&record).unwrap_or_default();
        let before = before.trim();
        if !before.is_empty() && before != "0" {
            if choice == AutoNuma::Disable {
                tracing::info!(was = %before, "kernel NUMA balancing stays off; it was turned off by an earlier daemon, restored on exit");
                return Some(before.to_string());
            }
            tracing::info!(was = %before, "kernel NUMA balancing restored: an earlier daemon turned it off and did not restore it");
            if std::fs::write(NUMA_BALANCING, before).is_ok() {
                let _ = std::fs::remove_file(&record);
            }
            return None;
        }
        tracing::info!("kernel NUMA balancing (AutoNUMA) is off");
        return None;
    }
    // on, so any record is stale (restored by someone else)
    let _ = std::fs::remove_file(&record);
    match choice {
        AutoNuma::Leave => None,
        AutoNuma::Warn => {
            tracing::warn!(value = %cur, "kernel NUMA balancing (AutoNUMA) is on: it migrates pages toward threads on its own and can undo placements; set controller.autonuma = \"disable\" to turn it off while rebalancer runs");
            None
        }
        AutoNuma::Disable => {
            match std::fs::write(&record, &cur).and_then(|()| std::fs::write(NUMA_BALANCING, "0")) {
                Ok(()) => {
                    tracing::info!(was = %cur, "kernel NUMA balancing turned off while rebalancer runs");
                    Some(cur)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not turn kernel NUMA balancing off");
                    None
                }
            }
        }
    }
}

/// SIGHUP: re-read the config; a bad file is reported and the running config kept. The
/// controller section (period included: the round thread reads it before each wait) and
/// dry-run on apply at once (dry-run off only at a restart: `--dry-run` stays in force); the placement section applies when its reservations can be applied
/// to the allocator (`Allocator::reconfigure`), else it is refused with the reason. Settings
/// that need a restart (listeners, state dir, sysfs root, the eBPF samplers) are reported as such.
pub(crate) fn reload(io: &mut Io, d: &Daemon, path: Option<&std::path::Path>) {
    let new = match Config::load(path) {
        Ok(c) => {
            Config::warn_removed_keys(path);
            c
        }
        Err(e) => {
            tracing::error!(error = %e, "config reload failed; keeping the running config");
            return;
        }
    };
    // kubelet's files are read before any lock is taken (no lock held across I/O)
    let kubelet_files = super::kubelet::read_files(&new.kubernetes.kubelet_state_dir);
    let mut s = d.lock(io);
    if new.server != s.cfg.server
        || new.daemon.state_dir != s.cfg.daemon.state_dir
        || new.daemon.sysfs_root != s.cfg.daemon.sysfs_root
        || new.ebpf != s.cfg.ebpf
    {
        tracing::warn!(
            "server / state_dir / sysfs_root / ebpf changes take effect at the next restart (the samplers are loaded once)"
        );
    }
    s.cfg.controller = new.controller;
    // Dry-run off on a reload would start writing cgroupfs under an operator who asked for
    // none (`--dry-run` on the command line, which the file does not show): only a restart
    // turns it off. Turning it on applies at once.
    if s.cfg.daemon.dry_run && !new.daemon.dry_run {
        tracing::error!("config reload: daemon.dry_run stays on (set by --dry-run or the file at start); turning dry-run off needs a restart");
    } else {
        s.cfg.daemon.dry_run = new.daemon.dry_run;
    }
    let sh = &mut *s;
    let placed = match sh.state.allocator.reconfigure(&sh.topo, &new.placement) {
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
    sh.cfg.kubernetes.kubelet_state_dir = new.kubernetes.kubelet_state_dir;
    super::kubelet::install_files(sh, kubelet_files, &d.metrics);
    drop(s);
    if placed {
        if let Err(e) = d.checkpoint(io) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rounds::ProcCpuTime;
    use std::{sync::mpsc, time::Instant};

    fn daemon(state: &std::path::Path) -> Daemon {
        let topo = crate::topology::TopologyBuilder::default().build();
        let mut cfg = Config::load(None).unwrap();
        cfg.daemon.state_dir = state.to_path_buf();
        Daemon::new(Shared::fresh(topo, cfg).unwrap(), serve::Metrics::default())
    }

    fn config(path: &std::path::Path, state: &std::path::Path, extra: &str) {
        std::fs::write(
            path,
            format!("[daemon]\nstate_dir = \"{}\"\n{extra}", state.display()),
        )
        .unwrap();
    }

    /// A daemon started with `--dry-run` (the file says nothing of it) stays in
    /// dry-run across a SIGHUP, as does one whose file said dry_run = true and now says false;
    /// the rest of the reload applies. Dry-run on by a reload applies.
    #[test]
    fn a_reload_does_not_turn_dry_run_off() {
        let io = &mut Io::new();
        let state = tempfile::tempdir().unwrap();
        let file = state.path().join("rebalancer.toml");
        let d = daemon(state.path());
        d.lock(io).cfg.daemon.dry_run = true; // --dry-run
        config(&file, state.path(), "[controller]\nperiod_ms = 4321\n");
        reload(io, &d, Some(&file));
        assert!(d.lock(io).cfg.daemon.dry_run, "--dry-run kept");
        assert_eq!(
            d.lock(io).cfg.controller.period_ms,
            4321,
            "the rest applied"
        );
        config(&file, state.path(), "dry_run = false\n");
        reload(io, &d, Some(&file));
        assert!(
            d.lock(io).cfg.daemon.dry_run,
            "an explicit false is refused too"
        );

        let d = daemon(state.path());
        assert!(!d.lock(io).cfg.daemon.dry_run);
        config(&file, state.path(), "dry_run = true\n");
        reload(io, &d, Some(&file));
        assert!(d.lock(io).cfg.daemon.dry_run, "dry-run on applies at once");
    }

    /// The round thread's liveness limit (10 periods, at least 2 min) follows
    /// a reload that lengthens the period; with the limit of the start, a period of 1 min
    /// would make the thread "dead" (503, exit) between two healthy rounds.
    #[test]
    fn a_reload_lengthening_the_period_moves_the_rounds_liveness_limit() {
        let io = &mut Io::new();
        let state = tempfile::tempdir().unwrap();
        let d = daemon(state.path());
        let none = crate::cgroup::Cgroups::new(crate::cgroup::Mounts::default());
        let adm = Admission::new(d.clone(), Arc::new(CgroupCpusetWriter::new(none.clone())));
        let engine = Engine::new(
            none,
            Box::new(ProcCpuTime::new("/proc".as_ref())),
            "/proc".as_ref(),
        );
        let (limit_tx, _limit_rx) = tokio::sync::oneshot::channel();
        let (tx, thread) = rounds::thread::spawn(io, engine, adm, 0, limit_tx).unwrap();
        let health = &d.metrics.health;
        assert_eq!(health.max_silence("rounds"), Some(Duration::from_secs(120)));
        d.lock(io).cfg.controller.period_ms = 60_000;
        tx.send(rounds::thread::RoundCmd::Reload).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while health.max_silence("rounds") != Some(Duration::from_secs(600))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(health.max_silence("rounds"), Some(Duration::from_secs(600)));
        tx.send(rounds::thread::RoundCmd::Stop).unwrap();
        thread.join().unwrap();
        assert!(health.dead().is_empty(), "{:?}", health.dead());
    }

    /// A SIGHUP while the state lock is held elsewhere must not stall the main loop, which
    /// would then not see SIGTERM. The request returns at once; SIGHUPs meanwhile coalesce;
    /// the reload runs once the lock is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reload_waiting_for_the_state_lock_does_not_block_the_main_loop() {
        let io = &mut Io::new();
        let state = tempfile::tempdir().unwrap();
        let file = state.path().join("rebalancer.toml");
        std::fs::write(
            &file,
            format!(
                "[daemon]\nstate_dir = \"{}\"\n[controller]\nperiod_ms = 7777\n",
                state.path().display()
            ),
        )
        .unwrap();
        let d = daemon(state.path());
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reloads = {
            let done = done.clone();
            Reloader::spawn(d.clone(), Some(file), move || {
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        };
        // The state lock held on another thread until told.
        let (release, released) = mpsc::channel::<()>();
        let (taken, is_taken) = mpsc::channel::<()>();
        let holder = {
            let d = d.clone();
            std::thread::spawn(move || {
                let mut io = Io::new();
                let _held = d.lock(&mut io);
                taken.send(()).unwrap();
                let _ = released.recv();
            })
        };
        is_taken.recv().unwrap();
        let t0 = Instant::now();
        reloads.request();
        let mut spent = t0.elapsed();
        // The first reload is running (waiting for the lock) once the reloader took it off
        // the queue; only then do the next four coalesce into one queued reload.
        let until = Instant::now() + Duration::from_secs(10);
        while reloads.tx.capacity() < reloads.tx.max_capacity() && Instant::now() < until {
            tokio::task::yield_now().await;
        }
        let t1 = Instant::now();
        for _ in 0..4 {
            reloads.request();
        }
        spent += t1.elapsed();
        assert!(spent < Duration::from_millis(100), "{spent:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            done.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "still waiting for the lock"
        );
        release.send(()).unwrap();
        holder.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.load(std::sync::atomic::Ordering::SeqCst) < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // One running (waiting for the lock) and one queued: five SIGHUPs are two reloads.
        assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(d.lock(io).cfg.controller.period_ms, 7777);
    }
}

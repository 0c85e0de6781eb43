//! The cgroup watcher: inotify on kubelet's cgroup tree in the cpuset hierarchy (its root, QoS
//! tiers and pods: see [`Scope`]), so a new container cgroup is admitted and its cpuset written
//! within milliseconds of its appearance, and a removed one is released — with any runtime
//! (containerd, CRI-O, podman, systemd), without configuring the runtime.
//!
//! This module is the transport: the inotify loop on its own thread (blocking reads; a
//! container cgroup whose limits are still to come waits in a retry queue, never on the
//! thread), the watches, and `reconcile` for what already exists (at start, and after an
//! inotify queue overflow). inotify instances and watches are counted per user, and every uid-0
//! container shares the daemon's count: a watcher that cannot start, or loses a watch, is a
//! failing `inotify` health component, and its supervisor reconciles kubelet's tree every
//! control period instead, trying inotify again each time, until a watcher runs whole. What a cgroup asks for and how it is admitted is `policy`, which calls the one
//! admission service (`daemon::admission`). Changes are checkpointed once per batch of events,
//! coalesced on the service's checkpointer thread.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use crate::{
    cgroup::{Cgroups, Controller},
    daemon::Io,
    daemon::{
        admission::Admission,
        reconcile::Seen,
        writer::{CgroupCpusetWriter, CpusetWriter},
    },
};

pub mod policy;
#[cfg(test)]
mod tests;

pub use policy::WatchOutcome;
#[cfg(test)]
use policy::{
    container_for, guaranteed_millis_from_weight, limits_ready, pod_for,
    request_millis_from_weight, LIMITS_GRACE,
};

/// How often the watcher looks at its retry queue while it holds a cgroup.
const RETRY_TICK: Duration = Duration::from_millis(5);

/// Container cgroups seen before their limits, with when each was first seen: seen again on
/// later events and ticks, and admitted as they show once [`policy::LIMITS_GRACE`] has passed since
/// then, so none stays longer.
#[derive(Debug, Default)]
pub struct Retry {
    first_seen: BTreeMap<String, Instant>,
}

impl Retry {
    /// [`policy::created`], the grace counted from when `rel` was first seen (`t0` if now);
    /// a `NotReady` cgroup is kept for [`Retry::revisit`].
    pub fn created(
        &mut self,
        io: &mut Io,
        adm: &Admission,
        cgroups: &Cgroups,
        rel: &str,
        t0: Instant,
    ) -> WatchOutcome {
        let key = rel.trim_matches('/').to_string();
        let seen = *self.first_seen.entry(key.clone()).or_insert(t0);
        let o = created(io, adm, cgroups, &key, seen);
        if !matches!(o, WatchOutcome::NotReady { .. }) {
            self.first_seen.remove(&key);
        }
        o
    }

    /// A cgroup removed: nothing more to wait for.
    pub fn forget(&mut self, rel: &str) {
        self.first_seen.remove(rel.trim_matches('/'));
    }

    /// Every queued cgroup seen again (those gone dropped); what changed.
    pub fn revisit(
        &mut self,
        io: &mut Io,
        adm: &Admission,
        cgroups: &Cgroups,
    ) -> Vec<WatchOutcome> {
        let queued: Vec<String> = self.first_seen.keys().cloned().collect();
        let mut out = Vec::new();
        for rel in queued {
            if !cgroups.exists(Controller::Cpuset, &rel) {
                self.first_seen.remove(&rel);
                continue;
            }
            match self.created(io, adm, cgroups, &rel, Instant::now()) {
                WatchOutcome::NotReady { .. } => {}
                o => out.push(o),
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.first_seen.is_empty()
    }
}
use policy::{created, removed};

/// Handles a cgroup that appeared (see [`policy::created`]) and checkpoints the change now.
#[cfg(test)]
pub fn on_created(
    io: &mut Io,
    adm: &Admission,
    cgroups: &Cgroups,
    rel: &str,
    t0: Instant,
) -> WatchOutcome {
    let o = created(io, adm, cgroups, rel, t0);
    if o.changed() {
        adm.checkpoint_logged(io);
    }
    o
}

/// Handles a cgroup that disappeared (see [`policy::removed`]) and checkpoints the change now.
#[cfg(test)]
pub fn on_removed(io: &mut Io, adm: &Admission, rel: &str) -> WatchOutcome {
    let o = removed(io, adm, rel);
    if o.changed() {
        adm.checkpoint_logged(io);
    }
    o
}

/// Admits what exists and is unknown, releases bindings whose cgroup vanished. A hierarchy
/// that cannot be walked whole (out of file descriptors, unmounted) releases nothing: an
/// incomplete list would read as every container gone, and their CPUs would be handed out
/// again while they run. It is tried again at the next overflow or restart.
pub fn reconcile(io: &mut Io, adm: &Admission, cgroups: &Cgroups) -> Vec<WatchOutcome> {
    reconcile_with(io, adm, cgroups, &mut Retry::default())
}

/// [`reconcile`], a cgroup whose limits are still to come kept in `retry` (seen again at the
/// next call, or by whoever revisits `retry`).
pub fn reconcile_with(
    io: &mut Io,
    adm: &Admission,
    cgroups: &Cgroups,
    retry: &mut Retry,
) -> Vec<WatchOutcome> {
    // Bindings and pods are only ever under kubelet's root: the rest is not walked.
    let roots = crate::cgroup::kube::kubernetes_roots(
        adm.daemon.lock(io).cfg.cgroups.kubernetes_root.as_deref(),
    );
    let live: std::collections::BTreeSet<String> = match cgroups
        .walk_roots(Controller::Cpuset, &roots)
    {
        Ok(all) => all
            .into_iter()
            .map(|p| p.trim_matches('/').to_string())
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot walk the cpuset hierarchy: nothing admitted or released until it can");
            return Vec::new();
        }
    };
    // A binding's cgroup is released only when it is really gone, asked once more: a
    // directory the walk missed is not a container that exited.
    let unlisted: Vec<String> = (adm.daemon.lock(io).state.bindings.keys())
        .filter(|k| !live.contains(k.as_str()))
        .cloned()
        .collect();
    let live: Vec<String> = live.into_iter().collect();
    let mut out: Vec<WatchOutcome> = (unlisted.iter())
        .filter(|g| !cgroups.exists(Controller::Cpuset, g))
        .map(|g| removed(io, adm, g))
        .collect();
    out.extend(policy::pods_gone(io, adm, &live));
    // refused ones stay refused (and fenced) until they go: not asked again every period
    let refused = adm.daemon.lock(io).refused.clone();
    for rel in live.iter().filter(|r| !refused.contains(*r)) {
        match retry.created(io, adm, cgroups, rel, Instant::now()) {
            WatchOutcome::Ignored | WatchOutcome::NotReady { .. } => {}
            o => out.push(o),
        }
    }
    // What the books restored or kept, against what the containers run on now (the books
    // are not changed: logged and counted by `repair`).
    let live_cpus = CgroupCpusetWriter::new(cgroups.clone());
    adm.repair(io, |cg| live_cpus.cpus(cg).map(Seen::cgroupfs));
    if out.iter().any(WatchOutcome::changed) {
        adm.checkpoint_logged(io);
    }
    out
}

/// Why a running watcher stopped watching (a watch it could not add), set by its thread as it
/// ends; None while it runs whole.
type Lost = Arc<Mutex<Option<String>>>;

/// Starts the cgroup watcher and keeps it going: a thread that starts it, and while it cannot
/// run whole (no inotify instance left, a watch that could not be added) marks the `inotify`
/// health component failing with the reason, reconciles kubelet's tree every control period
/// instead (new containers are admitted late, not never), and tries inotify again each time.
/// Never a restart: a restarted daemon would meet the same limits.
pub fn supervise(adm: Admission, cgroups: Cgroups) -> std::io::Result<std::thread::JoinHandle<()>> {
    supervise_with(adm, cgroups, spawn_watcher)
}

/// [`supervise`] with `start` starting the watcher.
fn supervise_with<F>(
    adm: Admission,
    cgroups: Cgroups,
    mut start: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnMut(&mut Io, Admission, Cgroups, Lost) -> std::io::Result<std::thread::JoinHandle<()>>
        + Send
        + 'static,
{
    let health = adm.daemon.metrics.health.register("inotify", None);
    std::thread::Builder::new()
        .name("cgroup-watcher-supervisor".into())
        .spawn(move || {
            let io = &mut Io::new();
            let mut running: Option<(std::thread::JoinHandle<()>, Lost)> = None;
            let mut retry = Retry::default();
            let mut reason: Option<String> = None;
            while !adm.daemon.stopping() {
                // A watcher that lost a watch ended itself (its instance and watches freed);
                // one that died otherwise stays dead in /healthz (a restart is its cure).
                let lost = running
                    .as_ref()
                    .and_then(|(h, l)| h.is_finished().then(|| l.lock().unwrap().clone()))
                    .flatten();
                if let Some(why) = lost {
                    // reconciled first (removals it missed), started again next period
                    running = None;
                    health.failing(format!("cgroup watcher down, reconciling each period: {why}"));
                    reason = Some(why);
                } else if running.is_none() {
                    let l: Lost = Default::default();
                    match start(io, adm.clone(), cgroups.clone(), l.clone()) {
                        Ok(h) => {
                            running = Some((h, l));
                            // again: reconciling each period stops
                            let again = reason.take().is_some();
                            tracing::info!(again, "cgroup watcher running (inotify)");
                            health.recovered();
                        }
                        Err(e) => {
                            let why = format!("{e}");
                            if reason.as_deref() != Some(why.as_str()) {
                                tracing::warn!(error = %why, "cgroup watcher cannot run; reconciling kubelet's cgroup tree every control period until it can (fs.inotify.max_user_instances / max_user_watches are per user, shared with every uid-0 container)");
                            }
                            health.failing(format!("cgroup watcher down, reconciling each period: {why}"));
                            reason = Some(why);
                        }
                    }
                }
                if running.is_none() {
                    let n = reconcile_with(io, &adm, &cgroups, &mut retry).len();
                    if n > 0 {
                        tracing::info!(changes = n, "reconciled without inotify");
                    }
                }
                let period = adm.daemon.lock(io).cfg.controller.period_ms.max(10);
                std::thread::sleep(Duration::from_millis(period));
            }
            health.stopped();
        })
}

/// Starts the watcher thread over the cpuset hierarchy. An error if inotify is unavailable or
/// any directory in scope cannot be watched (nothing kept: the instance and its watches are
/// freed). A watch that cannot be added later ends the thread with the reason in `lost`.
fn spawn_watcher(
    io: &mut Io,
    adm: Admission,
    cgroups: Cgroups,
    lost: Lost,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let root = cgroups
        .hierarchy(Controller::Cpuset)
        .map(|(p, _)| p.to_path_buf())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()))?;
    let scope = {
        let s = adm.daemon.lock(io);
        Scope::new(root.clone(), &s.cfg.cgroups)
    };
    let mut ino = Inotify::init().map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("no inotify instance ({e}); raise fs.inotify.max_user_instances"),
        )
    })?;
    let mut watches: BTreeMap<WatchDescriptor, PathBuf> = BTreeMap::new();
    let mask = WatchMask::CREATE | WatchMask::DELETE | WatchMask::ONLYDIR | WatchMask::DELETE_SELF;
    // What appeared between the start-up reconcile and these watches is handled first.
    let mut initial = Vec::new();
    let metrics = adm.daemon.metrics.clone();
    let mut failed = None;
    add_tree(
        &mut ino,
        &mut watches,
        &scope,
        Path::new(""),
        mask,
        &mut initial,
        &metrics,
        &mut failed,
    );
    if let Some(why) = failed {
        return Err(std::io::Error::other(why));
    }
    let health = metrics.health.register("watcher", None);
    std::thread::Builder::new().name("cgroup-watcher".into()).spawn(move || {
        let io = &mut Io::new();
        // Dropped by a panic or a return: the watcher shows dead in /healthz.
        let health = health;
        let mut retry = Retry::default();
        let mut changed = false;
        for rel in initial {
            changed |= retry.created(io, &adm, &cgroups, &rel.to_string_lossy(), Instant::now()).changed();
        }
        if changed {
            adm.request_checkpoint(io);
        }
        let mut buf = [0u8; 64 * 1024];
        loop {
            let mut overflow = false;
            let mut changed = false;
            let mut failed = None;
            // Blocking while nothing waits in the retry queue; else a short poll, then the queue.
            if retry.is_empty() || readable(&ino, RETRY_TICK) {
                let events = match ino.read_events_blocking(&mut buf) {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::error!(error = %e, "inotify read failed; watcher stopped (the daemon exits to be restarted)");
                        health.failed(format!("inotify read failed: {e}"));
                        return;
                    }
                };
                let t0 = Instant::now();
                let mut found = Vec::new();
                // In order: a cgroup created and removed within one batch is admitted (or found
                // gone) before its removal is handled, never after.
                for ev in events {
                    if ev.mask.contains(EventMask::Q_OVERFLOW) {
                        overflow = true;
                        continue;
                    }
                    // The watch is gone (its directory removed, or the hierarchy unmounted).
                    if ev.mask.contains(EventMask::IGNORED) {
                        watches.remove(&ev.wd);
                        continue;
                    }
                    let (Some(parent), Some(name)) = (watches.get(&ev.wd).cloned(), ev.name) else { continue };
                    let rel = parent.join(name);
                    test_hook_kill(name);
                    if ev.mask.contains(EventMask::CREATE) && ev.mask.contains(EventMask::ISDIR) {
                        changed |= retry.created(io, &adm, &cgroups, &rel.to_string_lossy(), t0).changed();
                        // Directories made below it before its watch existed are admitted too.
                        add_tree(&mut ino, &mut watches, &scope, &rel, mask, &mut found, &metrics, &mut failed);
                        for sub in found.drain(..) {
                            changed |= retry.created(io, &adm, &cgroups, &sub.to_string_lossy(), t0).changed();
                        }
                    } else if ev.mask.contains(EventMask::DELETE) && ev.mask.contains(EventMask::ISDIR) {
                        retry.forget(&rel.to_string_lossy());
                        changed |= removed(io, &adm, &rel.to_string_lossy()).changed();
                        watches.retain(|_, p| !p.starts_with(&rel));
                    }
                }
            }
            changed |= retry.revisit(io, &adm, &cgroups).iter().any(WatchOutcome::changed);
            if changed {
                adm.request_checkpoint(io);
            }
            if let Some(why) = failed {
                // Containers below the unwatched directory would go unseen: the supervisor
                // reconciles each period instead and starts a whole watcher when it can.
                tracing::warn!(reason = %why, "cgroup watcher lost a watch; handing over to reconciling each period");
                *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                health.stopped();
                return;
            }
            if overflow {
                tracing::warn!("inotify queue overflowed; reconciling");
                reconcile_with(io, &adm, &cgroups, &mut retry);
            }
        }
    })
}

/// Whether the inotify descriptor has events within `timeout` (a poll; an interrupted one
/// counts as none).
fn readable(ino: &Inotify, timeout: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: ino.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd, its count 1.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    n > 0 && fd.revents & libc::POLLIN != 0
}

/// Which directories of the hierarchy are watched: those on the path to kubelet's cgroup root
/// (`cgroups.kubernetes_root`, else `kubepods` and `kubepods.slice` at the top), the root
/// itself, its QoS tiers and its pods — the directories a container cgroup appears in or
/// vanishes from. Not the containers' own directories nor anything below them: a container
/// with write access to its cgroup may make any number of directories there, and they must
/// not use up the inotify watches the pods need (nothing below a container is admitted). Not
/// the configured `cgroups.roots` either: the watcher admits only Kubernetes containers, and
/// the rounds find what runs under those roots. Fixed at start: changed roots need a restart.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    /// The hierarchy's directory.
    pub(crate) dir: PathBuf,
    /// kubelet's cgroup root, as path segments; None: everything (tests).
    roots: Option<Vec<Vec<String>>>,
    /// `cgroups.kubernetes_root` as configured (for `classify_in`).
    kube_root: Option<String>,
}

impl Scope {
    pub(crate) fn new(dir: PathBuf, cfg: &crate::config::CgroupConfig) -> Scope {
        let segs = |p: &str| -> Vec<String> {
            p.split('/')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        let mut roots: Vec<Vec<String>> = match &cfg.kubernetes_root {
            Some(k) => vec![segs(k)],
            None => vec![segs("kubepods"), segs("kubepods.slice")],
        };
        roots.retain(|r| !r.is_empty());
        Scope {
            dir,
            roots: Some(roots),
            kube_root: cfg.kubernetes_root.clone(),
        }
    }

    /// Every directory (for tests of the watch mechanics).
    #[cfg(test)]
    pub(crate) fn everything(dir: &Path) -> Scope {
        Scope {
            dir: dir.to_path_buf(),
            roots: None,
            kube_root: None,
        }
    }

    /// Whether `rel` (relative to the hierarchy) is on the path to kubelet's root, or is that
    /// root, a QoS tier or a pod below it.
    pub(crate) fn covers(&self, rel: &Path) -> bool {
        let Some(roots) = &self.roots else {
            return true;
        };
        let segs: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().to_string())
            .filter(|c| !c.is_empty() && c != "/")
            .collect();
        if roots.iter().any(|r| r.starts_with(&segs)) {
            return true;
        }
        roots.iter().any(|r| segs.starts_with(r))
            && matches!(
                crate::cgroup::classify_in(&segs.join("/"), self.kube_root.as_deref(), &[]),
                crate::cgroup::CgroupKind::Kubepods
                    | crate::cgroup::CgroupKind::QosTier { .. }
                    | crate::cgroup::CgroupKind::Pod { .. }
            )
    }
}

/// Watches `rel` and every directory below it within `scope` (skipping what vanished
/// meanwhile); pushes the directories found below `rel` onto `found`, and why the first
/// directory that could not be watched was not onto `failed`.
#[allow(clippy::too_many_arguments)]
fn add_tree(
    ino: &mut Inotify,
    watches: &mut BTreeMap<WatchDescriptor, PathBuf>,
    scope: &Scope,
    rel: &Path,
    mask: WatchMask,
    found: &mut Vec<PathBuf>,
    metrics: &crate::serve::Metrics,
    failed: &mut Option<String>,
) {
    if !scope.covers(rel) {
        return;
    }
    let dir = scope.dir.join(rel);
    let wd = match ino.watches().add(&dir, mask) {
        Ok(wd) => wd,
        // Removed meanwhile: nothing to watch.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            let why = watch_failed(metrics, &dir, &e);
            failed.get_or_insert(why);
            return;
        }
    };
    watches.insert(wd, rel.to_path_buf());
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let sub = rel.join(OsStr::new(&e.file_name()));
            // Every directory below is reported (a container made before its pod's watch
            // existed is admitted), but only the covered ones are watched.
            found.push(sub.clone());
            if scope.covers(&sub) {
                add_tree(ino, watches, scope, &sub, mask, found, metrics, failed);
            }
        }
    }
}

/// A directory the watcher could not watch: counted by errno, warned at the 1st, 2nd, 4th, 8th…
/// failure (ENOSPC floods would flood the log too). The reason, for the health component.
fn watch_failed(metrics: &crate::serve::Metrics, dir: &Path, e: &std::io::Error) -> String {
    let reason = match e.raw_os_error() {
        Some(libc::ENOSPC) => "ENOSPC".to_string(),
        Some(libc::ENOMEM) => "ENOMEM".to_string(),
        Some(libc::EACCES) => "EACCES".to_string(),
        Some(n) => format!("errno {n}"),
        None => "other".to_string(),
    };
    let c = metrics
        .inotify_watch_failures
        .get_or_create(&crate::serve::metrics::ReasonLabel {
            reason: reason.clone(),
        });
    let n = c.inc() + 1;
    let hint = if reason == "ENOSPC" {
        "; raise fs.inotify.max_user_watches"
    } else {
        ""
    };
    if n.is_power_of_two() {
        tracing::warn!(dir = %dir.display(), error = %e, failures = n,
            "cannot watch a cgroup directory{hint}");
    }
    format!("cannot watch {} ({e}){hint}", dir.display())
}

/// Debug builds only, and only with `REBALANCER_TEST_HOOKS=1` in the environment: a cgroup named
/// `rebalancer-test-kill-watcher` panics the watcher thread, so the root tests can check that a
/// dead watcher is seen (`tests/hardening_root.rs`). Release builds compile it to nothing.
fn test_hook_kill(name: &OsStr) {
    if cfg!(debug_assertions)
        && name == "rebalancer-test-kill-watcher"
        && std::env::var_os("REBALANCER_TEST_HOOKS").is_some_and(|v| v == "1")
    {
        panic!("test hook: watcher killed");
    }
}

/// The watcher thread alone, without a supervisor (tests of the watch mechanics).
#[cfg(test)]
fn spawn(
    io: &mut Io,
    adm: Admission,
    cgroups: Cgroups,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    spawn_watcher(io, adm, cgroups, Default::default())
}

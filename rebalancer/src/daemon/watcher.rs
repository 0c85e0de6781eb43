//! The cgroup watcher: inotify on the cpuset hierarchy's managed roots (the Kubernetes kubepods
//! tree and the configured roots), so a new container cgroup is admitted and its cpuset written
//! within milliseconds of its appearance, and a removed one is released — with any runtime
//! (containerd, CRI-O, podman, systemd), without configuring the runtime.
//!
//! Requests are read from the cgroup itself: CPU limit from cpu.max (v1 cfs quota), CPU request
//! from cpu.weight (v1 shares, inverted from kubelet's shares formula), memory limit from
//! memory.max; QoS from the path. A container of a pod already admitted through the API is
//! bound to that pod's next unbound container instead of being admitted again.
//!
//! It runs on its own thread with blocking inotify reads; each event takes the shared lock
//! briefly. `reconcile` does the same for what already exists (at start, and after an inotify
//! queue overflow).

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use super::{Binding, Daemon, Shared};
use crate::{
    cgroup::{classify, classify_with_roots, CgroupKind, Cgroups, Controller, Qos},
    cpuset::CpuSet,
    placement::pod::{Container, Pod},
};

/// How long a container's limits may take to appear after its cgroup: a runtime makes the
/// directory first and writes cpu.max / memory.max / cpu.weight just after (on v2 they live in
/// the directory itself), so at the inotify event they usually still show the defaults.
pub const LIMITS_GRACE: Duration = Duration::from_millis(250);

/// The kernel's default cgroup v2 cpu.weight: what a new cgroup shows before its runtime
/// writes the container's (kubelet's 2.6-CPU request maps to it too, and is rare).
const DEFAULT_V2_WEIGHT: u64 = 100;

/// Waits at most `grace` until a container cgroup shows what its QoS class implies it will get:
/// a Guaranteed one a CPU quota and a memory limit (it always has both); a Burstable one on
/// cgroup v2 a cpu.weight other than the kernel default (v1's default shares equal a 1-CPU
/// request, so there is nothing to wait for). `false` when they never appeared.
pub fn await_limits(cgroups: &Cgroups, rel: &str, qos: Qos, grace: Duration) -> bool {
    let t0 = Instant::now();
    let v2_cpu = cgroups
        .hierarchy(Controller::Cpu)
        .is_ok_and(|(_, v)| v == crate::cgroup::Version::V2);
    loop {
        let ready = match qos {
            Qos::Guaranteed => {
                cgroups.cpu_max(rel).is_ok_and(|m| m.quota_us.is_some())
                    && cgroups.memory_max(rel).is_ok_and(|m| m.is_some())
            }
            Qos::Burstable => {
                !v2_cpu
                    || cgroups
                        .cpu_weight(rel)
                        .is_ok_and(|w| w != DEFAULT_V2_WEIGHT)
            }
            Qos::BestEffort => true,
        };
        if ready {
            return true;
        }
        if t0.elapsed() >= grace {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What happened to one cgroup, for logs and tests.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchOutcome {
    Admitted {
        cgroup: String,
        cpus: String,
        mems: String,
        micros: u128,
    },
    Bound {
        cgroup: String,
        pod: String,
    },
    Rejected {
        cgroup: String,
        reason: String,
    },
    Released {
        cgroup: String,
    },
    /// The cgroup was removed before its cpuset could be written (its container exited at
    /// once): the admission was undone. A normal race, logged at debug level.
    Vanished {
        cgroup: String,
    },
    Ignored,
}

impl WatchOutcome {
    /// True when the daemon's state changed (and must be checkpointed).
    pub fn changed(&self) -> bool {
        !matches!(self, WatchOutcome::Ignored | WatchOutcome::Rejected { .. })
    }
}

/// Approximate inverse (one weight step ≈ 2.5% at small requests) of kubelet's shares formula (shares = request_millis * 1024 / 1000) through the v2
/// weight mapping the cgroup layer applies (weight = 1 + (shares - 2) * 9999 / 262142).
pub fn request_millis_from_weight(weight: u64) -> u64 {
    let shares = (weight.saturating_sub(1) * 262_142).div_ceil(9_999) + 2;
    if shares <= 2 {
        return 0;
    }
    (shares * 1000).div_ceil(1024)
}

/// The single-container pod the watcher admits for a container cgroup it does not know.
pub fn pod_for(cgroups: &Cgroups, rel: &str, pod_uid: &str, id: &str, qos: Qos) -> Pod {
    let limit_millis = cgroups
        .cpu_max(rel)
        .ok()
        .and_then(|m| m.quota_us.map(|q| q * 1000 / m.period_us.max(1)))
        .unwrap_or(0);
    let weight_req = cgroups
        .cpu_weight(rel)
        .map(request_millis_from_weight)
        .unwrap_or(0);
    let mem_limit = cgroups.memory_max(rel).ok().flatten().unwrap_or(0);
    let (req, mem_req) = match qos {
        Qos::Guaranteed => (limit_millis, mem_limit),
        Qos::Burstable => (weight_req.max(1), 0),
        Qos::BestEffort => (0, 0),
    };
    let name = id.chars().take(12).collect::<String>();
    Pod {
        uid: format!("{pod_uid}/{name}"),
        containers: vec![Container {
            name,
            cpu_request_millis: if qos == Qos::BestEffort { 0 } else { req },
            cpu_limit_millis: if qos == Qos::Guaranteed {
                limit_millis
            } else {
                0
            },
            memory_bytes: mem_req,
            memory_limit_bytes: if qos == Qos::Guaranteed { mem_limit } else { 0 },
            ..Default::default()
        }],
    }
}

/// Handles a cgroup that appeared: admit (or bind) and write its cpuset (unless dry-run),
/// then checkpoint.
pub fn on_created(d: &Daemon, cgroups: &Cgroups, rel: &str, t0: Instant) -> WatchOutcome {
    let o = created(d, cgroups, rel, t0);
    if o.changed() {
        checkpoint(d);
    }
    o
}

/// Writes the checkpoint after watcher changes. A failure is logged: the live cgroups are the
/// truth for watcher admissions, and a restart reconciles from them.
fn checkpoint(d: &Daemon) {
    if let Err(e) = d.checkpoint() {
        tracing::warn!(error = %e, "checkpoint after watcher changes failed");
    }
}

/// [`on_created`] without the checkpoint (the watcher checkpoints once per batch of events).
fn created(d: &Daemon, cgroups: &Cgroups, rel: &str, t0: Instant) -> WatchOutcome {
    let rel = rel.trim_matches('/').to_string();
    if let CgroupKind::Container {
        pod_uid,
        qos: qos @ (Qos::Guaranteed | Qos::Burstable),
        ..
    } = classify(&rel)
    {
        let settled = {
            let s = d.lock();
            // Through the API (its requests are known), already bound, or not ours to admit.
            s.state.allocator.pods.contains_key(&pod_uid)
                || s.state.bindings.contains_key(&rel)
                || !s.cfg.cgroups.kubernetes
        };
        if !settled && !await_limits(cgroups, &rel, qos, LIMITS_GRACE) {
            tracing::warn!(cgroup = %rel, ?qos, "container cgroup still without the limits of its QoS class (cpu.max / memory.max, or cpu.weight) after {LIMITS_GRACE:?}; admitting what it shows");
        }
    }
    let mut s = d.lock();
    let CgroupKind::Container {
        pod_uid, qos, id, ..
    } = classify_with_roots(&rel, &s.cfg.cgroups.roots)
    else {
        return WatchOutcome::Ignored;
    };
    if !s.cfg.cgroups.kubernetes || s.state.bindings.contains_key(&rel) {
        return WatchOutcome::Ignored;
    }
    // A pod admitted through the API: bind to its next unbound container.
    if let Some(pod) = s.state.allocator.pods.get(&pod_uid) {
        let bound: Vec<&str> = s
            .state
            .bindings
            .values()
            .filter(|b| b.pod_uid == pod_uid)
            .map(|b| b.container.as_str())
            .collect();
        if let Some(c) = pod
            .containers
            .iter()
            .find(|c| !bound.contains(&c.placement.container.as_str()))
        {
            let (cpus, mems, container, exclusive) = (
                c.placement.cpus.clone(),
                c.placement.mems.clone(),
                c.placement.container.clone(),
                c.placement.exclusive,
            );
            if !s.cfg.daemon.dry_run && write(cgroups, &rel, &cpus, &mems) == Written::Vanished {
                tracing::debug!(cgroup = %rel, "container cgroup vanished before its cpuset was written");
                return WatchOutcome::Vanished { cgroup: rel };
            }
            s.state.bindings.insert(
                rel.clone(),
                Binding {
                    pod_uid: pod_uid.clone(),
                    container,
                },
            );
            if exclusive && !s.cfg.daemon.dry_run {
                shrink_shared(&s, cgroups);
            }
            return WatchOutcome::Bound {
                cgroup: rel,
                pod: pod_uid,
            };
        }
    }
    let pod = pod_for(cgroups, &rel, &pod_uid, &id, qos);
    let shared = &mut *s;
    match shared
        .state
        .allocator
        .admit(&shared.topo, &shared.cfg.placement, &pod)
    {
        Ok(placements) => {
            let p = &placements[0];
            if !shared.cfg.daemon.dry_run
                && write(cgroups, &rel, &p.cpus, &p.mems) == Written::Vanished
            {
                shared.state.allocator.release(&pod.uid);
                tracing::debug!(cgroup = %rel, "container cgroup vanished before its cpuset was written; admission undone");
                return WatchOutcome::Vanished { cgroup: rel };
            }
            shared.state.bindings.insert(
                rel.clone(),
                Binding {
                    pod_uid: pod.uid.clone(),
                    container: p.container.clone(),
                },
            );
            if p.exclusive && !shared.cfg.daemon.dry_run {
                shrink_shared(shared, cgroups);
            }
            let micros = t0.elapsed().as_micros();
            d.metrics
                .admission_requests
                .get_or_create(&crate::serve::metrics::ResultLabel {
                    result: "admitted".into(),
                })
                .inc();
            d.metrics.admission_duration.observe(micros as f64 / 1e6);
            tracing::info!(cgroup = %rel, cpus = %p.cpus, mems = %p.mems, micros, "container cgroup admitted");
            WatchOutcome::Admitted {
                cgroup: rel,
                cpus: p.cpus.to_string(),
                mems: p.mems.to_string(),
                micros,
            }
        }
        Err(rej) => {
            d.metrics
                .admission_rejections
                .get_or_create(&crate::serve::metrics::ReasonLabel {
                    reason: rej.reason.to_string(),
                })
                .inc();
            let fenced = (!shared.cfg.daemon.dry_run)
                .then(|| fence_off_exclusive(shared, cgroups, &rel))
                .flatten();
            match &fenced {
                Some(pool) => {
                    tracing::warn!(cgroup = %rel, reason = %rej.reason, details = %rej.details, cpus = %pool,
                    "container cgroup not admitted; moved off exclusive CPUs to the shared pool, unaccounted")
                }
                None => tracing::warn!(cgroup = %rel, reason = %rej.reason, details = %rej.details,
                    "container cgroup not admitted; left as the runtime made it"),
            }
            WatchOutcome::Rejected {
                cgroup: rel,
                reason: rej.reason.to_string(),
            }
        }
    }
}

/// A container we could not admit still never runs on another container's exclusive CPUs: when
/// the cpuset the runtime gave it overlaps them, it gets the shared pool instead (unaccounted, as
/// kubelet's shared pool would run it). Returns the cpuset written, if one was.
fn fence_off_exclusive(s: &Shared, cgroups: &Cgroups, rel: &str) -> Option<CpuSet> {
    let excl = s.state.allocator.exclusive_cpus();
    let current = cgroups.effective_cpus(rel).ok()?;
    if current.is_disjoint(&excl) {
        return None;
    }
    let pool = s
        .state
        .allocator
        .shared_pool(&crate::placement::cpu::CpuView::new(&s.topo));
    if pool.is_empty() {
        return None;
    }
    match cgroups.write_cpus(rel, &pool) {
        Ok(()) => Some(pool),
        Err(e) => {
            tracing::warn!(cgroup = %rel, error = %e, "moving a rejected container off exclusive CPUs failed");
            None
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Written {
    Ok,
    Failed,
    Vanished,
}

fn write(cgroups: &Cgroups, rel: &str, cpus: &CpuSet, mems: &CpuSet) -> Written {
    // mems first: a task must never find itself with CPUs but no allowed memory node.
    match cgroups
        .write_mems(rel, mems)
        .and_then(|_| cgroups.write_cpus(rel, cpus))
    {
        Ok(()) => Written::Ok,
        // Removed meanwhile (ENOENT, or ENODEV from a dying cgroup): not an error.
        Err(_) if !cgroups.exists(Controller::Cpuset, rel) => Written::Vanished,
        Err(e) => {
            tracing::warn!(cgroup = %rel, error = %e, "writing the admitted cpuset failed");
            Written::Failed
        }
    }
}

/// Exclusive CPUs were just handed out: every bound shared container stops using them, as
/// kubelet's CPU manager shrinks its shared pool. Its cpuset keeps what is left of its live set,
/// or else its admission pool minus the exclusive CPUs (never empty: the allocator refuses an
/// exclusive allocation that would leave a shared container without a CPU).
pub fn shrink_shared(s: &Shared, cgroups: &Cgroups) -> usize {
    let excl = s.state.allocator.exclusive_cpus();
    let mut shrunk = 0;
    for (cg, b) in &s.state.bindings {
        let exclusive = s.state.allocator.pods.get(&b.pod_uid).is_some_and(|p| {
            p.containers
                .iter()
                .any(|c| c.placement.container == b.container && c.placement.exclusive)
        });
        let Some(pool) = s.state.allocator.current_cpus(&b.pod_uid, &b.container) else {
            continue;
        };
        if exclusive {
            continue;
        }
        let live = match cgroups.cpus(cg) {
            Ok(c) if !c.is_empty() => c,
            _ => match cgroups.effective_cpus(cg) {
                Ok(c) => c,
                Err(_) => continue,
            },
        };
        if live.is_disjoint(&excl) {
            continue;
        }
        let kept = live.difference(&excl);
        let new = if kept.is_empty() { pool } else { kept };
        if new.is_empty() {
            tracing::warn!(cgroup = %cg, "no CPU left outside the exclusive ones; cpuset left as it is");
            continue;
        }
        match cgroups.write_cpus(cg, &new) {
            Ok(()) => {
                shrunk += 1;
                tracing::info!(cgroup = %cg, cpus = %new, "shared container moved off newly exclusive CPUs");
            }
            Err(e) => {
                tracing::warn!(cgroup = %cg, error = %e, "moving a shared container off exclusive CPUs failed")
            }
        }
    }
    shrunk
}

/// Exclusive CPUs that went offline are replaced (see `Allocator::replace_offline`): the
/// container's cgroup gets its new cpuset, and shared containers move off CPUs that just
/// became exclusive. The state is checkpointed at the end of the round.
pub fn replace_offline(s: &mut Shared, cgroups: &Cgroups) {
    let sh = &mut *s;
    let replaced = sh
        .state
        .allocator
        .replace_offline(&sh.topo, &sh.cfg.placement);
    if replaced.is_empty() {
        return;
    }
    let dry_run = sh.cfg.daemon.dry_run;
    for r in &replaced {
        let cg = sh
            .state
            .bindings
            .iter()
            .find(|(_, b)| b.pod_uid == r.pod_uid && b.container == r.container)
            .map(|(cg, _)| cg.clone());
        if r.added.len() < r.lost.len() {
            tracing::warn!(pod = %r.pod_uid, container = %r.container, lost = %r.lost, added = %r.added, cpus = %r.cpus,
                "exclusive CPUs went offline and not all could be replaced");
        } else {
            tracing::warn!(pod = %r.pod_uid, container = %r.container, lost = %r.lost, added = %r.added, cpus = %r.cpus,
                "exclusive CPUs went offline; replaced");
        }
        let Some(cg) = cg else { continue };
        if dry_run {
            continue;
        }
        if let Err(e) = cgroups.write_cpus(&cg, &r.cpus) {
            tracing::warn!(cgroup = %cg, error = %e, "writing the replacement exclusive CPUs failed");
        }
    }
    if !dry_run {
        shrink_shared(sh, cgroups);
    }
}

/// Handles a cgroup that disappeared: unbind, release a watcher-admitted pod, checkpoint.
pub fn on_removed(d: &Daemon, rel: &str) -> WatchOutcome {
    let o = removed(d, rel);
    if o.changed() {
        checkpoint(d);
    }
    o
}

/// [`on_removed`] without the checkpoint.
fn removed(d: &Daemon, rel: &str) -> WatchOutcome {
    let rel = rel.trim_matches('/').to_string();
    let mut s = d.lock();
    let Some(b) = s.state.bindings.remove(&rel) else {
        return WatchOutcome::Ignored;
    };
    // Watcher-admitted pods are keyed "<pod uid>/<container>"; API pods are released by DELETE.
    if b.pod_uid.contains('/') {
        s.state.allocator.release(&b.pod_uid);
    }
    tracing::info!(cgroup = %rel, "container cgroup removed; released");
    WatchOutcome::Released { cgroup: rel }
}

/// Admits what exists and is unknown, releases bindings whose cgroup vanished.
pub fn reconcile(d: &Daemon, cgroups: &Cgroups) -> Vec<WatchOutcome> {
    let live: Vec<String> = cgroups
        .walk(Controller::Cpuset, "")
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.trim_matches('/').to_string())
        .collect();
    let gone: Vec<String> = d
        .lock()
        .state
        .bindings
        .keys()
        .filter(|k| !live.contains(k))
        .cloned()
        .collect();
    let mut out: Vec<WatchOutcome> = gone.iter().map(|g| removed(d, g)).collect();
    for rel in &live {
        match created(d, cgroups, rel, Instant::now()) {
            WatchOutcome::Ignored => {}
            o => out.push(o),
        }
    }
    if out.iter().any(WatchOutcome::changed) {
        checkpoint(d);
    }
    out
}

/// Starts the watcher thread over the cpuset hierarchy. Returns an error if inotify is
/// unavailable; the daemon then relies on `reconcile` each round.
pub fn spawn(d: Daemon, cgroups: Cgroups) -> std::io::Result<std::thread::JoinHandle<()>> {
    let root = cgroups
        .hierarchy(Controller::Cpuset)
        .map(|(p, _)| p.to_path_buf())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()))?;
    let mut ino = Inotify::init()?;
    let mut watches: BTreeMap<WatchDescriptor, PathBuf> = BTreeMap::new();
    let mask = WatchMask::CREATE | WatchMask::DELETE | WatchMask::ONLYDIR | WatchMask::DELETE_SELF;
    // What appeared between the start-up reconcile and these watches is handled first.
    let mut initial = Vec::new();
    add_tree(
        &mut ino,
        &mut watches,
        &root,
        Path::new(""),
        mask,
        &mut initial,
    );
    let ck = spawn_checkpointer(d.clone())?;
    std::thread::Builder::new().name("cgroup-watcher".into()).spawn(move || {
        let mut changed = false;
        for rel in initial {
            changed |= created(&d, &cgroups, &rel.to_string_lossy(), Instant::now()).changed();
        }
        if changed {
            let _ = ck.send(());
        }
        let mut buf = [0u8; 64 * 1024];
        loop {
            let events = match ino.read_events_blocking(&mut buf) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!(error = %e, "inotify read failed; watcher stopped (rounds still reconcile)");
                    return;
                }
            };
            let t0 = Instant::now();
            let mut overflow = false;
            let mut changed = false;
            let mut found = Vec::new();
            // In order: a cgroup created and removed within one batch is admitted (or found
            // gone) before its removal is handled, never after.
            for ev in events {
                if ev.mask.contains(EventMask::Q_OVERFLOW) {
                    overflow = true;
                    continue;
                }
                let (Some(parent), Some(name)) = (watches.get(&ev.wd).cloned(), ev.name) else { continue };
                let rel = parent.join(name);
                if ev.mask.contains(EventMask::CREATE) && ev.mask.contains(EventMask::ISDIR) {
                    let placed = created(&d, &cgroups, &rel.to_string_lossy(), t0).changed();
                    if placed {
                        d.wake.notify_one(); // its first round now, not a period later
                    }
                    changed |= placed;
                    // Directories made below it before its watch existed are admitted too.
                    add_tree(&mut ino, &mut watches, &root, &rel, mask, &mut found);
                    for sub in found.drain(..) {
                        changed |= created(&d, &cgroups, &sub.to_string_lossy(), t0).changed();
                    }
                } else if ev.mask.contains(EventMask::DELETE) && ev.mask.contains(EventMask::ISDIR) {
                    changed |= removed(&d, &rel.to_string_lossy()).changed();
                    watches.retain(|_, p| !p.starts_with(&rel));
                }
            }
            if changed {
                let _ = ck.send(());
            }
            if overflow {
                tracing::warn!("inotify queue overflowed; reconciling");
                reconcile(&d, &cgroups);
            }
        }
    })
}

/// Shortest time between two checkpoints of watcher changes. Under churn (hundreds of cgroups
/// a second) one checkpoint covers many changes instead of one fsync'd write per event; a crash
/// in between loses nothing that matters: the live cgroups are the truth for what the watcher
/// admitted, and a restart reconciles from them.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

/// The thread that checkpoints watcher changes, so the watcher never waits for the disk:
/// requests sent while it writes are coalesced into the next write, at most one per
/// [`CHECKPOINT_EVERY`].
fn spawn_checkpointer(d: Daemon) -> std::io::Result<std::sync::mpsc::Sender<()>> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("checkpointer".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                while rx.try_recv().is_ok() {}
                checkpoint(&d);
                std::thread::sleep(CHECKPOINT_EVERY);
            }
        })?;
    Ok(tx)
}

/// Watches `rel` and every directory below it (skipping what vanished meanwhile); pushes the
/// directories found below `rel` onto `found`.
fn add_tree(
    ino: &mut Inotify,
    watches: &mut BTreeMap<WatchDescriptor, PathBuf>,
    root: &Path,
    rel: &Path,
    mask: WatchMask,
    found: &mut Vec<PathBuf>,
) {
    let dir = root.join(rel);
    let Ok(wd) = ino.watches().add(&dir, mask) else {
        return;
    };
    watches.insert(wd, rel.to_path_buf());
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let sub = rel.join(OsStr::new(&e.file_name()));
            found.push(sub.clone());
            add_tree(ino, watches, root, &sub, mask, found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cgroup::Mounts, config::Config, serve::Metrics, topology::TopologyBuilder};

    const UID: &str = "8d5c3f2e-1b4a-4c6d-9e8f-7a6b5c4d3e2f";

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A fake v2 hierarchy (2 nodes x 2 CPUs) and a daemon over it.
    fn fake(root: &Path) -> (Daemon, Cgroups) {
        put(root, "cgroup.controllers", "cpuset cpu memory\n");
        for dir in [
            "",
            "kubepods.slice",
            "kubepods.slice/kubepods-besteffort.slice",
        ] {
            put(root, &format!("{dir}/cpuset.cpus.effective"), "0-3\n");
            put(root, &format!("{dir}/cpuset.mems.effective"), "0-1\n");
        }
        let topo = TopologyBuilder {
            cores_per_node: 2,
            threads_per_core: 1,
            ..Default::default()
        }
        .build();
        let mut cfg = Config::default();
        cfg.daemon.state_dir = root.join("state");
        let shared = Shared::fresh(topo, cfg).unwrap();
        let cgroups = Cgroups::new(Mounts::scan_root(root).unwrap());
        (Daemon::new(shared, Metrics::default()), cgroups)
    }

    /// A container cgroup as a runtime makes it: the directory, limits still unset.
    fn container(root: &Path, pod: &str, id: &str) -> String {
        let rel = format!("{pod}/cri-containerd-{}.scope", id.repeat(64));
        put(root, &format!("{pod}/cpuset.cpus.effective"), "0-3\n");
        put(root, &format!("{pod}/cpuset.mems.effective"), "0-1\n");
        for (f, v) in [
            ("cpuset.cpus", ""),
            ("cpuset.mems", ""),
            ("cpu.max", "max 100000\n"),
            ("cpu.weight", "100\n"),
            ("memory.max", "max\n"),
        ] {
            put(root, &format!("{rel}/{f}"), v);
        }
        rel
    }

    /// A BestEffort container of pod UID.
    fn besteffort_container(root: &Path) -> String {
        let us = UID.replace('-', "_");
        container(
            root,
            &format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{us}.slice"),
            "b",
        )
    }

    /// What a runtime writes for a Guaranteed 1-CPU, 64 MiB container.
    fn guaranteed_limits(dir: &Path) {
        std::fs::write(dir.join("memory.max"), "67108864\n").unwrap();
        std::fs::write(dir.join("cpu.max"), "100000 100000\n").unwrap();
    }

    #[test]
    fn guaranteed_limits_written_after_mkdir_still_get_exclusive_cpus_and_shared_ones_move_off() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (d, cg) = fake(root);
        let us = UID.replace('-', "_");
        // A BestEffort container first: the whole shared pool.
        let be = besteffort_container(root);
        let o = on_created(&d, &cg, &be, Instant::now());
        assert!(
            matches!(&o, WatchOutcome::Admitted { cpus, .. } if cpus == "0-3"),
            "{o:?}"
        );
        // A Guaranteed 1-CPU container whose runtime writes its limits 30 ms after mkdir.
        let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
        let (gdir, t0) = (root.join(&g), Instant::now());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            guaranteed_limits(&gdir);
        });
        let o = on_created(&d, &cg, &g, t0);
        writer.join().unwrap();
        let WatchOutcome::Admitted { cpus, mems, .. } = &o else {
            panic!("{o:?}")
        };
        let gcpus = CpuSet::parse(cpus).unwrap();
        assert_eq!(
            gcpus.len(),
            1,
            "one exclusive CPU, not the shared pool: {o:?}"
        );
        assert_eq!(d.lock().state.allocator.exclusive_cpus(), gcpus);
        assert_eq!(
            mems,
            &d.lock()
                .topo
                .node_of_cpu(gcpus.iter().next().unwrap())
                .unwrap()
                .to_string()
        );
        // The BestEffort container no longer runs on the exclusive CPU, and still has CPUs.
        let be_now = cg.cpus(&be).unwrap();
        assert_eq!(be_now, CpuSet::parse("0-3").unwrap().difference(&gcpus));
        // Limits that never come: admitted as shown after the grace time, not blocked forever.
        let never = container(
            root,
            &format!("kubepods.slice/kubepods-pod{}.slice", us.replace('8', "9")),
            "c",
        );
        let t = Instant::now();
        assert!(!await_limits(
            &cg,
            &never,
            Qos::Guaranteed,
            Duration::from_millis(20)
        ));
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    /// CPU hotplug: a Guaranteed container's exclusive CPU goes offline; it gets another one
    /// written to its cgroup, the BestEffort container moves off that one, and nothing is
    /// empty.
    #[test]
    fn an_exclusive_cpu_going_offline_is_replaced_in_the_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (d, cg) = fake(root);
        let us = UID.replace('-', "_");
        let be = besteffort_container(root);
        on_created(&d, &cg, &be, Instant::now());
        let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
        guaranteed_limits(&root.join(&g));
        let o = on_created(&d, &cg, &g, Instant::now());
        assert!(matches!(o, WatchOutcome::Admitted { .. }), "{o:?}");
        let old = cg.cpus(&g).unwrap();
        assert_eq!(old.len(), 1);
        let gone = old.first().unwrap();

        let mut s = d.lock();
        for c in s.topo.cpus.iter_mut() {
            if c.id == gone {
                c.online = false;
            }
        }
        replace_offline(&mut s, &cg);
        let new = cg.cpus(&g).unwrap();
        assert_eq!(new.len(), 1, "CPU count kept: {new}");
        assert!(!new.contains(gone));
        assert_eq!(s.state.allocator.exclusive_cpus(), new);
        let be_now = cg.cpus(&be).unwrap();
        assert!(
            !be_now.is_empty() && be_now.is_disjoint(&new),
            "{be_now} vs {new}"
        );
        // Nothing more to do at the next check.
        replace_offline(&mut s, &cg);
        assert_eq!(cg.cpus(&g).unwrap(), new);
    }

    #[test]
    fn a_container_made_before_its_pod_cgroup_is_watched_is_still_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (d, cg) = fake(root);
        spawn(d.clone(), cg.clone()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let pod = format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
            UID.replace('-', "_")
        );
        let be = {
            // Hold the lock: the watcher takes the pod cgroup's event and then waits in
            // on_created, before it can watch the pod cgroup; the container appears meanwhile.
            let _held = d.lock();
            std::fs::create_dir_all(root.join(&pod)).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            container(root, &pod, "e")
        };
        let t0 = Instant::now();
        while cg.cpus(&be).unwrap().is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the container made before its pod cgroup was watched never got a cpuset"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(cg.cpus(&be).unwrap(), CpuSet::parse("0-3").unwrap());
    }

    #[test]
    fn a_burstable_weight_written_after_mkdir_is_the_request_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (d, cg) = fake(root);
        let us = UID.replace('-', "_");
        let b = container(
            root,
            &format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{us}.slice"),
            "b",
        );
        // The runtime writes the 500m request's weight 30 ms after the directory appears; until
        // then the kernel default (100, i.e. ~2.6 CPUs) shows.
        let bdir = root.join(&b);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            std::fs::write(bdir.join("cpu.weight"), "20\n").unwrap();
        });
        let o = on_created(&d, &cg, &b, Instant::now());
        writer.join().unwrap();
        assert!(matches!(o, WatchOutcome::Admitted { .. }), "{o:?}");
        let s = d.lock();
        let pod = s.state.allocator.pods.values().next().unwrap();
        assert!(
            (450..=550).contains(&pod.cpu_request_millis),
            "admitted with {}m, not the 500m written after mkdir",
            pod.cpu_request_millis
        );
    }

    #[test]
    fn a_rejected_container_is_fenced_off_exclusive_cpus() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (d, cg) = fake(root);
        let us = UID.replace('-', "_");
        // A Guaranteed container takes 3 of the 4 CPUs.
        let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
        put(root, &format!("{g}/cpu.max"), "300000 100000\n");
        put(root, &format!("{g}/memory.max"), "67108864\n");
        let o = on_created(&d, &cg, &g, Instant::now());
        let WatchOutcome::Admitted { cpus, .. } = &o else {
            panic!("{o:?}")
        };
        let excl = CpuSet::parse(cpus).unwrap();
        assert_eq!(excl.len(), 3);
        // A Burstable container asking for 8 CPUs cannot be admitted; the runtime gave it the
        // whole machine, exclusive CPUs included.
        let other = UID.replace('8', "9").replace('-', "_");
        let b = container(
            root,
            &format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{other}.slice"),
            "b",
        );
        put(root, &format!("{b}/cpu.weight"), "313\n");
        put(root, &format!("{b}/cpuset.cpus.effective"), "0-3\n");
        let o = on_created(&d, &cg, &b, Instant::now());
        assert!(matches!(o, WatchOutcome::Rejected { .. }), "{o:?}");
        let now = cg.cpus(&b).unwrap();
        assert!(!now.is_empty() && now.is_disjoint(&excl), "{now} vs {excl}");
        assert_eq!(now, CpuSet::parse("0-3").unwrap().difference(&excl));
    }

    #[test]
    fn weight_inverts_kubelet_shares() {
        // kubelet: 500m → 512 shares → weight 1 + 510*9999/262142 = 20; the weight scale is
        // coarser than millicores, so the inverse is exact to within one weight step (~2.5%).
        let back = request_millis_from_weight(20);
        assert!((485..=515).contains(&back), "{back}");
        assert_eq!(request_millis_from_weight(1), 0);
        // 2 CPUs → 2048 shares → weight 79
        let w = 1 + (2048 - 2) * 9999 / 262_142;
        let back = request_millis_from_weight(w);
        assert!((1990..=2010).contains(&back), "{back}");
    }
}

//! The cgroup watcher: inotify on the cpuset hierarchy's managed roots (the Kubernetes kubepods
//! tree and the configured roots), so a new container cgroup is admitted and its cpuset written
//! within milliseconds of its appearance, and a removed one is released — with any runtime
//! (containerd, CRI-O, podman, systemd), without configuring the runtime.
//!
//! This module is the transport: the inotify loop on its own thread (blocking reads), the
//! watches, and `reconcile` for what already exists (at start, and after an inotify queue
//! overflow). What a cgroup asks for and how it is admitted is `policy`, which calls the one
//! admission service (`daemon::admission`). Changes are checkpointed once per batch of events,
//! coalesced on the service's checkpointer thread.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    time::Instant,
};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use crate::{
    cgroup::{Cgroups, Controller},
    daemon::admission::Admission,
};

pub mod policy;
#[cfg(test)]
mod tests;

pub use policy::{await_limits, pod_for, request_millis_from_weight, WatchOutcome, LIMITS_GRACE};
use policy::{created, removed};

/// Handles a cgroup that appeared (see [`policy::created`]) and checkpoints the change now.
pub fn on_created(adm: &Admission, cgroups: &Cgroups, rel: &str, t0: Instant) -> WatchOutcome {
    let o = created(adm, cgroups, rel, t0);
    if o.changed() {
        checkpoint(adm);
    }
    o
}

/// Handles a cgroup that disappeared (see [`policy::removed`]) and checkpoints the change now.
pub fn on_removed(adm: &Admission, rel: &str) -> WatchOutcome {
    let o = removed(adm, rel);
    if o.changed() {
        checkpoint(adm);
    }
    o
}

/// Writes the checkpoint after watcher changes. A failure is logged: the live cgroups are the
/// truth for watcher admissions, and a restart reconciles from them.
fn checkpoint(adm: &Admission) {
    if let Err(e) = adm.checkpoint() {
        tracing::warn!(error = %e, "checkpoint after watcher changes failed");
    }
}

/// Admits what exists and is unknown, releases bindings whose cgroup vanished.
pub fn reconcile(adm: &Admission, cgroups: &Cgroups) -> Vec<WatchOutcome> {
    let live: Vec<String> = cgroups
        .walk(Controller::Cpuset, "")
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.trim_matches('/').to_string())
        .collect();
    let gone: Vec<String> = adm
        .daemon
        .lock()
        .state
        .bindings
        .keys()
        .filter(|k| !live.contains(k))
        .cloned()
        .collect();
    let mut out: Vec<WatchOutcome> = gone.iter().map(|g| removed(adm, g)).collect();
    for rel in &live {
        match created(adm, cgroups, rel, Instant::now()) {
            WatchOutcome::Ignored => {}
            o => out.push(o),
        }
    }
    if out.iter().any(WatchOutcome::changed) {
        checkpoint(adm);
    }
    out
}

/// Starts the watcher thread over the cpuset hierarchy. Returns an error if inotify is
/// unavailable; the daemon then relies on `reconcile` each round.
pub fn spawn(adm: Admission, cgroups: Cgroups) -> std::io::Result<std::thread::JoinHandle<()>> {
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
    std::thread::Builder::new().name("cgroup-watcher".into()).spawn(move || {
        let mut changed = false;
        for rel in initial {
            changed |= created(&adm, &cgroups, &rel.to_string_lossy(), Instant::now()).changed();
        }
        if changed {
            adm.request_checkpoint();
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
                    changed |= created(&adm, &cgroups, &rel.to_string_lossy(), t0).changed();
                    // Directories made below it before its watch existed are admitted too.
                    add_tree(&mut ino, &mut watches, &root, &rel, mask, &mut found);
                    for sub in found.drain(..) {
                        changed |= created(&adm, &cgroups, &sub.to_string_lossy(), t0).changed();
                    }
                } else if ev.mask.contains(EventMask::DELETE) && ev.mask.contains(EventMask::ISDIR) {
                    changed |= removed(&adm, &rel.to_string_lossy()).changed();
                    watches.retain(|_, p| !p.starts_with(&rel));
                }
            }
            if changed {
                adm.request_checkpoint();
            }
            if overflow {
                tracing::warn!("inotify queue overflowed; reconciling");
                reconcile(&adm, &cgroups);
            }
        }
    })
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

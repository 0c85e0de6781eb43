//! The running daemon's shared state and its persistence: the topology, the validated config,
//! the admission allocator, which container cgroup is bound to which admitted container, and
//! the controller's memory and last decisions. The API, the watcher and the control loop share
//! one [`Shared`] behind a mutex (critical sections are short and never span an await).
//!
//! The checkpoint holds what must survive a restart (allocator, bindings, controller state);
//! every change to the allocator is checkpointed before it is acknowledged.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
};

pub mod apply;
pub mod engine;
pub mod run;
pub mod trigger;
pub mod watcher;

#[cfg(test)]
mod fault_tests;

use serde::{Deserialize, Serialize};

use crate::{
    checkpoint::{self, CheckpointError},
    config::Config,
    controller::{ControllerState, Decision},
    placement::admission::Allocator,
    serve::Metrics,
    topology::Topology,
};

/// A container cgroup bound to an admitted container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub pod_uid: String,
    pub container: String,
}

/// What the checkpoint holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    pub allocator: Allocator,
    /// cgroup path (relative to the hierarchy root) → admitted container.
    pub bindings: BTreeMap<String, Binding>,
    pub controller: ControllerState,
}

/// Everything the daemon's tasks share.
pub struct Shared {
    pub topo: Topology,
    pub cfg: Config,
    pub state: Persisted,
    /// The last round's decision per cgroup, for `explain`.
    pub decisions: BTreeMap<String, Decision>,
    /// eBPF / PMU source availability, for `status`.
    pub sources: Vec<serde_json::Value>,
    /// The last round's observations, for `top`.
    pub last_obs: Option<crate::controller::Observations>,
    /// Orders checkpoint writes (see [`CheckpointWriter`]).
    pub ckpt: Arc<CheckpointWriter>,
}

impl Shared {
    /// The daemon's state on `topo` under `cfg`, holding `state` (restored or fresh); nothing
    /// observed or decided yet.
    pub fn new(topo: Topology, cfg: Config, state: Persisted) -> Shared {
        Shared {
            topo,
            cfg,
            state,
            decisions: Default::default(),
            sources: Vec::new(),
            last_obs: None,
            ckpt: Default::default(),
        }
    }

    /// A fresh state: an empty allocator on `topo` under `cfg`'s placement settings.
    pub fn fresh(
        topo: Topology,
        cfg: Config,
    ) -> Result<Shared, crate::placement::admission::PlacementError> {
        let allocator = Allocator::new(&topo, &cfg.placement)?;
        Ok(Shared::new(
            topo,
            cfg,
            Persisted {
                allocator,
                bindings: Default::default(),
                controller: Default::default(),
            },
        ))
    }

    pub fn state_dir(&self) -> PathBuf {
        self.cfg.daemon.state_dir.clone()
    }

    /// Writes the checkpoint now, under the state lock (the admission API acknowledges only
    /// what is on disk). The watcher and the control loop use [`Daemon::checkpoint`] instead.
    pub fn checkpoint(&self) -> Result<(), CheckpointError> {
        let gen = self.ckpt.next_generation();
        let dir = &self.cfg.daemon.state_dir;
        self.ckpt
            .write(dir, gen, &checkpoint::encode(dir, &self.state)?)
    }
}

/// Serialises checkpoint writes and keeps an older state from overwriting a newer one: each
/// checkpoint takes a generation while the state lock is held (so generations follow the
/// state's order), and a write whose generation is older than the one on disk is dropped.
#[derive(Debug, Default)]
pub struct CheckpointWriter {
    next: AtomicU64,
    written: Mutex<u64>,
}

impl CheckpointWriter {
    /// A new generation; call with the state lock held.
    pub fn next_generation(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Writes `bytes` of generation `gen` unless a newer generation is already on disk.
    pub fn write(&self, dir: &Path, gen: u64, bytes: &[u8]) -> Result<(), CheckpointError> {
        let mut on_disk = self.written.lock().unwrap_or_else(|p| p.into_inner());
        if *on_disk > gen {
            return Ok(());
        }
        checkpoint::write_encoded(dir, bytes)?;
        *on_disk = gen;
        Ok(())
    }
}

/// Handle cloned into every task.
#[derive(Clone)]
pub struct Daemon {
    inner: Arc<Mutex<Shared>>,
    pub metrics: Metrics,
    /// Wakes the control loop for a round now (an operator's cpuset change, a new cgroup's
    /// first placement; see `trigger`).
    pub wake: Arc<tokio::sync::Notify>,
}

impl Daemon {
    pub fn new(shared: Shared, metrics: Metrics) -> Daemon {
        Daemon {
            inner: Arc::new(Mutex::new(shared)),
            metrics,
            wake: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Writes the checkpoint: encoded under the state lock, written (fsync, rename) outside it,
    /// so a slow disk never holds up the watcher or the API.
    pub fn checkpoint(&self) -> Result<(), CheckpointError> {
        let (dir, gen, bytes, w) = {
            let s = self.lock();
            let gen = s.ckpt.next_generation();
            let dir = s.cfg.daemon.state_dir.clone();
            let bytes = checkpoint::encode(&dir, &s.state)?;
            (dir, gen, bytes, s.ckpt.clone())
        };
        w.write(&dir, gen, &bytes)
    }

    /// Locks the shared state. A panic in another holder does not make the state unusable:
    /// every mutation is all-or-nothing (see `Allocator::admit`), so the data is consistent.
    pub fn lock(&self) -> MutexGuard<'_, Shared> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

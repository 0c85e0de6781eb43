//! The running daemon's shared state and its persistence: the topology, the validated config,
//! the admission allocator, which container cgroup is bound to which admitted container, and
//! the controller's memory and last decisions. The API, the watcher and the control loop share
//! one [`Shared`] behind a mutex (critical sections are short and never span an await).
//!
//! The checkpoint holds what must survive a restart (allocator, bindings, controller state);
//! every change to the allocator is checkpointed before it is acknowledged.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
};

pub mod apply;
pub mod engine;
pub mod run;
pub mod watcher;

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
}

impl Shared {
    pub fn state_dir(&self) -> PathBuf {
        self.cfg.daemon.state_dir.clone()
    }

    /// Writes the checkpoint now.
    pub fn checkpoint(&self) -> Result<(), CheckpointError> {
        checkpoint::save(&self.cfg.daemon.state_dir, &self.state)
    }
}

/// Handle cloned into every task.
#[derive(Clone)]
pub struct Daemon {
    inner: Arc<Mutex<Shared>>,
    pub metrics: Metrics,
}

impl Daemon {
    pub fn new(shared: Shared, metrics: Metrics) -> Daemon {
        Daemon {
            inner: Arc::new(Mutex::new(shared)),
            metrics,
        }
    }

    /// Locks the shared state. A panic in another holder does not make the state unusable:
    /// every mutation is all-or-nothing (see `Allocator::admit`), so the data is consistent.
    pub fn lock(&self) -> MutexGuard<'_, Shared> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

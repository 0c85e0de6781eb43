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

pub mod admission;
pub mod annotations;
pub mod api;
pub mod apply;
pub mod engine;
pub mod kubelet;
pub mod lock;
pub mod nri;
pub mod nri_updates;
pub mod reconcile;
pub mod run;
pub mod status;
pub mod trigger;
pub mod watcher;
pub mod writer;

#[cfg(test)]
mod apply_tests;
#[cfg(test)]
mod books_tests;
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
    /// What pods' annotations ask (pod uid → ask), as the runtime last told it over NRI
    /// (`annotations`): kept here so a restart honours them before the runtime reconnects.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotated: BTreeMap<String, annotations::Ask>,
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
    /// The load the last round measured beyond the books (`Allocator::overuse`): orders the
    /// shared pools admission chooses between. Not checkpointed; empty until a round ran.
    pub overuse: crate::placement::admission::Overuse,
    /// Containers of kubelet pods without kubelet CPUs, fenced off the exclusive CPUs (cgroup →
    /// pod uid; `admission::fence_cpus`): fenced again whenever the shared containers follow
    /// the books (`admission::shared_changes`). Not checkpointed: the start-up reconcile and
    /// NRI's Synchronize fence them again.
    pub fenced: BTreeMap<String, String>,
    /// Fenced containers whose re-fence write failed, with the consecutive failures (a v1
    /// cpuset with a child, a parent without the CPUs): retried each round, logged at the 1st,
    /// 2nd, 4th, 8th, … failure so one stuck cgroup does not flood the log.
    pub fence_failures: BTreeMap<String, u32>,
    /// Kubernetes containers the watcher found but could not admit (refused, or their cgroup
    /// read failed): unaccounted, and fenced off the exclusive CPUs as `fenced` are, whenever
    /// those change, until their cgroup goes. Not checkpointed: the start-up reconcile finds
    /// them again.
    pub refused: std::collections::BTreeSet<String>,
    /// Consecutive rounds in which some bound shared container could not be set to its pool
    /// (`admission::shared_changes`: a write failed after exclusive CPUs were taken, so it may
    /// still run on them); 0 when the last attempt wrote all. Retried each round
    /// (`Admission::refence`) while above 0.
    pub shrink_failures: u32,
    /// Cgroups whose move is booked and being written (`admission::book_move` until
    /// `Booked::settle`): neither a repair nor a shrink writes them meanwhile (the move's own
    /// read of their cpus would find someone else's write); the settle sets them right.
    pub moving: std::collections::BTreeSet<String>,
    /// The admission mode in force (`[kubernetes] admission`, `auto` resolved), for `status`.
    pub admission: crate::config::AdmissionMode,
    /// Whether the NRI plugin is registered with the runtime now.
    pub nri_connected: bool,
    /// kubelet's static CPU / Memory Manager assignments adopted (`daemon::kubelet`).
    pub kubelet: kubelet::Status,
    /// The runtime that configured the NRI plugin (`status`).
    pub nri_runtime: status::NriRuntime,
    /// The NodeResourceTopology exporter's state (None: export off).
    pub topology_export: Option<crate::nrt::export::ExportStatus>,
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
            overuse: Default::default(),
            fenced: Default::default(),
            fence_failures: Default::default(),
            refused: Default::default(),
            shrink_failures: 0,
            moving: Default::default(),
            admission: crate::config::AdmissionMode::Off,
            nri_connected: false,
            kubelet: Default::default(),
            nri_runtime: Default::default(),
            topology_export: None,
        }
    }

    /// A round's observations: folded into the controller's state, and what they show beyond
    /// the books kept for admission (`overuse`), taken before the round's moves are booked so
    /// a workload moved off a node keeps its overuse there until the next round measures it.
    /// With load-aware admission off (`admission_load_periods` 0) there is no overuse to
    /// compute: it is cleared, so a reload that turns it off applies at the next round.
    pub fn observe(
        &mut self,
        obs: &crate::controller::Observations,
        cfg: &crate::config::ControllerConfig,
    ) -> crate::controller::Scores {
        let scores = (self.state.controller).observe_window(
            &self.topo,
            obs,
            crate::controller::EWMA_ALPHA,
            cfg.period_ms,
        );
        if cfg.admission_load_periods == 0 {
            self.overuse = Default::default();
            return scores;
        }
        let lasting = (self.state.controller).lasting_pressure(cfg.admission_load_periods as usize);
        self.overuse = self.state.allocator.overuse(&self.topo, &lasting);
        scores
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
                annotated: Default::default(),
            },
        ))
    }

    pub fn state_dir(&self) -> PathBuf {
        self.cfg.daemon.state_dir.clone()
    }
}

/// Milliseconds since boot (CLOCK_BOOTTIME): the clock of every time the checkpoint holds.
/// Unlike process uptime it survives a restart; unlike the wall clock it never jumps. The
/// checkpoint lives on tmpfs and so never outlives a boot; a state dir on disk restored after
/// a reboot has times in the future, which [`ControllerState::clamp_times`] brings back to now.
pub fn boot_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1000) + (ts.tv_nsec as u64) / 1_000_000
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
    order: Arc<Mutex<()>>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
    pub metrics: Metrics,
    /// Events that want a round soon, and the daemon's own cpuset.cpus writes (`trigger`).
    pub rounds: Arc<trigger::Hub>,
    /// Counts the books' changes (every one is checkpointed); the topology export waits on it.
    pub books: Arc<BooksChanged>,
    /// Orders checkpoint writes (see [`CheckpointWriter`]). Beside the state, not in it: no
    /// I/O is reachable through the state lock's guard.
    ckpt: Arc<CheckpointWriter>,
}

/// A count of the books' changes that a thread can wait on.
#[derive(Debug, Default)]
pub struct BooksChanged {
    count: Mutex<u64>,
    changed: std::sync::Condvar,
}

impl BooksChanged {
    pub fn bump(&self) {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.changed.notify_all();
    }

    pub fn count(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until the count is past `seen`, at most `timeout`.
    pub fn wait_past(&self, seen: u64, timeout: std::time::Duration) {
        let c = self.count.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.changed.wait_timeout_while(c, timeout, |c| *c <= seen);
    }
}

impl Daemon {
    pub fn new(shared: Shared, metrics: Metrics) -> Daemon {
        Daemon {
            inner: Arc::new(Mutex::new(shared)),
            order: Default::default(),
            stopping: Default::default(),
            metrics,
            rounds: Default::default(),
            books: Default::default(),
            ckpt: Default::default(),
        }
    }

    /// The daemon is stopping: a round under way applies no further move (see `apply`).
    pub fn request_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether [`Daemon::request_stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// The allocator's change lock: held by every change of the allocator (admission, release,
    /// hotplug replacement, a move's update of the books) for its whole call, I/O included, and
    /// always taken before [`Daemon::lock`]. It orders those changes and their cgroup writes;
    /// it never blocks a reader of the state.
    pub fn order(&self) -> MutexGuard<'_, ()> {
        self.order.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the checkpoint: the state copied under the state lock (with its generation),
    /// encoded and written (fsync, rename) outside it, so neither the encoding nor a slow disk
    /// holds up an admission, the watcher or the API (the NRI hook waited for a 200-pod
    /// encoding in the state lock: the bulk of its p99).
    pub fn checkpoint(&self) -> Result<(), CheckpointError> {
        let (dir, gen, state) = {
            let s = self.lock();
            let gen = self.ckpt.next_generation();
            (s.cfg.daemon.state_dir.clone(), gen, s.state.clone())
        };
        self.books.bump();
        let bytes = checkpoint::encode(&dir, &state)?;
        self.ckpt.write(&dir, gen, &bytes)
    }

    /// Locks the shared state. A panic in another holder does not make the state unusable:
    /// every mutation is all-or-nothing (see `Allocator::admit`), so the data is consistent.
    pub fn lock(&self) -> MutexGuard<'_, Shared> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

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
    /// The admitted pod's key in the books (`Allocator::pods`).
    pub pod_uid: crate::placement::key::AllocKey,
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
    /// Bindings whose container's cpuset is being written (an admission or a bind between its
    /// booking and its commit): the cgroup counts as bound (a second bind of it is refused) and
    /// the container as taken (no other cgroup is bound to it), but nothing is repaired or
    /// shrunk onto it until the commit makes it a binding.
    pub binding: BTreeMap<String, Binding>,
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
            binding: Default::default(),
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

    /// Writes the checkpoint: the state copied under the state lock (with its generation),
    /// encoded and written (fsync, rename) outside it, so neither the encoding nor a slow disk
    /// holds up an admission, the watcher or the API (the NRI hook waited for a 200-pod
    /// encoding in the state lock: the bulk of its p99).
    pub fn checkpoint(&self) -> Result<(), CheckpointError> {
        self.checkpoint_with(|_| {}).map(|_| ())
    }

    /// [`Daemon::checkpoint`] of the state as `edit` leaves a copy of it (a release not yet
    /// committed to the books: `Admission::release`). Returns the generation written.
    pub fn checkpoint_with(
        &self,
        edit: impl FnOnce(&mut Persisted),
    ) -> Result<u64, CheckpointError> {
        let (dir, gen, mut state) = {
            let s = self.lock();
            let gen = self.ckpt.next_generation();
            (s.cfg.daemon.state_dir.clone(), gen, s.state.clone())
        };
        edit(&mut state);
        self.books.bump();
        writer::io_edge();
        let bytes = checkpoint::encode(&dir, &state)?;
        self.ckpt.write(&dir, gen, &bytes)?;
        Ok(gen)
    }

    /// Whether a checkpoint generation was taken after `gen`.
    pub fn checkpointed_since(&self, gen: u64) -> bool {
        self.ckpt.next.load(Ordering::SeqCst) > gen
    }

    /// Locks the shared state. A panic in another holder does not make the state unusable:
    /// every mutation is all-or-nothing (see `Allocator::admit`), so the data is consistent.
    /// The guard is counted per thread while it lives: the effects path (`writer::io_edge`)
    /// refuses to run on a thread that holds one.
    pub fn lock(&self) -> StateGuard<'_> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        HELD.with(|h| h.set(h.get() + 1));
        StateGuard(g)
    }
}

thread_local! {
    /// State guards the thread holds now ([`Daemon::lock`]).
    static HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this thread holds the state lock now.
pub fn state_held() -> bool {
    HELD.with(|h| h.get() > 0)
}

/// The state lock's guard ([`Daemon::lock`]), counted per thread so I/O can check that no
/// guard is held (`writer::io_edge`).
pub struct StateGuard<'a>(MutexGuard<'a, Shared>);

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut Shared {
        &mut self.0
    }
}

//! The running daemon's shared state and its persistence: the topology, the validated config,
//! the admission allocator, which container cgroup is bound to which admitted container, and
//! the controller's memory and last decisions. The API, the watcher and the control loop share
//! one [`Shared`] behind a mutex (critical sections are short and never span an await),
//! locked only with the thread's [`Io`] token, which every effect needs: no I/O under the lock.
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
pub mod kubelet;
pub mod lock;
pub mod nri;
pub mod nri_updates;
pub mod reconcile;
pub mod run;
pub mod status;
pub mod watcher;
pub mod writer;

#[cfg(test)]
mod apply_tests;
#[cfg(test)]
mod books_tests;
#[cfg(test)]
pub(crate) mod fault_tests;

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

impl Persisted {
    /// Nothing booked: an empty allocator on `topo` under `cfg`'s placement settings.
    pub fn fresh(
        topo: &Topology,
        cfg: &Config,
    ) -> Result<Persisted, crate::placement::admission::PlacementError> {
        Ok(Persisted {
            allocator: Allocator::new(topo, &cfg.placement)?,
            bindings: Default::default(),
            controller: Default::default(),
            annotated: Default::default(),
        })
    }
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

    /// A round's observations: folded into the controller's state (returned with a copy of it,
    /// for the planner to run on outside the lock), and what they show beyond
    /// the books kept for admission (`overuse`), taken before the round's moves are booked so
    /// a workload moved off a node keeps its overuse there until the next round measures it.
    /// With load-aware admission off (`admission_load_periods` 0) there is no overuse to
    /// compute: it is cleared, so a reload that turns it off applies at the next round.
    pub fn observe(
        &mut self,
        obs: &crate::controller::Observations,
        cfg: &crate::config::ControllerConfig,
    ) -> (crate::controller::Scores, ControllerState) {
        let scores = (self.state.controller).observe_window(
            &self.topo,
            obs,
            crate::controller::EWMA_ALPHA,
            cfg.period_ms,
        );
        self.overuse = match cfg.admission_load_periods as usize {
            0 => Default::default(),
            n => (self.state.allocator)
                .overuse(&self.topo, &self.state.controller.lasting_pressure(n)),
        };
        (scores, self.state.controller.clone())
    }

    /// A fresh state: an empty allocator on `topo` under `cfg`'s placement settings.
    pub fn fresh(
        topo: Topology,
        cfg: Config,
    ) -> Result<Shared, crate::placement::admission::PlacementError> {
        let state = Persisted::fresh(&topo, &cfg)?;
        Ok(Shared::new(topo, cfg, state))
    }

    pub fn state_dir(&self) -> PathBuf {
        self.cfg.daemon.state_dir.clone()
    }
}

/// What a control round (`crate::rounds`) reads of the state and publishes to it.
impl Shared {
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// A round's inputs: the config, the topology and the reservations in force (see
    /// `Allocator::reconfigure`).
    pub fn round_inputs(&self) -> (Config, Topology, crate::cpuset::CpuSet) {
        let reserved = self.state.allocator.reserved_cpus.clone();
        (self.cfg.clone(), self.topo.clone(), reserved)
    }

    /// The rounds a cgroup's score has been kept for (None: no score yet).
    pub fn score_periods(&self, cg: &str) -> Option<u64> {
        self.state.controller.cgroups.get(cg).map(|c| c.periods)
    }

    /// CPUs or nodes went online or offline: `topo` read again replaces the topology.
    pub fn set_topology(&mut self, topo: Topology) {
        tracing::warn!(
            nodes_before = self.topo.nodes.len(),
            nodes = topo.nodes.len(),
            cpus_before = %self.topo.online_cpus(),
            cpus = %topo.online_cpus(),
            "CPUs or NUMA nodes went online/offline; topology rebuilt"
        );
        self.topo = topo;
    }

    /// A source's status for `status`, replacing the one of its name.
    pub fn set_source(&mut self, st: crate::ebpf::SourceStatus) {
        let name = Some(st.name.as_str());
        (self.sources).retain(|v| v.get("name").and_then(|n| n.as_str()) != name);
        if let Ok(v) = serde_json::to_value(&st) {
            self.sources.push(v);
        }
    }

    /// A round's decisions (for `explain`) and observations (for `top`).
    pub fn publish_round(&mut self, decisions: &[Decision], obs: crate::controller::Observations) {
        let by_cgroup = decisions.iter().map(|dc| (dc.cgroup.clone(), dc.clone()));
        self.decisions = by_cgroup.collect();
        self.last_obs = Some(obs);
    }

    /// Per node, the Memory Manager memory admitted Guaranteed containers were promised there and
    /// do not use (yet): their blocks' `taken` bytes minus what the round observed in their cgroups
    /// on that node (a container not observed counts as using none).
    pub fn promised_unused(&self, obs: &crate::controller::Observations) -> BTreeMap<u32, u64> {
        let used: BTreeMap<&str, &BTreeMap<u32, u64>> = obs
            .cgroups
            .iter()
            .map(|c| (c.id.as_str(), &c.mem_bytes_per_node))
            .collect();
        let mut out = BTreeMap::new();
        for cg in self.state.bindings.keys() {
            let Some(mem) = admission::bound_container(self, cg).and_then(|c| c.memory.as_ref())
            else {
                continue;
            };
            let mut promised: BTreeMap<u32, u64> = BTreeMap::new();
            for &(node, r, t) in &mem.taken {
                if r == crate::placement::memory::MemoryResource::Memory {
                    *promised.entry(node).or_default() += t;
                }
            }
            for (node, p) in promised {
                let u = used
                    .get(cg.as_str())
                    .and_then(|m| m.get(&node))
                    .copied()
                    .unwrap_or(0);
                *out.entry(node).or_default() += p.saturating_sub(u);
            }
        }
        out
    }

    /// Constraints of a cgroup bound to an admitted container (None when not bound).
    pub fn bound_constraints(&self, cg: &str) -> Option<crate::controller::Constraints> {
        if kubelet::pinned(self, cg) || annotations::pinned(self, cg) {
            // kubelet's static managers placed it, or its pod asks not to be moved: never moved
            return Some(crate::controller::Constraints {
                pinned: true,
                ..Default::default()
            });
        }
        if !self.state.bindings.contains_key(cg) {
            return None;
        }
        let mut c = crate::controller::Constraints::default();
        // Bound, its pod or container gone meanwhile: nothing promised.
        let Some(ac) = admission::bound_container(self, cg) else {
            return Some(c);
        };
        // none of its CPUs online: it runs on the shared pool meanwhile, as a shared one
        c.exclusive =
            ac.placement.exclusive && !reconcile::stranded(&ac.placement, &self.topo.online_cpus());
        c.exclusive_cpus = if c.exclusive {
            ac.placement.cpus.len() as u32
        } else {
            0
        };
        c.needs_hugepages = ac.memory.is_some();
        let affinity = || ac.placement.affinity.map(|m| m.to_cpuset());
        match self.cfg.placement.policy {
            crate::config::TopologyPolicy::SingleNumaNode => c.single_numa_node = true,
            crate::config::TopologyPolicy::Restricted => c.allowed_nodes = affinity(),
            _ => {}
        }
        if !ac.placement.devices.is_empty() {
            c.allowed_nodes = affinity();
        }
        // Memory Manager memory stays in its group (the nodes it was booked on).
        if let Some(mem) = &ac.memory {
            let group = mem.nodes.to_cpuset();
            c.allowed_nodes = Some(match c.allowed_nodes.take() {
                Some(a) => a.intersection(&group),
                None => group,
            });
        }
        Some(c)
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
    pub fn write(
        &self,
        _io: &Io,
        dir: &Path,
        gen: u64,
        bytes: &[u8],
    ) -> Result<(), CheckpointError> {
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
    pub rounds: Arc<crate::rounds::trigger::Hub>,
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
    pub fn checkpoint(&self, io: &mut Io) -> Result<(), CheckpointError> {
        self.checkpoint_with(io, |_| {}).map(|_| ())
    }

    /// [`Daemon::checkpoint`] of the state as `edit` leaves a copy of it (a release not yet
    /// committed to the books: `Admission::release`). Returns the generation written.
    pub fn checkpoint_with(
        &self,
        io: &mut Io,
        edit: impl FnOnce(&mut Persisted),
    ) -> Result<u64, CheckpointError> {
        let (dir, gen, mut state) = {
            let s = self.lock(io);
            let gen = self.ckpt.next_generation();
            (s.cfg.daemon.state_dir.clone(), gen, s.state.clone())
        };
        edit(&mut state);
        self.books.bump();
        let bytes = checkpoint::encode(&dir, &state)?;
        self.ckpt.write(io, &dir, gen, &bytes)?;
        Ok(gen)
    }

    /// Whether a checkpoint generation was taken after `gen`.
    pub fn checkpointed_since(&self, gen: u64) -> bool {
        self.ckpt.next.load(Ordering::SeqCst) > gen
    }

    /// Locks the shared state. A panic in another holder does not make the state unusable:
    /// every mutation is all-or-nothing (see `Allocator::admit`), so the data is consistent.
    /// The guard keeps `io` borrowed while it lives, so no effect (each takes `&Io`) compiles
    /// in its scope.
    pub fn lock<'a>(&'a self, _io: &'a mut Io) -> StateGuard<'a> {
        StateGuard(self.locked(), std::marker::PhantomData::<&'a mut Io>)
    }

    /// The state for a `Drop` body, which has no token to give (the undo of a booking dropped
    /// unsettled, a plugin thread's end): `f` sees the state only and does no I/O.
    pub(crate) fn in_drop(&self, f: impl FnOnce(&mut Shared)) {
        f(&mut self.locked())
    }

    fn locked(&self) -> MutexGuard<'_, Shared> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The capability to do I/O (a cgroupfs write, a runtime call, a page move, an fsync): every
/// effect takes `&Io`, and [`Daemon::lock`] takes `&mut Io` and keeps it borrowed for the
/// guard's lifetime, so an effect with the state lock held does not compile:
///
/// ```compile_fail,E0502
/// # fn f(d: &rebalancer::daemon::Daemon, sink: &dyn rebalancer::daemon::writer::CpusetWriter,
/// #      c: &rebalancer::daemon::writer::CpusetChange) {
/// let mut io = rebalancer::daemon::Io::new();
/// let guard = d.lock(&mut io);
/// let _ = sink.write(&io, c); // `io` is borrowed by the guard
/// drop(guard);
/// # }
/// ```
///
/// A token cannot leave its thread (`!Send`), and a thread has at most one at a time (making a
/// second one while the first lives panics), so none can be made afresh under a guard: tokens
/// are made where a thread starts its work (its entry point, a blocking task, a request
/// handler's synchronous part) and passed down.
pub struct Io(std::marker::PhantomData<*const ()>);

thread_local! {
    static TOKEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Io {
    /// This thread's token. Panics when the thread has one already.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Io {
        assert!(
            !TOKEN.with(|t| t.replace(true)),
            "a second I/O token on one thread"
        );
        Io(std::marker::PhantomData)
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        TOKEN.with(|t| t.set(false));
    }
}

/// The state lock's guard ([`Daemon::lock`]): holds the thread's [`Io`] borrowed.
pub struct StateGuard<'a>(MutexGuard<'a, Shared>, std::marker::PhantomData<&'a mut Io>);

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

#[cfg(test)]
mod io_tests {
    use super::Io;

    /// No token can be made while the thread's first lives, so none can be conjured under a
    /// guard that holds the first.
    #[test]
    #[should_panic(expected = "a second I/O token on one thread")]
    fn a_second_token_on_one_thread_panics() {
        let _first = Io::new();
        let _second = Io::new();
    }

    /// A dropped token leaves the thread free to make one again.
    #[test]
    fn a_token_can_be_made_again_once_the_first_is_dropped() {
        drop(Io::new());
        drop(Io::new());
    }
}

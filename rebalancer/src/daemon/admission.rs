//! The one admission service. Every door that admits a container — the API (`POST /v1/admit`),
//! the cgroup watcher (a new container cgroup), an NRI plugin (CreateContainer) — calls
//! [`Admission`], so the rules (validation, allocation, binding, rollback, checkpoint, metrics,
//! the shared pool's shrink) exist once.
//!
//! ```text
//! Admission::admit(AdmitRequest { pod, bind, durability, since }) -> Result<Admitted, AdmitError>
//! Admission::bind(cgroup, pod_uid, durability, since)  -> Result<Option<Admitted>, AdmitError>
//! Admission::release(uid, durability)                  -> Result<(), ReleaseError>
//! Admission::unbind(cgroup, durability)                -> Option<Binding>
//! Admission::replace_offline()                         -> usize
//! Admission::checkpoint() / request_checkpoint() / record_invalid()
//! ```
//!
//! - `admit` allocates `pod` (all-or-nothing, `Allocator::admit`). With `bind = Some(cgroup)`
//!   the container cgroup is bound to the pod's first container and its cpuset is written
//!   through the [`CpusetWriter`] (for NRI: the CreateContainer adjustment); a container that
//!   vanished meanwhile undoes the admission. When the admission made CPUs exclusive, every
//!   bound shared container still on them is moved off (kubelet's shared-pool shrink) through
//!   the same writer; [`Admitted::shrunk`] lists those changes. A rejected container that has a
//!   cgroup is fenced off other containers' exclusive CPUs ([`AdmitError::Rejected::fenced`]).
//! - `bind` binds a container cgroup to the next unbound container of a pod admitted earlier
//!   (through the API) and writes its cpuset; `Ok(None)` when the pod is unknown or has none.
//! - [`Durability::Durable`]: the change is checkpointed before `admit`/`release` return, and
//!   undone when that fails (the API acknowledges only what is on disk). [`Durability::Deferred`]:
//!   the caller checkpoints later (the watcher: once per batch of events, coalesced — what it
//!   admitted is rebuilt from the live cgroups by `reconcile` anyway).
//! - Dry-run: decisions and books as usual, no cpuset written.
//!
//! Locking: the state lock is held only to decide and to update the books, never across a
//! write, a read of cgroupfs or an fsync. Every change of the allocator holds a second lock,
//! [`Daemon::order`] (always taken before the state lock), for its whole call — writes and checkpoint
//! included — so admissions' writes happen in the order of their decisions (the shared pool a
//! later admission writes is computed after an earlier one's), and a failed checkpoint can be
//! undone exactly. A slow write or fsync delays the next admission, never the API's reads, the
//! control round or `/healthz`.

use std::{
    collections::BTreeMap,
    sync::{mpsc, Arc, MutexGuard, OnceLock},
    time::{Duration, Instant},
};

use super::{
    writer::{CpusetChange, CpusetWriter, WriteError},
    Binding, Daemon, Shared,
};
use crate::{
    checkpoint::CheckpointError,
    cpuset::CpuSet,
    placement::{
        cpu::CpuView,
        pod::{ContainerPlacement, Pod, Rejection},
    },
    serve::metrics::{ReasonLabel, ResultLabel},
};

/// Shortest time between two deferred checkpoints ([`Admission::request_checkpoint`]). Under
/// churn (hundreds of cgroups a second) one checkpoint covers many changes.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

/// When a change must be on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Checkpointed before the call returns; undone if that fails.
    Durable,
    /// The caller checkpoints later ([`Admission::request_checkpoint`] or
    /// [`Admission::checkpoint`]).
    Deferred,
}

/// One admission.
#[derive(Clone, Copy, Debug)]
pub struct AdmitRequest<'a> {
    pub pod: &'a Pod,
    /// The container cgroup to bind to the pod's first container and write, if there is one
    /// yet (the watcher, NRI); None for the API, whose pods are bound when their cgroups appear.
    pub bind: Option<&'a str>,
    pub durability: Durability,
    /// When the request arrived (for `rebalancer_admission_duration_seconds`).
    pub since: Instant,
}

/// What an admission decided and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    pub uid: String,
    pub placements: Vec<ContainerPlacement>,
    /// The cgroup bound and the pod's container it stands for.
    pub bound: Option<(String, String)>,
    /// Other containers' cpuset changes made (or, dry-run, not made) so that no shared
    /// container runs on CPUs this admission made exclusive.
    pub shrunk: Vec<CpusetChange>,
    pub micros: u128,
}

/// Why an admission did not happen. Nothing changed in the books.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("invalid pod: {0}")]
    Invalid(String),
    /// The allocator refused (kubelet-like reason). `fenced`: the cpus the container's cgroup
    /// was moved to because it overlapped other containers' exclusive CPUs.
    #[error("{rejection}")]
    Rejected {
        rejection: Rejection,
        fenced: Option<CpuSet>,
    },
    #[error("cgroup {0} is already bound")]
    AlreadyBound(String),
    #[error("container cgroup {0} vanished before its cpuset was written; admission undone")]
    Vanished(String),
    #[error("admission undone: {0}")]
    Checkpoint(#[source] CheckpointError),
}

/// Why a release did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("pod {0:?} is not admitted")]
    NotAdmitted(String),
    #[error("release undone: {0}")]
    Checkpoint(#[source] CheckpointError),
}

/// The admission service; cheap to clone (one per door).
#[derive(Clone)]
pub struct Admission {
    pub daemon: Daemon,
    writer: Arc<dyn CpusetWriter>,
    checkpointer: Arc<OnceLock<mpsc::Sender<()>>>,
}

impl Admission {
    pub fn new(daemon: Daemon, writer: Arc<dyn CpusetWriter>) -> Admission {
        Admission {
            daemon,
            writer,
            checkpointer: Default::default(),
        }
    }

    fn order(&self) -> MutexGuard<'_, ()> {
        self.daemon.order()
    }

    fn count(&self, result: &str) {
        self.daemon
            .metrics
            .admission_requests
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts a request refused before it reached the service (a body that is not a pod).
    pub fn record_invalid(&self) {
        self.count("invalid");
    }

    /// Admits `req.pod` (see the module doc).
    pub fn admit(&self, req: AdmitRequest<'_>) -> Result<Admitted, AdmitError> {
        let r = self.admit_inner(req);
        let m = &self.daemon.metrics;
        match &r {
            Ok(a) => {
                self.count("admitted");
                m.admission_duration.observe(a.micros as f64 / 1e6);
            }
            Err(AdmitError::Invalid(_)) => self.count("invalid"),
            Err(AdmitError::Rejected { rejection, .. }) => {
                self.count("rejected");
                m.admission_rejections
                    .get_or_create(&ReasonLabel {
                        reason: rejection.reason.to_string(),
                    })
                    .inc();
            }
            Err(AdmitError::Checkpoint(_)) => self.count("error"),
            Err(AdmitError::AlreadyBound(_) | AdmitError::Vanished(_)) => {}
        }
        r
    }

    fn admit_inner(&self, req: AdmitRequest<'_>) -> Result<Admitted, AdmitError> {
        let pod = req.pod;
        pod.validate().map_err(AdmitError::Invalid)?;
        let _order = self.order();
        let (placements, dry_run) = {
            let mut s = self.daemon.lock();
            if let Some(cg) = req.bind {
                if s.state.bindings.contains_key(cg) {
                    return Err(AdmitError::AlreadyBound(cg.into()));
                }
            }
            let sh = &mut *s;
            let dry_run = sh.cfg.daemon.dry_run;
            match sh.state.allocator.admit(&sh.topo, &sh.cfg.placement, pod) {
                Ok(p) => {
                    if let (Some(cg), Some(first)) = (req.bind, p.first()) {
                        sh.state.bindings.insert(
                            cg.into(),
                            Binding {
                                pod_uid: pod.uid.clone(),
                                container: first.container.clone(),
                            },
                        );
                    }
                    (p, dry_run)
                }
                Err(rejection) => {
                    let fence = match req.bind {
                        Some(cg) if !dry_run => Some((cg, exclusive_and_pool(sh))),
                        _ => None,
                    };
                    drop(s);
                    let fenced = fence.and_then(|(cg, (excl, pool))| self.fence(cg, &excl, &pool));
                    return Err(AdmitError::Rejected { rejection, fenced });
                }
            }
        };
        let bound = req
            .bind
            .zip(placements.first())
            .map(|(cg, p)| (cg.to_string(), p.container.clone()));
        if let (Some((cg, _)), Some(p), false) = (&bound, placements.first(), dry_run) {
            if let Err(WriteError::Vanished { .. }) = self.write_own(cg, p) {
                let mut s = self.daemon.lock();
                s.state.allocator.release(&pod.uid);
                s.state.bindings.remove(cg);
                return Err(AdmitError::Vanished(cg.clone()));
            }
        }
        let shrunk = if placements.iter().any(|p| p.exclusive) && bound.is_some() {
            self.shrink_locked_order(dry_run)
        } else {
            Vec::new()
        };
        if req.durability == Durability::Durable {
            if let Err(e) = self.daemon.checkpoint() {
                let mut s = self.daemon.lock();
                s.state.allocator.release(&pod.uid);
                if let Some((cg, _)) = &bound {
                    s.state.bindings.remove(cg);
                }
                tracing::error!(error = %e, uid = %pod.uid, "admission not checkpointed; undone");
                return Err(AdmitError::Checkpoint(e));
            }
        }
        Ok(Admitted {
            uid: pod.uid.clone(),
            placements,
            bound,
            shrunk,
            micros: req.since.elapsed().as_micros(),
        })
    }

    /// Binds `cgroup` to the next unbound container of pod `pod_uid` (admitted earlier, through
    /// the API) and writes its cpuset. `Ok(None)`: the pod is not admitted, or every container
    /// of it is bound already.
    pub fn bind(
        &self,
        cgroup: &str,
        pod_uid: &str,
        durability: Durability,
        since: Instant,
    ) -> Result<Option<Admitted>, AdmitError> {
        let _order = self.order();
        let (placement, dry_run) = {
            let mut s = self.daemon.lock();
            if s.state.bindings.contains_key(cgroup) {
                return Err(AdmitError::AlreadyBound(cgroup.into()));
            }
            let Some(pod) = s.state.allocator.pods.get(pod_uid) else {
                return Ok(None);
            };
            let bound: Vec<&str> = s
                .state
                .bindings
                .values()
                .filter(|b| b.pod_uid == pod_uid)
                .map(|b| b.container.as_str())
                .collect();
            let Some(c) = pod
                .containers
                .iter()
                .find(|c| !bound.contains(&c.placement.container.as_str()))
            else {
                return Ok(None);
            };
            let p = c.placement.clone();
            s.state.bindings.insert(
                cgroup.into(),
                Binding {
                    pod_uid: pod_uid.into(),
                    container: p.container.clone(),
                },
            );
            (p, s.cfg.daemon.dry_run)
        };
        if !dry_run {
            if let Err(WriteError::Vanished { .. }) = self.write_own(cgroup, &placement) {
                self.daemon.lock().state.bindings.remove(cgroup);
                return Err(AdmitError::Vanished(cgroup.into()));
            }
        }
        let shrunk = if placement.exclusive {
            self.shrink_locked_order(dry_run)
        } else {
            Vec::new()
        };
        if durability == Durability::Durable {
            if let Err(e) = self.daemon.checkpoint() {
                self.daemon.lock().state.bindings.remove(cgroup);
                return Err(AdmitError::Checkpoint(e));
            }
        }
        Ok(Some(Admitted {
            uid: pod_uid.into(),
            bound: Some((cgroup.into(), placement.container.clone())),
            placements: vec![placement],
            shrunk,
            micros: since.elapsed().as_micros(),
        }))
    }

    /// Releases pod `uid` and every binding to it.
    pub fn release(&self, uid: &str, durability: Durability) -> Result<(), ReleaseError> {
        let _order = self.order();
        let before = {
            let mut s = self.daemon.lock();
            let before = s.state.clone();
            if !s.state.allocator.release(uid) {
                return Err(ReleaseError::NotAdmitted(uid.into()));
            }
            s.state.bindings.retain(|_, b| b.pod_uid != uid);
            before
        };
        if durability == Durability::Durable {
            if let Err(e) = self.daemon.checkpoint() {
                let mut s = self.daemon.lock();
                // Undo only this release: no other allocator change happened meanwhile (they
                // all hold `order`); bindings made meanwhile stay.
                s.state.allocator = before.allocator;
                for (cg, b) in before.bindings.iter().filter(|(_, b)| b.pod_uid == uid) {
                    s.state.bindings.insert(cg.clone(), b.clone());
                }
                return Err(ReleaseError::Checkpoint(e));
            }
        }
        tracing::info!(%uid, "pod released");
        Ok(())
    }

    /// A container cgroup went away: its binding is dropped, and a pod the watcher admitted for
    /// it (uid `"<pod uid>/<container>"`) released; API pods are released by their DELETE.
    pub fn unbind(&self, cgroup: &str, durability: Durability) -> Option<Binding> {
        let _order = self.order();
        let b = {
            let mut s = self.daemon.lock();
            let b = s.state.bindings.remove(cgroup)?;
            if b.pod_uid.contains('/') {
                s.state.allocator.release(&b.pod_uid);
            }
            b
        };
        if durability == Durability::Durable {
            self.checkpoint_logged();
        }
        Some(b)
    }

    /// Exclusive CPUs that went offline are replaced (`Allocator::replace_offline`): each
    /// container's cgroup gets its new cpuset, and shared containers move off CPUs that just
    /// became exclusive. Returns how many placements were replaced. Checkpointed by the caller.
    pub fn replace_offline(&self) -> usize {
        let _order = self.order();
        let (writes, dry_run) = {
            let mut s = self.daemon.lock();
            let sh = &mut *s;
            let replaced = sh
                .state
                .allocator
                .replace_offline(&sh.topo, &sh.cfg.placement);
            let mut writes = Vec::new();
            for r in &replaced {
                if r.added.len() < r.lost.len() {
                    tracing::warn!(pod = %r.pod_uid, container = %r.container, lost = %r.lost, added = %r.added, cpus = %r.cpus,
                        "exclusive CPUs went offline and not all could be replaced");
                } else {
                    tracing::warn!(pod = %r.pod_uid, container = %r.container, lost = %r.lost, added = %r.added, cpus = %r.cpus,
                        "exclusive CPUs went offline; replaced");
                }
                if let Some((cg, _)) = sh
                    .state
                    .bindings
                    .iter()
                    .find(|(_, b)| b.pod_uid == r.pod_uid && b.container == r.container)
                {
                    writes.push(CpusetChange {
                        cgroup: cg.clone(),
                        cpus: r.cpus.clone(),
                        mems: None,
                    });
                }
            }
            if replaced.is_empty() {
                return 0;
            }
            (writes, sh.cfg.daemon.dry_run)
        };
        if !dry_run {
            for w in &writes {
                if let Err(e) = self.writer.write(w) {
                    tracing::warn!(cgroup = %w.cgroup, error = %e, "writing the replacement exclusive CPUs failed");
                }
            }
        }
        self.shrink_locked_order(dry_run);
        writes.len()
    }

    /// Writes the checkpoint now (encoded under the state lock, written outside it).
    pub fn checkpoint(&self) -> Result<(), CheckpointError> {
        self.daemon.checkpoint()
    }

    fn checkpoint_logged(&self) {
        if let Err(e) = self.daemon.checkpoint() {
            tracing::warn!(error = %e, "checkpoint after admission changes failed");
        }
    }

    /// Asks the checkpointer thread for a checkpoint soon: requests made while it writes are
    /// coalesced into its next write, at most one per [`CHECKPOINT_EVERY`]. Falls back to a
    /// checkpoint now when the thread cannot be started.
    pub fn request_checkpoint(&self) {
        let tx = self.checkpointer.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<()>();
            let me = self.clone_without_checkpointer();
            let spawned = std::thread::Builder::new()
                .name("checkpointer".into())
                .spawn(move || {
                    while rx.recv().is_ok() {
                        while rx.try_recv().is_ok() {}
                        me.checkpoint_logged();
                        std::thread::sleep(CHECKPOINT_EVERY);
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "checkpointer thread not started; checkpointing inline");
            }
            tx
        });
        if tx.send(()).is_err() {
            self.checkpoint_logged();
        }
    }

    /// A handle for the checkpointer thread itself (holding the sender would keep it alive).
    fn clone_without_checkpointer(&self) -> Admission {
        Admission {
            daemon: self.daemon.clone(),
            writer: self.writer.clone(),
            checkpointer: Default::default(),
        }
    }

    fn write_own(&self, cg: &str, p: &ContainerPlacement) -> Result<(), WriteError> {
        let r = self.writer.write(&CpusetChange {
            cgroup: cg.into(),
            cpus: p.cpus.clone(),
            mems: Some(p.mems.clone()),
        });
        match &r {
            Err(WriteError::Vanished { .. }) => {
                tracing::debug!(cgroup = %cg, "container cgroup vanished before its cpuset was written")
            }
            Err(e) => {
                tracing::warn!(cgroup = %cg, error = %e, "writing the admitted cpuset failed")
            }
            Ok(()) => {}
        }
        r
    }

    /// The shared-pool shrink. Call with `order` held: the books are read under the state
    /// lock, the containers' cpusets read and written without it.
    fn shrink_locked_order(&self, dry_run: bool) -> Vec<CpusetChange> {
        let (excl, shared) = {
            let s = self.daemon.lock();
            (s.state.allocator.exclusive_cpus(), shared_bound(&s))
        };
        let mut out = Vec::new();
        for (cg, pool) in shared {
            let Some(live) = self.writer.cpus(&cg) else {
                continue;
            };
            if live.is_disjoint(&excl) {
                continue;
            }
            let kept = live.difference(&excl);
            let cpus = if kept.is_empty() { pool } else { kept };
            if cpus.is_empty() {
                tracing::warn!(cgroup = %cg, "no CPU left outside the exclusive ones; cpuset left as it is");
                continue;
            }
            let change = CpusetChange {
                cgroup: cg,
                cpus,
                mems: None,
            };
            if !dry_run {
                match self.writer.write(&change) {
                    Ok(()) => {
                        tracing::info!(cgroup = %change.cgroup, cpus = %change.cpus, "shared container moved off newly exclusive CPUs")
                    }
                    Err(e) => {
                        tracing::warn!(cgroup = %change.cgroup, error = %e, "moving a shared container off exclusive CPUs failed");
                        continue;
                    }
                }
            }
            out.push(change);
        }
        out
    }

    /// A container we could not admit still never runs on another container's exclusive CPUs:
    /// when its cpuset overlaps them it gets the shared pool instead (unaccounted, as kubelet's
    /// shared pool would run it). Call with `order` held.
    fn fence(&self, cg: &str, excl: &CpuSet, pool: &CpuSet) -> Option<CpuSet> {
        let current = self.writer.cpus(cg)?;
        if current.is_disjoint(excl) || pool.is_empty() {
            return None;
        }
        match self.writer.write(&CpusetChange {
            cgroup: cg.into(),
            cpus: pool.clone(),
            mems: None,
        }) {
            Ok(()) => Some(pool.clone()),
            Err(e) => {
                tracing::warn!(cgroup = %cg, error = %e, "moving a rejected container off exclusive CPUs failed");
                None
            }
        }
    }
}

/// The exclusive CPUs and the shared pool now.
fn exclusive_and_pool(s: &Shared) -> (CpuSet, CpuSet) {
    (
        s.state.allocator.exclusive_cpus(),
        s.state.allocator.shared_pool(&CpuView::new(&s.topo)),
    )
}

/// Bound shared containers and their admission pools minus the exclusive CPUs.
fn shared_bound(s: &Shared) -> BTreeMap<String, CpuSet> {
    s.state
        .bindings
        .iter()
        .filter_map(|(cg, b)| {
            let exclusive = s.state.allocator.pods.get(&b.pod_uid).is_some_and(|p| {
                p.containers
                    .iter()
                    .any(|c| c.placement.container == b.container && c.placement.exclusive)
            });
            if exclusive {
                return None;
            }
            let pool = s.state.allocator.current_cpus(&b.pod_uid, &b.container)?;
            Some((cg.clone(), pool))
        })
        .collect()
}

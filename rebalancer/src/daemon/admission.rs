//! The one admission service. Every door that admits a container — the API (`POST /v1/admit`),
//! the cgroup watcher (a new container cgroup), an NRI plugin (CreateContainer) — calls
//! [`Admission`], so the rules (validation, allocation, binding, rollback, checkpoint, metrics,
//! the shared pool's shrink) exist once.
//!
//! ```text
//! Admission::admit(AdmitRequest { pod, bind, durability, since }) -> Result<Admitted, AdmitError>
//! Admission::admit_member(MemberRequest { member, bind, durability, since }) -> Result<Admitted, AdmitError>
//! Admission::admit_bound(pod, member, bind, durability, since) -> Result<Admitted, AdmitError>
//! Admission::pod_gone(pod_uid, durability)             -> bool
//! Admission::bind(cgroup, pod_uid, durability, since)  -> Result<Option<Admitted>, AdmitError>
//! Admission::release(uid, durability)                  -> Result<(), ReleaseError>
//! Admission::unbind(cgroup, durability)                -> Option<Binding>
//! Admission::resize(cgroup, container, durability)     -> Result<Option<ContainerPlacement>, AdmitError>
//! Admission::replace_offline()                         -> usize
//! Admission::request_checkpoint() / record_invalid()
//! ```
//!
//! - `admit` allocates `pod` (all-or-nothing, `Allocator::admit`). With `bind = Some(cgroup)`
//!   the container cgroup is bound to the pod's first container and its cpuset is written
//!   through the [`CpusetWriter`] (for NRI: the CreateContainer adjustment); a container that
//!   vanished meanwhile undoes the admission. When the admission made CPUs exclusive, every
//!   bound shared container still on them is moved off (kubelet's shared-pool shrink) through
//!   the same writer; [`Admitted::shrunk`] lists those changes. A rejected container that has a
//!   cgroup is fenced off other containers' exclusive CPUs ([`AdmitError::Rejected::fenced`]).
//! - `admit_member` admits one container of a pod whose containers arrive one at a time (the
//!   watcher and NRI under `placement.scope = "pod"`) within the pod's affinity, computed from
//!   the pod's totals at its first container and held for the containers still to come
//!   (`placement::hold`); `unbind` gives a gone container's share back to the pod's hold and
//!   `pod_gone` releases the pod (its cgroup or sandbox removed).
//! - `bind` binds a container cgroup to the next unbound container of a pod admitted earlier
//!   (through the API) and writes its cpuset; `Ok(None)` when the pod is unknown or has none.
//! - [`Durability::Durable`]: the change is checkpointed before `admit`/`release` return, and
//!   undone when that fails (the API acknowledges only what is on disk). [`Durability::Deferred`]:
//!   the caller checkpoints later (the watcher: once per batch of events, coalesced — what it
//!   admitted is rebuilt from the live cgroups by `reconcile` anyway).
//! - Dry-run: decisions and books as usual, no cpuset written.
//!
//! Locking (the change protocol, ARCHITECTURE.md): a change is planned and booked under the
//! state lock with no I/O (what it takes is booked; what it leaves stays held while its
//! writes run: a binding being written in `Shared::binding`, a resize's old CPUs in
//! `Allocator::in_flight`, a durable release's pod until its checkpoint is on disk), written
//! with no lock held, then committed or undone under the lock (a targeted undo: the pod
//! released, the member given back, the resized container's old record put back). There is no
//! second lock: a slow write or fsync delays only its own change, never another admission,
//! the API's reads, the control round or `/healthz`. Writes of the shared pool, fences and
//! repairs are planned again after they ran until the plan holds nothing new
//! ([`Admission::follow_pool`]), so a write made stale by a concurrent change is corrected by
//! the writer that made it.

use std::{
    collections::BTreeMap,
    sync::{mpsc, Arc, OnceLock},
    time::{Duration, Instant},
};

use super::{
    writer::{CpusetChange, CpusetWriter, WriteError},
    Binding, Daemon, Io, Shared,
};
use crate::{
    checkpoint::CheckpointError,
    cpuset::CpuSet,
    placement::{
        admission::{AdmittedContainer, PodMember},
        cpu::CpuView,
        key::AllocKey,
        memory::MemoryRequest,
        pod::{ContainerPlacement, Pod, Rejection},
    },
    serve::metrics::{count, ResultLabel},
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
    /// [`Daemon::checkpoint`]).
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

/// One container of a pod admitted one container at a time (pod scope in the watcher and
/// NRI): bound to its cgroup, written through the writer.
#[derive(Clone, Copy, Debug)]
pub struct MemberRequest<'a> {
    pub member: PodMember<'a>,
    pub bind: &'a str,
    pub durability: Durability,
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
    /// Writing the container's cpuset failed (not vanished): nothing kept, so the container
    /// holds no CPUs it never got.
    #[error("writing the cpuset of container cgroup {0} failed; admission undone")]
    WriteFailed(String),
    #[error("admission undone: {0}")]
    Checkpoint(#[source] CheckpointError),
    /// A resize refused while a move of the container's cgroup is under way: tried again at
    /// the container's next update.
    #[error("container cgroup {0} is being moved; resize it again once the move ended")]
    Moving(String),
    /// The pod was released while its container's cpuset was written: nothing bound, the
    /// container kept off the exclusive CPUs as one not admitted (`Shared::refused`).
    #[error("pod {0:?} was released while its container's cpuset was written; not bound")]
    Released(String),
    /// The caller's deadline passed before its change was booked: nothing was admitted.
    #[error(
        "the request's deadline passed while it waited for the allocator; nothing was admitted"
    )]
    DeadlinePassed,
}

/// Why a release did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("pod {0:?} is not admitted")]
    NotAdmitted(String),
    #[error("release undone: {0}")]
    Checkpoint(#[source] CheckpointError),
    /// The caller's deadline passed before its change was booked: nothing was released.
    #[error(
        "the request's deadline passed while it waited for the allocator; nothing was released"
    )]
    DeadlinePassed,
    /// Containers of the pod are bound and their cgroups live: they run on its CPUs.
    #[error("pod {uid:?} still has running containers bound to its CPUs ({}); release it once they are gone", cgroups.join(", "))]
    StillBound { uid: String, cgroups: Vec<String> },
}

/// The admission service; cheap to clone (one per door).
#[derive(Clone)]
pub struct Admission {
    pub daemon: Daemon,
    writer: Arc<dyn CpusetWriter>,
    checkpointer: Arc<OnceLock<mpsc::Sender<()>>>,
    /// Containers it admits already run ([`Admission::adopting`]).
    adopt: bool,
}

impl Admission {
    pub fn new(daemon: Daemon, writer: Arc<dyn CpusetWriter>) -> Admission {
        Admission {
            daemon,
            writer,
            checkpointer: Default::default(),
            adopt: false,
        }
    }

    /// The same service for containers that already run when the daemon first meets them
    /// (the start-up reconcile, NRI Synchronize): each keeps the exclusive CPUs it runs on
    /// where the books allow them (`Allocator::adopt_live_cpus`) and its memory where it is
    /// (see `adopt_as_it_runs`). A new container (the watcher's events, NRI CreateContainer)
    /// goes through the plain service and gets its placement as decided.
    pub fn adopting(&self) -> Admission {
        Admission {
            adopt: true,
            ..self.clone()
        }
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
    pub fn admit(&self, io: &mut Io, req: AdmitRequest<'_>) -> Result<Admitted, AdmitError> {
        self.admit_by(io, req, None)
    }

    /// As [`Admission::admit`], but refused with [`AdmitError::DeadlinePassed`], changing
    /// nothing, when the state lock is had only after `deadline`: a caller that has given up
    /// (the API's request timeout) never finds the pod admitted behind its back. Once past the
    /// check the admission runs to its end and its outcome is the answer.
    pub fn admit_by(
        &self,
        io: &mut Io,
        req: AdmitRequest<'_>,
        deadline: Option<Instant>,
    ) -> Result<Admitted, AdmitError> {
        self.observed(io, |io| {
            let pod = req.pod;
            pod.validate().map_err(AdmitError::Invalid)?;
            // `<pod uid>/<container>` is the key of the watcher's and NRI's single-container pods,
            // released when their container goes; the API's pods go with their DELETE only.
            if req.bind.is_none() && pod.uid.contains('/') {
                return Err(AdmitError::Invalid(format!(
                    "pod uid {:?}: '/' is reserved for the daemon's single-container pods",
                    pod.uid
                )));
            }
            let key = AllocKey::parse(&pod.uid);
            let (placements, dry_run) = self.book(
                io,
                req.bind,
                deadline,
                |sh| {
                    (sh.state.allocator).admit_keyed(
                        &sh.topo,
                        &sh.cfg.placement,
                        key.clone(),
                        pod,
                        &sh.overuse,
                    )
                },
                |sh, _| {
                    sh.state.allocator.release(&pod.uid);
                },
                |p| p.first().map(|first| binding(&pod.uid, first)),
            )?;
            let exclusive = placements.iter().any(|p| p.exclusive);
            self.commit(
                io,
                Booking {
                    uid: &pod.uid,
                    cg: req.bind,
                    placements,
                    dry_run,
                    exclusive,
                    durability: req.durability,
                    releases_pod: true,
                    adopts: true,
                    since: req.since,
                },
                &|s| {
                    s.state.allocator.release(&pod.uid);
                },
            )
        })
    }

    /// Admits one container of a pod under pod scope (see the module doc and
    /// `placement::hold`): the first container of the pod computes and holds the pod's
    /// affinity from `member.totals`, or refuses the pod; every container lands within it.
    pub fn admit_member(
        &self,
        io: &mut Io,
        req: MemberRequest<'_>,
    ) -> Result<Admitted, AdmitError> {
        self.observed(io, |io| {
            let uid = req.member.pod_uid;
            let cg = req.bind;
            let ((placement, _, first, exclusive_changed), dry_run) = self.book(
                io,
                Some(cg),
                None,
                |sh| {
                    let first = !sh.state.allocator.pods.contains_key(uid);
                    let before = sh.state.allocator.clone();
                    let p = (sh.state.allocator).admit_member_seeing(
                        &sh.topo,
                        &sh.cfg.placement,
                        req.member,
                        &sh.overuse,
                    )?;
                    // The pod's hold may have taken (or given back) exclusive CPUs besides the
                    // container's.
                    let changed = before.exclusive_cpus() != sh.state.allocator.exclusive_cpus();
                    Ok((p, before, first, changed))
                },
                |sh, (_, before, _, _)| sh.state.allocator = before,
                |(p, ..)| Some(binding(uid, p)),
            )?;
            self.commit(
                io,
                Booking {
                    uid,
                    cg: Some(cg),
                    placements: vec![placement],
                    dry_run,
                    exclusive: exclusive_changed,
                    durability: req.durability,
                    releases_pod: first,
                    adopts: true,
                    since: req.since,
                },
                &|s| undo_member(s, uid, &req.member.container.name, first),
            )
        })
    }

    /// A container bound to its cgroup `bind` as it arrives (the watcher, NRI): with `member`
    /// (`placement.scope = "pod"`) one container of its pod ([`Admission::admit_member`]),
    /// else `pod`, its single-container pod ([`Admission::admit`]).
    pub fn admit_bound(
        &self,
        io: &mut Io,
        pod: &Pod,
        member: Option<PodMember<'_>>,
        bind: &str,
        durability: Durability,
        since: Instant,
    ) -> Result<Admitted, AdmitError> {
        match member {
            Some(member) => self.admit_member(
                io,
                MemberRequest {
                    member,
                    bind,
                    durability,
                    since,
                },
            ),
            None => self.admit(
                io,
                AdmitRequest {
                    pod,
                    bind: Some(bind),
                    durability,
                    since,
                },
            ),
        }
    }

    /// A pod admitted one container at a time is gone (its pod cgroup removed, its sandbox
    /// removed): the pod, its hold and any binding left are released. `false` for a pod that
    /// holds nothing (unknown, or admitted whole through the API: released by its DELETE).
    pub fn pod_gone(&self, io: &mut Io, uid: &str, durability: Durability) -> bool {
        let held = self
            .daemon
            .lock(io)
            .state
            .allocator
            .pods
            .get(uid)
            .is_some_and(|p| p.hold.is_some());
        held && self.release_pod(io, uid, durability, None).is_ok()
    }

    /// Uids of the pods admitted one container at a time (they hold their pod's share).
    pub fn held_pods(&self, io: &mut Io) -> Vec<String> {
        let s = self.daemon.lock(io);
        s.state
            .allocator
            .pods
            .iter()
            .filter(|(_, p)| p.hold.is_some())
            .map(|(uid, _)| uid.to_string())
            .collect()
    }

    /// One admission's answer, its metrics counted.
    fn observed(
        &self,
        io: &mut Io,
        admit: impl FnOnce(&mut Io) -> Result<Admitted, AdmitError>,
    ) -> Result<Admitted, AdmitError> {
        let r = admit(io);
        let m = &self.daemon.metrics;
        match &r {
            Ok(a) => {
                self.count("admitted");
                m.admission_duration.observe(a.micros as f64 / 1e6);
                log_decisions(a);
            }
            Err(AdmitError::Invalid(_)) => self.count("invalid"),
            Err(AdmitError::Rejected { rejection, .. }) => {
                self.count("rejected");
                tracing::debug!(target: DECISION_TARGET, reason = %rejection, "admission refused");
                count(&m.admission_rejections, rejection.reason.to_string());
            }
            Err(AdmitError::Checkpoint(_)) => self.count("error"),
            Err(AdmitError::WriteFailed(_)) => self.count("write_failed"),
            Err(AdmitError::DeadlinePassed) => self.count("timeout"),
            Err(AdmitError::AlreadyBound(_) | AdmitError::Vanished(_)) => {}
            Err(AdmitError::Released(_)) => self.count("released"),
            Err(AdmitError::Moving(_)) => self.count("moving"),
        }
        r
    }

    /// Binds `cgroup` to the next unbound container of pod `pod_uid` (admitted earlier, through
    /// the API) and writes its cpuset. `Ok(None)`: the pod is not admitted, or every container
    /// of it is bound already.
    pub fn bind(
        &self,
        io: &mut Io,
        cgroup: &str,
        pod_uid: &str,
        durability: Durability,
        since: Instant,
    ) -> Result<Option<Admitted>, AdmitError> {
        // The pod's next container not bound, nor being bound. A pod admitted one container
        // at a time binds through `admit_member`.
        let next_unbound = |s: &mut Shared| {
            let pod = (s.state.allocator.pods.get(pod_uid)).filter(|p| p.hold.is_none())?;
            let bound: Vec<&str> = (s.state.bindings.values())
                .chain(s.binding.values())
                .filter(|b| b.pod_uid == pod_uid)
                .map(|b| b.container.as_str())
                .collect();
            let c = (pod.containers.iter())
                .find(|c| !bound.contains(&c.placement.container.as_str()))?;
            Some(c.placement.clone())
        };
        let (placement, dry_run) = self.book(
            io,
            Some(cgroup),
            None,
            |s| Ok(next_unbound(s)),
            |_, _| {},
            |p| p.as_ref().map(|p| binding(pod_uid, p)),
        )?;
        let Some(placement) = placement else {
            return Ok(None);
        };
        let booking = Booking {
            uid: pod_uid,
            cg: Some(cgroup),
            exclusive: placement.exclusive,
            placements: vec![placement],
            dry_run,
            durability,
            releases_pod: false,
            adopts: false,
            since,
        };
        self.commit(io, booking, &|_| {}).map(Some)
    }

    /// Releases pod `uid` and every binding to it.
    pub fn release(
        &self,
        io: &mut Io,
        uid: &str,
        durability: Durability,
    ) -> Result<(), ReleaseError> {
        self.release_pod(io, uid, durability, None)
    }

    /// The API's release (`DELETE /v1/pods/{uid}`): refused with
    /// [`ReleaseError::StillBound`] while containers of the pod are bound and their cgroups
    /// live (freeing the CPUs they run on would hand them to the next admission: an overlap),
    /// and with [`ReleaseError::DeadlinePassed`] when the state lock is had only after
    /// `deadline`. A binding whose cgroup is gone (the watcher not yet told) is dropped.
    pub fn release_unbound(
        &self,
        io: &mut Io,
        uid: &str,
        durability: Durability,
        deadline: Option<Instant>,
    ) -> Result<(), ReleaseError> {
        let (bound, binding) = {
            let s = self.daemon.lock(io);
            if deadline.is_some_and(|t| Instant::now() >= t) {
                return Err(ReleaseError::DeadlinePassed);
            }
            if !s.state.allocator.pods.contains_key(uid) {
                return Err(ReleaseError::NotAdmitted(uid.into()));
            }
            let of = |m: &BTreeMap<String, Binding>| -> Vec<String> {
                (m.iter())
                    .filter(|(_, b)| b.pod_uid == uid)
                    .map(|(cg, _)| cg.clone())
                    .collect()
            };
            (of(&s.state.bindings), of(&s.binding))
        };
        // Read outside the state lock (cgroupfs I/O); a container being bound now is live.
        let (dead, live): (Vec<String>, Vec<String>) =
            (bound.into_iter()).partition(|cg| self.writer.cpus(cg).is_none());
        let live: Vec<String> = live.into_iter().chain(binding).collect();
        if !live.is_empty() {
            return Err(ReleaseError::StillBound {
                uid: uid.into(),
                cgroups: live,
            });
        }
        self.release_pod(io, uid, durability, Some(&dead))
    }

    /// Releases pod `uid` and its bindings. Durable: the pod stays booked until a checkpoint
    /// without it is on disk (written from a copy of the state with the release made), so
    /// nothing it holds is handed out before the release is final, and a failed checkpoint
    /// leaves nothing to undo; then the release is committed to the books.
    ///
    /// `dead`: for [`Admission::release_unbound`], the bindings to the pod whose cgroups it
    /// found gone. Any other binding to the pod at the commit — a bind booked or committed
    /// while the cgroups were read or the checkpoint written — is a container running on the
    /// pod's CPUs: the release is refused ([`ReleaseError::StillBound`]) and the checkpoint
    /// holds the pod again.
    fn release_pod(
        &self,
        io: &mut Io,
        uid: &str,
        durability: Durability,
        dead: Option<&[String]>,
    ) -> Result<(), ReleaseError> {
        if !self.daemon.lock(io).state.allocator.pods.contains_key(uid) {
            return Err(ReleaseError::NotAdmitted(uid.into()));
        }
        let written = match durability {
            Durability::Durable => Some(
                (self.daemon)
                    .checkpoint_with(io, |st| {
                        st.allocator.release(uid);
                        st.bindings.retain(|_, b| b.pod_uid != uid);
                    })
                    .map_err(ReleaseError::Checkpoint)?,
            ),
            Durability::Deferred => None,
        };
        let (freed, dry_run) = {
            let mut s = self.daemon.lock(io);
            let excl = s.state.allocator.exclusive_cpus();
            let live: Vec<String> = match dead {
                Some(dead) => (s.state.bindings.iter())
                    .chain(s.binding.iter())
                    .filter(|(cg, b)| b.pod_uid == uid && !dead.contains(cg))
                    .map(|(cg, _)| cg.clone())
                    .collect(),
                None => Vec::new(),
            };
            if !live.is_empty() && s.state.allocator.pods.contains_key(uid) {
                drop(s);
                if written.is_some() {
                    self.checkpoint_logged(io);
                }
                return Err(ReleaseError::StillBound {
                    uid: uid.into(),
                    cgroups: live,
                });
            }
            // released by another caller meanwhile
            if !s.state.allocator.release(uid) {
                return Err(ReleaseError::NotAdmitted(uid.into()));
            }
            s.state.bindings.retain(|_, b| b.pod_uid != uid);
            (
                excl != s.state.allocator.exclusive_cpus(),
                s.cfg.daemon.dry_run,
            )
        };
        // a checkpoint taken between ours and the commit still holds the pod
        if written.is_some_and(|gen| self.daemon.checkpointed_since(gen)) {
            self.checkpoint_logged(io);
        }
        if freed {
            self.follow_pool(io, dry_run);
        }
        tracing::info!(%uid, "pod released");
        Ok(())
    }

    /// A container cgroup went away: its binding is dropped, a pod the watcher admitted for
    /// it (uid `"<pod uid>/<container>"`) released, and a container of a pod admitted one
    /// container at a time gives its share back to the pod's hold (the pod goes with
    /// [`Admission::pod_gone`]); API pods are released by their DELETE.
    pub fn unbind(&self, io: &mut Io, cgroup: &str, durability: Durability) -> Option<Binding> {
        let (b, freed, dry_run) = {
            let mut s = self.daemon.lock(io);
            let b = s.state.bindings.remove(cgroup)?;
            let excl = s.state.allocator.exclusive_cpus();
            undo_member(&mut s, &b.pod_uid, &b.container, b.pod_uid.is_container());
            let freed = excl != s.state.allocator.exclusive_cpus();
            (b, freed, s.cfg.daemon.dry_run)
        };
        // Checkpointed before the shared pool grows, as in `release`.
        if durability == Durability::Durable {
            self.checkpoint_logged(io);
        }
        if freed {
            self.follow_pool(io, dry_run);
        }
        Some(b)
    }

    /// A bound container's requests changed in place (a resize: NRI UpdateContainer, or the
    /// limits the watcher reads): its placement follows as `Allocator::resize` decides, or
    /// the resize is refused and nothing changes. A grow moves the shared containers off the
    /// CPUs it takes before its own cpuset is written; a shrink writes its own first, then the
    /// shared pool grows, so no CPU is ever both exclusive and shared. `Ok(None)`: the
    /// placement stays as it is. Refused with [`AdmitError::Moving`] while a move of the
    /// cgroup is under way (its settle would put back cpus booked before the resize); the
    /// cgroup counts as moving while the resize's write runs, so no move starts on it.
    pub fn resize(
        &self,
        io: &mut Io,
        cgroup: &str,
        new: &crate::placement::pod::Container,
        durability: Durability,
    ) -> Result<Option<ContainerPlacement>, AdmitError> {
        // Booked as an admission is (`book`; no cgroup to bind: this one is bound already).
        let (resized, dry_run) = self
            .book(
                io,
                None,
                None,
                |sh| match sh.state.bindings.get(cgroup).cloned() {
                    None => Ok(Err(AdmitError::Invalid(format!(
                        "container cgroup {cgroup} is not bound"
                    )))),
                    Some(_) if sh.moving.contains(cgroup) => {
                        Ok(Err(AdmitError::Moving(cgroup.into())))
                    }
                    Some(b) => book_resize(&self.daemon, sh, cgroup, &b, new).map(Ok),
                },
                |sh, r| {
                    if let Ok(Some((_, mut booked, _))) = r {
                        booked.settle_in(sh, false)
                    }
                },
                |_| None,
            )
            .inspect_err(|e| {
                if let AdmitError::Rejected { rejection, .. } = e {
                    let m = &self.daemon.metrics.admission_rejections;
                    count(m, rejection.reason.to_string());
                }
            })?;
        let Some((grew, booking, placement)) = resized? else {
            return Ok(None);
        };
        if grew {
            self.follow_pool(io, dry_run);
        }
        let written = self.write_own(io, cgroup, &placement, dry_run);
        booking.settle(io, written.is_ok());
        if written.is_err() {
            // the shared containers back to the pool the books say again
            self.follow_pool(io, dry_run);
            return written.map(|()| None);
        }
        if !grew {
            self.follow_pool(io, dry_run);
        }
        match durability {
            Durability::Durable => self.checkpoint_logged(io),
            Durability::Deferred => self.request_checkpoint(io),
        }
        self.daemon.rounds.wake(crate::rounds::trigger::Why::Placed);
        Ok(Some(placement))
    }

    /// Exclusive CPUs that went offline are replaced (`Allocator::replace_offline`): each
    /// container's cgroup gets its new cpuset, and shared containers move off CPUs that just
    /// became exclusive. Returns how many placements were replaced. Checkpointed by the caller.
    pub fn replace_offline(&self, io: &mut Io) -> usize {
        let (writes, dry_run) = {
            let mut s = self.daemon.lock(io);
            let sh = &mut *s;
            let replaced = sh
                .state
                .allocator
                .replace_offline(&sh.topo, &sh.cfg.placement);
            // What each now runs on, as the reconcile has it: one none of whose CPUs could be
            // replaced gets the shared pool meanwhile (`reconcile::booked`)
            let books = super::reconcile::booked(sh);
            let mut writes = Vec::new();
            for r in &replaced {
                let replaced_all = r.added.len() >= r.lost.len();
                tracing::warn!(pod = %r.pod_uid, container = %r.container, lost = %r.lost, added = %r.added, cpus = %r.cpus,
                    replaced_all, "exclusive CPUs went offline");
                let bound = (sh.state.bindings.iter())
                    .find(|(_, b)| b.pod_uid == r.pod_uid && b.container == r.container);
                let cpus = bound.and_then(|(cg, _)| {
                    match books.iter().find(|b| b.cgroup == *cg) {
                        Some(b) => Some(b.cpus.clone()),
                        // its move under way (`Shared::moving`): what it was given, if online
                        None => Some(r.cpus.intersection(&sh.topo.online_cpus()))
                            .filter(|c| !c.is_empty()),
                    }
                    .map(|cpus| (cg.clone(), cpus))
                });
                writes.extend(cpus.map(|(cgroup, cpus)| CpusetChange {
                    cgroup,
                    cpus,
                    mems: None,
                }));
            }
            if replaced.is_empty() {
                return 0;
            }
            (writes, sh.cfg.daemon.dry_run)
        };
        if !dry_run {
            for w in &writes {
                if let Err(e) = self.write_noted(io, w) {
                    tracing::warn!(cgroup = %w.cgroup, error = %e, "writing the replacement exclusive CPUs failed");
                }
            }
        }
        self.follow_pool(io, dry_run);
        writes.len()
    }

    /// Writes the checkpoint now; a failure is logged.
    pub(crate) fn checkpoint_logged(&self, io: &mut Io) {
        if let Err(e) = self.daemon.checkpoint(io) {
            tracing::warn!(error = %e, "checkpoint after admission changes failed");
        }
    }

    /// Asks the checkpointer thread for a checkpoint soon: requests made while it writes are
    /// coalesced into its next write, at most one per [`CHECKPOINT_EVERY`]. Falls back to a
    /// checkpoint now when the thread cannot be started.
    pub fn request_checkpoint(&self, io: &mut Io) {
        let tx = self.checkpointer.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<()>();
            // a handle of its own: holding the sender would keep the thread alive
            let me = Admission::new(self.daemon.clone(), self.writer.clone());
            // Dropped by a panic: the checkpointer shows dead in /healthz.
            let health = me.daemon.metrics.health.register("checkpointer", None);
            let spawned = std::thread::Builder::new()
                .name("checkpointer".into())
                .spawn(move || {
                    let io = &mut Io::new();
                    while rx.recv().is_ok() {
                        while rx.try_recv().is_ok() {}
                        me.checkpoint_logged(io);
                        std::thread::sleep(CHECKPOINT_EVERY);
                    }
                    // Every sender is gone (the daemon is stopping): not a failure.
                    health.stopped();
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "checkpointer thread not started; checkpointing inline");
            }
            tx
        });
        if tx.send(()).is_err() {
            self.checkpoint_logged(io);
        }
    }

    /// The booking half of an admission, under the state lock with no I/O: `cg` (the container
    /// to bind, if any) checked unbound, `admit` run on the books and undone (`undo`) when it
    /// leaves the containers we did not admit without a shared CPU, and `cg` booked as being
    /// bound (`Shared::binding`) to the container `bound_to` names. A rejection fences `cg` off
    /// the exclusive CPUs. Returns what `admit` gave and whether this is a dry run.
    fn book<T>(
        &self,
        io: &mut Io,
        cg: Option<&str>,
        deadline: Option<Instant>,
        admit: impl FnOnce(&mut Shared) -> Result<T, Rejection>,
        undo: impl FnOnce(&mut Shared, T),
        bound_to: impl FnOnce(&T) -> Option<Binding>,
    ) -> Result<(T, bool), AdmitError> {
        let mut s = self.daemon.lock(io);
        if deadline.is_some_and(|t| Instant::now() >= t) {
            return Err(AdmitError::DeadlinePassed);
        }
        // bound, or being bound (its cpuset written under a booking)
        if let Some(cg) =
            cg.filter(|cg| s.state.bindings.contains_key(*cg) || s.binding.contains_key(*cg))
        {
            return Err(AdmitError::AlreadyBound(cg.into()));
        }
        let sh = &mut *s;
        let dry_run = sh.cfg.daemon.dry_run;
        let had_pool = !(sh.refused.is_empty() && sh.fenced.is_empty()) && shared_pool_left(sh);
        let r = admit(sh).and_then(|t| match leaves_unadmitted_no_cpu(sh, had_pool) {
            None => Ok(t),
            Some(rejection) => {
                undo(sh, t);
                Err(rejection)
            }
        });
        match r {
            Ok(t) => {
                if let Some((cg, b)) = cg.zip(bound_to(&t)) {
                    sh.binding.insert(cg.into(), b);
                }
                Ok((t, dry_run))
            }
            Err(rejection) => {
                let fence = cg
                    .filter(|_| !dry_run)
                    .map(|cg| (cg, exclusive_and_pool(sh)));
                drop(s);
                let fenced = fence.and_then(|(cg, (excl, pool))| self.fence(io, cg, &excl, &pool));
                Err(AdmitError::Rejected { rejection, fenced })
            }
        }
    }

    /// The one sequence after an admission, a member's admission or a bind is booked (under
    /// the state lock, its cgroup in `Shared::binding`): the container adopted as it runs,
    /// written and bound ([`Admission::write_and_bind`]), the shared pool following when the
    /// exclusive CPUs changed, the books checkpointed when durable, and a round woken for the
    /// new container. A failed write or checkpoint gives the booking back (`give_back`); a
    /// failed checkpoint of a booking that made its pod (`releases_pod`) also drops the
    /// bindings to that pod made meanwhile (`refuse_bindings_of`). Returns the answer.
    fn commit(
        &self,
        io: &mut Io,
        mut b: Booking<'_>,
        give_back: &dyn Fn(&mut Shared),
    ) -> Result<Admitted, AdmitError> {
        if let Some((cg, p)) = b.cg.zip(b.placements.first_mut()) {
            if b.adopts {
                self.adopt_as_it_runs(io, cg, b.uid, p);
            }
            if let Err(e) = self.write_and_bind(io, cg, b.uid, p, b.dry_run) {
                give_back(&mut self.daemon.lock(io));
                return Err(e);
            }
        }
        let bound = b.cg.is_some();
        let shrunk = if b.exclusive && bound {
            self.follow_pool(io, b.dry_run)
        } else {
            Vec::new()
        };
        if b.durability == Durability::Durable {
            if let Err(e) = self.daemon.checkpoint(io) {
                let others = {
                    let mut s = self.daemon.lock(io);
                    if let Some(cg) = b.cg {
                        s.state.bindings.remove(cg);
                    }
                    give_back(&mut s);
                    b.releases_pod && refuse_bindings_of(&mut s, b.uid, None, b.dry_run)
                };
                if (b.exclusive && bound) || others {
                    self.follow_pool(io, b.dry_run);
                }
                tracing::error!(error = %e, uid = %b.uid, "admission not checkpointed; undone");
                return Err(AdmitError::Checkpoint(e));
            }
        }
        if bound {
            // A new container placed: a round soon sees it (`trigger`).
            self.daemon.rounds.wake(crate::rounds::trigger::Why::Placed);
        }
        Ok(Admitted {
            uid: b.uid.into(),
            bound: (b.cg.zip(b.placements.first())).map(|(cg, p)| (cg.into(), p.container.clone())),
            placements: b.placements,
            shrunk,
            micros: b.since.elapsed().as_micros(),
        })
    }

    /// Writes container `cg`'s cpuset (unless `dry_run`), then commits its binding (booked by
    /// the caller in `Shared::binding`, which keeps a second bind of it out meanwhile): bound
    /// only once written, so `status` never shows a binding whose cgroup still has the
    /// runtime's cpuset. On an error nothing is bound; the caller undoes its allocation. A pod
    /// released while the cpuset was written is not bound to: the container, written onto CPUs
    /// the books no longer hold for it, is fenced as one refused ([`AdmitError::Released`]).
    fn write_and_bind(
        &self,
        io: &mut Io,
        cg: &str,
        uid: &str,
        p: &ContainerPlacement,
        dry_run: bool,
    ) -> Result<(), AdmitError> {
        let mut booked = BindingBooked {
            d: &self.daemon,
            cgroup: cg,
            settled: false,
        };
        let written = self.write_own(io, cg, p, dry_run);
        let mut s = self.daemon.lock(io);
        s.binding.remove(cg);
        booked.settled = true;
        written?;
        if !s.state.allocator.pods.contains_key(uid) {
            let fence = (!dry_run).then(|| {
                s.refused.insert(cg.into());
                exclusive_and_pool(&s)
            });
            drop(s);
            if let Some((excl, pool)) = fence {
                self.fence(io, cg, &excl, &pool);
            }
            tracing::warn!(cgroup = %cg, %uid, "pod released while its container's cpuset was written; not bound, fenced as a refused container");
            return Err(AdmitError::Released(uid.into()));
        }
        s.state.bindings.insert(cg.into(), binding(uid, p));
        Ok(())
    }

    /// Adoption of a container that already runs (only through [`Admission::adopting`]): an
    /// exclusive one keeps the CPUs it runs on where the books allow them
    /// (`Allocator::adopt_live_cpus`), and its placement's mems are widened by the nodes its
    /// memory may be on now (`CpusetWriter::memory_nodes`: its effective mems and what
    /// `memory.numa_stat` shows), in the books too, instead of narrowed in the write — the
    /// kernel migrates a cgroup's memory inside a mems write that narrows it (v2; v1 with
    /// memory_migrate), one container after another, outside `migration_budget_mib`, with
    /// admissions waiting behind it (every cpuset write waits for the queued migrations). Narrowing is left to the control rounds, which move
    /// memory within the budget. Reads cgroupfs with no lock held; the books are changed under the
    /// state lock, checked against them as they are then (another admission may have come between).
    fn adopt_as_it_runs(&self, io: &mut Io, cg: &str, uid: &str, p: &mut ContainerPlacement) {
        if !self.adopt {
            return;
        }
        let live = (p.exclusive).then(|| self.writer.cpus(cg)).flatten();
        let nodes = self.writer.memory_nodes(cg);
        let mut s = self.daemon.lock(io);
        let sh = &mut *s;
        if let Some(live) = live {
            let (topo, cfg) = (&sh.topo, &sh.cfg.placement);
            if let Some(cpus) =
                (sh.state.allocator).adopt_live_cpus(topo, cfg, uid, &p.container, &live)
            {
                tracing::info!(cgroup = %cg, placed = %p.cpus, cpus = %cpus, "running container adopted on the exclusive CPUs it runs on");
                p.cpus = cpus;
            }
        }
        let Some(nodes) = nodes else {
            return;
        };
        let wide = p.mems.union(&nodes);
        if wide == p.mems {
            return;
        }
        tracing::info!(cgroup = %cg, placed = %p.mems, memory_on = %nodes, mems = %wide, "running container adopted with its memory where it is; control rounds narrow its mems within the migration budget");
        // the mems only: its Memory Manager booking stays on the placement's nodes (booked
        // over both, they would become one NUMA group and pull later pods' memory across)
        let booked = (sh.state.allocator.pods.get_mut(uid)).and_then(|pod| {
            pod.containers
                .iter_mut()
                .find(|c| c.placement.container == p.container)
        });
        if let Some(c) = booked {
            c.placement.mems = wide.clone();
        }
        p.mems = wide;
    }

    /// Every cpuset write of the service: noted as the daemon's own first, so the round
    /// trigger does not take it for an operator's change (`trigger`).
    fn write_noted(&self, io: &mut Io, c: &CpusetChange) -> Result<(), WriteError> {
        super::writer::apply(io, &*self.writer, &self.daemon.rounds, c)
    }

    /// Writes container `cg`'s placement (nothing in a dry run).
    fn write_own(
        &self,
        io: &mut Io,
        cg: &str,
        p: &ContainerPlacement,
        dry_run: bool,
    ) -> Result<(), AdmitError> {
        if dry_run {
            return Ok(());
        }
        let change = CpusetChange {
            cgroup: cg.into(),
            cpus: p.cpus.clone(),
            mems: Some(p.mems.clone()),
        };
        self.write_noted(io, &change).map_err(|e| match e {
            WriteError::Vanished { .. } => {
                tracing::debug!(cgroup = %cg, "container cgroup vanished before its cpuset was written");
                AdmitError::Vanished(cg.into())
            }
            e => {
                tracing::warn!(cgroup = %cg, error = %e, "writing the admitted cpuset failed");
                AdmitError::WriteFailed(cg.into())
            }
        })
    }

    /// kubelet's state files again when they changed since last read (a cheap `stat`; read
    /// and parsed with no lock held, installed under the state lock), and, when an
    /// install (this one, the start's or a reload's) changed the exclusive CPUs, the shared
    /// containers set to their pools. Called at every CreateContainer hook and control round.
    /// Whether shared containers were set to their pools.
    pub fn refresh_kubelet(&self, io: &mut Io) -> bool {
        let (dir, pending) = {
            let s = self.daemon.lock(io);
            (
                s.cfg.kubernetes.kubelet_state_dir.clone(),
                s.kubelet.shrink_pending,
            )
        };
        let now = super::kubelet::stamp(&dir);
        let changed = super::kubelet::changed(&self.daemon.lock(io).kubelet, &dir, &now);
        if !changed && !pending {
            return false;
        }
        let files = changed.then(|| super::kubelet::read_files(&dir));
        let (shrink, dry_run) = {
            let mut s = self.daemon.lock(io);
            if let Some(files) = files {
                // unless a reload changed the directory meanwhile (and read it)
                if s.cfg.kubernetes.kubelet_state_dir == dir {
                    super::kubelet::install_files(&mut s, files, &self.daemon.metrics);
                }
            }
            (
                std::mem::take(&mut s.kubelet.shrink_pending),
                s.cfg.daemon.dry_run,
            )
        };
        if shrink {
            tracing::info!(
                "kubelet's exclusive CPUs changed: shared containers set to their pools"
            );
            self.follow_pool(io, dry_run);
        }
        shrink
    }

    /// The shared pool follows the books through the service's writer ([`follow_pool`]).
    pub(super) fn follow_pool(&self, io: &mut Io, dry_run: bool) -> Vec<CpusetChange> {
        let read = |a: &&Admission, cg: &str| a.writer.cpus(cg);
        let d = &self.daemon;
        follow_pool(io, d, &mut &*self, dry_run, read, |io, a, c| {
            a.write_noted(io, c)
        })
    }

    /// Every bound container that runs elsewhere than the books say (`seen`: what cgroupfs
    /// and the runtime report; `daemon::reconcile`) set back to its booked cpuset: compared
    /// with the books under the state lock, written with none, and compared again until
    /// nothing this call has not written differs (as [`Admission::follow_pool`]). The
    /// changes written; none in a dry run.
    pub fn repair(
        &self,
        io: &mut Io,
        seen: impl Fn(&str) -> Option<super::reconcile::Seen>,
    ) -> Vec<CpusetChange> {
        let mut out = Vec::new();
        let mut tried: Vec<CpusetChange> = Vec::new();
        for _ in 0..FOLLOW_PASSES {
            let books = {
                let s = self.daemon.lock(io);
                if s.cfg.daemon.dry_run {
                    return out;
                }
                super::reconcile::booked(&s)
            };
            let todo: Vec<CpusetChange> = (super::reconcile::repairs(&books, &seen).into_iter())
                .filter(|c| !tried.contains(c))
                .collect();
            if todo.is_empty() {
                break;
            }
            for change in todo {
                tried.push(change.clone());
                match self.write_noted(io, &change) {
                    Ok(()) => {
                        tracing::warn!(cgroup = %change.cgroup, cpus = %change.cpus, mems = ?change.mems, "container ran elsewhere than booked; set back to its booked cpuset");
                        self.daemon.metrics.books_repairs.inc();
                        out.push(change);
                    }
                    Err(super::writer::WriteError::Vanished { .. }) => {}
                    Err(e) => {
                        tracing::warn!(cgroup = %change.cgroup, error = %e, "setting a container back to its booked cpuset failed (tried again every round)")
                    }
                }
            }
        }
        out
    }

    /// A kubelet pod's container, as the watcher sees it (it cannot tell which container a
    /// cgroup is): its cpus fenced off the exclusive CPUs but the pod's own kubelet CPUs
    /// (`fence_of`, `fence_cpus`: a container kubelet gave CPUs is within those, no write), its mems
    /// left to kubelet; not booked (kubelet booked its memory) but remembered in
    /// `Shared::fenced`, so the exclusive CPUs admitted later are fenced off it too
    /// (`shared_changes`). The cpus written, if any.
    pub fn fence_unassigned(&self, io: &mut Io, cg: &str, pod_uid: &str) -> Option<CpuSet> {
        let (excl, pool) = {
            let mut s = self.daemon.lock(io);
            if s.cfg.daemon.dry_run {
                return None;
            }
            s.fenced.insert(cg.into(), pod_uid.into());
            fence_of(&s, pod_uid)
        };
        // The runtime writes the container's cpuset after this: a round soon
        // fences it again (`refence`), at the latest the next period's.
        self.daemon.rounds.wake(crate::rounds::trigger::Why::Placed);
        let cpus = fence_cpus(&self.writer.cpus(cg)?, &excl, &pool)?;
        self.write_cpus(
            io,
            cg,
            cpus,
            "fencing a kubelet pod's container off the exclusive CPUs",
        )
    }

    /// kubelet's containers without kubelet CPUs fenced again as they are now: the
    /// watcher fences one at mkdir, but the runtime writes the spec's cpuset after that (and on
    /// cgroup v1 a fresh cpuset cgroup is empty until the runtime copies its parent's into it,
    /// so the fence at mkdir has nothing to fence). Each control round calls this, so such a
    /// write is undone within one period. The changes written.
    ///
    /// The fences are planned from the books and the live cpusets, read with no lock held, and
    /// written with none; a fence stale by an admission meanwhile is that admission's to
    /// correct (`follow_pool` plans the fenced containers too).
    pub fn refence(&self, io: &mut Io) -> Vec<CpusetChange> {
        let mut out = self.repair(io, |cg| {
            self.writer.cpus(cg).map(super::reconcile::Seen::cgroupfs)
        });
        let (shrink_failed, dry_run, nothing_fenced) = {
            let s = self.daemon.lock(io);
            let nothing_fenced = s.fenced.is_empty() && s.refused.is_empty();
            (s.shrink_failures > 0, s.cfg.daemon.dry_run, nothing_fenced)
        };
        // A failed write of an earlier attempt to set the shared containers to their pool
        // (`Shared::shrink_failures`): they may still run on another's exclusive CPUs.
        if shrink_failed && !dry_run {
            let reshrunk = self.follow_pool(io, false);
            if !reshrunk.is_empty() {
                out.extend(reshrunk);
                return out;
            }
        }
        if nothing_fenced || dry_run {
            return out;
        }
        let live = |cg: &str| self.writer.cpus(cg);
        let wanted = fenced_changes(io, &self.daemon, &live);
        // a cgroup fenced as it should be (whoever fixed it) starts its failure count afresh
        (self.daemon.lock(io).fence_failures)
            .retain(|cg, _| wanted.iter().any(|c| c.cgroup == *cg));
        // a reload may have turned dry-run on while the plan was read
        if wanted.is_empty() || self.daemon.lock(io).cfg.daemon.dry_run {
            return out;
        }
        for change in wanted {
            match self.write_noted(io, &change) {
                Ok(()) => {
                    self.daemon.lock(io).fence_failures.remove(&change.cgroup);
                    tracing::info!(cgroup = %change.cgroup, cpus = %change.cpus, "unaccounted container (kubelet's without kubelet CPUs, or not admitted) fenced off the exclusive CPUs again");
                    out.push(change);
                }
                Err(e) => {
                    let n = {
                        let mut s = self.daemon.lock(io);
                        let n = s.fence_failures.entry(change.cgroup.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    if n.is_power_of_two() {
                        tracing::warn!(cgroup = %change.cgroup, error = %e, failures = n, "fencing a kubelet pod's container off the exclusive CPUs failed (retried every round; logged at the 1st, 2nd, 4th, ... failure)");
                    } else {
                        tracing::debug!(cgroup = %change.cgroup, error = %e, failures = n, "fencing a kubelet pod's container off the exclusive CPUs failed again");
                    }
                }
            }
        }
        out
    }

    /// A container we could not admit still never runs on another container's exclusive CPUs:
    /// when its cpuset overlaps them it gets the shared pool instead (unaccounted, as kubelet's
    /// shared pool would run it).
    fn fence(&self, io: &mut Io, cg: &str, excl: &CpuSet, pool: &CpuSet) -> Option<CpuSet> {
        let current = self.writer.cpus(cg)?;
        if current.is_disjoint(excl) || pool.is_empty() {
            return None;
        }
        self.write_cpus(
            io,
            cg,
            pool.clone(),
            "moving a rejected container off exclusive CPUs",
        )
    }

    /// Writes `cg`'s cpus alone; a failure is logged as `what` failed. The cpus written.
    fn write_cpus(&self, io: &mut Io, cg: &str, cpus: CpuSet, what: &str) -> Option<CpuSet> {
        let change = CpusetChange {
            cgroup: cg.into(),
            cpus,
            mems: None,
        };
        match self.write_noted(io, &change) {
            Ok(()) => Some(change.cpus),
            Err(e) => {
                tracing::warn!(cgroup = %cg, error = %e, "{what} failed");
                None
            }
        }
    }
}

/// A resize of `b`'s container booked, under the state lock (`Allocator::resize`): the
/// exclusive CPUs it leaves or takes stay exclusive while its cpuset is written (no admission
/// hands them out, no shared container is set onto them), the memory a shrink frees is held
/// (an undo books it again in full), and the cgroup counts as moving. `Ok(None)`: the
/// placement stays as it is. Else whether the exclusive CPUs grew, the booking, the placement.
fn book_resize(
    d: &Daemon,
    sh: &mut Shared,
    cg: &str,
    b: &Binding,
    new: &crate::placement::pod::Container,
) -> Result<Option<(bool, ResizeBooked, ContainerPlacement)>, Rejection> {
    let key = format!("resize {cg}");
    let excl_before = sh.state.allocator.exclusive_cpus();
    let before_pod = sh.state.allocator.pods.get(&b.pod_uid).cloned();
    let (topo, cfg) = (&sh.topo, &sh.cfg.placement);
    let placement = (sh.state.allocator).resize(topo, cfg, &b.pod_uid, &b.container, new)?;
    let before_c = (before_pod.iter().flat_map(|p| &p.containers))
        .find(|c| c.placement.container == b.container);
    let old = before_c.map(|c| &c.placement);
    if old == Some(&placement) {
        return Ok(None);
    }
    let grew = !(sh.state.allocator.exclusive_cpus()).is_subset(&excl_before);
    let exclusive_of = |p: &ContainerPlacement| {
        if p.exclusive {
            p.cpus.clone()
        } else {
            CpuSet::new()
        }
    };
    let held = (old.map(exclusive_of).unwrap_or_default()).union(&exclusive_of(&placement));
    if !held.is_empty() {
        sh.state.allocator.in_flight.insert(key.clone(), held);
    }
    if let Some(before_pod) = &before_pod {
        (sh.state.allocator).hold_freed_memory(&key, &b.pod_uid, before_pod);
    }
    sh.moving.insert(cg.into());
    let before = (before_pod.as_ref().zip(before_c))
        .map(|(p, c)| (c.clone(), (p.cpu_request_millis, p.memory_request.clone())));
    let booked = ResizeBooked {
        d: d.clone(),
        settled: false,
        cgroup: cg.into(),
        key,
        uid: b.pod_uid.to_string(),
        before,
    };
    Ok(Some((grew, booked, placement)))
}

/// Passes of [`follow_pool`] and [`Admission::repair`]: each plans again from the
/// books and writes only what it has not written yet, so the passes end well before this
/// unless other changes keep landing; what is left is the next round's.
const FOLLOW_PASSES: usize = 4;

/// The binding of a cgroup to `uid`'s container placed as `p`.
fn binding(uid: &str, p: &ContainerPlacement) -> Binding {
    Binding {
        pod_uid: uid.into(),
        container: p.container.clone(),
    }
}

/// A booked admission, member admission or bind, for [`Admission::commit`].
struct Booking<'a> {
    uid: &'a str,
    /// The container's cgroup, when one is bound (to the first placement).
    cg: Option<&'a str>,
    placements: Vec<ContainerPlacement>,
    dry_run: bool,
    /// Whether the booking changed the exclusive CPUs.
    exclusive: bool,
    durability: Durability,
    /// Whether undoing it releases its pod (an admission that made the pod).
    releases_pod: bool,
    /// Whether a running container is adopted as it runs (`adopt_as_it_runs`): an admission's
    /// own booking, which its undo gives back whole. A bind to an API pod does not adopt: its
    /// undo gives nothing back, so an adoption's changes to the pod would stay in the books.
    adopts: bool,
    /// When the request arrived.
    since: Instant,
}

/// An undone admission released pod `uid`: the bindings to it (but `own`, the undone change's
/// own cgroup) were made meanwhile, while it was not yet durable. They are dropped and their
/// containers, written onto CPUs the books no longer hold for them, kept off the exclusive CPUs
/// as refused ones (`Shared::refused`). Whether there were any.
fn refuse_bindings_of(s: &mut Shared, uid: &str, own: Option<&str>, dry_run: bool) -> bool {
    let others: Vec<String> = (s.state.bindings.iter())
        .filter(|(cg, b)| b.pod_uid == uid && Some(cg.as_str()) != own)
        .map(|(cg, _)| cg.clone())
        .collect();
    s.state.bindings.retain(|_, b| b.pod_uid != uid);
    for cg in &others {
        tracing::warn!(cgroup = %cg, %uid, "bound while its pod's admission was not yet checkpointed; the admission undone, the container fenced as a refused one");
        if !dry_run {
            s.refused.insert(cg.clone());
        }
    }
    !others.is_empty()
}

/// Undoes the admission of member `container` of pod `uid`: the pod released when this
/// admission made it or it is the container's own (`first`), else the member's share given
/// back to the pod's hold.
fn undo_member(s: &mut Shared, uid: &str, container: &str, first: bool) {
    if first {
        s.state.allocator.release(uid);
    } else {
        let sh = &mut *s;
        (sh.state.allocator).remove_member(&sh.topo, &sh.cfg.placement, uid, container);
    }
}

/// The shared pool follows the books (see [`shared_changes`]), through `w` (`read`, `write`):
/// planned from the books and what `w` reads, written with no lock held, and planned again
/// until the plan holds nothing this call has not written (at most [`FOLLOW_PASSES`]).
/// Changes run concurrently, so a write planned before another change's booking can land
/// after that change's writes: the writer that made it is the one that sees it and corrects
/// it. A failed write is retried every round ([`shrink_outcome`]). The changes written (dry
/// run: those planned).
pub(crate) fn follow_pool<W: ?Sized, E: std::fmt::Display>(
    io: &mut Io,
    d: &Daemon,
    w: &mut W,
    dry_run: bool,
    read: impl Fn(&W, &str) -> Option<CpuSet>,
    mut write: impl FnMut(&mut Io, &mut W, &CpusetChange) -> Result<(), E>,
) -> Vec<CpusetChange> {
    let mut out: Vec<CpusetChange> = Vec::new();
    let mut tried: Vec<CpusetChange> = Vec::new();
    let mut failed = 0;
    for _ in 0..FOLLOW_PASSES {
        let changes = shared_changes(io, d, |cg| read(w, cg));
        if dry_run {
            out = changes;
            break;
        }
        let todo: Vec<CpusetChange> = (changes.into_iter())
            .filter(|c| !tried.contains(c))
            .collect();
        if todo.is_empty() {
            break;
        }
        failed = 0;
        for change in todo {
            tried.push(change.clone());
            if let Err(e) = write(io, w, &change) {
                tracing::warn!(cgroup = %change.cgroup, error = %e, "moving a shared container to its pool failed (retried every round)");
                failed += 1;
                continue;
            }
            tracing::info!(cgroup = %change.cgroup, cpus = %change.cpus, "shared container set to its pool (exclusive CPUs taken or freed)");
            out.retain(|c| c.cgroup != change.cgroup);
            out.push(change);
        }
    }
    shrink_outcome(io, d, failed);
    out
}

/// Records how an attempt to set the shared containers to their pool ended: `failed` writes
/// (0: all written). While some fail, each round tries again (`Admission::refence`); the
/// rounds in a row that failed are counted and warned of at the 1st, 2nd, 4th, … of them.
pub(crate) fn shrink_outcome(io: &mut Io, d: &Daemon, failed: usize) {
    let n = {
        let mut s = d.lock(io);
        s.shrink_failures = if failed == 0 {
            0
        } else {
            s.shrink_failures.saturating_add(1)
        };
        s.shrink_failures
    };
    d.metrics.shared_pool_pending.set(failed as i64);
    if n > 0 && n.is_power_of_two() {
        tracing::warn!(containers = failed, attempts = n, "shared containers could not be set to their pool: they may run on exclusive CPUs until a retry succeeds (every round)");
    }
}

/// The log target of the Topology Manager decisions: `RUST_LOG` or `daemon.log_level`
/// `info,rebalancer::topology_manager=debug` turns them on alone.
pub const DECISION_TARGET: &str = "rebalancer::topology_manager";

/// kubelet's decision log (`TopologyHints` per provider, `ContainerTopologyHint`): one line
/// per placed container at debug, with each provider's hints, the merged hint and the
/// affinity it got. A refusal's reason carries the hints too (`TopologyAffinityError`).
fn log_decisions(a: &Admitted) {
    for p in &a.placements {
        let Some(d) = &p.topology else { continue };
        let affinity = p.affinity.map(|m| m.to_cpuset());
        tracing::debug!(
            target: DECISION_TARGET,
            pod = %a.uid,
            container = %p.container,
            hints = %d.hints_line(),
            merged = %d.merged,
            affinity = ?affinity.map(|m| m.to_string()),
            cpus = %p.cpus,
            mems = %p.mems,
            "topology hints merged"
        );
    }
}

/// The cpus that keep a container now on `current` off the exclusive CPUs `excl`: None when
/// it is already off them; else what it has outside them, or the shared `pool` when nothing is
/// left (None too when the pool is empty: never an empty cpuset).
pub fn fence_cpus(current: &CpuSet, excl: &CpuSet, pool: &CpuSet) -> Option<CpuSet> {
    if current.is_disjoint(excl) {
        return None;
    }
    let rest = current.difference(excl);
    Some(if rest.is_empty() { pool.clone() } else { rest }).filter(|c| !c.is_empty())
}

/// What a container of kubelet's pod `pod_uid` is fenced off, and the pool it falls back on:
/// the exclusive CPUs but the pod's own kubelet CPUs. A cgroup does not say which
/// container it is, so every container of the pod is fenced: one kubelet gave CPUs runs on a
/// subset of the pod's own, which this leaves it (`fence_cpus` None: no write); a sidecar on
/// kubelet's shared pool is kept off every other exclusive CPU.
fn fence_of(s: &Shared, pod_uid: &str) -> (CpuSet, CpuSet) {
    let (excl, pool) = exclusive_and_pool(s);
    (excl.difference(&super::kubelet::pod_cpus(s, pod_uid)), pool)
}

/// The exclusive CPUs and the shared pool now.
/// Containers the books do not hold — refused ones, and kubelet's fenced ones — run on the
/// shared pool: a change that makes the last shared CPU exclusive while one of them lives
/// would leave it nowhere to be fenced to, sharing a CPU given exclusively. Such a change is
/// refused (checked on the books it leaves, before anything is written). `had_pool`: whether
/// the shared pool had a CPU before the change ([`shared_pool_left`]); one already empty (a
/// pod scope hold took it) is not this change's doing.
fn leaves_unadmitted_no_cpu(s: &Shared, had_pool: bool) -> Option<Rejection> {
    let waiting = s.refused.len() + s.fenced.len();
    if !had_pool || waiting == 0 || shared_pool_left(s) {
        return None;
    }
    Some(Rejection::new(
        crate::placement::pod::RejectionReason::InsufficientCpu,
        format!(
            "exclusive CPUs would leave no shared CPU for the {waiting} running container(s) not admitted (refused, or kubelet's), which must keep off them"
        ),
    ))
}

/// Whether the shared pool has a CPU now.
fn shared_pool_left(s: &Shared) -> bool {
    !(s.state.allocator)
        .shared_pool(&CpuView::new(&s.topo))
        .is_empty()
}

pub(crate) fn exclusive_and_pool(s: &Shared) -> (CpuSet, CpuSet) {
    (
        s.state.allocator.exclusive_cpus(),
        s.state.allocator.shared_pool(&CpuView::new(&s.topo)),
    )
}

/// The shared pool as the books have it: every bound shared container's cpuset should be its
/// pool minus the exclusive CPUs (`Allocator::current_cpus`) — smaller when exclusive CPUs were
/// taken (kubelet's shrink), larger again when they were freed. The changes for the bound shared
/// containers whose live cpus (`live`, read without the state lock) differ from that; one whose
/// pool is all exclusive keeps what it has (never an empty cpuset).
pub fn shared_changes(
    io: &mut Io,
    d: &Daemon,
    live: impl Fn(&str) -> Option<CpuSet>,
) -> Vec<CpusetChange> {
    let want = shared_bound(&d.lock(io));
    let mut out = fenced_changes(io, d, &live);
    for (cg, cpus) in want {
        if cpus.is_empty() {
            tracing::warn!(cgroup = %cg, "no CPU left outside the exclusive ones; cpuset left as it is");
            continue;
        }
        if live(&cg).is_some_and(|l| l != cpus) {
            out.push(CpusetChange {
                cgroup: cg,
                cpus,
                mems: None,
            });
        }
    }
    out
}

/// The changes that keep kubelet's containers without kubelet CPUs (`Shared::fenced`) and the
/// containers not admitted (`Shared::refused`) off the exclusive CPUs as they are now
/// (`live`); forgets those whose pod kubelet no longer holds and those whose cgroup is gone.
fn fenced_changes(
    io: &mut Io,
    d: &Daemon,
    live: &impl Fn(&str) -> Option<CpuSet>,
) -> Vec<CpusetChange> {
    let fenced = {
        let mut s = d.lock(io);
        // fenced containers of pods kubelet no longer holds are no longer ours to fence
        let gone: Vec<String> = (s.fenced.iter())
            .filter(|(_, uid)| super::kubelet::cpu_assigned(&s, uid, None).is_none())
            .map(|(cg, _)| cg.clone())
            .collect();
        for cg in gone {
            s.fenced.remove(&cg);
            s.fence_failures.remove(&cg);
        }
        let mut fenced: Vec<(String, (CpuSet, CpuSet))> = (s.fenced.iter())
            .map(|(cg, uid)| (cg.clone(), fence_of(&s, uid)))
            .collect();
        // containers not admitted: off every exclusive CPU
        if !s.refused.is_empty() {
            let all = exclusive_and_pool(&s);
            fenced.extend(s.refused.iter().map(|cg| (cg.clone(), all.clone())));
        }
        fenced
    };
    let mut out = Vec::new();
    // kubelet's containers without kubelet CPUs: kept off the exclusive CPUs as they change
    let mut vanished = Vec::new();
    for (cg, (excl, pool)) in fenced {
        match live(&cg) {
            Some(l) => out.extend(fence_cpus(&l, &excl, &pool).map(|cpus| CpusetChange {
                cgroup: cg,
                cpus,
                mems: None,
            })),
            None => vanished.push(cg),
        }
    }
    if !vanished.is_empty() {
        let mut s = d.lock(io);
        for cg in &vanished {
            s.fenced.remove(cg);
            s.refused.remove(cg);
            s.fence_failures.remove(cg);
        }
    }
    out
}

/// Bound shared containers and their pools minus the exclusive CPUs (as
/// `Allocator::current_cpus`, with the exclusive CPUs gathered once rather than per container:
/// per container it made every shrink quadratic in the admitted containers).
fn shared_bound(s: &Shared) -> BTreeMap<String, CpuSet> {
    let exclusive = s.state.allocator.exclusive_cpus();
    let online = s.topo.online_cpus();
    // exclusive ones none of whose CPUs is online run on the shared pool meanwhile, and
    // follow it as the shared ones do (`reconcile::booked`)
    let stranded_on = std::cell::OnceCell::new();
    s.state
        .bindings
        .iter()
        .filter(|(cg, _)| !s.moving.contains(*cg))
        .filter_map(|(cg, _)| {
            let p = &bound_container(s, cg)?.placement;
            let cpus = if !p.exclusive {
                p.cpus.difference(&exclusive)
            } else if super::reconcile::stranded(p, &online) {
                (stranded_on.get_or_init(|| super::reconcile::pool_now(s, &exclusive, &online)))
                    .clone()
            } else {
                return None;
            };
            Some((cg.clone(), cpus))
        })
        .collect()
}

/// Why the books refuse a control-round move (a reason label for `moves_skipped`).
pub type BooksRefusal = &'static str;

/// The books' side of a control-round move, checked just before it is written (`apply`): its
/// CPUs may not be reserved, nor another container's exclusive ones — an admission may have
/// taken them since the round planned — and a bound container holding Memory Manager memory
/// moves it only to nodes whose blocks can take it. A move that keeps its CPUs (an operator's
/// pin) is checked for memory only.
pub fn move_allowed(s: &Shared, mv: &crate::controller::Move) -> Result<(), BooksRefusal> {
    let a = &s.state.allocator;
    let own = bound_container(s, &mv.cgroup);
    if mv.to_cpus != mv.from_cpus {
        if !mv.to_cpus.is_disjoint(&a.reserved_cpus) {
            return Err("books-reserved");
        }
        let mut excl = a.exclusive_cpus();
        if let Some(c) = own.filter(|c| c.placement.exclusive) {
            excl = excl.difference(&c.placement.cpus);
        }
        if !mv.to_cpus.is_disjoint(&excl) {
            return Err("books-exclusive");
        }
        // An exclusive container's new CPUs leave every shared container at least one.
        if own.is_some_and(|c| c.placement.exclusive) {
            let after = excl.union(&mv.to_cpus);
            let starved = a
                .pods
                .values()
                .flat_map(|p| &p.containers)
                .filter(|c| !c.placement.exclusive)
                .any(|c| !c.placement.cpus.is_empty() && c.placement.cpus.is_subset(&after));
            if starved {
                return Err("books-shared-starved");
            }
        }
    }
    if let (Some(c), None) = (own, &mv.stage) {
        if let (Some(mem), Some(mask)) = (&c.memory, node_mask(&mv.to_mems)) {
            if mask != mem.nodes
                && crate::placement::admission::rebook_memory(a.memory.clone(), mem, mask).is_none()
            {
                return Err("books-memory");
            }
        }
    }
    Ok(())
}

/// A move's cpus booked before they are written (see [`book_move`]); settled once the writes
/// ended ([`Booked::settle`]). Not clonable: one settle per booking. Dropped unsettled (a
/// panic in the move's writes) it is given back, so no CPU stays held.
#[must_use = "a booking holds CPUs until it is settled"]
pub struct Booked {
    d: Daemon,
    settled: bool,
    cgroup: String,
    /// The bound container and the cpus the books gave it before (None: unbound).
    bound: Option<(String, String, CpuSet)>,
    /// The exclusive CPUs once booked: what the shared containers were set against.
    exclusive: CpuSet,
}

/// A bind's booking of its cgroup (`Shared::binding`) while the cpuset is written: given back
/// when dropped unsettled (the write panicked), so the cgroup can be bound again.
struct BindingBooked<'a> {
    d: &'a Daemon,
    cgroup: &'a str,
    settled: bool,
}

impl Drop for BindingBooked<'_> {
    fn drop(&mut self) {
        if !self.settled {
            tracing::warn!(cgroup = %self.cgroup, "a bind's booking was never settled (its write panicked); given back");
            self.d.in_drop(|s| drop(s.binding.remove(self.cgroup)));
        }
    }
}

/// A resize's booking while its write runs: the cgroup counted as moving, its CPUs and the
/// memory a shrink freed held under `key`. Settled once the write ended, or when dropped
/// unsettled (its write panicked): the holds let go and, unless written, the resized
/// container put back as it was.
struct ResizeBooked {
    d: Daemon,
    settled: bool,
    cgroup: String,
    key: String,
    uid: String,
    /// The container's record and the pod's requests before the resize.
    before: Option<(AdmittedContainer, (u64, MemoryRequest))>,
}

impl ResizeBooked {
    fn settle(mut self, io: &mut Io, written: bool) {
        let d = self.d.clone();
        self.settle_in(&mut d.lock(io), written);
    }

    fn settle_in(&mut self, s: &mut Shared, written: bool) {
        self.settled = true;
        s.moving.remove(&self.cgroup);
        s.state.allocator.let_go(&self.key);
        if let (false, Some((container, requests))) = (written, self.before.take()) {
            s.state
                .allocator
                .undo_resize(&self.uid, &container, requests);
        }
    }
}

impl Drop for ResizeBooked {
    fn drop(&mut self) {
        if !self.settled {
            tracing::warn!(cgroup = %self.cgroup, "a resize's booking was never settled (its write panicked); undone");
            let d = self.d.clone();
            d.in_drop(|s| self.settle_in(s, false));
        }
    }
}

/// The first half of a move's change: under the locks, with no I/O, the move is checked
/// against the books ([`move_allowed`]: none of its new CPUs exclusive, held ones included)
/// and the bound container's cpus are booked at the target. An exclusive container's old and
/// new CPUs are held (`Allocator::in_flight`): no admission hands them out and no shared
/// container is set onto them while the writes run, with no lock held. `Ok(None)`: nothing to
/// book (a dry run, or the cpus stay).
pub fn book_move(
    io: &mut Io,
    d: &Daemon,
    mv: &crate::controller::Move,
    dry_run: bool,
) -> Result<Option<Booked>, BooksRefusal> {
    let mut s = d.lock(io);
    move_allowed(&s, mv)?;
    if dry_run || mv.to_cpus == mv.from_cpus {
        return Ok(None);
    }
    // a resize's write under way: its settle would put back what this move books
    if s.moving.contains(&mv.cgroup) {
        return Err("books-moving");
    }
    s.moving.insert(mv.cgroup.clone());
    let own =
        bound_container(&s, &mv.cgroup).map(|c| (c.placement.exclusive, c.placement.cpus.clone()));
    if own.as_ref().is_some_and(|(excl, _)| *excl) {
        let held = mv.from_cpus.union(&mv.to_cpus);
        s.state.allocator.in_flight.insert(mv.cgroup.clone(), held);
    }
    let binding = s.state.bindings.get(&mv.cgroup).cloned();
    let bound = binding.zip(own).map(|(b, (_, cpus))| {
        (s.state.allocator).record_move_cpus(&b.pod_uid, &b.container, &mv.to_cpus);
        (b.pod_uid.to_string(), b.container, cpus)
    });
    Ok(Some(Booked {
        d: d.clone(),
        settled: false,
        cgroup: mv.cgroup.clone(),
        bound,
        exclusive: s.state.allocator.exclusive_cpus(),
    }))
}

impl Booked {
    /// The second half of a move's change, once its writes ended: the held CPUs are let go,
    /// and the booked cpus stay when they were `written`, else the books go back to what they
    /// were. Returns whether the exclusive CPUs differ from those at the booking (this move's,
    /// or an admission's while the writes ran): the shared containers then follow
    /// ([`shared_changes`], written by the caller with no lock held), the moved one included.
    pub fn settle(mut self, io: &mut Io, written: bool) -> bool {
        let d = self.d.clone();
        let changed = self.settle_in(&mut d.lock(io), written);
        changed
    }

    fn settle_in(&mut self, s: &mut Shared, written: bool) -> bool {
        self.settled = true;
        s.moving.remove(&self.cgroup);
        s.state.allocator.in_flight.remove(&self.cgroup);
        if let (false, Some((uid, container, cpus))) = (written, &self.bound) {
            s.state.allocator.record_move_cpus(uid, container, cpus);
        }
        self.exclusive != s.state.allocator.exclusive_cpus()
    }
}

impl Drop for Booked {
    fn drop(&mut self) {
        if !self.settled {
            tracing::warn!(cgroup = %self.cgroup, "a move's booking was never settled (its writes panicked); given back");
            let d = self.d.clone();
            d.in_drop(|s| {
                self.settle_in(s, false);
            });
        }
    }
}

/// A move's cpus were written: the bound container's placement follows them — its CPUs (for a
/// shared container, its pool and the CPU charges spread over it) — so later admissions
/// decide on what cgroupfs holds: for cpus someone else wrote (a move's are booked by
/// [`book_move`]). On the state its caller holds locked. Unbound cgroups have nothing in the books. Returns
/// true when exclusive CPUs changed (the shared containers then follow: [`shared_changes`]).
pub fn record_cpus(s: &mut Shared, mv: &crate::controller::Move) -> bool {
    let Some(b) = s.state.bindings.get(&mv.cgroup).cloned() else {
        return false;
    };
    s.state
        .allocator
        .record_move_cpus(&b.pod_uid, &b.container, &mv.to_cpus)
}

/// A move's mems were written (the migration done): the bound container's mems follow, and
/// its Memory Manager memory is re-booked on the new nodes.
pub fn record_mems(io: &mut Io, d: &Daemon, mv: &crate::controller::Move) {
    let mut s = d.lock(io);
    let Some(b) = s.state.bindings.get(&mv.cgroup).cloned() else {
        return;
    };
    if mv.stage.is_none() {
        s.state
            .allocator
            .record_move_mems(&b.pod_uid, &b.container, &mv.to_mems);
    }
}

/// The admitted container `cg` is bound to.
pub(crate) fn bound_container<'a>(
    s: &'a Shared,
    cg: &str,
) -> Option<&'a crate::placement::admission::AdmittedContainer> {
    let b = s.state.bindings.get(cg)?;
    s.state
        .allocator
        .pods
        .get(&b.pod_uid)?
        .containers
        .iter()
        .find(|c| c.placement.container == b.container)
}

fn node_mask(mems: &CpuSet) -> Option<crate::placement::mask::NodeMask> {
    crate::placement::mask::NodeMask::from_ids(mems.iter())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{path::Path, sync::Arc, time::Instant};

    use proptest::prelude::*;

    use super::*;
    use crate::{
        cgroup::{Cgroups, Mounts},
        config::Config,
        daemon::Persisted,
        daemon::{run::reload, writer::CgroupCpusetWriter},
        placement::{key::KeyKind, pod::Container},
        serve::Metrics,
        topology::TopologyBuilder,
    };

    #[derive(Clone, Debug)]
    enum Op {
        /// A Guaranteed pod of n CPUs (exclusive).
        Guaranteed(u64),
        /// A Burstable pod requesting millis (shared pool).
        Burstable(u64),
        /// Release the i-th admitted pod (modulo the number).
        Release(usize),
        /// SIGHUP with these CPUs (bit i = CPU i) as placement.reserved_cpus.
        Reserve(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..=3).prop_map(Op::Guaranteed),
            (100u64..=2500).prop_map(Op::Burstable),
            any::<usize>().prop_map(Op::Release),
            any::<u8>().prop_map(Op::Reserve),
        ]
    }

    /// A one-container pod: Guaranteed (`millis` limit = request, `mem` bytes) or Burstable.
    pub(crate) fn pod(uid: &str, millis: u64, mem: u64, guaranteed: bool) -> Pod {
        Pod {
            uid: uid.into(),
            containers: vec![Container {
                name: "c".into(),
                cpu_request_millis: millis,
                cpu_limit_millis: if guaranteed { millis } else { 0 },
                memory_bytes: if guaranteed { mem } else { 0 },
                memory_limit_bytes: if guaranteed { mem } else { 0 },
                ..Default::default()
            }],
            init_containers: Vec::new(),
        }
    }

    /// Strict reservation (kubelet's `strict-cpu-reservation`): reserved CPUs are in no
    /// placement, not even the shared pool (non-strict keeps them in the shared pool).
    fn config_file(path: &Path, state: &Path, reserved: &CpuSet) {
        std::fs::write(
            path,
            format!(
                "[daemon]\nstate_dir = \"{}\"\n[placement]\nreserved_cpus = \"{reserved}\"\nstrict_cpu_reservation = true\n",
                state.display()
            ),
        )
        .unwrap();
    }

    /// The books' keys say who admitted a pod. The checkpoint holds them as the plain strings
    /// older daemons wrote, and reads them back with their kinds: the start-up release of
    /// unbound single-container pods takes those only, never an API pod waiting for its
    /// container. An API pod cannot take a single-container pod's key form.
    #[test]
    fn allocation_keys_load_typed_from_the_checkpoints_plain_strings() {
        let io = &mut Io::new();
        let dir = tempfile::tempdir().unwrap();
        let (state, file) = (dir.path().join("state"), dir.path().join("c.toml"));
        config_file(&file, &state, &CpuSet::new());
        let cfg = Config::load(Some(&file)).unwrap();
        let topo = TopologyBuilder::default().build();
        let d = Daemon::new(Shared::fresh(topo, cfg).unwrap(), Metrics::default());
        let adm = Admission::new(
            d.clone(),
            Arc::new(CgroupCpusetWriter::new(Cgroups::new(Mounts::default()))),
        );
        let api = |io: &mut Io, uid: &str| {
            adm.admit(
                io,
                AdmitRequest {
                    pod: &pod(uid, 1000, 64 << 20, true),
                    bind: None,
                    durability: Durability::Durable,
                    since: Instant::now(),
                },
            )
        };
        api(io, "api-1").unwrap();
        assert!(
            matches!(api(io, "ns/x"), Err(AdmitError::Invalid(_))),
            "an API pod with a single-container pod's key form"
        );
        {
            let mut s = d.lock(io);
            let sh = &mut *s;
            for uid in ["u1/abc", "u2/def"] {
                (sh.state.allocator)
                    .admit(&sh.topo, &sh.cfg.placement, &pod(uid, 1000, 64 << 20, true))
                    .unwrap();
            }
            sh.state.bindings.insert(
                "kubepods/pod-u1/abc".into(),
                Binding {
                    pod_uid: AllocKey::container("u1", "abc"),
                    container: "c".into(),
                },
            );
        }
        adm.daemon.checkpoint(io).unwrap();
        let raw: serde_json::Value = crate::checkpoint::load(&state).unwrap().unwrap();
        let pods = &raw["allocator"]["pods"];
        assert!(
            pods["api-1"].is_object() && pods["u1/abc"].is_object(),
            "{pods}"
        );
        assert_eq!(raw["bindings"]["kubepods/pod-u1/abc"]["pod_uid"], "u1/abc");
        let mut back: Persisted = crate::checkpoint::load(&state).unwrap().unwrap();
        let kind = |k: &str| back.allocator.pods.get_key_value(k).unwrap().0.kind();
        assert_eq!(kind("api-1"), KeyKind::Pod);
        assert_eq!(kind("u1/abc"), KeyKind::Container);
        assert!(back.bindings["kubepods/pod-u1/abc"].pod_uid.is_container());
        assert_eq!(super::super::run::release_unbound_containers(&mut back), 1);
        let left: Vec<&str> = back.allocator.pods.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            left,
            ["api-1", "u1/abc"],
            "only the unbound container's pod released"
        );
    }

    /// A round's observations reach admission (`Shared::observe`, as the engine's round calls
    /// it): a Burstable pod the requests would send to node 0 goes to node 1 once node 0 is
    /// measured running well beyond what was charged there.
    #[test]
    fn admission_sees_the_load_a_round_measured() {
        let io = &mut Io::new();
        use crate::controller::{NodeObs, Observations};
        let dir = tempfile::tempdir().unwrap();
        let (state, file) = (dir.path().join("state"), dir.path().join("c.toml"));
        config_file(&file, &state, &CpuSet::new());
        let mut cfg = Config::load(Some(&file)).unwrap();
        assert_eq!(cfg.controller.admission_load_periods, 0, "off by default");
        cfg.controller.admission_load_periods = 1;
        // node 0 = CPUs 0-3,8-11, node 1 = 4-7,12-15
        let topo = TopologyBuilder::default().build();
        let d = Daemon::new(
            Shared::fresh(topo.clone(), cfg.clone()).unwrap(),
            Metrics::default(),
        );
        let adm = Admission::new(
            d.clone(),
            Arc::new(CgroupCpusetWriter::new(Cgroups::new(Mounts::default()))),
        );
        let admit = |io: &mut Io, uid: &str| {
            let p = pod(uid, 500, 0, false);
            let r = adm.admit(
                io,
                AdmitRequest {
                    pod: &p,
                    bind: None,
                    durability: Durability::Durable,
                    since: Instant::now(),
                },
            );
            r.unwrap().placements[0].cpus.to_string()
        };
        assert_eq!(admit(io, "a"), "0-3,8-11");
        assert_eq!(admit(io, "b"), "4-7,12-15");
        // node 0 busy 6 CPUs' worth (500m charged), node 1 half a CPU (500m charged)
        let node = |busy| NodeObs {
            cpu_busy: busy,
            ..Default::default()
        };
        let obs = Observations {
            nodes: [(0, node(0.75)), (1, node(0.0625))].into_iter().collect(),
            ..Default::default()
        };
        d.lock(io).observe(&obs, &cfg.controller);
        let want: BTreeMap<u32, u64> = [(0, 5500)].into_iter().collect();
        assert_eq!(d.lock(io).overuse.by_node, want);
        // off (the default), a round measures nothing for admission
        let mut off = cfg.controller.clone();
        off.admission_load_periods = 0;
        let mut probe = Shared::fresh(topo.clone(), cfg.clone()).unwrap();
        probe.observe(&obs, &off);
        assert!(probe.overuse.by_node.is_empty());
        // by requests alone (a tie) the next pod would go to node 0
        let mut plain = d.lock(io).state.allocator.clone();
        let c = pod("c", 500, 0, false);
        let by_requests = plain.admit(&topo, &cfg.placement, &c).unwrap();
        assert_eq!(by_requests[0].cpus.to_string(), "0-3,8-11");
        assert_eq!(admit(io, "c"), "4-7,12-15");
    }

    /// What admission counts as lasting load: each node's lowest pressure over the last
    /// `admission_load_periods` periods (fewer when fewer were seen); none when off.
    #[test]
    fn lasting_pressure_is_the_lowest_of_the_last_periods() {
        use crate::controller::ControllerState;
        let mut st = ControllerState::default();
        st.node_pressure
            .insert(0, [0.2, 1.5, 1.2, 1.4].into_iter().collect());
        st.node_pressure.insert(1, [0.9].into_iter().collect());
        let got = |n| st.lasting_pressure(n);
        let want = |v: &[(u32, f64)]| v.iter().copied().collect::<BTreeMap<u32, f64>>();
        assert_eq!(got(0), want(&[]));
        assert_eq!(got(1), want(&[(0, 1.4), (1, 0.9)]));
        assert_eq!(got(3), want(&[(0, 1.2), (1, 0.9)]));
        assert_eq!(got(64), want(&[(0, 0.2), (1, 0.9)]));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Whatever the order of admissions, releases and SIGHUPs changing
        /// `reserved_cpus`, no reserved CPU is ever in an exclusive or a shared placement; a
        /// reload is applied exactly when no admitted container holds a newly reserved CPU, and
        /// the reservations in force are the allocator's.
        #[test]
        fn a_reload_of_reserved_cpus_never_leaves_a_reserved_cpu_in_a_placement(ops in proptest::collection::vec(op(), 1..24)) {
            let io = &mut Io::new();
            let dir = tempfile::tempdir().unwrap();
            let (state, file) = (dir.path().join("state"), dir.path().join("c.toml"));
            config_file(&file, &state, &CpuSet::new());
            let cfg = Config::load(Some(&file)).unwrap();
            let topo = TopologyBuilder { cores_per_node: 4, threads_per_core: 1, ..Default::default() }.build();
            let d = Daemon::new(Shared::fresh(topo.clone(), cfg).unwrap(), Metrics::default());
            let adm = Admission::new(d.clone(), Arc::new(CgroupCpusetWriter::new(Cgroups::new(Mounts::default()))));
            let mut live: Vec<String> = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Guaranteed(n) | Op::Burstable(n) => {
                        let g = matches!(op, Op::Guaranteed(_));
                        let uid = format!("p{i}");
                        let p = pod(&uid, if g { n * 1000 } else { *n }, 64 << 20, g);
                        if adm.admit(io, AdmitRequest { pod: &p, bind: None, durability: Durability::Durable, since: Instant::now() }).is_ok() {
                            live.push(uid);
                        }
                    }
                    Op::Release(k) if !live.is_empty() => {
                        let uid = live.remove(k % live.len());
                        adm.release(io, &uid, Durability::Durable).unwrap();
                    }
                    Op::Release(_) => {}
                    Op::Reserve(bits) => {
                        let want: CpuSet = (0..8).filter(|c| bits & (1 << c) != 0).collect();
                        let before = d.lock(io).state.allocator.clone();
                        let held: CpuSet = before
                            .placements()
                            .fold(CpuSet::new(), |a, p| a.union(&p.cpus))
                            .intersection(&want.difference(&before.reserved_cpus));
                        config_file(&file, &state, &want);
                        reload(io, &d, Some(&file));
                        let s = d.lock(io);
                        let in_force = &s.state.allocator.reserved_cpus;
                        let all_reserved = topo.online_cpus().is_subset(&want);
                        if held.is_empty() && !all_reserved {
                            prop_assert_eq!(in_force, &want, "refused without a holder");
                        } else {
                            prop_assert_eq!(in_force, &before.reserved_cpus, "applied though {} is held", held);
                        }
                        prop_assert_eq!(&s.cfg.reserved_cpus(), in_force, "config and allocator disagree");
                    }
                }
                let s = d.lock(io);
                let reserved = &s.state.allocator.reserved_cpus;
                for p in s.state.allocator.placements() {
                    prop_assert!(p.cpus.is_disjoint(reserved), "{} holds reserved CPUs {} after {:?}", p.container, reserved, op);
                    prop_assert!(!p.cpus.is_empty());
                }
                let pool = s.state.allocator.shared_pool(&CpuView::new(&s.topo));
                prop_assert!(pool.is_disjoint(reserved));
            }
        }
    }

    /// A writer over a node whose every container runs on `live` with its memory on `memory`.
    struct RunningNode {
        live: CpuSet,
        memory: CpuSet,
        written: std::sync::Mutex<Vec<CpusetChange>>,
    }

    impl CpusetWriter for RunningNode {
        fn write(&self, _io: &Io, c: &CpusetChange) -> Result<(), WriteError> {
            self.written.lock().unwrap().push(c.clone());
            Ok(())
        }
        fn cpus(&self, _: &str) -> Option<CpuSet> {
            Some(self.live.clone())
        }
        fn memory_nodes(&self, _: &str) -> Option<CpuSet> {
            Some(self.memory.clone())
        }
    }

    /// A new container (the watcher's events, NRI CreateContainer) gets its placement as
    /// decided, whatever it touched already; one met running at start (`adopting`) keeps its
    /// exclusive CPUs and its memory's nodes, in the books too, so no write migrates memory.
    #[test]
    fn only_an_adopted_container_keeps_its_cpus_and_memory_where_they_are() {
        let io = &mut Io::new();
        let mut cfg = Config::default();
        cfg.placement.policy = crate::config::TopologyPolicy::SingleNumaNode;
        // node 0 = CPUs 0-3,8-11, node 1 = 4-7,12-15
        let topo = TopologyBuilder::default().build();
        let d = Daemon::new(Shared::fresh(topo, cfg).unwrap(), Metrics::default());
        let node = Arc::new(RunningNode {
            live: CpuSet::parse("3,11").unwrap(),
            memory: CpuSet::parse("1").unwrap(),
            written: Default::default(),
        });
        let adm = Admission::new(d.clone(), node.clone());
        let admit = |io: &mut Io, adm: &Admission, uid: &str, cg: &str| {
            let p = pod(uid, 2000, 64 << 20, true);
            let a = adm
                .admit(
                    io,
                    AdmitRequest {
                        pod: &p,
                        bind: Some(cg),
                        durability: Durability::Deferred,
                        since: Instant::now(),
                    },
                )
                .unwrap();
            a.placements[0].clone()
        };
        let booked = |io: &mut Io, uid: &str| {
            d.lock(io).state.allocator.pods[uid].containers[0]
                .placement
                .clone()
        };
        let new = admit(io, &adm, "new", "kubepods/new");
        assert_eq!(
            (new.cpus.to_string(), new.mems.to_string()),
            ("0,8".into(), "0".into())
        );
        assert_eq!(booked(io, "new"), new);
        let w = node.written.lock().unwrap().last().cloned().unwrap();
        assert_eq!(w.mems, Some(new.mems.clone()));
        let old = admit(io, &adm.adopting(), "old", "kubepods/old");
        assert_eq!(
            (old.cpus.to_string(), old.mems.to_string()),
            ("3,11".into(), "0-1".into())
        );
        assert_eq!(booked(io, "old"), old);
        let w = node.written.lock().unwrap().last().cloned().unwrap();
        assert_eq!((w.cpus, w.mems), (old.cpus.clone(), Some(old.mems.clone())));
        assert_eq!(
            d.lock(io).state.allocator.exclusive_cpus().to_string(),
            "0,3,8,11"
        );
        // adoption does not stick to the service it was derived from
        let next = admit(io, &adm, "next", "kubepods/next");
        assert_eq!(next.mems.to_string(), "0");
        assert!(next.cpus.is_disjoint(&CpuSet::parse("0,3,8,11").unwrap()));
    }
}

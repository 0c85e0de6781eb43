//! Changes to the runtime's containers made *outside* the NRI hooks — the control round's
//! moves, the CPU-hotplug replacement (`Admission::replace_offline`), the shared pool's shrink
//! after an API admission — and how the runtime's view of them is kept in step.
//!
//! Every such change is **written to cgroupfs first**, by the writer (a move's booked first with
//! its CPUs held, settled after: no admission can hand out CPUs a container has not left yet;
//! an admission's shrink planned from the books and written with no lock held), and then told to the runtime so its container spec
//! (`runc update`) says the same: queued here and sent either in the next hook answer that may
//! carry updates of other containers (CreateContainer / StopContainer / Synchronize: applied by
//! the runtime inside its own hook, no lock-order hazard) or, when the connection allows it, as
//! an unsolicited `UpdateContainers`. The runtime applying the same values again changes
//! nothing; its answer never moves the books (a failed update leaves only the runtime's spec
//! behind, never the cgroup: logged, counted, and sent again up to [`RETRIES`] times).
//!
//! [`Runtime`] is shared by the plugin thread (`daemon::nri`, which knows which cgroup is which
//! runtime container and owns the socket) and the writers of the other threads:
//! - the moves' writer (`rounds::OwnedWriter`), which tells it each cpuset write
//!   ([`Runtime::written`]);
//! - the admission service's cgroupfs sink (`writer::CgroupCpusetWriter::telling`).
//!
//! Unsolicited updates ([`Runtime::set_updates`], decided at Configure by
//! [`runtime_updates_safe`] under `kubernetes.nri_runtime_updates`; `auto` allows them only for
//! a runtime known to be fixed: containerd ≥ 2.4.0, whatever name it reports): containerd
//! before 2.4.0 can deadlock on a plugin's UpdateContainers that crosses a lifecycle event
//! (containerd/containerd#13733, fixed by containerd/nri#301 in NRI v0.12.1). At most one is in
//! flight, each carrying the latest given cpuset of at most [`MAX_BATCH`] containers (so the
//! runtime's serial `runc update`s fit the deadline), sent once the connection is quiet
//! (`nri::session::QUIET`); one that is not answered within the session's deadline ends the
//! connection (`rebalancer_nri_updates_total{reason="timeout"}`), which reconnects with
//! unsolicited updates off for good after [`STICKY_TIMEOUTS`] (no flapping; `status` says why).
//! Ordering: when an answer comes for a container given something newer meanwhile, the runtime
//! may have applied the older value over the daemon's newer write, so [`Runtime::answered`]
//! names it for the plugin to write again and queues it again; the same
//! for what was in flight when the connection went, and for what rode a hook's answer once it
//! has settled ([`HOOK_SETTLE`]: the runtime applies those after the hook returns).
//!
//! Not connected, or a cgroup that is not one of the runtime's containers: written to cgroupfs
//! only, logged, and counted in `rebalancer_nri_direct_writes_total{reason}`. A runtime
//! container written while disconnected is still recorded and queued, so the reconnect tells
//! the runtime what cgroupfs has (never a value from before the disconnect).

use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use crate::{
    cpuset::CpuSet,
    nri::api,
    serve::{
        metrics::{count, ReasonLabel},
        Metrics,
    },
};

/// What a container was last given (through a hook's answer or a write).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Given {
    pub cpus: Option<CpuSet>,
    pub mems: Option<CpuSet>,
}

/// Why a change was not told to the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direct {
    NotConnected,
    NotRuntimeContainer,
}

impl Direct {
    fn label(self) -> &'static str {
        match self {
            Direct::NotConnected => "not-connected",
            Direct::NotRuntimeContainer => "not-runtime-container",
        }
    }
}

/// Whether unsolicited UpdateContainers are safe with the runtime that answered Configure,
/// and why. An allow-list: only a runtime known to be fixed is safe.
/// - containerd — runtime name `containerd`, or `v2` as containerd 2.0.0 and its first
///   patches report it (containerd/containerd#11485, `path.Base` of the module path), or any
///   name containing "containerd": safe from 2.4.0 on (2.4.0 release candidates included).
///   Earlier ones carry containerd/containerd#13733 (their NRI ≤ v0.12.0 holds the
///   adaptation lock across the update callback; fixed by containerd/nri#301, NRI v0.12.1,
///   which containerd uses with `WithAdaptLock` first in 2.4.0 — containerd/containerd#13812
///   on main; no backport to 1.7 or 2.0–2.3 is known). A version that does not parse is
///   affected.
/// - CRI-O and every other runtime: not safe. CRI-O embeds the same NRI adaptation library,
///   and its own fix of NRI lock-inversion deadlocks (cri-o/cri-o#9835) is not merged, so no
///   CRI-O version is known to be fixed.
pub fn runtime_updates_safe(name: &str, version: &str) -> (bool, String) {
    let lower = name.trim().to_ascii_lowercase();
    if !(lower.contains("containerd") || lower == "v2") {
        return (
            false,
            format!("{name:?} {version:?}: not a runtime known to be fixed for plugin updates (containerd/containerd#13733 and its kind; CRI-O: cri-o/cri-o#9835 open)"),
        );
    }
    let v = version.trim().trim_start_matches('v');
    let (core, pre) = match v.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&v[..i], &v[i..]),
        None => (v, ""),
    };
    let nums: Vec<Option<u32>> = core.split('.').map(|p| p.parse().ok()).collect();
    let (ma, mi, pa) = match nums.as_slice() {
        [Some(ma), Some(mi), rest @ ..] => (*ma, *mi, rest.first().copied().flatten().unwrap_or(0)),
        _ => {
            return (
                false,
                format!("containerd version {version:?} not understood; taken as affected by containerd/containerd#13733"),
            )
        }
    };
    // a pre-release of 2.4.0 other than a release candidate may predate containerd#13812
    let early_pre = (ma, mi, pa) == (2, 4, 0) && pre.starts_with('-') && !pre.starts_with("-rc");
    if (ma, mi) >= (2, 4) && !early_pre {
        (
            true,
            format!("containerd {version} has containerd/nri#301 (fixed in 2.4.0)"),
        )
    } else {
        (
            false,
            format!("containerd {version} can deadlock on a plugin's UpdateContainers (containerd/containerd#13733, fixed in 2.4.0)"),
        )
    }
}

#[derive(Default)]
struct State {
    connected: bool,
    /// Unsolicited UpdateContainers allowed on this connection.
    updates: bool,
    /// cgroup → the runtime's container id (containers the plugin placed or adopted).
    ids: BTreeMap<String, String>,
    given: BTreeMap<String, Given>,
    /// Cgroups whose given cpuset is to be told to the runtime, in order.
    queued: Vec<String>,
    /// Sent and not answered: (cgroup, what was sent).
    inflight: Vec<(String, Given)>,
    /// Carried in a hook's answer, which the runtime applies after the hook returns: by
    /// cgroup, checked by [`Runtime::settle_hooked`].
    hooked: BTreeMap<String, Hooked>,
    /// Failed updates by cgroup: each is sent again, at most [`RETRIES`] times in a row.
    failures: BTreeMap<String, u32>,
    /// Unanswered past the deadline so far (unsolicited updates off for good at
    /// [`STICKY_TIMEOUTS`]).
    timeouts: u32,
}

impl State {
    /// `cgroup` was given these cpus and mems (`None`: that part as it was).
    fn give(&mut self, cgroup: &str, cpus: Option<&CpuSet>, mems: Option<&CpuSet>) {
        let g = self.given.entry(cgroup.to_string()).or_default();
        g.cpus = cpus.cloned().or(g.cpus.take());
        g.mems = mems.cloned().or(g.mems.take());
    }

    /// `cgroup`, a runtime container, queued to be told again (once).
    fn requeue(&mut self, cgroup: &str) {
        if self.ids.contains_key(cgroup) && !self.queued.iter().any(|c| c == cgroup) {
            self.queued.push(cgroup.to_string());
        }
    }
}

/// An update that rode a hook's answer.
#[derive(Clone, Debug)]
struct Hooked {
    /// The cpus the answer carried.
    sent: CpuSet,
    /// When to look (the answer's size scales it: the runtime applies them one by one).
    due: Instant,
    /// Looks left (a slow runtime may apply it after the first).
    looks: u32,
}

/// A hooked update to check: the runtime may have put its `sent` cpus over the newer ones the
/// container was given since (the plugin compares cgroupfs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settle {
    pub cgroup: String,
    pub sent: CpuSet,
}

/// How many times in a row a failed update is sent again before only its log and count
/// remain (the runtime's spec then stays behind cgroupfs until the next change).
pub const RETRIES: u32 = 3;

/// How long after a hook's answer its first update is looked at again (the runtime runs one
/// `runc update` per container after the hook returns), plus [`HOOK_PER_UPDATE`] for each one
/// before it in the answer; looked at [`HOOK_LOOKS`] times, one such span apart.
pub const HOOK_SETTLE: Duration = Duration::from_secs(2);
pub const HOOK_PER_UPDATE: Duration = Duration::from_millis(100);
pub const HOOK_LOOKS: u32 = 3;

/// Timeouts (in the daemon's life) after which unsolicited updates stay off.
pub const STICKY_TIMEOUTS: u32 = 2;

/// At most this many containers per unsolicited UpdateContainers: the runtime applies them
/// one after the other (one `runc update` each), and the batch must be answered within the
/// session's deadline however many containers are queued.
pub const MAX_BATCH: usize = 16;

/// The runtime's side of container changes (see the module doc).
pub struct Runtime {
    state: Mutex<State>,
    metrics: Metrics,
}

impl Runtime {
    pub fn new(metrics: Metrics) -> Runtime {
        Runtime {
            state: Mutex::default(),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The plugin registered (`true`) or lost its connection. On a loss, what was in flight is
    /// returned (the runtime may still apply it over newer writes: the caller writes those
    /// cgroups again) and stays queued for the next connection; unsolicited updates are off
    /// until the next Configure decides.
    pub fn set_connected(&self, up: bool) -> Vec<String> {
        let mut s = self.lock();
        s.connected = up;
        if up {
            return Vec::new();
        }
        s.updates = false;
        let lost: Vec<String> = std::mem::take(&mut s.inflight)
            .into_iter()
            .map(|(c, _)| c)
            .collect();
        for cg in &lost {
            if !s.queued.contains(cg) {
                s.queued.push(cg.clone());
            }
        }
        lost
    }

    /// Unsolicited UpdateContainers on (`true`) or off for this connection; what is now in
    /// force (off for good after [`STICKY_TIMEOUTS`] timeouts: [`Self::timed_out`]).
    pub fn set_updates(&self, on: bool) -> bool {
        let mut s = self.lock();
        s.updates = on && s.timeouts < STICKY_TIMEOUTS;
        s.updates
    }

    /// Whether timeouts turned unsolicited updates off for good: a runtime that is slow or
    /// ignores them would otherwise make the connection flap (each gap creates containers
    /// unplaced).
    #[cfg(test)]
    pub fn updates_timed_out(&self) -> bool {
        self.lock().timeouts >= STICKY_TIMEOUTS
    }

    #[cfg(test)]
    pub fn updates_enabled(&self) -> bool {
        self.lock().updates
    }

    /// `cgroup` is the runtime's container `id`.
    pub fn track(&self, cgroup: &str, id: &str) {
        self.lock().ids.insert(cgroup.to_string(), id.to_string());
    }

    /// The container is gone: forgotten (with what it was given).
    pub fn untrack(&self, cgroup: &str) {
        let mut s = self.lock();
        s.ids.remove(cgroup);
        s.given.remove(cgroup);
        s.queued.retain(|c| c != cgroup);
        s.hooked.remove(cgroup);
        s.failures.remove(cgroup);
    }

    /// Synchronize: the runtime's containers are exactly `ids` (cgroup → id).
    pub fn retrack(&self, ids: BTreeMap<String, String>) {
        let mut s = self.lock();
        s.given.retain(|cg, _| ids.contains_key(cg));
        s.queued.retain(|cg| ids.contains_key(cg));
        s.hooked.retain(|cg, _| ids.contains_key(cg));
        s.failures.retain(|cg, _| ids.contains_key(cg));
        s.ids = ids;
    }

    /// A hook's answer (or a write) gave `cgroup` this cpuset.
    pub fn note_given(&self, cgroup: &str, cpus: &CpuSet, mems: Option<&CpuSet>) {
        self.lock().give(cgroup, Some(cpus), mems);
    }

    /// An answer of a hook carries these cpus for these cgroups, in this order (see
    /// [`Self::settle_hooked`]).
    pub fn note_hooked<'a>(&self, sent: impl IntoIterator<Item = (&'a str, &'a CpuSet)>) {
        Self::hooked_locked(&mut self.lock(), sent);
    }

    fn hooked_locked<'a>(s: &mut State, sent: impl IntoIterator<Item = (&'a str, &'a CpuSet)>) {
        let now = Instant::now();
        for (i, (cg, cpus)) in sent.into_iter().enumerate() {
            s.hooked.insert(
                cg.to_string(),
                Hooked {
                    sent: cpus.clone(),
                    due: now + HOOK_SETTLE + HOOK_PER_UPDATE * (i as u32),
                    looks: HOOK_LOOKS,
                },
            );
        }
    }

    /// What `cgroup` was last given, if anything.
    pub fn given(&self, cgroup: &str) -> Option<Given> {
        self.lock().given.get(cgroup).cloned()
    }

    /// The runtime's container id of `cgroup`, if it is one.
    pub fn id_of(&self, cgroup: &str) -> Option<String> {
        self.lock().ids.get(cgroup).cloned()
    }

    /// `cgroup` was written new cpus and/or mems (cgroupfs already has them): recorded and
    /// queued for the runtime, never waited for. Recorded and queued whenever `cgroup` is a
    /// tracked runtime container, connected or not, so what a reconnect sends (Synchronize's
    /// answer, the next batch) is what cgroupfs was last given, never a value from before the
    /// disconnect. `Err` (for the log and metric) when the runtime cannot be told now.
    pub fn submit(
        &self,
        cgroup: &str,
        cpus: Option<&CpuSet>,
        mems: Option<&CpuSet>,
    ) -> Result<(), Direct> {
        let mut s = self.lock();
        let tracked = s.ids.contains_key(cgroup);
        if tracked {
            s.give(cgroup, cpus, mems);
            // a new value: its own retries
            s.failures.remove(cgroup);
            s.requeue(cgroup);
        }
        if !s.connected {
            return Err(Direct::NotConnected);
        }
        if !tracked {
            return Err(Direct::NotRuntimeContainer);
        }
        Ok(())
    }

    fn updates_of(s: &mut State, queued: Vec<String>, inflight: bool) -> Vec<api::ContainerUpdate> {
        let mut out = Vec::new();
        for cg in queued {
            let (Some(id), Some(g)) = (s.ids.get(&cg).cloned(), s.given.get(&cg).cloned()) else {
                continue;
            };
            out.push(update(&id, g.cpus.as_ref(), g.mems.as_ref()));
            if inflight {
                s.inflight.push((cg, g));
            }
        }
        out
    }

    /// For the plugin thread, when the connection is quiet, unsolicited updates are on and
    /// none is in flight: the first [`MAX_BATCH`] queued changes as one batch (each the
    /// latest given), now in flight; the rest stay queued for the next batches.
    pub fn take_batch(&self) -> Vec<api::ContainerUpdate> {
        let mut s = self.lock();
        if !s.connected || !s.updates || !s.inflight.is_empty() {
            return Vec::new();
        }
        let n = s.queued.len().min(MAX_BATCH);
        let queued: Vec<String> = s.queued.drain(..n).collect();
        Self::updates_of(&mut s, queued, true)
    }

    /// For a hook answer that carries updates of other containers: the queued changes (those
    /// of containers in flight stay queued for after their answer).
    pub fn take_for_hook(&self) -> Vec<api::ContainerUpdate> {
        let mut s = self.lock();
        if !s.connected {
            return Vec::new();
        }
        let (busy, free): (Vec<String>, Vec<String>) = std::mem::take(&mut s.queued)
            .into_iter()
            .partition(|cg| s.inflight.iter().any(|(c, _)| c == cg));
        s.queued = busy;
        let sent: Vec<(String, CpuSet)> = free
            .iter()
            .filter(|cg| s.ids.contains_key(*cg))
            .filter_map(|cg| Some((cg.clone(), s.given.get(cg)?.cpus.clone()?)))
            .collect();
        let out = Self::updates_of(&mut s, free, false);
        Self::hooked_locked(&mut s, sent.iter().map(|(c, p)| (c.as_str(), p)));
        out
    }

    /// The hooked updates due now whose container was given other cpus since
    /// (an out-of-hook write while the runtime was still applying the
    /// answer, which may put the older cpus over it). The plugin compares cgroupfs: the
    /// answer's cpus there mean the runtime overwrote the newer write (written again and told
    /// again); the newer cpus mean not yet or not at all, so it is looked at again, up to
    /// [`HOOK_LOOKS`] times; anything else is someone else's write, left alone. Updates whose
    /// container was given nothing newer are done.
    pub fn settle_hooked(&self, now: Instant) -> Vec<Settle> {
        let mut s = self.lock();
        let due: Vec<String> = s
            .hooked
            .iter()
            .filter(|(_, h)| h.due <= now)
            .map(|(cg, _)| cg.clone())
            .collect();
        let mut out = Vec::new();
        for cg in due {
            let Some(mut h) = s.hooked.remove(&cg) else {
                continue;
            };
            let newer = s
                .given
                .get(&cg)
                .and_then(|g| g.cpus.as_ref())
                .is_some_and(|c| *c != h.sent);
            if !newer {
                continue;
            }
            out.push(Settle {
                cgroup: cg.clone(),
                sent: h.sent.clone(),
            });
            h.looks = h.looks.saturating_sub(1);
            if h.looks > 0 {
                h.due = now + HOOK_SETTLE;
                s.hooked.insert(cg, h);
            }
        }
        out
    }

    /// A hooked update's container found with the answer's old cpus over its newer ones:
    /// queued again (the runtime is told the newer cpus) and no longer watched.
    pub fn overwritten(&self, cgroup: &str) {
        let mut s = self.lock();
        s.hooked.remove(cgroup);
        s.requeue(cgroup);
    }

    /// Drops the watch on a hooked update (its container holds someone else's cpus).
    pub fn settled(&self, cgroup: &str) {
        self.lock().hooked.remove(cgroup);
    }

    /// The runtime answered the batch in flight: `Ok(failed container ids)` or the error of
    /// the whole request. Returns the cgroups given something newer meanwhile (the runtime
    /// may have applied the older value over the newer write: to be written again), which are
    /// also queued again. A failure only leaves the runtime's spec behind: logged and counted.
    pub fn answered(&self, result: Result<Vec<String>, String>) -> Vec<String> {
        let mut s = self.lock();
        let inflight = std::mem::take(&mut s.inflight);
        let mut ok = 0u64;
        let mut bad = 0u64;
        let mut stale = Vec::new();
        for (cg, sent) in inflight {
            let id = s.ids.get(&cg).cloned().unwrap_or_default();
            let why = match &result {
                Err(e) => Some(format!("the runtime refused the update: {e}")),
                Ok(failed) if failed.contains(&id) => {
                    Some(format!("the runtime failed the update of container {id}"))
                }
                Ok(_) => None,
            };
            match why {
                Some(w) => {
                    bad += 1;
                    let n = s.failures.entry(cg.clone()).or_default();
                    *n += 1;
                    let retry = *n <= RETRIES;
                    tracing::warn!(cgroup = %cg, container = %id, error = %w, retry, "container update through the runtime failed; cgroupfs has the change, the runtime's spec does not");
                    // sent again (the latest given): a runtime's spec left behind would
                    // write the old cpuset back at its next update of the container
                    if retry {
                        s.requeue(&cg);
                    }
                }
                None => {
                    ok += 1;
                    s.failures.remove(&cg);
                }
            }
            let newer = s.given.get(&cg).is_some_and(|g| *g != sent);
            if newer && s.ids.contains_key(&cg) {
                s.requeue(&cg);
                stale.push(cg);
            }
        }
        drop(s);
        self.count(ok, "applied");
        self.count(bad, "failed");
        stale
    }

    /// The runtime did not answer the batch in flight within the session's deadline (the
    /// connection is then closed): counted; what was in flight is returned as by
    /// [`Self::set_connected`]`(false)`.
    pub fn timed_out(&self) -> Vec<String> {
        let (n, sticky) = {
            let mut s = self.lock();
            s.timeouts += 1;
            (s.inflight.len() as u64, s.timeouts >= STICKY_TIMEOUTS)
        };
        // sticky: changes ride the hooks' answers from now on
        tracing::warn!(containers = n, sticky, "the runtime did not answer container updates in time; closing the NRI connection (it reconnects){}",
            if sticky { "; unsolicited updates off until the daemon restarts" } else { "" });
        self.count(n.max(1), "timeout");
        self.set_connected(false)
    }

    fn count(&self, n: u64, reason: &str) {
        if n > 0 {
            self.metrics
                .nri_updates
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .inc_by(n);
        }
    }

    /// Tells the runtime of a write already made; counted when it cannot be told.
    /// A cpuset write of the moves' writer is in cgroupfs: told to the runtime. A mems write
    /// carries the cpus with it (`cpus_now`) when the runtime never gave the container any (an
    /// adopted container): its spec would otherwise name mems without cpus.
    pub fn written(
        &self,
        cg: &str,
        cpus: Option<&CpuSet>,
        mems: Option<&CpuSet>,
        cpus_now: impl FnOnce() -> Option<CpuSet>,
    ) {
        let given = match (cpus, mems) {
            (None, Some(_)) if self.given(cg).and_then(|g| g.cpus).is_none() => cpus_now(),
            _ => None,
        };
        let what = if mems.is_some() { "mems" } else { "cpus" };
        self.tell(cg, cpus.or(given.as_ref()), mems, what);
    }

    pub(super) fn tell(&self, cg: &str, cpus: Option<&CpuSet>, mems: Option<&CpuSet>, what: &str) {
        if let Err(why) = self.submit(cg, cpus, mems) {
            tracing::info!(cgroup = %cg, reason = why.label(), change = what, "NRI mode: cpuset written to cgroupfs only, the runtime not told");
            count(&self.metrics.nri_direct_writes, why.label());
        }
    }
}

/// One container update of cpus (and mems).
pub fn update(id: &str, cpus: Option<&CpuSet>, mems: Option<&CpuSet>) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: id.to_string(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(cpu_resources(cpus, mems)),
        }),
        ignore_failure: true,
    }
}

/// A container's resources that name its cpus and mems (an empty one: not set).
pub fn cpu_resources(cpus: Option<&CpuSet>, mems: Option<&CpuSet>) -> api::LinuxResources {
    api::LinuxResources {
        cpu: Some(api::LinuxCpu {
            cpus: cpus.map(|c| c.to_string()).unwrap_or_default(),
            mems: mems.map(|m| m.to_string()).unwrap_or_default(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::Cgroups;
    use crate::controller::{CgroupWriteError, CgroupWriter, FakeCgroups};
    use crate::daemon::writer::{CgroupCpusetWriter, CpusetChange, CpusetWriter};
    use crate::daemon::Io;
    use std::sync::Arc;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    #[test]
    fn one_batch_in_flight_and_the_latest_decision_wins() {
        let rt = Runtime::new(Metrics::default());
        assert_eq!(
            rt.submit("a", Some(&set("0")), None),
            Err(Direct::NotConnected)
        );
        rt.set_connected(true);
        rt.set_updates(true);
        assert_eq!(
            rt.submit("a", Some(&set("0")), None),
            Err(Direct::NotRuntimeContainer)
        );
        rt.track("a", "ida");
        rt.track("b", "idb");
        rt.submit("a", None, Some(&set("0"))).unwrap();
        rt.submit("a", Some(&set("1")), None).unwrap();
        rt.submit("b", Some(&set("2-3")), None).unwrap();
        // Coalesced: one update per container, with everything given so far.
        let batch = rt.take_batch();
        assert_eq!(batch.len(), 2);
        let cpu = |u: &api::ContainerUpdate| {
            let c = u.linux.as_ref().unwrap().resources.as_ref().unwrap();
            let c = c.cpu.as_ref().unwrap();
            (c.cpus.clone(), c.mems.clone())
        };
        assert_eq!(batch[0].container_id, "ida");
        assert_eq!(cpu(&batch[0]), ("1".into(), "0".into()));
        assert_eq!(cpu(&batch[1]), ("2-3".into(), String::new()));
        // A newer decision while in flight: nothing more is sent until the answer, and a hook
        // answer does not take a container that is in flight either.
        rt.submit("a", Some(&set("0")), None).unwrap();
        assert!(rt.take_batch().is_empty());
        assert!(rt.take_for_hook().is_empty());
        // b failed: sent again (its spec must not stay behind); a was given something newer
        // meanwhile: the runtime may have applied "1" over the write of "0", so a is named to
        // be written again and is sent again with the newer cpus.
        assert_eq!(rt.answered(Ok(vec!["idb".into()])), vec!["a".to_string()]);
        let again = rt.take_batch();
        assert_eq!(again.len(), 2);
        let a = again.iter().find(|u| u.container_id == "ida").unwrap();
        assert_eq!(cpu(a), ("0".into(), "0".into()));
        assert!(again.iter().any(|u| u.container_id == "idb"));
        assert!(rt.answered(Ok(vec![])).is_empty());
        assert!(rt.take_batch().is_empty());
        let m = rt.metrics.render();
        assert!(
            m.contains("rebalancer_nri_updates_total{reason=\"failed\"} 1"),
            "{m}"
        );
        assert!(
            m.contains("rebalancer_nri_updates_total{reason=\"applied\"} 3"),
            "{m}"
        );
        // a failing container is sent again RETRIES times in a row, then left (counted)
        rt.submit("b", Some(&set("1")), None).unwrap();
        for _ in 0..=RETRIES {
            let batch = rt.take_batch();
            assert_eq!(batch.len(), 1);
            rt.answered(Ok(vec!["idb".into()]));
        }
        assert!(
            rt.take_batch().is_empty(),
            "given up after {RETRIES} retries"
        );
    }

    /// Unsolicited updates off (a runtime with containerd#13733): nothing is sent between
    /// hooks; the next hook answer carries the queued changes.
    #[test]
    fn without_unsolicited_updates_the_next_hook_answer_carries_them() {
        let rt = Runtime::new(Metrics::default());
        rt.set_connected(true);
        rt.track("a", "ida");
        rt.submit("a", Some(&set("1")), None).unwrap();
        assert!(!rt.updates_enabled());
        assert!(rt.take_batch().is_empty());
        let hook = rt.take_for_hook();
        assert_eq!(hook.len(), 1);
        assert_eq!(hook[0].container_id, "ida");
        assert!(rt.take_for_hook().is_empty(), "taken once");
    }

    #[test]
    fn the_version_rule_names_containerd_before_2_4_as_affected() {
        for (name, v, safe) in [
            ("containerd", "1.7.24~ds1", false),
            ("containerd", "v1.7.24", false),
            ("containerd", "2.0.3", false),
            ("containerd", "v2.3.9", false),
            ("containerd", "v2.4.0", true),
            ("containerd", "2.4.0-rc.0", true),
            ("containerd", "3.0.0", true),
            ("containerd", "", false),
            ("containerd", "unknown", false),
            ("containerd", "2.4.0-beta.1", false),
            // containerd 2.0.x reports its name as "v2" (containerd#11485)
            ("v2", "v2.0.3", false),
            ("v2", "2.0.0", false),
            ("v2", "v2.4.0", true),
            ("v2", "garbage", false),
            // CRI-O: no version known to be fixed (cri-o#9835 open); others unknown: off
            ("cri-o", "1.30.2", false),
            ("CRI-O", "", false),
            ("", "", false),
            ("someruntime", "2.4.0", false),
        ] {
            let (ok, why) = runtime_updates_safe(name, v);
            assert_eq!(ok, safe, "{name} {v}: {why}");
            assert!(!why.is_empty());
            if !ok {
                assert!(why.contains("13733"), "{why}");
            }
        }
    }

    /// The fake kernel, shared by the "runtime" (a thread applying the batches, as runc
    /// update does) and the daemon's writer, which counts what it writes itself.
    #[derive(Clone)]
    struct Shared<'a>(
        Arc<Mutex<FakeCgroups>>,
        Arc<Mutex<Vec<String>>>,
        Option<&'a Runtime>,
    );

    impl CgroupWriter for Shared<'_> {
        fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
            self.0.lock().unwrap().read_cpus(cg)
        }
        fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
            self.0.lock().unwrap().read_mems(cg)
        }
        fn write_cpus(&mut self, io: &Io, cg: &str, c: &CpuSet) -> Result<(), CgroupWriteError> {
            self.1.lock().unwrap().push(format!("cpus {cg} {c}"));
            self.0.lock().unwrap().write_cpus(io, cg, c)?;
            if let Some(rt) = self.2 {
                rt.written(cg, Some(c), None, || None);
            }
            Ok(())
        }
        fn write_mems(&mut self, io: &Io, cg: &str, m: &CpuSet) -> Result<(), CgroupWriteError> {
            self.1.lock().unwrap().push(format!("mems {cg} {m}"));
            self.0.lock().unwrap().write_mems(io, cg, m)?;
            if let Some(rt) = self.2 {
                rt.written(cg, None, Some(m), || self.read_cpus(cg).ok());
            }
            Ok(())
        }
        fn needs_memory_migrate(&self) -> bool {
            self.0.lock().unwrap().needs_memory_migrate()
        }
        fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
            self.0.lock().unwrap().read_memory_migrate(cg)
        }
        fn set_memory_migrate(
            &mut self,
            io: &Io,
            cg: &str,
            on: bool,
        ) -> Result<(), CgroupWriteError> {
            self.0.lock().unwrap().set_memory_migrate(io, cg, on)
        }
        fn move_pages(
            &mut self,
            io: &Io,
            cg: &str,
            t: &CpuSet,
            b: u64,
        ) -> Result<u64, CgroupWriteError> {
            self.0.lock().unwrap().move_pages(io, cg, t, b)
        }
    }

    fn a_move() -> crate::controller::Move {
        crate::controller::Move {
            cgroup: "kubepods/pod1/c1".into(),
            from_cpus: set("0-1"),
            to_cpus: set("2-3"),
            from_mems: set("0"),
            to_mems: set("1"),
            bytes_to_migrate: 1 << 20,
            reason: crate::controller::Trigger::PoorLocality,
            locality_before: 0.0,
            locality_after: 1.0,
            net: 1.0,
            stage: None,
        }
    }

    /// N2: a move of a runtime container is in cgroupfs when the writer returns, before the runtime answered or even got it; the runtime then
    /// gets one update with the final cpus and mems. N5: nothing waits for the runtime (it
    /// never answers here), so a stop is never held up by it.
    #[test]
    fn a_move_of_a_runtime_container_is_in_cgroupfs_first_and_told_to_the_runtime() {
        let io = &mut Io::new();
        let mut fake = FakeCgroups::v1().with("kubepods/pod1/c1", "0-1", "0");
        fake.set_memory("kubepods/pod1/c1", &[(0, 1 << 20)]);
        let kernel = Arc::new(Mutex::new(fake));
        let direct = Arc::new(Mutex::new(Vec::new()));
        let metrics = Metrics::default();
        let rt = Arc::new(Runtime::new(metrics.clone()));
        rt.set_connected(true);
        rt.set_updates(true);
        rt.retrack([("kubepods/pod1/c1".to_string(), "c1id".to_string())].into());
        let mv = a_move();
        let mut w = Shared(kernel.clone(), direct.clone(), Some(&rt));
        let t0 = std::time::Instant::now();
        let done = crate::controller::apply(io, &mv, &mut w, false).unwrap();
        assert!(
            t0.elapsed() < crate::daemon::run::SHUTDOWN_BOUND,
            "{:?}",
            t0.elapsed()
        );
        {
            let k = kernel.lock().unwrap();
            assert_eq!(k.cpus("kubepods/pod1/c1"), Some(&set("2-3")));
            assert_eq!(k.mems("kubepods/pod1/c1"), Some(&set("1")));
            // v1: memory_migrate was on while mems narrowed, and off again after.
            assert_eq!(
                k.memory("kubepods/pod1/c1").unwrap().get(&1),
                Some(&(1 << 20))
            );
            assert_eq!(k.memory_migrate("kubepods/pod1/c1"), Some(false));
        }
        assert_eq!(done.moved_bytes, 1 << 20);
        assert!(direct
            .lock()
            .unwrap()
            .contains(&"cpus kubepods/pod1/c1 2-3".to_string()));
        let batch = rt.take_batch();
        assert_eq!(batch.len(), 1);
        let cpu = batch[0].linux.as_ref().unwrap().resources.as_ref().unwrap();
        let cpu = cpu.cpu.as_ref().unwrap();
        assert_eq!((cpu.cpus.as_str(), cpu.mems.as_str()), ("2-3", "1"));
        assert!(rt.answered(Ok(vec![])).is_empty());
        assert!(metrics
            .render()
            .contains("rebalancer_nri_updates_total{reason=\"applied\"} 1"));
        // (its series exist from the start, at 0)
        let text = metrics.render();
        assert!(
            text.lines()
                .filter(|l| l.starts_with("rebalancer_nri_direct_writes_total{"))
                .all(|l| l.ends_with(" 0")),
            "{text}"
        );
    }

    /// A write made while the plugin is disconnected is what a reconnect sends —
    /// never the value queued before the disconnect (which the runtime would apply over the
    /// newer cgroupfs write, onto CPUs the books may have given away).
    #[test]
    fn a_write_while_disconnected_is_what_the_reconnect_sends() {
        let io = &mut Io::new();
        let kernel = Arc::new(Mutex::new(FakeCgroups::v1().with("x", "0-7", "0")));
        let direct = Arc::new(Mutex::new(Vec::new()));
        let metrics = Metrics::default();
        let rt = Runtime::new(metrics.clone());
        rt.set_connected(true);
        rt.track("x", "idx");
        // updates off: x stays queued with 0-1
        rt.submit("x", Some(&set("0-1")), None).unwrap();
        rt.set_connected(false);
        let mut w = Shared(kernel.clone(), direct, Some(&rt));
        w.write_cpus(io, "x", &set("2-3")).unwrap();
        assert_eq!(kernel.lock().unwrap().cpus("x"), Some(&set("2-3")));
        assert!(metrics
            .render()
            .contains("rebalancer_nri_direct_writes_total{reason=\"not-connected\"} 1"));
        assert_eq!(rt.given("x").unwrap().cpus, Some(set("2-3")));
        rt.set_connected(true);
        rt.retrack([("x".to_string(), "idx".to_string())].into());
        let hook = rt.take_for_hook();
        assert_eq!(hook.len(), 1);
        assert_eq!(hook[0].container_id, "idx");
        let cpu = hook[0].linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!(cpu.cpu.as_ref().unwrap().cpus, "2-3");
        // a cgroup the runtime does not know is still only written, not queued
        assert_eq!(
            rt.submit("y", Some(&set("4")), None),
            Err(Direct::NotRuntimeContainer)
        );
        assert!(rt.take_for_hook().is_empty());
    }

    #[test]
    fn without_the_runtime_a_move_is_written_directly_and_counted() {
        let io = &mut Io::new();
        let kernel = Arc::new(Mutex::new(FakeCgroups::v2().with(
            "kubepods/pod1/c1",
            "0-1",
            "0",
        )));
        let direct = Arc::new(Mutex::new(Vec::new()));
        let metrics = Metrics::default();
        let rt = Runtime::new(metrics.clone());
        let mut w = Shared(kernel.clone(), direct.clone(), Some(&rt));
        crate::controller::apply(io, &a_move(), &mut w, false).unwrap();
        assert!(!direct.lock().unwrap().is_empty());
        assert!(metrics
            .render()
            .contains("rebalancer_nri_direct_writes_total{reason=\"not-connected\"}"));
        // Connected, but not a container of the runtime's.
        rt.set_connected(true);
        let mut mv = a_move();
        (mv.from_cpus, mv.to_cpus, mv.from_mems, mv.to_mems) =
            (set("2-3"), set("0-1"), set("1"), set("0"));
        crate::controller::apply(io, &mv, &mut w, false).unwrap();
        assert!(metrics
            .render()
            .contains("rebalancer_nri_direct_writes_total{reason=\"not-runtime-container\"}"));
        assert_eq!(
            kernel.lock().unwrap().cpus("kubepods/pod1/c1"),
            Some(&set("0-1"))
        );
    }

    /// N3: an update the runtime never answers times out (the session then closes the
    /// connection): counted, and what was in flight is named to be written again and queued
    /// for the next connection.
    #[test]
    fn an_unanswered_update_times_out_and_is_written_again() {
        let metrics = Metrics::default();
        let rt = Arc::new(Runtime::new(metrics.clone()));
        rt.set_connected(true);
        rt.set_updates(true);
        rt.track("a", "ida");
        rt.submit("a", Some(&set("1")), None).unwrap();
        assert_eq!(rt.take_batch().len(), 1);
        assert!(rt.take_batch().is_empty(), "one in flight");
        assert_eq!(rt.timed_out(), vec!["a".to_string()]);
        assert!(metrics
            .render()
            .contains("rebalancer_nri_updates_total{reason=\"timeout\"} 1"));
        assert!(!rt.updates_enabled(), "off");
        assert_eq!(
            rt.submit("a", Some(&set("1")), None),
            Err(Direct::NotConnected)
        );
        // reconnected: still queued, sent again
        rt.set_connected(true);
        assert!(rt.set_updates(true), "one timeout is not yet for good");
        assert_eq!(rt.take_batch().len(), 1);
        // a second one: the next Configure cannot turn unsolicited updates on again
        // (No flapping); the change, still queued, rides the next hook's answer
        assert_eq!(rt.timed_out(), vec!["a".to_string()]);
        rt.set_connected(true);
        assert!(!rt.set_updates(true));
        assert!(rt.updates_timed_out());
        assert!(rt.take_batch().is_empty());
        assert_eq!(rt.take_for_hook().len(), 1);
    }

    /// An update carried in a hook's answer is applied by the runtime after the
    /// hook returns, one container after the other; a newer out-of-hook write meanwhile may be
    /// overwritten by it. Once the answer is due (later for the containers further in it), a
    /// container given other cpus since is handed to the plugin to compare with cgroupfs,
    /// up to HOOK_LOOKS times, until found overwritten (queued again) or settled; one given
    /// nothing newer is done.
    #[test]
    fn a_write_newer_than_a_hooks_answer_is_looked_at_once_the_answer_is_due() {
        let rt = Runtime::new(Metrics::default());
        rt.set_connected(true);
        for (cg, id) in [("a", "ida"), ("b", "idb"), ("c", "idc")] {
            rt.track(cg, id);
        }
        rt.submit("a", Some(&set("1")), None).unwrap();
        rt.submit("b", Some(&set("3")), None).unwrap();
        rt.submit("c", Some(&set("5")), None).unwrap();
        assert_eq!(rt.take_for_hook().len(), 3, "all ride the answer");
        let t0 = Instant::now();
        assert!(rt.settle_hooked(t0).is_empty(), "not due yet");
        // a and c are moved again while the runtime applies the answer
        rt.submit("a", Some(&set("2")), None).unwrap();
        rt.submit("c", Some(&set("6")), None).unwrap();
        assert_eq!(rt.take_for_hook().len(), 2);
        rt.submit("a", Some(&set("0")), None).unwrap();
        // a's first answer is due after HOOK_SETTLE; but its newer answer replaced the watch
        let first = t0 + HOOK_SETTLE + HOOK_PER_UPDATE;
        let due = rt.settle_hooked(first);
        assert_eq!(
            due,
            vec![Settle {
                cgroup: "a".into(),
                sent: set("2")
            }],
            "the later answer's a (given 0 since) is due; b got nothing newer; c's second \
             answer, its second update, is not due yet"
        );
        let later = rt.settle_hooked(first + HOOK_PER_UPDATE);
        assert!(
            later.is_empty(),
            "c was given nothing newer than its answer: {later:?}"
        );
        // a is looked at again (the runtime may be slow), until found overwritten
        let again = rt.settle_hooked(first + HOOK_SETTLE);
        assert_eq!(again.len(), 1);
        rt.overwritten("a");
        assert!(rt.settle_hooked(first + HOOK_SETTLE * 10).is_empty());
        let told = rt.take_for_hook();
        assert_eq!(told.len(), 1, "a is told again");
        assert_eq!(told[0].container_id, "ida");
        // a watch ends after HOOK_LOOKS looks however long the runtime takes
        rt.submit("b", Some(&set("4")), None).unwrap();
        rt.take_for_hook();
        rt.submit("b", Some(&set("7")), None).unwrap();
        let mut t = Instant::now();
        let mut looks = 0;
        for _ in 0..10 {
            t += HOOK_SETTLE * 2;
            looks += rt.settle_hooked(t).len();
        }
        assert_eq!(looks, HOOK_LOOKS as usize);
    }

    /// A shrink that names many containers goes out in batches of at most
    /// MAX_BATCH, one in flight at a time, each answered before the next; all are sent once.
    #[test]
    fn many_queued_updates_go_out_in_bounded_batches() {
        let rt = Runtime::new(Metrics::default());
        rt.set_connected(true);
        assert!(rt.set_updates(true));
        let n = 2 * MAX_BATCH + 3;
        for i in 0..n {
            let cg = format!("c{i}");
            rt.track(&cg, &format!("id{i}"));
            rt.submit(&cg, Some(&set("1")), None).unwrap();
        }
        let mut sent = Vec::new();
        loop {
            let batch = rt.take_batch();
            if batch.is_empty() {
                break;
            }
            assert!(batch.len() <= MAX_BATCH, "{}", batch.len());
            assert!(rt.take_batch().is_empty(), "one batch in flight");
            sent.extend(batch.into_iter().map(|u| u.container_id));
            assert!(rt.answered(Ok(vec![])).is_empty());
        }
        let want: Vec<String> = (0..n).map(|i| format!("id{i}")).collect();
        assert_eq!(sent, want, "each once, in order");
    }

    /// N1: the shared pool's shrink through the runtime's writer is in cgroupfs at once; a
    /// failed runtime update leaves the books and the readers on what cgroupfs has.
    #[test]
    fn a_failed_update_leaves_the_books_on_what_cgroupfs_has() {
        let io = &mut Io::new();
        let root = tempfile::tempdir().unwrap();
        let cg = "kubepods/burstable/pod1/s";
        let put = |rel: &str, v: &str| {
            let p = root.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        };
        put("cgroup.controllers", "cpuset cpu memory\n");
        for dir in [
            "",
            "kubepods",
            "kubepods/burstable",
            "kubepods/burstable/pod1",
        ] {
            put(&format!("{dir}/cpuset.cpus.effective"), "0-7\n");
            put(&format!("{dir}/cpuset.mems.effective"), "0\n");
        }
        for f in [
            "cpuset.cpus",
            "cpuset.mems",
            "cpuset.cpus.effective",
            "cpuset.mems.effective",
        ] {
            put(
                &format!("{cg}/{f}"),
                if f.contains("mems") { "0\n" } else { "0-7\n" },
            );
        }
        let cgroups = Cgroups::new(crate::cgroup::mode::Mounts::scan_root(root.path()).unwrap());
        let metrics = Metrics::default();
        let rt = Arc::new(Runtime::new(metrics.clone()));
        rt.set_connected(true);
        rt.set_updates(true);
        rt.track(cg, "sid");
        let w = CgroupCpusetWriter::telling(cgroups.clone(), Some(rt.clone()));
        let pool = set("0-3,5-7");
        w.write(
            io,
            &CpusetChange {
                cgroup: cg.into(),
                cpus: pool.clone(),
                mems: None,
            },
        )
        .unwrap();
        assert_eq!(
            cgroups.cpus(cg).unwrap(),
            pool,
            "in cgroupfs before any answer"
        );
        assert_eq!(rt.take_batch().len(), 1);
        assert!(rt.answered(Err("refused".into())).is_empty());
        assert_eq!(w.cpus(cg), Some(pool.clone()));
        assert_eq!(cgroups.cpus(cg).unwrap(), pool);
        assert!(metrics
            .render()
            .contains("rebalancer_nri_updates_total{reason=\"failed\"} 1"));
    }
}

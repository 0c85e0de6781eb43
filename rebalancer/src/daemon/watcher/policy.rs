//! The watcher's admission policy: what a container cgroup that appeared asks for, read from
//! the cgroup itself — CPU limit from cpu.max (v1 cfs quota), CPU request from cpu.weight (v1
//! shares, inverted from kubelet's shares formula), memory limit from memory.max; QoS from the
//! path — and which call of the admission service it becomes: a container of a pod already
//! admitted through the API is bound to that pod's next unbound container; any other one is
//! admitted as a single-container pod, or, under `placement.scope = "pod"`, as one container of
//! its pod (`Admission::admit_member`) with the pod's totals read the same way from the pod
//! cgroup, whose limits kubelet sets to the pod's sums (`placement::hold`); the pod cgroup's
//! removal releases the pod. No inotify here (see `watcher`), and no allocation rules (see
//! `daemon::admission`).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::{
    cgroup::{classify_in, CgroupKind, Cgroups, Controller},
    config::{AdmissionMode, TopologyScope},
    daemon::admission::{Admission, AdmitError, Durability},
    daemon::Io,
    placement::{
        admission::PodMember,
        pod::{Container, Pod, Qos},
    },
};

/// How long a container's limits may take to appear after its cgroup: a runtime makes the
/// directory first and writes cpu.max / memory.max / cpu.weight just after (on v2 they live in
/// the directory itself), so at the inotify event they usually still show the defaults. Until
/// then the cgroup waits in the watcher's retry queue (never on its thread); after it, it is
/// admitted as it shows.
pub const LIMITS_GRACE: Duration = Duration::from_millis(250);

/// The kernel's default cgroup v2 cpu.weight: what a new cgroup shows before its runtime
/// writes the container's (kubelet's 2.6-CPU request maps to it too, and is rare).
const DEFAULT_V2_WEIGHT: u64 = 100;

/// Whether a container cgroup shows what its QoS class implies it will get: a Guaranteed one a
/// memory limit and its CPU (a quota, or without CFS quota a cpu.weight other than the
/// kernel default on cgroup v2); a Burstable one on cgroup v2 a cpu.weight other than the
/// default (v1's default shares equal a 1-CPU request, so there is nothing to wait for).
pub fn limits_ready(cgroups: &Cgroups, rel: &str, qos: Qos) -> bool {
    let v2_cpu = cgroups
        .hierarchy(Controller::Cpu)
        .is_ok_and(|(_, v)| v == crate::cgroup::Version::V2);
    let weight_set = || {
        !v2_cpu
            || cgroups
                .cpu_weight(rel)
                .is_ok_and(|w| w != DEFAULT_V2_WEIGHT)
    };
    match qos {
        Qos::Guaranteed => {
            cgroups.memory_max(rel).is_ok_and(|m| m.is_some())
                && (cgroups.cpu_max(rel).is_ok_and(|m| m.quota_us.is_some()) || weight_set())
        }
        Qos::Burstable => weight_set(),
        Qos::BestEffort => true,
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
    /// Its limits have not appeared yet (see [`LIMITS_GRACE`]): nothing done, to be seen
    /// again from the retry queue.
    NotReady {
        cgroup: String,
    },
    /// The cgroup was removed before its cpuset could be written (its container exited at
    /// once): the admission was undone. A normal race, logged at debug level.
    Vanished {
        cgroup: String,
    },
    /// Writing its cpuset failed: nothing was kept (no binding; a watcher admission undone).
    WriteFailed {
        cgroup: String,
    },
    Ignored,
}

impl WatchOutcome {
    /// True when the daemon's state changed (and must be checkpointed).
    pub fn changed(&self) -> bool {
        !matches!(
            self,
            WatchOutcome::Ignored
                | WatchOutcome::NotReady { .. }
                | WatchOutcome::Rejected { .. }
                | WatchOutcome::WriteFailed { .. }
        )
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

/// A Guaranteed container's CPU request from its cpu.weight, for one kubelet runs without a
/// CFS quota (`cpuCFSQuota: false`): the whole CPU count whose kubelet shares map to exactly
/// this weight when there is one (what a pinning node's containers ask for, and what exclusive
/// CPUs need), the approximate inverse otherwise.
pub fn guaranteed_millis_from_weight(weight: u64) -> u64 {
    let approx = request_millis_from_weight(weight);
    let whole = (approx + 500) / 1000;
    if whole > 0 && crate::cgroup::files::shares_to_weight(whole.saturating_mul(1024)) == weight {
        whole * 1000
    } else {
        approx
    }
}

/// The single-container pod the watcher admits for a container cgroup it does not know.
pub fn pod_for(cgroups: &Cgroups, rel: &str, pod_uid: &str, id: &str, qos: Qos) -> Pod {
    let name = id.chars().take(12).collect::<String>();
    Pod {
        uid: crate::placement::key::AllocKey::container(pod_uid, &name).to_string(),
        containers: vec![container_for(cgroups, rel, &name, qos)],
        init_containers: Vec::new(),
    }
}

/// What the cgroup `rel` asks for as one container of QoS class `qos`: for a container cgroup
/// the container's requests; for a pod cgroup the pod's totals (kubelet writes the pod's summed
/// CPU quota, shares / weight, memory and hugetlb limits there).
pub fn container_for(cgroups: &Cgroups, rel: &str, name: &str, qos: Qos) -> Container {
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
    // kubelet writes a Guaranteed container's hugepage requests as its hugetlb limits
    let huge = cgroups.hugetlb_limits(rel).unwrap_or_default();
    let (h2, h1) = if qos == Qos::Guaranteed {
        (
            huge.hugepages_2mi.unwrap_or(0),
            huge.hugepages_1gi.unwrap_or(0),
        )
    } else {
        (0, 0)
    };
    let (req, mem_req) = match qos {
        // without a CFS quota kubelet still writes the request as the weight
        Qos::Guaranteed if limit_millis == 0 => (
            cgroups
                .cpu_weight(rel)
                .map(guaranteed_millis_from_weight)
                .unwrap_or(0),
            mem_limit,
        ),
        Qos::Guaranteed => (limit_millis, mem_limit),
        Qos::Burstable => (weight_req.max(1), 0),
        Qos::BestEffort => (0, 0),
    };
    Container {
        name: name.into(),
        cpu_request_millis: if qos == Qos::BestEffort { 0 } else { req },
        cpu_limit_millis: if qos == Qos::Guaranteed { req } else { 0 },
        memory_bytes: mem_req,
        memory_limit_bytes: if qos == Qos::Guaranteed { mem_limit } else { 0 },
        hugepages_2mi_bytes: h2,
        hugepages_1gi_bytes: h1,
        ..Default::default()
    }
}

/// Handles a cgroup that appeared (first seen at `t0`): admit (or bind) and write its cpuset
/// (unless dry-run); `NotReady` while its limits are still to come within [`LIMITS_GRACE`]
/// of `t0`. The change is not checkpointed here (see `Durability::Deferred`).
pub fn created(
    io: &mut Io,
    adm: &Admission,
    cgroups: &Cgroups,
    rel: &str,
    t0: Instant,
) -> WatchOutcome {
    let rel = rel.trim_matches('/').to_string();
    let (kind, kubernetes, known, kube_root, pod_scope) = {
        let s = adm.daemon.lock(io);
        // Pods and containers only under kubelet's cgroup root (see cgroup::kube): a
        // kubepods-looking tree anywhere else is never admitted.
        let kube_root = s.cfg.cgroups.kubernetes_root.clone();
        let kind = classify_in(&rel, kube_root.as_deref(), &s.cfg.cgroups.roots);
        // known: a pod admitted whole through the API (its requests are known), or bound
        let known = match &kind {
            CgroupKind::Container { pod_uid, .. } => {
                s.state
                    .allocator
                    .pods
                    .get(pod_uid)
                    .is_some_and(|p| p.hold.is_none())
                    || s.state.bindings.contains_key(&rel)
            }
            _ => false,
        };
        let pod_scope = s.cfg.placement.scope == TopologyScope::Pod;
        (kind, s.cfg.cgroups.kubernetes, known, kube_root, pod_scope)
    };
    let CgroupKind::Container {
        pod_uid, qos, id, ..
    } = kind
    else {
        return WatchOutcome::Ignored;
    };
    if !kubernetes {
        return WatchOutcome::Ignored;
    }
    // kubelet writes its state files at pod admission, before the runtime makes the
    // containers: a changed file is read first (a stat when unchanged), as NRI does
    adm.refresh_kubelet(io);
    let kubelets = super::super::kubelet::cpu_assigned(&adm.daemon.lock(io), &pod_uid, None);
    if let Some(cpus) = kubelets {
        // kubelet's static managers placed the pod (adopted from their state files); its mems
        // are kubelet's. A cgroup does not say which container it is, so each is fenced off
        // the exclusive CPUs but the pod's own kubelet CPUs: a container kubelet
        // gave CPUs runs within the pod's own and is left as it is, a sidecar on kubelet's
        // shared pool keeps off the other exclusive CPUs. Again at each round (`refence`):
        // the runtime writes the cpuset after this.
        let fenced = adm.fence_unassigned(io, &rel, &pod_uid);
        tracing::info!(cgroup = %rel, pod = %pod_uid, kubelet_cpus = cpus, fenced = ?fenced, "container of a pod kubelet's static managers placed; mems left to kubelet, cpus kept off the exclusive CPUs but the pod's own kubelet CPUs");
        return WatchOutcome::Ignored;
    }
    // Through the API (its requests are known) or already bound: nothing to wait for. Limits
    // are only awaited for the Kubernetes layout (configured roots have no QoS-implied limits).
    if let CgroupKind::Container {
        qos: q @ (Qos::Guaranteed | Qos::Burstable),
        ..
    } = classify_in(&rel, kube_root.as_deref(), &[])
    {
        if !known && !limits_ready(cgroups, &rel, q) {
            if t0.elapsed() < LIMITS_GRACE {
                return WatchOutcome::NotReady { cgroup: rel };
            }
            tracing::warn!(cgroup = %rel, qos = ?q, "container cgroup still without the limits of its QoS class (cpu.max / memory.max, or cpu.weight) after {LIMITS_GRACE:?}; admitting what it shows");
        }
    }
    // A pod admitted through the API: bind to its next unbound container.
    match adm.bind(io, &rel, &pod_uid, Durability::Deferred, t0) {
        Ok(Some(_)) => {
            return WatchOutcome::Bound {
                cgroup: rel,
                pod: pod_uid,
            }
        }
        Ok(None) => {}
        Err(AdmitError::AlreadyBound(_)) => return WatchOutcome::Ignored,
        Err(AdmitError::Vanished(_)) => return WatchOutcome::Vanished { cgroup: rel },
        Err(AdmitError::WriteFailed(_)) => {
            tracing::warn!(cgroup = %rel, "not bound: its cpuset could not be written");
            return WatchOutcome::WriteFailed { cgroup: rel };
        }
        Err(e) => {
            tracing::warn!(cgroup = %rel, error = %e, "binding the container cgroup failed");
            return WatchOutcome::Ignored;
        }
    }
    let pod = pod_for(cgroups, &rel, &pod_uid, &id, qos);
    // Pod scope: one container of its pod, the pod's totals from the pod cgroup.
    let totals = (rel.rsplit_once('/').filter(|_| pod_scope))
        .map(|(pod_rel, _)| container_for(cgroups, pod_rel, "pod", qos));
    let member = totals.as_ref().map(|totals| PodMember {
        pod_uid: &pod_uid,
        totals,
        container: &pod.containers[0],
    });
    let answer = adm.admit_bound(io, &pod, member, &rel, Durability::Deferred, t0);
    // Not admitted: kept fenced off the exclusive CPUs as they change, until it goes.
    let refused = matches!(
        answer,
        Err(AdmitError::Rejected { .. } | AdmitError::Invalid(_) | AdmitError::Released(_))
    );
    {
        let mut s = adm.daemon.lock(io);
        if refused && !s.cfg.daemon.dry_run {
            s.refused.insert(rel.clone());
        } else {
            s.refused.remove(&rel);
        }
    }
    match answer {
        Ok(a) => {
            let p = &a.placements[0];
            tracing::info!(cgroup = %rel, cpus = %p.cpus, mems = %p.mems, micros = a.micros, "container cgroup admitted");
            WatchOutcome::Admitted {
                cgroup: rel,
                cpus: p.cpus.to_string(),
                mems: p.mems.to_string(),
                micros: a.micros,
            }
        }
        Err(AdmitError::Rejected { rejection, fenced }) => {
            // fenced: moved off the exclusive CPUs to the shared pool; None: left as the runtime
            // made it (dry run, no shared pool, the fence write failed, or already off them)
            tracing::warn!(cgroup = %rel, reason = %rejection.reason, details = %rejection.details, fenced = ?fenced,
                "container cgroup not admitted; unaccounted");
            WatchOutcome::Rejected {
                cgroup: rel,
                reason: rejection.reason.to_string(),
            }
        }
        Err(AdmitError::Vanished(_)) => WatchOutcome::Vanished { cgroup: rel },
        Err(AdmitError::WriteFailed(_)) => {
            tracing::warn!(cgroup = %rel, "admission undone: its cpuset could not be written");
            WatchOutcome::WriteFailed { cgroup: rel }
        }
        Err(AdmitError::AlreadyBound(_)) => WatchOutcome::Ignored,
        Err(e) => {
            tracing::warn!(cgroup = %rel, error = %e, "container cgroup not admitted");
            WatchOutcome::Rejected {
                cgroup: rel,
                reason: e.to_string(),
            }
        }
    }
}

/// Handles a cgroup that disappeared: unbind, and release a watcher-admitted pod; a pod
/// cgroup's removal releases a pod admitted one container at a time (pod scope). Not
/// checkpointed here.
pub fn removed(io: &mut Io, adm: &Admission, rel: &str) -> WatchOutcome {
    let rel = rel.trim_matches('/').to_string();
    adm.daemon.lock(io).refused.remove(&rel);
    if adm.unbind(io, &rel, Durability::Deferred).is_some() {
        tracing::info!(cgroup = %rel, "container cgroup removed; released");
        return WatchOutcome::Released { cgroup: rel };
    }
    let kind = {
        let s = adm.daemon.lock(io);
        classify_in(
            &rel,
            s.cfg.cgroups.kubernetes_root.as_deref(),
            &s.cfg.cgroups.roots,
        )
    };
    match kind {
        CgroupKind::Pod { uid, .. } if adm.pod_gone(io, &uid, Durability::Deferred) => {
            tracing::info!(cgroup = %rel, pod = %uid, "pod cgroup removed; the pod's hold released");
            WatchOutcome::Released { cgroup: rel }
        }
        _ => WatchOutcome::Ignored,
    }
}

/// Pods admitted one container at a time whose pod cgroup is not among `live` (paths relative
/// to the hierarchy) any more: released (the watcher missed the removal: a restart, an
/// overflow).
pub fn pods_gone(io: &mut Io, adm: &Admission, live: &[String]) -> Vec<WatchOutcome> {
    let held = adm.held_pods(io);
    if held.is_empty() {
        return Vec::new();
    }
    let (kube_root, roots) = {
        let s = adm.daemon.lock(io);
        (
            s.cfg.cgroups.kubernetes_root.clone(),
            s.cfg.cgroups.roots.clone(),
        )
    };
    let live_pods: std::collections::BTreeSet<String> = live
        .iter()
        .filter_map(|rel| match classify_in(rel, kube_root.as_deref(), &roots) {
            CgroupKind::Pod { uid, .. } => Some(uid),
            CgroupKind::Container { pod_uid, .. } => Some(pod_uid),
            _ => None,
        })
        .collect();
    held.into_iter()
        .filter(|uid| !live_pods.contains(uid))
        .filter(|uid| adm.pod_gone(io, uid, Durability::Deferred))
        .map(|uid| {
            tracing::info!(pod = %uid, "pod cgroup gone; the pod's hold released");
            WatchOutcome::Released { cgroup: uid }
        })
        .collect()
}

/// A control round's look at the limits of each container the watcher admitted (kubelet
/// writes cpu.max / memory.max anew for an in-place resize; the watcher sees no event for a
/// write): one that asks other requests than booked is resized as NRI's UpdateContainer is
/// (`Admission::resize`: grown within its affinity, shrunk back to the pool, or refused with a
/// reason, logged and counted in `rebalancer_admission_rejections_total`). A refused ask is
/// kept in `refused` and not tried (nor logged) again until the limits change once more.
/// Returns how many were resized. Watcher mode only; cgroupfs is read with no lock held.
pub fn resized(
    io: &mut Io,
    adm: &Admission,
    cgroups: &Cgroups,
    refused: &mut BTreeMap<String, Container>,
) -> usize {
    let bound: Vec<(String, String, String, Qos)> = {
        let s = adm.daemon.lock(io);
        if !matches!(s.admission, AdmissionMode::Watcher | AdmissionMode::Auto) {
            return 0;
        }
        let kube_root = s.cfg.cgroups.kubernetes_root.as_deref();
        (s.state.bindings.iter())
            // the watcher's own admissions (`pod_for`); the API's pods keep the API's requests
            .filter(|(_, b)| b.pod_uid.is_container())
            .filter_map(|(cg, b)| match classify_in(cg, kube_root, &[]) {
                CgroupKind::Container { qos, .. } => {
                    Some((cg.clone(), b.pod_uid.to_string(), b.container.clone(), qos))
                }
                _ => None,
            })
            .collect()
    };
    refused.retain(|cg, _| bound.iter().any(|(c, ..)| c == cg));
    let mut n = 0;
    for (cg, uid, name, qos) in bound {
        let asked = container_for(cgroups, &cg, &name, qos);
        if refused.get(&cg) == Some(&asked)
            || !(adm.daemon.lock(io).state.allocator).asks_other_than_booked(&uid, &asked)
        {
            continue;
        }
        match adm.resize(io, &cg, &asked, Durability::Deferred) {
            Ok(p) => {
                refused.remove(&cg);
                n += 1;
                // no placement: the one it had stays
                let cpus = p.as_ref().map(|p| p.cpus.to_string()).unwrap_or_default();
                let mems = p.as_ref().map(|p| p.mems.to_string()).unwrap_or_default();
                let exclusive = p.as_ref().map(|p| p.exclusive);
                tracing::info!(cgroup = %cg, cpu_millis = asked.cpu_request(), memory_bytes = asked.memory_limit_bytes,
                    cpus, mems, exclusive, "container resized (its limits changed)");
            }
            Err(e) => {
                tracing::warn!(cgroup = %cg, cpu_millis = asked.cpu_request(), memory_bytes = asked.memory_limit_bytes, error = %e, "container's new limits (a resize) refused; it keeps its placement and its books");
                refused.insert(cg, asked);
            }
        }
    }
    if n > 0 {
        adm.request_checkpoint(io);
    }
    n
}

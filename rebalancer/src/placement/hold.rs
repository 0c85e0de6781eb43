//! Pod scope for pods whose containers arrive one at a time (the cgroup watcher, NRI's
//! CreateContainer), where the API admits whole pods.
//!
//! kubelet's Topology Manager under `scope = "pod"` merges the hints of the pod's total — its
//! effective request: the larger of the init-container peak and the app containers' sum — and
//! allocates every container within that one affinity. A door that sees one container at a
//! time gives the pod's totals instead (the watcher: the pod cgroup's limits, which kubelet sets
//! to the pod's sum; NRI: `PodSandbox.linux.pod_resources`, kubelet's sandbox resources):
//!
//! - The first container of the pod ([`Allocator::admit_member`]) computes the pod's hint from
//!   the totals (refused as kubelet's TopologyAffinityError when no aligned affinity fits), books
//!   the whole pod's CPU request and memory in the node's capacity, and keeps a [`PodHold`]: the
//!   pod's hint and what its containers still to come will need — exclusive CPUs and Memory
//!   Manager memory within the hint's nodes — so nothing else is given the pod's share.
//! - Every container of the pod is allocated within the pod's hint from the hold first (its CPUs
//!   taken from the held ones when they suffice); the hold then shrinks to the totals minus what
//!   the pod's live containers hold.
//! - A container that goes away ([`Allocator::remove_member`]) gives its share back to the hold
//!   (a regular init container's CPUs and memory are so reused by the app containers after it,
//!   as kubelet reuses them); the hold, and the pod, are released with the pod
//!   ([`Allocator::release`]: the pod cgroup removed, RemovePodSandbox).
//!
//! What the totals cannot tell: which of the pod's CPUs are exclusive (a pod of two 1.5-CPU
//! containers shows 3 CPUs, like one of 2 + 1). The pod's hint and hold are computed as if a
//! whole-number CPU total were all exclusive (Guaranteed pods under the static CPU policy; a
//! fractional total holds no CPUs, only memory): the affinity is the one the largest exclusive
//! demand the totals allow would get, and a shared container later takes its CPUs from the
//! shared pool of that affinity, its share of the held CPUs freed for it. Totals smaller than a container (no `pod_resources`, a pod cgroup without limits)
//! count as that container: the pod is then as large as the containers seen so far.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    exclusive_cpus, memory_managed, memory_request, AdmittedPod, Allocator, Container,
    ContainerKind, ContainerPlacement, Overuse, Rejection, Reuse, R,
};
use crate::config::{PlacementConfig, TopologyPolicy};
use crate::cpuset::CpuSet;
use crate::placement::cpu::{self, CpuView, StaticOptions};
use crate::placement::memory::{MemoryAllocation, MemoryRequest};
use crate::placement::pod::{Pod, Qos};
use crate::placement::{NodeMask, TopologyHint};
use crate::topology::Topology;

/// What a pod admitted one container at a time holds for its containers still to come.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodHold {
    /// The pod's totals (its effective requests), as one container.
    pub totals: Container,
    /// The pod's merged hint: every container of the pod is allocated within it.
    pub hint: TopologyHint,
    /// The decision that gave `hint` (shown with each of the pod's containers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<crate::placement::decision::HintDecision>,
    /// Exclusive CPUs set aside (in no container's cpuset; no one else's either).
    pub cpus: CpuSet,
    /// Memory Manager memory set aside on the pod's nodes.
    pub memory: Option<MemoryAllocation>,
    /// The live containers' node-level memory requests (memory and hugepages, by container
    /// name): what the pod books grows past its totals with them, as its CPU request does.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub members: BTreeMap<String, MemoryRequest>,
}

/// One container of a pod admitted one container at a time.
#[derive(Clone, Copy, Debug)]
pub struct PodMember<'a> {
    /// The pod's uid: the allocator's key for the whole pod.
    pub pod_uid: &'a str,
    /// The pod's totals as the door reads them.
    pub totals: &'a Container,
    pub container: &'a Container,
}

/// `totals`, raised field by field to at least `c` (the pod is at least its container); the
/// pod's attached devices known so far are the container's (no door sees a pod's devices).
fn at_least(totals: &Container, c: &Container) -> Container {
    Container {
        name: "pod".into(),
        cpu_request_millis: totals.cpu_request().max(c.cpu_request()),
        cpu_limit_millis: totals.cpu_limit_millis.max(c.cpu_limit_millis),
        memory_bytes: totals.memory_request().max(c.memory_request()),
        memory_limit_bytes: totals.memory_limit_bytes.max(c.memory_limit_bytes),
        hugepages_2mi_bytes: totals.hugepages_2mi_bytes.max(c.hugepages_2mi_bytes),
        hugepages_1gi_bytes: totals.hugepages_1gi_bytes.max(c.hugepages_1gi_bytes),
        attached_devices: c.attached_devices.clone(),
        ..Default::default()
    }
}

/// Millicores the pod's live containers use: exclusive CPUs whole, shared ones their charge.
fn live_millis(pod: &AdmittedPod) -> u64 {
    pod.containers
        .iter()
        .map(|x| {
            if x.placement.exclusive {
                x.placement.cpus.len() as u64 * 1000
            } else {
                x.charges.values().sum()
            }
        })
        .sum()
}

impl Allocator {
    /// Admits one container of a pod under pod scope (see the module doc), or refuses it; on
    /// refusal the state is unchanged. The first container's refusal refuses the pod (nothing
    /// is held); a later one's refuses only that container.
    pub fn admit_member(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        m: PodMember<'_>,
    ) -> Result<ContainerPlacement, Rejection> {
        self.admit_member_seeing(topo, cfg, m, Overuse::NONE)
    }

    /// As [`Allocator::admit_member`], the measured `overuse` ordering the shared pools that
    /// fit (see [`Allocator::admit_seeing`]).
    pub fn admit_member_seeing(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        m: PodMember<'_>,
        overuse: &Overuse,
    ) -> Result<ContainerPlacement, Rejection> {
        let mut next = self.clone();
        let p = next.admit_member_inner(topo, cfg, m, overuse)?;
        *self = next;
        Ok(p)
    }

    fn admit_member_inner(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        m: PodMember<'_>,
        overuse: &Overuse,
    ) -> Result<ContainerPlacement, Rejection> {
        let c = m.container;
        let one = Pod {
            uid: m.pod_uid.to_string(),
            containers: vec![c.clone()],
            init_containers: Vec::new(),
        };
        one.validate()
            .map_err(|d| Rejection::new(R::InvalidPod, d))?;
        let view = CpuView::new(topo);
        if !self.pods.contains_key(m.pod_uid) {
            let totals = at_least(m.totals, c);
            let whole = Pod {
                containers: vec![totals.clone()],
                ..one.clone()
            };
            // The pod's QoS is its totals' (the doors shape them by the pod's QoS class).
            let qos = whole.qos();
            let (cpu_total, mem_total) = self.check_capacity(&view, &whole)?;
            let (hint, decision) = self.hint_for(topo, cfg, &view, qos, &[&totals], None, None)?;
            self.pods.insert(
                crate::placement::key::AllocKey::pod(m.pod_uid),
                AdmittedPod {
                    qos,
                    cpu_request_millis: cpu_total,
                    memory_request: mem_total,
                    containers: Vec::new(),
                    hold: Some(PodHold {
                        totals,
                        hint,
                        decision,
                        cpus: CpuSet::new(),
                        memory: None,
                        members: BTreeMap::new(),
                    }),
                },
            );
        }
        let pod = &self.pods[m.pod_uid];
        let Some(mut hold) = pod.hold.clone() else {
            return Err(Rejection::new(
                R::AlreadyAdmitted,
                format!("pod {} is admitted as a whole pod", m.pod_uid),
            ));
        };
        if pod
            .containers
            .iter()
            .any(|x| x.placement.container == c.name)
        {
            return Err(Rejection::new(
                R::AlreadyAdmitted,
                format!(
                    "container {} of pod {} is already admitted",
                    c.name, m.pod_uid
                ),
            ));
        }
        let qos = pod.qos;
        // Every container of a Guaranteed pod is Guaranteed, every one of a BestEffort pod is
        // BestEffort (a Burstable pod may have any); the doors derive both from the pod's QoS.
        let own = one.qos();
        if qos != own && qos != Qos::Burstable {
            return Err(Rejection::new(
                R::InvalidPod,
                format!(
                    "container {} asks as a {own:?} container, but pod {} is {qos:?}",
                    c.name, m.pod_uid
                ),
            ));
        }
        // Containers beyond the totals (a door without the pod's totals) grow the pod's
        // node-level CPU request, within what the node has left.
        let live = live_millis(pod) + c.cpu_request();
        if live > pod.cpu_request_millis {
            let allocatable = view.online.difference(&self.reserved_cpus).len() as u64 * 1000;
            let used: u64 = self
                .pods
                .iter()
                .filter(|(k, _)| k.as_str() != m.pod_uid)
                .map(|(_, p)| p.cpu_request_millis)
                .sum();
            if used + live > allocatable {
                return Err(Rejection::new(
                    R::InsufficientCpu,
                    format!(
                        "pod {} would request {live}m, {}m of {allocatable}m allocatable left",
                        m.pod_uid,
                        allocatable.saturating_sub(used)
                    ),
                ));
            }
            if let Some(p) = self.pods.get_mut(m.pod_uid) {
                p.cpu_request_millis = live;
            }
        }
        // ... and its node-level memory request (memory, hugepages: what `check_capacity`
        // counts), within what the nodes have left: a door without the pod's hugepages (NRI's
        // pod_resources has none) or without totals books the containers it has seen
        hold.members.insert(c.name.clone(), memory_request(c));
        let grown = self.grown_memory(m.pod_uid, &hold)?;
        if let Some(p) = self.pods.get_mut(m.pod_uid) {
            p.memory_request.extend(grown);
        }
        // What the hold kept is the container's to take first.
        self.drop_hold(m.pod_uid);
        let mut reuse = Reuse {
            prefer: hold.cpus.clone(),
            ..Reuse::default()
        };
        let mut a = self.allocate(
            topo,
            cfg,
            &view,
            qos,
            m.pod_uid,
            c,
            ContainerKind::App,
            hold.hint,
            &mut reuse,
            overuse,
        )?;
        a.placement.topology = hold.decision.clone();
        // A container beyond the pod's totals (wrong or missing totals) may not fit the pod's
        // affinity: restricted and single-numa-node refuse it, as kubelet's admission would
        // have refused the pod it belongs to; best-effort lets it spill, as kubelet does.
        if matches!(
            cfg.policy,
            TopologyPolicy::Restricted | TopologyPolicy::SingleNumaNode
        ) {
            let mems = NodeMask::from_ids(a.placement.mems.iter()).unwrap_or_default();
            let within = hold.hint.affinity.unwrap_or(mems);
            // CPUs and memory both: the Memory Manager may have extended the memory past
            // the affinity (a request beyond the node's free memory).
            if !view
                .nodes_of(&a.placement.cpus)
                .is_subset_of(within.and(mems))
                || !mems.is_subset_of(within)
            {
                return Err(Rejection::new(
                    R::TopologyAffinityError,
                    format!(
                        "container {} does not fit pod {}'s NUMA affinity {:?} (the pod's totals: {}m CPU)",
                        c.name, m.pod_uid, hold.hint.affinity, hold.totals.cpu_request()
                    ),
                ));
            }
        }
        let placement = a.placement.clone();
        let pod = self.pods.get_mut(m.pod_uid).expect("inserted above");
        pod.containers.push(a);
        self.place_hold(cfg, &view, m.pod_uid, hold, CpuSet::new());
        Ok(placement)
    }

    /// A container of a pod admitted one container at a time went away: its CPUs, memory and
    /// shared charges go back to the pod's hold. `false` when `uid` holds no such pod or
    /// container (a pod admitted whole is released whole).
    pub fn remove_member(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        uid: &str,
        container: &str,
    ) -> bool {
        let Some(pod) = self.pods.get_mut(uid) else {
            return false;
        };
        let Some(hold) = pod.hold.clone() else {
            return false;
        };
        let Some(i) = pod
            .containers
            .iter()
            .position(|c| c.placement.container == container)
        else {
            return false;
        };
        let gone = pod.containers.remove(i);
        for (cpu, m) in &gone.charges {
            if let Some(l) = self.shared_load.get_mut(cpu) {
                *l -= (*m).min(*l);
                if *l == 0 {
                    self.shared_load.remove(cpu);
                }
            }
        }
        if let Some(a) = &gone.memory {
            self.memory.release(a);
        }
        let freed = if gone.placement.exclusive {
            gone.placement.cpus.clone()
        } else {
            CpuSet::new()
        };
        // what the pod books shrinks back toward its totals (never below them) as what grew
        // it goes
        let mut hold = hold;
        hold.members.remove(container);
        let cpu_floor = hold.totals.cpu_request().max(live_millis(pod));
        pod.cpu_request_millis = pod.cpu_request_millis.min(cpu_floor);
        let totals = memory_request(&hold.totals);
        for (r, b) in pod.memory_request.iter_mut() {
            let live: u64 = hold.members.values().filter_map(|q| q.get(r)).sum();
            let keep = totals.get(r).copied().unwrap_or(0).max(live);
            *b = (*b).min(keep);
        }
        pod.memory_request.retain(|_, b| *b > 0);
        self.drop_hold(uid);
        self.place_hold(cfg, &CpuView::new(topo), uid, hold, freed);
        true
    }

    /// The resources whose sum over the pod's live containers (`hold.members`) is past what
    /// the pod books, at that sum; refused when the nodes' allocatable, less what the other
    /// pods book, does not hold it.
    fn grown_memory(&self, uid: &str, hold: &PodHold) -> Result<MemoryRequest, Rejection> {
        let booked = &self.pods[uid].memory_request;
        let mut live = MemoryRequest::new();
        for req in hold.members.values() {
            for (&r, &b) in req {
                *live.entry(r).or_default() += b;
            }
        }
        let mut grown = MemoryRequest::new();
        for (r, b) in live {
            if b <= booked.get(&r).copied().unwrap_or(0) {
                continue;
            }
            let alloc = self.allocatable_memory(r);
            let used = self.booked_memory(r, Some(uid));
            if used + b > alloc {
                return Err(Rejection::new(
                    R::InsufficientMemory,
                    format!(
                        "pod {uid} would request {b} bytes of {}, {} of {alloc} allocatable left",
                        r.name(),
                        alloc.saturating_sub(used)
                    ),
                ));
            }
            grown.insert(r, b);
        }
        Ok(grown)
    }

    /// Releases what the pod's hold keeps (its CPUs are then in no one's books) and leaves an
    /// empty hold with the pod's totals and hint.
    fn drop_hold(&mut self, uid: &str) {
        let Some(h) = self.pods.get_mut(uid).and_then(|p| p.hold.as_mut()) else {
            return;
        };
        h.cpus = CpuSet::new();
        if let Some(a) = h.memory.take() {
            self.memory.release(&a);
        }
    }

    /// Sets aside what the pod's containers still need (totals minus what its live containers
    /// hold) within the pod's hint: exclusive CPUs from the ones it kept before (`old.cpus`,
    /// then `freed`) first, then the exclusive pool of the hint's nodes; memory on the nodes of
    /// the pod's memory. As much as is there, never failing: the containers take the rest, or
    /// are refused, as they come.
    fn place_hold(
        &mut self,
        cfg: &PlacementConfig,
        view: &CpuView,
        uid: &str,
        old: PodHold,
        freed: CpuSet,
    ) {
        let pod = &self.pods[uid];
        let qos = pod.qos;
        let totals = &old.totals;
        // what the live containers use, in millicores: exclusive CPUs whole, shared charges
        let used = live_millis(pod);
        let need = (exclusive_cpus(cfg, qos, totals).unwrap_or(0) as u64 * 1000)
            .saturating_sub(used) as usize
            / 1000;
        let mut mem_need = MemoryRequest::new();
        if memory_managed(cfg, qos) {
            for (r, b) in memory_request(totals) {
                let used: u64 = pod
                    .containers
                    .iter()
                    .filter_map(|c| c.memory.as_ref())
                    .flat_map(|a| a.taken.iter())
                    .filter(|(_, rr, _)| *rr == r)
                    .map(|(_, _, t)| t)
                    .sum();
                if b > used {
                    mem_need.insert(r, b - used);
                }
            }
        }
        let mem_mask = pod
            .containers
            .iter()
            .find_map(|c| c.memory.as_ref().map(|a| a.nodes))
            .or(old.hint.affinity);
        let mut cpus = CpuSet::new();
        if need > 0 {
            let within = old
                .hint
                .affinity
                .map_or(view.online.clone(), |a| view.cpus_of_mask(a));
            // the CPUs it kept (and a removed container's) are its own, whatever the shared
            // containers' minimum would keep
            let ours = old
                .cpus
                .union(&freed)
                .intersection(&within)
                .intersection(&view.online)
                .difference(&self.exclusive_cpus())
                .difference(&self.reserved_cpus);
            let pool = self
                .exclusive_pool(view, cfg.overcommit_ratio)
                .intersection(&within)
                .union(&ours);
            let opts = StaticOptions {
                full_pcpus_only: false,
                distribute_across_numa: false,
                align_by_socket: false,
                ..StaticOptions::of(cfg)
            };
            let shared = self.shared_pool(view);
            let kept = ours;
            for n in (1..=need.min(pool.len())).rev() {
                let from_kept = (kept.len() >= n)
                    .then(|| cpu::take_by_topology(view, &kept, n, &opts).ok())
                    .flatten();
                let got = from_kept.or_else(|| {
                    let rest = cpu::take_by_topology(
                        view,
                        &pool.difference(&kept),
                        n - kept.len().min(n),
                        &opts,
                    )
                    .ok()?;
                    Some(kept.union(&rest))
                });
                let Some(got) = got.filter(|g| g.len() == n) else {
                    continue;
                };
                if self
                    .check_no_starvation(view, &shared.difference(&got), cfg.overcommit_ratio)
                    .is_ok()
                {
                    cpus = got;
                    break;
                }
            }
        }
        // never on a mask that would break another pod's NUMA group: a single node is held
        // with its group, a mask across groups holds nothing (the containers are then
        // allocated, or refused, as they come)
        let memory = match (mem_need.is_empty(), mem_mask) {
            (false, Some(mask)) => self
                .memory
                .unbroken(mask)
                .map(|m| self.memory.allocate(&mem_need, m)),
            _ => None,
        };
        if let Some(p) = self.pods.get_mut(uid) {
            p.hold = Some(PodHold {
                cpus,
                memory,
                ..old
            });
        }
    }
}

#[cfg(test)]
#[path = "hold_tests.rs"]
mod tests;

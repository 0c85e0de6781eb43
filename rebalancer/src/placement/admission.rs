//! Pod admission over all providers (CPU, memory, devices): Topology Manager scopes and
//! policies, then allocation. The [`Allocator`] is a plain serialisable value (the future
//! checkpoint); `admit` is atomic (a refused pod changes nothing) and `release` undoes a pod
//! exactly.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{
    AllocationStrategy, CpuManagerPolicy, MemoryManagerPolicy, PlacementConfig, SharedCpuPolicy,
    TopologyPolicy, TopologyScope,
};
use crate::cpuset::CpuSet;
use crate::placement::cpu::{self, CpuError, CpuView, StaticOptions};
use crate::placement::decision::HintDecision;
use crate::placement::device::{DeviceError, DeviceOwner, DeviceRequest, DeviceState};
use crate::placement::memory::{
    reusable_on, update_reusable, ContainerKind, MemoryAllocation, MemoryError, MemoryRequest,
    MemoryResource, MemoryState, ReusableMemory,
};
use crate::placement::merge::{self, MergeOptions};
use crate::placement::numa_info::NumaInfo;
pub use crate::placement::shared::Overuse;
use crate::placement::shared::{spread, Charges, SharedPools};
use crate::placement::{NodeMask, TopologyHint};
use crate::topology::Topology;

use crate::placement::key::AllocKey;
pub use crate::placement::pod::{
    Container, ContainerPlacement, Pod, Qos, Rejection, RejectionReason,
};

use RejectionReason as R;

pub use crate::placement::merge::ProviderHints;

#[path = "hold.rs"]
mod hold;
#[path = "resize.rs"]
mod resize;
pub use hold::{PodHold, PodMember};

/// Why an allocator could not be built from the machine and config.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("placement.reserved_cpus: {0}")]
    ReservedCpus(#[from] crate::cpuset::ParseCpuListError),
    #[error("placement.reserved_memory: {0}")]
    ReservedMemory(#[from] MemoryError),
    #[error("placement.reserved_cpus {reserved} leaves no CPU for workloads")]
    NoCpuLeft { reserved: CpuSet },
    #[error("the machine has {nodes} NUMA nodes, more than placement.max_allowable_numa_nodes = {max} allows under topology policy {policy:?} (kubelet refuses to start too)")]
    TooManyNodes {
        nodes: usize,
        max: u32,
        policy: TopologyPolicy,
    },
}

/// One admitted container: its placement and what it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmittedContainer {
    pub placement: ContainerPlacement,
    /// App, init or sidecar container.
    #[serde(default)]
    pub kind: ContainerKind,
    /// Millicores charged on shared CPUs (empty for exclusive containers).
    pub charges: Charges,
    pub memory: Option<MemoryAllocation>,
}

/// An exclusive placement that lost CPUs to hotplug (see [`Allocator::replace_offline`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replaced {
    pub pod_uid: String,
    pub container: String,
    /// Its CPUs that went offline.
    pub lost: CpuSet,
    /// Online CPUs it got in their place.
    pub added: CpuSet,
    /// Its cpuset now.
    pub cpus: CpuSet,
}

/// One admitted pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmittedPod {
    pub qos: Qos,
    pub cpu_request_millis: u64,
    /// Requested bytes per memory resource (node-level capacity accounting).
    pub memory_request: MemoryRequest,
    pub containers: Vec<AdmittedContainer>,
    /// Pod scope for a pod admitted one container at a time: what it holds for its containers
    /// still to come (see `hold`). None for pods admitted whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<PodHold>,
}

/// The admission state: reserved CPUs, shared-pool charges, memory, devices, admitted pods.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocator {
    pub reserved_cpus: CpuSet,
    /// strict-cpu-reservation: the reserved CPUs are off the shared pool too.
    #[serde(default)]
    pub strict_reservation: bool,
    pub shared_load: Charges,
    pub memory: MemoryState,
    pub devices: DeviceState,
    pub pods: BTreeMap<crate::placement::key::AllocKey, AdmittedPod>,
    /// CPUs held while an exclusive container's cpus are written (`daemon::apply`: a move's
    /// old and new CPUs, keyed by its cgroup; `Admission::resize`: the old and new exclusive
    /// CPUs, keyed `resize <cgroup>`): exclusive until the write ended, so no admission hands
    /// them out and no shared container is set onto them meanwhile. Not checkpointed: a write
    /// under way does not outlive the daemon.
    #[serde(skip)]
    pub in_flight: BTreeMap<String, CpuSet>,
    /// Memory Manager memory held while a resize's write runs (keyed as `in_flight`): what a
    /// shrink freed, which an undo books again. Not checkpointed, as `in_flight`.
    #[serde(skip)]
    pub in_flight_memory: BTreeMap<String, MemoryAllocation>,
}

impl Allocator {
    /// An empty state for `topo` with the config's reserved CPUs and memory.
    pub fn new(topo: &Topology, cfg: &PlacementConfig) -> Result<Allocator, PlacementError> {
        let reserved_cpus = cfg.reserved_cpus.clone();
        if topo.online_cpus().is_subset(&reserved_cpus) {
            return Err(PlacementError::NoCpuLeft {
                reserved: reserved_cpus,
            });
        }
        if cfg.policy != TopologyPolicy::None
            && topo.nodes.len() > cfg.max_allowable_numa_nodes as usize
        {
            return Err(PlacementError::TooManyNodes {
                nodes: topo.nodes.len(),
                max: cfg.max_allowable_numa_nodes,
                policy: cfg.policy,
            });
        }
        Ok(Allocator {
            reserved_cpus,
            strict_reservation: cfg.strict_cpu_reservation,
            shared_load: Charges::new(),
            memory: MemoryState::new(topo, &cfg.reserved_memory)?,
            devices: DeviceState::default(),
            pods: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            in_flight_memory: BTreeMap::new(),
        })
    }

    /// CPUs held exclusively by admitted containers, by pods for their containers still
    /// to come (`PodHold`), and by exclusive containers' changes under way (`in_flight`).
    pub fn exclusive_cpus(&self) -> CpuSet {
        let held = self
            .pods
            .values()
            .filter_map(|p| p.hold.as_ref())
            .map(|h| &h.cpus)
            .chain(self.in_flight.values())
            .fold(CpuSet::new(), |a, h| a.union(h));
        self.placements()
            .filter(|p| p.exclusive)
            .fold(held, |a, p| a.union(&p.cpus))
    }

    /// Every admitted container's placement, by pod uid then container order.
    pub fn placements(&self) -> impl Iterator<Item = &ContainerPlacement> {
        self.pods
            .values()
            .flat_map(|p| p.containers.iter().map(|c| &c.placement))
    }

    /// The shared pool now: online CPUs minus exclusive ones, and minus the reserved ones
    /// under strict-cpu-reservation (kubelet keeps reserved CPUs in the shared pool otherwise).
    pub fn shared_pool(&self, view: &CpuView) -> CpuSet {
        let pool = view.online.difference(&self.exclusive_cpus());
        if self.strict_reservation {
            pool.difference(&self.reserved_cpus)
        } else {
            pool
        }
    }

    /// The CPUs an exclusive allocation may take: the shared pool minus what the shared
    /// containers need to keep — one CPU of each one's pool, and per node enough shared CPUs to
    /// carry the node's shared charge within `ratio`. The kept CPUs are the highest-numbered of
    /// each pool (exclusive allocations pack from the low end), so the hints steer a Guaranteed
    /// pod to another node rather than starving a Burstable pod confined to this one.
    fn exclusive_pool(&self, view: &CpuView, ratio: f64) -> CpuSet {
        let shared = self.shared_pool(view);
        let mut keep = CpuSet::new();
        for p in self.pods.values() {
            for c in p.containers.iter().filter(|c| !c.placement.exclusive) {
                let pool = c.placement.cpus.intersection(&shared);
                if pool.is_disjoint(&keep) {
                    if let Some(last) = pool.iter().last() {
                        keep.insert(last);
                    }
                }
            }
        }
        for cpus in view.nodes.values() {
            let load: u64 = cpus.iter().filter_map(|c| self.shared_load.get(&c)).sum();
            let need = (load as f64 / (1000.0 * ratio)).ceil() as usize;
            let node_shared = cpus.intersection(&shared);
            let have = node_shared.intersection(&keep).len();
            let mut spare: Vec<u32> = node_shared.iter().filter(|&c| !keep.contains(c)).collect();
            spare.reverse();
            for cpu in spare.into_iter().take(need.saturating_sub(have)) {
                keep.insert(cpu);
            }
        }
        shared.difference(&keep).difference(&self.reserved_cpus)
    }

    /// A shared container's cpuset now (its admission pool minus CPUs since made exclusive).
    pub fn current_cpus(&self, uid: &str, container: &str) -> Option<CpuSet> {
        let pod = self.pods.get(uid)?;
        let c = pod
            .containers
            .iter()
            .find(|c| c.placement.container == container)?;
        if c.placement.exclusive {
            return Some(c.placement.cpus.clone());
        }
        Some(c.placement.cpus.difference(&self.exclusive_cpus()))
    }

    /// A control-round move wrote `cpus` for this container: its placement follows them (for
    /// a shared container, its pool and its CPU charges spread over it), so later admissions
    /// decide on where it runs now. Returns true when its exclusive CPUs changed (the shared
    /// containers' cpusets then follow). False, and nothing changes, for an unknown container.
    pub fn record_move_cpus(&mut self, uid: &str, container: &str, cpus: &CpuSet) -> bool {
        let Some(c) = self.pods.get_mut(uid).and_then(|p| {
            p.containers
                .iter_mut()
                .find(|c| c.placement.container == container)
        }) else {
            return false;
        };
        if c.placement.cpus == *cpus {
            return false;
        }
        c.placement.cpus = cpus.clone();
        if c.placement.exclusive {
            return true;
        }
        let millis: u64 = c.charges.values().sum();
        for (cpu, m) in &c.charges {
            if let Some(l) = self.shared_load.get_mut(cpu) {
                *l -= (*m).min(*l);
                if *l == 0 {
                    self.shared_load.remove(cpu);
                }
            }
        }
        c.charges = spread(cpus, millis);
        for (cpu, m) in &c.charges {
            *self.shared_load.entry(*cpu).or_default() += m;
        }
        false
    }

    /// A control-round move's mems were written (its memory migrated): the container's mems
    /// follow, and its Memory Manager memory is re-booked on the new nodes when they can take
    /// it all (else the booking stays where it was).
    pub fn record_move_mems(&mut self, uid: &str, container: &str, mems: &CpuSet) {
        let Some(c) = self.pods.get_mut(uid).and_then(|p| {
            p.containers
                .iter_mut()
                .find(|c| c.placement.container == container)
        }) else {
            return;
        };
        if c.placement.mems == *mems {
            return;
        }
        c.placement.mems = mems.clone();
        if let (Some(mem), Some(mask)) = (&c.memory, NodeMask::from_ids(mems.iter())) {
            if mask != mem.nodes {
                if let Some((state, new)) = rebook_memory(self.memory.clone(), mem, mask) {
                    self.memory = state;
                    c.memory = Some(new);
                }
            }
        }
    }

    /// CPUs went offline (hotplug, a node taken away): each exclusive placement that held some
    /// gets as many online CPUs from the exclusive pool in their place — within its NUMA
    /// affinity first, then anywhere, whole cores when `full_pcpus_only` asks and single CPUs
    /// when nothing else is left — so a Guaranteed container keeps its CPU count. One that
    /// cannot be made whole keeps its online CPUs plus what could be found (`added` shorter
    /// than `lost`); one left with no online CPU at all keeps its old set (the kernel then runs
    /// it on its parent's CPUs). Shared placements need nothing: the shared pool is derived
    /// from the online CPUs every time.
    pub fn replace_offline(&mut self, topo: &Topology, cfg: &PlacementConfig) -> Vec<Replaced> {
        let view = CpuView::new(topo);
        let online = &view.online;
        let hit: Vec<(bool, String, usize)> = self
            .pods
            .iter()
            // kubelet's own placements (adopted from its state files) are kubelet's to fix
            .filter(|(uid, _)| !uid.is_kubelet())
            .flat_map(|(uid, p)| {
                p.containers
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.placement.exclusive && !c.placement.cpus.is_subset(online))
                    .map(|(i, c)| (c.kind == ContainerKind::Init, uid.to_string(), i))
                    .collect::<Vec<_>>()
            })
            .collect();
        // Regular init containers last: they run to completion before the pod's other
        // containers start, and the CPUs they held live on in the containers that reuse them,
        // so those (the ones that keep running) are made whole first.
        let mut hit = hit;
        hit.sort_by_key(|&(init, _, _)| init);
        let hit: Vec<(String, usize)> = hit.into_iter().map(|(_, uid, i)| (uid, i)).collect();
        let mut out = Vec::new();
        for (uid, i) in hit {
            let placement = &self.pods[&uid].containers[i].placement;
            let (old, affinity) = (placement.cpus.clone(), placement.affinity);
            let lost = old.difference(&view.online);
            let keep = old.intersection(&view.online);
            // The lost CPUs are not in the exclusive pool (offline); the kept ones are held.
            let pool = self.exclusive_pool(&view, cfg.overcommit_ratio);
            let strict = StaticOptions {
                distribute_across_numa: false,
                ..StaticOptions::of(cfg)
            };
            let loose = StaticOptions {
                full_pcpus_only: false,
                align_by_socket: false,
                ..strict
            };
            let mut added = CpuSet::new();
            for n in (1..=lost.len()).rev() {
                let tries = [(affinity, strict), (None, strict), (None, loose)];
                let shared = self.shared_pool(&view);
                if let Some(got) = tries.iter().find_map(|(a, o)| {
                    let got = cpu::allocate_exclusive(&view, &pool, n, *a, o).ok()?;
                    // As at admission: the shared containers keep enough CPUs.
                    self.check_no_starvation(&view, &shared.difference(&got), cfg.overcommit_ratio)
                        .ok()
                        .map(|()| got)
                }) {
                    added = got;
                    break;
                }
            }
            let cpus = keep.union(&added);
            if cpus.is_empty() {
                out.push(Replaced {
                    pod_uid: uid,
                    container: placement.container.clone(),
                    lost,
                    added,
                    cpus: old,
                });
                continue;
            }
            let container = placement.container.clone();
            self.pods.get_mut(&uid).expect("listed above").containers[i]
                .placement
                .cpus = cpus.clone();
            out.push(Replaced {
                pod_uid: uid,
                container,
                lost,
                added,
                cpus,
            });
        }
        out
    }

    /// kubelet's Memory Manager `Start` check of a restored state against the machine found:
    /// the memory blocks of every admitted container, rebuilt on this machine's empty state
    /// (topology and `reserved_memory` now), must give the stored memory state
    /// ([`crate::placement::memory_case::check_restored`]). A machine whose memory or
    /// reservation changed, or a state that does not add up, fails with the first difference.
    pub fn check_restored(
        &self,
        topo: &Topology,
        cfg: &PlacementConfig,
    ) -> Result<(), MemoryError> {
        let fresh = MemoryState::new(topo, &cfg.reserved_memory)?;
        let mut assignments = crate::placement::memory_case::Assignments::new();
        for (uid, p) in &self.pods {
            for c in &p.containers {
                let Some(a) = &c.memory else { continue };
                let blocks = if a.requested.is_empty() {
                    // written before allocations kept their request: what was taken
                    let mut sums = MemoryRequest::new();
                    for &(_, r, t) in &a.taken {
                        *sums.entry(r).or_default() += t;
                    }
                    MemoryAllocation {
                        requested: sums,
                        ..a.clone()
                    }
                    .kubelet_blocks()
                } else {
                    a.kubelet_blocks()
                };
                assignments
                    .entry(uid.to_string())
                    .or_default()
                    .insert(c.placement.container.clone(), blocks);
            }
            // a pod's hold is one more assignment of the pod (no container has that name)
            if let Some(a) = p.hold.as_ref().and_then(|h| h.memory.as_ref()) {
                assignments
                    .entry(uid.to_string())
                    .or_default()
                    .insert("(pod hold)".into(), a.kubelet_blocks_requested());
            }
        }
        crate::placement::memory_case::check_restored(&self.memory, &fresh, &assignments)
    }

    /// A restored shared container of ours with no CPUs recorded (a hand-edited, torn or
    /// foreign checkpoint: admission never records one) is given the shared pool again, so one
    /// bad record cannot make the starvation guard refuse every exclusive admission for as long
    /// as that container lives. kubelet's CPU-less entries are left as they are (they run on
    /// kubelet's pool). Returns the repaired `<pod uid>/<container>` names.
    pub fn repair_empty_shared(&mut self, topo: &Topology) -> Vec<String> {
        let pool = self.shared_pool(&CpuView::new(topo));
        let mut out = Vec::new();
        for (uid, p) in self.pods.iter_mut() {
            if uid.is_kubelet() {
                continue;
            }
            for c in p.containers.iter_mut() {
                if !c.placement.exclusive && c.placement.cpus.is_empty() && !pool.is_empty() {
                    c.placement.cpus = pool.clone();
                    out.push(format!("{uid}/{}", c.placement.container));
                }
            }
        }
        out
    }

    /// Admits `pod` or refuses it; on refusal the state is unchanged. Balances by requests
    /// only (nothing measured): [`Allocator::admit_seeing`] with [`Overuse::NONE`].
    pub fn admit(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        pod: &Pod,
    ) -> Result<Vec<ContainerPlacement>, Rejection> {
        self.admit_seeing(topo, cfg, pod, Overuse::NONE)
    }

    /// As [`Allocator::admit`], with the load measured beyond the requests (`overuse`, see
    /// [`Allocator::overuse`]) ordering the shared pools that fit: among the nodes the rules
    /// leave open and whose charges can carry the request, the one less loaded in fact comes
    /// first. It never decides a fit, a hint, exclusive CPUs or memory.
    pub fn admit_seeing(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        pod: &Pod,
        overuse: &Overuse,
    ) -> Result<Vec<ContainerPlacement>, Rejection> {
        self.admit_keyed(topo, cfg, pod.uid.as_str().into(), pod, overuse)
    }

    /// As [`Allocator::admit_seeing`], booked under `key` (whose text is `pod`'s uid): who
    /// admits the pod says what kind it is.
    pub fn admit_keyed(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        key: AllocKey,
        pod: &Pod,
        overuse: &Overuse,
    ) -> Result<Vec<ContainerPlacement>, Rejection> {
        let mut next = self.clone();
        let placements = next.admit_inner(topo, cfg, key, pod, overuse)?;
        *self = next;
        Ok(placements)
    }

    /// What the machine measured beyond the books: per node, `pressure` (runnable demand per
    /// CPU of the node, as `controller::NodeObs::pressure` gives it: running plus waiting,
    /// else the busy share) × its online CPUs, less what is booked there now (its shared
    /// charges, 1000 per exclusive CPU), where positive. Taken right after an observation and
    /// before the round's moves are booked, so a workload moved off a node keeps its overuse
    /// there until the next measurement shows the node relieved. Nodes without a number, or
    /// with one that is not finite, have none.
    pub fn overuse(&self, topo: &Topology, pressure: &BTreeMap<u32, f64>) -> Overuse {
        let view = CpuView::new(topo);
        let excl = self.exclusive_cpus();
        let mut by_node = BTreeMap::new();
        for (n, cpus) in &view.nodes {
            let Some(&p) = pressure.get(n) else { continue };
            if !p.is_finite() || p <= 0.0 || cpus.is_empty() {
                continue;
            }
            let measured = (p.min(64.0) * cpus.len() as f64 * 1000.0) as u64;
            let charged: u64 = cpus.iter().filter_map(|c| self.shared_load.get(&c)).sum();
            let booked = charged + cpus.intersection(&excl).len() as u64 * 1000;
            let over = measured.saturating_sub(booked);
            if over > 0 {
                by_node.insert(*n, over);
            }
        }
        Overuse { by_node }
    }

    /// Releases a pod; `false` when it was not admitted.
    pub fn release(&mut self, uid: &str) -> bool {
        let Some(pod) = self.pods.remove(uid) else {
            return false;
        };
        for c in &pod.containers {
            for (cpu, m) in &c.charges {
                if let Some(l) = self.shared_load.get_mut(cpu) {
                    *l -= (*m).min(*l);
                    if *l == 0 {
                        self.shared_load.remove(cpu);
                    }
                }
            }
            if let Some(a) = &c.memory {
                self.memory.release(a);
            }
        }
        if let Some(a) = pod.hold.as_ref().and_then(|h| h.memory.as_ref()) {
            self.memory.release(a);
        }
        self.devices.release(uid);
        true
    }

    fn admit_inner(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        key: AllocKey,
        pod: &Pod,
        overuse: &Overuse,
    ) -> Result<Vec<ContainerPlacement>, Rejection> {
        pod.validate()
            .map_err(|d| Rejection::new(R::InvalidPod, d))?;
        if self.pods.contains_key(&pod.uid) {
            return Err(Rejection::new(
                R::AlreadyAdmitted,
                format!("pod {} is already admitted", pod.uid),
            ));
        }
        let qos = pod.qos();
        let view = CpuView::new(topo);
        let (cpu_total, mem_total) = self.check_capacity(&view, pod)?;
        // the pod is recorded first so that each container sees its siblings' CPUs taken
        self.pods.insert(
            key,
            AdmittedPod {
                qos,
                cpu_request_millis: cpu_total,
                memory_request: mem_total,
                containers: Vec::new(),
                hold: None,
            },
        );
        let pod_hint = match cfg.scope {
            TopologyScope::Pod => {
                let reqs: Vec<&Container> = pod.containers.iter().collect();
                let effective = Demand::of_pod(cfg, qos, pod);
                Some(self.hint_for(topo, cfg, &view, qos, &reqs, Some(&effective), None)?)
            }
            TopologyScope::Container => None,
        };
        // what the pod's regular init containers held and later containers may take again
        // (kubelet's cpusToReuse and initContainersReusableMemory)
        let mut reuse = Reuse::default();
        let mut out = Vec::new();
        for (c, kind) in pod.in_order() {
            let (hint, decision) = match &pod_hint {
                Some(h) => h.clone(),
                None => {
                    self.hint_for(topo, cfg, &view, qos, &[c], None, Some((&pod.uid, &reuse)))?
                }
            };
            let mut a = self.allocate(
                topo, cfg, &view, qos, &pod.uid, c, kind, hint, &mut reuse, overuse,
            )?;
            a.placement.topology = decision;
            if kind == ContainerKind::App {
                out.push(a.placement.clone());
            }
            if let Some(p) = self.pods.get_mut(&pod.uid) {
                p.containers.push(a);
            }
        }
        Ok(out)
    }

    /// Node-level capacity (kubelet's resource-fit admission): the pod's requests plus those
    /// admitted must fit the allocatable CPUs and memory of the machine.
    fn check_capacity(&self, view: &CpuView, pod: &Pod) -> Result<(u64, MemoryRequest), Rejection> {
        let cpu = pod.effective(Container::cpu_request);
        let allocatable = view.online.difference(&self.reserved_cpus).len() as u64 * 1000;
        let used = (self.pods.values()).fold(0u64, |a, p| a.saturating_add(p.cpu_request_millis));
        if used.saturating_add(cpu) > allocatable {
            return Err(Rejection::new(
                R::InsufficientCpu,
                format!(
                    "requested {cpu}m, {}m of {allocatable}m allocatable left",
                    allocatable.saturating_sub(used)
                ),
            ));
        }
        let mem = pod_memory_request(pod);
        for (r, &b) in &mem {
            let alloc = self.allocatable_memory(*r);
            let used = self.booked_memory(*r, None);
            if used.saturating_add(b) > alloc {
                return Err(Rejection::new(
                    R::InsufficientMemory,
                    format!(
                        "requested {b} bytes of {}, {} of {alloc} allocatable left",
                        r.name(),
                        alloc.saturating_sub(used)
                    ),
                ));
            }
        }
        Ok((cpu, mem))
    }

    /// The nodes' allocatable bytes of `r`.
    pub(super) fn allocatable_memory(&self, r: MemoryResource) -> u64 {
        self.memory
            .nodes
            .iter()
            .filter_map(|n| n.blocks.get(&r))
            .map(|x| x.allocatable)
            .sum()
    }

    /// What the pods book of `r` at node level (all of them, or all but `except`).
    pub(super) fn booked_memory(&self, r: MemoryResource, except: Option<&str>) -> u64 {
        self.pods
            .iter()
            .filter(|(k, _)| Some(k.as_str()) != except)
            .filter_map(|(_, p)| p.memory_request.get(&r))
            .sum()
    }

    /// Collects the providers' hints for `containers` (one container, or the whole pod in pod
    /// scope), merges them and applies the policy's admission rule and the tie-break strategy.
    /// `reuse`: the pod (uid) and what its init containers left to reuse, which the CPU and
    /// memory hints count as kubelet's do (container scope). With the hint, the decision that
    /// gave it (None under policy none, which merges nothing).
    #[allow(clippy::too_many_arguments)]
    fn hint_for(
        &self,
        topo: &Topology,
        cfg: &PlacementConfig,
        view: &CpuView,
        qos: Qos,
        containers: &[&Container],
        effective: Option<&Demand>,
        reuse: Option<(&str, &Reuse)>,
    ) -> Result<(TopologyHint, Option<HintDecision>), Rejection> {
        if cfg.policy == TopologyPolicy::None {
            return Ok((TopologyHint::new(None, false), None));
        }
        let summed = Demand::of(cfg, qos, containers);
        let demand = effective.unwrap_or(&summed);
        let exclusive = demand.exclusive;
        let cpu_hints: ProviderHints = (exclusive > 0).then(|| {
            let h = cpu::exclusive_hints(
                view,
                &self.exclusive_pool(view, cfg.overcommit_ratio),
                reuse.map_or(&CpuSet::new(), |(_, r)| &r.cpus),
                exclusive as usize,
                cfg.align_by_socket,
            );
            [("cpu".to_string(), Some(h))].into_iter().collect()
        });
        let mem = demand.memory.clone();
        let mem_hints: ProviderHints = self
            .memory
            .hints(&mem, &|m, r| {
                reuse.map_or(0, |(uid, x)| reusable_on(&x.memory, uid, m, r))
            })
            .map(|m| m.into_iter().map(|(k, v)| (k, Some(v))).collect());
        let mut by_resource = BTreeMap::new();
        let mut addresses = Vec::new();
        let mut attached = Vec::new();
        for c in containers {
            for (r, n) in &c.devices {
                *by_resource.entry(r.clone()).or_insert(0) += n;
            }
            addresses.extend(c.device_addresses.iter().cloned());
            attached.extend(c.attached_devices.iter().cloned());
        }
        let dev_hints = self
            .devices
            .hints(
                topo,
                &cfg.device_resources,
                DeviceRequest {
                    by_resource: &by_resource,
                    addresses: &addresses,
                    attached: &attached,
                },
            )
            .map_err(device_rejection)?;
        let providers = [cpu_hints, mem_hints, dev_hints];
        let numa = numa_info(topo);
        let mut hint = merge::merge(
            cfg.policy,
            &MergeOptions::from_config(cfg),
            &numa,
            &providers,
        );
        let decision = HintDecision::new(&["cpu", "memory", "device"], &providers, &hint);
        let admit = merge::admit(cfg.policy, &hint);
        if !admit {
            return Err(Rejection::new(
                R::TopologyAffinityError,
                format!(
                    "no preferred NUMA affinity under policy {:?} (best merged hint {:?}; hints: {})",
                    cfg.policy,
                    hint.affinity,
                    decision.hints_line()
                ),
            ));
        }
        if let (true, Some(aff)) = (hint.preferred, hint.affinity) {
            hint.affinity = Some(self.tie_break(
                cfg.numa_allocation_strategy,
                view,
                &merge::normalise(&providers),
                aff,
            ));
        }
        Ok((hint, Some(decision)))
    }

    /// Balance, not pack: among the masks as wide as `chosen` that every provider prefers
    /// equally (each list has a preferred hint with no affinity or exactly that mask), pick by
    /// load; `Kubelet` keeps the merge's lowest mask.
    fn tie_break(
        &self,
        strategy: AllocationStrategy,
        view: &CpuView,
        lists: &[Vec<TopologyHint>],
        chosen: NodeMask,
    ) -> NodeMask {
        if strategy == AllocationStrategy::Kubelet {
            return chosen;
        }
        let mut cands: Vec<NodeMask> = lists
            .iter()
            .flatten()
            .filter(|h| h.preferred)
            .filter_map(|h| h.affinity)
            .filter(|m| m.count() == chosen.count())
            .collect();
        cands.sort();
        cands.dedup();
        cands.retain(|m| {
            lists.iter().all(|l| {
                l.iter()
                    .any(|h| h.preferred && h.affinity.is_none_or(|a| a == *m))
            })
        });
        if cands.is_empty() {
            return chosen;
        }
        let excl = self.exclusive_cpus();
        let load = |m: NodeMask| {
            let cpus = view.cpus_of_mask(m);
            let busy = cpus.intersection(&excl).len() as f64
                + cpus
                    .iter()
                    .filter_map(|c| self.shared_load.get(&c))
                    .sum::<u64>() as f64
                    / 1000.0;
            let cpu = if cpus.is_empty() {
                0.0
            } else {
                busy / cpus.len() as f64
            };
            cpu + self.memory.used_fraction(m)
        };
        let mut best = cands[0];
        for &m in &cands[1..] {
            let (lb, lm) = (load(best), load(m));
            let better = match strategy {
                AllocationStrategy::LeastAllocated => lm < lb,
                AllocationStrategy::MostAllocated => lm > lb,
                AllocationStrategy::Kubelet => false,
            };
            if better {
                best = m;
            }
        }
        best
    }

    #[allow(clippy::too_many_arguments)]
    fn allocate(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        view: &CpuView,
        qos: Qos,
        uid: &str,
        c: &Container,
        kind: ContainerKind,
        hint: TopologyHint,
        reuse: &mut Reuse,
        overuse: &Overuse,
    ) -> Result<AdmittedContainer, Rejection> {
        let affinity = hint.affinity;
        let shared = self.shared_pool(view);
        // exclusive CPUs first (kubelet's CPU manager allocates before the memory manager)
        let exclusive = match exclusive_cpus(cfg, qos, c) {
            Some(n) => {
                let opts = StaticOptions::of(cfg);
                // kubelet: the assignable CPUs plus those the pod's init containers may hand on
                let pool = self
                    .exclusive_pool(view, cfg.overcommit_ratio)
                    .union(&reuse.cpus.intersection(&view.online))
                    .union(&reuse.prefer.intersection(&view.online));
                // CPUs a pod held for its containers are taken first when they suffice
                let preferred = reuse.prefer.intersection(&pool);
                let from_preferred = (preferred.len() >= n)
                    .then(|| cpu::allocate_exclusive(view, &preferred, n, affinity, &opts).ok())
                    .flatten();
                let got = match from_preferred {
                    Some(got) => Ok(got),
                    None => cpu::allocate_exclusive(view, &pool, n, affinity, &opts),
                }
                .map_err(|e| match e {
                    CpuError::SmtAlignment { .. } => {
                        Rejection::new(R::SmtAlignmentError, e.to_string())
                    }
                    CpuError::Insufficient { .. } | CpuError::Take(_) => {
                        Rejection::new(R::InsufficientCpu, e.to_string())
                    }
                })?;
                self.check_no_starvation(view, &shared.difference(&got), cfg.overcommit_ratio)?;
                // kubelet's updateCPUsToReuse: a regular init container's CPUs become
                // reusable; any other container's CPUs are no longer
                reuse.cpus = if kind == ContainerKind::Init {
                    reuse.cpus.union(&got)
                } else {
                    reuse.cpus.difference(&got)
                };
                Some(got)
            }
            None => None,
        };
        let memory = if memory_managed(cfg, qos) {
            let req = memory_request(c);
            let mask = {
                let tie = tie_fn(self, view, cfg.numa_allocation_strategy);
                let reusable =
                    |m: NodeMask, r: MemoryResource| reusable_on(&reuse.memory, uid, m, r);
                self.memory
                    .choose_kubelet(&req, hint, &reusable, &*tie, false)
                    .and_then(|m| self.memory.keep_groups(m, &req))
                    .map_err(|e| match e {
                        MemoryError::Insufficient { .. } => {
                            Rejection::new(R::InsufficientMemory, e.to_string())
                        }
                        _ => Rejection::new(R::MemoryNumaGroupError, e.to_string()),
                    })?
            };
            let a = self
                .memory
                .allocate_reusing(&req, mask, &|r| reusable_on(&reuse.memory, uid, mask, r));
            update_reusable(&mut reuse.memory, uid, kind, &a.kubelet_blocks_requested());
            Some(a)
        } else {
            None
        };
        let devices = self
            .devices
            .allocate(
                topo,
                &cfg.device_resources,
                DeviceRequest {
                    by_resource: &c.devices,
                    addresses: &c.device_addresses,
                    attached: &c.attached_devices,
                },
                affinity,
                &DeviceOwner {
                    pod: uid.to_string(),
                    container: c.name.clone(),
                },
            )
            .map_err(device_rejection)?;
        let within = memory.as_ref().map(|m| m.nodes).or(affinity);
        let (cpus, charges) = match exclusive {
            Some(cpus) => (cpus, Charges::new()),
            None => {
                let shared = self.shared_pool(view);
                let pools = SharedPools {
                    view,
                    shared,
                    load: &self.shared_load,
                    overcommit_ratio: cfg.overcommit_ratio,
                    cluster_affinity: cfg.topology_cluster_affinity,
                    overuse,
                };
                let millis = c.cpu_request();
                let cpus = if qos == Qos::BestEffort {
                    pools.best_effort(within)
                } else {
                    match cfg.shared_cpu_policy {
                        SharedCpuPolicy::NumaAware => pools.numa_aware(millis, within),
                        SharedCpuPolicy::TopologyAware => pools.topology_aware(millis, within),
                    }
                };
                let cpus = cpus.ok_or_else(|| {
                    Rejection::new(
                        R::InsufficientCpu,
                        format!(
                            "no shared CPU pool{} can carry {millis}m for container {}",
                            within.map_or(String::new(), |w| format!(" within nodes {w:?}")),
                            c.name
                        ),
                    )
                })?;
                // a regular init container has exited before the app containers start: the
                // pod's effective request (check_capacity) covers it, its charge would count twice
                let charges = if kind == ContainerKind::Init {
                    Charges::new()
                } else {
                    spread(&cpus, millis)
                };
                for (cpu, m) in &charges {
                    *self.shared_load.entry(*cpu).or_default() += m;
                }
                (cpus, charges)
            }
        };
        let exclusive_container = exclusive_cpus(cfg, qos, c).is_some();
        let mems = match &memory {
            Some(m) => m.nodes.to_cpuset(),
            // TAP leaves a shared container's mems alone unless its memory topology is on
            None if cfg.shared_cpu_policy == SharedCpuPolicy::TopologyAware
                && !cfg.tap_memory_topology
                && !exclusive_container =>
            {
                topo.memory_nodes(&topo.node_ids().collect())
            }
            None => topo.memory_nodes(&view.nodes_of(&cpus).to_cpuset()),
        };
        Ok(AdmittedContainer {
            kind,
            placement: ContainerPlacement {
                container: c.name.clone(),
                exclusive: exclusive_cpus(cfg, qos, c).is_some(),
                cpus,
                mems,
                affinity,
                devices,
                topology: None,
            },
            charges,
            memory,
        })
    }

    /// Taking exclusive CPUs must leave every shared container at least one CPU and keep every
    /// node's shared charge within its overcommit capacity.
    fn check_no_starvation(
        &self,
        view: &CpuView,
        shared_after: &CpuSet,
        ratio: f64,
    ) -> Result<(), Rejection> {
        for (uid, p) in &self.pods {
            // kubelet's Memory Manager entries without CPUs (`daemon::kubelet`, pods under the
            // reserved uid prefix) run on kubelet's shared pool, not ours: no shared CPU of ours
            // to lose. Any other shared container without CPUs is refused an exclusive CPU
            // below (it has none left), never skipped.
            let kubelets = uid.is_kubelet();
            for c in p
                .containers
                .iter()
                .filter(|c| !(c.placement.exclusive || kubelets && c.placement.cpus.is_empty()))
            {
                if c.placement.cpus.is_disjoint(shared_after) {
                    return Err(Rejection::new(
                        R::InsufficientCpu,
                        format!(
                            "exclusive CPUs would leave {uid}/{} without a CPU",
                            c.placement.container
                        ),
                    ));
                }
            }
        }
        let pools = SharedPools {
            view,
            shared: shared_after.clone(),
            load: &self.shared_load,
            overcommit_ratio: ratio,
            cluster_affinity: false,
            overuse: Overuse::NONE,
        };
        for (n, cpus) in &view.nodes {
            let (load, cap) = (pools.load_of(cpus), pools.capacity_of(cpus));
            if load > cap {
                return Err(Rejection::new(
                    R::InsufficientCpu,
                    format!("exclusive CPUs would overcommit node {n}'s shared CPUs ({load}m charged, {cap}m capacity)"),
                ));
            }
        }
        Ok(())
    }
}

/// Exclusive CPU count of a container: Guaranteed with an integer CPU request, under the CPU
/// Manager's static policy.
fn exclusive_cpus(cfg: &PlacementConfig, qos: Qos, c: &Container) -> Option<usize> {
    let r = c.cpu_request();
    (cfg.cpu_manager_policy == CpuManagerPolicy::Static
        && qos == Qos::Guaranteed
        && r > 0
        && r.is_multiple_of(1000))
    .then_some((r / 1000) as usize)
}

/// Whether the Memory Manager reserves memory for the pod (static policy, Guaranteed).
fn memory_managed(cfg: &PlacementConfig, qos: Qos) -> bool {
    cfg.memory_manager_policy == MemoryManagerPolicy::Static && qos == Qos::Guaranteed
}

/// What the pod's regular init containers held that later containers of the pod may take,
/// and (`prefer`) the CPUs a pod held for its containers (`hold`), taken first.
#[derive(Default)]
struct Reuse {
    cpus: CpuSet,
    memory: ReusableMemory,
    prefer: CpuSet,
}

/// What a set of containers asks of the hint providers: exclusive CPUs and managed memory.
struct Demand {
    exclusive: u64,
    memory: MemoryRequest,
}

impl Demand {
    /// Summed over `containers` (container scope: one container).
    fn of(cfg: &PlacementConfig, qos: Qos, containers: &[&Container]) -> Demand {
        let exclusive = containers
            .iter()
            .filter_map(|c| exclusive_cpus(cfg, qos, c))
            .sum::<usize>() as u64;
        let mut memory = MemoryRequest::new();
        if memory_managed(cfg, qos) {
            for c in containers {
                for (r, b) in memory_request(c) {
                    *memory.entry(r).or_default() += b;
                }
            }
        }
        Demand { exclusive, memory }
    }

    /// The pod's effective demand (pod scope): kubelet's max of the init-container peak and
    /// the long-running total, per quantity.
    fn of_pod(cfg: &PlacementConfig, qos: Qos, pod: &Pod) -> Demand {
        let exclusive = pod.effective(|c| exclusive_cpus(cfg, qos, c).unwrap_or(0) as u64);
        let memory = if memory_managed(cfg, qos) {
            pod_memory_request(pod)
        } else {
            MemoryRequest::new()
        };
        Demand { exclusive, memory }
    }
}

/// The pod's effective memory request per resource.
fn pod_memory_request(pod: &Pod) -> MemoryRequest {
    MemoryResource::ALL
        .into_iter()
        .map(|r| {
            let b = pod.effective(|c| memory_request(c).get(&r).copied().unwrap_or(0));
            (r, b)
        })
        .filter(|(_, b)| *b > 0)
        .collect()
}

fn memory_request(c: &Container) -> MemoryRequest {
    [
        (MemoryResource::Memory, c.memory_request()),
        (MemoryResource::Hugepages2Mi, c.hugepages_2mi_bytes),
        (MemoryResource::Hugepages1Gi, c.hugepages_1gi_bytes),
    ]
    .into_iter()
    .filter(|(_, b)| *b > 0)
    .collect()
}

/// The merge's view of the machine: node ids and distance rows indexed by node id.
pub fn numa_info(topo: &Topology) -> NumaInfo {
    let ids: Vec<u32> = topo.node_ids().collect();
    let max = ids.iter().copied().max().unwrap_or(0);
    let distances = ids
        .iter()
        .map(|&i| {
            let row = (0..=max).map(|j| u64::from(topo.distance(i, j))).collect();
            (i, row)
        })
        .collect();
    NumaInfo::new(ids, distances)
}

fn device_rejection(e: DeviceError) -> Rejection {
    let reason = match e {
        DeviceError::UnknownResource { .. } | DeviceError::UnknownAddress { .. } => {
            R::UnknownDevice
        }
        DeviceError::Busy { .. } | DeviceError::Insufficient { .. } => R::InsufficientDevices,
    };
    Rejection::new(reason, e.to_string())
}

/// The tie between equally wide memory masks: lowest mask (kubelet) or by load.
fn tie_fn<'a>(
    a: &'a Allocator,
    view: &'a CpuView,
    s: AllocationStrategy,
) -> Box<dyn Fn(NodeMask, NodeMask) -> bool + 'a> {
    let load = move |m: NodeMask| {
        let excl = a.exclusive_cpus();
        let cpus = view.cpus_of_mask(m);
        let c = if cpus.is_empty() {
            0.0
        } else {
            cpus.intersection(&excl).len() as f64 / cpus.len() as f64
        };
        c + a.memory.used_fraction(m)
    };
    match s {
        AllocationStrategy::Kubelet => Box::new(|x: NodeMask, y: NodeMask| x.0 < y.0),
        AllocationStrategy::LeastAllocated => Box::new(move |x, y| {
            let (lx, ly) = (load(x), load(y));
            lx < ly || (lx == ly && x.0 < y.0)
        }),
        AllocationStrategy::MostAllocated => Box::new(move |x, y| {
            let (lx, ly) = (load(x), load(y));
            lx > ly || (lx == ly && x.0 < y.0)
        }),
    }
}

/// `mem` moved to the nodes of `mask` on `state`: the new state and allocation, or None when
/// those nodes' blocks cannot take all of it (a Guaranteed block would be short), the move
/// would split a NUMA group, or the container holds memory it did not book itself (reused
/// from its pod's init containers, whose booking stays where it is: re-booking only its own
/// part would run the rest booked nowhere on the new nodes).
pub fn rebook_memory(
    mut state: MemoryState,
    mem: &MemoryAllocation,
    mask: NodeMask,
) -> Option<(MemoryState, MemoryAllocation)> {
    let mut req = MemoryRequest::new();
    for &(_, r, t) in &mem.taken {
        *req.entry(r).or_default() += t;
    }
    if (mem.requested.iter()).any(|(r, &want)| want > req.get(r).copied().unwrap_or(0)) {
        return None;
    }
    state.release(mem);
    // a move never breaks a NUMA group (kubelet's rule: a node serves one group)
    if state.unbroken(mask) != Some(mask) {
        return None;
    }
    let new = state.allocate(&req, mask);
    let mut got = MemoryRequest::new();
    for &(_, r, t) in &new.taken {
        *got.entry(r).or_default() += t;
    }
    (got == req).then_some((state, new))
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "seed003_tests.rs"]
mod seed003_tests;

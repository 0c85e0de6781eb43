//! Memory Manager static policy model (kubelet `memorymanager/policy_static.go`): per node and
//! per resource (memory, hugepages-2Mi, hugepages-1Gi) total / system-reserved / allocatable /
//! reserved / free; NUMA groups (a node serves either single-node allocations or one fixed
//! multi-node group, never both); hints; the choice of nodes for an allocation; reservation and
//! release; init-container memory reuse; and `start`'s check of a stored state against the
//! machine. `rebalancer hints memory` (`memory_case`) drives exactly these functions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::ReservedMemory;
use crate::placement::cpu::candidate_masks;
use crate::placement::{NodeMask, TopologyHint};
use crate::topology::Topology;

/// A memory resource of the Memory Manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MemoryResource {
    #[serde(rename = "memory")]
    Memory,
    #[serde(rename = "hugepages-2Mi")]
    Hugepages2Mi,
    #[serde(rename = "hugepages-1Gi")]
    Hugepages1Gi,
}

impl MemoryResource {
    pub const ALL: [MemoryResource; 3] = [
        MemoryResource::Memory,
        MemoryResource::Hugepages2Mi,
        MemoryResource::Hugepages1Gi,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MemoryResource::Memory => "memory",
            MemoryResource::Hugepages2Mi => "hugepages-2Mi",
            MemoryResource::Hugepages1Gi => "hugepages-1Gi",
        }
    }

    /// The resource of a Kubernetes resource name (`memory`, `hugepages-2Mi`, …).
    pub fn parse(s: &str) -> Option<MemoryResource> {
        Self::ALL.into_iter().find(|r| r.name() == s)
    }

    /// The hugepage resource of a page size in KiB (`hugepages-<size>` as kubelet names it).
    pub fn hugepages_of_kib(kib: u64) -> Option<MemoryResource> {
        match kib {
            2048 => Some(MemoryResource::Hugepages2Mi),
            1_048_576 => Some(MemoryResource::Hugepages1Gi),
            _ => None,
        }
    }

    /// Whether kubelet counts the resource name as memory for the Memory Manager (`memory`
    /// or any `hugepages-*`).
    pub fn is_memory_name(s: &str) -> bool {
        s == "memory" || s.starts_with("hugepages-")
    }
}

/// One resource on one node, in bytes. `allocatable = total - system_reserved`,
/// `free = allocatable - reserved`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryBlock {
    pub total: u64,
    pub system_reserved: u64,
    pub allocatable: u64,
    pub reserved: u64,
    pub free: u64,
}

/// A node's memory state. `cells` is the group the node serves (itself when single);
/// `assignments` counts memory blocks on the node (kubelet's `NumberOfAssignments`: a container
/// with memory and hugepages adds two).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMemory {
    pub id: u32,
    pub blocks: BTreeMap<MemoryResource, MemoryBlock>,
    pub cells: NodeMask,
    pub assignments: u32,
}

/// The machine's memory state (the Memory Manager's `NUMANodeMap`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryState {
    pub nodes: Vec<NodeMemory>,
}

/// Bytes requested per resource (zero entries are left out).
pub type MemoryRequest = BTreeMap<MemoryResource, u64>;

/// One node of the machine as the Memory Manager sees it (cadvisor's `MachineInfo.Topology`):
/// its memory in bytes (hugepage pools included, as the kernel counts MemTotal) and its
/// hugepage pools as (page size KiB, pages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineNode {
    pub id: u32,
    pub memory: u64,
    pub hugepages: Vec<(u64, u64)>,
}

/// Memory reserved for the system per node and resource (kubelet `--reserved-memory`).
pub type SystemReserved = BTreeMap<u32, BTreeMap<MemoryResource, u64>>;

/// kubelet's `state.Block`: bytes of one resource held on a node group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub numa_affinity: NodeMask,
    #[serde(rename = "type")]
    pub resource: MemoryResource,
    pub size: u64,
}

/// What one allocation took: its node group, the bytes per (node, resource), and how many
/// blocks (one per requested resource) it counts on each of its nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAllocation {
    pub nodes: NodeMask,
    pub taken: Vec<(u32, MemoryResource, u64)>,
    /// Blocks counted per node (checkpoints written before this field counted one).
    #[serde(default = "one")]
    pub blocks: u32,
    /// Requested bytes per resource (the blocks as kubelet stores them; before reuse).
    #[serde(default)]
    pub requested: MemoryRequest,
}

fn one() -> u32 {
    1
}

impl MemoryAllocation {
    /// The blocks as requested (before reuse), for kubelet's reuse bookkeeping.
    pub fn kubelet_blocks_requested(&self) -> Vec<Block> {
        self.requested
            .iter()
            .map(|(&resource, &size)| Block {
                numa_affinity: self.nodes,
                resource,
                size,
            })
            .collect()
    }

    /// The allocation as kubelet's blocks: one per requested resource, sized by what was
    /// reserved (a container that reused init-container memory holds the rest, as kubelet's
    /// shrunk init blocks make the pod's blocks sum to what it holds).
    pub fn kubelet_blocks(&self) -> Vec<Block> {
        self.requested
            .keys()
            .map(|&resource| Block {
                numa_affinity: self.nodes,
                resource,
                size: self
                    .taken
                    .iter()
                    .filter(|t| t.1 == resource)
                    .map(|t| t.2)
                    .sum(),
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("reserved memory for node {node} names a node the machine does not have")]
    UnknownNode { node: u32 },
    #[error(
        "reserved {resource} on node {node} ({reserved} bytes) exceeds its total ({total} bytes)"
    )]
    ReservedTooLarge {
        node: u32,
        resource: &'static str,
        reserved: u64,
        total: u64,
    },
    #[error("[memorymanager] you should specify the system reserved memory")]
    NoSystemReserved,
    #[error("[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available (requested {requested} bytes of {resource})")]
    Insufficient {
        resource: &'static str,
        requested: u64,
    },
    #[error("[memorymanager] failed to find the default preferred hint")]
    DefaultNotPreferred,
    #[error("[memorymanager] failed to find NUMA nodes to extend the current topology hint {0:?}")]
    CannotExtend(NodeMask),
    #[error("[memorymanager] failed to find the extended preferred hint")]
    ExtendedNotPreferred,
    #[error("[memorymanager] preferred hint {0:?} violates NUMA node allocation (a node cannot serve both single and cross NUMA node allocations)")]
    Violation(NodeMask),
    #[error("[memorymanager] machine state can not be empty when it has memory assignments")]
    EmptyStateWithAssignments,
    #[error("[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses the NUMA that does not exist")]
    AssignmentUnknownNode { pod: String, container: String },
    #[error("[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses memory resource that does not exist")]
    AssignmentUnknownResource { pod: String, container: String },
    #[error("[memorymanager] the expected machine state is different from the real one ({0})")]
    StateMismatch(String),
}

/// Memory of regular init containers that later containers of the same pod may take again
/// (kubelet's `initContainersReusableMemory`: pod → node group → resource → bytes). Sidecars
/// (restartable init containers) hold theirs and never appear here.
pub type ReusableMemory = BTreeMap<String, BTreeMap<NodeMask, BTreeMap<MemoryResource, u64>>>;

/// The kind of a pod's container, for reuse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContainerKind {
    /// An app container.
    #[default]
    App,
    /// A regular init container: runs to completion before the next one starts.
    Init,
    /// A restartable init container (`restartPolicy: Always`): runs for the pod's life.
    Sidecar,
}

/// Bytes of `r` the pod may reuse on exactly `mask` (kubelet `getPodReusableMemory`).
pub fn reusable_on(reuse: &ReusableMemory, pod: &str, mask: NodeMask, r: MemoryResource) -> u64 {
    reuse
        .get(pod)
        .and_then(|p| p.get(&mask))
        .and_then(|m| m.get(&r))
        .copied()
        .unwrap_or(0)
}

/// kubelet `updatePodReusableMemory`: entries of other pods go; a regular init container's
/// blocks become reusable (the largest per group and resource); an app or sidecar container's
/// blocks use up what was reusable on their group.
pub fn update_reusable(
    reuse: &mut ReusableMemory,
    pod: &str,
    kind: ContainerKind,
    blocks: &[Block],
) {
    reuse.retain(|uid, _| uid == pod);
    if kind == ContainerKind::Init {
        let p = reuse.entry(pod.to_string()).or_default();
        for b in blocks {
            let e = p
                .entry(b.numa_affinity)
                .or_default()
                .entry(b.resource)
                .or_default();
            if b.size > *e {
                *e = b.size;
            }
        }
        return;
    }
    for b in blocks {
        if let Some(e) = reuse
            .get_mut(pod)
            .and_then(|p| p.get_mut(&b.numa_affinity))
            .and_then(|m| m.get_mut(&b.resource))
        {
            *e = e.saturating_sub(b.size);
        }
    }
}

impl MemoryState {
    /// Builds the state from the topology (memory and hugepage pools per node) and the
    /// per-node system reservation.
    pub fn new(topo: &Topology, reserved: &[ReservedMemory]) -> Result<MemoryState, MemoryError> {
        for r in reserved {
            if topo.node(r.node).is_none() {
                return Err(MemoryError::UnknownNode { node: r.node });
            }
        }
        Self::from_machine(&machine_nodes(topo), &system_reserved(reserved))
    }

    /// kubelet's `getDefaultMachineState`: for every node, each hugepage pool it has (total =
    /// pages × size) and regular memory, whose allocatable is its total minus the system
    /// reservation minus the node's hugepage pools.
    pub fn from_machine(
        machine: &[MachineNode],
        reserved: &SystemReserved,
    ) -> Result<MemoryState, MemoryError> {
        let mut nodes = Vec::new();
        for n in machine {
            let sys = |r: MemoryResource| {
                reserved
                    .get(&n.id)
                    .and_then(|m| m.get(&r))
                    .copied()
                    .unwrap_or(0)
            };
            let too_large =
                |r: MemoryResource, reserved: u64, total: u64| MemoryError::ReservedTooLarge {
                    node: n.id,
                    resource: r.name(),
                    reserved,
                    total,
                };
            let mut blocks = BTreeMap::new();
            let mut in_hugepages = 0u64;
            for &(kib, pages) in &n.hugepages {
                let Some(r) = MemoryResource::hugepages_of_kib(kib) else {
                    continue;
                };
                let total = pages.saturating_mul(kib).saturating_mul(1024);
                let s = sys(r);
                let allocatable = total.checked_sub(s).ok_or(too_large(r, s, total))?;
                blocks.insert(
                    r,
                    MemoryBlock {
                        total,
                        system_reserved: s,
                        allocatable,
                        reserved: 0,
                        free: allocatable,
                    },
                );
                in_hugepages = in_hugepages.saturating_add(total);
            }
            let s = sys(MemoryResource::Memory);
            let allocatable = n
                .memory
                .checked_sub(s)
                .and_then(|a| a.checked_sub(in_hugepages))
                .ok_or(too_large(
                    MemoryResource::Memory,
                    s.saturating_add(in_hugepages),
                    n.memory,
                ))?;
            blocks.insert(
                MemoryResource::Memory,
                MemoryBlock {
                    total: n.memory,
                    system_reserved: s,
                    allocatable,
                    reserved: 0,
                    free: allocatable,
                },
            );
            nodes.push(NodeMemory {
                id: n.id,
                blocks,
                cells: NodeMask::single(n.id),
                assignments: 0,
            });
        }
        nodes.sort_by_key(|n| n.id);
        Ok(MemoryState { nodes })
    }

    pub fn node(&self, id: u32) -> Option<&NodeMemory> {
        self.nodes.iter().find(|n| n.id == id)
    }

    fn node_mut(&mut self, id: u32) -> Option<&mut NodeMemory> {
        self.nodes.iter_mut().find(|n| n.id == id)
    }

    fn sum(&self, mask: NodeMask, r: MemoryResource, f: fn(&MemoryBlock) -> u64) -> u64 {
        mask.ids()
            .filter_map(|id| self.node(id))
            .filter_map(|n| n.blocks.get(&r))
            .map(f)
            .fold(0u64, u64::saturating_add)
    }

    pub fn all_nodes(&self) -> NodeMask {
        NodeMask::from_ids(self.nodes.iter().map(|n| n.id)).unwrap_or_default()
    }

    /// Whether `calculateHints` may offer `mask` under the group rules: a node already in a
    /// multi-node group cannot serve a single-node allocation; a used node can join a
    /// multi-node allocation only of exactly its group.
    fn group_ok(&self, mask: NodeMask) -> bool {
        let single = mask.count() == 1;
        mask.ids().filter_map(|id| self.node(id)).all(|n| {
            if single {
                n.cells.count() <= 1
            } else {
                n.assignments == 0 || (n.cells.count() > 1 && n.cells == mask)
            }
        })
    }

    /// kubelet's `isAffinityViolatingNUMAAllocations`: a multi-node mask over a used node that
    /// serves single-node allocations or another group.
    pub fn violates(&self, mask: NodeMask) -> bool {
        mask.count() > 1
            && mask
                .ids()
                .filter_map(|id| self.node(id))
                .any(|n| n.assignments > 0 && (n.cells.count() == 1 || n.cells != mask))
    }

    /// kubelet's `calculateHints` over the masks admission considers, with the pod's
    /// `reusable` init-container memory per mask (none for a pod's first container).
    pub fn hints(
        &self,
        req: &MemoryRequest,
        reusable: &dyn Fn(NodeMask, MemoryResource) -> u64,
    ) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
        if req.is_empty() {
            return None;
        }
        Some(self.calculate_hints(req, reusable, false))
    }

    /// kubelet's `calculateHints`: for every node mask (kubelet's order: single nodes, then
    /// pairs, …) whose allocatable memory covers the request, that the group rules allow and
    /// whose free memory plus the pod's reusable memory on exactly that mask covers it, a hint
    /// for every requested resource; preferred at the narrowest width whose allocatable covers
    /// the request. No mask → an empty map (the Topology Manager then sees no preference and
    /// the allocation itself fails). `all_masks` enumerates every mask (kubelet's
    /// `IterateBitMasks`) instead of the pruned candidates.
    pub fn calculate_hints(
        &self,
        req: &MemoryRequest,
        reusable: &dyn Fn(NodeMask, MemoryResource) -> u64,
        all_masks: bool,
    ) -> BTreeMap<String, Vec<TopologyHint>> {
        let allocatable_fits = |m: NodeMask| {
            req.iter()
                .all(|(r, &b)| self.sum(m, *r, |x| x.allocatable) >= b)
        };
        let masks = if all_masks {
            every_mask(self.all_nodes())
        } else {
            candidate_masks(self.all_nodes(), &allocatable_fits)
        };
        let mut min_width = self.nodes.len() as u32;
        let mut list = Vec::new();
        for m in masks {
            if !allocatable_fits(m) {
                continue;
            }
            min_width = min_width.min(m.count());
            if !self.group_ok(m) {
                continue;
            }
            if req
                .iter()
                .all(|(r, &b)| self.sum(m, *r, |x| x.free).saturating_add(reusable(m, *r)) >= b)
            {
                list.push(m);
            }
        }
        if list.is_empty() {
            return BTreeMap::new();
        }
        let hints: Vec<TopologyHint> = list
            .into_iter()
            .map(|m| TopologyHint::new(Some(m), m.count() == min_width))
            .collect();
        req.keys()
            .map(|r| (r.name().to_string(), hints.clone()))
            .collect()
    }

    /// kubelet's `isAffinitySatisfyRequest`.
    pub fn satisfies(&self, mask: NodeMask, req: &MemoryRequest) -> bool {
        req.iter()
            .all(|(r, &b)| self.sum(mask, *r, |x| x.free) >= b)
    }

    /// kubelet's `findBestHint`: preferred first, then narrower (`tie` breaks equal widths
    /// when given, else the lowest mask). `None` when no hint has an affinity.
    fn best_hint(
        hints: &[TopologyHint],
        tie: &dyn Fn(NodeMask, NodeMask) -> bool,
    ) -> Option<TopologyHint> {
        let mut best: Option<TopologyHint> = None;
        for h in hints {
            let Some(m) = h.affinity else { continue };
            best = match best {
                None => Some(*h),
                Some(b) => {
                    let bm = b.affinity.unwrap_or_default();
                    let better = (h.preferred && !b.preferred)
                        || (h.preferred == b.preferred
                            && (m.count() < bm.count() || (m.count() == bm.count() && tie(m, bm))));
                    Some(if better { *h } else { b })
                }
            };
        }
        best
    }

    /// The node group an allocation for `req` under the Topology Manager's hint uses
    /// (kubelet's `Allocate` up to the state update): with no affinity the best of all hints
    /// (`getDefaultHint`), refused when the Topology Manager's hint was preferred and that one
    /// is not; a group whose free memory does not cover the request extended to the best hint
    /// containing it (`extendTopologyManagerHint`, whose hints count free plus reusable
    /// memory), with the same preference rule; then the group rules hold
    /// (`isAffinityViolatingNUMAAllocations`). `reusable` is the pod's reusable init-container
    /// memory per mask.
    pub fn choose_kubelet(
        &self,
        req: &MemoryRequest,
        hint: TopologyHint,
        reusable: &dyn Fn(NodeMask, MemoryResource) -> u64,
        tie: &dyn Fn(NodeMask, NodeMask) -> bool,
        all_masks: bool,
    ) -> Result<NodeMask, MemoryError> {
        let insufficient = || {
            let (r, b) = req
                .iter()
                .next()
                .map(|(r, b)| (r.name(), *b))
                .unwrap_or(("memory", 0));
            MemoryError::Insufficient {
                resource: r,
                requested: b,
            }
        };
        let hints = || self.calculate_hints(req, reusable, all_masks);
        let memory_list = |h: &BTreeMap<String, Vec<TopologyHint>>| {
            h.get(MemoryResource::Memory.name())
                .cloned()
                .unwrap_or_default()
        };
        let mut best = hint;
        if hint.affinity.is_none() {
            let h = hints();
            if h.is_empty() {
                return Err(insufficient());
            }
            let default =
                Self::best_hint(&memory_list(&h), tie).unwrap_or(TopologyHint::new(None, false));
            if !default.preferred && hint.preferred {
                return Err(MemoryError::DefaultNotPreferred);
            }
            best = default;
        }
        let Some(mut mask) = best.affinity else {
            return Err(insufficient());
        };
        if !self.satisfies(mask, req) {
            let within: Vec<TopologyHint> = memory_list(&hints())
                .into_iter()
                .filter(|x| x.affinity.is_some_and(|a| mask.is_subset_of(a)))
                .collect();
            let Some(ext) = Self::best_hint(&within, tie) else {
                return Err(MemoryError::CannotExtend(mask));
            };
            if !ext.preferred && best.preferred {
                return Err(MemoryError::ExtendedNotPreferred);
            }
            // kubelet takes the extended hint as it is: `calculateHints` counted free plus
            // reusable memory, so a mask the pod's init containers make room in is kept
            // (no second check of the free memory alone, which refused exactly those).
            mask = ext.affinity.unwrap_or_default();
        }
        if self.violates(mask) {
            return Err(MemoryError::Violation(mask));
        }
        Ok(mask)
    }

    /// Admission's one departure from kubelet's `Allocate`: a single-node mask on a node that
    /// serves a multi-node group. kubelet lets it through (`isAffinityViolatingNUMAAllocations`
    /// skips single-node masks, and a best-effort merge can hand one over from another
    /// provider's hint) and then breaks the group: the node serves itself while its partners
    /// still list it, and releasing the container does not restore the group. Here the
    /// allocation takes the node's whole group instead, when the group has the room, and is
    /// refused otherwise. `hints memory` (the conformance command) stays kubelet-exact.
    pub fn keep_groups(
        &self,
        mask: NodeMask,
        req: &MemoryRequest,
    ) -> Result<NodeMask, MemoryError> {
        let group = match mask.ids().collect::<Vec<_>>()[..] {
            [id] => self.node(id).map(|n| n.cells).filter(|g| g.count() > 1),
            _ => None,
        };
        match group {
            None => Ok(mask),
            Some(g) if self.satisfies(g, req) && !self.violates(g) => Ok(g),
            Some(_) => Err(MemoryError::Violation(mask)),
        }
    }

    /// The nodes an allocation meant for `mask` may take without breaking a NUMA group: a
    /// single node's whole group (itself when it serves none), a multi-node mask when it
    /// violates no group; None otherwise. For what admission sets aside or re-books outside
    /// [`MemoryState::choose`] (a pod's hold, a moved container's memory).
    pub fn unbroken(&self, mask: NodeMask) -> Option<NodeMask> {
        match mask.ids().collect::<Vec<_>>()[..] {
            [id] => Some(self.node(id).map_or(mask, |n| n.cells)),
            _ => (!self.violates(mask)).then_some(mask),
        }
    }

    /// [`MemoryState::choose_kubelet`] for admission: no reuse, the admission's masks.
    pub fn choose(
        &self,
        req: &MemoryRequest,
        hint: TopologyHint,
        tie: &dyn Fn(NodeMask, NodeMask) -> bool,
    ) -> Result<NodeMask, MemoryError> {
        self.choose_kubelet(req, hint, &|_, _| 0, tie, false)
    }

    /// kubelet's `updateMachineState` for one block: every node of `mask` counts one more
    /// block and serves the group `mask`; `size` bytes are reserved from the nodes' free memory
    /// in id order. Returns what each node gave.
    pub fn reserve(&mut self, mask: NodeMask, r: MemoryResource, size: u64) -> Vec<(u32, u64)> {
        let mut left = size;
        let mut taken = Vec::new();
        for id in mask.ids() {
            let Some(n) = self.node_mut(id) else { continue };
            n.assignments = n.assignments.saturating_add(1);
            n.cells = mask;
            if left == 0 {
                continue;
            }
            let Some(b) = n.blocks.get_mut(&r) else {
                continue;
            };
            let t = b.free.min(left);
            if t == 0 {
                continue;
            }
            b.free -= t;
            b.reserved = b.reserved.saturating_add(t);
            left -= t;
            taken.push((id, t));
        }
        taken
    }

    /// kubelet's `RemoveContainer` for one block: every node of the block counts one block
    /// less (serving only itself once it has none); `size` bytes go back from the nodes'
    /// reserved memory in id order.
    pub fn release_block(&mut self, b: &Block) {
        let mut left = b.size;
        for id in b.numa_affinity.ids() {
            let Some(n) = self.node_mut(id) else { continue };
            n.assignments = n.assignments.saturating_sub(1);
            if n.assignments == 0 {
                n.cells = NodeMask::single(id);
            }
            if left == 0 {
                continue;
            }
            let Some(m) = n.blocks.get_mut(&b.resource) else {
                continue;
            };
            let t = m.reserved.min(left);
            m.reserved -= t;
            m.free = m.free.saturating_add(t);
            left -= t;
        }
    }

    /// Reserves `req` on the nodes of `mask` (kubelet's `Allocate` state update; `reuse`
    /// bytes per resource come from the pod's init containers and are not reserved again),
    /// making the mask the nodes' group. The caller chose `mask` with
    /// [`MemoryState::choose`].
    pub fn allocate_reusing(
        &mut self,
        req: &MemoryRequest,
        mask: NodeMask,
        reuse: &dyn Fn(MemoryResource) -> u64,
    ) -> MemoryAllocation {
        let mut taken = Vec::new();
        for (&r, &want) in req {
            let size = want.saturating_sub(reuse(r));
            for (id, t) in self.reserve(mask, r, size) {
                taken.push((id, r, t));
            }
        }
        MemoryAllocation {
            nodes: mask,
            taken,
            blocks: req.len() as u32,
            requested: req.clone(),
        }
    }

    /// [`MemoryState::allocate_reusing`] with nothing to reuse.
    pub fn allocate(&mut self, req: &MemoryRequest, mask: NodeMask) -> MemoryAllocation {
        self.allocate_reusing(req, mask, &|_| 0)
    }

    /// Undoes an allocation exactly; a node with no assignment left serves only itself.
    pub fn release(&mut self, a: &MemoryAllocation) {
        for &(id, r, t) in &a.taken {
            if let Some(b) = self.node_mut(id).and_then(|n| n.blocks.get_mut(&r)) {
                b.free += t;
                b.reserved -= t.min(b.reserved);
            }
        }
        for n in self.nodes.iter_mut().filter(|n| a.nodes.contains(n.id)) {
            n.assignments = n.assignments.saturating_sub(a.blocks);
            if n.assignments == 0 {
                n.cells = NodeMask::single(n.id);
            }
        }
    }

    /// The state `blocks` make on an empty machine (`fresh`): kubelet's `validateState`
    /// rebuild. Errors when a block names a node or a resource the machine does not have.
    pub fn rebuild<'a>(
        fresh: &MemoryState,
        blocks: impl IntoIterator<Item = (&'a str, &'a str, &'a Block)>,
    ) -> Result<MemoryState, MemoryError> {
        let mut s = fresh.clone();
        for (pod, container, b) in blocks {
            for id in b.numa_affinity.ids() {
                let known = s
                    .node(id)
                    .ok_or_else(|| MemoryError::AssignmentUnknownNode {
                        pod: pod.to_string(),
                        container: container.to_string(),
                    })?;
                if !known.blocks.contains_key(&b.resource) {
                    return Err(MemoryError::AssignmentUnknownResource {
                        pod: pod.to_string(),
                        container: container.to_string(),
                    });
                }
            }
            s.reserve(b.numa_affinity, b.resource, b.size);
        }
        Ok(s)
    }

    /// kubelet's `areMachineStatesEqual`: the same nodes, per node the same block count, group
    /// and resources with equal total, system-reserved and allocatable, and per group equal
    /// sums of free and reserved (a cross-node reservation may be split differently). `Err`
    /// says the first difference.
    pub fn same_as(&self, other: &MemoryState) -> Result<(), String> {
        if self.nodes.len() != other.nodes.len() {
            return Err(format!(
                "{} NUMA nodes, expected {}",
                self.nodes.len(),
                other.nodes.len()
            ));
        }
        for a in &self.nodes {
            let id = a.id;
            let b = other
                .node(id)
                .ok_or_else(|| format!("node {id} is not on the machine"))?;
            if a.assignments != b.assignments {
                return Err(format!(
                    "node {id}: {} assignments, expected {}",
                    a.assignments, b.assignments
                ));
            }
            if a.cells != b.cells {
                return Err(format!(
                    "node {id}: group {:?}, expected {:?}",
                    a.cells, b.cells
                ));
            }
            if a.blocks.len() != b.blocks.len() {
                return Err(format!(
                    "node {id}: {} memory resources, expected {}",
                    a.blocks.len(),
                    b.blocks.len()
                ));
            }
            for (r, x) in &a.blocks {
                let y = b
                    .blocks
                    .get(r)
                    .ok_or_else(|| format!("node {id}: no {} on the machine", r.name()))?;
                for (what, p, q) in [
                    ("total", x.total, y.total),
                    ("system reserved", x.system_reserved, y.system_reserved),
                    ("allocatable", x.allocatable, y.allocatable),
                ] {
                    if p != q {
                        return Err(format!("node {id}: {} {what} {p}, expected {q}", r.name()));
                    }
                }
                for (what, f) in [
                    (
                        "free",
                        (|m: &MemoryBlock| m.free) as fn(&MemoryBlock) -> u64,
                    ),
                    ("reserved", |m: &MemoryBlock| m.reserved),
                ] {
                    let (p, q) = (self.sum(a.cells, *r, f), other.sum(a.cells, *r, f));
                    if p != q {
                        return Err(format!(
                            "node {id}: {} {what} over group {:?} {p}, expected {q}",
                            r.name(),
                            a.cells
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Fraction of allocatable regular memory reserved on `mask` (0 when none allocatable).
    pub fn used_fraction(&self, mask: NodeMask) -> f64 {
        let a = self.sum(mask, MemoryResource::Memory, |b| b.allocatable);
        let r = self.sum(mask, MemoryResource::Memory, |b| b.reserved);
        if a == 0 {
            0.0
        } else {
            r as f64 / a as f64
        }
    }
}

/// The machine's nodes as the Memory Manager sees them.
pub fn machine_nodes(topo: &Topology) -> Vec<MachineNode> {
    topo.nodes
        .iter()
        .map(|n| MachineNode {
            id: n.id,
            memory: n.memory_total_bytes,
            hugepages: n
                .hugepages
                .iter()
                .filter_map(|(k, h)| {
                    let kib = k.strip_suffix("kB")?.parse().ok()?;
                    Some((kib, h.total))
                })
                .collect(),
        })
        .collect()
}

/// The config's reservation per node and resource.
pub fn system_reserved(reserved: &[ReservedMemory]) -> SystemReserved {
    reserved
        .iter()
        .map(|r| {
            let m = [
                (MemoryResource::Memory, r.memory_bytes),
                (MemoryResource::Hugepages2Mi, r.hugepages_2mi_bytes),
                (MemoryResource::Hugepages1Gi, r.hugepages_1gi_bytes),
            ]
            .into_iter()
            .filter(|(_, b)| *b > 0)
            .collect();
            (r.node, m)
        })
        .collect()
}

/// Every non-empty mask over `nodes` in kubelet's `IterateBitMasks` order (by width, then
/// lexicographic ids).
pub fn every_mask(nodes: NodeMask) -> Vec<NodeMask> {
    let ids: Vec<u32> = nodes.ids().collect();
    let mut out = Vec::new();
    for k in 1..=ids.len() {
        let mut idx: Vec<usize> = (0..k).collect();
        loop {
            out.push(NodeMask::from_ids(idx.iter().map(|&i| ids[i])).unwrap_or_default());
            let mut i = k;
            while i > 0 && idx[i - 1] == ids.len() - k + i - 1 {
                i -= 1;
            }
            if i == 0 {
                break;
            }
            idx[i - 1] += 1;
            for j in i..k {
                idx[j] = idx[j - 1] + 1;
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;

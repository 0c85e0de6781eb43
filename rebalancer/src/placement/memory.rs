//! Memory Manager static policy model (kubelet `memorymanager/policy_static.go`): per node and
//! per resource (memory, hugepages-2Mi, hugepages-1Gi) total / system-reserved / allocatable /
//! reserved / free; NUMA groups (a node serves either single-node allocations or one fixed
//! multi-node group, never both); hints; allocation; release.

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

/// A node's memory state. `cells` is the group the node serves (itself when single).
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

/// What one allocation took: its node group and the bytes per (node, resource).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAllocation {
    pub nodes: NodeMask,
    pub taken: Vec<(u32, MemoryResource, u64)>,
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
    #[error("no NUMA nodes with enough {resource} available (requested {requested} bytes)")]
    Insufficient {
        resource: &'static str,
        requested: u64,
    },
    #[error("failed to find NUMA nodes to extend the current topology hint {0:?}")]
    CannotExtend(NodeMask),
    #[error("preferred hint {0:?} violates NUMA node allocation (a node cannot serve both single and cross NUMA node allocations)")]
    Violation(NodeMask),
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
        let mut nodes = Vec::new();
        for n in &topo.nodes {
            let res = reserved.iter().find(|r| r.node == n.id);
            let hp = |key: &str, size: u64| n.hugepages.get(key).map_or(0, |h| h.total * size);
            let mut blocks = BTreeMap::new();
            for (r, total, sys) in [
                (
                    MemoryResource::Memory,
                    n.memory_total_bytes,
                    res.map_or(0, |r| r.memory_bytes),
                ),
                (
                    MemoryResource::Hugepages2Mi,
                    hp("2048kB", 2 << 20),
                    res.map_or(0, |r| r.hugepages_2mi_bytes),
                ),
                (
                    MemoryResource::Hugepages1Gi,
                    hp("1048576kB", 1 << 30),
                    res.map_or(0, |r| r.hugepages_1gi_bytes),
                ),
            ] {
                if sys > total {
                    return Err(MemoryError::ReservedTooLarge {
                        node: n.id,
                        resource: r.name(),
                        reserved: sys,
                        total,
                    });
                }
                blocks.insert(
                    r,
                    MemoryBlock {
                        total,
                        system_reserved: sys,
                        allocatable: total - sys,
                        reserved: 0,
                        free: total - sys,
                    },
                );
            }
            nodes.push(NodeMemory {
                id: n.id,
                blocks,
                cells: NodeMask::single(n.id),
                assignments: 0,
            });
        }
        Ok(MemoryState { nodes })
    }

    fn node(&self, id: u32) -> Option<&NodeMemory> {
        self.nodes.iter().find(|n| n.id == id)
    }

    fn sum(&self, mask: NodeMask, r: MemoryResource, f: fn(&MemoryBlock) -> u64) -> u64 {
        mask.ids()
            .filter_map(|id| self.node(id))
            .filter_map(|n| n.blocks.get(&r))
            .map(f)
            .sum()
    }

    pub fn all_nodes(&self) -> NodeMask {
        NodeMask::from_ids(self.nodes.iter().map(|n| n.id)).unwrap_or_default()
    }

    /// Whether a mask may take a new allocation under the group rules.
    fn group_ok(&self, mask: NodeMask) -> bool {
        let single = mask.count() == 1;
        mask.ids().filter_map(|id| self.node(id)).all(|n| {
            if single {
                // a node already in a cross-node group cannot serve a single-node one
                n.cells.count() <= 1 || n.assignments == 0
            } else {
                n.assignments == 0 || (n.cells.count() > 1 && n.cells == mask)
            }
        })
    }

    /// kubelet's `calculateHints`: one list per requested resource (all equal), a hint for
    /// every mask whose allocatable memory covers the request, that respects the groups and
    /// whose free memory covers it; preferred at the minimal allocatable width. `None` for an
    /// empty request (no preference).
    pub fn hints(&self, req: &MemoryRequest) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
        if req.values().all(|&b| b == 0) {
            return None;
        }
        let allocatable_fits = |m: NodeMask| {
            req.iter()
                .all(|(r, &b)| self.sum(m, *r, |x| x.allocatable) >= b)
        };
        let masks = candidate_masks(self.all_nodes(), &allocatable_fits);
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
            if req.iter().all(|(r, &b)| self.sum(m, *r, |x| x.free) >= b) {
                list.push(m);
            }
        }
        let hints: Vec<TopologyHint> = list
            .into_iter()
            .map(|m| TopologyHint::new(Some(m), m.count() == min_width))
            .collect();
        Some(
            req.iter()
                .filter(|(_, b)| **b > 0)
                .map(|(r, _)| (r.name().to_string(), hints.clone()))
                .collect(),
        )
    }

    fn satisfies(&self, mask: NodeMask, req: &MemoryRequest) -> bool {
        req.iter()
            .all(|(r, &b)| self.sum(mask, *r, |x| x.free) >= b)
    }

    /// kubelet's `findBestHint`: preferred first, then narrower (`tie` breaks equal widths
    /// when given, else the lowest mask).
    fn best_hint(hints: &[TopologyHint], tie: &dyn Fn(NodeMask, NodeMask) -> bool) -> NodeMask {
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
        best.and_then(|b| b.affinity).unwrap_or_default()
    }

    /// The node group an allocation for `req` under `hint` would use: the hint itself if its
    /// free memory covers the request, else the best hint containing it (kubelet's
    /// `extendTopologyManagerHint`); no hint → the best hint overall (`getDefaultHint`).
    pub fn choose(
        &self,
        req: &MemoryRequest,
        hint: Option<NodeMask>,
        tie: &dyn Fn(NodeMask, NodeMask) -> bool,
    ) -> Result<NodeMask, MemoryError> {
        let insufficient = || {
            let (r, b) = req
                .iter()
                .find(|(_, b)| **b > 0)
                .map(|(r, b)| (r.name(), *b))
                .unwrap_or(("memory", 0));
            MemoryError::Insufficient {
                resource: r,
                requested: b,
            }
        };
        let all = self.hints(req).unwrap_or_default();
        let list = all.values().next().cloned().unwrap_or_default();
        let mask = match hint {
            Some(h) if self.satisfies(h, req) => h,
            Some(h) => {
                let within: Vec<TopologyHint> = list
                    .iter()
                    .filter(|x| x.affinity.is_some_and(|a| h.is_subset_of(a)))
                    .copied()
                    .collect();
                if within.is_empty() {
                    return Err(if list.is_empty() {
                        insufficient()
                    } else {
                        MemoryError::CannotExtend(h)
                    });
                }
                Self::best_hint(&within, tie)
            }
            None => {
                if list.is_empty() {
                    return Err(insufficient());
                }
                Self::best_hint(&list, tie)
            }
        };
        if !self.group_ok(mask) {
            return Err(MemoryError::Violation(mask));
        }
        if !self.satisfies(mask, req) {
            return Err(insufficient());
        }
        Ok(mask)
    }

    /// Reserves `req` on the nodes of `mask` in id order (kubelet's `Allocate`), making the
    /// mask the nodes' group. The caller chose `mask` with [`MemoryState::choose`].
    pub fn allocate(&mut self, req: &MemoryRequest, mask: NodeMask) -> MemoryAllocation {
        let mut taken = Vec::new();
        for n in self.nodes.iter_mut().filter(|n| mask.contains(n.id)) {
            n.assignments += 1;
            n.cells = mask;
        }
        for (r, &want) in req {
            let mut left = want;
            for n in self.nodes.iter_mut().filter(|n| mask.contains(n.id)) {
                if left == 0 {
                    break;
                }
                let Some(b) = n.blocks.get_mut(r) else {
                    continue;
                };
                let t = b.free.min(left);
                if t == 0 {
                    continue;
                }
                b.free -= t;
                b.reserved += t;
                left -= t;
                taken.push((n.id, *r, t));
            }
        }
        MemoryAllocation { nodes: mask, taken }
    }

    /// Undoes an allocation exactly; a node with no assignment left serves only itself.
    pub fn release(&mut self, a: &MemoryAllocation) {
        for &(id, r, t) in &a.taken {
            if let Some(b) = self
                .nodes
                .iter_mut()
                .find(|n| n.id == id)
                .and_then(|n| n.blocks.get_mut(&r))
            {
                b.free += t;
                b.reserved -= t.min(b.reserved);
            }
        }
        for n in self.nodes.iter_mut().filter(|n| a.nodes.contains(n.id)) {
            n.assignments = n.assignments.saturating_sub(1);
            if n.assignments == 0 {
                n.cells = NodeMask::single(n.id);
            }
        }
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

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;

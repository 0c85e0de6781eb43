//! One conformance case of `rebalancer hints memory` (../shared/conformance/memory-manager.md):
//! one kubelet Memory Manager operation (static policy) on a stored state, parsed from JSON with
//! errors that name the offending field, evaluated with [`super::memory`]'s model, answered as
//! one JSON line.
//!
//! What the operations do (kubelet's `policy_static.go`):
//! - `new`: refuses a reservation without regular memory (`NewPolicyStatic`);
//! - `start`: an empty stored state (with no assignments) becomes the machine's default state;
//!   otherwise the state the assignments make on the machine must equal the stored one
//!   (`validateState`) — the same check the daemon runs on a restored checkpoint;
//! - `allocate`: Guaranteed pods only; each named container in order, stopping at the first
//!   error; an already allocated container only updates the reusable memory; init containers'
//!   memory is reused by later containers on the same node group, sidecars keep theirs;
//! - `remove_container`, `get_topology_hints` (every node mask, kubelet's order; blocks already
//!   held regenerate their own hints), `get_pod_requested_resources`.
//!
//! Refused as malformed: wrong JSON types, an unknown `operation`, node ids past 127, sizes that
//! are not non-negative integers, resource names other than `memory`, `hugepages-2Mi` and
//! `hugepages-1Gi` in states and blocks (the model's resources), quantities that do not parse, a
//! call naming a container the pod does not have. Extra fields are ignored.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::mask::{NodeMask, TopologyHint, MAX_NODES};
use super::memory::{
    reusable_on, update_reusable, Block, ContainerKind, MachineNode, MemoryBlock, MemoryError,
    MemoryRequest, MemoryResource, MemoryState, NodeMemory, ReusableMemory, SystemReserved,
};
use super::merge_case::{err, kind, present, CaseError};
use super::quantity::Quantity;

/// Stored blocks: pod uid → container → blocks (kubelet's `ContainerMemoryAssignments`).
pub type Assignments = BTreeMap<String, BTreeMap<String, Vec<Block>>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    New,
    Start,
    Allocate,
    RemoveContainer,
    GetTopologyHints,
    GetPodRequestedResources,
}

/// A container of the case's pod: its requests and limits by resource name.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseContainer {
    pub name: String,
    pub requests: BTreeMap<String, Quantity>,
    pub limits: BTreeMap<String, Quantity>,
    /// `restart_policy: "Always"` (a sidecar when it is an init container).
    pub restartable: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CasePod {
    pub uid: String,
    pub containers: Vec<CaseContainer>,
    pub init_containers: Vec<CaseContainer>,
}

/// A parsed case.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryCase {
    pub operation: Operation,
    pub machine: Vec<MachineNode>,
    pub reserved: Option<SystemReserved>,
    pub state: MemoryState,
    pub assignments: Assignments,
    pub reusable: ReusableMemory,
    pub hint: TopologyHint,
    pub pod: Option<CasePod>,
    /// `allocate`: container names in order; `remove_container`: [pod uid, container];
    /// `get_topology_hints`: [container].
    pub call: Vec<String>,
}

/// The answer of one case.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CaseAnswer {
    pub error: Option<String>,
    pub state: Option<(Assignments, MemoryState)>,
    /// `None` = kubelet's nil map.
    pub hints: Option<BTreeMap<String, Vec<TopologyHint>>>,
    pub requested: Option<BTreeMap<String, u64>>,
}

/// kubelet's `GetPodQOS` over cpu and memory, summed over all containers.
fn guaranteed(pod: &CasePod) -> bool {
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut all_limits = true;
    for c in pod.containers.iter().chain(&pod.init_containers) {
        for (r, q) in &c.requests {
            if (r == "cpu" || r == "memory") && q.is_positive() {
                let e = requests.entry(r.as_str()).or_default();
                *e = e.saturating_add(q.0);
            }
        }
        let mut found = 0;
        for (r, q) in &c.limits {
            if (r == "cpu" || r == "memory") && q.is_positive() {
                let e = limits.entry(r.as_str()).or_default();
                *e = e.saturating_add(q.0);
                found += 1;
            }
        }
        all_limits &= found == 2;
    }
    if requests.is_empty() && limits.is_empty() {
        return false;
    }
    all_limits
        && requests.iter().all(|(r, q)| limits.get(r) == Some(q))
        && requests.len() == limits.len()
}

/// kubelet's `getRequestedResources`: memory and hugepages from the container's requests.
fn requested(c: &CaseContainer) -> Result<BTreeMap<String, u64>, String> {
    let mut out = BTreeMap::new();
    for (r, q) in &c.requests {
        if !MemoryResource::is_memory_name(r) {
            continue;
        }
        let v = q
            .as_i64()
            .ok_or("[memorymanager] failed to represent quantity as int64")?;
        out.insert(r.clone(), v as u64);
    }
    Ok(out)
}

fn model_request(r: &BTreeMap<String, u64>) -> Result<MemoryRequest, String> {
    r.iter()
        .map(|(k, &v)| {
            MemoryResource::parse(k)
                .map(|r| (r, v))
                .ok_or_else(|| format!("[memorymanager] resource {k} is not modelled (memory, hugepages-2Mi, hugepages-1Gi)"))
        })
        .collect()
}

/// kubelet's `getPodRequestedResources`: per resource of the app containers, the larger of
/// the long-running total (app containers + sidecars) and the init-container peak (each regular
/// init container plus the sidecars started before it).
pub fn pod_requested(pod: &CasePod) -> Result<BTreeMap<String, u64>, String> {
    let mut init_peak: BTreeMap<String, u64> = BTreeMap::new();
    let mut sidecars: BTreeMap<String, u64> = BTreeMap::new();
    for c in &pod.init_containers {
        for (r, q) in requested(c)? {
            let peak = init_peak.entry(r.clone()).or_default();
            let side = sidecars.entry(r).or_default();
            if c.restartable {
                *side = side.saturating_add(q);
            } else if side.saturating_add(q) > *peak {
                *peak = side.saturating_add(q);
            }
        }
    }
    let mut apps: BTreeMap<String, u64> = BTreeMap::new();
    for c in &pod.containers {
        for (r, q) in requested(c)? {
            let e = apps.entry(r).or_default();
            *e = e.saturating_add(q);
        }
    }
    Ok(apps
        .into_iter()
        .map(|(r, total)| {
            let long = total.saturating_add(sidecars.get(&r).copied().unwrap_or(0));
            let v = long.max(init_peak.get(&r).copied().unwrap_or(0));
            (r, v)
        })
        .collect())
}

impl CasePod {
    fn find(&self, name: &str) -> Option<(&CaseContainer, ContainerKind)> {
        if let Some(c) = self.containers.iter().find(|c| c.name == name) {
            return Some((c, ContainerKind::App));
        }
        self.init_containers
            .iter()
            .find(|c| c.name == name)
            .map(|c| {
                let k = if c.restartable {
                    ContainerKind::Sidecar
                } else {
                    ContainerKind::Init
                };
                (c, k)
            })
    }
}

/// The run of one case: the policy's state and the case's answer.
struct Run {
    state: MemoryState,
    assignments: Assignments,
    reusable: ReusableMemory,
}

impl Run {
    /// kubelet's `Allocate` for one container.
    fn allocate(&mut self, pod: &CasePod, name: &str, hint: TopologyHint) -> Result<(), String> {
        let (c, kind) = pod
            .find(name)
            .ok_or_else(|| format!("no container {name}"))?;
        if !guaranteed(pod) {
            return Ok(());
        }
        if let Some(blocks) = self.assignments.get(&pod.uid).and_then(|p| p.get(name)) {
            let blocks = blocks.clone();
            update_reusable(&mut self.reusable, &pod.uid, kind, &blocks);
            return Ok(());
        }
        let req = model_request(&requested(c)?)?;
        let reusable = self.reusable.clone();
        let uid = pod.uid.as_str();
        let reuse = |m: NodeMask, r: MemoryResource| reusable_on(&reusable, uid, m, r);
        let mask = self
            .state
            .choose_kubelet(&req, hint, &reuse, &|a, b| a.0 < b.0, true)
            .map_err(|e: MemoryError| e.to_string())?;
        let blocks: Vec<Block> = req
            .iter()
            .map(|(&resource, &size)| Block {
                numa_affinity: mask,
                resource,
                size,
            })
            .collect();
        self.state.allocate_reusing(&req, mask, &|r| reuse(mask, r));
        update_reusable(&mut self.reusable, uid, kind, &blocks);
        self.assignments
            .entry(uid.to_string())
            .or_default()
            .insert(name.to_string(), blocks.clone());
        self.shrink_init_blocks(pod, name, &blocks);
        Ok(())
    }

    /// kubelet's `updateInitContainersMemoryBlocks`: the blocks of the regular init containers
    /// before `name` shrink by what `name` reused, so the pod's blocks sum to what it holds.
    fn shrink_init_blocks(&mut self, pod: &CasePod, name: &str, blocks: &[Block]) {
        for b in blocks {
            let mut size = b.size;
            for init in &pod.init_containers {
                if init.name == name || size == 0 {
                    break;
                }
                if init.restartable {
                    continue;
                }
                let Some(held) = self
                    .assignments
                    .get_mut(&pod.uid)
                    .and_then(|p| p.get_mut(&init.name))
                else {
                    continue;
                };
                for ib in held.iter_mut() {
                    if ib.size == 0
                        || ib.resource != b.resource
                        || ib.numa_affinity != b.numa_affinity
                    {
                        continue;
                    }
                    let t = ib.size.min(size);
                    ib.size -= t;
                    size -= t;
                }
            }
        }
    }

    /// kubelet's `RemoveContainer`.
    fn remove(&mut self, uid: &str, name: &str) {
        let Some(blocks) = self.assignments.get_mut(uid).and_then(|p| p.remove(name)) else {
            return;
        };
        if self.assignments.get(uid).is_some_and(BTreeMap::is_empty) {
            self.assignments.remove(uid);
        }
        for b in &blocks {
            self.state.release_block(b);
        }
    }
}

/// kubelet's `regenerateHints`: the blocks' own masks, preferred, when they match the request.
fn regenerate(
    blocks: &[Block],
    req: &BTreeMap<String, u64>,
) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
    let mut hints: BTreeMap<String, Vec<TopologyHint>> =
        req.keys().map(|r| (r.clone(), Vec::new())).collect();
    if blocks.len() != req.len() {
        return None;
    }
    for b in blocks {
        let want = req.get(b.resource.name())?;
        if *want != b.size {
            return None;
        }
        hints
            .get_mut(b.resource.name())?
            .push(TopologyHint::new(Some(b.numa_affinity), true));
    }
    Some(hints)
}

impl MemoryCase {
    pub fn evaluate(&self) -> CaseAnswer {
        let mut run = Run {
            state: self.state.clone(),
            assignments: self.assignments.clone(),
            reusable: self.reusable.clone(),
        };
        let mut out = CaseAnswer::default();
        match self.operation {
            Operation::New => {
                let total: u64 = self
                    .reserved
                    .iter()
                    .flat_map(|r| r.values())
                    .filter_map(|m| m.get(&MemoryResource::Memory))
                    .sum();
                if total == 0 {
                    out.error = Some(MemoryError::NoSystemReserved.to_string());
                }
                return out;
            }
            Operation::Start => {
                if let Err(e) = self.start() {
                    out.error = Some(e.to_string());
                } else if run.state.nodes.is_empty() {
                    run.state = self.default_state().unwrap_or(run.state);
                }
            }
            Operation::Allocate => {
                if let Some(pod) = &self.pod {
                    for name in &self.call {
                        if let Err(e) = run.allocate(pod, name, self.hint) {
                            out.error = Some(e);
                            break;
                        }
                    }
                }
            }
            Operation::RemoveContainer => {
                if let [uid, name] = self.call.as_slice() {
                    run.remove(uid, name);
                }
            }
            Operation::GetTopologyHints => {
                out.hints = self.topology_hints(&run);
                return out;
            }
            Operation::GetPodRequestedResources => {
                match self
                    .pod
                    .as_ref()
                    .map(pod_requested)
                    .unwrap_or(Ok(BTreeMap::new()))
                {
                    Ok(r) => out.requested = Some(r),
                    Err(e) => out.error = Some(e),
                }
                return out;
            }
        }
        out.state = Some((run.assignments, run.state));
        out
    }

    fn default_state(&self) -> Result<MemoryState, MemoryError> {
        MemoryState::from_machine(&self.machine, &self.reserved.clone().unwrap_or_default())
    }

    /// kubelet's `validateState`.
    fn start(&self) -> Result<(), MemoryError> {
        let fresh = self.default_state()?;
        check_restored(&self.state, &fresh, &self.assignments)
    }

    fn topology_hints(&self, run: &Run) -> Option<BTreeMap<String, Vec<TopologyHint>>> {
        let pod = self.pod.as_ref()?;
        let (c, _) = pod.find(self.call.first()?)?;
        if !guaranteed(pod) {
            return None;
        }
        let req = requested(c).ok()?;
        if let Some(blocks) = run.assignments.get(&pod.uid).and_then(|p| p.get(&c.name)) {
            return regenerate(blocks, &req);
        }
        let req = model_request(&req).ok()?;
        let uid = pod.uid.as_str();
        Some(
            run.state
                .calculate_hints(&req, &|m, r| reusable_on(&run.reusable, uid, m, r), true),
        )
    }
}

/// kubelet's `validateState` on a stored state and its blocks against the state `fresh` of
/// the machine found: an empty stored state is fine only without blocks; otherwise the blocks
/// rebuilt on `fresh` must give the stored state ([`MemoryState::same_as`]).
pub fn check_restored(
    stored: &MemoryState,
    fresh: &MemoryState,
    assignments: &Assignments,
) -> Result<(), MemoryError> {
    if stored.nodes.is_empty() {
        if assignments.values().any(|p| !p.is_empty()) {
            return Err(MemoryError::EmptyStateWithAssignments);
        }
        return Ok(());
    }
    let blocks = assignments.iter().flat_map(|(pod, cs)| {
        cs.iter()
            .flat_map(move |(c, bs)| bs.iter().map(move |b| (pod.as_str(), c.as_str(), b)))
    });
    let expected = MemoryState::rebuild(fresh, blocks)?;
    stored
        .same_as(&expected)
        .map_err(MemoryError::StateMismatch)
}

// ---- output ----

fn hints_json(h: &BTreeMap<String, Vec<TopologyHint>>) -> Value {
    h.iter()
        .map(|(r, list)| {
            let l: Vec<Value> = list
                .iter()
                .map(|h| {
                    json!({"affinity": h.affinity.map(|m| m.ids().collect::<Vec<_>>()),
                           "preferred": h.preferred})
                })
                .collect();
            (r.clone(), Value::Array(l))
        })
        .collect::<Map<_, _>>()
        .into()
}

pub fn state_json(s: &MemoryState) -> Value {
    s.nodes
        .iter()
        .map(|n| {
            let map: Map<String, Value> = n
                .blocks
                .iter()
                .map(|(r, b)| {
                    (
                        r.name().to_string(),
                        json!({"allocatable": b.allocatable, "free": b.free, "reserved": b.reserved,
                               "system_reserved": b.system_reserved, "total_mem_size": b.total}),
                    )
                })
                .collect();
            (
                n.id.to_string(),
                json!({"memory_map": map, "cells": n.cells.ids().collect::<Vec<_>>(),
                       "number_of_assignments": n.assignments}),
            )
        })
        .collect::<Map<_, _>>()
        .into()
}

pub fn assignments_json(a: &Assignments) -> Value {
    serde_json::to_value(a).unwrap_or(Value::Null)
}

/// The output line: `{"error":…,"assignments":…,"machine_state":…,"topology_hints":…,"requested":…}`.
pub fn outcome_json(o: &CaseAnswer) -> String {
    let (a, s) = match &o.state {
        Some((a, s)) => (assignments_json(a), state_json(s)),
        None => (Value::Null, Value::Null),
    };
    // serde_json keeps insertion order only with preserve_order; write the fields in order
    format!(
        "{{\"error\":{},\"assignments\":{},\"machine_state\":{},\"topology_hints\":{},\"requested\":{}}}",
        serde_json::to_string(&o.error).unwrap_or_default(),
        a,
        s,
        o.hints.as_ref().map_or(Value::Null, hints_json),
        serde_json::to_value(&o.requested).unwrap_or(Value::Null),
    )
}

/// The output line of a malformed case.
pub fn error_line(index: usize, e: &CaseError) -> String {
    format!(
        "{{\"error\":{},\"assignments\":null,\"machine_state\":null,\"topology_hints\":null,\"requested\":null,\"index\":{index},\"field\":{}}}",
        Value::String(format!("case {index}: {e}")),
        Value::String(e.field.clone()),
    )
}

// ---- input ----

fn obj<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, CaseError> {
    v.as_object().ok_or_else(|| CaseError {
        field: field.into(),
        message: format!("expected an object, got {}", kind(v)),
    })
}

fn uint(v: Option<&Value>, field: &str) -> Result<u64, CaseError> {
    match v {
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| CaseError {
            field: field.into(),
            message: format!("expected a non-negative integer, got {n}"),
        }),
        Some(other) => err(
            field,
            format!("expected a non-negative integer, got {}", kind(other)),
        ),
        None => err(field, "missing"),
    }
}

fn node_id(v: &Value, field: &str) -> Result<u32, CaseError> {
    match v.as_u64() {
        Some(id) if id < u64::from(MAX_NODES) => Ok(id as u32),
        _ => err(
            field,
            format!("expected a node id in 0..{MAX_NODES}, got {v}"),
        ),
    }
}

fn node_key(k: &str, field: &str) -> Result<u32, CaseError> {
    match k.parse::<u32>() {
        Ok(id) if id < MAX_NODES => Ok(id),
        _ => err(
            field,
            format!("expected a node id in 0..{MAX_NODES} as key, got {k:?}"),
        ),
    }
}

fn mask_of(v: &Value, field: &str) -> Result<NodeMask, CaseError> {
    let Some(items) = v.as_array() else {
        return err(
            field,
            format!("expected an array of node ids, got {}", kind(v)),
        );
    };
    let ids = items
        .iter()
        .enumerate()
        .map(|(i, x)| node_id(x, &format!("{field}[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NodeMask::from_ids(ids).unwrap_or_default())
}

fn resource(k: &str, field: &str) -> Result<MemoryResource, CaseError> {
    MemoryResource::parse(k).ok_or_else(|| CaseError {
        field: field.into(),
        message: format!("unknown memory resource {k:?} (memory, hugepages-2Mi or hugepages-1Gi)"),
    })
}

fn parse_machine(v: Option<&Value>) -> Result<Vec<MachineNode>, CaseError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let o = obj(v, "machine_info")?;
    let Some(topo) = present(o, "topology") else {
        return Ok(Vec::new());
    };
    let Some(items) = topo.as_array() else {
        return err(
            "machine_info.topology",
            format!("expected an array, got {}", kind(topo)),
        );
    };
    let mut out = Vec::new();
    for (i, n) in items.iter().enumerate() {
        let f = format!("machine_info.topology[{i}]");
        let o = obj(n, &f)?;
        let id = node_id(o.get("id").unwrap_or(&Value::Null), &format!("{f}.id"))?;
        let memory = uint(o.get("memory"), &format!("{f}.memory"))?;
        let mut hugepages = Vec::new();
        if let Some(hp) = present(o, "hugepages") {
            let Some(list) = hp.as_array() else {
                return err(
                    format!("{f}.hugepages"),
                    format!("expected an array, got {}", kind(hp)),
                );
            };
            for (j, h) in list.iter().enumerate() {
                let hf = format!("{f}.hugepages[{j}]");
                let ho = obj(h, &hf)?;
                let kib = uint(ho.get("page_size_kib"), &format!("{hf}.page_size_kib"))?;
                if MemoryResource::hugepages_of_kib(kib).is_none() {
                    return err(
                        format!("{hf}.page_size_kib"),
                        format!("page size {kib} KiB is not modelled (2048 or 1048576)"),
                    );
                }
                let pages = uint(ho.get("num_pages"), &format!("{hf}.num_pages"))?;
                hugepages.push((kib, pages));
            }
        }
        out.push(MachineNode {
            id,
            memory,
            hugepages,
        });
    }
    Ok(out)
}

fn parse_reserved(v: Option<&Value>) -> Result<Option<SystemReserved>, CaseError> {
    let Some(v) = v else { return Ok(None) };
    let mut out = SystemReserved::new();
    for (k, m) in obj(v, "system_reserved")? {
        let f = format!("system_reserved.{k}");
        let id = node_key(k, &f)?;
        let mut per = BTreeMap::new();
        for (r, b) in obj(m, &f)? {
            let rf = format!("{f}.{r}");
            per.insert(resource(r, &rf)?, uint(Some(b), &rf)?);
        }
        out.insert(id, per);
    }
    Ok(Some(out))
}

fn parse_state(v: Option<&Value>) -> Result<MemoryState, CaseError> {
    let mut nodes = Vec::new();
    if let Some(v) = v {
        for (k, n) in obj(v, "machine_state")? {
            let f = format!("machine_state.{k}");
            let id = node_key(k, &f)?;
            let o = obj(n, &f)?;
            let mut blocks = BTreeMap::new();
            if let Some(mm) = present(o, "memory_map") {
                for (r, t) in obj(mm, &format!("{f}.memory_map"))? {
                    let rf = format!("{f}.memory_map.{r}");
                    let to = obj(t, &rf)?;
                    let g = |name: &str| uint(to.get(name), &format!("{rf}.{name}"));
                    blocks.insert(
                        resource(r, &rf)?,
                        MemoryBlock {
                            total: g("total_mem_size")?,
                            system_reserved: g("system_reserved")?,
                            allocatable: g("allocatable")?,
                            reserved: g("reserved")?,
                            free: g("free")?,
                        },
                    );
                }
            }
            let cells = match present(o, "cells") {
                Some(c) => mask_of(c, &format!("{f}.cells"))?,
                None => NodeMask::EMPTY,
            };
            let assignments = match present(o, "number_of_assignments") {
                Some(a) => u32::try_from(uint(Some(a), &format!("{f}.number_of_assignments"))?)
                    .unwrap_or(u32::MAX),
                None => 0,
            };
            nodes.push(NodeMemory {
                id,
                blocks,
                cells,
                assignments,
            });
        }
    }
    nodes.sort_by_key(|n| n.id);
    if nodes.len() > MAX_CASE_NODES {
        return err(
            "machine_state",
            format!(
                "{} NUMA nodes: the hints of every node mask are enumerated, up to {MAX_CASE_NODES} nodes",
                nodes.len()
            ),
        );
    }
    Ok(MemoryState { nodes })
}

/// Most NUMA nodes a case may have (every mask is enumerated, as kubelet does; kubelet's own
/// limit is 8 unless max-allowable-numa-nodes raises it).
pub const MAX_CASE_NODES: usize = 16;

fn parse_assignments(v: Option<&Value>) -> Result<Assignments, CaseError> {
    let mut out = Assignments::new();
    let Some(v) = v else { return Ok(out) };
    for (pod, cs) in obj(v, "assignments")? {
        let pf = format!("assignments.{pod}");
        let mut per = BTreeMap::new();
        for (c, bs) in obj(cs, &pf)? {
            let cf = format!("{pf}.{c}");
            let Some(list) = bs.as_array() else {
                return err(cf, format!("expected an array of blocks, got {}", kind(bs)));
            };
            let mut blocks = Vec::new();
            for (i, b) in list.iter().enumerate() {
                let bf = format!("{cf}[{i}]");
                let bo = obj(b, &bf)?;
                let numa_affinity = mask_of(
                    bo.get("numa_affinity").unwrap_or(&Value::Null),
                    &format!("{bf}.numa_affinity"),
                )?;
                let r = match bo.get("type") {
                    Some(Value::String(s)) => resource(s, &format!("{bf}.type"))?,
                    _ => return err(format!("{bf}.type"), "expected a resource name"),
                };
                let size = uint(bo.get("size"), &format!("{bf}.size"))?;
                blocks.push(Block {
                    numa_affinity,
                    resource: r,
                    size,
                });
            }
            per.insert(c.clone(), blocks);
        }
        out.insert(pod.clone(), per);
    }
    Ok(out)
}

/// A reusable-memory key: kubelet's bitmask string (binary digits, node 0 rightmost, as
/// `BitMask.String()` prints it) or a node list such as `"0,1"` / `"[0,1]"`.
fn parse_mask_key(k: &str, field: &str) -> Result<NodeMask, CaseError> {
    let t = k.trim().trim_start_matches('[').trim_end_matches(']');
    if !t.is_empty() && t.chars().all(|c| c == '0' || c == '1') && !t.contains(',') && k.len() > 1 {
        let ids = t
            .chars()
            .rev()
            .enumerate()
            .filter(|(_, c)| *c == '1')
            .map(|(i, _)| i as u32);
        return NodeMask::from_ids(ids).ok_or_else(|| CaseError {
            field: field.into(),
            message: format!("mask {k:?} is wider than {MAX_NODES} nodes"),
        });
    }
    let ids = t
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<u32>().ok().filter(|&i| i < MAX_NODES))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| CaseError {
            field: field.into(),
            message: format!("expected a bitmask string or a node list, got {k:?}"),
        })?;
    Ok(NodeMask::from_ids(ids).unwrap_or_default())
}

fn parse_reusable(v: Option<&Value>) -> Result<ReusableMemory, CaseError> {
    let mut out = ReusableMemory::new();
    let Some(v) = v else { return Ok(out) };
    for (pod, masks) in obj(v, "init_containers_reusable_memory")? {
        let pf = format!("init_containers_reusable_memory.{pod}");
        let mut per = BTreeMap::new();
        for (k, rs) in obj(masks, &pf)? {
            let mf = format!("{pf}.{k}");
            let mask = parse_mask_key(k, &mf)?;
            let mut m = BTreeMap::new();
            for (r, b) in obj(rs, &mf)? {
                let rf = format!("{mf}.{r}");
                m.insert(resource(r, &rf)?, uint(Some(b), &rf)?);
            }
            per.insert(mask, m);
        }
        out.insert(pod.clone(), per);
    }
    Ok(out)
}

fn parse_hint(v: Option<&Value>) -> Result<TopologyHint, CaseError> {
    let Some(v) = v else {
        // no hint stored: the Topology Manager's zero value
        return Ok(TopologyHint::new(None, false));
    };
    let o = obj(v, "topology_hint")?;
    let affinity = match present(o, "affinity") {
        Some(a) => Some(mask_of(a, "topology_hint.affinity")?),
        None => None,
    };
    let preferred = match o.get("preferred") {
        Some(Value::Bool(b)) => *b,
        None | Some(Value::Null) => false,
        Some(other) => {
            return err(
                "topology_hint.preferred",
                format!("expected a boolean, got {}", kind(other)),
            )
        }
    };
    Ok(TopologyHint::new(affinity, preferred))
}

fn quantities(v: Option<&Value>, field: &str) -> Result<BTreeMap<String, Quantity>, CaseError> {
    let mut out = BTreeMap::new();
    let Some(v) = v else { return Ok(out) };
    for (r, q) in obj(v, field)? {
        let f = format!("{field}.{r}");
        let parsed = match q {
            Value::String(s) => Quantity::parse(s).map_err(|e| CaseError {
                field: f.clone(),
                message: e.to_string(),
            })?,
            Value::Number(n) => Quantity::parse(&n.to_string()).map_err(|e| CaseError {
                field: f.clone(),
                message: e.to_string(),
            })?,
            other => {
                return err(
                    f,
                    format!("expected a quantity string, got {}", kind(other)),
                )
            }
        };
        out.insert(r.clone(), parsed);
    }
    Ok(out)
}

fn parse_containers(v: Option<&Value>, field: &str) -> Result<Vec<CaseContainer>, CaseError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let Some(list) = v.as_array() else {
        return err(field, format!("expected an array, got {}", kind(v)));
    };
    let mut out = Vec::new();
    for (i, c) in list.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let o = obj(c, &f)?;
        let name = match o.get("name") {
            Some(Value::String(s)) => s.clone(),
            _ => return err(format!("{f}.name"), "expected a string"),
        };
        let res = present(o, "resources");
        let ro = match res {
            Some(r) => Some(obj(r, &format!("{f}.resources"))?),
            None => None,
        };
        let requests = quantities(
            ro.and_then(|r| present(r, "requests")),
            &format!("{f}.resources.requests"),
        )?;
        let limits = quantities(
            ro.and_then(|r| present(r, "limits")),
            &format!("{f}.resources.limits"),
        )?;
        let restartable = match present(o, "restart_policy") {
            Some(Value::String(s)) => s == "Always",
            None => false,
            Some(other) => {
                return err(
                    format!("{f}.restart_policy"),
                    format!("expected a string or null, got {}", kind(other)),
                )
            }
        };
        out.push(CaseContainer {
            name,
            requests,
            limits,
            restartable,
        });
    }
    Ok(out)
}

fn parse_pod(v: Option<&Value>) -> Result<Option<CasePod>, CaseError> {
    let Some(v) = v else { return Ok(None) };
    let o = obj(v, "pod")?;
    let uid = match present(o, "uid") {
        Some(Value::String(s)) => s.clone(),
        None => String::new(),
        Some(other) => return err("pod.uid", format!("expected a string, got {}", kind(other))),
    };
    Ok(Some(CasePod {
        uid,
        containers: parse_containers(present(o, "containers"), "pod.containers")?,
        init_containers: parse_containers(present(o, "init_containers"), "pod.init_containers")?,
    }))
}

fn string(o: &Map<String, Value>, key: &str, field: &str) -> Result<String, CaseError> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => err(field, format!("expected a string, got {}", kind(other))),
        None => err(field, "missing"),
    }
}

/// Parses and validates one case object.
pub fn parse_case(v: &Value) -> Result<MemoryCase, CaseError> {
    let o = obj(v, "(case)")?;
    let operation = match o.get("operation") {
        Some(Value::String(s)) => match s.as_str() {
            "new" => Operation::New,
            "start" => Operation::Start,
            "allocate" => Operation::Allocate,
            "remove_container" => Operation::RemoveContainer,
            "get_topology_hints" => Operation::GetTopologyHints,
            "get_pod_requested_resources" => Operation::GetPodRequestedResources,
            other => return err("operation", format!("unknown operation {other:?} (new, start, allocate, remove_container, get_topology_hints, get_pod_requested_resources)")),
        },
        Some(other) => return err("operation", format!("expected a string, got {}", kind(other))),
        None => return err("operation", "missing"),
    };
    let pod = parse_pod(present(o, "pod"))?;
    let call_obj = match present(o, "call") {
        Some(c) => Some(obj(c, "call")?),
        None => None,
    };
    let call = match operation {
        Operation::Allocate => {
            let names = match call_obj.and_then(|c| present(c, "containers")) {
                Some(Value::Array(a)) => a
                    .iter()
                    .enumerate()
                    .map(|(i, n)| match n {
                        Value::String(s) => Ok(s.clone()),
                        other => err(
                            format!("call.containers[{i}]"),
                            format!("expected a container name, got {}", kind(other)),
                        ),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(other) => {
                    return err(
                        "call.containers",
                        format!("expected an array, got {}", kind(other)),
                    )
                }
                None => return err("call.containers", "missing"),
            };
            let Some(p) = &pod else {
                return err("pod", "missing");
            };
            for (i, n) in names.iter().enumerate() {
                if p.find(n).is_none() {
                    return err(
                        format!("call.containers[{i}]"),
                        format!("the pod has no container {n:?}"),
                    );
                }
            }
            names
        }
        Operation::RemoveContainer => {
            let Some(c) = call_obj else {
                return err("call", "missing");
            };
            vec![
                string(c, "pod_uid", "call.pod_uid")?,
                string(c, "container", "call.container")?,
            ]
        }
        Operation::GetTopologyHints => {
            let Some(c) = call_obj else {
                return err("call", "missing");
            };
            let name = string(c, "container", "call.container")?;
            let Some(p) = &pod else {
                return err("pod", "missing");
            };
            if p.find(&name).is_none() {
                return err(
                    "call.container",
                    format!("the pod has no container {name:?}"),
                );
            }
            vec![name]
        }
        _ => Vec::new(),
    };
    if operation == Operation::GetPodRequestedResources && pod.is_none() {
        return err("pod", "missing");
    }
    Ok(MemoryCase {
        operation,
        machine: parse_machine(present(o, "machine_info"))?,
        reserved: parse_reserved(present(o, "system_reserved"))?,
        state: parse_state(present(o, "machine_state"))?,
        assignments: parse_assignments(present(o, "assignments"))?,
        reusable: parse_reusable(present(o, "init_containers_reusable_memory"))?,
        hint: parse_hint(present(o, "topology_hint"))?,
        pod,
        call,
    })
}

#[cfg(test)]
#[path = "memory_case_tests.rs"]
mod tests;

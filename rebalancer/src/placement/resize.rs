//! In-place resize of an admitted container (Kubernetes' `resize` subresource, which kubelet
//! hands the runtime as CRI `UpdateContainerResources`), as kubelet's CPU and Memory Managers
//! treat one: exclusive CPUs grow by CPUs taken within the container's NUMA affinity — the
//! CPUs it runs on kept — or the resize is refused; they shrink to a topology-packed subset
//! of what it holds, the rest going back to the shared pool; Memory Manager memory is booked
//! again on the same nodes, or the resize is refused. A shared container's charge follows its
//! new request. Atomic: a refused resize changes nothing.
//!
//! Only pods admitted whole with one container are resized (the watcher's and the NRI
//! plugin's containers); a pod admitted one container at a time under pod scope holds its
//! pod's totals, which a container's resize alone does not change, so it is refused.

use super::*;

impl Allocator {
    /// Resizes container `name` of pod `uid` to `new`'s requests and limits (its name is not
    /// used); the container's placement now, or why not (the books unchanged).
    pub fn resize(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        uid: &str,
        name: &str,
        new: &Container,
    ) -> Result<ContainerPlacement, Rejection> {
        let mut next = self.clone();
        let p = next.resize_inner(topo, cfg, uid, name, new)?;
        *self = next;
        Ok(p)
    }

    /// Whether `new` asks other requests than those booked for pod `uid` admitted as one
    /// container (a resize to make); false for a pod unknown or not admitted as one container.
    pub fn asks_other_than_booked(&self, uid: &str, new: &Container) -> bool {
        let Some(p) = (self.pods.get(uid)).filter(|p| p.hold.is_none() && p.containers.len() == 1)
        else {
            return false;
        };
        let one = Pod {
            uid: uid.to_string(),
            containers: vec![new.clone()],
            init_containers: Vec::new(),
        };
        new.cpu_request() != p.cpu_request_millis || pod_memory_request(&one) != p.memory_request
    }

    fn resize_inner(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
        uid: &str,
        name: &str,
        new: &Container,
    ) -> Result<ContainerPlacement, Rejection> {
        let new = Container {
            name: name.to_string(),
            ..new.clone()
        };
        let invalid = |d: String| Rejection::new(R::InvalidPod, d);
        let pod =
            (self.pods.get(uid)).ok_or_else(|| invalid(format!("pod {uid} is not admitted")))?;
        if pod.hold.is_some() || pod.containers.len() != 1 {
            return Err(invalid(format!(
                "pod {uid} was not admitted as one container: its containers are not resized in place"
            )));
        }
        let old = pod.containers[0].clone();
        if old.placement.container != name {
            return Err(invalid(format!("pod {uid} has no container {name}")));
        }
        let one = Pod {
            uid: uid.to_string(),
            containers: vec![new.clone()],
            init_containers: Vec::new(),
        };
        one.validate().map_err(invalid)?;
        let qos = one.qos();
        if qos != pod.qos {
            return Err(invalid(format!(
                "a resize cannot change the QoS class ({:?} to {qos:?}; Kubernetes forbids it too)",
                pod.qos
            )));
        }
        let view = CpuView::new(topo);
        // node-level fit as at admission, the pod's old requests left out
        let cpu = new.cpu_request();
        let allocatable = view.online.difference(&self.reserved_cpus).len() as u64 * 1000;
        let used: u64 = (self.pods.iter())
            .filter(|(k, _)| *k != uid)
            .fold(0u64, |a, (_, p)| a.saturating_add(p.cpu_request_millis));
        if used.saturating_add(cpu) > allocatable {
            return Err(Rejection::new(
                R::InsufficientCpu,
                format!(
                    "resize to {cpu}m: {}m of {allocatable}m allocatable left",
                    allocatable.saturating_sub(used)
                ),
            ));
        }
        let mem_total = pod_memory_request(&one);
        for (r, &b) in &mem_total {
            let (alloc, used) = (
                self.allocatable_memory(*r),
                self.booked_memory(*r, Some(uid)),
            );
            if used.saturating_add(b) > alloc {
                return Err(Rejection::new(
                    R::InsufficientMemory,
                    format!(
                        "resize to {b} bytes of {}: {} of {alloc} allocatable left",
                        r.name(),
                        alloc.saturating_sub(used)
                    ),
                ));
            }
        }
        // the old charge off the shared CPUs; the new one (if shared) put back below
        for (c, m) in &old.charges {
            if let Some(l) = self.shared_load.get_mut(c) {
                *l -= (*m).min(*l);
                if *l == 0 {
                    self.shared_load.remove(c);
                }
            }
        }
        let memory = match &old.memory {
            Some(a) => Some(self.rebook_resized(a, &memory_request(&new))?),
            None => None,
        };
        let affinity = old.placement.affinity;
        // where it may grow: its affinity and the nodes it runs on now (a round may have
        // moved it); anywhere under policy none
        let within = match affinity {
            Some(a) => view.cpus_of_mask(a.or(view.nodes_of(&old.placement.cpus))),
            None => view.online.clone(),
        };
        let (cpus, charges, exclusive) = match exclusive_cpus(cfg, qos, &new) {
            Some(n) => (
                self.resize_exclusive(cfg, &view, &old, n, &within)?,
                Charges::new(),
                true,
            ),
            None => {
                let cpus = if old.placement.exclusive {
                    // back to the shared pool, on the nodes it had
                    let shared = self.shared_pool(&view);
                    let near = shared.intersection(&within);
                    if near.is_empty() {
                        shared
                    } else {
                        near
                    }
                } else {
                    old.placement.cpus.clone()
                };
                let charges = spread(&cpus, cpu);
                for (c, m) in &charges {
                    *self.shared_load.entry(*c).or_default() += m;
                }
                (cpus, charges, false)
            }
        };
        let mems = match (&memory, exclusive || old.placement.exclusive) {
            (Some(m), _) => m.nodes.to_cpuset(),
            (None, true) => view.nodes_of(&cpus).to_cpuset(),
            (None, false) => old.placement.mems.clone(),
        };
        let placement = ContainerPlacement {
            cpus,
            mems,
            exclusive,
            ..old.placement.clone()
        };
        let p = self.pods.get_mut(uid).expect("checked above");
        p.cpu_request_millis = cpu;
        p.memory_request = mem_total;
        p.containers[0] = AdmittedContainer {
            placement: placement.clone(),
            charges,
            memory,
            ..old
        };
        // as at admission: every shared container keeps a CPU, no node's shared CPUs overrun
        let shared = self.shared_pool(&view);
        self.check_no_starvation(&view, &shared, cfg.overcommit_ratio)?;
        Ok(placement)
    }

    /// The exclusive CPUs of a container resized to `n`: its own kept (all on a grow, a
    /// packed subset on a shrink) and the rest taken from the exclusive pool within `within`.
    fn resize_exclusive(
        &self,
        cfg: &PlacementConfig,
        view: &CpuView,
        old: &AdmittedContainer,
        n: usize,
        within: &CpuSet,
    ) -> Result<CpuSet, Rejection> {
        let opts = StaticOptions::of(cfg);
        let affinity = old.placement.affinity;
        let have = if old.placement.exclusive {
            old.placement.cpus.intersection(&view.online)
        } else {
            CpuSet::new()
        };
        let rejection = |e: CpuError, what: String| match e {
            CpuError::SmtAlignment { .. } => {
                Rejection::new(R::SmtAlignmentError, format!("{what}: {e}"))
            }
            CpuError::Insufficient { .. } | CpuError::Take(_) => {
                Rejection::new(R::InsufficientCpu, format!("{what}: {e}"))
            }
        };
        if n <= have.len() {
            return cpu::allocate_exclusive(view, &have, n, affinity, &opts)
                .map_err(|e| rejection(e, format!("shrinking {} to {n} CPUs", have)));
        }
        let extra = n - have.len();
        let pool = self
            .exclusive_pool(view, cfg.overcommit_ratio)
            .intersection(within);
        let got = cpu::allocate_exclusive(view, &pool, extra, affinity, &opts).map_err(|e| {
            rejection(
                e,
                format!(
                    "growing to {n} CPUs needs {extra} more within nodes {} ({} free there)",
                    view.nodes_of(within).to_cpuset(),
                    pool.len()
                ),
            )
        })?;
        Ok(have.union(&got))
    }
    /// Holds under `key` the Memory Manager memory the resize of `uid`'s container freed (its
    /// record `before` the resize), on the nodes it had, while the resize's write runs: no
    /// admission takes it meanwhile, so an undo books it again in full. Let go by
    /// [`Allocator::let_go`].
    pub fn hold_freed_memory(&mut self, key: &str, uid: &str, before: &AdmittedPod) {
        let now = (self.pods.get(uid)).and_then(|p| p.containers.first());
        let (Some(now), Some(old)) = (now, before.containers.first()) else {
            return;
        };
        let Some(old) = &old.memory else {
            return;
        };
        let taken = |a: Option<&MemoryAllocation>| {
            let mut m = MemoryRequest::new();
            for &(_, r, t) in a.map(|a| a.taken.as_slice()).unwrap_or_default() {
                *m.entry(r).or_default() += t;
            }
            m
        };
        let (was, is) = (taken(Some(old)), taken(now.memory.as_ref()));
        let freed: MemoryRequest = (was.iter())
            .map(|(r, &b)| (*r, b.saturating_sub(is.get(r).copied().unwrap_or(0))))
            .filter(|(_, b)| *b > 0)
            .collect();
        if freed.is_empty() {
            return;
        }
        let held = self.memory.allocate(&freed, old.nodes);
        self.in_flight_memory.insert(key.into(), held);
    }

    /// A change's write ended: what it held under `key` (CPUs, memory) is let go.
    pub fn let_go(&mut self, key: &str) {
        self.in_flight.remove(key);
        if let Some(a) = self.in_flight_memory.remove(key) {
            self.memory.release(&a);
        }
    }

    /// Puts back container `before` of pod `uid` as it was before a resize when the resize's
    /// write failed (called with the resize's holds let go): the container's own entries only
    /// — its placement, shared charges and Memory Manager memory (booked again on the same
    /// nodes, held free while the write ran) — and the pod's requests; anything else changed
    /// meanwhile stays. Nothing when the pod or the container is gone.
    pub fn undo_resize(
        &mut self,
        uid: &str,
        before: &AdmittedContainer,
        requests: (u64, MemoryRequest),
    ) {
        let name = &before.placement.container;
        let Some(now) = (self.pods.get(uid))
            .and_then(|p| p.containers.iter().find(|c| c.placement.container == *name))
            .cloned()
        else {
            return;
        };
        for (cpu, m) in &now.charges {
            if let Some(l) = self.shared_load.get_mut(cpu) {
                *l -= (*m).min(*l);
                if *l == 0 {
                    self.shared_load.remove(cpu);
                }
            }
        }
        if let Some(a) = &now.memory {
            self.memory.release(a);
        }
        let mut back = before.clone();
        for (cpu, m) in &back.charges {
            *self.shared_load.entry(*cpu).or_default() += m;
        }
        if let Some(a) = &back.memory {
            let mut took = MemoryRequest::new();
            for &(_, r, t) in &a.taken {
                *took.entry(r).or_default() += t;
            }
            let again = self.memory.allocate(&took, a.nodes);
            back.memory = Some(MemoryAllocation {
                requested: a.requested.clone(),
                ..again
            });
        }
        let p = self.pods.get_mut(uid).expect("found above");
        (p.cpu_request_millis, p.memory_request) = requests;
        if let Some(c) = (p.containers.iter_mut()).find(|c| c.placement.container == *name) {
            *c = back;
        }
    }

    /// `a` booked again for `req` on its own nodes (a shrink always fits; a grow fits or is
    /// refused: the container keeps its nodes).
    fn rebook_resized(
        &mut self,
        a: &MemoryAllocation,
        req: &MemoryRequest,
    ) -> Result<MemoryAllocation, Rejection> {
        let mut state = self.memory.clone();
        state.release(a);
        let refuse = |d: String| Rejection::new(R::InsufficientMemory, d);
        if state.unbroken(a.nodes) != Some(a.nodes) {
            return Err(refuse(format!(
                "the container's memory nodes {} now serve another NUMA group",
                a.nodes.to_cpuset()
            )));
        }
        let new = state.allocate(req, a.nodes);
        let mut got = MemoryRequest::new();
        for &(_, r, t) in &new.taken {
            *got.entry(r).or_default() += t;
        }
        for (r, &want) in req {
            let have = got.get(r).copied().unwrap_or(0);
            if have < want {
                return Err(refuse(format!(
                    "growing {} to {want} bytes: its nodes {} have {have} free",
                    r.name(),
                    a.nodes.to_cpuset()
                )));
            }
        }
        self.memory = state;
        Ok(new)
    }
}

#[cfg(test)]
#[path = "resize_tests.rs"]
mod tests;

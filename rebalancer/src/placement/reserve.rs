//! A reload's reservations (`placement.reserved_cpus`, `reserved_memory`,
//! `strict_cpu_reservation`) applied to the books, or refused while admitted placements hold
//! what they would reserve.
//!
//! ```text
//! Allocator::reconfigure(topo, cfg) -> Result<bool, ReservationError>
//! ```
use super::admission::Allocator;
use crate::{config::PlacementConfig, cpuset::CpuSet, topology::Topology};

/// Why new reservations were not applied to the allocator.
#[derive(Debug, thiserror::Error)]
pub enum ReservationError {
    #[error("{0}")]
    Invalid(#[from] super::admission::PlacementError),
    #[error("placement.reserved_cpus {reserved} would take CPUs {taken} that admitted containers hold: {holders}; release them first")]
    CpusHeld {
        reserved: CpuSet,
        taken: CpuSet,
        holders: String,
    },
    #[error("placement.reserved_memory changed while {0} admitted container(s) or pod hold(s) have Memory Manager memory; release them first")]
    MemoryHeld(usize),
}

impl Allocator {
    /// Applies `cfg`'s `reserved_cpus` and `reserved_memory` to the books (a restart with a changed
    /// config, or SIGHUP), or refuses with the reason and leaves them unchanged. Newly reserved
    /// CPUs may not be in any admitted placement — exclusive, or a shared container's pool — so no
    /// reserved CPU is ever in a placement; CPUs no longer reserved simply become free. Memory
    /// reservations may change only while no admitted container holds Memory Manager memory (the
    /// blocks' reserved figures would otherwise be rebuilt under live allocations).
    pub fn reconfigure(
        &mut self,
        topo: &Topology,
        cfg: &PlacementConfig,
    ) -> Result<bool, ReservationError> {
        let alloc = self;
        let fresh = Allocator::new(topo, cfg)?;
        let cpus_changed = fresh.reserved_cpus != alloc.reserved_cpus;
        // What each block was built with (its live `reserved` / `free` move with allocations).
        let built = |m: &super::memory::MemoryState| -> Vec<(u32, &'static str, u64)> {
            m.nodes
                .iter()
                .flat_map(|n| {
                    n.blocks
                        .iter()
                        .map(move |(r, b)| (n.id, r.name(), b.system_reserved))
                })
                .collect()
        };
        let memory_changed = built(&alloc.memory) != built(&fresh.memory);
        let strict_changed = fresh.strict_reservation != alloc.strict_reservation;
        if !cpus_changed && !memory_changed && !strict_changed {
            return Ok(false);
        }
        let added = fresh.reserved_cpus.difference(&alloc.reserved_cpus);
        // without strict-cpu-reservation shared containers may keep running on reserved CPUs;
        // turning it on reserves every reserved CPU from them too
        let off_shared = match (fresh.strict_reservation, alloc.strict_reservation) {
            (true, false) => fresh.reserved_cpus.clone(),
            (true, true) => added.clone(),
            (false, _) => CpuSet::new(),
        };
        let mut taken = CpuSet::new();
        let mut holders = Vec::new();
        for (uid, p) in &alloc.pods {
            for c in &p.containers {
                let off = if c.placement.exclusive {
                    &added
                } else {
                    &off_shared
                };
                let hit = c.placement.cpus.intersection(off);
                if !hit.is_empty() {
                    taken = taken.union(&hit);
                    holders.push(format!("{uid}/{} on {hit}", c.placement.container));
                }
            }
            // CPUs a pod holds for its containers still to come are exclusive too
            if let Some(h) = &p.hold {
                let hit = h.cpus.intersection(&added);
                if !hit.is_empty() {
                    taken = taken.union(&hit);
                    holders.push(format!("{uid} (held for its containers) on {hit}"));
                }
            }
        }
        if !taken.is_empty() {
            return Err(ReservationError::CpusHeld {
                reserved: fresh.reserved_cpus,
                taken,
                holders: holders.join(", "),
            });
        }
        if memory_changed {
            // Memory a pod holds for its containers still to come is booked in the tables too.
            let held = alloc
                .pods
                .values()
                .map(|p| {
                    let live = p.containers.iter().filter(|c| c.memory.is_some()).count();
                    live + usize::from(p.hold.as_ref().is_some_and(|h| h.memory.is_some()))
                })
                .sum::<usize>();
            if held > 0 {
                return Err(ReservationError::MemoryHeld(held));
            }
            alloc.memory = fresh.memory;
        }
        alloc.reserved_cpus = fresh.reserved_cpus;
        alloc.strict_reservation = fresh.strict_reservation;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ReservedMemory, TopologyScope};
    use crate::placement::admission::{Container, PodMember};
    use crate::topology::TopologyBuilder;

    fn guaranteed(millis: u64, mem: u64) -> Container {
        Container {
            name: "c".into(),
            cpu_request_millis: millis,
            cpu_limit_millis: millis,
            memory_bytes: mem,
            memory_limit_bytes: mem,
            ..Default::default()
        }
    }

    /// A pod admitted one container at a time whose only container has gone (a crash loop, or
    /// between its init and app containers) holds its Memory Manager memory in its hold, no
    /// container has any: a changed `reserved_memory` is still refused (applying it would drop
    /// the hold's booking from the fresh tables and give that memory away twice).
    #[test]
    fn a_reserved_memory_change_is_refused_while_a_pod_hold_has_memory() {
        let topo = TopologyBuilder {
            cores_per_node: 4,
            threads_per_core: 1,
            ..Default::default()
        }
        .build();
        let mut cfg = PlacementConfig {
            scope: TopologyScope::Pod,
            ..Default::default()
        };
        let mut a = Allocator::new(&topo, &cfg).unwrap();
        let (totals, c) = (guaranteed(2000, 256 << 20), guaranteed(1000, 128 << 20));
        let m = PodMember {
            pod_uid: "p",
            totals: &totals,
            container: &c,
        };
        a.admit_member(&topo, &cfg, m).unwrap();
        assert!(a.remove_member(&topo, &cfg, "p", "c"));
        let p = &a.pods["p"];
        assert!(p.containers.is_empty());
        assert!(
            p.hold.as_ref().unwrap().memory.is_some(),
            "the hold keeps the pod's memory"
        );
        let before = a.clone();
        cfg.reserved_memory = vec![ReservedMemory {
            node: 0,
            memory_bytes: 64 << 20,
            hugepages_2mi_bytes: 0,
            hugepages_1gi_bytes: 0,
        }];
        let err = a.reconfigure(&topo, &cfg).unwrap_err();
        assert!(matches!(err, ReservationError::MemoryHeld(1)), "{err}");
        assert_eq!(a.memory, before.memory, "a refused reload changes nothing");
        // once the pod is gone the change applies
        a.release("p");
        assert!(a.reconfigure(&topo, &cfg).unwrap());
    }
}

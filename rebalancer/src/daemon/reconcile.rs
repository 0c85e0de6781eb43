//! The comparison of what runs with the books: every bound container's live cpuset (what
//! cgroupfs holds, and what the runtime says it gave) against what the books give it, and the
//! changes that repair each difference in the books' favour.
//!
//! Why: a change can reach the node differently from how it reached the books — an NRI answer
//! the runtime gave up waiting for (it then starts the container unplaced), a runtime that
//! writes its spec's cpuset after the watcher's write, a write that failed halfway. Whoever
//! sees the node (NRI Synchronize on every connect, the watcher's start-up reconcile, each
//! control round for the bound containers) hands what it saw here and writes the result
//! through its own writer (`Admission::repair`).

use crate::cpuset::CpuSet;
use crate::daemon::writer::CpusetChange;
use crate::daemon::Shared;

/// What the books give one bound container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BookedSets {
    pub cgroup: String,
    /// Its own CPUs when exclusive; a shared one's pool less every exclusive CPU.
    pub cpus: CpuSet,
    pub mems: CpuSet,
    pub exclusive: bool,
}

/// What was seen of one container: the cpus each source reports (cgroupfs, the runtime's
/// spec), and the mems when a source says the container never got ours (the runtime started
/// it with no cpuset: an answer it did not wait for).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub cpus: Vec<CpuSet>,
    pub mems: Option<CpuSet>,
}

impl Seen {
    /// The cpus cgroupfs holds, the one source.
    pub fn cgroupfs(cpus: CpuSet) -> Seen {
        Seen {
            cpus: vec![cpus],
            mems: None,
        }
    }
}

/// Every bound container's booked cpuset (but those whose move is being written:
/// `Shared::moving`), its CPUs that are online (as the kernel leaves a
/// cpuset when a CPU goes offline; an exclusive one's replacement is the hotplug
/// replacement's to make). A shared container with none left gets the shared pool now, and so
/// does an exclusive one none of whose CPUs is online and none could replace
/// (`Allocator::replace_offline`), booked as shared meanwhile: left alone, the kernel would run
/// a cgroup with no online CPU on its parent's, others' exclusive CPUs among them. One with
/// nothing left at all is left out: never an empty cpuset.
pub fn booked(s: &Shared) -> Vec<BookedSets> {
    let exclusive = s.state.allocator.exclusive_cpus();
    let online = s.topo.online_cpus();
    let pool = pool_now(s, &exclusive, &online);
    (s.state.bindings.keys())
        .filter(|cg| !s.moving.contains(*cg))
        .filter_map(|cg| {
            let p = &super::admission::bound_container(s, cg)?.placement;
            let own = if p.exclusive {
                p.cpus.intersection(&online)
            } else {
                p.cpus.difference(&exclusive).intersection(&online)
            };
            let (cpus, exclusive) = if own.is_empty() {
                (pool.clone(), false)
            } else {
                (own, p.exclusive)
            };
            (!cpus.is_empty()).then(|| BookedSets {
                cgroup: cg.clone(),
                cpus,
                mems: p.mems.clone(),
                exclusive,
            })
        })
        .collect()
}

/// Whether `p` is exclusive with none of its CPUs online (`booked`: it runs on the shared
/// pool meanwhile, and counts as shared until they return or are replaced).
pub fn stranded(p: &crate::placement::pod::ContainerPlacement, online: &CpuSet) -> bool {
    p.exclusive && p.cpus.is_disjoint(online)
}

/// The shared pool as a container with no CPU of its own left runs on it (as a fenced one):
/// the books' pool less every exclusive CPU (`exclusive`), online.
pub fn pool_now(s: &Shared, exclusive: &CpuSet, online: &CpuSet) -> CpuSet {
    let view = crate::placement::cpu::CpuView::new(&s.topo);
    (s.state.allocator.shared_pool(&view))
        .difference(exclusive)
        .intersection(online)
}

/// The changes that bring every container in `books` whose `seen` differs back to its booked
/// cpus (and mems, where a source reported they were never set). Containers not seen (gone,
/// not created yet) are left alone: releasing what is gone is the caller's, who knows whether
/// its view of the node is whole.
pub fn repairs(books: &[BookedSets], seen: impl Fn(&str) -> Option<Seen>) -> Vec<CpusetChange> {
    books
        .iter()
        .filter_map(|b| {
            let s = seen(&b.cgroup)?;
            let mems = s.mems.filter(|m| *m != b.mems).map(|_| b.mems.clone());
            (s.cpus.iter().any(|c| *c != b.cpus) || mems.is_some()).then(|| CpusetChange {
                cgroup: b.cgroup.clone(),
                cpus: b.cpus.clone(),
                mems,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    fn book(cg: &str, cpus: &str, excl: bool) -> BookedSets {
        BookedSets {
            cgroup: cg.into(),
            cpus: set(cpus),
            mems: set("0"),
            exclusive: excl,
        }
    }

    #[test]
    fn a_container_that_runs_elsewhere_than_booked_is_set_back() {
        let books = [book("g", "0", true), book("b", "1", false)];
        // the runtime started g unplaced (no cpus, no mems in its spec), cgroupfs on both CPUs;
        // b's cgroupfs was shrunk but the runtime's spec still has both CPUs
        let seen = |cg: &str| match cg {
            "g" => Some(Seen {
                cpus: vec![set("0-1"), CpuSet::new()],
                mems: Some(CpuSet::new()),
            }),
            "b" => Some(Seen {
                cpus: vec![set("1"), set("0-1")],
                mems: None,
            }),
            _ => None,
        };
        let r = repairs(&books, seen);
        assert_eq!(
            r,
            vec![
                CpusetChange {
                    cgroup: "g".into(),
                    cpus: set("0"),
                    mems: Some(set("0")),
                },
                CpusetChange {
                    cgroup: "b".into(),
                    cpus: set("1"),
                    mems: None,
                },
            ]
        );
    }

    #[test]
    fn what_agrees_or_was_not_seen_is_left_alone() {
        let books = [book("g", "0", true), book("gone", "1", true)];
        let seen = |cg: &str| {
            (cg == "g").then(|| Seen {
                cpus: vec![set("0"), set("0")],
                mems: Some(set("0")),
            })
        };
        assert!(repairs(&books, seen).is_empty());
    }
}

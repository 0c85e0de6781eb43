//! One round's moves applied concurrently: a few writer threads, each carrying out whole moves
//! through [`apply`] with a writer of its own, so N cgroups to fix cost about one migration
//! time (a narrowing `cpuset.mems` write returns when the kernel has migrated that cgroup's
//! memory), not N.
//!
//! What stays as in the sequential loop:
//! - **budget**: a move is started only if the bytes of the moves applied or under way plus its
//!   own fit the round's budget (a reservation, released when the move fails), so the bytes
//!   of the applied moves never exceed it whatever the interleaving;
//! - **order and exclusivity**: moves are started in plan order; a move that takes CPUs an
//!   earlier move gives up (or moves the same cgroup) waits until that move is done, and is not
//!   started when it failed (its CPUs were not given up), so two cgroups never hold the same
//!   exclusive CPU;
//! - **rollback**: each move touches one cgroup, and a failing move rolls back only its own
//!   writes ([`apply`]); the others go on.
//!
//! The kernel does not migrate for two `cpuset.mems` writes at once: cgroup v2 queues each
//! cgroup's migration on one *ordered* workqueue (`cpuset_migrate_mm_wq`) and every writer
//! waits for the whole queue, so parallel narrowing writes cost the sum of the migrations (in
//! the 2node guest, two 256 MiB cgroups: 144 s in parallel against 19 + 42 s one after the
//! other). So when a round has more than one move, each writer first moves its cgroup's pages
//! to the target itself (`move_pages(2)` in its own thread, at most the move's bytes) where the
//! target is already inside the cgroup's mems, and the narrowing write then finds little left.

use std::sync::{Condvar, Mutex};

use super::actuator::{apply, Applied, ApplyError, CgroupWriter};
use super::plan_types::Move;

/// What became of one move.
#[derive(Debug)]
pub enum MoveOutcome {
    Applied(Applied),
    Failed(ApplyError),
    /// Not started: it would have exceeded the round's migration budget.
    OverBudget,
    /// Not started: it takes CPUs that an earlier move of the round, which failed, did not
    /// give up.
    Blocked {
        on: String,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Waiting,
    Running,
    Done { ok: bool },
}

struct Sched {
    next: usize,
    reserved: u64,
    status: Vec<Status>,
    outcomes: Vec<Option<MoveOutcome>>,
}

/// Earlier moves that move `i` must wait for: the same cgroup, or CPUs they give up that `i`
/// takes.
fn dependencies(moves: &[Move]) -> Vec<Vec<usize>> {
    (0..moves.len())
        .map(|i| {
            (0..i)
                .filter(|&j| {
                    let (a, b) = (&moves[j], &moves[i]);
                    a.cgroup == b.cgroup
                        || !b.to_cpus.is_disjoint(&a.from_cpus.difference(&a.to_cpus))
                })
                .collect()
        })
        .collect()
}

/// Whether the writer moves the pages itself before the mems write: a plain (not staged)
/// move that narrows mems to nodes the cgroup may already use.
fn premigrates(mv: &Move) -> bool {
    mv.stage.is_none()
        && mv.bytes_to_migrate > 0
        && mv.to_mems != mv.from_mems
        && mv.to_mems.is_subset(&mv.from_mems)
}

/// Applies `moves` on up to `threads` threads (at least one), each with its own writer from
/// `writer`; `budget` bytes for the round. Outcomes in the order of `moves`.
pub fn apply_concurrently<W, F>(
    moves: &[Move],
    writer: F,
    threads: usize,
    budget: u64,
    dry_run: bool,
) -> Vec<MoveOutcome>
where
    W: CgroupWriter,
    F: Fn() -> W + Sync,
{
    let deps = dependencies(moves);
    let sched = Mutex::new(Sched {
        next: 0,
        reserved: 0,
        status: vec![Status::Waiting; moves.len()],
        outcomes: (0..moves.len()).map(|_| None).collect(),
    });
    let done = Condvar::new();
    let threads = threads.clamp(1, moves.len().max(1));
    let premigrate = threads > 1 && !dry_run;
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut w = writer();
                loop {
                    let mut g = sched.lock().unwrap_or_else(|e| e.into_inner());
                    // The next move in plan order, once what it depends on is done.
                    let i = loop {
                        let i = g.next;
                        if i >= moves.len() {
                            return;
                        }
                        if deps[i]
                            .iter()
                            .all(|&j| matches!(g.status[j], Status::Done { .. }))
                        {
                            break i;
                        }
                        g = done.wait(g).unwrap_or_else(|e| e.into_inner());
                    };
                    g.next += 1;
                    let mv = &moves[i];
                    if let Some(&j) = deps[i]
                        .iter()
                        .find(|&&j| g.status[j] == Status::Done { ok: false })
                    {
                        g.status[i] = Status::Done { ok: false };
                        g.outcomes[i] = Some(MoveOutcome::Blocked {
                            on: moves[j].cgroup.clone(),
                        });
                        done.notify_all();
                        continue;
                    }
                    if g.reserved.saturating_add(mv.bytes_to_migrate) > budget {
                        g.status[i] = Status::Done { ok: false };
                        g.outcomes[i] = Some(MoveOutcome::OverBudget);
                        done.notify_all();
                        continue;
                    }
                    g.reserved = g.reserved.saturating_add(mv.bytes_to_migrate);
                    g.status[i] = Status::Running;
                    drop(g); // never held across the writes
                    if premigrate && premigrates(mv) {
                        // Failure is not fatal: the narrowing write migrates what is left.
                        let _ = w.move_pages(&mv.cgroup, &mv.to_mems, mv.bytes_to_migrate);
                    }
                    let r = apply(mv, &mut w, dry_run);
                    let mut g = sched.lock().unwrap_or_else(|e| e.into_inner());
                    let ok = r.is_ok();
                    if !ok {
                        g.reserved = g.reserved.saturating_sub(mv.bytes_to_migrate);
                    }
                    g.status[i] = Status::Done { ok };
                    g.outcomes[i] = Some(match r {
                        Ok(a) => MoveOutcome::Applied(a),
                        Err(e) => MoveOutcome::Failed(e),
                    });
                    done.notify_all();
                }
            });
        }
    });
    sched
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .outcomes
        .into_iter()
        .map(|o| o.expect("every move has an outcome once the threads are done"))
        .collect()
}

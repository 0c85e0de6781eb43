//! Applying moves: each move through the actuator (any [`CgroupWriter`]: the real cgroup
//! layer, or `FakeCgroups` in the tests), the controller's memory (cooldown, counters) and the
//! metrics updated, and the migration budget enforced once more on what is actually applied
//! (the planner already keeps to it; this is the actuator-side guard of the invariant).
//!
//! Each move is a change of the books in two halves around its writes, with no lock held
//! across a write: `admission::book_move` checks it against the books (`move_allowed`: no
//! reserved, held or other container's exclusive CPU, Memory Manager memory only where it
//! fits), books its cpus and holds an exclusive container's old and new CPUs; the writes up to
//! cpuset.cpus run; `admission::Booked::settle` keeps the booking when the cpus were written and
//! gives it back when not, and the shared containers follow when the exclusive CPUs changed
//! meanwhile. The mems are recorded once migrated (`admission::record_mems`), so the allocator
//! and cgroupfs agree after every move. The locks are taken only inside those functions, which
//! get no writer.
//!
//! The daemon's rounds hand their moves to [`Applier`]: up to `controller.apply_threads`
//! writer threads, each applying whole moves through that same per-move path with a writer of
//! its own, so N cgroups to fix cost about one migration, not N, and a round never waits for
//! a migration (the next round plans around the moves still under way: not their cgroups, and
//! the budget less their bytes). What the one-after-the-other loop ([`apply_moves`], the
//! reference of the tests and benches) guaranteed still holds:
//! - **budget, a rate**: a move is queued only if its bytes, those of every move queued or under
//!   way and those of the moves that ended within the last `period_ms` fit the budget
//!   ([`Applier::budget_used`]), so rounds brought forward by events get no fresh budget and
//!   no more than a budget migrates per period;
//! - **order and exclusivity**: moves start in plan order; one that takes CPUs an earlier move
//!   gives up waits until that move is done and is not applied when it was not (its CPUs were
//!   not given up); moves of bound containers with Memory Manager memory go one at a time (each
//!   books check sees the record of the one before); and the books check refuses any CPU that
//!   is exclusive by then;
//! - **rollback**: a move touches one cgroup, and a failing move rolls back only its own
//!   writes; the others go on.
//!
//! cgroup v2 migrates every cgroup's memory on one ordered kernel workqueue
//! (`cpuset_migrate_mm_wq`) and each `cpuset.mems` writer waits for the whole queue, so
//! concurrent narrowing writes would cost the sum of the migrations: when several moves run at
//! once, each writer first moves its own cgroup's memory toward the target itself with
//! migrate_pages(2) (`CgroupWriter::migrate_pages`: the kernel's walk of each process's mm, in
//! the writer's thread, a process at a time, `PREMIGRATE_STEP` asked per call; only the pages
//! the process alone maps, `pages::WithoutSysNice`: pages shared with other cgroups'
//! processes, a binary's text, are left for last) and the narrowing write finds
//! little left. When a whole walk left only that little (`CgroupWriter::left_behind`, at most
//! a sixteenth of the move), the cgroup's mems already held the target and the allocator has
//! not bound the container, there is no narrowing write: its memory is where it runs, its new
//! pages are allocated there, and the pages it shares stay where the other processes use them
//! (a narrowing write would migrate them MOVE_ALL, stalling every process that maps them and
//! every other cpuset write behind it: 8–32 s in vm-bench); the target is kept
//! (`CgroupState::wide_of`) for the planner. The writers run at `controller.apply_nice` (-10: the
//! migration ahead of the workloads' threads, as AutoNUMA's runs in the faulting task, which
//! waits for it); below 0 a move alone is premigrated too (the kernel's worker of a narrowing
//! write runs at the normal priority). At 0 or above, a move that runs alone makes no page
//! steps: one pass over each process's mm moves it (below).
//! Every narrowing write is preceded by its writer moving what that write would migrate,
//! shared pages too (`CgroupWriter::migrate_all`: migrate_pages(2) MOVE_ALL), the writers
//! taking turns over that and the write (`Pool::narrowing`): the write queues nothing on the
//! kernel's workqueue, which every cpuset write on the machine (an admission's) waits for.
//! Between its page steps the writer reads the cgroup's cpus: when someone else re-pinned it
//! meanwhile, the move is abandoned (`controller::abandon`: mems back, their cpus kept), never
//! finished toward a target they no longer want, and a failed move's undo never overwrites
//! their cpus. The daemon's own rewrites of the cgroup (`rounds::trigger::Hub::is_own`: the shared pool
//! following another writer's exclusive move, an admission's shrink) are not someone else's:
//! neither the page steps nor `controller::finish`'s read-back abandon or roll back for them.
//!
//! A stop of the daemon ([`Daemon::request_stop`]) is checked before each move (the moves left
//! wait for the next start) and between a writer's page steps, where the move is cut short
//! (`controller::cut_short`: cpus moved, mems left widened, "stopped"): no narrowing write
//! migrates the rest past the shutdown bound. A page step is one whole process's
//! `migrate_pages(2)` call where several moves run at once, so a stop waits for that process.
//! A move's books are checkpointed once its cpus are
//! recorded and again once it is applied, so the books and its cooldown survive the stop.
//!
//! A panic in a move (a bug) fails that move only ("panic"; the thread goes on with a new
//! writer); a move under way for longer than the stuck limit (10 periods, at least 2 min: a
//! cgroup write hung in the kernel) stops the `apply` health component's beats, so /healthz
//! fails and the daemon is restarted. Cooldowns of the writers' moves start when the move ends,
//! not at the round's time.
//!
//! Every cpuset.cpus write of a move (and of its rollback) is noted as the daemon's own
//! (`rounds::trigger::Hub`), so the round trigger does not take it for an operator's change.
//!
//! A failure is counted by reason (`rebalancer_moves_failed_total{reason}`: busy, invalid,
//! no-space, permission, vanished, stale, …) and never stops the round: the other moves go on.
//! A cgroup that vanished before or during its move is a normal race (its container exited)
//! and is logged at debug level; an external change (stale) is adopted and logged at info; a
//! real write failure is a warning.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{Arc, Condvar, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use crate::{
    controller::{self, ApplyError, CgroupWriter, Move},
    serve::metrics::count,
};

use super::{Daemon, Io};

/// What one call of [`apply_moves`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppliedMoves {
    pub applied: usize,
    /// (cgroup, reason) of each move that failed.
    pub failed: Vec<(String, &'static str)>,
    /// Moves not attempted because they would have exceeded the round's migration budget.
    pub over_budget: usize,
    /// Bytes the applied moves migrate.
    pub bytes: u64,
}

/// Applies `moves` through `w` in order, one after the other, in the caller's thread (see the
/// module doc): the reference of the tests and benches. The daemon's rounds use [`Applier`],
/// the same per-move path.
pub fn apply_moves(
    io: &mut Io,
    d: &Daemon,
    w: &mut dyn CgroupWriter,
    moves: &[Move],
    now_ms: u64,
    dry_run: bool,
) -> AppliedMoves {
    let budget = (d.lock(io).cfg.controller.migration_budget_mib).saturating_mul(1 << 20);
    let mut out = AppliedMoves::default();
    for (i, mv) in moves.iter().enumerate() {
        if d.stopping() {
            tracing::info!(
                left = moves.len() - i,
                "stopping: the round's remaining moves are not applied"
            );
            break;
        }
        if out.bytes.saturating_add(mv.bytes_to_migrate) > budget {
            over_budget(d, mv, budget);
            out.over_budget += 1;
            continue;
        }
        out.add(mv, apply_one(io, d, w, mv, now_ms, dry_run, How::default()));
    }
    out
}

fn over_budget(d: &Daemon, mv: &Move, budget: u64) {
    tracing::warn!(cgroup = %mv.cgroup, bytes = mv.bytes_to_migrate, budget, "move not applied: it would exceed the round's migration budget");
    count(&d.metrics.moves_skipped, "budget");
}

/// What became of one move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveResult {
    Applied,
    /// Not written: the books refuse it now, or (writer threads) it takes CPUs that an
    /// earlier move which failed did not give up.
    Refused(&'static str),
    Failed(&'static str),
}

impl AppliedMoves {
    fn add(&mut self, mv: &Move, o: MoveResult) {
        match o {
            MoveResult::Applied => {
                self.applied += 1;
                self.bytes = self.bytes.saturating_add(mv.bytes_to_migrate);
            }
            MoveResult::Refused(_) => {}
            MoveResult::Failed(reason) => self.failed.push((mv.cgroup.clone(), reason)),
        }
    }
}

/// A cpuset.cpus write of the daemon's own, noted first (`rounds::trigger::Hub`) so the round
/// trigger does not take it for an operator's change, and the note taken back when it failed.
fn write_own_cpus(
    io: &Io,
    d: &Daemon,
    w: &mut dyn CgroupWriter,
    cg: &str,
    cpus: &crate::cpuset::CpuSet,
) -> Result<(), controller::CgroupWriteError> {
    d.rounds.note_own_cpus(cg, cpus);
    let r = w.write_cpus(io, cg, cpus);
    if r.is_err() {
        d.rounds.unnote_own_cpus(cg, cpus);
    }
    r
}

/// A writer's page moves ahead of the mems write, per call (see [`apply_one`]): the writer
/// looks for a re-pin or a stop between steps. The writer's page walk resumes from step to
/// step (`pages::Walk`), so a smaller step costs no more queries.
const PREMIGRATE_STEP: u64 = 16 << 20;

/// How [`apply_one`] applies a move: on a writer thread of [`Applier`], or in the caller's
/// thread ([`apply_moves`], the default).
#[derive(Clone, Copy, Default)]
struct How<'a> {
    /// The writer moves the cgroup's own pages ahead of its mems write, a step at a time.
    premigrate: bool,
    /// The cooldown starts when the move ends, not at the round's time (a writer thread,
    /// whose move may end long after its round).
    clock: bool,
    /// The writers' turns over a narrowing write (`Pool::narrowing`); None: one thread.
    narrowing: Option<&'a Mutex<()>>,
}

/// One move: the books check and booking under the state lock, the writes up to cpuset.cpus
/// with none, the settle under it; then (with `premigrate`) the cgroup's pages moved toward the target by
/// this thread, the mems write that migrates the rest, and the record of the move.
fn apply_one(
    io: &mut Io,
    d: &Daemon,
    w: &mut dyn CgroupWriter,
    mv: &Move,
    now_ms: u64,
    dry_run: bool,
    how: How<'_>,
) -> MoveResult {
    let How {
        premigrate,
        clock,
        narrowing,
    } = how;
    // With `clock` (a writer thread, whose move may end long after its round), the cooldown
    // starts when the move ends, not at the round's time.
    let at = |now_ms: u64| {
        if clock {
            now_ms.max(super::boot_ms())
        } else {
            now_ms
        }
    };
    // The books first (`admission::book_move`: checked, the target cpus booked, the CPUs the
    // move leaves and takes held from admissions), then the writes up to the cpus with no
    // lock held, then the books settled: kept when the cpus were written, given back when
    // not. An admission meanwhile cannot take the held CPUs, and waits for no write.
    let booked = match super::admission::book_move(io, d, mv, dry_run) {
        Ok(b) => b,
        Err(reason) => {
            tracing::info!(cgroup = %mv.cgroup, to_cpus = %mv.to_cpus, to_mems = %mv.to_mems, reason, "move not applied: the allocator's books changed since the round planned it");
            count(&d.metrics.moves_skipped, reason);
            return MoveResult::Refused(reason);
        }
    };
    // The move's only cpus write is its first half's last step (the second half and a
    // rollback keep them): noted as the daemon's own, as `write_own_cpus` does.
    d.rounds.note_own_cpus(&mv.cgroup, &mv.to_cpus);
    let begun = controller::begin(io, mv, w, dry_run);
    if !matches!(&begun, Ok(controller::Begun::CpusMoved(_))) {
        d.rounds.unnote_own_cpus(&mv.cgroup, &mv.to_cpus);
    }
    if let Some(b) = booked {
        let written = matches!(&begun, Ok(controller::Begun::CpusMoved(_)));
        if b.settle(io, written) {
            // An exclusive container moved: the shared pool follows it.
            shared_follow(io, d, w);
        }
    }
    if let Ok(controller::Begun::CpusMoved(_)) = &begun {
        // The books changed with the cpus: on disk before the migration, so a stop (or a
        // crash) in the middle of it keeps them (encoded and written outside the locks).
        if let Err(e) = d.checkpoint(io) {
            tracing::warn!(cgroup = %mv.cgroup, error = %e, "checkpoint after a move's cpus failed");
        }
    }
    // How long the move's page moves and its narrowing write took (logged with the move: a
    // migration that runs long after its pages are local shows here).
    let (mut premigrate_ms, mut ahead_ms, mut finish_ms) = (0u128, 0u128, 0u128);
    // The move as finished when its mems were left wide (see below), and what was left.
    let mut kept_wide: Option<(Move, u64, u64)> = None;
    let result = begun.and_then(|b| match b {
        controller::Begun::DryRun(a) => Ok(a),
        controller::Begun::CpusMoved(rest) => {
            let started = Instant::now();
            // cgroup v2 migrates every cgroup's memory on one ordered kernel workqueue
            // (`cpuset_migrate_mm_wq`) and each mems writer waits for the whole queue:
            // concurrent narrowing writes cost the sum of their migrations. So each writer
            // first moves its own cgroup's memory (migrate_pages(2), whole processes, at
            // least PREMIGRATE_STEP a call; the widened mems already allow the target) and the
            // narrowing write finds little left. A failure here is not one of the move: the
            // mems write migrates the rest. Between steps the cgroup's cpus are read: when
            // someone else wrote them meanwhile (the operator re-pinned the workload), the
            // move is abandoned (mems back, their cpus kept) rather than finished toward a
            // target they no longer want.
            let premigrated = premigrate
                && mv.stage.is_none()
                && mv.bytes_to_migrate > 0
                && mv.to_mems != mv.from_mems;
            // Whether the walk went over every process (its last call found nothing more to
            // move, or all the planned bytes moved), not cut short by a trickle or an error.
            let mut walked = false;
            // What the page moves moved (their reports; the kernel's own on the mems write
            // is not known).
            let mut moved = 0u64;
            if premigrated {
                loop {
                    if let Some(now) = repinned(d, w, mv) {
                        books_follow(io, d, w, mv, &now);
                        return Err(controller::abandon(io, mv, w, rest, now));
                    }
                    if moved >= mv.bytes_to_migrate {
                        // All it planned moved: what is left is beyond the plan.
                        walked = true;
                        break;
                    }
                    if d.stopping() {
                        // No narrowing write (it would migrate the rest, past the shutdown
                        // bound): the move stops here, mems still widened (see the doc).
                        return Err(controller::cut_short(io, mv, w, rest));
                    }
                    let step = PREMIGRATE_STEP.min(mv.bytes_to_migrate - moved);
                    match w.migrate_pages(io, &mv.cgroup, &mv.to_mems, step) {
                        Ok(0) => {
                            walked = true;
                            break;
                        }
                        // A small part of what was asked: the kernel places only a trickle
                        // now (target full, pages pinned). Looping on it kept a writer busy
                        // for the rest of a benchmark window; the mems write migrates the rest.
                        Ok(n) if n < step / 8 => {
                            tracing::debug!(cgroup = %mv.cgroup, moved = n, asked = step, "page moves ahead of the mems write trickle; the mems write migrates the rest");
                            break;
                        }
                        Ok(n) => moved = moved.saturating_add(n),
                        Err(e) => {
                            tracing::debug!(cgroup = %mv.cgroup, error = %e, "moving pages ahead of the mems write failed; the mems write migrates them");
                            break;
                        }
                    }
                }
            }
            premigrate_ms = started.elapsed().as_millis();
            // What a whole walk of its processes left is what they do not alone map (a
            // binary's text and shared libraries, memory shared between its own processes),
            // unmapped page cache and pinned pages (`pages::WithoutSysNice`). A narrowing write
            // would migrate the mapped part MOVE_ALL (cgroup v2 always migrates), stalling every
            // process that maps those pages while it runs, and every other cgroup's cpuset
            // write waits for it on the kernel's ordered queue (vm-bench: 8–32 s for a few
            // hundred pages). So when that is all that is left (a sixteenth of the move at
            // most) and the cgroup's mems already held the target (nothing was widened: no
            // node is left open that no one chose), there is no narrowing write: its memory is
            // where it runs, its new pages are allocated there (local to its threads), and the
            // pages it shares stay where the others use them. Not after a walk cut short (a
            // trickle, an error: what is left may be its own), and not for a container the
            // allocator has bound (its books hold its mems: they are written exactly).
            let left = (walked
                && rest.mems_now() == &mv.from_mems
                && !d.lock(io).state.bindings.contains_key(&mv.cgroup))
                .then(|| w.left_behind(&mv.cgroup, &mv.to_mems))
                .flatten();
            if premigrated {
                tracing::debug!(cgroup = %mv.cgroup, walked, ?left, from_mems = %mv.from_mems, "what the page moves left off the target (memory.numa_stat)");
            }
            // 0 too: memory.numa_stat counts what is charged to the cgroup, and the pages its
            // processes share with others are often charged elsewhere (vm-bench: one page left
            // by numa_stat, 200–340 mapped off the target; the narrowing write after a move
            // that left 0 took 1–2.4 s).
            let left = left.filter(|&l| l <= mv.bytes_to_migrate / 16);
            // The move as finished with mems left as they are (`from_mems`: the condition
            // above), read back against those.
            let wide = left.map(|_| Move {
                to_mems: mv.from_mems.clone(),
                ..mv.clone()
            });
            let (fin, rest) = match &wide {
                Some(wide) => (wide, rest.leaving_mems_wide()),
                None => (mv, rest),
            };
            // A write that narrows mems (drops a node they hold now) migrates what is on that
            // node in the kernel's cpuset workqueue, and every cpuset write on the machine (an
            // admission's too) waits for the whole queue: 13.7 s once in the guest, behind
            // the pages other processes map. So the writer first moves, in its own thread,
            // every page the write would migrate (`CgroupWriter::migrate_all`: shared ones too,
            // MOVE_ALL, as the kernel would) and the write finds nothing left to queue. The
            // writers take `narrowing` in turn over that and the write: two at once would
            // send the pages both their processes map back and forth, each leaving the other's
            // write some to migrate. A failure here is not one of the move (the write migrates
            // what is left).
            let narrows = !dry_run
                && fin.stage.is_none()
                && !rest.mems_now().difference(&fin.to_mems).is_empty();
            let _turn = narrows
                .then(|| narrowing.map(|m| m.lock().unwrap_or_else(|e| e.into_inner())))
                .flatten();
            if narrows {
                // No stop check here: after a whole walk little is left, and a move alone
                // at a nice value ≥ 0 goes on as its narrowing write went on before (waited
                // for, see the module doc).
                let ahead = Instant::now();
                match w.migrate_all(io, &mv.cgroup, &fin.to_mems) {
                    Ok(n) => {
                        tracing::debug!(cgroup = %mv.cgroup, moved = n, ms = ahead.elapsed().as_millis() as u64, "pages moved ahead of the narrowing mems write, shared ones too")
                    }
                    Err(e) => {
                        tracing::debug!(cgroup = %mv.cgroup, error = %e, "moving the pages ahead of the narrowing mems write failed; the write migrates them")
                    }
                }
                ahead_ms = ahead.elapsed().as_millis();
                if let Some(now) = repinned(d, w, mv) {
                    books_follow(io, d, w, mv, &now);
                    return Err(controller::abandon(io, mv, w, rest, now));
                }
            }
            let hub = d.rounds.clone();
            let cg = mv.cgroup.clone();
            let rest = rest
                .keep_cpus_on_failure()
                .accepting_cpus(Box::new(move |c| hub.is_own(&cg, c)));
            let finishing = Instant::now();
            let r = controller::finish(io, fin, w, rest);
            finish_ms = finishing.elapsed().as_millis();
            drop(_turn);
            if let (Ok(_), Some(wide), Some(l)) = (&r, wide, left) {
                // Only a move that finished is told as left wide (a rolled-back one put its
                // mems back); what it migrated is what its page moves reported.
                kept_wide = Some((wide, l, moved));
            }
            if let Err(e) = &r {
                if !matches!(
                    e,
                    ApplyError::Vanished { .. }
                        | ApplyError::RollbackFailed { .. }
                        | ApplyError::Stopped { .. }
                ) {
                    undo_cpus(io, d, w, mv);
                }
            }
            r
        }
    });
    if let Some((wide, left, _)) = &kept_wide {
        tracing::debug!(cgroup = %mv.cgroup, left_bytes = left, mems = %wide.to_mems, target = %mv.to_mems, "its pages moved; cpuset.mems left widened: what is left off the target is what its processes do not alone map");
    }
    // The nodes the move meant the memory for, when it left mems wider.
    let planned_mems = kept_wide.as_ref().map(|_| mv.to_mems.clone());
    let mv = kept_wide.as_ref().map_or(mv, |(m, _, _)| m);
    match result {
        Ok(mut done) => {
            if let Some((_, _, moved)) = &kept_wide {
                // As a stage's: what the page moves reported, never more than planned.
                done.moved_bytes = (*moved).min(mv.bytes_to_migrate);
            }
            let staged = mv.stage.as_ref().map(|s| s.toward.to_string());
            tracing::info!(cgroup = %mv.cgroup, to_cpus = %mv.to_cpus, to_mems = %mv.to_mems, bytes = mv.bytes_to_migrate,
                moved = done.moved_bytes, staged_toward = ?staged,
                before = mv.locality_before, after = mv.locality_after, dry_run, steps = done.steps.len(),
                premigrate_ms, ahead_ms, finish_ms, "move applied");
            if let Some(e) = &done.pages_error {
                tracing::warn!(cgroup = %mv.cgroup, error = %e, "staged move: moving pages failed; the cpuset writes stand");
            }
            if !dry_run {
                super::admission::record_mems(io, d, mv);
                {
                    let mut s = d.lock(io);
                    let c = &mut s.state.controller;
                    c.record_move(mv, done.moved_bytes, at(now_ms));
                    if let (Some(st), Some(target)) = (c.cgroups.get_mut(&mv.cgroup), &planned_mems)
                    {
                        st.wide_of = Some((mv.to_mems.clone(), target.clone()));
                    }
                }
                d.metrics.pages_migrated.inc_by(done.moved_bytes / 4096);
                if kept_wide.is_some() {
                    d.metrics.moves_mems_left_wide.inc();
                }
                // On disk before the next move: a stop (or a crash) while later moves
                // migrate keeps this one's cooldown and books.
                if let Err(e) = d.checkpoint(io) {
                    tracing::warn!(cgroup = %mv.cgroup, error = %e, "checkpoint after a move failed");
                }
            }
            count(&d.metrics.moves_applied, trigger_name(&mv.reason));
            MoveResult::Applied
        }
        Err(e) => {
            let reason = e.reason();
            match &e {
                ApplyError::Vanished { .. } | ApplyError::Read { .. } if reason == "vanished" => {
                    tracing::debug!(cgroup = %mv.cgroup, "cgroup vanished before its move; nothing to do")
                }
                ApplyError::Stale { .. } => {
                    tracing::info!(cgroup = %mv.cgroup, error = %e, "cgroup changed by someone else since it was observed; their choice is kept")
                }
                ApplyError::Stopped { .. } => {
                    tracing::info!(cgroup = %mv.cgroup, to_cpus = %mv.to_cpus, "stopping: move cut short before its narrowing mems write; its cpus are moved, its mems stay widened")
                }
                _ => {
                    tracing::warn!(cgroup = %mv.cgroup, error = %e, reason, "move failed")
                }
            }
            if reason != "vanished" {
                d.lock(io)
                    .state
                    .controller
                    .record_failure(&mv.cgroup, at(now_ms));
            }
            count(&d.metrics.moves_failed, reason);
            MoveResult::Failed(reason)
        }
    }
}

/// The second half of `mv` failed (its mems are rolled back, its new cpus kept): the cpus go
/// back too, as a move of their own (booked, written with no lock held, settled) — only when the books still
/// allow the old cpus (an admission may have made them exclusive meanwhile; then the new cpus,
/// recorded and valid, stay). Nothing is written when the move kept the cpus, or when the
/// cgroup's cpus are no longer the ones the move wrote: someone else (the operator, kubelet)
/// changed them meanwhile, and their choice is kept.
fn undo_cpus(io: &mut Io, d: &Daemon, w: &mut dyn CgroupWriter, mv: &Move) {
    if mv.to_cpus == mv.from_cpus {
        return;
    }
    let back = cpus_from_new(mv, &mv.from_cpus);
    match w.read_cpus(&mv.cgroup) {
        Ok(now) if now == mv.to_cpus => {}
        Ok(now) => {
            tracing::info!(cgroup = %mv.cgroup, cpus = %now, "failed move: its cpus were changed by someone else meanwhile; their choice is kept");
            return;
        }
        Err(_) => return, // vanished, or unreadable: nothing to put back
    }
    // As a move of its own: booked and held, written with no lock held, settled.
    let booked = match super::admission::book_move(io, d, &back, false) {
        Ok(b) => b,
        Err(reason) => {
            tracing::info!(cgroup = %mv.cgroup, cpus = %mv.to_cpus, reason, "failed move: its new cpus are kept; the old ones are no longer free");
            return;
        }
    };
    let written = write_own_cpus(io, d, w, &mv.cgroup, &mv.from_cpus);
    if let Err(e) = &written {
        tracing::warn!(cgroup = %mv.cgroup, error = %e, "failed move: putting its cpus back failed; the new cpus are kept")
    }
    if booked.is_some_and(|b| b.settle(io, written.is_ok())) {
        shared_follow(io, d, w);
    }
}

/// A move of `mv`'s cgroup from the cpus `mv` gave it to `cpus`, its mems as they were
/// before `mv` and no memory to migrate.
fn cpus_from_new(mv: &Move, cpus: &crate::cpuset::CpuSet) -> Move {
    Move {
        from_cpus: mv.to_cpus.clone(),
        to_cpus: cpus.clone(),
        to_mems: mv.from_mems.clone(),
        from_mems: mv.from_mems.clone(),
        stage: None,
        bytes_to_migrate: 0,
        ..mv.clone()
    }
}

/// The shared containers set to their pool after an exclusive container's cpus changed,
/// through this thread's writer (`admission::follow_pool`).
fn shared_follow(io: &mut Io, d: &Daemon, w: &mut dyn CgroupWriter) {
    let read = |w: &_, cg: &str| CgroupWriter::read_cpus(w, cg).ok();
    super::admission::follow_pool(io, d, w, false, read, |io, w, c| {
        write_own_cpus(io, d, w, &c.cgroup, &c.cpus)
    });
}

/// The cgroup's cpus when someone else wrote them after `mv` moved them (the operator
/// re-pinned it). The daemon's own rewrite (the shared pool following another writer's
/// exclusive move, an admission's shrink) is not someone else's: the books want it.
fn repinned(d: &Daemon, w: &dyn CgroupWriter, mv: &Move) -> Option<crate::cpuset::CpuSet> {
    let now = w.read_cpus(&mv.cgroup).ok()?;
    (now != mv.to_cpus && !d.rounds.is_own(&mv.cgroup, &now)).then_some(now)
}

/// Someone else wrote the cgroup's cpus (`found`) while its move migrated. The
/// books were moved to `mv.to_cpus` when the move began; they follow what the cgroup holds
/// now when the books allow it there (no one else's exclusive or reserved CPUs), so the
/// allocator neither reserves CPUs the container left nor hands out the ones it runs on.
/// When they do not allow it, the books keep the move's cpus and the overlap is logged.
fn books_follow(
    io: &mut Io,
    d: &Daemon,
    w: &mut dyn CgroupWriter,
    mv: &Move,
    found: &crate::cpuset::CpuSet,
) {
    let follow = cpus_from_new(mv, found);
    let followed = {
        let mut s = d.lock(io);
        match super::admission::move_allowed(&s, &follow) {
            Ok(()) => {
                tracing::info!(cgroup = %mv.cgroup, cpus = %found, "move abandoned for someone else's cpus; the books follow them");
                super::admission::record_cpus(&mut s, &follow)
            }
            Err(reason) => {
                tracing::warn!(cgroup = %mv.cgroup, cpus = %found, reason, "move abandoned for someone else's cpus, which the books give to others; the books keep the move's");
                false
            }
        }
    };
    if followed {
        shared_follow(io, d, w);
    }
}

/// Makes the writer of one apply thread.
pub type WriterFactory = Arc<dyn Fn() -> Box<dyn CgroupWriter> + Send + Sync>;

/// The daemon's writer threads (see the module doc): rounds [`Applier::submit`] their moves
/// and go on; up to `controller.apply_threads` moves are applied at once, each through the
/// same per-move path as [`apply_moves`].
pub struct Applier {
    d: Daemon,
    writer: WriterFactory,
    pool: Arc<Pool>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// The writers' health component (`apply`): beats while no move has been under way for
    /// longer than `stuck_after` (a writer hung in a cgroup write fails /healthz).
    health: Option<crate::health::Reporter>,
    stuck_after: Option<Duration>,
}

struct Pool {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Held by one writer at a time over its move's last page moves and narrowing mems write
    /// (see [`apply_one`]); no other lock is taken under it but the state lock's short
    /// sections, and no decision or admission takes it.
    narrowing: Mutex<()>,
}

#[derive(Default)]
struct Queue {
    next_id: u64,
    /// Submitted, not started, in plan order.
    waiting: VecDeque<Job>,
    running: Vec<Job>,
    /// Moves that ended without being applied (failed, refused, blocked), by id → cgroup:
    /// what waiting moves that take their CPUs depend on. Cleared when nothing waits.
    failed: BTreeMap<u64, String>,
    /// Moves applied at most at once (the live `apply_threads`, set at each submit).
    limit: usize,
    /// Tests: the writers move their pages themselves even for a move that runs alone.
    premigrate_alone: bool,
    /// When each move that ran ended, and its bytes: what migrated within the last period
    /// counts against the budget too (see [`Applier::budget_used`]).
    ended: VecDeque<(Instant, u64)>,
    closed: bool,
    report: AppliedMoves,
}

#[derive(Clone)]
struct Job {
    id: u64,
    /// When a writer took it (`None` while it waits).
    started: Option<Instant>,
    mv: Move,
    now_ms: u64,
    dry_run: bool,
    /// A bound container holding Memory Manager memory: the books check of its memory must
    /// see the record of every earlier such move, so these go one at a time.
    memory_managed: bool,
    /// Earlier moves (not done at submission) that give up CPUs this one takes.
    deps: Vec<u64>,
}

enum Pick {
    Run(Job),
    Blocked(Job, String),
    Wait,
}

impl Queue {
    /// The moves queued or under way.
    fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.waiting.iter().chain(&self.running)
    }

    fn bytes(&self) -> u64 {
        (self.jobs()).fold(0u64, |a, j| a.saturating_add(j.mv.bytes_to_migrate))
    }

    /// Bytes of the moves that ended within `window` before `now` (older ones forgotten).
    fn ended_within(&mut self, now: Instant, window: Duration) -> u64 {
        while self
            .ended
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > window)
        {
            self.ended.pop_front();
        }
        self.ended
            .iter()
            .fold(0u64, |a, (_, b)| a.saturating_add(*b))
    }

    /// A move that ran has ended: out of `running`, its outcome reported, its bytes in the
    /// window (all but a refused one's, which wrote nothing).
    fn end(&mut self, job: &Job, o: MoveResult) {
        self.running.retain(|j| j.id != job.id);
        if !matches!(o, MoveResult::Refused(_)) && job.mv.bytes_to_migrate > 0 && !job.dry_run {
            self.ended
                .push_back((Instant::now(), job.mv.bytes_to_migrate));
        }
        if o != MoveResult::Applied {
            self.failed.insert(job.id, job.mv.cgroup.clone());
        }
        self.report.add(&job.mv, o);
        if self.waiting.is_empty() {
            self.failed.clear();
        }
    }

    fn next(&mut self) -> Pick {
        if self.running.len() >= self.limit.max(1) {
            return Pick::Wait;
        }
        for i in 0..self.waiting.len() {
            let j = &self.waiting[i];
            let earlier = || self.running.iter().chain(self.waiting.range(..i));
            if j.deps.iter().any(|id| earlier().any(|e| e.id == *id)) {
                continue;
            }
            if j.memory_managed && earlier().any(|e| e.memory_managed) {
                continue;
            }
            let on = j.deps.iter().find_map(|id| self.failed.get(id).cloned());
            let job = self.waiting.remove(i).expect("index in range");
            return match on {
                Some(on) => Pick::Blocked(job, on),
                None => Pick::Run(job),
            };
        }
        Pick::Wait
    }
}

/// What [`Applier::submit`] did with a round's moves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Submitted {
    pub queued: usize,
    /// Not queued: with the bytes still migrating they would exceed the budget.
    pub over_budget: usize,
    /// Not queued: a move of the same cgroup is still under way.
    pub in_flight: usize,
}

impl Applier {
    /// No thread runs until the first move is submitted. The writers' health component
    /// (`apply`) is registered here.
    pub fn new(d: Daemon, writer: WriterFactory) -> Applier {
        let health = d.metrics.health.register("apply", None);
        Applier {
            d,
            writer,
            pool: Arc::new(Pool {
                q: Mutex::new(Queue::default()),
                cv: Condvar::new(),
                narrowing: Mutex::new(()),
            }),
            workers: Vec::new(),
            health: Some(health),
            stuck_after: None,
        }
    }

    /// A move under way for longer than `after` is a stuck writer (default: 10 periods, at
    /// least 2 min, as the rounds' own limit).
    #[cfg(test)]
    pub fn stuck_after(mut self, after: Duration) -> Applier {
        self.stuck_after = Some(after);
        self
    }

    /// Tests of the writers' page moves with a single move.
    #[cfg(test)]
    pub(crate) fn premigrate_alone(self) -> Applier {
        self.queue().premigrate_alone = true;
        self
    }

    /// The writers' health: a beat unless a move has been under way for longer than the
    /// stuck limit (then the `apply` component goes silent and, that limit later, dead). The
    /// round thread calls it every round (through [`Applier::in_flight`]).
    fn check_health(&self, io: &mut Io) {
        let limit = self.stuck_after.unwrap_or_else(|| {
            let period = Duration::from_millis(self.d.lock(io).cfg.controller.period_ms);
            (period * 10).max(Duration::from_secs(120))
        });
        let oldest = {
            let q = self.queue();
            q.running.iter().filter_map(|j| j.started).min()
        };
        if let Some(h) = &self.health {
            h.set_max_silence(Some(limit));
            if oldest.is_none_or(|t| t.elapsed() < limit) {
                h.beat();
            } else {
                tracing::warn!(limit = ?limit, "a move has been under way for longer than the limit: a writer is stuck");
            }
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.pool.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cgroups whose moves are queued or under way, and the bytes they migrate: the next
    /// round plans around them (not those cgroups; the budget less those bytes).
    pub fn in_flight(&self, io: &mut Io) -> (BTreeSet<String>, u64) {
        self.check_health(io);
        let q = self.queue();
        let cgs = q.jobs().map(|j| j.mv.cgroup.clone()).collect();
        (cgs, q.bytes())
    }

    /// The bytes that count against a round's migration budget now: those of the moves queued
    /// or under way, plus those of the moves that ended within the last `controller.period_ms`
    /// — the budget is a rate (per period), however often rounds run (events bring them
    /// forward).
    pub fn budget_used(&self, io: &mut Io) -> u64 {
        let window = self.window(io);
        let mut q = self.queue();
        q.bytes()
            .saturating_add(q.ended_within(Instant::now(), window))
    }

    fn window(&self, io: &mut Io) -> Duration {
        Duration::from_millis(self.d.lock(io).cfg.controller.period_ms)
    }

    /// Queues `moves` (plan order) and returns at once. A move is queued only when, with the
    /// bytes of every move queued or under way, it fits the round's budget (so the bytes
    /// migrating at once never pass it), and no move of its cgroup is under way.
    pub fn submit(&mut self, io: &mut Io, moves: &[Move], now_ms: u64, dry_run: bool) -> Submitted {
        self.submit_at(io, moves, now_ms, dry_run, Instant::now())
    }

    /// [`Applier::submit`] at `now` (the clock of the budget's window).
    pub(crate) fn submit_at(
        &mut self,
        io: &mut Io,
        moves: &[Move],
        now_ms: u64,
        dry_run: bool,
        now: Instant,
    ) -> Submitted {
        let window = self.window(io);
        let (budget, limit, managed) = {
            let s = self.d.lock(io);
            let managed: Vec<bool> = moves
                .iter()
                .map(|mv| {
                    super::admission::bound_container(&s, &mv.cgroup)
                        .is_some_and(|c| c.memory.is_some())
                })
                .collect();
            (
                s.cfg
                    .controller
                    .migration_budget_mib
                    .saturating_mul(1 << 20),
                s.cfg.controller.apply_threads.max(1) as usize,
                managed,
            )
        };
        let mut out = Submitted::default();
        let pending = {
            let mut q = self.queue();
            q.limit = limit;
            let recent = q.ended_within(now, window);
            for (mv, memory_managed) in moves.iter().zip(managed) {
                if q.jobs().any(|j| j.mv.cgroup == mv.cgroup) {
                    tracing::debug!(cgroup = %mv.cgroup, "move not queued: a move of this cgroup is still under way");
                    out.in_flight += 1;
                    continue;
                }
                if q.bytes()
                    .saturating_add(recent)
                    .saturating_add(mv.bytes_to_migrate)
                    > budget
                {
                    over_budget(&self.d, mv, budget);
                    q.report.over_budget += 1;
                    out.over_budget += 1;
                    continue;
                }
                let deps = (q.jobs())
                    .filter(|j| {
                        !mv.to_cpus
                            .is_disjoint(&j.mv.from_cpus.difference(&j.mv.to_cpus))
                    })
                    .map(|j| j.id)
                    .collect();
                q.next_id += 1;
                let id = q.next_id;
                q.waiting.push_back(Job {
                    id,
                    started: None,
                    mv: mv.clone(),
                    now_ms,
                    dry_run,
                    memory_managed,
                    deps,
                });
                out.queued += 1;
            }
            q.waiting.len() + q.running.len()
        };
        self.pool.cv.notify_all();
        // A thread that ended (it cannot, short of a panic outside a move) is replaced.
        self.workers.retain(|h| !h.is_finished());
        while self.workers.len() < limit.min(pending) {
            let (d, pool, writer) = (self.d.clone(), self.pool.clone(), self.writer.clone());
            match std::thread::Builder::new()
                .name(format!("apply-{}", self.workers.len()))
                .spawn(move || work(&mut Io::new(), d, pool, writer))
            {
                Ok(h) => self.workers.push(h),
                Err(e) => {
                    tracing::warn!(error = %e, threads = self.workers.len(), "cannot start another apply thread");
                    if self.workers.is_empty() {
                        // No thread at all: the moves are applied here, one after the other.
                        work_inline(io, &self.d, &self.pool, &self.writer);
                    }
                    break;
                }
            }
        }
        out
    }

    /// Waits until every move submitted is done; returns what was done since the last call.
    #[cfg(test)]
    pub fn wait(&self) -> AppliedMoves {
        let mut q = self.queue();
        while !(q.waiting.is_empty() && q.running.is_empty()) {
            q = self
                .pool
                .cv
                .wait_timeout(q, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        std::mem::take(&mut q.report)
    }

    /// Applies what is queued (none of it after a stop: [`Daemon::request_stop`]), ends the
    /// threads and returns what was done since the last [`Applier::wait`].
    pub fn finish(mut self) -> AppliedMoves {
        self.close();
        std::mem::take(&mut self.queue().report)
    }

    fn close(&mut self) {
        self.queue().closed = true;
        self.pool.cv.notify_all();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
        if let Some(h) = self.health.take() {
            h.stopped();
        }
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        self.close();
    }
}

/// One apply thread: takes the next move that may start (plan order; not before the moves
/// whose CPUs it takes, nor a Memory Manager move before an earlier one), applies it with its
/// own writer, until the applier is closed and nothing is queued, or the daemon stops.
fn work(io: &mut Io, d: Daemon, pool: Arc<Pool>, writer: WriterFactory) {
    let mut w = writer();
    // Restored when this function returns: it may run on the rounds thread (`work_inline`).
    let mut nice = Nice::new();
    // Read with no queue lock held (the daemon's lock is never taken under it), and set
    // before a move is picked: whether a lone move is premigrated follows the value the
    // thread has, not the one asked for (a refused -10 leaves the normal priority).
    let want = d.lock(io).cfg.controller.apply_nice;
    nice.set(io, want);
    let mut q = pool.q.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if d.stopping() && !q.waiting.is_empty() {
            tracing::info!(
                left = q.waiting.len(),
                "stopping: the moves not yet started are not applied"
            );
            q.waiting.clear();
            pool.cv.notify_all();
        }
        match q.next() {
            Pick::Run(mut job) => {
                // The writer's own page moves only when other moves run (or wait to) at the
                // same time: alone, the narrowing mems write (the kernel's migration, one
                // pass over the mm in its worker) is the faster path — vm-bench's TCG guest
                // showed move_pages from the daemon's threads slower than it even when
                // serialised (BENCHMARKS, "Parallel moves and event-driven rounds").
                // A writer ahead of the workloads (`apply_nice` < 0) moves the pages itself
                // even alone: the kernel's worker runs at the normal priority.
                let premigrate = nice.ahead()
                    || (q.limit > 1
                        && (q.premigrate_alone || !(q.running.is_empty() && q.waiting.is_empty())));
                job.started = Some(Instant::now());
                q.running.push(job.clone());
                drop(q);
                // A panic in a move (a bug) ends that move, not the thread: it leaves
                // `running` as failed, and the writer is made anew (its state is unknown).
                let o = match catch_unwind(AssertUnwindSafe(|| {
                    apply_one(
                        io,
                        &d,
                        &mut *w,
                        &job.mv,
                        job.now_ms,
                        job.dry_run,
                        How {
                            premigrate,
                            clock: true,
                            narrowing: Some(&pool.narrowing),
                        },
                    )
                })) {
                    Ok(o) => o,
                    Err(_) => {
                        tracing::error!(cgroup = %job.mv.cgroup, "applying a move panicked; it is counted as failed");
                        count(&d.metrics.moves_failed, "panic");
                        d.lock(io)
                            .state
                            .controller
                            .record_failure(&job.mv.cgroup, job.now_ms.max(super::boot_ms()));
                        w = writer();
                        MoveResult::Failed("panic")
                    }
                };
                let want = d.lock(io).cfg.controller.apply_nice;
                nice.set(io, want);
                q = pool.q.lock().unwrap_or_else(|e| e.into_inner());
                q.end(&job, o);
                pool.cv.notify_all();
            }
            Pick::Blocked(job, on) => {
                tracing::info!(cgroup = %job.mv.cgroup, waits_for = %on, "move not applied: it takes CPUs that the move of another cgroup, which was not applied, did not give up");
                count(&d.metrics.moves_skipped, "blocked");
                q.end(&job, MoveResult::Refused("blocked"));
                pool.cv.notify_all();
            }
            Pick::Wait => {
                if (q.closed || d.stopping()) && q.waiting.is_empty() {
                    return;
                }
                // Woken by a submit, a move done or a close; the timeout sees a stop.
                q = pool
                    .cv
                    .wait_timeout(q, Duration::from_millis(200))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

/// The moves queued, applied in the caller's thread (no apply thread could be started).
fn work_inline(io: &mut Io, d: &Daemon, pool: &Arc<Pool>, writer: &WriterFactory) {
    let mut q = pool.q.lock().unwrap_or_else(|e| e.into_inner());
    let limit = std::mem::replace(&mut q.limit, 1);
    let closed = std::mem::replace(&mut q.closed, true);
    drop(q);
    work(io, d.clone(), pool.clone(), writer.clone());
    let mut q = pool.q.lock().unwrap_or_else(|e| e.into_inner());
    q.limit = limit;
    q.closed = closed;
}

fn trigger_name(t: &controller::Trigger) -> String {
    match t {
        controller::Trigger::PoorLocality => "poor-locality".into(),
        controller::Trigger::Overloaded { .. } => "overloaded".into(),
        controller::Trigger::Migrating { .. } => "migrating".into(),
    }
}

/// The nice value of the calling writer thread (`controller.apply_nice`, followed on reload).
/// `setpriority(PRIO_PROCESS, tid)` sets one thread's value on Linux. The value is absolute;
/// the thread's value when this was made is restored when it is dropped (the function may
/// run on the rounds thread, whose later threads would inherit it). A refused value (a
/// negative one without CAP_SYS_NICE) is logged — once per value asked — and the thread
/// keeps the value it has.
struct Nice {
    /// The thread's value when made (None: unknown, nothing restored).
    base: Option<i32>,
    now: Option<i32>,
}

static NICE_REFUSED: std::sync::Mutex<Option<i32>> = std::sync::Mutex::new(None);

fn thread_nice(tid: libc::id_t) -> Option<i32> {
    // getpriority may return -1 as a value: errno tells.
    // SAFETY: plain syscalls on the calling thread with integer arguments.
    unsafe {
        *libc::__errno_location() = 0;
        let v = libc::getpriority(libc::PRIO_PROCESS, tid);
        (*libc::__errno_location() == 0).then_some(v)
    }
}

fn gettid() -> libc::id_t {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::id_t }
}

impl Nice {
    fn new() -> Nice {
        let base = thread_nice(gettid());
        Nice { base, now: base }
    }

    /// Whether the thread runs ahead of the workloads (a negative value it has).
    fn ahead(&self) -> bool {
        self.now.is_some_and(|n| n < 0)
    }

    /// A syscall, and a warning logged: never under the state lock.
    fn set(&mut self, _io: &Io, want: i32) {
        if self.now == Some(want) {
            return;
        }
        // SAFETY: a plain syscall on the calling thread with integer arguments.
        let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, gettid(), want) };
        if r == 0 {
            self.now = Some(want);
            return;
        }
        let e = std::io::Error::last_os_error();
        let mut last = NICE_REFUSED.lock().unwrap_or_else(|e| e.into_inner());
        if *last != Some(want) {
            *last = Some(want);
            tracing::warn!(nice = want, now = ?self.now, error = %e, "cannot set the writer threads' nice value (controller.apply_nice); they keep the value they have");
        }
    }
}

impl Drop for Nice {
    fn drop(&mut self) {
        if let Some(base) = self.base {
            if self.now != Some(base) {
                // SAFETY: as in `set`. Raising a value back is always allowed; lowering it
                // back (a positive apply_nice) may be refused without CAP_SYS_NICE.
                let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, gettid(), base) };
                if r != 0 {
                    tracing::warn!(nice = base, error = %std::io::Error::last_os_error(), "cannot restore a thread's nice value after its moves");
                }
            }
        }
    }
}

#[cfg(test)]
mod nice_tests {
    use super::{gettid, thread_nice, Io, Nice};

    /// A writer's nice value is the thread's only while its work runs: the value it had is
    /// restored when the work ends (the rounds thread runs it when no writer can start, and
    /// the threads it starts later inherit its value). Raising the value needs no privilege.
    #[test]
    fn a_threads_nice_value_is_restored_when_its_work_ends() {
        std::thread::spawn(|| {
            let io = &Io::new();
            let base = thread_nice(gettid()).expect("getpriority of this thread");
            if base + 3 > 19 {
                // Run under `nice -n 17` or more: no higher value is left to set.
                println!("SKIP: this thread's nice value {base} leaves no room above it");
                return;
            }
            {
                let mut n = Nice::new();
                assert!(!n.ahead() || base < 0);
                n.set(io, base + 3);
                assert_eq!(thread_nice(gettid()), Some(base + 3));
                assert!(!n.ahead(), "a positive value is not ahead of the workloads");
            }
            assert_eq!(thread_nice(gettid()), Some(base), "restored on drop");
        })
        .join()
        .unwrap();
    }
}

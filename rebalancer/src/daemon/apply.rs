//! Applying one round's moves: each move through the actuator (any [`CgroupWriter`]: the real
//! cgroup layer, or `FakeCgroups` in the fault-injection tests), the controller's memory
//! (cooldown, counters) and the metrics updated, and the round's migration budget enforced
//! once more on what is actually applied (the planner already keeps to it; this is the
//! actuator-side guard of the invariant).
//!
//! The daemon applies a round's moves on a few writer threads ([`apply_moves_concurrently`],
//! `controller.apply_threads`); [`apply_moves`] is the one-at-a-time loop.
//!
//! A failure is counted by reason (`rebalancer_moves_failed_total{reason}`: busy, invalid,
//! no-space, permission, vanished, stale, …) and never stops the round: the other moves go on.
//! A cgroup that vanished before or during its move is a normal race (its container exited)
//! and is logged at debug level; an external change (stale) is adopted and logged at info; a
//! real write failure is a warning.

use crate::{
    controller::{
        self,
        concurrent::{apply_concurrently, MoveOutcome},
        ApplyError, CgroupWriter, Move,
    },
    serve::metrics::ReasonLabel,
};

use super::Daemon;

/// What one call of [`apply_moves`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub applied: usize,
    /// (cgroup, reason) of each move that failed.
    pub failed: Vec<(String, &'static str)>,
    /// Moves not attempted because they would have exceeded the round's migration budget.
    pub over_budget: usize,
    /// Bytes the applied moves migrate.
    pub bytes: u64,
}

/// Applies `moves` through `w` in order, one at a time (see the module doc).
pub fn apply_moves(
    d: &Daemon,
    w: &mut dyn CgroupWriter,
    moves: &[Move],
    now_ms: u64,
    dry_run: bool,
) -> Applied {
    let budget = budget_of(d);
    let mut out = Applied::default();
    for mv in moves {
        if out.bytes.saturating_add(mv.bytes_to_migrate) > budget {
            record(
                d,
                mv,
                MoveOutcome::OverBudget,
                now_ms,
                dry_run,
                budget,
                &mut out,
            );
            continue;
        }
        let r = match controller::apply(mv, w, dry_run) {
            Ok(a) => MoveOutcome::Applied(a),
            Err(e) => MoveOutcome::Failed(e),
        };
        record(d, mv, r, now_ms, dry_run, budget, &mut out);
    }
    out
}

/// Applies `moves` on up to `threads` writer threads, each with a writer from `writer`
/// (`controller::concurrent`: budget reserved per move, CPUs given up taken in plan order,
/// a failure rolls back only its own move); then records each outcome as [`apply_moves`]
/// does. No lock is held while the writes run.
pub fn apply_moves_concurrently<W, F>(
    d: &Daemon,
    writer: F,
    threads: usize,
    moves: &[Move],
    now_ms: u64,
    dry_run: bool,
) -> Applied
where
    W: CgroupWriter,
    F: Fn() -> W + Sync,
{
    let budget = budget_of(d);
    let outcomes = apply_concurrently(moves, writer, threads, budget, dry_run);
    let mut out = Applied::default();
    for (mv, o) in moves.iter().zip(outcomes) {
        record(d, mv, o, now_ms, dry_run, budget, &mut out);
    }
    out
}

fn budget_of(d: &Daemon) -> u64 {
    d.lock()
        .cfg
        .controller
        .migration_budget_mib
        .saturating_mul(1 << 20)
}

/// Logs one move's outcome, counts it, and updates the controller's memory.
fn record(
    d: &Daemon,
    mv: &Move,
    outcome: MoveOutcome,
    now_ms: u64,
    dry_run: bool,
    budget: u64,
    out: &mut Applied,
) {
    match outcome {
        MoveOutcome::OverBudget => {
            tracing::warn!(cgroup = %mv.cgroup, bytes = mv.bytes_to_migrate, budget, "move not applied: it would exceed the round's migration budget");
            d.metrics
                .moves_skipped
                .get_or_create(&ReasonLabel {
                    reason: "budget".into(),
                })
                .inc();
            out.over_budget += 1;
        }
        MoveOutcome::Blocked { on } => {
            tracing::info!(cgroup = %mv.cgroup, waits_for = %on, "move not applied: it takes CPUs that the failed move of another cgroup did not give up");
            d.metrics
                .moves_skipped
                .get_or_create(&ReasonLabel {
                    reason: "blocked".into(),
                })
                .inc();
            out.failed.push((mv.cgroup.clone(), "blocked"));
        }
        MoveOutcome::Applied(done) => {
            out.applied += 1;
            out.bytes = out.bytes.saturating_add(mv.bytes_to_migrate);
            let staged = mv.stage.as_ref().map(|s| s.toward.to_string());
            tracing::info!(cgroup = %mv.cgroup, to_cpus = %mv.to_cpus, to_mems = %mv.to_mems, bytes = mv.bytes_to_migrate,
                moved = done.moved_bytes, staged_toward = ?staged,
                before = mv.locality_before, after = mv.locality_after, dry_run, steps = done.steps.len(), "move applied");
            if let Some(e) = &done.pages_error {
                tracing::warn!(cgroup = %mv.cgroup, error = %e, "staged move: moving pages failed; the cpuset writes stand");
            }
            let mut s = d.lock();
            if !dry_run {
                s.state.controller.record_move(mv, done.moved_bytes, now_ms);
                d.metrics.pages_migrated.inc_by(done.moved_bytes / 4096);
            }
            d.metrics
                .moves_applied
                .get_or_create(&ReasonLabel {
                    reason: trigger_name(&mv.reason),
                })
                .inc();
        }
        MoveOutcome::Failed(e) => {
            let reason = e.reason();
            match &e {
                ApplyError::Vanished { .. } => {
                    tracing::debug!(cgroup = %mv.cgroup, "cgroup vanished before its move; nothing to do")
                }
                ApplyError::Read { .. } if reason == "vanished" => {
                    tracing::debug!(cgroup = %mv.cgroup, "cgroup vanished before its move; nothing to do")
                }
                ApplyError::Stale { .. } => {
                    tracing::info!(cgroup = %mv.cgroup, error = %e, "cgroup changed by someone else since it was observed; their choice is kept")
                }
                _ => {
                    tracing::warn!(cgroup = %mv.cgroup, error = %e, reason, "move failed")
                }
            }
            if reason != "vanished" {
                d.lock().state.controller.record_failure(&mv.cgroup, now_ms);
            }
            d.metrics
                .moves_failed
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .inc();
            out.failed.push((mv.cgroup.clone(), reason));
        }
    }
}

fn trigger_name(t: &controller::Trigger) -> String {
    match t {
        controller::Trigger::PoorLocality => "poor-locality".into(),
        controller::Trigger::Overloaded { .. } => "overloaded".into(),
    }
}

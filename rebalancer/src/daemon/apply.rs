//! Applying one round's moves: each move through the actuator (any [`CgroupWriter`]: the real
//! cgroup layer, or `FakeCgroups` in the fault-injection tests), the controller's memory
//! (cooldown, counters) and the metrics updated, and the round's migration budget enforced
//! once more on what is actually applied (the planner already keeps to it; this is the
//! actuator-side guard of the invariant).
//!
//! Each move is checked against the allocator's books just before it is written
//! (`admission::move_allowed`: no reserved or other container's exclusive CPU, Memory Manager
//! memory only where it fits) and, once written, recorded in them
//! (`admission::record_cpus_locked_order`, `admission::record_mems`), so the allocator and
//! cgroupfs agree after every move. The check, the cpus write and its record happen under the
//! allocator lock (`Daemon::order`), ordered with admissions; the memory migration after it.
//!
//! A stop of the daemon ([`Daemon::request_stop`]) is checked before each move: the moves left
//! wait for the next start, so a slow migration never outlasts the shutdown bound. Each applied
//! move is checkpointed before the next one starts, so its cooldown survives the stop.
//!
//! A failure is counted by reason (`rebalancer_moves_failed_total{reason}`: busy, invalid,
//! no-space, permission, vanished, stale, …) and never stops the round: the other moves go on.
//! A cgroup that vanished before or during its move is a normal race (its container exited)
//! and is logged at debug level; an external change (stale) is adopted and logged at info; a
//! real write failure is a warning.

use crate::{
    controller::{self, ApplyError, CgroupWriter, Move},
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

/// Applies `moves` through `w` in order (see the module doc).
pub fn apply_moves(
    d: &Daemon,
    w: &mut dyn CgroupWriter,
    moves: &[Move],
    now_ms: u64,
    dry_run: bool,
) -> Applied {
    let budget = d
        .lock()
        .cfg
        .controller
        .migration_budget_mib
        .saturating_mul(1 << 20);
    let mut out = Applied::default();
    for (i, mv) in moves.iter().enumerate() {
        if d.stopping() {
            tracing::info!(
                left = moves.len() - i,
                "stopping: the round's remaining moves are not applied"
            );
            break;
        }
        if out.bytes.saturating_add(mv.bytes_to_migrate) > budget {
            tracing::warn!(cgroup = %mv.cgroup, bytes = mv.bytes_to_migrate, budget, "move not applied: it would exceed the round's migration budget");
            d.metrics
                .moves_skipped
                .get_or_create(&ReasonLabel {
                    reason: "budget".into(),
                })
                .inc();
            out.over_budget += 1;
            continue;
        }
        // The allocator lock (`Daemon::order`) is held from the books check over the cpus
        // write to its record, so no admission comes between them: one that makes the target
        // CPUs exclusive either ran before (the check refuses, or the cpus read is stale) or
        // runs after (its shrink sees the new cpus). The mems write that migrates the memory,
        // and a stage's page moves, run after it is released.
        let begun = {
            let _order = d.order();
            if let Err(reason) = super::admission::move_allowed(d, mv) {
                tracing::info!(cgroup = %mv.cgroup, to_cpus = %mv.to_cpus, to_mems = %mv.to_mems, reason, "move not applied: the allocator's books changed since the round planned it");
                d.metrics
                    .moves_skipped
                    .get_or_create(&ReasonLabel {
                        reason: reason.into(),
                    })
                    .inc();
                continue;
            }
            let begun = controller::begin(mv, w, dry_run);
            if let Ok(controller::Begun::CpusMoved(_)) = &begun {
                if super::admission::record_cpus_locked_order(d, mv) {
                    // An exclusive container moved: the shared pool follows it.
                    for c in super::admission::shared_changes(d, |cg| w.read_cpus(cg).ok()) {
                        if let Err(e) = w.write_cpus(&c.cgroup, &c.cpus) {
                            tracing::warn!(cgroup = %c.cgroup, error = %e, "moving a shared container to its pool failed");
                        }
                    }
                }
            }
            begun
        };
        let result = begun.and_then(|b| match b {
            controller::Begun::DryRun(a) => Ok(a),
            controller::Begun::CpusMoved(rest) => {
                let r = controller::finish(mv, w, rest.keep_cpus_on_failure());
                if let Err(e) = &r {
                    if !matches!(
                        e,
                        ApplyError::Vanished { .. } | ApplyError::RollbackFailed { .. }
                    ) {
                        undo_cpus(d, w, mv);
                    }
                }
                r
            }
        });
        match result {
            Ok(done) => {
                out.applied += 1;
                out.bytes = out.bytes.saturating_add(mv.bytes_to_migrate);
                let staged = mv.stage.as_ref().map(|s| s.toward.to_string());
                tracing::info!(cgroup = %mv.cgroup, to_cpus = %mv.to_cpus, to_mems = %mv.to_mems, bytes = mv.bytes_to_migrate,
                    moved = done.moved_bytes, staged_toward = ?staged,
                    before = mv.locality_before, after = mv.locality_after, dry_run, steps = done.steps.len(), "move applied");
                if let Some(e) = &done.pages_error {
                    tracing::warn!(cgroup = %mv.cgroup, error = %e, "staged move: moving pages failed; the cpuset writes stand");
                }
                if !dry_run {
                    super::admission::record_mems(d, mv);
                    d.lock()
                        .state
                        .controller
                        .record_move(mv, done.moved_bytes, now_ms);
                    d.metrics.pages_migrated.inc_by(done.moved_bytes / 4096);
                    // On disk before the next move: a stop (or a crash) while later moves
                    // migrate keeps this one's cooldown and books.
                    if let Err(e) = d.checkpoint() {
                        tracing::warn!(cgroup = %mv.cgroup, error = %e, "checkpoint after a move failed");
                    }
                }
                d.metrics
                    .moves_applied
                    .get_or_create(&ReasonLabel {
                        reason: trigger_name(&mv.reason),
                    })
                    .inc();
            }
            Err(e) => {
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
    out
}

/// The second half of `mv` failed (its mems are rolled back, its new cpus kept): the cpus go
/// back too, as a move of their own under the allocator lock — only when the books still
/// allow the old cpus (an admission may have made them exclusive meanwhile; then the new cpus,
/// recorded and valid, stay).
fn undo_cpus(d: &Daemon, w: &mut dyn CgroupWriter, mv: &Move) {
    let back = Move {
        from_cpus: mv.to_cpus.clone(),
        to_cpus: mv.from_cpus.clone(),
        to_mems: mv.from_mems.clone(),
        from_mems: mv.from_mems.clone(),
        stage: None,
        bytes_to_migrate: 0,
        ..mv.clone()
    };
    let _order = d.order();
    if let Err(reason) = super::admission::move_allowed(d, &back) {
        tracing::info!(cgroup = %mv.cgroup, cpus = %mv.to_cpus, reason, "failed move: its new cpus are kept; the old ones are no longer free");
        return;
    }
    match w.write_cpus(&mv.cgroup, &mv.from_cpus) {
        Ok(()) => {
            if super::admission::record_cpus_locked_order(d, &back) {
                for c in super::admission::shared_changes(d, |cg| w.read_cpus(cg).ok()) {
                    if let Err(e) = w.write_cpus(&c.cgroup, &c.cpus) {
                        tracing::warn!(cgroup = %c.cgroup, error = %e, "moving a shared container to its pool failed");
                    }
                }
            }
        }
        Err(e) => {
            tracing::warn!(cgroup = %mv.cgroup, error = %e, "failed move: putting its cpus back failed; the new cpus are kept")
        }
    }
}

fn trigger_name(t: &controller::Trigger) -> String {
    match t {
        controller::Trigger::PoorLocality => "poor-locality".into(),
        controller::Trigger::Overloaded { .. } => "overloaded".into(),
        controller::Trigger::Migrating { .. } => "migrating".into(),
    }
}

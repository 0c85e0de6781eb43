//! The control-round thread: a round at once, then one every `controller.period_ms`, brought
//! forward by events (`trigger`), with the counters marked between rounds.

use std::{
    sync::mpsc,
    time::{Duration, Instant},
};

use super::{trigger, Engine};
use crate::daemon::{admission::Admission, Io};

/// What the main task (and the trigger) tell the control-round thread.
#[derive(Debug)]
pub enum RoundCmd {
    /// The config was reloaded: the next round is due `period_ms` (the new one) after the
    /// last round started.
    Reload,
    /// An event wants a round soon (see `trigger`), and when it was sent: one that came
    /// while a round ran is settled from its own time, not from when the round ended.
    Event(trigger::Why, Instant),
    /// Finish the round under way, if any, wait for the moves being applied, and stop.
    Stop,
}

/// Starts the control-round thread: a round at once, then one every `controller.period_ms`
/// (read from the live config, so a reload applies), measured start to start; a round longer
/// than the period is followed by the next at once. Events (an operator's cpuset.cpus write,
/// a new container's placement: `trigger`) bring a round forward: `event_settle_ms` after a
/// burst, and its follow-up. Between rounds it marks the counters (`Engine::mark`: at the
/// first event of a burst, else once halfway through the period; a later event's mark
/// replaces an earlier one), and the next round reads where each workload ran since. After
/// `max_rounds` rounds (0: no limit) it waits for the moves still being applied, reports on
/// `limit` and stops.
pub fn spawn(
    io: &mut Io,
    mut engine: Engine,
    adm: Admission,
    max_rounds: u64,
    limit: tokio::sync::oneshot::Sender<u64>,
) -> std::io::Result<(mpsc::Sender<RoundCmd>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<RoundCmd>();
    // Dead when the thread panics, or when no round finished for 10 periods (at least 2 min);
    // the limit follows a reloaded period.
    let max_silence = |io: &mut Io, adm: &Admission| {
        let period = Duration::from_millis(adm.daemon.lock(io).config().controller.period_ms);
        Some((period * 10).max(Duration::from_secs(120)))
    };
    let health = adm
        .daemon
        .metrics
        .health
        .register("rounds", max_silence(io, &adm));
    {
        let tx = std::sync::Mutex::new(tx.clone());
        adm.daemon.rounds.connect(move |why| {
            let _ = tx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(RoundCmd::Event(why, Instant::now()));
        });
    }
    let trigger = match trigger::CpusetTrigger::spawn(adm.daemon.clone()) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "cpuset trigger unavailable (inotify); rounds on operators' cpuset changes wait for the period");
            None
        }
    };
    let settle = |io: &mut Io, adm: &Admission| {
        Duration::from_millis(adm.daemon.lock(io).config().controller.event_settle_ms)
    };
    let gap = |io: &mut Io, adm: &Admission| {
        let s = adm.daemon.lock(io);
        let c = &s.config().controller;
        trigger::min_gap(
            Duration::from_millis(c.event_settle_ms),
            Duration::from_millis(c.period_ms),
        )
    };
    let mut events = trigger::Coalescer::new(settle(io, &adm));
    events.set_min_gap(gap(io, &adm));
    let h = std::thread::Builder::new()
        .name("control-rounds".into())
        .spawn(move || {
            let io = &mut Io::new();
            let mut rounds = 0u64;
            loop {
                let started = Instant::now();
                if events.round_started(started) {
                    tracing::debug!("round brought forward by an event");
                }
                engine.round(io, &adm);
                // A skipped round (cgroup walk or samples' read failed) is no sign of life:
                // if it lasts, health sees the rounds silent and the daemon restarts.
                if engine.skipped_in_a_row() == 0 {
                    health.beat();
                }
                rounds += 1;
                match &trigger {
                    Some(t) => t.watch(&adm.daemon.rounds, engine.watch_files()),
                    None => adm
                        .daemon
                        .rounds
                        .retain_own(&engine.managed_now().iter().map(String::as_str).collect()),
                }
                if max_rounds != 0 && rounds >= max_rounds {
                    engine.finish();
                    health.stopped();
                    let _ = limit.send(rounds);
                    return;
                }
                // Once per round (a mark that finds nothing to read is not retried at once).
                let mut halfway = false;
                loop {
                    let period =
                        Duration::from_millis(adm.daemon.lock(io).config().controller.period_ms);
                    let due = events
                        .due()
                        .map_or(started + period, |e| e.min(started + period));
                    // Halfway through the period, a reading for the next round to split its
                    // window at (`Engine::mark`), unless an event's mark came first.
                    let half = started + period / 2;
                    let mark_at = (!halfway && !engine.marked() && half < due).then_some(half);
                    let wait = mark_at
                        .unwrap_or(due)
                        .saturating_duration_since(Instant::now());
                    match rx.recv_timeout(wait) {
                        Ok(RoundCmd::Reload) => {
                            health.set_max_silence(max_silence(io, &adm));
                            events.set_settle(settle(io, &adm));
                            events.set_min_gap(gap(io, &adm));
                            continue;
                        }
                        Ok(RoundCmd::Event(why, at)) => {
                            tracing::debug!(?why, "event: a round soon");
                            // The first event of a burst: the event round sees where each
                            // workload has run since (a workload that moved itself just
                            // before is not averaged with where it was).
                            // Re-pinned cgroups' written-pages windows start now, so the
                            // event's round reads them without waiting for a first window.
                            engine.repinned(io, &adm.daemon, &adm.daemon.rounds.take_repinned());
                            let first = !events.bursting();
                            events.event(at);
                            if first && events.bursting() {
                                engine.mark(io, &adm);
                            }
                            continue;
                        }
                        Ok(RoundCmd::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                            engine.finish();
                            health.stopped();
                            return;
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) if mark_at.is_some() => {
                            halfway = true;
                            engine.mark(io, &adm);
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                    }
                }
            }
        })?;
    Ok((tx, h))
}

//! The planner: one pure function from what was observed to the moves worth making.
//!
//! `plan` does no I/O and cannot fail. Every cgroup gets a [`Decision`]; candidates (poor
//! smoothed locality, or running on an overloaded node while another has room) are priced
//! against every target option (see `target`), gated by pinning, exclusivity, cooldown,
//! `min_gain` (hysteresis) and cost, then accepted most-net-gain first (ties by id) within the
//! round's migration budget and move count, re-checking each against the room earlier moves of
//! the round took. A move whose memory exceeds the budget left is staged (see [`Stage`]);
//! stages under way are continued first, before any new candidate.

use std::cmp::Ordering;

use super::locality::{Evidence, Scores};
use super::observe::{CgroupObs, Observations};
use super::plan_types::{
    Considered, Decision, Move, Outcome, Plan, Skip, Stage, TargetRejection, Trigger,
};
use super::target::{Picks, Projection};
use super::{CgroupState, ControllerState};
use crate::config::ControllerConfig;
use crate::topology::Topology;

/// A cgroup's instant score this period and its evidence (see `locality::instant`).
type Instant = Option<(f64, Evidence)>;

/// Plans one round. `now_ms` is on the same clock as the state's last-move times.
pub fn plan(
    topo: &Topology,
    obs: &Observations,
    state: &ControllerState,
    cfg: &ControllerConfig,
    now_ms: u64,
) -> Plan {
    plan_scored(topo, obs, &Scores::of(obs), state, cfg, now_ms)
}

/// [`plan`] with the period's instant scores already computed: `scores` are `obs`'s, as
/// `ControllerState::observe_scored(obs, ..)` returned them (scores of other observations
/// would be other decisions; scores that cannot be `obs`'s, of another length, are ignored
/// and computed again).
pub fn plan_scored(
    topo: &Topology,
    obs: &Observations,
    scores: &Scores,
    state: &ControllerState,
    cfg: &ControllerConfig,
    now_ms: u64,
) -> Plan {
    plan_with(topo, obs, scores, state, cfg, now_ms, None)
}

/// [`plan_scored`] with the first evaluation on `threads` threads (`None`: as many as the
/// round's size is worth, see [`evaluate_all`]); the plan is the same for any count.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_with(
    topo: &Topology,
    obs: &Observations,
    scores: &Scores,
    state: &ControllerState,
    cfg: &ControllerConfig,
    now_ms: u64,
    threads: Option<usize>,
) -> Plan {
    let own;
    let scores = if scores.fits(obs) {
        scores
    } else {
        own = Scores::of(obs);
        &own
    };
    let mut pairs: Vec<(&CgroupObs, Instant)> =
        obs.cgroups.iter().zip(scores.0.iter().copied()).collect();
    // The steady state: the cgroups the state holds, in its (sorted, unique) key order, as
    // `observe` leaves it. One equality per cgroup sees it; each state is then its key's.
    let steady = state.cgroups.len() == pairs.len()
        && (state.cgroups.keys().zip(&pairs)).all(|(id, p)| *id == p.0.id);
    // Usually already sorted and unique (one comparison per cgroup to see it).
    if !steady && !pairs.windows(2).all(|w| w[0].0.id < w[1].0.id) {
        pairs.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        pairs.dedup_by(|a, b| a.0.id == b.0.id);
    }
    let (cgs, insts): (Vec<&CgroupObs>, Vec<Instant>) = pairs.into_iter().unzip();
    // Each cgroup's state, by one ordered walk of both (no string lookup per cgroup).
    let sts = if steady {
        state.cgroups.values().map(Some).collect()
    } else {
        states_of(&cgs, state)
    };

    let mut proj = Projection::new(topo, obs, state, cfg);
    // Staged moves under way go first: finishing what was started.
    let mut moves = Vec::new();
    // (index, outcome) of the cgroups whose stage was continued, in index order.
    let mut continued: Vec<(usize, Outcome)> = Vec::new();
    for (i, cg) in cgs.iter().enumerate() {
        match continue_stage(&mut proj, cg, sts[i]) {
            Some(Ok(mv)) => {
                let to_nodes = mv.stage.as_ref().map_or(&mv.to_mems, |s| &s.toward).clone();
                continued.push((i, Outcome::Moved { to_nodes }));
                moves.push(mv);
            }
            Some(Err(skip)) => continued.push((i, Outcome::Skipped(skip))),
            None => {}
        }
    }
    // The decisions are built in place (one per cgroup, in id order); what a candidate's
    // move needs besides its decision is kept aside, for the candidates alone.
    let (mut decisions, mut proposals) = evaluate_all(
        &proj,
        obs,
        &cgs,
        &insts,
        &sts,
        cfg,
        now_ms,
        threads.unwrap_or_else(|| plan_threads(cgs.len(), topo.nodes.len())),
    );
    if !continued.is_empty() {
        // A continued stage is the cgroup's move this round: no proposal of its own.
        proposals.retain(|p| continued.binary_search_by_key(&p.i, |c| c.0).is_err());
        for (i, outcome) in continued {
            let d = &mut decisions[i];
            d.outcome = outcome;
            d.considered.clear();
        }
    }

    // `cgs` is sorted by id and unique: index order is id order (no string compare), and no
    // two proposals are equal (any sort gives this order).
    proposals.sort_unstable_by(|a, b| b.net.total_cmp(&a.net).then(a.i.cmp(&b.i)));

    for mut p in proposals {
        let i = p.i;
        if proj.moves_left == 0 {
            decisions[i].outcome = Outcome::Skipped(Skip::MaxMoves);
            continue;
        }
        if proj.dirty {
            let e = evaluate(&proj, obs, cgs[i], insts[i], sts[i], cfg, now_ms);
            decisions[i] = e.decision;
            p.picks = e.picks;
            match e.chosen {
                Some(k) => p.chosen = k,
                None => continue,
            }
        }
        let decision = &mut decisions[i];
        match choose(&decision.considered, cfg, proj.budget_left) {
            Ok(k) => {
                let opt = p.picks.option(&decision.considered, k);
                let cg = cgs[i];
                let to_cpus = proj.to_cpus(cg, opt);
                let c = opt.considered;
                // Over the budget left: the first stage (see `Stage`) takes what is left.
                // cpuset.mems never names a node without memory (the kernel refuses it).
                let mems = proj.mems_of(&c.nodes).into_owned();
                let stage = (c.bytes_to_migrate > proj.budget_left).then(|| Stage {
                    toward: mems.clone(),
                    remaining_bytes: c.bytes_to_migrate,
                });
                let (to_mems, bytes) = match &stage {
                    Some(_) => (cg.mems.union(&mems), proj.budget_left),
                    None => (mems, c.bytes_to_migrate),
                };
                proj.accept(obs, cg, opt);
                let mv = Move {
                    cgroup: cg.id.clone(),
                    from_cpus: cg.cpus.clone(),
                    to_cpus,
                    from_mems: cg.mems.clone(),
                    to_mems,
                    bytes_to_migrate: bytes,
                    reason: decision.trigger.clone().unwrap_or(Trigger::PoorLocality),
                    locality_before: decision.smoothed.unwrap_or(c.locality_after),
                    locality_after: c.locality_after,
                    net: c.net,
                    stage,
                };
                decision.outcome = Outcome::Moved {
                    to_nodes: c.nodes.clone(),
                };
                moves.push(mv);
            }
            Err(skip) => decision.outcome = Outcome::Skipped(skip),
        }
    }
    Plan { moves, decisions }
}

/// Cgroups × nodes a thread is worth: a thread costs tens of microseconds to start and its
/// decisions are freed by another thread, a candidate's evaluation prices up to one option
/// per node. Below this a round evaluates on the calling thread (2 nodes × 10,000 cgroups ran
/// slower on two threads than on one, 32 × 10,000 faster: BENCHMARKS, "Planner scale").
const WORK_PER_THREAD: usize = 64 * 1024;
/// At most this many threads evaluate a round's cgroups.
const PARALLEL_MAX: usize = 4;

/// How many threads a round's first evaluation of `cgroups` cgroups on `nodes` nodes is worth:
/// one per [`WORK_PER_THREAD`] cgroups × nodes, at most [`PARALLEL_MAX`] and no more than
/// the CPUs this process may use (`available_parallelism` counts its affinity and cgroup CPU
/// quota).
fn plan_threads(cgroups: usize, nodes: usize) -> usize {
    let work = cgroups.saturating_mul(nodes.max(1));
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(PARALLEL_MAX)
        .min(work / WORK_PER_THREAD)
        .max(1)
}

/// Every cgroup's first evaluation against the round's projection before any move (which
/// they only read): the decisions in `cgs` order, and a proposal for each candidate with an
/// option chosen, in index order. With `threads` > 1 the cgroups are split into contiguous
/// chunks evaluated on scoped threads: the same evaluations, so the same plan, in less wall
/// time; the CPU time is the same. The calling thread's chunk is written straight into the
/// round's list (10,000 decisions are a few MB: each copy of them costs).
#[allow(clippy::too_many_arguments)]
fn evaluate_all(
    proj: &Projection<'_>,
    obs: &Observations,
    cgs: &[&CgroupObs],
    insts: &[Instant],
    sts: &[Option<&CgroupState>],
    cfg: &ControllerConfig,
    now_ms: u64,
    threads: usize,
) -> (Vec<Decision>, Vec<Proposal>) {
    let run =
        |r: std::ops::Range<usize>, decisions: &mut Vec<Decision>, props: &mut Vec<Proposal>| {
            decisions.extend(r.map(|i| {
                let e = evaluate(proj, obs, cgs[i], insts[i], sts[i], cfg, now_ms);
                if let Some(chosen) = e.chosen {
                    props.push(Proposal {
                        i,
                        picks: e.picks,
                        chosen,
                        net: e.decision.considered[chosen].net,
                    });
                }
                e.decision
            }));
        };
    let mut decisions: Vec<Decision> = Vec::with_capacity(cgs.len());
    let mut proposals: Vec<Proposal> = Vec::new();
    let threads = threads.min(cgs.len());
    if threads <= 1 {
        run(0..cgs.len(), &mut decisions, &mut proposals);
        return (decisions, proposals);
    }
    let chunk = cgs.len().div_ceil(threads);
    std::thread::scope(|s| {
        let run = &run;
        // The calling thread takes the first chunk; the others run beside it. A thread that
        // cannot be started (a pids limit, no memory) leaves its chunk to the calling thread.
        let others: Vec<_> = (1..threads)
            .map(|t| {
                let r = t * chunk..((t + 1) * chunk).min(cgs.len());
                let spawned = std::thread::Builder::new()
                    .name("rb-plan".into())
                    .spawn_scoped(s, {
                        let r = r.clone();
                        move || {
                            let (mut d, mut p) = (Vec::with_capacity(r.len()), Vec::new());
                            run(r, &mut d, &mut p);
                            (d, p)
                        }
                    });
                (r, spawned.ok())
            })
            .collect();
        run(0..chunk.min(cgs.len()), &mut decisions, &mut proposals);
        for (r, h) in others {
            match h.map(|h| h.join()) {
                Some(Ok((d, p))) => {
                    decisions.extend(d);
                    proposals.extend(p);
                }
                // A panic in a worker is the round's, as it would be on this thread.
                Some(Err(p)) => std::panic::resume_unwind(p),
                None => run(r, &mut decisions, &mut proposals),
            }
        }
    });
    (decisions, proposals)
}

/// A candidate with an option chosen: its index (in id order), what turning its options
/// into a move needs, and the option chosen with the whole remaining budget.
struct Proposal {
    i: usize,
    picks: Picks,
    chosen: usize,
    /// The chosen option's net gain, which ranks the proposals (kept here: the sort reads it
    /// without reaching into 10,000 decisions).
    net: f64,
}

/// The state of each of `cgs` (sorted by id, unique), walking the state's map in step.
fn states_of<'s>(cgs: &[&CgroupObs], state: &'s ControllerState) -> Vec<Option<&'s CgroupState>> {
    let mut it = state.cgroups.iter().peekable();
    cgs.iter()
        .map(|cg| {
            // One comparison per step.
            while let Some(&(id, st)) = it.peek() {
                match id.as_str().cmp(cg.id.as_str()) {
                    Ordering::Less => _ = it.next(),
                    Ordering::Equal => return Some(st),
                    Ordering::Greater => return None,
                }
            }
            None
        })
        .collect()
}

/// A decision in the making: its options are priced straight into `decision.considered`,
/// with what turning each into a move needs in `picks`.
struct Eval {
    decision: Decision,
    picks: Picks,
    /// Index of the option chosen with the whole remaining budget, for a candidate.
    chosen: Option<usize>,
}

fn evaluate(
    proj: &Projection<'_>,
    obs: &Observations,
    cg: &CgroupObs,
    inst: Instant,
    st: Option<&CgroupState>,
    cfg: &ControllerConfig,
    now_ms: u64,
) -> Eval {
    let smoothed = st.and_then(|s| s.smoothed).or(inst.map(|(s, _)| s));
    let trigger = proj.trigger(cg, smoothed, cfg);
    let decision = Decision {
        cgroup: cg.id.clone(),
        locality: inst.map(|(s, _)| s),
        evidence: inst.map(|(_, e)| e),
        smoothed,
        smoothed_from: st
            .filter(|s| s.smoothed.is_some())
            .map(|s| s.smoothed_from)
            .unwrap_or_default(),
        cpu_demand: obs.cpu_demand(cg),
        memory_bytes: cg.total_mem(),
        trigger: trigger.clone(),
        considered: Vec::new(),
        outcome: Outcome::Healthy,
    };
    let eval = |outcome| Eval {
        decision: Decision {
            outcome,
            ..decision
        },
        picks: Picks::default(),
        chosen: None,
    };
    let Some(trigger) = trigger else {
        return eval(if smoothed.is_none() {
            Outcome::NoData
        } else {
            Outcome::Healthy
        });
    };
    let c = &cg.constraints;
    if c.moving {
        return eval(Outcome::Skipped(Skip::InFlight));
    }
    if c.pinned {
        return eval(Outcome::Skipped(Skip::Pinned));
    }
    if c.exclusive && !cfg.move_exclusive {
        return eval(Outcome::Skipped(Skip::Exclusive));
    }
    // Memory bound to nodes where the threads may no longer run (the operator moved them):
    // fixed now, not after the cooldown; but not twice in a row (a tenant flipping its
    // threads' affinity would have its memory migrated back and forth every round): after a
    // move made within the cooldown of the one before, the next waits for its cooldown.
    let early_before = st.is_some_and(|s| {
        s.last_move_ms
            .zip(s.move_before_ms)
            .is_some_and(|(last, before)| last.saturating_sub(before) < cfg.cooldown_ms)
    });
    // Where its memory is bound: its mems, or the target of our move that left them wider
    // (while they are still what it left).
    let bound = st
        .and_then(|s| s.wide_of.as_ref())
        .filter(|(left, _)| *left == cg.mems)
        .map_or(&cg.mems, |(_, target)| target);
    // (allowed CPU nodes without memory allow the memory nodes that stand in for them)
    let misplaced = !early_before
        && c.allowed_nodes
            .as_ref()
            .is_some_and(|a| !bound.is_subset(&proj.mems_of(a)));
    if let Some(remaining_ms) = st
        .and_then(|s| s.cooldown_remaining(&cg.cpus, now_ms, cfg.cooldown_ms))
        .filter(|_| !misplaced)
    {
        return eval(Outcome::Skipped(Skip::Cooldown { remaining_ms }));
    }
    // What a move saves is counted for as long as the workload has lived so far (its expected
    // remaining life), at most the horizon; a cgroup the state has not seen yet gets the horizon.
    let lived_ms = st
        .filter(|s| s.periods > 0)
        .map_or(cfg.horizon_ms, |s| s.lived_ms.min(cfg.horizon_ms));
    let (considered, picks) = proj.options(obs, cg, &trigger, smoothed, cfg, lived_ms);
    let (outcome, chosen) = match choose(&considered, cfg, proj.budget_left) {
        Ok(k) => (Outcome::Healthy, Some(k)),
        Err(skip) => (Outcome::Skipped(skip), None),
    };
    let mut e = eval(outcome);
    e.decision.considered = considered;
    e.picks = picks;
    e.chosen = chosen;
    e
}

/// The next round of a staged move of `cg` (see [`Stage`]), when one is under way and still
/// stands: the cgroup's CPUs are still the ones the last stage wrote, its mems still include
/// the target, and the last stage made progress. `None` sends the cgroup down the normal
/// path (with its cooldown). The final round narrows mems once the rest fits in the budget.
fn continue_stage(
    proj: &mut Projection<'_>,
    cg: &CgroupObs,
    st: Option<&CgroupState>,
) -> Option<Result<Move, Skip>> {
    let sg = st?.staging.as_ref()?;
    if cg.constraints.moving {
        return Some(Err(Skip::InFlight));
    }
    if cg.constraints.pinned || cg.cpus != sg.to_cpus || !sg.toward.is_subset(&cg.mems) {
        return None;
    }
    let all: u64 = cg
        .mem_bytes_per_node
        .keys()
        .chain(cg.hugepage_bytes_per_node.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .fold(0u64, |a, &n| a.saturating_add(cg.mem_on(n)));
    let remaining = cg
        .mem_bytes_per_node
        .keys()
        .chain(cg.hugepage_bytes_per_node.keys())
        .filter(|n| !sg.toward.contains(**n))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .fold(0u64, |a, &n| a.saturating_add(cg.mem_on(n)));
    if remaining != 0 && remaining >= sg.remaining_bytes {
        return None; // no progress: its pages do not move (pinned, mlocked by a device …)
    }
    if proj.moves_left == 0 {
        return Some(Err(Skip::MaxMoves));
    }
    let budget = proj.budget_left;
    if remaining > 0 && budget == 0 {
        return Some(Err(Skip::Budget {
            need: remaining,
            remaining: budget,
        }));
    }
    let last = remaining <= budget;
    let bytes = remaining.min(budget);
    let local = |moved: u64| {
        let on = all.saturating_sub(remaining).saturating_add(moved);
        if all == 0 {
            1.0
        } else {
            on as f64 / all as f64
        }
    };
    proj.accept_pages(&sg.toward, bytes);
    Some(Ok(Move {
        cgroup: cg.id.clone(),
        from_cpus: cg.cpus.clone(),
        to_cpus: cg.cpus.clone(),
        from_mems: cg.mems.clone(),
        to_mems: if last {
            sg.toward.clone()
        } else {
            cg.mems.clone()
        },
        bytes_to_migrate: bytes,
        reason: Trigger::PoorLocality,
        locality_before: local(0),
        locality_after: local(bytes),
        net: 0.0,
        stage: (!last).then(|| Stage {
            toward: sg.toward.clone(),
            remaining_bytes: remaining,
        }),
    }))
}

/// The best acceptable option within `budget` bytes: feasible, gain ≥ `min_gain`, net > 0;
/// most net first, then fewer bytes, fewer nodes, lower node ids. With staged migration on,
/// the best acceptable option over the budget when at least a quarter of the round's budget
/// is left (its first stage takes that). Otherwise the reason.
fn choose(options: &[Considered], cfg: &ControllerConfig, budget: u64) -> Result<usize, Skip> {
    let rank = |a: &usize, b: &usize| -> Ordering {
        let (x, y) = (&options[*a], &options[*b]);
        y.net
            .total_cmp(&x.net)
            .then(x.bytes_to_migrate.cmp(&y.bytes_to_migrate))
            .then(x.nodes.len().cmp(&y.nodes.len()))
            .then_with(|| x.nodes.cmp_ids(&y.nodes))
    };
    // The usual answer in one walk (this runs for every candidate, and again for each
    // proposal): the best acceptable option within the budget, the first of equals as
    // `min_by` keeps it. Without one, the walks below say why or stage.
    // The best so far with its net, bytes and node count (`rank`'s keys, read once each).
    let mut within: Option<(usize, f64, u64, usize)> = None;
    for (k, c) in options.iter().enumerate() {
        if c.rejected.is_none()
            && c.gain >= cfg.min_gain
            && c.net > 0.0
            && c.bytes_to_migrate <= budget
        {
            // `rank(w, k)` is `Greater`: `k` goes first.
            let ahead = within.is_none_or(|(w, net, bytes, len)| {
                c.net
                    .total_cmp(&net)
                    .then(bytes.cmp(&c.bytes_to_migrate))
                    .then_with(|| len.cmp(&c.nodes.len()))
                    .then_with(|| options[w].nodes.cmp_ids(&c.nodes))
                    == Ordering::Greater
            });
            if ahead {
                within = Some((k, c.net, c.bytes_to_migrate, c.nodes.len()));
            }
        }
    }
    if let Some((k, ..)) = within {
        return Ok(k);
    }
    // Index walks, no lists.
    let feasible = || (0..options.len()).filter(|&k| options[k].rejected.is_none());
    if feasible().next().is_none() {
        let here = options
            .iter()
            .any(|o| o.rejected == Some(TargetRejection::Unchanged));
        return Err(if here {
            Skip::NoBetterTarget
        } else {
            Skip::NoFeasibleTarget
        });
    }
    let acceptable = || {
        feasible().filter(|&k| {
            let c = &options[k];
            c.gain >= cfg.min_gain && c.net > 0.0
        })
    };
    if acceptable().next().is_none() {
        let best = feasible()
            .map(|k| &options[k])
            .max_by(|a, b| a.gain.total_cmp(&b.gain));
        return Err(match best {
            Some(c) if c.gain < cfg.min_gain => Skip::BelowMinGain { gain: c.gain },
            // Overload relief counted only for as long as the overload has lasted so far does
            // not pay for the move.
            Some(c)
                if c.horizon_ms < cfg.horizon_ms
                    || (c.relief > 0.0 && c.relief_horizon_ms < cfg.horizon_ms) =>
            {
                Skip::ShortHorizon {
                    horizon_ms: c.horizon_ms,
                    relief_horizon_ms: c.relief_horizon_ms,
                    saving: c.saving,
                    cost: c.cost,
                    contention: c.contention,
                }
            }
            // The locality pays for the migration; the CPU contention it adds does not.
            Some(c) if c.saving > c.cost && c.contention > 0.0 => Skip::SlowerAfter {
                saving: c.saving,
                cost: c.cost,
                contention: c.contention,
            },
            Some(c) => Skip::CostExceedsSaving {
                saving: c.saving,
                cost: c.cost,
            },
            None => Skip::NoFeasibleTarget,
        });
    }
    let full = cfg.migration_budget_mib.saturating_mul(1 << 20);
    let staged = || {
        (budget > 0 && budget >= full / 4)
            .then(|| acceptable().min_by(rank))
            .flatten()
    };
    staged().ok_or_else(|| Skip::Budget {
        need: acceptable()
            .map(|k| options[k].bytes_to_migrate)
            .min()
            .unwrap_or(0),
        remaining: budget,
    })
}

#[cfg(test)]
#[path = "planner_props.rs"]
mod props;

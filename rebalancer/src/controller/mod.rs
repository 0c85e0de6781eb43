//! The dynamic controller's pure core: observations, locality scores, the planner, the
//! actuator seam and the controller's own state.
//!
//! One round: `state.observe_window(&topo, &obs, alpha, period_ms)` updates the smoothed
//! scores, weighing the round's window by its length (and each node's busy history);
//! `plan(..)` (pure, no I/O, cannot fail) proposes moves and explains every decision; `actuator::apply` carries each
//! move out through a [`CgroupWriter`] (the cgroup layer's implementation, or [`FakeCgroups`]
//! in tests) in an order that never leaves a workload without CPUs or memory; then
//! `state.record_move` / `state.record_failure` starts the cooldown.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cpuset::CpuSet;

pub mod actuator;
/// In-memory cgroup writer with failure injection: tests only.
#[cfg(test)]
pub mod fake;
pub mod locality;
pub mod observe;
pub mod plan_types;
pub mod planner;
mod target;

#[cfg(test)]
mod actuator_tests;
#[cfg(test)]
mod migration_tests;
#[cfg(test)]
mod planner_tests;
#[cfg(test)]
mod scale_tests;
#[cfg(test)]
mod smoothing_tests;

pub use actuator::{
    abandon, apply, begin, cut_short, finish, Applied, ApplyError, Begun, CgroupFile,
    CgroupWriteError, CgroupWriter, Rest, Step,
};
#[cfg(test)]
pub use fake::{FakeCgroups, FakeFailure};
pub use locality::{Evidence, EvidenceCounts, Scores};
pub use observe::{CgroupObs, Constraints, NodeObs, Observations};
pub use plan_types::{
    Considered, Decision, Move, Outcome, Plan, Skip, Stage, TargetRejection, Trigger,
};
pub use planner::{plan, plan_scored};

/// What the controller remembers about one cgroup between rounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CgroupState {
    /// EWMA of the locality score, windows weighed by their length; `None` until the first
    /// window with evidence, and again right after a move or a change of the cgroup's nodes
    /// (the old history no longer describes the new placement: see `fold`).
    pub smoothed: Option<f64>,
    /// How much of a whole history `smoothed` rests on, 0..=1: 1 − (1 − α)^T after T periods'
    /// worth of samples since it (re)started. A young history weighs a new window more (the
    /// EWMA's start-up correction): its first window is the score whatever its length.
    /// Checkpoints from before this field was kept read as a whole history.
    #[serde(default = "whole_history", skip_serializing_if = "is_whole_history")]
    pub smoothed_weight: f64,
    /// The nodes of the cgroup's cpuset.cpus, and its cpuset.mems, when it was last
    /// observed: when either has changed since (an operator's pin, an allocator's re-pin),
    /// the history describes another placement and the score restarts (see `fold`). A
    /// change within the same nodes (the shared pool growing or shrinking by a CPU) is not
    /// one. Node sets: a few ids in the checkpoint (absent from older ones: the first round
    /// after an upgrade sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<(CpuSet, CpuSet)>,
    /// When the last move (or failed attempt) started its cooldown.
    pub last_move_ms: Option<u64>,
    /// The cpuset.mems the last move left wider than its target, and that target (see
    /// `daemon::apply`): while the cgroup's mems are still those, the planner reads the
    /// target as where its memory is bound (a tenant that pulls its memory back to a node of
    /// the wide set with its own memory policy is not "bound where it may not run", which
    /// would lift the cooldown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wide_of: Option<(CpuSet, CpuSet)>,
    /// When the move before it did: a move within the cooldown of the one before (its memory
    /// was bound where its threads may no longer run) lets the next wait for its cooldown
    /// (see `planner`), so a tenant who flips its threads' affinity cannot make the daemon
    /// migrate its memory back and forth every round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_before_ms: Option<u64>,
    pub moves: u64,
    /// The cpuset.cpus the last move wrote: when the cgroup's CPUs differ from it, someone else
    /// (the operator) has moved the workload since, and the cooldown no longer applies.
    #[serde(default)]
    pub last_cpus: Option<CpuSet>,
    /// A staged move under way (see [`plan_types::Stage`]): later rounds continue it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<Staging>,
    /// Periods of each kind of evidence folded into `smoothed` since it (re)started: what the
    /// smoothed score rests on (shown by `explain`).
    #[serde(default, skip_serializing_if = "EvidenceCounts::is_empty")]
    pub smoothed_from: EvidenceCounts,
    /// Periods the cgroup has been observed (rounds, of whatever length).
    #[serde(default)]
    pub periods: u64,
    /// Time the cgroup has been observed, ms: how long it has lived so far, which is as long
    /// as the planner counts what a move of it would save (its expected remaining life).
    /// Event rounds' windows are shorter than a period, so rounds do not measure it.
    #[serde(default)]
    pub lived_ms: u64,
}

impl Default for CgroupState {
    fn default() -> CgroupState {
        CgroupState {
            smoothed: None,
            // Read only while `smoothed` is set: a score set by hand is a whole history.
            smoothed_weight: 1.0,
            placement: None,
            last_move_ms: None,
            wide_of: None,
            move_before_ms: None,
            moves: 0,
            last_cpus: None,
            staging: None,
            smoothed_from: EvidenceCounts::default(),
            periods: 0,
            lived_ms: 0,
        }
    }
}

fn whole_history() -> f64 {
    1.0
}

fn is_whole_history(w: &f64) -> bool {
    *w >= 1.0
}

impl CgroupState {
    /// Folds one window's observation of the cgroup in: `window` periods' worth of samples
    /// (an event round's window is shorter than a period, a late round's longer) of `cg`,
    /// placed on the nodes `placed` (its CPUs' nodes and its cpuset.mems; `None`: not
    /// tracked).
    ///
    /// The smoothing weighs samples by time, not by round: a window of `w` periods enters
    /// with weight `1 − (1 − α)^w`, so five rounds a fifth of a period long move the score
    /// exactly as far as one whole period (at α 0.5 a fifth moves it 13 % of the way, a
    /// period 50 %): a sliver of samples does not sway a settled score as a period would. A
    /// history younger than a period is a time-weighted mean of its windows (the EWMA's
    /// start-up correction: a new cgroup's second period weighs 2/3 at α 0.5, not 1/2).
    ///
    /// A cgroup whose nodes changed since it was last observed (an operator's pin, an
    /// allocator's re-pin) restarts its history: the old one describes another placement. The
    /// window that saw the change is mostly from before it (a round's window runs from the
    /// last round), so it seeds the score with no weight: the round that sees it acts on it,
    /// and the next window, all after the change, replaces it. So does a cgroup whose threads
    /// moved themselves to another node since the last window (`shifted`), where its score is
    /// counted from its CPU time: that window is its CPU time where it runs now
    /// ([`CgroupObs::follow_recent`]).
    fn fold(
        &mut self,
        inst: Option<(f64, Evidence)>,
        window: Window,
        placed: Option<(CpuSet, &CpuSet)>,
        shifted: bool,
    ) {
        self.periods = self.periods.saturating_add(1);
        if self.lived_ms == 0 && self.periods > 1 {
            // A checkpoint from before `lived_ms` was kept: its rounds were whole periods.
            self.lived_ms = (self.periods - 1).saturating_mul(window.period_ms);
        }
        self.lived_ms = self.lived_ms.saturating_add(window.ms);
        let mut restarted = false;
        if let Some((nodes, mems)) = placed {
            let same = |(n, m): &(CpuSet, CpuSet)| *n == nodes && m == mems;
            match &self.placement {
                Some(p) if same(p) => {}
                p => {
                    restarted = p.is_some();
                    self.placement = Some((nodes, mems.clone()));
                }
            }
        }
        // Its threads moved themselves to another node (see `CgroupObs::follow_recent`): the
        // history is of the placement they left. Only where the score is counted from its CPU
        // time (re-weighted to where it runs now); measured accesses (hinting faults, PMU
        // events) are the whole window's, and the history still tempers them.
        restarted |= shifted
            && inst
                .is_some_and(|(_, ev)| matches!(ev, Evidence::ShareModel | Evidence::WrittenPages));
        // The history was of the old placement (not cleared by our own move, whose next
        // window is mostly after it).
        let stale = restarted && self.smoothed.is_some();
        if restarted {
            self.smoothed = None;
        }
        if let Some((s, ev)) = inst {
            if self.smoothed.is_none() {
                self.smoothed_from.clear();
            }
            let keep = window.keep;
            let gain = 1.0 - keep;
            let old = self
                .smoothed
                .map_or(0.0, |_| self.smoothed_weight.clamp(0.0, 1.0) * keep);
            let weight = old + gain;
            self.smoothed = Some(match self.smoothed {
                Some(o) if weight > 0.0 => (old * o + gain * s) / weight,
                // No weight at all (alpha 0, or a window of no time): nothing changes.
                Some(o) => o,
                None => s,
            });
            self.smoothed_weight = if stale { 0.0 } else { weight.min(1.0) };
            self.smoothed_from.add(ev);
        }
    }

    /// Milliseconds of cooldown left at `now_ms` for a cgroup with this state whose
    /// cpuset.cpus is now `cpus` (see [`ControllerState::cooldown_remaining`]).
    pub fn cooldown_remaining(&self, cpus: &CpuSet, now_ms: u64, cooldown_ms: u64) -> Option<u64> {
        let last = self.last_move_ms?;
        if self.last_cpus.as_ref().is_some_and(|c| c != cpus) {
            return None;
        }
        let until = last.saturating_add(cooldown_ms);
        (now_ms < until).then(|| until - now_ms)
    }
}

/// Where a staged move is going, and how much was left to move when its last stage ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    pub to_cpus: CpuSet,
    pub toward: CpuSet,
    pub remaining_bytes: u64,
}

/// What one round's observation covers, for [`CgroupState::fold`].
#[derive(Clone, Copy, Debug)]
struct Window {
    ms: u64,
    period_ms: u64,
    /// The weight the smoothed score keeps over the window, (1 − alpha)^(its length in
    /// control periods): the same for every cgroup of a round, so computed once per round.
    keep: f64,
}

/// A value its copies share until one of them is changed (`DerefMut`, which gives that copy
/// its own first when another still holds it). The daemon copies the controller's state out
/// of its lock every round for the planner, which only reads it: the copy is a count, not
/// 10,000 cgroups' states allocated and freed again. Serialised as the value itself.
#[derive(Default, PartialEq)]
pub struct CopyOnWrite<T>(Arc<T>);

impl<T> Clone for CopyOnWrite<T> {
    fn clone(&self) -> Self {
        CopyOnWrite(Arc::clone(&self.0))
    }
}

impl<T> From<T> for CopyOnWrite<T> {
    fn from(v: T) -> Self {
        CopyOnWrite(Arc::new(v))
    }
}

impl<T: Clone> CopyOnWrite<T> {
    /// The value, copied only when another copy still holds it.
    pub fn into_inner(self) -> T {
        Arc::try_unwrap(self.0).unwrap_or_else(|shared| (*shared).clone())
    }
}

impl<T> Deref for CopyOnWrite<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> DerefMut for CopyOnWrite<T> {
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<'a, T> IntoIterator for &'a CopyOnWrite<T>
where
    &'a T: IntoIterator,
{
    type Item = <&'a T as IntoIterator>::Item;
    type IntoIter = <&'a T as IntoIterator>::IntoIter;
    fn into_iter(self) -> Self::IntoIter {
        (*self.0).into_iter()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for CopyOnWrite<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Serialize> Serialize for CopyOnWrite<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for CopyOnWrite<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(CopyOnWrite::from)
    }
}

/// The controller's memory across rounds (serialisable into the checkpoint). Copies share
/// the per-cgroup states until one changes them ([`CopyOnWrite`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ControllerState {
    pub cgroups: CopyOnWrite<BTreeMap<String, CgroupState>>,
    pub rounds: u64,
    pub moves_total: u64,
    pub bytes_migrated_total: u64,
    pub failed_moves_total: u64,
    /// Each node's CPU pressure over the last periods, oldest first, at most
    /// [`PRESSURE_HISTORY`]: its runnable demand per CPU where measured, else its busy share.
    /// How long an overload has lasted so far, and its lowest level over that time, are what
    /// the planner counts the relief of a move off it by (see `target`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_pressure: BTreeMap<u32, std::collections::VecDeque<f64>>,
}

/// Periods of node pressure the controller keeps (at the default 5 s period, 320 s: more than
/// any sane horizon).
pub const PRESSURE_HISTORY: usize = 64;

/// Weight of the newest period in the smoothed locality score (EWMA) once it has a history
/// (see `CgroupState::fold`). Not a key: on the tune half of the generated machines 0.3 and
/// 0.8 decided as 0.5 on every case (BENCHMARKS.md, "Simulator").
pub const EWMA_ALPHA: f64 = 0.5;
/// Most moves per round. Not a key: the migration budget binds first (16 decided as 4 on
/// every case of the tune half).
pub const MAX_MOVES_PER_ROUND: u32 = 4;
/// CPU time one cross-node scheduler migration of a thread costs (its caches refilled across
/// the interconnect), µs: the saving of a move counts the migrations it avoids. Not a key (10
/// and 200 decided as 50 on the tune half; the thread-spread trace rests on it).
pub const CROSS_NODE_MIGRATION_COST_US: f64 = 50.0;
/// A cgroup whose CPUs span several nodes and whose threads cross nodes this often (per
/// second) is a candidate to consolidate its CPUs even when its locality looks fine. Not a key
/// (30 and 1000 decided as 100 on the tune half; the thread-spread trace rests on it).
pub const MIGRATION_TRIGGER_PER_S: f64 = 100.0;

impl ControllerState {
    /// Folds one period into the smoothed scores and forgets cgroups no longer observed.
    pub fn observe(&mut self, obs: &Observations, alpha: f64) {
        self.observe_scored(obs, alpha);
    }

    /// [`ControllerState::observe`], returning the period's instant scores it folded in, for
    /// [`planner::plan_scored`] (which then does not compute them again). `obs` covers one
    /// whole period (see [`ControllerState::observe_window`]).
    /// Placements are not tracked (no restart of a score when a cgroup's nodes change).
    pub fn observe_scored(&mut self, obs: &Observations, alpha: f64) -> Scores {
        let period_ms = obs.period_ns / 1_000_000;
        self.observe_in(None, obs, alpha, period_ms)
    }

    /// [`ControllerState::observe_scored`] as the daemon's rounds run it, on `topo`, for
    /// observations that cover `obs.period_ns` of a control period `period_ms` long: an event
    /// round's shorter window weighs less in the smoothed scores, and a cgroup whose nodes
    /// changed restarts its score (see [`CgroupState::fold`]).
    pub fn observe_window(
        &mut self,
        topo: &crate::topology::Topology,
        obs: &Observations,
        alpha: f64,
        period_ms: u64,
    ) -> Scores {
        self.observe_in(Some(topo), obs, alpha, period_ms)
    }

    fn observe_in(
        &mut self,
        topo: Option<&crate::topology::Topology>,
        obs: &Observations,
        alpha: f64,
        period_ms: u64,
    ) -> Scores {
        fn placed<'c>(
            topo: Option<&crate::topology::Topology>,
            cg: &'c CgroupObs,
        ) -> Option<(CpuSet, &'c CpuSet)> {
            topo.map(|t| (t.nodes_of_cpus(&cg.cpus), &cg.mems))
        }
        let scores = Scores::of(obs);
        let ms = obs.period_ns / 1_000_000;
        let periods = if period_ms == 0 {
            1.0
        } else {
            obs.period_ns as f64 / 1e6 / period_ms as f64
        };
        let alpha = if alpha.is_finite() {
            alpha.clamp(0.0, 1.0)
        } else {
            1.0
        };
        let window = Window {
            ms,
            period_ms,
            keep: (1.0 - alpha).powf(periods.max(0.0)),
        };
        // One ordered walk over the observations (sorted by id, stable: a duplicated id is
        // folded in the order observed) and the old state (a BTreeMap, in id order), instead
        // of a lookup by string per cgroup: the state keeps its keys, only new ones are cloned.
        let mut cgs: Vec<(&CgroupObs, Option<(f64, Evidence)>)> =
            obs.cgroups.iter().zip(scores.0.iter().copied()).collect();
        // The steady state: the same cgroups as last period, updated in place (no rebuild).
        // In the map's key order, so sorted and unique too: one equality per cgroup sees it.
        let same = self.cgroups.len() == cgs.len()
            && self.cgroups.keys().zip(&cgs).all(|(id, cg)| *id == cg.0.id);
        if !same && !cgs.windows(2).all(|w| w[0].0.id < w[1].0.id) {
            cgs.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        }
        if same {
            for ((_, st), (cg, inst)) in self.cgroups.iter_mut().zip(cgs) {
                st.fold(inst, window, placed(topo, cg), cg.shifted);
            }
        } else {
            let mut old = (std::mem::take(&mut self.cgroups).into_inner())
                .into_iter()
                .peekable();
            let mut kept: Vec<(String, CgroupState)> = Vec::with_capacity(cgs.len());
            for (cg, inst) in cgs {
                if kept.last().is_none_or(|(id, _)| *id != cg.id) {
                    while old.next_if(|(id, _)| *id < cg.id).is_some() {}
                    let entry = old
                        .next_if(|(id, _)| *id == cg.id)
                        .unwrap_or_else(|| (cg.id.clone(), CgroupState::default()));
                    kept.push(entry);
                }
                let Some((_, st)) = kept.last_mut() else {
                    continue;
                };
                st.fold(inst, window, placed(topo, cg), cg.shifted);
            }
            drop(old);
            // Sorted and unique: the map is built in one pass.
            self.cgroups = CopyOnWrite::from(kept.into_iter().collect::<BTreeMap<_, _>>());
        }
        for (&n, o) in &obs.nodes {
            let h = self.node_pressure.entry(n).or_default();
            h.push_back(o.pressure());
            while h.len() > PRESSURE_HISTORY {
                h.pop_front();
            }
        }
        self.node_pressure.retain(|n, _| obs.nodes.contains_key(n));
        self.rounds += 1;
        scores
    }

    /// Each node's pressure at its lowest over the last `periods` periods kept (fewer when
    /// fewer were observed): the load that has lasted that long. Empty for 0.
    pub fn lasting_pressure(&self, periods: usize) -> BTreeMap<u32, f64> {
        if periods == 0 {
            return BTreeMap::new();
        }
        self.node_pressure
            .iter()
            .filter_map(|(&n, h)| {
                let low = h.iter().rev().take(periods).copied().reduce(f64::min)?;
                Some((n, low))
            })
            .collect()
    }

    /// A move was applied and migrated `bytes`: cooldown starts (a staged move is continued
    /// without one), history restarts, counters grow.
    pub fn record_move(&mut self, mv: &Move, bytes: u64, now_ms: u64) {
        let st = self.cgroups.entry(mv.cgroup.clone()).or_default();
        st.move_before_ms = st.last_move_ms.replace(now_ms);
        st.wide_of = None;
        st.last_cpus = Some(mv.to_cpus.clone());
        st.smoothed = None;
        st.smoothed_from.clear();
        st.moves += 1;
        st.staging = mv.stage.as_ref().map(|s| Staging {
            to_cpus: mv.to_cpus.clone(),
            toward: s.toward.clone(),
            remaining_bytes: s.remaining_bytes,
        });
        self.moves_total += 1;
        self.bytes_migrated_total = self.bytes_migrated_total.saturating_add(bytes);
    }

    /// A move failed (and was rolled back): cooldown starts too, so it is not retried at once.
    pub fn record_failure(&mut self, cgroup: &str, now_ms: u64) {
        let st = self.cgroups.entry(cgroup.to_string()).or_default();
        st.move_before_ms = st.last_move_ms.replace(now_ms);
        st.staging = None;
        self.failed_moves_total += 1;
    }

    /// Times restored from a checkpoint of an earlier boot (a state dir on disk) can lie in the
    /// future of `now_ms`: they are brought back to `now_ms`, so such a cooldown lasts at most
    /// its length. Returns how many were.
    pub fn clamp_times(&mut self, now_ms: u64) -> usize {
        let mut n = 0;
        for st in self.cgroups.values_mut() {
            if let Some(t) = st.last_move_ms.as_mut().filter(|t| **t > now_ms) {
                *t = now_ms;
                n += 1;
            }
            if let Some(t) = st.move_before_ms.as_mut().filter(|t| **t > now_ms) {
                *t = now_ms;
            }
        }
        n
    }

    /// Milliseconds of cooldown left for `cgroup` (whose cpuset.cpus is now `cpus`) at
    /// `now_ms`, or `None` when it may move — also when its CPUs were changed by someone else
    /// since our last move (the situation the cooldown protected is gone).
    pub fn cooldown_remaining(
        &self,
        cgroup: &str,
        cpus: &CpuSet,
        now_ms: u64,
        cooldown_ms: u64,
    ) -> Option<u64> {
        self.cgroups
            .get(cgroup)?
            .cooldown_remaining(cpus, now_ms, cooldown_ms)
    }
}

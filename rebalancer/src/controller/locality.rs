//! Locality scores: how much of a cgroup's CPU time runs next to its memory.
//!
//! The instant score of a period is the remote ratio measured by hinting faults or PMU events
//! when present (`1 − remote / (local + remote)`; only when *both* sides were counted — a
//! remote count without a local one is no ratio, never "0% local"), and otherwise the share
//! model `Σ_node cpu_share × mem_share` — weighted by the bytes written per node when
//! soft-dirty sampling measured them (`crate::written`), by resident bytes otherwise. Scores are smoothed with an EWMA (windows weighed by their
//! length, restarted when a cgroup's nodes change: `CgroupState::fold`) so one noisy period
//! of a settled placement does not trigger a move. [`expected_after`] estimates the share-model score after a move to a node set.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::observe::CgroupObs;
use crate::cpuset::CpuSet;

/// Where an instant score came from (shown by `explain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Evidence {
    /// NUMA hinting faults (task_numa_fault kprobe; only while AutoNUMA runs).
    HintingFaults,
    /// Local and remote DRAM PMU events (both sides counted).
    Pmu,
    /// CPU share × share of the period's written bytes per node (soft-dirty sampling: the
    /// pages it really writes, not all it holds).
    WrittenPages,
    /// CPU share × memory share per node (assumes every page is touched alike).
    ShareModel,
}

impl Evidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::HintingFaults => "hinting-faults",
            Evidence::Pmu => "pmu",
            Evidence::WrittenPages => "written-pages",
            Evidence::ShareModel => "share-model",
        }
    }
}

impl Evidence {
    /// Every kind, in the order of `Ord` (the order `EvidenceCounts` serialises them in).
    pub const ALL: [Evidence; 4] = [
        Evidence::HintingFaults,
        Evidence::Pmu,
        Evidence::WrittenPages,
        Evidence::ShareModel,
    ];
}

/// Periods counted per kind of evidence (what a smoothed score rests on): one counter per
/// kind, inline, so the planner's per-cgroup decision copies it without a heap allocation.
/// Serialised as the map of the kinds counted (`{"share-model": 3}`), in `Evidence` order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvidenceCounts([u32; 4]);

impl EvidenceCounts {
    /// Periods counted for `ev`, `None` when none were.
    pub fn get(&self, ev: &Evidence) -> Option<&u32> {
        Some(&self.0[*ev as usize]).filter(|&&c| c > 0)
    }

    /// One more period of `ev`.
    pub fn add(&mut self, ev: Evidence) {
        let c = &mut self.0[ev as usize];
        *c = c.saturating_add(1);
    }

    pub fn clear(&mut self) {
        self.0 = [0; 4];
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&c| c == 0)
    }

    /// The kinds counted, with their periods, in `Evidence` order.
    pub fn iter(&self) -> impl Iterator<Item = (Evidence, u32)> + '_ {
        Evidence::ALL
            .into_iter()
            .map(|e| (e, self.0[e as usize]))
            .filter(|&(_, c)| c > 0)
    }
}

impl FromIterator<(Evidence, u32)> for EvidenceCounts {
    fn from_iter<I: IntoIterator<Item = (Evidence, u32)>>(it: I) -> Self {
        let mut out = EvidenceCounts::default();
        for (e, c) in it {
            out.0[e as usize] = c;
        }
        out
    }
}

impl Serialize for EvidenceCounts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for EvidenceCounts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<Evidence, u32>::deserialize(d)?
            .into_iter()
            .collect())
    }
}

/// One period's instant score of every observed cgroup ([`instant`]), index for index with
/// `Observations::cgroups`: what `ControllerState::observe_scored` folded in, handed to
/// `plan_scored` so the round computes each cgroup's score once, not twice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scores(pub(super) Vec<Option<(f64, Evidence)>>);

impl Scores {
    /// The instant score of each of `obs`'s cgroups, in their order.
    pub fn of(obs: &super::Observations) -> Self {
        Scores(obs.cgroups.iter().map(instant).collect())
    }

    /// Whether these can be `obs`'s scores (one per cgroup).
    pub fn fits(&self, obs: &super::Observations) -> bool {
        self.0.len() == obs.cgroups.len()
    }
}

/// The instant locality of a cgroup in 0..=1, or `None` when the period holds no evidence
/// (no CPU time, or no memory and no fault/PMU counts).
pub fn instant(cg: &CgroupObs) -> Option<(f64, Evidence)> {
    if let Some(r) = ratio(cg.local_faults, cg.remote_faults) {
        return Some((r, Evidence::HintingFaults));
    }
    if let Some(r) = ratio(cg.local_events, cg.remote_events) {
        return Some((r, Evidence::Pmu));
    }
    let written: u64 = cg
        .written_bytes_per_node
        .values()
        .fold(0u64, |a, &b| a.saturating_add(b));
    if written >= crate::written::MIN_WRITTEN_BYTES {
        let on = |n: u32| cg.written_bytes_per_node.get(&n).copied().unwrap_or(0);
        if let Some(s) = share_model(&cg.cpu_ns_per_node, on, written) {
            return Some((s, Evidence::WrittenPages));
        }
    }
    share_model(&cg.cpu_ns_per_node, |n| cg.mem_on(n), cg.total_mem())
        .map(|s| (s, Evidence::ShareModel))
}

/// `1 − remote / (local + remote)`; `None` unless both sides were counted and some access was.
fn ratio(local: Option<u64>, remote: Option<u64>) -> Option<f64> {
    let (local, remote) = (local?, remote?);
    let total = local.saturating_add(remote);
    if total == 0 {
        return None;
    }
    Some(1.0 - remote as f64 / total as f64)
}

/// `Σ cpu_share(n) × mem_share(n)`; `None` without CPU time or memory.
fn share_model(
    cpu: &BTreeMap<u32, u64>,
    mem_on: impl Fn(u32) -> u64,
    mem_total: u64,
) -> Option<f64> {
    let cpu_total: u64 = cpu.values().fold(0u64, |a, &b| a.saturating_add(b));
    if cpu_total == 0 || mem_total == 0 {
        return None;
    }
    let s: f64 = cpu
        .iter()
        .map(|(&n, &ns)| (ns as f64 / cpu_total as f64) * (mem_on(n) as f64 / mem_total as f64))
        .sum();
    Some(s.clamp(0.0, 1.0))
}

/// Expected share-model locality after the cgroup runs on `target` nodes with `cpuset.mems =
/// target`. CPU time spreads over the target like today's time on those nodes (uniformly when
/// it has none there); memory already on the target stays, memory outside it migrates and lands
/// in proportion to the CPU time (first-touch-like). One node gives 1.0.
pub fn expected_after(cg: &CgroupObs, target: &CpuSet) -> f64 {
    let k = target.len();
    if k == 0 {
        return 0.0;
    }
    if k == 1 {
        return 1.0;
    }
    let on_target = target.iter().fold(0u64, |a, n| {
        a.saturating_add(cg.cpu_ns_per_node.get(&n).copied().unwrap_or(0))
    });
    let cpu_share = |n: u32| -> f64 {
        if on_target == 0 {
            1.0 / k as f64
        } else {
            cg.cpu_ns_per_node.get(&n).copied().unwrap_or(0) as f64 / on_target as f64
        }
    };
    let total = cg.total_mem();
    if total == 0 {
        return target.iter().map(|n| cpu_share(n).powi(2)).sum();
    }
    let inside = target
        .iter()
        .fold(0u64, |a, n| a.saturating_add(cg.mem_on(n)));
    let outside = total.saturating_sub(inside);
    target
        .iter()
        .map(|n| {
            let c = cpu_share(n);
            let m = (cg.mem_on(n) as f64 + outside as f64 * c) / total as f64;
            c * m
        })
        .sum::<f64>()
        .clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cg(cpu: &[(u32, u64)], mem: &[(u32, u64)]) -> CgroupObs {
        CgroupObs {
            id: "t".into(),
            cpu_ns_per_node: cpu.iter().copied().collect(),
            mem_bytes_per_node: mem.iter().copied().collect(),
            ..Default::default()
        }
    }

    fn check(c: &CgroupObs, want: Option<(f64, Evidence)>) {
        let got = instant(c);
        match (got, want) {
            (None, None) => {}
            (Some((g, ge)), Some((w, we))) => {
                assert!(
                    (g - w).abs() < 1e-9 && ge == we,
                    "{c:?}: got {g} {ge:?}, want {w} {we:?}"
                )
            }
            _ => panic!("{c:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn instant_scores() {
        use Evidence::*;
        check(&cg(&[(0, 100)], &[(0, 10)]), Some((1.0, ShareModel)));
        check(&cg(&[(0, 100)], &[(1, 10)]), Some((0.0, ShareModel)));
        check(
            &cg(&[(0, 50), (1, 50)], &[(0, 10), (1, 30)]),
            Some((0.5, ShareModel)),
        );
        check(
            &cg(&[(0, 75), (1, 25)], &[(0, 10)]),
            Some((0.75, ShareModel)),
        );
        check(&cg(&[], &[(0, 10)]), None);
        check(&cg(&[(0, 1)], &[]), None);
        let mut f = cg(&[(0, 100)], &[(1, 10)]);
        f.local_faults = Some(30);
        f.remote_faults = Some(10);
        check(&f, Some((0.75, HintingFaults)));
        f.local_faults = Some(0);
        f.remote_faults = Some(0);
        f.local_events = Some(9);
        f.remote_events = Some(1);
        check(&f, Some((0.9, Pmu)));
        f.local_events = None;
        check(&f, Some((0.0, ShareModel))); // a remote count alone is no PMU ratio
        let mut h = cg(&[(0, 100)], &[(0, 10)]);
        h.hugepage_bytes_per_node.insert(1, 30);
        check(&h, Some((0.25, ShareModel)));
    }

    /// The PMU ratio from sampled DRAM events, each side scaled by its own period.
    #[test]
    fn pmu_scores_local_remote_and_never_zero_from_one_side() {
        use crate::ebpf::pmu::{scale, LOCAL_PERIOD, REMOTE_PERIOD};
        // Memory all on node 1, CPU on node 0: the share model says 0.
        let mut c = cg(&[(0, 100)], &[(1, 10)]);
        // A local workload: 990 local samples, 10 remote.
        let (l, r) = scale(false, 990, 10);
        (c.local_events, c.remote_events) = (Some(l), Some(r));
        let want =
            1.0 - (10 * REMOTE_PERIOD) as f64 / (990 * LOCAL_PERIOD + 10 * REMOTE_PERIOD) as f64;
        check(&c, Some((want, Evidence::Pmu)));
        assert!(want > 0.99);
        // A remote one: 10 local, 990 remote.
        let (l, r) = scale(false, 10, 990);
        (c.local_events, c.remote_events) = (Some(l), Some(r));
        let (got, _) = instant(&c).unwrap();
        assert!(got < 0.02, "{got}");
        // Only remote samples, no local counter: never 0 from the PMU. Where memory and CPU
        // are together the share model scores it local; without memory there is no score.
        let mut only = cg(&[(0, 100)], &[(0, 10)]);
        only.remote_events = Some(990 * REMOTE_PERIOD);
        check(&only, Some((1.0, Evidence::ShareModel)));
        only.mem_bytes_per_node.clear();
        check(&only, None);
        // Both counted but nothing happened this period: no PMU score either.
        let mut idle = cg(&[(0, 100)], &[(0, 10)]);
        (idle.local_events, idle.remote_events) = (Some(0), Some(0));
        check(&idle, Some((1.0, Evidence::ShareModel)));
    }

    /// A hot set that is a minority of the memory: 32 MiB written on node 1, 224 MiB idle on
    /// node 0, threads on node 0. Resident memory says 0.875 local; the written pages say 0.
    #[test]
    fn written_pages_weight_the_share_model() {
        const MIB: u64 = 1 << 20;
        let mut c = cg(&[(0, 100)], &[(0, 224 * MIB), (1, 32 * MIB)]);
        check(&c, Some((0.875, Evidence::ShareModel)));
        c.written_bytes_per_node = [(1, 32 * MIB)].into_iter().collect();
        check(&c, Some((0.0, Evidence::WrittenPages)));
        c.written_bytes_per_node = [(0, 8 * MIB), (1, 24 * MIB)].into_iter().collect();
        check(&c, Some((0.25, Evidence::WrittenPages)));
        // Too little written to say anything: the share model again.
        c.written_bytes_per_node = [(1, crate::written::MIN_WRITTEN_BYTES - 1)]
            .into_iter()
            .collect();
        check(&c, Some((0.875, Evidence::ShareModel)));
    }

    /// Serialised as the map it replaced: only the kinds counted, in `Evidence` order.
    #[test]
    fn evidence_counts_serialise_as_a_map() {
        let mut c = EvidenceCounts::default();
        assert!(c.is_empty());
        assert_eq!(serde_json::to_string(&c).unwrap(), "{}");
        c.add(Evidence::ShareModel);
        c.add(Evidence::ShareModel);
        c.add(Evidence::HintingFaults);
        let want = BTreeMap::from([(Evidence::HintingFaults, 1u32), (Evidence::ShareModel, 2)]);
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, serde_json::to_string(&want).unwrap());
        assert_eq!(json, r#"{"hinting-faults":1,"share-model":2}"#);
        assert_eq!(serde_json::from_str::<EvidenceCounts>(&json).unwrap(), c);
        assert_eq!(c.get(&Evidence::ShareModel), Some(&2));
        assert_eq!(c.get(&Evidence::Pmu), None);
        c.clear();
        assert!(c.is_empty());
    }

    #[test]
    fn expected_after_a_move() {
        let c = cg(&[(0, 50), (1, 50)], &[(0, 10), (1, 10), (2, 20)]);
        assert_eq!(expected_after(&c, &CpuSet::from_iter([3])), 1.0);
        // two nodes, CPU 50/50, memory ends 50/50 → 0.5
        assert!((expected_after(&c, &CpuSet::from_iter([0, 1])) - 0.5).abs() < 1e-9);
        assert_eq!(expected_after(&c, &CpuSet::new()), 0.0);
    }
}

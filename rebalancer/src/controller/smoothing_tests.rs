//! The smoothed locality score across rounds of any length: weighed by time, restarted by a
//! change of placement, and how long a cgroup has lived.

use super::*;
use crate::topology::{Topology, TopologyBuilder};

const MIB: u64 = 1 << 20;
const PERIOD_MS: u64 = 2000;

/// One window of `ms` in which cgroup "w", on `cpus` with its memory on node 0, ran on node
/// `ran_on`: instant locality 1.0 on node 0, 0.0 on node 1.
fn window(ms: u64, ran_on: u32, cpus: &str) -> Observations {
    Observations {
        period_ns: ms * 1_000_000,
        cgroups: vec![CgroupObs {
            id: "w".into(),
            cpu_ns_per_node: [(ran_on, ms * 500_000)].into_iter().collect(),
            mem_bytes_per_node: [(0, 256 * MIB)].into_iter().collect(),
            cpus: CpuSet::parse(cpus).unwrap(),
            mems: CpuSet::parse("0-1").unwrap(),
            ..Default::default()
        }],
        nodes: BTreeMap::new(),
        reserved_cpus: CpuSet::new(),
    }
}

/// 2 nodes × 4 CPUs: node 0 = CPUs 0-3, node 1 = CPUs 4-7.
fn machine() -> Topology {
    TopologyBuilder {
        cores_per_node: 4,
        threads_per_core: 1,
        ..Default::default()
    }
    .build()
}

fn fold(st: &mut ControllerState, ms: u64, ran_on: u32, cpus: &str) -> f64 {
    let obs = window(ms, ran_on, cpus);
    st.observe_window(&machine(), &obs, 0.5, PERIOD_MS);
    st.cgroups["w"].smoothed.unwrap()
}

/// A settled score, local for a long while.
fn settled() -> ControllerState {
    let mut st = ControllerState::default();
    for _ in 0..40 {
        assert_eq!(fold(&mut st, PERIOD_MS, 0, "0-7"), 1.0);
    }
    st
}

/// An event round's window a tenth of a period long was folded in
/// like a whole period's. Now a window weighs by its length: five fifths of a period move
/// the score exactly as far as one whole period, and one fifth far less.
#[test]
fn a_short_window_weighs_by_its_length() {
    let mut whole = settled();
    let one = fold(&mut whole, PERIOD_MS, 1, "0-7");
    assert!(
        (one - 0.5).abs() < 1e-9,
        "alpha 0.5 for a whole period: {one}"
    );
    let mut fifths = settled();
    let first = fold(&mut fifths, PERIOD_MS / 5, 1, "0-7");
    assert!(first > 0.85 && first < 0.9, "a fifth of a period: {first}");
    for _ in 0..4 {
        fold(&mut fifths, PERIOD_MS / 5, 1, "0-7");
    }
    let five = fifths.cgroups["w"].smoothed.unwrap();
    assert!((five - one).abs() < 1e-9, "{five} vs {one}");
    // A late round (two periods' worth) weighs as two periods.
    let mut late = settled();
    let two = fold(&mut late, 2 * PERIOD_MS, 1, "0-7");
    assert!((two - 0.25).abs() < 1e-9, "{two}");
}

/// An operator's pin (the cgroup's CPUs moved to other nodes since the last round) restarts
/// the score from the new window, however short: the old history describes another
/// placement, and the pin's event round acts on it at once.
#[test]
fn a_change_of_placement_restarts_the_score() {
    let mut st = settled();
    assert_eq!(fold(&mut st, PERIOD_MS / 10, 1, "4-7"), 0.0);
    // cpuset.mems too.
    let mut st = settled();
    let mut obs = window(PERIOD_MS / 10, 1, "0-7");
    obs.cgroups[0].mems = CpuSet::parse("0").unwrap();
    st.observe_window(&machine(), &obs, 0.5, PERIOD_MS);
    assert_eq!(st.cgroups["w"].smoothed, Some(0.0));
    // The same nodes again, or other CPUs of the same nodes (a shared pool that grew or
    // shrank by a CPU): no restart.
    let mut st = settled();
    assert!(fold(&mut st, PERIOD_MS / 10, 1, "0-7") > 0.9);
    let s = fold(&mut st, PERIOD_MS / 10, 0, "0-6");
    assert!(s > 0.9 && s < 1.0, "{s}");
    // Whole periods, placements not tracked (`observe`): as before, no restart.
    let mut st = settled();
    st.observe(&window(PERIOD_MS, 1, "4-7"), 0.5);
    let s = st.cgroups["w"].smoothed.unwrap();
    assert!((s - 0.5).abs() < 1e-9, "{s}");
}

/// A cgroup whose threads moved themselves to other nodes within the window (no cpuset
/// change: `CgroupObs::follow_recent` set `shifted`) restarts its score like a re-pin: the
/// round that sees the move acts on the new placement, not on an average with the old one.
#[test]
fn a_workload_that_moved_itself_restarts_its_score() {
    let mut st = settled();
    let mut obs = window(PERIOD_MS / 10, 1, "0-7");
    obs.cgroups[0].shifted = true;
    st.observe_window(&machine(), &obs, 0.5, PERIOD_MS);
    assert_eq!(st.cgroups["w"].smoothed, Some(0.0));
    assert_eq!(
        st.cgroups["w"].smoothed_weight, 0.0,
        "seeded with no weight: the next window replaces it"
    );
    assert_eq!(fold(&mut st, PERIOD_MS / 2, 1, "0-7"), 0.0);
    // Not shifted: the same short window moves a settled score only a little.
    let mut st = settled();
    assert!(fold(&mut st, PERIOD_MS / 10, 1, "0-7") > 0.9);
    // Measured accesses (hinting faults here) are the whole window's, not
    // re-weighted to where its threads run now: the history still tempers them.
    let mut st = settled();
    let mut obs = window(PERIOD_MS / 10, 1, "0-7");
    obs.cgroups[0].shifted = true;
    obs.cgroups[0].remote_faults = Some(900);
    obs.cgroups[0].local_faults = Some(100);
    st.observe_window(&machine(), &obs, 0.5, PERIOD_MS);
    assert_eq!(
        st.cgroups["w"].smoothed_from.get(&Evidence::HintingFaults),
        Some(&1)
    );
    let s = st.cgroups["w"].smoothed.unwrap();
    assert!(s > 0.9, "not restarted: {s}");
}

/// The window that saw the pin runs from the round before, mostly before the pin,
/// so it seeds the restarted score with no weight: the next window, all after the pin,
/// replaces it however short (a short follow-up must not be outweighed by the seed).
#[test]
fn the_window_that_saw_a_change_does_not_outweigh_the_next() {
    let mut st = settled();
    // The pin came at the end of a whole period: its samples were local.
    assert_eq!(fold(&mut st, PERIOD_MS, 0, "4-7"), 1.0);
    // The follow-up, half a period, all remote: the score is its.
    assert_eq!(fold(&mut st, PERIOD_MS / 2, 1, "4-7"), 0.0);
    // From then on a young history: time-weighted, the newest a little more.
    let s = fold(&mut st, PERIOD_MS / 2, 0, "4-7");
    assert!(s > 0.55 && s < 0.6, "{s}");
}

/// How long a cgroup has lived (the horizon of a move's saving) adds windows' lengths, not
/// rounds: ten event rounds of 200 ms are 2 s, not ten periods. A checkpoint written before
/// `lived_ms` was kept counts its rounds as periods.
#[test]
fn lived_time_adds_windows_not_rounds() {
    let mut st = ControllerState::default();
    for _ in 0..10 {
        fold(&mut st, 200, 0, "0-7");
    }
    assert_eq!(st.cgroups["w"].lived_ms, 2000);
    assert_eq!(st.cgroups["w"].periods, 10);
    let json = r#"{"cgroups":{"w":{"smoothed":0.5,"last_move_ms":null,"moves":0,"periods":5}},
        "rounds":5,"moves_total":0,"bytes_migrated_total":0,"failed_moves_total":0}"#;
    let mut old: ControllerState = serde_json::from_str(json).unwrap();
    assert_eq!(old.cgroups["w"].smoothed_weight, 1.0, "a whole history");
    old.observe_window(&machine(), &window(PERIOD_MS, 0, "0-7"), 0.5, PERIOD_MS);
    assert_eq!(old.cgroups["w"].lived_ms, 6 * PERIOD_MS);
    assert_eq!(
        old.cgroups["w"].smoothed,
        Some(0.75),
        "alpha 0.5 on a whole history"
    );
}

/// The nodes with a CPU in a set (the placement's key).
#[test]
fn nodes_of_cpus_are_the_nodes_the_set_touches() {
    let t = machine();
    assert_eq!(
        t.nodes_of_cpus(&CpuSet::parse("0-7").unwrap()),
        CpuSet::parse("0-1").unwrap()
    );
    assert_eq!(
        t.nodes_of_cpus(&CpuSet::parse("3").unwrap()),
        CpuSet::parse("0").unwrap()
    );
    assert_eq!(
        t.nodes_of_cpus(&CpuSet::parse("4,7").unwrap()),
        CpuSet::parse("1").unwrap()
    );
    assert_eq!(t.nodes_of_cpus(&CpuSet::new()), CpuSet::new());
}

/// A re-pin seen in a window with no evidence clears the old score (it does not
/// stay as the new placement's); after the daemon's own move (the score already cleared by
/// `record_move`), the next window is mostly after the move and keeps its weight.
#[test]
fn a_restart_in_an_idle_window_and_after_our_own_move() {
    let mut st = settled();
    let mut idle = window(PERIOD_MS, 1, "4-7");
    idle.cgroups[0].cpu_ns_per_node.clear();
    idle.cgroups[0].mem_bytes_per_node.clear();
    st.observe_window(&machine(), &idle, 0.5, PERIOD_MS);
    assert_eq!(
        st.cgroups["w"].smoothed, None,
        "the old placement's score is gone"
    );
    // Our own move: record_move clears the score, the next window seeds it with its weight.
    let mut st = settled();
    let mv = Move {
        cgroup: "w".into(),
        from_cpus: CpuSet::parse("0-7").unwrap(),
        to_cpus: CpuSet::parse("4-7").unwrap(),
        from_mems: CpuSet::parse("0-1").unwrap(),
        to_mems: CpuSet::parse("0-1").unwrap(),
        bytes_to_migrate: 0,
        reason: Trigger::PoorLocality,
        locality_before: 0.0,
        locality_after: 1.0,
        net: 1.0,
        stage: None,
    };
    st.record_move(&mv, 0, 1);
    assert_eq!(fold(&mut st, PERIOD_MS, 1, "4-7"), 0.0);
    assert!((st.cgroups["w"].smoothed_weight - 0.5).abs() < 1e-9);
    // alpha 0: nothing ever changes a score once seeded.
    let mut st = ControllerState::default();
    st.observe_window(&machine(), &window(PERIOD_MS, 0, "0-7"), 0.0, PERIOD_MS);
    st.observe_window(&machine(), &window(PERIOD_MS, 1, "0-7"), 0.0, PERIOD_MS);
    assert_eq!(st.cgroups["w"].smoothed, Some(1.0));
}

//! Scheduler migrations in the plan: a cgroup whose threads cross nodes is a candidate to
//! consolidate its CPUs, and a move's saving counts the migrations it avoids.

use super::*;
use crate::config::ControllerConfig;
use crate::cpuset::CpuSet;
use crate::topology::{Topology, TopologyBuilder};

const MIB: u64 = 1 << 20;
const SEC: u64 = 1_000_000_000;

/// 2 nodes × 4 CPUs: node 0 = CPUs 0-3, node 1 = CPUs 4-7.
fn machine() -> Topology {
    TopologyBuilder {
        sockets: 2,
        nodes_per_socket: 1,
        cores_per_node: 4,
        threads_per_core: 1,
        ..Default::default()
    }
    .build()
}

/// A shared (admitted) cgroup on every CPU: 1.0 CPU on node 0, 0.2 on node 1, all memory on
/// node 0 (share-model locality 0.83, above the 0.8 threshold), `crossings` in the period.
fn spread(crossings: u64) -> CgroupObs {
    CgroupObs {
        id: "w".into(),
        cpu_ns_per_node: [(0, SEC), (1, SEC / 5)].into_iter().collect(),
        mem_bytes_per_node: [(0, 256 * MIB)].into_iter().collect(),
        cross_node_migrations: crossings,
        cpus: CpuSet::parse("0-7").unwrap(),
        mems: CpuSet::parse("0-1").unwrap(),
        ..Default::default()
    }
}

fn plan_one(cg: CgroupObs, cfg: &ControllerConfig) -> Plan {
    let obs = Observations {
        period_ns: SEC,
        cgroups: vec![cg],
        nodes: (0..2)
            .map(|n| {
                (
                    n,
                    NodeObs {
                        cpu_busy: 0.2,
                        free_bytes: 8 << 30,
                        free_hugepage_bytes: 0,
                        runnable: None,
                    },
                )
            })
            .collect(),
        reserved_cpus: CpuSet::new(),
    };
    let mut st = ControllerState::default();
    st.observe(&obs, crate::controller::EWMA_ALPHA);
    plan(&machine(), &obs, &st, cfg, 1_000_000)
}

#[test]
fn crossing_threads_make_a_well_placed_cgroup_a_candidate() {
    let cfg = ControllerConfig::default();
    let quiet = plan_one(spread(10), &cfg);
    assert_eq!(quiet.decision("w").unwrap().outcome, Outcome::Healthy);
    assert!(quiet.moves.is_empty());

    let busy = plan_one(spread(2000), &cfg);
    let d = busy.decision("w").unwrap();
    assert_eq!(d.trigger, Some(Trigger::Migrating { per_s: 2000.0 }));
    assert_eq!(busy.moves.len(), 1, "{d:?}");
    let mv = &busy.moves[0];
    assert_eq!(
        mv.to_cpus,
        CpuSet::parse("0-3").unwrap(),
        "onto the memory's node"
    );
    assert_eq!(mv.to_mems, CpuSet::parse("0").unwrap());
    assert_eq!(mv.bytes_to_migrate, 0);
    let c = d
        .considered
        .iter()
        .find(|c| c.nodes == CpuSet::parse("0").unwrap())
        .unwrap();
    assert_eq!(c.migrations_avoided_per_s, 2000.0);
    // 2000/s × 50 µs over a 1.2-CPU demand, on top of the locality gain 1 − 0.83
    let points = 2000.0 * 50e-6 / 1.2;
    assert!((c.gain - (1.0 - 1.0 / 1.2) - points).abs() < 1e-9, "{c:?}");
}

#[test]
fn the_operators_cpus_are_never_consolidated_for_migrations() {
    let mut cg = spread(5000);
    cg.constraints.keep_cpus = true;
    let p = plan_one(cg, &ControllerConfig::default());
    assert!(p.moves.is_empty(), "{:?}", p.decision("w"));
    assert_eq!(p.decision("w").unwrap().trigger, None);
}

#[test]
fn saving_counts_migrations_avoided() {
    // Poor locality (memory on node 1): the move is a candidate either way; the migrations
    // avoided add their CPU time to the saving of the one-node target and nothing to a
    // two-node one.
    let at = |crossings| {
        let mut cg = spread(crossings);
        cg.mem_bytes_per_node = [(1, 256 * MIB)].into_iter().collect();
        let p = plan_one(cg, &ControllerConfig::default());
        p.decision("w").unwrap().considered.clone()
    };
    let (none, many) = (at(0), at(1000));
    let one = CpuSet::parse("1").unwrap();
    let saving = |v: &[Considered], n: &CpuSet| v.iter().find(|c| &c.nodes == n).unwrap().saving;
    // Observed for one 1 s period: its saving is counted for the 1 s it has lived so far.
    let lived = many.iter().find(|c| c.nodes == one).unwrap().horizon_ms;
    assert_eq!(lived, 1000, "{many:?}");
    let want = 1000.0 * 50e-6 * lived as f64 / 1000.0;
    assert!(
        (saving(&many, &one) - saving(&none, &one) - want).abs() < 1e-9,
        "{many:?}"
    );
    for c in many.iter().filter(|c| c.nodes.len() == 2) {
        assert_eq!(c.migrations_avoided_per_s, 0.0, "{c:?}");
    }
}

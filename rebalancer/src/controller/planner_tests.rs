//! Planner tests: one table of synthetic scenarios through `check()`, a multi-round simulation
//! for hysteresis, and properties over random observations on an 8-node machine.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::config::ControllerConfig;
use crate::cpuset::CpuSet;
use crate::topology::{Topology, TopologyBuilder};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const PERIOD: u64 = 1_000_000_000;

/// 4 nodes × 4 cores × 2 threads: node n has CPUs 4n..4n+3 and 16+4n..16+4n+3.
fn machine() -> Topology {
    TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 4,
        cores_per_node: 4,
        threads_per_core: 2,
        ..Default::default()
    }
    .build()
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

/// A cgroup: CPU demand per node (in CPUs), memory per node (MiB), current cpus and mems.
fn cg(id: &str, cpu: &[(u32, f64)], mem_mib: &[(u32, u64)], cpus: &str, mems: &str) -> CgroupObs {
    CgroupObs {
        id: id.into(),
        cpu_ns_per_node: cpu
            .iter()
            .map(|&(n, c)| (n, (c * PERIOD as f64) as u64))
            .collect(),
        mem_bytes_per_node: mem_mib.iter().map(|&(n, m)| (n, m * MIB)).collect(),
        cpus: set(cpus),
        mems: set(mems),
        ..Default::default()
    }
}

/// `c` with its own wait on the run queues measured: `cpus` CPUs' worth per node.
fn waited(mut c: CgroupObs, wait: &[(u32, f64)]) -> CgroupObs {
    c.wait_ns_per_node = wait
        .iter()
        .map(|&(n, w)| (n, (w * PERIOD as f64) as u64))
        .collect();
    c
}

fn world(cgroups: Vec<CgroupObs>) -> Observations {
    Observations {
        period_ns: PERIOD,
        cgroups,
        nodes: (0..4)
            .map(|n| {
                (
                    n,
                    NodeObs {
                        cpu_busy: 0.3,
                        free_bytes: 32 * GIB,
                        free_hugepage_bytes: 0,
                        runnable: None,
                    },
                )
            })
            .collect(),
        reserved_cpus: CpuSet::new(),
    }
}

fn kind(o: &Outcome) -> String {
    match o {
        Outcome::Moved { .. } => "moved".into(),
        Outcome::Healthy => "healthy".into(),
        Outcome::NoData => "no-data".into(),
        Outcome::Skipped(s) => {
            let v = serde_json::to_value(s).unwrap();
            format!("skip:{}", v["kind"].as_str().unwrap())
        }
    }
}

struct Case {
    name: &'static str,
    obs: Observations,
    state: ControllerState,
    cfg: ControllerConfig,
    now: u64,
    /// (cgroup, to_cpus, to_mems, MiB to migrate), in plan order.
    moves: &'static [(&'static str, &'static str, &'static str, u64)],
    /// (cgroup, outcome kind)
    outcomes: &'static [(&'static str, &'static str)],
}

fn check(c: Case) {
    let p = plan(&machine(), &c.obs, &c.state, &c.cfg, c.now);
    let got: Vec<(String, String, String, u64)> = p
        .moves
        .iter()
        .map(|m| {
            (
                m.cgroup.clone(),
                m.to_cpus.to_string(),
                m.to_mems.to_string(),
                m.bytes_to_migrate / MIB,
            )
        })
        .collect();
    let want: Vec<(String, String, String, u64)> = c
        .moves
        .iter()
        .map(|&(a, b, d, e)| (a.into(), b.into(), d.into(), e))
        .collect();
    assert_eq!(got, want, "{}: moves\n{:#?}", c.name, p.decisions);
    for &(id, k) in c.outcomes {
        let d = p
            .decision(id)
            .unwrap_or_else(|| panic!("{}: no decision for {id}", c.name));
        assert_eq!(kind(&d.outcome), k, "{}: {id}: {d:#?}", c.name);
    }
    assert_eq!(p.decisions.len(), c.obs.cgroups.len(), "{}", c.name);
    // Same plan whatever the input order.
    let mut rev = c.obs.clone();
    rev.cgroups.reverse();
    assert_eq!(
        plan(&machine(), &rev, &c.state, &c.cfg, c.now),
        p,
        "{}: order",
        c.name
    );
}

/// The defaults.
fn cfg() -> ControllerConfig {
    ControllerConfig::default()
}

fn moved_at(id: &str, at: u64) -> ControllerState {
    let mut s = ControllerState::default();
    s.cgroups.entry(id.into()).or_default().last_move_ms = Some(at);
    s
}

fn exclusive(mut c: CgroupObs) -> CgroupObs {
    c.constraints.exclusive = true;
    c
}

#[test]
fn planner_rules() {
    let base = |name, obs, moves, outcomes| Case {
        name,
        obs,
        state: ControllerState::default(),
        cfg: cfg(),
        now: 100_000,
        moves,
        outcomes,
    };
    check(base(
        "poor locality: to the node holding most memory, migrating the rest",
        world(vec![cg(
            "a",
            &[(0, 1.0), (1, 1.0)],
            &[(0, 100), (1, 900)],
            "0-7,16-23",
            "0-1",
        )]),
        &[("a", "4-7,20-23", "1", 100)],
        &[("a", "moved")],
    ));
    check(base(
        "memory-heavy, CPU on the wrong node: move the CPUs, migrate nothing",
        world(vec![cg("a", &[(0, 2.0)], &[(1, 8192)], "0-3,16-19", "0-1")]),
        &[("a", "4-7,20-23", "1", 0)],
        &[("a", "moved")],
    ));
    let split = |id| cg(id, &[(2, 1.0)], &[(0, 400), (1, 400)], "8-11,24-27", "0-2");
    check(Case {
        cfg: ControllerConfig {
            migration_budget_mib: 1000,
            ..cfg()
        },
        ..base(
            "budget stops the third move",
            world(vec![split("b1"), split("b2"), split("b3")]),
            &[("b1", "0-3,16-19", "0", 400), ("b2", "0-3,16-19", "0", 400)],
            &[("b1", "moved"), ("b2", "moved"), ("b3", "skip:budget")],
        )
    });
    let mut busy = split("b1");
    busy.constraints.moving = true;
    check(base(
        "a cgroup whose move is still being applied is not planned again",
        world(vec![busy, split("b2")]),
        &[("b2", "0-3,16-19", "0", 400)],
        &[("b1", "skip:in-flight"), ("b2", "moved")],
    ));
    check(Case {
        cfg: ControllerConfig {
            migration_budget_mib: 100_000,
            ..cfg()
        },
        ..base(
            "max moves per round",
            world(vec![
                split("b1"),
                split("b2"),
                split("b3"),
                split("b4"),
                split("b5"),
            ]),
            &[
                ("b1", "0-3,16-19", "0", 400),
                ("b2", "0-3,16-19", "0", 400),
                ("b3", "0-3,16-19", "0", 400),
                ("b4", "0-3,16-19", "0", 400),
            ],
            &[("b5", "skip:max-moves")],
        )
    });
    check(Case {
        state: moved_at("a", 90_000),
        ..base(
            "cooldown blocks",
            world(vec![cg("a", &[(0, 2.0)], &[(1, 8192)], "0-3,16-19", "0-1")]),
            &[],
            &[("a", "skip:cooldown")],
        )
    });
    check(Case {
        state: moved_at("a", 69_999),
        ..base(
            "cooldown over",
            world(vec![cg("a", &[(0, 2.0)], &[(1, 8192)], "0-3,16-19", "0-1")]),
            &[("a", "4-7,20-23", "1", 0)],
            &[("a", "moved")],
        )
    });
    // A cgroup we did not admit, spanning every node, whose threads the operator pinned to
    // node 1 (their affinity): memory follows to node 1, the cgroup's CPUs are never narrowed
    // (a thread may later set its affinity to any of them).
    let operators = |cpu_node: u32, allowed: &str| {
        let mut c = cg("w", &[(cpu_node, 1.0)], &[(0, 512)], "0-31", "0-3");
        c.constraints.keep_cpus = true;
        c.constraints.allowed_nodes = Some(set(allowed));
        c
    };
    check(base(
        "operator's CPUs: move only the memory",
        world(vec![operators(1, "1")]),
        &[("w", "0-31", "1", 512)],
        &[("w", "moved")],
    ));
    // After that move the thread moves itself to node 2: its memory is now bound where it may
    // not run, so the cooldown does not hold the fix back.
    let mut after = operators(2, "2");
    after.mems = set("1");
    after.mem_bytes_per_node = [(1, 512 * MIB)].into();
    let mut st = moved_at("w", 95_000);
    st.cgroups.get_mut("w").unwrap().last_cpus = Some(set("0-31"));
    check(Case {
        state: st.clone(),
        ..base(
            "operator moved the threads: no cooldown",
            world(vec![after]),
            &[("w", "0-31", "2", 512)],
            &[("w", "moved")],
        )
    });
    // But not twice in a row. That fix came 10 s after the move before it; when
    // the thread flips back, the next waits for its cooldown (a tenant flipping its affinity
    // every round would have its memory migrated back and forth every round).
    let mut st = st;
    st.cgroups.get_mut("w").unwrap().move_before_ms = Some(85_000);
    let mut flipped = operators(2, "2");
    flipped.mems = set("1");
    check(Case {
        state: st.clone(),
        ..base(
            "a second fix within the cooldown of the first waits",
            world(vec![flipped.clone()]),
            &[],
            &[("w", "skip:cooldown")],
        )
    });
    // One a cooldown after the move before it is a first fix again.
    st.cgroups.get_mut("w").unwrap().move_before_ms = Some(65_000);
    check(Case {
        state: st,
        ..base(
            "a fix a cooldown after the move before it",
            world(vec![flipped]),
            &[("w", "0-31", "2", 512)],
            &[("w", "moved")],
        )
    });
    // Our move left its mems wide (0-3) with its memory meant for node 1, where
    // its threads may run; the tenant pulled the memory back to node 0 with its own memory
    // policy. Not bound where it may not run: the cooldown holds.
    let mut st = moved_at("w", 95_000);
    st.cgroups.get_mut("w").unwrap().last_cpus = Some(set("0-31"));
    st.cgroups.get_mut("w").unwrap().wide_of = Some((set("0-3"), set("1")));
    check(Case {
        state: st.clone(),
        ..base(
            "mems left wide by our move: the target is where its memory is bound",
            world(vec![operators(1, "1")]),
            &[],
            &[("w", "skip:cooldown")],
        )
    });
    // Once its mems are no longer what our move left, they are what counts again.
    st.cgroups.get_mut("w").unwrap().wide_of = Some((set("0-1"), set("1")));
    check(Case {
        state: st,
        ..base(
            "mems changed since: read as they are",
            world(vec![operators(1, "1")]),
            &[("w", "0-31", "1", 512)],
            &[("w", "moved")],
        )
    });
    // Our own cgroup whose CPUs someone else changed after our move: cooldown waived too.
    let mut st = moved_at("a", 90_000);
    st.cgroups.get_mut("a").unwrap().last_cpus = Some(set("4-7,20-23"));
    check(Case {
        state: st,
        ..base(
            "CPUs changed by someone else since our move: no cooldown",
            world(vec![cg("a", &[(0, 2.0)], &[(1, 8192)], "0-3,16-19", "0-1")]),
            &[("a", "4-7,20-23", "1", 0)],
            &[("a", "moved")],
        )
    });
    check(Case {
        cfg: ControllerConfig {
            min_gain: 0.3,
            ..cfg()
        },
        ..base(
            "below min_gain: skip",
            world(vec![cg(
                "a",
                &[(0, 0.75), (1, 0.25)],
                &[(0, 100)],
                "0-7,16-23",
                "0-1",
            )]),
            &[],
            &[("a", "skip:below-min-gain")],
        )
    });
    check(base(
        "above min_gain: same cgroup moves at the default",
        world(vec![cg(
            "a",
            &[(0, 0.75), (1, 0.25)],
            &[(0, 100)],
            "0-7,16-23",
            "0-1",
        )]),
        &[("a", "0-3,16-19", "0", 0)],
        &[("a", "moved")],
    ));
    check(base(
        "idle workload with much memory: migration costs more than it saves",
        world(vec![cg(
            "a",
            &[(2, 0.01)],
            &[(0, 2048), (1, 2048)],
            "8-11,24-27",
            "0-2",
        )]),
        &[],
        &[("a", "skip:cost-exceeds-saving")],
    ));
    check(base(
        "exclusive not moved by default",
        world(vec![exclusive(cg(
            "x",
            &[(1, 1.0)],
            &[(0, 1024)],
            "4,20",
            "0-1",
        ))]),
        &[],
        &[("x", "skip:exclusive")],
    ));
    check(Case {
        cfg: ControllerConfig {
            move_exclusive: true,
            ..cfg()
        },
        ..base(
            "exclusive moved when allowed: whole free cores, not another's",
            world(vec![
                exclusive(cg("x", &[(1, 1.0)], &[(0, 1024)], "4,20", "0-1")),
                exclusive(cg("y", &[(0, 1.0)], &[(0, 10)], "0,16", "0")),
            ]),
            &[("x", "1,17", "0", 0)],
            &[("x", "moved"), ("y", "healthy")],
        )
    });
    let mut fenced = cg("a", &[(0, 1.0)], &[(1, 1024)], "0-3,16-19", "0-1");
    fenced.constraints.allowed_nodes = Some(set("0,2"));
    check(base(
        "allowed nodes respected: memory comes to the CPUs instead",
        world(vec![fenced]),
        &[("a", "0-3,16-19", "0", 1024)],
        &[("a", "moved")],
    ));
    let mut full = world(vec![cg(
        "a",
        &[(2, 1.0)],
        &[(0, 1024), (1, 1024)],
        "8-11,24-27",
        "0-2",
    )]);
    full.nodes.get_mut(&0).unwrap().free_bytes = 100 * MIB;
    check(base(
        "target without free memory rejected",
        full.clone(),
        &[("a", "4-7,20-23", "1", 1024)],
        &[("a", "moved")],
    ));
    for n in full.nodes.values_mut() {
        n.free_bytes = 100 * MIB;
    }
    check(base(
        "no target has free memory",
        full,
        &[],
        &[("a", "skip:no-feasible-target")],
    ));
    let mut hot = world(vec![
        cg("o", &[(0, 2.0)], &[(0, 512)], "0-3,16-19", "0"),
        cg("p", &[(0, 2.0)], &[(0, 512)], "0-3,16-19", "0"),
    ]);
    hot.nodes.get_mut(&0).unwrap().cpu_busy = 0.95;
    hot.nodes.get_mut(&2).unwrap().cpu_busy = 0.1;
    check(base(
        "overloaded node: one workload leaves for the idlest node, then it is not overloaded",
        hot,
        &[("o", "8-11,24-27", "2", 512)],
        &[("o", "moved"), ("p", "healthy")],
    ));
    let mut pinned = cg("a", &[(0, 2.0)], &[(1, 8192)], "0-3,16-19", "0-1");
    pinned.constraints.pinned = true;
    check(base(
        "healthy, idle and pinned",
        world(vec![
            cg("h", &[(0, 2.0)], &[(0, 100)], "0-3,16-19", "0"),
            cg("i", &[], &[(0, 100)], "0-3,16-19", "0"),
            pinned,
        ]),
        &[],
        &[("h", "healthy"), ("i", "no-data"), ("a", "skip:pinned")],
    ));
    let mut single = cg("s", &[(0, 5.0), (1, 5.0)], &[(2, 100)], "0-7,16-23", "0-2");
    single.constraints.single_numa_node = true;
    let mut multi = single.clone();
    multi.id = "m".into();
    multi.constraints.single_numa_node = false;
    check(base(
        "single-numa-node cannot fit 10 CPUs; without it two near nodes are used",
        world(vec![single, multi]),
        &[("m", "0-7,16-23", "0-1", 100)],
        &[("s", "skip:no-feasible-target"), ("m", "moved")],
    ));
    check(base(
        "room taken by an earlier move of the round is not counted twice",
        world(vec![
            cg("z", &[(0, 4.0)], &[(1, 100)], "0-3,16-19", "0-1"),
            cg("b", &[(0, 1.0)], &[(1, 100)], "0-3,16-19", "0-1"),
            cg("a", &[(0, 1.0)], &[(1, 100)], "0-3,16-19", "0-1"),
        ]),
        // z fills node 1 to 0.8 busy; one more CPU would pass 0.9, so a and b take their
        // memory to node 0 instead.
        &[
            ("z", "4-7,20-23", "1", 0),
            ("a", "0-3,16-19", "0", 100),
            ("b", "0-3,16-19", "0", 100),
        ],
        &[],
    ));
    check(base(
        "ordering: most net gain first, ties by id",
        world(vec![
            cg("z", &[(0, 2.0)], &[(1, 100)], "0-3,16-19", "0-1"),
            cg("b", &[(0, 1.0)], &[(1, 100)], "0-3,16-19", "0-1"),
            cg("a", &[(0, 1.0)], &[(1, 100)], "0-3,16-19", "0-1"),
        ]),
        &[
            ("z", "4-7,20-23", "1", 0),
            ("a", "4-7,20-23", "1", 0),
            ("b", "4-7,20-23", "1", 0),
        ],
        &[],
    ));
    let mut reserved = world(vec![cg("a", &[(0, 2.0)], &[(1, 8192)], "0-3,16-19", "0-1")]);
    reserved.reserved_cpus = set("4,20");
    check(base(
        "reserved CPUs never handed out",
        reserved,
        &[("a", "5-7,21-23", "1", 0)],
        &[],
    ));
}

#[test]
fn smoothing_keeps_one_bad_period_from_moving() {
    let c = || cg("a", &[(0, 1.0)], &[(0, 100)], "0-3,16-19", "0");
    let mut st = ControllerState::default();
    // A settled history (a young one weighs a new period more: see smoothing_tests).
    for _ in 0..40 {
        st.observe(&world(vec![c()]), 0.5);
    }
    // One period where all CPU time was remote: instant 0, smoothed 0.5·0 + 0.5·1 = 0.5 < 0.8,
    // so with alpha 0.5 it would be a candidate; with alpha 0.1 it stays at 0.9.
    let bad = world(vec![cg("a", &[(1, 1.0)], &[(0, 100)], "0-3,16-19", "0")]);
    let mut slow = st.clone();
    slow.observe(&bad, 0.1);
    let p = plan(&machine(), &bad, &slow, &cfg(), 0);
    assert_eq!(kind(&p.decisions[0].outcome), "healthy", "{p:#?}");
    assert!((p.decisions[0].smoothed.unwrap() - 0.9).abs() < 1e-9);
}

/// The synthetic world's answer to a move: CPU time follows the cpus, memory the mems.
fn apply_to_world(obs: &mut Observations, topo: &Topology, moves: &[Move]) {
    for m in moves {
        let c = obs.cgroups.iter_mut().find(|c| c.id == m.cgroup).unwrap();
        let total = c.total_cpu_ns();
        let nodes: Vec<u32> = m
            .to_mems
            .iter()
            .filter(|&n| {
                !topo
                    .cpus_of_nodes(&CpuSet::from_iter([n]))
                    .intersection(&m.to_cpus)
                    .is_empty()
            })
            .collect();
        c.cpu_ns_per_node = nodes
            .iter()
            .map(|&n| (n, total / nodes.len() as u64))
            .collect();
        let mem: u64 = c.mem_bytes_per_node.values().sum();
        // A plain move migrates everything off the new mems; a stage moves its bytes toward
        // the target (pages, one node after the other).
        let (keep, mut budget) = match &m.stage {
            None => (&m.to_mems, u64::MAX),
            Some(s) => (&s.toward, m.bytes_to_migrate),
        };
        let mut outside = 0u64;
        for (n, b) in c.mem_bytes_per_node.iter_mut() {
            if !keep.contains(*n) {
                let take = (*b).min(budget);
                *b -= take;
                budget -= take;
                outside += take;
            }
        }
        c.mem_bytes_per_node.retain(|_, b| *b > 0);
        let first = keep.first().unwrap();
        *c.mem_bytes_per_node.entry(first).or_default() += outside;
        assert_eq!(c.mem_bytes_per_node.values().sum::<u64>(), mem);
        c.cpus = m.to_cpus.clone();
        c.mems = m.to_mems.clone();
    }
    // Node busy follows the workloads' demand.
    let mut busy: BTreeMap<u32, f64> = BTreeMap::new();
    for c in &obs.cgroups {
        for (&n, &ns) in &c.cpu_ns_per_node {
            *busy.entry(n).or_default() += ns as f64 / PERIOD as f64 / 8.0;
        }
    }
    for (n, o) in obs.nodes.iter_mut() {
        o.cpu_busy = (0.05 + busy.get(n).copied().unwrap_or(0.0)).min(1.0);
    }
}

#[test]
fn hysteresis_no_ping_pong_across_rounds() {
    let topo = machine();
    let mut obs = world(vec![
        cg(
            "half",
            &[(0, 1.0)],
            &[(0, 500), (1, 500)],
            "0-3,16-19",
            "0-1",
        ),
        cg("wrong", &[(2, 2.0)], &[(3, 2048)], "8-11,24-27", "2-3"),
        cg(
            "two",
            &[(0, 3.0), (1, 3.0)],
            &[(0, 300), (1, 300)],
            "0-7,16-23",
            "0-1",
        ),
        cg("hot1", &[(3, 3.0)], &[(3, 100)], "12-15,28-31", "3"),
        cg("hot2", &[(3, 3.0)], &[(3, 100)], "12-15,28-31", "3"),
        cg("hot3", &[(3, 1.5)], &[(3, 100)], "12-15,28-31", "3"),
    ]);
    apply_to_world(&mut obs, &topo, &[]);
    let cfg = ControllerConfig {
        cooldown_ms: 10_000,
        ..cfg()
    };
    let mut state = ControllerState::default();
    let mut per_round = Vec::new();
    let mut per_cg: BTreeMap<String, u32> = BTreeMap::new();
    for round in 0..20u64 {
        let now = round * 5_000;
        state.observe(&obs, crate::controller::EWMA_ALPHA);
        let p = plan(&topo, &obs, &state, &cfg, now);
        for m in &p.moves {
            // The later rounds of a staged move are that one move going on.
            let continuing = state
                .cgroups
                .get(&m.cgroup)
                .is_some_and(|s| s.staging.is_some());
            state.record_move(m, m.bytes_to_migrate, now);
            if !continuing {
                *per_cg.entry(m.cgroup.clone()).or_default() += 1;
            }
        }
        per_round.push(p.moves.len());
        apply_to_world(&mut obs, &topo, &p.moves);
    }
    assert!(per_round[..3].iter().sum::<usize>() >= 2, "{per_round:?}");
    assert_eq!(
        per_round[8..].iter().sum::<usize>(),
        0,
        "still moving: {per_round:?} {per_cg:?}"
    );
    assert!(per_cg.values().all(|&n| n <= 1), "ping-pong: {per_cg:?}");
}

// ---- properties over random observations on an 8-node, 256-CPU machine ----

fn big() -> Topology {
    TopologyBuilder {
        sockets: 2,
        nodes_per_socket: 4,
        cores_per_node: 16,
        threads_per_core: 2,
        ..Default::default()
    }
    .build()
}

fn arb_nodes() -> impl Strategy<Value = CpuSet> {
    (1u32..256).prop_map(|m| (0..8).filter(|n| m & (1 << n) != 0).collect())
}

prop_compose! {
    fn arb_cg(i: usize)(
        cpu in proptest::collection::btree_map(0u32..8, 0u64..8 * PERIOD, 0..4),
        mem in proptest::collection::btree_map(0u32..8, 0u64..4 * GIB, 0..4),
        huge in proptest::collection::btree_map(0u32..8, 0u64..GIB, 0..2),
        mems in arb_nodes(),
        allowed in proptest::option::of(arb_nodes()),
        exclusive in any::<bool>(),
        single in any::<bool>(),
        keep in any::<bool>(),
        faults in proptest::option::of((0u64..1000, 0u64..1000)),
    ) -> CgroupObs {
        let topo = big();
        let cpus = if exclusive {
            CpuSet::from_iter([i as u32 % 128, i as u32 % 128 + 128])
        } else {
            topo.cpus_of_nodes(&mems)
        };
        CgroupObs {
            id: format!("cg{i:03}"),
            cpu_ns_per_node: cpu,
            mem_bytes_per_node: mem,
            hugepage_bytes_per_node: huge,
            local_faults: faults.map(|f| f.0),
            remote_faults: faults.map(|f| f.1),
            cpus,
            mems,
            constraints: Constraints {
                allowed_nodes: allowed,
                exclusive,
                single_numa_node: single,
                keep_cpus: keep && !exclusive,
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

fn arb_world() -> impl Strategy<Value = (Observations, ControllerState, ControllerConfig, u64)> {
    let cgs = (1usize..30).prop_flat_map(|n| (0..n).map(arb_cg).collect::<Vec<_>>());
    let nodes = proptest::collection::vec((0.0f64..1.0, 0u64..16 * GIB, 0u64..4 * GIB), 8);
    let cooldowns = proptest::collection::vec(proptest::option::of(0u64..100_000), 30);
    (
        cgs,
        nodes,
        cooldowns,
        0u64..4096,
        any::<bool>(),
        proptest::collection::btree_set(0u32..256, 0..8),
    )
        .prop_map(|(cgroups, nodes, cool, budget, move_exclusive, reserved)| {
            let mut state = ControllerState::default();
            for (c, t) in cgroups.iter().zip(&cool) {
                state.cgroups.entry(c.id.clone()).or_default().last_move_ms = *t;
            }
            let obs = Observations {
                period_ns: PERIOD,
                cgroups,
                nodes: nodes
                    .into_iter()
                    .enumerate()
                    .map(|(i, (b, f, h))| {
                        (
                            i as u32,
                            NodeObs {
                                cpu_busy: b,
                                free_bytes: f,
                                free_hugepage_bytes: h,
                                runnable: None,
                            },
                        )
                    })
                    .collect(),
                reserved_cpus: reserved.into_iter().collect(),
            };
            let cfg = ControllerConfig {
                migration_budget_mib: budget,
                move_exclusive,
                cooldown_ms: 30_000,
                ..ControllerConfig::default()
            };
            (obs, state, cfg, 100_000)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn planner_invariants((obs, state, cfg, now) in arb_world()) {
        let topo = big();
        let p = plan(&topo, &obs, &state, &cfg, now);
        prop_assert!(p.moves.len() <= crate::controller::MAX_MOVES_PER_ROUND as usize);
        prop_assert!(p.bytes_to_migrate() <= cfg.migration_budget_mib * MIB);
        prop_assert_eq!(p.decisions.len(), obs.cgroups.len());
        let mut excl_claimed = obs
            .cgroups
            .iter()
            .filter(|c| c.constraints.exclusive)
            .fold(CpuSet::new(), |a, c| a.union(&c.cpus));
        for m in &p.moves {
            let c = obs.cgroups.iter().find(|c| c.id == m.cgroup).unwrap();
            prop_assert!(!m.to_cpus.is_empty() && !m.to_mems.is_empty(), "{m:?}");
            // A stage only widens mems (nothing migrates on a widening); the constraints hold
            // for where it is going.
            let target = match &m.stage {
                Some(s) => {
                    prop_assert_eq!(&m.to_mems, &c.mems.union(&s.toward));
                    prop_assert!(s.remaining_bytes > m.bytes_to_migrate, "{m:?}");
                    s.toward.clone()
                }
                None => m.to_mems.clone(),
            };
            let m = &Move { to_mems: target, ..m.clone() };
            let misplaced = c.constraints.allowed_nodes.as_ref().is_some_and(|a| !c.mems.is_subset(a));
            prop_assert!(misplaced || state.cooldown_remaining(&m.cgroup, &c.cpus, now, cfg.cooldown_ms).is_none());
            if c.constraints.keep_cpus {
                // The operator's CPUs are never rewritten; only memory moves.
                prop_assert_eq!(&m.to_cpus, &c.cpus);
            } else {
                let cpu_nodes: CpuSet = m.to_cpus.iter().filter_map(|x| topo.node_of_cpu(x)).collect();
                prop_assert!(cpu_nodes.is_subset(&m.to_mems), "{m:?}");
            }
            if let Some(a) = &c.constraints.allowed_nodes {
                prop_assert!(m.to_mems.is_subset(a), "{m:?} outside {a}");
            }
            if c.constraints.single_numa_node {
                prop_assert_eq!(m.to_mems.len(), 1);
            }
            if !c.constraints.keep_cpus {
                prop_assert!(m.to_cpus.is_disjoint(&obs.reserved_cpus), "{m:?}");
            } else {
                // Memory only to nodes holding some of the operator's CPUs.
                let cpu_nodes: CpuSet = c.cpus.iter().filter_map(|x| topo.node_of_cpu(x)).collect();
                prop_assert!(m.to_mems.is_subset(&cpu_nodes), "{m:?}");
            }
            if c.constraints.exclusive {
                prop_assert!(cfg.move_exclusive);
                let others = excl_claimed.difference(&c.cpus);
                prop_assert!(m.to_cpus.is_disjoint(&others), "{m:?} overlaps {others}");
                excl_claimed = others.union(&m.to_cpus);
            } else if !c.constraints.keep_cpus {
                prop_assert!(m.to_cpus.is_disjoint(&excl_claimed), "{m:?} on exclusive CPUs");
            }
            prop_assert_eq!(&m.from_cpus, &c.cpus);
            prop_assert_eq!(&m.from_mems, &c.mems);
        }
        // Deterministic.
        prop_assert_eq!(plan(&topo, &obs, &state, &cfg, now), p);
    }
}

/// Guards the property test against vacuity: its random worlds must reach every gate.
#[test]
fn random_worlds_exercise_every_gate() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut r = TestRunner::deterministic();
    let (mut moves, mut excl) = (0, 0);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..200 {
        let (obs, state, cfg, now) = arb_world().new_tree(&mut r).unwrap().current();
        let p = plan(&big(), &obs, &state, &cfg, now);
        moves += p.moves.len();
        excl += p
            .moves
            .iter()
            .filter(|m| {
                obs.cgroups
                    .iter()
                    .any(|c| c.id == m.cgroup && c.constraints.exclusive)
            })
            .count();
        for d in &p.decisions {
            *kinds.entry(kind(&d.outcome)).or_default() += 1;
        }
    }
    assert!(moves > 50 && excl > 10, "{moves} moves, {excl} exclusive");
    for k in [
        "skip:budget",
        "skip:cooldown",
        "skip:max-moves",
        "skip:exclusive",
        "skip:no-feasible-target",
        "skip:cost-exceeds-saving",
    ] {
        assert!(
            kinds.get(k).copied().unwrap_or(0) > 0,
            "{k} never reached: {kinds:?}"
        );
    }
}

#[test]
fn absurd_input_gives_a_plan_not_a_panic() {
    let mut a = cg("a", &[], &[], "0-3", "0");
    a.cpu_ns_per_node = [(0, u64::MAX), (1, u64::MAX), (9, 5)].into_iter().collect();
    a.mem_bytes_per_node = [(0, u64::MAX), (1, u64::MAX)].into_iter().collect();
    a.hugepage_bytes_per_node = [(2, u64::MAX)].into_iter().collect();
    a.remote_faults = Some(u64::MAX);
    a.local_faults = Some(u64::MAX);
    a.constraints.exclusive = true;
    a.constraints.exclusive_cpus = u32::MAX;
    a.constraints.allowed_nodes = Some(CpuSet::new());
    let mut b = a.clone();
    b.id = "b".into();
    b.constraints = Constraints::default();
    let mut w = world(vec![a, b]);
    w.nodes.get_mut(&0).unwrap().cpu_busy = f64::NAN;
    w.nodes.get_mut(&1).unwrap().free_bytes = u64::MAX;
    w.nodes.remove(&3);
    let cfg = ControllerConfig {
        move_exclusive: true,
        migration_budget_mib: u64::MAX,
        horizon_ms: u64::MAX,
        migration_cost_per_gib: f64::INFINITY,
        ..cfg()
    };
    for period in [0, 1, PERIOD] {
        w.period_ns = period;
        let mut st = ControllerState::default();
        st.observe(&w, f64::NAN);
        let p = plan(&machine(), &w, &st, &cfg, u64::MAX);
        assert_eq!(p.decisions.len(), 2);
        for m in &p.moves {
            assert!(!m.to_cpus.is_empty() && !m.to_mems.is_empty());
        }
    }
}

/// A single-node workload whose CPUs run on node 2 and whose 3,000 MiB are split over nodes 0
/// and 1: moving it to node 0 migrates 1,500 MiB, more than the 1,000 MiB budget.
fn staged_world() -> (Observations, ControllerConfig) {
    let mut big = cg(
        "big",
        &[(2, 1.0)],
        &[(0, 1500), (1, 1500)],
        "8-11,24-27",
        "0-2",
    );
    big.constraints.single_numa_node = true;
    let cfg = ControllerConfig {
        migration_budget_mib: 1000,
        cooldown_ms: 60_000,
        ..cfg()
    };
    (world(vec![big]), cfg)
}

#[test]
fn more_memory_than_the_budget_moves_in_stages() {
    let topo = machine();
    let (mut obs, cfg) = staged_world();
    let mut state = ControllerState::default();
    // A workload that has run for the horizon (60 periods of 1 s): its saving counts in full.
    for _ in 0..60 {
        state.observe(&obs, crate::controller::EWMA_ALPHA);
    }
    let mut rounds = Vec::new();
    for round in 0..6u64 {
        let now = round * 5_000;
        state.observe(&obs, crate::controller::EWMA_ALPHA);
        let p = plan(&topo, &obs, &state, &cfg, now);
        assert!(p.bytes_to_migrate() <= 1000 * MIB, "{:?}", p.moves);
        for m in &p.moves {
            rounds.push((
                m.to_cpus.to_string(),
                m.to_mems.to_string(),
                m.bytes_to_migrate / MIB,
                m.stage.as_ref().map(|s| s.toward.to_string()),
            ));
            state.record_move(m, m.bytes_to_migrate, now);
        }
        apply_to_world(&mut obs, &topo, &p.moves);
    }
    let s = |x: &str| x.to_string();
    assert_eq!(
        rounds,
        vec![
            // CPUs move now, mems only widen, a budget's worth of pages moves…
            (s("0-3,16-19"), s("0-2"), 1000, Some(s("0"))),
            // …and the next round (inside the cooldown) narrows mems: the rest fits.
            (s("0-3,16-19"), s("0"), 500, None),
        ]
    );
    let c = &obs.cgroups[0];
    assert_eq!(c.mem_bytes_per_node, BTreeMap::from([(0, 3000 * MIB)]));
    assert!(state.cgroups["big"].staging.is_none());
}

#[test]
fn staging_stalled_or_overridden_falls_back() {
    let topo = machine();
    let (obs, cfg) = staged_world();
    let p = plan(&topo, &obs, &ControllerState::default(), &cfg, 0);
    let first = p.moves[0].clone();
    assert!(first.stage.is_some());
    let mut state = ControllerState::default();
    state.record_move(&first, 0, 0);
    let mut after = obs.clone();
    after.cgroups[0].cpus = first.to_cpus.clone();
    after.cgroups[0].mems = first.to_mems.clone();
    // Stalled: no page moved (pinned pages): no next stage, the cooldown applies again.
    let p = plan(&topo, &after, &state, &cfg, 5_000);
    assert!(p.moves.is_empty(), "{:?}", p.moves);
    assert_eq!(kind(&p.decision("big").unwrap().outcome), "skip:cooldown");
    // Progress: the next stage comes inside the cooldown.
    let mut moving = after.clone();
    moving.cgroups[0].mem_bytes_per_node = BTreeMap::from([(0, 2000 * MIB), (1, 1000 * MIB)]);
    let p = plan(&topo, &moving, &state, &cfg, 5_000);
    assert_eq!(p.moves.len(), 1);
    assert_eq!(p.moves[0].to_mems, set("0"), "{:?}", p.moves);
    assert_eq!(p.moves[0].bytes_to_migrate, 1000 * MIB);
    // The operator moved its CPUs meanwhile: staging is over, their choice is the input.
    let mut theirs = moving.clone();
    theirs.cgroups[0].cpus = set("12-15");
    let p = plan(&topo, &theirs, &state, &cfg, 5_000);
    assert!(p.moves.iter().all(|m| m.from_cpus == set("12-15")));
    assert_ne!(kind(&p.decision("big").unwrap().outcome), "skip:cooldown");
}

/// A locality point is priced by how far "remote" is: the same workload and option save 22×
/// more between nodes at distance 32 than between sub-NUMA clusters at distance 11.
#[test]
fn saving_is_priced_by_the_slit_distance() {
    let saving = |near: u32| {
        let topo = TopologyBuilder {
            near,
            ..Default::default()
        }
        .build();
        let obs = world(vec![cg("a", &[(0, 2.0)], &[(1, 4096)], "0-3", "0-1")]);
        let p = plan(&topo, &obs, &ControllerState::default(), &cfg(), 0);
        let d = p.decision("a").unwrap();
        d.considered
            .iter()
            .find(|c| c.nodes == set("0"))
            .unwrap_or_else(|| panic!("{d:#?}"))
            .saving
    };
    let (near, far) = (saving(11), saving(32));
    assert!(near > 0.0, "{near}");
    assert!((far / near - 22.0).abs() < 1e-6, "{far} / {near}");
}

/// The cost model sees the target's CPU contention: moving 2 CPUs of demand onto a node whose
/// run queue already wants 1.4× its CPUs (while its busy share, sampled, reads 0.5) would pay
/// for the migration in locality, but stretches every task there: skipped as `slower-after`,
/// with the figures in explain. Without the run-queue figure the same move is made.
#[test]
fn a_move_into_a_crowded_run_queue_is_skipped_as_slower_after() {
    let mut a = cg("a", &[(0, 2.0)], &[(1, 512)], "0-3,16-19", "0-1");
    a.constraints.allowed_nodes = Some(set("0-1"));
    let mut obs = world(vec![a]);
    // Node 0 has no room for the memory: the only way to locality is the CPUs to node 1.
    obs.nodes.get_mut(&0).unwrap().free_bytes = 64 * MIB;
    let node1 = obs.nodes.get_mut(&1).unwrap();
    node1.cpu_busy = 0.5;
    let blind = plan(&machine(), &obs, &ControllerState::default(), &cfg(), 0);
    assert_eq!(
        kind(&blind.decision("a").unwrap().outcome),
        "moved",
        "{blind:#?}"
    );
    assert_eq!(blind.moves[0].to_mems, set("1"));

    obs.nodes.get_mut(&1).unwrap().runnable = Some(1.4);
    let p = plan(&machine(), &obs, &ControllerState::default(), &cfg(), 0);
    let d = p.decision("a").unwrap();
    assert!(p.moves.is_empty(), "{p:#?}");
    assert_eq!(kind(&d.outcome), "skip:slower-after", "{d:#?}");
    let Outcome::Skipped(Skip::SlowerAfter {
        saving,
        cost,
        contention,
    }) = d.outcome
    else {
        unreachable!()
    };
    assert!(saving > cost && contention > saving - cost, "{d:#?}");
    // 8 CPUs of node 1 wanted 11.2, now 13.2: 13.2 × 13.2/8 − 11.2 × 11.2/8 = 6.1 CPUs of
    // stretched work; node 0 (2.4 wanted) sheds 2 without contention: −2.0. Over 60 s.
    assert!(
        (contention - (6.1 - 2.0) * 60.0).abs() < 1.0,
        "{contention}"
    );
    let c = d.considered.iter().find(|c| c.nodes == set("1")).unwrap();
    assert!((c.net - (c.saving - c.cost - c.contention)).abs() < 1e-9);
}

/// Overload relief is priced by the contention model and counted only for as long as the
/// overload has lasted so far: a 2-CPU workload with 16 GiB of memory on a node whose run
/// queue wants 2× its CPUs would take 7.5 CPUs of stretched work off it (16 × 16/8 − 14 × 14/8)
/// and add its own 2 to an idle node: 5.5 CPUs of relief. After one 1 s period of overload that
/// is 5.5 CPU-seconds against 16 GiB of migration: skipped as `short-horizon`, the horizons in explain. Once the overload
/// has lasted the whole horizon (60 periods), the same move pays and is made.
#[test]
fn a_relief_move_that_does_not_pay_for_itself_is_skipped_as_short_horizon() {
    // It wants 2 CPUs and runs 1: its node's queue holds twice the CPUs.
    let a = cg("a", &[(0, 1.0)], &[(0, 16 * 1024)], "0-3,16-19", "0");
    let mut obs = world(vec![a]);
    for (&n, o) in obs.nodes.iter_mut() {
        let (busy, runnable) = if n == 0 { (1.0, 2.0) } else { (0.1, 0.1) };
        o.cpu_busy = busy;
        o.runnable = Some(runnable);
    }
    let mut state = ControllerState::default();
    state.observe(&obs, 0.5);
    let p = plan(&machine(), &obs, &state, &cfg(), 0);
    let d = p.decision("a").unwrap();
    assert!(p.moves.is_empty(), "{p:#?}");
    assert_eq!(kind(&d.outcome), "skip:short-horizon", "{d:#?}");
    let Outcome::Skipped(Skip::ShortHorizon {
        relief_horizon_ms,
        saving,
        cost,
        contention,
        ..
    }) = d.outcome
    else {
        unreachable!()
    };
    assert_eq!(relief_horizon_ms, 1000, "{d:#?}");
    assert!((cost - 16.0).abs() < 1e-9, "{d:#?}");
    assert_eq!(contention, 0.0, "{d:#?}");
    assert!(saving < cost, "{d:#?}");
    let c = d.considered.iter().find(|c| c.nodes == set("1")).unwrap();
    assert!((c.relief - 5.5 / 2.0).abs() < 1e-6, "{c:#?}");
    // The explain JSON carries the reason and both horizons.
    let v = serde_json::to_value(&d.outcome).unwrap();
    assert_eq!(v["kind"], "short-horizon");
    assert_eq!(v["relief_horizon_ms"], 1000);

    for _ in 1..60 {
        state.observe(&obs, 0.5);
    }
    let p = plan(&machine(), &obs, &state, &cfg(), 0);
    assert_eq!(p.moves.len(), 1, "{p:#?}");
    let d = p.decision("a").unwrap();
    let Outcome::Moved { to_nodes } = &d.outcome else {
        panic!("{d:#?}")
    };
    assert!(to_nodes.len() == 1 && !to_nodes.contains(0), "{d:#?}");
    let c = d.considered.iter().find(|c| &c.nodes == to_nodes).unwrap();
    assert_eq!(c.relief_horizon_ms, 60_000, "{c:#?}");
    assert!(c.net > 0.0, "{c:#?}");
}

/// Relief is counted for as long as the source's overload has lasted; over that same window the
/// target may go back to the load it had. `a` (2 CPUs) runs on node 0, whose run queue has
/// wanted 1.2× its 8 CPUs for 12 periods; nodes 1–3 wanted 1.5× until this period, when they
/// dropped to 0.1. Priced against this period alone the move takes 3.92 CPUs of stretched work
/// off node 0 (9.6 × 9.6/8 − 7.6) and adds its own 2 to an idle target: 1.92 CPUs of relief.
/// At the targets' peak of the window (12 → 14 CPUs on 8: 14 × 14/8 − 12 × 12/8 = 6.5 more)
/// it makes the machine slower: no relief, not moved. Once the targets' room has lasted the
/// horizon, the same move is made, priced at 1.92 / 2 per CPU.
#[test]
fn relief_is_priced_at_the_targets_peak_over_the_window_it_is_counted_for() {
    // It wants 2 CPUs and runs 2 / 1.2 of them.
    let a = cg("a", &[(0, 2.0 / 1.2)], &[(0, 16)], "0-3,16-19", "0");
    let mut obs = world(vec![a]);
    let set_load = |obs: &mut Observations, target: f64| {
        for (&n, o) in obs.nodes.iter_mut() {
            let r = if n == 0 { 1.2 } else { target };
            o.cpu_busy = r.min(1.0);
            o.runnable = Some(r);
        }
    };
    let mut state = ControllerState::default();
    set_load(&mut obs, 1.5);
    for _ in 0..11 {
        state.observe(&obs, 0.5);
    }
    set_load(&mut obs, 0.1);
    state.observe(&obs, 0.5);
    let p = plan(&machine(), &obs, &state, &cfg(), 0);
    let d = p.decision("a").unwrap();
    assert!(p.moves.is_empty(), "{p:#?}");
    assert!(
        matches!(d.trigger, Some(Trigger::Overloaded { .. })),
        "{d:#?}"
    );
    for c in d.considered.iter().filter(|c| !c.nodes.contains(0)) {
        assert_eq!(c.relief, 0.0, "{c:#?}");
    }
    assert_eq!(kind(&d.outcome), "skip:below-min-gain", "{d:#?}");

    // The targets' room has now lasted the whole horizon (60 periods): the move pays.
    for _ in 0..60 {
        state.observe(&obs, 0.5);
    }
    let p = plan(&machine(), &obs, &state, &cfg(), 0);
    assert_eq!(p.moves.len(), 1, "{p:#?}");
    let d = p.decision("a").unwrap();
    let Outcome::Moved { to_nodes } = &d.outcome else {
        panic!("{d:#?}")
    };
    let c = d.considered.iter().find(|c| &c.nodes == to_nodes).unwrap();
    assert!((c.relief - 1.92 / 2.0).abs() < 1e-6, "{c:#?}");
}

/// One round on `topo` after the horizon (61 periods) of the same loads: node n's run queue at
/// `runnable(n)` per CPU, its busy share that capped at 1 (or `busy(n)` where given).
fn plan_after_horizon(
    topo: &Topology,
    a: CgroupObs,
    runnable: impl Fn(u32) -> f64,
    busy: impl Fn(u32) -> Option<f64>,
    cfg: &ControllerConfig,
) -> Plan {
    let mut obs = world(vec![a]);
    for (&n, o) in obs.nodes.iter_mut() {
        let r = runnable(n);
        o.cpu_busy = busy(n).unwrap_or(r.min(1.0));
        o.runnable = Some(r);
    }
    let mut state = ControllerState::default();
    for _ in 0..61 {
        state.observe(&obs, 0.5);
    }
    plan(topo, &obs, &state, cfg, 0)
}

/// `machine()` with node 1 cut to 2 cores (4 CPUs): nodes of unequal size.
fn machine_small_node1() -> Topology {
    let mut t = machine();
    let keep = t.nodes[1].cpus.iter().take(2).collect::<Vec<_>>();
    let cut: Vec<u32> = t.nodes[1]
        .cpus
        .iter()
        .filter(|c| {
            let core = t.cpu(*c).unwrap().core;
            !keep.iter().any(|k| t.cpu(*k).unwrap().core == core)
        })
        .collect();
    t.nodes[1].cpus = t.nodes[1]
        .cpus
        .difference(&cut.iter().copied().collect::<CpuSet>());
    t.cpus.retain(|c| !cut.contains(&c.id));
    assert_eq!(t.nodes[1].cpus.len(), 4, "{:?}", t.nodes[1].cpus);
    t
}

/// A relief move may take its target past `overload_busy` when it takes contention away and
/// leaves the target less pressed than the node it leaves: `a` (4 CPUs) on node 0, whose run
/// queue has wanted 2× its 8 CPUs for the whole horizon; nodes 1–3 want 0.6× theirs. Moved to
/// one of them it leaves 1.1× there and 1.5× on node 0 (16 × 2 − 12 × 1.5 = 14 CPUs of
/// stretched work less, 8.8 × 1.1 − 4.8 = 4.88 more): made, where the threshold alone used to
/// keep it on the hottest node. With the source at 1.0× the same target would end more pressed
/// than the source was: rejected as before.
#[test]
fn a_relief_move_may_pass_overload_busy_into_a_less_pressed_node() {
    let run_with = |src: f64, own_wait: bool| {
        // It wants 4 CPUs and, on a node whose queue holds `src` per CPU, runs 4 / src and
        // waits the rest (measured, or left to the node's average).
        let got = 4.0 / src.max(1.0);
        let mut a = cg("a", &[(0, got)], &[(0, 16)], "0-3,16-19", "0");
        if own_wait {
            a = waited(a, &[(0, 4.0 - got)]);
        }
        let load = |n| if n == 0 { src } else { 0.6 };
        plan_after_horizon(&machine(), a, load, |_| None, &cfg())
    };
    let run = |src: f64| run_with(src, true);
    // Without its own wait measured the same move is priced alike but not made: past
    // `overload_busy` only on a workload's own figures.
    let p = run_with(2.0, false);
    assert!(p.moves.is_empty(), "{p:#?}");
    let d = p.decision("a").unwrap();
    let c = d.considered.iter().find(|c| c.nodes == set("1")).unwrap();
    assert!(
        c.relief > 0.0 && matches!(c.rejected, Some(TargetRejection::Overloaded { .. })),
        "{c:#?}"
    );

    let p = run(2.0);
    assert_eq!(p.moves.len(), 1, "{p:#?}");
    let d = p.decision("a").unwrap();
    let Outcome::Moved { to_nodes } = &d.outcome else {
        panic!("{d:#?}")
    };
    assert!(to_nodes.len() == 1 && !to_nodes.contains(0), "{d:#?}");
    let c = d.considered.iter().find(|c| &c.nodes == to_nodes).unwrap();
    assert!(c.rejected.is_none() && c.net > 0.0, "{c:#?}");
    assert!((c.relief - (14.0 - 4.88) / 4.0).abs() < 1e-6, "{c:#?}");

    let p = run(1.0);
    assert!(p.moves.is_empty(), "{p:#?}");
    let d = p.decision("a").unwrap();
    for c in d
        .considered
        .iter()
        .filter(|c| c.nodes.len() == 1 && !c.nodes.contains(0))
    {
        assert!(
            matches!(c.rejected, Some(TargetRejection::Overloaded { .. })),
            "{c:#?}"
        );
    }
}

/// On nodes of unequal size a move can take contention away and still leave its target as
/// pressed as the source: node 0 (8 CPUs) at 1.25×, node 1 (4 CPUs) below it, nodes 2–3 at
/// 1.25× too; `a` (2 CPUs) leaves node 0 at 1.0×. Node 1 at 0.75× would end at 1.25× (the
/// source's pressure) although the machine's stretched work falls by 1.25 CPUs: not moved, or
/// node 1 and node 0 would trade it back and forth. At 0.625× it ends at 1.125×: moved.
#[test]
fn past_overload_busy_a_target_must_end_less_pressed_than_its_source() {
    let run = |n1: f64| {
        // It wants 2 CPUs, runs 2 / 1.25 of them and waits the rest.
        let a = waited(
            cg("a", &[(0, 1.6)], &[(0, 16)], "0-3,16-19", "0"),
            &[(0, 0.4)],
        );
        let load = |n| if n == 1 { n1 } else { 1.25 };
        plan_after_horizon(&machine_small_node1(), a, load, |_| None, &cfg())
    };
    let p = run(0.75);
    assert!(p.moves.is_empty(), "{p:#?}");
    let d = p.decision("a").unwrap();
    let c = d.considered.iter().find(|c| c.nodes == set("1")).unwrap();
    assert!(
        matches!(
            c.rejected,
            Some(TargetRejection::Overloaded { node: 1, .. })
        ),
        "{c:#?}"
    );
    assert!(c.relief > 0.0, "the machine's contention falls: {c:#?}");

    let p = run(0.625);
    assert_eq!(p.moves.len(), 1, "{p:#?}");
    let d = p.decision("a").unwrap();
    assert!(
        matches!(&d.outcome, Outcome::Moved { to_nodes } if *to_nodes == set("1")),
        "{d:#?}"
    );
}

/// The exception past `overload_busy` needs a real run-queue reading on every node it prices,
/// and is not for whole cores: the same move as in
/// `a_relief_move_may_pass_overload_busy_into_a_less_pressed_node` stays rejected when the
/// targets' readings are not finite, and for an exclusive workload (its cores leave the
/// target's shared pool, which per-node pressure does not see).
#[test]
fn past_overload_busy_needs_measured_queues_and_shared_cpus() {
    let run = |target: f64, excl: bool| {
        // As there: it wants 4 CPUs, runs 2 and waits 2.
        let mut a = waited(
            cg("a", &[(0, 2.0)], &[(0, 16)], "0-3,16-19", "0"),
            &[(0, 2.0)],
        );
        if excl {
            a = exclusive(a);
        }
        let load = |n| if n == 0 { 2.0 } else { target };
        let busy = |n| Some(if n == 0 { 1.0 } else { 0.6 });
        let cfg = ControllerConfig {
            move_exclusive: true,
            ..cfg()
        };
        plan_after_horizon(&machine(), a, load, busy, &cfg)
    };
    assert_eq!(run(0.6, false).moves.len(), 1, "the control");
    for (target, excl) in [
        (f64::NAN, false),
        (f64::INFINITY, false),
        (-1.0, false),
        (0.6, true),
    ] {
        let p = run(target, excl);
        assert!(p.moves.is_empty(), "{target} {excl}: {p:#?}");
        let d = p.decision("a").unwrap();
        for c in d.considered.iter().filter(|c| !c.nodes.contains(0)) {
            assert!(
                matches!(
                    c.rejected,
                    Some(TargetRejection::Overloaded { .. }) | Some(TargetRejection::NoCpus { .. })
                ),
                "{target} {excl}: {c:#?}"
            );
        }
    }
}

/// The kernel reports the CPU time a workload received; the run queue counts its waiting too.
/// On nodes of 12 CPUs, `a` has 12 busy threads on node 0 beside 12 other tasks: the queue
/// holds 24 (2.0 per CPU) and `a` receives 6 CPUs. Moved alone to a node holding 12 it would put
/// 24 there and leave 12: the machine's stretched work stays the same, no relief — priced by
/// the 6 CPUs it received, the same move would look like 24 → 18 and 12 → 18, and the next
/// round would see it waiting on its new node and move it back. No single node is an option
/// worth taking; if it moves, it is spread over more than one.
#[test]
fn a_workload_on_a_queued_node_is_priced_at_what_it_wants_not_what_it_got() {
    let topo = TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 4,
        cores_per_node: 6,
        threads_per_core: 2,
        ..Default::default()
    }
    .build();
    let node0 = topo.nodes[0].cpus.to_string();
    let a = cg("a", &[(0, 6.0)], &[(0, 16)], &node0, "0");
    // The other nodes: a queue as long as their CPUs, in bursts (busy 0.8).
    let load = |n| if n == 0 { 2.0 } else { 1.0 };
    let busy = |n| (n != 0).then_some(0.8);
    let p = plan_after_horizon(&topo, a, load, busy, &cfg());
    let d = p.decision("a").unwrap();
    let single: Vec<_> = d
        .considered
        .iter()
        .filter(|c| c.nodes.len() == 1 && !c.nodes.contains(0))
        .collect();
    assert!(
        !single.is_empty(),
        "single-node options were priced: {d:#?}"
    );
    for c in single {
        assert!(c.relief <= 1e-9, "one node cannot take it: {c:#?}");
    }
    assert!(p.moves.is_empty(), "{p:#?}");
}

/// A node's runnable / busy is an average: cgroups share a node by weight, not by thread, so a
/// workload's want estimated from it can be wrong. `a` (12 busy threads) shares node 0 with 4
/// tasks of another cgroup of equal weight: the queue holds 16 (2.0 per CPU), `a` receives 4
/// CPUs and is priced at 8 from the average. Into node 1 (4 tasks) the move looks like 16 → 8
/// and 4 → 12: less contention, node 1 (1.5 per CPU) less pressed than node 0 (2.0) — but on
/// node 1 `a` would again get 4 CPUs beside 4 tasks, the mirror image, and move back. Past
/// `overload_busy` a move needs the workload's own wait: unmeasured, the move is refused; its
/// own wait (8 CPUs' worth) shows it wants 12, more than node 1 has: no single node is even
/// an option.
#[test]
fn past_overload_busy_needs_the_workloads_own_wait() {
    for own_wait in [false, true] {
        let mut a = cg("a", &[(0, 4.0)], &[(0, 16)], "0-3,16-19", "0");
        if own_wait {
            a = waited(a, &[(0, 8.0)]);
        }
        let load = |n| if n == 0 { 2.0 } else { 0.5 };
        let p = plan_after_horizon(&machine(), a, load, |_| None, &cfg());
        let d = p.decision("a").unwrap();
        let one = d.considered.iter().find(|c| c.nodes == set("1"));
        match (own_wait, one) {
            (false, Some(c)) => assert!(
                c.relief > 0.0
                    && matches!(
                        c.rejected,
                        Some(TargetRejection::Overloaded { node: 1, .. })
                    ),
                "priced as relief from the average, refused: {c:#?}"
            ),
            (false, None) => panic!("node 1 not considered: {d:#?}"),
            (true, one) => assert!(one.is_none(), "12 wanted CPUs on 8: {d:#?}"),
        }
        if let Outcome::Moved { to_nodes } = &d.outcome {
            assert!(to_nodes.len() > 1, "own wait {own_wait}: {d:#?}");
        }
    }
}

/// A measured want sizes CPUs, but never past what the workload can be given: an operator's
/// pinned workload (`keep_cpus`) on 4 CPUs of node 1 that ran 4 and waited 1 more still has
/// its memory follow its CPUs (sized by the want, 5 CPUs would fit nowhere in its 4); a
/// single-node workload that wants 12 on nodes of 8 is still offered single nodes (sized to
/// the largest, not stranded with only multi-node options it may not take).
#[test]
fn a_measured_want_never_strands_a_workload_it_cannot_be_given() {
    let mut w = waited(cg("w", &[(1, 4.0)], &[(0, 512)], "4-7", "0"), &[(1, 1.0)]);
    w.constraints.keep_cpus = true;
    w.constraints.allowed_nodes = Some(set("1"));
    check(Case {
        name: "operator's 4 CPUs, wanting 5: memory follows",
        obs: world(vec![w]),
        state: ControllerState::default(),
        cfg: cfg(),
        now: 100_000,
        moves: &[("w", "4-7", "1", 512)],
        outcomes: &[("w", "moved")],
    });

    let mut s = waited(
        cg("s", &[(0, 4.0)], &[(1, 64)], "0-3,16-19", "0-1"),
        &[(0, 8.0)],
    );
    s.constraints.single_numa_node = true;
    let p = plan(
        &machine(),
        &world(vec![s]),
        &ControllerState::default(),
        &cfg(),
        100_000,
    );
    let d = p.decision("s").unwrap();
    let singles: Vec<_> = d.considered.iter().filter(|c| c.nodes.len() == 1).collect();
    assert!(!singles.is_empty(), "no single node offered: {d:#?}");
    assert!(
        singles.iter().all(|c| !matches!(
            c.rejected,
            Some(TargetRejection::NoCpus { .. } | TargetRejection::TooManyNodes { .. })
        )),
        "single nodes refused for size: {d:#?}"
    );
}

/// Two nodes of 8 CPUs; node 1 has CPUs but no memory (its memory is all elsewhere).
fn machine_node1_without_memory() -> Topology {
    let mut t = TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 2,
        cores_per_node: 4,
        threads_per_core: 2,
        ..Default::default()
    }
    .build();
    t.nodes[1].memory_total_bytes = 0;
    t.nodes[1].memory_free_bytes = 0;
    t
}

/// cpuset.mems never names a node without memory (the kernel refuses the write): relief onto
/// such a node writes the nearest memory node into mems instead, as admission does, and is
/// priced so: its memory stays where it is (nothing to migrate, no free memory needed on the
/// node, which has none), and it is remote from there on (the locality it loses counts
/// against the relief). Once there, the same node is no move.
#[test]
fn relief_onto_a_node_without_memory_keeps_mems_on_memory_nodes() {
    let topo = machine_node1_without_memory();
    let a = cg("a", &[(0, 1.0)], &[(0, 16)], "0-3,8-11", "0");
    // node 0's queue four times its CPUs, node 1 idle
    let load = |n: u32| -> f64 {
        if n == 0 {
            4.0
        } else {
            0.1
        }
    };
    let mut obs = world(vec![a]);
    obs.nodes.retain(|&n, _| n < 2);
    obs.nodes.get_mut(&1).unwrap().free_bytes = 0;
    for (&n, o) in obs.nodes.iter_mut() {
        o.cpu_busy = load(n).min(1.0);
        o.runnable = Some(load(n));
    }
    let mut state = ControllerState::default();
    for _ in 0..61 {
        state.observe(&obs, 0.5);
    }
    let p = plan(&topo, &obs, &state, &cfg(), 0);
    let d = p.decision("a").unwrap();
    let m = p
        .moves
        .iter()
        .find(|m| m.cgroup == "a")
        .unwrap_or_else(|| panic!("a is moved: {d:#?}"));
    assert_eq!(m.to_cpus, topo.nodes[1].cpus, "{m:?}");
    assert_eq!(m.to_mems, set("0"), "{m:?}");
    assert_eq!(m.bytes_to_migrate, 0, "{m:?}");
    let c = d.considered.iter().find(|c| c.nodes == set("1")).unwrap();
    assert_eq!(c.locality_after, 0.0, "remote from node 1: {c:?}");

    // Where it went, seen in later rounds (poor locality there, node 0 still full): node 1
    // again is where it is, not a move.
    let mut there = cg("a", &[(1, 1.0)], &[(0, 16)], "", "");
    there.cpus = m.to_cpus.clone();
    there.mems = m.to_mems.clone();
    obs.cgroups = vec![there];
    let mut state = ControllerState::default();
    for _ in 0..61 {
        state.observe(&obs, 0.5);
    }
    let p = plan(&topo, &obs, &state, &cfg(), 0);
    let d = p.decision("a").unwrap();
    assert!(d.trigger.is_some(), "{d:#?}");
    let c = d.considered.iter().find(|c| c.nodes == set("1"));
    assert_eq!(
        c.and_then(|c| c.rejected.clone()),
        Some(TargetRejection::Unchanged),
        "{d:#?}"
    );
    assert!(p.moves.is_empty(), "{p:#?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    /// On a machine where some nodes have CPUs but no memory, every move's mems (and a
    /// stage's target) are memory nodes: those that stand in for the CPU nodes it goes to.
    #[test]
    fn mems_of_moves_are_memory_nodes(
        (obs, state, cfg, now) in arb_world(),
        holes in 1u32..255,
    ) {
        let mut topo = big();
        for n in &mut topo.nodes {
            if holes & (1 << n.id) != 0 {
                n.memory_total_bytes = 0;
            }
        }
        let with_memory: CpuSet = topo.nodes.iter().filter(|n| n.memory_total_bytes > 0).map(|n| n.id).collect();
        let p = plan(&topo, &obs, &state, &cfg, now);
        for m in &p.moves {
            let c = obs.cgroups.iter().find(|c| c.id == m.cgroup).unwrap();
            let Outcome::Moved { to_nodes } = &p.decision(&m.cgroup).unwrap().outcome else {
                panic!("{m:?} without its decision")
            };
            let toward = match &m.stage {
                Some(s) => {
                    prop_assert_eq!(&m.to_mems, &c.mems.union(&s.toward));
                    &s.toward
                }
                None => &m.to_mems,
            };
            prop_assert!(toward.is_subset(&with_memory), "{m:?}, memory on {with_memory}");
            prop_assert_eq!(toward, &topo.memory_nodes(to_nodes), "{:?}", m);
            if !c.constraints.keep_cpus {
                let cpu_nodes: CpuSet = m.to_cpus.iter().filter_map(|x| topo.node_of_cpu(x)).collect();
                prop_assert!(cpu_nodes.is_subset(to_nodes), "{m:?}");
            }
        }
    }
}

#[test]
fn every_outcome_reads_back_as_it_was_written() {
    // `rebalancer status` reads the decisions the daemon wrote: a skip's own `kind` must not
    // collide with the outcome's tag.
    let outcomes = [
        Outcome::Moved {
            to_nodes: CpuSet::from_iter([1]),
        },
        Outcome::Healthy,
        Outcome::NoData,
        Outcome::Skipped(Skip::Cooldown { remaining_ms: 5 }),
        Outcome::Skipped(Skip::MaxMoves),
    ];
    for o in outcomes {
        let json = serde_json::to_string(&o).unwrap();
        let back: Outcome = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
        assert_eq!(back, o, "{json}");
    }
}

/// A workload that keeps its CPUs (its threads' own affinity on node 0, a cpuset over every
/// node) and writes only its memory on node 3: the move of that memory to node 0 adds no CPU
/// load anywhere (where its threads run is not the move's doing), so node 0 being busy —
/// with the workload's own time, part of it spent elsewhere while it allocated — does not
/// reject it as overloaded.
#[test]
fn a_move_that_keeps_the_cpus_adds_no_load_to_its_target() {
    let mut w = cg(
        "w",
        &[(0, 0.5), (3, 0.5)],
        &[(0, 224), (3, 32)],
        "0-31",
        "0-3",
    );
    w.constraints.keep_cpus = true;
    w.constraints.allowed_nodes = Some(set("0"));
    w.written_bytes_per_node = [(3, 32 * MIB)].into();
    let mut obs = world(vec![w]);
    obs.nodes.get_mut(&0).unwrap().cpu_busy = 0.85;
    let p = plan(&machine(), &obs, &ControllerState::default(), &cfg(), 0);
    assert_eq!(
        kind(&p.decision("w").unwrap().outcome),
        "moved",
        "{:#?}",
        p.decisions
    );
    let m = &p.moves[0];
    assert_eq!(
        (m.to_cpus.to_string(), m.to_mems.to_string()),
        ("0-31".into(), "0".into())
    );
}

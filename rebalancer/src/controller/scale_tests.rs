//! Golden checks of whole rounds at scale: `ControllerState::observe` + `plan` on the
//! `planner_scale` bench's machines and population (2, 8 and 32 nodes, 1,000 cgroups) and on a
//! mixed population that reaches every gate (exclusive, pinned, in flight, keep-cpus, allowed
//! nodes, hugepages, overloaded and measured nodes, cooldowns, staged moves, duplicate ids).
//! The digests are of the JSON of the state after `observe` and of the plan (every decision
//! with every option's numbers, exact to the last bit of each f64), taken before the round's
//! hot paths were optimised: the optimisations must not change one decision.
//!
//! A deliberate change of the planner's cost model or rules changes them too: run
//! `REBALANCER_BLESS=1 cargo test -p rebalancer --lib scale_tests -- --nocapture` and paste the
//! printed digests after checking the change is meant.

use std::collections::{BTreeMap, VecDeque};

use super::*;
use crate::config::ControllerConfig;
use crate::cpuset::CpuSet;
use crate::topology::{Topology, TopologyBuilder};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const PERIOD_NS: u64 = 5_000_000_000;

/// The bench's machines: 16 cores × 2 threads per node, 2 / 8 / 32 nodes.
pub(super) fn machine(nodes: u32) -> Topology {
    let (sockets, per) = match nodes {
        2 => (2, 1),
        8 => (2, 4),
        _ => (4, nodes / 4),
    };
    TopologyBuilder {
        sockets,
        nodes_per_socket: per,
        cores_per_node: 16,
        threads_per_core: 2,
        memory_per_node_bytes: 512 * GIB,
        ..Default::default()
    }
    .build()
}

/// The bench's population (`benches/planner_scale.rs`, `observations`).
fn bench_obs(topo: &Topology, n: usize) -> Observations {
    let nodes = topo.nodes.len() as u32;
    let cgroups = (0..n)
        .map(|i| {
            let home = i as u32 % nodes;
            let other = (home + 1) % nodes;
            let mem = (64 + (i as u64 % 7) * 32) << 20;
            let mut mem_per_node = BTreeMap::from([(home, mem)]);
            if i % 5 == 0 {
                mem_per_node.insert(home, mem / 2);
                mem_per_node.insert(other, mem / 2);
            }
            CgroupObs {
                id: format!("kubepods/burstable/pod{i:05}/c"),
                cpu_ns_per_node: BTreeMap::from([(home, PERIOD_NS / 20)]),
                mem_bytes_per_node: mem_per_node,
                cpus: topo.nodes[home as usize].cpus.clone(),
                mems: CpuSet::from_iter([home]),
                ..Default::default()
            }
        })
        .collect();
    Observations {
        period_ns: PERIOD_NS,
        cgroups,
        nodes: topo
            .nodes
            .iter()
            .map(|nd| {
                let o = NodeObs {
                    cpu_busy: 0.5,
                    free_bytes: 256 * GIB,
                    free_hugepage_bytes: 0,
                    runnable: None,
                };
                (nd.id, o)
            })
            .collect(),
        reserved_cpus: CpuSet::new(),
    }
}

/// A small deterministic generator (64-bit LCG, high bits).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A mixed population on `topo`: `n` cgroups (two of them sharing an id), with a state that
/// has history, cooldowns and staged moves under way, and nodes of which some are overloaded.
pub(super) fn mixed(topo: &Topology, n: usize, seed: u64) -> (Observations, ControllerState) {
    let mut r = Rng(seed);
    let nodes = topo.nodes.len() as u64;
    let node = |r: &mut Rng| r.below(nodes) as u32;
    let mut state = ControllerState::default();
    // Exclusive CPUs are handed out core by core from the top of each node, never twice.
    let mut next_core: Vec<usize> = vec![0; topo.nodes.len()];
    let mut cgroups = Vec::new();
    for i in 0..n {
        let home = node(&mut r);
        let other = node(&mut r);
        let id = if i == 7 {
            "kubepods/burstable/pod00003/c".to_string()
        } else {
            format!("kubepods/burstable/pod{i:05}/c")
        };
        let demand_ns = PERIOD_NS / 100 * (1 + r.below(300));
        let mut cpu = BTreeMap::from([(home, demand_ns)]);
        if r.chance(30) {
            cpu.insert(other, demand_ns / (1 + r.below(4)));
        }
        let mut mem = BTreeMap::new();
        for _ in 0..1 + r.below(3) {
            mem.insert(node(&mut r), (16 + r.below(1024)) * MIB);
        }
        let mut huge = BTreeMap::new();
        if r.chance(5) {
            huge.insert(node(&mut r), (1 + r.below(4)) * 2 * MIB * 512);
        }
        let mut mems = CpuSet::from_iter([home]);
        if r.chance(25) {
            mems.insert(other);
        }
        let exclusive = r.chance(8);
        let cpus = if exclusive {
            let nd = &topo.nodes[home as usize];
            let cores: Vec<u32> = nd.cpus.iter().take(16).collect();
            let k = next_core[home as usize];
            if k + 2 <= cores.len() {
                next_core[home as usize] += 2;
                let mut s = CpuSet::new();
                for c in &cores[k..k + 2] {
                    s.insert(*c);
                    s.insert(*c + 16);
                }
                s
            } else {
                topo.cpus_of_nodes(&mems)
            }
        } else {
            topo.cpus_of_nodes(&mems)
        };
        let exclusive = exclusive && cpus.len() == 4;
        let keep_cpus = !exclusive && r.chance(5);
        let constraints = Constraints {
            allowed_nodes: r.chance(10).then(|| {
                let mut a = CpuSet::from_iter([home, other]);
                a.insert(node(&mut r));
                a
            }),
            exclusive,
            exclusive_cpus: if exclusive && r.chance(50) { 2 } else { 0 },
            needs_hugepages: !huge.is_empty(),
            single_numa_node: r.chance(10),
            max_nodes: r.chance(10).then(|| 1 + r.below(3) as u32),
            pinned: r.chance(3),
            keep_cpus,
            moving: r.chance(2),
        };
        let (local_faults, remote_faults) = if r.chance(10) {
            (Some(r.below(1000)), Some(r.below(1000)))
        } else {
            (None, None)
        };
        let cg = CgroupObs {
            id: id.clone(),
            cpu_ns_per_node: cpu,
            mem_bytes_per_node: mem,
            hugepage_bytes_per_node: huge,
            cross_node_migrations: if r.chance(10) { r.below(20_000) } else { 0 },
            local_faults,
            remote_faults,
            cpus: cpus.clone(),
            mems: mems.clone(),
            constraints,
            ..Default::default()
        };
        // History: a smoothed score, cooldowns (some from a move whose CPUs the operator
        // changed since), staged moves under way.
        if r.chance(70) {
            let st = state.cgroups.entry(id).or_default();
            st.periods = r.below(30);
            if r.chance(80) {
                st.smoothed = Some(r.below(1000) as f64 / 1000.0);
                st.smoothed_from = [(locality::Evidence::ShareModel, 1 + r.below(9) as u32)]
                    .into_iter()
                    .collect();
            }
            if r.chance(20) {
                // Moved before, as `record_move` counts it: relief may take it (`moved`).
                st.moves = 1;
                st.last_move_ms = Some(r.below(200_000));
                st.last_cpus = Some(if r.chance(70) {
                    cpus.clone()
                } else {
                    CpuSet::new()
                });
            }
            if r.chance(2) {
                st.staging = Some(Staging {
                    to_cpus: cpus,
                    toward: CpuSet::from_iter([home]),
                    remaining_bytes: r.below(4096) * MIB,
                });
            }
        }
        cgroups.push(cg);
    }
    // Some of the state's cgroups are gone.
    for i in 0..20 {
        state
            .cgroups
            .entry(format!("kubepods/besteffort/gone{i:03}"))
            .or_default()
            .periods = 3;
    }
    let mut obs_nodes = BTreeMap::new();
    for nd in &topo.nodes {
        let hot = r.chance(25);
        let busy = if hot {
            0.9 + r.below(100) as f64 / 1000.0
        } else {
            r.below(900) as f64 / 1000.0
        };
        let o = NodeObs {
            cpu_busy: busy,
            free_bytes: r.below(64) * GIB,
            free_hugepage_bytes: r.below(8) * GIB,
            runnable: r.chance(60).then(|| busy + r.below(1500) as f64 / 1000.0),
        };
        let h: VecDeque<f64> = (0..r.below(12))
            .map(|_| if hot && r.chance(85) { 1.0 } else { 0.5 })
            .collect();
        state.node_pressure.insert(nd.id, h);
        obs_nodes.insert(nd.id, o);
    }
    // Lists the cgroups in an order that is not the id order.
    cgroups.reverse();
    let obs = Observations {
        period_ns: PERIOD_NS,
        cgroups,
        nodes: obs_nodes,
        reserved_cpus: CpuSet::from_iter([0, 1]),
    };
    (obs, state)
}

/// FNV-1a over the JSON: exact (serde_json prints the shortest f64 that reads back the same).
fn digest<T: serde::Serialize>(v: &T) -> u64 {
    let bytes = serde_json::to_vec(v).unwrap();
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// One round as the daemon runs it: observe into the state, plan on the result with the
/// scores observe folded in; `plan`, which scores the observations itself, decides the same.
fn round(
    topo: &Topology,
    obs: &Observations,
    mut state: ControllerState,
    cfg: &ControllerConfig,
) -> (ControllerState, Plan) {
    let scores = state.observe_scored(obs, crate::controller::EWMA_ALPHA);
    let plan = plan_scored(topo, obs, &scores, &state, cfg, 120_000);
    let unscored = super::plan(topo, obs, &state, cfg, 120_000);
    assert_eq!(
        digest(&plan),
        digest(&unscored),
        "plan_scored and plan differ"
    );
    // Scores that cannot be these observations' are not used.
    let other = plan_scored(topo, obs, &Scores::default(), &state, cfg, 120_000);
    assert_eq!(
        digest(&plan),
        digest(&other),
        "plan_scored used foreign scores"
    );
    (state, plan)
}

fn check(name: &str, got: (u64, u64), want: (u64, u64), bless: &mut Vec<String>) {
    if std::env::var_os("REBALANCER_BLESS").is_some() {
        bless.push(format!("(\"{name}\", {:#018x}, {:#018x}),", got.0, got.1));
        return;
    }
    assert_eq!(
        got, want,
        "{name}: (state, plan) digests changed: the round's decisions are not what they were"
    );
}

/// (name, state digest, plan digest).
const GOLDEN: &[(&str, u64, u64)] = &[
    ("bench-2n-1000", 0x9c7afbf4918a1b4e, 0x0bbfedb88b653256),
    ("bench-8n-1000", 0x4b150aaf23f1ba2b, 0x5205c22a99750029),
    ("bench-32n-1000", 0x4e55f233f359435f, 0x209a100cfd8a5097),
    ("mixed-2n-1-default", 0xd513ddddc9e5e1b8, 0x4cf7922629480234),
    ("mixed-2n-1-wide", 0x7094ed9daeaa780e, 0x9eae620fd68add20),
    ("mixed-2n-1-tight", 0x7094ed9daeaa780e, 0x6095c47fa37f9dc1),
    ("mixed-2n-2-default", 0x139585c6d3f25dc1, 0xace35b928cb6d9a7),
    ("mixed-2n-2-wide", 0x9ad6c48de1198682, 0xef2c7d83804828d9),
    ("mixed-2n-2-tight", 0x9ad6c48de1198682, 0xac740364cb467521),
    ("mixed-2n-3-default", 0xe4b25274d1bd4ca1, 0x1ffe84529d824711),
    ("mixed-2n-3-wide", 0x27ab2c61af7d3ed9, 0xda19295dbf3d9796),
    ("mixed-2n-3-tight", 0x27ab2c61af7d3ed9, 0x8ef5d295c82b09e7),
    ("mixed-8n-1-default", 0x25dc4d230c955cb7, 0xa800fe6dbc7c07f8),
    ("mixed-8n-1-wide", 0x20a4ba573cafe05d, 0xe2f8afcae289f6d2),
    ("mixed-8n-1-tight", 0x20a4ba573cafe05d, 0x49f393d0dbda764a),
    ("mixed-8n-2-default", 0xe7bb48348019cf34, 0xef3e09d886871b4f),
    ("mixed-8n-2-wide", 0xafdd67405d8751e4, 0xb768e1a3998f7ae3),
    ("mixed-8n-2-tight", 0xafdd67405d8751e4, 0x7793fc86121d326b),
    ("mixed-8n-3-default", 0xee39d1d9566cc2b8, 0x19d92182d8abcd9e),
    ("mixed-8n-3-wide", 0xd621f1c86d2b2035, 0x84185971cba7079e),
    ("mixed-8n-3-tight", 0xd621f1c86d2b2035, 0x41ddd08eccd80211),
    (
        "mixed-32n-1-default",
        0xe9af4689bf3c73fc,
        0x2611542df9b3966b,
    ),
    ("mixed-32n-1-wide", 0x116319048dbee724, 0xb3b6aeb98f6b38e0),
    ("mixed-32n-1-tight", 0x116319048dbee724, 0x86102c1f601d71e4),
    (
        "mixed-32n-2-default",
        0xd75046b5f14f00f6,
        0x0031ffc968ce84a9,
    ),
    ("mixed-32n-2-wide", 0xed6e96ad8a2751eb, 0x43fba8117bc24bf6),
    ("mixed-32n-2-tight", 0xed6e96ad8a2751eb, 0x4d0379090b89b771),
    (
        "mixed-32n-3-default",
        0xf12414b9910e0411,
        0x7f86c0b276d5baae,
    ),
    ("mixed-32n-3-wide", 0x8b067910692f299f, 0x6bec178828648c4e),
    ("mixed-32n-3-tight", 0x8b067910692f299f, 0x4a2383d93b0628e7),
];

fn want(name: &str) -> (u64, u64) {
    GOLDEN
        .iter()
        .find(|g| g.0 == name)
        .map_or((0, 0), |g| (g.1, g.2))
}

#[test]
fn bench_rounds_decide_as_before() {
    let cfg = ControllerConfig::default();
    let mut bless = Vec::new();
    for nodes in [2u32, 8, 32] {
        let topo = machine(nodes);
        let obs = bench_obs(&topo, 1_000);
        let mut state = ControllerState::default();
        state.observe(&obs, crate::controller::EWMA_ALPHA);
        let (st, p) = round(&topo, &obs, state, &cfg);
        assert_eq!(p.moves.len(), 4, "{nodes}n: the bench's round moves");
        assert_eq!(p.decisions.len(), 1_000);
        let name = format!("bench-{nodes}n-1000");
        check(&name, (digest(&st), digest(&p)), want(&name), &mut bless);
    }
    for b in &bless {
        println!("{b}");
    }
}

#[test]
fn mixed_rounds_decide_as_before() {
    let mut bless = Vec::new();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let cfgs = [
        ("default", ControllerConfig::default()),
        (
            "wide",
            ControllerConfig {
                move_exclusive: true,
                migration_budget_mib: 4096,
                ..ControllerConfig::default()
            },
        ),
        (
            "tight",
            ControllerConfig {
                migration_budget_mib: 256,
                ..ControllerConfig::default()
            },
        ),
    ];
    for nodes in [2u32, 8, 32] {
        let topo = machine(nodes);
        for seed in 1..=3u64 {
            let (obs, state) = mixed(&topo, 600, seed * 7919 + u64::from(nodes));
            for (cname, cfg) in &cfgs {
                let mut state = state.clone();
                if *cname != "default" {
                    // No stage under way takes the budget first: new moves get staged.
                    for s in state.cgroups.values_mut() {
                        s.staging = None;
                    }
                }
                let (st, p) = round(&topo, &obs, state, cfg);
                for m in &p.moves {
                    let k = match (&m.stage, m.net == 0.0 && m.to_cpus == m.from_cpus) {
                        (_, true) => "move:stage-continued",
                        (Some(_), false) => "move:staged",
                        (None, false) => "move:plain",
                    };
                    *kinds.entry(k.into()).or_default() += 1;
                }
                for d in &p.decisions {
                    if let Some(t) = &d.trigger {
                        let v = serde_json::to_value(t).unwrap();
                        let k = format!("trigger:{}", v["kind"].as_str().unwrap());
                        *kinds.entry(k).or_default() += 1;
                    }
                    let k = match &d.outcome {
                        Outcome::Skipped(s) => {
                            let v = serde_json::to_value(s).unwrap();
                            format!("skip:{}", v["kind"].as_str().unwrap())
                        }
                        o => format!("{:?}", std::mem::discriminant(o)),
                    };
                    *kinds.entry(k).or_default() += 1;
                }
                let name = format!("mixed-{nodes}n-{seed}-{cname}");
                check(&name, (digest(&st), digest(&p)), want(&name), &mut bless);
            }
        }
    }
    for b in &bless {
        println!("{b}");
    }
    println!("{kinds:?}");
    // The population reaches the gates the optimisations touch.
    for k in [
        "skip:budget",
        "skip:cooldown",
        "skip:max-moves",
        "skip:exclusive",
        "skip:pinned",
        "skip:in-flight",
        "skip:no-feasible-target",
        "skip:no-better-target",
        "skip:below-min-gain",
        "move:plain",
        "move:staged",
        "move:stage-continued",
        "trigger:poor-locality",
        "trigger:overloaded",
        "trigger:migrating",
    ] {
        assert!(
            kinds.get(k).is_some_and(|&c| c > 0),
            "{k} never reached: {kinds:?}"
        );
    }
}

/// The first evaluation split over threads decides exactly as on one: every mixed round (all
/// three configs) and a bench round, planned on 1, 2, 3 and 7 threads (more threads than
/// the machine has CPUs still run, and a chunk count that does not divide the cgroups).
#[test]
fn rounds_on_several_threads_decide_as_on_one() {
    let cfgs = [
        ControllerConfig::default(),
        ControllerConfig {
            move_exclusive: true,
            migration_budget_mib: 4096,
            ..ControllerConfig::default()
        },
    ];
    for nodes in [2u32, 8, 32] {
        let topo = machine(nodes);
        let mut cases = vec![{
            let obs = bench_obs(&topo, 1_001);
            let mut state = ControllerState::default();
            state.observe(&obs, crate::controller::EWMA_ALPHA);
            (obs, state)
        }];
        cases.extend((1..=2u64).map(|seed| mixed(&topo, 601, seed * 7919 + u64::from(nodes))));
        for (obs, state) in &cases {
            for cfg in &cfgs {
                let mut st = state.clone();
                let scores = st.observe_scored(obs, crate::controller::EWMA_ALPHA);
                let one = planner::plan_with(&topo, obs, &scores, &st, cfg, 120_000, Some(1));
                assert!(!one.decisions.is_empty());
                for threads in [2, 3, 7] {
                    let many =
                        planner::plan_with(&topo, obs, &scores, &st, cfg, 120_000, Some(threads));
                    assert_eq!(
                        digest(&one),
                        digest(&many),
                        "{nodes}n, {threads} threads: a different plan"
                    );
                    assert_eq!(one, many);
                }
            }
        }
    }
}

//! Simulator tests: determinism for a seed, and small scenarios whose outcome the model fixes.

use super::workload::{Phase, Task};
use super::*;
use crate::placement::pod::{Container, Pod};
use crate::topology::TopologyBuilder;

const GIB: u64 = 1 << 30;

fn machine() -> Topology {
    TopologyBuilder {
        sockets: 2,
        nodes_per_socket: 2,
        cores_per_node: 4,
        threads_per_core: 2,
        memory_per_node_bytes: 32 * GIB,
        ..Default::default()
    }
    .build()
}

fn all() -> Vec<SimPolicy> {
    vec![
        SimPolicy::Rebalancer,
        SimPolicy::Static,
        SimPolicy::Kubelet,
        SimPolicy::Autonuma,
        SimPolicy::Oracle,
    ]
}

#[test]
fn a_simulation_is_deterministic_for_a_seed() {
    let mut trace = generate(Kind::ChurnStorm, 11);
    trace.duration_s = 120;
    let topo = machine();
    let cfg = SimConfig::default();
    let a = simulate(&topo, "synthetic", &trace, &cfg, &all()).unwrap();
    let b = simulate(&topo, "synthetic", &trace, &cfg, &all()).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    // and the seed matters
    let mut other = generate(Kind::ChurnStorm, 12);
    other.duration_s = 120;
    let c = simulate(&topo, "synthetic", &other, &cfg, &all()).unwrap();
    assert_ne!(a.policies, c.policies);
    for p in &a.policies {
        assert_eq!(p.invariant_violations, 0, "{p:?}");
        assert!(p.admitted > 0, "{p:?}");
    }
}

fn task(uid: &str, arrive_s: u64, phases: Vec<Phase>, mem: u64) -> Task {
    Task {
        pod: Pod {
            uid: uid.into(),
            containers: vec![Container {
                name: "main".into(),
                cpu_request_millis: 2000,
                cpu_limit_millis: 4000,
                memory_bytes: GIB,
                ..Default::default()
            }],
            init_containers: Vec::new(),
        },
        arrive_s,
        leave_s: None,
        initial_mem_bytes: mem,
        hugepages: false,
        phases,
    }
}

fn phase(at_s: u64, cpus: f64, mem: f64) -> Phase {
    Phase {
        at_s,
        cpus,
        mem_intensity: mem,
        cross_node_migrations_per_s: 0.0,
        io_intensity: 0.0,
        grow_bytes_per_s: 0,
    }
}

/// A BestEffort pod gets the whole machine: its threads and first-touch memory spread over
/// every node (locality ≈ 1/4). The planner consolidates it; the oracle starts consolidated;
/// static stays spread.
#[test]
fn spread_workload_is_consolidated_by_the_planner() {
    let mut be = task("be", 0, vec![phase(0, 2.0, 0.6)], GIB / 2);
    be.pod.containers[0] = Container {
        name: "main".into(),
        ..Default::default()
    };
    let trace = Workload {
        name: "spread".into(),
        seed: 0,
        duration_s: 120,
        machine: Default::default(),
        tasks: vec![be],
    };
    let r = simulate(
        &machine(),
        "synthetic",
        &trace,
        &SimConfig::default(),
        &all(),
    )
    .unwrap();
    let get = |p| r.policies.iter().find(|x| x.policy == p).unwrap();
    let (reb, st, or) = (
        get(SimPolicy::Rebalancer),
        get(SimPolicy::Static),
        get(SimPolicy::Oracle),
    );
    assert!(st.mean_locality < 0.35, "{st:?}");
    assert!(reb.moves >= 1, "{reb:?}");
    assert!(reb.mean_locality > 0.8, "{reb:?}");
    assert!(or.mean_locality > 0.99, "{or:?}");
    assert!(reb.slowdown < st.slowdown, "{reb:?} vs {st:?}");
    assert_eq!(reb.move_reversals, 0);
    let v = r.vs_oracle.unwrap();
    assert!(v.locality_ratio > 0.8 && v.locality_ratio <= 1.0, "{v:?}");
}

/// AutoNUMA moves pages toward threads at its rate: a Guaranteed neighbour taking one node's
/// CPUs pushes a machine-wide pod's threads off it, and its pages follow; hugetlb memory is
/// never moved by it.
#[test]
fn autonuma_moves_pages_at_its_rate_but_not_hugepages() {
    let mut be = task("be", 0, vec![phase(0, 2.0, 0.5)], 2 * GIB);
    be.pod.containers[0] = Container {
        name: "main".into(),
        ..Default::default()
    };
    let mut hog = task("hog", 5, vec![phase(0, 8.0, 0.1)], GIB / 4);
    let c = &mut hog.pod.containers[0];
    (
        c.cpu_request_millis,
        c.cpu_limit_millis,
        c.memory_limit_bytes,
    ) = (8000, 8000, GIB);
    let mut trace = Workload {
        name: "an".into(),
        seed: 0,
        duration_s: 60,
        machine: Default::default(),
        tasks: vec![be, hog],
    };
    let cfg = SimConfig::default();
    let st = run_policy(&machine(), &trace, &cfg, SimPolicy::Kubelet).unwrap();
    let r = run_policy(&machine(), &trace, &cfg, SimPolicy::Autonuma).unwrap();
    assert!(r.bytes_migrated > 0, "{r:?}");
    assert!(
        r.bytes_migrated <= 2 * 60 * cfg.model.autonuma_bytes_per_s,
        "{r:?}"
    );
    assert!(r.mean_locality > st.mean_locality, "{r:?} vs {st:?}");
    assert_eq!((r.moves, st.bytes_migrated), (0, 0));
    trace.tasks[0].hugepages = true;
    trace.machine.hugepages_1g_per_node = Some(4);
    let topo = trace.machine(&machine());
    let r = run_policy(&topo, &trace, &cfg, SimPolicy::Autonuma).unwrap();
    assert_eq!(r.bytes_migrated, 0, "{r:?}");
}

/// Pods the real allocator refuses are counted, identically under every policy.
#[test]
fn rejections_come_from_the_real_allocator() {
    let tasks = (0..6)
        .map(|i| {
            let mut t = task(&format!("t{i}"), 0, vec![phase(0, 1.0, 0.1)], GIB);
            t.pod.containers[0].cpu_request_millis = 8000;
            t.pod.containers[0].cpu_limit_millis = 8000;
            t
        })
        .collect();
    let trace = Workload {
        name: "full".into(),
        seed: 0,
        duration_s: 5,
        machine: Default::default(),
        tasks,
    };
    let r = simulate(
        &machine(),
        "synthetic",
        &trace,
        &SimConfig::default(),
        &all(),
    )
    .unwrap();
    for p in &r.policies {
        // 32 CPUs allocatable, 8 CPUs each: 4 fit
        assert_eq!((p.admitted, p.rejections), (4, 2), "{p:?}");
    }
}

/// A thread-spreading workload (BestEffort: the whole machine; 4000 cross-node migrations/s
/// while its threads span nodes). Static leaves it spread and pays for every crossing; the
/// planner consolidates it onto one node, after which its threads cross no node.
#[test]
fn thread_spreading_workload_is_consolidated_and_stops_crossing_nodes() {
    let spread = |rate: f64| {
        let mut p = phase(0, 2.0, 0.3);
        p.cross_node_migrations_per_s = rate;
        let mut be = task("spreader", 0, vec![p], GIB / 4);
        be.pod.containers[0] = Container {
            name: "main".into(),
            ..Default::default()
        };
        Workload {
            name: "thread-spread".into(),
            seed: 0,
            duration_s: 120,
            machine: Default::default(),
            tasks: vec![be],
        }
    };
    let run = |rate: f64| {
        simulate(
            &machine(),
            "synthetic",
            &spread(rate),
            &SimConfig::default(),
            &[SimPolicy::Static, SimPolicy::Rebalancer],
        )
        .unwrap()
        .policies
    };
    let busy = run(4000.0);
    let quiet = run(0.0);
    let (st, reb) = (&busy[0], &busy[1]);
    assert_eq!(st.cross_node_migrations, 4000 * 120, "{st:?}");
    assert!(reb.moves >= 1, "{reb:?}");
    assert!(
        reb.cross_node_migrations * 5 < st.cross_node_migrations,
        "consolidated: {reb:?} vs {st:?}"
    );
    // Each crossing costs 50 µs of CPU: 4000/s on 2 CPUs of work is +0.1 slowdown.
    assert!(
        (st.slowdown - quiet[0].slowdown - 0.1).abs() < 0.005,
        "{} vs {}",
        st.slowdown,
        quiet[0].slowdown
    );
    assert!(reb.slowdown < st.slowdown, "{reb:?} vs {st:?}");
    assert_eq!(quiet[0].cross_node_migrations, 0);
}

/// The diagnostics: `log_moves` records each move with the option the planner priced, and a
/// `frozen` workload is never moved (the counterfactual `simulate --attribute` runs); with it
/// frozen, the Rebalancer is the Static run.
#[test]
fn moves_are_logged_and_a_frozen_workload_is_never_moved() {
    let mut be = task("be", 0, vec![phase(0, 2.0, 0.6)], GIB / 2);
    be.pod.containers[0] = Container {
        name: "main".into(),
        ..Default::default()
    };
    let trace = Workload {
        name: "spread".into(),
        seed: 0,
        duration_s: 120,
        machine: Default::default(),
        tasks: vec![be],
    };
    let logged = SimConfig {
        log_moves: true,
        ..SimConfig::default()
    };
    let r = simulate(
        &machine(),
        "synthetic",
        &trace,
        &logged,
        &[SimPolicy::Rebalancer],
    )
    .unwrap();
    let reb = &r.policies[0];
    assert!(reb.moves >= 1, "{reb:?}");
    assert_eq!(reb.move_log.len() as u64, reb.moves, "{reb:?}");
    let first = &reb.move_log[0];
    assert_eq!(first.cgroup, "be");
    let priced = first.priced.as_ref().expect("a new move is priced");
    assert!(priced.net > 0.0, "{priced:?}");
    // Not logged unless asked.
    let plain = simulate(
        &machine(),
        "synthetic",
        &trace,
        &SimConfig::default(),
        &[SimPolicy::Rebalancer],
    )
    .unwrap();
    assert!(plain.policies[0].move_log.is_empty());
    assert_eq!(plain.policies[0].slowdown, reb.slowdown);

    let frozen = SimConfig {
        frozen: ["be".to_string()].into(),
        ..SimConfig::default()
    };
    let r = simulate(
        &machine(),
        "synthetic",
        &trace,
        &frozen,
        &[SimPolicy::Rebalancer, SimPolicy::Static],
    )
    .unwrap();
    assert_eq!(r.policies[0].moves, 0, "{:?}", r.policies[0]);
    assert_eq!(r.policies[0].slowdown, r.policies[1].slowdown);
}

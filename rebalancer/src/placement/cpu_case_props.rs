//! Property test: on random machines, free CPUs and requests, the exclusive CPUs the admission
//! engine gives a Guaranteed container are exactly what `rebalancer hints cpu` answers for the
//! same machine, free CPUs, request and options (its code path: the case parsed from JSON as
//! the command reads it, then evaluated) — so the contract checked from outside is what pods
//! get.
use proptest::prelude::*;
use serde_json::json;

use crate::config::{MemoryManagerPolicy, PlacementConfig, TopologyPolicy};
use crate::cpuset::CpuSet;
use crate::placement::admission::{Allocator, Container, Pod};
use crate::placement::cpu_case;
use crate::topology::{Topology, TopologyBuilder};

/// The machine as the `hints cpu` contract describes it, from what kubelet's discovery reads:
/// a core is keyed by its lowest thread id, the uncore cache by the L3 (else the socket).
fn case_topology(t: &Topology) -> serde_json::Value {
    let cpus: Vec<serde_json::Value> = t
        .cpus
        .iter()
        .filter(|c| c.online)
        .map(|c| {
            json!({
                "cpu": c.id,
                "core": c.siblings.iter().next().unwrap_or(c.id).min(c.id),
                "socket": c.socket,
                "numa": c.node.unwrap(),
                "uncore": c.l3.unwrap_or(c.socket),
            })
        })
        .collect();
    json!({ "cpus": cpus })
}

#[derive(Clone, Debug)]
struct World {
    sockets: u32,
    nodes_per_socket: u32,
    cores_per_node: u32,
    threads: u32,
    cores_per_l3: u32,
    /// Bits of the CPUs reserved (not free), by id.
    taken: u64,
    request: usize,
    across_numa: bool,
    across_cores: bool,
    by_uncore: bool,
}

fn world() -> impl Strategy<Value = World> {
    (
        (1u32..=2, 1u32..=3, 1u32..=4, 1u32..=2, 1u32..=4),
        any::<u64>(),
        1usize..=40,
        (any::<bool>(), any::<bool>(), any::<bool>()),
    )
        .prop_map(|((s, n, c, t, l3), taken, request, (an, ac, bu))| World {
            sockets: s,
            nodes_per_socket: n,
            cores_per_node: c,
            threads: t,
            cores_per_l3: l3,
            taken,
            request,
            across_numa: an,
            across_cores: ac,
            by_uncore: bu,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn admission_takes_the_cpus_hints_cpu_answers(w in world()) {
        // kubelet refuses these option pairs at start; the engine's config does too
        prop_assume!(!(w.across_numa && w.across_cores));
        prop_assume!(!(w.by_uncore && (w.across_numa || w.across_cores)));
        let topo = TopologyBuilder {
            sockets: w.sockets,
            nodes_per_socket: w.nodes_per_socket,
            cores_per_node: w.cores_per_node,
            threads_per_core: w.threads,
            cores_per_l3: w.cores_per_l3,
            ..Default::default()
        }
        .build();
        let online = topo.online_cpus();
        let taken: CpuSet = online.iter().filter(|c| w.taken >> (c % 64) & 1 == 1).collect();
        prop_assume!(!online.is_subset(&taken));
        let free = online.difference(&taken);
        let request = w.request.min(free.len() + 1);

        // the engine: the taken CPUs reserved, a Guaranteed container of `request` CPUs
        let cfg = PlacementConfig {
            policy: TopologyPolicy::None,
            memory_manager_policy: MemoryManagerPolicy::None,
            reserved_cpus: taken.clone(),
            distribute_cpus_across_numa: w.across_numa,
            distribute_cpus_across_cores: w.across_cores,
            prefer_align_cpus_by_uncorecache: w.by_uncore,
            ..Default::default()
        };
        let mut a = Allocator::new(&topo, &cfg).unwrap();
        let pod = Pod {
            uid: "p".into(),
            containers: vec![Container {
                name: "c".into(),
                cpu_limit_millis: request as u64 * 1000,
                memory_limit_bytes: 1 << 20,
                ..Default::default()
            }],
            init_containers: vec![],
        };
        let engine = a.admit(&topo, &cfg, &pod).map(|p| p[0].cpus.clone());

        // the command: the same question as a case
        let case = json!({
            "topology": case_topology(&topo),
            "available": free.to_string(),
            "request": request,
            "options": {
                "distribute_cpus_across_numa": w.across_numa,
                "cpu_group_size": 1,
                "distribute_cpus_across_cores": w.across_cores,
                "prefer_align_cpus_by_uncorecache": w.by_uncore,
            },
        });
        let command = cpu_case::parse_case(&case).unwrap().evaluate();
        match (&engine, &command) {
            (Ok(e), Ok(c)) => prop_assert_eq!(e, c, "free {} request {}", free, request),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "engine {:?} but hints cpu {:?} (free {}, request {})", engine, command, free, request),
        }
    }
}

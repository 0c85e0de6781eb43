//! Property test: the short way of pricing a single node (`Projection::price_single`) gives
//! exactly what the general code (`Projection::price`) gives — every figure to the last bit,
//! every rejection, the same picks — for every candidate of random populations (the golden
//! rounds' generator: exclusive, pinned, keep-cpus, hugepages, overloaded and measured nodes)
//! on 2, 8 and 32 nodes, some without memory, under random overload thresholds.
use proptest::prelude::*;

use super::Projection;
use crate::config::ControllerConfig;
use crate::controller::scale_tests::{machine, mixed};
use crate::controller::{ControllerState, Observations};
use crate::topology::Topology;

/// The machine, with node `without` (if any) holding no memory (a CPU-only node).
fn topology(nodes: u32, without: Option<u32>) -> Topology {
    let mut topo = machine(nodes);
    if let Some(k) = without {
        let n = &mut topo.nodes[(k % nodes) as usize];
        n.memory_total_bytes = 0;
        n.memory_free_bytes = 0;
    }
    topo
}

/// Every candidate's options priced both ways: (the number of candidates the short way may
/// take, the first difference).
fn compare(
    topo: &Topology,
    obs: &Observations,
    state: &ControllerState,
    cfg: &ControllerConfig,
) -> (usize, Option<String>) {
    let fast = Projection::new(topo, obs, state, cfg);
    let mut general = Projection::new(topo, obs, state, cfg);
    general.general_only = true;
    let mut shared = 0;
    for cg in &obs.cgroups {
        let smoothed = state
            .cgroups
            .get(&cg.id)
            .and_then(|s| s.smoothed)
            .or(Some(0.3));
        let Some(trigger) = fast.trigger(cg, smoothed, cfg) else {
            continue;
        };
        let c = &cg.constraints;
        shared += usize::from(
            !c.exclusive
                && !c.keep_cpus
                && !matches!(trigger, crate::controller::Trigger::Overloaded { .. }),
        );
        for lived_ms in [0, 90_000, cfg.horizon_ms] {
            let a = fast.options(obs, cg, &trigger, smoothed, cfg, lived_ms);
            let b = general.options(obs, cg, &trigger, smoothed, cfg, lived_ms);
            // Debug prints each f64 exactly (shortest round trip, -0.0 and NaN included).
            let (a, b) = (format!("{a:?}"), format!("{b:?}"));
            if a != b {
                return (
                    shared,
                    Some(format!("{}:\n  short   {a}\n  general {b}", cg.id)),
                );
            }
        }
    }
    (shared, None)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_single_node_is_priced_as_the_general_code_prices_it(
        nodes in prop::sample::select(vec![2u32, 8, 32]),
        without in prop::option::of(0u32..32),
        seed in any::<u64>(),
        overload_busy in 0.3f64..1.2,
        move_exclusive in any::<bool>(),
    ) {
        let topo = topology(nodes, without);
        let (obs, state) = mixed(&topo, 150, seed);
        let cfg = ControllerConfig {
            overload_busy,
            move_exclusive,
            ..ControllerConfig::default()
        };
        let (_, diff) = compare(&topo, &obs, &state, &cfg);
        prop_assert!(diff.is_none(), "{}", diff.unwrap_or_default());
    }
}

/// The property above is not vacuous: its populations hold candidates the short way takes.
#[test]
fn the_short_way_is_taken() {
    let topo = topology(8, Some(3));
    let (obs, state) = mixed(&topo, 150, 7);
    let (shared, diff) = compare(&topo, &obs, &state, &ControllerConfig::default());
    assert!(diff.is_none(), "{}", diff.unwrap_or_default());
    assert!(
        shared > 20,
        "only {shared} candidates priced as shared CPUs"
    );
}

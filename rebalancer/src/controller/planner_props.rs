//! Property test: `choose`'s one walk finds the option the ranking picks among the acceptable
//! options within the budget (the first of equals, as `min_by` keeps it) — on random options
//! with ties in net, bytes and node count, sets over two words, rejections and NaN nets — and
//! without one answers as before (a skip, or a staged option over the budget).
use std::cmp::Ordering;

use proptest::prelude::*;

use super::choose;
use crate::config::ControllerConfig;
use crate::controller::{Considered, TargetRejection};
use crate::cpuset::CpuSet;

/// The ranking's pick among the acceptable options within `budget`, walked as a list.
fn ranked_within(options: &[Considered], cfg: &ControllerConfig, budget: u64) -> Option<usize> {
    let rank = |a: &usize, b: &usize| -> Ordering {
        let (x, y) = (&options[*a], &options[*b]);
        y.net
            .total_cmp(&x.net)
            .then(x.bytes_to_migrate.cmp(&y.bytes_to_migrate))
            .then(x.nodes.len().cmp(&y.nodes.len()))
            .then_with(|| x.nodes.cmp_ids(&y.nodes))
    };
    (0..options.len())
        .filter(|&k| {
            let c = &options[k];
            c.rejected.is_none()
                && c.gain >= cfg.min_gain
                && c.net > 0.0
                && c.bytes_to_migrate <= budget
        })
        .min_by(rank)
}

fn option() -> impl Strategy<Value = Considered> {
    (
        prop::collection::vec(
            prop::sample::select(vec![0u32, 1, 2, 63, 64, 70, 127]),
            1..4,
        ),
        prop::sample::select(vec![-1.0f64, 0.0, 0.5, 2.0, 2.0, 7.5, f64::NAN]),
        prop::sample::select(vec![0.0f64, 0.01, 0.2, 0.2]),
        prop::sample::select(vec![0u64, 1 << 20, 1 << 20, 1 << 30]),
        prop::option::weighted(0.2, Just(TargetRejection::Unchanged)),
    )
        .prop_map(|(nodes, net, gain, bytes, rejected)| Considered {
            nodes: CpuSet::from_iter(nodes),
            locality_after: 1.0,
            bytes_to_migrate: bytes,
            gain,
            relief: 0.0,
            horizon_ms: 0,
            relief_horizon_ms: 0,
            migrations_avoided_per_s: 0.0,
            saving: net,
            cost: 0.0,
            contention: 0.0,
            net,
            rejected,
        })
}

proptest! {
    #[test]
    fn choose_picks_as_the_ranking_does(
        options in prop::collection::vec(option(), 0..40),
        budget in prop::sample::select(vec![0u64, 1 << 20, 300 << 20, 1 << 30]),
        min_gain in prop::sample::select(vec![0.0f64, 0.05]),
    ) {
        let cfg = ControllerConfig { min_gain, ..ControllerConfig::default() };
        let got = choose(&options, &cfg, budget);
        match ranked_within(&options, &cfg, budget) {
            Some(k) => prop_assert_eq!(got, Ok(k)),
            // Nothing within the budget: a skip, or an option over it to stage.
            None => prop_assert!(
                got.as_ref().map_or(true, |&k| options[k].bytes_to_migrate > budget),
                "{got:?}"
            ),
        }
    }
}

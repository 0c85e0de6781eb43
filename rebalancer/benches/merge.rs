//! Hint-merge time at 4, 8, 16 and 64 NUMA nodes with 4 providers of realistic hints (target:
//! 64 nodes × 4 providers under 10 ms): `merge` (the branch-and-bound search), `merge_reachable`
//! (the previous engine: the set of reachable masks) and, up to 8 nodes, `merge_enumerate`.
//!
//! The machine has sockets of up to 8 nodes. Each provider offers what a kubelet-style provider
//! would for a request it can place on one node of its free set: a preferred single-node hint per
//! free node, then non-preferred hints for every pair of nodes inside a socket, every whole socket
//! and the whole machine (on 64 nodes: 64 + 224 + 8 + 1 = 297 hints for the CPU list).
//! - `aligned`: the providers' free sets overlap, so a preferred single node exists;
//! - `conflict`: the device sits where CPU cannot fit on one node, so there is no preferred
//!   result and the merge must search the non-preferred combinations;
//! - `disjoint`: CPU, memory and hugepages each fit on one node but never the same one, and the
//!   device provider has no preference: the widest non-preferred search (the expensive case).

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rebalancer::placement::merge::{
    merge, merge_enumerate, merge_reachable, MergeOptions, MergePolicy, ProviderHints,
};
use rebalancer::placement::numa_info::NumaInfo;
use rebalancer::placement::{NodeMask, TopologyHint};

fn socket_size(nodes: u32) -> u32 {
    (nodes / 2).clamp(1, 8)
}

/// Hints of a provider that fits on one node of `free`, or on any pair / socket / the machine.
fn provider_hints(nodes: u32, free: impl Fn(u32) -> bool) -> Vec<TopologyHint> {
    let s = socket_size(nodes);
    let mut hints: Vec<TopologyHint> = (0..nodes)
        .filter(|&n| free(n))
        .map(|n| TopologyHint::new(Some(NodeMask::single(n)), true))
        .collect();
    for base in (0..nodes).step_by(s as usize) {
        for a in base..base + s {
            for b in a + 1..base + s {
                let m = NodeMask::single(a).or(NodeMask::single(b));
                hints.push(TopologyHint::new(Some(m), false));
            }
        }
        let socket = NodeMask::from_ids(base..base + s).unwrap();
        hints.push(TopologyHint::new(Some(socket), false));
    }
    hints.push(TopologyHint::new(NodeMask::from_ids(0..nodes), false));
    hints
}

fn provider(resource: &str, hints: Vec<TopologyHint>) -> ProviderHints {
    Some(BTreeMap::from([(resource.to_string(), Some(hints))]))
}

/// CPU, memory, hugepages and a device provider.
fn providers(nodes: u32, scenario: &str) -> Vec<ProviderHints> {
    if scenario == "disjoint" {
        // Every provider fits on one node, never the same one; the device provider has no
        // preference: three lists of hundreds of hints and no preferred result.
        return vec![
            provider("cpu", provider_hints(nodes, |n| n % 3 == 0)),
            provider("memory", provider_hints(nodes, |n| n % 3 == 1)),
            provider("hugepages-2Mi", provider_hints(nodes, |n| n % 3 == 2)),
            None,
        ];
    }
    let conflict = scenario == "conflict";
    let cpu_free = |n: u32| n % 4 != 3;
    let device_nodes: Vec<u32> = if conflict {
        (0..nodes).filter(|n| n % 4 == 3).take(2).collect()
    } else {
        vec![nodes - 2, nodes - 1]
    };
    let dev = device_nodes
        .iter()
        .map(|&n| TopologyHint::new(Some(NodeMask::single(n)), true))
        .collect();
    vec![
        provider("cpu", provider_hints(nodes, cpu_free)),
        provider(
            "memory",
            provider_hints(nodes, |n| n % 2 == 0 || n >= nodes / 2),
        ),
        provider("hugepages-2Mi", provider_hints(nodes, |n| n != 0)),
        provider("vendor.com/gpu", dev),
    ]
}

fn bench(c: &mut Criterion) {
    let opts = MergeOptions::default();
    let mut g = c.benchmark_group("hint_merge");
    for nodes in [4u32, 8, 16, 64] {
        let numa = NumaInfo::without_distances((0..nodes).collect());
        for label in ["aligned", "conflict", "disjoint"] {
            let ps = providers(nodes, label);
            let lists: usize = ps
                .iter()
                .flatten()
                .flat_map(|m| m.values().flatten())
                .map(Vec::len)
                .product();
            eprintln!(
                "{nodes} nodes {label}: {lists} combinations; result {:?}",
                merge(MergePolicy::BestEffort, &opts, &numa, &ps)
            );
            g.bench_with_input(
                BenchmarkId::new(format!("best-effort/{label}"), nodes),
                &ps,
                |b, ps| b.iter(|| merge(MergePolicy::BestEffort, &opts, &numa, black_box(ps))),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("reachable/{label}"), nodes),
                &ps,
                |b, ps| {
                    b.iter(|| merge_reachable(MergePolicy::BestEffort, &opts, &numa, black_box(ps)))
                },
            );
            if nodes <= 8 {
                g.bench_with_input(
                    BenchmarkId::new(format!("enumerate/{label}"), nodes),
                    &ps,
                    |b, ps| {
                        b.iter(|| {
                            merge_enumerate(MergePolicy::BestEffort, &opts, &numa, black_box(ps))
                        })
                    },
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

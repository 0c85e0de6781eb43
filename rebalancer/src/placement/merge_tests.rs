//! Tests of the hint merge: one table pinning every rule of hint-merge.md (each case checked on
//! both engines), scope helpers, and a property test proving the fast engine equals the plain
//! enumeration (and that list order never matters).

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn mask(ids: &[u32]) -> NodeMask {
    NodeMask::from_ids(ids.iter().copied()).unwrap()
}

/// A hint with an affinity.
fn h(ids: &[u32], preferred: bool) -> TopologyHint {
    TopologyHint::new(Some(mask(ids)), preferred)
}

/// A hint without affinity.
fn dc(preferred: bool) -> TopologyHint {
    TopologyHint::new(None, preferred)
}

/// A provider with one resource per list, named r0, r1, ….
fn p(lists: Vec<Option<Vec<TopologyHint>>>) -> ProviderHints {
    Some(
        lists
            .into_iter()
            .enumerate()
            .map(|(i, l)| (format!("r{i}"), l))
            .collect(),
    )
}

/// A provider with one resource holding `hints`.
fn one(hints: Vec<TopologyHint>) -> ProviderHints {
    p(vec![Some(hints)])
}

fn machine(n: u32) -> NumaInfo {
    NumaInfo::without_distances((0..n).collect())
}

/// kubelet's 4-node test distances: {0,1} and {2,3} are pairs.
fn four_with_distances() -> NumaInfo {
    let d = [
        [10, 11, 12, 12],
        [11, 10, 12, 12],
        [12, 12, 10, 11],
        [12, 12, 11, 10],
    ];
    NumaInfo::new(
        vec![0, 1, 2, 3],
        d.iter()
            .enumerate()
            .map(|(i, r)| (i as u32, r.to_vec()))
            .collect(),
    )
}

struct Case {
    name: &'static str,
    policy: MergePolicy,
    closest: bool,
    numa: NumaInfo,
    providers: Vec<ProviderHints>,
    /// `None` = no affinity.
    want: Option<&'static [u32]>,
    preferred: bool,
    admit: bool,
}

fn check(c: Case) {
    let opts = MergeOptions {
        prefer_closest_numa: c.closest,
        max_allowable_numa_nodes: None,
    };
    let want = TopologyHint::new(c.want.map(mask), c.preferred);
    let fast = decide(c.policy, &opts, &c.numa, &c.providers);
    let slow = merge_enumerate(c.policy, &opts, &c.numa, &c.providers);
    assert_eq!(fast.hint, want, "{}: fast engine", c.name);
    assert_eq!(slow, want, "{}: enumeration", c.name);
    assert_eq!(fast.admit, c.admit, "{}: admit", c.name);
}

use MergePolicy::{BestEffort as BE, None as NONE, Restricted as R, SingleNumaNode as SNN};

fn case(
    name: &'static str,
    policy: MergePolicy,
    providers: Vec<ProviderHints>,
    want: Option<&'static [u32]>,
    preferred: bool,
    admit: bool,
) -> Case {
    Case {
        name,
        policy,
        closest: false,
        numa: machine(4),
        providers,
        want,
        preferred,
        admit,
    }
}

const ALL4: &[u32] = &[0, 1, 2, 3];

#[test]
fn every_rule_of_the_merge() {
    let cases = vec![
        // ---- Step 1: normalisation ----
        case(
            "no providers: one empty combination gives ALL preferred",
            BE,
            vec![],
            Some(ALL4),
            true,
            true,
        ),
        case(
            "nil provider is a preferred don't-care",
            R,
            vec![None],
            Some(ALL4),
            true,
            true,
        ),
        case(
            "empty provider map is a preferred don't-care",
            R,
            vec![Some(BTreeMap::new())],
            Some(ALL4),
            true,
            true,
        ),
        case(
            "nil resource list is a preferred don't-care",
            R,
            vec![p(vec![None, Some(vec![h(&[1], true)])])],
            Some(&[1]),
            true,
            true,
        ),
        case(
            "empty resource list is a non-preferred don't-care",
            BE,
            vec![p(vec![Some(vec![])]), one(vec![h(&[1], true)])],
            Some(&[1]),
            false,
            true,
        ),
        case(
            "empty resource list: restricted does not admit",
            R,
            vec![p(vec![Some(vec![])])],
            Some(ALL4),
            false,
            false,
        ),
        case(
            "every resource of a provider is its own list",
            BE,
            vec![p(vec![
                Some(vec![h(&[0], true), h(&[1], true)]),
                Some(vec![h(&[1], true)]),
            ])],
            Some(&[1]),
            true,
            true,
        ),
        // ---- Step 2: single-numa-node filter ----
        case(
            "snn drops non-preferred hints",
            SNN,
            vec![one(vec![h(&[0], false), h(&[1], true)])],
            Some(&[1]),
            true,
            true,
        ),
        case(
            "snn drops multi-node hints: empty list, no combination",
            SNN,
            vec![one(vec![h(&[0, 1], true)])],
            None,
            false,
            false,
        ),
        case(
            "snn keeps preferred don't-care: ALL becomes no affinity",
            SNN,
            vec![one(vec![dc(true)])],
            None,
            true,
            true,
        ),
        case(
            "snn drops a non-preferred don't-care",
            SNN,
            vec![one(vec![dc(false)])],
            None,
            false,
            false,
        ),
        case(
            "snn drops an empty-mask hint",
            SNN,
            vec![one(vec![h(&[], true)]), one(vec![h(&[2], true)])],
            None,
            false,
            false,
        ),
        case(
            "snn: mismatched single nodes give no winner",
            SNN,
            vec![one(vec![h(&[0], true)]), one(vec![h(&[1], true)])],
            None,
            false,
            false,
        ),
        Case {
            numa: machine(1),
            ..case(
                "snn: a single-node machine's node is ALL → no affinity",
                SNN,
                vec![one(vec![h(&[0], true)])],
                None,
                true,
                true,
            )
        },
        // ---- Step 4: merged hint of a combination ----
        case(
            "affinity is the AND of all affinities",
            BE,
            vec![
                one(vec![h(&[0, 1, 2], false)]),
                one(vec![h(&[1, 2, 3], false)]),
            ],
            Some(&[1, 2]),
            false,
            true,
        ),
        case(
            "preferred needs equal affinities: {0}p with {0,1}p is {0} not preferred",
            R,
            vec![one(vec![h(&[0], true)]), one(vec![h(&[0, 1], true)])],
            Some(&[0]),
            false,
            false,
        ),
        case(
            "don't-care hints do not break preference",
            R,
            vec![one(vec![dc(true)]), one(vec![h(&[1], true)])],
            Some(&[1]),
            true,
            true,
        ),
        case(
            "a non-preferred don't-care breaks preference",
            BE,
            vec![one(vec![dc(false)]), one(vec![h(&[1], true)])],
            Some(&[1]),
            false,
            true,
        ),
        Case {
            numa: machine(2),
            ..case(
                "equality uses raw masks (node 5 is off the machine)",
                BE,
                vec![one(vec![h(&[0, 1, 5], true)]), one(vec![h(&[0, 1], true)])],
                Some(&[0, 1]),
                false,
                true,
            )
        },
        Case {
            numa: machine(2),
            ..case(
                "hint nodes off the machine are ANDed away",
                R,
                vec![one(vec![h(&[1, 5], true)])],
                Some(&[1]),
                true,
                true,
            )
        },
        // ---- Step 5: compare ----
        case(
            "an empty merge never wins: no winner gives {ALL, false}",
            BE,
            vec![one(vec![h(&[0], true)]), one(vec![h(&[1], true)])],
            Some(ALL4),
            false,
            true,
        ),
        case(
            "an empty-mask hint never wins",
            R,
            vec![one(vec![h(&[], true)])],
            Some(ALL4),
            false,
            false,
        ),
        case(
            "preferred beats a narrower non-preferred",
            R,
            vec![
                one(vec![h(&[0], false), h(&[0, 1], true)]),
                one(vec![h(&[0, 1], true), h(&[0], false)]),
            ],
            Some(&[0, 1]),
            true,
            true,
        ),
        case(
            "both preferred: the narrower",
            BE,
            vec![one(vec![h(&[0, 1], true), h(&[1], true)])],
            Some(&[1]),
            true,
            true,
        ),
        case(
            "narrower is an integer comparison: {1,2} before {0,3}",
            BE,
            vec![one(vec![h(&[0, 3], true), h(&[1, 2], true)])],
            Some(&[1, 2]),
            true,
            true,
        ),
        Case {
            numa: four_with_distances(),
            closest: true,
            ..case(
                "closest: same count, smaller mean distance",
                BE,
                vec![one(vec![h(&[0, 2], true), h(&[2, 3], true)])],
                Some(&[2, 3]),
                true,
                true,
            )
        },
        Case {
            numa: four_with_distances(),
            ..case(
                "without the option: narrower",
                BE,
                vec![one(vec![h(&[0, 2], true), h(&[2, 3], true)])],
                Some(&[0, 2]),
                true,
                true,
            )
        },
        Case {
            numa: four_with_distances(),
            closest: true,
            ..case(
                "closest: equal mean distance, smaller int",
                R,
                vec![one(vec![h(&[2, 3], true), h(&[0, 1], true)])],
                Some(&[0, 1]),
                true,
                true,
            )
        },
        Case {
            numa: four_with_distances(),
            closest: true,
            ..case(
                "closest: different counts, the narrower",
                BE,
                vec![one(vec![h(&[0, 1], true), h(&[3], true)])],
                Some(&[3]),
                true,
                true,
            )
        },
        Case {
            numa: diag_skewed(),
            closest: true,
            ..case(
                "closest applies to single nodes (own distance)",
                BE,
                vec![one(vec![h(&[0], true), h(&[1], true)])],
                Some(&[1]),
                true,
                true,
            )
        },
        Case {
            numa: diag_skewed(),
            closest: true,
            ..case(
                "closest is off for single-numa-node",
                SNN,
                vec![one(vec![h(&[0], true), h(&[1], true)])],
                Some(&[0]),
                true,
                true,
            )
        },
        // Non-preferred steering towards bnp.
        case(
            "bnp (kubelet 1): {0,1} at bnp=2",
            BE,
            vec![
                one(vec![h(ALL4, false), h(&[0, 1], false)]),
                one(vec![h(&[0, 1], false)]),
            ],
            Some(&[0, 1]),
            false,
            true,
        ),
        case(
            "bnp (kubelet 3): count == bnp kept over a narrower",
            BE,
            vec![
                one(vec![h(ALL4, false), h(&[0, 1], false)]),
                one(vec![h(&[1, 2], false)]),
            ],
            Some(&[1, 2]),
            false,
            true,
        ),
        case(
            "bnp: among counts == bnp, fit",
            BE,
            vec![one(vec![h(&[2, 3], false), h(&[0, 1], false)])],
            Some(&[0, 1]),
            false,
            true,
        ),
        Case {
            numa: four_with_distances(),
            closest: true,
            ..case(
                "bnp: among counts == bnp, closest",
                BE,
                vec![one(vec![h(&[0, 2], false), h(&[2, 3], false)])],
                Some(&[2, 3]),
                false,
                true,
            )
        },
        case(
            "bnp: below bnp beats above it",
            BE,
            vec![
                one(vec![h(&[0, 1, 2], false), h(&[0], false)]),
                one(vec![h(ALL4, false), h(&[0, 3], false)]),
            ],
            Some(&[0]),
            false,
            true,
        ),
        case(
            "bnp: below bnp, the wider (then fit)",
            BE,
            vec![
                one(vec![h(&[0, 1, 2], false), h(ALL4, false)]),
                one(vec![h(&[0, 1], false), h(&[3], false), h(&[0, 3], false)]),
            ],
            Some(&[0, 1]),
            false,
            true,
        ),
        Case {
            numa: machine(6),
            ..case(
                "bnp: all above bnp, the narrowest",
                BE,
                vec![
                    one(vec![
                        h(&[0], false),
                        h(&[1, 2], false),
                        h(&[1, 2, 4], false),
                    ]),
                    one(vec![h(&[3], false), h(&[1, 2, 4], false)]),
                ],
                Some(&[1, 2]),
                false,
                true,
            )
        },
        case(
            "bnp skips lists with only don't-care hints",
            BE,
            vec![
                one(vec![dc(false)]),
                one(vec![h(&[0, 1], false), h(&[0], false)]),
            ],
            Some(&[0]),
            false,
            true,
        ),
        Case {
            numa: machine(5),
            ..case(
                "bnp counts raw masks (node 5 off the machine)",
                BE,
                vec![
                    one(vec![h(&[0, 1, 2, 5], false), h(&[0, 1, 2, 3, 4], false)]),
                    one(vec![h(&[0, 1, 2, 3], false), h(&[3], false)]),
                ],
                Some(&[0, 1, 2, 3]),
                false,
                true,
            )
        },
        // ---- Admission per policy ----
        case(
            "best-effort admits a non-preferred result",
            BE,
            vec![one(vec![h(&[0, 1], false)])],
            Some(&[0, 1]),
            false,
            true,
        ),
        case(
            "restricted refuses a non-preferred result",
            R,
            vec![one(vec![h(&[0, 1], false)])],
            Some(&[0, 1]),
            false,
            false,
        ),
        case(
            "single-numa-node refuses a non-preferred result",
            SNN,
            vec![one(vec![h(&[0], false)])],
            None,
            false,
            false,
        ),
        case(
            "policy none: no affinity, not preferred, admitted",
            NONE,
            vec![one(vec![h(&[0], true)])],
            None,
            false,
            true,
        ),
        // ---- Options ----
        Case {
            numa: machine(16),
            ..case(
                "more than 8 nodes still merge",
                R,
                vec![
                    one(vec![h(&[9, 10], true), h(&[12], true)]),
                    one(vec![h(&[12], true), dc(true)]),
                ],
                Some(&[12]),
                true,
                true,
            )
        },
        // ---- Degenerate machine ----
        Case {
            numa: machine(0),
            ..case(
                "no machine nodes: ALL is empty",
                BE,
                vec![one(vec![h(&[0], true)])],
                Some(&[]),
                false,
                true,
            )
        },
    ];
    for c in cases {
        check(c);
    }
}

/// Node 0 has a large distance to itself, so closest picks {1} over the narrower {0}.
fn diag_skewed() -> NumaInfo {
    NumaInfo::new(
        vec![0, 1],
        [(0, vec![20, 21]), (1, vec![21, 10])].into_iter().collect(),
    )
}

#[test]
fn options_are_checked_like_kubelet() {
    let numa = machine(4);
    let small = MergeOptions {
        prefer_closest_numa: false,
        max_allowable_numa_nodes: Some(4),
    };
    assert_eq!(
        small.check(BE, &numa),
        Err(OptionsError::MaxAllowableTooSmall(4))
    );
    let closest = MergeOptions {
        prefer_closest_numa: true,
        max_allowable_numa_nodes: None,
    };
    assert!(matches!(
        closest.check(R, &numa),
        Err(OptionsError::Distances(_))
    ));
    // kubelet's NewNUMAInfo reads the rows under every policy but none
    assert!(matches!(
        closest.check(SNN, &numa),
        Err(OptionsError::Distances(_))
    ));
    assert_eq!(closest.check(SNN, &four_with_distances()), Ok(()));
    assert_eq!(closest.check(NONE, &numa), Ok(()));
    assert_eq!(small.check(NONE, &numa), Ok(()));
    assert_eq!(closest.check(BE, &four_with_distances()), Ok(()));
    assert_eq!(closest.max_allowable(), 8);
}

#[test]
fn scopes_container_and_pod() {
    let numa = machine(4);
    let opts = MergeOptions::default();
    let c0 = vec![one(vec![h(&[1], true)])];
    let c1 = vec![one(vec![h(&[0, 1], false)])];
    let per = merge_containers(R, &opts, &numa, &[c0.clone(), c1.clone()]);
    assert_eq!(per.len(), 2);
    assert_eq!(per[0].hint, h(&[1], true));
    assert!(per[0].admit);
    assert_eq!(per[1].hint, h(&[0, 1], false));
    assert!(!per[1].admit);
    // Pod scope: the providers' pod-level hints are merged once.
    let pod = merge_pod(
        R,
        &opts,
        &numa,
        &[one(vec![h(&[1], true), h(&[0, 1], false)])],
    );
    assert_eq!(
        pod,
        MergeDecision {
            hint: h(&[1], true),
            admit: true
        }
    );
}

// ---- Property test: the fast engine equals the enumeration ----

fn arb_hint() -> impl Strategy<Value = TopologyHint> {
    (
        prop_oneof![1 => Just(None), 4 => (0u8..=255).prop_map(|b| Some(NodeMask(b as u128)))],
        any::<bool>(),
    )
        .prop_map(|(a, p)| TopologyHint::new(a, p))
}

fn arb_list() -> impl Strategy<Value = Option<Vec<TopologyHint>>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(vec![])),
        6 => prop::collection::vec(arb_hint(), 1..=4).prop_map(Some),
    ]
}

fn arb_provider() -> impl Strategy<Value = ProviderHints> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(BTreeMap::new())),
        6 => prop::collection::vec(arb_list(), 1..=2).prop_map(|ls| {
            Some(ls.into_iter().enumerate().map(|(i, l)| (format!("r{i}"), l)).collect())
        }),
    ]
}

fn arb_policy() -> impl Strategy<Value = MergePolicy> {
    prop_oneof![Just(NONE), Just(BE), Just(R), Just(SNN)]
}

/// Up to 6 machine nodes (ids below 6; hints may name 6 and 7, off the machine) and random
/// distance rows over 0..8 from a small set of values, so equal means happen.
fn arb_numa() -> impl Strategy<Value = NumaInfo> {
    (
        0u8..64,
        prop::collection::vec(prop::sample::select(vec![10u64, 11, 12, 20, 21]), 64),
    )
        .prop_map(|(nodes, d)| {
            let nodes: Vec<u32> = (0..6).filter(|i| nodes & (1 << i) != 0).collect();
            let distances = (0..8u32)
                .map(|i| (i, d[i as usize * 8..i as usize * 8 + 8].to_vec()))
                .collect();
            NumaInfo::new(nodes, distances)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn fast_merge_equals_enumeration(
        policy in arb_policy(),
        closest in any::<bool>(),
        numa in arb_numa(),
        providers in prop::collection::vec(arb_provider(), 0..=3),
    ) {
        let opts = MergeOptions { prefer_closest_numa: closest, max_allowable_numa_nodes: None };
        let slow = merge_enumerate(policy, &opts, &numa, &providers);
        prop_assert_eq!(merge(policy, &opts, &numa, &providers), slow);
        // Order never matters: reversing providers reverses the lists.
        let reversed: Vec<ProviderHints> = providers.iter().rev().cloned().collect();
        prop_assert_eq!(merge_enumerate(policy, &opts, &numa, &reversed), slow);
    }
}

// ---- The branch-and-bound search (merge_search) against the enumeration and the old engine ----

/// Deterministic pseudo-random numbers for the large fixed cases (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random mask of `width` distinct nodes out of `0..nodes`.
fn random_mask(rng: &mut Rng, nodes: u32, width: u32) -> NodeMask {
    let mut ids: Vec<u32> = (0..nodes).collect();
    for i in 0..width as usize {
        let j = i + rng.below((ids.len() - i) as u64) as usize;
        ids.swap(i, j);
    }
    NodeMask::from_ids(ids[..width as usize].iter().copied()).unwrap()
}

/// `lists` providers of `hints` random non-preferred masks of nodes/2 ..= 7·nodes/8 nodes each
/// (a wide case).
fn wide_case(seed: u64, nodes: u32, lists: usize, hints: usize) -> Vec<ProviderHints> {
    let mut rng = Rng(seed);
    (0..lists)
        .map(|_| {
            one((0..hints)
                .map(|_| {
                    let w = nodes / 2 + rng.below(u64::from(nodes * 3 / 8) + 1) as u32;
                    TopologyHint::new(Some(random_mask(&mut rng, nodes, w)), false)
                })
                .collect())
        })
        .collect()
}

/// The kubelet-shaped case: CPU and memory list every mask of two or more nodes (preferred:
/// the pairs inside nodes 0..5), a device on the last node lists every mask containing it
/// (preferred: that node alone). No mask is preferred by all three.
fn kubelet_shaped(nodes: u32) -> Vec<ProviderHints> {
    let last = nodes - 1;
    let every = |keep: &dyn Fn(NodeMask) -> bool, pref: &dyn Fn(NodeMask) -> bool| {
        (1u128..1 << nodes)
            .map(NodeMask)
            .filter(|m| keep(*m))
            .map(|m| TopologyHint::new(Some(m), pref(m)))
            .collect::<Vec<_>>()
    };
    let cpu = every(&|m| m.count() >= 2, &|m| m.count() == 2 && m.0 < 1 << 6);
    let gpu = every(&|m| m.contains(last), &|m| m == NodeMask::single(last));
    vec![one(cpu.clone()), one(cpu), one(gpu)]
}

/// Two sockets of `nodes / 2`: own distance 10, `near` inside the first socket, `near2` inside
/// the second, 21 across.
fn two_sockets(nodes: u32, near: u64, near2: u64) -> NumaInfo {
    let half = nodes / 2;
    let d = |i: u32, j: u32| match (i == j, i < half, j < half) {
        (true, _, _) => 10,
        (_, true, true) => near,
        (_, false, false) => near2,
        _ => 21,
    };
    NumaInfo::new(
        (0..nodes).collect(),
        (0..nodes)
            .map(|i| (i, (0..nodes).map(|j| d(i, j)).collect()))
            .collect(),
    )
}

fn opts(closest: bool) -> MergeOptions {
    MergeOptions {
        prefer_closest_numa: closest,
        max_allowable_numa_nodes: Some(128),
    }
}

#[test]
fn kubelet_shaped_hints_at_16_nodes() {
    let providers = kubelet_shaped(16);
    let numa = machine(16);
    // bnp = 2 (CPU's narrowest); {0,1} = {0,1,15} ∧ {0,1} ∧ {0,1} is the narrowest mask of two
    // nodes, and no preferred result exists.
    let d = decide(BE, &opts(false), &numa, &providers);
    assert_eq!(d.hint, h(&[0, 1], false));
    assert!(d.admit);
    assert!(!decide(R, &opts(false), &numa, &providers).admit);
    // Closest: the second socket's pairs are closer (11 against 12): its narrowest pair.
    let numa = two_sockets(16, 12, 11);
    assert_eq!(merge(BE, &opts(true), &numa, &providers), h(&[8, 9], false));
}

#[test]
fn kubelet_shaped_hints_match_the_old_engine_at_9_and_10_nodes() {
    for nodes in [9, 10] {
        let providers = kubelet_shaped(nodes);
        for (numa, closest) in [
            (machine(nodes), false),
            (two_sockets(nodes, 12, 11), true),
            (two_sockets(nodes, 11, 11), true),
        ] {
            let o = opts(closest);
            let old = merge_reachable(BE, &o, &numa, &providers);
            assert_eq!(merge(BE, &o, &numa, &providers), old, "{nodes} nodes");
        }
    }
}

/// The result of [`wide_case`]`(64, 64, 8, 8)` by kubelet's enumeration (16.7 million combinations;
/// `wide_64_node_result_is_kubelets` recomputes it).
const WIDE64: &[u32] = &[
    2, 3, 11, 12, 14, 17, 20, 23, 25, 29, 35, 36, 41, 44, 46, 47, 51, 60, 63,
];

#[test]
fn wide_random_hints_at_64_nodes() {
    let providers = wide_case(64, 64, 8, 8);
    let numa = machine(64);
    assert_eq!(merge(BE, &opts(false), &numa, &providers), h(WIDE64, false));
    // The larger shape (20 lists of 12) finishes too; its result has no oracle here, but
    // it must be a reachable mask: contained in one hint of every list.
    let big = wide_case(65, 64, 20, 12);
    let got = merge(BE, &opts(false), &numa, &big).affinity.unwrap();
    assert!(!got.is_empty());
    for p in &big {
        let list = p
            .as_ref()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .as_ref()
            .unwrap();
        assert!(list.iter().any(|h| got.is_subset_of(h.affinity.unwrap())));
    }
}

#[test]
#[ignore = "16.7 million combinations: run with -- --ignored"]
fn wide_64_node_result_is_kubelets() {
    let providers = wide_case(64, 64, 8, 8);
    assert_eq!(
        merge_enumerate(BE, &opts(false), &machine(64), &providers),
        h(WIDE64, false)
    );
}

/// Machine node ids: 1 to 8 ids out of 0..12, moved up by 0, 60 or 116 (ids up to 127).
fn arb_machine_ids() -> impl Strategy<Value = Vec<u32>> {
    (
        prop::sample::subsequence((0u32..12).collect::<Vec<_>>(), 1..=8),
        prop::sample::select(vec![0u32, 60, 116]),
    )
        .prop_map(|(ids, base)| ids.into_iter().map(|i| i + base).collect())
}

/// Distances for every id of `0..=max`: small values with many equal means, values around the
/// exact-sum limit (2^20), or huge ones (kubelet's f64 sums round).
fn arb_distances(max: u32) -> impl Strategy<Value = BTreeMap<u32, Vec<u64>>> {
    let n = (max + 1) as usize;
    prop_oneof![
        prop::collection::vec(prop::sample::select(vec![10u64, 11, 12, 20, 21]), n * n),
        prop::collection::vec(
            prop::sample::select(vec![1u64 << 20, (1 << 20) + 1, (1 << 21) + 3, 10]),
            n * n
        ),
        prop::collection::vec(
            prop::sample::select(vec![
                (1u64 << 53) + 1,
                (1 << 60) + 7,
                100_000_000_000_000_007
            ]),
            n * n
        ),
    ]
    .prop_map(move |d| {
        (0..n)
            .map(|i| (i as u32, d[i * n..i * n + n].to_vec()))
            .collect()
    })
}

/// A hint over the machine `ids`: no affinity, an empty mask, or machine nodes plus sometimes a
/// node off the machine; preferred one time in five (so most cases reach the search).
fn arb_hint_on(ids: Vec<u32>) -> impl Strategy<Value = TopologyHint> {
    let n = ids.len();
    (
        prop_oneof![
            1 => Just(None),
            1 => Just(Some(vec![])),
            10 => prop::sample::subsequence(ids.clone(), 1..=n).prop_map(Some),
            1 => (prop::sample::subsequence(ids, 0..=n), 0u32..128).prop_map(|(mut v, x)| {
                v.push(x);
                Some(v)
            }),
        ],
        prop::bool::weighted(0.2),
    )
        .prop_map(|(a, p)| TopologyHint::new(a.map(|v| NodeMask::from_ids(v).unwrap()), p))
}

/// 1 to 4 hints, one maybe repeated.
fn arb_hints_on(ids: Vec<u32>) -> impl Strategy<Value = Vec<TopologyHint>> {
    (
        prop::collection::vec(arb_hint_on(ids), 1..=4),
        prop::collection::vec(any::<prop::sample::Index>(), 0..=1),
    )
        .prop_map(|(mut hs, dups)| {
            for d in dups {
                hs.push(hs[d.index(hs.len())]);
            }
            hs
        })
}

fn arb_providers_on(ids: Vec<u32>) -> impl Strategy<Value = Vec<ProviderHints>> {
    let list = prop_oneof![
        1 => Just(None),
        1 => Just(Some(vec![])),
        10 => arb_hints_on(ids).prop_map(Some),
    ];
    let provider = prop_oneof![
        1 => Just(None),
        1 => Just(Some(BTreeMap::new())),
        10 => prop::collection::vec(list, 1..=2).prop_map(|ls| {
            Some(ls.into_iter().enumerate().map(|(i, l)| (format!("r{i}"), l)).collect())
        }),
    ];
    prop::collection::vec(provider, 0..=3)
}

fn arb_case() -> impl Strategy<Value = (MergePolicy, bool, NumaInfo, Vec<ProviderHints>)> {
    arb_machine_ids().prop_flat_map(|ids| {
        let max = *ids.iter().max().unwrap();
        (
            arb_policy(),
            any::<bool>(),
            arb_distances(max),
            arb_providers_on(ids.clone()),
        )
            .prop_map(move |(policy, closest, d, ps)| {
                (policy, closest, NumaInfo::new(ids.clone(), d), ps)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// 1 to 8 machine nodes with ids up to 127, mostly non-preferred hints (duplicates, empty
    /// masks, nodes off the machine, no-affinity hints, nil and empty lists and providers),
    /// distances with ties or rounding, every policy.
    #[test]
    fn search_equals_enumeration((policy, closest, numa, providers) in arb_case()) {
        let o = opts(closest);
        let slow = merge_enumerate(policy, &o, &numa, &providers);
        prop_assert_eq!(merge(policy, &o, &numa, &providers), slow);
        prop_assert_eq!(merge_reachable(policy, &o, &numa, &providers), slow);
    }
}

/// 9 to 14 nodes, 2 to 5 lists of up to 12 wide hints (too many combinations to enumerate): the
/// search against the old reachable-set engine.
fn arb_wide_case() -> impl Strategy<Value = (u32, bool, u64, Vec<ProviderHints>)> {
    (9u32..=14, any::<bool>(), 11u64..=21).prop_flat_map(|(nodes, closest, near)| {
        let hint = (1u128..1 << nodes, prop::bool::weighted(0.1))
            .prop_map(|(m, p)| TopologyHint::new(Some(NodeMask(m)), p));
        let list = prop::collection::vec(hint, 1..=12).prop_map(one);
        (
            Just(nodes),
            Just(closest),
            Just(near),
            prop::collection::vec(list, 2..=5),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn search_equals_the_old_engine_beyond_8_nodes(
        (nodes, closest, near, providers) in arb_wide_case(),
        policy in prop_oneof![Just(BE), Just(R), Just(SNN)],
    ) {
        let numa = two_sockets(nodes, near, 11);
        let o = opts(closest);
        prop_assert_eq!(
            merge(policy, &o, &numa, &providers),
            merge_reachable(policy, &o, &numa, &providers)
        );
    }
}

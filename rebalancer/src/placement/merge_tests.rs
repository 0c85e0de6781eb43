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
        Decision {
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

//! Memory Manager model tests (after kubelet's memorymanager policy_static_test.go).
use super::*;
use crate::topology::TopologyBuilder;

const G: u64 = 1 << 30;

/// Two nodes of 7 GiB, 512 × 2 MiB and 2 × 1 GiB hugepages each (so 4 GiB of regular memory);
/// 1 GiB reserved on node 0.
fn state() -> MemoryState {
    let t = TopologyBuilder {
        memory_per_node_bytes: 7 * G,
        hugepages_2m_per_node: 512,
        hugepages_1g_per_node: 2,
        ..Default::default()
    }
    .build();
    MemoryState::new(
        &t,
        &[ReservedMemory {
            node: 0,
            memory_bytes: G,
            hugepages_2mi_bytes: 0,
            hugepages_1gi_bytes: 0,
        }],
    )
    .unwrap()
}

fn req(mem: u64, h2: u64, h1: u64) -> MemoryRequest {
    [
        (MemoryResource::Memory, mem),
        (MemoryResource::Hugepages2Mi, h2),
        (MemoryResource::Hugepages1Gi, h1),
    ]
    .into_iter()
    .filter(|(_, b)| *b > 0)
    .collect()
}

fn mask(ids: &[u32]) -> NodeMask {
    NodeMask::from_ids(ids.iter().copied()).unwrap()
}

fn show_hints(s: &MemoryState, r: &MemoryRequest) -> String {
    let Some(h) = s.hints(r, &|_, _| 0) else {
        return "nil".into();
    };
    let lists: Vec<&Vec<TopologyHint>> = h.values().collect();
    assert!(lists.windows(2).all(|w| w[0] == w[1]), "lists differ");
    lists
        .first()
        .map(|l| {
            l.iter()
                .map(|h| {
                    let ids: String = h.affinity.unwrap().ids().map(|i| i.to_string()).collect();
                    format!("{ids}{}", if h.preferred { "P" } else { "" })
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

fn lowest(a: NodeMask, b: NodeMask) -> bool {
    a.0 < b.0
}

fn check(s: &MemoryState, r: MemoryRequest, hints: &str, hint: Option<&[u32]>, choose: &str) {
    assert_eq!(show_hints(s, &r), hints, "hints for {r:?}");
    let got = match s.choose(&r, TopologyHint::new(hint.map(mask), false), &lowest) {
        Ok(m) => m.ids().map(|i| i.to_string()).collect::<String>(),
        Err(MemoryError::Insufficient { .. }) => "insufficient".into(),
        Err(MemoryError::CannotExtend(_)) => "cannot-extend".into(),
        Err(MemoryError::Violation(_)) => "violation".into(),
        Err(e) => e.to_string(),
    };
    assert_eq!(got, choose, "choose for {r:?} under {hint:?}");
}

#[test]
fn blocks_follow_topology_and_reservation() {
    let s = state();
    let b = s.nodes[0].blocks[&MemoryResource::Memory];
    assert_eq!(
        (b.total, b.system_reserved, b.allocatable, b.free),
        (7 * G, G, 3 * G, 3 * G)
    );
    assert_eq!(s.nodes[1].blocks[&MemoryResource::Hugepages2Mi].free, G);
    assert_eq!(s.nodes[1].blocks[&MemoryResource::Hugepages1Gi].free, 2 * G);
}

#[test]
fn hints_and_choice_on_an_empty_machine() {
    let s = state();
    check(&s, req(0, 0, 0), "nil", None, "insufficient");
    check(&s, req(2 * G, 0, 0), "0P 1P 01", None, "0");
    check(&s, req(2 * G, 0, 0), "0P 1P 01", Some(&[1]), "1");
    check(&s, req(3 * G + 1, 0, 0), "1P 01", None, "1");
    check(&s, req(5 * G, 0, 0), "01P", None, "01");
    check(&s, req(5 * G, 0, 0), "01P", Some(&[0]), "01");
    check(&s, req(G, 3 * G / 2, 0), "01P", None, "01");
    check(&s, req(8 * G, 0, 0), "", None, "insufficient");
    check(&s, req(G, 0, 5 * G), "", None, "insufficient");
}

#[test]
fn single_and_cross_node_groups_never_mix() {
    // a single-node allocation on node 0 forbids node 0 in any group
    let mut s = state();
    let before = s.clone();
    let a = s.allocate(&req(2 * G, 0, 0), mask(&[0]));
    check(&s, req(2 * G, 0, 0), "1P", None, "1");
    check(&s, req(5 * G, 0, 0), "", None, "insufficient");
    check(&s, req(G / 2, 0, 0), "0P 1P", Some(&[0, 1]), "violation");
    s.release(&a);
    assert_eq!(s, before, "release restores the state exactly");

    // a cross-node group serves only allocations of the same group
    let b = s.allocate(&req(5 * G, 0, 0), mask(&[0, 1]));
    assert_eq!(
        b.taken,
        vec![
            (0, MemoryResource::Memory, 3 * G),
            (1, MemoryResource::Memory, 2 * G)
        ]
    );
    check(&s, req(G, 0, 0), "01", None, "01");
    check(&s, req(G, 0, 0), "01", Some(&[0]), "01");
    // kubelet's isAffinityViolatingNUMAAllocations never refuses a single-node mask: a
    // Topology Manager hint of node 1 that node 1's free memory covers is taken as it is
    check(&s, req(G, 0, 0), "01", Some(&[1]), "1");
    // a wider group over the used group is refused
    let t = TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 3,
        memory_per_node_bytes: 4 * G,
        ..Default::default()
    }
    .build();
    let mut three = MemoryState::new(&t, &[]).unwrap();
    three.allocate(&req(5 * G, 0, 0), mask(&[0, 1]));
    assert_eq!(
        three.choose(
            &req(G, 0, 0),
            TopologyHint::new(Some(mask(&[0, 1, 2])), false),
            &lowest
        ),
        Err(MemoryError::Violation(mask(&[0, 1, 2])))
    );
    s.release(&b);
    assert_eq!(s, before);
}

#[test]
fn bad_reservations_are_refused() {
    let t = TopologyBuilder::default().build();
    let r = |node, memory_bytes| ReservedMemory {
        node,
        memory_bytes,
        hugepages_2mi_bytes: 0,
        hugepages_1gi_bytes: 0,
    };
    assert!(matches!(
        MemoryState::new(&t, &[r(7, 1)]),
        Err(MemoryError::UnknownNode { node: 7 })
    ));
    assert!(matches!(
        MemoryState::new(&t, &[r(0, 65 * G)]),
        Err(MemoryError::ReservedTooLarge { node: 0, .. })
    ));
}

/// What a hold or a moved container's memory may take without breaking a group: a single
/// node's whole group, a multi-node mask only over nodes free or serving exactly it (found by
/// the member-sequence property test: a pod's hold on {0, 1} split the group {0, 1, 2}).
#[test]
fn unbroken_masks_never_split_a_group() {
    let t = TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 3,
        memory_per_node_bytes: 4 * G,
        ..Default::default()
    }
    .build();
    let mut s = MemoryState::new(&t, &[]).unwrap();
    assert_eq!(s.unbroken(mask(&[0])), Some(mask(&[0])));
    assert_eq!(s.unbroken(mask(&[0, 1])), Some(mask(&[0, 1])));
    s.allocate(&req(9 * G, 0, 0), mask(&[0, 1, 2]));
    assert_eq!(
        s.unbroken(mask(&[0])),
        Some(mask(&[0, 1, 2])),
        "a node is taken with its group"
    );
    assert_eq!(
        s.unbroken(mask(&[0, 1])),
        None,
        "a part of a group is refused"
    );
    assert_eq!(s.unbroken(mask(&[0, 1, 2])), Some(mask(&[0, 1, 2])));
}

//! Seed 003's Memory Manager walkthrough (pod1 … pod7) as admission on two-node machines of
//! 10 GiB allocatable memory per node (11 GiB, 1 GiB reserved per node, kubelet
//! `--reserved-memory`), Topology Manager policy restricted. The Guaranteed pods ask for half a
//! CPU (Guaranteed, no exclusive CPUs), so memory alone decides their NUMA affinity, as in the
//! seed.
use super::*;
use crate::config::ReservedMemory;
use crate::topology::TopologyBuilder;

const G: u64 = 1 << 30;

fn machine() -> (Topology, PlacementConfig) {
    let t = TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 2,
        cores_per_node: 4,
        threads_per_core: 1,
        memory_per_node_bytes: 11 * G,
        ..Default::default()
    }
    .build();
    let reserved = |node| ReservedMemory {
        node,
        memory_bytes: G,
        hugepages_2mi_bytes: 0,
        hugepages_1gi_bytes: 0,
    };
    let cfg = PlacementConfig {
        policy: TopologyPolicy::Restricted,
        reserved_memory: vec![reserved(0), reserved(1)],
        ..Default::default()
    };
    (t, cfg)
}

fn guaranteed(uid: &str, mem: u64) -> Pod {
    Pod {
        uid: uid.into(),
        containers: vec![Container {
            name: "c".into(),
            cpu_request_millis: 500,
            cpu_limit_millis: 500,
            memory_bytes: mem,
            memory_limit_bytes: mem,
            ..Default::default()
        }],
        init_containers: Vec::new(),
    }
}

/// Free regular memory per node and each node's group, as "free0/free1 cells0 cells1".
fn show(a: &Allocator) -> String {
    let n = &a.memory.nodes;
    let m = |i: usize| n[i].blocks[&MemoryResource::Memory].free / G;
    format!("{}/{} {:?} {:?}", m(0), m(1), n[0].cells, n[1].cells)
}

#[test]
fn multi_numa_group_and_the_refusal_of_a_pod_that_one_node_could_hold() {
    let (t, c) = machine();
    let mut a = Allocator::new(&t, &c).unwrap();
    // pod1: 15 GiB fits no single node: group1 = [0,1], cpuset.mems 0-1
    let p = a.admit(&t, &c, &guaranteed("pod1", 15 * G)).unwrap();
    assert_eq!(p[0].mems.to_string(), "0-1");
    assert_eq!(show(&a), "0/5 {0, 1} {0, 1}");
    // pod2: 5 GiB would fit group1's 5 GiB left, but one node could hold it on an empty
    // machine: the only hint ([0,1]) is not preferred, and restricted refuses it
    let before = a.clone();
    let e = a.admit(&t, &c, &guaranteed("pod2", 5 * G)).unwrap_err();
    assert_eq!(e.reason, RejectionReason::TopologyAffinityError, "{e}");
    assert_eq!(a, before, "a refusal changes nothing");
    // pod3: Burstable, not the Memory Manager's business: admitted, memory untouched
    let mut burst = guaranteed("pod3", 5 * G);
    burst.containers[0].memory_limit_bytes = 8 * G;
    assert_eq!(burst.qos(), Qos::Burstable);
    a.admit(&t, &c, &burst).unwrap();
    assert_eq!(show(&a), "0/5 {0, 1} {0, 1}");
}

#[test]
fn single_numa_groups_and_the_refusal_that_avoids_spilling_across_groups() {
    let (t, c) = machine();
    let mut a = Allocator::new(&t, &c).unwrap();
    let mems = |a: &mut Allocator, uid: &str, g: u64| {
        a.admit(&t, &c, &guaranteed(uid, g * G))
            .map(|p| p[0].mems.to_string())
    };
    // pod4: 2 GiB on node 0 (group2 = [0])
    assert_eq!(mems(&mut a, "pod4", 2).unwrap(), "0");
    // pod5: 6 GiB joins group2 (8 GiB free there)
    assert_eq!(mems(&mut a, "pod5", 6).unwrap(), "0");
    assert_eq!(show(&a), "2/10 {0} {1}");
    // pod6: 3 GiB no longer fits group2 (2 GiB left): node 1 becomes group3
    assert_eq!(mems(&mut a, "pod6", 3).unwrap(), "1");
    assert_eq!(show(&a), "2/7 {0} {1}");
    // pod7: 8 GiB fits neither group (2 and 7 GiB left). Together they have 9 GiB, but a
    // group never spans groups: refused, nothing changed
    let before = a.clone();
    let e = a.admit(&t, &c, &guaranteed("pod7", 8 * G)).unwrap_err();
    assert_eq!(e.reason, RejectionReason::MemoryNumaGroupError, "{e}");
    assert!(e.details.contains("violates NUMA node allocation"), "{e}");
    assert_eq!(a, before);
    // what fits a group is still admitted there
    assert_eq!(mems(&mut a, "pod7b", 7).unwrap(), "1");
    assert_eq!(show(&a), "2/0 {0} {1}");
}

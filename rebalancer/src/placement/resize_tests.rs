//! Resize on a 2-node machine (CPUs 0-1 on node 0, 2-3 on node 1, 4 GiB a node): grow within
//! the node, refusal leaving the books as they were, shrink back to the pool, memory re-booked
//! on the container's nodes, a shared container's charge, the QoS class kept.
use super::*;
use crate::topology::TopologyBuilder;

const G: u64 = 1 << 30;

fn topo() -> Topology {
    TopologyBuilder {
        cores_per_node: 2,
        threads_per_core: 1,
        memory_per_node_bytes: 4 * G,
        ..Default::default()
    }
    .build()
}

fn cfg() -> PlacementConfig {
    PlacementConfig {
        policy: TopologyPolicy::SingleNumaNode,
        ..Default::default()
    }
}

fn c(millis: u64, mem: u64, guaranteed: bool) -> Container {
    Container {
        name: "c".into(),
        cpu_request_millis: millis,
        cpu_limit_millis: if guaranteed { millis } else { 0 },
        memory_bytes: mem,
        memory_limit_bytes: mem,
        ..Default::default()
    }
}

fn admitted(containers: &[(&str, Container)]) -> Allocator {
    let t = topo();
    let mut a = Allocator::new(&t, &cfg()).unwrap();
    for (uid, c) in containers {
        let pod = Pod {
            uid: uid.to_string(),
            containers: vec![c.clone()],
            init_containers: Vec::new(),
        };
        a.admit(&t, &cfg(), &pod).unwrap();
    }
    a
}

fn cpus(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

fn node_free(a: &Allocator, node: u32) -> u64 {
    a.memory.nodes.iter().find(|n| n.id == node).unwrap().blocks[&MemoryResource::Memory].free
}

#[test]
fn a_grow_keeps_its_cpus_and_takes_more_on_its_node() {
    let mut a = admitted(&[("g", c(1000, G, true))]);
    let before = a.pods["g"].containers[0].placement.cpus.clone();
    let p = a
        .resize(&topo(), &cfg(), "g", "c", &c(2000, G, true))
        .unwrap();
    assert!(p.exclusive);
    assert_eq!(p.cpus, cpus("0-1"));
    assert!(before.is_subset(&p.cpus), "its CPU {before} kept");
    assert_eq!(a.exclusive_cpus(), cpus("0-1"));
    assert_eq!(a.pods["g"].cpu_request_millis, 2000);
}

#[test]
fn a_grow_past_its_node_is_refused_and_changes_nothing() {
    // a shared container on node 1 and 2 exclusive CPUs on node 0: no third CPU on node 0
    let mut a = admitted(&[("g", c(2000, G, true))]);
    let before = a.clone();
    let e = a
        .resize(&topo(), &cfg(), "g", "c", &c(3000, G, true))
        .unwrap_err();
    assert_eq!(e.reason, RejectionReason::InsufficientCpu, "{e}");
    assert!(e.details.contains("within nodes 0"), "{e}");
    assert_eq!(a, before);
}

#[test]
fn a_grow_that_would_leave_a_shared_container_no_cpu_is_refused() {
    // one node of 2 CPUs: g holds one, the shared container b runs on the other
    let t = TopologyBuilder {
        nodes_per_socket: 1,
        cores_per_node: 2,
        threads_per_core: 1,
        memory_per_node_bytes: 4 * G,
        ..Default::default()
    }
    .build();
    let mut a = Allocator::new(&t, &cfg()).unwrap();
    for (uid, c) in [("g", c(1000, G, true)), ("b", c(500, 0, false))] {
        let pod = Pod {
            uid: uid.into(),
            containers: vec![c],
            init_containers: Vec::new(),
        };
        a.admit(&t, &cfg(), &pod).unwrap();
    }
    let before = a.clone();
    let e = a
        .resize(&t, &cfg(), "g", "c", &c(2000, G, true))
        .unwrap_err();
    assert_eq!(e.reason, RejectionReason::InsufficientCpu, "{e}");
    assert_eq!(a, before);
}

#[test]
fn a_shrink_gives_cpus_back_to_the_shared_pool() {
    let mut a = admitted(&[("g", c(2000, G, true))]);
    let t = topo();
    let view = CpuView::new(&t);
    let p = a.resize(&t, &cfg(), "g", "c", &c(1000, G, true)).unwrap();
    assert_eq!(p.cpus.len(), 1);
    assert!(p.cpus.is_subset(&cpus("0-1")));
    assert_eq!(a.exclusive_cpus(), p.cpus);
    assert_eq!(a.shared_pool(&view), cpus("0-3").difference(&p.cpus));
    // and back again: the same node
    let p = a.resize(&t, &cfg(), "g", "c", &c(2000, G, true)).unwrap();
    assert_eq!(p.cpus, cpus("0-1"));
}

#[test]
fn memory_is_rebooked_on_its_nodes_or_the_resize_is_refused() {
    let mut a = admitted(&[("g", c(1000, 3 * G, true))]);
    let t = topo();
    let node = a.pods["g"].containers[0].memory.as_ref().unwrap().nodes;
    let id = node.ids().next().unwrap();
    let free = node_free(&a, id);
    let before = a.clone();
    let e = a
        .resize(&t, &cfg(), "g", "c", &c(1000, 5 * G, true))
        .unwrap_err();
    assert_eq!(e.reason, RejectionReason::InsufficientMemory, "{e}");
    assert_eq!(a, before);
    let p = a.resize(&t, &cfg(), "g", "c", &c(1000, G, true)).unwrap();
    assert_eq!(p.mems, node.to_cpuset());
    assert_eq!(node_free(&a, id), free + 2 * G);
    a.check_restored(&t, &cfg()).unwrap();
    a.release("g");
    assert_eq!(node_free(&a, id), free + 3 * G, "released exactly");
}

#[test]
fn a_shared_container_is_charged_its_new_request() {
    let mut a = admitted(&[("b", c(500, 0, false))]);
    let pool = a.pods["b"].containers[0].placement.cpus.clone();
    let p = a
        .resize(&topo(), &cfg(), "b", "c", &c(1500, 0, false))
        .unwrap();
    assert!(!p.exclusive);
    assert_eq!(p.cpus, pool);
    assert_eq!(a.shared_load.values().sum::<u64>(), 1500);
    assert_eq!(a.pods["b"].cpu_request_millis, 1500);
}

#[test]
fn a_resize_that_changes_the_qos_class_or_an_unknown_pod_is_refused() {
    let mut a = admitted(&[("g", c(1000, G, true))]);
    let before = a.clone();
    let e = a
        .resize(&topo(), &cfg(), "g", "c", &c(1000, G, false))
        .unwrap_err();
    assert_eq!(e.reason, RejectionReason::InvalidPod);
    assert!(e.details.contains("QoS"), "{e}");
    let e = a
        .resize(&topo(), &cfg(), "x", "c", &c(1000, G, true))
        .unwrap_err();
    assert!(e.details.contains("not admitted"), "{e}");
    assert_eq!(a, before);
}

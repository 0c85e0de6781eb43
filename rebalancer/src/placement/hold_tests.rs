//! Pod scope one container at a time, on the EPYC-like machine of the admission tests
//! (8 nodes of 16 CPUs and 16 GiB).
use super::super::tests::{epyc, guaranteed, G};
use super::*;
use crate::config::{TopologyPolicy, TopologyScope};
use crate::placement::memory::MemoryResource;
use crate::placement::pod::RejectionReason;
use crate::placement::NodeMask;

fn cfg(policy: TopologyPolicy) -> PlacementConfig {
    PlacementConfig {
        policy,
        scope: TopologyScope::Pod,
        ..Default::default()
    }
}

fn member<'a>(uid: &'a str, totals: &'a Container, c: &'a Container) -> PodMember<'a> {
    PodMember {
        pod_uid: uid,
        totals,
        container: c,
    }
}

fn one(uid: &str, c: Container) -> Pod {
    Pod {
        uid: uid.into(),
        containers: vec![c],
        init_containers: Vec::new(),
    }
}

fn node_of(t: &Topology, cpus: &CpuSet) -> Vec<u32> {
    let mut n: Vec<u32> = cpus.iter().filter_map(|c| t.node_of_cpu(c)).collect();
    n.dedup();
    n
}

/// A pod of two 6-CPU containers (12 CPUs, 2 GiB in all) arrives one container at a time, an
/// 8-CPU pod between them: the pod's second container lands on the first one's node, on the
/// CPUs held for it, where one-container pods (container scope) would split the pod.
#[test]
fn a_pods_containers_land_in_its_affinity_on_the_cpus_held_for_them() {
    let t = epyc();
    let c = cfg(TopologyPolicy::SingleNumaNode);
    let mut a = Allocator::new(&t, &c).unwrap();
    let totals = guaranteed("pod", 12000, 2 * G);
    let (ca, cb) = (guaranteed("a", 6000, G), guaranteed("b", 6000, G));
    let pa = a.admit_member(&t, &c, member("p", &totals, &ca)).unwrap();
    assert_eq!(pa.affinity, Some(NodeMask::single(0)));
    assert_eq!(node_of(&t, &pa.cpus), [0]);
    let hold = a.pods["p"].hold.clone().unwrap();
    assert_eq!(hold.cpus.len(), 6);
    assert!(hold.cpus.is_disjoint(&pa.cpus));
    assert_eq!(node_of(&t, &hold.cpus), [0]);
    // the pod's whole memory is on node 0 too: 1 GiB with a, 1 GiB held
    assert_eq!(hold.memory.as_ref().unwrap().nodes, NodeMask::single(0));
    assert_eq!(a.exclusive_cpus().len(), 12);
    // an 8-CPU pod does not fit the 4 CPUs node 0 has left
    let other = a
        .admit(&t, &c, &one("o", guaranteed("o", 8000, G)))
        .unwrap();
    assert_eq!(node_of(&t, &other[0].cpus), [1]);
    let pb = a.admit_member(&t, &c, member("p", &totals, &cb)).unwrap();
    assert_eq!(pb.cpus, hold.cpus, "b takes the CPUs held for it");
    assert_eq!(pb.mems.to_string(), "0");
    let hold = a.pods["p"].hold.as_ref().unwrap();
    assert!(hold.cpus.is_empty() && hold.memory.is_none());

    // container scope, each container its own one-container pod: the pod is split
    let mut c1 = c.clone();
    c1.scope = TopologyScope::Container;
    let mut b = Allocator::new(&t, &c1).unwrap();
    let xa = b.admit(&t, &c1, &one("p/a", ca.clone())).unwrap();
    b.admit(&t, &c1, &one("o", guaranteed("o", 8000, G)))
        .unwrap();
    let xb = b.admit(&t, &c1, &one("p/b", cb.clone())).unwrap();
    assert_ne!(node_of(&t, &xa[0].cpus), node_of(&t, &xb[0].cpus));
}

/// A pod whose totals fit no single node is refused at its first container, as kubelet's
/// TopologyAffinityError refuses it, though the container alone would fit; nothing changes.
#[test]
fn a_pod_whose_totals_fit_no_node_is_refused_at_its_first_container() {
    let t = epyc();
    let c = cfg(TopologyPolicy::SingleNumaNode);
    let mut a = Allocator::new(&t, &c).unwrap();
    let before = a.clone();
    let totals = guaranteed("pod", 20000, 2 * G);
    let err = a
        .admit_member(&t, &c, member("p", &totals, &guaranteed("a", 4000, G)))
        .unwrap_err();
    assert_eq!(err.reason, RejectionReason::TopologyAffinityError);
    assert_eq!(a, before);
    // best-effort admits it, spread over the narrowest nodes that hold 20 CPUs
    let c = cfg(TopologyPolicy::BestEffort);
    let mut a = Allocator::new(&t, &c).unwrap();
    let p = a
        .admit_member(&t, &c, member("p", &totals, &guaranteed("a", 4000, G)))
        .unwrap();
    assert_eq!(p.affinity.unwrap().count(), 2);
    assert_eq!(a.exclusive_cpus().len(), 20);
}

/// An init container takes the pod's whole share, exits (its share goes back to the hold), and
/// the app containers take the same CPUs, as kubelet reuses an init container's CPUs; the
/// pod's release frees everything, memory included.
#[test]
fn an_exited_containers_share_goes_back_to_the_hold_and_the_pods_release_frees_all() {
    let t = epyc();
    let c = cfg(TopologyPolicy::SingleNumaNode);
    let fresh = Allocator::new(&t, &c).unwrap();
    let mut a = fresh.clone();
    // kubelet's totals: max(init 8, 4 + 4)
    let totals = guaranteed("pod", 8000, 2 * G);
    let init = a
        .admit_member(
            &t,
            &c,
            member("p", &totals, &guaranteed("init", 8000, 2 * G)),
        )
        .unwrap();
    assert!(a.pods["p"].hold.as_ref().unwrap().cpus.is_empty());
    assert!(a.remove_member(&t, &c, "p", "init"));
    let hold = a.pods["p"].hold.clone().unwrap();
    assert_eq!(
        hold.cpus, init.cpus,
        "the init container's CPUs are held again"
    );
    assert!(
        a.check_restored(&t, &c).is_ok(),
        "the hold's memory is in the books"
    );
    let x = a
        .admit_member(&t, &c, member("p", &totals, &guaranteed("x", 4000, G)))
        .unwrap();
    let y = a
        .admit_member(&t, &c, member("p", &totals, &guaranteed("y", 4000, G)))
        .unwrap();
    assert_eq!(x.cpus.union(&y.cpus), init.cpus);
    assert!(!a.remove_member(&t, &c, "p", "nope"));
    // a container twice, and a pod admitted whole, are refused
    let err = a
        .admit_member(&t, &c, member("p", &totals, &guaranteed("x", 1000, G)))
        .unwrap_err();
    assert_eq!(err.reason, RejectionReason::AlreadyAdmitted);
    a.admit(&t, &c, &one("whole", guaranteed("w", 1000, G)))
        .unwrap();
    let err = a
        .admit_member(&t, &c, member("whole", &totals, &guaranteed("z", 1000, G)))
        .unwrap_err();
    assert_eq!(err.reason, RejectionReason::AlreadyAdmitted);
    assert!(a.release("whole"));
    assert!(a.release("p"));
    assert_eq!(a, fresh);
}

/// Totals below the container (a door without the pod's totals) count as the container: the
/// pod is as large as its containers seen so far, and nothing more is held.
#[test]
fn totals_below_the_container_count_as_the_container() {
    let t = epyc();
    let c = cfg(TopologyPolicy::Restricted);
    let mut a = Allocator::new(&t, &c).unwrap();
    let none = Container {
        name: "pod".into(),
        ..Default::default()
    };
    let p = a
        .admit_member(&t, &c, member("p", &none, &guaranteed("a", 2000, G)))
        .unwrap();
    assert_eq!(p.cpus.len(), 2);
    let pod = &a.pods["p"];
    assert_eq!(pod.cpu_request_millis, 2000);
    assert!(pod.hold.as_ref().unwrap().cpus.is_empty());
    // a later container still gets the pod's affinity (node 0), from the exclusive pool there
    let q = a
        .admit_member(&t, &c, member("p", &none, &guaranteed("b", 2000, G)))
        .unwrap();
    assert_eq!(q.affinity, p.affinity);
    assert_eq!(node_of(&t, &q.cpus), [0]);
    assert_eq!(a.pods["p"].cpu_request_millis, 4000, "the pod grew by b");
}

/// A Guaranteed pod of two 1.5-CPU containers shows 3 CPUs: 3 are held at first; the first
/// (shared) container frees one and a half of them, so 1 stays held; the second frees the rest.
#[test]
fn shared_containers_of_a_held_pod_free_their_share_of_the_hold() {
    let t = epyc();
    let c = cfg(TopologyPolicy::SingleNumaNode);
    let mut a = Allocator::new(&t, &c).unwrap();
    let totals = guaranteed("pod", 3000, 2 * G);
    let held = |a: &Allocator| a.pods["p"].hold.as_ref().unwrap().cpus.len();
    let x = a
        .admit_member(&t, &c, member("p", &totals, &guaranteed("x", 1500, G)))
        .unwrap();
    assert!(!x.exclusive);
    assert_eq!(held(&a), 1);
    let y = a
        .admit_member(&t, &c, member("p", &totals, &guaranteed("y", 1500, G)))
        .unwrap();
    assert!(!y.exclusive);
    assert_eq!(held(&a), 0);
    assert_eq!(x.affinity, y.affinity);
    assert!(a.exclusive_cpus().is_empty());
}

/// A container beyond the pod's totals that does not fit the pod's affinity is refused under
/// restricted (it would spill off the pod's node); one whose QoS contradicts its pod's is
/// refused as an invalid pod.
#[test]
fn containers_beyond_the_totals_or_against_the_pods_qos_are_refused() {
    let t = epyc();
    let c = cfg(TopologyPolicy::Restricted);
    let mut a = Allocator::new(&t, &c).unwrap();
    let totals = guaranteed("pod", 6000, 2 * G);
    a.admit_member(&t, &c, member("p", &totals, &guaranteed("a", 3000, G)))
        .unwrap();
    // node 0 has 16 CPUs, 6 of them the pod's: 14 more do not fit it
    let before = a.clone();
    let err = a
        .admit_member(&t, &c, member("p", &totals, &guaranteed("b", 14000, G)))
        .unwrap_err();
    assert_eq!(err.reason, RejectionReason::TopologyAffinityError, "{err}");
    assert_eq!(a, before);
    let be = Container {
        name: "x".into(),
        ..Default::default()
    };
    let err = a
        .admit_member(&t, &c, member("p", &totals, &be))
        .unwrap_err();
    assert_eq!(err.reason, RejectionReason::InvalidPod, "{err}");
    assert_eq!(a, before);
}

/// A door whose totals leave out the hugepages (NRI's pod_resources has none)
/// books a pod's memory and hugepages as the containers it has seen, not as the first one:
/// the second 8 GiB of 1 GiB pages grows the pod's booking, so another pod asking for the
/// machine's last 8 GiB of them is refused until that container is gone.
#[test]
fn memory_beyond_the_totals_grows_what_the_pod_books_and_shrinks_back() {
    let t = epyc();
    // the node-level capacity check alone (no Memory Manager: memory_manager_policy = none)
    let c = PlacementConfig {
        memory_manager_policy: crate::config::MemoryManagerPolicy::None,
        ..cfg(TopologyPolicy::Restricted)
    };
    let mut a = Allocator::new(&t, &c).unwrap();
    let huge = |name: &str| Container {
        hugepages_1gi_bytes: 8 * G,
        ..guaranteed(name, 1000, G)
    };
    // the totals as NRI gives them: CPU and memory, no hugepages
    let totals = guaranteed("pod", 2000, 2 * G);
    a.admit_member(&t, &c, member("p", &totals, &huge("a")))
        .unwrap();
    let booked = |a: &Allocator, r| a.pods["p"].memory_request.get(&r).copied();
    assert_eq!(booked(&a, MemoryResource::Hugepages1Gi), Some(8 * G));
    a.admit_member(&t, &c, member("p", &totals, &huge("b")))
        .unwrap();
    assert_eq!(booked(&a, MemoryResource::Hugepages1Gi), Some(16 * G));
    assert_eq!(
        booked(&a, MemoryResource::Memory),
        Some(2 * G),
        "the totals hold both"
    );
    // the machine has 8 nodes x 2 GiB of 1 GiB pages: all booked by p
    let q = one("q", huge("q"));
    let before = a.clone();
    let err = a.admit(&t, &c, &q).unwrap_err();
    assert_eq!(err.reason, RejectionReason::InsufficientMemory, "{err}");
    assert_eq!(a, before);
    // nor does a third container of p fit
    let err = a
        .admit_member(&t, &c, member("p", &totals, &huge("c")))
        .unwrap_err();
    assert_eq!(err.reason, RejectionReason::InsufficientMemory, "{err}");
    assert_eq!(a, before);
    // b goes: the pod books what its live container needs again, and q fits
    assert!(a.remove_member(&t, &c, "p", "b"));
    assert_eq!(booked(&a, MemoryResource::Hugepages1Gi), Some(8 * G));
    assert_eq!(
        booked(&a, MemoryResource::Memory),
        Some(2 * G),
        "never below the totals"
    );
    assert_eq!(a.pods["p"].cpu_request_millis, 2000);
    a.admit(&t, &c, &q).unwrap();
}

//! Table-driven tests of take-by-topology and the CPU hints (after kubelet's
//! cpu_assignment_test.go and policy_static_test.go, on x86-numbered synthetic machines).
use super::*;
use crate::topology::TopologyBuilder;

/// 1 socket, 2 nodes, 4 cores per node, 2 threads: node0 = 0-3,8-11, node1 = 4-7,12-15;
/// siblings are N and N+8; L3 groups of `cores_per_l3` cores.
fn machine(cores_per_l3: u32) -> CpuView {
    CpuView::new(
        &TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 4,
            threads_per_core: 2,
            cores_per_l3,
            ..Default::default()
        }
        .build(),
    )
}

fn opts(full: bool, distribute: bool, uncore: bool) -> StaticOptions {
    StaticOptions {
        full_pcpus_only: full,
        distribute_across_numa: distribute,
        distribute_across_cores: false,
        align_by_socket: false,
        prefer_align_by_uncorecache: uncore,
        cluster_affinity: false,
    }
}

fn show(r: Result<CpuSet, CpuError>) -> String {
    match r {
        Ok(s) => s.to_string(),
        Err(CpuError::SmtAlignment { .. }) => "SMTAlignmentError".into(),
        Err(CpuError::Insufficient { .. }) => "insufficient".into(),
        Err(CpuError::Take(e)) => e.to_string(),
    }
}

/// (case, available, request, affinity, options, expected cpulist or error)
type Case = (
    &'static str,
    &'static str,
    usize,
    Option<&'static [u32]>,
    StaticOptions,
    &'static str,
);

fn check(cases: &[Case], v: &CpuView) {
    for (name, avail, n, aff, o, want) in cases {
        let avail = CpuSet::parse(avail).unwrap();
        let aff = aff.map(|a| NodeMask::from_ids(a.iter().copied()).unwrap());
        let got = show(allocate_exclusive(v, &avail, *n, aff, o));
        assert_eq!(&got, want, "case {name}");
    }
}

#[test]
fn take_by_topology_packed() {
    let p = opts(false, false, false);
    let cases: &[Case] = &[
        ("one cpu", "0-15", 1, None, p, "0"),
        ("one core", "0-15", 2, None, p, "0,8"),
        ("core then thread", "0-15", 3, None, p, "0-1,8"),
        ("whole node", "0-15", 8, None, p, "0-3,8-11"),
        ("node then core", "0-15", 10, None, p, "0-4,8-12"),
        ("fill a partial core first", "1-15", 1, None, p, "8"),
        ("whole core skips partial", "1-15", 2, None, p, "1,9"),
        (
            "free node beats partial node",
            "0-2,4-10,12-15",
            8,
            None,
            p,
            "4-7,12-15",
        ),
        ("everything", "0-15", 16, None, p, "0-15"),
        ("too many", "0-15", 17, None, p, "insufficient"),
        ("zero", "0-15", 0, None, p, ""),
        ("aligned to node 1", "0-15", 2, Some(&[1]), p, "4,12"),
        (
            "aligned then the rest",
            "0-15",
            10,
            Some(&[1]),
            p,
            "0,4-8,12-15",
        ),
    ];
    check(cases, &machine(4));
}

#[test]
fn full_pcpus_only_refuses_split_cores() {
    let f = opts(true, false, false);
    let cases: &[Case] = &[
        ("odd request", "0-15", 3, None, f, "SMTAlignmentError"),
        ("whole cores", "1-15", 2, None, f, "1,9"),
        ("whole node", "1-15", 8, None, f, "4-7,12-15"),
        (
            "not enough whole cores",
            "0-7",
            2,
            None,
            f,
            "SMTAlignmentError",
        ),
    ];
    check(cases, &machine(4));
}

#[test]
fn distribute_cpus_across_numa() {
    let d = opts(false, true, false);
    let cases: &[Case] = &[
        ("fits one node: packed", "0-15", 4, None, d, "0-1,8-9"),
        (
            "two nodes: even split",
            "0-15",
            12,
            None,
            d,
            "0-2,4-6,8-10,12-14",
        ),
        (
            "full pcpus: groups of a core",
            "0-15",
            6,
            None,
            opts(true, true, false),
            "0-2,8-10",
        ),
        (
            "odd split: five each",
            "0-15",
            10,
            None,
            d,
            "0-2,4-6,8-9,12-13",
        ),
    ];
    check(cases, &machine(4));
}

#[test]
fn prefer_align_by_uncorecache() {
    // L3 groups of two cores: {0,1,8,9} {2,3,10,11} {4,5,12,13} {6,7,14,15}
    let cases: &[Case] = &[
        (
            "whole free L3 group",
            "1-15",
            4,
            None,
            opts(false, false, true),
            "2-3,10-11",
        ),
        (
            "without the option: whole cores",
            "1-15",
            4,
            None,
            opts(false, false, false),
            "1-2,9-10",
        ),
        (
            "remainder inside one L3",
            "0-15",
            6,
            None,
            opts(false, false, true),
            "0-2,8-10",
        ),
    ];
    check(cases, &machine(2));
}

fn hints(v: &CpuView, avail: &str, n: usize, by_socket: bool) -> String {
    exclusive_hints(
        v,
        &CpuSet::parse(avail).unwrap(),
        &CpuSet::new(),
        n,
        by_socket,
    )
    .iter()
    .map(|h| {
        let ids: Vec<String> = h.affinity.unwrap().ids().map(|i| i.to_string()).collect();
        format!("{}{}", ids.join(""), if h.preferred { "P" } else { "" })
    })
    .collect::<Vec<_>>()
    .join(" ")
}

#[test]
fn hints_for_every_mask_preferred_at_minimal_width() {
    let v = machine(4);
    assert_eq!(hints(&v, "0-15", 4, false), "0P 1P 01");
    assert_eq!(hints(&v, "0-15", 10, false), "01P");
    assert_eq!(hints(&v, "0,8,4-7,12-15", 4, false), "1P 01");
    // minimal width is judged on the whole machine, not on what is free
    assert_eq!(hints(&v, "0-3,4-7", 6, false), "01");
    assert_eq!(hints(&v, "0-15", 17, false), "");
    let two_sockets = CpuView::new(
        &TopologyBuilder {
            sockets: 2,
            nodes_per_socket: 2,
            cores_per_node: 4,
            threads_per_core: 2,
            ..Default::default()
        }
        .build(),
    );
    // 20 CPUs need 3 nodes; with align-by-socket the 2-socket mask is preferred too
    assert_eq!(
        hints(&two_sockets, "0-31", 20, false),
        "012P 013P 023P 123P 0123"
    );
    assert_eq!(
        hints(&two_sockets, "0-31", 20, true),
        "012P 013P 023P 123P 0123P"
    );
}

/// On 16 nodes (pruned candidates: widths 1-2 and all nodes) a pod reusing CPUs of
/// nodes 0, 5 and 9 gets kubelet's narrowest reusing hint {0,5,9}, not only all-nodes.
#[test]
fn reusable_cpus_past_twelve_nodes_keep_their_nodes_mask() {
    let v = CpuView::new(
        &TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 16,
            cores_per_node: 2,
            threads_per_core: 1,
            ..Default::default()
        }
        .build(),
    );
    let reusable: CpuSet = [0, 5, 9]
        .iter()
        .map(|&n| v.nodes[&n].first().unwrap())
        .collect();
    let all = v.node_mask();
    let got = exclusive_hints(&v, &v.online, &reusable, 1, false);
    let want = vec![
        TopologyHint::new(NodeMask::from_ids([0, 5, 9]), false),
        TopologyHint::new(Some(all), false),
    ];
    assert_eq!(got, want);
    // Without reuse nothing changes: every single node is a preferred hint.
    let plain = exclusive_hints(&v, &v.online, &CpuSet::new(), 1, false);
    assert_eq!(plain.iter().filter(|h| h.preferred).count(), 16);
    assert!(!plain
        .iter()
        .any(|h| h.affinity == NodeMask::from_ids([0, 5, 9])));
}

/// 1 socket, 2 nodes of 8 single-thread cores, CPU clusters of 4 cores (Kunpeng-like):
/// node0 = 0-7 (clusters 0-3, 4-7), node1 = 8-15 (clusters 8-11, 12-15).
fn clustered(cores_per_cluster: u32) -> CpuView {
    CpuView::new(
        &TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 8,
            threads_per_core: 1,
            cores_per_l3: 8,
            cores_per_cluster,
            ..Default::default()
        }
        .build(),
    )
}

fn with_clusters(o: StaticOptions) -> StaticOptions {
    StaticOptions {
        cluster_affinity: true,
        ..o
    }
}

#[test]
fn topology_cluster_affinity_packs_whole_clusters() {
    let p = opts(false, false, false);
    let c = with_clusters(p);
    let cases: &[Case] = &[
        // CPU 0 is taken (or reserved: reserved CPUs are never available): the cluster 0-3 is
        // split, so four CPUs are the whole cluster 4-7, not 1-4 across two clusters
        ("whole free cluster", "1-15", 4, None, c, "4-7"),
        ("without: kubelet's order", "1-15", 4, None, p, "1-4"),
        // a remainder goes to the one cluster that holds it with the fewest free CPUs
        ("best fit keeps clusters whole", "1-15", 3, None, c, "1-3"),
        (
            "partial clusters: one that holds it",
            "0,4-5,8-15",
            3,
            None,
            c,
            "8-10",
        ),
        (
            "without: spans two clusters",
            "0,4-5,8-15",
            3,
            None,
            p,
            "0,4-5",
        ),
        (
            "partial clusters: the fuller one",
            "2-3,5-7,8-15",
            3,
            None,
            c,
            "5-7",
        ),
        ("without: 2-3 and 5", "2-3,5-7,8-15", 3, None, p, "2-3,5"),
        // no cluster holds it: as few clusters as possible within one node
        (
            "fill from the fullest",
            "0,4-6,8-9,12-13",
            4,
            None,
            c,
            "0,4-6",
        ),
        ("whole node first", "0-15", 8, None, c, "0-7"),
        ("node then a cluster's part", "0-15", 10, None, c, "0-9"),
        ("cluster then part of another", "0-15", 6, None, c, "0-5"),
        ("aligned to node 1", "1-15", 4, Some(&[1]), c, "8-11"),
        (
            "aligned, node 1 split by a taken CPU",
            "1-8,10-15",
            4,
            Some(&[1]),
            c,
            "12-15",
        ),
        ("too many", "1-15", 16, None, c, "insufficient"),
    ];
    check(cases, &clustered(4));
    // a machine without clusters: the option changes nothing
    let flat: &[Case] = &[
        ("no clusters", "1-15", 4, None, c, "1-4"),
        ("no clusters, partial", "0,4-5,8-15", 3, None, c, "0,4-5"),
    ];
    check(flat, &clustered(0));
}

#[test]
fn topology_cluster_affinity_with_smt_and_full_pcpus_only() {
    // 1 socket, 2 nodes × 4 cores × 2 threads (siblings N, N+8), clusters of 2 cores:
    // {0,1,8,9} {2,3,10,11} {4,5,12,13} {6,7,14,15}
    let v = CpuView::new(
        &TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 4,
            threads_per_core: 2,
            cores_per_cluster: 2,
            ..Default::default()
        }
        .build(),
    );
    let cases: &[Case] = &[
        (
            "whole cluster of two cores",
            "1-15",
            4,
            None,
            with_clusters(opts(false, false, false)),
            "2-3,10-11",
        ),
        (
            "without",
            "1-15",
            4,
            None,
            opts(false, false, false),
            "1-2,9-10",
        ),
        // whole cores asked: the split cluster {1,8,9} has only one whole core, so the two
        // CPUs come from it (core 1 = 1,9), never half of core 0
        (
            "full pcpus in a partial cluster",
            "1-15",
            2,
            None,
            with_clusters(opts(true, false, false)),
            "1,9",
        ),
        // six per node: a whole cluster and a whole core of the next one, on each node
        (
            "distribute across numa: clusters per node",
            "0-15",
            12,
            None,
            with_clusters(opts(false, true, false)),
            "0-2,4-6,8-10,12-14",
        ),
    ];
    check(cases, &v);
}

/// 2 sockets × 2 nodes × 2 cores × 2 threads: node0 = 0-1,8-9 and node1 = 2-3,10-11 on
/// socket 0; node2 = 4-5,12-13 and node3 = 6-7,14-15 on socket 1; siblings N and N+8.
fn two_sockets() -> CpuView {
    CpuView::new(
        &TopologyBuilder {
            sockets: 2,
            nodes_per_socket: 2,
            cores_per_node: 2,
            threads_per_core: 2,
            ..Default::default()
        }
        .build(),
    )
}

/// distribute-cpus-across-cores (kubelet's spread strategy): one CPU of each free core
/// before any core's sibling, whole nodes and sockets still first.
#[test]
fn distribute_cpus_across_cores() {
    let s = StaticOptions {
        distribute_across_cores: true,
        ..opts(false, false, false)
    };
    let p = opts(false, false, false);
    let cases: &[Case] = &[
        ("one thread per core", "0-15", 4, None, s, "0-3"),
        ("packed takes whole cores", "0-15", 4, None, p, "0-1,8-9"),
        ("aligned to node 1", "0-15", 2, Some(&[1]), s, "4-5"),
        (
            "a whole node is still whole",
            "0-15",
            8,
            None,
            s,
            "0-3,8-11",
        ),
        (
            "a whole node, then one CPU per core",
            "0-15",
            10,
            None,
            s,
            "0-5,8-11",
        ),
    ];
    check(cases, &machine(4));
}

/// align-by-socket. kubelet widens the aligned CPUs to the affinity's whole sockets and
/// takes packed from them, which can leave the affinity's nodes (and so the memory's: a
/// container's mems are its affinity) while they have room. The engine keeps the documented
/// invariant instead — CPUs within the admitted nodes whenever they suffice — and widens to
/// the sockets only for what those nodes cannot give, before the rest of the machine
/// (docs/configuration.md).
#[test]
fn align_by_socket_takes_the_affinitys_nodes_then_their_sockets() {
    let v = two_sockets();
    let a = StaticOptions {
        align_by_socket: true,
        ..opts(false, false, false)
    };
    let p = opts(false, false, false);
    let cases: &[Case] = &[
        // kubelet: "0,8" (socket 0 packed: node 0 first, off the affinity's node 1)
        ("fits the affinity's node", "0-15", 2, Some(&[1]), a, "2,10"),
        (
            "the same without the option",
            "0-15",
            2,
            Some(&[1]),
            p,
            "2,10",
        ),
        // node 1 gives 4; the other 2 from its socket (node 0) with the option, and without
        // it from the fullest socket anywhere (socket 1 has only core 4 left)
        (
            "the rest from the affinity's socket",
            "0-4,8-12",
            6,
            Some(&[1]),
            a,
            "0,2-3,8,10-11",
        ),
        (
            "the rest anywhere without the option",
            "0-4,8-12",
            6,
            Some(&[1]),
            p,
            "2-4,10-12",
        ),
        // the socket cannot give it all: the rest of the machine
        ("past the socket", "0-15", 10, Some(&[1]), a, "0-4,8-12"),
    ];
    check(cases, &v);
}

/// kubelet's own align-by-socket case (policy_static_test.go, topoDualSocketMultiNumaPerSocketHT:
/// node n = CPUs 10n..10n+9 and 40+10n.., sockets of two nodes), free CPUs 2, 11, 21, 22,
/// two CPUs for the hint {0, 2}. kubelet answers 2,11 with the option (CPU 11 is on node 1,
/// outside the hint and so outside the container's mems) and 2,21 without; the engine answers
/// 2,21 both ways: the hint's nodes can give both CPUs.
#[test]
fn kubelets_align_by_socket_case_keeps_to_the_hints_nodes() {
    let v = CpuView::new(
        &TopologyBuilder {
            sockets: 2,
            nodes_per_socket: 2,
            cores_per_node: 10,
            threads_per_core: 2,
            ..Default::default()
        }
        .build(),
    );
    let a = StaticOptions {
        align_by_socket: true,
        ..opts(false, false, false)
    };
    let p = opts(false, false, false);
    let cases: &[Case] = &[
        ("align-by-socket", "2,11,21-22", 2, Some(&[0, 2]), a, "2,21"),
        (
            "without it (kubelet: 2,21)",
            "2,11,21-22",
            2,
            Some(&[0, 2]),
            p,
            "2,21",
        ),
    ];
    check(cases, &v);
}

/// Every option reaches the engine's exclusive take: on the same machine, after a first
/// 2-CPU pod (core 0, CPUs 0 and 8, except under distribute-cpus-across-cores), one admission
/// per option through `Allocator::admit` gets the CPUs that option's take gives on the free
/// CPUs.
#[test]
fn every_option_reaches_admission() {
    use crate::config::PlacementConfig;
    use crate::placement::admission::{Allocator, Container, Pod};
    let topo = TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 2,
        cores_per_node: 4,
        threads_per_core: 2,
        cores_per_l3: 2,
        ..Default::default()
    }
    .build();
    let pod = |uid: &str, n: u64| Pod {
        uid: uid.into(),
        containers: vec![Container {
            name: "c".into(),
            cpu_limit_millis: n * 1000,
            memory_limit_bytes: 1 << 20,
            ..Default::default()
        }],
        init_containers: vec![],
    };
    let base = PlacementConfig {
        memory_manager_policy: crate::config::MemoryManagerPolicy::None,
        policy: crate::config::TopologyPolicy::None,
        ..Default::default()
    };
    let with = |f: &dyn Fn(&mut PlacementConfig)| {
        let mut c = base.clone();
        f(&mut c);
        c
    };
    let cases: Vec<(&str, PlacementConfig, u64, &str)> = vec![
        ("packed: whole cores", base.clone(), 4, "1-2,9-10"),
        (
            "full-pcpus-only refuses a split core",
            with(&|c| c.full_pcpus_only = true),
            3,
            "SMTAlignmentError",
        ),
        (
            "distribute-cpus-across-numa: both nodes",
            with(&|c| c.distribute_cpus_across_numa = true),
            12,
            "1-6,9-14",
        ),
        (
            "distribute-cpus-across-cores: one per core",
            with(&|c| c.distribute_cpus_across_cores = true),
            4,
            // the first pod took 0-1 (one CPU of two cores); then one CPU of each of four
            // more cores (packed: two whole cores, 1-2,9-10)
            "2-5",
        ),
        (
            "prefer-align-cpus-by-uncorecache: a whole free L3",
            with(&|c| c.prefer_align_cpus_by_uncorecache = true),
            4,
            "2-3,10-11",
        ),
    ];
    for (name, cfg, n, want) in cases {
        let mut a = Allocator::new(&topo, &cfg).unwrap();
        let first = a.admit(&topo, &cfg, &pod("first", 2)).unwrap()[0]
            .cpus
            .clone();
        let got = match a.admit(&topo, &cfg, &pod("p", n)) {
            Ok(p) => p[0].cpus.to_string(),
            Err(r) => r.reason.to_string(),
        };
        assert_eq!(got, want, "{name}");
        // the very take `hints cpu` runs, on the CPUs the first pod left (full-pcpus-only is
        // allocateCPUs' check before any take)
        if !cfg.full_pcpus_only {
            let free = CpuView::new(&topo).online.difference(&first);
            let direct = cpu_take_of(&topo, &cfg, &free, n).unwrap();
            assert_eq!(got, direct, "{name}: admission and the take differ");
        }
    }
}

/// `cpu_take` with the options of `cfg` on `free` CPUs of `topo` (`hints cpu`'s path).
fn cpu_take_of(
    topo: &crate::topology::Topology,
    cfg: &crate::config::PlacementConfig,
    free: &CpuSet,
    n: u64,
) -> Result<String, String> {
    let v = CpuView::new(topo);
    let strategy = if cfg.distribute_cpus_across_cores {
        cpu_take::Strategy::Spread
    } else {
        cpu_take::Strategy::Packed
    };
    let got = if cfg.distribute_cpus_across_numa {
        cpu_take::take_distributed(&v.kubelet, free, n as usize, 1, strategy)
    } else {
        cpu_take::take_packed(
            &v.kubelet,
            free,
            n as usize,
            strategy,
            cfg.prefer_align_cpus_by_uncorecache,
        )
    };
    got.map(|c| c.to_string()).map_err(|e| e.to_string())
}

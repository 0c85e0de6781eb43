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
    }
}

fn show(r: Result<CpuSet, CpuError>) -> String {
    match r {
        Ok(s) => s.to_string(),
        Err(CpuError::SmtAlignment { .. }) => "SMTAlignmentError".into(),
        Err(CpuError::Insufficient { .. }) => "insufficient".into(),
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
    exclusive_hints(v, &CpuSet::parse(avail).unwrap(), n, by_socket)
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

//! kubelet's accumulator orders (cpu_assignment_test.go's free-list tables) and the Go slice
//! aliasing the distributed take depends on.

use super::*;

/// kubelet's topoSingleSocketHT: 8 CPUs, cores {0,4} {1,5} {2,6} {3,7}.
fn single_socket_ht() -> CpuTopology {
    CpuTopology::new((0..8).map(|c| CpuInfo {
        cpu: c,
        core: c % 4,
        socket: 0,
        numa: 0,
        uncore: 0,
    }))
}

/// kubelet's topoDualSocketHT: 12 CPUs, even CPUs on socket 0, cores {c, c+6}.
fn dual_socket_ht() -> CpuTopology {
    CpuTopology::new((0..12).map(|c| CpuInfo {
        cpu: c,
        core: c % 6,
        socket: c % 2,
        numa: c % 2,
        uncore: c % 2,
    }))
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

#[test]
fn free_cores_in_kubelet_order() {
    let t = dual_socket_ht();
    for (avail, want) in [
        ("0-11", vec![0, 2, 4, 1, 3, 5]),
        ("1-5,7-11", vec![2, 4, 1, 3, 5]),
        ("2-5,8-11", vec![2, 4, 3, 5]),
    ] {
        let acc = Acc::new(&t, &set(avail), 0, Strategy::Packed);
        let free: Vec<u32> = acc
            .sorted_cores()
            .into_iter()
            .filter(|&c| acc.count(Key::Core, c) == t.cpus_per_core())
            .collect();
        assert_eq!(free, want, "{avail}");
    }
}

#[test]
fn free_cpus_in_kubelet_order() {
    let s = single_socket_ht();
    let d = dual_socket_ht();
    for (t, avail, want) in [
        (&s, "0-7", vec![0, 4, 1, 5, 2, 6, 3, 7]),
        (&s, "3-7", vec![4, 5, 6, 3, 7]),
        (&d, "0-11", vec![0, 6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
        (&d, "1-11", vec![6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
        (&d, "1-5,7-11", vec![2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ] {
        let acc = Acc::new(t, &set(avail), 0, Strategy::Packed);
        assert_eq!(acc.sorted_cpus(), want, "{avail}");
    }
}

#[test]
fn common_packed_cases() {
    let s = single_socket_ht();
    let d = dual_socket_ht();
    for (t, avail, n, want) in [
        (&s, "0-7", 0, ""),
        (&s, "0-7", 1, "0"),
        (&s, "1,3,5-7", 1, "6"),
        (&s, "0-7", 2, "0,4"),
        (&s, "0-7", 8, "0-7"),
        (&s, "0-3,6", 2, "2,6"),
        (&d, "0-11", 6, "0,2,4,6,8,10"),
    ] {
        let got = take_packed(t, &set(avail), n, Strategy::Packed, false).unwrap();
        assert_eq!(got, set(want), "{avail} n={n}");
    }
    assert_eq!(
        take_packed(&s, &set("0,2,4,6"), 5, Strategy::Packed, false)
            .unwrap_err()
            .to_string(),
        "not enough cpus available to satisfy request: requested=5, available=4"
    );
}

/// Go's append shares a backing array once a slice has spare capacity: a length-4
/// combination kept from its callback shows the last element of a later sibling.
#[test]
fn kept_combination_follows_go_append() {
    let mut kept = None;
    let mut all = Vec::new();
    combinations(&[0, 1, 2, 3, 4], 4, &mut |c| {
        all.push(c.to_vec());
        if kept.is_none() {
            kept = Some(c.clone());
        }
        true
    });
    assert_eq!(all[0], vec![0, 1, 2, 3]);
    assert_eq!(all[1], vec![0, 1, 2, 4]);
    // [0,1,2] has capacity 4: the second combination wrote its last element over the first's
    assert_eq!(kept.unwrap().to_vec(), vec![0, 1, 2, 4]);
    assert_eq!(all.len(), 5);
}

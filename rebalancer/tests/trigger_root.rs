//! Root test of event-driven rounds with real cgroups and a real daemon (period 60 s, so any
//! round after the first is an event's): the first round runs at start; an operator's burst of
//! writes to a managed container's cpuset.cpus brings one round forward (after the settle
//! delay) plus its follow-up, and no more (the daemon's own writes do not retrigger it); a new
//! container's placement by the watcher does the same.
//!
//! Skips with a printed reason when not root, without a cpuset controller or with < 2 CPUs.
mod common;

use std::time::{Duration, Instant};

fn rounds(d: &common::Daemon) -> u64 {
    d.status()["controller"]["rounds"].as_u64().unwrap_or(0)
}

/// Waits until the daemon counted at least `n` rounds; returns how long it took.
fn until_rounds(d: &common::Daemon, n: u64, timeout: Duration) -> Duration {
    let t0 = Instant::now();
    while rounds(d) < n {
        assert!(
            t0.elapsed() < timeout,
            "round {n} did not come within {timeout:?} (rounds {}):\n{}",
            rounds(d),
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

/// Over `quiet`, no round runs beyond `n`.
fn no_more_rounds_than(d: &common::Daemon, n: u64, quiet: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < quiet {
        assert_eq!(rounds(d), n, "a round ran with no event:\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cpuset_writes_and_placements_bring_rounds_forward() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = common::KubeTree::new(cg, "trigger");
    let (_, c1) = tree.pod_with_container("7a160000-aaaa-4000-8000-000000000001", &"a".repeat(64));
    let t_start = Instant::now();
    let d = common::Daemon::start(
        "",
        &format!(
            "{}[ebpf]\nenabled = false\n[controller]\nperiod_ms = 60000\nevent_settle_ms = 200\n",
            tree.cgroups_toml()
        ),
    );
    // The first round at start, not a period (60 s) later.
    until_rounds(&d, 1, Duration::from_secs(30));
    let first = t_start.elapsed();
    println!("first round {first:?} after the daemon was started");
    assert!(first < Duration::from_secs(30));
    // The container's placement by the watcher's reconcile at start came before the rounds
    // listened: nothing else is due.
    let r = rounds(&d);
    no_more_rounds_than(&d, r, Duration::from_secs(2));

    // The operator pins c1 twice, a millisecond apart: one round sees both.
    let file = tree.mount.join(&c1).join("cpuset.cpus");
    let cpus: Vec<u32> = tree.all_cpus.iter().collect();
    let t0 = Instant::now();
    std::fs::write(&file, cpus[0].to_string()).unwrap();
    std::thread::sleep(Duration::from_millis(1));
    std::fs::write(&file, cpus[1].to_string()).unwrap();
    let took = until_rounds(&d, r + 1, Duration::from_secs(10));
    println!("round {took:?} after the operator's cpuset.cpus writes");
    assert!(
        took >= Duration::from_millis(200),
        "before the settle delay: {took:?}"
    );
    // Its follow-up, then quiet: the burst was one round (and the daemon's own writes, if any,
    // did not start another).
    until_rounds(&d, r + 2, Duration::from_secs(10));
    let after = t0.elapsed();
    no_more_rounds_than(&d, r + 2, Duration::from_secs(3));
    println!("follow-up {after:?} after the writes");
    assert!(
        d.log_text().contains("round brought forward by an event"),
        "{}",
        d.log_text()
    );

    // A new container: the watcher places it (writing its cpuset, noted as the daemon's
    // own), and a round follows soon, with its follow-up, and nothing more.
    let r = rounds(&d);
    let t0 = Instant::now();
    let (_, c2) = tree.pod_with_container("7a160000-bbbb-4000-8000-000000000002", &"b".repeat(64));
    let took = until_rounds(&d, r + 1, Duration::from_secs(10));
    println!("round {took:?} after a new container cgroup was made");
    let placed = std::fs::read_to_string(tree.mount.join(&c2).join("cpuset.cpus")).unwrap();
    assert!(!placed.trim().is_empty(), "the watcher placed c2");
    until_rounds(&d, r + 2, Duration::from_secs(10));
    no_more_rounds_than(&d, r + 2, Duration::from_secs(3));
    println!("placement: rounds {} → {} in {:?}", r, r + 2, t0.elapsed());
}

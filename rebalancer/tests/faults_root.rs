//! Fault injection for real on this machine's cgroupfs with real daemons; the
//! errno table and the node-offline fault run on fakes and fixtures in
//! `src/daemon/fault_tests.rs`. Each test ends with `assert_invariants` (tests/common): no empty
//! cpuset, cpusets within their parent, exclusive CPUs disjoint and never reserved, the
//! migration budget kept, bindings = live containers, and the checkpoint equal to the state.
//!
//! Skips with a printed reason when not root, without a cpuset controller or with < 2 CPUs.
mod common;

use std::time::{Duration, Instant};

use common::{assert_invariants, wait_for, Daemon, KubeTree};
use rebalancer::{
    cgroup::Controller,
    checkpoint,
    config::Config,
    controller::{Move, Trigger},
    cpuset::CpuSet,
    daemon::{apply::apply_moves, status::StatusDoc, Persisted, Shared},
    rounds::OwnedWriter,
    serve::Metrics,
    topology::sysfs,
};

const BUDGET_MIB: u64 = 1024;

/// Waits until the daemon's bindings under the tree are exactly its live containers.
fn wait_bound(d: &Daemon, tree: &KubeTree) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = d.status();
        let ours: std::collections::BTreeSet<String> = st["bindings"]
            .as_object()
            .map(|b| {
                b.keys()
                    .filter(|k| k.starts_with(&format!("{}/", tree.prefix)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if ours == tree.live_containers() {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "bindings {ours:?} never matched the live containers {:?}",
            tree.live_containers()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `n` Burstable containers; `tag` is one hex digit (container ids are 64 hex digits).
fn containers(tree: &mut KubeTree, n: usize, tag: &str) {
    for i in 0..n {
        let uid = format!("fa017000-0000-4000-8000-{tag}{i:06}");
        tree.pod_with_container(&uid, &format!("{tag}{i:062x}"));
    }
}

/// Fault (a), for real: a plan's cgroup is rmdir'ed between plan and apply. Its move ends as
/// "vanished" (no rollback attempted on a cgroup that is gone, no failure recorded), and the
/// round goes on: the next cgroup's move is applied and read back.
#[test]
fn cgroup_rmdired_between_plan_and_apply_is_skipped_and_others_still_move() {
    let io = &mut rebalancer::daemon::Io::new();
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg.clone(), "rmdir");
    let (a_pod, a) =
        tree.pod_with_container("fa017000-aaaa-4000-8000-000000000001", &"a".repeat(64));
    let (_, b) = tree.pod_with_container("fa017000-bbbb-4000-8000-000000000002", &"b".repeat(64));
    let all = tree.all_cpus.clone();
    let mems = tree.all_mems.clone();
    for c in [&a, &b] {
        cg.write_mems(c, &mems).unwrap();
        cg.write_cpus(c, &all).unwrap();
    }
    let one: CpuSet = all.iter().skip(1).take(1).collect();
    let state = tempfile::tempdir().unwrap();
    let mut cfg = Config::load(None).unwrap();
    cfg.daemon.state_dir = state.path().to_path_buf();
    let topo = sysfs::read(std::path::Path::new("/sys")).unwrap();
    let d = rebalancer::daemon::Daemon::new(Shared::fresh(topo, cfg).unwrap(), Metrics::default());
    let mv = |cgroup: &str| Move {
        cgroup: cgroup.to_string(),
        from_cpus: all.clone(),
        to_cpus: one.clone(),
        from_mems: mems.clone(),
        to_mems: mems.clone(),
        bytes_to_migrate: 0,
        reason: Trigger::PoorLocality,
        locality_before: 0.1,
        locality_after: 0.9,
        net: 1.0,
        stage: None,
    };
    let plan = [mv(&a), mv(&b)];
    // The container exits between plan and apply.
    tree.rmdir(&a).unwrap();
    tree.rmdir(&a_pod).unwrap();
    let mut w = OwnedWriter::new(cg.clone());
    let done = apply_moves(io, &d, &mut w, &plan, 1000, false);
    println!("apply after rmdir: {done:?}");
    assert_eq!(done.failed, [(a.clone(), "vanished")]);
    assert_eq!(done.applied, 1);
    assert_eq!(cg.effective_cpus(&b).unwrap(), one);
    assert_eq!(d.lock(io).state.controller.failed_moves_total, 0);
    assert!(!cg.exists(Controller::Cpuset, &a));
    // Invariants on what is left (nothing is bound: this daemon admitted nothing).
    let status = serde_json::to_value(StatusDoc::of(&d.lock(io))).unwrap();
    let eff = cg.effective_cpus(&b).unwrap();
    assert!(!eff.is_empty() && eff.is_subset(&cg.effective_cpus(&tree.burstable).unwrap()));
    tree.rmdir(&b).unwrap();
    d.checkpoint(io).unwrap();
    let cp: Persisted = checkpoint::load(state.path()).unwrap().unwrap();
    assert_invariants(&tree, &status, Some(&cp), BUDGET_MIB);
}

/// Fault (d): a program fails to attach (on this kernel: the kprobe and the PMU event; any
/// source reported unavailable for a reason other than configuration). The daemon starts
/// anyway, logs the reason, reports the source as unavailable in the metric and in status, and
/// keeps running rounds on its fallback (/proc for per-cgroup CPU time).
#[test]
fn program_failing_to_attach_leaves_the_daemon_on_its_fallback_with_the_reason() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg, "attach");
    containers(&mut tree, 2, "d");
    let d = Daemon::start(
        "",
        &format!("{}[controller]\nperiod_ms = 200\n", tree.cgroups_toml()),
    );
    d.wait_rounds(2, Duration::from_secs(30));
    let st = wait_bound(&d, &tree);
    let sources = st["sources"].as_array().cloned().unwrap_or_default();
    let failed: Vec<&serde_json::Value> = sources
        .iter()
        .filter(|s| {
            s["available"] == false && {
                let r = s["reason"].as_str().unwrap_or("");
                !r.contains("not selected") && !r.contains("disabled by config")
            }
        })
        .collect();
    let Some(f) = failed.first() else {
        println!("SKIP: every eBPF source attached on this kernel; no attach failure to observe");
        return;
    };
    let name = f["name"].as_str().unwrap();
    let reason = f["reason"].as_str().unwrap();
    println!("source {name} failed to attach: {reason}");
    assert!(!reason.is_empty());
    assert_eq!(
        d.metric(&format!(
            "rebalancer_ebpf_source_available{{source=\"{name}\"}}"
        )),
        Some(0.0)
    );
    let log = d.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("eBPF source skipped") && l.contains(name) && l.contains(reason)),
        "the reason is not in the log:\n{log}"
    );
    let source = log
        .lines()
        .find(|l| l.contains("CPU time source"))
        .unwrap_or_default();
    assert!(source.contains("procfs"), "no /proc fallback: {source}");
    d.wait_rounds(2, Duration::from_secs(30));
    assert_invariants(&tree, &d.status(), None, BUDGET_MIB);
}

/// Fault (e): the checkpoint is truncated, or corrupted (a byte changed, so its checksum no
/// longer matches), while the daemon is down. At start the daemon warns, rebuilds its state from
/// the live cgroups (every live container is admitted again and bound), and runs.
#[test]
fn truncated_or_corrupted_checkpoint_is_rebuilt_from_live_cgroups_with_a_warning() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg, "ckpt");
    containers(&mut tree, 3, "e");
    let mut d = Daemon::start(
        "",
        &format!("{}[controller]\nperiod_ms = 200\n", tree.cgroups_toml()),
    );
    wait_bound(&d, &tree);
    for (how, damage) in [
        (
            "truncated",
            (|b: &mut Vec<u8>| b.truncate(b.len() / 2)) as fn(&mut Vec<u8>),
        ),
        ("corrupted", |b: &mut Vec<u8>| {
            let at = b.iter().rposition(|&c| c == b'0').unwrap();
            b[at] = b'1';
        }),
    ] {
        assert!(d.signal_and_wait(libc::SIGTERM).success());
        let path = d.state_dir.join(checkpoint::FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        damage(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        assert!(
            checkpoint::load::<Persisted>(&d.state_dir).is_err(),
            "{how}: still loads"
        );
        let log_from = d.log_text().len();
        d.restart();
        let st = wait_bound(&d, &tree);
        let log = d.log_text();
        let warned = log[log_from..]
            .lines()
            .find(|l| l.contains(" WARN ") && l.contains("checkpoint unusable"));
        println!("{how}: {}", warned.unwrap_or("no warning"));
        assert!(warned.is_some(), "{how}: no warning:\n{}", &log[log_from..]);
        assert!(d.alive());
        d.wait_rounds(1, Duration::from_secs(30));
        assert_invariants(&tree, &st, None, BUDGET_MIB);
    }
    let st = d.status();
    assert!(d.signal_and_wait(libc::SIGTERM).success());
    assert_invariants(&tree, &st, d.checkpoint().as_ref(), BUDGET_MIB);
}

/// Seconds since midnight UTC of a log line's timestamp (RFC 3339, `YYYY-MM-DDThh:mm:ss.ffffffZ ...`).
fn log_secs(line: &str) -> Option<f64> {
    let t = line
        .split_whitespace()
        .next()?
        .split_once('T')?
        .1
        .trim_end_matches('Z');
    let mut p = t.split(':');
    let (h, m, s): (f64, f64, f64) = (
        p.next()?.parse().ok()?,
        p.next()?.parse().ok()?,
        p.next()?.parse().ok()?,
    );
    Some(h * 3600.0 + m * 60.0 + s)
}

fn now_secs() -> f64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (d.as_secs() % 86_400) as f64 + f64::from(d.subsec_micros()) / 1e6
}

/// Sends `sig` while a round runs: holds the next round right after its start (the debug
/// build's test hook: `<state_dir>/test-hold-round`), waits for the hook's log line, signals,
/// and lets the round go on once the daemon has logged the signal (SIGTERM) or died (SIGKILL).
/// Returns the exit status and whether the log proves the signal landed mid-round (a round
/// started before it and finished after it).
fn signal_mid_round(d: &mut Daemon, sig: i32) -> (std::process::ExitStatus, bool) {
    const HELD: &str = "test hook: round held";
    let hold = d.state_dir.join("test-hold-round");
    let held = d.log_text().matches(HELD).count();
    std::fs::write(&hold, b"").unwrap();
    wait_for(20, "a round held by the test hook", || {
        d.log_text().matches(HELD).count() > held
    });
    let sent = now_secs();
    d.signal(sig);
    if sig == libc::SIGTERM {
        wait_for(20, "the SIGTERM logged", || {
            d.log_text().contains("SIGTERM received, stopping")
        });
    }
    std::fs::remove_file(&hold).unwrap();
    let st = d.wait_exit(sig);
    let log = d.log_text();
    let lines: Vec<&str> = log.lines().collect();
    let mid = lines.iter().enumerate().any(|(i, l)| {
        l.contains("round start")
            && log_secs(l).is_some_and(|t| t <= sent)
            && lines[i + 1..]
                .iter()
                .find(|n| n.contains("round done") || n.contains("round start"))
                .is_some_and(|n| n.contains("round done") && log_secs(n).is_some_and(|t| t >= sent))
    });
    // After kill -9 the round never finished: its start is the last round line, before the signal.
    let killed_mid = sig == libc::SIGKILL
        && lines
            .iter()
            .rev()
            .find(|l| l.contains("round start") || l.contains("round done"))
            .is_some_and(|l| l.contains("round start") && log_secs(l).is_some_and(|t| t <= sent));
    (st, mid || killed_mid)
}

/// Starts a daemon with a fast control loop over the tree; returns it once bound, with the
/// measured mean round duration.
fn busy_daemon(tree: &KubeTree) -> (Daemon, f64) {
    let d = Daemon::start(
        "",
        &format!("{}[controller]\nperiod_ms = 100\n", tree.cgroups_toml()),
    );
    wait_bound(&d, tree);
    d.wait_rounds(5, Duration::from_secs(30));
    let m = d.metrics();
    let sum = common::metric_value(&m, "rebalancer_control_round_duration_seconds_sum").unwrap();
    let n = common::metric_value(&m, "rebalancer_control_round_duration_seconds_count").unwrap();
    (d, sum / n)
}

/// No half-applied move: every bound container's cpuset is its admitted placement, unless the
/// controller moved it (then it is the move's target, checked non-empty by the invariants).
fn no_half_applied_move(tree: &KubeTree, cp: &Persisted) {
    for (rel, b) in &cp.bindings {
        if !rel.starts_with(&tree.prefix) {
            continue;
        }
        let pod = &cp.allocator.pods[&b.pod_uid];
        let c = pod
            .containers
            .iter()
            .find(|c| c.placement.container == b.container)
            .unwrap();
        let moved = cp.controller.cgroups.get(rel).is_some_and(|s| s.moves > 0);
        if !moved {
            assert_eq!(tree.cg.cpus(rel).unwrap(), c.placement.cpus, "{rel}: cpus");
            assert_eq!(tree.cg.mems(rel).unwrap(), c.placement.mems, "{rel}: mems");
        }
    }
}

/// Fault (f): SIGTERM while a round runs (held by the test hook; the log then shows that the
/// signal landed between a round's start and its end): the daemon
/// exits 0 after the round in progress, says it stopped cleanly, leaves a checkpoint that loads
/// and matches the live cgroups, and no move is half-applied. Four daemons, four signals, each
/// sent while a round is held by the test hook, so each must be proven mid-round.
#[test]
fn sigterm_mid_round_exits_cleanly_with_a_consistent_checkpoint() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg, "term");
    containers(&mut tree, 60, "f");
    for attempt in 0..4 {
        let (mut d, round_s) = busy_daemon(&tree);
        let before = d.status();
        let t = Instant::now();
        let (st, mid) = signal_mid_round(&mut d, libc::SIGTERM);
        println!(
            "attempt {attempt}: SIGTERM (mean round {:.1} ms) {} mid-round: exit {st} after {:.1} ms",
            round_s * 1e3,
            if mid { "landed" } else { "did not land" },
            t.elapsed().as_secs_f64() * 1e3
        );
        assert!(st.success(), "exit status {st}");
        let log = d.log_text();
        assert!(
            mid,
            "attempt {attempt}: the SIGTERM did not land mid-round:\n{log}"
        );
        assert!(log.contains("SIGTERM received, stopping"), "{log}");
        assert!(log.contains("rebalancer stopped cleanly"), "{log}");
        let cp = d.checkpoint().expect("a checkpoint was written");
        no_half_applied_move(&tree, &cp);
        assert_invariants(&tree, &before, Some(&cp), BUDGET_MIB);
    }
}

/// Fault (g): kill -9 while a round runs (as in (f)), then containers come and go while the
/// daemon is down. At restart it reconciles: vanished containers are released, new ones
/// admitted, the survivors keep their cpusets (no double admission), and every invariant holds.
#[test]
fn kill_9_mid_round_then_restart_reconciles_with_invariants_intact() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg, "kill");
    containers(&mut tree, 30, "c");
    let (mut d, round_s) = busy_daemon(&tree);
    let kept: Vec<String> = tree.live_containers().into_iter().skip(10).collect();
    let before: Vec<CpuSet> = kept.iter().map(|c| tree.cg.cpus(c).unwrap()).collect();
    let (st, mid) = signal_mid_round(&mut d, libc::SIGKILL);
    println!(
        "kill -9 (mean round {:.1} ms) {} mid-round: {st}",
        round_s * 1e3,
        if mid { "landed" } else { "did not land" }
    );
    assert!(mid, "the kill -9 did not land mid-round:\n{}", d.log_text());
    // While it is down: 10 containers exit, 5 new ones start.
    for c in tree.live_containers().into_iter().take(10) {
        tree.rmdir(&c).unwrap();
        tree.rmdir(c.rsplit_once('/').unwrap().0).unwrap();
    }
    containers(&mut tree, 5, "d");
    let pods_before = d.checkpoint().map_or(0, |c| c.allocator.pods.len());
    d.restart();
    let status = wait_bound(&d, &tree);
    let pods = status["pods"].as_array().map_or(0, |p| p.len());
    println!("restart: {pods_before} pods in the checkpoint, {pods} after reconcile");
    assert_eq!(
        pods, 25,
        "one pod per live container, nothing admitted twice"
    );
    for (c, cpus) in kept.iter().zip(&before) {
        assert_eq!(&tree.cg.cpus(c).unwrap(), cpus, "{c} kept its cpuset");
    }
    d.wait_rounds(2, Duration::from_secs(30));
    assert_invariants(&tree, &status, None, BUDGET_MIB);
    let st = d.status();
    assert!(d.signal_and_wait(libc::SIGTERM).success());
    let cp = d.checkpoint().unwrap();
    no_half_applied_move(&tree, &cp);
    assert_invariants(&tree, &st, Some(&cp), BUDGET_MIB);
}

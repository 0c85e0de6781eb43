//! Root tests of the actuator and the daemon on this machine's real cgroupfs:
//! - a real move (cpuset.cpus 0-1 → 1) applied through the cgroup layer, read back, and seen
//!   by the member process's own affinity;
//! - dry-run (of one move, and of a whole daemon run managing the cgroup) leaves every file of
//!   the cgroup byte-identical.
//!
//! Skips with a printed reason when not root, without a cpuset controller or with < 2 CPUs.
mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use rebalancer::{
    cgroup::{Cgroups, Controller},
    controller::{self, Move, Trigger},
    cpuset::CpuSet,
    rounds::OwnedWriter,
};

struct Guard {
    dir: PathBuf,
    child: Option<Child>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        for _ in 0..50 {
            if !self.dir.exists() || std::fs::remove_dir(&self.dir).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn setup(name: &str) -> Option<(Cgroups, String, Guard)> {
    let cg = common::root_cgroups()?;
    let Ok((root, _)) = cg.hierarchy(Controller::Cpuset) else {
        return None;
    };
    let root = root.to_path_buf();
    let parent_cpus = cg.effective_cpus("").ok()?;
    let rel = format!("rebalancer-test-{name}-{}", std::process::id());
    let two: CpuSet = parent_cpus.iter().take(2).collect();
    let mems: CpuSet = cg.effective_mems("").ok()?.iter().take(1).collect();
    cg.create_cpuset(&rel, &two, &mems)
        .expect("create test cpuset");
    let mut guard = Guard {
        dir: root.join(&rel),
        child: None,
    };
    let child = Command::new("sleep")
        .arg("60")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    cg.add_proc(Controller::Cpuset, &rel, child.id())
        .expect("join the cgroup");
    guard.child = Some(child);
    Some((cg, rel, guard))
}

/// Writes a dry-run daemon config managing `rel` (state and socket in `dir`, metrics on a free
/// port) plus `extra` sections; returns its path.
fn dry_run_config(dir: &Path, rel: &str, extra: &str) -> PathBuf {
    let cfg = dir.join("c.toml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ndry_run = true\nstate_dir = \"{0}/state\"\n[cgroups]\nroots = [\"{rel}\"]\nkubernetes = false\n[server]\nsocket = \"{0}/s.sock\"\nmetrics_listen = \"127.0.0.1:{port}\"\n{extra}",
            dir.display()
        ),
    )
    .unwrap();
    cfg
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            Some((
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).ok()?,
            ))
        })
        .collect()
}

fn mv(rel: &str, from: &CpuSet, to: &CpuSet, mems: &CpuSet) -> Move {
    Move {
        cgroup: rel.to_string(),
        from_cpus: from.clone(),
        to_cpus: to.clone(),
        from_mems: mems.clone(),
        to_mems: mems.clone(),
        bytes_to_migrate: 0,
        reason: Trigger::PoorLocality,
        locality_before: 0.0,
        locality_after: 1.0,
        net: 1.0,
        stage: None,
    }
}

#[test]
fn a_real_move_is_applied_and_read_back() {
    let io = &mut rebalancer::daemon::Io::new();
    let Some((cg, rel, guard)) = setup("move") else {
        return;
    };
    let from = cg.effective_cpus(&rel).unwrap();
    let mems = cg.effective_mems(&rel).unwrap();
    let to: CpuSet = from.iter().skip(1).take(1).collect();
    let mut w = OwnedWriter::new(cg.clone());
    let done = controller::apply(io, &mv(&rel, &from, &to, &mems), &mut w, false).expect("apply");
    assert!(!done.dry_run);
    assert_eq!(cg.effective_cpus(&rel).unwrap(), to);
    let pid = guard.child.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let allowed = rebalancer::procfs::parse_cpus_allowed(&status).unwrap();
    assert_eq!(allowed, to, "the member task's affinity follows the cpuset");
    println!("moved {rel} from {from} to {to}; task affinity {allowed}");
}

#[test]
fn dry_run_leaves_every_file_byte_identical() {
    let io = &mut rebalancer::daemon::Io::new();
    let _serial = common::serial();
    let Some((cg, rel, guard)) = setup("dry") else {
        return;
    };
    let before = snapshot(&guard.dir);
    let from = cg.effective_cpus(&rel).unwrap();
    let mems = cg.effective_mems(&rel).unwrap();
    let to: CpuSet = from.iter().take(1).collect();
    let mut w = OwnedWriter::new(cg.clone());
    let done =
        controller::apply(io, &mv(&rel, &from, &to, &mems), &mut w, true).expect("dry-run apply");
    assert!(done.dry_run);
    assert_eq!(
        snapshot(&guard.dir),
        before,
        "a dry-run move wrote to cgroupfs"
    );

    // A whole daemon run in dry-run mode managing this cgroup writes nothing either.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dry_run_config(
        dir.path(),
        &rel,
        "[controller]\nperiod_ms = 200\nlocality_threshold = 1.0\nmin_gain = 0.0\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["run", "--rounds", "4", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "rebalancer=debug")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("managed=1"),
        "the daemon did not manage the test cgroup:\n{log}"
    );
    assert_eq!(
        snapshot(&guard.dir),
        before,
        "a dry-run daemon wrote to cgroupfs"
    );
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn top_shows_a_busy_workload_on_its_node() {
    let _serial = common::serial();
    let Some((cg, rel, _guard)) = setup("top") else {
        return;
    };
    let busy = KillOnDrop(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    );
    cg.add_proc(Controller::Cpuset, &rel, busy.0.id())
        .expect("join the cgroup");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dry_run_config(
        dir.path(),
        &rel,
        "[ebpf]\nenabled = false\n[controller]\nperiod_ms = 300\n",
    );
    let _daemon = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_rebalancer"))
            .args(["run", "--config"])
            .arg(&cfg)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sock = dir.path().join("s.sock");
    let top = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rebalancer"))
            .arg("top")
            .args(args)
            .arg("--socket")
            .arg(&sock)
            .output()
            .unwrap()
    };
    // Wait for a few rounds (the first one has no CPU delta yet).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let view = loop {
        assert!(std::time::Instant::now() < deadline, "no rounds in 30 s");
        let out = top(&["--json"]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if v["rounds"].as_u64().unwrap_or(0) >= 3 {
                break v;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let w = view["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["cgroup"] == rel.as_str())
        .unwrap_or_else(|| panic!("{rel} not in {view}"));
    let cpu = w["cpu"].as_f64().unwrap();
    println!("top: {rel} uses {cpu:.2} CPUs, shares {}", w["cpu_share"]);
    // A spinning shell is always runnable: what it ran plus what it waited on the run queue
    // is one CPU's worth, however busy the machine is (on an idle machine nearly all of it
    // runs; with the build beside it on 2 CPUs, a good part waits). It ran some of it.
    // Where the round did not measure the wait, what it ran alone must show it busy.
    assert!(cpu > 0.02 && cpu < 1.3, "{w}");
    match w["wait"].as_f64() {
        Some(wait) => assert!(
            cpu + wait > 0.6 && cpu + wait < 1.5,
            "ran {cpu:.2} + waited {wait:.2}: {w}"
        ),
        None => assert!(cpu > 0.3, "{w}"),
    }
    let share_sum: f64 = w["cpu_share"]
        .as_object()
        .unwrap()
        .values()
        .map(|s| s.as_f64().unwrap())
        .sum();
    assert!((share_sum - 1.0).abs() < 1e-6, "{w}");
    let nodes = view["nodes"].as_array().unwrap();
    assert!(!nodes.is_empty());
    let busy_total: f64 = nodes.iter().map(|n| n["busy"].as_f64().unwrap()).sum();
    assert!(busy_total > 0.0, "{view}");

    let out = top(&["--once"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(text.contains("NODE") && text.contains("WORKLOAD"), "{text}");
    assert!(
        text.lines().any(|l| l.contains(&rel[rel.len() - 8..])),
        "{text}"
    );
}

/// A workload's own wait on the run queue, as the daemon measures it (`controller.own_wait`,
/// `runwait`) and `top` shows it: one process spinning in four threads in a cgroup whose
/// cpuset is one CPU can run one thread at a time, so at every instant at least three wait —
/// at least 3 CPUs' worth of wait per period, at most 4 (all of them, when something else
/// holds the CPU), less the edges of a period. A sleeping process beside it adds nothing.
/// Read by process, not thread, it would be unmeasured (its main thread alone does not run).
/// With `own_wait = false` nothing is measured. The kernel must keep run delays
/// (`/proc/self/schedstat`); without them it skips, printing why.
#[test]
fn top_shows_what_a_crowded_workload_waited() {
    let _serial = common::serial();
    if let Err(why) = rebalancer::runwait::probe(Path::new("/proc")) {
        println!("SKIP: {why}");
        return;
    }
    let Some((cg, rel, _guard)) = setup("wait") else {
        return;
    };
    let one: CpuSet = cg
        .effective_cpus(&rel)
        .unwrap()
        .iter()
        .skip(1)
        .take(1)
        .collect();
    cg.write_cpus(&rel, &one)
        .expect("narrow the test cpuset to one CPU");
    let spinner = common::spin_threads(4);
    cg.add_proc(Controller::Cpuset, &rel, spinner.id())
        .expect("join the cgroup");
    for own_wait in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dry_run_config(
            dir.path(),
            &rel,
            &format!("[ebpf]\nenabled = false\n[controller]\nperiod_ms = 1000\nevent_settle_ms = 0\nown_wait = {own_wait}\n"),
        );
        let daemon = KillOnDrop(
            Command::new(env!("CARGO_BIN_EXE_rebalancer"))
                .args(["run", "--config"])
                .arg(&cfg)
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let sock = dir.path().join("s.sock");
        let view = || {
            let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
                .args(["top", "--json", "--socket"])
                .arg(&sock)
                .output()
                .unwrap();
            out.status
                .success()
                .then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap())
        };
        // Rounds 1 and 2 are the CPU time's and the wait's baselines; from round 3 both
        // measure.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut waits = Vec::new();
        let mut last_round = 0;
        while waits.len() < 3 {
            assert!(std::time::Instant::now() < deadline, "no rounds in 30 s");
            if let Some(v) = view() {
                let rounds = v["rounds"].as_u64().unwrap_or(0);
                if rounds >= 3 && rounds != last_round {
                    last_round = rounds;
                    let w = v["workloads"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|w| w["cgroup"] == rel.as_str())
                        .unwrap_or_else(|| panic!("{rel} not in {v}"))
                        .clone();
                    println!(
                        "own_wait {own_wait}, round {rounds}: cpu {} wait {} (period {} s)",
                        w["cpu"], w["wait"], v["period_s"]
                    );
                    waits.push(w["wait"].as_f64());
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !own_wait {
            assert!(
                waits.iter().all(Option::is_none),
                "measured while off: {waits:?}"
            );
            continue;
        }
        let mut waits: Vec<f64> = waits
            .into_iter()
            .map(|w| w.expect("wait not measured"))
            .collect();
        waits.sort_by(f64::total_cmp);
        let median = waits[1];
        assert!(
            (2.5..=4.5).contains(&median),
            "4 threads on 1 CPU waited {median} CPUs' worth (rounds: {waits:?})"
        );
        // The source is reported available.
        let status = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
            .args(["status", "--json", "--socket"])
            .arg(&sock)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(
            text.contains("own_wait:schedstat"),
            "own_wait source not in status: {text}"
        );
        drop(daemon);
    }
}

/// Not a test: the spinning child of [`common::spin_threads`] (returns at once otherwise).
#[test]
fn spin_threads_child() {
    common::spin_threads_entry();
}

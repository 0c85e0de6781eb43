//! Root tests of the actuator and the daemon on this machine's real cgroupfs:
//! - a real move (cpuset.cpus 0-1 → 1) applied through the cgroup layer, read back, and seen
//!   by the member process's own affinity;
//! - dry-run (of one move, and of a whole daemon run managing the cgroup) leaves every file of
//!   the cgroup byte-identical.
//!
//! Skips with a printed reason when not root, without a cpuset controller or with < 2 CPUs.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use rebalancer::{
    cgroup::{Cgroups, Controller},
    controller::{self, Move, Trigger},
    cpuset::CpuSet,
    daemon::engine::RealWriter,
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
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return None;
    }
    let cg = match Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) {
        Ok(c) => c,
        Err(e) => {
            println!("SKIP: {e}");
            return None;
        }
    };
    let Ok((root, _)) = cg.hierarchy(Controller::Cpuset) else {
        println!("SKIP: no cpuset controller");
        return None;
    };
    let root = root.to_path_buf();
    let parent_cpus = cg.effective_cpus("").ok()?;
    if parent_cpus.len() < 2 {
        println!("SKIP: needs 2 CPUs, the root cpuset has {parent_cpus}");
        return None;
    }
    let rel = format!("rebalancer-test-{name}-{}", std::process::id());
    let two: CpuSet = parent_cpus.iter().take(2).collect();
    let mems: CpuSet = cg.effective_mems("").ok()?.iter().take(1).collect();
    if cg
        .hierarchy(Controller::Cpuset)
        .is_ok_and(|(_, v)| v == rebalancer::cgroup::Version::V2)
    {
        let _ = cg.enable_cpuset_v2("");
    }
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
    }
}

#[test]
fn a_real_move_is_applied_and_read_back() {
    let Some((cg, rel, guard)) = setup("move") else {
        return;
    };
    let from = cg.effective_cpus(&rel).unwrap();
    let mems = cg.effective_mems(&rel).unwrap();
    let to: CpuSet = from.iter().skip(1).take(1).collect();
    let mut w = RealWriter(&cg);
    let done = controller::apply(&mv(&rel, &from, &to, &mems), &mut w, false).expect("apply");
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
    let Some((cg, rel, guard)) = setup("dry") else {
        return;
    };
    let before = snapshot(&guard.dir);
    let from = cg.effective_cpus(&rel).unwrap();
    let mems = cg.effective_mems(&rel).unwrap();
    let to: CpuSet = from.iter().take(1).collect();
    let mut w = RealWriter(&cg);
    let done =
        controller::apply(&mv(&rel, &from, &to, &mems), &mut w, true).expect("dry-run apply");
    assert!(done.dry_run);
    assert_eq!(
        snapshot(&guard.dir),
        before,
        "a dry-run move wrote to cgroupfs"
    );

    // A whole daemon run in dry-run mode managing this cgroup writes nothing either.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ndry_run = true\nstate_dir = \"{0}/state\"\n[cgroups]\nroots = [\"{rel}\"]\n[controller]\nperiod_ms = 200\nlocality_threshold = 1.0\nmin_gain = 0.0\n[server]\nsocket = \"{0}/s.sock\"\nmetrics_listen = \"127.0.0.1:{port}\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
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

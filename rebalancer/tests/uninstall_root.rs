//! Root test of `rebalancer uninstall` on this machine's real cgroupfs: a daemon (the watcher
//! door) places Burstable containers off a strictly reserved CPU, so their cpusets are
//! narrower than their parents'; while it runs, uninstall refuses; once it is stopped,
//! uninstall leaves every managed container cgroup with its parent's effective cpus and mems.
//! `kernel.numa_balancing`: a daemon told to turn it off records the value it found and is
//! killed (SIGKILL: no restore); uninstall restores the recorded value.
//!
//! Skips with a printed reason when not root, without a cpuset controller or with < 2 CPUs.
mod common;

use std::process::Command;

use common::{wait_for, Daemon, KubeTree};
use rebalancer::cpuset::CpuSet;

const NUMA_BALANCING: &str = "/proc/sys/kernel/numa_balancing";

fn uninstall(d: &Daemon, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["uninstall", "--config"])
        .arg(&d.config)
        .args(extra)
        .output()
        .unwrap()
}

/// Puts kernel.numa_balancing back as the test found it, whatever happens.
struct Sysctl(Option<String>);

impl Drop for Sysctl {
    fn drop(&mut self) {
        if let Some(v) = &self.0 {
            let _ = std::fs::write(NUMA_BALANCING, v);
        }
    }
}

#[test]
fn uninstall_hands_every_managed_container_its_parents_sets_and_restores_numa_balancing() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg.clone(), "uninstall");
    let all = tree.all_cpus.clone();
    let reserved: CpuSet = all.iter().take(1).collect();
    // numa_balancing on before the daemon, so "disable" has something to record
    let found = std::fs::read_to_string(NUMA_BALANCING).ok();
    let _sysctl = Sysctl(found.clone());
    let autonuma = found.is_some() && std::fs::write(NUMA_BALANCING, "1").is_ok();
    if !autonuma {
        println!("kernel.numa_balancing cannot be set here: only the cpusets are checked");
    }

    let mut d = Daemon::start(
        "",
        &format!(
            "{}[placement]\nreserved_cpus = \"{reserved}\"\nstrict_cpu_reservation = true\n[controller]\nautonuma = \"disable\"\n[ebpf]\nenabled = false\n",
            tree.cgroups_toml()
        ),
    );
    let mut managed = Vec::new();
    for i in 0..3 {
        let uid = format!("0a1b2c3d-0000-4000-8000-{i:012}");
        let (_, c) = tree.pod_with_container(&uid, &format!("{i:x}").repeat(64));
        managed.push(c);
    }
    let narrowed = all.difference(&reserved);
    wait_for(
        20,
        "the watcher to place the containers off the reserved CPU",
        || {
            managed
                .iter()
                .all(|c| cg.cpus(c).is_ok_and(|cpus| cpus == narrowed))
        },
    );
    if autonuma {
        assert_eq!(std::fs::read_to_string(NUMA_BALANCING).unwrap().trim(), "0");
    }

    // a running daemon: refused, nothing written
    let out = uninstall(&d, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another rebalancer") && err.contains("--force"),
        "{err}"
    );
    for c in &managed {
        assert_eq!(
            cg.cpus(c).unwrap(),
            narrowed,
            "{c} written by a refused uninstall"
        );
    }

    // killed: nothing restored, the record stays for uninstall
    d.signal_and_wait(libc::SIGKILL);
    if autonuma {
        assert_eq!(std::fs::read_to_string(NUMA_BALANCING).unwrap().trim(), "0");
        assert!(d.state_dir.join("numa_balancing.before").exists());
    }
    // --dry-run writes nothing
    let out = uninstall(&d, &["--dry-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for c in &managed {
        assert_eq!(cg.cpus(c).unwrap(), narrowed);
    }
    let out = uninstall(&d, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    for c in &managed {
        let parent = c.rsplit_once('/').unwrap().0;
        assert_eq!(
            cg.cpus(c).unwrap(),
            cg.effective_cpus(parent).unwrap(),
            "{c}"
        );
        assert_eq!(
            cg.mems(c).unwrap(),
            cg.effective_mems(parent).unwrap(),
            "{c}"
        );
        assert_eq!(cg.cpus(c).unwrap(), all);
    }
    if autonuma {
        assert_eq!(std::fs::read_to_string(NUMA_BALANCING).unwrap().trim(), "1");
        assert!(!d.state_dir.join("numa_balancing.before").exists());
    }
}

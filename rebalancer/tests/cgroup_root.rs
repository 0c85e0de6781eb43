//! Root test on this machine's real cgroupfs: makes a cpuset cgroup through the layer, writes
//! and reads it back, and shows that invalid writes are refused (by us, or by the kernel with a
//! mapped error) and change nothing. Skips with a printed reason when not root or without a
//! cpuset controller. Cleans up (rmdir) even when an assertion fails.
mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use rebalancer::{
    cgroup::{CgroupError, Cgroups, Controller, Version},
    cpuset::CpuSet,
};

/// Removes the test cgroups (deepest first) when dropped, whatever happened.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            for _ in 0..50 {
                if !dir.exists() || std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if dir.exists() {
                eprintln!("WARNING: could not remove {}", dir.display());
            }
        }
    }
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

#[test]
fn real_cpuset_write_read_back_and_refusals() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let cg = match Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) {
        Ok(cg) => cg,
        Err(e) => {
            println!("SKIP: cannot detect cgroups: {e}");
            return;
        }
    };
    let (root, version) = match cg.hierarchy(Controller::Cpuset) {
        Ok((r, v)) => (r.to_path_buf(), v),
        Err(e) => {
            println!("SKIP: {e}");
            return;
        }
    };
    if version == Version::V2 {
        let controllers =
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "cpuset") {
            println!(
                "SKIP: cpuset controller not available on the v2 hierarchy at {}",
                root.display()
            );
            return;
        }
        cg.enable_cpuset_v2("/")
            .expect("enable +cpuset in the root's subtree_control");
    }
    println!(
        "cgroup mode {}, cpuset on {:?} at {}",
        cg.mode(),
        version,
        root.display()
    );

    let all_cpus = cg.effective_cpus("/").unwrap();
    let all_mems = cg.effective_mems("/").unwrap();
    let first = set(&all_cpus.first().unwrap().to_string());
    let name = format!("/rebalancer-test-{}", std::process::id());
    let inner = format!("{name}/inner");
    let _cleanup = Cleanup(vec![root.join(&name[1..]), root.join(&inner[1..])]);

    // Create with the first CPU; it reads back, also straight from the kernel's file.
    cg.create_cpuset(&name, &first, &all_mems).unwrap();
    assert_eq!(cg.cpus(&name).unwrap(), first);
    assert_eq!(cg.mems(&name).unwrap(), all_mems);
    let raw = std::fs::read_to_string(root.join(&name[1..]).join("cpuset.cpus")).unwrap();
    assert_eq!(raw.trim(), first.first().unwrap().to_string());
    cg.write_cpus(&name, &all_cpus).unwrap();
    assert_eq!(cg.cpus(&name).unwrap(), all_cpus);
    assert_eq!(cg.effective_cpus(&name).unwrap(), all_cpus);
    cg.set_memory_migrate(&name, true).unwrap();

    // Refused by us, nothing changes.
    let file = root.join(&name[1..]).join("cpuset.cpus");
    let e = cg.write_cpus(&name, &CpuSet::new()).unwrap_err();
    assert!(matches!(e, CgroupError::Empty { .. }), "{e}");
    println!("empty: {e}");
    let e = cg.write_cpus(&name, &set("4095")).unwrap_err();
    assert!(matches!(e, CgroupError::OutsideParent { .. }), "{e}");
    assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    println!("out of range: {e}");
    let e = cg.write_mems(&name, &set("63")).unwrap_err();
    assert!(matches!(e, CgroupError::OutsideParent { .. }), "{e}");
    assert_eq!(cg.cpus(&name).unwrap(), all_cpus);
    assert_eq!(cg.mems(&name).unwrap(), all_mems);

    // A task can join, and sees the cpuset.
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let joined = cg.add_proc(Controller::Cpuset, &name, child.id());
    let procs = cg.procs(Controller::Cpuset, &name);
    let _ = child.kill();
    let _ = child.wait();
    joined.unwrap();
    assert!(procs.unwrap().contains(&child.id()));

    if all_cpus.len() < 2 {
        println!("SKIP (part): one CPU, cannot test a child outside its parent");
        return;
    }
    let second = set(&all_cpus.iter().nth(1).unwrap().to_string());
    cg.write_cpus(&name, &first.union(&second)).unwrap();
    cg.create_cpuset(&inner, &first, &all_mems).unwrap();
    cg.write_cpus(&name, &first).unwrap();
    assert_eq!(cg.effective_cpus(&name).unwrap(), first);

    // Outside the parent: `second` is the machine's but not the parent's. Refused by us.
    let e = cg.write_cpus(&inner, &second).unwrap_err();
    assert!(matches!(e, CgroupError::OutsideParent { .. }), "{e}");
    println!("outside parent: {e}");
    assert_eq!(cg.cpus(&inner).unwrap(), first);

    // Refused by the kernel: on v1 a parent may not drop a CPU its child uses (EBUSY). Our
    // check passes (`second` is within the root), so this exercises the errno mapping.
    let r = cg.write_cpus(&name, &second);
    match version {
        Version::V1 => {
            let e = r.unwrap_err();
            match &e {
                CgroupError::Write { reason, path, .. } => {
                    assert!(reason.contains("EBUSY"), "{reason}");
                    assert_eq!(path, &file);
                }
                other => panic!("expected a kernel EBUSY, got {other:?}"),
            }
            println!("kernel refusal: {e}");
            assert_eq!(
                cg.cpus(&name).unwrap(),
                first,
                "a refused write changed the file"
            );
        }
        // v2 allows it and takes the CPU from the child's effective set instead.
        Version::V2 => r.unwrap(),
    }
}

/// The readers parse this kernel's real files (the root cgroup of each v1 hierarchy; a v2 root
/// has no cpu.max / memory.max, so on v2 only the cpuset and numa_stat-free parts are read).
#[test]
fn real_readers_parse_this_kernel() {
    let cg = match Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) {
        Ok(cg) => cg,
        Err(e) => {
            println!("SKIP: cannot detect cgroups: {e}");
            return;
        }
    };
    println!("mode {}", cg.mode());
    if let Ok((_, Version::V1)) = cg.hierarchy(Controller::Memory) {
        let s = cg.numa_stat("/").unwrap();
        assert!(!s.anon.is_empty() && !s.file.is_empty(), "{s:?}");
        println!("root numa_stat: {s:?}");
        assert_eq!(cg.memory_max("/").unwrap(), None);
    } else {
        println!("SKIP (part): memory not on v1");
    }
    if let Ok((_, Version::V1)) = cg.hierarchy(Controller::Cpu) {
        assert_eq!(cg.cpu_max("/").unwrap().quota_us, None);
        assert!((1..=10_000).contains(&cg.cpu_weight("/").unwrap()));
    }
    if cg.mounts().v2.is_some() {
        assert!(cg.cgroup_id("/").unwrap() > 0);
    }
    if cg.hierarchy(Controller::Cpuset).is_ok() {
        let mine = cg
            .cgroup_of_pid(Path::new("/proc"), std::process::id(), Controller::Cpuset)
            .unwrap();
        println!("this test's cpuset cgroup: {mine}");
        assert!(cg.dir(Controller::Cpuset, &mine).unwrap().0.is_dir());
        assert!(!cg.effective_cpus("/").unwrap().is_empty());
        assert!(!cg.effective_mems("/").unwrap().is_empty());
    }
}

/// `Cgroups::throttling` and `Cgroups::threads` on this kernel: a spinning process in a child
/// cgroup whose *parent* has a CPU quota of 10% is throttled within a second; the child's own
/// `cpu.stat` counts nothing (it has no limit), the reader counts its parent's throttling —
/// `nr_throttled` and the throttled time, each of which must grow. `threads` lists the
/// spinner's two threads (its process alone would be one). Skips (printing why) when not root or without a CPU controller
/// to limit (v2: `+cpu` not enabled at the root).
#[test]
fn throttling_by_an_ancestors_quota_is_counted() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let Ok(cg) = Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) else {
        println!("SKIP: cannot detect cgroups");
        return;
    };
    let Ok((root, version)) = cg
        .hierarchy(Controller::Cpu)
        .map(|(r, v)| (r.to_path_buf(), v))
    else {
        println!("SKIP: no CPU controller");
        return;
    };
    if version == Version::V2
        && !std::fs::read_to_string(root.join("cgroup.subtree_control"))
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "cpu")
    {
        println!("SKIP: cgroup v2 without +cpu in the root's subtree_control");
        return;
    }
    let parent = format!("rebalancer-test-throttle-{}", std::process::id());
    let child = format!("{parent}/w");
    let _cleanup = Cleanup(vec![root.join(&parent), root.join(&child)]);
    std::fs::create_dir(root.join(&parent)).unwrap();
    match version {
        Version::V2 => {
            std::fs::write(root.join(&parent).join("cgroup.subtree_control"), "+cpu").unwrap();
            std::fs::write(root.join(&parent).join("cpu.max"), "10000 100000").unwrap();
        }
        Version::V1 => {
            std::fs::write(root.join(&parent).join("cpu.cfs_period_us"), "100000").unwrap();
            std::fs::write(root.join(&parent).join("cpu.cfs_quota_us"), "10000").unwrap();
        }
    }
    std::fs::create_dir(root.join(&child)).unwrap();
    assert_eq!(cg.throttling(&child), 0, "nothing ran yet");
    let spin = common::spin_threads(2);
    let pid = spin.id();
    std::fs::write(root.join(&child).join("cgroup.procs"), pid.to_string()).unwrap();
    // The kernel counts a throttle when the group runs out of quota but adds its throttled
    // time only when the group is unthrottled at the next period, so the parent's two counters
    // grow one period apart: wait (within the deadline) until both have.
    let read_parent = || std::fs::read_to_string(root.join(&parent).join("cpu.stat")).unwrap();
    let line = |stat: &str, k: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
    };
    let both_grew = |stat: &str| {
        line(stat, "nr_throttled ") > Some(0)
            && line(stat, "throttled_time ").or(line(stat, "throttled_usec ")) > Some(0)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while (cg.throttling(&child) == 0 || !both_grew(&read_parent()))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let counted = cg.throttling(&child);
    let own = rebalancer::cgroup::files::parse_throttling(
        &std::fs::read_to_string(root.join(&child).join("cpu.stat")).unwrap(),
    );
    let threads = cg.threads(Controller::Cpu, &child);
    let tids = common::tids_of(pid);
    let parent_stat = read_parent();
    drop(spin);
    let line = |k: &str| line(&parent_stat, k);
    // Both of the parent's counters grew (each is part of what `throttling` sums).
    assert!(line("nr_throttled ") > Some(0), "{parent_stat}");
    assert!(
        line("throttled_time ").or(line("throttled_usec ")) > Some(0),
        "{parent_stat}"
    );
    assert!(
        counted > 0,
        "a spinner under a 10% quota was never throttled"
    );
    assert_eq!(own, 0, "the child has no limit of its own");
    let mut threads = threads.unwrap();
    threads.sort_unstable();
    assert!(tids.len() >= 2, "the spinner has {tids:?}");
    assert_eq!(threads, tids, "the spinner's threads");
}

/// `Cgroups::threads` on a cgroup v2 hierarchy (`cgroup.threads`), wherever one is mounted —
/// the unified mount beside v1 on a hybrid host too: a child moved into a fresh group is its
/// one thread. Skips (printing why) when not root or without a cgroup2 mount.
#[test]
fn threads_of_a_v2_cgroup() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let Some(v2) = rebalancer::ebpf::probe::cgroup2_mount(&mi) else {
        println!("SKIP: no cgroup2 mount");
        return;
    };
    let cg = Cgroups::new(rebalancer::cgroup::Mounts {
        v2: Some(v2.clone()),
        v1: Default::default(),
    });
    let rel = format!("rebalancer-test-threads-{}", std::process::id());
    let _cleanup = Cleanup(vec![v2.join(&rel)]);
    std::fs::create_dir(v2.join(&rel)).unwrap();
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let moved = std::fs::write(v2.join(&rel).join("cgroup.procs"), pid.to_string());
    let threads = cg.threads(Controller::Cpuset, &rel);
    let _ = child.kill();
    let _ = child.wait();
    moved.unwrap();
    assert_eq!(threads.unwrap(), vec![pid]);
}

/// Not a test: the spinning child of [`common::spin_threads`] (returns at once otherwise).
#[test]
fn spin_threads_child() {
    common::spin_threads_entry();
}

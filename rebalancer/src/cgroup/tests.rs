//! Cgroup layer on fake hierarchies in tempdirs (plain files: no kernel validation, so these
//! test our own checks, parsing and path resolution; tests/cgroup_root.rs tests the kernel).
use std::{fs, path::Path};

use super::*;

fn put(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// A hybrid machine: v1 cpuset, cpu,cpuacct and memory, empty v2 at unified/.
fn fake_v1(root: &Path) -> Cgroups {
    for (rel, text) in [
        ("cpuset/tasks", ""),
        ("cpuset/cpuset.cpus", "0-7\n"),
        ("cpuset/cpuset.mems", "0-1\n"),
        ("cpuset/cpuset.effective_cpus", "0-7\n"),
        ("cpuset/cpuset.effective_mems", "0-1\n"),
        ("cpuset/pod/cpuset.cpus", "0-3\n"),
        ("cpuset/pod/cpuset.mems", "0\n"),
        ("cpuset/pod/cpuset.effective_cpus", "0-3\n"),
        ("cpuset/pod/cpuset.effective_mems", "0\n"),
        ("cpuset/pod/cpuset.memory_migrate", "0\n"),
        ("cpuset/pod/c1/cpuset.cpus", "0-1\n"),
        ("cpuset/pod/c1/cpuset.mems", "0\n"),
        ("cpuset/pod/c1/cgroup.procs", "17\n4242\n"),
        ("cpu,cpuacct/tasks", ""),
        ("cpu,cpuacct/pod/cpu.cfs_quota_us", "150000\n"),
        ("cpu,cpuacct/pod/cpu.cfs_period_us", "100000\n"),
        ("cpu,cpuacct/pod/cpu.shares", "2048\n"),
        ("memory/tasks", ""),
        ("memory/pod/memory.limit_in_bytes", "9223372036854771712\n"),
        ("memory/pod/memory.numa_stat", "total=30 N0=20 N1=10\nfile=10 N0=10 N1=0\nanon=20 N0=10 N1=10\nunevictable=0 N0=0 N1=0\n"),
        ("unified/cgroup.controllers", ""),
    ] {
        put(root, rel, text);
    }
    Cgroups::new(Mounts::scan_root(root).unwrap()).with_page_size(4096)
}

fn fake_v2(root: &Path) -> Cgroups {
    for (rel, text) in [
        ("cgroup.controllers", "cpuset cpu io memory hugetlb pids\n"),
        ("cpuset.cpus.effective", "0-15\n"),
        ("cpuset.mems.effective", "0-3\n"),
        ("k.slice/cpuset.cpus", "\n"),
        ("k.slice/cpuset.mems", "\n"),
        ("k.slice/cpuset.cpus.effective", "0-15\n"),
        ("k.slice/cpuset.mems.effective", "0-3\n"),
        ("k.slice/cpu.max", "max 100000\n"),
        ("k.slice/cpu.weight", "100\n"),
        ("k.slice/memory.max", "1073741824\n"),
        ("k.slice/memory.numa_stat", "anon N0=4096 N1=0 N2=8192 N3=0\nfile N0=0 N1=0 N2=0 N3=4096\nanon_thp N0=0 N1=0 N2=0 N3=0\n"),
        ("k.slice/hugetlb.2MB.numa_stat", "total=4194304 N0=2097152 N1=0 N2=2097152 N3=0\n"),
        ("k.slice/hugetlb.1GB.numa_stat", "total=1073741824 N0=1073741824 N1=0 N2=0 N3=0\n"),
        ("k.slice/cgroup.procs", ""),
    ] {
        put(root, rel, text);
    }
    Cgroups::new(Mounts::scan_root(root).unwrap())
}

#[test]
fn v1_reads_and_validated_writes() {
    let d = tempfile::tempdir().unwrap();
    let cg = fake_v1(d.path());
    assert_eq!(cg.mode(), CgroupMode::Hybrid);
    assert_eq!(cg.effective_cpus("/pod").unwrap().to_string(), "0-3");
    assert_eq!(cg.effective_mems("pod").unwrap().to_string(), "0");
    assert_eq!(cg.cpu_max("/pod").unwrap().cpus(), Some(1.5));
    assert_eq!(
        cg.cpu_weight("/pod").unwrap(),
        files::shares_to_weight(2048)
    );
    assert_eq!(cg.memory_max("/pod").unwrap(), None);
    let s = cg.numa_stat("/pod").unwrap();
    assert_eq!(s.anon, [(0, 40960), (1, 40960)].into_iter().collect());
    assert_eq!(s.file, [(0, 40960), (1, 0)].into_iter().collect());
    assert!(s.hugetlb.is_empty());
    assert_eq!(
        cg.procs(Controller::Cpuset, "/pod/c1").unwrap(),
        vec![17, 4242]
    );
    assert_eq!(
        cg.walk(Controller::Cpuset, "/").unwrap(),
        vec!["/".to_string(), "/pod".into(), "/pod/c1".into()]
    );

    let file = d.path().join("cpuset/pod/c1/cpuset.cpus");
    cg.write_cpus("/pod/c1", &CpuSet::parse("2-3").unwrap())
        .unwrap();
    assert_eq!(fs::read_to_string(&file).unwrap(), "2-3");
    cg.set_memory_migrate("/pod", true).unwrap();
    assert_eq!(
        fs::read_to_string(d.path().join("cpuset/pod/cpuset.memory_migrate")).unwrap(),
        "1"
    );

    // Refusals change nothing and name the file.
    let e = cg
        .write_cpus("/pod/c1", &CpuSet::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("empty") && e.contains("pod/c1/cpuset.cpus"),
        "{e}"
    );
    let e = cg
        .write_cpus("/pod/c1", &CpuSet::parse("3-5").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"4-5\" not in the parent's effective set \"0-3\""),
        "{e}"
    );
    let e = cg
        .write_mems("/pod/c1", &CpuSet::parse("1").unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cpuset.mems"), "{e}");
    assert_eq!(fs::read_to_string(&file).unwrap(), "2-3");
    let e = cg
        .write_cpus("/pod/../..", &CpuSet::parse("1").unwrap())
        .unwrap_err();
    assert!(matches!(e, CgroupError::BadPath { .. }), "{e}");
    // A missing file is an error naming it.
    let e = cg
        .write_cpus("/gone", &CpuSet::parse("1").unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gone/cpuset.cpus"), "{e}");
}

#[test]
fn v2_reads_and_validated_writes() {
    let d = tempfile::tempdir().unwrap();
    let cg = fake_v2(d.path());
    assert_eq!(cg.mode(), CgroupMode::V2);
    assert_eq!(cg.cpus("/k.slice").unwrap(), CpuSet::new());
    assert_eq!(cg.effective_cpus("/k.slice").unwrap().to_string(), "0-15");
    assert_eq!(cg.cpu_max("/k.slice").unwrap().quota_us, None);
    assert_eq!(cg.cpu_weight("/k.slice").unwrap(), 100);
    assert_eq!(cg.memory_max("/k.slice").unwrap(), Some(1 << 30));
    let s = cg.numa_stat("/k.slice").unwrap();
    assert_eq!(s.anon[&2], 8192);
    assert_eq!(s.file[&3], 4096);
    assert_eq!(s.hugetlb[&0], (1 << 30) + (2 << 20));
    assert_eq!(s.hugetlb[&2], 2 << 20);
    cg.write_cpus("/k.slice", &CpuSet::parse("8-15").unwrap())
        .unwrap();
    cg.write_mems("/k.slice", &CpuSet::parse("2-3").unwrap())
        .unwrap();
    assert_eq!(cg.mems("/k.slice").unwrap().to_string(), "2-3");
    let e = cg
        .write_mems("/k.slice", &CpuSet::parse("4").unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"4\" not in the parent's effective set \"0-3\""),
        "{e}"
    );
    cg.set_memory_migrate("/k.slice", true).unwrap(); // no-op on v2
                                                      // A malformed file names itself.
    put(d.path(), "k.slice/cpuset.cpus.effective", "0-\n");
    let e = cg.effective_cpus("/k.slice").unwrap_err().to_string();
    assert!(e.contains("k.slice/cpuset.cpus.effective"), "{e}");
}

#[test]
fn create_refuses_before_mkdir_and_cleans_up_after_a_failed_write() {
    let d = tempfile::tempdir().unwrap();
    let cg = fake_v1(d.path());
    let e = cg.create_cpuset("/pod/new", &CpuSet::new(), &CpuSet::parse("0").unwrap());
    assert!(matches!(e, Err(CgroupError::Empty { .. })));
    assert!(!d.path().join("cpuset/pod/new").exists());
    // On a fake tree mkdir makes no interface files, so the first write fails: the directory
    // must be removed again.
    let e = cg.create_cpuset(
        "/pod/new",
        &CpuSet::parse("0").unwrap(),
        &CpuSet::parse("0").unwrap(),
    );
    assert!(e.is_err());
    assert!(!d.path().join("cpuset/pod/new").exists());
}

#[test]
fn no_controller_is_a_clear_error() {
    let cg = Cgroups::new(Mounts::default());
    let e = cg.effective_cpus("/").unwrap_err().to_string();
    assert_eq!(e, "no cpuset controller mounted (cgroup mode none)");
}

#[test]
fn kernel_errnos_have_messages() {
    for (errno, word) in [
        (libc::EINVAL, "EINVAL"),
        (libc::EBUSY, "EBUSY"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::EACCES, "permission"),
        (libc::ENOENT, "no longer exists"),
    ] {
        let r = write_reason(&std::io::Error::from_raw_os_error(errno));
        assert!(r.contains(word), "{errno}: {r}");
    }
}

/// Every malformed or missing file is an error naming it. (file, content or None to delete,
/// the read that must fail)
#[test]
fn malformed_cgroup_files_name_the_file() {
    type Read = fn(&Cgroups) -> Result<(), CgroupError>;
    let table: &[(&str, Option<&str>, Read)] = &[
        ("k.slice/cpuset.cpus", Some("0-3,\n"), |c| {
            c.cpus("/k.slice").map(drop)
        }),
        ("k.slice/cpuset.mems.effective", None, |c| {
            c.effective_mems("/k.slice").map(drop)
        }),
        ("k.slice/cpu.max", Some("100000\n"), |c| {
            c.cpu_max("/k.slice").map(drop)
        }),
        ("k.slice/cpu.weight", Some("heavy\n"), |c| {
            c.cpu_weight("/k.slice").map(drop)
        }),
        ("k.slice/memory.max", Some("12G\n"), |c| {
            c.memory_max("/k.slice").map(drop)
        }),
        ("k.slice/memory.numa_stat", Some("anon N0=1 N1\n"), |c| {
            c.numa_stat("/k.slice").map(drop)
        }),
        ("k.slice/memory.numa_stat", None, |c| {
            c.numa_stat("/k.slice").map(drop)
        }),
        (
            "k.slice/hugetlb.2MB.numa_stat",
            Some("hierarchical_total=0\n"),
            |c| c.numa_stat("/k.slice").map(drop),
        ),
        ("k.slice/cgroup.procs", Some("12\n1x\n"), |c| {
            c.procs(Controller::Cpu, "/k.slice").map(drop)
        }),
        // The parent's effective set is read before a write: a bad one stops the write.
        ("cpuset.cpus.effective", Some("0-15,16-\n"), |c| {
            c.write_cpus("/k.slice", &CpuSet::parse("1").unwrap())
        }),
    ];
    for (rel, content, read) in table {
        let d = tempfile::tempdir().unwrap();
        let cg = fake_v2(d.path());
        let p = d.path().join(rel);
        match content {
            Some(text) => fs::write(&p, text).unwrap(),
            None => fs::remove_file(&p).unwrap(),
        }
        let e = read(&cg).expect_err(rel).to_string();
        assert!(e.contains(&p.display().to_string()), "{rel}: {e}");
    }
}

#[test]
fn cgroup_id_is_the_v2_inode() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().unwrap();
    let cg = fake_v2(d.path());
    let ino = fs::metadata(d.path().join("k.slice")).unwrap().ino();
    assert_eq!(cg.cgroup_id("/k.slice").unwrap(), ino);
    assert!(cg
        .cgroup_id("/missing")
        .unwrap_err()
        .to_string()
        .contains("missing"));
}

#[test]
fn cgroup_of_pid_picks_the_controllers_line() {
    let d = tempfile::tempdir().unwrap();
    let cg = fake_v1(&d.path().join("cg"));
    put(
        d.path(),
        "proc/77/cgroup",
        "4:memory:/m\n3:cpuset:/pod/c1\n2:cpu,cpuacct:/pod\n0::/\n",
    );
    let proc = d.path().join("proc");
    assert_eq!(
        cg.cgroup_of_pid(&proc, 77, Controller::Cpuset).unwrap(),
        "/pod/c1"
    );
    assert_eq!(
        cg.cgroup_of_pid(&proc, 77, Controller::Cpu).unwrap(),
        "/pod"
    );
    let v2 = fake_v2(&d.path().join("v2"));
    assert_eq!(
        v2.cgroup_of_pid(&proc, 77, Controller::Cpuset).unwrap(),
        "/"
    );
    let e = cg
        .cgroup_of_pid(&proc, 78, Controller::Cpuset)
        .unwrap_err()
        .to_string();
    assert!(e.contains("proc/78/cgroup"), "{e}");
}

#[test]
fn hugetlb_limits_read_v1_and_v2_names() {
    let d = tempfile::tempdir().unwrap();
    let v2 = fake_v2(d.path());
    assert_eq!(
        v2.hugetlb_limits("k.slice").unwrap(),
        HugetlbLimits::default(),
        "no limit files: no limits"
    );
    put(d.path(), "k.slice/hugetlb.2MB.max", "4194304\n");
    put(d.path(), "k.slice/hugetlb.1GB.max", "max\n");
    assert_eq!(
        v2.hugetlb_limits("k.slice").unwrap(),
        HugetlbLimits {
            hugepages_2mi: Some(4 << 20),
            hugepages_1gi: None
        }
    );
    put(d.path(), "k.slice/hugetlb.1GB.max", "lots\n");
    assert!(v2
        .hugetlb_limits("k.slice")
        .unwrap_err()
        .to_string()
        .contains("hugetlb.1GB.max"));

    let d1 = tempfile::tempdir().unwrap();
    put(d1.path(), "hugetlb/tasks", "");
    put(
        d1.path(),
        "hugetlb/pod/hugetlb.1GB.limit_in_bytes",
        "2147483648\n",
    );
    put(
        d1.path(),
        "hugetlb/pod/hugetlb.2MB.limit_in_bytes",
        "9223372036854771712\n",
    );
    let v1 = fake_v1(d1.path());
    assert_eq!(
        v1.hugetlb_limits("pod").unwrap(),
        HugetlbLimits {
            hugepages_2mi: None,
            hugepages_1gi: Some(2 << 30)
        }
    );
    // no hugetlb controller at all
    let d0 = tempfile::tempdir().unwrap();
    assert_eq!(
        fake_v1(d0.path()).hugetlb_limits("pod").unwrap(),
        HugetlbLimits::default()
    );
}

/// `walk_roots` lists what is at or below the roots (a missing root has nothing) and nothing
/// of the rest of the hierarchy; a hierarchy that cannot be read is an error, not an empty
/// list.
#[test]
fn walk_roots_walks_only_the_roots_and_fails_when_the_hierarchy_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cg");
    let cg = fake_v2(&root);
    for d in [
        "kubepods.slice/kubepods-podx.slice/a",
        "user.slice/user-1000.slice/u1/u2",
        "batch/job",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let roots = [
        "kubepods".to_string(),
        "kubepods.slice".into(),
        "/batch".into(),
    ];
    let got = cg.walk_roots(Controller::Cpuset, &roots).unwrap();
    assert_eq!(
        got,
        [
            "/batch",
            "/batch/job",
            "/kubepods.slice",
            "/kubepods.slice/kubepods-podx.slice",
            "/kubepods.slice/kubepods-podx.slice/a",
        ]
    );
    std::fs::rename(&root, dir.path().join("unmounted")).unwrap();
    assert!(cg.walk_roots(Controller::Cpuset, &roots).is_err());
}

/// A tenant nesting its delegated cgroups past PATH_MAX made `walk` fail with
/// ENAMETOOLONG at every round (and the health check restart the daemon in a loop). The rest
/// is walked; what cannot be named is left out.
#[test]
fn a_tree_nested_past_path_max_does_not_fail_the_walk() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cg");
    let cg = fake_v2(&root);
    std::fs::create_dir_all(root.join("kubepods/pod1/c1")).unwrap();
    std::fs::create_dir_all(root.join("tenant")).unwrap();
    // 30 levels of 200-byte names (6,000 bytes) by mkdirat/openat, each relative to the last.
    let name = std::ffi::CString::new("d".repeat(200)).unwrap();
    let mut fd = std::fs::File::open(root.join("tenant"))
        .map(OwnedFd::from)
        .unwrap();
    for _ in 0..30 {
        // SAFETY: a valid directory fd and a NUL-terminated name.
        let next = unsafe {
            assert_eq!(libc::mkdirat(fd.as_raw_fd(), name.as_ptr(), 0o755), 0);
            libc::openat(
                fd.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(next >= 0);
        // SAFETY: a new fd this function owns.
        fd = unsafe { OwnedFd::from_raw_fd(next) };
    }
    let all = cg
        .walk(Controller::Cpuset, "")
        .expect("the walk does not fail");
    assert!(all.contains(&"/kubepods/pod1/c1".to_string()));
    assert!(all.contains(&"/tenant".to_string()));
    assert!(all
        .iter()
        .all(|p| root.join(p.trim_start_matches('/')).as_os_str().len() < 4096));
    assert!(
        all.len() > 20,
        "what can be named below the tenant is listed"
    );
    let roots = cg
        .walk_roots(Controller::Cpuset, &["tenant".to_string()])
        .expect("walk_roots does not fail either");
    assert!(roots.iter().all(|p| p.starts_with("/tenant")));
}

#[test]
fn populated_counts_processes_in_nested_cgroups() {
    let d = tempfile::tempdir().unwrap();
    let cg = fake_v2(d.path());
    put(d.path(), "k.slice/cgroup.events", "populated 1\nfrozen 1\n");
    // its own procs are empty: the processes are below it
    assert!(cg.procs(Controller::Cpuset, "k.slice").unwrap().is_empty());
    assert!(cg.populated(Controller::Cpuset, "k.slice").unwrap());
    put(d.path(), "k.slice/cgroup.events", "populated 0\nfrozen 0\n");
    assert!(!cg.populated(Controller::Cpuset, "k.slice").unwrap());

    let d = tempfile::tempdir().unwrap();
    let cg = fake_v1(d.path());
    put(d.path(), "cpuset/pod/cgroup.procs", "");
    assert!(cg.procs(Controller::Cpuset, "/pod").unwrap().is_empty());
    assert!(
        cg.populated(Controller::Cpuset, "/pod").unwrap(),
        "c1 below it has 17 and 4242"
    );
    put(d.path(), "cpuset/pod/c1/cgroup.procs", "");
    assert!(!cg.populated(Controller::Cpuset, "/pod").unwrap());
}

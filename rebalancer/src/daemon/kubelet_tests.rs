//! kubelet state files in kubelet's exact format, with the checksums kubelet's own tests use
//! (pkg/kubelet/cm/cpumanager/state/state_checkpoint_test.go, memorymanager/state/…).

use super::*;
use crate::config::Config;
use crate::daemon::Io;
use crate::daemon::Shared;
use crate::kubelet_files::*;
use crate::serve::Metrics;
use crate::topology::TopologyBuilder;
use std::collections::BTreeMap;

/// kubelet's "Restore valid checkpoint" (policy none, so nothing to adopt).
const CPU_NONE: &str = r#"{
    "policyName": "none",
    "defaultCPUSet": "1-3",
    "entries": {
        "pod": {
            "container1": "4-6",
            "container2": "1-3"
        }
    },
    "checksum": 3610638499
}"#;

/// kubelet's memory manager "Restore checkpoint from v1 (migration)" checkpoint (the
/// four-field MemoryManagerCheckpoint that kubelet 1.22-1.3x writes).
const MEM_STATIC: &str = r#"{
    "policyName":"static",
    "machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},
    "entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},
    "checksum": 4215593881
}"#;

#[test]
fn checksums_are_kubelets() {
    let cases = [
        (
            r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 354655845}"#,
            true,
        ),
        (
            r#"{"policyName": "other", "defaultCPUSet": "1-3", "entries": {}, "checksum": 1394507217}"#,
            true,
        ),
        (CPU_NONE, true),
        (
            r#"{"policyName": "none", "defaultCPUSet": "4-6", "entries": {}, "checksum": 1337}"#,
            false,
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(CPU_FILE);
    for (text, ok) in cases {
        std::fs::write(&p, text).unwrap();
        let r = read_cpu(&p);
        assert_eq!(r.is_ok(), ok, "{text}: {r:?}");
        if !ok {
            assert!(matches!(
                r,
                Err(KubeletStateError::Checksum { stored: 1337, .. })
            ));
        }
    }
    let m = dir.path().join(MEMORY_FILE);
    std::fs::write(&m, MEM_STATIC).unwrap();
    let mem = read_memory(&m).unwrap().unwrap();
    assert_eq!(mem.checksum, 4215593881);
    // one byte changed: the checksum no longer matches
    std::fs::write(&m, MEM_STATIC.replace("\"size\":512", "\"size\":513")).unwrap();
    assert!(matches!(
        read_memory(&m),
        Err(KubeletStateError::Checksum { .. })
    ));
    // a file that is not a checkpoint, and none at all
    std::fs::write(&m, "{").unwrap();
    assert!(matches!(
        read_memory(&m),
        Err(KubeletStateError::Json { .. })
    ));
    assert!(read_cpu(&dir.path().join("absent")).unwrap().is_none());
    assert_eq!(fnv1a32(""), 0x811c_9dc5);
}

/// A static CPU Manager checkpoint for `entries` (pod → container → cpus), checksummed as
/// kubelet does (the renderer is checked against kubelet's vectors above).
fn cpu_static(default: &str, entries: &[(&str, &str, &str)]) -> String {
    let mut c = CpuCheckpoint {
        policy_name: "static".into(),
        default_cpu_set: default.into(),
        entries: Some(BTreeMap::new()),
        checksum: 0,
    };
    for (pod, name, cpus) in entries {
        c.entries
            .as_mut()
            .unwrap()
            .entry(pod.to_string())
            .or_default()
            .insert(name.to_string(), cpus.to_string());
    }
    let sum = fnv1a32(&spew_cpu(&c));
    let entries = serde_json::to_string(c.entries.as_ref().unwrap()).unwrap();
    format!(
        r#"{{"policyName":"static","defaultCpuSet":"{default}","entries":{entries},"checksum":{sum}}}"#
    )
}

/// A daemon on 2 nodes x 4 CPUs reading kubelet's files from `dir`.
fn shared(dir: &Path) -> Shared {
    let topo = TopologyBuilder {
        cores_per_node: 4,
        threads_per_core: 1,
        ..Default::default()
    }
    .build();
    let mut cfg = Config::default();
    cfg.daemon.state_dir = dir.join("state");
    cfg.kubernetes.kubelet_state_dir = dir.to_path_buf();
    Shared::fresh(topo, cfg).unwrap()
}

const POD: &str = "235148fe-393f-47a8-a17d-bd55bc1a836b";

#[test]
fn static_assignments_are_adopted_exclusive_with_their_memory_and_pinned() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(CPU_FILE),
        cpu_static("0,3-7", &[(POD, "cgroup1-0", "1-2")]),
    )
    .unwrap();
    // the memory manager's file names pod "pod" (kubelet's test vector) and 512 bytes on node 0
    std::fs::write(dir.path().join(MEMORY_FILE), MEM_STATIC).unwrap();
    let mut s = shared(dir.path());
    let m = Metrics::default();
    let free0 = s.state.allocator.memory.node(0).unwrap().clone();
    adopt(&mut s, &m);
    assert!(s.kubelet.errors.is_empty(), "{:?}", s.kubelet.errors);
    assert_eq!(s.kubelet.cpu_policy, "static");
    assert_eq!(s.kubelet.adopted.len(), 2, "{:?}", s.kubelet.adopted);
    let a = &s.state.allocator;
    assert_eq!(a.exclusive_cpus(), CpuSet::parse("1-2").unwrap());
    let pool = a.shared_pool(&crate::placement::cpu::CpuView::new(&s.topo));
    assert!(pool.is_disjoint(&CpuSet::parse("1-2").unwrap()), "{pool}");
    assert_ne!(
        a.memory.node(0).unwrap(),
        &free0,
        "512 bytes booked on node 0"
    );
    let cg = format!("kubepods/pod{POD}/{}", "a".repeat(64));
    assert!(pinned(&s, &cg));
    assert!(s.bound_constraints(&cg).unwrap().pinned);
    assert!(!pinned(
        &s,
        &format!("kubepods/podother/{}", "a".repeat(64))
    ));
    // under kubelet's --cgroup-root as configured, as the engine classifies it
    let rooted = format!("custom/kubepods/pod{POD}/{}", "a".repeat(64));
    assert!(!pinned(&s, &rooted), "not under the default roots");
    s.cfg.cgroups.kubernetes_root = Some("custom/kubepods".into());
    assert!(pinned(&s, &rooted));
    s.cfg.cgroups.kubernetes_root = None;
    assert!(m
        .render()
        .contains("rebalancer_kubelet_adopted_containers 2"));
    // a reload with the file gone: released exactly (memory back as it was)
    std::fs::remove_file(dir.path().join(CPU_FILE)).unwrap();
    std::fs::remove_file(dir.path().join(MEMORY_FILE)).unwrap();
    adopt(&mut s, &m);
    assert!(s.state.allocator.pods.is_empty());
    assert_eq!(s.state.allocator.memory.node(0).unwrap(), &free0);
    assert!(s.kubelet.errors.is_empty());
}

/// Which of a kubelet pod's containers kubelet gave CPUs. A container with a
/// CPU entry is kubelet's; another container of that pod, and every container of a pod with
/// only Memory Manager entries, is not (its cpus are fenced off the exclusive CPUs).
#[test]
fn a_kubelet_pods_containers_without_kubelet_cpus_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(CPU_FILE),
        cpu_static("0,3-7", &[(POD, "cgroup1-0", "1-2")]),
    )
    .unwrap();
    std::fs::write(dir.path().join(MEMORY_FILE), MEM_STATIC).unwrap();
    let mut s = shared(dir.path());
    adopt(&mut s, &Metrics::default());
    assert!(s.kubelet.errors.is_empty(), "{:?}", s.kubelet.errors);
    assert_eq!(cpu_assigned(&s, POD, Some("cgroup1-0")), Some(true));
    assert_eq!(cpu_assigned(&s, POD, Some("sidecar")), Some(false));
    assert_eq!(
        cpu_assigned(&s, POD, None),
        Some(true),
        "some container has CPUs"
    );
    // Memory Manager only: kubelet's pod, no kubelet CPUs for any container
    assert_eq!(cpu_assigned(&s, "pod", Some("container1")), Some(false));
    assert_eq!(cpu_assigned(&s, "pod", None), Some(false));
    assert_eq!(cpu_assigned(&s, "not-kubelets", None), None);
    assert_eq!(cpu_assigned(&s, "not-kubelets", Some("x")), None);
}

#[test]
fn a_bad_file_adopts_nothing_of_its_own_and_loses_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(CPU_FILE),
        cpu_static("0,3-7", &[(POD, "c", "1-2")]),
    )
    .unwrap();
    let mut s = shared(dir.path());
    let m = Metrics::default();
    adopt(&mut s, &m);
    assert_eq!(s.state.allocator.exclusive_cpus().len(), 2);
    // the memory file is corrupt: its error is reported, the CPU file still adopted
    std::fs::write(
        dir.path().join(MEMORY_FILE),
        MEM_STATIC.replace("4215593881", "4215593882"),
    )
    .unwrap();
    adopt(&mut s, &m);
    assert_eq!(s.state.allocator.exclusive_cpus().len(), 2);
    assert_eq!(s.kubelet.errors.len(), 1, "{:?}", s.kubelet.errors);
    assert!(
        s.kubelet.errors[0].contains("checksum"),
        "{:?}",
        s.kubelet.errors
    );
    assert!(m
        .render()
        .contains("rebalancer_kubelet_state_errors_total{reason=\"checksum\"} 1"));
    // a corrupt CPU file: its previous adoption is kept (kubelet's containers still run on
    // those CPUs, whatever the file now says), the error reported
    std::fs::write(dir.path().join(CPU_FILE), "{\"policyName\":").unwrap();
    adopt(&mut s, &m);
    assert_eq!(
        s.state.allocator.exclusive_cpus(),
        CpuSet::parse("1-2").unwrap()
    );
    assert_eq!(s.kubelet.adopted, vec![format!("{POD}/c")]);
    assert_eq!(s.kubelet.errors.len(), 2, "{:?}", s.kubelet.errors);
    assert_eq!(s.kubelet.cpu_policy, "static", "the previous file's policy");
    // an unreadable one (a directory in its place) keeps it too
    std::fs::remove_file(dir.path().join(CPU_FILE)).unwrap();
    std::fs::create_dir(dir.path().join(CPU_FILE)).unwrap();
    adopt(&mut s, &m);
    assert_eq!(s.state.allocator.exclusive_cpus().len(), 2);
    std::fs::remove_dir(dir.path().join(CPU_FILE)).unwrap();
    // policy none: nothing to adopt, no error
    std::fs::write(dir.path().join(CPU_FILE), CPU_NONE).unwrap();
    std::fs::remove_file(dir.path().join(MEMORY_FILE)).unwrap();
    adopt(&mut s, &m);
    assert!(s.state.allocator.pods.is_empty());
    assert!(s.kubelet.errors.is_empty(), "{:?}", s.kubelet.errors);
    assert_eq!(s.kubelet.cpu_policy, "none");
}

#[test]
fn an_entry_on_cpus_already_exclusive_is_refused_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = shared(dir.path());
    let topo = s.topo.clone();
    let cfg = s.cfg.placement.clone();
    let pod = crate::placement::admission::Pod {
        uid: "ours".into(),
        containers: vec![crate::placement::admission::Container {
            name: "a".into(),
            cpu_request_millis: 1000,
            cpu_limit_millis: 1000,
            memory_bytes: 1 << 20,
            memory_limit_bytes: 1 << 20,
            ..Default::default()
        }],
        init_containers: vec![],
    };
    let ours = s.state.allocator.admit(&topo, &cfg, &pod).unwrap()[0]
        .cpus
        .clone();
    std::fs::write(
        dir.path().join(CPU_FILE),
        cpu_static(
            "",
            &[
                (POD, "clash", &ours.to_string()),
                ("other-pod", "fine", "6"),
            ],
        ),
    )
    .unwrap();
    let m = Metrics::default();
    adopt(&mut s, &m);
    assert_eq!(s.kubelet.adopted, vec!["other-pod/fine".to_string()]);
    assert_eq!(s.kubelet.errors.len(), 1, "{:?}", s.kubelet.errors);
    // the refusal is counted for alerting, not only in `status`
    assert!(
        m.render()
            .contains(r#"rebalancer_kubelet_state_errors_total{reason="refused"} 1"#),
        "{}",
        m.render()
    );
    assert_eq!(
        s.state.allocator.exclusive_cpus(),
        ours.union(&CpuSet::parse("6").unwrap())
    );
}

/// A newer kubelet's checkpoint (pod-level resource managers: `podEntries`; CPU V4's `data` /
/// `dataChecksum` with the legacy checksum 0) is refused as a format not supported: at start
/// nothing of it is adopted but the error says why; later, the previous adoption is kept.
#[test]
fn a_newer_kubelet_format_is_refused_and_keeps_the_previous_adoption() {
    let dir = tempfile::tempdir().unwrap();
    let v4 = r#"{"policyName":"static","defaultCpuSet":"0","entries":{},"podEntries":{"P":{"cpuset":"1-2"}},"data":"x","dataChecksum":123,"checksum":0}"#;
    std::fs::write(dir.path().join(CPU_FILE), v4).unwrap();
    let mut s = shared(dir.path());
    let m = Metrics::default();
    adopt(&mut s, &m);
    assert_eq!(s.kubelet.errors.len(), 1, "{:?}", s.kubelet.errors);
    assert!(
        s.kubelet.errors[0].contains("kubelet checkpoint format not supported")
            && s.kubelet.errors[0].contains("podEntries")
            && s.kubelet.errors[0].contains("dataChecksum"),
        "{:?}",
        s.kubelet.errors
    );
    assert!(m
        .render()
        .contains("rebalancer_kubelet_state_errors_total{reason=\"unsupported\"} 1"));
    // a valid file, then kubelet upgraded to the newer format: the adoption stays
    std::fs::write(
        dir.path().join(CPU_FILE),
        cpu_static("0,3-7", &[(POD, "c", "1-2")]),
    )
    .unwrap();
    adopt(&mut s, &m);
    assert!(s.kubelet.errors.is_empty(), "{:?}", s.kubelet.errors);
    std::fs::write(dir.path().join(CPU_FILE), v4).unwrap();
    adopt(&mut s, &m);
    assert_eq!(
        s.state.allocator.exclusive_cpus(),
        CpuSet::parse("1-2").unwrap()
    );
    // the memory checkpoint with podEntries likewise
    let mem = MEM_STATIC.replace("\"checksum\"", "\"podEntries\":{},\"checksum\"");
    std::fs::write(dir.path().join(MEMORY_FILE), mem).unwrap();
    assert!(matches!(
        read_memory(&dir.path().join(MEMORY_FILE)),
        Err(KubeletStateError::Unsupported { .. })
    ));
}

/// Checksum 0 (kubelet accepts it, from its old file backend) is unverified: such a file adds
/// its containers but drops none of the previous adoption, even when it says policy none.
#[test]
fn an_unverified_file_adds_to_the_adoption_and_drops_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(CPU_FILE),
        cpu_static("0,3-7", &[(POD, "c", "1-2")]),
    )
    .unwrap();
    let mut s = shared(dir.path());
    let m = Metrics::default();
    adopt(&mut s, &m);
    assert_eq!(s.state.allocator.exclusive_cpus().len(), 2);
    std::fs::write(
        dir.path().join(CPU_FILE),
        r#"{"policyName":"static","defaultCpuSet":"0","entries":{"other":{"d":"5"}},"checksum":0}"#,
    )
    .unwrap();
    adopt(&mut s, &m);
    assert_eq!(
        s.state.allocator.exclusive_cpus(),
        CpuSet::parse("1-2,5").unwrap()
    );
    assert_eq!(s.kubelet.errors.len(), 1, "{:?}", s.kubelet.errors);
    assert!(s.kubelet.errors[0].contains("unverified"));
    assert!(m
        .render()
        .contains("rebalancer_kubelet_state_errors_total{reason=\"unverified\"} 1"));
    std::fs::write(
        dir.path().join(CPU_FILE),
        r#"{"policyName":"none","defaultCpuSet":"0-7","entries":{},"checksum":0}"#,
    )
    .unwrap();
    adopt(&mut s, &m);
    assert_eq!(
        s.state.allocator.exclusive_cpus(),
        CpuSet::parse("1-2,5").unwrap()
    );
    // a verified policy none drops it
    std::fs::write(dir.path().join(CPU_FILE), CPU_NONE).unwrap();
    adopt(&mut s, &m);
    assert!(s.state.allocator.pods.is_empty());
}

/// Only a regular file is read, and at most MAX_FILE_BYTES: a FIFO does not block the reader,
/// a symlink (to /dev/zero, say) and a huge file are refused with a clear error.
#[test]
fn only_a_regular_file_of_bounded_size_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(CPU_FILE);
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let t = std::time::Instant::now();
    let r = read_cpu(&p);
    assert!(
        matches!(&r, Err(KubeletStateError::NotRegular { kind, .. }) if kind == "a FIFO"),
        "{r:?}"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
    let r = read_cpu(&p);
    assert!(
        matches!(&r, Err(KubeletStateError::NotRegular { kind, .. }) if kind == "a symlink"),
        "{r:?}"
    );
    std::fs::remove_file(&p).unwrap();
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(MAX_FILE_BYTES + 1).unwrap();
    let r = read_cpu(&p);
    assert!(
        matches!(&r, Err(KubeletStateError::TooLarge { .. })),
        "{r:?}"
    );
    assert!(r.unwrap_err().to_string().contains("larger than"));
    // and through the daemon's path: reported, nothing adopted, nothing hangs
    let mut s = shared(dir.path());
    adopt(&mut s, &Metrics::default());
    assert_eq!(s.kubelet.errors.len(), 1, "{:?}", s.kubelet.errors);
}

/// A cpuset writer over the fake kernel (as `books_tests`).
struct FakeCpuset(std::sync::Arc<std::sync::Mutex<crate::controller::FakeCgroups>>);

impl crate::daemon::writer::CpusetWriter for FakeCpuset {
    fn write(
        &self,
        io: &Io,
        c: &crate::daemon::writer::CpusetChange,
    ) -> Result<(), crate::daemon::writer::WriteError> {
        use crate::controller::CgroupWriter as _;
        self.0
            .lock()
            .unwrap()
            .write_cpus(io, &c.cgroup, &c.cpus)
            .map_err(|e| crate::daemon::writer::WriteError::Failed {
                cgroup: c.cgroup.clone(),
                message: e.to_string(),
            })
    }
    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        use crate::controller::CgroupWriter as _;
        self.0.lock().unwrap().read_cpus(cgroup).ok()
    }
}

/// Kubelet's files are read again when they change (a `stat` at each
/// CreateContainer hook and control round, `Admission::refresh_kubelet`), not only at start
/// and SIGHUP; a newly adopted kubelet CPU leaves our shared containers at once, and a pod
/// gone from the file gives its CPUs back.
#[test]
fn a_changed_state_file_is_read_again_and_shrinks_the_shared_containers() {
    let io = &mut crate::daemon::Io::new();
    use crate::daemon::admission::{Admission, AdmitRequest, Durability};
    let dir = tempfile::tempdir().unwrap();
    let d = crate::daemon::Daemon::new(shared(dir.path()), Metrics::default());
    let fake = std::sync::Arc::new(std::sync::Mutex::new(crate::controller::FakeCgroups::v2()));
    let cg = "kubepods/besteffort/pods/c";
    fake.lock().unwrap().insert(cg, "0-7", "0-1");
    let adm = Admission::new(d.clone(), std::sync::Arc::new(FakeCpuset(fake.clone())));
    let p = crate::daemon::admission::tests::pod("s", 0, 0, false);
    adm.admit(
        io,
        AdmitRequest {
            pod: &p,
            bind: Some(cg),
            durability: Durability::Deferred,
            since: std::time::Instant::now(),
        },
    )
    .unwrap();
    let cpus = |f: &std::sync::Arc<std::sync::Mutex<crate::controller::FakeCgroups>>| {
        f.lock().unwrap().cpus(cg).cloned().unwrap()
    };
    assert_eq!(cpus(&fake), CpuSet::parse("0-7").unwrap());
    // no file yet: nothing changes
    assert!(!adm.refresh_kubelet(io));
    // kubelet admits a static pod: CPU 3 is its
    std::fs::write(
        dir.path().join(CPU_FILE),
        cpu_static("0-2,4-7", &[(POD, "app", "3")]),
    )
    .unwrap();
    assert!(adm.refresh_kubelet(io));
    assert!(owns_pod(&d.lock(io), POD));
    assert_eq!(cpus(&fake), CpuSet::parse("0-2,4-7").unwrap());
    // unchanged: not read again
    assert!(!adm.refresh_kubelet(io));
    // the pod gone from the file: its CPU back to the pool
    std::fs::write(dir.path().join(CPU_FILE), cpu_static("0-7", &[])).unwrap();
    assert!(adm.refresh_kubelet(io));
    assert!(!owns_pod(&d.lock(io), POD));
    assert_eq!(cpus(&fake), CpuSet::parse("0-7").unwrap());
    // an install elsewhere (start, SIGHUP: files read and installed there) leaves the shrink
    // pending for the next refresh, though the files are unchanged by then
    std::fs::write(
        dir.path().join(CPU_FILE),
        cpu_static("0-4,6-7", &[(POD, "app", "5")]),
    )
    .unwrap();
    adopt(&mut d.lock(io), &Metrics::default());
    assert_eq!(cpus(&fake), CpuSet::parse("0-7").unwrap());
    assert!(adm.refresh_kubelet(io));
    assert_eq!(cpus(&fake), CpuSet::parse("0-4,6-7").unwrap());
    assert!(!adm.refresh_kubelet(io));
}

#[test]
fn a_missing_state_dir_is_a_warning_in_status_an_existing_empty_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = shared(dir.path());
    let m = Metrics::default();
    adopt(&mut s, &m);
    assert!(s.kubelet.warnings.is_empty(), "{:?}", s.kubelet.warnings);
    let gone = dir.path().join("not-mounted");
    s.cfg.kubernetes.kubelet_state_dir = gone.clone();
    adopt(&mut s, &m);
    assert_eq!(s.kubelet.warnings.len(), 1);
    assert!(
        s.kubelet.warnings[0].contains(&gone.display().to_string()),
        "{:?}",
        s.kubelet.warnings
    );
    assert!(s.kubelet.errors.is_empty());
    // off: no warning
    s.cfg.kubernetes.kubelet_state_dir = Default::default();
    adopt(&mut s, &m);
    assert!(s.kubelet.warnings.is_empty());
}

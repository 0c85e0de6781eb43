use super::*;
use crate::daemon::Io;
use crate::{
    cgroup::Mounts,
    config::{Config, TopologyScope},
    serve::Metrics,
    topology::TopologyBuilder,
};
use crate::{
    cpuset::CpuSet,
    daemon::{writer::CgroupCpusetWriter, Daemon, Shared},
    placement::pod::Qos,
};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

const UID: &str = "8d5c3f2e-1b4a-4c6d-9e8f-7a6b5c4d3e2f";

fn put(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A fake v2 hierarchy (2 nodes x 2 CPUs) and a daemon over it.
fn fake(root: &Path) -> (Admission, Cgroups) {
    fake_with(root, |_| {})
}

/// [`fake`] with `f` applied to the config.
fn fake_with(root: &Path, f: impl FnOnce(&mut Config)) -> (Admission, Cgroups) {
    put(root, "cgroup.controllers", "cpuset cpu memory\n");
    for dir in [
        "",
        "kubepods.slice",
        "kubepods.slice/kubepods-besteffort.slice",
    ] {
        put(root, &format!("{dir}/cpuset.cpus.effective"), "0-3\n");
        put(root, &format!("{dir}/cpuset.mems.effective"), "0-1\n");
    }
    let topo = TopologyBuilder {
        cores_per_node: 2,
        threads_per_core: 1,
        ..Default::default()
    }
    .build();
    let mut cfg = Config::default();
    cfg.daemon.state_dir = root.join("state");
    f(&mut cfg);
    let shared = Shared::fresh(topo, cfg).unwrap();
    let cgroups = Cgroups::new(Mounts::scan_root(root).unwrap());
    let d = Daemon::new(shared, Metrics::default());
    let adm = Admission::new(d, Arc::new(CgroupCpusetWriter::new(cgroups.clone())));
    (adm, cgroups)
}

/// A container cgroup as a runtime makes it: the directory, limits still unset.
fn container(root: &Path, pod: &str, id: &str) -> String {
    let rel = format!("{pod}/cri-containerd-{}.scope", id.repeat(64));
    put(root, &format!("{pod}/cpuset.cpus.effective"), "0-3\n");
    put(root, &format!("{pod}/cpuset.mems.effective"), "0-1\n");
    for (f, v) in [
        ("cpuset.cpus", ""),
        ("cpuset.mems", ""),
        ("cpu.max", "max 100000\n"),
        ("cpu.weight", "100\n"),
        ("memory.max", "max\n"),
    ] {
        put(root, &format!("{rel}/{f}"), v);
    }
    rel
}

/// A BestEffort container of pod UID.
fn besteffort_container(root: &Path) -> String {
    let us = UID.replace('-', "_");
    container(
        root,
        &format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{us}.slice"),
        "b",
    )
}

/// What a runtime writes for a Guaranteed 1-CPU, 64 MiB container.
fn guaranteed_limits(dir: &Path) {
    std::fs::write(dir.join("memory.max"), "67108864\n").unwrap();
    std::fs::write(dir.join("cpu.max"), "100000 100000\n").unwrap();
}

#[test]
fn guaranteed_limits_written_after_mkdir_still_get_exclusive_cpus_and_shared_ones_move_off() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    let us = UID.replace('-', "_");
    // A BestEffort container first: the whole shared pool.
    let be = besteffort_container(root);
    let o = on_created(io, &d, &cg, &be, Instant::now());
    assert!(
        matches!(&o, WatchOutcome::Admitted { cpus, .. } if cpus == "0-3"),
        "{o:?}"
    );
    // A Guaranteed 1-CPU container whose runtime writes its limits after mkdir: queued, not
    // waited for, then admitted when seen again.
    let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    let mut retry = Retry::default();
    let o = retry.created(io, &d, &cg, &g, Instant::now());
    assert_eq!(o, WatchOutcome::NotReady { cgroup: g.clone() });
    assert!(!retry.is_empty());
    assert!(retry.revisit(io, &d, &cg).is_empty(), "still not ready");
    guaranteed_limits(&root.join(&g));
    let mut done = retry.revisit(io, &d, &cg);
    assert!(retry.is_empty());
    assert_eq!(done.len(), 1, "{done:?}");
    let o = done.remove(0);
    let WatchOutcome::Admitted { cpus, mems, .. } = &o else {
        panic!("{o:?}")
    };
    let gcpus = CpuSet::parse(cpus).unwrap();
    assert_eq!(
        gcpus.len(),
        1,
        "one exclusive CPU, not the shared pool: {o:?}"
    );
    assert_eq!(d.daemon.lock(io).state.allocator.exclusive_cpus(), gcpus);
    assert_eq!(
        mems,
        &d.daemon
            .lock(io)
            .topo
            .node_of_cpu(gcpus.iter().next().unwrap())
            .unwrap()
            .to_string()
    );
    // The BestEffort container no longer runs on the exclusive CPU, and still has CPUs.
    let be_now = cg.cpus(&be).unwrap();
    assert_eq!(be_now, CpuSet::parse("0-3").unwrap().difference(&gcpus));
    // Limits that never come: admitted as shown after the grace time, not blocked forever.
    let never = container(
        root,
        &format!("kubepods.slice/kubepods-pod{}.slice", us.replace('8', "9")),
        "c",
    );
    assert!(!limits_ready(&cg, &never, Qos::Guaranteed));
    let seen = Instant::now() - LIMITS_GRACE;
    let o = retry.created(io, &d, &cg, &never, seen);
    assert!(!matches!(o, WatchOutcome::NotReady { .. }), "{o:?}");
    assert!(retry.is_empty());
    // A queued cgroup removed before its limits came is dropped.
    let gone = container(
        root,
        &format!("kubepods.slice/kubepods-pod{}.slice", us.replace('8', "7")),
        "d",
    );
    assert!(matches!(
        retry.created(io, &d, &cg, &gone, Instant::now()),
        WatchOutcome::NotReady { .. }
    ));
    std::fs::remove_dir_all(root.join(&gone)).unwrap();
    assert!(retry.revisit(io, &d, &cg).is_empty());
    assert!(retry.is_empty());
}

/// A writer that fails every write to one cgroup while told to (a v1 cpuset whose child
/// holds CPUs the parent would drop: EBUSY).
struct FailFor {
    inner: CgroupCpusetWriter,
    fail: Arc<std::sync::Mutex<Option<String>>>,
}

impl crate::daemon::writer::CpusetWriter for FailFor {
    fn write(
        &self,
        io: &Io,
        c: &crate::daemon::writer::CpusetChange,
    ) -> Result<(), crate::daemon::writer::WriteError> {
        if self.fail.lock().unwrap().as_deref() == Some(c.cgroup.as_str()) {
            return Err(crate::daemon::writer::WriteError::Failed {
                cgroup: c.cgroup.clone(),
                message: "EBUSY (test)".into(),
            });
        }
        self.inner.write(io, c)
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        self.inner.cpus(cgroup)
    }
}

/// A shared container whose move off newly exclusive CPUs failed is moved off them at the
/// next round (`refence`), and counted until then: it never stays on another container's
/// exclusive CPUs.
#[test]
fn a_failed_move_off_exclusive_cpus_is_retried_each_round() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d0, cg) = fake(root);
    let fail = Arc::new(std::sync::Mutex::new(None));
    let d = Admission::new(
        d0.daemon.clone(),
        Arc::new(FailFor {
            inner: CgroupCpusetWriter::new(cg.clone()),
            fail: fail.clone(),
        }),
    );
    let be = besteffort_container(root);
    assert!(matches!(
        on_created(io, &d, &cg, &be, Instant::now()),
        WatchOutcome::Admitted { .. }
    ));
    *fail.lock().unwrap() = Some(be.clone());
    let us = UID.replace('-', "_");
    let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    guaranteed_limits(&root.join(&g));
    let o = on_created(io, &d, &cg, &g, Instant::now());
    let WatchOutcome::Admitted { cpus, .. } = &o else {
        panic!("{o:?}")
    };
    let gcpus = CpuSet::parse(cpus).unwrap();
    // the write failed: still on the exclusive CPU, and counted
    assert!(!cg.cpus(&be).unwrap().is_disjoint(&gcpus));
    assert_eq!(d.daemon.lock(io).shrink_failures, 1);
    assert_eq!(d.daemon.metrics.shared_pool_pending.get(), 1);
    // a round while it still fails: counted again, nothing else changes
    assert!(d.refence(io).is_empty());
    assert_eq!(d.daemon.lock(io).shrink_failures, 2);
    // the next round after the cause went: moved off
    *fail.lock().unwrap() = None;
    let changed = d.refence(io);
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(
        cg.cpus(&be).unwrap(),
        CpuSet::parse("0-3").unwrap().difference(&gcpus)
    );
    assert_eq!(d.daemon.lock(io).shrink_failures, 0);
    assert_eq!(d.daemon.metrics.shared_pool_pending.get(), 0);
    // and no more retries
    assert!(d.refence(io).is_empty());
}

/// CPU hotplug: a Guaranteed container's exclusive CPU goes offline; it gets another one
/// written to its cgroup, the BestEffort container moves off that one, and nothing is
/// empty.
#[test]
fn an_exclusive_cpu_going_offline_is_replaced_in_the_cgroup() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    let us = UID.replace('-', "_");
    let be = besteffort_container(root);
    on_created(io, &d, &cg, &be, Instant::now());
    let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    guaranteed_limits(&root.join(&g));
    let o = on_created(io, &d, &cg, &g, Instant::now());
    assert!(matches!(o, WatchOutcome::Admitted { .. }), "{o:?}");
    let old = cg.cpus(&g).unwrap();
    assert_eq!(old.len(), 1);
    let gone = old.first().unwrap();

    for c in d.daemon.lock(io).topo.cpus.iter_mut() {
        if c.id == gone {
            c.online = false;
        }
    }
    d.replace_offline(io);
    let s = d.daemon.lock(io);
    let new = cg.cpus(&g).unwrap();
    assert_eq!(new.len(), 1, "CPU count kept: {new}");
    assert!(!new.contains(gone));
    assert_eq!(s.state.allocator.exclusive_cpus(), new);
    let be_now = cg.cpus(&be).unwrap();
    assert!(
        !be_now.is_empty() && be_now.is_disjoint(&new),
        "{be_now} vs {new}"
    );
    // Nothing more to do at the next check.
    drop(s);
    assert_eq!(d.replace_offline(io), 0);
    assert_eq!(cg.cpus(&g).unwrap(), new);
}

#[test]
fn a_container_made_before_its_pod_cgroup_is_watched_is_still_admitted() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    spawn(io, d.clone(), cg.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let pod = format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        UID.replace('-', "_")
    );
    let be = {
        // Hold the lock: the watcher takes the pod cgroup's event and then waits in
        // on_created, before it can watch the pod cgroup; the container appears meanwhile.
        let _held = d.daemon.lock(io);
        std::fs::create_dir_all(root.join(&pod)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        container(root, &pod, "e")
    };
    let t0 = Instant::now();
    while cg.cpus(&be).unwrap().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the container made before its pod cgroup was watched never got a cpuset"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(cg.cpus(&be).unwrap(), CpuSet::parse("0-3").unwrap());
}

#[test]
fn a_burstable_weight_written_after_mkdir_is_the_request_admitted() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    let us = UID.replace('-', "_");
    let b = container(
        root,
        &format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{us}.slice"),
        "b",
    );
    // The runtime writes the 500m request's weight after the directory appears; until then
    // the kernel default (100, i.e. ~2.6 CPUs) shows, and the cgroup waits in the queue.
    let mut retry = Retry::default();
    let o = retry.created(io, &d, &cg, &b, Instant::now());
    assert!(matches!(o, WatchOutcome::NotReady { .. }), "{o:?}");
    std::fs::write(root.join(&b).join("cpu.weight"), "20\n").unwrap();
    let o = retry.revisit(io, &d, &cg);
    assert!(matches!(o[..], [WatchOutcome::Admitted { .. }]), "{o:?}");
    let s = d.daemon.lock(io);
    let pod = s.state.allocator.pods.values().next().unwrap();
    assert!(
        (450..=550).contains(&pod.cpu_request_millis),
        "admitted with {}m, not the 500m written after mkdir",
        pod.cpu_request_millis
    );
}

#[test]
fn a_rejected_container_is_fenced_off_exclusive_cpus() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    let us = UID.replace('-', "_");
    // A Guaranteed container takes 3 of the 4 CPUs.
    let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    put(root, &format!("{g}/cpu.max"), "300000 100000\n");
    put(root, &format!("{g}/memory.max"), "67108864\n");
    let o = on_created(io, &d, &cg, &g, Instant::now());
    let WatchOutcome::Admitted { cpus, .. } = &o else {
        panic!("{o:?}")
    };
    let excl = CpuSet::parse(cpus).unwrap();
    assert_eq!(excl.len(), 3);
    // A Burstable container asking for 8 CPUs cannot be admitted; the runtime gave it the
    // whole machine, exclusive CPUs included.
    let other = UID.replace('8', "9").replace('-', "_");
    let b = container(
        root,
        &format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{other}.slice"),
        "b",
    );
    put(root, &format!("{b}/cpu.weight"), "313\n");
    put(root, &format!("{b}/cpuset.cpus.effective"), "0-3\n");
    let o = on_created(io, &d, &cg, &b, Instant::now());
    assert!(matches!(o, WatchOutcome::Rejected { .. }), "{o:?}");
    let now = cg.cpus(&b).unwrap();
    assert!(!now.is_empty() && now.is_disjoint(&excl), "{now} vs {excl}");
    assert_eq!(now, CpuSet::parse("0-3").unwrap().difference(&excl));
    // Kept in the books as fenced: the runtime writing it back onto the exclusive CPUs is
    // undone at the next round.
    assert!(d.daemon.lock(io).refused.contains(&b));
    put(
        root,
        &format!("{b}/cpuset.cpus"),
        "0-3
",
    );
    let changed = d.refence(io);
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(cg.cpus(&b).unwrap().is_disjoint(&excl));
    // The exclusive set changing (the Guaranteed container gone, the refused one on every
    // CPU again, a 2-CPU container admitted): fenced off the new exclusive CPUs at that
    // admission, never an empty cpuset.
    assert!(matches!(
        on_removed(io, &d, &g),
        WatchOutcome::Released { .. }
    ));
    put(root, &format!("{b}/cpuset.cpus"), "0-3\n");
    let third = UID.replace('8', "7").replace('-', "_");
    let g2 = container(
        root,
        &format!("kubepods.slice/kubepods-pod{third}.slice"),
        "c",
    );
    put(root, &format!("{g2}/cpu.max"), "200000 100000\n");
    put(root, &format!("{g2}/memory.max"), "67108864\n");
    let excl2 = admitted_cpus(&on_created(io, &d, &cg, &g2, Instant::now()));
    let now = cg.cpus(&b).unwrap();
    assert!(
        !now.is_empty() && now.is_disjoint(&excl2),
        "refused container on {now}, {excl2} exclusive now"
    );
    // Its cgroup gone: released from the books.
    std::fs::remove_dir_all(root.join(&b)).unwrap();
    on_removed(io, &d, &b);
    assert!(d.daemon.lock(io).refused.is_empty());
}

/// A refused container runs on the shared pool: an exclusive admission that would take the
/// last shared CPU is refused while it lives (it would have nowhere to be fenced to), and
/// admitted once it is gone.
#[test]
fn the_last_shared_cpu_is_not_made_exclusive_under_a_refused_container() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    let us = UID.replace('-', "_");
    let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    put(root, &format!("{g}/cpu.max"), "200000 100000\n");
    put(root, &format!("{g}/memory.max"), "67108864\n");
    let excl = admitted_cpus(&on_created(io, &d, &cg, &g, Instant::now()));
    let other = UID.replace('8', "9").replace('-', "_");
    let b = container(
        root,
        &format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{other}.slice"),
        "b",
    );
    put(root, &format!("{b}/cpu.weight"), "313\n");
    put(root, &format!("{b}/cpuset.cpus.effective"), "0-3\n");
    assert!(matches!(
        on_created(io, &d, &cg, &b, Instant::now()),
        WatchOutcome::Rejected { .. }
    ));
    let fenced = cg.cpus(&b).unwrap();
    assert_eq!(fenced, CpuSet::parse("0-3").unwrap().difference(&excl));
    let third = UID.replace('8', "7").replace('-', "_");
    let g2 = container(
        root,
        &format!("kubepods.slice/kubepods-pod{third}.slice"),
        "c",
    );
    put(root, &format!("{g2}/cpu.max"), "200000 100000\n");
    put(root, &format!("{g2}/memory.max"), "67108864\n");
    let o = on_created(io, &d, &cg, &g2, Instant::now());
    let WatchOutcome::Rejected { reason, .. } = &o else {
        panic!("the last shared CPU was made exclusive under a refused container: {o:?}")
    };
    assert_eq!(reason, "InsufficientCPU");
    assert_eq!(
        cg.cpus(&b).unwrap(),
        fenced,
        "the refused container keeps its CPU"
    );
    assert_eq!(d.daemon.lock(io).state.allocator.exclusive_cpus(), excl);
    // the refused container gone, the same request fits
    std::fs::remove_dir_all(root.join(&b)).unwrap();
    on_removed(io, &d, &b);
    on_removed(io, &d, &g2);
    let excl2 = admitted_cpus(&on_created(io, &d, &cg, &g2, Instant::now()));
    assert_eq!(excl2, fenced);
}

/// A start without usable books: a running container whose memory is on node 1 is adopted on
/// node 0's CPU with its mems widened by node 1 — written so (the kernel migrates nothing when
/// mems grow) and booked so, so the reconcile finds nothing to repair — and the narrowing is
/// left to the control rounds' budgeted moves. A new container the watcher sees gets its
/// placement's mems as they are, even with memory off them already.
#[test]
fn a_running_container_is_adopted_with_its_memory_where_it_is() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    let us = UID.replace('-', "_");
    let a = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    guaranteed_limits(&root.join(&a));
    put(
        root,
        &format!("{a}/memory.numa_stat"),
        "anon N0=0 N1=1073741824\nfile N0=0 N1=0\n",
    );
    // the start-up reconcile (`run`) adopts what runs
    let o = super::reconcile(io, &d.adopting(), &cg).remove(0);
    let cpus = admitted_cpus(&o);
    let WatchOutcome::Admitted { mems, .. } = &o else {
        unreachable!()
    };
    let (mems, written) = (CpuSet::parse(mems).unwrap(), cg.mems(&a).unwrap());
    assert_eq!(written, mems);
    assert!(written.contains(1), "its memory's node kept: {written}");
    let s = d.daemon.lock(io);
    let booked = s
        .state
        .allocator
        .placements()
        .find(|p| p.cpus == cpus)
        .unwrap();
    assert_eq!(booked.mems, written, "the books agree");
    drop(s);
    assert!(d.repair(io, |_| None).is_empty());
    // a new container: nothing to keep
    let other = UID.replace('8', "9").replace('-', "_");
    let b = container(
        root,
        &format!("kubepods.slice/kubepods-pod{other}.slice"),
        "b",
    );
    guaranteed_limits(&root.join(&b));
    put(
        root,
        &format!("{b}/memory.numa_stat"),
        "anon N0=0 N1=1048576\nfile N0=0 N1=0\n",
    );
    let o = on_created(io, &d, &cg, &b, Instant::now());
    let WatchOutcome::Admitted { mems, .. } = &o else {
        panic!("{o:?}")
    };
    assert_eq!(CpuSet::parse(mems).unwrap().len(), 1, "{o:?}");
    assert_eq!(cg.mems(&b).unwrap().len(), 1, "written as placed");
}

/// A running container whose charged memory is all on one node may still map pages elsewhere
/// (a shared binary's, charged to another cgroup): adopted, its mems stay as wide as its
/// effective mems, so the write narrows nothing and the kernel migrates nothing in it.
#[test]
fn an_adopted_container_keeps_its_effective_mems_whatever_numa_stat_shows() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // single-numa-node: placed on node 0, mems 0 — and its charged memory is there too
    let (d, cg) = fake_with(root, |c| {
        c.placement.policy = crate::config::TopologyPolicy::SingleNumaNode
    });
    let us = UID.replace('-', "_");
    let a = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    guaranteed_limits(&root.join(&a));
    put(root, &format!("{a}/cpuset.mems.effective"), "0-1\n");
    put(
        root,
        &format!("{a}/memory.numa_stat"),
        "anon N0=1073741824 N1=0\nfile N0=0 N1=0\n",
    );
    let o = super::reconcile(io, &d.adopting(), &cg).remove(0);
    let WatchOutcome::Admitted { mems, .. } = &o else {
        panic!("{o:?}")
    };
    assert_eq!(mems, "0-1", "{o:?}");
    assert_eq!(cg.mems(&a).unwrap().to_string(), "0-1", "written as wide");
    assert!(d.repair(io, |_| None).is_empty(), "the books agree");
}

#[test]
fn a_failed_cpuset_write_leaves_no_admission_and_no_binding() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (adm, cg) = fake(root);
    let us = UID.replace('-', "_");
    let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    guaranteed_limits(&root.join(&g));
    // cpuset.mems cannot be written (a directory in its place), the cgroup still exists.
    std::fs::remove_file(root.join(&g).join("cpuset.mems")).unwrap();
    std::fs::create_dir(root.join(&g).join("cpuset.mems")).unwrap();
    let o = on_created(io, &adm, &cg, &g, Instant::now());
    assert_eq!(o, WatchOutcome::WriteFailed { cgroup: g.clone() });
    let s = adm.daemon.lock(io);
    assert!(
        s.state.allocator.pods.is_empty(),
        "admission kept after a failed write"
    );
    assert!(s.state.bindings.is_empty());
    assert!(s.state.allocator.exclusive_cpus().is_empty());
}

#[test]
fn a_kubepods_decoy_outside_kubelets_root_is_never_admitted() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (adm, cg) = fake(root);
    let us = UID.replace('-', "_");
    for dir in ["user.slice", "user.slice/user-1000.slice"] {
        put(root, &format!("{dir}/cpuset.cpus.effective"), "0-3\n");
        put(root, &format!("{dir}/cpuset.mems.effective"), "0-1\n");
    }
    let decoy = container(
        root,
        &format!("user.slice/user-1000.slice/kubepods.slice/kubepods-pod{us}.slice"),
        "a",
    );
    guaranteed_limits(&root.join(&decoy));
    assert_eq!(
        on_created(io, &adm, &cg, &decoy, Instant::now()),
        WatchOutcome::Ignored
    );
    assert!(reconcile(io, &adm, &cg).is_empty());
    let s = adm.daemon.lock(io);
    assert!(s.state.allocator.pods.is_empty() && s.state.bindings.is_empty());
    assert_eq!(
        std::fs::read_to_string(root.join(&decoy).join("cpuset.cpus")).unwrap(),
        ""
    );
}

#[test]
fn weight_inverts_kubelet_shares() {
    // kubelet: 500m → 512 shares → weight 1 + 510*9999/262142 = 20; the weight scale is
    // coarser than millicores, so the inverse is exact to within one weight step (~2.5%).
    let back = request_millis_from_weight(20);
    assert!((485..=515).contains(&back), "{back}");
    assert_eq!(request_millis_from_weight(1), 0);
    // 2 CPUs → 2048 shares → weight 79
    let w = 1 + (2048 - 2) * 9999 / 262_142;
    let back = request_millis_from_weight(w);
    assert!((1990..=2010).contains(&back), "{back}");
}

#[test]
fn a_directory_that_cannot_be_watched_is_counted_by_errno() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("ok")).unwrap();
    // ONLYDIR on a regular file: inotify_add_watch fails (ENOTDIR), as it would with ENOSPC.
    std::fs::write(root.join("file"), "").unwrap();
    let m = Metrics::default();
    let mut ino = Inotify::init().unwrap();
    let mut watches = BTreeMap::new();
    let mut found = Vec::new();
    let mask = WatchMask::CREATE | WatchMask::ONLYDIR;
    let mut failed = None;
    add_tree(
        &mut ino,
        &mut watches,
        &Scope::everything(root),
        Path::new("file"),
        mask,
        &mut found,
        &m,
        &mut failed,
    );
    let why = failed
        .take()
        .expect("a watch that could not be added is reported");
    assert!(why.contains("cannot watch"), "{why}");
    add_tree(
        &mut ino,
        &mut watches,
        &Scope::everything(root),
        Path::new("gone"),
        mask,
        &mut found,
        &m,
        &mut failed,
    );
    assert_eq!(failed, None, "a directory removed meanwhile is no failure");
    add_tree(
        &mut ino,
        &mut watches,
        &Scope::everything(root),
        Path::new("ok"),
        mask,
        &mut found,
        &m,
        &mut None,
    );
    assert_eq!(watches.len(), 1, "only the directory is watched");
    let text = m.render();
    assert!(
        text.contains(&format!(
            "rebalancer_inotify_watch_failures_total{{reason=\"errno {}\"}} 1",
            libc::ENOTDIR
        )),
        "{text}"
    );
    // A directory removed meanwhile is not a failure (the known reasons' series are at 0).
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("rebalancer_inotify_watch_failures_total{"))
            .filter(|l| !l.ends_with(" 0"))
            .count(),
        1,
        "{text}"
    );
}

#[test]
fn pod_for_reads_a_guaranteed_containers_hugetlb_limits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    put(root, "cgroup.controllers", "cpuset cpu memory hugetlb\n");
    let rel = container(root, "kubepods.slice/kubepods-pod1.slice", "g");
    guaranteed_limits(&root.join(&rel));
    put(root, &format!("{rel}/hugetlb.2MB.max"), "8388608\n");
    put(root, &format!("{rel}/hugetlb.1GB.max"), "1073741824\n");
    let cgroups = Cgroups::new(Mounts::scan_root(root).unwrap());
    let p = pod_for(&cgroups, &rel, "pod1", "g", Qos::Guaranteed);
    let c = &p.containers[0];
    assert_eq!(
        (c.hugepages_2mi_bytes, c.hugepages_1gi_bytes),
        (8 << 20, 1 << 30)
    );
    assert_eq!(c.memory_limit_bytes, 64 << 20);
    // a Burstable container's hugetlb limits ask the Memory Manager for nothing
    let b = pod_for(&cgroups, &rel, "pod1", "g", Qos::Burstable);
    assert_eq!(b.containers[0].hugepages_1gi_bytes, 0);
}

/// The watcher watched the whole cpuset hierarchy, users' delegated subtrees
/// included (inotify watch exhaustion for the kubepods tree). Only the path to kubelet's root
/// and the configured roots, and what is below them, are watched.
#[test]
fn the_watcher_watches_only_the_paths_to_kubelets_root_its_tiers_and_pods() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let kube = "kubelet.slice/kubelet-kubepods.slice";
    let pod = format!(
        "{kube}/kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{}.slice",
        UID.replace('-', "_")
    );
    let ctr = format!("{pod}/cri-containerd-{}.scope", "c".repeat(64));
    for d in [
        format!("{kube}/kubepods-besteffort.slice"),
        "kubelet.slice/other.slice".into(),
        "user.slice/user-1000.slice/user@1000.service/a/b/c".into(),
        "kubepods/burstable".into(),
        "batch/job1".into(),
        // a container's own sub-cgroups, as many as it likes: never watched
        format!("{ctr}/a/b"),
        format!("{ctr}/x"),
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let cfg = crate::config::CgroupConfig {
        kubernetes_root: Some(format!("/{kube}")),
        roots: vec!["/batch".into()],
        ..Default::default()
    };
    let scope = Scope::new(root.to_path_buf(), &cfg);
    let m = Metrics::default();
    let mut ino = Inotify::init().unwrap();
    let mut watches = BTreeMap::new();
    let mut found = Vec::new();
    add_tree(
        &mut ino,
        &mut watches,
        &scope,
        Path::new(""),
        WatchMask::CREATE | WatchMask::ONLYDIR,
        &mut found,
        &m,
        &mut None,
    );
    let mut watched: Vec<String> = watches
        .values()
        .map(|p| p.to_string_lossy().to_string())
        .collect();
    watched.sort();
    assert_eq!(
        watched,
        [
            "".to_string(),
            "kubelet.slice".into(),
            kube.into(),
            format!("{kube}/kubepods-besteffort.slice"),
            pod.clone(),
        ]
    );
    // The container that was already there is reported (to be admitted), nothing below it.
    let found: Vec<String> = found
        .iter()
        .map(|p| p.to_string_lossy().to_string())
        .collect();
    assert!(found.contains(&ctr), "{found:?}");
    assert!(
        !found.iter().any(|f| f.starts_with(&format!("{ctr}/"))),
        "{found:?}"
    );
}

/// A hierarchy that cannot be walked (here: gone, as when unmounted) releases nothing: the
/// admitted container keeps its binding and its CPUs stay allocated.
#[test]
fn a_hierarchy_that_cannot_be_walked_releases_nothing() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cg");
    std::fs::create_dir(&root).unwrap();
    let (adm, cg) = fake(&root);
    let be = besteffort_container(&root);
    assert!(matches!(
        on_created(io, &adm, &cg, &be, Instant::now()),
        WatchOutcome::Admitted { .. }
    ));
    assert!(adm.daemon.lock(io).state.bindings.contains_key(&be));
    std::fs::rename(&root, dir.path().join("elsewhere")).unwrap();
    assert!(reconcile(io, &adm, &cg).is_empty());
    let s = adm.daemon.lock(io);
    assert!(
        s.state.bindings.contains_key(&be),
        "released on a failed walk"
    );
    assert_eq!(s.state.allocator.pods.len(), 1);
}

/// A directory that cannot be watched (ENOSPC: out of watches) is counted by errno and
/// named, with the sysctl to raise, in the reason the watcher hands its supervisor.
#[test]
fn an_enospc_watch_failure_names_the_sysctl() {
    let m = Metrics::default();
    let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
    let why = watch_failed(&m, Path::new("/sys/fs/cgroup/kubepods/x"), &e);
    watch_failed(&m, Path::new("/sys/fs/cgroup/kubepods/y"), &e);
    assert!(
        why.contains("kubepods/x") && why.contains("max_user_watches"),
        "{why}"
    );
    let n = m
        .inotify_watch_failures
        .get_or_create(&crate::serve::metrics::ReasonLabel {
            reason: "ENOSPC".into(),
        })
        .get();
    assert_eq!(n, 2);
}

/// A watcher that cannot start (no inotify instance left): the `inotify` component fails with
/// the reason — never one a restart is asked to cure — and the supervisor reconciles every
/// period instead, so a container made meanwhile is still admitted; once a watcher starts
/// the component is healthy again and the reconciling stops. A watcher that later loses a
/// watch hands back to reconciling the same way.
#[test]
fn a_watcher_that_cannot_start_fails_health_and_containers_are_reconciled_each_period() {
    let io = &mut crate::daemon::Io::new();
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake_with(root, |c| c.controller.period_ms = 10);
    let works = Arc::new(AtomicBool::new(false));
    let lose = Arc::new(AtomicBool::new(false));
    let starts = Arc::new(AtomicUsize::new(0));
    let why = Arc::new(std::sync::Mutex::new(
        "no inotify instance (Too many open files); raise fs.inotify.max_user_instances"
            .to_string(),
    ));
    let (w, l, n, y) = (works.clone(), lose.clone(), starts.clone(), why.clone());
    let sup = supervise_with(d.clone(), cg.clone(), move |_io, adm, _, lost| {
        n.fetch_add(1, Ordering::SeqCst);
        if !w.load(Ordering::SeqCst) {
            return Err(std::io::Error::other(y.lock().unwrap().clone()));
        }
        let l = l.clone();
        Ok(std::thread::spawn(move || {
            while !adm.daemon.stopping() {
                if l.swap(false, Ordering::SeqCst) {
                    *lost.lock().unwrap() = Some("cannot watch x (ENOSPC)".into());
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }))
    })
    .unwrap();
    let health = d.daemon.metrics.health.clone();
    let wait = |what: &str, f: &mut dyn FnMut() -> bool| {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait("the inotify component to fail", &mut || {
        !health.dead().is_empty()
    });
    let dead = health.dead();
    assert_eq!(dead[0].component, "inotify");
    assert!(!dead[0].restart, "{dead:?}");
    assert!(dead[0].reason.contains("max_user_instances"), "{dead:?}");
    // without inotify, a new container is admitted by a round's reconcile
    let be = besteffort_container(root);
    wait("the reconcile to admit the container", &mut || {
        d.daemon.lock(io).state.bindings.contains_key(&be)
    });
    assert!(
        starts.load(Ordering::SeqCst) >= 2,
        "inotify tried again each period"
    );
    works.store(true, Ordering::SeqCst);
    wait("the watcher to start", &mut || health.dead().is_empty());
    // a watch lost (and inotify short again): failing again, reconciling again
    *why.lock().unwrap() = "cannot watch x (ENOSPC); raise fs.inotify.max_user_watches".into();
    works.store(false, Ordering::SeqCst);
    lose.store(true, Ordering::SeqCst);
    wait("the lost watch to show", &mut || {
        health.dead().iter().any(|x| x.reason.contains("ENOSPC"))
    });
    std::fs::remove_dir_all(root.join(&be)).unwrap();
    wait("the reconcile to release the container", &mut || {
        !d.daemon.lock(io).state.bindings.contains_key(&be)
    });
    works.store(true, Ordering::SeqCst);
    wait("a whole watcher again", &mut || health.dead().is_empty());
    d.daemon.request_stop();
    sup.join().unwrap();
}

/// A Guaranteed pod cgroup as kubelet makes it: the pod's summed CPU quota and memory limit.
fn guaranteed_pod(root: &Path, uid: &str, cpus: u64, mem: u64) -> String {
    let pod = format!("kubepods.slice/kubepods-pod{}.slice", uid.replace('-', "_"));
    put(
        root,
        &format!("{pod}/cpu.max"),
        &format!("{} 100000\n", cpus * 100_000),
    );
    put(root, &format!("{pod}/memory.max"), &format!("{mem}\n"));
    pod
}

fn admitted_cpus(o: &WatchOutcome) -> CpuSet {
    match o {
        WatchOutcome::Admitted { cpus, .. } => CpuSet::parse(cpus).unwrap(),
        o => panic!("{o:?}"),
    }
}

/// Pod scope in watcher mode: a pod of two Guaranteed 1-CPU containers (its pod cgroup says 2
/// CPUs, 128 MiB) whose containers appear one at a time, another 1-CPU pod between them: both
/// containers of the pod land on one node — on the CPU held for the second — where container
/// scope splits them. The containers' removal gives their CPUs back to the pod's hold, and
/// the pod cgroup's removal releases it.
#[test]
fn pod_scope_keeps_a_pods_containers_on_one_node_where_container_scope_splits_them() {
    let io = &mut crate::daemon::Io::new();
    let other = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9";
    for scope in [TopologyScope::Pod, TopologyScope::Container] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (d, cg) = fake_with(root, |c| c.placement.scope = scope);
        let p = guaranteed_pod(root, UID, 2, 128 << 20);
        let q = guaranteed_pod(root, other, 1, 64 << 20);
        let node =
            |io: &mut Io, cpus: &CpuSet| d.daemon.lock(io).topo.node_of_cpu(cpus.first().unwrap());
        let a = container(root, &p, "a");
        guaranteed_limits(&root.join(&a));
        let ca = admitted_cpus(&on_created(io, &d, &cg, &a, Instant::now()));
        // (container ids are hex, as the runtimes make them)
        let x = container(root, &q, "c");
        guaranteed_limits(&root.join(&x));
        let cx = admitted_cpus(&on_created(io, &d, &cg, &x, Instant::now()));
        let b = container(root, &p, "b");
        guaranteed_limits(&root.join(&b));
        let cb = admitted_cpus(&on_created(io, &d, &cg, &b, Instant::now()));
        assert_eq!(cg.cpus(&b).unwrap(), cb, "written");
        assert!(ca.is_disjoint(&cb) && ca.is_disjoint(&cx) && cb.is_disjoint(&cx));
        if scope == TopologyScope::Container {
            assert_ne!(
                node(io, &ca),
                node(io, &cb),
                "container scope splits the pod"
            );
            continue;
        }
        assert_eq!(node(io, &ca), node(io, &cb), "{scope:?}: {ca} and {cb}");
        assert_ne!(
            node(io, &cx),
            node(io, &ca),
            "the other pod went to the other node"
        );
        // b gone: its CPU is held for the pod again, not given to anyone
        std::fs::remove_dir_all(root.join(&b)).unwrap();
        assert!(matches!(
            on_removed(io, &d, &b),
            WatchOutcome::Released { .. }
        ));
        assert_eq!(
            d.daemon.lock(io).state.allocator.exclusive_cpus(),
            ca.union(&cb).union(&cx)
        );
        std::fs::remove_dir_all(root.join(&a)).unwrap();
        on_removed(io, &d, &a);
        assert!(d.daemon.lock(io).state.allocator.pods.contains_key(UID));
        // the pod cgroup gone: the pod is released
        std::fs::remove_dir_all(root.join(&p)).unwrap();
        let o = on_removed(io, &d, &p);
        assert!(matches!(o, WatchOutcome::Released { .. }), "{o:?}");
        let s = d.daemon.lock(io);
        assert!(!s.state.allocator.pods.contains_key(UID));
        assert_eq!(s.state.allocator.exclusive_cpus(), cx);
    }
}

/// Pod scope under single-numa-node: a pod whose cgroup says 3 CPUs (a node has 2) is refused
/// at its first container, as kubelet's TopologyAffinityError refuses it, though the 1-CPU
/// container alone would fit; nothing is held, and container scope admits the container.
#[test]
fn pod_scope_refuses_a_pod_that_fits_no_single_node() {
    let io = &mut crate::daemon::Io::new();
    for (scope, refused) in [
        (TopologyScope::Pod, true),
        (TopologyScope::Container, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (d, cg) = fake_with(root, |c| {
            c.placement.scope = scope;
            c.placement.policy = crate::config::TopologyPolicy::SingleNumaNode;
        });
        let p = guaranteed_pod(root, UID, 3, 192 << 20);
        let a = container(root, &p, "a");
        guaranteed_limits(&root.join(&a));
        let o = on_created(io, &d, &cg, &a, Instant::now());
        if refused {
            assert!(
                matches!(&o, WatchOutcome::Rejected { reason, .. } if reason == "TopologyAffinityError"),
                "{o:?}"
            );
            let s = d.daemon.lock(io);
            assert!(s.state.allocator.pods.is_empty() && s.state.bindings.is_empty());
        } else {
            assert_eq!(admitted_cpus(&o).len(), 1, "{o:?}");
        }
    }
}

/// The watcher's side of fencing: a pod with only kubelet Memory Manager entries (CPU Manager
/// `none`, or a non-integer Guaranteed pod) is kubelet's, but kubelet gave none of its
/// containers CPUs: each is fenced off the exclusive CPUs (its mems left to kubelet), not
/// admitted (a pod with kubelet CPUs: see the sidecar test below).
/// A fake hierarchy with kubelet's memory_manager_state holding one pod (`KUBE_UID`, a 512 MiB
/// Memory Manager entry for its container "app", no CPUs), adopted.
const KUBE_UID: &str = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9";

fn kubelet_memory_pod(io: &mut Io, dir: &Path) -> (Admission, Cgroups, PathBuf) {
    use crate::kubelet_files::{fnv1a32, spew_memory, MemoryCheckpoint};
    let root = dir.join("cg");
    let kdir = dir.join("kubelet");
    std::fs::create_dir_all(&kdir).unwrap();
    let text = r#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"UID":{"app":[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":0}"#
        .replace("UID", KUBE_UID);
    let c: MemoryCheckpoint = serde_json::from_str(&text).unwrap();
    let sum = fnv1a32(&spew_memory(&c).unwrap());
    std::fs::write(
        kdir.join("memory_manager_state"),
        text.replace("\"checksum\":0", &format!("\"checksum\":{sum}")),
    )
    .unwrap();
    let (adm, cg) = fake_with(&root, |c| c.kubernetes.kubelet_state_dir = kdir.clone());
    {
        let mut s = adm.daemon.lock(io);
        let m = adm.daemon.metrics.clone();
        crate::daemon::kubelet::adopt(&mut s, &m);
        assert!(s.kubelet.errors.is_empty(), "{:?}", s.kubelet.errors);
        assert_eq!(s.kubelet.adopted.len(), 1, "{:?}", s.kubelet);
        assert!(s.state.allocator.exclusive_cpus().is_empty());
    }
    (adm, cg, root)
}

/// A Guaranteed container of our pod `pod_uid` admitted through the watcher: its exclusive CPU.
fn admit_exclusive(
    io: &mut Io,
    adm: &Admission,
    cg: &Cgroups,
    root: &Path,
    pod_uid: &str,
    id: &str,
) -> CpuSet {
    let u = pod_uid.replace('-', "_");
    let g = container(root, &format!("kubepods.slice/kubepods-pod{u}.slice"), id);
    guaranteed_limits(&root.join(&g));
    let o = on_created(io, adm, cg, &g, Instant::now());
    let WatchOutcome::Admitted { cpus, .. } = &o else {
        panic!("{o:?}")
    };
    let got = CpuSet::parse(cpus).unwrap();
    assert_eq!(got.len(), 1);
    got
}

#[test]
fn a_memory_managed_kubelet_pods_container_is_fenced_off_the_exclusive_cpus() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let (adm, cg, root) = kubelet_memory_pod(io, dir.path());
    let kube_uid = KUBE_UID;
    // one exclusive CPU of ours
    let ours = admit_exclusive(io, &adm, &cg, &root, UID, "a");
    // kubelet's memory-managed pod: its container keeps off our CPU, and is not admitted
    let ku = kube_uid.replace('-', "_");
    let k = container(
        &root,
        &format!("kubepods.slice/kubepods-pod{ku}.slice"),
        "c",
    );
    guaranteed_limits(&root.join(&k));
    // as the kernel shows a new cgroup: every CPU, the one exclusive to us included
    put(&root, &format!("{k}/cpuset.cpus.effective"), "0-3\n");
    assert_eq!(
        on_created(io, &adm, &cg, &k, Instant::now()),
        WatchOutcome::Ignored
    );
    assert_eq!(
        cg.cpus(&k).unwrap(),
        CpuSet::parse("0-3").unwrap().difference(&ours)
    );
    assert_eq!(
        std::fs::read_to_string(root.join(&k).join("cpuset.mems")).unwrap(),
        "",
        "mems left to kubelet"
    );
    {
        let s = adm.daemon.lock(io);
        assert!(!s.state.bindings.contains_key(&k));
        assert_eq!(s.state.allocator.exclusive_cpus(), ours);
    }
    // An exclusive CPU admitted after it is fenced off it too
    let later = admit_exclusive(io, &adm, &cg, &root, &UID.replace('8', "7"), "d");
    assert_eq!(
        cg.cpus(&k).unwrap(),
        CpuSet::parse("0-3")
            .unwrap()
            .difference(&ours)
            .difference(&later)
    );
    // The runtime writes the spec's cpuset after the fence at mkdir (kubelet's
    // default set: every CPU); the next round's `refence` fences it again.
    let fence = CpuSet::parse("0-3")
        .unwrap()
        .difference(&ours)
        .difference(&later);
    put(&root, &format!("{k}/cpuset.cpus"), "0-3\n");
    put(&root, &format!("{k}/cpuset.cpus.effective"), "0-3\n");
    let again = adm.refence(io);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(cg.cpus(&k).unwrap(), fence);
    assert!(adm.refence(io).is_empty(), "nothing to do once fenced");
    // and cgroup v1's shape: a fresh cpuset cgroup is empty (effective too) until the runtime
    // copies its parent's into it, so the fence at mkdir writes nothing; the next round does
    let k2 = container(
        &root,
        &format!("kubepods.slice/kubepods-pod{ku}.slice"),
        "e",
    );
    guaranteed_limits(&root.join(&k2));
    put(&root, &format!("{k2}/cpuset.cpus.effective"), "");
    assert_eq!(
        on_created(io, &adm, &cg, &k2, Instant::now()),
        WatchOutcome::Ignored
    );
    assert!(cg.cpus(&k2).unwrap().is_empty(), "nothing to fence yet");
    put(&root, &format!("{k2}/cpuset.cpus"), "0-3\n");
    put(&root, &format!("{k2}/cpuset.cpus.effective"), "0-3\n");
    assert_eq!(adm.refence(io).len(), 1);
    assert_eq!(cg.cpus(&k2).unwrap(), fence);
    std::fs::remove_dir_all(root.join(&k2)).unwrap();
    // its cgroup gone: forgotten at the next shrink
    std::fs::remove_dir_all(root.join(&k)).unwrap();
    let _ = crate::daemon::admission::shared_changes(io, &adm.daemon, |c| {
        crate::daemon::writer::CpusetWriter::cpus(&CgroupCpusetWriter::new(cg.clone()), c)
    });
    assert!(adm.daemon.lock(io).fenced.is_empty());
}

/// A pod kubelet's CPU Manager gave CPUs to one container: every container of it
/// is fenced off the exclusive CPUs but the pod's own (a cgroup does not say which container
/// it is). The container kubelet gave CPUs is within the pod's own and is not written; a
/// sidecar on every CPU keeps off ours.
#[test]
fn a_kubelet_pods_sidecar_is_fenced_off_the_exclusive_cpus_but_its_pods_own() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let (adm, cg, root) = kubelet_memory_pod(io, dir.path());
    {
        // as an adopted cpu_manager_state entry gives it: CPU 3 exclusive to "app"
        let mut s = adm.daemon.lock(io);
        let p = (s.state.allocator.pods)
            .get_mut(&format!("kubelet:{KUBE_UID}"))
            .unwrap();
        p.containers[0].placement.exclusive = true;
        p.containers[0].placement.cpus = CpuSet::parse("3").unwrap();
    }
    let ours = admit_exclusive(io, &adm, &cg, &root, UID, "a");
    assert!(!ours.contains(3), "{ours}");
    let ku = KUBE_UID.replace('-', "_");
    let pod = format!("kubepods.slice/kubepods-pod{ku}.slice");
    // kubelet's app container, as the runtime made it: on the pod's own CPU
    let app = container(&root, &pod, "c");
    guaranteed_limits(&root.join(&app));
    put(&root, &format!("{app}/cpuset.cpus"), "3\n");
    put(&root, &format!("{app}/cpuset.cpus.effective"), "3\n");
    assert_eq!(
        on_created(io, &adm, &cg, &app, Instant::now()),
        WatchOutcome::Ignored
    );
    assert_eq!(cg.cpus(&app).unwrap(), CpuSet::parse("3").unwrap());
    // its sidecar on every CPU (ours included): fenced off ours
    let side = container(&root, &pod, "d");
    guaranteed_limits(&root.join(&side));
    put(&root, &format!("{side}/cpuset.cpus.effective"), "0-3\n");
    assert_eq!(
        on_created(io, &adm, &cg, &side, Instant::now()),
        WatchOutcome::Ignored
    );
    assert_eq!(
        cg.cpus(&side).unwrap(),
        CpuSet::parse("0-3").unwrap().difference(&ours)
    );
    assert!(adm.refence(io).is_empty(), "both as they should be");
    assert_eq!(cg.cpus(&app).unwrap(), CpuSet::parse("3").unwrap());
}

/// kubelet with `cpuCFSQuota: false`: a Guaranteed container's cgroup has no quota (cpu.max
/// "max"), its request only in its weight (2 CPUs: shares 2048, weight 79 on v2). It is ready
/// as it is, asks for exactly 2 CPUs and gets 2 exclusive ones.
#[test]
fn a_guaranteed_container_without_a_quota_gets_its_weight_as_exclusive_cpus() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    let us = UID.replace('-', "_");
    let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    put(root, &format!("{g}/memory.max"), "67108864\n");
    assert!(!limits_ready(&cg, &g, Qos::Guaranteed), "default weight");
    let weight = crate::cgroup::files::shares_to_weight(2048);
    put(root, &format!("{g}/cpu.weight"), &format!("{weight}\n"));
    assert!(limits_ready(&cg, &g, Qos::Guaranteed));
    let c = container_for(&cg, &g, "a", Qos::Guaranteed);
    assert_eq!((c.cpu_request_millis, c.cpu_limit_millis), (2000, 2000));
    let cpus = admitted_cpus(&on_created(io, &d, &cg, &g, Instant::now()));
    assert_eq!(cpus.len(), 2, "{cpus}");
    assert_eq!(d.daemon.lock(io).state.allocator.exclusive_cpus(), cpus);
}

/// The weight inverse lands on whole CPUs wherever kubelet's whole-CPU shares map (every
/// count a node here could give), and stays the plain inverse between them.
#[test]
fn whole_cpu_weights_invert_exactly() {
    for n in 1..=256u64 {
        let w = crate::cgroup::files::shares_to_weight(n * 1024);
        assert_eq!(
            guaranteed_millis_from_weight(w),
            n * 1000,
            "{n} CPUs, weight {w}"
        );
    }
    // 1500m: shares 1536, no whole CPU maps to its weight
    let w = crate::cgroup::files::shares_to_weight(1536);
    let m = guaranteed_millis_from_weight(w);
    assert!((1450..=1550).contains(&m), "{m}");
}

/// kubelet's in-place resize as the watcher sees it: the container's cpu.max written anew
/// after its admission. The next round's look (`resized`) grows it to 2 exclusive CPUs — its
/// own kept, the books and its cpuset agree, the shared container moved off — refuses a grow
/// past the machine with the books unchanged (and does not ask again until the limits change),
/// and shrinks it back to 1 CPU, the other going back to the shared pool.
#[test]
fn a_resize_written_to_the_limits_follows_like_nris() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (d, cg) = fake(root);
    d.daemon.lock(io).admission = crate::config::AdmissionMode::Watcher;
    let us = UID.replace('-', "_");
    let g = container(root, &format!("kubepods.slice/kubepods-pod{us}.slice"), "a");
    guaranteed_limits(&root.join(&g));
    let one = admitted_cpus(&on_created(io, &d, &cg, &g, Instant::now()));
    assert_eq!(one.len(), 1);
    let b = besteffort_container(root);
    on_created(io, &d, &cg, &b, Instant::now());
    let mut refused = BTreeMap::new();
    assert_eq!(
        policy::resized(io, &d, &cg, &mut refused),
        0,
        "nothing changed"
    );
    let booked = |io: &mut Io, d: &Admission| {
        let s = d.daemon.lock(io);
        let b = &s.state.bindings[&g];
        let p = &s.state.allocator.pods[&b.pod_uid];
        (p.cpu_request_millis, p.containers[0].placement.clone())
    };
    let rejected = |d: &Admission| -> f64 {
        let text = d.daemon.metrics.render();
        (text.lines())
            .find(|l| {
                l.starts_with("rebalancer_admission_rejections_total")
                    && l.contains("InsufficientCPU")
            })
            .map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
    };
    // grow to 2 CPUs
    put(root, &format!("{g}/cpu.max"), "200000 100000\n");
    assert_eq!(policy::resized(io, &d, &cg, &mut refused), 1);
    let (millis, p) = booked(io, &d);
    assert_eq!((millis, p.exclusive, p.cpus.len()), (2000, true, 2));
    assert!(
        one.is_subset(&p.cpus),
        "its own CPU kept: {} of {}",
        one,
        p.cpus
    );
    assert_eq!(cg.cpus(&g).unwrap(), p.cpus, "written as booked");
    assert!(
        cg.cpus(&b).unwrap().is_disjoint(&p.cpus),
        "the shared one moved off"
    );
    // past the machine: refused, nothing changes, not asked again while the limits stay
    put(root, &format!("{g}/cpu.max"), "900000 100000\n");
    let before = d.daemon.lock(io).state.allocator.clone();
    let n0 = rejected(&d);
    assert_eq!(policy::resized(io, &d, &cg, &mut refused), 0);
    assert_eq!(d.daemon.lock(io).state.allocator, before);
    assert!(refused.contains_key(&g));
    let n1 = rejected(&d);
    assert!(n1 > n0, "counted with its reason");
    assert_eq!(policy::resized(io, &d, &cg, &mut refused), 0);
    assert_eq!(rejected(&d), n1, "not asked again");
    // shrink back to 1 CPU: the other goes back to the shared pool
    put(root, &format!("{g}/cpu.max"), "100000 100000\n");
    assert_eq!(policy::resized(io, &d, &cg, &mut refused), 1);
    assert!(refused.is_empty());
    let (millis, p) = booked(io, &d);
    assert_eq!((millis, p.cpus.len()), (1000, 1));
    assert_eq!(cg.cpus(&g).unwrap(), p.cpus);
    let excl = d.daemon.lock(io).state.allocator.exclusive_cpus();
    assert_eq!(excl, p.cpus);
}

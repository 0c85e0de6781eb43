//! Fault injection through the daemon's seams, on `FakeCgroups` and sysfs
//! fixtures; the faults that need the real kernel are in `tests/faults_root.rs`. Each test
//! ends with [`assert_invariants`]: no empty cpuset, every cpuset within its parent, exclusive
//! CPUs disjoint and never reserved, the round's migration budget kept, and the checkpoint on
//! disk equal to the daemon's state.

use crate::daemon::Io;
use std::path::Path;

use super::{apply::apply_moves, Daemon, Persisted, Shared};
use crate::rounds::Engine;
use crate::{
    cgroup::{Cgroups, Mounts},
    config::Config,
    controller::{
        self, CgroupFile, CgroupObs, ControllerState, FakeCgroups, FakeFailure, Move, NodeObs,
        Observations, Trigger,
    },
    cpuset::CpuSet,
    serve::Metrics,
    topology::{sysfs, Topology, TopologyBuilder},
};

const MIB: u64 = 1 << 20;

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

pub(crate) fn daemon(topo: Topology, state_dir: &Path, sysfs_root: Option<&Path>) -> Daemon {
    let mut cfg = Config::load(None).unwrap();
    cfg.daemon.state_dir = state_dir.to_path_buf();
    if let Some(r) = sysfs_root {
        cfg.daemon.sysfs_root = r.to_path_buf();
    }
    Daemon::new(Shared::fresh(topo, cfg).unwrap(), Metrics::default())
}

/// 2 nodes × 4 CPUs: node 0 = 0-3, node 1 = 4-7.
pub(crate) fn two_nodes() -> Topology {
    TopologyBuilder {
        sockets: 1,
        nodes_per_socket: 2,
        cores_per_node: 4,
        threads_per_core: 1,
        ..Default::default()
    }
    .build()
}

fn mv(cg: &str, from: &str, to: &str, from_mems: &str, to_mems: &str, mib: u64) -> Move {
    Move {
        cgroup: cg.into(),
        from_cpus: set(from),
        to_cpus: set(to),
        from_mems: set(from_mems),
        to_mems: set(to_mems),
        bytes_to_migrate: mib * MIB,
        reason: Trigger::PoorLocality,
        locality_before: 0.2,
        locality_after: 0.9,
        net: 1.0,
        stage: None,
    }
}

/// The invariants of PRODUCT.md on the daemon's state, the fake cgroups (`parent` is every
/// cgroup's parent effective set: (cpus, mems)) and the checkpoint on disk.
fn assert_invariants(
    io: &mut Io,
    d: &Daemon,
    fake: &FakeCgroups,
    cgroups: &[&str],
    parent: (&CpuSet, &CpuSet),
    applied_bytes: u64,
) {
    let s = d.lock(io);
    for cg in cgroups {
        let (Some(cpus), Some(mems)) = (fake.cpus(cg), fake.mems(cg)) else {
            continue; // vanished
        };
        assert!(!cpus.is_empty() && !mems.is_empty(), "{cg}: empty cpuset");
        assert!(
            cpus.is_subset(parent.0) && mems.is_subset(parent.1),
            "{cg}: {cpus}/{mems} outside the parent"
        );
    }
    for (c, cpus, mems) in fake.history() {
        assert!(
            !cpus.is_empty() && !mems.is_empty(),
            "{c} went through an empty cpuset"
        );
    }
    let mut seen = CpuSet::new();
    for pod in s.state.allocator.pods.values() {
        for c in pod.containers.iter().filter(|c| c.placement.exclusive) {
            assert!(
                c.placement.cpus.intersection(&seen).is_empty(),
                "exclusive CPUs overlap"
            );
            assert!(c
                .placement
                .cpus
                .intersection(&s.state.allocator.reserved_cpus)
                .is_empty());
            seen = seen.union(&c.placement.cpus);
        }
    }
    let budget = s.cfg.controller.migration_budget_mib * MIB;
    assert!(applied_bytes <= budget, "{applied_bytes} > budget {budget}");
    drop(s);
    d.checkpoint(io).unwrap();
    let on_disk: Persisted = crate::checkpoint::load(&d.lock(io).state_dir())
        .unwrap()
        .unwrap();
    assert_eq!(
        on_disk,
        d.lock(io).state,
        "checkpoint differs from the state"
    );
}

fn failed(d: &Daemon, reason: &str) -> u64 {
    d.metrics
        .moves_failed
        .get_or_create(&crate::serve::metrics::ReasonLabel {
            reason: reason.into(),
        })
        .get()
}

/// Fault (b): a write failing with EBUSY, EINVAL, ENOSPC or EACCES, at each write of a move
/// (v1 and v2): the cgroup is rolled back to its cpuset before the move, the failure is
/// counted under its reason, the controller records the failure (cooldown), and the round
/// goes on: the next cgroup's move is applied.
#[test]
fn each_write_errno_rolls_back_is_counted_by_reason_and_the_round_continues() {
    let io = &mut crate::daemon::Io::new();
    let table = [
        (FakeFailure::Busy, "busy"),
        (FakeFailure::Invalid, "invalid"),
        (FakeFailure::NoSpace, "no-space"),
        (FakeFailure::Permission, "permission"),
    ];
    let points = [
        (CgroupFile::MemoryMigrate, 1),
        (CgroupFile::Mems, 1),
        (CgroupFile::Cpus, 1),
        (CgroupFile::Mems, 2),
        (CgroupFile::MemoryMigrate, 2),
    ];
    let (all, mems) = (set("0-7"), set("0-1"));
    for v1 in [false, true] {
        for (failure, reason) in table {
            for (file, nth) in points {
                if !v1 && file == CgroupFile::MemoryMigrate {
                    continue;
                }
                let at = format!("v1={v1} {reason} at {file} #{nth}");
                let dir = tempfile::tempdir().unwrap();
                let d = daemon(two_nodes(), dir.path(), None);
                let mut f = FakeCgroups::version(v1);
                f.insert("pod/a", "0-3", "0");
                f.insert("pod/b", "0-3", "0");
                f.fail_write(file, nth, failure);
                let moves = [
                    mv("pod/a", "0-3", "4-7", "0", "1", 10),
                    mv("pod/b", "0-3", "4-7", "0", "1", 10),
                ];
                let done = apply_moves(io, &d, &mut f, &moves, 1000, false);
                assert_eq!(done.failed, [("pod/a".to_string(), reason)], "{at}");
                assert_eq!(done.applied, 1, "{at}: the round goes on");
                assert_eq!(f.cpus("pod/a"), Some(&set("0-3")), "{at}: rolled back");
                assert_eq!(f.mems("pod/a"), Some(&set("0")), "{at}: rolled back");
                assert_eq!(f.memory_migrate("pod/a"), Some(false), "{at}");
                assert_eq!(f.cpus("pod/b"), Some(&set("4-7")), "{at}");
                assert_eq!(failed(&d, reason), 1, "{at}: counted by reason");
                {
                    let s = d.lock(io);
                    let st = &s.state.controller;
                    assert_eq!(st.failed_moves_total, 1, "{at}");
                    assert!(
                        st.cooldown_remaining("pod/a", &set("0-3"), 1001, 60_000)
                            .is_some(),
                        "{at}"
                    );
                }
                assert_invariants(io, &d, &f, &["pod/a", "pod/b"], (&all, &mems), done.bytes);
            }
        }
    }
}

/// Fault (a) on the fake (the real rmdir is in faults_root): a cgroup removed between plan and
/// apply is a quiet "vanished" (no failure recorded, no cooldown for a cgroup that is gone),
/// and the other moves of the round are applied.
#[test]
fn cgroup_removed_between_plan_and_apply_is_skipped_and_the_round_continues() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(two_nodes(), dir.path(), None);
    let mut f = FakeCgroups::v2()
        .with("pod/a", "0-3", "0")
        .with("pod/b", "0-3", "0");
    let moves = [
        mv("pod/a", "0-3", "4-7", "0", "1", 10),
        mv("pod/b", "0-3", "4-7", "0", "1", 10),
    ];
    f.remove("pod/a"); // the container exited after the plan
    let done = apply_moves(io, &d, &mut f, &moves, 1000, false);
    assert_eq!(done.failed, [("pod/a".to_string(), "vanished")]);
    assert_eq!(done.applied, 1);
    assert_eq!(f.cpus("pod/b"), Some(&set("4-7")));
    assert_eq!(failed(&d, "vanished"), 1);
    assert_eq!(d.lock(io).state.controller.failed_moves_total, 0);
    assert_invariants(
        io,
        &d,
        &f,
        &["pod/a", "pod/b"],
        (&set("0-7"), &set("0-1")),
        done.bytes,
    );
}

/// The actuator side keeps the migration budget even if a plan exceeded it: moves past the
/// budget are not attempted (and counted as skipped for "budget").
#[test]
fn a_plan_past_the_migration_budget_is_cut_at_the_budget() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(two_nodes(), dir.path(), None);
    d.lock(io).cfg.controller.migration_budget_mib = 100;
    let mut f = FakeCgroups::v2();
    let names = ["pod/a", "pod/b", "pod/c"];
    for n in names {
        f.insert(n, "0-3", "0");
    }
    let moves: Vec<Move> = names
        .iter()
        .map(|n| mv(n, "0-3", "4-7", "0", "1", 60))
        .collect();
    let done = apply_moves(io, &d, &mut f, &moves, 1000, false);
    assert_eq!((done.applied, done.over_budget), (1, 2));
    assert_eq!(f.cpus("pod/b"), Some(&set("0-3")), "not attempted");
    assert_invariants(io, &d, &f, &names, (&set("0-7"), &set("0-1")), done.bytes);
}

fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&src, &dst);
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Takes node `n` (the highest) of a copied sysfs tree offline as the kernel shows it: its
/// CPUs leave `cpu/online`, it leaves `node/online`, its node directory goes, and the other
/// nodes' distance rows lose its column.
fn take_last_node_offline(root: &Path, topo: &Topology) -> (u32, CpuSet) {
    let last = topo.nodes.last().unwrap();
    let node_dir = root.join("devices/system/node");
    let online: CpuSet = topo.online_cpus().difference(&last.cpus);
    std::fs::write(root.join("devices/system/cpu/online"), online.to_string()).unwrap();
    let nodes: CpuSet = topo
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|&n| n != last.id)
        .collect();
    std::fs::write(node_dir.join("online"), nodes.to_string()).unwrap();
    std::fs::remove_dir_all(node_dir.join(format!("node{}", last.id))).unwrap();
    for n in nodes.iter() {
        let p = node_dir.join(format!("node{n}/distance"));
        let row = std::fs::read_to_string(&p).unwrap();
        let mut v: Vec<&str> = row.split_whitespace().collect();
        v.pop();
        std::fs::write(&p, v.join(" ")).unwrap();
    }
    (last.id, last.cpus.clone())
}

/// A cgroup on node 0's CPUs whose memory sits on `to`: the planner moves its CPUs there.
fn pulled_to(topo: &Topology, to: u32) -> Observations {
    let n0 = &topo.nodes[0];
    let cgroup = CgroupObs {
        id: "pod/c".into(),
        cpu_ns_per_node: [(n0.id, 2_000_000_000)].into(),
        mem_bytes_per_node: [(to, 8 << 30)].into(),
        cpus: n0.cpus.clone(),
        mems: topo.nodes.iter().map(|n| n.id).collect(),
        ..Default::default()
    };
    Observations {
        period_ns: 1_000_000_000,
        cgroups: vec![cgroup],
        nodes: topo
            .nodes
            .iter()
            .map(|n| {
                (
                    n.id,
                    NodeObs {
                        cpu_busy: 0.3,
                        free_bytes: 32 << 30,
                        free_hugepage_bytes: 0,
                        runnable: None,
                    },
                )
            })
            .collect(),
        reserved_cpus: CpuSet::new(),
    }
}

/// Fault (c): a NUMA node goes offline between rounds (sysfs fixture changed under a running
/// engine). The engine notices, rebuilds the topology, and plans made after it never reference
/// the vanished node's CPUs or memory — even for a cgroup whose stale memory figures still
/// point at that node (before the change, the same observation moved it there).
#[test]
fn node_going_offline_rebuilds_the_topology_and_plans_avoid_its_cpus() {
    let io = &mut crate::daemon::Io::new();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/epyc-nps4");
    let root = tempfile::tempdir().unwrap();
    copy_tree(&fixture, root.path());
    let state = tempfile::tempdir().unwrap();
    let before = sysfs::read(root.path()).unwrap();
    let d = daemon(before.clone(), state.path(), Some(root.path()));
    let mut engine = Engine::new(
        Cgroups::new(Mounts::default()),
        Box::new(crate::rounds::ProcCpuTime::new(Path::new("/proc"))),
        Path::new("/proc"),
    );
    let adm = super::admission::Admission::new(
        d.clone(),
        std::sync::Arc::new(super::writer::CgroupCpusetWriter::new(Cgroups::new(
            Mounts::default(),
        ))),
    );
    assert!(
        !engine.refresh_topology(io, &adm),
        "first look only records"
    );
    assert!(!engine.refresh_topology(io, &adm), "nothing changed");

    let cfg = d.lock(io).cfg.controller.clone();
    let (gone, gone_cpus) = (
        before.nodes.last().unwrap().id,
        before.nodes.last().unwrap().cpus.clone(),
    );
    let p = controller::plan(
        &before,
        &pulled_to(&before, gone),
        &ControllerState::default(),
        &cfg,
        1_000_000,
    );
    assert!(
        p.moves.iter().any(|m| m.to_cpus.is_subset(&gone_cpus)),
        "the scenario must move toward node {gone} while it is online: {:#?}",
        p.decisions
    );

    let (id, cpus) = take_last_node_offline(root.path(), &before);
    assert_eq!((id, &cpus), (gone, &gone_cpus));
    assert!(engine.refresh_topology(io, &adm), "the change is noticed");
    let after = d.lock(io).topo.clone();
    assert_eq!(after.nodes.len(), before.nodes.len() - 1);
    assert!(after.node(gone).is_none());
    assert!(after.online_cpus().intersection(&gone_cpus).is_empty());

    let p = controller::plan(
        &after,
        &pulled_to(&after, gone),
        &ControllerState::default(),
        &cfg,
        1_000_000,
    );
    for m in &p.moves {
        assert!(
            m.to_cpus.intersection(&gone_cpus).is_empty() && !m.to_mems.contains(gone),
            "a plan after the change references node {gone}: {m:?}"
        );
        assert!(!m.to_cpus.is_empty() && !m.to_mems.is_empty());
        assert!(m.to_cpus.is_subset(&after.online_cpus()));
    }
    // And the rebuilt topology is what every later round uses: a second check is quiet.
    assert!(!engine.refresh_topology(io, &adm));
    let mut f = FakeCgroups::v2();
    f.insert("pod/c", &after.nodes[0].cpus.to_string(), "0");
    let all_mems: CpuSet = after.nodes.iter().map(|n| n.id).collect();
    let mut moves = p.moves.clone();
    for m in &mut moves {
        m.from_mems = set("0");
    }
    let done = apply_moves(io, &d, &mut f, &moves, 1_000_000, false);
    assert_invariants(
        io,
        &d,
        &f,
        &["pod/c"],
        (&after.online_cpus(), &all_mems),
        done.bytes,
    );
}

/// The CPU-time source of [`sampler_follows_cpu_hotplug`]: records the online CPUs of each
/// topology it is told to follow, and says a CPU is pending while `pending` is set.
struct FollowingSource {
    syncs: std::sync::Arc<std::sync::Mutex<Vec<CpuSet>>>,
    pending: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl crate::rounds::CpuTimeSource for FollowingSource {
    fn cumulative(
        &mut self,
        _: &Cgroups,
        _: &[String],
        _: &Topology,
    ) -> Option<std::collections::BTreeMap<String, crate::ebpf::Sample>> {
        Some(Default::default())
    }
    fn name(&self) -> &'static str {
        "following"
    }
    fn sync_cpus(&mut self, topo: &Topology) {
        self.syncs.lock().unwrap().push(topo.online_cpus());
    }
    fn cpus_pending(&self) -> bool {
        self.pending.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// CPU hotplug left the eBPF sampler blind on CPUs that came back online: the topology was
/// rebuilt, but nothing told the sampler. A round's topology check now hands the rebuilt
/// topology to the CPU-time source, and keeps doing so while the source misses a CPU (a failed
/// attach to retry); otherwise it leaves the source alone.
#[test]
fn sampler_follows_cpu_hotplug() {
    let io = &mut crate::daemon::Io::new();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/epyc-nps4");
    let root = tempfile::tempdir().unwrap();
    copy_tree(&fixture, root.path());
    let state = tempfile::tempdir().unwrap();
    let before = sysfs::read(root.path()).unwrap();
    let d = daemon(before.clone(), state.path(), Some(root.path()));
    let syncs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let pending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut engine = Engine::new(
        Cgroups::new(Mounts::default()),
        Box::new(FollowingSource {
            syncs: syncs.clone(),
            pending: pending.clone(),
        }),
        Path::new("/proc"),
    );
    let adm = super::admission::Admission::new(
        d.clone(),
        std::sync::Arc::new(super::writer::CgroupCpusetWriter::new(Cgroups::new(
            Mounts::default(),
        ))),
    );
    assert!(!engine.follow_topology(io, &adm));
    assert!(!engine.follow_topology(io, &adm));
    assert!(syncs.lock().unwrap().is_empty(), "nothing changed");

    let (_, gone_cpus) = take_last_node_offline(root.path(), &before);
    assert!(engine.follow_topology(io, &adm));
    let after = d.lock(io).topo.online_cpus();
    assert_eq!(*syncs.lock().unwrap(), vec![after.clone()]);
    assert!(after.intersection(&gone_cpus).is_empty());

    // A CPU the source could not attach: retried at every check until it is not pending.
    pending.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(!engine.follow_topology(io, &adm));
    assert!(!engine.follow_topology(io, &adm));
    pending.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(!engine.follow_topology(io, &adm));
    assert_eq!(
        *syncs.lock().unwrap(),
        vec![after.clone(), after.clone(), after]
    );
}

/// The controller's times are on a clock that survives a restart. A move's cooldown
/// started before the restart has, after it, what was left minus the time the restart took —
/// not its whole length again (the old process-uptime clock restarted at 0, so every restored
/// cooldown began anew, and a restart after a long uptime made it last for the old uptime).
#[test]
fn cooldowns_after_a_restart_are_what_they_were_before_it() {
    let io = &mut crate::daemon::Io::new();
    let state = tempfile::tempdir().unwrap();
    let topo = two_nodes();
    let d = daemon(topo.clone(), state.path(), None);
    let cooldown = d.lock(io).cfg.controller.cooldown_ms;
    assert!(
        cooldown >= 10_000,
        "the default cooldown is long enough to measure"
    );
    let m = mv("pod/c", "0-3", "4-7", "0", "1", 10);
    d.lock(io)
        .state
        .controller
        .record_move(&m, 10 * MIB, crate::daemon::boot_ms());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let left = |st: &ControllerState, now: u64| {
        st.cooldown_remaining("pod/c", &set("4-7"), now, cooldown)
            .expect("still cooling down")
    };
    let t_before = crate::daemon::boot_ms();
    let before = left(&d.lock(io).state.controller, t_before);
    d.checkpoint(io).unwrap();
    let cfg = d.lock(io).cfg.clone();
    drop(d);

    // The restart: the state restored as `run` does.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let restored = super::run::restore(&cfg, &topo).unwrap();
    let t_after = crate::daemon::boot_ms();
    let after = left(&restored.controller, t_after);
    // Exactly the boot-clock time between the two readings went by (however long the
    // checkpoint's fsync and the restore took), and at least the 200 ms slept.
    let elapsed = i128::from(t_after) - i128::from(t_before);
    assert!(elapsed >= 200, "{elapsed} ms between the readings");
    assert_eq!(
        i128::from(before) - i128::from(after),
        elapsed,
        "cooldown left {before} ms before the restart, {after} ms after it, {elapsed} ms apart \
         on the boot clock (cooldown {cooldown} ms)"
    );
    assert!(after <= cooldown - 500, "{after} of {cooldown}");

    // A checkpoint from an earlier boot (times in the future) lasts at most one cooldown.
    let mut future = restored.controller.clone();
    future.cgroups.get_mut("pod/c").unwrap().last_move_ms =
        Some(crate::daemon::boot_ms() + 3_600_000);
    assert_eq!(future.clamp_times(crate::daemon::boot_ms()), 1);
    assert!(left(&future, crate::daemon::boot_ms()) <= cooldown);
}

/// A writer that asks the daemon to stop during its first cpuset write (SIGTERM arriving while
/// a round's first move migrates).
struct StopDuringFirstMove {
    fake: FakeCgroups,
    d: Daemon,
}

impl controller::CgroupWriter for StopDuringFirstMove {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, controller::CgroupWriteError> {
        self.fake.read_cpus(cg)
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, controller::CgroupWriteError> {
        self.fake.read_mems(cg)
    }
    fn write_cpus(
        &mut self,
        io: &Io,
        cg: &str,
        c: &CpuSet,
    ) -> Result<(), controller::CgroupWriteError> {
        self.d.request_stop();
        self.fake.write_cpus(io, cg, c)
    }
    fn write_mems(
        &mut self,
        io: &Io,
        cg: &str,
        m: &CpuSet,
    ) -> Result<(), controller::CgroupWriteError> {
        self.fake.write_mems(io, cg, m)
    }
    fn needs_memory_migrate(&self) -> bool {
        self.fake.needs_memory_migrate()
    }
    fn read_memory_migrate(&self, cg: &str) -> Result<bool, controller::CgroupWriteError> {
        self.fake.read_memory_migrate(cg)
    }
    fn set_memory_migrate(
        &mut self,
        io: &Io,
        cg: &str,
        on: bool,
    ) -> Result<(), controller::CgroupWriteError> {
        self.fake.set_memory_migrate(io, cg, on)
    }
    fn move_pages(
        &mut self,
        io: &Io,
        cg: &str,
        toward: &CpuSet,
        max: u64,
    ) -> Result<u64, controller::CgroupWriteError> {
        self.fake.move_pages(io, cg, toward, max)
    }
}

/// SIGTERM during a round's moves. The move under way finishes, no further
/// move starts (a slow migration would outlast the shutdown bound), and the applied move's
/// cooldown is on disk before the daemon's final checkpoint (which the shutdown watchdog may
/// not leave time for).
#[test]
fn a_stop_during_a_slow_migration_applies_no_further_move_and_keeps_the_cooldown() {
    let io = &mut crate::daemon::Io::new();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(two_nodes(), dir.path(), None);
    let names = ["pod/a", "pod/b", "pod/c"];
    let mut fake = FakeCgroups::v2();
    for n in names {
        fake.insert(n, "0-3", "0");
    }
    let mut w = StopDuringFirstMove { fake, d: d.clone() };
    let moves: Vec<Move> = names
        .iter()
        .map(|n| mv(n, "0-3", "4-7", "0", "1", 10))
        .collect();
    let done = apply_moves(io, &d, &mut w, &moves, 1000, false);
    assert_eq!(done.applied, 1, "{done:?}");
    assert_eq!(w.fake.cpus("pod/a"), Some(&set("4-7")));
    for n in ["pod/b", "pod/c"] {
        assert_eq!(w.fake.cpus(n), Some(&set("0-3")), "{n}: not attempted");
    }
    // No final checkpoint: what the move wrote is on disk already.
    let on_disk = crate::checkpoint::load::<Persisted>(dir.path())
        .unwrap()
        .expect("checkpointed after the move");
    assert_eq!(
        on_disk
            .controller
            .cgroups
            .get("pod/a")
            .and_then(|c| c.last_move_ms),
        Some(1000),
        "the move's cooldown survives the stop"
    );
}

/// A checkpoint taken mid-admission (the pod booked, its cgroup not yet bound) and a kill
/// before the next one: at the restart the unbound container admission is released — its
/// exclusive CPU free again — while a bound one and a pod admitted whole through the API (bare
/// uid, waiting for its container) are kept.
#[test]
fn a_container_admission_checkpointed_before_its_binding_is_released_at_restart() {
    let io = &mut crate::daemon::Io::new();
    use crate::placement::pod::{Container, Pod};
    let state = tempfile::tempdir().unwrap();
    let topo = two_nodes();
    let d = daemon(topo.clone(), state.path(), None);
    let pod = |uid: &str| Pod {
        uid: uid.into(),
        containers: vec![Container {
            name: "c".into(),
            cpu_request_millis: 1000,
            cpu_limit_millis: 1000,
            memory_bytes: 64 << 20,
            memory_limit_bytes: 64 << 20,
            ..Default::default()
        }],
        init_containers: Vec::new(),
    };
    {
        let mut s = d.lock(io);
        let sh = &mut *s;
        for uid in ["p1/aaaaaaaaaaaa", "p2/bbbbbbbbbbbb", "api-pod"] {
            sh.state
                .allocator
                .admit(&sh.topo, &sh.cfg.placement, &pod(uid))
                .unwrap();
        }
        // only p1's cgroup was bound when the checkpoint was taken
        sh.state.bindings.insert(
            "kubepods/podp1/aaaa".into(),
            super::Binding {
                pod_uid: "p1/aaaaaaaaaaaa".into(),
                container: "c".into(),
            },
        );
        assert_eq!(sh.state.allocator.exclusive_cpus().len(), 3);
    }
    d.checkpoint(io).unwrap();
    let cfg = d.lock(io).cfg.clone();
    drop(d);
    let restored = super::run::restore(&cfg, &topo).unwrap();
    let keys: Vec<&str> = restored.allocator.pods.keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["api-pod", "p1/aaaaaaaaaaaa"]);
    assert_eq!(restored.allocator.exclusive_cpus().len(), 2);
}

//! Moves go through the allocator: a property test over random admissions (through
//! the admission service, bound to cgroups of a `FakeCgroups`), control rounds (the real
//! planner on observations of those cgroups, the real `apply_moves` writing the fake) and
//! releases. After every step the allocator and the fake agree — every bound container's
//! cpuset is what the books say (`current_cpus`, its mems), exclusive CPUs are disjoint and
//! never reserved, no cpuset is empty — and no Guaranteed container's Memory Manager block is
//! short: its memory is booked in full, on nodes its cgroup may allocate from, and no block is
//! booked past what it has.

use crate::daemon::Io;
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use proptest::prelude::*;

use super::{
    admission::{tests::pod, Admission, AdmitRequest, Durability},
    apply::apply_moves,
    writer::{CpusetChange, CpusetWriter, WriteError},
    Daemon, Shared,
};
use crate::{
    config::Config,
    controller::{
        self, CgroupObs, CgroupWriteError, CgroupWriter, FakeCgroups, NodeObs, Observations,
    },
    cpuset::CpuSet,
    placement::memory::MemoryResource,
    serve::Metrics,
    topology::TopologyBuilder,
};

const MIB: u64 = 1 << 20;
const NODE_BYTES: u64 = 2 << 30;

/// The admission service's writer over the shared fake.
struct FakeCpuset(Arc<Mutex<FakeCgroups>>);

impl CpusetWriter for FakeCpuset {
    fn write(&self, io: &Io, c: &CpusetChange) -> Result<(), WriteError> {
        let mut f = self.0.lock().unwrap();
        let conv = |e: CgroupWriteError| match e {
            CgroupWriteError::Vanished { cgroup } => WriteError::Vanished { cgroup },
            e => WriteError::Failed {
                cgroup: c.cgroup.clone(),
                message: e.to_string(),
            },
        };
        if let Some(m) = &c.mems {
            f.write_mems(io, &c.cgroup, m).map_err(conv)?;
        }
        f.write_cpus(io, &c.cgroup, &c.cpus).map_err(conv)
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        self.0.lock().unwrap().read_cpus(cgroup).ok()
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A Guaranteed pod: CPUs, MiB of memory, and the node its memory first lands on.
    Guaranteed(u64, u64, u32),
    /// A Burstable pod: millicores, MiB it uses, the node its memory is on.
    Burstable(u64, u64, u32),
    /// Release the i-th live pod (modulo).
    Release(usize),
    /// A control round in which every workload runs on this node.
    Round(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..=2, 64u64..=768, 0u32..2).prop_map(|(c, m, n)| Op::Guaranteed(c, m, n)),
        (100u64..=1500, 16u64..=512, 0u32..2).prop_map(|(c, m, n)| Op::Burstable(c, m, n)),
        any::<usize>().prop_map(Op::Release),
        (0u32..2).prop_map(Op::Round),
        (0u32..2).prop_map(Op::Round),
    ]
}

/// One round's observations of the bound cgroups, as the engine makes them: CPU time on
/// `node`, memory where the fake has it, the books' constraints, nodes' free memory minus
/// what the Memory Manager promised and is unused.
fn observe(io: &mut Io, d: &Daemon, fake: &FakeCgroups, node: u32) -> Observations {
    let s = d.lock(io);
    let mut used: BTreeMap<u32, u64> = BTreeMap::new();
    let mut cgroups = Vec::new();
    for cg in s.state.bindings.keys() {
        let mem = fake.memory(cg).cloned().unwrap_or_default();
        for (n, b) in &mem {
            *used.entry(*n).or_default() += b;
        }
        cgroups.push(CgroupObs {
            id: cg.clone(),
            cpu_ns_per_node: [(node, 2_000_000_000)].into(),
            mem_bytes_per_node: mem,
            cpus: fake.cpus(cg).cloned().unwrap_or_default(),
            mems: fake.mems(cg).cloned().unwrap_or_default(),
            constraints: s.bound_constraints(cg).unwrap_or_default(),
            ..Default::default()
        });
    }
    let mut obs = Observations {
        period_ns: 2_000_000_000,
        cgroups,
        nodes: s
            .topo
            .nodes
            .iter()
            .map(|n| {
                (
                    n.id,
                    NodeObs {
                        cpu_busy: 0.2,
                        free_bytes: NODE_BYTES
                            .saturating_sub(used.get(&n.id).copied().unwrap_or(0)),
                        free_hugepage_bytes: 0,
                        runnable: None,
                    },
                )
            })
            .collect(),
        reserved_cpus: s.state.allocator.reserved_cpus.clone(),
    };
    for (n, b) in s.promised_unused(&obs) {
        if let Some(o) = obs.nodes.get_mut(&n) {
            o.free_bytes = o.free_bytes.saturating_sub(b);
        }
    }
    obs
}

/// The invariants of the module doc; `Err` names the first one broken.
fn books_agree(io: &mut Io, d: &Daemon, fake: &FakeCgroups) -> Result<(), String> {
    let s = d.lock(io);
    let a = &s.state.allocator;
    let mut excl = CpuSet::new();
    for (cg, b) in &s.state.bindings {
        let c = super::admission::bound_container(&s, cg)
            .ok_or(format!("{cg} bound to an unknown container"))?;
        let want = a.current_cpus(&b.pod_uid, &b.container).unwrap();
        let cpus = fake.cpus(cg).ok_or(format!("{cg} not in the fake"))?;
        let mems = fake.mems(cg).unwrap();
        if cpus.is_empty() || mems.is_empty() {
            return Err(format!("{cg}: empty cpuset {cpus} / {mems}"));
        }
        if *cpus != want || *mems != c.placement.mems {
            return Err(format!(
                "{cg}: cgroupfs {cpus} / {mems}, books {want} / {}",
                c.placement.mems
            ));
        }
        if c.placement.exclusive {
            if !excl.is_disjoint(&c.placement.cpus)
                || !c.placement.cpus.is_disjoint(&a.reserved_cpus)
            {
                return Err(format!("{cg}: exclusive {} overlaps", c.placement.cpus));
            }
            excl = excl.union(&c.placement.cpus);
        }
        if let Some(m) = &c.memory {
            let booked: u64 = m
                .taken
                .iter()
                .filter(|t| t.1 == MemoryResource::Memory)
                .map(|t| t.2)
                .sum();
            let pod = a.pods.get(&b.pod_uid).unwrap();
            let want_mem = pod
                .memory_request
                .get(&MemoryResource::Memory)
                .copied()
                .unwrap_or(0);
            if booked != want_mem {
                return Err(format!("{cg}: {booked} bytes booked of {want_mem}"));
            }
            for &(n, _, _) in &m.taken {
                if !c.placement.mems.contains(n) || !m.nodes.contains(n) {
                    return Err(format!(
                        "{cg}: memory booked on node {n}, mems {}",
                        c.placement.mems
                    ));
                }
            }
        }
    }
    for n in &a.memory.nodes {
        for (r, b) in &n.blocks {
            if b.reserved > b.allocatable || b.reserved + b.free != b.allocatable {
                return Err(format!("node {} {r:?}: block {b:?} short", n.id));
            }
        }
    }
    Ok(())
}

/// Two nodes of 4 CPUs and 2 GiB, a daemon over them, its admission service writing a fake.
struct World {
    _dir: tempfile::TempDir,
    topo: crate::topology::Topology,
    ctl: crate::config::ControllerConfig,
    d: Daemon,
    fake: Arc<Mutex<FakeCgroups>>,
    adm: Admission,
}

fn world(move_exclusive: bool) -> World {
    let dir = tempfile::tempdir().unwrap();
    let topo = TopologyBuilder {
        cores_per_node: 4,
        threads_per_core: 1,
        memory_per_node_bytes: NODE_BYTES,
        ..Default::default()
    }
    .build();
    let mut cfg = Config::default();
    cfg.daemon.state_dir = dir.path().join("state");
    cfg.controller.move_exclusive = move_exclusive;
    cfg.controller.migration_budget_mib = 4096;
    let ctl = cfg.controller.clone();
    let d = Daemon::new(
        Shared::fresh(topo.clone(), cfg).unwrap(),
        Metrics::default(),
    );
    let fake = Arc::new(Mutex::new(FakeCgroups::v2()));
    let adm = Admission::new(d.clone(), Arc::new(FakeCpuset(fake.clone())));
    World {
        _dir: dir,
        topo,
        ctl,
        d,
        fake,
        adm,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn allocator_and_cgroupfs_never_disagree_and_no_guaranteed_block_is_short(
        ops in proptest::collection::vec(op(), 1..30),
        move_exclusive in any::<bool>(),
    ) {
        let io = &mut Io::new();
        let World { _dir, topo, ctl, d, fake, adm } = world(move_exclusive);
        let cooldown = ctl.cooldown_ms;
        let mut live: Vec<(String, String)> = Vec::new();
        let mut now = 1_000_000u64;
        let mut moves = 0;
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Guaranteed(cpus, mib, node) | Op::Burstable(cpus, mib, node) => {
                    let g = matches!(op, Op::Guaranteed(..));
                    let (uid, cg) = (format!("p{i}"), format!("kubepods/p{i}/c"));
                    {
                        let mut f = fake.lock().unwrap();
                        f.insert(&cg, "0-7", "0-1");
                        f.set_memory(&cg, &[(node, mib * MIB)]);
                    }
                    let millis = if g { cpus * 1000 } else { cpus };
                    let p = pod(&uid, millis, mib * MIB, g);
                    match adm.admit(io, AdmitRequest { pod: &p, bind: Some(&cg), durability: Durability::Deferred, since: Instant::now() }) {
                        Ok(_) => live.push((uid, cg)),
                        Err(_) => fake.lock().unwrap().remove(&cg),
                    }
                }
                Op::Release(k) if !live.is_empty() => {
                    let (_, cg) = live.remove(k % live.len());
                    prop_assert!(adm.unbind(io, &cg, Durability::Deferred).is_some());
                    fake.lock().unwrap().remove(&cg);
                }
                Op::Release(_) => {}
                Op::Round(node) => {
                    let mut f = fake.lock().unwrap();
                    let obs = observe(io, &d, &f, node);
                    let state = {
                        let mut s = d.lock(io);
                        s.state.controller.observe(&obs, crate::controller::EWMA_ALPHA);
                        s.state.controller.clone()
                    };
                    let plan = controller::plan(&topo, &obs, &state, &ctl, now);
                    moves += apply_moves(io, &d, &mut *f, &plan.moves, now, false).applied;
                    now += cooldown + 1;
                }
            }
            let f = fake.lock().unwrap();
            if let Err(e) = books_agree(io, &d, &f) {
                prop_assert!(false, "after step {i} {op:?} (ops {ops:?}): {e}");
            }
        }
        let _ = moves;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The property above with the daemon's writer threads (1–4, `apply::Applier`) on the
    /// shared fake: a round's moves are applied concurrently, and the next admission or
    /// release runs while they migrate; once they are done the books and cgroupfs agree.
    #[test]
    fn allocator_and_cgroupfs_agree_with_concurrent_writers_racing_admissions(
        ops in proptest::collection::vec(op(), 1..30),
        move_exclusive in any::<bool>(),
        threads in 1u32..=4,
    ) {
        let io = &mut Io::new();
        let World { _dir, topo, ctl, d, fake, adm } = world(move_exclusive);
        d.lock(io).cfg.controller.apply_threads = threads;
        let writer = super::apply_tests::SharedFake::over(fake.clone());
        let mut applier = super::apply::Applier::new(d.clone(), writer.factory());
        let cooldown = ctl.cooldown_ms;
        let mut live: Vec<(String, String)> = Vec::new();
        let mut now = 1_000_000u64;
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Guaranteed(cpus, mib, node) | Op::Burstable(cpus, mib, node) => {
                    let g = matches!(op, Op::Guaranteed(..));
                    let (uid, cg) = (format!("p{i}"), format!("kubepods/p{i}/c"));
                    {
                        let mut f = fake.lock().unwrap();
                        f.insert(&cg, "0-7", "0-1");
                        f.set_memory(&cg, &[(node, mib * MIB)]);
                    }
                    let millis = if g { cpus * 1000 } else { cpus };
                    let p = pod(&uid, millis, mib * MIB, g);
                    match adm.admit(io, AdmitRequest { pod: &p, bind: Some(&cg), durability: Durability::Deferred, since: Instant::now() }) {
                        Ok(_) => live.push((uid, cg)),
                        Err(_) => fake.lock().unwrap().remove(&cg),
                    }
                }
                Op::Release(k) if !live.is_empty() => {
                    let (_, cg) = live.remove(k % live.len());
                    prop_assert!(adm.unbind(io, &cg, Durability::Deferred).is_some());
                    fake.lock().unwrap().remove(&cg);
                }
                Op::Release(_) => {}
                Op::Round(node) => {
                    applier.wait();
                    let obs = observe(io, &d, &fake.lock().unwrap(), node);
                    let state = {
                        let mut s = d.lock(io);
                        s.state.controller.observe(&obs, crate::controller::EWMA_ALPHA);
                        s.state.controller.clone()
                    };
                    let plan = controller::plan(&topo, &obs, &state, &ctl, now);
                    applier.submit(io, &plan.moves, now, false);
                    now += cooldown + 1;
                    // Checked after the next step, which runs while these moves migrate.
                    continue;
                }
            }
            let done = applier.wait();
            prop_assert!(done.bytes <= ctl.migration_budget_mib * MIB);
            let f = fake.lock().unwrap();
            if let Err(e) = books_agree(io, &d, &f) {
                prop_assert!(false, "after step {i} {op:?} (threads {threads}, ops {ops:?}): {e}");
            }
        }
        applier.wait();
        let f = fake.lock().unwrap();
        if let Err(e) = books_agree(io, &d, &f) {
            prop_assert!(false, "at the end (threads {threads}, ops {ops:?}): {e}");
        }
    }
}

/// The property above is not vacuous: a shared container's move is applied and followed by the
/// books (its pool, charges and mems); a Guaranteed container's Memory Manager memory stays in
/// its group even with `move_exclusive` and all its CPU time elsewhere (the group is a
/// constraint); and memory promised to it but untouched is not free to a Burstable move.
#[test]
fn a_move_updates_the_books_it_changes_and_respects_memory_manager_promises() {
    let io = &mut Io::new();
    let World {
        _dir,
        topo,
        ctl,
        d,
        fake,
        adm,
    } = world(true);
    let admit = |io: &mut Io, i: usize, g: bool, mem: u64| {
        let p = pod(&format!("p{i}"), if g { 1000 } else { 500 }, mem, g);
        admit_bound(io, &adm, &fake, &p).1.unwrap()
    };
    // A Burstable container (shared pool, memory on node 0) and a Guaranteed one (1 CPU and
    // 256 MiB of Memory Manager memory, on node 0).
    admit(io, 0, false, 0);
    let g = admit(io, 1, true, 256 * MIB);
    assert_eq!(g.placements[0].mems, CpuSet::parse("0").unwrap());
    let g_booked = d.lock(io).state.allocator.pods["p1"].containers[0]
        .memory
        .clone()
        .unwrap();
    for i in 0..2 {
        fake.lock()
            .unwrap()
            .set_memory(&format!("kubepods/p{i}/c"), &[(0, 256 * MIB)]);
    }
    let round = |io: &mut Io, now: u64| {
        let mut f = fake.lock().unwrap();
        let obs = observe(io, &d, &f, 1);
        let state = {
            let mut s = d.lock(io);
            s.state
                .controller
                .observe(&obs, crate::controller::EWMA_ALPHA);
            s.state.controller.clone()
        };
        let plan = controller::plan(&topo, &obs, &state, &ctl, now);
        let n = apply_moves(io, &d, &mut *f, &plan.moves, now, false).applied;
        books_agree(io, &d, &f).unwrap();
        n
    };
    // Both run on node 1 now.
    let applied: usize = (0..3)
        .map(|r| round(io, 1_000_000 + r * (ctl.cooldown_ms + 1)))
        .sum();
    assert_eq!(
        applied, 1,
        "the shared container moved, the Guaranteed one kept its group"
    );
    {
        let s = d.lock(io);
        let b = &s.state.allocator.pods["p0"].containers[0];
        assert_eq!(b.placement.mems, CpuSet::parse("1").unwrap());
        assert!(
            b.placement.cpus.is_subset(&topo.nodes[1].cpus),
            "{}",
            b.placement.cpus
        );
        assert!(
            b.charges.keys().all(|c| topo.nodes[1].cpus.contains(*c)),
            "{:?}",
            b.charges
        );
        let g = &s.state.allocator.pods["p1"].containers[0];
        assert_eq!(g.placement.mems, CpuSet::parse("0").unwrap());
        assert_eq!(g.memory.as_ref(), Some(&g_booked));
    }

    // A second Guaranteed container is promised 1.875 GiB on node 1 and touches none of it; a
    // Burstable container running on node 1 with 1 GiB on node 0 must not move there (MemFree
    // alone would say 2 GiB are free).
    let big = admit(io, 2, true, NODE_BYTES - 128 * MIB);
    assert_eq!(big.placements[0].mems, CpuSet::parse("1").unwrap());
    admit(io, 3, false, 0);
    fake.lock().unwrap().set_memory("kubepods/p2/c", &[]);
    fake.lock()
        .unwrap()
        .set_memory("kubepods/p3/c", &[(0, 1 << 30)]);
    let before = fake.lock().unwrap().mems("kubepods/p3/c").cloned();
    for r in 0..3 {
        round(io, 100_000_000 + r * (ctl.cooldown_ms + 1));
    }
    assert_eq!(
        fake.lock().unwrap().mems("kubepods/p3/c").cloned(),
        before,
        "a Burstable container's memory went into memory promised to a Guaranteed one"
    );
}

/// A release whose checkpoint fails is undone (the pod holds its exclusive CPUs
/// again), so the shared pool must not have grown onto them: the shared container's cpuset
/// stays disjoint from the exclusive CPUs the books still hold.
#[test]
fn release_with_failed_checkpoint_does_not_grow_the_shared_pool() {
    let io = &mut Io::new();
    let World {
        _dir, d, fake, adm, ..
    } = world(false);
    for (i, g) in [(0, false), (1, true)] {
        let p = pod(&format!("p{i}"), if g { 1000 } else { 500 }, 256 * MIB, g);
        admit_bound(io, &adm, &fake, &p).1.unwrap();
    }
    let excl = d.lock(io).state.allocator.exclusive_cpus();
    assert!(!excl.is_empty(), "the Guaranteed pod holds exclusive CPUs");
    let shared = || fake.lock().unwrap().read_cpus("kubepods/p0/c").unwrap();
    assert!(shared().is_disjoint(&excl), "{} vs {excl}", shared());

    // The checkpoint cannot be written: its directory would be under a regular file.
    let blocker = _dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"").unwrap();
    d.lock(io).cfg.daemon.state_dir = blocker.join("state");
    let r = adm.release(io, "p1", Durability::Durable);
    assert!(
        matches!(r, Err(super::admission::ReleaseError::Checkpoint(_))),
        "{r:?}"
    );
    assert_eq!(
        d.lock(io).state.allocator.exclusive_cpus(),
        excl,
        "release undone"
    );
    assert!(
        shared().is_disjoint(&excl),
        "shared container widened onto CPUs the pod holds again: {} vs {excl}",
        shared()
    );

    // Once the checkpoint can be written, the release goes through and the pool grows.
    d.lock(io).cfg.daemon.state_dir = _dir.path().join("state");
    adm.release(io, "p1", Durability::Durable).unwrap();
    assert!(excl.is_subset(&shared()), "{} vs {excl}", shared());
    assert_eq!(
        Some(shared()),
        d.lock(io).state.allocator.current_cpus("p0", "c")
    );
}

/// The control round's writer over the shared fake that, at its first cpuset.cpus write, runs
/// `hook` (an admission racing the round) inline: the move holds no lock across its writes.
struct RacingWriter {
    fake: Arc<Mutex<FakeCgroups>>,
    hook: Option<Box<dyn FnOnce() + Send>>,
}

impl CgroupWriter for RacingWriter {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        self.fake.lock().unwrap().read_cpus(cg)
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        self.fake.lock().unwrap().read_mems(cg)
    }
    fn write_cpus(&mut self, io: &Io, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
        if let Some(hook) = self.hook.take() {
            // no lock is held across a move's writes: the racing change runs here, inline
            run_racing(hook);
        }
        self.fake.lock().unwrap().write_cpus(io, cg, cpus)
    }
    fn write_mems(&mut self, io: &Io, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
        self.fake.lock().unwrap().write_mems(io, cg, mems)
    }
    fn needs_memory_migrate(&self) -> bool {
        self.fake.lock().unwrap().needs_memory_migrate()
    }
    fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
        self.fake.lock().unwrap().read_memory_migrate(cg)
    }
    fn set_memory_migrate(&mut self, io: &Io, cg: &str, on: bool) -> Result<(), CgroupWriteError> {
        self.fake.lock().unwrap().set_memory_migrate(io, cg, on)
    }
    fn move_pages(
        &mut self,
        io: &Io,
        cg: &str,
        to: &CpuSet,
        max: u64,
    ) -> Result<u64, CgroupWriteError> {
        self.fake.lock().unwrap().move_pages(io, cg, to, max)
    }
}

/// A reconcile while a move's writes run leaves the moving container alone: the books already
/// say where it goes, cgroupfs still says where it was, and a repair written then would race
/// the move's own write (its settle sets the container right).
#[test]
fn a_repair_during_a_moves_write_leaves_the_moving_container_alone() {
    let io = &mut Io::new();
    let World {
        _dir, d, fake, adm, ..
    } = world(false);
    let g = "kubepods/p0/c";
    fake.lock().unwrap().insert(g, "0-7", "0-1");
    adm.admit(
        io,
        AdmitRequest {
            pod: &pod("p0", 1000, 256 * MIB, true),
            bind: Some(g),
            durability: Durability::Deferred,
            since: Instant::now(),
        },
    )
    .unwrap();
    let (from_cpus, mems) = {
        let f = fake.lock().unwrap();
        (f.read_cpus(g).unwrap(), f.read_mems(g).unwrap())
    };
    let to = CpuSet::parse("5").unwrap();
    let mv = controller::Move {
        cgroup: g.into(),
        from_cpus,
        to_cpus: to.clone(),
        from_mems: mems.clone(),
        to_mems: mems,
        bytes_to_migrate: 0,
        reason: controller::Trigger::PoorLocality,
        locality_before: 0.0,
        locality_after: 1.0,
        net: 1.0,
        stage: None,
    };
    let repaired = Arc::new(Mutex::new(None));
    let racing = {
        let (adm, fake, repaired) = (adm.clone(), fake.clone(), repaired.clone());
        move || {
            let io = &mut Io::new();
            let changes = adm.repair(io, |cg| {
                fake.lock()
                    .unwrap()
                    .cpus(cg)
                    .map(|c| super::reconcile::Seen {
                        cpus: vec![c.clone()],
                        mems: None,
                    })
            });
            *repaired.lock().unwrap() = Some(changes);
        }
    };
    let mut w = RacingWriter {
        fake: fake.clone(),
        hook: Some(Box::new(racing)),
    };
    let applied = apply_moves(io, &d, &mut w, &[mv], 1_000_000, false);
    assert_eq!(applied.applied, 1, "{applied:?}");
    assert_eq!(
        repaired.lock().unwrap().take(),
        Some(vec![]),
        "repaired while moving"
    );
    assert_eq!(fake.lock().unwrap().cpus(g), Some(&to));
    books_agree(io, &d, &fake.lock().unwrap()).unwrap();
}

/// A move whose cpus write panics (a bug in a writer; the writer threads catch it and go on)
/// gives its booking back as it unwinds: no CPU stays held, and the books keep the cpus the
/// container runs on.
#[test]
fn a_move_whose_write_panics_gives_its_booking_back() {
    let io = &mut Io::new();
    let World {
        _dir, d, fake, adm, ..
    } = world(false);
    let g = "kubepods/p0/c";
    fake.lock().unwrap().insert(g, "0-7", "0-1");
    adm.admit(
        io,
        AdmitRequest {
            pod: &pod("p0", 1000, 256 * MIB, true),
            bind: Some(g),
            durability: Durability::Deferred,
            since: Instant::now(),
        },
    )
    .unwrap();
    let (from_cpus, mems) = {
        let f = fake.lock().unwrap();
        (f.read_cpus(g).unwrap(), f.read_mems(g).unwrap())
    };
    assert_eq!(from_cpus.len(), 1, "exclusive: {from_cpus}");
    let to = CpuSet::parse("5").unwrap();
    assert_ne!(from_cpus, to);
    let mv = controller::Move {
        cgroup: g.into(),
        from_cpus: from_cpus.clone(),
        to_cpus: to,
        from_mems: mems.clone(),
        to_mems: mems,
        bytes_to_migrate: 0,
        reason: controller::Trigger::PoorLocality,
        locality_before: 0.0,
        locality_after: 1.0,
        net: 1.0,
        stage: None,
    };
    let mut w = RacingWriter {
        fake: fake.clone(),
        hook: Some(Box::new(|| panic!("a bug in a writer"))),
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        apply_moves(io, &d, &mut w, &[mv], 1_000_000, false)
    }));
    assert!(r.is_err(), "the writer panicked");
    {
        let s = d.lock(io);
        let a = &s.state.allocator;
        assert!(a.in_flight.is_empty(), "held: {:?}", a.in_flight);
        assert_eq!(a.exclusive_cpus(), from_cpus);
    }
    books_agree(io, &d, &fake.lock().unwrap()).unwrap();
}

/// An admission that makes CPUs exclusive while a control round moves a shared
/// container onto them. Before the fix the round's check and write ran outside the allocator
/// lock: the admission's shrink saw the shared container where it was (or was overwritten by
/// the round's write) and the container ended on the new exclusive CPUs. Now the move is
/// booked before its write (the admission's shrink sees its target) and settled after it:
/// the exclusive CPUs changed meanwhile, so the shared containers, the moved one included,
/// are set to their pool again.
#[test]
fn round_move_racing_an_admission_never_leaves_a_shared_container_on_exclusive_cpus() {
    let io = &mut Io::new();
    let World {
        _dir, d, fake, adm, ..
    } = world(false);
    let b = "kubepods/p0/c";
    fake.lock().unwrap().insert(b, "0-7", "0-1");
    adm.admit(
        io,
        AdmitRequest {
            pod: &pod("p0", 500, 0, false),
            bind: Some(b),
            durability: Durability::Deferred,
            since: Instant::now(),
        },
    )
    .unwrap();
    let (from_cpus, from_mems) = {
        let f = fake.lock().unwrap();
        (f.read_cpus(b).unwrap(), f.read_mems(b).unwrap())
    };
    // The round planned (before the admission) to give B every CPU.
    let all = CpuSet::parse("0-7").unwrap();
    assert_ne!(from_cpus, all);
    let mv = controller::Move {
        cgroup: b.into(),
        from_cpus,
        to_cpus: all.clone(),
        from_mems: from_mems.clone(),
        to_mems: from_mems,
        bytes_to_migrate: 0,
        reason: controller::Trigger::PoorLocality,
        locality_before: 0.0,
        locality_after: 1.0,
        net: 1.0,
        stage: None,
    };
    let g = "kubepods/p1/c";
    fake.lock().unwrap().insert(g, "0-7", "0-1");
    let racing = adm.clone();
    let mut w = RacingWriter {
        fake: fake.clone(),
        hook: Some(Box::new(move || {
            let io = &mut Io::new();
            racing
                .admit(
                    io,
                    AdmitRequest {
                        pod: &pod("p1", 1000, 256 * MIB, true),
                        bind: Some("kubepods/p1/c"),
                        durability: Durability::Deferred,
                        since: Instant::now(),
                    },
                )
                .unwrap();
        })),
    };
    let applied = apply_moves(io, &d, &mut w, &[mv], 1_000_000, false);
    assert!(
        w.hook.is_none(),
        "the admission ran during the round's write"
    );
    let excl = d.lock(io).state.allocator.exclusive_cpus();
    assert!(!excl.is_empty(), "the admission took exclusive CPUs");
    let f = fake.lock().unwrap();
    let on = f.read_cpus(b).unwrap();
    assert!(
        on.is_disjoint(&excl),
        "shared container on exclusive CPUs: {on} vs {excl} ({applied:?})"
    );
    assert_eq!(applied.applied, 1, "{applied:?}");
    books_agree(io, &d, &f).unwrap();
}

/// A shared container's move and an exclusive container's move into the
/// same node run at once; the exclusive one's record shrinks the shared one's pool (the
/// daemon's own rewrite) while the shared one migrates — in its page moves, or in its
/// narrowing mems write. The shared move is neither abandoned nor rolled back for it (its
/// memory is not migrated back): both moves land, and the books and cgroupfs agree.
#[test]
fn a_shared_move_is_not_undone_by_the_pool_shrink_of_a_concurrent_exclusive_move() {
    let io = &mut Io::new();
    use super::apply::{Applier, WriterFactory};
    use super::apply_tests::SharedFake;

    /// S's page moves (or its narrowing mems write) wait until S's cpus were rewritten by
    /// someone (X's record), at most 10 s.
    struct Held {
        w: SharedFake,
        s: String,
        in_pages: bool,
        inside: Arc<std::sync::atomic::AtomicBool>,
        planned: CpuSet,
        target: CpuSet,
    }
    impl Held {
        fn hold(&self) {
            self.inside.store(true, std::sync::atomic::Ordering::SeqCst);
            let t0 = Instant::now();
            while self.w.read_cpus(&self.s).ok().as_ref() == Some(&self.planned)
                && t0.elapsed() < std::time::Duration::from_secs(10)
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }
    impl CgroupWriter for Held {
        fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
            self.w.read_cpus(cg)
        }
        fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
            self.w.read_mems(cg)
        }
        fn write_cpus(&mut self, io: &Io, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
            self.w.write_cpus(io, cg, cpus)
        }
        fn write_mems(&mut self, io: &Io, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
            if cg == self.s && !self.in_pages && mems.is_subset(&self.target) {
                self.hold();
            }
            self.w.write_mems(io, cg, mems)
        }
        fn needs_memory_migrate(&self) -> bool {
            false
        }
        fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
            self.w.read_memory_migrate(cg)
        }
        fn set_memory_migrate(
            &mut self,
            io: &Io,
            cg: &str,
            on: bool,
        ) -> Result<(), CgroupWriteError> {
            self.w.set_memory_migrate(io, cg, on)
        }
        fn move_pages(
            &mut self,
            io: &Io,
            cg: &str,
            to: &CpuSet,
            max: u64,
        ) -> Result<u64, CgroupWriteError> {
            if cg == self.s && self.in_pages {
                self.hold();
            }
            self.w.move_pages(io, cg, to, max)
        }
    }

    for in_pages in [true, false] {
        let World {
            _dir,
            topo,
            d,
            fake,
            adm,
            ..
        } = world(true);
        d.lock(io).cfg.controller.apply_threads = 2;
        let admit = |io: &mut Io, uid: &str, g: bool| {
            let mem = if g { 256 * MIB } else { 0 };
            let p = pod(uid, if g { 1000 } else { 500 }, mem, g);
            let (cg, got) = admit_bound(io, &adm, &fake, &p);
            got.unwrap();
            cg
        };
        let x = admit(io, "x", true);
        let s = admit(io, "s", false);
        let (x_cpus, x_mems, s_cpus, s_mems) = {
            let f = fake.lock().unwrap();
            (
                f.cpus(&x).unwrap().clone(),
                f.mems(&x).unwrap().clone(),
                f.cpus(&s).unwrap().clone(),
                f.mems(&s).unwrap().clone(),
            )
        };
        assert_eq!(x_cpus.len(), 1, "X is exclusive: {x_cpus}");
        // S moves to the node it is not on, X (exclusive) to the same node.
        let from = topo
            .nodes
            .iter()
            .find(|n| s_cpus.is_subset(&n.cpus))
            .unwrap()
            .id;
        let to = 1 - from;
        let target = CpuSet::from_iter([to]);
        fake.lock().unwrap().set_memory(&s, &[(from, 64 * MIB)]);
        let node = topo.nodes[to as usize].cpus.clone();
        assert!(x_cpus.is_subset(&node), "X {x_cpus} on S's target node");
        // S into the target node's pool (less X's CPU); X to another CPU of that node: one
        // of S's new CPUs, which X's record takes out of S's pool while S migrates.
        let s_to = node.difference(&x_cpus);
        let x_to = CpuSet::from_iter([s_to.iter().nth(1).unwrap()]);
        let mv = |cg: &str, from: (&CpuSet, &CpuSet), to: &CpuSet, bytes: u64| controller::Move {
            cgroup: cg.into(),
            from_cpus: from.0.clone(),
            to_cpus: to.clone(),
            from_mems: from.1.clone(),
            to_mems: target.clone(),
            bytes_to_migrate: bytes,
            reason: controller::Trigger::PoorLocality,
            locality_before: 0.5,
            locality_after: 1.0,
            net: 1.0,
            stage: None,
        };
        let s_move = mv(&s, (&s_cpus, &s_mems), &s_to, 64 * MIB);
        let x_move = controller::Move {
            to_mems: x_mems.clone(),
            ..mv(&x, (&x_cpus, &x_mems), &x_to, 0)
        };
        let inside = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let factory: WriterFactory = {
            let (fake, s, inside, planned, target) = (
                fake.clone(),
                s.clone(),
                inside.clone(),
                s_to.clone(),
                target.clone(),
            );
            Arc::new(move || {
                Box::new(Held {
                    w: SharedFake::over(fake.clone()),
                    s: s.clone(),
                    in_pages,
                    inside: inside.clone(),
                    planned: planned.clone(),
                    target: target.clone(),
                })
            })
        };
        let mut a = Applier::new(d.clone(), factory);
        if in_pages {
            // S alone would migrate through the kernel's mems write.
            a = a.premigrate_alone();
        }
        assert_eq!(a.submit(io, &[s_move], 1000, false).queued, 1);
        let t0 = Instant::now();
        while !inside.load(std::sync::atomic::Ordering::SeqCst)
            && !a.in_flight(io).0.is_empty()
            && t0.elapsed() < std::time::Duration::from_secs(20)
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        if !inside.load(std::sync::atomic::Ordering::SeqCst) {
            panic!(
                "S is not migrating: {:?} s {s_cpus}/{s_mems} x {x_cpus}/{x_mems} {:?}",
                a.finish(),
                fake.lock().unwrap().writes()
            );
        }
        assert_eq!(a.submit(io, &[x_move], 1000, false).queued, 1);
        let done = a.finish();
        assert_eq!(done.failed, vec![], "in_pages {in_pages}: {done:?}");
        assert_eq!(done.applied, 2, "in_pages {in_pages}: {done:?}");
        let f = fake.lock().unwrap();
        assert_eq!(f.cpus(&x), Some(&x_to));
        assert_eq!(
            f.cpus(&s),
            Some(&s_to.difference(&x_to)),
            "S follows the books' pool"
        );
        assert_eq!(f.mems(&s), Some(&target));
        assert_eq!(
            f.memory(&s).unwrap().keys().copied().collect::<Vec<_>>(),
            vec![to],
            "S's memory is on node 1, not migrated back"
        );
        books_agree(io, &d, &f).unwrap();
    }
}

/// The admission service's writer over the fake cgroupfs and a fake runtime: each write also
/// becomes the container's spec, as the runtime applies a hook answer or an update.
#[derive(Clone)]
struct FakeNode {
    cgroupfs: Arc<Mutex<FakeCgroups>>,
    /// cgroup → (cpus, mems) of the runtime's spec; empty sets: none given.
    spec: Arc<Mutex<BTreeMap<String, (CpuSet, CpuSet)>>>,
}

impl CpusetWriter for FakeNode {
    fn write(&self, io: &Io, c: &CpusetChange) -> Result<(), WriteError> {
        FakeCpuset(self.cgroupfs.clone()).write(io, c)?;
        let mut spec = self.spec.lock().unwrap();
        let e = spec.entry(c.cgroup.clone()).or_default();
        e.0 = c.cpus.clone();
        if let Some(m) = &c.mems {
            e.1 = m.clone();
        }
        Ok(())
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        FakeCpuset(self.cgroupfs.clone()).cpus(cgroup)
    }
}

impl FakeNode {
    /// What a reconcile sees of `cg`: cgroupfs's cpus and the runtime's spec (no mems in the
    /// spec: it never got ours), as NRI's Synchronize reports it.
    fn seen(&self, cg: &str) -> Option<super::reconcile::Seen> {
        let live = self.cpus(cg)?;
        let (cpus, mems) = self
            .spec
            .lock()
            .unwrap()
            .get(cg)
            .cloned()
            .unwrap_or_default();
        Some(super::reconcile::Seen {
            cpus: vec![live, cpus],
            mems: mems.is_empty().then(CpuSet::new),
        })
    }
}

#[derive(Clone, Debug)]
enum Event {
    Books(Op),
    /// The runtime started the k-th live container (modulo) unplaced, on every CPU and node:
    /// an answer it gave up waiting for.
    LostAnswer(usize),
    /// The n-th cpuset.cpus write from now on fails.
    FailWrite(usize),
    /// CPU c goes offline (its exclusive holder gets a replacement), or back online.
    Hotplug(u32),
    /// The daemon dies and restarts from its checkpoint, written just before or not.
    Restart(bool),
    /// A control round (every workload on this node) during whose first cpus write a
    /// Guaranteed pod of this many CPUs is admitted: the move's CPUs are held in the books
    /// while its writes run, with no lock held.
    RacingRound(u32, u64),
    /// A Guaranteed pod of this many CPUs admitted while another one's cpuset write runs
    /// (the first number its CPUs, the second the racing pod's).
    RacingAdmission(u64, u64),
    /// The k-th live container (modulo) resized to this many exclusive CPUs while a
    /// Guaranteed pod of one CPU is admitted during its own cpuset write.
    RacingResize(usize, u64),
}

/// The fake node whose first cpuset write of `on` first runs `hook`: a change racing another
/// change's write, which holds no lock.
#[derive(Clone)]
struct HookedNode {
    node: FakeNode,
    on: String,
    hook: Hook,
}

/// A change to run once, from another thread's write.
type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

impl CpusetWriter for HookedNode {
    fn write(&self, io: &Io, c: &CpusetChange) -> Result<(), WriteError> {
        if c.cgroup == self.on {
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                run_racing(hook);
            }
        }
        self.node.write(io, c)
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        self.node.cpus(cgroup)
    }
}

impl HookedNode {
    fn new(node: &FakeNode, on: &str, hook: impl FnOnce() + Send + 'static) -> HookedNode {
        HookedNode {
            node: node.clone(),
            on: on.into(),
            hook: Arc::new(Mutex::new(Some(Box::new(hook)))),
        }
    }

    fn ran(&self) -> bool {
        self.hook.lock().unwrap().is_none()
    }
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => op().prop_map(Event::Books),
        1 => any::<usize>().prop_map(Event::LostAnswer),
        1 => (1usize..=3).prop_map(Event::FailWrite),
        1 => (0u32..8).prop_map(Event::Hotplug),
        1 => any::<bool>().prop_map(Event::Restart),
        2 => (0u32..2, 1u64..=2).prop_map(|(n, c)| Event::RacingRound(n, c)),
        1 => (1u64..=2, 1u64..=2).prop_map(|(a, b)| Event::RacingAdmission(a, b)),
        2 => (any::<usize>(), 1u64..=3).prop_map(|(k, n)| Event::RacingResize(k, n)),
    ]
}

/// Once reconciled: every bound container the books can place (its CPUs online) runs on
/// exactly its booked cpuset (and mems, where the runtime gave none), no cpuset is empty, and
/// no bound container runs on another's exclusive CPU.
fn node_agrees(io: &mut Io, d: &Daemon, fake: &FakeCgroups) -> Result<(), String> {
    let s = d.lock(io);
    let books = super::reconcile::booked(&s);
    for b in &books {
        let cpus = fake
            .cpus(&b.cgroup)
            .ok_or(format!("{} not in the fake", b.cgroup))?;
        if *cpus != b.cpus {
            return Err(format!("{}: runs on {cpus}, booked {}", b.cgroup, b.cpus));
        }
    }
    // Hotplug can leave no online CPU outside the exclusive ones: a container with none of its
    // own online then has nowhere to run, `booked` leaves it out (never an empty cpuset) and
    // the kernel runs it on what is online. Only then may a bound container be left out.
    let exclusive =
        (books.iter().filter(|b| b.exclusive)).fold(CpuSet::new(), |acc, b| acc.union(&b.cpus));
    let no_pool = s.topo.online_cpus().difference(&exclusive).is_empty();
    for cg in s.state.bindings.keys() {
        let cpus = fake.cpus(cg).ok_or(format!("{cg} not in the fake"))?;
        if cpus.is_empty() || fake.mems(cg).is_none_or(|m| m.is_empty()) {
            return Err(format!("{cg}: empty cpuset"));
        }
        if !books.iter().any(|b| b.cgroup == *cg) {
            if no_pool {
                continue;
            }
            return Err(format!(
                "{cg} is bound but not booked while the shared pool has CPUs: {:?}, online {}",
                super::admission::bound_container(&s, cg).map(|c| &c.placement),
                s.topo.online_cpus()
            ));
        }
        for e in books.iter().filter(|e| e.exclusive && e.cgroup != *cg) {
            if !cpus.is_disjoint(&e.cpus) {
                return Err(format!(
                    "{cg} runs on {cpus}, {} of them {}'s exclusive; booked {:?}; online {}; books {books:?}",
                    cpus.intersection(&e.cpus),
                    e.cgroup,
                    super::admission::bound_container(&s, cg).map(|c| &c.placement),
                    s.topo.online_cpus(),
                ));
            }
        }
    }
    Ok(())
}

/// Whether `cg` is bound exclusive with a CPU of its own online. One whose CPUs all went
/// offline (none could replace them) runs on the shared pool meanwhile (`reconcile::booked`):
/// an admission may take from under it what any shared container may lose.
fn holds_online_exclusive(s: &Shared, cg: &str) -> bool {
    super::admission::bound_container(s, cg).is_some_and(|c| {
        c.placement.exclusive && !c.placement.cpus.is_disjoint(&s.topo.online_cpus())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    /// Random admissions, releases, moves, CPU hotplug, failed writes, answers the runtime
    /// gave up on and daemon restarts (from a fresh or a stale checkpoint) against a fake
    /// cgroupfs and a fake runtime: after each step and a reconcile — what NRI's Synchronize
    /// and each control round do — what runs is what the books say (`node_agrees`).
    #[test]
    fn once_reconciled_every_bound_container_runs_as_booked(
        events in proptest::collection::vec(event(), 1..40),
    ) {
        let io = &mut Io::new();
        let World { _dir, ctl, mut d, fake, .. } = world(true);
        let node = FakeNode { cgroupfs: fake.clone(), spec: Default::default() };
        let mut adm = Admission::new(d.clone(), Arc::new(node.clone()));
        let mut live: Vec<(String, String, crate::placement::pod::Pod)> = Vec::new();
        let mut now = 1_000_000u64;
        for (i, ev) in events.iter().enumerate() {
            match ev {
                Event::Books(Op::Guaranteed(cpus, mib, n) | Op::Burstable(cpus, mib, n)) => {
                    let g = matches!(ev, Event::Books(Op::Guaranteed(..)));
                    let (uid, cg) = (format!("p{i}/c"), format!("kubepods/p{i}/c"));
                    {
                        let mut f = fake.lock().unwrap();
                        f.insert(&cg, "0-7", "0-1");
                        f.set_memory(&cg, &[(*n, mib * MIB)]);
                    }
                    let p = pod(&uid, if g { cpus * 1000 } else { *cpus }, mib * MIB, g);
                    match adm.admit(io, AdmitRequest { pod: &p, bind: Some(&cg), durability: Durability::Deferred, since: Instant::now() }) {
                        Ok(_) => live.push((uid, cg, p)),
                        Err(_) => fake.lock().unwrap().remove(&cg),
                    }
                }
                Event::Books(Op::Release(k)) if !live.is_empty() => {
                    let (_, cg, _) = live.remove(k % live.len());
                    fake.lock().unwrap().remove(&cg);
                    adm.unbind(io, &cg, Durability::Deferred);
                }
                Event::Books(Op::Release(_)) => {}
                Event::Books(Op::Round(n)) => {
                    let mut f = fake.lock().unwrap();
                    let obs = observe(io, &d, &f, *n);
                    let state = {
                        let mut s = d.lock(io);
                        s.state.controller.observe(&obs, crate::controller::EWMA_ALPHA);
                        s.state.controller.clone()
                    };
                    let topo_now = d.lock(io).topo.clone();
                    let plan = controller::plan(&topo_now, &obs, &state, &ctl, now);
                    apply_moves(io, &d, &mut *f, &plan.moves, now, false);
                    now += ctl.cooldown_ms + 1;
                }
                Event::RacingRound(n, cpus) => {
                    let plan = {
                        let f = fake.lock().unwrap();
                        let obs = observe(io, &d, &f, *n);
                        let state = {
                            let mut s = d.lock(io);
                            s.state.controller.observe(&obs, crate::controller::EWMA_ALPHA);
                            s.state.controller.clone()
                        };
                        let topo_now = d.lock(io).topo.clone();
                        controller::plan(&topo_now, &obs, &state, &ctl, now)
                    };
                    let (uid, cg) = (format!("p{i}/c"), format!("kubepods/p{i}/c"));
                    fake.lock().unwrap().insert(&cg, "0-7", "0-1");
                    let p = pod(&uid, cpus * 1000, 64 * MIB, true);
                    let admitted = Arc::new(Mutex::new(None));
                    let overlap = Arc::new(Mutex::new(None));
                    let racing = {
                        let (adm, p, cg, admitted, overlap, fake) = (adm.clone(), p.clone(), cg.clone(), admitted.clone(), overlap.clone(), fake.clone());
                        move || {
                            let io = &mut Io::new();
                            let r = adm.admit(io, AdmitRequest { pod: &p, bind: Some(&cg), durability: Durability::Deferred, since: Instant::now() });
                            *admitted.lock().unwrap() = Some(r.is_ok());
                            // while the move's write is under way: the CPUs just handed out
                            // are none an exclusive container still runs on
                            let s = adm.daemon.lock(io);
                            let f = fake.lock().unwrap();
                            let Some(ours) = super::admission::bound_container(&s, &cg).map(|c| c.placement.cpus.clone()) else { return };
                            for other in s.state.bindings.keys().filter(|o| **o != cg) {
                                let exclusive = holds_online_exclusive(&s, other);
                                let on = f.cpus(other).cloned().unwrap_or_default();
                                if exclusive && !on.is_disjoint(&ours) {
                                    *overlap.lock().unwrap() = Some(format!("{cg} given {ours} while {other} still runs on {on}"));
                                }
                            }
                        }
                    };
                    let mut w = RacingWriter { fake: fake.clone(), hook: Some(Box::new(racing)) };
                    apply_moves(io, &d, &mut w, &plan.moves, now, false);
                    let overlap = overlap.lock().unwrap().take();
                    prop_assert!(overlap.is_none(), "step {i}: {overlap:?}");
                    if let Some(hook) = w.hook.take() {
                        run_racing(hook); // no move wrote cpus: admitted after the round
                    }
                    if admitted.lock().unwrap().take() == Some(true) {
                        live.push((uid, cg, p));
                    } else {
                        fake.lock().unwrap().remove(&cg);
                    }
                    now += ctl.cooldown_ms + 1;
                }
                Event::RacingAdmission(a, b) => {
                    let (uid_a, cg_a) = (format!("p{i}/c"), format!("kubepods/p{i}/c"));
                    let (uid_b, cg_b) = (format!("q{i}/c"), format!("kubepods/q{i}/c"));
                    fake.lock().unwrap().insert(&cg_a, "0-7", "0-1");
                    fake.lock().unwrap().insert(&cg_b, "0-7", "0-1");
                    let (pa, pb) = (pod(&uid_a, a * 1000, 64 * MIB, true), pod(&uid_b, b * 1000, 64 * MIB, true));
                    let clash = Arc::new(Mutex::new(None));
                    let b_ok = Arc::new(Mutex::new(false));
                    let hook = {
                        let (adm, pb, cg_b, uid_a, clash, b_ok) = (adm.clone(), pb.clone(), cg_b.clone(), uid_a.clone(), clash.clone(), b_ok.clone());
                        move || {
                            let io = &mut Io::new();
                            let Ok(got) = adm.admit(io, AdmitRequest { pod: &pb, bind: Some(&cg_b), durability: Durability::Deferred, since: Instant::now() }) else { return };
                            *b_ok.lock().unwrap() = true;
                            // while the first one's write is under way: its booked CPUs are
                            // none of those just handed out
                            let s = adm.daemon.lock(io);
                            let booked = (s.state.allocator.pods.get(&uid_a)).map(|p| p.containers[0].placement.cpus.clone());
                            if let Some(a) = booked.filter(|a| !a.is_disjoint(&got.placements[0].cpus)) {
                                *clash.lock().unwrap() = Some(format!("{uid_a} booked {a}, racing admission got {}", got.placements[0].cpus));
                            }
                        }
                    };
                    let hooked = HookedNode::new(&node, &cg_a, hook);
                    let racing = Admission::new(d.clone(), Arc::new(hooked.clone()));
                    match racing.admit(io, AdmitRequest { pod: &pa, bind: Some(&cg_a), durability: Durability::Deferred, since: Instant::now() }) {
                        Ok(_) => live.push((uid_a, cg_a, pa)),
                        Err(_) => fake.lock().unwrap().remove(&cg_a),
                    }
                    let clash = clash.lock().unwrap().take();
                    prop_assert!(clash.is_none(), "step {i}: {clash:?}");
                    if hooked.ran() && *b_ok.lock().unwrap() {
                        live.push((uid_b, cg_b, pb));
                    } else {
                        fake.lock().unwrap().remove(&cg_b);
                    }
                }
                Event::RacingResize(k, n) if !live.is_empty() => {
                    let j = k % live.len();
                    let (uid, cg, _) = live[j].clone();
                    let grown = pod(&uid, n * 1000, 64 * MIB, true);
                    let (uid_c, cg_c) = (format!("r{i}/c"), format!("kubepods/r{i}/c"));
                    fake.lock().unwrap().insert(&cg_c, "0-7", "0-1");
                    let pc = pod(&uid_c, 1000, 64 * MIB, true);
                    let clash = Arc::new(Mutex::new(None));
                    let c_ok = Arc::new(Mutex::new(false));
                    let hook = {
                        let (adm, pc, cg_c, cg, clash, c_ok, fake) = (adm.clone(), pc.clone(), cg_c.clone(), cg.clone(), clash.clone(), c_ok.clone(), fake.clone());
                        move || {
                            let io = &mut Io::new();
                            // what the resized container runs on until its write: exclusive
                            // CPUs it is leaving, held in the books meanwhile
                            let runs_on = fake.lock().unwrap().cpus(&cg).cloned().unwrap_or_default();
                            let Ok(got) = adm.admit(io, AdmitRequest { pod: &pc, bind: Some(&cg_c), durability: Durability::Deferred, since: Instant::now() }) else { return };
                            *c_ok.lock().unwrap() = true;
                            if !runs_on.is_disjoint(&got.placements[0].cpus) {
                                *clash.lock().unwrap() = Some(format!("{cg} runs on {runs_on} during its resize, racing admission got {}", got.placements[0].cpus));
                            }
                        }
                    };
                    let hooked = HookedNode::new(&node, &cg, hook);
                    let racing = Admission::new(d.clone(), Arc::new(hooked.clone()));
                    let exclusive = holds_online_exclusive(&d.lock(io), &cg);
                    // durable: checkpointed inline (a deferred one would start a checkpointer thread that
                    // outlives a restart of this test daemon)
                    if let Ok(Some(_)) = racing.resize(io, &cg, &grown.containers[0], Durability::Durable) {
                        live[j].2 = grown;
                    }
                    let clash = clash.lock().unwrap().take();
                    prop_assert!(!exclusive || clash.is_none(), "step {i}: {clash:?}");
                    if hooked.ran() && *c_ok.lock().unwrap() {
                        live.push((uid_c, cg_c, pc));
                    } else {
                        fake.lock().unwrap().remove(&cg_c);
                    }
                }
                Event::RacingResize(..) => {}
                Event::LostAnswer(k) if !live.is_empty() => {
                    let (_, cg, _) = &live[k % live.len()];
                    fake.lock().unwrap().insert(cg, "0-7", "0-1");
                    node.spec.lock().unwrap().insert(cg.clone(), Default::default());
                }
                Event::LostAnswer(_) => {}
                Event::FailWrite(n) => {
                    fake.lock().unwrap().fail_write(controller::CgroupFile::Cpus, *n, controller::FakeFailure::Busy);
                }
                Event::Hotplug(c) => {
                    {
                        let mut s = d.lock(io);
                        let others_online = s.topo.online_cpus().len() > 2;
                        let cpu = s.topo.cpus.iter_mut().find(|x| x.id == *c).unwrap();
                        if cpu.online && !others_online {
                            continue;
                        }
                        cpu.online = !cpu.online;
                        let (on, node) = (cpu.online, cpu.node);
                        // as sysfs shows it: a node lists its online CPUs
                        let n = s.topo.nodes.iter_mut().find(|n| Some(n.id) == node).unwrap();
                        n.cpus = if on {
                            n.cpus.union(&CpuSet::from_iter([*c]))
                        } else {
                            n.cpus.difference(&CpuSet::from_iter([*c]))
                        };
                    }
                    // as the daemon does on every topology change (`Engine::refresh_topology`):
                    // a CPU back online can make whole an exclusive container left short
                    adm.replace_offline(io);
                }
                Event::Restart(checkpointed) => {
                    if *checkpointed {
                        adm.daemon.checkpoint(io).unwrap();
                    }
                    let (cfg, topo_now) = { let s = d.lock(io); (s.cfg.clone(), s.topo.clone()) };
                    let restored = super::run::restore(&cfg, &topo_now).unwrap();
                    d = Daemon::new(Shared::new(topo_now, cfg, restored), Metrics::default());
                    adm = Admission::new(d.clone(), Arc::new(node.clone()));
                    // the start-up reconcile's releases and admissions, over the fake
                    let gone: Vec<String> = (d.lock(io).state.bindings.keys())
                        .filter(|cg| !live.iter().any(|(_, l, _)| l == *cg))
                        .cloned()
                        .collect();
                    for cg in gone {
                        adm.unbind(io, &cg, Durability::Deferred);
                    }
                    let mut kept = Vec::new();
                    for (uid, cg, p) in std::mem::take(&mut live) {
                        if d.lock(io).state.bindings.contains_key(&cg) {
                            kept.push((uid, cg, p));
                            continue;
                        }
                        match adm.admit(io, AdmitRequest { pod: &p, bind: Some(&cg), durability: Durability::Deferred, since: Instant::now() }) {
                            Ok(_) => kept.push((uid, cg, p)),
                            Err(_) => fake.lock().unwrap().remove(&cg),
                        }
                    }
                    live = kept;
                }
            }
            // The reconcile, as often as writes fail (each injected failure fails one write).
            for _ in 0..4 {
                adm.repair(io, |cg| node.seen(cg));
                adm.refence(io);
            }
            let f = fake.lock().unwrap();
            if let Err(e) = node_agrees(io, &d, &f) {
                prop_assert!(false, "after step {i} {ev:?} (events {events:?}): {e}");
            }
        }
    }
}

/// The fake cgroupfs whose first read of `on`'s cpus first runs `hook`: a change racing
/// another change's reads, which hold no lock.
struct HookedReads {
    fake: Arc<Mutex<FakeCgroups>>,
    on: String,
    hook: Hook,
}

impl HookedReads {
    fn new(fake: &Arc<Mutex<FakeCgroups>>, on: &str, hook: impl FnOnce() + Send + 'static) -> Self {
        HookedReads {
            fake: fake.clone(),
            on: on.into(),
            hook: Arc::new(Mutex::new(Some(Box::new(hook)))),
        }
    }
}

impl CpusetWriter for HookedReads {
    fn write(&self, io: &Io, c: &CpusetChange) -> Result<(), WriteError> {
        FakeCpuset(self.fake.clone()).write(io, c)
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        if cgroup == self.on {
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                run_racing(hook);
            }
        }
        FakeCpuset(self.fake.clone()).cpus(cgroup)
    }
}

/// `p`'s one container admitted bound to `kubepods/<uid>/c`, a cgroup new in the fake (on
/// every CPU, as the runtime creates it): the cgroup, and what admission answered.
fn admit_bound(
    io: &mut Io,
    adm: &Admission,
    fake: &Arc<Mutex<FakeCgroups>>,
    p: &crate::placement::pod::Pod,
) -> (
    String,
    Result<super::admission::Admitted, super::admission::AdmitError>,
) {
    let cg = format!("kubepods/{}/c", p.uid);
    fake.lock().unwrap().insert(&cg, "0-7", "0-1");
    let req = AdmitRequest {
        pod: p,
        bind: Some(&cg),
        durability: Durability::Deferred,
        since: Instant::now(),
    };
    let got = adm.admit(io, req);
    (cg, got)
}

/// A Guaranteed API pod of two one-CPU containers, admitted unbound.
fn two_container_pod(io: &mut Io, adm: &Admission, uid: &str) -> crate::placement::pod::Pod {
    let mut p = pod(uid, 1000, 64 * MIB, true);
    let mut second = p.containers[0].clone();
    second.name = "d".into();
    p.containers.push(second);
    adm.admit(
        io,
        AdmitRequest {
            pod: &p,
            bind: None,
            durability: Durability::Deferred,
            since: Instant::now(),
        },
    )
    .unwrap();
    p
}

/// An exclusive container all of whose CPUs go offline while no free CPU can replace them
/// is set to the shared pool by the reconcile (left alone, the kernel would run it on its
/// parent's CPUs, another's exclusive ones among them), and back to its own when they return.
#[test]
fn an_exclusive_container_with_no_cpu_online_runs_on_the_shared_pool_meanwhile() {
    let io = &mut Io::new();
    let World { d, fake, adm, .. } = world(false);
    let mut booked = Vec::new();
    // two exclusive containers and a shared one, which keeps the last free CPU its own
    for (i, millis) in [2000u64, 5000, 100].into_iter().enumerate() {
        let p = pod(&format!("p{i}"), millis, 64 * MIB, millis >= 1000);
        let (cg, got) = admit_bound(io, &adm, &fake, &p);
        booked.push((cg, got.unwrap().placements[0].cpus.clone()));
    }
    // the first one's CPUs go offline: one CPU is left outside the second one's, the shared
    // pool's last, so nothing replaces them
    let (gone, gone_cpus) = booked[0].clone();
    let (other, other_cpus) = booked[1].clone();
    let set_online = |io: &mut Io, on: bool| {
        let mut s = d.lock(io);
        for cpu in s.topo.cpus.iter_mut().filter(|c| gone_cpus.contains(c.id)) {
            cpu.online = on;
        }
        for n in s.topo.nodes.iter_mut() {
            n.cpus = if on {
                n.cpus.union(&gone_cpus)
            } else {
                n.cpus.difference(&gone_cpus)
            };
        }
    };
    set_online(io, false);
    adm.replace_offline(io);
    let pool = d.lock(io).topo.online_cpus().difference(&other_cpus);
    assert!(!pool.is_empty());
    let held = |io: &mut Io| {
        super::admission::bound_container(&d.lock(io), &gone).map(|c| c.placement.cpus.clone())
    };
    assert_eq!(
        held(io),
        Some(gone_cpus.clone()),
        "no free CPU could replace them"
    );
    assert_eq!(fake.lock().unwrap().cpus(&gone), Some(&pool));
    // a runtime that set it back where its spec says: the reconcile repairs it
    fake.lock().unwrap().insert(&gone, "0-7", "0-1");
    adm.refence(io);
    assert_eq!(fake.lock().unwrap().cpus(&gone), Some(&pool));
    assert_eq!(fake.lock().unwrap().cpus(&other), Some(&other_cpus));
    assert_eq!(fake.lock().unwrap().cpus(&booked[2].0), Some(&pool));
    // the shared pool grows (the second one released): it follows it
    fake.lock().unwrap().remove(&other);
    adm.unbind(io, &other, Durability::Deferred);
    adm.release(io, "p1", Durability::Deferred).unwrap();
    let pool = d.lock(io).topo.online_cpus();
    assert_eq!(fake.lock().unwrap().cpus(&gone), Some(&pool));
    set_online(io, true);
    adm.refence(io);
    assert_eq!(
        fake.lock().unwrap().cpus(&gone),
        Some(&gone_cpus),
        "its CPUs stayed its own"
    );
}

/// An API DELETE whose cgroup reads (of a bound container already gone) let the watcher bind
/// the pod's next container: the release is refused at its commit, the pod and the new
/// binding stay, and the container runs on CPUs the books hold for it.
#[test]
fn a_release_racing_a_bind_is_refused_at_its_commit() {
    let io = &mut Io::new();
    let World { d, fake, adm, .. } = world(false);
    two_container_pod(io, &adm, "p");
    let (gone, racing_cg) = ("kubepods/p/a", "kubepods/p/b");
    fake.lock().unwrap().insert(gone, "0-7", "0-1");
    adm.bind(io, gone, "p", Durability::Deferred, Instant::now())
        .unwrap()
        .unwrap();
    // its container exited; the watcher not yet told
    fake.lock().unwrap().remove(gone);
    fake.lock().unwrap().insert(racing_cg, "0-7", "0-1");
    let hook = {
        let adm = adm.clone();
        move || {
            let io = &mut Io::new();
            adm.bind(io, racing_cg, "p", Durability::Deferred, Instant::now())
                .unwrap()
                .unwrap();
        }
    };
    let reads = HookedReads::new(&fake, gone, hook);
    let api = Admission::new(d.clone(), Arc::new(reads));
    let r = api.release_unbound(io, "p", Durability::Durable, None);
    match &r {
        Err(super::admission::ReleaseError::StillBound { cgroups, .. }) => {
            assert_eq!(cgroups, &vec![racing_cg.to_string()])
        }
        r => panic!("release not refused: {r:?}"),
    }
    let s = d.lock(io);
    assert!(s.state.allocator.pods.contains_key("p"));
    let booked = super::admission::bound_container(&s, racing_cg)
        .map(|c| c.placement.cpus.clone())
        .expect("the racing bind stays bound");
    assert_eq!(fake.lock().unwrap().cpus(racing_cg), Some(&booked));
    assert!(
        booked.is_subset(&s.state.allocator.exclusive_cpus()),
        "{booked} held exclusively"
    );
}

/// A bind whose cpuset write lets the pod be released is not committed: nothing is bound to
/// the gone pod, and the container is kept off the exclusive CPUs admitted next (refused).
#[test]
fn a_bind_racing_a_release_is_not_committed_and_its_container_fenced() {
    let io = &mut Io::new();
    let World { d, fake, adm, .. } = world(false);
    adm.admit(
        io,
        AdmitRequest {
            pod: &pod("p", 2000, 64 * MIB, true),
            bind: None,
            durability: Durability::Deferred,
            since: Instant::now(),
        },
    )
    .unwrap();
    let p_cpus = d.lock(io).state.allocator.exclusive_cpus();
    let cg = "kubepods/p/c";
    fake.lock().unwrap().insert(cg, "0-7", "0-1");
    let node = FakeNode {
        cgroupfs: fake.clone(),
        spec: Default::default(),
    };
    let hook = {
        let adm = adm.clone();
        move || {
            let io = &mut Io::new();
            adm.release(io, "p", Durability::Deferred).unwrap()
        }
    };
    let hooked = HookedNode::new(&node, cg, hook);
    let watcher = Admission::new(d.clone(), Arc::new(hooked.clone()));
    let r = watcher.bind(io, cg, "p", Durability::Deferred, Instant::now());
    assert!(hooked.ran());
    assert!(
        matches!(r, Err(super::admission::AdmitError::Released(_))),
        "{r:?}"
    );
    assert!(!d.lock(io).state.bindings.contains_key(cg));
    assert_eq!(fake.lock().unwrap().cpus(cg), Some(&p_cpus));
    // the CPUs it was written onto handed out again: it is moved off them
    let q = "kubepods/q/c";
    fake.lock().unwrap().insert(q, "0-7", "0-1");
    let got = adm
        .admit(
            io,
            AdmitRequest {
                pod: &pod("q", 2000, 64 * MIB, true),
                bind: Some(q),
                durability: Durability::Deferred,
                since: Instant::now(),
            },
        )
        .unwrap();
    assert_eq!(got.placements[0].cpus, p_cpus, "the same CPUs handed out");
    let excl = d.lock(io).state.allocator.exclusive_cpus();
    let runs = fake.lock().unwrap().cpus(cg).cloned().unwrap();
    assert!(
        runs.is_disjoint(&excl),
        "{cg} runs on {runs}, exclusive {excl}"
    );
}

/// A durable admission whose checkpoint fails is undone with every binding to its pod: a
/// container of the pod bound while its cpuset was written (before the checkpoint) is not
/// left bound to a gone pod, and is kept off the exclusive CPUs as a refused one.
#[test]
fn a_failed_durable_admission_undoes_the_bindings_made_meanwhile() {
    let io = &mut Io::new();
    let World {
        _dir, d, fake, adm, ..
    } = world(false);
    let mut p = pod("p", 1000, 64 * MIB, true);
    let mut second = p.containers[0].clone();
    second.name = "d".into();
    p.containers.push(second);
    let (cg_a, cg_b) = ("kubepods/p/a", "kubepods/p/b");
    fake.lock().unwrap().insert(cg_a, "0-7", "0-1");
    fake.lock().unwrap().insert(cg_b, "0-7", "0-1");
    let node = FakeNode {
        cgroupfs: fake.clone(),
        spec: Default::default(),
    };
    let hook = {
        let adm = adm.clone();
        move || {
            let io = &mut Io::new();
            adm.bind(io, cg_b, "p", Durability::Deferred, Instant::now())
                .unwrap()
                .unwrap();
        }
    };
    let hooked = HookedNode::new(&node, cg_a, hook);
    let racing = Admission::new(d.clone(), Arc::new(hooked.clone()));
    // The checkpoint cannot be written: its directory would be under a regular file.
    let blocker = _dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"").unwrap();
    d.lock(io).cfg.daemon.state_dir = blocker.join("state");
    let r = racing.admit(
        io,
        AdmitRequest {
            pod: &p,
            bind: Some(cg_a),
            durability: Durability::Durable,
            since: Instant::now(),
        },
    );
    assert!(hooked.ran());
    assert!(
        matches!(r, Err(super::admission::AdmitError::Checkpoint(_))),
        "{r:?}"
    );
    let s = d.lock(io);
    assert!(!s.state.allocator.pods.contains_key("p"));
    assert_eq!(
        s.state.bindings.keys().collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "nothing bound to the undone pod"
    );
    assert!(
        s.refused.contains(cg_b),
        "the racing bind's container fenced"
    );
}

/// A shrinking resize frees Memory Manager memory, which stays held while its write runs: an
/// admission during the write cannot take it, and when the write fails the undo books the
/// container's memory again in full.
#[test]
fn a_failed_shrink_books_its_memory_again_in_full() {
    let io = &mut Io::new();
    let World { d, fake, adm, .. } = world(false);
    let bind = |io: &mut Io, uid: &str, cpus: u64, mib: u64| {
        let (cg, got) = admit_bound(io, &adm, &fake, &pod(uid, cpus * 1000, mib * MIB, true));
        (cg, got.unwrap().placements[0].mems.clone())
    };
    let (cg, p_node) = bind(io, "p", 2, 1536);
    // the other node's memory taken: what the shrink frees is the only room for a 1 GiB pod
    let (_, r_node) = bind(io, "r", 1, 1536);
    assert_ne!(p_node, r_node);
    let booked = |io: &mut Io, uid: &str| -> u64 {
        let s = d.lock(io);
        let c = &s.state.allocator.pods[uid].containers[0];
        c.memory.as_ref().unwrap().taken.iter().map(|t| t.2).sum()
    };
    assert_eq!(booked(io, "p"), 1536 * MIB);
    let racing_ok = Arc::new(Mutex::new(None));
    let hook = {
        let (adm, fake, racing_ok, cg) = (adm.clone(), fake.clone(), racing_ok.clone(), cg.clone());
        move || {
            let io = &mut Io::new();
            let q = "kubepods/q/c";
            fake.lock().unwrap().insert(q, "0-7", "0-1");
            let r = adm.admit(
                io,
                AdmitRequest {
                    pod: &pod("q", 1000, 1024 * MIB, true),
                    bind: Some(q),
                    durability: Durability::Deferred,
                    since: Instant::now(),
                },
            );
            *racing_ok.lock().unwrap() = Some(r.is_ok());
            // the resize's own write fails next
            fake.lock().unwrap().fail_cgroup_write(
                &cg,
                controller::CgroupFile::Cpus,
                1,
                controller::FakeFailure::Busy,
            );
        }
    };
    let node = FakeNode {
        cgroupfs: fake.clone(),
        spec: Default::default(),
    };
    let hooked = HookedNode::new(&node, &cg, hook);
    let racing = Admission::new(d.clone(), Arc::new(hooked.clone()));
    let shrunk = pod("p", 1000, 256 * MIB, true);
    let r = racing.resize(io, &cg, &shrunk.containers[0], Durability::Deferred);
    assert!(hooked.ran());
    assert!(r.is_err(), "the resize's write failed: {r:?}");
    assert_eq!(
        *racing_ok.lock().unwrap(),
        Some(false),
        "the memory the shrink freed stays held while its write runs"
    );
    assert_eq!(booked(io, "p"), 1536 * MIB, "undone in full");
    let s = d.lock(io);
    assert!(s.state.allocator.in_flight_memory.is_empty());
    assert!(s.state.allocator.in_flight.is_empty());
}

/// A move of `cg`'s bound container from its cpus to `to`, memory staying.
fn move_of(fake: &Arc<Mutex<FakeCgroups>>, cg: &str, to: &str) -> controller::Move {
    let (from_cpus, mems) = {
        let f = fake.lock().unwrap();
        (f.read_cpus(cg).unwrap(), f.read_mems(cg).unwrap())
    };
    controller::Move {
        cgroup: cg.into(),
        from_cpus,
        to_cpus: CpuSet::parse(to).unwrap(),
        from_mems: mems.clone(),
        to_mems: mems,
        bytes_to_migrate: 0,
        reason: controller::Trigger::PoorLocality,
        locality_before: 0.0,
        locality_after: 1.0,
        net: 1.0,
        stage: None,
    }
}

/// A resize and a move of one cgroup never overlap: a resize is refused while a move of its
/// cgroup is booked (the move's undo would put back cpus booked before it), and no move is
/// booked while a resize's write runs.
#[test]
fn a_resize_and_a_move_of_one_cgroup_never_overlap() {
    let io = &mut Io::new();
    let World { d, fake, adm, .. } = world(false);
    let cg = "kubepods/p/c";
    fake.lock().unwrap().insert(cg, "0-7", "0-1");
    adm.admit(
        io,
        AdmitRequest {
            pod: &pod("p", 1000, 256 * MIB, true),
            bind: Some(cg),
            durability: Durability::Deferred,
            since: Instant::now(),
        },
    )
    .unwrap();
    let grown = pod("p", 2000, 256 * MIB, true);
    let booked = super::admission::book_move(io, &d, &move_of(&fake, cg, "6"), false)
        .unwrap()
        .expect("the move is booked");
    let before = d.lock(io).state.allocator.clone();
    let r = adm.resize(io, cg, &grown.containers[0], Durability::Deferred);
    assert!(
        matches!(r, Err(super::admission::AdmitError::Moving(_))),
        "{r:?}"
    );
    assert_eq!(
        d.lock(io).state.allocator,
        before,
        "the refused resize changed nothing"
    );
    booked.settle(io, false);

    // a move during the resize's write is refused
    let refused = Arc::new(Mutex::new(None));
    let hook = {
        let (d, fake, refused) = (d.clone(), fake.clone(), refused.clone());
        move || {
            let io = &mut Io::new();
            let r = super::admission::book_move(io, &d, &move_of(&fake, cg, "6"), false);
            *refused.lock().unwrap() = Some(r.err());
        }
    };
    let node = FakeNode {
        cgroupfs: fake.clone(),
        spec: Default::default(),
    };
    let hooked = HookedNode::new(&node, cg, hook);
    let racing = Admission::new(d.clone(), Arc::new(hooked.clone()));
    let got = racing
        .resize(io, cg, &grown.containers[0], Durability::Deferred)
        .unwrap()
        .expect("resized");
    assert!(hooked.ran());
    assert_eq!(*refused.lock().unwrap(), Some(Some("books-moving")));
    let s = d.lock(io);
    assert!(s.moving.is_empty());
    assert_eq!(
        super::admission::bound_container(&s, cg).map(|c| c.placement.cpus.clone()),
        Some(got.cpus)
    );
}

/// A resize whose write panics gives its booking back: nothing left held, the cgroup no
/// longer moving, the container's record as before.
#[test]
fn a_resize_whose_write_panics_gives_its_booking_back() {
    let io = &mut Io::new();
    let World { d, fake, adm, .. } = world(false);
    let cg = "kubepods/p/c";
    fake.lock().unwrap().insert(cg, "0-7", "0-1");
    adm.admit(
        io,
        AdmitRequest {
            pod: &pod("p", 2000, 512 * MIB, true),
            bind: Some(cg),
            durability: Durability::Deferred,
            since: Instant::now(),
        },
    )
    .unwrap();
    let before = d.lock(io).state.allocator.clone();
    let node = FakeNode {
        cgroupfs: fake.clone(),
        spec: Default::default(),
    };
    let hooked = HookedNode::new(&node, cg, || panic!("a bug in a writer"));
    let racing = Admission::new(d.clone(), Arc::new(hooked));
    let shrunk = pod("p", 1000, 256 * MIB, true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        racing.resize(io, cg, &shrunk.containers[0], Durability::Deferred)
    }));
    assert!(r.is_err(), "the writer panicked");
    let s = d.lock(io);
    assert!(s.moving.is_empty());
    assert_eq!(s.state.allocator, before, "booking given back");
}

/// A bind whose write panics gives its cgroup's booking back: the cgroup can be bound again.
#[test]
fn a_bind_whose_write_panics_gives_its_booking_back() {
    let io = &mut Io::new();
    let World { d, fake, adm, .. } = world(false);
    adm.admit(
        io,
        AdmitRequest {
            pod: &pod("p", 1000, 64 * MIB, true),
            bind: None,
            durability: Durability::Deferred,
            since: Instant::now(),
        },
    )
    .unwrap();
    let cg = "kubepods/p/c";
    fake.lock().unwrap().insert(cg, "0-7", "0-1");
    let node = FakeNode {
        cgroupfs: fake.clone(),
        spec: Default::default(),
    };
    let hooked = HookedNode::new(&node, cg, || panic!("a bug in a writer"));
    let racing = Admission::new(d.clone(), Arc::new(hooked));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        racing.bind(io, cg, "p", Durability::Deferred, Instant::now())
    }));
    assert!(r.is_err(), "the writer panicked");
    assert!(d.lock(io).binding.is_empty(), "booking given back");
    adm.bind(io, cg, "p", Durability::Deferred, Instant::now())
        .unwrap()
        .expect("bound at the next attempt");
}

/// A change racing a write, run on a thread of its own (it locks with that thread's token)
/// while the write that lets it in waits.
fn run_racing(change: impl FnOnce() + Send) {
    std::thread::scope(|s| {
        s.spawn(change);
    });
}

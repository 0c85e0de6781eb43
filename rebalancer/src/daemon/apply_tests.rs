//! The writer threads (`apply::Applier`) on a shared fake: moves' migrations overlap in time,
//! the budget holds over moves queued and under way whatever the interleaving, a failing
//! writer rolls back only its own move, CPUs given up are taken only once free, a stop
//! starts no further move, a dry run writes nothing; and a property over random moves,
//! failures and thread counts.

use crate::daemon::Io;
use std::{
    collections::BTreeMap,
    sync::{Arc, Condvar, Mutex},
    time::Duration,
};

use proptest::prelude::*;

use super::{
    apply::{Applier, WriterFactory},
    Daemon, Shared,
};
use crate::{
    config::Config,
    controller::{
        CgroupFile, CgroupWriteError, CgroupWriter, FakeCgroups, FakeFailure, Move, Trigger,
    },
    cpuset::CpuSet,
    serve::Metrics,
    topology::TopologyBuilder,
};

const MIB: u64 = 1 << 20;

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

fn mv(cg: &str, cpus: (&str, &str), mems: (&str, &str), bytes: u64) -> Move {
    Move {
        cgroup: cg.into(),
        from_cpus: set(cpus.0),
        to_cpus: set(cpus.1),
        from_mems: set(mems.0),
        to_mems: set(mems.1),
        bytes_to_migrate: bytes,
        reason: Trigger::PoorLocality,
        locality_before: 0.5,
        locality_after: 1.0,
        net: 1.0,
        stage: None,
    }
}

/// Page moves (the migration) wait here: until `want` writers are inside at once (or 20 s
/// pass; a one-at-a-time loop never meets), or until [`Gate::open`].
struct Gate {
    want: usize,
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl Gate {
    fn new(want: usize) -> Arc<Gate> {
        Arc::new(Gate {
            want,
            state: Mutex::new((0, false)),
            cv: Condvar::new(),
        })
    }

    fn arrive(&self) {
        let mut g = self.state.lock().unwrap();
        g.0 += 1;
        if g.0 >= self.want {
            g.1 = true;
            self.cv.notify_all();
            return;
        }
        let _ = self
            .cv
            .wait_timeout_while(g, Duration::from_secs(20), |s| !s.1)
            .unwrap();
    }

    fn open(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }

    fn met(&self) -> bool {
        self.state.lock().unwrap().1
    }

    /// Writers inside (arrived) so far.
    fn arrived(&self) -> usize {
        self.state.lock().unwrap().0
    }
}

/// One writer per thread over one fake (locked per call, as cgroupfs serialises each file
/// write), with an optional gate in front of the page moves.
#[derive(Clone)]
pub(crate) struct SharedFake {
    pub fake: Arc<Mutex<FakeCgroups>>,
    gate: Option<Arc<Gate>>,
    /// Calls of (move_pages, migrate_pages) so far, over every thread's writer.
    calls: Arc<Mutex<(u32, u32)>>,
    /// The nice value of the thread of each mems write and page move, in call order.
    nices: Arc<Mutex<Vec<i32>>>,
    /// At most this many bytes moved per migrate_pages call (a kernel that can place only a
    /// trickle of the pages: target node full, pages pinned).
    trickle: Option<u64>,
    /// What `left_behind` reports after the page moves (pages other processes map).
    left: Option<u64>,
}

/// The calling thread's nice value.
fn thread_nice() -> i32 {
    // SAFETY: plain syscalls on the calling thread.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::getpriority(libc::PRIO_PROCESS, tid)
    }
}

impl CgroupWriter for SharedFake {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        self.fake.lock().unwrap().read_cpus(cg)
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        self.fake.lock().unwrap().read_mems(cg)
    }
    fn write_cpus(&mut self, io: &Io, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
        self.fake.lock().unwrap().write_cpus(io, cg, cpus)
    }
    fn write_mems(&mut self, io: &Io, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
        self.nices.lock().unwrap().push(thread_nice());
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
        self.calls.lock().unwrap().0 += 1;
        if let Some(g) = &self.gate {
            g.arrive();
        }
        self.fake.lock().unwrap().move_pages(io, cg, to, max)
    }
    fn migrate_pages(
        &mut self,
        io: &Io,
        cg: &str,
        to: &CpuSet,
        max: u64,
    ) -> Result<u64, CgroupWriteError> {
        self.calls.lock().unwrap().1 += 1;
        self.nices.lock().unwrap().push(thread_nice());
        if let Some(g) = &self.gate {
            g.arrive();
        }
        // As if the cgroup were many small processes, each moved whole.
        let max = self.trickle.map_or(max, |t| t.min(max));
        self.fake.lock().unwrap().move_pages(io, cg, to, max)
    }
    fn left_behind(&self, _cg: &str, _toward: &CpuSet) -> Option<u64> {
        self.left
    }
}

impl SharedFake {
    pub(crate) fn new(fake: FakeCgroups) -> SharedFake {
        SharedFake::over(Arc::new(Mutex::new(fake)))
    }

    pub(crate) fn over(fake: Arc<Mutex<FakeCgroups>>) -> SharedFake {
        SharedFake {
            fake,
            gate: None,
            calls: Arc::default(),
            nices: Arc::default(),
            trickle: None,
            left: None,
        }
    }

    pub(crate) fn factory(&self) -> WriterFactory {
        let w = self.clone();
        Arc::new(move || Box::new(w.clone()))
    }
}

/// A daemon over 4 nodes of 4 CPUs with `threads` apply threads and `budget_mib`.
fn daemon(threads: u32, budget_mib: u64) -> (tempfile::TempDir, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let topo = TopologyBuilder {
        nodes_per_socket: 4,
        cores_per_node: 4,
        threads_per_core: 1,
        ..Default::default()
    }
    .build();
    let mut cfg = Config::default();
    cfg.daemon.state_dir = dir.path().join("state");
    cfg.controller.apply_threads = threads;
    cfg.controller.migration_budget_mib = budget_mib;
    let d = Daemon::new(Shared::fresh(topo, cfg).unwrap(), Metrics::default());
    (dir, d)
}

fn fake_of(cgs: &[(&str, &str, &str)]) -> FakeCgroups {
    cgs.iter().fold(FakeCgroups::v2(), |f, (c, cpus, mems)| {
        f.with(c, cpus, mems)
    })
}

/// Replays the fake's history from `initial`: no write ever left a cgroup with an empty set,
/// and the `exclusive` cgroups' CPUs were pairwise disjoint after every write.
fn check_history(initial: &[(&str, &str, &str)], fake: &FakeCgroups, exclusive: &[&str]) {
    let mut now: BTreeMap<String, (CpuSet, CpuSet)> = initial
        .iter()
        .map(|(c, cpus, mems)| (c.to_string(), (set(cpus), set(mems))))
        .collect();
    for (k, (cg, cpus, mems)) in fake.history().iter().enumerate() {
        assert!(
            !cpus.is_empty() && !mems.is_empty(),
            "write {k}: empty set for {cg}"
        );
        now.insert(cg.clone(), (cpus.clone(), mems.clone()));
        for (i, a) in exclusive.iter().enumerate() {
            for b in &exclusive[i + 1..] {
                assert!(
                    now[*a].0.is_disjoint(&now[*b].0),
                    "write {k}: {a} {} and {b} {} overlap",
                    now[*a].0,
                    now[*b].0
                );
            }
        }
    }
}

/// Four moves whose memory migrates: all four writers move their pages at the same time (a
/// one-at-a-time loop never meets the gate), and every move lands with all its memory on the
/// target — moved by the writers' own page moves, not by the kernel's serialised mems writes.
#[test]
fn moves_of_a_round_migrate_at_the_same_time() {
    let io = &mut crate::daemon::Io::new();
    let cgs = [
        ("a", "0-3", "0-1"),
        ("b", "4-7", "0-1"),
        ("c", "8-11", "0-1"),
        ("d", "12-15", "0-1"),
    ];
    let mut fake = fake_of(&cgs);
    for (c, _, _) in &cgs {
        fake.set_memory(c, &[(0, 100 * MIB), (1, 100 * MIB)]);
    }
    let gate = Gate::new(4);
    let w = SharedFake {
        gate: Some(gate.clone()),
        ..SharedFake::new(fake)
    };
    let moves = [
        mv("a", ("0-3", "0-3"), ("0-1", "0"), 100 * MIB),
        mv("b", ("4-7", "4-7"), ("0-1", "0"), 100 * MIB),
        mv("c", ("8-11", "8-11"), ("0-1", "1"), 100 * MIB),
        mv("d", ("12-15", "12-15"), ("0-1", "1"), 100 * MIB),
    ];
    let (_dir, d) = daemon(4, 1024);
    let mut a = Applier::new(d.clone(), w.factory());
    assert_eq!(a.submit(io, &moves, 1000, false).queued, 4);
    let done = a.wait();
    assert!(gate.met(), "the four page moves never overlapped");
    assert_eq!(done.applied, 4, "{done:?}");
    let (move_calls, migrate_calls) = *w.calls.lock().unwrap();
    assert!(
        move_calls == 0 && migrate_calls >= 4,
        "the writers move whole processes by the kernel's walk (migrate_pages), not by \
         move_pages: {move_calls} / {migrate_calls}"
    );
    let f = w.fake.lock().unwrap();
    for m in &moves {
        assert_eq!(f.mems(&m.cgroup), Some(&m.to_mems));
        let on: Vec<u32> = f.memory(&m.cgroup).unwrap().keys().copied().collect();
        assert_eq!(on, m.to_mems.iter().collect::<Vec<_>>(), "{}", m.cgroup);
    }
    assert_eq!(f.migrated(), 4 * 100 * MIB);
    check_history(&cgs, &f, &[]);
    drop(f);
    // Recorded as the sequential loop records: cooldowns and counters.
    let s = d.lock(io);
    assert_eq!(s.state.controller.moves_total, 4);
    assert_eq!(s.state.controller.bytes_migrated_total, 4 * 100 * MIB);
}

/// The budget holds over what is queued and under way: while two 400 MiB moves migrate, a
/// third (of another round) does not fit the 1 GiB budget; once they are done it does.
#[test]
fn bytes_still_migrating_count_against_the_next_submit() {
    let io = &mut crate::daemon::Io::new();
    let cgs = [
        ("a", "0-3", "0-1"),
        ("b", "4-7", "0-1"),
        ("c", "8-11", "0-1"),
    ];
    let mut fake = fake_of(&cgs);
    for (c, _, _) in &cgs {
        fake.set_memory(c, &[(0, 400 * MIB), (1, 400 * MIB)]);
    }
    let gate = Gate::new(usize::MAX);
    let w = SharedFake {
        gate: Some(gate.clone()),
        ..SharedFake::new(fake)
    };
    let (_dir, d) = daemon(4, 1024);
    let mut a = Applier::new(d.clone(), w.factory());
    let first = [
        mv("a", ("0-3", "0-3"), ("0-1", "1"), 400 * MIB),
        mv("b", ("4-7", "4-7"), ("0-1", "1"), 400 * MIB),
    ];
    assert_eq!(a.submit(io, &first, 1000, false).queued, 2);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while gate.arrived() < 2 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(gate.arrived(), 2, "both writers are migrating");
    assert_eq!(a.in_flight(io).1, 800 * MIB);
    let third = [mv("c", ("8-11", "8-11"), ("0-1", "1"), 400 * MIB)];
    let s = a.submit(io, &third, 2000, false);
    assert_eq!((s.queued, s.over_budget), (0, 1), "{s:?}");
    // A second move of a cgroup under way is not queued either.
    let again = [mv("a", ("0-3", "0-3"), ("0-1", "1"), 0)];
    assert_eq!(a.submit(io, &again, 2000, false).in_flight, 1);
    gate.open();
    let done = a.wait();
    assert_eq!((done.applied, done.over_budget), (2, 1), "{done:?}");
    assert!(done.bytes <= 1024 * MIB);
    assert_eq!(a.in_flight(io), (Default::default(), 0));
    // The budget is a rate: the 800 MiB that ended within the period still count, so the
    // third fits only once the period since they ended has passed.
    assert_eq!(a.budget_used(io), 800 * MIB);
    let s = a.submit(io, &third, 3000, false);
    assert_eq!((s.queued, s.over_budget), (0, 1), "{s:?}");
    let later = std::time::Instant::now() + Duration::from_millis(period_ms(io, &d) + 1);
    assert_eq!(a.submit_at(io, &third, 3000, false, later).queued, 1);
    assert_eq!(a.wait().applied, 1);
}

fn period_ms(io: &mut Io, d: &Daemon) -> u64 {
    d.lock(io).cfg.controller.period_ms
}

/// Rounds brought forward by events get no fresh budget. Moves that
/// ended within the last period count against the next submit as moves under way do: two
/// 600 MiB moves submitted in two rounds 1 ms apart (each alone within the 1 GiB budget)
/// never both run within one period.
#[test]
fn the_budget_is_a_rate_over_the_period_not_per_round() {
    let io = &mut crate::daemon::Io::new();
    let cgs = [("a", "0-3", "0-1"), ("b", "4-7", "0-1")];
    let mut fake = fake_of(&cgs);
    for (c, _, _) in &cgs {
        fake.set_memory(c, &[(0, 600 * MIB)]);
    }
    let w = SharedFake::new(fake);
    let (_dir, d) = daemon(4, 1024);
    let mut a = Applier::new(d.clone(), w.factory());
    let t0 = std::time::Instant::now();
    let first = [mv("a", ("0-3", "0-3"), ("0-1", "1"), 600 * MIB)];
    assert_eq!(a.submit_at(io, &first, 1000, false, t0).queued, 1);
    assert_eq!(a.wait().applied, 1);
    assert_eq!(a.in_flight(io).1, 0, "nothing under way");
    assert_eq!(
        a.budget_used(io),
        600 * MIB,
        "but 600 MiB within the period"
    );
    let second = [mv("b", ("4-7", "4-7"), ("0-1", "1"), 600 * MIB)];
    let s = a.submit_at(io, &second, 1001, false, t0 + Duration::from_millis(1));
    assert_eq!((s.queued, s.over_budget), (0, 1), "{s:?}");
    // A period after the first ended, the second fits.
    let later = std::time::Instant::now() + Duration::from_millis(period_ms(io, &d) + 1);
    assert_eq!(a.submit_at(io, &second, 6001, false, later).queued, 1);
    let done = a.finish();
    assert_eq!((done.applied, done.over_budget), (1, 1), "{done:?}");
}

/// A writer that panics in a move ends that move, not the pool: the move
/// leaves `running` (its cgroup is planned again, its bytes stop counting after the period),
/// is counted as failed ("panic"), `wait` returns, and the same pool applies the next move.
#[test]
fn a_panicking_writer_fails_only_its_move_and_the_pool_goes_on() {
    let io = &mut Io::new();
    struct Panicky(SharedFake);
    impl CgroupWriter for Panicky {
        fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
            self.0.read_cpus(cg)
        }
        fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
            self.0.read_mems(cg)
        }
        fn write_cpus(&mut self, io: &Io, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
            self.0.write_cpus(io, cg, cpus)
        }
        fn write_mems(&mut self, io: &Io, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
            if cg == "a" {
                panic!("a bug in a writer");
            }
            self.0.write_mems(io, cg, mems)
        }
        fn needs_memory_migrate(&self) -> bool {
            false
        }
        fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
            self.0.read_memory_migrate(cg)
        }
        fn set_memory_migrate(
            &mut self,
            io: &Io,
            cg: &str,
            on: bool,
        ) -> Result<(), CgroupWriteError> {
            self.0.set_memory_migrate(io, cg, on)
        }
        fn move_pages(
            &mut self,
            io: &Io,
            cg: &str,
            to: &CpuSet,
            max: u64,
        ) -> Result<u64, CgroupWriteError> {
            self.0.move_pages(io, cg, to, max)
        }
    }
    let cgs = [("a", "0-3", "0-1"), ("b", "4-7", "0-1")];
    let mut fake = fake_of(&cgs);
    for (c, _, _) in &cgs {
        fake.set_memory(c, &[(0, 600 * MIB)]);
    }
    let w = SharedFake::new(fake);
    let factory: WriterFactory = {
        let w = w.clone();
        Arc::new(move || Box::new(Panicky(w.clone())))
    };
    for threads in [1, 2] {
        let (_dir, d) = daemon(threads, 1024);
        let mut a = Applier::new(d.clone(), factory.clone());
        let t0 = std::time::Instant::now();
        let first = [mv("a", ("0-3", "0-1"), ("0-1", "1"), 600 * MIB)];
        assert_eq!(a.submit_at(io, &first, 1000, false, t0).queued, 1);
        let done = a.wait();
        assert_eq!(done.failed, vec![("a".to_string(), "panic")], "{threads}");
        assert_eq!(
            a.in_flight(io),
            (Default::default(), 0),
            "{threads}: a not in flight"
        );
        assert_eq!(
            d.metrics
                .moves_failed
                .get_or_create(&crate::serve::metrics::ReasonLabel {
                    reason: "panic".into()
                })
                .get(),
            1
        );
        // The next move (its bytes past the period of a's) is applied by the same pool.
        let later = std::time::Instant::now() + Duration::from_millis(period_ms(io, &d) + 1);
        let second = [mv("b", ("4-7", "4-5"), ("0-1", "1"), 600 * MIB)];
        assert_eq!(a.submit_at(io, &second, 7000, false, later).queued, 1);
        assert_eq!(a.finish().applied, 1, "{threads}");
        assert_eq!(w.fake.lock().unwrap().mems("b"), Some(&set("1")));
        let mut f = w.fake.lock().unwrap();
        for (c, cpus, mems) in &cgs {
            f.write_mems(io, c, &set(mems)).unwrap();
            f.write_cpus(io, c, &set(cpus)).unwrap();
            f.set_memory(c, &[(0, 600 * MIB)]);
        }
    }
}

/// A writer stuck in one move (a cgroup write in D state) for longer than
/// the stuck limit fails the `apply` health component (so /healthz fails and the daemon is
/// restarted); once the move ends it is healthy again.
#[test]
fn a_stuck_writer_fails_health() {
    let io = &mut crate::daemon::Io::new();
    let mut fake = fake_of(&[("a", "0-3", "0-1")]);
    fake.set_memory("a", &[(0, 10 * MIB)]);
    let gate = Gate::new(usize::MAX);
    let w = SharedFake {
        gate: Some(gate.clone()),
        ..SharedFake::new(fake)
    };
    let (_dir, d) = daemon(2, 1024);
    let mut a = Applier::new(d.clone(), w.factory())
        .stuck_after(Duration::from_millis(50))
        .premigrate_alone();
    a.submit(
        io,
        &[mv("a", ("0-3", "0-3"), ("0-1", "1"), 10 * MIB)],
        1000,
        false,
    );
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while gate.arrived() < 1 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(gate.arrived(), 1, "the writer is in its move");
    let health = &d.metrics.health;
    assert!(health.dead().is_empty(), "{:?}", health.dead());
    std::thread::sleep(Duration::from_millis(120));
    a.in_flight(io); // a round's check: the move is older than the limit, no beat
    std::thread::sleep(Duration::from_millis(60));
    let dead = health.dead();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].component, "apply");
    gate.open();
    assert_eq!(a.wait().applied, 1);
    a.in_flight(io);
    assert!(health.dead().is_empty(), "{:?}", health.dead());
    a.finish();
    assert!(health.dead().is_empty(), "stopped on purpose");
}

/// A stop while a writer moves its pages ahead of the narrowing write
/// cuts the move short instead of running that write (which would migrate the rest, past the
/// shutdown bound): cpus moved, mems still widened, no narrowing write, reported "stopped";
/// the books of its cpus were checkpointed before the migration began.
#[test]
fn a_stop_during_the_page_moves_cuts_the_move_short() {
    let io = &mut crate::daemon::Io::new();
    let mut fake = fake_of(&[("m", "0-3", "0")]);
    fake.set_memory("m", &[(0, 256 * MIB)]);
    let gate = Gate::new(usize::MAX);
    let w = SharedFake {
        gate: Some(gate.clone()),
        ..SharedFake::new(fake)
    };
    let (dir, d) = daemon(2, 1024);
    let written = || {
        dir.path()
            .join("state")
            .read_dir()
            .is_ok_and(|mut r| r.next().is_some())
    };
    assert!(!written(), "no checkpoint before the move");
    let mut a = Applier::new(d.clone(), w.factory()).premigrate_alone();
    a.submit(
        io,
        &[mv("m", ("0-3", "4-7"), ("0", "1"), 256 * MIB)],
        1000,
        false,
    );
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while gate.arrived() < 1 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(gate.arrived(), 1);
    assert!(written(), "the books were checkpointed once the cpus moved");
    d.request_stop();
    gate.open();
    let t0 = std::time::Instant::now();
    let done = a.finish();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(done.failed, vec![("m".to_string(), "stopped")], "{done:?}");
    let f = w.fake.lock().unwrap();
    assert_eq!(f.cpus("m"), Some(&set("4-7")), "cpus moved");
    assert_eq!(f.mems("m"), Some(&set("0-1")), "mems still widened");
    assert!(
        !f.writes()
            .iter()
            .any(|wr| wr.file == CgroupFile::Mems && wr.value == "1"),
        "no narrowing write: {:?}",
        f.writes()
    );
    assert!(
        f.migrated() <= 64 * MIB,
        "one page step at most: {}",
        f.migrated()
    );
}

/// In a 4-node guest, migrate_pages(2) placed a few pages a call, each call counted as progress, and the writer looped on it for the rest of the window
/// (32 s of the daemon's CPU, w2's mems never narrowed). A step that moves a small part of
/// what it asked for ends the page moves: the narrowing write migrates the rest.
#[test]
fn page_moves_that_trickle_give_way_to_the_mems_write() {
    let io = &mut crate::daemon::Io::new();
    let mut fake = fake_of(&[("m", "0-3", "0")]);
    fake.set_memory("m", &[(0, 256 * MIB)]);
    let w = SharedFake {
        trickle: Some(8 * 4096),
        ..SharedFake::new(fake)
    };
    let (_dir, d) = daemon(2, 1024);
    let mut a = Applier::new(d.clone(), w.factory()).premigrate_alone();
    a.submit(
        io,
        &[mv("m", ("0-3", "4-7"), ("0", "1"), 256 * MIB)],
        1000,
        false,
    );
    let done = a.finish();
    assert!(done.failed.is_empty(), "{done:?}");
    assert_eq!(
        w.calls.lock().unwrap().1,
        1,
        "one trickling step, not thousands"
    );
    assert_eq!(
        w.fake.lock().unwrap().mems("m"),
        Some(&set("1")),
        "mems narrowed"
    );
}

/// A failing writer rolls back only its own move: b's cpus write fails after its mems were
/// widened; b is restored, a and c keep their new cpusets.
#[test]
fn a_failing_writer_rolls_back_only_its_own_move() {
    let io = &mut crate::daemon::Io::new();
    let cgs = [
        ("a", "0-3", "0-1"),
        ("b", "4-7", "0-1"),
        ("c", "8-11", "0-1"),
    ];
    let moves = [
        mv("a", ("0-3", "0-1"), ("0-1", "0"), 100 * MIB),
        mv("b", ("4-7", "4-5"), ("0-1", "2"), 100 * MIB),
        mv("c", ("8-11", "8-9"), ("0-1", "1"), 100 * MIB),
    ];
    for (file, failure) in [
        (CgroupFile::Cpus, FakeFailure::Busy),
        (CgroupFile::Cpus, FakeFailure::Invalid),
        // The narrowing mems write, after the cpus were moved and recorded.
        (CgroupFile::Mems, FakeFailure::NoSpace),
    ] {
        let mut fake = fake_of(&cgs);
        let nth = if file == CgroupFile::Mems { 2 } else { 1 };
        fake.fail_cgroup_write("b", file, nth, failure);
        let w = SharedFake::new(fake);
        let (_dir, d) = daemon(3, 1024);
        let mut a = Applier::new(d.clone(), w.factory());
        a.submit(io, &moves, 1000, false);
        let done = a.finish();
        assert_eq!(done.applied, 2, "{file:?} {failure:?}: {done:?}");
        assert_eq!(done.failed.len(), 1);
        assert_eq!(done.failed[0].0, "b");
        let f = w.fake.lock().unwrap();
        assert_eq!(
            (f.cpus("b"), f.mems("b")),
            (Some(&set("4-7")), Some(&set("0-1"))),
            "{file:?}: b rolled back"
        );
        assert_eq!(
            (f.cpus("a"), f.mems("a")),
            (Some(&set("0-1")), Some(&set("0")))
        );
        assert_eq!(
            (f.cpus("c"), f.mems("c")),
            (Some(&set("8-9")), Some(&set("1")))
        );
        check_history(&cgs, &f, &[]);
        let s = d.lock(io);
        assert_eq!(s.state.controller.failed_moves_total, 1);
        assert_eq!(s.state.controller.moves_total, 2);
    }
}

/// CPUs change hands in plan order: y takes the CPUs x gives up only once x is done, and not
/// at all when x failed (the two would overlap); z, independent, goes on.
#[test]
fn cpus_given_up_are_taken_only_once_free() {
    let io = &mut crate::daemon::Io::new();
    let cgs = [("x", "0-1", "0"), ("y", "4-5", "1"), ("z", "6-7", "1")];
    let moves = [
        mv("x", ("0-1", "2-3"), ("0", "0"), 0),
        mv("y", ("4-5", "0-1"), ("1", "0"), 10 * MIB),
        mv("z", ("6-7", "6-7"), ("1", "0"), 10 * MIB),
    ];
    for threads in [1, 3] {
        let w = SharedFake::new(fake_of(&cgs));
        let (_dir, d) = daemon(threads, 1024);
        let mut a = Applier::new(d.clone(), w.factory());
        a.submit(io, &moves, 1000, false);
        assert_eq!(a.finish().applied, 3);
        check_history(&cgs, &w.fake.lock().unwrap(), &["x", "y", "z"]);

        let mut fake = fake_of(&cgs);
        fake.fail_cgroup_write("x", CgroupFile::Cpus, 1, FakeFailure::Busy);
        let w = SharedFake::new(fake);
        let (_dir, d) = daemon(threads, 1024);
        let mut a = Applier::new(d.clone(), w.factory());
        a.submit(io, &moves, 1000, false);
        let done = a.finish();
        assert_eq!(done.applied, 1, "only z: {done:?}");
        assert_eq!(done.failed, vec![("x".to_string(), "busy")]);
        let f = w.fake.lock().unwrap();
        assert_eq!(f.cpus("y"), Some(&set("4-5")), "y untouched");
        assert_eq!(f.mems("z"), Some(&set("0")), "z moved");
        check_history(&cgs, &f, &["x", "y", "z"]);
    }
}

/// A stop while moves migrate: the moves under way finish (no half-applied move), the ones
/// not started are not applied.
#[test]
fn a_stop_starts_no_further_move() {
    let io = &mut crate::daemon::Io::new();
    let names = ["m0", "m1", "m2", "m3", "m4"];
    let cgs: Vec<(&str, &str, &str)> = names.iter().map(|n| (*n, "0-3", "0-1")).collect();
    let mut fake = fake_of(&cgs);
    for n in names {
        fake.set_memory(n, &[(0, 10 * MIB), (1, 10 * MIB)]);
    }
    let gate = Gate::new(usize::MAX);
    let w = SharedFake {
        gate: Some(gate.clone()),
        ..SharedFake::new(fake)
    };
    let moves: Vec<Move> = names
        .iter()
        .map(|n| mv(n, ("0-3", "0-3"), ("0-1", "1"), 10 * MIB))
        .collect();
    let (_dir, d) = daemon(2, 1024);
    let mut a = Applier::new(d.clone(), w.factory());
    assert_eq!(a.submit(io, &moves, 1000, false).queued, 5);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while gate.arrived() < 2 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(gate.arrived(), 2);
    d.request_stop();
    // The writers see the stop within their poll, then the two under way finish.
    std::thread::sleep(Duration::from_millis(500));
    gate.open();
    let done = a.finish();
    assert_eq!(done.applied, 2, "{done:?}");
    let f = w.fake.lock().unwrap();
    let moved = names
        .iter()
        .filter(|n| f.mems(n) == Some(&set("1")))
        .count();
    let untouched = names
        .iter()
        .filter(|n| f.mems(n) == Some(&set("0-1")) && f.memory(n).unwrap().len() == 2)
        .count();
    assert_eq!((moved, untouched), (2, 3));
}

/// The operator re-pins a cgroup while its move migrates (vm-bench's shift landed exactly
/// there): the move is abandoned (stale) before its mems are narrowed, its mems are rolled
/// back, and the operator's cpus stay — never overwritten by the move's undo.
#[test]
fn an_operators_pin_during_a_migration_is_kept() {
    let io = &mut Io::new();
    struct Meddler {
        w: SharedFake,
        pin: (String, CpuSet),
    }
    impl CgroupWriter for Meddler {
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
            // The operator's write lands while the pages move.
            let (c, cpus) = &self.pin;
            self.w.fake.lock().unwrap().write_cpus(io, c, cpus).unwrap();
            self.w.move_pages(io, cg, to, max)
        }
    }
    for (what, cpus) in [
        ("keeps its cpus", ("2-3", "2-3")),
        ("moves its cpus", ("2-3", "0-1")),
    ] {
        let mut fake = fake_of(&[("w2", cpus.0, "0-1")]);
        fake.set_memory("w2", &[(1, 10 * MIB)]);
        let w = SharedFake::new(fake);
        let m = mv("w2", cpus, ("0-1", "0"), 10 * MIB);
        let (_dir, d) = daemon(2, 1024);
        let factory: WriterFactory = {
            let w = w.clone();
            Arc::new(move || {
                Box::new(Meddler {
                    w: w.clone(),
                    pin: ("w2".into(), set("1")),
                })
            })
        };
        // The writer's own page moves, which a move alone would leave to the kernel's mems
        // write (`a_move_alone_migrates_through_the_kernel`).
        let mut a = Applier::new(d.clone(), factory).premigrate_alone();
        a.submit(io, &[m], 1000, false);
        let done = a.finish();
        assert_eq!(done.failed, vec![("w2".to_string(), "stale")], "{what}");
        let f = w.fake.lock().unwrap();
        assert_eq!(
            f.cpus("w2"),
            Some(&set("1")),
            "{what}: the operator's pin kept"
        );
        assert_eq!(f.mems("w2"), Some(&set("0-1")), "{what}: mems rolled back");
        assert!(
            !f.writes()
                .iter()
                .any(|wr| wr.file == CgroupFile::Mems && wr.value == "0"),
            "{what}: mems never narrowed toward the abandoned target: {:?}",
            f.writes()
        );
    }
    // The container is bound and exclusive; the books moved to the move's cpus
    // when it began, and follow the operator's pin when it is abandoned (they would
    // otherwise reserve CPUs it left, and hand out the one it runs on).
    let (_dir, d) = daemon(2, 1024);
    let placed = {
        let mut s = d.lock(io);
        let sh = &mut *s;
        let p = crate::placement::admission::Pod {
            uid: "p".into(),
            containers: vec![crate::placement::admission::Container {
                name: "c".into(),
                cpu_request_millis: 1000,
                cpu_limit_millis: 1000,
                memory_bytes: MIB,
                memory_limit_bytes: MIB,
                ..Default::default()
            }],
            init_containers: vec![],
        };
        let got = sh
            .state
            .allocator
            .admit(&sh.topo, &sh.cfg.placement, &p)
            .unwrap();
        sh.state.bindings.insert(
            "w2".into(),
            super::Binding {
                pod_uid: "p".into(),
                container: "c".into(),
            },
        );
        got[0].clone()
    };
    assert!(placed.exclusive);
    let from = placed.cpus.to_string();
    let mut fake = fake_of(&[("w2", &from, &placed.mems.to_string())]);
    fake.set_memory("w2", &[(0, 10 * MIB)]);
    let w = SharedFake::new(fake);
    let factory: WriterFactory = {
        let w = w.clone();
        Arc::new(move || {
            Box::new(Meddler {
                w: w.clone(),
                pin: ("w2".into(), set("6")),
            })
        })
    };
    let m = mv(
        "w2",
        (&from, "5"),
        (&placed.mems.to_string(), "1"),
        10 * MIB,
    );
    let mut a = Applier::new(d.clone(), factory).premigrate_alone();
    a.submit(io, &[m], 1000, false);
    let done = a.finish();
    assert_eq!(done.failed, vec![("w2".to_string(), "stale")]);
    assert_eq!(w.fake.lock().unwrap().cpus("w2"), Some(&set("6")));
    let s = d.lock(io);
    assert_eq!(
        s.state.allocator.current_cpus("p", "c"),
        Some(set("6")),
        "the books follow the operator's cpus"
    );
    assert!(
        !s.state.allocator.exclusive_cpus().contains(5),
        "5 not reserved"
    );
}

/// A move that runs alone (nothing else queued or under way) goes through the kernel's
/// narrowing mems write, not the writer's own page moves: in vm-bench's guest the kernel's
/// migration was the faster path for one cgroup; the writers move pages themselves only when
/// several moves run at once (`moves_of_a_round_migrate_at_the_same_time`).
#[test]
fn a_move_alone_migrates_through_the_kernel() {
    let io = &mut crate::daemon::Io::new();
    let mut fake = fake_of(&[("a", "0-3", "0-1")]);
    fake.set_memory("a", &[(0, 100 * MIB), (1, 100 * MIB)]);
    let gate = Gate::new(usize::MAX);
    let w = SharedFake {
        gate: Some(gate.clone()),
        ..SharedFake::new(fake)
    };
    let (_dir, d) = daemon(4, 1024);
    // At the workloads' priority (0), a lone move goes by its mems write.
    d.lock(io).cfg.controller.apply_nice = 0;
    let mut a = Applier::new(d.clone(), w.factory());
    a.submit(
        io,
        &[mv("a", ("0-3", "0-3"), ("0-1", "1"), 100 * MIB)],
        1000,
        false,
    );
    assert_eq!(a.finish().applied, 1);
    assert_eq!(gate.arrived(), 0, "no page moves of the writer's own");
    let f = w.fake.lock().unwrap();
    assert_eq!(f.mems("a"), Some(&set("1")));
    assert_eq!(
        f.memory("a").unwrap().keys().copied().collect::<Vec<_>>(),
        vec![1],
        "migrated by the mems write"
    );
}

/// A dry run writes nothing from any thread, and moves no page.
#[test]
fn a_concurrent_dry_run_writes_nothing() {
    let io = &mut crate::daemon::Io::new();
    let cgs = [("a", "0-3", "0-1"), ("b", "4-7", "0-1")];
    let mut fake = fake_of(&cgs);
    fake.set_memory("a", &[(1, 10 * MIB)]);
    let w = SharedFake::new(fake);
    let moves = [
        mv("a", ("0-3", "0-1"), ("0-1", "0"), 10 * MIB),
        mv("b", ("4-7", "4-5"), ("0-1", "1"), 10 * MIB),
    ];
    let (_dir, d) = daemon(2, 1024);
    let mut a = Applier::new(d.clone(), w.factory());
    a.submit(io, &moves, 1000, true);
    assert_eq!(a.finish().applied, 2);
    let f = w.fake.lock().unwrap();
    assert!(f.writes().is_empty());
    assert_eq!(f.migrated(), 0);
    assert_eq!(
        d.lock(io).state.controller.moves_total,
        0,
        "nothing recorded"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random rounds of moves (random sizes, targets, injected failures of any write) on 1–4
    /// threads, two rounds submitted back to back: the bytes applied never pass the budget,
    /// every applied move is where it was planned, every other one where it was (rolled back
    /// or untouched), and no write ever left a cgroup with an empty set.
    #[test]
    fn budget_and_rollback_hold_with_concurrent_writers(
        threads in 1u32..=4,
        budget_mib in 100u64..=1000,
        plan in proptest::collection::vec(
            (0u32..4, 0u32..4, 1u64..=400, proptest::option::of((0usize..3, 0usize..4))),
            1..10,
        ),
    ) {
        let io = &mut crate::daemon::Io::new();
        let mut cgs = Vec::new();
        let mut moves = Vec::new();
        let mut fake = FakeCgroups::v2();
        let names: Vec<String> = (0..plan.len()).map(|i| format!("g{i}")).collect();
        for (i, &(cpu_node, mem_node, mib, fail)) in plan.iter().enumerate() {
            let from = format!("{}-{}", 4 * (i % 4), 4 * (i % 4) + 3);
            let to = format!("{}-{}", 4 * cpu_node, 4 * cpu_node + 1);
            fake.insert(&names[i], &from, "0-3");
            fake.set_memory(&names[i], &[(mem_node, mib * MIB), ((mem_node + 1) % 4, mib * MIB)]);
            // The first write of a file fails (a later one would be the rollback's own, whose
            // failure keeps the new cpus by design: see `apply::undo_cpus`).
            if let Some((file, kind)) = fail {
                let (file, nth) = [(CgroupFile::Cpus, 1), (CgroupFile::Mems, 1), (CgroupFile::Mems, 1)][file];
                let kind = [FakeFailure::Busy, FakeFailure::Invalid, FakeFailure::NoSpace, FakeFailure::Permission][kind];
                fake.fail_cgroup_write(&names[i], file, nth, kind);
            }
            cgs.push((names[i].clone(), from.clone()));
            moves.push(Move {
                cgroup: names[i].clone(),
                from_cpus: set(&from),
                to_cpus: set(&to),
                from_mems: set("0-3"),
                to_mems: CpuSet::from_iter([mem_node]),
                bytes_to_migrate: mib * MIB,
                reason: Trigger::PoorLocality,
                locality_before: 0.5,
                locality_after: 1.0,
                net: 1.0,
                stage: None,
            });
        }
        let w = SharedFake::new(fake);
        let (_dir, d) = daemon(threads, budget_mib);
        let mut a = Applier::new(d.clone(), w.factory());
        let half = moves.len() / 2;
        let s1 = a.submit(io, &moves[..half], 1000, false);
        let s2 = a.submit(io, &moves[half..], 2000, false);
        prop_assert_eq!(s1.queued + s1.over_budget + s2.queued + s2.over_budget, moves.len());
        let done = a.finish();
        prop_assert!(done.bytes <= budget_mib * MIB, "{} > budget: {:?}", done.bytes, done);
        let f = w.fake.lock().unwrap();
        let mut applied = 0;
        for (m, (_, from)) in moves.iter().zip(&cgs) {
            let now = (f.cpus(&m.cgroup).cloned(), f.mems(&m.cgroup).cloned());
            if now == (Some(m.to_cpus.clone()), Some(m.to_mems.clone())) {
                applied += 1;
            } else {
                prop_assert_eq!(now, (Some(set(from)), Some(set("0-3"))), "{} neither moved nor restored", m.cgroup);
            }
        }
        prop_assert_eq!(applied, done.applied);
        let initial: Vec<(&str, &str, &str)> = cgs.iter().map(|(c, from)| (c.as_str(), from.as_str(), "0-3")).collect();
        check_history(&initial, &f, &[]);
    }
}

/// The writer threads pass the writer's `settle` through (NRI mode: the runtime applies the
/// writes later, and a move is read back only once it answered): every applied move of a
/// writer thread was settled.
#[test]
fn writer_threads_settle_each_move_before_it_is_read_back() {
    let io = &mut Io::new();
    struct Settling {
        w: SharedFake,
        settled: Arc<Mutex<Vec<String>>>,
    }
    impl CgroupWriter for Settling {
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
            self.w.move_pages(io, cg, to, max)
        }
        fn settle(&mut self, _io: &Io, cg: &str) -> Result<(), CgroupWriteError> {
            self.settled.lock().unwrap().push(cg.to_string());
            Ok(())
        }
    }
    let cgs = [("a", "0-3", "0-1"), ("b", "4-7", "0-1")];
    let w = SharedFake::new(fake_of(&cgs));
    let settled = Arc::new(Mutex::new(Vec::new()));
    let factory: WriterFactory = {
        let (w, settled) = (w.clone(), settled.clone());
        Arc::new(move || {
            Box::new(Settling {
                w: w.clone(),
                settled: settled.clone(),
            })
        })
    };
    let (_dir, d) = daemon(2, 1024);
    let mut a = Applier::new(d.clone(), factory);
    a.submit(
        io,
        &[
            mv("a", ("0-3", "0-1"), ("0-1", "0"), 0),
            mv("b", ("4-7", "4-5"), ("0-1", "1"), 0),
        ],
        1000,
        false,
    );
    assert_eq!(a.finish().applied, 2);
    let mut s = settled.lock().unwrap().clone();
    s.sort();
    s.dedup();
    assert_eq!(s, vec!["a".to_string(), "b".to_string()]);
}

/// The writer threads migrate at `controller.apply_nice`; ahead of the workloads (a negative
/// value) a writer moves even a lone move's pages itself (the kernel's worker for a narrowing
/// mems write runs at the normal priority); at 0 or above a lone move goes by its mems write.
/// Without the privilege for a negative value the move is applied all the same, at the
/// daemon's priority.
#[test]
fn writers_migrate_at_their_nice_value() {
    let io = &mut crate::daemon::Io::new();
    let lone = |io: &mut Io, nice: i32| {
        let cgs = [("a", "0-3", "0-1")];
        let mut fake = fake_of(&cgs);
        fake.set_memory("a", &[(0, 100 * MIB), (1, 100 * MIB)]);
        let w = SharedFake::new(fake);
        let (_dir, d) = daemon(4, 1024);
        d.lock(io).cfg.controller.apply_nice = nice;
        let mut a = Applier::new(d.clone(), w.factory());
        let moves = [mv("a", ("0-3", "0-3"), ("0-1", "0"), 100 * MIB)];
        assert_eq!(a.submit(io, &moves, 1000, false).queued, 1);
        let done = a.wait();
        assert_eq!(done.applied, 1, "{done:?}");
        let f = w.fake.lock().unwrap();
        assert_eq!(f.mems("a"), Some(&set("0")));
        check_history(&cgs, &f, &[]);
        let calls = *w.calls.lock().unwrap();
        let nices = w.nices.lock().unwrap().clone();
        (calls.1, nices)
    };
    // Any thread may lower its own priority.
    let (migrate_calls, nices) = lone(io, 7);
    assert_eq!(
        migrate_calls, 0,
        "alone at nice 7: the narrowing mems write migrates"
    );
    assert!(
        !nices.is_empty() && nices.iter().all(|&n| n == 7),
        "{nices:?}"
    );
    let (migrate_calls, nices) = lone(io, -3);
    assert!(
        migrate_calls >= 1,
        "ahead of the workloads the writer moves the pages itself"
    );
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } == 0 {
        assert!(nices.iter().all(|&n| n == -3), "{nices:?}");
    } else {
        eprintln!("not root: nice -3 refused, the move applied at the daemon's priority");
        assert!(nices.iter().all(|&n| n >= 0), "{nices:?}");
    }
}

/// In the guest, after a writer moved a workload's pages, what was left
/// off the target was pages other processes map (the binary's text), and the narrowing mems
/// write migrated them MOVE_ALL for 8–32 s, stalling every process that maps them and every
/// other cgroup's cpuset write. When that is all that is left (at most a sixteenth of the
/// move), mems stay widened; otherwise, or for a container the allocator has bound (its books
/// hold its mems), or when it is not known, the narrowing write runs as before.
#[test]
fn pages_only_others_map_are_left_where_they_are() {
    let io = &mut crate::daemon::Io::new();
    // 250 MiB to move of the 256 planned: the walk ends with a call that finds nothing more
    // (all 256 would end it on the planned bytes: the same).
    let run_from =
        |io: &mut Io, from_mems: &str, left: Option<u64>, bound: bool, trickle: Option<u64>| {
            let mut fake = fake_of(&[("w", "0-3", from_mems)]);
            fake.set_memory("w", &[(0, 250 * MIB)]);
            let w = SharedFake {
                left,
                trickle,
                ..SharedFake::new(fake)
            };
            let (_dir, d) = daemon(2, 1024);
            if bound {
                d.lock(io).state.bindings.insert(
                    "w".into(),
                    crate::daemon::Binding {
                        pod_uid: "uid".into(),
                        container: "c".into(),
                    },
                );
            }
            let mut a = Applier::new(d.clone(), w.factory()).premigrate_alone();
            a.submit(
                io,
                &[mv("w", ("0-3", "4-7"), (from_mems, "1"), 256 * MIB)],
                1000,
                false,
            );
            assert_eq!(a.wait().applied, 1);
            let f = w.fake.lock().unwrap();
            assert_eq!(f.cpus("w"), Some(&set("4-7")));
            let on: Vec<u32> = f.memory("w").unwrap().keys().copied().collect();
            assert_eq!(on, [1], "its pages moved in every case");
            let mems_writes = f
                .writes()
                .iter()
                .filter(|x| x.file == CgroupFile::Mems)
                .count();
            let st = d.lock(io).state.controller.clone();
            assert_eq!(st.moves_total, 1);
            assert_eq!(st.cgroups["w"].last_cpus, Some(set("4-7")));
            let mems = f.mems("w").cloned().unwrap();
            assert_eq!(
                st.cgroups["w"].wide_of,
                (mems != set("1")).then(|| (mems.clone(), set("1"))),
                "the target is kept exactly when mems were left wide"
            );
            let wide = mems != set("1");
            assert_eq!(d.metrics.moves_mems_left_wide.get(), u64::from(wide));
            // Left wide: what its page moves reported; narrowed: the planned figure (the mems
            // write migrated the rest, how much is not known).
            assert_eq!(
                st.bytes_migrated_total,
                if wide { 250 * MIB } else { 256 * MIB }
            );
            (mems, mems_writes)
        };
    let run = |io: &mut Io, left, bound| run_from(io, "0-1", left, bound, None);
    assert_eq!(
        run(io, Some(MIB), false),
        (set("0-1"), 0),
        "1 MiB of shared pages left: no narrowing write"
    );
    assert_eq!(run(io, None, false), (set("1"), 1), "not known: narrowed");
    assert_eq!(
        run(io, Some(0), false),
        (set("0-1"), 0),
        "nothing charged left: shared pages charged elsewhere may still be mapped"
    );
    assert_eq!(
        run(io, Some(17 * MIB), false),
        (set("1"), 1),
        "more than a sixteenth left"
    );
    assert_eq!(
        run(io, Some(MIB), true),
        (set("1"), 1),
        "bound: its books hold its mems"
    );
    // Its mems did not hold the target (widened to 0-1 for the move): narrowed, no node left
    // open that no one chose.
    assert_eq!(run_from(io, "0", Some(MIB), false, None), (set("1"), 2));
    // The walk cut short by a trickle (1 MiB a call of 16 asked): what is left may be its own.
    assert_eq!(
        run_from(io, "0-1", Some(MIB), false, Some(MIB)),
        (set("1"), 1)
    );
}

/// A move whose mems were to be left wide but whose finish failed (here: putting v1's
/// memory_migrate back) is rolled back like any other: not counted as left wide, no target
/// kept for the planner, no move recorded.
#[test]
fn a_move_left_wide_that_fails_to_finish_is_a_failed_move() {
    let io = &mut crate::daemon::Io::new();
    let mut fake = FakeCgroups::v1().with("w", "0-3", "0-1");
    fake.set_memory("w", &[(0, 250 * MIB)]);
    fake.fail_write(CgroupFile::MemoryMigrate, 2, FakeFailure::Busy);
    let w = SharedFake {
        left: Some(MIB),
        ..SharedFake::new(fake)
    };
    let (_dir, d) = daemon(2, 1024);
    let mut a = Applier::new(d.clone(), w.factory()).premigrate_alone();
    a.submit(
        io,
        &[mv("w", ("0-3", "4-7"), ("0-1", "1"), 256 * MIB)],
        1000,
        false,
    );
    let done = a.wait();
    assert_eq!(done.applied, 0);
    assert_eq!(done.failed.len(), 1, "{:?}", done.failed);
    let f = w.fake.lock().unwrap();
    assert_eq!(f.mems("w"), Some(&set("0-1")));
    let memory_migrate_writes = f
        .writes()
        .iter()
        .filter(|x| x.file == CgroupFile::MemoryMigrate)
        .count();
    assert!(memory_migrate_writes >= 2, "the finish was tried");
    assert!(
        !f.writes().iter().any(|x| x.file == CgroupFile::Mems),
        "no mems write: the move was on its wide path"
    );
    let st = d.lock(io).state.controller.clone();
    assert_eq!(st.moves_total, 0);
    assert_eq!(st.failed_moves_total, 1);
    assert_eq!(st.cgroups["w"].wide_of, None);
    assert_eq!(d.metrics.moves_mems_left_wide.get(), 0);
}

//! Concurrent application of a round's moves on the fake: budget, exclusivity, rollback.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::actuator::{CgroupFile, CgroupWriteError, CgroupWriter};
use super::concurrent::{apply_concurrently, MoveOutcome};
use super::fake::{FakeCgroups, FakeFailure};
use super::plan_types::{Move, Trigger};
use crate::cpuset::CpuSet;

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

/// Writers arriving at their page moves (the migration) wait there until
/// `want` of them are inside at once, or `timeout` passes; `reached` says whether they met.
struct Rendezvous {
    want: usize,
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl Rendezvous {
    fn new(want: usize) -> Arc<Self> {
        Arc::new(Rendezvous {
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
        // Generous: on a loaded machine threads start late; the sequential loop never meets.
        let _ = self
            .cv
            .wait_timeout_while(g, Duration::from_secs(20), |s| !s.1)
            .unwrap();
    }

    fn reached(&self) -> bool {
        self.state.lock().unwrap().1
    }
}

/// One writer of several threads over one fake (locked per call, as cgroupfs serialises each
/// file write), with an optional rendezvous before migrating writes.
#[derive(Clone)]
struct Shared {
    fake: Arc<Mutex<FakeCgroups>>,
    gate: Option<Arc<Rendezvous>>,
}

impl CgroupWriter for Shared {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        self.fake.lock().unwrap().read_cpus(cg)
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        self.fake.lock().unwrap().read_mems(cg)
    }
    fn write_cpus(&mut self, cg: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError> {
        self.fake.lock().unwrap().write_cpus(cg, cpus)
    }
    fn write_mems(&mut self, cg: &str, mems: &CpuSet) -> Result<(), CgroupWriteError> {
        self.fake.lock().unwrap().write_mems(cg, mems)
    }
    fn needs_memory_migrate(&self) -> bool {
        self.fake.lock().unwrap().needs_memory_migrate()
    }
    fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
        self.fake.lock().unwrap().read_memory_migrate(cg)
    }
    fn set_memory_migrate(&mut self, cg: &str, on: bool) -> Result<(), CgroupWriteError> {
        self.fake.lock().unwrap().set_memory_migrate(cg, on)
    }
    fn move_pages(&mut self, cg: &str, to: &CpuSet, max: u64) -> Result<u64, CgroupWriteError> {
        if let Some(g) = &self.gate {
            g.arrive();
        }
        self.fake.lock().unwrap().move_pages(cg, to, max)
    }
}

fn shared(fake: FakeCgroups, gate: Option<Arc<Rendezvous>>) -> Shared {
    Shared {
        fake: Arc::new(Mutex::new(fake)),
        gate,
    }
}

/// Replays the fake's history from `initial` and checks after every write: no empty cpuset,
/// and the `exclusive` cgroups' CPUs pairwise disjoint.
fn check_history(initial: &[(&str, &str, &str)], fake: &FakeCgroups, exclusive: &[&str]) {
    let mut now: std::collections::BTreeMap<String, (CpuSet, CpuSet)> = initial
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
                    "write {k}: exclusive {a} {} and {b} {} overlap",
                    now[*a].0,
                    now[*b].0
                );
            }
        }
    }
}

fn applied(o: &[MoveOutcome]) -> Vec<usize> {
    (0..o.len())
        .filter(|&i| matches!(o[i], MoveOutcome::Applied(_)))
        .collect()
}

fn fake_of(cgs: &[(&str, &str, &str)]) -> FakeCgroups {
    cgs.iter().fold(FakeCgroups::v2(), |f, (c, cpus, mems)| {
        f.with(c, cpus, mems)
    })
}

/// Four moves whose memory migrates: all four writers are moving their pages at once (a
/// sequential loop would never meet the rendezvous), every move lands with all its memory on
/// the target, within budget.
#[test]
fn moves_of_a_round_migrate_at_the_same_time() {
    let cgs = [
        ("a", "0-3", "0-1"),
        ("b", "0-3", "0-1"),
        ("c", "4-7", "0-1"),
        ("d", "4-7", "0-1"),
    ];
    let gate = Rendezvous::new(4);
    let mut fake = fake_of(&cgs);
    for (c, _, _) in &cgs {
        fake.set_memory(c, &[(0, 100 * MIB), (1, 100 * MIB)]);
    }
    let w = shared(fake, Some(gate.clone()));
    let moves = [
        mv("a", ("0-3", "0-3"), ("0-1", "0"), 200 * MIB),
        mv("b", ("0-3", "0-3"), ("0-1", "0"), 200 * MIB),
        mv("c", ("4-7", "4-7"), ("0-1", "1"), 200 * MIB),
        mv("d", ("4-7", "4-7"), ("0-1", "1"), 200 * MIB),
    ];
    let out = apply_concurrently(&moves, || w.clone(), 4, 1024 * MIB, false);
    assert!(gate.reached(), "the four migrating writes never overlapped");
    assert_eq!(applied(&out), vec![0, 1, 2, 3], "{out:?}");
    let f = w.fake.lock().unwrap();
    for m in &moves {
        assert_eq!(f.mems(&m.cgroup), Some(&m.to_mems));
        let on: Vec<u32> = f.memory(&m.cgroup).unwrap().keys().copied().collect();
        assert_eq!(on, m.to_mems.iter().collect::<Vec<_>>(), "{}", m.cgroup);
    }
    // Moved by the writers' page moves (100 MiB each), not by the mems writes: the same total.
    assert_eq!(f.migrated(), 4 * 100 * MIB);
    check_history(&cgs, &f, &[]);
}

/// The budget holds whatever the interleaving: a move starts only if the bytes applied or
/// under way plus its own fit; a failed move's bytes are given back.
#[test]
fn budget_holds_with_concurrent_writers() {
    let names = ["m0", "m1", "m2", "m3", "m4", "m5"];
    let cgs: Vec<(&str, &str, &str)> = names.iter().map(|n| (*n, "0-3", "0-1")).collect();
    let moves: Vec<Move> = names
        .iter()
        .map(|n| mv(n, ("0-3", "0-3"), ("0-1", "0"), 300 * MIB))
        .collect();
    let budget = 1024 * MIB;
    for threads in [1, 2, 4, 6] {
        for fail in [None, Some("m1")] {
            let mut fake = fake_of(&cgs);
            if let Some(f) = fail {
                fake.fail_cgroup_write(f, CgroupFile::Mems, 1, FakeFailure::Busy);
            }
            let w = shared(fake, None);
            let out = apply_concurrently(&moves, || w.clone(), threads, budget, false);
            let ok = applied(&out);
            let bytes: u64 = ok.iter().map(|&i| moves[i].bytes_to_migrate).sum();
            assert!(
                bytes <= budget,
                "threads {threads}: {bytes} > {budget}: {out:?}"
            );
            let f = w.fake.lock().unwrap();
            for (i, o) in out.iter().enumerate() {
                let m = &moves[i];
                match o {
                    MoveOutcome::Applied(_) => assert_eq!(f.mems(&m.cgroup), Some(&m.to_mems)),
                    MoveOutcome::Failed(_) => {
                        assert_eq!(Some(m.cgroup.as_str()), fail);
                        assert_eq!(f.mems(&m.cgroup), Some(&m.from_mems), "rolled back");
                    }
                    MoveOutcome::OverBudget => {
                        assert_eq!(f.mems(&m.cgroup), Some(&m.from_mems), "untouched")
                    }
                    MoveOutcome::Blocked { .. } => panic!("no dependency here: {o:?}"),
                }
            }
            // Three fit; with m1 failing, one more may take its place (always with one thread,
            // as the sequential loop does).
            match (fail, threads) {
                (None, _) => assert_eq!(ok, vec![0, 1, 2], "threads {threads}"),
                (Some(_), 1) => assert_eq!(ok, vec![0, 2, 3]),
                // Which later move gets m1's bytes depends on when m1's failure is seen.
                (Some(_), _) => assert!(
                    ok.starts_with(&[0, 2]) && (2..=3).contains(&ok.len()),
                    "{ok:?}"
                ),
            }
            check_history(&cgs, &f, &[]);
        }
    }
}

/// A failing writer rolls back only its own move: the other cgroups keep their new cpusets.
#[test]
fn a_failing_writer_rolls_back_only_its_own_move() {
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
    for failure in [
        FakeFailure::Busy,
        FakeFailure::Invalid,
        FakeFailure::NoSpace,
    ] {
        let mut fake = fake_of(&cgs);
        // b's cpus write fails after its mems were widened to 0-2: the rollback restores both.
        fake.fail_cgroup_write("b", CgroupFile::Cpus, 1, failure);
        let w = shared(fake, None);
        let out = apply_concurrently(&moves, || w.clone(), 3, 1024 * MIB, false);
        assert_eq!(applied(&out), vec![0, 2], "{out:?}");
        assert!(matches!(out[1], MoveOutcome::Failed(_)), "{out:?}");
        let f = w.fake.lock().unwrap();
        assert_eq!(
            (f.cpus("b"), f.mems("b")),
            (Some(&set("4-7")), Some(&set("0-1")))
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
    }
}

/// Exclusive CPUs change hands in plan order: the move that takes CPUs another move gives up
/// waits for it, and is not made when that move failed (it would overlap).
#[test]
fn cpus_given_up_are_taken_only_after_they_are_free() {
    let cgs = [("x", "0-1", "0"), ("y", "4-5", "1"), ("z", "6-7", "1")];
    // x leaves 0-1 for 2-3; y takes 0-1 (after x); z is independent.
    let moves = [
        mv("x", ("0-1", "2-3"), ("0", "0"), 0),
        mv("y", ("4-5", "0-1"), ("1", "0"), 10 * MIB),
        mv("z", ("6-7", "6-7"), ("1", "0"), 10 * MIB),
    ];
    for threads in [1, 3] {
        let w = shared(fake_of(&cgs), None);
        let out = apply_concurrently(&moves, || w.clone(), threads, 1024 * MIB, false);
        assert_eq!(applied(&out), vec![0, 1, 2], "{out:?}");
        check_history(&cgs, &w.fake.lock().unwrap(), &["x", "y", "z"]);

        let mut fake = fake_of(&cgs);
        fake.fail_cgroup_write("x", CgroupFile::Cpus, 1, FakeFailure::Busy);
        let w = shared(fake, None);
        let out = apply_concurrently(&moves, || w.clone(), threads, 1024 * MIB, false);
        assert!(matches!(out[0], MoveOutcome::Failed(_)), "{out:?}");
        assert!(
            matches!(&out[1], MoveOutcome::Blocked { on } if on == "x"),
            "{out:?}"
        );
        assert!(matches!(out[2], MoveOutcome::Applied(_)), "{out:?}");
        let f = w.fake.lock().unwrap();
        assert_eq!(f.cpus("y"), Some(&set("4-5")), "y untouched");
        check_history(&cgs, &f, &["x", "y", "z"]);
    }
}

/// A dry run writes nothing from any thread.
#[test]
fn a_concurrent_dry_run_writes_nothing() {
    let cgs = [("a", "0-3", "0-1"), ("b", "4-7", "0-1")];
    let moves = [
        mv("a", ("0-3", "0-1"), ("0-1", "0"), 100 * MIB),
        mv("b", ("4-7", "4-5"), ("0-1", "1"), 100 * MIB),
    ];
    let w = shared(fake_of(&cgs), None);
    let out = apply_concurrently(&moves, || w.clone(), 2, 1024 * MIB, true);
    assert_eq!(applied(&out), vec![0, 1]);
    assert!(w.fake.lock().unwrap().writes().is_empty());
}

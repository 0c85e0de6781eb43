//! Actuator tests on `FakeCgroups`: write order, rollback on every injected failure, dry-run
//! writes nothing, vanished and stale cgroups give clean errors, empty sets are refused.

use super::actuator::{apply, ApplyError, CgroupFile, Step};
use super::fake::{FakeCgroups, FakeFailure};
use super::plan_types::{Move, Trigger};
use crate::cpuset::CpuSet;
use crate::daemon::Io;

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

fn mv(from_cpus: &str, to_cpus: &str, from_mems: &str, to_mems: &str) -> Move {
    Move {
        cgroup: "pod/c".into(),
        from_cpus: set(from_cpus),
        to_cpus: set(to_cpus),
        from_mems: set(from_mems),
        to_mems: set(to_mems),
        bytes_to_migrate: 0,
        reason: Trigger::PoorLocality,
        locality_before: 0.0,
        locality_after: 1.0,
        net: 1.0,
        stage: None,
    }
}

fn writes(f: &FakeCgroups) -> Vec<String> {
    f.writes()
        .iter()
        .map(|w| format!("{}={}", w.file, w.value))
        .collect()
}

/// Every state the fake went through kept CPUs and memory nodes.
fn never_empty(f: &FakeCgroups) {
    for (cg, cpus, mems) in f.history() {
        assert!(
            !cpus.is_empty() && !mems.is_empty(),
            "{cg} left with {cpus:?} {mems:?}"
        );
    }
}

fn check(io: &mut Io, v1: bool, m: Move, want: &[&str]) {
    let mut f = FakeCgroups::version(v1);
    f.insert("pod/c", &m.from_cpus.to_string(), &m.from_mems.to_string());
    let a = apply(io, &m, &mut f, false).unwrap();
    assert_eq!(writes(&f), want, "{m:?}");
    assert_eq!(a.steps.len(), want.len());
    assert_eq!(f.cpus("pod/c"), Some(&m.to_cpus));
    assert_eq!(f.mems("pod/c"), Some(&m.to_mems));
    assert_eq!(f.memory_migrate("pod/c"), Some(false));
    never_empty(&f);
}

#[test]
fn writes_in_safe_order() {
    let io = &mut crate::daemon::Io::new();
    check(
        io,
        false,
        mv("0-3", "4-7", "0", "1"),
        &["cpuset.mems=0-1", "cpuset.cpus=4-7", "cpuset.mems=1"],
    );
    check(
        io,
        true,
        mv("0-3", "4-7", "0", "1"),
        &[
            "cpuset.memory_migrate=1",
            "cpuset.mems=0-1",
            "cpuset.cpus=4-7",
            "cpuset.mems=1",
            "cpuset.memory_migrate=0",
        ],
    );
    // CPUs only: mems unchanged, no memory_migrate dance.
    check(
        io,
        true,
        mv("0-3", "4-7", "0-1", "0-1"),
        &["cpuset.cpus=4-7"],
    );
    // Narrowing only (mems already wide): cpus first, then mems.
    check(
        io,
        false,
        mv("0-7", "4-7", "0-1", "1"),
        &["cpuset.cpus=4-7", "cpuset.mems=1"],
    );
    // Widening only.
    check(
        io,
        false,
        mv("0-3", "0-7", "0", "0-1"),
        &["cpuset.mems=0-1", "cpuset.cpus=0-7"],
    );
}

#[test]
fn rollback_restores_on_every_failure() {
    let io = &mut crate::daemon::Io::new();
    let kinds = [
        FakeFailure::Busy,
        FakeFailure::Invalid,
        FakeFailure::NoSpace,
        FakeFailure::Permission,
    ];
    // (file, n-th write of it) — every write of a v1 move.
    let points = [
        (CgroupFile::MemoryMigrate, 1),
        (CgroupFile::Mems, 1),
        (CgroupFile::Cpus, 1),
        (CgroupFile::Mems, 2),
        (CgroupFile::MemoryMigrate, 2),
    ];
    for v1 in [false, true] {
        for &kind in &kinds {
            for &(file, nth) in &points {
                if !v1 && file == CgroupFile::MemoryMigrate {
                    continue;
                }
                let mut f = FakeCgroups::version(v1);
                f.insert("pod/c", "0-3", "0");
                f.fail_write(file, nth, kind);
                let err = apply(io, &mv("0-3", "4-7", "0", "1"), &mut f, false).unwrap_err();
                let at = format!("v1={v1} {kind:?} at {file} #{nth}");
                assert!(matches!(err, ApplyError::Failed { .. }), "{at}: {err}");
                assert_eq!(f.cpus("pod/c"), Some(&set("0-3")), "{at}");
                assert_eq!(f.mems("pod/c"), Some(&set("0")), "{at}");
                assert_eq!(f.memory_migrate("pod/c"), Some(false), "{at}");
                never_empty(&f);
                assert!(err.to_string().contains("rolled back"), "{at}: {err}");
            }
        }
    }
}

#[test]
fn failed_rollback_is_reported() {
    let io = &mut crate::daemon::Io::new();
    let mut f = FakeCgroups::v2().with("pod/c", "0-3", "0");
    f.fail_write(CgroupFile::Cpus, 1, FakeFailure::Busy);
    f.fail_write(CgroupFile::Mems, 2, FakeFailure::Busy); // the rollback's narrowing
    let err = apply(io, &mv("0-3", "4-7", "0", "1"), &mut f, false).unwrap_err();
    assert!(matches!(err, ApplyError::RollbackFailed { .. }), "{err}");
    assert!(err.to_string().contains("cpuset.cpus=4-7"), "{err}");
    // Still never empty: the cgroup keeps the widened mems and its old CPUs.
    assert_eq!(f.cpus("pod/c"), Some(&set("0-3")));
    assert_eq!(f.mems("pod/c"), Some(&set("0-1")));
}

#[test]
fn dry_run_writes_nothing() {
    let io = &mut crate::daemon::Io::new();
    for v1 in [false, true] {
        let mut f = FakeCgroups::version(v1);
        f.insert("pod/c", "0-3", "0");
        let a = apply(io, &mv("0-3", "4-7", "0", "1"), &mut f, true).unwrap();
        assert!(a.dry_run);
        assert_eq!(a.steps.len(), if v1 { 5 } else { 3 });
        assert_eq!(a.steps[a.steps.len() / 2], Step::WriteCpus(set("4-7")));
        assert!(f.writes().is_empty(), "dry run wrote {:?}", f.writes());
        assert_eq!(f.cpus("pod/c"), Some(&set("0-3")));
    }
}

#[test]
fn vanished_cgroup_is_a_clean_error() {
    let io = &mut crate::daemon::Io::new();
    let mut f = FakeCgroups::v2();
    let err = apply(io, &mv("0-3", "4-7", "0", "1"), &mut f, false).unwrap_err();
    assert!(matches!(err, ApplyError::Vanished { .. }), "{err}");
    assert_eq!(err.to_string(), "cgroup pod/c vanished during the move");
    // Vanishing in the middle: no rollback attempted on a cgroup that no longer exists.
    let mut f = FakeCgroups::v2().with("pod/c", "0-3", "0");
    f.fail_write(CgroupFile::Cpus, 1, FakeFailure::Vanished);
    let err = apply(io, &mv("0-3", "4-7", "0", "1"), &mut f, false).unwrap_err();
    assert!(matches!(err, ApplyError::Vanished { .. }), "{err}");
    assert_eq!(writes(&f), ["cpuset.mems=0-1"]);
}

#[test]
fn empty_target_refused_without_a_write() {
    let io = &mut crate::daemon::Io::new();
    for m in [mv("0-3", "", "0", "1"), mv("0-3", "4-7", "0", "")] {
        let mut f = FakeCgroups::v2().with("pod/c", "0-3", "0");
        let err = apply(io, &m, &mut f, false).unwrap_err();
        assert!(matches!(err, ApplyError::EmptyTarget { .. }), "{err}");
        assert!(f.writes().is_empty());
    }
}

#[test]
fn external_change_is_adopted_not_fought() {
    let io = &mut crate::daemon::Io::new();
    let mut f = FakeCgroups::v2().with("pod/c", "8-9", "0");
    let err = apply(io, &mv("0-3", "4-7", "0", "1"), &mut f, false).unwrap_err();
    assert!(
        matches!(
            err,
            ApplyError::Stale {
                file: CgroupFile::Cpus,
                ..
            }
        ),
        "{err}"
    );
    assert!(f.writes().is_empty());
}

#[test]
fn read_back_mismatch_rolls_back() {
    let io = &mut crate::daemon::Io::new();
    let mut f = FakeCgroups::v2().with("pod/c", "0-3", "0");
    f.misreport(CgroupFile::Cpus, set("4-5"));
    // The stale check reads the misreported value too, so plan from it.
    let err = apply(io, &mv("4-5", "4-7", "0", "1"), &mut f, false).unwrap_err();
    assert!(
        matches!(
            err,
            ApplyError::Verify {
                file: CgroupFile::Cpus,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(f.cpus("pod/c"), Some(&set("4-5")));
    assert_eq!(f.mems("pod/c"), Some(&set("0")));
}

/// A stage widens mems (the kernel migrates nothing), moves the CPUs, then moves at most its
/// bytes of pages toward the target; v1 and v2 alike. A dry run moves nothing.
#[test]
fn a_stage_widens_mems_and_moves_only_its_budget_of_pages() {
    let io = &mut crate::daemon::Io::new();
    const MIB: u64 = 1 << 20;
    for v1 in [false, true] {
        let mut f = FakeCgroups::version(v1);
        f.insert("pod/c", "0-3", "0");
        f.set_memory("pod/c", &[(0, 300 * MIB)]);
        let m = Move {
            to_mems: set("0-1"),
            bytes_to_migrate: 100 * MIB,
            stage: Some(crate::controller::Stage {
                toward: set("1"),
                remaining_bytes: 300 * MIB,
            }),
            ..mv("0-3", "4-7", "0", "0-1")
        };
        let dry = apply(io, &m, &mut f, true).unwrap();
        assert_eq!(dry.moved_bytes, 0);
        assert!(dry
            .steps
            .iter()
            .any(|s| matches!(s, Step::MovePages { .. })));
        assert_eq!(f.migrated(), 0, "dry run");
        assert!(f.writes().is_empty(), "dry run");

        let a = apply(io, &m, &mut f, false).unwrap();
        assert_eq!(a.moved_bytes, 100 * MIB);
        assert_eq!(a.pages_error, None);
        assert_eq!(f.migrated(), 100 * MIB, "widening migrated something");
        assert_eq!(
            f.memory("pod/c").unwrap(),
            &std::collections::BTreeMap::from([(0, 200 * MIB), (1, 100 * MIB)])
        );
        assert_eq!(f.cpus("pod/c"), Some(&set("4-7")));
        assert_eq!(f.mems("pod/c"), Some(&set("0-1")));
        never_empty(&f);

        // The last round is a plain move: narrowing mems migrates the rest.
        let last = mv("4-7", "4-7", "0-1", "1");
        apply(io, &last, &mut f, false).unwrap();
        assert_eq!(f.migrated(), 300 * MIB);
        assert_eq!(
            f.memory("pod/c").unwrap(),
            &std::collections::BTreeMap::from([(1, 300 * MIB)])
        );
    }
}

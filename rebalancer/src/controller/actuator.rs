//! The actuator seam: the only path by which the controller changes a cgroup.
//!
//! [`CgroupWriter`] is implemented by the cgroup layer (real cgroupfs, v1 or v2) and by
//! [`super::FakeCgroups`] (tests). [`apply`] carries out one [`Move`] in an order that never
//! leaves the workload without CPUs or memory: (v1: `memory_migrate=1`), widen mems to
//! old ∪ new, move cpus, narrow mems to the target (this migrates the memory), (v1: restore
//! `memory_migrate`); then it reads both sets back. On any failure it rolls back to the
//! previous cpus/mems. A dry run reads but writes nothing. An empty set is never written.
//! A staged move (see [`super::Stage`]) only widens mems, then moves up to its budget of pages
//! through [`CgroupWriter::move_pages`].
//! [`apply`] is [`begin`] (checks and the writes up to cpuset.cpus) then [`finish`] (narrowing
//! mems, read-back, page moves), so a caller can hold a lock over the first half only.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::plan_types::Move;
use crate::{cpuset::CpuSet, daemon::Io};

/// The cgroup files the actuator touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CgroupFile {
    Cpus,
    Mems,
    MemoryMigrate,
    /// The pages of the cgroup's processes (move_pages(2)), not a file.
    Pages,
}

impl fmt::Display for CgroupFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupFile::Cpus => "cpuset.cpus",
            CgroupFile::Mems => "cpuset.mems",
            CgroupFile::MemoryMigrate => "cpuset.memory_migrate",
            CgroupFile::Pages => "pages (move_pages)",
        })
    }
}

/// A failed read or write of one cgroup file, classified by errno.
#[derive(Debug, thiserror::Error)]
pub enum CgroupWriteError {
    #[error("cgroup {cgroup} no longer exists")]
    Vanished { cgroup: String },
    #[error("{file} of {cgroup}: device or resource busy")]
    Busy { cgroup: String, file: CgroupFile },
    #[error("{file} of {cgroup}: value {value:?} rejected as invalid")]
    Invalid {
        cgroup: String,
        file: CgroupFile,
        value: String,
    },
    #[error("{file} of {cgroup}: {value:?} is outside the parent's effective set or offline")]
    NoSpace {
        cgroup: String,
        file: CgroupFile,
        value: String,
    },
    #[error("{file} of {cgroup}: permission denied")]
    Permission { cgroup: String, file: CgroupFile },
    #[error("{file} of {cgroup}")]
    Io {
        cgroup: String,
        file: CgroupFile,
        #[source]
        source: std::io::Error,
    },
}

impl CgroupWriteError {
    /// A short, stable name of the failure (a metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Vanished { .. } => "vanished",
            Self::Busy { .. } => "busy",
            Self::Invalid { .. } => "invalid",
            Self::NoSpace { .. } => "no-space",
            Self::Permission { .. } => "permission",
            Self::Io { .. } => "io",
        }
    }

    /// Classifies an I/O error on `file` of `cgroup` (writing `value`) by its errno.
    pub fn from_io(cgroup: &str, file: CgroupFile, value: &str, err: std::io::Error) -> Self {
        let cgroup = cgroup.to_string();
        match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENODEV) => Self::Vanished { cgroup },
            Some(libc::EBUSY) => Self::Busy { cgroup, file },
            Some(libc::EINVAL) => Self::Invalid {
                cgroup,
                file,
                value: value.to_string(),
            },
            Some(libc::ENOSPC) => Self::NoSpace {
                cgroup,
                file,
                value: value.to_string(),
            },
            Some(libc::EACCES) | Some(libc::EPERM) => Self::Permission { cgroup, file },
            _ => Self::Io {
                cgroup,
                file,
                source: err,
            },
        }
    }
}

/// Reads and writes the cpuset of cgroups named by their path relative to the hierarchy. The
/// writes and page moves take the thread's I/O token ([`Io`]): none runs under the state lock.
pub trait CgroupWriter {
    fn read_cpus(&self, cgroup: &str) -> Result<CpuSet, CgroupWriteError>;
    fn read_mems(&self, cgroup: &str) -> Result<CpuSet, CgroupWriteError>;
    fn write_cpus(&mut self, io: &Io, cgroup: &str, cpus: &CpuSet) -> Result<(), CgroupWriteError>;
    fn write_mems(&mut self, io: &Io, cgroup: &str, mems: &CpuSet) -> Result<(), CgroupWriteError>;
    /// True on cgroup v1, where memory follows a mems change only with memory_migrate=1
    /// (v2 always migrates).
    fn needs_memory_migrate(&self) -> bool;
    fn read_memory_migrate(&self, cgroup: &str) -> Result<bool, CgroupWriteError>;
    fn set_memory_migrate(
        &mut self,
        io: &Io,
        cgroup: &str,
        on: bool,
    ) -> Result<(), CgroupWriteError>;
    /// Moves at most `max_bytes` of the cgroup's pages that are on nodes outside `toward` to
    /// `toward` (move_pages(2)); returns the bytes moved. Used by staged moves only.
    fn move_pages(
        &mut self,
        io: &Io,
        cgroup: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError>;
    /// Moves the cgroup's pages that are on nodes outside `toward` to `toward` by the kernel's
    /// own walk of each process's memory (migrate_pages(2)), whole processes one after the
    /// other until at least `max_bytes` moved; returns the bytes moved (0: nothing left). For
    /// a move whose bytes are all budgeted (a writer's pages ahead of its narrowing mems write),
    /// never for a stage. Default: [`CgroupWriter::move_pages`] (the fakes).
    fn migrate_pages(
        &mut self,
        io: &Io,
        cgroup: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError> {
        self.move_pages(io, cgroup, toward, max_bytes)
    }
    /// Bytes of the cgroup's memory still on nodes outside `toward` (its memory.numa_stat):
    /// after its writer moved the pages its processes alone map, what is left is pages other
    /// processes map (a binary's text, shared libraries), which a narrowing mems write would
    /// migrate (see `daemon::apply`). None: not known (the default; the fakes unless told).
    fn left_behind(&self, _cgroup: &str, _toward: &CpuSet) -> Option<u64> {
        None
    }
    /// Waits until the writes made so far are in force, for a writer whose writes someone
    /// else applies later (the container runtime, in NRI mode); [`finish`] calls it before
    /// reading a move back. Never called with the daemon's allocator lock held.
    fn settle(&mut self, _io: &Io, _cgroup: &str) -> Result<(), CgroupWriteError> {
        Ok(())
    }
}

/// One write of a move.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "value")]
pub enum Step {
    SetMemoryMigrate(bool),
    WriteMems(CpuSet),
    WriteCpus(CpuSet),
    /// A staged move's page moves (after the writes).
    MovePages {
        toward: CpuSet,
        max_bytes: u64,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::SetMemoryMigrate(on) => write!(f, "cpuset.memory_migrate={}", u8::from(*on)),
            Step::WriteMems(s) => write!(f, "cpuset.mems={s}"),
            Step::WriteCpus(s) => write!(f, "cpuset.cpus={s}"),
            Step::MovePages { toward, max_bytes } => {
                write!(f, "move_pages(≤{max_bytes} bytes → nodes {toward})")
            }
        }
    }
}

/// What a move did (or, in a dry run, would do).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub cgroup: String,
    pub steps: Vec<Step>,
    pub dry_run: bool,
    /// Bytes migrated: the planned figure for a plain move (the kernel migrates on the mems
    /// write), what move_pages reported for a stage (0 in a dry run).
    pub moved_bytes: u64,
    /// A stage's page moves failed (the cpuset writes stand: they are valid on their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages_error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("refusing to write an empty {file} to {cgroup}")]
    EmptyTarget { cgroup: String, file: CgroupFile },
    #[error("cgroup {cgroup} vanished during the move")]
    Vanished { cgroup: String },
    #[error("cannot read the cpuset of {cgroup}")]
    Read {
        cgroup: String,
        #[source]
        source: CgroupWriteError,
    },
    /// Someone else (e.g. kubelet's CPU manager) changed the cgroup since it was observed;
    /// the controller adopts their choice instead of fighting it.
    #[error("{file} of {cgroup} is now {found:?}, not the {planned:?} the move was planned from")]
    Stale {
        cgroup: String,
        file: CgroupFile,
        planned: String,
        found: String,
    },
    #[error("move of {cgroup} failed at {step}; rolled back")]
    Failed {
        cgroup: String,
        step: Step,
        #[source]
        source: CgroupWriteError,
    },
    #[error("move of {cgroup}: {file} reads back {found:?}, expected {expected:?}; rolled back")]
    Verify {
        cgroup: String,
        file: CgroupFile,
        expected: String,
        found: String,
    },
    /// The daemon stops: the move was cut short ([`cut_short`]) before its narrowing mems
    /// write, its cpus moved and its mems still widened (nothing more migrates).
    #[error("move of {cgroup} cut short by the daemon's stop; its mems stay widened")]
    Stopped { cgroup: String },
    #[error("move of {cgroup} failed ({cause}) and its rollback failed too")]
    RollbackFailed {
        cgroup: String,
        cause: String,
        #[source]
        source: CgroupWriteError,
    },
}

impl ApplyError {
    /// A short, stable name of why the move failed (a metric label): the errno class of the
    /// write that failed, or what else went wrong.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::EmptyTarget { .. } => "empty-target",
            Self::Vanished { .. } => "vanished",
            Self::Read { source, .. } => match source {
                CgroupWriteError::Vanished { .. } => "vanished",
                _ => "read",
            },
            Self::Stale { .. } => "stale",
            Self::Failed { source, .. } => source.kind(),
            Self::Verify { .. } => "verify",
            Self::RollbackFailed { .. } => "rollback-failed",
            Self::Stopped { .. } => "stopped",
        }
    }
}

/// A vanished cgroup is its own error; anything else is wrapped by `f`.
fn classify(e: CgroupWriteError, f: impl FnOnce(CgroupWriteError) -> ApplyError) -> ApplyError {
    match e {
        CgroupWriteError::Vanished { cgroup } => ApplyError::Vanished { cgroup },
        other => f(other),
    }
}

/// The steps that take a cgroup from (`cpus`, `mems`) to the move's target, in safe order.
pub fn steps_for(mv: &Move, cpus: &CpuSet, mems: &CpuSet, v1_migrate_off: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    let wide = mems.union(&mv.to_mems);
    let mems_change = *mems != mv.to_mems;
    if mems_change && v1_migrate_off {
        steps.push(Step::SetMemoryMigrate(true));
    }
    if wide != *mems {
        steps.push(Step::WriteMems(wide.clone()));
    }
    if *cpus != mv.to_cpus {
        steps.push(Step::WriteCpus(mv.to_cpus.clone()));
    }
    if mv.to_mems != wide {
        steps.push(Step::WriteMems(mv.to_mems.clone()));
    }
    if mems_change && v1_migrate_off {
        steps.push(Step::SetMemoryMigrate(false));
    }
    steps
}

fn run(
    w: &mut dyn CgroupWriter,
    io: &Io,
    cgroup: &str,
    step: &Step,
) -> Result<(), CgroupWriteError> {
    match step {
        Step::SetMemoryMigrate(on) => w.set_memory_migrate(io, cgroup, *on),
        Step::WriteMems(s) => w.write_mems(io, cgroup, s),
        Step::WriteCpus(s) => w.write_cpus(io, cgroup, s),
        Step::MovePages { toward, max_bytes } => {
            w.move_pages(io, cgroup, toward, *max_bytes).map(drop)
        }
    }
}

/// Applies `mv` through `w`; with `dry_run` only reads and returns the steps it would write.
/// A failure at any step rolls back to the previous cpus and mems.
pub fn apply(
    io: &Io,
    mv: &Move,
    w: &mut dyn CgroupWriter,
    dry_run: bool,
) -> Result<Applied, ApplyError> {
    match begin(io, mv, w, dry_run)? {
        Begun::DryRun(a) => Ok(a),
        Begun::CpusMoved(rest) => finish(io, mv, w, rest),
    }
}

/// The first half of [`apply`]: the checks, then the writes up to and including cpuset.cpus
/// (memory_migrate on, mems widened); the rest — narrowing mems (the kernel migrates the
/// memory then) and the page moves — is [`finish`]. The daemon books the move before this
/// half and settles it after (`daemon::apply`), no lock held over either half.
pub fn begin(
    io: &Io,
    mv: &Move,
    w: &mut dyn CgroupWriter,
    dry_run: bool,
) -> Result<Begun, ApplyError> {
    let cg = mv.cgroup.as_str();
    for (set, file) in [
        (&mv.to_cpus, CgroupFile::Cpus),
        (&mv.to_mems, CgroupFile::Mems),
    ] {
        if set.is_empty() {
            return Err(ApplyError::EmptyTarget {
                cgroup: cg.to_string(),
                file,
            });
        }
    }
    let read_err = |e| {
        classify(e, |source| ApplyError::Read {
            cgroup: cg.to_string(),
            source,
        })
    };
    let cpus = w.read_cpus(cg).map_err(read_err)?;
    let mems = w.read_mems(cg).map_err(read_err)?;
    for (now, planned, file) in [
        (&cpus, &mv.from_cpus, CgroupFile::Cpus),
        (&mems, &mv.from_mems, CgroupFile::Mems),
    ] {
        if now != planned {
            return Err(ApplyError::Stale {
                cgroup: cg.to_string(),
                file,
                planned: planned.to_string(),
                found: now.to_string(),
            });
        }
    }
    let migrate_off = w.needs_memory_migrate() && !w.read_memory_migrate(cg).map_err(read_err)?;
    let steps = steps_for(mv, &cpus, &mems, migrate_off);
    let page_step = mv.stage.as_ref().map(|s| Step::MovePages {
        toward: s.toward.clone(),
        max_bytes: mv.bytes_to_migrate,
    });
    if dry_run {
        return Ok(Begun::DryRun(Applied {
            cgroup: cg.to_string(),
            steps: steps.into_iter().chain(page_step).collect(),
            dry_run: true,
            moved_bytes: 0,
            pages_error: None,
        }));
    }
    // The steps after the cpus write (see `steps_for`): narrowing mems, memory_migrate off.
    let wide = mems.union(&mv.to_mems);
    let tail = usize::from(mv.to_mems != wide) + usize::from(mems != mv.to_mems && migrate_off);
    let split = steps.len() - tail;

    let mut state = Live {
        cpus: cpus.clone(),
        mems: mems.clone(),
        migrate_on: !migrate_off,
    };
    for step in &steps[..split] {
        if let Err(e) = run(w, io, cg, step) {
            let cause = classify(e, |source| ApplyError::Failed {
                cgroup: cg.to_string(),
                step: step.clone(),
                source,
            });
            if matches!(cause, ApplyError::Vanished { .. }) {
                return Err(cause);
            }
            return Err(rollback(
                w,
                io,
                cg,
                &state,
                &cpus,
                &mems,
                !migrate_off,
                cause,
            ));
        }
        state.apply(step);
    }
    Ok(Begun::CpusMoved(Rest {
        steps,
        split,
        page_step,
        state,
        rollback_cpus: cpus,
        mems,
        migrate_was_on: !migrate_off,
        accept_cpus: None,
    }))
}

/// What [`begin`] did.
pub enum Begun {
    /// A dry run: the steps it would write.
    DryRun(Applied),
    /// The cpus are moved; [`finish`] does the rest.
    CpusMoved(Rest),
}

/// The second half of a move, for [`finish`].
pub struct Rest {
    steps: Vec<Step>,
    split: usize,
    page_step: Option<Step>,
    state: Live,
    rollback_cpus: CpuSet,
    mems: CpuSet,
    migrate_was_on: bool,
    /// Cpus other than the move's that [`finish`]'s read-back accepts (see
    /// [`Rest::accepting_cpus`]).
    accept_cpus: Option<AcceptCpus>,
}

/// See [`Rest::accepting_cpus`].
pub type AcceptCpus = Box<dyn Fn(&CpuSet) -> bool>;

impl Rest {
    /// [`finish`]'s read-back also accepts cpus for which `ok` says yes (the caller's own
    /// rewrite while the move was under way: the shared pool following the allocator's books),
    /// instead of rolling back a completed migration for them.
    pub fn accepting_cpus(mut self, ok: AcceptCpus) -> Rest {
        self.accept_cpus = Some(ok);
        self
    }

    /// The cpuset.mems the move has written so far (after [`begin`]: the old and the new
    /// nodes, or the old ones where they already held the new).
    pub fn mems_now(&self) -> &CpuSet {
        &self.state.mems
    }

    /// [`finish`] without the narrowing mems write: mems stay as [`Rest::mems_now`] (the
    /// caller's move then has those as its target, for the read-back); only memory_migrate
    /// (v1) is put back.
    pub fn leaving_mems_wide(mut self) -> Rest {
        let tail = self.steps.split_off(self.split);
        self.steps.extend(
            tail.into_iter()
                .filter(|s| !matches!(s, Step::WriteMems(_))),
        );
        self
    }

    /// A failure in [`finish`] restores mems (and memory_migrate) but keeps the new cpus: the
    /// caller has recorded them and may no longer write the old ones (another container may
    /// hold them by now).
    pub fn keep_cpus_on_failure(mut self) -> Rest {
        self.rollback_cpus = self.state.cpus.clone();
        self
    }
}

/// The second half of [`apply`] (see [`begin`]): narrows mems, verifies by reading back, and
/// moves a stage's pages.
pub fn finish(
    io: &Io,
    mv: &Move,
    w: &mut dyn CgroupWriter,
    rest: Rest,
) -> Result<Applied, ApplyError> {
    let cg = mv.cgroup.as_str();
    let Rest {
        steps,
        split,
        page_step,
        mut state,
        rollback_cpus,
        mems,
        migrate_was_on,
        accept_cpus,
    } = rest;
    // A failed step (or settle): a vanished cgroup is left alone, anything else rolled back.
    let fail = |w: &mut dyn CgroupWriter, state: &Live, step: Step, e: CgroupWriteError| {
        let cause = classify(e, |source| ApplyError::Failed {
            cgroup: cg.to_string(),
            step,
            source,
        });
        if matches!(cause, ApplyError::Vanished { .. }) {
            return cause;
        }
        rollback(
            w,
            io,
            cg,
            state,
            &rollback_cpus,
            &mems,
            migrate_was_on,
            cause,
        )
    };
    for step in &steps[split..] {
        if let Err(e) = run(w, io, cg, step) {
            return Err(fail(w, &state, step.clone(), e));
        }
        state.apply(step);
    }
    if let Err(e) = w.settle(io, cg) {
        let step = steps
            .last()
            .cloned()
            .unwrap_or(Step::WriteCpus(mv.to_cpus.clone()));
        return Err(fail(w, &state, step, e));
    }
    let read_err = |e| {
        classify(e, |source| ApplyError::Read {
            cgroup: cg.to_string(),
            source,
        })
    };

    // Verify by reading back.
    let back = [
        (w.read_cpus(cg), &mv.to_cpus, CgroupFile::Cpus),
        (w.read_mems(cg), &mv.to_mems, CgroupFile::Mems),
    ];
    for (got, expected, file) in back {
        let got = got.map_err(read_err)?;
        let accepted = file == CgroupFile::Cpus
            && !got.is_empty()
            && accept_cpus.as_ref().is_some_and(|ok| ok(&got));
        if got != *expected && !accepted {
            let cause = ApplyError::Verify {
                cgroup: cg.to_string(),
                file,
                expected: expected.to_string(),
                found: got.to_string(),
            };
            return Err(rollback(
                w,
                io,
                cg,
                &state,
                &rollback_cpus,
                &mems,
                migrate_was_on,
                cause,
            ));
        }
    }
    let (moved_bytes, pages_error) = match &mv.stage {
        None => (mv.bytes_to_migrate, None),
        Some(s) => match w.move_pages(io, cg, &s.toward, mv.bytes_to_migrate) {
            // Never credit more than the stage's share of the budget.
            Ok(b) => (b.min(mv.bytes_to_migrate), None),
            Err(e) => (0, Some(e.to_string())),
        },
    };
    Ok(Applied {
        cgroup: cg.to_string(),
        steps: steps.into_iter().chain(page_step).collect(),
        dry_run: false,
        moved_bytes,
        pages_error,
    })
}

/// Abandons a begun move instead of [`finish`]ing it: someone else wrote the cgroup's cpus
/// (`found`) while it was under way. Its mems (and memory_migrate) go back to what they were
/// before the move, its cpus stay as that someone wrote them; returns [`ApplyError::Stale`]
/// (or `RollbackFailed`).
pub fn abandon(
    io: &Io,
    mv: &Move,
    w: &mut dyn CgroupWriter,
    rest: Rest,
    found: CpuSet,
) -> ApplyError {
    let Rest {
        mut state,
        mems,
        migrate_was_on,
        ..
    } = rest;
    let cause = ApplyError::Stale {
        cgroup: mv.cgroup.clone(),
        file: CgroupFile::Cpus,
        planned: mv.to_cpus.to_string(),
        found: found.to_string(),
    };
    state.cpus = found.clone();
    rollback(
        w,
        io,
        &mv.cgroup,
        &state,
        &found,
        &mems,
        migrate_was_on,
        cause,
    )
}

/// Cuts a begun move short instead of [`finish`]ing it, because the daemon stops: no
/// narrowing mems write (it would migrate the rest of the memory, past the shutdown bound).
/// The cpus stay moved, the mems stay widened (the old and the new nodes: nothing migrates);
/// only memory_migrate (v1) is put back as it was. Returns [`ApplyError::Stopped`] (or
/// `RollbackFailed` when that write failed).
pub fn cut_short(io: &Io, mv: &Move, w: &mut dyn CgroupWriter, rest: Rest) -> ApplyError {
    let cause = ApplyError::Stopped {
        cgroup: mv.cgroup.clone(),
    };
    if rest.state.migrate_on != rest.migrate_was_on {
        if let Err(source) = run(
            w,
            io,
            &mv.cgroup,
            &Step::SetMemoryMigrate(rest.migrate_was_on),
        ) {
            return ApplyError::RollbackFailed {
                cgroup: mv.cgroup.clone(),
                cause: cause.to_string(),
                source,
            };
        }
    }
    cause
}

/// What the actuator has written so far.
struct Live {
    cpus: CpuSet,
    mems: CpuSet,
    migrate_on: bool,
}

impl Live {
    fn apply(&mut self, step: &Step) {
        match step {
            Step::SetMemoryMigrate(on) => self.migrate_on = *on,
            Step::WriteMems(s) => self.mems = s.clone(),
            Step::WriteCpus(s) => self.cpus = s.clone(),
            Step::MovePages { .. } => {}
        }
    }
}

/// Restores `cpus`/`mems` (and memory_migrate) from `live`, widening mems first. Returns
/// `cause` when the rollback worked, `RollbackFailed` otherwise.
#[allow(clippy::too_many_arguments)]
fn rollback(
    w: &mut dyn CgroupWriter,
    io: &Io,
    cg: &str,
    live: &Live,
    cpus: &CpuSet,
    mems: &CpuSet,
    migrate_was_on: bool,
    cause: ApplyError,
) -> ApplyError {
    let back = Move {
        cgroup: cg.to_string(),
        from_cpus: live.cpus.clone(),
        to_cpus: cpus.clone(),
        from_mems: live.mems.clone(),
        to_mems: mems.clone(),
        bytes_to_migrate: 0,
        reason: super::plan_types::Trigger::PoorLocality,
        locality_before: 0.0,
        locality_after: 0.0,
        net: 0.0,
        stage: None,
    };
    let mut steps = steps_for(&back, &live.cpus, &live.mems, false);
    if live.migrate_on != migrate_was_on {
        // Memory follows the restored mems while memory_migrate is still on; restore it last.
        steps.push(Step::SetMemoryMigrate(migrate_was_on));
    }
    for step in &steps {
        if let Err(source) = run(w, io, cg, step) {
            return ApplyError::RollbackFailed {
                cgroup: cg.to_string(),
                cause: cause.to_string(),
                source,
            };
        }
    }
    cause
}

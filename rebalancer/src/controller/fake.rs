//! `FakeCgroups`: an in-memory [`CgroupWriter`] for tests and simulation. It records every
//! write (so a dry run can be proven to write nothing), keeps the state after each write (so a
//! test can check a workload was never without CPUs or memory), and injects failures on the
//! n-th write of a file (EBUSY, EINVAL, ENOSPC, EACCES, or the cgroup vanishing).

use std::collections::BTreeMap;

use super::actuator::{CgroupFile, CgroupWriteError, CgroupWriter};
use crate::cpuset::CpuSet;

/// A failure to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeFailure {
    Busy,
    Invalid,
    NoSpace,
    Permission,
    /// The cgroup is removed (its processes exited) and the write fails with ENOENT.
    Vanished,
}

/// One recorded write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeWrite {
    pub cgroup: String,
    pub file: CgroupFile,
    pub value: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct FakeCgroup {
    cpus: CpuSet,
    mems: CpuSet,
    memory_migrate: bool,
    /// Bytes of the workload's memory per node.
    memory: BTreeMap<u32, u64>,
}

/// In-memory cgroups (v2 by default; `v1()` requires memory_migrate for migration).
#[derive(Clone, Debug, Default)]
pub struct FakeCgroups {
    cgroups: BTreeMap<String, FakeCgroup>,
    v1: bool,
    writes: Vec<FakeWrite>,
    /// (file, n-th write of that file counted from 1, failure)
    failures: Vec<(CgroupFile, usize, FakeFailure)>,
    counts: BTreeMap<CgroupFile, usize>,
    /// (cgroup, file, n-th write of that file to that cgroup counted from 1, failure)
    cgroup_failures: Vec<(String, CgroupFile, usize, FakeFailure)>,
    cgroup_counts: BTreeMap<(String, CgroupFile), usize>,
    /// Read-back of a file returns this instead of the truth (a kernel that clamps).
    misreport: BTreeMap<CgroupFile, CpuSet>,
    /// (cgroup, cpus, mems) after every successful write.
    history: Vec<(String, CpuSet, CpuSet)>,
    /// Bytes migrated so far (mems writes and move_pages).
    migrated: u64,
}

impl FakeCgroups {
    pub fn v2() -> Self {
        Self::default()
    }

    pub fn v1() -> Self {
        Self {
            v1: true,
            ..Self::default()
        }
    }

    /// [`FakeCgroups::v1`] or [`FakeCgroups::v2`].
    pub fn version(v1: bool) -> Self {
        if v1 {
            Self::v1()
        } else {
            Self::v2()
        }
    }

    pub fn with(mut self, cgroup: &str, cpus: &str, mems: &str) -> Self {
        self.insert(cgroup, cpus, mems);
        self
    }

    /// Adds a cgroup; `cpus`/`mems` are cpulists (a bad list is a test bug: it panics).
    pub fn insert(&mut self, cgroup: &str, cpus: &str, mems: &str) {
        let parse =
            |s: &str| CpuSet::parse(s).unwrap_or_else(|e| panic!("fake cpulist {s:?}: {e}"));
        self.cgroups.insert(
            cgroup.to_string(),
            FakeCgroup {
                cpus: parse(cpus),
                mems: parse(mems),
                memory_migrate: false,
                memory: BTreeMap::new(),
            },
        );
    }

    /// The `nth` (1-based) write of `file` from now on fails with `failure`.
    pub fn fail_write(&mut self, file: CgroupFile, nth: usize, failure: FakeFailure) {
        let base = self.counts.get(&file).copied().unwrap_or(0);
        self.failures.push((file, base + nth, failure));
    }

    /// The `nth` (1-based) write of `file` to `cgroup` from now on fails with `failure`
    /// (whatever other cgroups are written meanwhile: for concurrent writers).
    pub fn fail_cgroup_write(
        &mut self,
        cgroup: &str,
        file: CgroupFile,
        nth: usize,
        failure: FakeFailure,
    ) {
        let key = (cgroup.to_string(), file);
        let base = self.cgroup_counts.get(&key).copied().unwrap_or(0);
        self.cgroup_failures
            .push((cgroup.to_string(), file, base + nth, failure));
    }

    pub fn misreport(&mut self, file: CgroupFile, set: CpuSet) {
        self.misreport.insert(file, set);
    }

    pub fn remove(&mut self, cgroup: &str) {
        self.cgroups.remove(cgroup);
    }

    pub fn writes(&self) -> &[FakeWrite] {
        &self.writes
    }

    pub fn history(&self) -> &[(String, CpuSet, CpuSet)] {
        &self.history
    }

    pub fn cpus(&self, cgroup: &str) -> Option<&CpuSet> {
        self.cgroups.get(cgroup).map(|c| &c.cpus)
    }

    pub fn mems(&self, cgroup: &str) -> Option<&CpuSet> {
        self.cgroups.get(cgroup).map(|c| &c.mems)
    }

    /// Gives the cgroup `bytes` of memory on each node (a mems write then migrates it the way
    /// the kernel does: off the nodes no longer allowed, nothing on a widening).
    pub fn set_memory(&mut self, cgroup: &str, per_node: &[(u32, u64)]) {
        if let Some(c) = self.cgroups.get_mut(cgroup) {
            c.memory = per_node.iter().copied().collect();
        }
    }

    pub fn memory(&self, cgroup: &str) -> Option<&BTreeMap<u32, u64>> {
        self.cgroups.get(cgroup).map(|c| &c.memory)
    }

    /// Bytes migrated so far by mems writes and move_pages.
    pub fn migrated(&self) -> u64 {
        self.migrated
    }

    pub fn memory_migrate(&self, cgroup: &str) -> Option<bool> {
        self.cgroups.get(cgroup).map(|c| c.memory_migrate)
    }

    fn get(&self, cgroup: &str) -> Result<&FakeCgroup, CgroupWriteError> {
        self.cgroups
            .get(cgroup)
            .ok_or_else(|| CgroupWriteError::Vanished {
                cgroup: cgroup.to_string(),
            })
    }

    fn write(
        &mut self,
        cgroup: &str,
        file: CgroupFile,
        value: String,
        set: impl FnOnce(&mut FakeCgroup),
    ) -> Result<(), CgroupWriteError> {
        self.get(cgroup)?;
        let n = self.counts.entry(file).or_default();
        *n += 1;
        let n = *n;
        let cg = cgroup.to_string();
        let per = self.cgroup_counts.entry((cg.clone(), file)).or_default();
        *per += 1;
        let per = *per;
        let injected = self
            .failures
            .iter()
            .find(|(ff, nn, _)| *ff == file && *nn == n)
            .map(|&(_, _, f)| f)
            .or_else(|| {
                self.cgroup_failures
                    .iter()
                    .find(|(c, ff, nn, _)| *c == cg && *ff == file && *nn == per)
                    .map(|&(_, _, _, f)| f)
            });
        if let Some(f) = injected {
            return Err(match f {
                FakeFailure::Busy => CgroupWriteError::Busy { cgroup: cg, file },
                FakeFailure::Invalid => CgroupWriteError::Invalid {
                    cgroup: cg,
                    file,
                    value,
                },
                FakeFailure::NoSpace => CgroupWriteError::NoSpace {
                    cgroup: cg,
                    file,
                    value,
                },
                FakeFailure::Permission => CgroupWriteError::Permission { cgroup: cg, file },
                FakeFailure::Vanished => {
                    self.cgroups.remove(cgroup);
                    CgroupWriteError::Vanished { cgroup: cg }
                }
            });
        }
        if value.is_empty() {
            // The real kernel accepts some empty writes; the fake refuses them so a bug shows.
            return Err(CgroupWriteError::Invalid {
                cgroup: cg,
                file,
                value,
            });
        }
        self.writes.push(FakeWrite {
            cgroup: cg.clone(),
            file,
            value,
        });
        if let Some(c) = self.cgroups.get_mut(cgroup) {
            set(c);
            self.history.push((cg, c.cpus.clone(), c.mems.clone()));
        }
        Ok(())
    }
}

/// Moves up to `max` bytes that are on nodes outside `keep` to node `to`; returns the bytes.
fn shift(memory: &mut BTreeMap<u32, u64>, keep: &CpuSet, to: u32, max: u64) -> u64 {
    let mut moved = 0u64;
    for (n, b) in memory.iter_mut() {
        if keep.contains(*n) {
            continue;
        }
        let take = (*b).min(max - moved);
        *b -= take;
        moved += take;
    }
    *memory.entry(to).or_default() += moved;
    memory.retain(|_, b| *b > 0);
    moved
}

impl CgroupWriter for FakeCgroups {
    fn read_cpus(&self, cgroup: &str) -> Result<CpuSet, CgroupWriteError> {
        let c = self.get(cgroup)?;
        Ok(self
            .misreport
            .get(&CgroupFile::Cpus)
            .unwrap_or(&c.cpus)
            .clone())
    }

    fn read_mems(&self, cgroup: &str) -> Result<CpuSet, CgroupWriteError> {
        let c = self.get(cgroup)?;
        Ok(self
            .misreport
            .get(&CgroupFile::Mems)
            .unwrap_or(&c.mems)
            .clone())
    }

    fn write_cpus(
        &mut self,
        _io: &crate::daemon::Io,
        cgroup: &str,
        cpus: &CpuSet,
    ) -> Result<(), CgroupWriteError> {
        let v = cpus.clone();
        self.write(cgroup, CgroupFile::Cpus, cpus.to_string(), |c| c.cpus = v)
    }

    fn write_mems(
        &mut self,
        _io: &crate::daemon::Io,
        cgroup: &str,
        mems: &CpuSet,
    ) -> Result<(), CgroupWriteError> {
        let v = mems.clone();
        let migrates = !self.v1 || self.get(cgroup)?.memory_migrate;
        let mut moved = 0;
        self.write(cgroup, CgroupFile::Mems, mems.to_string(), |c| {
            if migrates {
                if let Some(to) = v.first() {
                    moved = shift(&mut c.memory, &v, to, u64::MAX);
                }
            }
            c.mems = v
        })?;
        self.migrated += moved;
        Ok(())
    }

    fn move_pages(
        &mut self,
        _io: &crate::daemon::Io,
        cgroup: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError> {
        let c = self
            .cgroups
            .get_mut(cgroup)
            .ok_or_else(|| CgroupWriteError::Vanished {
                cgroup: cgroup.to_string(),
            })?;
        let Some(to) = toward.first().filter(|n| c.mems.contains(*n)) else {
            return Ok(0); // like move_pages: a node outside the cpuset is refused
        };
        let moved = shift(&mut c.memory, toward, to, max_bytes);
        self.migrated += moved;
        Ok(moved)
    }

    fn needs_memory_migrate(&self) -> bool {
        self.v1
    }

    fn read_memory_migrate(&self, cgroup: &str) -> Result<bool, CgroupWriteError> {
        Ok(self.get(cgroup)?.memory_migrate)
    }

    fn set_memory_migrate(
        &mut self,
        _io: &crate::daemon::Io,
        cgroup: &str,
        on: bool,
    ) -> Result<(), CgroupWriteError> {
        let v = u8::from(on).to_string();
        self.write(cgroup, CgroupFile::MemoryMigrate, v, |c| {
            c.memory_migrate = on
        })
    }
}

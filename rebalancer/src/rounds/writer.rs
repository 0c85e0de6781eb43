//! The moves' writer: cgroupfs through the validated, read-back writes of [`Cgroups`], page
//! moves, and in NRI mode every cpuset write told to the runtime.

use crate::{
    cgroup::{CgroupError, Cgroups, Controller},
    controller::{CgroupFile, CgroupWriteError, CgroupWriter},
    cpuset::CpuSet,
    daemon::nri_updates,
};

/// The moves' writer of one apply thread (`apply::Applier`), and of the one-after-the-other
/// path: cgroupfs through the validated, read-back writes of [`Cgroups`] (reads are the
/// *effective* sets), page moves resuming this thread's walk, and — in NRI mode with
/// `kubernetes.nri_runtime_updates` — every cpuset write told to the runtime once it is in
/// cgroupfs ([`nri_updates::Runtime::written`]). Page moves are the daemon's own in
/// both modes (the runtime is told nothing of them).
pub struct OwnedWriter {
    pub cgroups: Cgroups,
    pub runtime: Option<std::sync::Arc<nri_updates::Runtime>>,
    /// The page walk of this thread's move, resumed from step to step.
    pub walk: crate::pages::Walk,
}

impl OwnedWriter {
    /// The cgroupfs writer alone (watcher mode; the root tests).
    pub fn new(cgroups: Cgroups) -> OwnedWriter {
        OwnedWriter {
            cgroups,
            runtime: None,
            walk: Default::default(),
        }
    }
}

fn wrap(cgroup: &str, file: CgroupFile, e: CgroupError) -> CgroupWriteError {
    match e {
        CgroupError::Io { source, .. } => CgroupWriteError::from_io(cgroup, file, "", source),
        CgroupError::Write { source, value, .. } => {
            CgroupWriteError::from_io(cgroup, file, &value, source)
        }
        CgroupError::OutsideParent { value, .. } => CgroupWriteError::NoSpace {
            cgroup: cgroup.into(),
            file,
            value,
        },
        CgroupError::Empty { .. } => CgroupWriteError::Invalid {
            cgroup: cgroup.into(),
            file,
            value: String::new(),
        },
        other => CgroupWriteError::Io {
            cgroup: cgroup.into(),
            file,
            source: std::io::Error::other(other.to_string()),
        },
    }
}

impl CgroupWriter for OwnedWriter {
    fn read_cpus(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        (self.cgroups.effective_cpus(cg)).map_err(|e| wrap(cg, CgroupFile::Cpus, e))
    }
    fn read_mems(&self, cg: &str) -> Result<CpuSet, CgroupWriteError> {
        (self.cgroups.effective_mems(cg)).map_err(|e| wrap(cg, CgroupFile::Mems, e))
    }
    fn write_cpus(
        &mut self,
        _io: &crate::daemon::Io,
        cg: &str,
        cpus: &CpuSet,
    ) -> Result<(), CgroupWriteError> {
        (self.cgroups.write_cpus(cg, cpus)).map_err(|e| wrap(cg, CgroupFile::Cpus, e))?;
        if let Some(rt) = &self.runtime {
            rt.written(cg, Some(cpus), None, || None);
        }
        Ok(())
    }
    fn write_mems(
        &mut self,
        _io: &crate::daemon::Io,
        cg: &str,
        mems: &CpuSet,
    ) -> Result<(), CgroupWriteError> {
        (self.cgroups.write_mems(cg, mems)).map_err(|e| wrap(cg, CgroupFile::Mems, e))?;
        if let Some(rt) = &self.runtime {
            rt.written(cg, None, Some(mems), || self.read_cpus(cg).ok());
        }
        Ok(())
    }
    fn needs_memory_migrate(&self) -> bool {
        (self.cgroups.hierarchy(Controller::Cpuset))
            .is_ok_and(|(_, v)| v == crate::cgroup::Version::V1)
    }
    fn read_memory_migrate(&self, cg: &str) -> Result<bool, CgroupWriteError> {
        let (dir, _) = (self.cgroups.dir(Controller::Cpuset, cg))
            .map_err(|e| wrap(cg, CgroupFile::MemoryMigrate, e))?;
        let p = dir.join("cpuset.memory_migrate");
        std::fs::read_to_string(&p)
            .map(|s| s.trim() == "1")
            .map_err(|e| CgroupWriteError::from_io(cg, CgroupFile::MemoryMigrate, "", e))
    }
    fn set_memory_migrate(
        &mut self,
        _io: &crate::daemon::Io,
        cg: &str,
        on: bool,
    ) -> Result<(), CgroupWriteError> {
        (self.cgroups.set_memory_migrate(cg, on))
            .map_err(|e| wrap(cg, CgroupFile::MemoryMigrate, e))
    }
    /// A step of move_pages(2), continuing this thread's walk (see [`crate::pages::Walk`]).
    fn move_pages(
        &mut self,
        _io: &crate::daemon::Io,
        cg: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError> {
        let cgroups = &self.cgroups;
        let procs = || procs_of(cgroups, cg);
        (self.walk.step(cg, toward, max_bytes, procs, procs))
            .map_err(|e| CgroupWriteError::from_io(cg, CgroupFile::Pages, "", e))
    }
    /// migrate_pages(2) of whole processes, continuing this thread's walk
    /// ([`crate::pages::Walk::step_whole`]).
    fn migrate_pages(
        &mut self,
        _io: &crate::daemon::Io,
        cg: &str,
        toward: &CpuSet,
        max_bytes: u64,
    ) -> Result<u64, CgroupWriteError> {
        let cgroups = &self.cgroups;
        let procs = || procs_of(cgroups, cg);
        (self.walk.step_whole(cg, toward, max_bytes, procs, procs))
            .map_err(|e| CgroupWriteError::from_io(cg, CgroupFile::Pages, "", e))
    }
    fn left_behind(&self, cg: &str, toward: &CpuSet) -> Option<u64> {
        let numa = self.cgroups.numa_stat(cg).ok()?;
        Some(
            numa.anon
                .iter()
                .chain(&numa.file)
                .chain(&numa.hugetlb)
                .filter(|(n, _)| !toward.contains(**n))
                .fold(0u64, |a, (_, &b)| a.saturating_add(b)),
        )
    }
}

/// The processes of cgroup `cg` (its cpuset hierarchy), for a page walk.
fn procs_of(cgroups: &Cgroups, cg: &str) -> std::io::Result<Vec<u32>> {
    cgroups.procs(Controller::Cpuset, cg).map_err(|e| match e {
        CgroupError::Io { source, .. } => source,
        other => std::io::Error::other(other.to_string()),
    })
}

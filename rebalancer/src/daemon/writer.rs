//! The one way admission changes a container's cpuset: the [`CpusetWriter`] seam. Its
//! implementations: [`CgroupCpusetWriter`] (cgroupfs, through the validated, read-back writes
//! of [`Cgroups`]); in NRI mode `daemon::nri::NriWriter` (the plugin thread's changes become
//! the runtime's container adjustment / updates) and `daemon::nri_updates::RuntimeCpusetWriter`
//! (the other threads' changes of the runtime's containers become queued container updates) —
//! never both, never neither.
//!
//! The control round's moves go through the actuator's `CgroupWriter` (`rounds::OwnedWriter`:
//! cgroupfs, told to the runtime in NRI mode), which also migrates memory; admission only ever
//! sets cpus (and a new container's mems).

use crate::{
    cgroup::{Cgroups, Controller},
    cpuset::CpuSet,
};

/// Every effect of the daemon (a cgroupfs write, a runtime update, a page move, a checkpoint's
/// fsync) passes here first: none runs on a thread that holds the state lock. A debug build
/// panics (every test), a release build logs once, so a lock held across I/O is found by any
/// test that reaches the write.
pub fn io_edge() {
    if super::state_held() {
        if cfg!(debug_assertions) {
            panic!("I/O with the daemon's state lock held");
        }
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| tracing::error!("I/O with the daemon's state lock held"));
    }
}

/// One container's cpuset change: `cpus`, and `mems` when they change too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpusetChange {
    /// The container's cgroup (relative to the hierarchy root).
    pub cgroup: String,
    pub cpus: CpuSet,
    pub mems: Option<CpuSet>,
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The container is gone (its cgroup removed meanwhile): a normal race, not a failure.
    #[error("container cgroup {cgroup} vanished")]
    Vanished { cgroup: String },
    #[error("writing the cpuset of {cgroup}: {message}")]
    Failed { cgroup: String, message: String },
}

/// Where admission's cpuset changes go. Implementations do I/O; they are called with no lock
/// of the daemon's state held.
pub trait CpusetWriter: Send + Sync {
    /// Applies `change`: mems first (a task never has CPUs without an allowed memory node), then
    /// cpus.
    fn write(&self, change: &CpusetChange) -> Result<(), WriteError>;
    /// The container's cpus as set now (its own `cpuset.cpus`, or the effective set when that
    /// is empty); None when unreadable.
    fn cpus(&self, cgroup: &str) -> Option<CpuSet>;
    /// The NUMA nodes a container's memory is on now (`memory.numa_stat`); None when it has
    /// none or it cannot be read. Admission keeps an adopted container's mems on these
    /// rather than narrow them in its write: the kernel would migrate the memory inside that
    /// write, outside any budget (see `Admission`'s adoption).
    fn memory_nodes(&self, _cgroup: &str) -> Option<CpuSet> {
        None
    }
}

/// The nodes of `cgroup`'s memory by its `memory.numa_stat` (anonymous, file and hugetlb
/// pages); None when it has none or cannot be read.
pub fn memory_nodes_of(cgroups: &Cgroups, cgroup: &str) -> Option<CpuSet> {
    let st = cgroups.numa_stat(cgroup).ok()?;
    let nodes: CpuSet = [&st.anon, &st.file, &st.hugetlb]
        .into_iter()
        .flat_map(|b| b.iter().filter(|(_, v)| **v > 0).map(|(n, _)| *n))
        .collect();
    (!nodes.is_empty()).then_some(nodes)
}

/// [`CpusetWriter`] over cgroupfs.
#[derive(Clone)]
pub struct CgroupCpusetWriter(pub Cgroups);

impl CpusetWriter for CgroupCpusetWriter {
    fn write(&self, c: &CpusetChange) -> Result<(), WriteError> {
        io_edge();
        let r = match &c.mems {
            Some(m) => self.0.write_mems(&c.cgroup, m),
            None => Ok(()),
        }
        .and_then(|_| self.0.write_cpus(&c.cgroup, &c.cpus));
        match r {
            Ok(()) => Ok(()),
            // Removed meanwhile (ENOENT, or ENODEV from a dying cgroup).
            Err(_) if !self.0.exists(Controller::Cpuset, &c.cgroup) => Err(WriteError::Vanished {
                cgroup: c.cgroup.clone(),
            }),
            Err(e) => Err(WriteError::Failed {
                cgroup: c.cgroup.clone(),
                message: e.to_string(),
            }),
        }
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        match self.0.cpus(cgroup) {
            Ok(c) if !c.is_empty() => Some(c),
            _ => self.0.effective_cpus(cgroup).ok(),
        }
    }

    fn memory_nodes(&self, cgroup: &str) -> Option<CpuSet> {
        memory_nodes_of(&self.0, cgroup)
    }
}

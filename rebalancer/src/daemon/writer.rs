//! The one way the daemon changes a container's cpuset: [`apply`] through a [`CpusetWriter`]
//! sink. Two sinks: [`CgroupCpusetWriter`] (cgroupfs, through the validated, read-back writes
//! of [`Cgroups`]; in NRI mode the runtime told after each write, as queued container updates)
//! and `daemon::nri::NriWriter` (the plugin thread's changes become the runtime's
//! CreateContainer adjustment / updates).
//!
//! The control round's moves go through the actuator's `CgroupWriter` (`rounds::OwnedWriter`:
//! cgroupfs, told to the runtime in NRI mode), which also migrates memory; admission only ever
//! sets cpus (and a new container's mems).

use std::sync::Arc;

use super::{nri_updates::Runtime, Io};
use crate::rounds::trigger::Hub;
use crate::{
    cgroup::{Cgroups, Controller},
    cpuset::CpuSet,
};

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

/// Where admission's cpuset changes go. Implementations do I/O: a write takes the thread's
/// [`Io`], so none runs under the state lock.
pub trait CpusetWriter: Send + Sync {
    /// Applies `change`: mems first (a task never has CPUs without an allowed memory node), then
    /// cpus.
    fn write(&self, io: &Io, change: &CpusetChange) -> Result<(), WriteError>;
    /// The container's cpus as set now (its own `cpuset.cpus`, or the effective set when that
    /// is empty); None when unreadable.
    fn cpus(&self, cgroup: &str) -> Option<CpuSet>;
    /// The NUMA nodes a container's memory may be on now (see [`memory_nodes_of`]); None when
    /// they cannot be read. Admission keeps an adopted container's mems on these rather than
    /// narrow them in its write: the kernel would migrate the memory inside that write,
    /// outside any budget (see `Admission`'s adoption).
    fn memory_nodes(&self, _cgroup: &str) -> Option<CpuSet> {
        None
    }
}

/// The nodes `cgroup`'s memory may be on: its effective `cpuset.mems` and the nodes its
/// `memory.numa_stat` shows (anonymous, file and hugetlb pages; memory left outside mems
/// narrowed without migration); None when neither can be read or both are empty. The
/// effective mems count even where numa_stat shows nothing: a narrowing mems write migrates
/// every page its tasks map outside the new set (MPOL_MF_MOVE_ALL), those charged to other
/// cgroups too — the pages of a binary or library its tasks share with others, each unmapped
/// from every process that maps it.
pub fn memory_nodes_of(cgroups: &Cgroups, cgroup: &str) -> Option<CpuSet> {
    let mut nodes = cgroups.effective_mems(cgroup).unwrap_or_default();
    if let Ok(st) = cgroups.numa_stat(cgroup) {
        let charged: CpuSet = [&st.anon, &st.file, &st.hugetlb]
            .into_iter()
            .flat_map(|b| b.iter().filter(|(_, v)| **v > 0).map(|(n, _)| *n))
            .collect();
        nodes = nodes.union(&charged);
    }
    (!nodes.is_empty()).then_some(nodes)
}

/// The cgroupfs sink: validated, read-back writes (`Cgroups`); in NRI mode each write is then
/// told to the runtime (`nri_updates::Runtime`), so its container spec never falls behind.
#[derive(Clone)]
pub struct CgroupCpusetWriter {
    cgroups: Cgroups,
    runtime: Option<Arc<Runtime>>,
}

impl CgroupCpusetWriter {
    pub fn new(cgroups: Cgroups) -> CgroupCpusetWriter {
        CgroupCpusetWriter::telling(cgroups, None)
    }

    /// Writes cgroupfs, then tells `runtime` (when there is one) what was written.
    pub fn telling(cgroups: Cgroups, runtime: Option<Arc<Runtime>>) -> CgroupCpusetWriter {
        CgroupCpusetWriter { cgroups, runtime }
    }
}

impl CpusetWriter for CgroupCpusetWriter {
    fn write(&self, _io: &Io, c: &CpusetChange) -> Result<(), WriteError> {
        let cg = &self.cgroups;
        let r = match &c.mems {
            Some(m) => cg.write_mems(&c.cgroup, m),
            None => Ok(()),
        }
        .and_then(|_| cg.write_cpus(&c.cgroup, &c.cpus));
        let cgroup = c.cgroup.clone();
        r.map_err(|e| match cg.exists(Controller::Cpuset, &c.cgroup) {
            // Removed meanwhile (ENOENT, or ENODEV from a dying cgroup).
            false => WriteError::Vanished { cgroup },
            true => WriteError::Failed {
                cgroup,
                message: e.to_string(),
            },
        })?;
        if let Some(rt) = &self.runtime {
            rt.tell(&c.cgroup, Some(&c.cpus), c.mems.as_ref(), "cpuset");
        }
        Ok(())
    }

    fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
        match self.cgroups.cpus(cgroup) {
            Ok(c) if !c.is_empty() => Some(c),
            _ => self.cgroups.effective_cpus(cgroup).ok(),
        }
    }

    fn memory_nodes(&self, cgroup: &str) -> Option<CpuSet> {
        memory_nodes_of(&self.cgroups, cgroup)
    }
}

/// The one way a cpuset change is made: noted as the daemon's own first (so the round trigger
/// does not take it for an operator's change), written through `sink` (which reads it back and
/// tells the runtime), and the note taken back when the write failed.
pub fn apply(
    io: &Io,
    sink: &dyn CpusetWriter,
    hub: &Hub,
    c: &CpusetChange,
) -> Result<(), WriteError> {
    hub.note_own_cpus(&c.cgroup, &c.cpus);
    let r = sink.write(io, c);
    if r.is_err() {
        hub.unnote_own_cpus(&c.cgroup, &c.cpus);
    }
    r
}

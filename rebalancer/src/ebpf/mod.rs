//! eBPF sampling: the only module that imports aya. Probes sources, loads and attaches the
//! embedded programs, and reads their maps (atomic adds on the BPF side: the watched cgroups'
//! counter slots in mmapable arrays, read from this process's mapping; every cgroup in shared
//! LRU hash maps before there is a watch list) into per-cgroup samples.
//!
//! - `probe`: kernel release, cgroup mode and v2 mount (from /proc/self/mountinfo).
//! - `pmu`: the local / remote DRAM event pair per CPU family, and whether its counts are
//!   believable (a ratio needs both sides).
//! - `tracefs`: format-file parsing (tracepoint field offsets differ between kernels).
//! - `btf`: task_struct member offsets from kernel BTF for the raw migration tracepoint.
//! - `loader`: loads the object, fills the config maps, attaches each source and reports it.
//! - `perfcpu`: the perf_event programs' events per CPU, kept in step with CPU hotplug.
//! - `sample`: [`Sampler`] — reads and folds the maps into a [`Sample`] per cgroup id, maps
//!   ids to paths, deletes entries of vanished cgroups, keeps the watch list.
//! - `slots`: which watched cgroup owns which counter slot (freed slots rest, then are zeroed
//!   before reuse), and the mapped arrays.
//! - `steal`: takes hypervisor steal time out of on-CPU time (both sources count wall time).
//! - `runq`: run-queue pressure per node from the run-queue lengths the cpu-clock samples read.
//!
//! CPU hotplug: the perf_event programs (cpu-clock sampler, DRAM pair) sample a CPU only through
//! an event opened on it, and the kernel drops a CPU's events when it goes offline and does not
//! bring them back when it returns. The daemon calls [`Sampler::sync_cpus`] with each rebuilt
//! topology (and each round while a CPU still lacks its events): it rewrites `CPU_NODE`, closes
//! the events of CPUs gone offline and opens them on CPUs (back) online, CPU by CPU — a CPU that
//! fails is logged and retried, the others keep sampling. A CPU that went offline and back
//! between two topology checks is found by its cpu-clock count standing still (`perfcpu`).
//! Userspace per-CPU state tolerates CPUs coming and going: run-queue and steal readings skip
//! CPUs absent from a reading or without enough samples, per-CPU arrays are sized for every
//! possible CPU.
//!
//! Without eBPF (not root, old kernel, `ebpf.enabled = false`, or built with
//! `REBALANCER_NO_EBPF=1`) [`Sampler::start`] returns no sampler and every source as skipped
//! with the reason; the daemon carries on without it.
use std::{collections::BTreeMap, path::PathBuf};

use serde::Serialize;

pub mod batch;
pub mod btf;
pub mod loader;
pub mod perfcpu;
pub mod pmu;
pub mod probe;
pub mod runq;
pub mod sample;
pub mod slots;
pub mod steal;
pub mod tracefs;

pub use sample::Sampler;

#[cfg(test)]
mod evidence_tests;

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("cannot mount tracefs at /sys/kernel/tracing")]
    Tracefs {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("map {0} missing from the eBPF object")]
    MissingMap(&'static str),
    #[error("cannot mmap map {map}")]
    Mmap {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Whether one source (program + attach point) runs on this kernel, and why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    pub name: String,
    pub available: bool,
    pub reason: String,
}

impl SourceStatus {
    pub fn ok(name: &str, reason: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            available: true,
            reason: reason.into(),
        }
    }
    pub fn skipped(name: &str, reason: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            available: false,
            reason: reason.into(),
        }
    }
}

/// What the kernel measured for one cgroup. [`Sampler::read`] returns cumulative values since
/// the sampler started; [`Sample::delta`] gives one period's worth.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// On-CPU nanoseconds per NUMA node.
    pub cpu_ns: BTreeMap<u32, u64>,
    pub migrations: u64,
    pub cross_node_migrations: u64,
    /// Task moves by the kernel NUMA balancer (move + swap).
    pub numa_moves: u64,
    /// NUMA-balancer moves that did not happen (sched_stick_numa).
    pub numa_stuck: u64,
    pub pages_migrated: u64,
    /// Pages migrated per migrate reason (names from the mm_migrate_pages format file).
    pub pages_by_reason: BTreeMap<String, u64>,
    /// NUMA hinting faults on pages local / remote to the faulting CPU.
    pub local_faults: u64,
    pub remote_faults: u64,
    /// PMU samples of the local / remote DRAM events (unscaled).
    pub local_samples: u64,
    pub remote_samples: u64,
    /// Local / remote DRAM accesses: each side's samples × its own period (see `pmu::scale`).
    pub local_events: u64,
    pub remote_events: u64,
    /// Both DRAM events were attached and trusted (`pmu::PmuHealth`) at this read: only then are
    /// the events evidence.
    pub pmu: bool,
}

/// The remote-access evidence of one period, as the controller takes it: a pair is `Some`
/// only when both of its sides were counted (a remote count alone is no ratio).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessEvidence {
    pub local_faults: Option<u64>,
    pub remote_faults: Option<u64>,
    pub local_events: Option<u64>,
    pub remote_events: Option<u64>,
}

impl AccessEvidence {
    /// Writes the evidence into a cgroup's observation.
    pub fn fill(&self, obs: &mut crate::controller::CgroupObs) {
        obs.local_faults = self.local_faults;
        obs.remote_faults = self.remote_faults;
        obs.local_events = self.local_events;
        obs.remote_events = self.remote_events;
    }
}

impl Sample {
    pub fn total_cpu_ns(&self) -> u64 {
        self.cpu_ns.values().fold(0, |a, &b| a.saturating_add(b))
    }

    /// This (delta) sample's remote-access evidence. Hinting faults (one kprobe counts both
    /// sides) when any were taken; PMU events when the pair is trusted and the cgroup has at
    /// least [`pmu::MIN_CGROUP_SAMPLES`] samples.
    pub fn access(&self) -> AccessEvidence {
        let faults = self.local_faults.saturating_add(self.remote_faults) > 0;
        let pmu = self.pmu
            && self.local_samples.saturating_add(self.remote_samples) >= pmu::MIN_CGROUP_SAMPLES;
        AccessEvidence {
            local_faults: faults.then_some(self.local_faults),
            remote_faults: faults.then_some(self.remote_faults),
            local_events: pmu.then_some(self.local_events),
            remote_events: pmu.then_some(self.remote_events),
        }
    }

    /// `self - earlier`, field by field, never below 0 (see the comment within).
    pub fn delta(&self, earlier: &Sample) -> Sample {
        // Counters go back only as a cgroup re-created at the same path (a new id counting
        // from 0) or as a local-includes-remote pair's scaled local events: the period reads
        // 0 then, never a lifetime. A watched cgroup's counters are never evicted (see
        // `slots`).
        let d = u64::saturating_sub;
        let map_delta = |a: &BTreeMap<u32, u64>, b: &BTreeMap<u32, u64>| {
            a.iter()
                .map(|(k, v)| (*k, d(*v, b.get(k).copied().unwrap_or(0))))
                .collect()
        };
        Sample {
            cpu_ns: map_delta(&self.cpu_ns, &earlier.cpu_ns),
            migrations: d(self.migrations, earlier.migrations),
            cross_node_migrations: d(self.cross_node_migrations, earlier.cross_node_migrations),
            numa_moves: d(self.numa_moves, earlier.numa_moves),
            numa_stuck: d(self.numa_stuck, earlier.numa_stuck),
            pages_migrated: d(self.pages_migrated, earlier.pages_migrated),
            pages_by_reason: self
                .pages_by_reason
                .iter()
                .map(|(k, v)| {
                    let before = earlier.pages_by_reason.get(k).copied().unwrap_or(0);
                    (k.clone(), d(*v, before))
                })
                .collect(),
            local_faults: d(self.local_faults, earlier.local_faults),
            remote_faults: d(self.remote_faults, earlier.remote_faults),
            local_samples: d(self.local_samples, earlier.local_samples),
            remote_samples: d(self.remote_samples, earlier.remote_samples),
            local_events: d(self.local_events, earlier.local_events),
            remote_events: d(self.remote_events, earlier.remote_events),
            pmu: self.pmu,
        }
    }
}

/// Deltas of every cgroup between two cumulative reads (cgroups new in `now` count from 0).
pub fn delta_all(
    now: &BTreeMap<u64, Sample>,
    before: &BTreeMap<u64, Sample>,
) -> BTreeMap<u64, Sample> {
    let empty = Sample::default();
    now.iter()
        .map(|(id, s)| (*id, s.delta(before.get(id).unwrap_or(&empty))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_never_reads_a_lifetime_and_keeps_new_keys() {
        let mut a = Sample::default();
        a.cpu_ns.insert(0, 100);
        a.migrations = 5;
        a.local_events = 900;
        a.pages_by_reason.insert("numa_misplaced".into(), 7);
        let mut b = Sample::default();
        b.cpu_ns.insert(0, 250);
        b.cpu_ns.insert(1, 10);
        // Went back: a cgroup re-created at the same path (a new id from 0), or the scaled
        // local events of a local-includes-remote pair. Never the whole count as one period.
        b.migrations = 3;
        b.local_events = 880;
        b.pages_by_reason.insert("numa_misplaced".into(), 9);
        let d = b.delta(&a);
        assert_eq!(d.cpu_ns, BTreeMap::from([(0, 150), (1, 10)]));
        assert_eq!(d.migrations, 0);
        assert_eq!(d.local_events, 0);
        assert_eq!(d.pages_by_reason["numa_misplaced"], 2);
        assert_eq!(d.total_cpu_ns(), 160);
        let all = delta_all(&BTreeMap::from([(7, b.clone())]), &BTreeMap::new());
        assert_eq!(all[&7], b);
    }
}

//! Local and remote DRAM accesses from the PMU: which pair of events to count on this CPU,
//! and whether what they count can be believed. Pure (the CPU identity is parsed from
//! /proc/cpuinfo text; the health check works on map totals); the loader attaches the pair.
//!
//! A remote ratio needs both sides: `1 − remote / (local + remote)` with the local side missing
//! would score every sampled cgroup 0% local. So the PMU is a locality source only when *both*
//! events attached, and only while [`PmuHealth`] trusts them: a side stuck at zero while the other
//! counts, or more events per on-CPU second than any memory system serves, drops the pair for
//! the sampler's life (with a warning and a metric); locality then comes from the other sources.
//!
//! Events, per CPU family (each scaled by its own sampling period):
//! - Intel: the generic `node-loads` / `node-load-misses` cache events. From Haswell on the
//!   kernel encodes them as OFFCORE_RESPONSE demand reads served by local / remote DRAM
//!   (arch/x86/events/intel/core.c, `hsw_`/`skl_`/… `hw_cache_extra_regs`); on Nehalem to Ivy
//!   Bridge `node-loads` counts *all* DRAM reads, so local = loads − misses there. The
//!   MEM_LOAD_L3_MISS_RETIRED.LOCAL_DRAM / REMOTE_DRAM events (raw `0x01d3` / `0x02d3`, Skylake-SP
//!   and later Xeons) can be configured instead (`ebpf.pmu_local_raw_event` / `pmu_raw_event`).
//! - AMD family 17h–1Ah (Zen 1–5): the kernel has no generic node events; PMCx043
//!   (`ls_refills_from_sys` / `ls_dmnd_fills_from_sys`) with umask 0x08 (DRAM or IO, near /
//!   local) and 0x40 (DRAM or IO, far / remote): raw `0x0843` / `0x4043`.
//! - Anything else: the generic pair, which the kernel refuses where it has no mapping (the
//!   source is then skipped with the reason).

/// Sampling period of the remote-DRAM event: one sample per this many events. Large enough
/// that even a remote-heavy workload (10^8 events/s per CPU) costs a few thousand samples/s.
pub const REMOTE_PERIOD: u64 = 10_007;
/// Sampling period of the local-DRAM event (local accesses are the common case: sampled more
/// sparsely). Prime, like the remote one, so neither beats with a loop's stride.
pub const LOCAL_PERIOD: u64 = 20_011;

/// Fewer PMU samples than this in one period for one cgroup give no PMU ratio (one sample is
/// no evidence of anything).
pub const MIN_CGROUP_SAMPLES: u64 = 8;

/// One PMU event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// PERF_TYPE_HW_CACHE node, read, access (perf's `node-loads`).
    NodeLoads,
    /// PERF_TYPE_HW_CACHE node, read, miss (perf's `node-load-misses`).
    NodeLoadMisses,
    /// PERF_TYPE_RAW with this config.
    Raw(u64),
}

impl Event {
    pub fn describe(self) -> String {
        match self {
            Event::NodeLoads => "node-loads".into(),
            Event::NodeLoadMisses => "node-load-misses".into(),
            Event::Raw(v) => format!("raw {v:#x}"),
        }
    }

    /// `perf_event_attr.config`: cache id | (op << 8) | (result << 16) for the generic events.
    pub fn perf_config(self) -> u64 {
        const PERF_COUNT_HW_CACHE_NODE: u64 = 6;
        const OP_READ: u64 = 0;
        const RESULT_ACCESS: u64 = 0;
        const RESULT_MISS: u64 = 1;
        match self {
            Event::NodeLoads => PERF_COUNT_HW_CACHE_NODE | (OP_READ << 8) | (RESULT_ACCESS << 16),
            Event::NodeLoadMisses => {
                PERF_COUNT_HW_CACHE_NODE | (OP_READ << 8) | (RESULT_MISS << 16)
            }
            Event::Raw(v) => v,
        }
    }
}

/// The pair of events counted, and how to read the local one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventPair {
    pub local: Event,
    pub remote: Event,
    /// The local event counts every DRAM read (remote ones too): local = local − remote.
    pub local_includes_remote: bool,
    /// Where the choice came from (for `probe` / `status`).
    pub why: String,
}

impl EventPair {
    /// "local: …, remote: …" with periods, for `probe` / `status`.
    pub fn describe(&self) -> String {
        format!(
            "local {} every {LOCAL_PERIOD}{}, remote {} every {REMOTE_PERIOD} ({})",
            self.local.describe(),
            if self.local_includes_remote {
                " (counts all DRAM reads: local = it − remote)"
            } else {
                ""
            },
            self.remote.describe(),
            self.why
        )
    }
}

/// Vendor, family and model of the first CPU in /proc/cpuinfo.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuId {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
}

impl CpuId {
    /// Parses the first processor block of /proc/cpuinfo (missing fields stay empty / 0).
    pub fn parse(cpuinfo: &str) -> CpuId {
        let mut id = CpuId::default();
        for line in cpuinfo.lines() {
            if line.trim().is_empty() && !id.vendor.is_empty() {
                break;
            }
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let v = v.trim();
            match k.trim() {
                "vendor_id" => id.vendor = v.to_string(),
                "cpu family" => id.family = v.parse().unwrap_or(0),
                "model" => id.model = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        id
    }
}

/// Intel family-6 models whose generic `node-loads` counts all DRAM reads (Nehalem, Westmere,
/// Sandy Bridge, Ivy Bridge: `nehalem_`/`snb_hw_cache_extra_regs`).
const INTEL_NODE_LOADS_ALL: [u32; 10] =
    [0x1a, 0x1e, 0x1f, 0x2e, 0x25, 0x2c, 0x2f, 0x2a, 0x2d, 0x3a];

/// The events to count: both configured raw events, else the family's documented pair. A
/// remote raw event without a local one is refused by config validation (it cannot give a
/// ratio).
pub fn choose(local_raw: Option<u64>, remote_raw: Option<u64>, cpu: &CpuId) -> EventPair {
    if let (Some(l), Some(r)) = (local_raw, remote_raw) {
        return EventPair {
            local: Event::Raw(l),
            remote: Event::Raw(r),
            local_includes_remote: false,
            why: "configured raw events".into(),
        };
    }
    match cpu.vendor.as_str() {
        "AuthenticAMD" | "HygonGenuine" if (0x17..=0x1a).contains(&cpu.family) => EventPair {
            local: Event::Raw(0x0843),
            remote: Event::Raw(0x4043),
            local_includes_remote: false,
            why: format!(
                "AMD family {:#x}: PMCx043 demand fills from DRAM near (umask 0x08) / far (0x40)",
                cpu.family
            ),
        },
        "GenuineIntel" => {
            let all = cpu.family == 6 && INTEL_NODE_LOADS_ALL.contains(&cpu.model);
            EventPair {
                local: Event::NodeLoads,
                remote: Event::NodeLoadMisses,
                local_includes_remote: all,
                why: format!(
                    "Intel family {} model {:#x}: generic node events, {}",
                    cpu.family,
                    cpu.model,
                    if all {
                        "node-loads = all DRAM reads on this generation"
                    } else {
                        "local / remote DRAM demand reads"
                    }
                ),
            }
        }
        v => EventPair {
            local: Event::NodeLoads,
            remote: Event::NodeLoadMisses,
            local_includes_remote: false,
            why: format!(
                "generic node events ({} family {:#x})",
                if v.is_empty() { "unknown CPU" } else { v },
                cpu.family
            ),
        },
    }
}

/// Local and remote access counts from the two sides' sample counts, each scaled by its own
/// period (an unbiased estimate of the event counts), saturating.
pub fn scale(pair_includes_remote: bool, local_samples: u64, remote_samples: u64) -> (u64, u64) {
    let remote = remote_samples.saturating_mul(REMOTE_PERIOD);
    let mut local = local_samples.saturating_mul(LOCAL_PERIOD);
    if pair_includes_remote {
        local = local.saturating_sub(remote);
    }
    (local, remote)
}

/// A side with this many samples while the other has none is taken as a counter stuck at 0.
pub const STUCK_SAMPLES: u64 = 200;
/// More DRAM accesses than this per on-CPU second (one per nanosecond per CPU) is beyond any
/// memory system: the counter counts something else.
pub const MAX_EVENTS_PER_CPU_S: f64 = 1e9;
/// Judged for implausible rates only once this much on-CPU time was sampled.
pub const MIN_CPU_NS: u64 = 1_000_000_000;
/// Both sides still at 0 after this much on-CPU time: the PMU does not count (a hypervisor's
/// virtual PMU that exposes the events but never counts them).
pub const SILENT_CPU_NS: u64 = 60_000_000_000;

/// Machine-wide totals since the sampler started (every cgroup summed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub local_samples: u64,
    pub remote_samples: u64,
    pub cpu_ns: u64,
}

/// Whether the attached pair is trusted; once dropped, dropped for good.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PmuHealth {
    dropped: Option<String>,
}

impl PmuHealth {
    /// Why the pair was dropped, if it was.
    pub fn dropped(&self) -> Option<&str> {
        self.dropped.as_deref()
    }

    pub fn trusted(&self) -> bool {
        self.dropped.is_none()
    }

    /// Checks cumulative totals; returns the reason when this call drops the pair (the caller
    /// warns and counts it once). `cpu_nodes`: nodes with CPUs (one node has no remote DRAM,
    /// so a remote side at 0 is then normal).
    pub fn check(&mut self, t: Totals, cpu_nodes: usize) -> Option<String> {
        if self.dropped.is_some() {
            return None;
        }
        let why = if t.local_samples == 0 && t.remote_samples >= STUCK_SAMPLES {
            Some(format!(
                "local-DRAM counter stuck at 0 while the remote one took {} samples",
                t.remote_samples
            ))
        } else if cpu_nodes >= 2 && t.remote_samples == 0 && t.local_samples >= STUCK_SAMPLES {
            Some(format!(
                "remote-DRAM counter stuck at 0 while the local one took {} samples",
                t.local_samples
            ))
        } else if t.local_samples == 0 && t.remote_samples == 0 && t.cpu_ns >= SILENT_CPU_NS {
            Some(format!(
                "no DRAM access counted in {:.0} CPU-seconds",
                t.cpu_ns as f64 / 1e9
            ))
        } else if t.cpu_ns >= MIN_CPU_NS {
            let (l, r) = scale(false, t.local_samples, t.remote_samples);
            let rate = (l as f64 + r as f64) / (t.cpu_ns as f64 / 1e9);
            (rate > MAX_EVENTS_PER_CPU_S).then(|| {
                format!(
                    "implausible: {rate:.2e} DRAM accesses per on-CPU second (limit {MAX_EVENTS_PER_CPU_S:.0e})"
                )
            })
        } else {
            None
        };
        self.dropped = why.clone();
        why
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const XEON: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Intel(R) Xeon(R) Gold 6148\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n";
    const EPYC: &str =
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n";
    const SNB: &str = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 45\n";

    #[test]
    fn events_per_family() {
        let x = CpuId::parse(XEON);
        assert_eq!(
            (x.vendor.as_str(), x.family, x.model),
            ("GenuineIntel", 6, 85)
        );
        let p = choose(None, None, &x);
        assert_eq!(
            (p.local, p.remote),
            (Event::NodeLoads, Event::NodeLoadMisses)
        );
        assert!(!p.local_includes_remote);
        assert!(choose(None, None, &CpuId::parse(SNB)).local_includes_remote);
        let a = choose(None, None, &CpuId::parse(EPYC));
        assert_eq!(
            (a.local, a.remote),
            (Event::Raw(0x0843), Event::Raw(0x4043))
        );
        let r = choose(Some(0x1d3), Some(0x2d3), &x);
        assert_eq!((r.local, r.remote), (Event::Raw(0x1d3), Event::Raw(0x2d3)));
        let u = choose(None, None, &CpuId::parse(""));
        assert_eq!(u.local, Event::NodeLoads);
        assert!(u.describe().contains("unknown CPU"), "{}", u.describe());
        assert!(p.describe().contains("local node-loads every 20011"));
        // perf's node-loads / node-load-misses
        assert_eq!(Event::NodeLoads.perf_config(), 0x6);
        assert_eq!(Event::NodeLoadMisses.perf_config(), 0x10006);
        assert_eq!(Event::Raw(0x4043).perf_config(), 0x4043);
    }

    #[test]
    fn each_side_scaled_by_its_period() {
        assert_eq!(scale(false, 3, 2), (3 * LOCAL_PERIOD, 2 * REMOTE_PERIOD));
        // node-loads counting all reads: the remote part comes off
        assert_eq!(
            scale(true, 1, 1),
            (LOCAL_PERIOD - REMOTE_PERIOD, REMOTE_PERIOD)
        );
        assert_eq!(scale(true, 0, 5).0, 0);
        assert_eq!(scale(false, u64::MAX, u64::MAX), (u64::MAX, u64::MAX));
    }

    #[test]
    fn health_drops_stuck_and_implausible_counters_once() {
        let t = |l, r, s: f64| Totals {
            local_samples: l,
            remote_samples: r,
            cpu_ns: (s * 1e9) as u64,
        };
        let mut h = PmuHealth::default();
        assert_eq!(h.check(t(0, 10, 5.0), 2), None, "too few samples to judge");
        assert_eq!(h.check(t(500, 40, 5.0), 2), None, "a normal mix");
        assert!(h.trusted());
        let why = h.check(t(0, STUCK_SAMPLES, 5.0), 2).unwrap();
        assert!(why.contains("local-DRAM counter stuck"), "{why}");
        assert!(!h.trusted());
        assert_eq!(h.check(t(0, 10_000, 5.0), 2), None, "reported once");
        assert_eq!(h.dropped(), Some(why.as_str()));

        let mut h = PmuHealth::default();
        assert_eq!(
            h.check(t(STUCK_SAMPLES, 0, 5.0), 1),
            None,
            "one node: no remote DRAM"
        );
        assert!(h
            .check(t(STUCK_SAMPLES, 0, 5.0), 2)
            .unwrap()
            .contains("remote-DRAM"));

        let mut h = PmuHealth::default();
        assert_eq!(h.check(t(0, 0, 59.0), 2), None);
        assert!(h
            .check(t(0, 0, 61.0), 2)
            .unwrap()
            .contains("no DRAM access"));

        // 10^6 samples × 20011 in 1 CPU-second: 2·10^10 accesses/s
        let mut h = PmuHealth::default();
        assert_eq!(
            h.check(t(1_000_000, 1, 0.5), 2),
            None,
            "not judged below 1 CPU-s"
        );
        assert!(h
            .check(t(1_000_000, 1, 1.0), 2)
            .unwrap()
            .contains("implausible"));
        let mut h = PmuHealth::default();
        assert_eq!(
            h.check(t(40_000, 4_000, 1.0), 2),
            None,
            "8.4e8/s: busy but possible"
        );
    }
}

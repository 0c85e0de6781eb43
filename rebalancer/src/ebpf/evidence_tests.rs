//! Every locality evidence through the real read path: injected slot contents →
//! [`fold_slots`] and [`pmu_check`] (PMU health, evidence marking), as a watching sampler reads
//! them, → per-period delta → [`Sample::access`] into the
//! cgroup's observation → `ControllerState::observe` → `plan` → the decision `explain` shows.

use std::collections::BTreeMap;

use super::{
    pmu::{self, Event, EventPair},
    sample::{fold_slots, pmu_check},
    slots::EVENT_WORDS,
    Sample,
};
use crate::{
    config::ControllerConfig,
    controller::{self, CgroupObs, ControllerState, Decision, Evidence, NodeObs, Observations},
    cpuset::CpuSet,
    topology::{Topology, TopologyBuilder},
};

const CG: u64 = 42;
const SEC: u64 = 1_000_000_000;
const MIB: u64 = 1 << 20;

fn machine() -> Topology {
    TopologyBuilder {
        sockets: 2,
        nodes_per_socket: 1,
        cores_per_node: 2,
        threads_per_core: 1,
        ..Default::default()
    }
    .build()
}

fn pair() -> EventPair {
    EventPair {
        local: Event::NodeLoads,
        remote: Event::NodeLoadMisses,
        local_includes_remote: false,
        why: "test".into(),
    }
}

/// Cumulative counters of the one cgroup, as the programs leave them in the maps.
#[derive(Clone, Copy, Default)]
struct Counts {
    cpu_ns_node0: u64,
    local_faults: u64,
    remote_faults: u64,
    local_samples: u64,
    remote_samples: u64,
}

impl Counts {
    /// `SLOT_CPU` (2 nodes per slot) and `SLOT_EVENTS` words with the cgroup in slot 1.
    fn slots(&self) -> (Vec<u64>, Vec<u64>) {
        let mut cpu = vec![0; 4];
        cpu[2] = self.cpu_ns_node0;
        let mut ev = vec![0; 2 * EVENT_WORDS];
        let e = &mut ev[EVENT_WORDS..];
        // `CgEvents`' fields in order: local / remote faults, remote / local DRAM samples.
        (e[5], e[6], e[7], e[8]) = (
            self.local_faults,
            self.remote_faults,
            self.remote_samples,
            self.local_samples,
        );
        (cpu, ev)
    }
}

/// The daemon's read path for one cgroup whose threads run on node 0 (CPUs 0-1, mems 0-1).
struct Pipe {
    pmu: Option<EventPair>,
    health: pmu::PmuHealth,
    prev: Sample,
    state: ControllerState,
    counts: Counts,
    dropped: Option<String>,
    /// Memory per node, MiB.
    mem: Vec<(u32, u64)>,
}

impl Pipe {
    fn new(pmu: Option<EventPair>, mem: &[(u32, u64)]) -> Pipe {
        Pipe {
            pmu,
            health: pmu::PmuHealth::default(),
            prev: Sample::default(),
            state: ControllerState::default(),
            counts: Counts::default(),
            dropped: None,
            mem: mem.to_vec(),
        }
    }

    /// One period: a CPU-second on node 0 plus `add` to the counters; returns the decision.
    fn period(&mut self, add: Counts) -> Decision {
        let c = &mut self.counts;
        c.cpu_ns_node0 += SEC;
        c.local_faults += add.local_faults;
        c.remote_faults += add.remote_faults;
        c.local_samples += add.local_samples;
        c.remote_samples += add.remote_samples;
        let (cpu, ev) = c.slots();
        let mut all = fold_slots(
            &BTreeMap::from([(CG, 1)]),
            |i| cpu[i],
            |i| ev[i],
            2,
            &[],
            self.pmu.as_ref().is_some_and(|p| p.local_includes_remote),
        );
        let dropped = pmu_check(&mut all, self.pmu.as_ref(), &mut self.health, 2);
        if dropped.is_some() {
            self.dropped = dropped;
        }
        let now = all.get(&CG).cloned().unwrap_or_default();
        let delta = now.delta(&self.prev);
        self.prev = now;
        let mut o = CgroupObs {
            id: "w".into(),
            cpu_ns_per_node: delta.cpu_ns.clone(),
            mem_bytes_per_node: self.mem.iter().map(|&(n, m)| (n, m * MIB)).collect(),
            cpus: CpuSet::parse("0-1").unwrap(),
            mems: CpuSet::parse("0-1").unwrap(),
            ..Default::default()
        };
        delta.access().fill(&mut o);
        let obs = Observations {
            period_ns: SEC,
            cgroups: vec![o],
            nodes: (0..2)
                .map(|n| {
                    (
                        n,
                        NodeObs {
                            cpu_busy: 0.2,
                            free_bytes: 8 << 30,
                            free_hugepage_bytes: 0,
                            runnable: None,
                        },
                    )
                })
                .collect(),
            reserved_cpus: CpuSet::new(),
        };
        let cfg = ControllerConfig::default();
        self.state.observe(&obs, crate::controller::EWMA_ALPHA);
        let plan = controller::plan(&machine(), &obs, &self.state, &cfg, 1_000_000);
        plan.decision("w").unwrap().clone()
    }
}

fn faults(local: u64, remote: u64) -> Counts {
    Counts {
        local_faults: local,
        remote_faults: remote,
        ..Default::default()
    }
}

fn samples(local: u64, remote: u64) -> Counts {
    Counts {
        local_samples: local,
        remote_samples: remote,
        ..Default::default()
    }
}

fn approx(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn hinting_faults_score_the_period() {
    // Memory on the CPUs' node (share model: 1.0), but the faults say 3 of 4 accesses remote.
    let mut p = Pipe::new(None, &[(0, 256)]);
    let d = p.period(faults(10, 30));
    assert_eq!(d.evidence, Some(Evidence::HintingFaults));
    assert!(approx(d.locality, 0.25), "{d:?}");
}

#[test]
fn pmu_scores_local_where_the_share_model_sees_remote() {
    // Memory on node 1, threads on node 0: the share model says 0 and would move it. The DRAM
    // counters say its accesses are local (its hot set is local): healthy, nothing moves.
    let mut p = Pipe::new(Some(pair()), &[(1, 256)]);
    let d = p.period(samples(990, 10));
    assert_eq!(d.evidence, Some(Evidence::Pmu));
    assert!(d.locality.unwrap() > 0.99, "{d:?}");
    assert_eq!(kind(&d), "healthy");
    // The remote workload: remote, and a candidate.
    let mut p = Pipe::new(Some(pair()), &[(0, 200), (1, 56)]);
    let d = p.period(samples(10, 990));
    assert_eq!(d.evidence, Some(Evidence::Pmu));
    assert!(d.locality.unwrap() < 0.02, "{d:?}");
    assert!(d.trigger.is_some(), "{d:?}");
}

#[test]
fn remote_samples_without_a_local_counter_never_score_zero() {
    // The local event did not attach (pair None): remote samples in the map are no evidence.
    let mut p = Pipe::new(None, &[(0, 256)]);
    let d = p.period(samples(0, 5_000));
    assert_eq!(d.evidence, Some(Evidence::ShareModel));
    assert!(approx(d.locality, 1.0), "{d:?}");
    assert_eq!(kind(&d), "healthy");
}

#[test]
fn a_stuck_local_counter_is_dropped_not_read_as_remote() {
    let mut p = Pipe::new(Some(pair()), &[(0, 256)]);
    let d = p.period(samples(0, pmu::STUCK_SAMPLES));
    assert!(
        p.dropped.as_deref().unwrap().contains("stuck"),
        "{:?}",
        p.dropped
    );
    assert_eq!(d.evidence, Some(Evidence::ShareModel));
    assert!(approx(d.locality, 1.0), "{d:?}");
    // Dropped for good: later healthy-looking counts are not believed either.
    let d = p.period(samples(500, 10));
    assert_eq!(d.evidence, Some(Evidence::ShareModel));
}

#[test]
fn too_few_samples_are_no_evidence() {
    let mut p = Pipe::new(Some(pair()), &[(0, 256)]);
    let d = p.period(samples(0, pmu::MIN_CGROUP_SAMPLES - 1));
    assert_eq!(d.evidence, Some(Evidence::ShareModel));
    let d = p.period(samples(0, pmu::MIN_CGROUP_SAMPLES));
    assert_eq!(d.evidence, Some(Evidence::Pmu));
    assert!(approx(d.locality, 0.0));
}

#[test]
fn faults_one_period_pmu_the_next_share_model_the_third() {
    let alpha = crate::controller::EWMA_ALPHA;
    let mut p = Pipe::new(Some(pair()), &[(0, 128), (1, 128)]);
    let d1 = p.period(faults(10, 30));
    assert_eq!(d1.evidence, Some(Evidence::HintingFaults));
    assert!(approx(d1.smoothed, 0.25));
    // Next period AutoNUMA is off: no faults, the PMU counts 3:1 local (by events).
    let d2 = p.period(samples(3 * pmu::REMOTE_PERIOD, pmu::LOCAL_PERIOD));
    assert_eq!(d2.evidence, Some(Evidence::Pmu));
    assert!(approx(d2.locality, 0.75), "{d2:?}");
    // A history one period old (weight alpha) weighs the second period more than alpha.
    let old = alpha * (1.0 - alpha);
    assert!(approx(
        d2.smoothed,
        (old * 0.25 + alpha * 0.75) / (old + alpha)
    ));
    assert_eq!(
        d2.smoothed_from.iter().collect::<BTreeMap<_, _>>(),
        BTreeMap::from([(Evidence::HintingFaults, 1), (Evidence::Pmu, 1)])
    );
    // Then nothing but CPU time and memory: half the memory is local.
    let d3 = p.period(Counts::default());
    assert_eq!(d3.evidence, Some(Evidence::ShareModel));
    assert!(approx(d3.locality, 0.5));
    assert_eq!(d3.smoothed_from.get(&Evidence::ShareModel), Some(&1));
    // explain shows both the period's evidence and what the smoothed score rests on.
    let v = serde_json::to_value(&d3).unwrap();
    assert_eq!(v["evidence"], "share-model");
    assert_eq!(v["smoothed_from"]["hinting-faults"], 1);
    assert_eq!(v["smoothed_from"]["pmu"], 1);
}

fn kind(d: &Decision) -> String {
    serde_json::to_value(&d.outcome).unwrap()["outcome"]
        .as_str()
        .unwrap()
        .to_string()
}

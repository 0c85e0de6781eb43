//! The guest scenarios: one entry per script in tests/vm/scenarios/<name>.sh.
//!
//! To add a scenario: write the script (source /vm/lib.sh, print one `VERDICT <name> …` line,
//! or data blocks for a host judge), then add one entry here. A test keeps the two in step.
use super::{
    judge,
    topology::VmTopology,
    verdict::{guest_verdicts, Section, Status, Verdict},
};

pub type HostJudge = fn(&Section, &VmTopology) -> Vec<Verdict>;

pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    /// Guest-side time limit (busybox `timeout`), seconds.
    pub timeout_s: u32,
    /// Part of a run without `--scenario`.
    pub default: bool,
    /// Topologies a run without `--scenario` boots it on (empty: every one). For scenarios whose
    /// subject does not depend on the NUMA layout, to keep the default run short.
    pub topologies: &'static [&'static str],
    /// `None`: the guest prints its verdict; `Some`: the host judges the data blocks (a guest
    /// SKIP or FAIL still stands).
    pub host_judge: Option<HostJudge>,
}

pub const ALL: &[Scenario] = &[
    Scenario {
        name: "topology",
        about: "guest /sys and `rebalancer topology --json` match the QEMU command line",
        timeout_s: 60,
        default: true,
        topologies: &[],
        host_judge: Some(judge::topology),
    },
    Scenario {
        name: "rebalance-control",
        about:
            "numa_balancing=0: remote pages stay remote without a daemon; =1: AutoNUMA moves them",
        timeout_s: 150,
        default: true,
        topologies: &[],
        host_judge: None,
    },
    Scenario {
        name: "sampling",
        about: "`rebalancer sample`: per-node CPU time, cross-node migrations and run queues, none once pinned",
        timeout_s: 90,
        default: true,
        topologies: &[],
        host_judge: Some(judge::sampling),
    },
    Scenario {
        name: "rebalance",
        about: "with the daemon and numa_balancing=0, a remote process ends >= 95% local",
        timeout_s: 240,
        default: true,
        topologies: &[],
        host_judge: None,
    },
    Scenario {
        name: "staged",
        about:
            "4x more remote memory than the round budget: moved in stages, never past the budget",
        timeout_s: 270,
        default: true,
        topologies: &[],
        host_judge: None,
    },
    Scenario {
        name: "admission",
        about: "Kubernetes-layout cgroups get cpusets and mems from the watcher",
        timeout_s: 60,
        default: true,
        topologies: &[],
        host_judge: None,
    },
    Scenario {
        name: "fresh-start",
        about: "no checkpoint, 4 running containers with memory off their node (48 MiB each; 1 GiB with --node-mem-mib 4096): adopted where they run, nothing migrated at start, memory moved in stages within the budget, every admission within NRI's 2 s timeout",
        timeout_s: 420,
        default: true,
        topologies: &["2node"],
        host_judge: None,
    },
    Scenario {
        name: "hotset",
        about: "hot 32 MiB remote, 224 MiB cold local: the daemon alone with its defaults fixes it no later than AutoNUMA",
        timeout_s: 420,
        default: false,
        topologies: &["2node"],
        host_judge: None,
    },
    Scenario {
        name: "consolidate",
        about: "a spread, migration-heavy BestEffort container is consolidated; sampled cross-node migrations fall",
        timeout_s: 240,
        default: false,
        topologies: &["2node"],
        host_judge: None,
    },
    Scenario {
        name: "restart",
        about: "kill -9 mid-round and restart: no double allocation, no empty cpuset",
        timeout_s: 90,
        default: true,
        topologies: &[],
        host_judge: None,
    },
    Scenario {
        name: "bad-input",
        about: "malformed API requests and config leave the daemon and cpusets intact",
        timeout_s: 120,
        default: true,
        topologies: &["2node"],
        host_judge: None,
    },
    Scenario {
        name: "hotplug",
        about: "a CPU taken offline and back online is sampled by the daemon's eBPF sampler again",
        timeout_s: 300,
        default: true,
        topologies: &["2node"],
        host_judge: None,
    },
    Scenario {
        name: "round-latency",
        about: "admission and /healthz latency while a round migrates 1 GiB (--node-mem-mib 1536)",
        timeout_s: 240,
        default: false,
        topologies: &["2node"],
        host_judge: None,
    },
    Scenario {
        name: "migrate-rate",
        about: "pages/s of each migration path (cpuset.mems, move_pages batches, migrate_pages) for a running / stopped / frozen hog",
        timeout_s: 1500,
        default: false,
        topologies: &["2node"],
        host_judge: None,
    },
    Scenario {
        name: "written-cost",
        about: "what the written-pages source costs a busy writer (pages written, minor faults) beside no manager and AutoNUMA",
        timeout_s: 420,
        default: false,
        topologies: &["2node"],
        host_judge: None,
    },
    Scenario {
        name: "selftest-fail",
        about: "harness self-test: always FAILs, so `vm-test --scenario selftest-fail` must fail",
        timeout_s: 10,
        default: false,
        topologies: &[],
        host_judge: None,
    },
];

pub fn by_name(name: &str) -> Option<&'static Scenario> {
    ALL.iter().find(|s| s.name == name)
}

impl Scenario {
    /// Whether a run without `--scenario` boots this scenario on `topology`.
    pub fn by_default_on(&self, topology: &str) -> bool {
        self.default && (self.topologies.is_empty() || self.topologies.contains(&topology))
    }

    /// Verdicts for this scenario from its console section (`None`: it never started).
    pub fn verdicts(&self, s: Option<&Section>, topo: &VmTopology) -> Vec<Verdict> {
        let Some(s) = s else {
            return vec![Verdict::new(
                self.name,
                Status::Fail,
                "never started (guest crashed or timed out before it)",
            )];
        };
        match self.host_judge {
            None => guest_verdicts(s),
            Some(judge) => {
                let own: Vec<Verdict> = s
                    .verdicts()
                    .into_iter()
                    .filter(|v| v.status != Status::Pass)
                    .collect();
                if own.is_empty() {
                    judge(s, topo)
                } else {
                    own
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_has_a_script_and_every_script_a_scenario() {
        let dir = crate::root().join("tests/vm/scenarios");
        let mut scripts: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|f| f.strip_suffix(".sh").map(str::to_string))
            .collect();
        scripts.sort();
        let mut names: Vec<String> = ALL.iter().map(|s| s.name.to_string()).collect();
        names.sort();
        assert_eq!(scripts, names);
    }

    #[test]
    fn topology_restrictions_name_real_topologies() {
        for s in ALL {
            for t in s.topologies {
                assert!(
                    super::super::topology::by_name(t).is_some(),
                    "{}: {t}",
                    s.name
                );
            }
        }
        let b = by_name("bad-input").unwrap();
        assert!(b.by_default_on("2node") && !b.by_default_on("memonly"));
        assert!(by_name("admission").unwrap().by_default_on("memonly"));
        assert!(!by_name("selftest-fail").unwrap().by_default_on("2node"));
    }

    #[test]
    fn host_judged_scenarios_keep_a_guest_skip() {
        let t = super::super::topology::by_name("2node").unwrap();
        let s = super::super::verdict::parse(
            "SCENARIO-BEGIN sampling\nVERDICT sampling SKIP no sample subcommand\nSCENARIO-END sampling rc=0\n",
        );
        let v = by_name("sampling")
            .unwrap()
            .verdicts(s.sections.first(), &t);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].status, Status::Skip);
        let v = by_name("rebalance").unwrap().verdicts(None, &t);
        assert_eq!(v[0].status, Status::Fail);
    }
}

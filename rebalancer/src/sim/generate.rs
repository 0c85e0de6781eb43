//! Seeded workload generators: the same kind and seed always give the same trace (a SplitMix64
//! stream, no external RNG). Kinds: a multi-tenant overcommitted node, databases on large
//! hugepage memory, GPU jobs tied to their device's node, and a churn storm. Traces are sized
//! for 64–128-CPU, 4–8-node machines (the EPYC NPS4 and Intel SNC fixtures).

use std::collections::BTreeMap;

use crate::placement::pod::{Container, Pod};
use crate::topology::{DeviceClass, PciDevice};

use super::workload::{MachineAdditions, Phase, Task, Workload};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The trace kinds `--generate` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    MultiTenant,
    Database,
    Gpu,
    ChurnStorm,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::MultiTenant => "multi-tenant",
            Kind::Database => "database",
            Kind::Gpu => "gpu",
            Kind::ChurnStorm => "churn-storm",
        }
    }
}

/// SplitMix64: tiny, seedable, good enough for traces.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi), rounded to 1e-3 (so the JSON round trip is exact).
    pub fn f64(&mut self, lo: f64, hi: f64) -> f64 {
        let x = lo + (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo);
        (x * 1000.0).round() / 1000.0
    }

    /// Uniform in [lo, hi] (hi ≥ lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// Generates one trace.
pub fn generate(kind: Kind, seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let (duration_s, machine, tasks) = match kind {
        Kind::MultiTenant => multi_tenant(&mut rng),
        Kind::Database => database(&mut rng),
        Kind::Gpu => gpu(&mut rng),
        Kind::ChurnStorm => churn(&mut rng),
    };
    Workload {
        name: kind.name().into(),
        seed,
        duration_s,
        machine,
        tasks,
    }
}

fn pod(uid: String, c: Container) -> Pod {
    Pod {
        uid,
        containers: vec![Container {
            name: "main".into(),
            ..c
        }],
        init_containers: Vec::new(),
    }
}

fn burstable(req_m: u64, lim_m: u64, mem: u64) -> Container {
    Container {
        cpu_request_millis: req_m,
        cpu_limit_millis: lim_m,
        memory_bytes: mem,
        memory_limit_bytes: mem * 2,
        ..Default::default()
    }
}

/// CPU-heavy ↔ memory-heavy phases every `lo..=hi` seconds until `until_s`.
fn alternating(rng: &mut Rng, req_cpus: f64, max_cpus: f64, until_s: u64) -> Vec<Phase> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut cpu_heavy = rng.range(0, 1) == 0;
    while at < until_s {
        out.push(if cpu_heavy {
            Phase {
                at_s: at,
                cpus: rng.f64(req_cpus, max_cpus),
                mem_intensity: rng.f64(0.05, 0.2),
                cross_node_migrations_per_s: 0.0,
                io_intensity: 0.0,
                grow_bytes_per_s: rng.range(0, 2) * MIB,
            }
        } else {
            Phase {
                at_s: at,
                cpus: rng.f64(req_cpus * 0.5, req_cpus),
                mem_intensity: rng.f64(0.45, 0.8),
                cross_node_migrations_per_s: 0.0,
                io_intensity: 0.0,
                grow_bytes_per_s: rng.range(4, 24) * MIB,
            }
        });
        cpu_heavy = !cpu_heavy;
        at += rng.range(60, 180);
    }
    out
}

type Trace = (u64, MachineAdditions, Vec<Task>);

fn multi_tenant(rng: &mut Rng) -> Trace {
    let duration = 600;
    let mut tasks = Vec::new();
    for i in 0..52 {
        let req = rng.range(2, 8) * 250;
        let arrive = if i < 40 { 0 } else { rng.range(30, 300) };
        let req_cpus = req as f64 / 1000.0;
        tasks.push(Task {
            pod: pod(
                format!("tenant-{i:02}"),
                burstable(req, req * 4, rng.range(1, 4) * GIB),
            ),
            arrive_s: arrive,
            leave_s: (rng.range(0, 3) == 0).then(|| arrive + rng.range(120, 400)),
            initial_mem_bytes: rng.range(512, 4096) * MIB,
            hugepages: false,
            phases: alternating(rng, req_cpus, req_cpus * 4.0, duration),
        });
    }
    for i in 0..6 {
        let arrive = rng.range(0, 400);
        tasks.push(Task {
            pod: pod(format!("batch-{i}"), Container::default()),
            arrive_s: arrive,
            leave_s: Some(arrive + rng.range(60, 200)),
            initial_mem_bytes: rng.range(1, 6) * GIB,
            hugepages: false,
            phases: vec![Phase {
                at_s: 0,
                cpus: rng.f64(2.0, 6.0),
                mem_intensity: rng.f64(0.3, 0.7),
                cross_node_migrations_per_s: 0.0,
                io_intensity: 0.0,
                grow_bytes_per_s: rng.range(8, 32) * MIB,
            }],
        });
    }
    (duration, MachineAdditions::default(), tasks)
}

fn database(rng: &mut Rng) -> Trace {
    let duration = 600;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let huge = rng.range(8, 16) * GIB;
        let c = Container {
            cpu_request_millis: 8000,
            cpu_limit_millis: 8000,
            memory_bytes: 4 * GIB,
            memory_limit_bytes: 4 * GIB,
            hugepages_1gi_bytes: huge,
            ..Default::default()
        };
        let mut phases = Vec::new();
        let mut at = 0;
        let mut oltp = true;
        while at < duration {
            phases.push(Phase {
                at_s: at,
                cpus: if oltp { 7.5 } else { 5.0 },
                mem_intensity: if oltp { 0.5 } else { 0.85 },
                cross_node_migrations_per_s: 0.0,
                io_intensity: 0.0,
                grow_bytes_per_s: 0,
            });
            oltp = !oltp;
            at += rng.range(90, 200);
        }
        tasks.push(Task {
            pod: pod(format!("db-{i}"), c),
            arrive_s: i * 20,
            leave_s: None,
            initial_mem_bytes: huge,
            hugepages: true,
            phases,
        });
    }
    for i in 0..24 {
        let req = rng.range(2, 6) * 250;
        let arrive = rng.range(0, 300);
        let req_cpus = req as f64 / 1000.0;
        tasks.push(Task {
            pod: pod(format!("app-{i:02}"), burstable(req, req * 3, 2 * GIB)),
            arrive_s: arrive,
            leave_s: (rng.range(0, 2) == 0).then(|| arrive + rng.range(100, 300)),
            initial_mem_bytes: rng.range(256, 2048) * MIB,
            hugepages: false,
            phases: alternating(rng, req_cpus, req_cpus * 2.5, duration),
        });
    }
    let machine = MachineAdditions {
        devices: Vec::new(),
        hugepages_1g_per_node: Some(12),
    };
    (duration, machine, tasks)
}

fn gpu(rng: &mut Rng) -> Trace {
    let duration = 600;
    let devices = (0..4)
        .map(|i| PciDevice {
            address: format!("0000:s{i}:00.0"),
            class: DeviceClass::Gpu,
            node: Some(i),
            vendor: Some("0x10de".into()),
            device: None,
        })
        .collect();
    let mut tasks = Vec::new();
    for i in 0..10 {
        let arrive = rng.range(0, 400);
        let mut c = burstable(4000, 8000, 8 * GIB);
        c.devices = BTreeMap::from([("nvidia.com/gpu".to_string(), 1)]);
        tasks.push(Task {
            pod: pod(format!("train-{i}"), c),
            arrive_s: arrive,
            leave_s: Some(arrive + rng.range(120, 300)),
            initial_mem_bytes: rng.range(4, 12) * GIB,
            hugepages: false,
            phases: vec![
                Phase {
                    at_s: 0,
                    cpus: 6.0,
                    mem_intensity: 0.5,
                    cross_node_migrations_per_s: 0.0,
                    io_intensity: 0.1,
                    grow_bytes_per_s: 32 * MIB,
                },
                Phase {
                    at_s: rng.range(30, 60),
                    cpus: 4.0,
                    mem_intensity: 0.25,
                    cross_node_migrations_per_s: 0.0,
                    io_intensity: 0.4,
                    grow_bytes_per_s: 0,
                },
            ],
        });
    }
    for i in 0..24 {
        let req = rng.range(2, 8) * 250;
        let req_cpus = req as f64 / 1000.0;
        tasks.push(Task {
            pod: pod(format!("web-{i:02}"), burstable(req, req * 4, GIB)),
            arrive_s: rng.range(0, 60),
            leave_s: None,
            initial_mem_bytes: rng.range(256, 3072) * MIB,
            hugepages: false,
            phases: alternating(rng, req_cpus, req_cpus * 3.0, duration),
        });
    }
    let machine = MachineAdditions {
        devices,
        hugepages_1g_per_node: None,
    };
    (duration, machine, tasks)
}

fn churn(rng: &mut Rng) -> Trace {
    let duration = 300;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let req = rng.range(2, 8) * 250;
        let req_cpus = req as f64 / 1000.0;
        tasks.push(Task {
            pod: pod(format!("svc-{i:02}"), burstable(req, req * 2, 2 * GIB)),
            arrive_s: 0,
            leave_s: None,
            initial_mem_bytes: rng.range(1, 4) * GIB,
            hugepages: false,
            phases: alternating(rng, req_cpus, req_cpus * 2.0, duration),
        });
    }
    let mut n = 0;
    for t in 60..180 {
        for _ in 0..rng.range(1, 5) {
            let req = rng.range(1, 8) * 250;
            let req_cpus = req as f64 / 1000.0;
            tasks.push(Task {
                pod: pod(format!("job-{n:04}"), burstable(req, req * 2, GIB / 2)),
                arrive_s: t,
                leave_s: Some(t + rng.range(5, 40)),
                initial_mem_bytes: rng.range(128, 1024) * MIB,
                hugepages: false,
                phases: vec![Phase {
                    at_s: 0,
                    cpus: rng.f64(req_cpus * 0.5, req_cpus * 2.0),
                    mem_intensity: rng.f64(0.1, 0.7),
                    cross_node_migrations_per_s: 0.0,
                    io_intensity: 0.0,
                    grow_bytes_per_s: rng.range(0, 16) * MIB,
                }],
            });
            n += 1;
        }
    }
    (duration, MachineAdditions::default(), tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_seeded_and_valid() {
        for kind in [
            Kind::MultiTenant,
            Kind::Database,
            Kind::Gpu,
            Kind::ChurnStorm,
        ] {
            let a = generate(kind, 7);
            a.validate().unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            assert_eq!(a, generate(kind, 7), "{kind:?} not deterministic");
            assert_ne!(a, generate(kind, 8), "{kind:?} ignores the seed");
            let text = serde_json::to_string(&a).unwrap();
            assert_eq!(
                Workload::from_json(&text).unwrap(),
                a,
                "{kind:?} round trip"
            );
        }
    }
}

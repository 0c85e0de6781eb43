//! The simulator's NUMA cost model (pure arithmetic, no state).
//!
//! A workload spends a fraction `mem_intensity` of its all-local time waiting on memory and
//! `io_intensity` on its device; the rest is compute. A memory access from node `n` to node `m`
//! costs `local_ns × distance(n, m) / 10` (SLIT), stretched by the bandwidth saturation of node
//! `m` (demanded bytes/s over the node's bandwidth, never below 1). CPU contention stretches
//! everything by `max(1, demand / CPUs)` of the node the thread runs on. The all-local,
//! uncontended ideal has slowdown 1.0. Migrating memory costs `migrate_s_per_gib` CPU-seconds;
//! a cross-node scheduler migration of a thread `cross_node_migration_us` of CPU time.

use serde::{Deserialize, Serialize};

/// Constants of the model; defaults are round figures for a current x86 server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostModel {
    /// Latency of a local DRAM access, ns (distance 10).
    pub local_ns: f64,
    /// DRAM bandwidth of one node, bytes/s.
    pub node_bandwidth: f64,
    /// Memory traffic of one fully memory-bound CPU, bytes/s (with prefetch / MLP).
    pub cpu_peak_traffic: f64,
    /// CPU-seconds spent per GiB of pages migrated (copy + TLB shootdowns + faults).
    pub migrate_s_per_gib: f64,
    /// AutoNUMA-like baseline: bytes per second per workload moved toward its threads.
    pub autonuma_bytes_per_s: u64,
    /// CPU time one cross-node scheduler migration costs (caches refilled remotely), µs.
    pub cross_node_migration_us: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            local_ns: 80.0,
            node_bandwidth: 40e9,
            cpu_peak_traffic: 4e9,
            migrate_s_per_gib: 0.3,
            autonuma_bytes_per_s: 64 << 20,
            cross_node_migration_us: 50.0,
        }
    }
}

/// One (thread node, memory node) pair of a workload's accesses: its share, the SLIT
/// distance and the saturation of the memory's node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    pub weight: f64,
    pub distance: u32,
    pub mem_saturation: f64,
}

impl CostModel {
    /// Access latency at a SLIT distance, ns.
    pub fn latency_ns(&self, distance: u32) -> f64 {
        self.local_ns * f64::from(distance) / 10.0
    }

    /// Stretch of memory accesses on a node asked for `demand` bytes/s (≥ 1).
    pub fn saturation(&self, demand_bytes_per_s: f64) -> f64 {
        if self.node_bandwidth <= 0.0 || !demand_bytes_per_s.is_finite() {
            return 1.0;
        }
        (demand_bytes_per_s / self.node_bandwidth).max(1.0)
    }

    /// Stretch of CPU time on a node whose threads want `demand` CPUs of `cpus` (≥ 1).
    pub fn contention(demand: f64, cpus: usize) -> f64 {
        if cpus == 0 {
            return 1.0;
        }
        (demand / cpus as f64).max(1.0)
    }

    /// Memory traffic of a workload running `cpus` CPUs at `mem_intensity`, bytes/s.
    pub fn traffic(&self, cpus: f64, mem_intensity: f64) -> f64 {
        cpus.max(0.0) * mem_intensity.clamp(0.0, 1.0) * self.cpu_peak_traffic
    }

    /// Slowdown of a workload vs the all-local ideal: compute part, memory part (distance ×
    /// saturation over `pairs`), device part (distance of its threads to the device), all
    /// stretched by `cpu_contention`.
    pub fn slowdown(
        &self,
        mem_intensity: f64,
        io_intensity: f64,
        pairs: &[Pair],
        device_distance: f64,
        cpu_contention: f64,
    ) -> f64 {
        let f = mem_intensity.clamp(0.0, 1.0);
        let io = io_intensity.clamp(0.0, 1.0 - f);
        let wsum: f64 = pairs.iter().map(|p| p.weight).sum();
        let mem = if wsum > 0.0 {
            pairs
                .iter()
                .map(|p| p.weight / wsum * f64::from(p.distance) / 10.0 * p.mem_saturation)
                .sum::<f64>()
        } else {
            1.0
        };
        cpu_contention.max(1.0) * ((1.0 - f - io) + f * mem + io * device_distance / 10.0)
    }

    /// CPU-seconds to migrate `bytes`.
    pub fn migration_cost_s(&self, bytes: u64) -> f64 {
        bytes as f64 / (1u64 << 30) as f64 * self.migrate_s_per_gib
    }
}

/// Local share of accesses: the weight of pairs at the local distance (10).
pub fn locality(pairs: &[Pair]) -> Option<f64> {
    let wsum: f64 = pairs.iter().map(|p| p.weight).sum();
    if wsum <= 0.0 {
        return None;
    }
    let local: f64 = pairs
        .iter()
        .filter(|p| p.distance <= 10)
        .map(|p| p.weight)
        .sum();
    Some(local / wsum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(weight: f64, distance: u32, sat: f64) -> Pair {
        Pair {
            weight,
            distance,
            mem_saturation: sat,
        }
    }

    struct Case {
        name: &'static str,
        mem: f64,
        io: f64,
        pairs: Vec<Pair>,
        dev: f64,
        cpu: f64,
        want: f64,
    }

    fn check(c: &Case) {
        let m = CostModel::default();
        let got = m.slowdown(c.mem, c.io, &c.pairs, c.dev, c.cpu);
        assert!(
            (got - c.want).abs() < 1e-9,
            "{}: got {got}, want {}",
            c.name,
            c.want
        );
    }

    #[test]
    fn slowdown_table() {
        let cases = [
            Case {
                name: "all local is the ideal",
                mem: 0.5,
                io: 0.0,
                pairs: vec![p(1.0, 10, 1.0)],
                dev: 10.0,
                cpu: 1.0,
                want: 1.0,
            },
            Case {
                name: "all remote at 32 on EPYC, half memory-bound",
                mem: 0.5,
                io: 0.0,
                pairs: vec![p(1.0, 32, 1.0)],
                dev: 10.0,
                cpu: 1.0,
                want: 0.5 + 0.5 * 3.2,
            },
            Case {
                name: "half remote at 21",
                mem: 1.0,
                io: 0.0,
                pairs: vec![p(0.5, 10, 1.0), p(0.5, 21, 1.0)],
                dev: 10.0,
                cpu: 1.0,
                want: 1.55,
            },
            Case {
                name: "saturated local node doubles memory time",
                mem: 0.4,
                io: 0.0,
                pairs: vec![p(1.0, 10, 2.0)],
                dev: 10.0,
                cpu: 1.0,
                want: 0.6 + 0.8,
            },
            Case {
                name: "CPU contention stretches everything",
                mem: 0.0,
                io: 0.0,
                pairs: vec![],
                dev: 10.0,
                cpu: 1.5,
                want: 1.5,
            },
            Case {
                name: "remote device",
                mem: 0.0,
                io: 0.3,
                pairs: vec![],
                dev: 21.0,
                cpu: 1.0,
                want: 0.7 + 0.3 * 2.1,
            },
            Case {
                name: "intensities are clamped",
                mem: 2.0,
                io: 1.0,
                pairs: vec![p(1.0, 20, 1.0)],
                dev: 30.0,
                cpu: 0.5,
                want: 2.0,
            },
        ];
        for c in &cases {
            check(c);
        }
    }

    #[test]
    fn latency_saturation_locality() {
        let m = CostModel::default();
        for (d, want) in [(10, 80.0), (12, 96.0), (21, 168.0), (32, 256.0)] {
            assert!((m.latency_ns(d) - want).abs() < 1e-9, "distance {d}");
        }
        for (demand, want) in [
            (0.0, 1.0),
            (20e9, 1.0),
            (40e9, 1.0),
            (60e9, 1.5),
            (f64::NAN, 1.0),
        ] {
            assert!(
                (m.saturation(demand) - want).abs() < 1e-9,
                "demand {demand}"
            );
        }
        for (d, c, want) in [(4.0, 8, 1.0), (16.0, 8, 2.0), (3.0, 0, 1.0)] {
            assert_eq!(CostModel::contention(d, c), want);
        }
        assert_eq!(locality(&[]), None);
        assert_eq!(locality(&[p(3.0, 10, 1.0), p(1.0, 21, 1.0)]), Some(0.75));
        assert!((m.migration_cost_s(2 << 30) - 0.6).abs() < 1e-12);
        assert!((m.traffic(2.0, 0.5) - 4e9).abs() < 1.0);
    }
}

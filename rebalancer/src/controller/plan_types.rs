//! The planner's output: moves to apply and, for every managed cgroup, a decision that records
//! what was considered, the numbers and the reason, for `rebalancer explain`.

use serde::{Deserialize, Serialize};

use super::locality::{Evidence, EvidenceCounts};
use crate::cpuset::CpuSet;

/// One round's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// In the order to apply them (most net gain first, ties by cgroup id).
    pub moves: Vec<Move>,
    /// One per observed cgroup, sorted by cgroup id.
    pub decisions: Vec<Decision>,
}

impl Plan {
    pub fn decision(&self, cgroup: &str) -> Option<&Decision> {
        self.decisions
            .binary_search_by(|d| d.cgroup.as_str().cmp(cgroup))
            .ok()
            .map(|i| &self.decisions[i])
    }

    pub fn bytes_to_migrate(&self) -> u64 {
        self.moves
            .iter()
            .fold(0u64, |a, m| a.saturating_add(m.bytes_to_migrate))
    }
}

/// Why a cgroup was a candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Trigger {
    /// Smoothed locality below `locality_threshold`.
    PoorLocality,
    /// Most of its CPU time is on overloaded nodes while another node has room.
    Overloaded { nodes: CpuSet },
    /// Its CPUs span several nodes and its threads cross nodes at least
    /// `MIGRATION_TRIGGER_PER_S` times a second: consolidating its CPUs avoids them.
    Migrating { per_s: f64 },
}

/// A change of one cgroup's cpuset. Both target sets are non-empty (the planner guarantees
/// it and the actuator checks it again).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Move {
    pub cgroup: String,
    pub from_cpus: CpuSet,
    pub to_cpus: CpuSet,
    pub from_mems: CpuSet,
    pub to_mems: CpuSet,
    /// Memory (normal + hugepages) outside the target nodes, which changing mems migrates;
    /// for a staged move, the most its page moves may migrate this round.
    pub bytes_to_migrate: u64,
    pub reason: Trigger,
    pub locality_before: f64,
    pub locality_after: f64,
    /// Net gain (saving − cost) that ranked it.
    pub net: f64,
    /// Set when the memory to migrate exceeds what the round's budget has left (see [`Stage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
}

/// One round of a staged move. The memory off the target exceeds the budget left, so instead
/// of narrowing mems (which migrates everything at once) cpus move to the target now, mems
/// only widen to old ∪ `toward` (the kernel migrates nothing on a widening) and up to
/// [`Move::bytes_to_migrate`] of the pages on other nodes are moved to `toward` one by one
/// (move_pages(2)). Later rounds continue without a cooldown until the rest fits in a round's
/// budget; then a plain move narrows mems to `toward`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    /// The nodes the memory is moving to (the final cpuset.mems).
    pub toward: CpuSet,
    /// Memory off `toward` when the stage was planned.
    pub remaining_bytes: u64,
}

/// Why one target option is impossible.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum TargetRejection {
    /// Outside the workload's allowed nodes (set when seeding; listed for completeness).
    NotAllowed,
    /// Needs more nodes than single-numa-node / max_nodes permit.
    TooManyNodes {
        need: u32,
        max: u32,
    },
    /// Not enough free CPUs (shared pool, or whole free cores for exclusive CPUs).
    NoCpus {
        need: u32,
        free: u32,
    },
    /// Not enough free memory on the target for what would migrate.
    NoMemory {
        need: u64,
        free: u64,
    },
    NoHugepages {
        need: u64,
        free: u64,
    },
    /// Would push this node past `overload_busy` (a shared-CPU relief move may, with run queues
    /// measured, when it takes contention away and leaves the node less pressed than the most
    /// pressed node it leaves: `Projection::balances`).
    Overloaded {
        node: u32,
        busy_after: f64,
    },
    /// The cgroup is already there.
    Unchanged,
}

/// One target the planner weighed, with its numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Considered {
    pub nodes: CpuSet,
    pub locality_after: f64,
    pub bytes_to_migrate: u64,
    /// Locality gain plus load relief (for an overload trigger), in score points.
    pub gain: f64,
    /// Load relief part of `gain`, 0 unless overloaded: per CPU of the workload, the CPU time
    /// the contention model says the tasks on the sources stop waiting less what the targets
    /// start to, where run-queue demand is measured; else source busy − target busy after.
    pub relief: f64,
    /// How long the locality gain (and scheduler migrations avoided) is counted in `saving`:
    /// as long as the workload has lived so far, at most `horizon_ms` of the config.
    #[serde(default)]
    pub horizon_ms: u64,
    /// How long the relief is counted in `saving`: as long as the overload has lasted so far,
    /// at most `horizon_ms`.
    #[serde(default)]
    pub relief_horizon_ms: u64,
    /// Cross-node scheduler migrations per second this target avoids (its CPUs on fewer
    /// nodes); their CPU time (`CROSS_NODE_MIGRATION_COST_US`) is part of `gain` and `saving`.
    #[serde(default)]
    pub migrations_avoided_per_s: f64,
    /// Expected saving (CPU-seconds): (locality gain × what a remote access costs here +
    /// migrations avoided) × CPU demand × `horizon_ms`, plus relief × CPU demand ×
    /// `relief_horizon_ms`.
    pub saving: f64,
    /// Migration cost: GiB to migrate × `migration_cost_per_gib`.
    pub cost: f64,
    /// CPU time lost over the horizon to the CPU contention the move adds (run-queue
    /// pressure on the target nodes beyond their CPUs, less what it takes off the sources).
    #[serde(default)]
    pub contention: f64,
    /// saving − cost − contention.
    pub net: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<TargetRejection>,
}

/// Why a candidate was not moved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Skip {
    /// Pinned by the operator or adopted from an external writer.
    Pinned,
    /// Exclusive CPUs and `move_exclusive` is off.
    Exclusive,
    Cooldown {
        remaining_ms: u64,
    },
    /// Every target option is impossible (see `considered`).
    NoFeasibleTarget,
    /// The best place is where it already is.
    NoBetterTarget,
    BelowMinGain {
        gain: f64,
    },
    CostExceedsSaving {
        saving: f64,
        cost: f64,
    },
    /// The locality would pay for the migration, but the CPU contention the move adds on the
    /// target would leave the workloads slower than they are.
    SlowerAfter {
        saving: f64,
        cost: f64,
        contention: f64,
    },
    /// The move does not pay for itself over the horizon the planner can justify: its saving,
    /// counted only as long as the workload has lived so far (`horizon_ms`) and its overload
    /// relief only as long as the overload has lasted so far (`relief_horizon_ms`), is less
    /// than the migration's cost plus the contention it adds (over the whole horizon).
    ShortHorizon {
        horizon_ms: u64,
        relief_horizon_ms: u64,
        saving: f64,
        cost: f64,
        contention: f64,
    },
    /// Would pass the round's migration budget.
    Budget {
        need: u64,
        remaining: u64,
    },
    /// `MAX_MOVES_PER_ROUND` reached.
    MaxMoves,
    /// A move of this cgroup planned by an earlier round is still being applied.
    InFlight,
}

/// Tagged `outcome`, not `kind`: a skip carries its own `kind`, and one JSON object cannot hold
/// both (`rebalancer status` could not read a skipped decision back).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "outcome")]
pub enum Outcome {
    Moved {
        to_nodes: CpuSet,
    },
    /// Not a candidate: locality fine and no overload.
    Healthy,
    /// No evidence this period (no CPU time or no memory) and nothing smoothed yet.
    NoData,
    Skipped(Skip),
}

/// What the planner decided about one cgroup, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub cgroup: String,
    /// This period's score and where it came from.
    pub locality: Option<f64>,
    pub evidence: Option<Evidence>,
    /// The smoothed score the decision used.
    pub smoothed: Option<f64>,
    /// Periods of each evidence the smoothed score was built from (empty when it is this
    /// period's score alone, before the controller state has any).
    #[serde(default, skip_serializing_if = "EvidenceCounts::is_empty")]
    pub smoothed_from: EvidenceCounts,
    /// CPUs' worth of demand this period.
    pub cpu_demand: f64,
    pub memory_bytes: u64,
    pub trigger: Option<Trigger>,
    pub considered: Vec<Considered>,
    pub outcome: Outcome,
}

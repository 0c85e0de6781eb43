//! Types shared by the kernel side (`rebalancer-ebpf`) and the daemon (`rebalancer`).
//!
//! Every type is `#[repr(C)]` with explicit padding so both sides agree byte for byte; sizes are
//! asserted at compile time. `aya::Pod` impls are behind the `user` feature.
#![no_std]

/// Largest CPU id + 1 the CPU → node array map holds.
pub const MAX_CPUS: u32 = 4096;

/// Default capacity of the per-(cgroup, node) maps (LRU: the least recently used entry is
/// evicted when full; the daemon also deletes entries of cgroups that vanished).
pub const CG_MAP_ENTRIES: u32 = 16384;

/// Largest `migrate_reason` value tracked per cgroup (the kernel has about 10).
pub const MAX_MIGRATE_REASONS: u32 = 16;

/// Counter slots of the watched cgroups (`CFG_WATCHED_ONLY`): `SLOT_EVENTS` holds one
/// [`SlotEvents`] per slot, `SLOT_CPU` one u64 per (slot, node). Both are `BPF_F_MMAPABLE`
/// arrays that userspace reads through its own mapping.
pub const SLOTS: u32 = CG_MAP_ENTRIES;

/// Most NUMA node ids `SLOT_CPU` keeps per slot (userspace sizes it for the machine's nodes,
/// up to this: 16,384 slots × 64 nodes × 8 bytes is 8 MiB).
pub const MAX_SLOT_NODES: u32 = 64;

/// `BPF_F_MMAPABLE` of `bpf_map_create` (Linux 5.5+): an array map userspace can mmap.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Largest tracepoint context offset the programs accept (bounds check on the BPF side).
pub const MAX_TP_OFFSET: u32 = 256;

/// `TNF_FAULT_LOCAL` from include/linux/sched/numa_balancing.h (same value on 6.1 and 6.18).
pub const TNF_FAULT_LOCAL: u32 = 0x08;

/// Exact (sched_switch) mode: the pending per-CPU time is flushed into the map when it grows
/// past this, so userspace never misses more than this per CPU.
pub const SWITCH_FLUSH_NS: u64 = 1_000_000;

/// `ProgConfig::flags` bit: the task_struct offsets (from kernel BTF) are valid.
pub const CFG_TASK_OFFSETS: u32 = 1;

/// `ProgConfig::flags` bit: the run-queue offsets (`task_struct.se.cfs_rq`, `cfs_rq.rq`,
/// `rq.nr_running`, from kernel BTF) are valid: each cpu-clock sample reads its CPU's run
/// queue length into `RUNQ`.
pub const CFG_RUNQ_OFFSETS: u32 = 2;

/// `ProgConfig::flags` bit: count only cgroups in `WATCHED` (the daemon's managed cgroups and
/// the cgroups below them, each mapped to the slot of the cgroup it is counted under), into
/// their slots of `SLOT_CPU` and `SLOT_EVENTS`; events of every other cgroup cost one failed
/// lookup, are counted in `Stat::Unwatched` and touch no counter, so no one else's cgroups can
/// take a managed cgroup's place. Unset (`rebalancer sample`, `top`): every cgroup is counted
/// under its own id in the LRU hash maps.
pub const CFG_WATCHED_ONLY: u32 = 4;

/// Slots of the per-CPU `RUNQ` array: cpu-clock samples that read the run queue, and the sum
/// of the lengths they read (tasks running or waiting on that CPU, all scheduling classes).
pub const RUNQ_SAMPLES: u32 = 0;
pub const RUNQ_SUM: u32 = 1;
pub const RUNQ_SLOTS: u32 = 2;

/// Key of per-(cgroup, NUMA node) maps: a cgroup v2 id and a node id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CgNodeKey {
    pub cgroup_id: u64,
    pub node: u32,
    pub _pad: u32,
}

/// Key of the per-(cgroup, migrate reason) page counter.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CgReasonKey {
    pub cgroup_id: u64,
    pub reason: u32,
    pub _pad: u32,
}

/// Event counters per (cgroup, node). `node` in the key is where the event landed: the
/// destination CPU's node for migrations, the current CPU's node otherwise, the memory's node
/// for NUMA hinting faults.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CgEvents {
    pub migrations: u64,
    pub cross_node_migrations: u64,
    /// sched_move_numa + sched_swap_numa (the NUMA balancer moved a task).
    pub numa_moves: u64,
    /// sched_stick_numa (the NUMA balancer wanted to move a task and could not).
    pub numa_stuck: u64,
    pub pages_migrated: u64,
    pub local_faults: u64,
    pub remote_faults: u64,
    /// Remote-DRAM PMU samples (userspace multiplies by the remote event's period).
    pub remote_events: u64,
    /// Local-DRAM PMU samples (userspace multiplies by the local event's period).
    pub local_events: u64,
}

/// The counters of one watched cgroup's slot, summed over nodes (only on-CPU time is kept per
/// node, in `SLOT_CPU`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SlotEvents {
    pub events: CgEvents,
    /// Pages migrated per migrate reason (reasons past the last go to the last).
    pub reasons: [u64; MAX_MIGRATE_REASONS as usize],
}

/// Per-CPU state of the exact (sched_switch) on-CPU accounting.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SwitchState {
    /// ktime of the last switch on this CPU.
    pub last_ns: u64,
    /// cgroup whose time is pending.
    pub cgroup_id: u64,
    /// Time of `cgroup_id` not yet added to the map.
    pub pending_ns: u64,
}

/// Everything userspace hands to the programs: tracepoint offsets from tracefs `format` files
/// (layouts differ between kernels), task_struct offsets from kernel BTF, sampling periods.
/// An offset of 0 means "unknown" (no field of interest sits at 0, the common header does).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgConfig {
    /// Nanoseconds of CPU time one cpu-clock sample stands for.
    pub sample_period_ns: u64,
    /// Remote-memory PMU events one sample stands for.
    pub remote_period: u64,
    pub switch_prev_pid_off: u32,
    pub migrate_pid_off: u32,
    pub migrate_orig_cpu_off: u32,
    pub migrate_dest_cpu_off: u32,
    pub move_numa_dst_nid_off: u32,
    pub swap_numa_dst_nid_off: u32,
    pub stick_numa_dst_nid_off: u32,
    pub mm_succeeded_off: u32,
    pub mm_reason_off: u32,
    /// `CFG_*` bits.
    pub flags: u32,
    /// task_struct → css_set (`cgroups`).
    pub task_cgroups_off: u32,
    /// css_set → default-hierarchy cgroup (`dfl_cgrp`).
    pub css_set_dfl_cgrp_off: u32,
    /// cgroup → kernfs_node (`kn`).
    pub cgroup_kn_off: u32,
    /// kernfs_node → u64 id (`id`), the cgroup v2 id.
    pub kernfs_node_id_off: u32,
    /// task_struct → CPU the task is on (`thread_info.cpu` or `cpu`).
    pub task_cpu_off: u32,
    /// task_struct → the cfs_rq its entity is queued on (`se.cfs_rq`).
    pub task_se_cfs_rq_off: u32,
    /// cfs_rq → the CPU's run queue (`rq`, with CONFIG_FAIR_GROUP_SCHED).
    pub cfs_rq_rq_off: u32,
    /// rq → tasks on the run queue, running or waiting (`nr_running`).
    pub rq_nr_running_off: u32,
    /// Node ids per slot in `SLOT_CPU` (its index is `slot * slot_nodes + node`).
    pub slot_nodes: u32,
    pub _pad: u32,
}

/// Indices of the per-CPU `STATS` array, used by both sides.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stat {
    /// sched_switch events that changed the running cgroup (touched the hash map).
    SwitchEvents = 0,
    ClockSamples,
    Migrations,
    /// A migration whose task's cgroup could not be read (no BTF offsets, not current).
    MigrationsUnattributed,
    NumaEvents,
    MmMigrateEvents,
    NumaFaults,
    RemoteSamples,
    /// A map update failed (map full without LRU, or out of memory), or a watched cgroup's
    /// count had no counter (its CPU on a node id past `slot_nodes`).
    MapUpdateFailed,
    /// A program found an offset of 0 or out of bounds in `ProgConfig`.
    BadConfig,
    /// A bpf_probe_read_kernel of the task's cgroup chain failed.
    TaskReadFailed,
    LocalSamples,
    /// A cpu-clock sample could not read its CPU's run queue (`task->se.cfs_rq->rq`).
    RunqReadFailed,
    /// An event of a cgroup not in `WATCHED` (with `CFG_WATCHED_ONLY`): not counted.
    Unwatched,
}

impl Stat {
    /// Number of slots of the `STATS` array.
    pub const COUNT: u32 = 14;
    /// Every stat, in index order.
    pub const ALL: [Stat; Stat::COUNT as usize] = [
        Stat::SwitchEvents,
        Stat::ClockSamples,
        Stat::Migrations,
        Stat::MigrationsUnattributed,
        Stat::NumaEvents,
        Stat::MmMigrateEvents,
        Stat::NumaFaults,
        Stat::RemoteSamples,
        Stat::MapUpdateFailed,
        Stat::BadConfig,
        Stat::TaskReadFailed,
        Stat::LocalSamples,
        Stat::RunqReadFailed,
        Stat::Unwatched,
    ];

    /// snake_case name for logs and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Stat::SwitchEvents => "switch_events",
            Stat::ClockSamples => "clock_samples",
            Stat::Migrations => "migrations",
            Stat::MigrationsUnattributed => "migrations_unattributed",
            Stat::NumaEvents => "numa_events",
            Stat::MmMigrateEvents => "mm_migrate_events",
            Stat::NumaFaults => "numa_faults",
            Stat::RemoteSamples => "remote_samples",
            Stat::MapUpdateFailed => "map_update_failed",
            Stat::BadConfig => "bad_config",
            Stat::TaskReadFailed => "task_read_failed",
            Stat::LocalSamples => "local_samples",
            Stat::RunqReadFailed => "runq_read_failed",
            Stat::Unwatched => "unwatched",
        }
    }
}

const _: () = assert!(core::mem::size_of::<CgNodeKey>() == 16);
const _: () = assert!(core::mem::size_of::<CgReasonKey>() == 16);
const _: () = assert!(core::mem::size_of::<CgEvents>() == 72);
const _: () = assert!(core::mem::size_of::<SwitchState>() == 24);
const _: () = assert!(core::mem::size_of::<ProgConfig>() == 96);
const _: () = assert!(core::mem::size_of::<SlotEvents>() == 200);
const _: () = assert!(Stat::Unwatched as u32 + 1 == Stat::COUNT);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain-old-data, repr(C), no padding holes (explicit pad fields).
    unsafe impl aya::Pod for super::CgNodeKey {}
    unsafe impl aya::Pod for super::CgReasonKey {}
    unsafe impl aya::Pod for super::CgEvents {}
    unsafe impl aya::Pod for super::SwitchState {}
    unsafe impl aya::Pod for super::SlotEvents {}
    unsafe impl aya::Pod for super::ProgConfig {}
}

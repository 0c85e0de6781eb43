//! Maps shared by every program, and the small helpers that update them.
use aya_ebpf::{
    macros::map,
    maps::{Array, LruPerCpuHashMap, PerCpuArray},
};
use rebalancer_common::{
    CgEvents, CgNodeKey, CgReasonKey, ProgConfig, Stat, SwitchState, CG_MAP_ENTRIES, MAX_CPUS,
    RUNQ_SLOTS,
};

/// On-CPU nanoseconds per (cgroup id, node). Userspace may resize it at load time.
#[map]
pub static CPU_TIME: LruPerCpuHashMap<CgNodeKey, u64> =
    LruPerCpuHashMap::with_max_entries(CG_MAP_ENTRIES, 0);
/// Event counters per (cgroup id, node).
#[map]
pub static EVENTS: LruPerCpuHashMap<CgNodeKey, CgEvents> =
    LruPerCpuHashMap::with_max_entries(CG_MAP_ENTRIES, 0);
/// Pages migrated per (cgroup id, migrate reason).
#[map]
pub static MIGRATE_REASONS: LruPerCpuHashMap<CgReasonKey, u64> =
    LruPerCpuHashMap::with_max_entries(CG_MAP_ENTRIES, 0);
/// Exact-mode state of each CPU.
#[map]
pub static SWITCH_STATE: PerCpuArray<SwitchState> = PerCpuArray::with_max_entries(1, 0);
/// CPU → NUMA node, filled by userspace from the topology.
#[map]
pub static CPU_NODE: Array<u32> = Array::with_max_entries(MAX_CPUS, 0);
/// Offsets and periods, filled by userspace.
#[map]
pub static CONFIG: Array<ProgConfig> = Array::with_max_entries(1, 0);
/// Run-queue length of each CPU as the cpu-clock samples read it (`RUNQ_SAMPLES`, `RUNQ_SUM`).
#[map]
pub static RUNQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(RUNQ_SLOTS, 0);
/// Program statistics, indexed by `Stat`.
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Stat::COUNT, 0);

#[inline(always)]
pub fn bump(stat: Stat) {
    if let Some(p) = STATS.get_ptr_mut(stat as u32) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
pub fn config() -> Result<&'static ProgConfig, i64> {
    CONFIG.get(0).ok_or(-2)
}

/// A tracepoint offset from `ProgConfig`, bounds-checked (0 = unknown).
#[inline(always)]
pub fn tp_off(off: u32) -> Result<usize, i64> {
    if off == 0 || off > rebalancer_common::MAX_TP_OFFSET {
        bump(Stat::BadConfig);
        return Err(-22);
    }
    Ok(off as usize)
}

/// Node of a CPU from the userspace-filled map.
#[inline(always)]
pub fn cpu_node(cpu: u32) -> Option<u32> {
    if cpu >= MAX_CPUS {
        return None;
    }
    CPU_NODE.get(cpu).copied()
}

/// Adds `ns` to the on-CPU time of (cgroup, node): lookup, then insert only when missing.
#[inline(always)]
pub fn add_cpu_ns(cgroup_id: u64, node: u32, ns: u64) {
    let key = CgNodeKey {
        cgroup_id,
        node,
        _pad: 0,
    };
    match CPU_TIME.get_ptr_mut(&key) {
        Some(p) => unsafe { *p += ns },
        None => {
            if CPU_TIME.insert(&key, &ns, 0).is_err() {
                bump(Stat::MapUpdateFailed);
            }
        }
    }
}

/// Applies `f` to the event counters of (cgroup, node), creating them when missing.
#[inline(always)]
pub fn update_events(cgroup_id: u64, node: u32, f: impl Fn(&mut CgEvents)) {
    let key = CgNodeKey {
        cgroup_id,
        node,
        _pad: 0,
    };
    match EVENTS.get_ptr_mut(&key) {
        Some(p) => f(unsafe { &mut *p }),
        None => {
            let mut v = CgEvents::default();
            f(&mut v);
            if EVENTS.insert(&key, &v, 0).is_err() {
                bump(Stat::MapUpdateFailed);
            }
        }
    }
}

/// Adds `pages` to (cgroup, reason).
#[inline(always)]
pub fn add_reason_pages(cgroup_id: u64, reason: u32, pages: u64) {
    let key = CgReasonKey {
        cgroup_id,
        reason,
        _pad: 0,
    };
    match MIGRATE_REASONS.get_ptr_mut(&key) {
        Some(p) => unsafe { *p += pages },
        None => {
            if MIGRATE_REASONS.insert(&key, &pages, 0).is_err() {
                bump(Stat::MapUpdateFailed);
            }
        }
    }
}

/// NUMA node of the CPU this program runs on.
#[inline(always)]
pub fn current_node() -> u32 {
    (unsafe { aya_ebpf::helpers::bpf_get_numa_node_id() }) as u32
}

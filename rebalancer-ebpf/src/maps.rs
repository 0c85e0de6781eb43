//! Maps shared by every program, and the small helpers that update them.
//!
//! The daemon's watched cgroups (`CFG_WATCHED_ONLY`) are counted in slots: `WATCHED` gives a
//! cgroup id's slot, and the counters sit at that index of two `BPF_F_MMAPABLE` arrays
//! (`SLOT_CPU` per (slot, node), `SLOT_EVENTS` per slot), added to atomically and read by
//! userspace straight from its mapping: no syscall, no hash walk.
//!
//! Without a watch list every cgroup is counted under its own id in shared LRU hash maps,
//! updated with atomic adds, not per-CPU maps: a per-CPU LRU map preallocates every entry's
//! value on every *possible* CPU (16,384 × 88 bytes × 256 CPUs is 369 MB, charged to the
//! daemon's memory cgroup), while these hold one value per entry (userspace sizes them at
//! load: 16,384 entries plus 128 per CPU for the LRU's per-CPU free lists,
//! `loader::cg_map_entries`). An entry is created with `BPF_NOEXIST`; a program that loses
//! the race to create it adds into the winner's entry, so no count is overwritten.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use rebalancer_common::{
    CgEvents, CgNodeKey, CgReasonKey, ProgConfig, SlotEvents, Stat, SwitchState, BPF_F_MMAPABLE,
    CFG_WATCHED_ONLY, CG_MAP_ENTRIES, MAX_CPUS, MAX_MIGRATE_REASONS, RUNQ_SLOTS, SLOTS,
};

/// `BPF_NOEXIST` of `bpf_map_update_elem`.
const BPF_NOEXIST: u64 = 1;

/// On-CPU nanoseconds per (cgroup id, node). Userspace may resize it at load time.
#[map]
pub static CPU_TIME: LruHashMap<CgNodeKey, u64> = LruHashMap::with_max_entries(CG_MAP_ENTRIES, 0);
/// Event counters per (cgroup id, node).
#[map]
pub static EVENTS: LruHashMap<CgNodeKey, CgEvents> =
    LruHashMap::with_max_entries(CG_MAP_ENTRIES, 0);
/// Pages migrated per (cgroup id, migrate reason).
#[map]
pub static MIGRATE_REASONS: LruHashMap<CgReasonKey, u64> =
    LruHashMap::with_max_entries(CG_MAP_ENTRIES, 0);
/// The cgroup ids counted when `CFG_WATCHED_ONLY` is set, each with the slot its events are
/// counted in (the managed cgroup's own; a cgroup below one shares its container's), filled by
/// the daemon each round. A slot's counters are zeroed before an id is given it.
#[map]
pub static WATCHED: HashMap<u64, u32> = HashMap::with_max_entries(CG_MAP_ENTRIES, 0);
/// On-CPU nanoseconds per (slot, node), at `slot * slot_nodes + node`. Userspace sizes it
/// (`SLOTS * slot_nodes`) at load.
#[map]
pub static SLOT_CPU: Array<u64> = Array::with_max_entries(SLOTS, BPF_F_MMAPABLE);
/// Event counters and pages per migrate reason, per slot.
#[map]
pub static SLOT_EVENTS: Array<SlotEvents> = Array::with_max_entries(SLOTS, BPF_F_MMAPABLE);
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

/// Adds `v` to the counter at `p` atomically (other CPUs add into the same entry): BPF's
/// `lock xadd` (BPF_ATOMIC | BPF_ADD, in every eBPF kernel). core's atomics have no
/// read-modify-write on this target (no CAS), hence the instruction itself.
#[inline(always)]
fn add(p: *mut u64, v: u64) {
    if v != 0 {
        // SAFETY: `p` points into a map value (8-byte aligned, alive while the program runs);
        // the instruction writes only those 8 bytes.
        unsafe {
            core::arch::asm!(
                "lock *(u64 *)({p} + 0) += {v}",
                p = in(reg) p,
                v = in(reg) v,
                options(nostack)
            )
        };
    }
}

/// Adds every field of `d` into the counters at `p`.
#[inline(always)]
fn add_events(p: *mut CgEvents, d: &CgEvents) {
    // SAFETY: field pointers of a valid map value.
    unsafe {
        add(&raw mut (*p).migrations, d.migrations);
        add(&raw mut (*p).cross_node_migrations, d.cross_node_migrations);
        add(&raw mut (*p).numa_moves, d.numa_moves);
        add(&raw mut (*p).numa_stuck, d.numa_stuck);
        add(&raw mut (*p).pages_migrated, d.pages_migrated);
        add(&raw mut (*p).local_faults, d.local_faults);
        add(&raw mut (*p).remote_faults, d.remote_faults);
        add(&raw mut (*p).remote_events, d.remote_events);
        add(&raw mut (*p).local_events, d.local_events);
    }
}

/// Adds `v` to the u64 counter of `key` in `map`, creating the entry when missing.
macro_rules! add_to {
    ($map:expr, $key:expr, $v:expr) => {{
        let (key, v) = ($key, $v);
        match $map.get_ptr_mut(&key) {
            Some(p) => add(p, v),
            None => {
                if $map.insert(&key, &v, BPF_NOEXIST).is_err() {
                    // Another CPU created it meanwhile (or the map is refusing): add into it.
                    match $map.get_ptr_mut(&key) {
                        Some(p) => add(p, v),
                        None => bump(Stat::MapUpdateFailed),
                    }
                }
            }
        }
    }};
}

/// Where the events of a cgroup are counted.
enum Counted {
    /// Under its own id, in the LRU hash maps (no watch list).
    Id(u64),
    /// In this slot of `SLOT_CPU` / `SLOT_EVENTS` (a watched cgroup).
    Slot(u32),
}

/// Where events of `cgroup_id` are counted: under its own id, unless the daemon asked for its
/// managed cgroups only (`CFG_WATCHED_ONLY`): then in the slot `WATCHED` gives it, or nowhere
/// (None) when it has none.
#[inline(always)]
fn watched(cgroup_id: u64) -> Option<Counted> {
    if !config().is_ok_and(|c| c.flags & CFG_WATCHED_ONLY != 0) {
        return Some(Counted::Id(cgroup_id));
    }
    match WATCHED.get_ptr(&cgroup_id) {
        // SAFETY: a map value, read once.
        Some(p) => Some(Counted::Slot(unsafe { *p })),
        None => {
            bump(Stat::Unwatched);
            None
        }
    }
}

/// The counters of `slot`, or None (counted as a failed update) when it is out of range.
#[inline(always)]
fn slot_events(slot: u32) -> Option<*mut SlotEvents> {
    let p = SLOT_EVENTS.get_ptr_mut(slot);
    if p.is_none() {
        bump(Stat::MapUpdateFailed);
    }
    p
}

/// Adds `ns` to the on-CPU time of (cgroup, node).
#[inline(always)]
pub fn add_cpu_ns(cgroup_id: u64, node: u32, ns: u64) {
    let cgroup_id = match watched(cgroup_id) {
        None => return,
        Some(Counted::Id(id)) => id,
        Some(Counted::Slot(slot)) => {
            let stride = config().map_or(0, |c| c.slot_nodes);
            // A node past the array's width (a node hot-added beyond the ids sized for) loses
            // its time, counted as a failed update.
            let p = if node < stride {
                SLOT_CPU.get_ptr_mut(slot.wrapping_mul(stride).wrapping_add(node))
            } else {
                None
            };
            match p {
                Some(p) => add(p, ns),
                None => bump(Stat::MapUpdateFailed),
            }
            return;
        }
    };
    let key = CgNodeKey {
        cgroup_id,
        node,
        _pad: 0,
    };
    add_to!(CPU_TIME, key, ns);
}

/// Adds what `f` counts to the event counters of (cgroup, node), creating them when missing.
#[inline(always)]
pub fn update_events(cgroup_id: u64, node: u32, f: impl Fn(&mut CgEvents)) {
    let mut d = CgEvents::default();
    f(&mut d);
    let cgroup_id = match watched(cgroup_id) {
        None => return,
        Some(Counted::Id(id)) => id,
        Some(Counted::Slot(slot)) => {
            if let Some(p) = slot_events(slot) {
                // SAFETY: a field of a valid map value.
                add_events(unsafe { &raw mut (*p).events }, &d);
            }
            return;
        }
    };
    let key = CgNodeKey {
        cgroup_id,
        node,
        _pad: 0,
    };
    match EVENTS.get_ptr_mut(&key) {
        Some(p) => add_events(p, &d),
        None => {
            if EVENTS.insert(&key, &d, BPF_NOEXIST).is_err() {
                match EVENTS.get_ptr_mut(&key) {
                    Some(p) => add_events(p, &d),
                    None => bump(Stat::MapUpdateFailed),
                }
            }
        }
    }
}

/// Adds `pages` to (cgroup, reason).
#[inline(always)]
pub fn add_reason_pages(cgroup_id: u64, reason: u32, pages: u64) {
    let cgroup_id = match watched(cgroup_id) {
        None => return,
        Some(Counted::Id(id)) => id,
        Some(Counted::Slot(slot)) => {
            if let Some(p) = slot_events(slot) {
                let r = if reason < MAX_MIGRATE_REASONS {
                    reason
                } else {
                    MAX_MIGRATE_REASONS - 1
                } as usize;
                // SAFETY: `r` is within the array of a valid map value.
                add(unsafe { &raw mut (*p).reasons[r] }, pages);
            }
            return;
        }
    };
    let key = CgReasonKey {
        cgroup_id,
        reason,
        _pad: 0,
    };
    add_to!(MIGRATE_REASONS, key, pages);
}

/// NUMA node of the CPU this program runs on.
#[inline(always)]
pub fn current_node() -> u32 {
    (unsafe { aya_ebpf::helpers::bpf_get_numa_node_id() }) as u32
}

//! rebalancer's eBPF programs. Entry points are thin; logic lives in `try_*` functions.
//!
//! - `sched_switch`: on-CPU nanoseconds per (cgroup id, NUMA node).
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_numa_node_id, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{Array, PerCpuArray, PerCpuHashMap},
    programs::TracePointContext,
};
use rebalancer_common::{CgNodeKey, TpConfig};

/// On-CPU nanoseconds per (cgroup id, node), per CPU; summed and diffed in userspace.
#[map]
static CPU_TIME: PerCpuHashMap<CgNodeKey, u64> = PerCpuHashMap::with_max_entries(16384, 0);
/// Timestamp of the last sched_switch on this CPU.
#[map]
static LAST_SWITCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Tracepoint field offsets, filled by userspace from tracefs format files.
#[map]
static CONFIG: Array<TpConfig> = Array::with_max_entries(1, 0);

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    match try_sched_switch(&ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn try_sched_switch(ctx: &TracePointContext) -> Result<(), i64> {
    let now = unsafe { bpf_ktime_get_ns() };
    let last = LAST_SWITCH.get_ptr_mut(0).ok_or(0i64)?;
    let prev = unsafe { *last };
    unsafe { *last = now };
    if prev == 0 {
        return Ok(());
    }
    let cfg = CONFIG.get(0).ok_or(0i64)?;
    let off = cfg.switch_prev_pid_off as usize;
    if off == 0 || off > 64 {
        return Err(-1);
    }
    // At sched_switch, `current` is still the previous task.
    let prev_pid: i32 = unsafe { ctx.read_at(off) }.map_err(|e| e as i64)?;
    if prev_pid == 0 {
        return Ok(()); // the idle task
    }
    let delta = now.wrapping_sub(prev);
    let key = CgNodeKey {
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        node: unsafe { bpf_get_numa_node_id() } as u32,
        _pad: 0,
    };
    match CPU_TIME.get_ptr_mut(&key) {
        Some(v) => unsafe { *v += delta },
        None => {
            let _ = CPU_TIME.insert(&key, &delta, 0);
        }
    }
    Ok(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

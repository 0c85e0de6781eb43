//! Memory-side signals: pages migrated (mm_migrate_pages), NUMA hinting faults
//! (task_numa_fault kprobe) and local / remote DRAM PMU samples (two perf events, one program
//! each, so a sample knows which side it counts).
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid},
    programs::{PerfEventContext, ProbeContext, TracePointContext},
};
use rebalancer_common::{Stat, MAX_MIGRATE_REASONS, TNF_FAULT_LOCAL};

use crate::maps::{add_reason_pages, bump, config, current_node, tp_off, update_events};

/// `mm_migrate_pages(succeeded, failed, …, mode, reason)`: pages migrated by the current task
/// (NUMA balancing and move_pages/mbind run in the task's context; cpuset.mems migration runs
/// in a kworker and is attributed to its cgroup, the root).
pub fn try_mm_migrate_pages(ctx: &TracePointContext) -> Result<(), i64> {
    bump(Stat::MmMigrateEvents);
    let cfg = config()?;
    let so = tp_off(cfg.mm_succeeded_off)?;
    let ro = tp_off(cfg.mm_reason_off)?;
    let succeeded: u64 = unsafe { ctx.read_at(so) }.map_err(|e| e as i64)?;
    let reason: u32 = unsafe { ctx.read_at(ro) }.map_err(|e| e as i64)?;
    if succeeded == 0 {
        return Ok(());
    }
    let cg = unsafe { bpf_get_current_cgroup_id() };
    let node = current_node();
    update_events(cg, node, |e| e.pages_migrated += succeeded);
    let reason = if reason < MAX_MIGRATE_REASONS {
        reason
    } else {
        MAX_MIGRATE_REASONS - 1
    };
    add_reason_pages(cg, reason, succeeded);
    Ok(())
}

/// kprobe `task_numa_fault(int last_cpupid, int mem_node, int pages, int flags)`, current is
/// the faulting task; `TNF_FAULT_LOCAL` tells whether the page was on the faulting CPU's node.
pub fn try_task_numa_fault(ctx: &ProbeContext) -> Result<(), i64> {
    bump(Stat::NumaFaults);
    let mem_node: i32 = ctx.arg(1).ok_or(-22i64)?;
    let pages: i32 = ctx.arg(2).ok_or(-22i64)?;
    let flags: i32 = ctx.arg(3).ok_or(-22i64)?;
    if pages <= 0 {
        return Ok(());
    }
    let node = if mem_node < 0 {
        current_node()
    } else {
        mem_node as u32
    };
    let local = flags as u32 & TNF_FAULT_LOCAL != 0;
    let cg = unsafe { bpf_get_current_cgroup_id() };
    update_events(cg, node, |e| {
        if local {
            e.local_faults += pages as u64;
        } else {
            e.remote_faults += pages as u64;
        }
    });
    Ok(())
}

/// One overflow of a DRAM-access PMU counter (`remote`: the remote-DRAM event, else the
/// local one): one sample (userspace scales by that event's period) for the interrupted task's
/// cgroup on this node.
pub fn try_mem_sample(_ctx: &PerfEventContext, remote: bool) -> Result<(), i64> {
    bump(if remote {
        Stat::RemoteSamples
    } else {
        Stat::LocalSamples
    });
    if bpf_get_current_pid_tgid() as u32 == 0 {
        return Ok(());
    }
    let cg = unsafe { bpf_get_current_cgroup_id() };
    let node = current_node();
    if remote {
        update_events(cg, node, |e| e.remote_events += 1);
    } else {
        update_events(cg, node, |e| e.local_events += 1);
    }
    Ok(())
}

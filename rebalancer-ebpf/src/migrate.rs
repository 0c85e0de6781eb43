//! Task migrations (sched_migrate_task) and NUMA-balancing task moves (sched_*_numa).
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    programs::{RawTracePointContext, TracePointContext},
};
use aya_log_ebpf::warn;
use rebalancer_common::{ProgConfig, Stat, CFG_TASK_OFFSETS};

use crate::maps::{bump, config, cpu_node, current_node, tp_off, update_events};

/// task_struct offsets above this are refused (task_struct is under 16 KiB on every config).
const MAX_TASK_OFF: u32 = 16384;

/// Reads `task->cgroups->dfl_cgrp->kn->id` with offsets taken from kernel BTF.
#[inline(always)]
fn task_cgroup_id(task: *const u8, cfg: &ProgConfig) -> Result<u64, i64> {
    let offs = [
        cfg.task_cgroups_off,
        cfg.css_set_dfl_cgrp_off,
        cfg.cgroup_kn_off,
        cfg.kernfs_node_id_off,
    ];
    if offs.iter().any(|&o| o >= MAX_TASK_OFF) {
        bump(Stat::BadConfig);
        return Err(-22);
    }
    let read_ptr = |base: *const u8, off: u32| -> Result<*const u8, i64> {
        if base.is_null() {
            return Err(-14);
        }
        unsafe { bpf_probe_read_kernel(base.add(off as usize) as *const *const u8) }
            .map_err(|e| e as i64)
    };
    let css = read_ptr(task, offs[0])?;
    let cgrp = read_ptr(css, offs[1])?;
    let kn = read_ptr(cgrp, offs[2])?;
    if kn.is_null() {
        return Err(-14);
    }
    unsafe { bpf_probe_read_kernel(kn.add(offs[3] as usize) as *const u64) }.map_err(|e| e as i64)
}

/// Counts one migration of a task of cgroup `cg` from `orig` to `dest` CPU.
#[inline(always)]
fn record_migration(cg: u64, orig: u32, dest: u32) {
    let dn = cpu_node(dest);
    let cross = match (cpu_node(orig), dn) {
        (Some(a), Some(b)) => a != b,
        _ => false,
    };
    update_events(cg, dn.unwrap_or(u32::MAX), |e| {
        e.migrations += 1;
        if cross {
            e.cross_node_migrations += 1;
        }
    });
}

/// Raw tracepoint `sched_migrate_task(struct task_struct *p, int dest_cpu)`: the migrating
/// task is an argument, so its own cgroup is read (the current task is often the waker, the
/// load balancer or a sched_setaffinity caller).
pub fn try_migrate_raw(ctx: &RawTracePointContext) -> Result<(), i64> {
    bump(Stat::Migrations);
    let cfg = config()?;
    if cfg.flags & CFG_TASK_OFFSETS == 0 || cfg.task_cpu_off >= MAX_TASK_OFF {
        bump(Stat::BadConfig);
        return Err(-22);
    }
    let task: *const u8 = ctx.arg(0);
    let dest: u64 = ctx.arg(1);
    if task.is_null() {
        return Err(-14);
    }
    let orig: u32 =
        match unsafe { bpf_probe_read_kernel(task.add(cfg.task_cpu_off as usize) as *const u32) } {
            Ok(c) => c,
            Err(e) => {
                bump(Stat::TaskReadFailed);
                return Err(e as i64);
            }
        };
    let cg = match task_cgroup_id(task, cfg) {
        Ok(cg) => cg,
        Err(e) => {
            bump(Stat::TaskReadFailed);
            return Err(e);
        }
    };
    record_migration(cg, orig, dest as u32);
    Ok(())
}

/// Classic tracepoint fallback (no BTF offsets): fields from the format file; only a migration
/// of the current task can be attributed to its cgroup, the others are counted as
/// unattributed.
pub fn try_migrate_tp(ctx: &TracePointContext) -> Result<(), i64> {
    bump(Stat::Migrations);
    let cfg = config()?;
    let (po, oo, dof) = match (
        tp_off(cfg.migrate_pid_off),
        tp_off(cfg.migrate_orig_cpu_off),
        tp_off(cfg.migrate_dest_cpu_off),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        _ => {
            warn!(ctx, "sched_migrate_task: bad field offsets in CONFIG");
            return Err(-22);
        }
    };
    let pid: i32 = unsafe { ctx.read_at(po) }.map_err(|e| e as i64)?;
    let orig: i32 = unsafe { ctx.read_at(oo) }.map_err(|e| e as i64)?;
    let dest: i32 = unsafe { ctx.read_at(dof) }.map_err(|e| e as i64)?;
    if pid as u32 != bpf_get_current_pid_tgid() as u32 {
        bump(Stat::MigrationsUnattributed);
        return Ok(());
    }
    let cg = unsafe { bpf_get_current_cgroup_id() };
    record_migration(cg, orig as u32, dest as u32);
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum NumaKind {
    Move,
    Swap,
    Stick,
}

/// The NUMA balancer runs in the context of the task it moves (task_numa_migrate is called
/// from the task's own fault path), so current's cgroup is the moved task's; for a swap it is
/// the source task's. The key's node is `dst_nid` from the format file.
pub fn try_numa(ctx: &TracePointContext, kind: NumaKind) -> Result<(), i64> {
    bump(Stat::NumaEvents);
    let cfg = config()?;
    let off = tp_off(match kind {
        NumaKind::Move => cfg.move_numa_dst_nid_off,
        NumaKind::Swap => cfg.swap_numa_dst_nid_off,
        NumaKind::Stick => cfg.stick_numa_dst_nid_off,
    })?;
    let dst_nid: i32 = unsafe { ctx.read_at(off) }.map_err(|e| e as i64)?;
    let node = if dst_nid < 0 {
        current_node()
    } else {
        dst_nid as u32
    };
    let cg = unsafe { bpf_get_current_cgroup_id() };
    update_events(cg, node, |e| {
        if kind == NumaKind::Stick {
            e.numa_stuck += 1;
        } else {
            e.numa_moves += 1;
        }
    });
    Ok(())
}

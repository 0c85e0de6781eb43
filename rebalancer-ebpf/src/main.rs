//! rebalancer's eBPF programs. Entry points are thin; logic lives in `try_*` functions in the
//! modules below; the per-cgroup counters are updated with atomic adds (see `maps`): the
//! daemon's watched cgroups in slots of mmapable arrays, every cgroup in shared LRU hash maps
//! when there is no watch list; diffed (saturating) in userspace.
//!
//! - `on_cpu_sample` (perf_event, software cpu-clock at `ebpf.sample_hz` per CPU): on-CPU time
//!   per (cgroup id, node) by sampling — the default; costs the same whatever the switch rate —
//!   and each CPU's run-queue length (`RUNQ`); `on_cpu_sample_norunq` without the latter.
//! - `sched_switch` (raw tracepoint): exact on-CPU time per (cgroup id, node) — the option.
//! - `sched_migrate_task` (raw tracepoint, the migrating task's cgroup read through task_struct
//!   offsets taken from kernel BTF) or `sched_migrate_task_tp` (classic tracepoint fallback
//!   without BTF: only migrations of the current task are attributed).
//! - `sched_move_numa` / `sched_swap_numa` / `sched_stick_numa` / `mm_migrate_pages`
//!   (tracepoints): NUMA-balancing moves and pages migrated (per reason).
//! - `task_numa_fault` (kprobe): NUMA hinting faults, local vs remote.
//! - `local_mem_sample` / `remote_mem_sample` (perf_event on the local- and remote-DRAM PMU
//!   events): sampled local and remote memory accesses.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

mod maps;
mod memory;
mod migrate;
mod oncpu;

use aya_ebpf::{
    macros::{kprobe, perf_event, raw_tracepoint, tracepoint},
    programs::{PerfEventContext, ProbeContext, RawTracePointContext, TracePointContext},
};

#[inline(always)]
fn done(r: Result<(), i64>) -> u32 {
    match r {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[perf_event]
pub fn on_cpu_sample(ctx: PerfEventContext) -> u32 {
    done(oncpu::try_on_cpu_sample::<true>(&ctx))
}

/// `on_cpu_sample` without the run-queue read (no bpf_probe_read_kernel: kernels before 5.5
/// refuse the helper, and would lose the on-CPU time with it).
#[perf_event]
pub fn on_cpu_sample_norunq(ctx: PerfEventContext) -> u32 {
    done(oncpu::try_on_cpu_sample::<false>(&ctx))
}

/// A raw tracepoint: no trace record is formatted before the program runs (the classic
/// tracepoint copies both comms and more on every switch), and no argument is needed.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    done(oncpu::try_sched_switch(&ctx)) as i32
}

#[raw_tracepoint(tracepoint = "sched_migrate_task")]
pub fn sched_migrate_task(ctx: RawTracePointContext) -> i32 {
    done(migrate::try_migrate_raw(&ctx)) as i32
}

#[tracepoint(category = "sched", name = "sched_migrate_task")]
pub fn sched_migrate_task_tp(ctx: TracePointContext) -> u32 {
    done(migrate::try_migrate_tp(&ctx))
}

#[tracepoint(category = "sched", name = "sched_move_numa")]
pub fn sched_move_numa(ctx: TracePointContext) -> u32 {
    done(migrate::try_numa(&ctx, migrate::NumaKind::Move))
}

#[tracepoint(category = "sched", name = "sched_swap_numa")]
pub fn sched_swap_numa(ctx: TracePointContext) -> u32 {
    done(migrate::try_numa(&ctx, migrate::NumaKind::Swap))
}

#[tracepoint(category = "sched", name = "sched_stick_numa")]
pub fn sched_stick_numa(ctx: TracePointContext) -> u32 {
    done(migrate::try_numa(&ctx, migrate::NumaKind::Stick))
}

#[tracepoint(category = "migrate", name = "mm_migrate_pages")]
pub fn mm_migrate_pages(ctx: TracePointContext) -> u32 {
    done(memory::try_mm_migrate_pages(&ctx))
}

#[kprobe]
pub fn task_numa_fault(ctx: ProbeContext) -> u32 {
    done(memory::try_task_numa_fault(&ctx))
}

#[perf_event]
pub fn remote_mem_sample(ctx: PerfEventContext) -> u32 {
    done(memory::try_mem_sample(&ctx, true))
}

#[perf_event]
pub fn local_mem_sample(ctx: PerfEventContext) -> u32 {
    done(memory::try_mem_sample(&ctx, false))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

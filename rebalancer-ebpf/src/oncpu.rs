//! On-CPU time per (cgroup, node): the cpu-clock sampler (default) and exact sched_switch
//! accounting (option). The cpu-clock sampler also reads its CPU's run-queue length, so the
//! time average of tasks running or waiting per CPU comes from the samples already taken.
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    programs::{PerfEventContext, RawTracePointContext},
};
use rebalancer_common::{
    ProgConfig, Stat, CFG_RUNQ_OFFSETS, RUNQ_SAMPLES, RUNQ_SUM, SWITCH_FLUSH_NS,
};

use crate::maps::{add_cpu_ns, bump, config, current_node, RUNQ, SWITCH_STATE};

/// Offsets above this are refused (task_struct is under 16 KiB, cfs_rq and rq under 8 KiB on
/// every config).
const MAX_RUNQ_OFF: u32 = 16384;
/// A run-queue length above this is a bad read, not a queue.
const MAX_RUNQ_LEN: u32 = 1 << 20;

/// `current->se.cfs_rq->rq->nr_running`: tasks on this CPU's run queue (running or waiting,
/// every scheduling class), with offsets taken from kernel BTF. The idle task's entity points
/// at the root cfs_rq of its CPU, so an idle CPU reads its (empty) queue too.
#[inline(always)]
fn runq_len(cfg: &ProgConfig) -> Result<u32, i64> {
    let offs = [
        cfg.task_se_cfs_rq_off,
        cfg.cfs_rq_rq_off,
        cfg.rq_nr_running_off,
    ];
    if offs.iter().any(|&o| o == 0 || o >= MAX_RUNQ_OFF) {
        bump(Stat::BadConfig);
        return Err(-22);
    }
    let read_ptr = |base: *const u8, off: u32| -> Result<*const u8, i64> {
        if base.is_null() {
            return Err(-14);
        }
        let p = unsafe { bpf_probe_read_kernel(base.add(off as usize) as *const *const u8) }
            .map_err(|e| e as i64)?;
        if p.is_null() {
            return Err(-14);
        }
        Ok(p)
    };
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let cfs_rq = read_ptr(task, offs[0])?;
    let rq = read_ptr(cfs_rq, offs[1])?;
    let n = unsafe { bpf_probe_read_kernel(rq.add(offs[2] as usize) as *const u32) }
        .map_err(|e| e as i64)?;
    if n > MAX_RUNQ_LEN {
        return Err(-34);
    }
    Ok(n)
}

/// Adds one reading of this CPU's run-queue length to `RUNQ` (a failed read is counted in
/// `Stat::RunqReadFailed` and adds nothing: the sample does not count as a reading).
#[inline(always)]
fn sample_runq(cfg: &ProgConfig) {
    if cfg.flags & CFG_RUNQ_OFFSETS == 0 {
        return;
    }
    match runq_len(cfg) {
        Ok(n) => {
            if let Some(p) = RUNQ.get_ptr_mut(RUNQ_SAMPLES) {
                unsafe { *p += 1 };
            }
            if let Some(p) = RUNQ.get_ptr_mut(RUNQ_SUM) {
                unsafe { *p += u64::from(n) };
            }
        }
        Err(_) => bump(Stat::RunqReadFailed),
    }
}

/// One cpu-clock sample: the interrupted task (current) ran `sample_period_ns` on this node,
/// and this CPU's run queue held what `runq_len` reads.
#[inline(always)]
pub fn try_on_cpu_sample<const RUNQ: bool>(_ctx: &PerfEventContext) -> Result<(), i64> {
    bump(Stat::ClockSamples);
    let cfg = config()?;
    if RUNQ {
        sample_runq(cfg);
    }
    let pid = bpf_get_current_pid_tgid() as u32;
    if pid == 0 {
        return Ok(()); // the idle task
    }
    let period = cfg.sample_period_ns;
    let cg = unsafe { bpf_get_current_cgroup_id() };
    let node = current_node();
    add_cpu_ns(cg, node, period);
    Ok(())
}

/// At sched_switch `current` is still the previous task, so its pid and cgroup come from
/// helpers (no context read). Time accumulates in a per-CPU slot while the same cgroup keeps
/// running and goes to the hash map only when the cgroup changes or the slot passes
/// `SWITCH_FLUSH_NS`: the common case costs one array access, no hash lookup.
pub fn try_sched_switch(_ctx: &RawTracePointContext) -> Result<(), i64> {
    let now = unsafe { bpf_ktime_get_ns() };
    let st = SWITCH_STATE.get_ptr_mut(0).ok_or(-2i64)?;
    let st = unsafe { &mut *st };
    let last = st.last_ns;
    st.last_ns = now;
    if last == 0 {
        return Ok(());
    }
    if bpf_get_current_pid_tgid() as u32 == 0 {
        return Ok(()); // the idle task ran
    }
    let delta = now.wrapping_sub(last);
    let cg = unsafe { bpf_get_current_cgroup_id() };
    if cg == st.cgroup_id {
        st.pending_ns += delta;
        if st.pending_ns < SWITCH_FLUSH_NS {
            return Ok(());
        }
        let ns = st.pending_ns;
        st.pending_ns = 0;
        add_cpu_ns(cg, current_node(), ns);
        return Ok(());
    }
    bump(Stat::SwitchEvents);
    let node = current_node();
    if st.pending_ns != 0 {
        add_cpu_ns(st.cgroup_id, node, st.pending_ns);
    }
    st.cgroup_id = cg;
    st.pending_ns = 0;
    add_cpu_ns(cg, node, delta);
    Ok(())
}

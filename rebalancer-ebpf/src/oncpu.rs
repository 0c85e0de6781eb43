//! On-CPU time per (cgroup, node): the cpu-clock sampler (default) and exact sched_switch
//! accounting (option).
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    programs::{PerfEventContext, RawTracePointContext},
};
use rebalancer_common::{Stat, SWITCH_FLUSH_NS};

use crate::maps::{add_cpu_ns, bump, config, current_node, SWITCH_STATE};

/// One cpu-clock sample: the interrupted task (current) ran `sample_period_ns` on this node.
pub fn try_on_cpu_sample(_ctx: &PerfEventContext) -> Result<(), i64> {
    bump(Stat::ClockSamples);
    let pid = bpf_get_current_pid_tgid() as u32;
    if pid == 0 {
        return Ok(()); // the idle task
    }
    let period = config()?.sample_period_ns;
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

//! Types shared by the kernel side (`rebalancer-ebpf`) and the daemon (`rebalancer`).
//!
//! Every type is `#[repr(C)]` with explicit padding so both sides agree byte for byte; sizes are
//! asserted at compile time. `aya::Pod` impls are behind the `user` feature.
#![no_std]

/// Largest CPU id + 1 the CPU → node array map holds.
pub const MAX_CPUS: u32 = 4096;

/// Key of per-(cgroup, NUMA node) maps: a cgroup v2 id and a node id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CgNodeKey {
    pub cgroup_id: u64,
    pub node: u32,
    pub _pad: u32,
}

/// Tracepoint field offsets, read by userspace from tracefs `format` files (layouts differ
/// between kernels, e.g. sched_migrate_task on 6.1 vs 6.18) and handed to the programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpConfig {
    pub switch_prev_pid_off: u32,
    pub migrate_pid_off: u32,
    pub migrate_orig_cpu_off: u32,
    pub migrate_dest_cpu_off: u32,
}

const _: () = assert!(core::mem::size_of::<CgNodeKey>() == 16);
const _: () = assert!(core::mem::size_of::<TpConfig>() == 16);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain-old-data, repr(C), no padding holes (explicit pad fields).
    unsafe impl aya::Pod for super::CgNodeKey {}
    unsafe impl aya::Pod for super::TpConfig {}
}

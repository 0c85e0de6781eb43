//! Static placement engine (pure, no I/O): kubelet-exact topology-hint merge, CPU / memory /
//! device hint providers and allocators, and pod admission.
pub mod mask;
pub mod merge;
pub mod merge_case;
mod merge_search;
pub mod numa_info;

pub use mask::{NodeMask, TopologyHint};
pub mod admission;
pub mod adopt;
pub mod cpu;
pub mod cpu_case;
#[cfg(test)]
mod cpu_case_props;
pub mod cpu_take;
pub mod decision;
pub mod device;
pub mod key;
pub mod memory;
pub mod memory_case;
pub mod pod;
pub mod quantity;
pub mod reserve;
pub mod shared;

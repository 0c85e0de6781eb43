//! rebalancer: an eBPF-assisted dynamic NUMA rebalancer for Linux servers and Kubernetes nodes.
//!
//! See ARCHITECTURE.md for the code map. The pure parts (placement, planner) do no I/O; topology
//! and cgroups are read from roots passed in; only `cgroup` writes cgroupfs.
pub mod cgroup;
pub mod checkpoint;
pub mod cli;
pub mod cmd;
pub mod config;
pub mod controller;
pub mod cpuset;
pub mod daemon;
pub mod ebpf;
pub mod health;
pub mod kubelet_files;
pub mod nri;
pub mod nrt;
pub mod pages;
pub mod placement;
pub mod procfs;
pub mod rounds;
pub mod runwait;
pub mod sdnotify;
pub mod serve;
pub mod sim;
pub mod topology;
pub mod written;

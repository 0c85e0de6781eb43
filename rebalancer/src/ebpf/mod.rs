//! eBPF sampling: the only module that imports aya. Probes sources, loads and attaches the
//! embedded programs, and reads their per-CPU maps into per-cgroup samples.

//! Cgroup layer: v1 / v2 / hybrid detection, reading and validated writing of cpuset and
//! resource files, and recognition of Kubernetes / systemd layouts. The only module that
//! writes cgroupfs.

//! Coexistence with kubelet's CPU and Memory Managers: when kubelet runs a static policy, its
//! state files (`<kubernetes.kubelet_state_dir>/cpu_manager_state`, `memory_manager_state`)
//! list the CPUs and memory it gave containers. Those assignments are adopted as allocator
//! pods keyed [`KEY_PREFIX`]`<pod uid>`: their CPUs are exclusive (off the shared pool, never
//! handed out by admission), their memory is booked on its nodes, the controller never moves a
//! container of such a pod (kubelet pins it; `pinned` in its constraints), admission leaves
//! its containers as kubelet made them, and CPU hotplug replacement leaves them to kubelet.
//!
//! Read at start, on every reload, and again whenever the files' stamps (inode, mtime, size)
//! change — checked at every NRI CreateContainer hook (kubelet writes its file at admission,
//! before CreateContainer) and every control round (`Admission::refresh_kubelet`, which also
//! sets the shared containers to their pools after an install that changed the exclusive
//! CPUs) — in every admission mode: read and parsed with no lock held ([`read_files`]), then
//! installed under the state lock ([`install_files`]).
//! A missing file, or one whose policy is not `static`, adopts nothing. Any error of a file —
//! unreadable, not a regular file, too large, not JSON, a format this does not support (a
//! newer kubelet's `podEntries` / `data` / `dataChecksum`), a checksum mismatch, an invalid
//! entry — is logged, counted in `rebalancer_kubelet_state_errors_total{reason}` and shown in
//! `status`, and keeps that file's previous adoption (kubelet's containers still run where
//! kubelet put them): an adoption is dropped only by a valid file. A file with checksum 0
//! (which kubelet accepts, from its old file backend) is unverified: it adds to the previous
//! adoption, never removes from it. An entry that names CPUs already exclusive to another
//! placement, or offline, is refused alone (logged).
//!
//! Their formats, checksum and safe reading: `crate::kubelet_files`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cgroup::kube::classify_in;
use crate::cpuset::CpuSet;
use crate::kubelet_files::{
    assignments, read_cpu, read_memory, CpuCheckpoint, KubeletStateError, MemoryCheckpoint,
    StaticAssignments, CPU_FILE, MEMORY_FILE,
};
use crate::placement::admission::{AdmittedContainer, AdmittedPod, ContainerPlacement, Qos};
use crate::placement::key::AllocKey;
use crate::placement::memory::MemoryRequest;
use crate::placement::NodeMask;

/// Allocator key prefix of an adopted kubelet pod (reserved: `Pod::validate` refuses it).
pub const KEY_PREFIX: &str = crate::placement::pod::RESERVED_UID_PREFIX;

/// What was adopted and what went wrong, for `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The directory read (`kubernetes.kubelet_state_dir`; empty: off).
    pub state_dir: PathBuf,
    /// The CPU Manager's policy as its file says (empty: no file).
    pub cpu_policy: String,
    /// The Memory Manager's policy as its file says (empty: no file).
    pub memory_policy: String,
    /// Containers adopted (by `<pod uid>/<container name>`).
    pub adopted: Vec<String>,
    /// The errors of the last read (files not adopted, entries refused).
    pub errors: Vec<String>,
    /// What the operator should know although nothing failed: the configured directory does
    /// not exist (kubelet's directory not mounted into the daemon's pod reads as "adopt
    /// nothing", and the daemon would hand out CPUs kubelet has pinned).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Each file's part of the adoption, kept when a later read of that file fails.
    #[serde(skip)]
    cpu_part: StaticAssignments,
    #[serde(skip)]
    memory_part: StaticAssignments,
    /// The files' [`stamp`] when last read (None: never read).
    #[serde(skip)]
    stamp: Option<Stamp>,
    /// An install changed the exclusive CPUs and the shared containers are not yet set to
    /// their pools (`Admission::refresh_kubelet` does it, with no lock held).
    #[serde(skip)]
    pub(crate) shrink_pending: bool,
}

/// What a file looked like (device, inode, mtime, size; None: absent or not statable).
type FileStamp = Option<(u64, u64, i64, i64, u64)>;

/// The two files' stamps: a change of either means they are read again.
pub type Stamp = [FileStamp; 2];

/// The stamps of the state files in `dir` (a cheap `lstat` each; no lock).
pub fn stamp(dir: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt as _;
    if dir.as_os_str().is_empty() {
        return [None, None];
    }
    let one = |name: &str| {
        std::fs::symlink_metadata(dir.join(name))
            .ok()
            .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
    };
    [one(CPU_FILE), one(MEMORY_FILE)]
}

/// Whether the files in `dir` look different from when `s` last read them (`dir` itself
/// changed counts too): to be read again.
pub fn changed(s: &Status, dir: &Path, now: &Stamp) -> bool {
    s.state_dir != dir || s.stamp.as_ref() != Some(now)
}

/// The two state files as read (I/O only, no lock: [`read_files`]), to be installed under the
/// locks by [`install_files`].
#[derive(Debug)]
pub struct Files {
    dir: PathBuf,
    stamp: Stamp,
    cpu: Result<Option<CpuCheckpoint>, KubeletStateError>,
    memory: Result<Option<MemoryCheckpoint>, KubeletStateError>,
}

/// Reads and parses the state files in `dir` (none when `dir` is empty). Takes no lock.
pub fn read_files(dir: &Path) -> Files {
    // stamped before reading: a change while reading is seen by the next check
    let stamp = stamp(dir);
    let none = dir.as_os_str().is_empty();
    Files {
        dir: dir.into(),
        stamp,
        cpu: if none {
            Ok(None)
        } else {
            read_cpu(&dir.join(CPU_FILE))
        },
        memory: if none {
            Ok(None)
        } else {
            read_memory(&dir.join(MEMORY_FILE))
        },
    }
}

/// A parsed file: its policy, its stored checksum and its assignments (or why they are invalid).
type FileRead = (String, u64, Result<StaticAssignments, KubeletStateError>);

/// One file's part of the adoption. A valid file's assignments replace the previous ones
/// (none when the file is gone or its policy is not `static`). On any error — unreadable, not
/// a regular file, too large, not JSON, an unsupported format, a checksum mismatch, an invalid
/// entry — the previous part is kept: kubelet's containers still run where kubelet put them,
/// whatever the file now says (kubelet itself refuses to start on such a file). An unverified
/// file (checksum 0) only adds containers to the previous part.
fn settle(
    prev: &StaticAssignments,
    prev_policy: &str,
    read: Result<Option<FileRead>, KubeletStateError>,
    path: &Path,
    errors: &mut Vec<KubeletStateError>,
) -> (StaticAssignments, String) {
    match read {
        Err(e) => {
            errors.push(e);
            (prev.clone(), prev_policy.into())
        }
        Ok(None) => (StaticAssignments::new(), String::new()),
        Ok(Some((policy, _, Err(e)))) => {
            errors.push(e);
            (prev.clone(), policy)
        }
        Ok(Some((policy, 0, Ok(a)))) => {
            errors.push(KubeletStateError::Unverified { path: path.into() });
            let mut out = prev.clone();
            for (pod, ctrs) in a {
                let have = out.entry(pod).or_default();
                for (name, asg) in ctrs {
                    have.entry(name).or_insert(asg);
                }
            }
            (out, policy)
        }
        Ok(Some((policy, _, Ok(a)))) => (a, policy),
    }
}

/// Installs `files` (from [`read_files`]) into `s` in place of the previous adoption, file by
/// file as [`settle`] says. Call under the state lock; does no I/O.
pub fn install_files(s: &mut super::Shared, files: Files, metrics: &crate::serve::Metrics) {
    let dir = files.dir;
    let mut errors: Vec<KubeletStateError> = Vec::new();
    let cpu_path = dir.join(CPU_FILE);
    let mem_path = dir.join(MEMORY_FILE);
    let cpu = files.cpu.map(|c| {
        c.map(|c| {
            let a = assignments(Some(&c), None, &cpu_path);
            (c.policy_name, c.checksum, a)
        })
    });
    let mem = files.memory.map(|m| {
        m.map(|m| {
            let a = assignments(None, Some(&m), &mem_path);
            (m.policy_name, m.checksum, a)
        })
    });
    let old = std::mem::take(&mut s.kubelet);
    let (cpu_part, cpu_policy) =
        settle(&old.cpu_part, &old.cpu_policy, cpu, &cpu_path, &mut errors);
    let (memory_part, memory_policy) = settle(
        &old.memory_part,
        &old.memory_policy,
        mem,
        &mem_path,
        &mut errors,
    );
    let mut assigned = cpu_part.clone();
    for (pod, ctrs) in &memory_part {
        for (name, asg) in ctrs {
            assigned
                .entry(pod.clone())
                .or_default()
                .entry(name.clone())
                .or_default()
                .memory = asg.memory.clone();
        }
    }
    let mut status = Status {
        state_dir: dir,
        cpu_policy,
        memory_policy,
        cpu_part,
        memory_part,
        stamp: Some(files.stamp),
        ..Default::default()
    };
    for e in &errors {
        tracing::error!(error = %e, "kubelet state file not adopted as it is; that file's previous adoption kept");
        crate::serve::metrics::count(&metrics.kubelet_state_errors, e.reason());
    }
    status.errors = errors.iter().map(|e| e.to_string()).collect();
    status.warnings = missing_dir_warning(&status.state_dir).into_iter().collect();
    for w in &status.warnings {
        if !old.warnings.contains(w) {
            tracing::warn!("{w}");
        }
    }
    let before = s.state.allocator.exclusive_cpus();
    let refused = install(s, &assigned, &mut status.adopted);
    status.shrink_pending = old.shrink_pending || s.state.allocator.exclusive_cpus() != before;
    for r in &refused {
        tracing::error!(error = %r, "kubelet assignment not adopted");
        crate::serve::metrics::count(&metrics.kubelet_state_errors, "refused");
    }
    status.errors.extend(refused);
    if !status.adopted.is_empty() {
        tracing::info!(containers = ?status.adopted, "kubelet's static CPU / Memory Manager assignments adopted as exclusive (never re-placed)");
    }
    metrics.kubelet_adopted.set(status.adopted.len() as i64);
    s.kubelet = status;
}

/// The warning for a configured state directory that is not a directory here.
fn missing_dir_warning(dir: &Path) -> Option<String> {
    (!dir.as_os_str().is_empty() && !dir.is_dir()).then(|| {
        format!(
            "kubelet state directory {} does not exist: nothing of kubelet's CPU / Memory Manager is adopted; mount kubelet's directory (read-only), or set kubernetes.kubelet_state_dir = \"\" where no kubelet runs",
            dir.display()
        )
    })
}

/// [`read_files`] then [`install_files`] on a `Shared` that is behind no lock (tests).
#[cfg(test)]
pub(crate) fn adopt(s: &mut super::Shared, metrics: &crate::serve::Metrics) {
    let files = read_files(&s.cfg.kubernetes.kubelet_state_dir.clone());
    install_files(s, files, metrics);
}

/// Replaces the adopted pods of `s`'s allocator by `assigned`; the refusals' reasons.
fn install(
    s: &mut super::Shared,
    assigned: &StaticAssignments,
    adopted: &mut Vec<String>,
) -> Vec<String> {
    let alloc = &mut s.state.allocator;
    let old: Vec<String> = alloc
        .pods
        .keys()
        .filter(|k| k.is_kubelet())
        .map(|k| k.to_string())
        .collect();
    for k in old {
        alloc.release(&k);
    }
    let online = s.topo.online_cpus();
    let mut taken = alloc.exclusive_cpus();
    let mut refused = Vec::new();
    for (pod, ctrs) in assigned {
        let mut containers = Vec::new();
        let mut cpu_millis = 0;
        let mut pod_req = MemoryRequest::new();
        for (name, a) in ctrs {
            if !a.cpus.is_subset(&online) || !a.cpus.is_disjoint(&taken) {
                refused.push(format!(
                    "pod {pod} container {name}: kubelet's CPUs {} are offline or exclusive to another placement ({})",
                    a.cpus,
                    a.cpus.intersection(&taken)
                ));
                continue;
            }
            let known = |m: NodeMask| m.ids().all(|id| alloc.memory.node(id).is_some());
            if let Some((_, _, m)) = a.memory.iter().find(|(_, _, m)| !known(*m)) {
                refused.push(format!(
                    "pod {pod} container {name}: kubelet's memory names nodes {m:?} this machine does not have"
                ));
                continue;
            }
            let mut req = MemoryRequest::new();
            let mut mask = NodeMask::EMPTY;
            for &(r, size, m) in &a.memory {
                *req.entry(r).or_default() += size;
                *pod_req.entry(r).or_default() += size;
                mask = mask.or(m);
            }
            let memory = (!req.is_empty()).then(|| alloc.memory.allocate(&req, mask));
            let mems = if mask.is_empty() {
                a.cpus
                    .iter()
                    .filter_map(|c| s.topo.node_of_cpu(c))
                    .collect()
            } else {
                mask.to_cpuset()
            };
            cpu_millis += a.cpus.len() as u64 * 1000;
            taken.union_with(&a.cpus);
            adopted.push(format!("{pod}/{name}"));
            containers.push(AdmittedContainer {
                placement: ContainerPlacement {
                    container: name.clone(),
                    exclusive: !a.cpus.is_empty(),
                    cpus: a.cpus.clone(),
                    mems,
                    affinity: (!mask.is_empty()).then_some(mask),
                    devices: Vec::new(),
                    topology: None,
                },
                kind: Default::default(),
                charges: Default::default(),
                memory,
            });
        }
        if containers.is_empty() {
            continue;
        }
        alloc.pods.insert(
            AllocKey::kubelet(pod),
            AdmittedPod {
                qos: Qos::Guaranteed,
                cpu_request_millis: cpu_millis,
                memory_request: pod_req,
                containers,
                hold: None,
            },
        );
    }
    refused
}

/// Whether kubelet's static CPU Manager gave `pod_uid`'s container `name` exclusive CPUs
/// (`name` None, for a caller that cannot tell a cgroup's container, as the watcher: any
/// container of the pod). None when the pod is not kubelet's. `Some(false)`: the pod is
/// kubelet's (a Memory Manager entry, or CPUs for another of its containers) but this
/// container runs on no CPU of kubelet's own: it must still not run on the exclusive CPUs
///, so its cpus are fenced off them (`admission::fence_cpus`), its mems left to
/// kubelet.
pub fn cpu_assigned(s: &super::Shared, pod_uid: &str, name: Option<&str>) -> Option<bool> {
    let mut exclusive = pod_of(s, pod_uid)?
        .containers
        .iter()
        .filter(|c| c.placement.exclusive);
    Some(exclusive.any(|c| name.is_none_or(|n| c.placement.container == n)))
}

/// The adopted pod of kubelet's `pod_uid`.
fn pod_of<'a>(s: &'a super::Shared, pod_uid: &str) -> Option<&'a AdmittedPod> {
    s.state
        .allocator
        .pods
        .get(AllocKey::kubelet(pod_uid).as_str())
}

/// The CPUs kubelet's static CPU Manager gave `pod_uid`'s containers (empty when it gave none,
/// or when the pod is not kubelet's). A container of the pod that kubelet gave CPUs runs on
/// these; one it gave none (a sidecar) on kubelet's shared pool.
pub fn pod_cpus(s: &super::Shared, pod_uid: &str) -> CpuSet {
    let mut out = CpuSet::new();
    for c in pod_of(s, pod_uid).iter().flat_map(|p| &p.containers) {
        if c.placement.exclusive {
            out.union_with(&c.placement.cpus);
        }
    }
    out
}

/// Whether `pod_uid` is a pod whose assignments were adopted from kubelet.
pub fn owns_pod(s: &super::Shared, pod_uid: &str) -> bool {
    pod_of(s, pod_uid).is_some()
}

/// Whether the cgroup `cg` is a container of an adopted kubelet pod (never moved), under
/// kubelet's cgroup root as configured (`cgroups.kubernetes_root`), as the engine reads it.
pub fn pinned(s: &super::Shared, cg: &str) -> bool {
    classify_in(cg, s.cfg.cgroups.kubernetes_root.as_deref(), &[])
        .pod_uid()
        .is_some_and(|uid| owns_pod(s, uid))
}

#[cfg(test)]
#[path = "kubelet_tests.rs"]
mod tests;

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
//! CPUs) — in every admission mode: read and parsed with no lock
//! held ([`read_files`]: regular files only — no symlink, FIFO or device —, at most
//! [`MAX_FILE_BYTES`]), then installed under the state lock ([`install_files`]).
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
//! The formats are kubelet's `CPUManagerCheckpointV2` (`policyName`, `defaultCpuSet`,
//! `entries`: pod uid → container name → cpuset, `checksum`) and `MemoryManagerCheckpoint`
//! (`policyName`, `machineState`, `entries`: pod uid → container name → blocks
//! `{numaAffinity, type, size}`, `checksum`). The checksum is kubelet's
//! `checkpointmanager/checksum`: FNV-1a 32 of go-spew's `%#v` rendering of the checkpoint with
//! `checksum = 0` (config `SortKeys, DisableMethods, SpewKeys`), reproduced by [`spew_cpu`] and
//! [`spew_memory`] for exactly these structs (checked against kubelet's own test vectors).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cgroup::kube::classify_in;
use crate::cpuset::CpuSet;
use crate::placement::admission::{AdmittedContainer, AdmittedPod, ContainerPlacement, Qos};
use crate::placement::key::AllocKey;
use crate::placement::memory::{MemoryRequest, MemoryResource};
use crate::placement::NodeMask;

/// Allocator key prefix of an adopted kubelet pod (reserved: `Pod::validate` refuses it).
pub const KEY_PREFIX: &str = crate::placement::pod::RESERVED_UID_PREFIX;
pub const CPU_FILE: &str = "cpu_manager_state";
pub const MEMORY_FILE: &str = "memory_manager_state";

/// Why a state file was not adopted.
#[derive(Debug, thiserror::Error)]
pub enum KubeletStateError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a kubelet checkpoint: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: checksum {stored} does not match the content (computed {computed}): corrupt, or written by a kubelet version whose format is not known")]
    Checksum {
        path: PathBuf,
        stored: u64,
        computed: u64,
    },
    #[error("{path}: checksum 0: unverified, so its assignments were added to the previous adoption and nothing of that was dropped")]
    Unverified { path: PathBuf },
    #[error("{path}: kubelet checkpoint format not supported (fields {fields:?}: a newer kubelet, e.g. pod-level resource managers)")]
    Unsupported { path: PathBuf, fields: Vec<String> },
    #[error("{path}: is {kind}, not a regular file: not read")]
    NotRegular { path: PathBuf, kind: String },
    #[error("{path}: larger than {limit} bytes: not read")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

impl KubeletStateError {
    fn reason(&self) -> &'static str {
        match self {
            KubeletStateError::Read { .. } => "read",
            KubeletStateError::Json { .. } => "parse",
            KubeletStateError::Checksum { .. } => "checksum",
            KubeletStateError::Invalid { .. } => "invalid",
            KubeletStateError::Unverified { .. } => "unverified",
            KubeletStateError::Unsupported { .. } => "unsupported",
            KubeletStateError::NotRegular { .. } => "kind",
            KubeletStateError::TooLarge { .. } => "size",
        }
    }
}

fn empty_map<K: Ord, V>() -> Option<BTreeMap<K, V>> {
    Some(BTreeMap::new())
}

/// kubelet's `CPUManagerCheckpointV2`. An absent map is an empty one (kubelet makes it before
/// unmarshalling); `null` is Go's nil map (rendered differently by the checksum).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct CpuCheckpoint {
    #[serde(rename = "policyName")]
    pub policy_name: String,
    #[serde(rename = "defaultCpuSet", alias = "defaultCPUSet", default)]
    pub default_cpu_set: String,
    #[serde(default = "empty_map")]
    pub entries: Option<BTreeMap<String, BTreeMap<String, String>>>,
    #[serde(default)]
    pub checksum: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct MemoryTable {
    #[serde(default)]
    pub total: u64,
    #[serde(rename = "systemReserved", default)]
    pub system_reserved: u64,
    #[serde(default)]
    pub allocatable: u64,
    #[serde(default)]
    pub reserved: u64,
    #[serde(default)]
    pub free: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct NodeState {
    #[serde(rename = "numberOfAssignments", default)]
    pub number_of_assignments: i64,
    #[serde(rename = "memoryMap", default)]
    pub memory_map: Option<BTreeMap<String, Option<MemoryTable>>>,
    #[serde(default)]
    pub cells: Option<Vec<i64>>,
}

/// One memory block of a container (kubelet's `state.Block`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Block {
    #[serde(rename = "numaAffinity", default)]
    pub numa_affinity: Option<Vec<i64>>,
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub size: u64,
}

/// kubelet's `MemoryManagerCheckpoint` (V2 of kubelet 1.22 on: four fields).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct MemoryCheckpoint {
    #[serde(rename = "policyName")]
    pub policy_name: String,
    #[serde(rename = "machineState", default = "empty_map")]
    pub machine_state: Option<BTreeMap<String, Option<NodeState>>>,
    #[serde(default = "empty_map")]
    pub entries: Option<BTreeMap<String, BTreeMap<String, Vec<Block>>>>,
    #[serde(default)]
    pub checksum: u64,
}

/// FNV-1a, 32 bits (Go's `hash/fnv.New32a`).
pub fn fnv1a32(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// A Go map rendered by spew inside a value (types off): `map[k:v k:v]`, `<nil>` for nil.
fn spew_map<V>(
    out: &mut String,
    m: Option<&BTreeMap<String, V>>,
    mut each: impl FnMut(&mut String, &V),
) {
    let Some(m) = m else {
        out.push_str("<nil>");
        return;
    };
    out.push_str("map[");
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(k);
        out.push(':');
        each(out, v);
    }
    out.push(']');
}

fn spew_ints(out: &mut String, v: Option<&Vec<i64>>) {
    match v {
        None => out.push_str("<nil>"),
        Some(v) => {
            out.push('[');
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let _ = write!(out, "{x}");
            }
            out.push(']');
        }
    }
}

/// go-spew `%#v` of `*state.CPUManagerCheckpoint` with `Checksum = 0` (what kubelet hashes).
pub fn spew_cpu(c: &CpuCheckpoint) -> String {
    let mut s = format!(
        "(*state.CPUManagerCheckpoint){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:(map[string]map[string]string)",
        c.policy_name, c.default_cpu_set
    );
    spew_map(&mut s, c.entries.as_ref(), |s, m| {
        spew_map(s, Some(m), |s, v: &String| s.push_str(v))
    });
    s.push_str(" Checksum:(checksum.Checksum)0}");
    s
}

/// go-spew `%#v` of `*state.MemoryManagerCheckpoint` with `Checksum = 0`. Map keys sort as
/// their Go type does: the node map's by number, the others' as strings.
pub fn spew_memory(c: &MemoryCheckpoint) -> Result<String, String> {
    let mut s = format!(
        "(*state.MemoryManagerCheckpoint){{PolicyName:(string){} MachineState:(state.NUMANodeMap)",
        c.policy_name
    );
    match &c.machine_state {
        None => s.push_str("<nil>"),
        Some(m) => {
            let mut nodes = Vec::new();
            for (k, v) in m {
                let id: i64 = k
                    .parse()
                    .map_err(|_| format!("machineState key {k:?} is not a node number"))?;
                nodes.push((id, v));
            }
            nodes.sort_by_key(|(id, _)| *id);
            s.push_str("map[");
            for (i, (id, n)) in nodes.into_iter().enumerate() {
                if i > 0 {
                    s.push(' ');
                }
                let _ = write!(s, "{id}:");
                let Some(n) = n else {
                    s.push_str("<nil>");
                    continue;
                };
                let _ = write!(
                    s,
                    "<*>{{NumberOfAssignments:(int){} MemoryMap:(map[v1.ResourceName]*state.MemoryTable)",
                    n.number_of_assignments
                );
                spew_map(&mut s, n.memory_map.as_ref(), |s, t| match t {
                    None => s.push_str("<nil>"),
                    Some(t) => {
                        let _ = write!(
                            s,
                            "<*>{{TotalMemSize:(uint64){} SystemReserved:(uint64){} Allocatable:(uint64){} Reserved:(uint64){} Free:(uint64){}}}",
                            t.total, t.system_reserved, t.allocatable, t.reserved, t.free
                        );
                    }
                });
                s.push_str(" Cells:([]int)");
                spew_ints(&mut s, n.cells.as_ref());
                s.push('}');
            }
            s.push(']');
        }
    }
    s.push_str(" Entries:(state.ContainerMemoryAssignments)");
    spew_map(&mut s, c.entries.as_ref(), |s, pod| {
        spew_map(s, Some(pod), |s, blocks: &Vec<Block>| {
            s.push('[');
            for (i, b) in blocks.iter().enumerate() {
                if i > 0 {
                    s.push(' ');
                }
                s.push_str("{NUMAAffinity:([]int)");
                spew_ints(s, b.numa_affinity.as_ref());
                let _ = write!(
                    s,
                    " Type:(v1.ResourceName){} Size:(uint64){}}}",
                    b.kind, b.size
                );
            }
            s.push(']');
        })
    });
    s.push_str(" Checksum:(checksum.Checksum)0}");
    Ok(s)
}

/// The largest state file read (kubelet's are kilobytes; a bigger one is refused, not read).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// The text of `path`: `Ok(None)` when it does not exist. Only a regular file is read — the
/// last component is opened without following a symlink, non-blocking (a FIFO never blocks the
/// reader), and the opened file's own metadata must say "regular" — and at most
/// [`MAX_FILE_BYTES`].
fn read(path: &Path) -> Result<Option<String>, KubeletStateError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let err = |source| KubeletStateError::Read {
        path: path.into(),
        source,
    };
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(KubeletStateError::NotRegular {
                path: path.into(),
                kind: "a symlink".into(),
            })
        }
        Err(e) => return Err(err(e)),
    };
    let meta = f.metadata().map_err(err)?;
    if !meta.file_type().is_file() {
        use std::os::unix::fs::FileTypeExt as _;
        let t = meta.file_type();
        let kind = if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else if t.is_dir() {
            "a directory"
        } else if t.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(KubeletStateError::NotRegular {
            path: path.into(),
            kind: kind.into(),
        });
    }
    let mut buf = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(err)?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        return Err(KubeletStateError::TooLarge {
            path: path.into(),
            limit: MAX_FILE_BYTES,
        });
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

fn verify(path: &Path, stored: u64, rendered: &str) -> Result<(), KubeletStateError> {
    let computed = u64::from(fnv1a32(rendered));
    // kubelet accepts a zero checksum (files of its old file backend); so does this, but such
    // a file is unverified: [`install_files`] lets it add to the adoption, never drop from it
    if stored != 0 && stored != computed {
        return Err(KubeletStateError::Checksum {
            path: path.into(),
            stored,
            computed,
        });
    }
    Ok(())
}

/// `text` as the checkpoint `T`, whose top-level fields are `known`: any other field (a newer
/// kubelet's `podEntries`, `data`, `dataChecksum`) is a format this does not support.
fn parse<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
    known: &[&str],
) -> Result<T, KubeletStateError> {
    let json = |source| KubeletStateError::Json {
        path: path.into(),
        source,
    };
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text).map_err(json)?;
    let unknown: Vec<String> = v
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(KubeletStateError::Unsupported {
            path: path.into(),
            fields: unknown,
        });
    }
    serde_json::from_value(serde_json::Value::Object(v)).map_err(json)
}

/// The CPU Manager's state file: `Ok(None)` when there is none.
pub fn read_cpu(path: &Path) -> Result<Option<CpuCheckpoint>, KubeletStateError> {
    let Some(text) = read(path)? else {
        return Ok(None);
    };
    let c: CpuCheckpoint = parse(
        path,
        &text,
        &[
            "policyName",
            "defaultCpuSet",
            "defaultCPUSet",
            "entries",
            "checksum",
        ],
    )?;
    verify(path, c.checksum, &spew_cpu(&c))?;
    Ok(Some(c))
}

/// The Memory Manager's state file: `Ok(None)` when there is none.
pub fn read_memory(path: &Path) -> Result<Option<MemoryCheckpoint>, KubeletStateError> {
    let Some(text) = read(path)? else {
        return Ok(None);
    };
    let c: MemoryCheckpoint = parse(
        path,
        &text,
        &["policyName", "machineState", "entries", "checksum"],
    )?;
    let rendered = spew_memory(&c).map_err(|what| KubeletStateError::Invalid {
        path: path.into(),
        what,
    })?;
    verify(path, c.checksum, &rendered)?;
    Ok(Some(c))
}

/// One adopted container: its exclusive CPUs (empty when kubelet gave it shared ones) and its
/// memory blocks (resource, size, nodes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    pub cpus: CpuSet,
    pub memory: Vec<(MemoryResource, u64, NodeMask)>,
}

/// What kubelet's static managers assigned: pod uid → container name → assignment.
pub type Assignments = BTreeMap<String, BTreeMap<String, Assignment>>;

/// The static assignments of the two files (a file under another policy gives none).
pub fn assignments(
    cpu: Option<&CpuCheckpoint>,
    mem: Option<&MemoryCheckpoint>,
    path: &Path,
) -> Result<Assignments, KubeletStateError> {
    let invalid = |what: String| KubeletStateError::Invalid {
        path: path.into(),
        what,
    };
    let mut out = Assignments::new();
    if let Some(c) = cpu.filter(|c| c.policy_name.eq_ignore_ascii_case("static")) {
        for (pod, ctrs) in c.entries.iter().flatten() {
            for (name, set) in ctrs {
                let cpus = CpuSet::parse(set).map_err(|e| {
                    invalid(format!(
                        "cpuset {set:?} of container {name} of pod {pod}: {e}"
                    ))
                })?;
                if cpus.is_empty() {
                    continue; // no CPUs of its own: nothing to adopt
                }
                out.entry(pod.clone())
                    .or_default()
                    .entry(name.clone())
                    .or_default()
                    .cpus = cpus;
            }
        }
    }
    if let Some(m) = mem.filter(|m| m.policy_name.eq_ignore_ascii_case("static")) {
        for (pod, ctrs) in m.entries.iter().flatten() {
            for (name, blocks) in ctrs {
                for b in blocks {
                    let r = MemoryResource::parse(&b.kind).ok_or_else(|| {
                        invalid(format!(
                            "memory type {:?} of container {name} of pod {pod} unknown",
                            b.kind
                        ))
                    })?;
                    let ids = b.numa_affinity.iter().flatten();
                    let mask = ids
                        .map(|&i| u32::try_from(i).ok())
                        .collect::<Option<Vec<u32>>>()
                        .and_then(NodeMask::from_ids)
                        .filter(|m| !m.is_empty())
                        .ok_or_else(|| {
                            invalid(format!(
                                "numaAffinity {:?} of container {name} of pod {pod}",
                                b.numa_affinity
                            ))
                        })?;
                    out.entry(pod.clone())
                        .or_default()
                        .entry(name.clone())
                        .or_default()
                        .memory
                        .push((r, b.size, mask));
                }
            }
        }
    }
    Ok(out)
}

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
    cpu_part: Assignments,
    #[serde(skip)]
    memory_part: Assignments,
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
    if dir.as_os_str().is_empty() {
        return Files {
            dir: dir.into(),
            stamp,
            cpu: Ok(None),
            memory: Ok(None),
        };
    }
    Files {
        dir: dir.into(),
        stamp,
        cpu: read_cpu(&dir.join(CPU_FILE)),
        memory: read_memory(&dir.join(MEMORY_FILE)),
    }
}

/// A parsed file: its policy, its stored checksum and its assignments (or why they are invalid).
type FileRead = (String, u64, Result<Assignments, KubeletStateError>);

/// One file's part of the adoption. A valid file's assignments replace the previous ones
/// (none when the file is gone or its policy is not `static`). On any error — unreadable, not
/// a regular file, too large, not JSON, an unsupported format, a checksum mismatch, an invalid
/// entry — the previous part is kept: kubelet's containers still run where kubelet put them,
/// whatever the file now says (kubelet itself refuses to start on such a file). An unverified
/// file (checksum 0) only adds containers to the previous part.
fn settle(
    prev: &Assignments,
    prev_policy: &str,
    read: Result<Option<FileRead>, KubeletStateError>,
    path: &Path,
    errors: &mut Vec<KubeletStateError>,
) -> (Assignments, String) {
    match read {
        Err(e) => {
            errors.push(e);
            (prev.clone(), prev_policy.into())
        }
        Ok(None) => (Assignments::new(), String::new()),
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
        metrics
            .kubelet_state_errors
            .get_or_create(&crate::serve::metrics::ReasonLabel {
                reason: e.reason().into(),
            })
            .inc();
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
        metrics
            .kubelet_state_errors
            .get_or_create(&crate::serve::metrics::ReasonLabel {
                reason: "refused".into(),
            })
            .inc();
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
    assigned: &Assignments,
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
    let p = s
        .state
        .allocator
        .pods
        .get(AllocKey::kubelet(pod_uid).as_str())?;
    Some(
        p.containers
            .iter()
            .any(|c| c.placement.exclusive && name.is_none_or(|n| c.placement.container == n)),
    )
}

/// The CPUs kubelet's static CPU Manager gave `pod_uid`'s containers (empty when it gave none,
/// or when the pod is not kubelet's). A container of the pod that kubelet gave CPUs runs on
/// these; one it gave none (a sidecar) on kubelet's shared pool.
pub fn pod_cpus(s: &super::Shared, pod_uid: &str) -> CpuSet {
    let mut out = CpuSet::new();
    if let Some(p) = s
        .state
        .allocator
        .pods
        .get(AllocKey::kubelet(pod_uid).as_str())
    {
        for c in p.containers.iter().filter(|c| c.placement.exclusive) {
            out.union_with(&c.placement.cpus);
        }
    }
    out
}

/// Whether `pod_uid` is a pod whose assignments were adopted from kubelet.
pub fn owns_pod(s: &super::Shared, pod_uid: &str) -> bool {
    s.state
        .allocator
        .pods
        .contains_key(AllocKey::kubelet(pod_uid).as_str())
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

//! kubelet's static CPU and Memory Manager state files (`cpu_manager_state`,
//! `memory_manager_state`): their formats, their checksum, and reading them safely. Pure but
//! for the reads: regular files only (no symlink, FIFO or device), at most
//! [`MAX_FILE_BYTES`]. What the daemon adopts from them is `daemon::kubelet`'s.
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

use serde::Deserialize;

use crate::cpuset::CpuSet;
use crate::placement::memory::MemoryResource;
use crate::placement::NodeMask;

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
    pub fn reason(&self) -> &'static str {
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

/// One memory block of a container (kubelet's `state.MemoryBlock`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct KubeletMemoryBlock {
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
    pub entries: Option<BTreeMap<String, BTreeMap<String, Vec<KubeletMemoryBlock>>>>,
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
        spew_map(s, Some(pod), |s, blocks: &Vec<KubeletMemoryBlock>| {
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
pub(crate) fn read(path: &Path) -> Result<Option<String>, KubeletStateError> {
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
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
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
pub type StaticAssignments = BTreeMap<String, BTreeMap<String, Assignment>>;

/// The static assignments of the two files (a file under another policy gives none).
pub fn assignments(
    cpu: Option<&CpuCheckpoint>,
    mem: Option<&MemoryCheckpoint>,
    path: &Path,
) -> Result<StaticAssignments, KubeletStateError> {
    let invalid = |what: String| KubeletStateError::Invalid {
        path: path.into(),
        what,
    };
    let mut out = StaticAssignments::new();
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

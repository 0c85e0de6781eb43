//! Cgroup layer: v1 / v2 / hybrid detection, reading and validated writing of cpuset and
//! resource files, and recognition of Kubernetes / systemd layouts. The only module that
//! writes cgroupfs.
//!
//! - [`mode`]: where the hierarchies are mounted (mountinfo or a directory scan; roots passed in).
//! - [`files`]: pure parsers for the interface files, v1 and v2, normalised to one model.
//! - [`kube`]: `classify(path)` → pod / container / QoS tier / systemd unit / configured root.
//! - [`Cgroups`] (here): the handle that resolves a cgroup path to a controller's directory,
//!   reads, and writes `cpuset.cpus` / `cpuset.mems` with the invariants enforced: never empty,
//!   never outside the parent's effective set, kernel errors mapped to messages naming the path
//!   and the value, and every write read back.
//!
//! **cgroups-rs is not used here; plain file I/O is.** Measured (proving-ground.md) and read in
//! its 0.5.1 source: on v2 its cpuset reader reads the v1 file names (`cpuset.effective_cpus`)
//! and so returns empty effective sets; creating a cgroup writes every controller of the parent
//! into `cgroup.subtree_control`; its readers turn read errors into empty defaults (an empty
//! cpuset looks like a valid answer — exactly what our invariants forbid); and it finds mounts
//! from the global `/proc/self/mountinfo` rather than a root we pass in. The root test
//! (`tests/cgroup_root.rs`) checks what we wrote by reading the kernel's file itself.
use std::{
    fs,
    io::Write,
    path::{Component, Path, PathBuf},
};

use crate::cpuset::CpuSet;

pub mod files;
pub mod kube;
pub mod mode;

pub use files::{CpuMax, NodeBytes, NumaStat, ProcCgroup};
pub use kube::{classify, classify_in, classify_with_roots, CgroupKind};
pub use mode::{CgroupMode, Mounts};

/// Errors of the cgroup layer. Every variant names the file involved.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Malformed { path: PathBuf, message: String },
    #[error("refusing to write an empty set to {path}: a cpuset is never empty")]
    Empty { path: PathBuf },
    #[error("refusing to write {value:?} to {path}: {outside:?} not in the parent's effective set {parent:?}")]
    OutsideParent {
        path: PathBuf,
        value: String,
        outside: String,
        parent: String,
    },
    #[error("writing {value:?} to {path}: {reason}")]
    Write {
        path: PathBuf,
        value: String,
        reason: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} reads back {read:?} after writing {wrote:?}")]
    Verify {
        path: PathBuf,
        wrote: String,
        read: String,
    },
    #[error("no {controller} controller mounted (cgroup mode {mode})")]
    NoController {
        controller: &'static str,
        mode: CgroupMode,
    },
    #[error("invalid cgroup path {path:?}: must be relative to the hierarchy, without '..'")]
    BadPath { path: String },
}

/// Which hierarchy a controller lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// A cgroup's hugepage limits in bytes (`None`: no limit file or unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HugetlbLimits {
    pub hugepages_2mi: Option<u64>,
    pub hugepages_1gi: Option<u64>,
}

/// Controllers the layer reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    Cpuset,
    Cpu,
    Memory,
    Hugetlb,
}

impl Controller {
    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpuset => "cpuset",
            Controller::Cpu => "cpu",
            Controller::Memory => "memory",
            Controller::Hugetlb => "hugetlb",
        }
    }
}

/// A cpuset file pair: CPUs or memory nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetKind {
    Cpus,
    Mems,
}

impl SetKind {
    fn file(self) -> &'static str {
        match self {
            SetKind::Cpus => "cpuset.cpus",
            SetKind::Mems => "cpuset.mems",
        }
    }
    fn effective(self, v: Version) -> &'static str {
        match (self, v) {
            (SetKind::Cpus, Version::V2) => "cpuset.cpus.effective",
            (SetKind::Mems, Version::V2) => "cpuset.mems.effective",
            (SetKind::Cpus, Version::V1) => "cpuset.effective_cpus",
            (SetKind::Mems, Version::V1) => "cpuset.effective_mems",
        }
    }
}

/// What the kernel means by a write error on a cgroup file.
fn write_reason(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EINVAL) => "the kernel rejected the value (EINVAL: malformed, offline, or outside the parent's set)",
        Some(libc::EBUSY) => "busy (EBUSY: a child cgroup or exclusive sibling still uses part of the current set)",
        Some(libc::ENOSPC) => "no CPUs or memory nodes would be left for the cgroup's tasks (ENOSPC)",
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied",
        Some(libc::ENOENT) | Some(libc::ENODEV) => "the cgroup or file no longer exists",
        _ => "write failed",
    }
}

/// Handle on the machine's cgroup hierarchies. Paths given to its methods are cgroup paths
/// relative to the hierarchy root (`/kubepods.slice/...`; the leading `/` is optional).
#[derive(Clone, Debug)]
pub struct Cgroups {
    mounts: Mounts,
    page_size: u64,
}

impl Cgroups {
    pub fn new(mounts: Mounts) -> Self {
        // SAFETY: sysconf has no preconditions.
        let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Self {
            mounts,
            page_size: u64::try_from(ps).ok().filter(|&p| p > 0).unwrap_or(4096),
        }
    }

    /// Detects the hierarchies mounted at or below `root` (normally `/sys/fs/cgroup`) from
    /// `mountinfo` (normally `/proc/self/mountinfo`), falling back to scanning `root`.
    pub fn detect(root: &Path, mountinfo: &Path) -> Result<Self, CgroupError> {
        Ok(Self::new(Mounts::detect(root, mountinfo)?))
    }

    /// Page size used to turn v1 `memory.numa_stat` pages into bytes (tests set it).
    pub fn with_page_size(mut self, page_size: u64) -> Self {
        self.page_size = page_size;
        self
    }

    pub fn mode(&self) -> CgroupMode {
        self.mounts.mode()
    }

    pub fn mounts(&self) -> &Mounts {
        &self.mounts
    }

    /// The hierarchy a controller is on: its v1 mount if it has one, else the v2 mount.
    pub fn hierarchy(&self, c: Controller) -> Result<(&Path, Version), CgroupError> {
        if let Some(p) = self.mounts.v1.get(c.name()) {
            return Ok((p, Version::V1));
        }
        match &self.mounts.v2 {
            Some(p) => Ok((p, Version::V2)),
            None => Err(CgroupError::NoController {
                controller: c.name(),
                mode: self.mode(),
            }),
        }
    }

    /// Directory of cgroup `rel` in controller `c`'s hierarchy.
    pub fn dir(&self, c: Controller, rel: &str) -> Result<(PathBuf, Version), CgroupError> {
        let (root, v) = self.hierarchy(c)?;
        Ok((root.join(clean(rel)?), v))
    }

    /// Whether cgroup `rel` exists in controller `c`'s hierarchy now.
    pub fn exists(&self, c: Controller, rel: &str) -> bool {
        self.dir(c, rel).is_ok_and(|(d, _)| d.is_dir())
    }

    fn read(&self, path: &Path) -> Result<String, CgroupError> {
        fs::read_to_string(path).map_err(|source| CgroupError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    fn read_set(&self, path: &Path) -> Result<CpuSet, CgroupError> {
        CpuSet::parse(&self.read(path)?).map_err(|e| CgroupError::Malformed {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    fn set_file(&self, rel: &str, kind: SetKind, effective: bool) -> Result<PathBuf, CgroupError> {
        let (dir, v) = self.dir(Controller::Cpuset, rel)?;
        Ok(dir.join(if effective {
            kind.effective(v)
        } else {
            kind.file()
        }))
    }

    /// `cpuset.cpus` as configured (may be empty on v2, meaning "inherit").
    pub fn cpus(&self, rel: &str) -> Result<CpuSet, CgroupError> {
        self.read_set(&self.set_file(rel, SetKind::Cpus, false)?)
    }

    pub fn mems(&self, rel: &str) -> Result<CpuSet, CgroupError> {
        self.read_set(&self.set_file(rel, SetKind::Mems, false)?)
    }

    /// The CPUs the cgroup's tasks may really use (v2 `cpuset.cpus.effective`, v1
    /// `cpuset.effective_cpus`).
    pub fn effective_cpus(&self, rel: &str) -> Result<CpuSet, CgroupError> {
        self.read_set(&self.set_file(rel, SetKind::Cpus, true)?)
    }

    pub fn effective_mems(&self, rel: &str) -> Result<CpuSet, CgroupError> {
        self.read_set(&self.set_file(rel, SetKind::Mems, true)?)
    }

    /// CPU bandwidth limit (v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`).
    pub fn cpu_max(&self, rel: &str) -> Result<CpuMax, CgroupError> {
        let (dir, v) = self.dir(Controller::Cpu, rel)?;
        match v {
            Version::V2 => {
                let p = dir.join("cpu.max");
                files::parse_cpu_max(&p, &self.read(&p)?)
            }
            Version::V1 => {
                let (q, p) = (dir.join("cpu.cfs_quota_us"), dir.join("cpu.cfs_period_us"));
                files::parse_cfs(&q, &self.read(&q)?, &p, &self.read(&p)?)
            }
        }
    }

    /// How much the CPU bandwidth limit (`cpu.max`, v1 CFS quota) of `cpu_rel` (a cgroup of
    /// the CPU controller's hierarchy) or of one of its ancestors throttled it
    /// ([`files::parse_throttling`] of each `cpu.stat`, summed from `cpu_rel` up to, not
    /// including, the hierarchy's root): only its growth means anything. A level without the
    /// file or the lines (no CPU controller, no limit) counts 0; so does everything without a
    /// CPU hierarchy.
    pub fn throttling(&self, cpu_rel: &str) -> u64 {
        let Ok((root, _)) = self.hierarchy(Controller::Cpu) else {
            return 0;
        };
        let Ok(rel) = clean(cpu_rel) else { return 0 };
        rel.ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .filter_map(|a| fs::read_to_string(root.join(a).join("cpu.stat")).ok())
            .map(|t| files::parse_throttling(&t))
            .fold(0u64, u64::wrapping_add)
    }

    /// CPU weight on the v2 scale 1..10000 (v1 `cpu.shares` converted).
    pub fn cpu_weight(&self, rel: &str) -> Result<u64, CgroupError> {
        let (dir, v) = self.dir(Controller::Cpu, rel)?;
        let p = dir.join(match v {
            Version::V2 => "cpu.weight",
            Version::V1 => "cpu.shares",
        });
        let n: u64 = self
            .read(&p)?
            .trim()
            .parse()
            .map_err(|_| CgroupError::Malformed {
                path: p.clone(),
                message: "expected a number".into(),
            })?;
        Ok(if v == Version::V1 {
            files::shares_to_weight(n)
        } else {
            n
        })
    }

    /// Memory limit in bytes, `None` for unlimited (v2 `memory.max`, v1 `memory.limit_in_bytes`).
    pub fn memory_max(&self, rel: &str) -> Result<Option<u64>, CgroupError> {
        let (dir, v) = self.dir(Controller::Memory, rel)?;
        let p = dir.join(match v {
            Version::V2 => "memory.max",
            Version::V1 => "memory.limit_in_bytes",
        });
        files::parse_memory_max(&p, &self.read(&p)?)
    }

    /// Hugepage limits in bytes per size: v1 `hugetlb.<size>.limit_in_bytes`, v2
    /// `hugetlb.<size>.max` (`<size>` as the kernel names it: `2MB`, `1GB`). A size whose file
    /// is absent (no hugetlb controller there, a size the machine lacks) or that is unlimited is
    /// `None`; a file that does not parse is an error naming it.
    pub fn hugetlb_limits(&self, rel: &str) -> Result<HugetlbLimits, CgroupError> {
        let Ok((dir, v)) = self.dir(Controller::Hugetlb, rel) else {
            return Ok(HugetlbLimits::default());
        };
        let read = |size: &str| -> Result<Option<u64>, CgroupError> {
            let p = dir.join(match v {
                Version::V2 => format!("hugetlb.{size}.max"),
                Version::V1 => format!("hugetlb.{size}.limit_in_bytes"),
            });
            match fs::read_to_string(&p) {
                Ok(text) => files::parse_memory_max(&p, &text),
                Err(_) => Ok(None),
            }
        };
        Ok(HugetlbLimits {
            hugepages_2mi: read("2MB")?,
            hugepages_1gi: read("1GB")?,
        })
    }

    /// Anonymous memory per node in bytes (`memory.numa_stat` alone: no hugetlb files read).
    pub fn anon_per_node(&self, rel: &str) -> Result<files::NodeBytes, CgroupError> {
        Ok(self.memory_numa_stat(rel)?.anon)
    }

    /// `memory.numa_stat` alone, v1 pages converted to bytes.
    fn memory_numa_stat(&self, rel: &str) -> Result<NumaStat, CgroupError> {
        let (dir, v) = self.dir(Controller::Memory, rel)?;
        let p = dir.join("memory.numa_stat");
        let text = self.read(&p)?;
        match v {
            Version::V2 => files::parse_numa_stat_v2(&p, &text),
            Version::V1 => files::parse_numa_stat_v1(&p, &text, self.page_size),
        }
    }

    /// Per-node memory in bytes: `memory.numa_stat` (v1 pages converted) plus hugetlb pages
    /// from `hugetlb.<size>.numa_stat` where the hugetlb controller has the cgroup.
    pub fn numa_stat(&self, rel: &str) -> Result<NumaStat, CgroupError> {
        let mut s = self.memory_numa_stat(rel)?;
        if let Ok((hdir, _)) = self.dir(Controller::Hugetlb, rel) {
            // Optional: no hugetlb controller or cgroup there means no hugetlb figures.
            if let Ok(rd) = fs::read_dir(&hdir) {
                let mut names: Vec<PathBuf> = rd
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("hugetlb.") && n.ends_with(".numa_stat"))
                    })
                    .collect();
                names.sort();
                for hp in names {
                    for (node, b) in files::parse_hugetlb_numa_stat(&hp, &self.read(&hp)?)? {
                        *s.hugetlb.entry(node).or_default() += b;
                    }
                }
            }
        }
        Ok(s)
    }

    /// Processes (tgids) in `cgroup.procs` of the cgroup in controller `c`'s hierarchy.
    pub fn procs(&self, c: Controller, rel: &str) -> Result<Vec<u32>, CgroupError> {
        let p = self.dir(c, rel)?.0.join("cgroup.procs");
        files::parse_procs(&p, &self.read(&p)?)
    }

    /// Whether a process runs in the cgroup or anywhere below it: `populated` of
    /// `cgroup.events` (v2). A container may keep its processes in nested cgroups (systemd or
    /// a container runtime inside it), where its own `cgroup.procs` is empty. v1 has no such
    /// file: its `cgroup.procs` and those of every cgroup below it.
    pub fn populated(&self, c: Controller, rel: &str) -> Result<bool, CgroupError> {
        let (dir, v) = self.dir(c, rel)?;
        match v {
            Version::V2 => {
                let p = dir.join("cgroup.events");
                Ok(self.read(&p)?.lines().any(|l| l.trim() == "populated 1"))
            }
            Version::V1 => {
                for sub in self.walk(c, rel)? {
                    if !self.procs(c, &sub)?.is_empty() {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
        }
    }

    /// Threads (tids) of the cgroup in controller `c`'s hierarchy: `cgroup.threads` (v2, every
    /// thread of its processes) or `tasks` (v1).
    pub fn threads(&self, c: Controller, rel: &str) -> Result<Vec<u32>, CgroupError> {
        let (dir, v) = self.dir(c, rel)?;
        let p = dir.join(match v {
            Version::V2 => "cgroup.threads",
            Version::V1 => "tasks",
        });
        files::parse_procs(&p, &self.read(&p)?)
    }

    /// Relative paths of every cgroup at or below one of `roots` (relative to the hierarchy;
    /// a root that does not exist has none), without walking the rest of the hierarchy (a
    /// user's delegated subtree may hold any number of cgroups). An error when the hierarchy
    /// itself cannot be read (unmounted) or a root cannot be walked whole: a partial list
    /// would read as cgroups gone.
    pub fn walk_roots(&self, c: Controller, roots: &[String]) -> Result<Vec<String>, CgroupError> {
        let (root, _) = self.hierarchy(c)?;
        fs::read_dir(root).map_err(|source| CgroupError::Io {
            path: root.to_path_buf(),
            source,
        })?;
        let mut out = Vec::new();
        for r in roots {
            let start = clean(r)?;
            if start.as_os_str().is_empty() {
                return self.walk(c, "");
            }
            match fs::symlink_metadata(root.join(&start)) {
                Ok(m) if m.is_dir() => match self.walk(c, r) {
                    Ok(v) => out.extend(v),
                    // Removed since it was looked at: a root that does not exist.
                    Err(CgroupError::Io { source, .. })
                        if matches!(
                            source.raw_os_error(),
                            Some(libc::ENOENT) | Some(libc::ENODEV)
                        ) => {}
                    Err(e) => return Err(e),
                },
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {}
                Err(source) => {
                    return Err(CgroupError::Io {
                        path: root.join(&start),
                        source,
                    })
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Relative paths of `rel` and every cgroup below it in controller `c`'s hierarchy.
    pub fn walk(&self, c: Controller, rel: &str) -> Result<Vec<String>, CgroupError> {
        let (root, _) = self.hierarchy(c)?;
        let start = clean(rel)?;
        let mut out = Vec::new();
        let mut stack = vec![start.clone()];
        let first = start;
        while let Some(r) = stack.pop() {
            let dir = root.join(&r);
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                // A cgroup below the start removed during the walk (its container exited).
                Err(e)
                    if r != first
                        && matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) =>
                {
                    continue
                }
                // A directory below the start its owner closed (a tenant's `chmod 700` in its
                // delegated cgroup; the daemon has no CAP_DAC_READ_SEARCH): listed, not
                // descended into, so it cannot fail the walk of everyone else's.
                Err(e) if r != first && e.raw_os_error() == Some(libc::EACCES) => {
                    out.push(format!("/{}", r.display()));
                    continue;
                }
                // Nested past PATH_MAX below the start (a tenant can nest its delegated
                // cgroups without limit): no file of it can be named, so it is not listed and
                // cannot fail the walk of everyone else's, now or at every later round.
                Err(e) if r != first && e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                    tracing::debug!(below = %first.display(), "a cgroup nested past PATH_MAX is not walked");
                    continue;
                }
                Err(source) => return Err(CgroupError::Io { path: dir, source }),
            };
            out.push(format!("/{}", r.display()));
            // An entry that cannot be read fails the walk: a partial list would read as
            // cgroups gone.
            for e in rd {
                let e = match e {
                    Ok(e) => e,
                    // Removed while it was read: as above.
                    Err(e)
                        if r != first
                            && matches!(
                                e.raw_os_error(),
                                Some(libc::ENOENT) | Some(libc::ENODEV)
                            ) =>
                    {
                        break
                    }
                    Err(source) => return Err(CgroupError::Io { path: dir, source }),
                };
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(r.join(e.file_name()));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Writes `cpuset.cpus`, refusing an empty set or CPUs outside the parent's effective CPUs,
    /// and reads it back.
    pub fn write_cpus(&self, rel: &str, cpus: &CpuSet) -> Result<(), CgroupError> {
        self.write_set(rel, SetKind::Cpus, cpus)
    }

    /// Writes `cpuset.mems` with the same checks against the parent's effective memory nodes.
    pub fn write_mems(&self, rel: &str, mems: &CpuSet) -> Result<(), CgroupError> {
        self.write_set(rel, SetKind::Mems, mems)
    }

    fn write_set(&self, rel: &str, kind: SetKind, value: &CpuSet) -> Result<(), CgroupError> {
        let (dir, v) = self.dir(Controller::Cpuset, rel)?;
        let path = dir.join(kind.file());
        if value.is_empty() {
            return Err(CgroupError::Empty { path });
        }
        // The root has no parent: its own effective set bounds it.
        let parent_dir = match dir.parent() {
            Some(p) if !clean(rel)?.as_os_str().is_empty() => p.to_path_buf(),
            _ => dir.clone(),
        };
        let parent = self.read_set(&parent_dir.join(kind.effective(v)))?;
        if !value.is_subset(&parent) {
            return Err(CgroupError::OutsideParent {
                path,
                value: value.to_cpulist(),
                outside: value.difference(&parent).to_cpulist(),
                parent: parent.to_cpulist(),
            });
        }
        self.write_file(&path, &value.to_cpulist())?;
        let back = self.read_set(&path)?;
        if &back != value {
            return Err(CgroupError::Verify {
                path,
                wrote: value.to_cpulist(),
                read: back.to_cpulist(),
            });
        }
        Ok(())
    }

    fn write_file(&self, path: &Path, value: &str) -> Result<(), CgroupError> {
        let map = |source: std::io::Error| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            reason: write_reason(&source),
            source,
        };
        // O_TRUNC as the shell's `>` does: harmless on cgroupfs, and makes plain-file fakes behave.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .map_err(map)?;
        f.write_all(value.as_bytes()).map_err(map)
    }

    /// v1 `cpuset.memory_migrate`: when on, a task's pages follow it into a cgroup and follow
    /// later `cpuset.mems` changes. v2 always migrates, so there this is a no-op.
    pub fn set_memory_migrate(&self, rel: &str, on: bool) -> Result<(), CgroupError> {
        let (dir, v) = self.dir(Controller::Cpuset, rel)?;
        if v == Version::V2 {
            return Ok(());
        }
        let p = dir.join("cpuset.memory_migrate");
        let want = if on { "1" } else { "0" };
        self.write_file(&p, want)?;
        let back = self.read(&p)?;
        if back.trim() != want {
            return Err(CgroupError::Verify {
                path: p,
                wrote: want.into(),
                read: back.trim().into(),
            });
        }
        Ok(())
    }

    /// Creates cpuset cgroup `rel` with `cpus` and `mems` (both validated against the parent);
    /// on v1 a cpuset needs both set before any task can join. Writes mems first (a task must
    /// never see CPUs without memory). On any failure the new directory is removed again.
    /// On v2 the parent must have `+cpuset` in `cgroup.subtree_control` (see
    /// [`Cgroups::enable_cpuset_v2`]).
    pub fn create_cpuset(
        &self,
        rel: &str,
        cpus: &CpuSet,
        mems: &CpuSet,
    ) -> Result<(), CgroupError> {
        let (dir, _) = self.dir(Controller::Cpuset, rel)?;
        // Validate before touching anything, so a refusal creates nothing.
        if cpus.is_empty() {
            return Err(CgroupError::Empty {
                path: dir.join("cpuset.cpus"),
            });
        }
        if mems.is_empty() {
            return Err(CgroupError::Empty {
                path: dir.join("cpuset.mems"),
            });
        }
        fs::create_dir(&dir).map_err(|source| CgroupError::Write {
            path: dir.clone(),
            value: "mkdir".into(),
            reason: write_reason(&source),
            source,
        })?;
        let r = self
            .write_mems(rel, mems)
            .and_then(|()| self.write_cpus(rel, cpus));
        if r.is_err() {
            let _ = fs::remove_dir(&dir);
        }
        r
    }

    /// Enables only the cpuset controller for the children of `rel` on v2 (cgroups-rs would
    /// enable every controller of the parent).
    pub fn enable_cpuset_v2(&self, rel: &str) -> Result<(), CgroupError> {
        let (dir, v) = self.dir(Controller::Cpuset, rel)?;
        if v == Version::V1 {
            return Ok(());
        }
        self.write_file(&dir.join("cgroup.subtree_control"), "+cpuset")
    }

    /// Moves process `pid` into cgroup `rel` of controller `c`'s hierarchy.
    pub fn add_proc(&self, c: Controller, rel: &str, pid: u32) -> Result<(), CgroupError> {
        let p = self.dir(c, rel)?.0.join("cgroup.procs");
        self.write_file(&p, &pid.to_string())
    }

    /// The cgroup's v2 id — the inode number of its directory on the cgroup2 mount, which is
    /// what `bpf_get_current_cgroup_id()` returns. Needs a v2 mount (on hybrid machines the
    /// unified hierarchy may hold no cgroups besides the root).
    pub fn cgroup_id(&self, rel: &str) -> Result<u64, CgroupError> {
        use std::os::unix::fs::MetadataExt;
        let Some(root) = &self.mounts.v2 else {
            return Err(CgroupError::NoController {
                controller: "cgroup2",
                mode: self.mode(),
            });
        };
        let dir = root.join(clean(rel)?);
        fs::metadata(&dir)
            .map(|m| m.ino())
            .map_err(|source| CgroupError::Io { path: dir, source })
    }

    /// The cgroup v2 ids of the cgroups below `rel` (not `rel` itself), breadth first, at most
    /// `limit` of them; the bool says the walk stopped at the limit. A directory that vanishes
    /// or cannot be read meanwhile is skipped (its owner may remove or close it).
    pub fn descendant_ids(&self, rel: &str, limit: usize) -> Result<(Vec<u64>, bool), CgroupError> {
        use std::os::unix::fs::MetadataExt;
        let Some(root) = &self.mounts.v2 else {
            return Err(CgroupError::NoController {
                controller: "cgroup2",
                mode: self.mode(),
            });
        };
        let mut queue = std::collections::VecDeque::from([root.join(clean(rel)?)]);
        let mut out = Vec::new();
        while let Some(dir) = queue.pop_front() {
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if out.len() == limit {
                    return Ok((out, true));
                }
                let Ok(md) = e.metadata() else { continue };
                out.push(md.ino());
                queue.push_back(e.path());
            }
        }
        Ok((out, false))
    }

    /// The cgroup of process `pid` in controller `c`'s hierarchy, from `<proc>/<pid>/cgroup`
    /// (`proc` normally `/proc`): the v1 line naming the controller, else the v2 `0::` line.
    pub fn cgroup_of_pid(
        &self,
        proc: &Path,
        pid: u32,
        c: Controller,
    ) -> Result<String, CgroupError> {
        let (_, v) = self.hierarchy(c)?;
        let p = proc.join(pid.to_string()).join("cgroup");
        let lines = files::parse_proc_cgroup(&p, &self.read(&p)?)?;
        let found = lines.into_iter().find(|l| match v {
            Version::V1 => l.controllers.iter().any(|x| x == c.name()),
            Version::V2 => l.hierarchy == 0 && l.controllers.is_empty(),
        });
        found.map(|l| l.path).ok_or_else(|| CgroupError::Malformed {
            path: p,
            message: format!("no line for the {} controller", c.name()),
        })
    }

    /// Removes an (empty) cgroup directory.
    pub fn remove(&self, c: Controller, rel: &str) -> Result<(), CgroupError> {
        let (dir, _) = self.dir(c, rel)?;
        fs::remove_dir(&dir).map_err(|source| CgroupError::Write {
            path: dir.clone(),
            value: "rmdir".into(),
            reason: write_reason(&source),
            source,
        })
    }
}

/// A cgroup path made relative, refusing `..` and other escapes from the hierarchy.
fn clean(rel: &str) -> Result<PathBuf, CgroupError> {
    let mut out = PathBuf::new();
    for c in Path::new(rel).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(s) => out.push(s),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(CgroupError::BadPath {
                    path: rel.to_string(),
                })
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

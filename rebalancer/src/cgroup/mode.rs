//! Which cgroup hierarchies exist and where: v2 (unified), v1 (one mount per controller set),
//! or hybrid (v1 controllers plus a v2 mount, e.g. systemd's `/sys/fs/cgroup/unified`).
//!
//! Two sources, both taking paths as inputs: `/proc/self/mountinfo` (what is really mounted,
//! filtered to mounts below the given root) and, when that finds nothing there, a scan of the
//! root directory itself (for tempdir trees in tests and for chroots without /proc).
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use super::CgroupError;

/// The cgroup layout of a machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    /// Only the unified hierarchy.
    V2,
    /// Only v1 controller hierarchies.
    V1,
    /// v1 controllers and a v2 mount side by side.
    Hybrid,
    /// No cgroup filesystem found below the root.
    None,
}

impl std::fmt::Display for CgroupMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CgroupMode::V2 => "v2",
            CgroupMode::V1 => "v1",
            CgroupMode::Hybrid => "hybrid",
            CgroupMode::None => "none",
        })
    }
}

/// The v1 controllers the kernel knows (mount options that are not controllers are ignored).
const V1_CONTROLLERS: &[&str] = &[
    "cpuset",
    "cpu",
    "cpuacct",
    "memory",
    "blkio",
    "io",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// Where each hierarchy is mounted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mounts {
    /// The cgroup2 mount, if any.
    pub v2: Option<PathBuf>,
    /// v1 controller name → mount point (co-mounted controllers share one path).
    pub v1: BTreeMap<String, PathBuf>,
}

impl Mounts {
    pub fn mode(&self) -> CgroupMode {
        match (self.v2.is_some(), self.v1.is_empty()) {
            (true, true) => CgroupMode::V2,
            (true, false) => CgroupMode::Hybrid,
            (false, false) => CgroupMode::V1,
            (false, true) => CgroupMode::None,
        }
    }

    /// Parses mountinfo text (proc(5) format), keeping cgroup mounts whose mount point is `root`
    /// or below it. `path` only names the source in errors.
    pub fn parse_mountinfo(path: &Path, text: &str, root: &Path) -> Result<Self, CgroupError> {
        let mut m = Mounts::default();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |message: &str| CgroupError::Malformed {
                path: path.to_path_buf(),
                message: format!("line {}: {message}", i + 1),
            };
            let (pre, post) = line
                .split_once(" - ")
                .ok_or_else(|| bad("no ' - ' separator"))?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 6 || post.len() < 3 {
                return Err(bad("too few fields"));
            }
            let mount_point = PathBuf::from(unescape(pre[4]));
            if !mount_point.starts_with(root) {
                continue;
            }
            match post[0] {
                "cgroup2" => m.v2 = Some(mount_point),
                "cgroup" => {
                    for opt in post[2].split(',') {
                        if V1_CONTROLLERS.contains(&opt) {
                            m.v1.insert(opt.to_string(), mount_point.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(m)
    }

    /// Infers the mounts from the directory layout below `root`: `root/cgroup.controllers` means
    /// v2 at the root; otherwise each subdirectory holding a `tasks` file is a v1 hierarchy
    /// named by its controllers (`cpu,cpuacct`), and one holding `cgroup.controllers` is v2.
    pub fn scan_root(root: &Path) -> Result<Self, CgroupError> {
        let mut m = Mounts::default();
        if root.join("cgroup.controllers").is_file() {
            m.v2 = Some(root.to_path_buf());
            return Ok(m);
        }
        let rd = match fs::read_dir(root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(m),
            Err(source) => {
                return Err(CgroupError::Io {
                    path: root.to_path_buf(),
                    source,
                })
            }
        };
        let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for dir in entries {
            if dir.join("cgroup.controllers").is_file() {
                m.v2 = Some(dir);
            } else if dir.join("tasks").is_file() && !dir.is_symlink() {
                let name = dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_string();
                for c in name.split(',') {
                    if V1_CONTROLLERS.contains(&c) {
                        m.v1.insert(c.to_string(), dir.clone());
                    }
                }
            }
        }
        Ok(m)
    }

    /// Mounts below `root` from `mountinfo`, falling back to [`Mounts::scan_root`] when the
    /// file is absent or lists no cgroup mount below `root`.
    pub fn detect(root: &Path, mountinfo: &Path) -> Result<Self, CgroupError> {
        match fs::read_to_string(mountinfo) {
            Ok(text) => {
                let m = Self::parse_mountinfo(mountinfo, &text, root)?;
                if m.mode() != CgroupMode::None {
                    return Ok(m);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(CgroupError::Io {
                    path: mountinfo.to_path_buf(),
                    source,
                })
            }
        }
        Self::scan_root(root)
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        let value = octal.map(|d| d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0')));
        match value.and_then(|v| u8::try_from(v).ok()) {
            Some(byte) if b[i] == b'\\' => {
                out.push(byte);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate
";
    const V2: &str = "\
25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
35 25 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    fn check(text: &str, root: &str, mode: CgroupMode, cpuset: Option<&str>) {
        let m = Mounts::parse_mountinfo(Path::new("mountinfo"), text, Path::new(root)).unwrap();
        assert_eq!(m.mode(), mode, "{text}");
        assert_eq!(
            m.v1.get("cpuset").map(|p| p.to_str().unwrap()),
            cpuset,
            "{text}"
        );
    }

    #[test]
    fn modes_from_mountinfo() {
        check(
            HYBRID,
            "/sys/fs/cgroup",
            CgroupMode::Hybrid,
            Some("/sys/fs/cgroup/cpuset"),
        );
        check(V2, "/sys/fs/cgroup", CgroupMode::V2, None);
        let v1: String = HYBRID
            .lines()
            .filter(|l| !l.contains("cgroup2"))
            .map(|l| format!("{l}\n"))
            .collect();
        check(
            &v1,
            "/sys/fs/cgroup",
            CgroupMode::V1,
            Some("/sys/fs/cgroup/cpuset"),
        );
        check(HYBRID, "/elsewhere", CgroupMode::None, None);
        let m =
            Mounts::parse_mountinfo(Path::new("m"), HYBRID, Path::new("/sys/fs/cgroup")).unwrap();
        assert_eq!(m.v1["cpuacct"], Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(!m.v1.contains_key("name=systemd"));
        assert_eq!(m.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn malformed_mountinfo_names_file_and_line() {
        let err =
            Mounts::parse_mountinfo(Path::new("/proc/self/mountinfo"), "1 2 3\n", Path::new("/"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("/proc/self/mountinfo") && err.contains("line 1"),
            "{err}"
        );
    }

    #[test]
    fn escaped_mount_points() {
        assert_eq!(unescape(r"/mnt/my\040cgroup"), "/mnt/my cgroup");
        assert_eq!(unescape(r"/a\\b"), r"/a\\b");
        assert_eq!(unescape(r"/x\777"), r"/x\777");
        assert_eq!(unescape(r"/x\04"), r"/x\04");
    }

    proptest::proptest! {
        #[test]
        fn mountinfo_parser_never_panics(text in "[ -~\\n]{0,300}") {
            let _ = Mounts::parse_mountinfo(Path::new("m"), &text, Path::new("/"));
            let _ = unescape(&text);
        }
    }

    #[test]
    fn scan_root_layouts() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        assert_eq!(Mounts::scan_root(r).unwrap().mode(), CgroupMode::None);
        for sub in ["cpuset", "cpu,cpuacct", "memory"] {
            fs::create_dir_all(r.join(sub)).unwrap();
            fs::write(r.join(sub).join("tasks"), "").unwrap();
        }
        assert_eq!(Mounts::scan_root(r).unwrap().mode(), CgroupMode::V1);
        fs::create_dir_all(r.join("unified")).unwrap();
        fs::write(r.join("unified/cgroup.controllers"), "").unwrap();
        let m = Mounts::scan_root(r).unwrap();
        assert_eq!(m.mode(), CgroupMode::Hybrid);
        assert_eq!(m.v1["cpu"], r.join("cpu,cpuacct"));
        let v2 = tempfile::tempdir().unwrap();
        fs::write(v2.path().join("cgroup.controllers"), "cpuset cpu memory\n").unwrap();
        assert_eq!(Mounts::scan_root(v2.path()).unwrap().mode(), CgroupMode::V2);
        // detect() falls back to the scan when mountinfo lists nothing below the root.
        let m = Mounts::detect(r, Path::new("/nonexistent/mountinfo")).unwrap();
        assert_eq!(m.mode(), CgroupMode::Hybrid);
    }
}

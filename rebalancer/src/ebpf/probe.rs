//! What this machine offers the samplers: kernel release, cgroup mode and the cgroup v2 mount
//! (parsed from /proc/self/mountinfo text, pure). The PMU events are chosen in `pmu`.
use std::path::PathBuf;

use serde::Serialize;

/// How cgroups are mounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupSupport {
    V1,
    V2,
    /// v1 controllers plus a v2 hierarchy (e.g. systemd's /sys/fs/cgroup/unified).
    Hybrid,
    None,
}

impl CgroupSupport {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupSupport::V1 => "v1",
            CgroupSupport::V2 => "v2",
            CgroupSupport::Hybrid => "hybrid",
            CgroupSupport::None => "none",
        }
    }
}

/// (mount point, fs type) of every mountinfo line. Format: `id parent maj:min root mountpoint
/// options [optional…] - fstype source superoptions`.
fn mounts(mountinfo: &str) -> impl Iterator<Item = (String, String)> + '_ {
    mountinfo.lines().filter_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mp = pre.split_whitespace().nth(4)?;
        let fstype = post.split_whitespace().next()?;
        Some((unescape(mp), fstype.to_string()))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal `\040` etc.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup mode described by mountinfo text.
pub fn cgroup_mode(mountinfo: &str) -> CgroupSupport {
    let (mut v1, mut v2) = (false, false);
    for (_, fstype) in mounts(mountinfo) {
        match fstype.as_str() {
            "cgroup" => v1 = true,
            "cgroup2" => v2 = true,
            _ => {}
        }
    }
    match (v1, v2) {
        (true, true) => CgroupSupport::Hybrid,
        (true, false) => CgroupSupport::V1,
        (false, true) => CgroupSupport::V2,
        (false, false) => CgroupSupport::None,
    }
}

/// Mount point of the cgroup v2 hierarchy (the first one), whose directory inodes are the ids
/// `bpf_get_current_cgroup_id()` returns.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mounts(mountinfo)
        .find(|(_, t)| t == "cgroup2")
        .map(|(mp, _)| PathBuf::from(mp))
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname NUL-terminates release.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Whether a kernel of this release creates `BPF_F_MMAPABLE` array maps (Linux 5.5+), which
/// hold the watched cgroups' counters. An unparsable release is tried (the load then says).
pub fn mmapable_arrays(release: &str) -> bool {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>());
    match (it.next(), it.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= (5, 5),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmapable_arrays_from_linux_5_5() {
        for (r, ok) in [
            ("6.1.0-27-cloud-amd64", true),
            ("6.18.2", true),
            ("5.5.0", true),
            ("5.4.0-150-generic", false),
            ("4.19.0", false),
            ("weird", true),
        ] {
            assert_eq!(mmapable_arrays(r), ok, "{r}");
        }
    }

    const HYBRID: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
36 33 0:31 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpuset
";
    const V2: &str = "\
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const V1: &str = "\
36 33 0:31 / /sys/fs/cgroup/cpuset rw,nosuid - cgroup cgroup rw,cpuset
37 33 0:32 / /sys/fs/cgroup/my\\040mem rw,nosuid - cgroup cgroup rw,memory
";

    fn check(text: &str, mode: CgroupSupport, v2: Option<&str>) {
        assert_eq!(cgroup_mode(text), mode, "{text}");
        assert_eq!(cgroup2_mount(text), v2.map(PathBuf::from), "{text}");
    }

    #[test]
    fn cgroup_modes() {
        for (text, mode, v2) in [
            (
                HYBRID,
                CgroupSupport::Hybrid,
                Some("/sys/fs/cgroup/unified"),
            ),
            (V2, CgroupSupport::V2, Some("/sys/fs/cgroup")),
            (V1, CgroupSupport::V1, None),
            ("", CgroupSupport::None, None),
            (
                "garbage without separator\n - \n",
                CgroupSupport::None,
                None,
            ),
        ] {
            check(text, mode, v2);
        }
        assert!(mounts(V1).any(|(mp, _)| mp == "/sys/fs/cgroup/my mem"));
    }
}

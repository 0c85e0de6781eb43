//! A real container runtime for the NRI tests, installed into the project's own folder and
//! nowhere else: Debian trixie's containerd 1.7 (it has NRI, and runs on bookworm), bookworm's
//! runc (trixie's needs a newer glibc), and a local OCI image built from Debian's
//! busybox-static (there is no network for a registry). Packages are fetched with
//! `apt-get download` through a *private* apt configuration (its own source list, lists and
//! cache under the install folder) and unpacked with `dpkg-deb -x`; the host's apt sources,
//! lists and installed packages are untouched.
//!
//! Layout of `target/containerd/` (or `$REBALANCER_CONTAINERD_DIR`):
//! - `root/usr/bin/{containerd,ctr,containerd-shim-runc-v2}`, `root/usr/sbin/runc`
//! - `image/rb-busybox.oci.tar`: an OCI archive, `docker.io/library/rb-busybox:test`
//! - `apt/`: the private apt state; `debs/`: the downloaded packages
//! - `STAMP`: the package versions installed (re-installs when they change)
//!
//! The tests (`rebalancer/tests/nri_root.rs`) start and stop containerd themselves with a
//! config of their own; this module only installs.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Result};

use crate::sh;

/// The packages: (suite, name). containerd from trixie; runc and busybox-static from
/// bookworm (the host's release).
const PACKAGES: &[(&str, &str)] = &[
    ("trixie", "containerd"),
    ("bookworm", "runc"),
    ("bookworm", "busybox-static"),
];

/// The image every test pod and container uses (sandbox image too).
pub const IMAGE: &str = "docker.io/library/rb-busybox:test";

pub fn dir() -> PathBuf {
    std::env::var_os("REBALANCER_CONTAINERD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::root().join("target/containerd"))
}

/// Installs (idempotently) containerd, runc and the test image.
pub fn install() -> Result<()> {
    let dir = dir();
    let stamp = dir.join("STAMP");
    let want = format!("{PACKAGES:?} {IMAGE}\n");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == want)
        && dir.join("root/usr/bin/containerd").exists()
        && dir.join("root/usr/sbin/runc").exists()
        && dir.join("image/rb-busybox.oci.tar").exists()
    {
        return Ok(());
    }
    fs::create_dir_all(&dir)?;
    let debs = dir.join("debs");
    let _ = fs::remove_dir_all(&debs);
    fs::create_dir_all(&debs)?;
    let apt = private_apt(&dir, &["bookworm", "trixie"])?;
    for (suite, pkg) in PACKAGES {
        sh(Command::new("apt-get").args(&apt).current_dir(&debs).args([
            "download",
            "-q",
            &format!("{pkg}/{suite}"),
        ]))?;
    }
    let root = dir.join("root");
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root)?;
    for e in fs::read_dir(&debs)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "deb") {
            sh(Command::new("dpkg-deb").arg("-x").arg(&p).arg(&root))?;
        }
    }
    for b in [
        "usr/bin/containerd",
        "usr/bin/ctr",
        "usr/bin/containerd-shim-runc-v2",
        "usr/sbin/runc",
        "bin/busybox",
    ] {
        if !root.join(b).exists() {
            bail!(
                "{} missing after unpacking the packages",
                root.join(b).display()
            );
        }
    }
    build_image(&root.join("bin/busybox"), &dir.join("image"))?;
    fs::write(&stamp, want)?;
    eprintln!(
        "containerd, runc and the test image installed in {}",
        dir.display()
    );
    Ok(())
}

/// apt options for a private source list (the Debian `suites`): its own lists and cache, so
/// the host's apt configuration and state stay as they are. Runs `apt-get update` on it.
pub(crate) fn private_apt(dir: &Path, suites: &[&str]) -> Result<Vec<String>> {
    let apt = dir.join("apt");
    for d in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(apt.join(d))?;
    }
    // The same archive the host uses (its deb822 sources name it).
    let uri = fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("URIs:").map(|u| u.trim().to_string()))
        })
        .filter(|u| !u.contains("security"))
        .unwrap_or_else(|| "http://deb.debian.org/debian".into());
    let list = apt.join("sources.list");
    fs::write(
        &list,
        suites
            .iter()
            .map(|suite| {
                format!("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {uri} {suite} main\n")
            })
            .collect::<String>(),
    )?;
    let opts: Vec<String> = [
        format!("Dir::Etc::sourcelist={}", list.display()),
        "Dir::Etc::sourceparts=/nonexistent".into(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
        "Debug::NoLocking=1".into(),
        // The private folders are root's; apt's sandbox user could not write them.
        "APT::Sandbox::User=root".into(),
    ]
    .into_iter()
    .flat_map(|o| ["-o".to_string(), o])
    .collect();
    sh(Command::new("apt-get").args(&opts).args(["update", "-q"]))?;
    Ok(opts)
}

/// An OCI image archive with busybox as `/bin/busybox` and its applets as symlinks; the
/// default command sleeps (it is the pods' sandbox "pause" too).
fn build_image(busybox: &Path, out: &Path) -> Result<()> {
    let work = out.join("work");
    let _ = fs::remove_dir_all(out);
    let rootfs = work.join("rootfs");
    fs::create_dir_all(rootfs.join("bin"))?;
    for d in ["proc", "sys", "dev", "tmp", "etc"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    fs::copy(busybox, rootfs.join("bin/busybox"))?;
    for applet in [
        "sh", "sleep", "cat", "grep", "echo", "true", "ls", "taskset",
    ] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    crate::oci::archive(
        &rootfs,
        r#"{"Env":["PATH=/bin"],"Cmd":["/bin/sleep","infinity"]}"#,
        IMAGE,
        &out.join("rb-busybox.oci.tar"),
    )?;
    fs::remove_dir_all(&work)?;
    Ok(())
}

//! What a guest boot needs, made idempotently: Debian packages (QEMU, busybox-static, cpio), the
//! Debian cloud kernel (downloaded once, cached under target/vm/kernel; `--kernel-suite trixie`
//! under target/vm/kernel-trixie), the musl target, static
//! binaries of rebalancer and the guest tool, and one initramfs per topology.
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use super::{scenario::Scenario, topology::VmTopology};
use crate::{cargo, root, setup, sh};

pub const MUSL: &str = "x86_64-unknown-linux-musl";

pub struct Assets {
    pub kernel: PathBuf,
    pub busybox: PathBuf,
    pub rebalancer: PathBuf,
    pub guest_tool: PathBuf,
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

pub fn vm_dir() -> PathBuf {
    target_dir().join("vm")
}

pub(super) fn stdout_of(c: &mut Command) -> Result<String> {
    let o = c.output().with_context(|| format!("spawning {c:?}"))?;
    if !o.status.success() {
        bail!(
            "{c:?} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Debian suites whose cloud kernel a guest can boot (`--kernel-suite`): bookworm (the host's
/// release, 6.1, the default) and trixie (6.12, fetched through the private apt source list of
/// `containerd.rs`).
pub const KERNEL_SUITES: &[&str] = &["bookworm", "trixie"];

/// The concrete kernel package behind the `linux-image-cloud-amd64` metapackage of `suite`
/// (`apt` options: the host's apt for bookworm, the private source list for trixie).
fn kernel_package(apt: &[String], suite: &str) -> Result<String> {
    let meta = if suite == "bookworm" {
        "linux-image-cloud-amd64".to_string()
    } else {
        format!("linux-image-cloud-amd64/{suite}")
    };
    let find = || -> Result<Option<String>> {
        let deps = stdout_of(Command::new("apt-cache").args(apt).args(["depends", &meta]))
            .unwrap_or_default();
        Ok(deps.lines().find_map(|l| {
            l.trim()
                .strip_prefix("Depends: ")
                .filter(|p| p.starts_with("linux-image-"))
                .map(str::to_string)
        }))
    };
    if let Some(p) = find()? {
        return Ok(p);
    }
    sh(Command::new("apt-get").args(apt).args(["update", "-q"]))?;
    find()?.with_context(|| format!("apt-cache knows no package behind {meta}"))
}

/// A vmlinuz from Debian's cloud kernel of `suite`, cached as target/vm/kernel/vmlinuz
/// (bookworm) or target/vm/kernel-<suite>/vmlinuz.
pub fn kernel(suite: &str) -> Result<PathBuf> {
    if !KERNEL_SUITES.contains(&suite) {
        bail!(
            "unknown kernel suite {suite:?}; known: {}",
            KERNEL_SUITES.join(", ")
        );
    }
    let dir = if suite == "bookworm" {
        vm_dir().join("kernel")
    } else {
        vm_dir().join(format!("kernel-{suite}"))
    };
    let vmlinuz = dir.join("vmlinuz");
    if vmlinuz.exists() {
        return Ok(vmlinuz);
    }
    fs::create_dir_all(&dir)?;
    let apt = if suite == "bookworm" {
        Vec::new()
    } else {
        crate::containerd::private_apt(&dir, &["bookworm", "trixie"])?
    };
    let pkg = kernel_package(&apt, suite)?;
    let dl = dir.join("download");
    let _ = fs::remove_dir_all(&dl);
    fs::create_dir_all(&dl)?;
    let spec = if suite == "bookworm" {
        pkg.clone()
    } else {
        format!("{pkg}/{suite}")
    };
    sh(Command::new("apt-get")
        .args(&apt)
        .current_dir(&dl)
        .args(["download", &spec]))?;
    let deb = fs::read_dir(&dl)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download {pkg} left no .deb in {}", dl.display()))?;
    let x = dl.join("x");
    sh(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x))?;
    let image = fs::read_dir(x.join("boot"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .with_context(|| format!("no boot/vmlinuz-* in {}", deb.display()))?;
    fs::copy(&image, &vmlinuz)?;
    fs::write(dir.join("package"), format!("{pkg}\n"))?;
    fs::remove_dir_all(&dl)?;
    eprintln!("vm: cached kernel {pkg} ({suite}) as {}", vmlinuz.display());
    Ok(vmlinuz)
}

/// The musl target and a C compiler for it: the TLS client's `ring` builds C and assembly,
/// and cc-rs looks for `x86_64-linux-musl-gcc`, which Debian ships as `musl-gcc`
/// (musl-tools). Every cargo this process starts inherits the compiler setting.
pub(crate) fn musl_target() -> Result<()> {
    let installed = stdout_of(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if !installed.lines().any(|l| l.trim() == MUSL) {
        sh(Command::new("rustup").args(["target", "add", MUSL]))?;
    }
    setup::apt(&["musl-tools"])?;
    if std::env::var_os("CC_x86_64_unknown_linux_musl").is_none() {
        std::env::set_var("CC_x86_64_unknown_linux_musl", "musl-gcc");
    }
    Ok(())
}

/// Installs prerequisites, fetches the kernel of `kernel_suite` (see [`KERNEL_SUITES`]) and
/// builds the static guest binaries (the rebalancer binary only when `rebalancer_bin` is not
/// given).
pub fn prepare(rebalancer_bin: Option<&Path>, kernel_suite: &str) -> Result<Assets> {
    setup::apt(&["qemu-system-x86", "busybox-static", "cpio"])?;
    musl_target()?;
    let kernel = kernel(kernel_suite)?;
    eprintln!("vm: building static (musl) binaries");
    let mut c = cargo();
    c.args(["build", "--release", "--target", MUSL]);
    c.args(["-p", "rebalancer-guest-tool"]);
    if rebalancer_bin.is_none() {
        c.args(["-p", "rebalancer"]);
    }
    sh(&mut c)?;
    let bin = target_dir().join(MUSL).join("release");
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .context("busybox not found after installing busybox-static")?;
    Ok(Assets {
        kernel,
        busybox,
        rebalancer: match rebalancer_bin {
            Some(p) => p
                .canonicalize()
                .with_context(|| format!("--rebalancer-bin {}", p.display()))?,
            None => bin.join("rebalancer"),
        },
        guest_tool: bin.join("guest-tool"),
    })
}

/// Shared libraries of a dynamically linked binary (absolute paths from `ldd`; none for a
/// static one).
pub(super) fn shared_libs(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

pub(super) fn copy_exec(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Stages the guest's root under `dir/root` and packs it as `dir/initrd.gz`.
pub fn initramfs(
    dir: &Path,
    a: &Assets,
    topo: &VmTopology,
    scenarios: &[&Scenario],
) -> Result<PathBuf> {
    stage(dir, a, topo, scenarios)?;
    pack(dir)
}

/// Stages the guest's root under `dir/root` (returned), to be packed by [`pack`].
pub fn stage(
    dir: &Path,
    a: &Assets,
    topo: &VmTopology,
    scenarios: &[&Scenario],
) -> Result<PathBuf> {
    let rootfs = dir.join("root");
    let _ = fs::remove_dir_all(&rootfs);
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "etc",
        "vm/scenarios",
    ] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    let src = root().join("tests/vm");
    copy_exec(&a.busybox, &rootfs.join("bin/busybox"))?;
    copy_exec(&a.rebalancer, &rootfs.join("bin/rebalancer"))?;
    for lib in shared_libs(&a.rebalancer) {
        let to = rootfs.join(lib.strip_prefix("/").unwrap_or(&lib));
        fs::create_dir_all(to.parent().context("library path has a parent")?)?;
        copy_exec(&lib, &to)?;
    }
    copy_exec(&a.guest_tool, &rootfs.join("bin/guest-tool"))?;
    copy_exec(&src.join("init"), &rootfs.join("init"))?;
    copy_exec(&src.join("lib.sh"), &rootfs.join("vm/lib.sh"))?;
    for s in scenarios {
        let f = format!("{}.sh", s.name);
        copy_exec(
            &src.join("scenarios").join(&f),
            &rootfs.join("vm/scenarios").join(&f),
        )?;
    }
    fs::write(rootfs.join("vm/topology.env"), topo.env())?;
    let list: String = scenarios
        .iter()
        .map(|s| format!("{} {}\n", s.name, s.timeout_s))
        .collect();
    fs::write(rootfs.join("vm/scenarios.list"), list)?;
    Ok(rootfs)
}

/// Packs `dir/root` as `dir/initrd.gz`.
pub fn pack(dir: &Path) -> Result<PathBuf> {
    let initrd = dir.join("initrd.gz");
    sh(Command::new("sh").current_dir(dir.join("root")).args([
        "-c",
        "find . | cpio -o -H newc --quiet | gzip -1 > ../initrd.gz",
    ]))?;
    Ok(initrd)
}

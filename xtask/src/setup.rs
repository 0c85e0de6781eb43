//! Idempotent installation of build and test prerequisites on a fresh machine.
use std::process::Command;

use anyhow::{Context, Result};

use crate::sh;

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd} >/dev/null 2>&1")])
        .status()
        .is_ok_and(|s| s.success())
}

fn output(c: &mut Command) -> String {
    c.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Installs Debian packages that are missing (runs `apt-get update` once, only if needed).
pub fn apt(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .contains("install ok installed")
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    sh(Command::new("apt-get").args(["update", "-q"]))?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(["-o", "DPkg::Lock::Timeout=300"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// The nightly the eBPF crate builds with: `channel` of rebalancer-ebpf/rust-toolchain.toml
/// (pinned to the bpf-linker's LLVM). The fuzz targets use it too.
pub fn ebpf_nightly() -> Result<String> {
    let f = crate::root().join("rebalancer-ebpf/rust-toolchain.toml");
    let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
    text.lines()
        .find_map(|l| {
            let v = l.trim().strip_prefix("channel")?.trim().strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_string())
        })
        .with_context(|| format!("no `channel = \"...\"` in {}", f.display()))
}

/// Installs everything; the API server's Go build may still be running when it returns.
pub fn all() -> Result<crate::apiserver::Build> {
    let nightly = ebpf_nightly()?;
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]));
    if !toolchains.lines().any(|l| l.starts_with(&nightly)) {
        sh(Command::new("rustup").args([
            "toolchain",
            "install",
            &nightly,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    let comps = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        &nightly,
    ]));
    if !comps.lines().any(|l| l.starts_with("rust-src")) {
        sh(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", &nightly]))?;
    }
    let stable = output(Command::new("rustup").args(["component", "list", "--installed"]));
    for comp in ["rustfmt", "clippy"] {
        if !stable.lines().any(|l| l.starts_with(comp)) {
            sh(Command::new("rustup").args(["component", "add", comp]))?;
        }
    }
    let targets = output(Command::new("rustup").args(["target", "list", "--installed"]));
    if !targets
        .lines()
        .any(|l| l.trim() == "x86_64-unknown-linux-musl")
    {
        sh(Command::new("rustup").args(["target", "add", "x86_64-unknown-linux-musl"]))?;
    }
    if !have("bpf-linker") {
        sh(Command::new("cargo").args(["install", "bpf-linker@0.10.2", "--locked"]))?;
    }
    apt(&[
        "bpftool",
        "linux-perf",
        "stress-ng",
        "numactl",
        "prometheus",
    ])?;
    // containerd + runc + a test image for the NRI tests, in the project's own folder.
    crate::containerd::install()?;
    // etcd + apiextensions-apiserver for the NodeResourceTopology export test.
    crate::apiserver::install()
}

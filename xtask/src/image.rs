//! `cargo xtask image`: the daemon's container image as an OCI archive, without Docker. The
//! image holds the static (musl) release binary with its eBPF programs embedded and its default
//! config, nothing else: no shell, no libc, no package manager. Import it on a node with
//! `ctr -n k8s.io images import <archive>`; config/kubernetes/ references it by [`name`].
use std::{fs, path::PathBuf};

use anyhow::Result;

use crate::{cargo, root, sh, vm::assets};

/// The image's name, as the manifests reference it.
pub fn name() -> String {
    format!(
        "ghcr.io/rebalancer/rebalancer:{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Where [`build`] writes the archive.
pub fn archive_path() -> PathBuf {
    assets::target_dir()
        .join("image")
        .join(format!("rebalancer-{}.oci.tar", env!("CARGO_PKG_VERSION")))
}

/// Builds the binary and writes the archive; returns its path.
pub fn build() -> Result<PathBuf> {
    assets::musl_target()?;
    sh(cargo().args([
        "build",
        "--release",
        "--target",
        assets::MUSL,
        "-p",
        "rebalancer",
        "--bin",
        "rebalancer",
    ]))?;
    let bin = assets::target_dir()
        .join(assets::MUSL)
        .join("release/rebalancer");
    let out = archive_path();
    let rootfs = out.with_extension("rootfs");
    let _ = fs::remove_dir_all(&rootfs);
    fs::create_dir_all(rootfs.join("usr/bin"))?;
    fs::create_dir_all(rootfs.join("etc/rebalancer"))?;
    fs::copy(&bin, rootfs.join("usr/bin/rebalancer"))?;
    fs::copy(
        root().join("config/rebalancer.toml"),
        rootfs.join("etc/rebalancer/rebalancer.toml"),
    )?;
    crate::oci::archive(
        &rootfs,
        r#"{"Entrypoint":["/usr/bin/rebalancer"],"Cmd":["run","--config","/etc/rebalancer/rebalancer.toml"]}"#,
        &name(),
        &out,
    )?;
    fs::remove_dir_all(&rootfs)?;
    println!("{}", out.display());
    eprintln!(
        "image {}: import with `ctr -n k8s.io images import {}`",
        name(),
        out.display()
    );
    Ok(out)
}

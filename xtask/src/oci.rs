//! OCI image archives without Docker: one uncompressed layer (a reproducible tar of a root
//! directory), its config and manifest as blobs, and an `index.json` naming the image with
//! `io.containerd.image.name`, so `ctr images import` registers it under that name.
use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result};

use crate::sh;

/// Writes `out`: an OCI image layout tar of `rootfs` as its one layer, with `config` (the image
/// config's `config` object: Env, Entrypoint, Cmd, …) and the image name `name`.
pub fn archive(rootfs: &Path, config: &str, name: &str, out: &Path) -> Result<()> {
    let work = out.with_extension("work");
    let _ = fs::remove_dir_all(&work);
    let layout = work.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;
    let layer = work.join("layer.tar");
    sh(Command::new("tar")
        .args([
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "--mtime=@0",
            "--sort=name",
        ])
        .arg("-C")
        .arg(rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg("."))?;
    let layer_sha = sha256(&layer)?;
    let layer_size = fs::metadata(&layer)?.len();
    fs::rename(&layer, blobs.join(&layer_sha))?;
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{config},"rootfs":{{"type":"layers","diff_ids":["sha256:{layer_sha}"]}}}}"#
    );
    let (config_sha, config_size) = blob(&blobs, config.as_bytes())?;
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:{config_sha}","size":{config_size}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:{layer_sha}","size":{layer_size}}}]}}"#
    );
    let (manifest_sha, manifest_size) = blob(&blobs, manifest.as_bytes())?;
    let tag = match name.rsplit_once(':') {
        Some((_, t)) if !t.contains('/') => t,
        _ => "latest",
    };
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    fs::write(
        layout.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{manifest_sha}","size":{manifest_size},"annotations":{{"io.containerd.image.name":"{name}","org.opencontainers.image.ref.name":"{tag}"}}}}]}}"#
        ),
    )?;
    sh(Command::new("tar")
        .args([
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "--mtime=@0",
            "-C",
        ])
        .arg(&layout)
        .arg("-cf")
        .arg(out)
        .args(["oci-layout", "index.json", "blobs"]))?;
    fs::remove_dir_all(&work)?;
    Ok(())
}

fn blob(dir: &Path, bytes: &[u8]) -> Result<(String, usize)> {
    let tmp = dir.join("tmp");
    fs::write(&tmp, bytes)?;
    let sha = sha256(&tmp)?;
    fs::rename(&tmp, dir.join(&sha))?;
    Ok((sha, bytes.len()))
}

fn sha256(p: &Path) -> Result<String> {
    let out = Command::new("sha256sum")
        .arg(p)
        .output()
        .context("running sha256sum")?;
    let s = String::from_utf8(out.stdout)?;
    s.split_whitespace()
        .next()
        .map(str::to_string)
        .filter(|h| h.len() == 64)
        .with_context(|| format!("sha256sum {}: {s:?}", p.display()))
}

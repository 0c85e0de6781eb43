//! Builds the eBPF programs (crate `rebalancer-ebpf`, nightly + bpf-linker via aya-build) into
//! OUT_DIR so the daemon can embed them, with the nightly pinned in
//! `rebalancer-ebpf/rust-toolchain.toml`. `REBALANCER_NO_EBPF=1` skips that and embeds an empty
//! object (for fuzzing and tooling builds): the daemon then reports every eBPF source as skipped.
//! `REBALANCER_EBPF_OBJ=<path>` embeds an object already built (`cargo xtask build-ebpf`):
//! `cargo xtask test` builds it once instead of once per profile and target (check, test, the
//! guest's musl release), each of which would otherwise rebuild `core` for BPF.
//!
//! Also generates the NRI and ttrpc protocol types from `proto/` (protox parses the .proto
//! files, so no protoc is needed; prost-build writes the Rust).
use std::{env, fs, path::PathBuf};

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=REBALANCER_NO_EBPF");
    println!("cargo:rerun-if-env-changed=REBALANCER_EBPF_OBJ");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    protocols()?;
    if env::var_os("REBALANCER_NO_EBPF").is_some_and(|v| v != "0") {
        fs::write(out.join("rebalancer"), b"")?;
        return Ok(());
    }
    if let Some(obj) = env::var_os("REBALANCER_EBPF_OBJ") {
        let obj = PathBuf::from(obj);
        println!("cargo:rerun-if-changed={}", obj.display());
        fs::copy(&obj, out.join("rebalancer"))
            .with_context(|| format!("REBALANCER_EBPF_OBJ={}", obj.display()))?;
        return Ok(());
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../rebalancer-ebpf");
    let toolchain_file = format!("{root}/rust-toolchain.toml");
    println!("cargo:rerun-if-changed={toolchain_file}");
    let channel = pinned_channel(&fs::read_to_string(&toolchain_file)?)
        .with_context(|| format!("no `channel = \"...\"` in {toolchain_file}"))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "rebalancer-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&channel),
    )
}

/// The `channel = "..."` value of a rust-toolchain.toml.
fn pinned_channel(toml: &str) -> Option<String> {
    toml.lines().find_map(|l| {
        let v = l.trim().strip_prefix("channel")?.trim().strip_prefix('=')?;
        Some(v.trim().trim_matches('"').to_string())
    })
}

fn protocols() -> anyhow::Result<()> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
    let files = ["nri/api.proto", "ttrpc/ttrpc.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={dir}/{f}");
    }
    let fds = protox::compile(files, [dir])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}

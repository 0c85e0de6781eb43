//! Builds the eBPF programs (crate `rebalancer-ebpf`, nightly + bpf-linker via aya-build) into
//! OUT_DIR so the daemon can embed them. `REBALANCER_NO_EBPF=1` skips that and embeds an empty
//! object (for fuzzing and tooling builds): the daemon then reports every eBPF source as skipped.
//!
//! Also generates the NRI and ttrpc protocol types from `proto/` (protox parses the .proto
//! files, so no protoc is needed; prost-build writes the Rust).
use std::{env, fs, path::PathBuf};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=REBALANCER_NO_EBPF");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    protocols()?;
    if env::var_os("REBALANCER_NO_EBPF").is_some_and(|v| v != "0") {
        fs::write(out.join("rebalancer"), b"")?;
        return Ok(());
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../rebalancer-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "rebalancer-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
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

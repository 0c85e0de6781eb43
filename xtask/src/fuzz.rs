//! `cargo xtask fuzz [--seconds N] [--target T]…`: runs every cargo-fuzz target in `fuzz/`
//! briefly (CI) or for longer (campaigns), installing cargo-fuzz first if it is missing.
//!
//! Each target starts from its committed seed corpus `fuzz/corpus/<target>` (read-only: new
//! inputs go to a scratch directory under `fuzz/target/`, so the tree stays clean). Builds embed an
//! empty eBPF object (`REBALANCER_NO_EBPF=1`) and use nightly, no sanitizer (the code under test
//! is safe Rust; we hunt panics) and debug assertions on, so arithmetic overflow is a finding too.
//! A crash fails the command and leaves the input in `fuzz/artifacts/<target>/`.
use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

use crate::{root, sh};

/// `rustup run <pinned nightly> cargo …` in the repo root, clean of the outer (stable) cargo's env.
fn nightly_cargo() -> Result<Command> {
    let nightly = crate::setup::ebpf_nightly()?;
    let mut c = Command::new("rustup");
    c.current_dir(root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO")
        .env("REBALANCER_NO_EBPF", "1")
        .args(["run", &nightly, "cargo"]);
    Ok(c)
}

fn ensure_cargo_fuzz() -> Result<()> {
    let have = nightly_cargo()?
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        crate::setup::all()?;
        sh(nightly_cargo()?.args(["install", "cargo-fuzz", "--locked"]))?;
    }
    Ok(())
}

/// Target names: one `fuzz/fuzz_targets/<name>.rs` each.
fn targets(fuzz_dir: &Path) -> Result<Vec<String>> {
    let dir = fuzz_dir.join("fuzz_targets");
    let mut names = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "rs") {
            if let Some(stem) = p.file_stem().and_then(|s| s.to_str()) {
                names.push(stem.to_string());
            }
        }
    }
    names.sort();
    Ok(names)
}

/// Builds every target (what `run` then runs); with `log`, its output goes there instead of
/// the terminal (when it runs alongside the host tests).
pub fn build(log: Option<&Path>) -> Result<()> {
    ensure_cargo_fuzz()?;
    let mut c = nightly_cargo()?;
    c.args(["fuzz", "build"]).args(FLAGS);
    if let Some(log) = log {
        let f =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        c.stdout(f.try_clone()?).stderr(f);
    }
    sh(&mut c)
}

const FLAGS: [&str; 3] = ["--sanitizer", "none", "--debug-assertions"];

/// Builds all targets (a no-op when `build` ran), then runs each (or those named) for `seconds`.
pub fn run(seconds: u64, only: &[String]) -> Result<()> {
    let fuzz_dir = root().join("fuzz");
    let all = targets(&fuzz_dir)?;
    for t in only {
        if !all.contains(t) {
            bail!("no fuzz target {t:?}; targets: {}", all.join(", "));
        }
    }
    let chosen: Vec<&String> = all
        .iter()
        .filter(|t| only.is_empty() || only.contains(t))
        .collect();
    build(None)?;
    let mut failed = Vec::new();
    for t in chosen {
        let corpus = fuzz_dir.join("corpus").join(t);
        let scratch = fuzz_dir.join("target").join("scratch-corpus").join(t);
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("creating {}", scratch.display()))?;
        let mut c = nightly_cargo()?;
        c.args(["fuzz", "run"])
            .args(FLAGS)
            .arg(t)
            .arg(&scratch)
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"]);
        if let Err(e) = sh(&mut c) {
            eprintln!("fuzz target {t} FAILED: {e:#} (input in fuzz/artifacts/{t}/)");
            failed.push(t.clone());
        }
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

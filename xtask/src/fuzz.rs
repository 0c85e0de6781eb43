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
    crate::without_package_env(&mut c);
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

/// How the targets are built: `Campaign` with the release profile (opt-level 3: the most inputs a
/// second), `Quick` with cargo-fuzz's `--dev` and the fuzz workspace's dev profile (opt-level 1):
/// on the build VM 2 min 35 s cold against 5 min 20 s, at 70% of the inputs a second (96,000
/// against 136,000 for `admission`). The test command runs each target 5 s beside the host
/// tests, where the optimised build was the longest step.
#[derive(Clone, Copy)]
pub enum Build {
    Campaign,
    Quick,
}

impl Build {
    fn flags(self) -> Vec<&'static str> {
        let mut f = FLAGS.to_vec();
        if matches!(self, Build::Quick) {
            f.push("--dev");
        }
        f
    }
}

/// Builds every target (what `run` then runs); with `log`, its output goes there instead of
/// the terminal (when it runs alongside the host tests).
pub fn build(log: Option<&Path>, how: Build) -> Result<()> {
    ensure_cargo_fuzz()?;
    let mut c = nightly_cargo()?;
    c.args(["fuzz", "build"]).args(how.flags());
    if let Some(log) = log {
        let f =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        c.stdout(f.try_clone()?).stderr(f);
    }
    sh(&mut c)
}

const FLAGS: [&str; 3] = ["--sanitizer", "none", "--debug-assertions"];

/// Builds all targets (a no-op when `build` ran), then runs each (or those named) for `seconds`,
/// one per CPU at a time: a libFuzzer process is single-threaded, so each target gets a whole
/// CPU for its `seconds`, as it did when they ran one after another, in less wall time. Each
/// run's output goes to `fuzz/target/logs/<target>.log`; its final stats are printed, and the
/// whole log when it fails.
pub fn run(seconds: u64, only: &[String], how: Build) -> Result<()> {
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
    build(None, how)?;
    let logs = fuzz_dir.join("target").join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let queue = std::sync::Mutex::new(chosen.into_iter());
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let Some(t) = queue.lock().unwrap().next() else {
                    return;
                };
                if let Err(e) = run_one(&fuzz_dir, &logs, t, seconds, how) {
                    eprintln!("fuzz target {t} FAILED: {e:#} (input in fuzz/artifacts/{t}/)");
                    failed.lock().unwrap().push(t.clone());
                }
            });
        }
    });
    let mut failed = failed.into_inner().unwrap();
    if !failed.is_empty() {
        failed.sort();
        bail!("fuzz targets failed: {}", failed.join(", "));
    }
    Ok(())
}

/// One target for `seconds` from its corpus, its output in `logs/<t>.log`.
fn run_one(fuzz_dir: &Path, logs: &Path, t: &str, seconds: u64, how: Build) -> Result<()> {
    let corpus = fuzz_dir.join("corpus").join(t);
    let scratch = fuzz_dir.join("target").join("scratch-corpus").join(t);
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let log = logs.join(format!("{t}.log"));
    let f = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut c = nightly_cargo()?;
    c.args(["fuzz", "run"])
        .args(how.flags())
        .arg(t)
        .arg(&scratch)
        .arg(&corpus)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .stdout(f.try_clone()?)
        .stderr(f);
    eprintln!("+ {c:?} > {}", log.display());
    let st = c.status().with_context(|| format!("spawning {c:?}"));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    match st {
        Ok(st) if st.success() => {
            let stats: Vec<&str> = text.lines().filter(|l| l.starts_with("stat::")).collect();
            eprintln!("fuzz target {t}: {}", stats.join(" "));
            Ok(())
        }
        Ok(st) => {
            eprintln!("{text}");
            bail!("{st}")
        }
        Err(e) => Err(e),
    }
}

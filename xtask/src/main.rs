//! `cargo xtask`: developer and CI tasks.
//!
//! - `setup`: installs what builds and tests need, idempotently (nightly + rust-src,
//!   bpf-linker, the musl target, Debian packages).
//! - `build-ebpf`: builds the eBPF object (release, BTF) into target/bpfel-unknown-none/release.
//! - `test`: setup, then fmt --check, clippy -D warnings and every test tier.
//! - `run`: setup, then the daemon with its embedded default config.
//! - `image`: the daemon's OCI image archive (see image.rs), for `ctr images import`.
//! - `vm-test`: multi-NUMA guest scenarios under QEMU (see `vm`).
//! - `vm-bench`: no manager / AutoNUMA / numad / rebalancer side by side in one guest (see
//!   `vm::bench`); a benchmark, not part of `test`.
//! - `fuzz`: every cargo-fuzz target briefly, from its committed corpus (see fuzz.rs).
mod apiserver;
mod containerd;
mod fuzz;
mod image;
mod oci;
mod overhead;
mod setup;
mod vm;

use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install build and test prerequisites (idempotent; needs root for apt-get).
    Setup,
    /// Build the eBPF programs (release, with BTF) to target/bpfel-unknown-none/release/rebalancer.
    BuildEbpf,
    /// Run every check CI runs: setup, fmt, clippy, unit + root tests.
    Test {
        /// Skip `setup` (when prerequisites are known to be installed).
        #[arg(long)]
        no_setup: bool,
        /// Skip the multi-NUMA guest tests (`vm-test`) that run after the host tests.
        #[arg(long)]
        no_vm: bool,
    },
    /// Run every fuzz target (cargo fuzz, nightly) from its seed corpus for N seconds each.
    Fuzz {
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Only these targets (repeatable); default all of fuzz/fuzz_targets.
        #[arg(long = "target")]
        targets: Vec<String>,
    },
    /// Write the daemon's OCI image archive (static binary + default config; no Docker needed).
    Image,
    /// Build and run the daemon with the embedded default config (extra args are passed on).
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure the eBPF samplers' overhead on `perf bench sched pipe` (root; see overhead.rs).
    EbpfOverhead(overhead::OverheadArgs),
    /// Boot multi-NUMA QEMU guests and run the guest scenarios (needs root for apt-get).
    VmTest(vm::VmTestArgs),
    /// Benchmark no manager / AutoNUMA / numad / rebalancer side by side in one multi-NUMA guest.
    VmBench(vm::VmBenchArgs),
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Setup => setup::all()?.wait(),
        Cmd::EbpfOverhead(a) => overhead::run(a),
        Cmd::BuildEbpf => build_ebpf().map(drop),
        Cmd::Image => image::build().map(drop),
        Cmd::Test { no_setup, no_vm } => test(no_setup, no_vm),
        Cmd::VmTest(a) => vm::vm_test(&a),
        Cmd::VmBench(a) => vm::vm_bench(&a),
        Cmd::Fuzz { seconds, targets } => fuzz::run(seconds, &targets, fuzz::Build::Campaign),
        Cmd::Run { args } => {
            setup::all()?;
            let mut c = cargo();
            c.args(["run", "--release", "--bin", "rebalancer", "--", "run"])
                .args(args);
            sh(&mut c)
        }
    }
}

/// Workspace root (xtask lives one level below it).
pub fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent")
        .to_path_buf()
}

pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    without_package_env(&mut c);
    c
}

/// Leaves out of `c`'s environment what cargo sets for the package it runs (`OUT_DIR`,
/// `CARGO_PKG_*`, `CARGO_MANIFEST_*`, …): ring's build script reruns when one of them differs
/// from its last build, and ring's rebuild rebuilds rustls and the daemon. A build started from
/// a root test (deploy_root runs `cargo xtask image` with the test's `OUT_DIR`) then rebuilt
/// the musl image (2 min 8 s on the CI run), and the guest tests' build after it again.
pub fn without_package_env(c: &mut Command) {
    const SET_FOR_A_PACKAGE: [&str; 9] = [
        "OUT_DIR",
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_BIN_EXE_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
    ];
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str() {
            if SET_FOR_A_PACKAGE.iter().any(|p| k.starts_with(p)) {
                c.env_remove(k);
            }
        }
    }
}

/// Runs a command, echoing it; fails on a non-zero exit.
pub fn sh(c: &mut Command) -> Result<()> {
    eprintln!("+ {:?}", c);
    let st = c.status().with_context(|| format!("spawning {c:?}"))?;
    if !st.success() {
        bail!("{c:?} failed: {st}");
    }
    Ok(())
}

/// Builds the eBPF object (release, BTF) with the pinned nightly, exactly as aya-build does from
/// rebalancer/build.rs, and returns its path.
pub fn build_ebpf() -> Result<std::path::PathBuf> {
    let nightly = setup::ebpf_nightly()?;
    let mut c = Command::new("rustup");
    without_package_env(&mut c);
    c.current_dir(root().join("rebalancer-ebpf"))
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env("CARGO_TARGET_DIR", root().join("target"))
        .args([
            "run",
            &nightly,
            "cargo",
            "build",
            "--release",
            "-Z",
            "build-std=core",
        ])
        .args(["--target", "bpfel-unknown-none", "--bin", "rebalancer"])
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "--cfg=bpf_target_arch=\"x86_64\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf",
        );
    sh(&mut c)?;
    let obj = root().join("target/bpfel-unknown-none/release/rebalancer");
    eprintln!("eBPF object: {}", obj.display());
    Ok(obj)
}

/// Every check, in an order that builds each thing once: the eBPF object once for every
/// profile (REBALANCER_EBPF_OBJ, see rebalancer/build.rs), the host tests compiled before they
/// run so the fuzz targets' nightly build can use the core the serial test run leaves idle.
fn test(no_setup: bool, no_vm: bool) -> Result<()> {
    let t0 = std::time::Instant::now();
    let mut steps: Vec<(&str, f64)> = Vec::new();
    let lap = |name, steps: &mut Vec<(&str, f64)>| {
        let total: f64 = steps.iter().map(|(_, s)| s).sum();
        steps.push((name, t0.elapsed().as_secs_f64() - total));
    };
    // The API server's Go build runs while fmt, the eBPF object and clippy do.
    let server = if no_setup {
        apiserver::Build::done()
    } else {
        setup::all()?
    };
    lap("setup", &mut steps);
    sh(cargo().args(["fmt", "--all", "--", "--check"]))?;
    // The alerting rules: valid, and firing (and not) as their unit tests say.
    let rules = root().join("config/prometheus");
    sh(Command::new("promtool")
        .current_dir(&rules)
        .args(["check", "rules", "rules.yaml"]))?;
    sh(Command::new("promtool")
        .current_dir(&rules)
        .args(["test", "rules", "rules_test.yaml"]))?;
    let obj = build_ebpf()?;
    // Inherited by every cargo below, the guest's musl build included.
    std::env::set_var("REBALANCER_EBPF_OBJ", &obj);
    lap("fmt, alert rules, eBPF object", &mut steps);
    sh(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    lap("clippy", &mut steps);
    // The deployment root test runs this image; the guest tests reuse its musl build. It builds
    // beside the host tests (its own target directories): on a small machine each build leaves
    // cores idle in its serial phases (build scripts, the large crate's front end, links), which
    // the other fills. The musl toolchain is set up first, as it sets the C compiler for both.
    vm::assets::musl_target()?;
    let image = std::thread::spawn(image::build);
    sh(cargo().args(["build", "-p", "cri-tool"]))?;
    sh(cargo().args(["test", "--no-run"]))?;
    image.join().expect("image build thread")?;
    lap("build host tests", &mut steps);
    // The fuzz targets build and then run (each briefly, from its committed corpus) beside the
    // host tests, which mostly wait (on daemons, containerd, the API server) and leave a core
    // idle: the same fuzzing, in time the host tests take anyway.
    let fuzz_build = {
        let log = root().join("target/fuzz-build.log");
        std::thread::spawn(move || {
            fuzz::build(Some(&log), fuzz::Build::Quick)
                .with_context(|| format!("fuzz build; its log: {}", log.display()))?;
            eprintln!("xtask test: every fuzz target briefly, from its committed corpus");
            fuzz::run(5, &[], fuzz::Build::Quick)
        })
    };
    server.wait()?;
    lap("API server build (rest of)", &mut steps);
    // What `cargo test` runs, in three parts: the unit and property tests (pure, or each in
    // its own temporary directories) on every CPU; the doc tests; then the integration and
    // root tests one at a time (they share cgroupfs, containerd, the API server). The NRI and
    // NodeResourceTopology root tests must find the containerd and API server that setup
    // installed, not skip.
    let host_test = |args: &[&str]| {
        sh(cargo()
            .arg("test")
            .args(args)
            .env("REBALANCER_REQUIRE_CONTAINERD", "1")
            .env("REBALANCER_REQUIRE_APISERVER", "1")
            .env("REBALANCER_APISERVER_DIR", apiserver::dir()))
    };
    let host = host_test(&["--lib", "--bins"])
        .and_then(|()| host_test(&["--doc"]))
        .and_then(|()| host_test(&["--test", "*", "--", "--test-threads=1"]));
    let fuzzed = fuzz_build.join().expect("fuzz thread");
    host?;
    fuzzed?;
    lap("run host tests (fuzz build and runs alongside)", &mut steps);
    if no_vm {
        eprintln!("xtask test: skipping the multi-NUMA guest tests (--no-vm)");
    } else {
        eprintln!(
            "xtask test: host tests passed; now the multi-NUMA guest tests (cargo xtask vm-test)"
        );
        vm::test_run()?;
    }
    lap("guest tests", &mut steps);
    eprintln!("xtask test: passed in {:.0}s", t0.elapsed().as_secs_f64());
    for (name, secs) in &steps {
        eprintln!("  {secs:>6.0}s  {name}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cargo started by the xtask sees none of what cargo set for the package that ran it
    /// (a root test running `cargo xtask image` has its own `OUT_DIR`), and keeps the rest.
    #[test]
    fn a_cargo_child_never_sees_the_callers_package_env() {
        std::env::set_var("OUT_DIR", "/tmp/some-package/out");
        std::env::set_var("CARGO_MANIFEST_DIR", "/tmp/some-package");
        std::env::set_var("CARGO_BUILD_JOBS", "2");
        let c = cargo();
        let removed: Vec<String> = c
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for k in ["OUT_DIR", "CARGO_MANIFEST_DIR", "CARGO_PKG_NAME"] {
            assert!(removed.iter().any(|r| r == k), "{k} left in: {removed:?}");
        }
        assert!(
            !removed.iter().any(|r| r == "CARGO_BUILD_JOBS"),
            "{removed:?}"
        );
    }
}

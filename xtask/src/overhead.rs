//! `cargo xtask ebpf-overhead`: the cost of the eBPF samplers on a context-switch-heavy
//! benchmark, measured side by side in one run.
//!
//! For each on-CPU mode (cpu-clock sampler, exact sched_switch) it runs `pairs` alternating
//! pairs of `taskset -c <cpu> perf bench sched pipe -l <loops>`: once with nothing attached and
//! once while `rebalancer sample --seconds 0 --prog-stats` holds every program attached (the
//! order inside a pair flips each time to cancel drift). It prints the median ratio
//! attached/baseline of perf's "Total time", and the kernel's own accounting
//! (run_time_ns / run_cnt with kernel.bpf_stats_enabled) as ns/event per program. Finally it
//! runs the root test that times reading 10,000 cgroups' entries from the maps.
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::{cargo, root, sh};

#[derive(Debug, clap::Args)]
pub struct OverheadArgs {
    /// Alternating (baseline, attached) pairs per mode.
    #[arg(long, default_value_t = 10)]
    pub pairs: usize,
    /// `perf bench sched pipe -l` loops per run.
    #[arg(long, default_value_t = 200_000)]
    pub loops: u64,
    /// CPU the benchmark is pinned to.
    #[arg(long, default_value_t = 1)]
    pub cpu: u32,
    /// Modes to measure: sampled, exact or both.
    #[arg(long, default_value = "both")]
    pub mode: String,
    /// Skip the 10,000-cgroup map read timing.
    #[arg(long)]
    pub no_read_bench: bool,
}

/// perf's "Total time: 4.123 [sec]".
fn parse_total(out: &str) -> Option<f64> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Total time:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CPU time (user + system) of waited-for children so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage fills a plain struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One benchmark run: (perf's total wall time, CPU time the benchmark consumed). The CPU time
/// is far less disturbed by other load on a shared machine than the wall time; the programs'
/// cost lands in it (they run in the switching task's context).
fn bench(a: &OverheadArgs) -> Result<(f64, f64)> {
    let cpu0 = children_cpu();
    let out = Command::new("taskset")
        .args([
            "-c",
            &a.cpu.to_string(),
            "perf",
            "bench",
            "sched",
            "pipe",
            "-l",
        ])
        .arg(a.loops.to_string())
        .output()
        .context("running perf bench (apt-get install linux-perf)")?;
    let cpu = children_cpu() - cpu0;
    let text = String::from_utf8_lossy(&out.stdout);
    match (out.status.success(), parse_total(&text)) {
        (true, Some(t)) => Ok((t, cpu)),
        _ => bail!(
            "perf bench failed: {}\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// (program, run_time_ns, run_count) from `rebalancer sample --json --prog-stats`.
type ProgRuns = Vec<(String, u64, u64)>;

fn attached(
    a: &OverheadArgs,
    bin: &std::path::Path,
    exact: bool,
) -> Result<((f64, f64), ProgRuns)> {
    let mut c = Command::new(bin);
    c.args(["sample", "--seconds", "0", "--json", "--prog-stats"]);
    if exact {
        c.arg("--exact");
    }
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {}", bin.display()))?;
    let stderr = child.stderr.take().context("stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("sampling for") => break,
            Some(Ok(_)) => continue,
            _ => {
                let _ = child.kill();
                bail!("rebalancer sample exited before attaching");
            }
        }
    }
    let t = bench(a);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output()?;
    let t = t?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("sample output: {}", String::from_utf8_lossy(&out.stdout)))?;
    let progs = v["programs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or("?").to_string(),
                        p["run_time_ns"].as_u64().unwrap_or(0),
                        p["run_count"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Ok((t, progs))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn run(a: OverheadArgs) -> Result<()> {
    sh(cargo().args(["build", "-p", "rebalancer", "--bin", "rebalancer"]))?;
    let bin = root().join("target/debug/rebalancer");
    let modes: Vec<bool> = match a.mode.as_str() {
        "sampled" => vec![false],
        "exact" => vec![true],
        "both" => vec![false, true],
        m => bail!("--mode {m}: expected sampled, exact or both"),
    };
    println!(
        "machine: {} CPUs, kernel {}; benchmark: taskset -c {} perf bench sched pipe -l {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        a.cpu,
        a.loops
    );
    for exact in modes {
        let name = if exact {
            "exact (sched_switch)"
        } else {
            "sampled (cpu-clock)"
        };
        let mut ratios = Vec::new();
        let mut cpu_ratios = Vec::new();
        let mut runs: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for i in 0..a.pairs {
            let (base, (att, progs)) = if i % 2 == 0 {
                let b = bench(&a)?;
                (b, attached(&a, &bin, exact)?)
            } else {
                let at = attached(&a, &bin, exact)?;
                (bench(&a)?, at)
            };
            for (p, ns, cnt) in progs {
                let e = runs.entry(p).or_default();
                e.0 += ns;
                e.1 += cnt;
            }
            println!(
                "{name} pair {}: wall {:.3} -> {:.3} s (ratio {:.4}); cpu {:.3} -> {:.3} s \
                 (ratio {:.4})",
                i + 1,
                base.0,
                att.0,
                att.0 / base.0,
                base.1,
                att.1,
                att.1 / base.1
            );
            ratios.push(att.0 / base.0);
            cpu_ratios.push(att.1 / base.1);
            std::thread::sleep(Duration::from_millis(200));
        }
        let med = median(&mut ratios);
        let cmed = median(&mut cpu_ratios);
        println!(
            "{name}: median ratio attached/baseline over {} pairs: wall {med:.4} ({:+.2}%), \
             cpu time {cmed:.4} ({:+.2}%)",
            a.pairs,
            (med - 1.0) * 100.0,
            (cmed - 1.0) * 100.0
        );
        for (p, (ns, cnt)) in &runs {
            if *cnt > 0 {
                println!(
                    "{name}: program {p:<22} run_cnt {cnt:>10} run_time_ns {ns:>12} = {:.1} ns/event",
                    *ns as f64 / *cnt as f64
                );
            }
        }
    }
    if !a.no_read_bench {
        sh(cargo().args([
            "test",
            "-p",
            "rebalancer",
            "--test",
            "ebpf_root",
            "read_10k_cgroups_timing",
            "--",
            "--nocapture",
        ]))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perf_total_and_median() {
        let out = "# Running 'sched/pipe' benchmark:\n# Executed 200000 pipe operations between two processes\n\n     Total time: 4.123 [sec]\n\n      20.615 usecs/op\n";
        assert_eq!(parse_total(out), Some(4.123));
        assert_eq!(parse_total("nothing"), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}

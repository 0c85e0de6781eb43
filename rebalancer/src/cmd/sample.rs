//! `rebalancer sample`: load the samplers, sample for N seconds (or until SIGINT/SIGTERM), print
//! per-cgroup, per-node numbers — a numatop-like look for operators and a check for tests.
use std::{collections::BTreeMap, os::unix::fs::MetadataExt, path::Path, process::ExitCode};

use anyhow::Context;
use serde::Serialize;

use crate::{
    config::{Config, OnCpuSource},
    ebpf::{sample::ProgStat, Sample, Sampler, SourceStatus},
    topology::{sysfs, Topology},
};

#[derive(Debug, clap::Args)]
pub struct SampleArgs {
    /// Seconds to sample (0 = until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Only these cgroups (v2 paths, absolute or relative to the v2 mount). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Exact sched_switch accounting instead of the cpu-clock sampler.
    #[arg(long)]
    pub exact: bool,
    /// Also report the kernel's run time / run count of each program (enables BPF stats).
    #[arg(long)]
    pub prog_stats: bool,
    /// Config file (TOML).
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Row<'a> {
    cgroup_id: u64,
    path: Option<&'a str>,
    #[serde(flatten)]
    sample: &'a Sample,
}

#[derive(Serialize)]
struct Report<'a> {
    seconds: f64,
    sources: &'a [SourceStatus],
    cgroups: Vec<Row<'a>>,
    /// Tasks running or waiting per CPU of each node over the window, from the run-queue
    /// lengths the cpu-clock samples read (nodes without enough readings are absent).
    runnable_per_cpu: BTreeMap<u32, f64>,
    stats: BTreeMap<&'static str, u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    programs: Vec<ProgStat>,
}

/// Waits `secs` seconds (0 = forever) or until SIGINT/SIGTERM, whichever comes first.
fn wait(secs: u64) {
    // SAFETY: plain sigset manipulation and sigtimedwait on this thread's blocked signals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let ts = libc::timespec {
            tv_sec: if secs == 0 { 1 << 40 } else { secs as _ },
            tv_nsec: 0,
        };
        libc::sigtimedwait(&set, std::ptr::null_mut(), &ts);
    }
}

pub fn run(a: SampleArgs) -> anyhow::Result<ExitCode> {
    crate::cli::init_tracing("warn");
    let mut cfg = Config::load(a.config.as_deref())?;
    if a.exact {
        cfg.ebpf.on_cpu_source = OnCpuSource::Exact;
    }
    let topo = sysfs::read(&cfg.daemon.sysfs_root)
        .with_context(|| format!("reading topology under {}", cfg.daemon.sysfs_root.display()))?;
    let (sampler, sources) = Sampler::start(&topo, &cfg.ebpf);
    let Some(mut sampler) = sampler else {
        for s in &sources {
            eprintln!("{}: skipped: {}", s.name, s.reason);
        }
        anyhow::bail!("no eBPF source could be attached");
    };
    if a.prog_stats {
        if let Err(e) = sampler.enable_kernel_stats() {
            eprintln!("warning: cannot enable BPF run-time stats: {e}");
        }
    }
    let mut wanted = Vec::new();
    for p in &a.cgroup {
        let path = match (Path::new(p).is_absolute(), sampler.cgroup2_root()) {
            (false, Some(root)) => root.join(p.trim_start_matches('/')),
            (true, Some(root)) if !Path::new(p).starts_with(root) => {
                root.join(p.trim_start_matches('/'))
            }
            _ => p.into(),
        };
        let md = std::fs::metadata(&path)
            .with_context(|| format!("cgroup {} (resolved to {})", p, path.display()))?;
        wanted.push(md.ino());
    }
    let before = sampler.read()?;
    let runq_before = sampler.runq().unwrap_or_default();
    let start = std::time::Instant::now();
    eprintln!(
        "sampling for {} (sources: {})",
        if a.seconds == 0 {
            "until SIGINT".to_string()
        } else {
            format!("{} s", a.seconds)
        },
        sources
            .iter()
            .filter(|s| s.available)
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    wait(a.seconds);
    let now = sampler.read()?;
    let runq_now = sampler.runq().unwrap_or_default();
    let secs = start.elapsed().as_secs_f64();
    let cpu_node = topo.cpu_node_map();
    let runnable_per_cpu = crate::ebpf::runq::runnable_between(&runq_before, &runq_now, &cpu_node);
    let delta = crate::ebpf::delta_all(&now, &before);
    let mut rows: Vec<Row> = delta
        .iter()
        .filter(|(id, _)| wanted.is_empty() || wanted.contains(id))
        .map(|(id, s)| Row {
            cgroup_id: *id,
            path: sampler.cgroup_path(*id),
            sample: s,
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.sample.total_cpu_ns()));
    let stats = sampler.stats()?.into_iter().collect();
    let programs = if a.prog_stats {
        sampler.prog_stats()
    } else {
        Vec::new()
    };
    let report = Report {
        seconds: secs,
        sources: &sources,
        cgroups: rows,
        runnable_per_cpu,
        stats,
        programs,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report, &topo);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(r: &Report, topo: &Topology) {
    let nodes: Vec<u32> = topo.node_ids().collect();
    print!("{:>8}", "cg_id");
    for n in &nodes {
        print!(" {:>10}", format!("cpu_ms@n{n}"));
    }
    println!(
        " {:>7} {:>7} {:>6} {:>8} {:>8} {:>8} {:>10} {:>10}  path",
        "migr", "x-node", "numa", "pages", "flt_loc", "flt_rem", "dram_loc", "dram_rem"
    );
    for row in &r.cgroups {
        let s = row.sample;
        print!("{:>8}", row.cgroup_id);
        for n in &nodes {
            let ms = s.cpu_ns.get(n).copied().unwrap_or(0) as f64 / 1e6;
            print!(" {ms:>10.1}");
        }
        println!(
            " {:>7} {:>7} {:>6} {:>8} {:>8} {:>8} {:>10} {:>10}  {}",
            s.migrations,
            s.cross_node_migrations,
            s.numa_moves,
            s.pages_migrated,
            s.local_faults,
            s.remote_faults,
            s.local_events,
            s.remote_events,
            row.path.unwrap_or("?")
        );
    }
    let rq: Vec<String> = nodes
        .iter()
        .map(|n| match r.runnable_per_cpu.get(n) {
            Some(x) => format!("n{n}={x:.2}"),
            None => format!("n{n}=-"),
        })
        .collect();
    println!("runnable per CPU: {}", rq.join(" "));
    let st: Vec<String> = r.stats.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("{:.2} s; stats: {}", r.seconds, st.join(" "));
    for p in &r.programs {
        let per = if p.run_count > 0 {
            p.run_time_ns as f64 / p.run_count as f64
        } else {
            0.0
        };
        println!(
            "prog {:<24} run_cnt {:>10} run_time_ns {:>12} ns/event {:>8.1}",
            p.name, p.run_count, p.run_time_ns, per
        );
    }
}

//! `rebalancer probe`: which eBPF / PMU sources this kernel supports, how their per-cgroup
//! counters are kept and read, the measured access source (written pages), and the cgroup mode.
//! It really loads and attaches every source (then detaches them), so "available" means the
//! verifier accepted the program and the attach point exists.
use std::process::ExitCode;

use serde::Serialize;

use crate::{
    config::Config,
    ebpf::{probe, Sampler, SourceStatus},
};

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Config file (TOML); its [ebpf] section decides what is tried.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Report {
    sources: Vec<SourceStatus>,
    /// Where the programs count per cgroup and how the daemon reads it.
    counters: String,
    kernel: String,
    cgroup_mode: &'static str,
}

pub fn run(a: ProbeArgs) -> anyhow::Result<ExitCode> {
    crate::cli::init_tracing("warn");
    let cfg = Config::load(a.config.as_deref())?;
    let topo = crate::topology::sysfs::read(&cfg.daemon.sysfs_root).map_err(|e| {
        anyhow::anyhow!(
            "reading topology under {}: {e}",
            cfg.daemon.sysfs_root.display()
        )
    })?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let (sampler, mut sources) = Sampler::start_with(&topo, &cfg.ebpf, true);
    let counters = match &sampler {
        Some(s) => s.counters(),
        None => "none (no eBPF source: see below)".to_string(),
    };
    drop(sampler);
    // The measured access source (`controller.written_pages`), probed as the daemon does.
    const WRITTEN: &str = "written_pages:soft_dirty";
    sources.push(match crate::written::probe(std::path::Path::new("/proc")) {
        Ok(()) if cfg.controller.written_pages => SourceStatus::ok(
            WRITTEN,
            "soft-dirty bits via clear_refs + pagemap, nodes via move_pages",
        ),
        Ok(()) => SourceStatus::skipped(WRITTEN, "available, off (controller.written_pages)"),
        Err(why) => SourceStatus::skipped(WRITTEN, why),
    });
    let report = Report {
        sources,
        counters,
        kernel: probe::kernel_release(),
        cgroup_mode: probe::cgroup_mode(&mountinfo).as_str(),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("kernel {}  cgroups {}", report.kernel, report.cgroup_mode);
        println!("counters: {}", report.counters);
        for s in &report.sources {
            let state = if s.available { "available" } else { "skipped" };
            println!("{:<22} {:<10} {}", s.name, state, s.reason);
        }
    }
    Ok(ExitCode::SUCCESS)
}

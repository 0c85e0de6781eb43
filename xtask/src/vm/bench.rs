//! `cargo xtask vm-bench`: the side-by-side benchmark in one multi-NUMA guest boot. The same
//! fixed mixed workload (tests/vm/bench/mixed.sh) runs under each condition in turn — no
//! manager, kernel AutoNUMA, numad (Debian's package, fetched like the kernel and cached under
//! target/vm/numad), the rebalancer daemon with AutoNUMA off and on — with a clean slate between
//! them (the guest init kills every process and removes the cgroups). The guest prints one data
//! block per condition; the host parses it (pure: [`parse_block`], [`summarize`]) and prints a
//! markdown table. A benchmark, not a test: `cargo xtask test` does not run it.
use std::{
    fmt::Write as _, fs, os::unix::fs::PermissionsExt, path::PathBuf, process::Command,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use super::{assets, qemu, topology, verdict};
use crate::{root, sh};

/// Locality counted as "reached".
const TARGET: f64 = 0.95;

/// The conditions, in run order: name (guest argument) and the table's label.
pub const CONDITIONS: &[(&str, &str)] = &[
    ("none", "no manager (numa_balancing=0)"),
    ("autonuma", "kernel AutoNUMA (numa_balancing=1)"),
    ("numad", "numad -i 1:2 (numa_balancing=0)"),
    ("rebalancer", "rebalancer (numa_balancing=0)"),
    (
        "baseline",
        "baseline rebalancer (--baseline-bin, numa_balancing=0)",
    ),
    (
        "rebalancer-autonuma",
        "rebalancer + AutoNUMA (numa_balancing=1)",
    ),
];

/// Conditions run when none is named: the two the ratio table compares (plus `baseline`
/// with `--baseline-bin`).
pub const DEFAULT_CONDITIONS: &[&str] = &["autonuma", "rebalancer"];

#[derive(Debug, clap::Args)]
pub struct VmBenchArgs {
    /// Topologies to boot (repeatable; default every one of `vm-test --list`; node memory is
    /// raised to 4 x --mib).
    #[arg(long, value_name = "NAME")]
    pub topology: Vec<String>,
    /// Conditions (repeatable: none, autonuma, numad, rebalancer, baseline,
    /// rebalancer-autonuma; `all` for every one; default autonuma and rebalancer, and
    /// baseline with --baseline-bin), run in the fixed order in each boot.
    #[arg(long, value_name = "NAME")]
    pub condition: Vec<String>,
    /// Boots per topology; the ratio table takes the median of each figure over them.
    #[arg(long, default_value_t = 3)]
    pub boots: u32,
    /// Memory of each of the three hogs (MiB); numad ignores processes under 300 MB.
    #[arg(long, default_value_t = 320)]
    pub mib: u32,
    /// Measured window per condition (s).
    #[arg(long, default_value_t = 90)]
    pub window: u32,
    /// When the operator re-pins w2 to the other node (s into the window).
    #[arg(long, default_value_t = 45)]
    pub shift: u32,
    /// The rebalancer's control period (ms).
    #[arg(long, default_value_t = 2000)]
    pub period_ms: u32,
    /// Pause between two locality readings (ms); a reading is stamped at the middle of the time it took
    /// (0.3-0.6 s under TCG). The reader takes part of the guest's one spare CPU.
    #[arg(long, default_value_t = 500)]
    pub sample_ms: u32,
    /// Read locality from the page table (/proc/PID/pagemap and each node's memory blocks)
    /// instead of numa_maps: the same count by another path, as a cross-check (no faster
    /// under TCG).
    #[arg(long)]
    pub pagemap: bool,
    /// Benchmark this rebalancer binary instead of building one.
    #[arg(long, value_name = "PATH")]
    pub rebalancer_bin: Option<PathBuf>,
    /// A second rebalancer binary (a static musl build, e.g. of main) run as condition
    /// `baseline` in the same boots: before/after against the same AutoNUMA runs.
    #[arg(long, value_name = "PATH")]
    pub baseline_bin: Option<PathBuf>,
    /// Debian suite of the guest's cloud kernel: bookworm (6.1, the default) or trixie (6.12).
    #[arg(long, value_name = "SUITE", default_value = "bookworm")]
    pub kernel_suite: String,
}

/// One `sample` line: aggregate pages of the workload at time `t` (s since the pins).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub t: f64,
    pub pages: u64,
    pub local_pages: u64,
    pub missing: u32,
}

impl Sample {
    pub fn local(&self) -> f64 {
        if self.pages == 0 {
            0.0
        } else {
            self.local_pages as f64 / self.pages as f64
        }
    }
}

/// One condition's data block, parsed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CondRun {
    pub cond: String,
    pub samples: Vec<Sample>,
    pub shift_t: Option<f64>,
    /// The `result` line's fields.
    pub result: Vec<(String, String)>,
}

impl CondRun {
    fn get(&self, k: &str) -> Option<&str> {
        self.result
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
    }

    fn num(&self, k: &str) -> Result<u64, String> {
        let v = self.get(k).ok_or_else(|| format!("result has no {k}"))?;
        v.parse()
            .map_err(|_| format!("result field {k}={v:?} is not a number"))
    }
}

fn fields(line: &str) -> impl Iterator<Item = (&str, &str)> {
    line.split_whitespace().filter_map(|f| f.split_once('='))
}

fn field<'a>(line: &'a str, k: &str) -> Option<&'a str> {
    fields(line).find(|(a, _)| *a == k).map(|(_, v)| v)
}

/// Parses the `bench` data block of one condition (format: tests/vm/bench/mixed.sh).
pub fn parse_block(text: &str) -> Result<CondRun, String> {
    let mut r = CondRun::default();
    let mut have_result = false;
    for line in text.lines().map(str::trim) {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "sample" => {
                let num = |k: &str| -> Result<u64, String> {
                    field(rest, k)
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| format!("bad sample line (no {k}): {line:?}"))
                };
                let t = field(rest, "t")
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|t| t.is_finite())
                    .ok_or_else(|| format!("bad sample line (no t): {line:?}"))?;
                r.samples.push(Sample {
                    t,
                    pages: num("pages")?,
                    local_pages: num("local_pages")?,
                    missing: num("missing")? as u32,
                });
            }
            "shift" => {
                r.shift_t = field(rest, "t").and_then(|v| v.parse().ok());
            }
            "result" => {
                r.result = fields(rest)
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect();
                have_result = true;
            }
            _ => {
                if let Some(c) = line.strip_prefix("cond=") {
                    r.cond = c.split_whitespace().next().unwrap_or("").to_string();
                }
            }
        }
    }
    if r.samples.is_empty() {
        return Err("no samples".into());
    }
    if !have_result {
        return Err("no result line (the condition did not finish)".into());
    }
    Ok(r)
}

/// One table row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub final_local: f64,
    /// Time-weighted over the window.
    pub mean_local: f64,
    /// Seconds from the pins to the first sample at >= 95% (before the shift).
    pub t95: Option<f64>,
    /// Seconds from the shift to the first sample at >= 95% after it.
    pub t95_shift: Option<f64>,
    /// Decision latency: seconds from the pins to the first MiB of w1 or w2 on the new node
    /// (whoever moved it); `t95 - decision` is the copy.
    pub decision: Option<f64>,
    /// The same from the shift, for w2.
    pub decision_shift: Option<f64>,
    pub pgmigrate: u64,
    pub pte_updates: u64,
    pub hint_faults: u64,
    /// The manager's own CPU time in the window (s); `None` without a manager process.
    pub mgr_cpu_s: Option<f64>,
    /// The same since the manager started (start-up included).
    pub mgr_total_s: Option<f64>,
    pub mgr: String,
    /// Something that makes the row suspect (a workload process or the manager died).
    pub note: Option<String>,
}

/// Summarises one condition.
pub fn summarize(r: &CondRun) -> Result<Row, String> {
    let s = &r.samples;
    let last = s.last().ok_or("no samples")?;
    let span = last.t - s[0].t;
    let mean_local = if span > 0.0 {
        s.windows(2)
            .map(|w| w[0].local() * (w[1].t - w[0].t))
            .sum::<f64>()
            / span
    } else {
        last.local()
    };
    let shift = r.shift_t.unwrap_or(f64::INFINITY);
    let t95 = s
        .iter()
        .find(|x| x.t < shift && x.local() >= TARGET)
        .map(|x| x.t);
    let t95_shift = r.shift_t.and_then(|st| {
        s.iter()
            .find(|x| x.t >= st && x.local() >= TARGET)
            .map(|x| x.t - st)
    });
    let mgr = r.get("mgr").unwrap_or("none").to_string();
    let clk = r.num("clk_tck").unwrap_or(100).max(1) as f64;
    let ticks = |k: &str| -> Result<Option<f64>, String> {
        match r.get(k) {
            Some("na") | None => Ok(None),
            Some(_) => Ok(Some(r.num(k)? as f64 / clk)),
        }
    };
    // "never", or absent in blocks from before the split: no figure.
    let first_move = |k: &str| -> Result<Option<f64>, String> {
        match r.get(k) {
            Some("never") | None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("result field {k}={v:?} is not a number")),
        }
    };
    let mgr_cpu_s = ticks("mgr_cpu_ticks")?;
    let mgr_total_s = ticks("mgr_total_ticks")?;
    let mut notes = Vec::new();
    if s.iter().any(|x| x.missing > 0) {
        notes.push("a workload process died".to_string());
    }
    if r.get("mgr_alive") == Some("no") {
        notes.push(format!("{mgr} exited during the window"));
    }
    Ok(Row {
        final_local: last.local(),
        mean_local,
        t95,
        t95_shift,
        decision: first_move("first_move_pin")?,
        decision_shift: first_move("first_move_shift")?,
        pgmigrate: r.num("pgmigrate")?,
        pte_updates: r.num("numa_pte_updates")?,
        hint_faults: r.num("numa_hint_faults")?,
        mgr_cpu_s,
        mgr_total_s,
        mgr,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

fn secs(t: Option<f64>) -> String {
    t.map_or("never".into(), |t| format!("{t:.1} s"))
}

/// The copy: the time to 95% less the decision latency (both known).
pub fn copy_time(t95: Option<f64>, decision: Option<f64>) -> Option<f64> {
    Some(t95? - decision?)
}

/// "t95 (decision + copy)".
fn split(t95: Option<f64>, decision: Option<f64>) -> String {
    match (t95, decision) {
        (Some(t), Some(d)) => format!("{t:.1} s ({d:.1} + {:.1})", t - d),
        (None, Some(d)) => format!("never (first move {d:.1} s)"),
        (t, None) => format!("{} (no first move seen)", secs(t)),
    }
}

/// The markdown table; `rows` holds (label, summary or why there is none).
pub fn table(rows: &[(&str, Result<Row, String>)], window: u32) -> String {
    let mut out = format!(
        "| condition | final locality | mean locality | to 95% after the pins (decision + copy) | to 95% after the shift (decision + copy) | pages migrated | manager CPU in the {window} s window | NUMA PTE updates / hint faults |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for (label, row) in rows {
        let _ = match row {
            Err(e) => writeln!(out, "| {label} | no data: {e} | | | | | | |"),
            Ok(r) => {
                let cpu = match (r.mgr_cpu_s, r.mgr_total_s) {
                    (Some(c), Some(t)) => format!("{c:.2} s ({t:.2} s since start)"),
                    (Some(c), None) => format!("{c:.2} s"),
                    (None, _) if r.pte_updates > 0 => "kernel (in the tasks)".into(),
                    (None, _) => "—".into(),
                };
                let note = r.note.as_ref().map_or(String::new(), |n| format!(" ({n})"));
                writeln!(
                    out,
                    "| {label}{note} | {:.1}% | {:.1}% | {} | {} | {} | {cpu} | {} / {} |",
                    100.0 * r.final_local,
                    100.0 * r.mean_local,
                    split(r.t95, r.decision),
                    split(r.t95_shift, r.decision_shift),
                    r.pgmigrate,
                    r.pte_updates,
                    r.hint_faults,
                )
            }
        };
    }
    out
}

/// numad's binary from Debian's package, cached as target/vm/numad/numad.
fn numad() -> Result<PathBuf> {
    let dir = assets::vm_dir().join("numad");
    let bin = dir.join("numad");
    if bin.exists() {
        return Ok(bin);
    }
    let dl = dir.join("download");
    let _ = fs::remove_dir_all(&dl);
    fs::create_dir_all(&dl)?;
    let get = || {
        Command::new("apt-get")
            .current_dir(&dl)
            .args(["download", "numad"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !get() {
        sh(Command::new("apt-get").args(["update", "-q"]))?;
        if !get() {
            bail!("apt-get download numad failed");
        }
    }
    let deb = fs::read_dir(&dl)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download numad left no .deb")?;
    let x = dl.join("x");
    sh(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x))?;
    fs::copy(x.join("usr/bin/numad"), &bin).context("the numad package has no usr/bin/numad")?;
    fs::write(
        dir.join("package"),
        format!(
            "{}\n",
            deb.file_name().unwrap_or_default().to_string_lossy()
        ),
    )?;
    fs::remove_dir_all(&dl)?;
    eprintln!("vm-bench: cached numad as {}", bin.display());
    Ok(bin)
}

/// Median of one figure over boots (upper median for an even count); `None` = none.
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}

/// Median time over boots where "never" counts as the longest; `None` if the median is never.
pub fn median_time(xs: &[Option<f64>]) -> Option<f64> {
    median(xs.iter().map(|t| t.unwrap_or(f64::INFINITY)).collect()).filter(|t| t.is_finite())
}

/// One condition's medians over the boots that gave data.
#[derive(Clone, Debug, PartialEq)]
pub struct Medians {
    pub boots: usize,
    pub t95: Option<f64>,
    pub t95_shift: Option<f64>,
    pub decision: Option<f64>,
    pub decision_shift: Option<f64>,
    pub copy: Option<f64>,
    pub copy_shift: Option<f64>,
    pub mean_local: f64,
    pub pgmigrate: f64,
    /// Boots whose row carries a note (a workload process or the manager died).
    pub noted: usize,
}

pub fn medians(rows: &[Row]) -> Option<Medians> {
    Some(Medians {
        boots: rows.len(),
        t95: median_time(&rows.iter().map(|r| r.t95).collect::<Vec<_>>()),
        t95_shift: median_time(&rows.iter().map(|r| r.t95_shift).collect::<Vec<_>>()),
        decision: median_time(&rows.iter().map(|r| r.decision).collect::<Vec<_>>()),
        decision_shift: median_time(&rows.iter().map(|r| r.decision_shift).collect::<Vec<_>>()),
        copy: median_time(
            &rows
                .iter()
                .map(|r| copy_time(r.t95, r.decision))
                .collect::<Vec<_>>(),
        ),
        copy_shift: median_time(
            &rows
                .iter()
                .map(|r| copy_time(r.t95_shift, r.decision_shift))
                .collect::<Vec<_>>(),
        ),
        mean_local: median(rows.iter().map(|r| r.mean_local).collect())?,
        pgmigrate: median(rows.iter().map(|r| r.pgmigrate as f64).collect())?,
        noted: rows.iter().filter(|r| r.note.is_some()).count(),
    })
}

/// `a / b` of two times, "never" being infinite.
fn time_ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        (Some(_), Some(_)) => "—".into(),
        (Some(_), None) => "0 (AutoNUMA never)".into(),
        (None, Some(_)) => "∞ (never)".into(),
        (None, None) => "— (both never)".into(),
    }
}

/// Per topology: per condition, the rows of the boots that gave data.
pub type Runs = Vec<(String, Vec<(String, Vec<Row>)>)>;

/// The ranking: per topology, each manager's medians against AutoNUMA's on the same boots
/// (rebalancer / AutoNUMA: ≤ 1 is better for the times and the pages, ≥ 1 for locality).
/// `runs` holds, per topology, per condition, the rows of the boots that gave data.
pub fn ratio_table(runs: &Runs, boots: u32) -> String {
    let mut out = format!(
        "Median of {boots} boot(s) per topology; ratio = manager / kernel AutoNUMA.\n\n\
         | topology | manager | boots | to 95% after the pins | decision / copy after the pins | to 95% after the shift | decision / copy after the shift | mean locality | pages migrated |\n\
         | --- | --- | ---: | --- | --- | --- | --- | --- | --- |\n"
    );
    for (topo, conds) in runs {
        let get = |c: &str| {
            conds
                .iter()
                .find(|(n, _)| n == c)
                .and_then(|(_, r)| medians(r))
        };
        let Some(an) = get("autonuma") else {
            let _ = writeln!(out, "| {topo} | (no AutoNUMA data) | | | | | | | |");
            continue;
        };
        let _ = writeln!(
            out,
            "| {topo} | kernel AutoNUMA | {} | {} | {} / {} | {} | {} / {} | {:.1}% | {:.0} |",
            an.boots,
            secs(an.t95),
            secs(an.decision),
            secs(an.copy),
            secs(an.t95_shift),
            secs(an.decision_shift),
            secs(an.copy_shift),
            100.0 * an.mean_local,
            an.pgmigrate
        );
        for (c, _) in conds.iter().filter(|(c, _)| c != "autonuma") {
            let Some(m) = get(c) else {
                let _ = writeln!(out, "| {topo} | {c} | 0 | no data | | | | | |");
                continue;
            };
            let noted = if m.noted > 0 {
                format!(" ({} with a note)", m.noted)
            } else {
                String::new()
            };
            let loc = if an.mean_local > 0.0 {
                format!("{:.2}", m.mean_local / an.mean_local)
            } else {
                "—".into()
            };
            let pages = if an.pgmigrate > 0.0 {
                format!("{:.2}", m.pgmigrate / an.pgmigrate)
            } else {
                "—".into()
            };
            let _ = writeln!(
                out,
                "| {topo} | {c}{noted} | {} | {} → **{}** | {} → {} / {} → {} | {} → **{}** | {} → {} / {} → {} | {:.1}% → **{loc}** | {:.0} → **{pages}** |",
                m.boots,
                secs(m.t95),
                time_ratio(m.t95, an.t95),
                secs(m.decision),
                time_ratio(m.decision, an.decision),
                secs(m.copy),
                time_ratio(m.copy, an.copy),
                secs(m.t95_shift),
                time_ratio(m.t95_shift, an.t95_shift),
                secs(m.decision_shift),
                time_ratio(m.decision_shift, an.decision_shift),
                secs(m.copy_shift),
                time_ratio(m.copy_shift, an.copy_shift),
                100.0 * m.mean_local,
                m.pgmigrate,
            );
        }
    }
    out
}

/// Resolves `--condition` (see [`VmBenchArgs::condition`]).
fn conditions(a: &VmBenchArgs) -> Result<Vec<(&'static str, &'static str)>> {
    let wanted: Vec<String> = if a.condition.is_empty() {
        let mut d: Vec<String> = DEFAULT_CONDITIONS.iter().map(|c| c.to_string()).collect();
        if a.baseline_bin.is_some() {
            d.push("baseline".into());
        }
        d
    } else if a.condition.iter().any(|c| c == "all") {
        CONDITIONS
            .iter()
            .map(|(c, _)| c.to_string())
            .filter(|c| c != "baseline" || a.baseline_bin.is_some())
            .collect()
    } else {
        a.condition.clone()
    };
    for c in &wanted {
        if !CONDITIONS.iter().any(|(n, _)| n == c) {
            let known: Vec<&str> = CONDITIONS.iter().map(|(n, _)| *n).collect();
            bail!("unknown condition {c:?}; known: {}, all", known.join(", "));
        }
    }
    if wanted.iter().any(|c| c == "baseline") && a.baseline_bin.is_none() {
        bail!("condition baseline needs --baseline-bin PATH");
    }
    // The fixed order, whatever order they were named in.
    Ok(CONDITIONS
        .iter()
        .copied()
        .filter(|(n, _)| wanted.iter().any(|w| w == n))
        .collect())
}

pub fn vm_bench(a: &VmBenchArgs) -> Result<()> {
    let t0 = std::time::Instant::now();
    let names: Vec<&str> = if a.topology.is_empty() {
        topology::NAMES.to_vec()
    } else {
        a.topology.iter().map(String::as_str).collect()
    };
    let mut topos = Vec::new();
    for name in &names {
        let mut topo = topology::by_name(name)
            .with_context(|| format!("unknown topology {name:?}; known: {}", topology::known()))?;
        topo.validate().map_err(anyhow::Error::msg)?;
        for n in &mut topo.nodes {
            n.mem_mib = n.mem_mib.max(4 * u64::from(a.mib));
        }
        topos.push(topo);
    }
    let conds = conditions(a)?;
    if a.shift >= a.window {
        bail!(
            "--shift ({}) must fall inside --window ({})",
            a.shift,
            a.window
        );
    }
    if a.boots == 0 {
        bail!("--boots must be at least 1");
    }
    let assets = assets::prepare(a.rebalancer_bin.as_deref(), &a.kernel_suite)?;
    let baseline = a
        .baseline_bin
        .as_ref()
        .map(|p| {
            p.canonicalize()
                .with_context(|| format!("--baseline-bin {}", p.display()))
        })
        .transpose()?;
    let numad = numad()?;

    let mut runs: Runs = Vec::new();
    let mut failures = Vec::new();
    for topo in &topos {
        let mut per_cond: Vec<(String, Vec<Row>)> = conds
            .iter()
            .map(|(c, _)| (c.to_string(), Vec::new()))
            .collect();
        let dir = assets::vm_dir().join(format!("bench-{}", topo.name));
        fs::create_dir_all(&dir)?;
        let rootfs = assets::stage(&dir, &assets, topo, &[])?;
        fs::create_dir_all(rootfs.join("vm/bench"))?;
        assets::copy_exec(
            &root().join("tests/vm/bench/mixed.sh"),
            &rootfs.join("vm/bench/mixed.sh"),
        )?;
        fs::write(
            rootfs.join("vm/bench.env"),
            format!(
                "MIB={}\nWINDOW={}\nSHIFT={}\nPERIOD_MS={}\nSAMPLE_S={:.3}\nLOCALITY={}\n",
                a.mib,
                a.window,
                a.shift,
                a.period_ms,
                f64::from(a.sample_ms) / 1000.0,
                if a.pagemap { "--pagemap" } else { "" }
            ),
        )?;
        if let Some(b) = &baseline {
            assets::copy_exec(b, &rootfs.join("bin/rebalancer-baseline"))?;
        }
        assets::copy_exec(&numad, &rootfs.join("bin/numad"))?;
        for lib in assets::shared_libs(&numad) {
            let to = rootfs.join(lib.strip_prefix("/").unwrap_or(&lib));
            fs::create_dir_all(to.parent().context("library path has a parent")?)?;
            assets::copy_exec(&lib, &to)?;
        }
        // One limit per condition: allocation, the window, and the daemon's start-up under TCG.
        let limit = a.window + 300;
        let mut list = String::new();
        for (c, _) in &conds {
            let name = format!("bench-{c}");
            let script = rootfs.join(format!("vm/scenarios/{name}.sh"));
            fs::write(&script, format!("exec sh /vm/bench/mixed.sh {c}\n"))?;
            fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
            list.push_str(&format!("{name} {limit}\n"));
        }
        fs::write(rootfs.join("vm/scenarios.list"), list)?;
        let initrd = assets::pack(&dir)?;
        let args = qemu::command_line(topo, &assets.kernel, &initrd);
        fs::write(
            dir.join("boot.sh"),
            format!("#!/bin/sh\nexec qemu-system-x86_64 {}\n", args.join(" ")),
        )?;
        let logs = assets::vm_dir().join("logs");
        fs::create_dir_all(&logs)?;
        let timeout = 120 + u64::from(limit) * conds.len() as u64;
        let head = format!(
            "Topology {} ({}), {} MiB per node; workload 3 busy hogs x {} MiB; window {} s, shift at {} s; rebalancer period {} ms.\n\n",
            topo.name, topo.about, topo.nodes[0].mem_mib, a.mib, a.window, a.shift, a.period_ms
        );
        let mut results = head.clone();
        for boot_no in 1..=a.boots {
            let log = logs.join(format!("bench-{}-{}.log", topo.name, super::now_stamp()));
            println!(
                "=== vm-bench: booting {} ({}; {} MiB per node), boot {boot_no} of {}, conditions: {}",
                topo.name,
                topo.about,
                topo.nodes[0].mem_mib,
                a.boots,
                conds.iter().map(|c| c.0).collect::<Vec<_>>().join(" ")
            );
            let tb = std::time::Instant::now();
            let boot = qemu::boot(
                &args,
                &log,
                Duration::from_secs(timeout),
                &format!("[bench {} #{boot_no}]", topo.name),
            )?;
            let console = verdict::parse(&boot.console);
            let rows: Vec<(&str, Result<Row, String>)> = conds
                .iter()
                .map(|(c, label)| {
                    let name = format!("bench-{c}");
                    let row = console
                        .sections
                        .iter()
                        .find(|s| s.name == name)
                        .ok_or_else(|| "the condition never started".to_string())
                        .and_then(|s| {
                            if let Some(v) = s.verdicts().into_iter().next() {
                                return Err(format!("{} {}", v.status, v.detail));
                            }
                            let (text, _) = s.data("bench").ok_or("no complete data block")?;
                            parse_block(&text).and_then(|r| summarize(&r))
                        });
                    (*label, row)
                })
                .collect();
            for ((c, _), (_, row)) in conds.iter().zip(&rows) {
                match row {
                    Ok(r) => per_cond
                        .iter_mut()
                        .find(|(n, _)| n == c)
                        .expect("every condition has a slot")
                        .1
                        .push(r.clone()),
                    Err(e) => failures.push(format!(
                        "{} boot {boot_no} {c}: {e} (log {})",
                        topo.name,
                        log.display()
                    )),
                }
            }
            if boot.timed_out || !console.done {
                failures.push(format!(
                    "{} boot {boot_no}: the guest did not finish (timeout {timeout}s); see {}",
                    topo.name,
                    log.display()
                ));
            }
            let md = table(&rows, a.window);
            results.push_str(&format!(
                "Boot {boot_no} (log {}):\n\n{md}\n",
                log.display()
            ));
            println!(
                "\n=== vm-bench {} boot {boot_no} ({:.0}s wall, guest {:.0}s; log: {})\n\n{md}",
                topo.name,
                tb.elapsed().as_secs_f64(),
                boot.seconds,
                log.display()
            );
        }
        fs::write(dir.join("results.md"), results)?;
        runs.push((topo.name.to_string(), per_cond));
        // The ranking so far, in case a later topology does not finish.
        fs::write(
            assets::vm_dir().join("bench-ratios.md"),
            ratio_table(&runs, a.boots),
        )?;
    }
    let ranking = ratio_table(&runs, a.boots);
    let out = assets::vm_dir().join("bench-ratios.md");
    fs::write(&out, &ranking)?;
    println!("\n=== vm-bench ranking ({})\n\n{ranking}", out.display());
    println!("=== vm-bench total {:.0}s", t0.elapsed().as_secs_f64());
    if !failures.is_empty() {
        bail!(
            "vm-bench: {} run(s) without data:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: &str = "\
cond=rebalancer mib=320 window=60 shift=30 period_ms=2000
sample t=0.1 pids=4 missing=0 pages=100 local_pages=0 local=0.0000 mig=0
sample t=2.1 pids=4 missing=0 pages=100 local_pages=50 local=0.5000 mig=50
sample t=4.1 pids=4 missing=0 pages=100 local_pages=96 local=0.9600 mig=96
shift t=30.0
sample t=30.0 pids=4 missing=0 pages=100 local_pages=60 local=0.6000 mig=96
sample t=36.1 pids=4 missing=0 pages=100 local_pages=100 local=1.0000 mig=136
result first_move_pin=1.30 first_move_shift=never pgmigrate=136 numa_pte_updates=0 numa_hint_faults=0 numa_pages_migrated=0 mgr=rebalancer mgr_cpu_ticks=150 mgr_total_ticks=450 mgr_alive=yes clk_tck=100
";

    /// Final locality, time to 95% after the pins and after the shift, pages migrated.
    type Want = (f64, Option<f64>, Option<f64>, u64);

    fn check(text: &str, want: Result<Want, &str>) {
        let got = parse_block(text).and_then(|r| summarize(&r));
        match (got, want) {
            (Ok(r), Ok((fin, t95, t95s, mig))) => {
                assert!((r.final_local - fin).abs() < 1e-9, "final {r:?}");
                let r2 = |t: Option<f64>| t.map(|t| (t * 100.0).round() / 100.0);
                assert_eq!((r2(r.t95), r2(r.t95_shift), r.pgmigrate), (t95, t95s, mig));
            }
            (Err(e), Err(w)) => assert!(e.contains(w), "error {e:?} lacks {w:?}"),
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn blocks_parse_and_summarise() {
        check(BLOCK, Ok((1.0, Some(4.1), Some(6.1), 136)));
        // Never reached: "never" both times.
        let never = BLOCK
            .replace("local_pages=96", "local_pages=10")
            .replace("local_pages=100 local=1", "local_pages=90 local=0.9");
        check(&never, Ok((0.9, None, None, 136)));
        // Today's lines: readings stamped mid-reading to 10 ms, with how long they took.
        let mid = "\
sample t=0.24 pids=3 missing=0 pages=100 local_pages=10 local=0.1000 mig=0 read_s=0.36
sample t=1.03 pids=3 missing=0 pages=100 local_pages=95 local=0.9500 mig=85 read_s=0.30
shift t=10.61
sample t=10.97 pids=3 missing=0 pages=100 local_pages=66 local=0.6600 mig=85 read_s=0.48
sample t=16.94 pids=3 missing=0 pages=100 local_pages=99 local=0.9900 mig=120 read_s=0.52
result pgmigrate=120 numa_pte_updates=0 numa_hint_faults=0 numa_pages_migrated=0 mgr=none mgr_cpu_ticks=na mgr_total_ticks=na mgr_alive=na clk_tck=100
";
        check(mid, Ok((0.99, Some(1.03), Some(6.33), 120)));
        check("cond=x\n", Err("no samples"));
        check(
            "sample t=1 pids=1 missing=0 pages=1 local_pages=1 mig=0\n",
            Err("no result line"),
        );
        check(
            "sample t=x pages=1\nresult pgmigrate=0\n",
            Err("bad sample"),
        );
        check(
            "sample t=1 pids=1 missing=0 pages=1 local_pages=1\nresult pgmigrate=zz\n",
            Err("not a number"),
        );
    }

    #[test]
    fn summary_details_and_table() {
        let r = summarize(&parse_block(BLOCK).unwrap()).unwrap();
        assert_eq!((r.mgr_cpu_s, r.mgr_total_s), (Some(1.5), Some(4.5)));
        assert_eq!((r.decision, r.decision_shift), (Some(1.3), None));
        let bad = BLOCK.replace("first_move_pin=1.30", "first_move_pin=soon");
        let e = summarize(&parse_block(&bad).unwrap()).unwrap_err();
        assert!(e.contains("first_move_pin"), "{e}");
        let old = BLOCK.replace("first_move_pin=1.30 first_move_shift=never ", "");
        let o = summarize(&parse_block(&old).unwrap()).unwrap();
        assert_eq!((o.decision, o.decision_shift), (None, None));
        assert_eq!(r.note, None);
        // Step-weighted mean: 0 for 2 s, .5 for 2 s, .96 for 25.9 s, .6 for 6.1 s, over 36 s.
        let want = (0.5 * 2.0 + 0.96 * 25.9 + 0.6 * 6.1) / 36.0;
        assert!((r.mean_local - want).abs() < 1e-9, "{}", r.mean_local);
        let died = BLOCK
            .replace(
                "missing=0 pages=100 local_pages=60",
                "missing=1 pages=100 local_pages=60",
            )
            .replace("mgr_alive=yes", "mgr_alive=no");
        let d = summarize(&parse_block(&died).unwrap()).unwrap();
        assert_eq!(
            d.note.as_deref(),
            Some("a workload process died; rebalancer exited during the window")
        );
        let kernel = BLOCK.replace(
            "numa_pte_updates=0 numa_hint_faults=0 numa_pages_migrated=0 mgr=rebalancer mgr_cpu_ticks=150 mgr_total_ticks=450 mgr_alive=yes",
            "numa_pte_updates=5 numa_hint_faults=7 numa_pages_migrated=3 mgr=none mgr_cpu_ticks=na mgr_total_ticks=na mgr_alive=na",
        );
        let k = summarize(&parse_block(&kernel).unwrap()).unwrap();
        let t = table(&[("A", Ok(r)), ("K", Ok(k)), ("X", Err("boom".into()))], 60);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert_eq!(
            lines[2],
            "| A | 100.0% | 82.0% | 4.1 s (1.3 + 2.8) | 6.1 s (no first move seen) | 136 | 1.50 s (4.50 s since start) | 0 / 0 |"
        );
        assert!(lines[3].contains("kernel (in the tasks)") && lines[3].ends_with("| 5 / 7 |"));
        assert_eq!(lines[4], "| X | no data: boom | | | | | | |");
    }

    #[test]
    fn medians_count_never_as_longest_and_ratios_rank() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![]), None);
        assert_eq!(median_time(&[Some(5.0), None, Some(7.0)]), Some(7.0));
        assert_eq!(median_time(&[None, None, Some(5.0)]), None);
        let row = |t95, shift, mean, pages| Row {
            final_local: 1.0,
            mean_local: mean,
            t95,
            t95_shift: shift,
            decision: t95.map(|t: f64| t / 2.0),
            decision_shift: None,
            pgmigrate: pages,
            pte_updates: 0,
            hint_faults: 0,
            mgr_cpu_s: None,
            mgr_total_s: None,
            mgr: "x".into(),
            note: None,
        };
        let an = vec![
            row(Some(10.0), Some(12.0), 0.90, 300),
            row(Some(12.0), Some(10.0), 0.88, 320),
            row(Some(11.0), None, 0.92, 310),
        ];
        let rb = vec![
            row(Some(5.0), Some(6.0), 0.95, 300),
            row(Some(6.0), Some(7.0), 0.93, 290),
            row(None, Some(5.0), 0.91, 280),
        ];
        let m = medians(&an).unwrap();
        assert_eq!(
            (m.t95, m.t95_shift, m.mean_local, m.pgmigrate),
            (Some(11.0), Some(12.0), 0.90, 310.0)
        );
        let t = ratio_table(
            &vec![(
                "2node".into(),
                vec![
                    ("autonuma".into(), an),
                    ("rebalancer".into(), rb),
                    ("baseline".into(), vec![]),
                ],
            )],
            3,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[4],
            "| 2node | kernel AutoNUMA | 3 | 11.0 s | 5.5 s / 5.5 s | 12.0 s | never / never | 90.0% | 310 |",
            "{t}"
        );
        // Decision and copy are medians of their own (a boot that never got there counts as
        // the longest), so they need not add up to the median time to 95%.
        assert_eq!(
            lines[5],
            "| 2node | rebalancer | 3 | 6.0 s → **0.55** | 3.0 s → 0.55 / 3.0 s → 0.55 | 6.0 s → **0.50** | never → — (both never) / never → — (both never) | 93.0% → **1.03** | 290 → **0.94** |",
            "{t}"
        );
        assert_eq!(lines[6], "| 2node | baseline | 0 | no data | | | | | |");
        assert_eq!(time_ratio(None, Some(1.0)), "∞ (never)");
    }
}

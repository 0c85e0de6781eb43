//! `mkcg`: make a cgroup the way a container runtime does — mkdir, then write its limits
//! (cpu.max, cpu.weight, memory.max …) at once — and measure how long until a daemon watching
//! the hierarchy has written its cpuset.cpus.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

/// Makes `dir`, writes each `FILE=VALUE` of `set` into it, then polls `cpuset.cpus` for up to
/// `wait_ms`. Prints one `MKCG dir=… written_us=<µs|none> cpus=… mems=…` line.
pub fn mkcg(dir: &Path, set: &[String], wait_ms: u64) -> Result<()> {
    let writes: Vec<(&str, &str)> = set
        .iter()
        .map(|s| {
            s.split_once('=')
                .with_context(|| format!("--set {s:?}: expected FILE=VALUE"))
        })
        .collect::<Result<_>>()?;
    if let Some((f, _)) = writes.iter().find(|(f, _)| f.contains('/')) {
        bail!("--set {f:?}: a file name, not a path");
    }
    let t0 = Instant::now();
    std::fs::create_dir(dir).with_context(|| format!("mkdir {}", dir.display()))?;
    for (f, v) in &writes {
        let p = dir.join(f);
        std::fs::write(&p, v).with_context(|| format!("writing {v:?} to {}", p.display()))?;
    }
    let set_us = t0.elapsed().as_micros();
    let cpus_file = dir.join("cpuset.cpus");
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let deadline = t0 + Duration::from_millis(wait_ms);
    let mut written = None;
    loop {
        if std::fs::read_to_string(&cpus_file).is_ok_and(|s| !s.trim().is_empty()) {
            written = Some(t0.elapsed().as_micros());
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let show = |s: String| if s.is_empty() { "-".to_string() } else { s };
    println!(
        "MKCG dir={} limits_us={set_us} written_us={} cpus={} mems={}",
        dir.display(),
        written.map_or("none".to_string(), |w| w.to_string()),
        show(read("cpuset.cpus")),
        show(read("cpuset.mems")),
    );
    Ok(())
}

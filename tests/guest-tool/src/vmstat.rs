//! `vmstat`: one /proc/vmstat counter sampled at a steady interval, each reading bracketed by
//! the wall clock read just before and just after it, so a check of "at most N within any
//! window" can use the widest span each pair of readings may have covered: a shell loop's
//! `date` and counter read are two processes apart, and a starved guest (page moves at nice
//! -10 on two CPUs) puts hundreds of milliseconds between them.

use std::{
    io::{Read, Seek, SeekFrom, Write},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};

/// UTC time of day, HH:MM:SS.nnnnnnnnn (the clock of the daemon's log lines).
fn stamp() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let s = d.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:09}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_nanos()
    )
}

fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Prints `BEFORE COUNT AFTER` every `interval_ms` until killed (or `seconds`).
pub fn run(key: &str, interval_ms: u64, nice: i32, seconds: f64) -> Result<()> {
    if nice != 0 {
        // SAFETY: plain syscall on this process.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            return Err(std::io::Error::last_os_error()).context("setpriority");
        }
    }
    let mut f = std::fs::File::open("/proc/vmstat").context("open /proc/vmstat")?;
    let mut buf = String::with_capacity(1 << 14);
    let mut out = std::io::stdout().lock();
    let start = Instant::now();
    let step = Duration::from_millis(interval_ms.max(1));
    let mut next = start;
    while start.elapsed().as_secs_f64() < seconds {
        buf.clear();
        f.seek(SeekFrom::Start(0))?;
        let before = stamp();
        f.read_to_string(&mut buf).context("read /proc/vmstat")?;
        let after = stamp();
        let Some(v) = counter(&buf, key) else {
            bail!("no {key} in /proc/vmstat");
        };
        writeln!(out, "{before} {v} {after}")?;
        out.flush()?;
        next += step;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    Ok(())
}

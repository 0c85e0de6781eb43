//! `guest-tool watch`: what a stalled loop waits for. The benchmark's reading loop writes a
//! heartbeat file every pass; when the file is older than `stale_ms`, this prints, without
//! spawning anything (a stall may be one of spawning processes): the load and pressure, how
//! each CPU spent the time since the loop was last fresh (/proc/stat: user, system, irq,
//! softirq, idle, steal), every task running or in uninterruptible sleep (R, D) with its
//! kernel stack, and every thread of the watched pids and of their descendants with its
//! state, the time it spent waiting for a CPU since the last report (schedstat) and its stack.
//! Apart from stalls, a thread of a watched process (not of its children) that has spent most
//! of 4 s or more in the kernel (a long migrate_pages(2), say) gets its CPU's backtrace printed
//! (sysrq `l`), every 5 s it stays so.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use anyhow::Result;

fn read(p: impl AsRef<Path>) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// (state, ppid, comm) of a task from its `stat`.
fn stat(dir: &Path) -> Option<(char, u32, String)> {
    let s = read(dir.join("stat"));
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s[open + 1..close].to_string();
    let mut rest = s[close + 1..].split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid, comm))
}

fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The thread ids of process `p`.
fn tids(p: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{p}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Per-CPU softirq counts from /proc/softirqs: (kind, per-CPU counts).
fn softirqs() -> Vec<(String, Vec<u64>)> {
    read("/proc/softirqs")
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut it = l.split_ascii_whitespace();
            let kind = it.next()?.trim_end_matches(':').to_string();
            Some((kind, it.filter_map(|x| x.parse().ok()).collect()))
        })
        .collect()
}

/// Asks every CPU for a backtrace of what it runs now (sysrq `l`) and returns the kernel log
/// lines that appeared since `kmsg` was opened or last read (non-blocking /dev/kmsg).
fn cpu_backtraces(kmsg: &mut Option<std::fs::File>) -> Vec<String> {
    use std::io::Read;
    let _ = std::fs::write("/proc/sysrq-trigger", "l");
    std::thread::sleep(Duration::from_millis(300));
    let Some(f) = kmsg.as_mut() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    // Each read returns one record; EAGAIN when none is left.
    while let Ok(n) = f.read(&mut buf) {
        if n == 0 {
            break;
        }
        let rec = String::from_utf8_lossy(&buf[..n]);
        if let Some((_, msg)) = rec.split_once(';') {
            out.push(msg.trim_end().to_string());
        }
    }
    out
}

/// Per-CPU jiffies from /proc/stat: name → [user, nice, system, idle, iowait, irq, softirq, steal].
fn cpu_times() -> BTreeMap<String, Vec<u64>> {
    read("/proc/stat")
        .lines()
        .filter(|l| l.starts_with("cpu"))
        .filter_map(|l| {
            let mut it = l.split_ascii_whitespace();
            let name = it.next()?.to_string();
            let v: Vec<u64> = it.take(8).filter_map(|x| x.parse().ok()).collect();
            (v.len() == 8).then_some((name, v))
        })
        .collect()
}

/// System time (clock ticks) of a task from its `stat`.
fn stime(dir: &Path) -> Option<u64> {
    let s = read(dir.join("stat"));
    s[s.rfind(')')? + 1..]
        .split_ascii_whitespace()
        .nth(12)?
        .parse()
        .ok()
}

/// The kernel log's NMI backtrace blocks (from "NMI backtrace for cpu" to the next) of the
/// CPU that ran thread `tid`.
fn blocks_of(lines: &[String], tid: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut block: Vec<String> = Vec::new();
    let pid = format!(" PID: {tid} ");
    let mut flush = |block: &mut Vec<String>| {
        if block.iter().any(|l| l.contains(&pid)) {
            out.append(block);
        }
        block.clear();
    };
    for l in lines {
        if l.starts_with("NMI backtrace for cpu") {
            flush(&mut block);
        }
        block.push(l.clone());
    }
    flush(&mut block);
    out
}

/// Every thread of the watched pids and of their descendants: (pid, tid, task dir).
fn watched_threads(watched: &[u32]) -> Vec<(u32, u32, std::path::PathBuf)> {
    let all = pids();
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    for &p in &all {
        if let Some((_, pp, _)) = stat(Path::new(&format!("/proc/{p}"))) {
            parent.insert(p, pp);
        }
    }
    let in_tree = |mut p: u32| -> bool {
        for _ in 0..64 {
            if watched.contains(&p) {
                return true;
            }
            match parent.get(&p) {
                Some(&pp) if pp != 0 => p = pp,
                _ => return false,
            }
        }
        false
    };
    let mut out = Vec::new();
    for &p in all.iter().filter(|&&p| in_tree(p)) {
        for t in tids(p) {
            out.push((p, t, format!("/proc/{p}/task/{t}").into()));
        }
    }
    out
}

fn stack(dir: &Path) -> String {
    read(dir.join("stack"))
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap_or(l))
        .take(12)
        .collect::<Vec<_>>()
        .join(" < ")
}

pub fn run(heartbeat: &Path, watched: &[u32], stale_ms: u64, seconds: f64) -> Result<()> {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let stale = Duration::from_millis(stale_ms);
    let mut last_report: Option<Instant> = None;
    let mut reports = 0;
    let mut reports_in_stall = 0;
    // Run-queue wait (ns) per thread at the last report.
    let mut waited: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    // CPU times and softirq counts when the heartbeat was last fresh.
    let mut fresh_times = cpu_times();
    let mut fresh_softirqs = softirqs();
    // The kernel log from now on (O_NONBLOCK, positioned at its end).
    let mut kmsg = {
        use std::{io::Seek, os::unix::fs::OpenOptionsExt};
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()
            .map(|mut f| {
                let _ = f.seek(std::io::SeekFrom::End(0));
                f
            })
    };
    // Per watched thread: (stime at the last look, since when it has been busy in the kernel,
    // when its backtrace was last printed).
    let mut busy: BTreeMap<u32, (u64, Option<Instant>, Option<Instant>)> = BTreeMap::new();
    let mut last_busy_look = Instant::now();
    let mut busy_dumps = 0;
    let tck = (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64;
    while Instant::now() < end && reports < 20 {
        std::thread::sleep(Duration::from_millis(200));
        if last_busy_look.elapsed() >= Duration::from_secs(1) {
            let dt = last_busy_look.elapsed().as_secs_f64();
            last_busy_look = Instant::now();
            let me = std::process::id();
            // Only the watched processes' own threads (the daemon's writers), not their
            // children's: a sysrq backtrace costs every CPU ~10 ms.
            let own = watched.iter().filter(|&&p| p != me);
            for (p, t) in own.flat_map(|&p| tids(p).into_iter().map(move |t| (p, t))) {
                let dir = std::path::PathBuf::from(format!("/proc/{p}/task/{t}"));
                let Some(now) = stime(&dir) else { continue };
                let entry = busy.entry(t).or_insert((now, None, None));
                let hot = (now.saturating_sub(entry.0) as f64 / tck) >= 0.5 * dt;
                entry.0 = now;
                if !hot {
                    entry.1 = None;
                    continue;
                }
                let since = *entry.1.get_or_insert_with(Instant::now);
                let long = since.elapsed() >= Duration::from_secs(4);
                let due = entry
                    .2
                    .is_none_or(|d| d.elapsed() >= Duration::from_secs(5));
                if long && due && busy_dumps < 12 {
                    busy_dumps += 1;
                    entry.2 = Some(Instant::now());
                    let (_, _, comm) = stat(&dir).unwrap_or(('?', 0, String::new()));
                    println!(
                        "WATCH busy {p}/{t} {comm}: mostly in the kernel for {:.0}s, syscall {}",
                        since.elapsed().as_secs_f64() + 1.0,
                        read(dir.join("syscall"))
                            .split_whitespace()
                            .next()
                            .unwrap_or("?")
                    );
                    for l in blocks_of(&cpu_backtraces(&mut kmsg), t) {
                        println!("WATCH   kmsg {l}");
                    }
                }
            }
        }
        let Ok(m) = std::fs::metadata(heartbeat).and_then(|m| m.modified()) else {
            continue;
        };
        let age = SystemTime::now().duration_since(m).unwrap_or_default();
        if age < stale {
            last_report = None;
            reports_in_stall = 0;
            fresh_times = cpu_times();
            fresh_softirqs = softirqs();
            continue;
        }
        if last_report.is_some_and(|t| t.elapsed() < Duration::from_secs(2)) {
            continue;
        }
        last_report = Some(Instant::now());
        reports += 1;
        let up = read("/proc/uptime");
        println!(
            "WATCH stale {:.1}s uptime {} load {}",
            age.as_secs_f64(),
            up.split_whitespace().next().unwrap_or("?"),
            read("/proc/loadavg").trim()
        );
        for r in ["cpu", "memory", "io"] {
            let p = read(format!("/proc/pressure/{r}"));
            if let Some(l) = p.lines().next() {
                println!("WATCH   psi {r}: {l}");
            }
        }
        for (cpu, now) in cpu_times() {
            let Some(then) = fresh_times.get(&cpu) else {
                continue;
            };
            let d: Vec<u64> = now
                .iter()
                .zip(then)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect();
            let total = d.iter().sum::<u64>().max(1) as f64;
            let pct = |i: usize| 100.0 * d[i] as f64 / total;
            println!(
                "WATCH   {cpu}: user {:.0}% system {:.0}% irq {:.0}% softirq {:.0}% idle {:.0}% steal {:.0}% ({} ticks)",
                pct(0) + pct(1),
                pct(2),
                pct(5),
                pct(6),
                pct(3) + pct(4),
                pct(7),
                total
            );
        }
        for ((kind, now), (_, then)) in softirqs().iter().zip(&fresh_softirqs) {
            let d: Vec<u64> = now
                .iter()
                .zip(then)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect();
            if d.iter().any(|&x| x > 0) {
                println!("WATCH   softirq {kind}: {d:?}");
            }
        }
        // What each CPU runs, once per stall (the first report) and at its 4th report.
        if reports_in_stall == 0 || reports_in_stall == 3 {
            for l in cpu_backtraces(&mut kmsg) {
                println!("WATCH   kmsg {l}");
            }
        }
        reports_in_stall += 1;
        let all = pids();
        let mine: std::collections::BTreeSet<u32> = watched_threads(watched)
            .into_iter()
            .map(|(p, _, _)| p)
            .collect();
        for &p in &all {
            let mine = mine.contains(&p);
            for t in tids(p) {
                let dir = std::path::PathBuf::from(format!("/proc/{p}/task/{t}"));
                let Some((state, _, comm)) = stat(&dir) else {
                    continue;
                };
                if !(mine || state == 'D' || state == 'R') {
                    continue;
                }
                let wait: u64 = read(dir.join("schedstat"))
                    .split_whitespace()
                    .nth(1)
                    .and_then(|w| w.parse().ok())
                    .unwrap_or(0);
                let before = waited.insert((p, t), wait);
                let dwait = before.map_or(String::from("-"), |b| {
                    format!("{}ms", wait.saturating_sub(b) / 1_000_000)
                });
                println!(
                    "WATCH   {p}/{t} {comm} {state} runq-wait+{dwait} wchan={} stack: {}",
                    read(dir.join("wchan")),
                    stack(&dir)
                );
            }
        }
    }
    Ok(())
}

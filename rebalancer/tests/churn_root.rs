//! Churn and soak: with a real daemon running (cgroup watcher on, eBPF
//! sampling on where it loads, a control round every second), container cgroups are created and
//! removed at `REBALANCER_CHURN_RATE` per second (default 200) for `REBALANCER_CHURN_SECS`
//! seconds (default 60). Half are removed at once (often before the watcher reaches them: the
//! vanish-before-admission race), half live 400 ms and must have their cpuset written by then.
//! Every 50th also gets a twin in the cgroup2 (unified) hierarchy running a short busy process,
//! so the eBPF programs create map entries for a cgroup that then disappears.
//!
//! Asserted, and printed:
//! - the rate achieved (≥ 90% of the target);
//! - no WARN or ERROR line in the daemon's log from the start of the churn until the end of
//!   the drain (nothing else happens in that window, so any such line is due to churn);
//! - the daemon stays alive;
//! - every long-lived container was answered (cpuset written before its removal) and every
//!   admission was released: at the end no binding or pod of the churn tree remains;
//! - no stale eBPF map entries: `rebalancer_ebpf_map_stale_entries` (entries of cgroups
//!   already removed) is 0 after the cleanup interval, and `rebalancer_ebpf_map_entries` is back
//!   at its pre-churn baseline (± live cgroups gaining an entry), and when eBPF ran the daemon
//!   deleted entries (`rebalancer_ebpf_map_deleted_entries`:
//!   the twins were seen, then cleaned up). The daemon's samplers count only its managed
//!   cgroups (the watch list): a removed container leaves the list at the next round and its
//!   entries are deleted at that round's read, so they are never left over as stale (the
//!   hierarchy-walk cleanup, two reads after a cgroup vanished, is for `sample` and `top`);
//! - VmRSS of the daemon grows < 5% from the end of warm-up (1/6 of the run) to the end.
mod common;

use std::{
    collections::VecDeque,
    path::PathBuf,
    time::{Duration, Instant},
};

use common::{assert_invariants, Daemon, KubeTree};
use rebalancer::cgroup::Version;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A busy process in a fresh cgroup2 cgroup at `rel` under the unified mount (the twin of a
/// container cgroup); returns the thread that waits for it and removes the cgroup.
fn twin(unified: PathBuf, rel: String) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let dir = unified.join(&rel);
        if std::fs::create_dir_all(&dir).is_err() {
            return;
        }
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                // Busy after 0.5 s: past its container's 400 ms life, while the daemon still
                // watches it if a round saw the container (the watch list changes at rounds).
                "read x; sleep 0.5; i=0; while [ $i -lt 8000 ]; do i=$((i+1)); done",
            ])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let _ = std::fs::write(dir.join("cgroup.procs"), child.id().to_string());
        drop(child.stdin.take()); // go
        let _ = child.wait();
        // The pod level is removed too (the container level first).
        for d in [dir.clone(), dir.parent().unwrap().to_path_buf()] {
            for _ in 0..100 {
                if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    })
}

#[test]
fn churn_of_200_cgroups_per_second_leaves_no_errors_leaks_or_stale_map_entries() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let secs = env_or("REBALANCER_CHURN_SECS", 60);
    let rate = env_or("REBALANCER_CHURN_RATE", 200).max(1);
    let unified = cg.mounts().v2.clone();
    let hybrid = cg
        .hierarchy(rebalancer::cgroup::Controller::Cpuset)
        .is_ok_and(|(_, v)| v == Version::V1)
        && unified.is_some();
    let mut tree = KubeTree::new(cg, "churn");
    let period_ms = 1000;
    let budget_mib = 1024;
    let mut d = Daemon::start(
        "",
        &format!(
            "{}[controller]\nperiod_ms = {period_ms}\nmigration_budget_mib = {budget_mib}\n",
            tree.cgroups_toml()
        ),
    );
    d.wait_rounds(2, Duration::from_secs(30));
    let log = d.log_text();
    let source = log
        .lines()
        .find(|l| l.contains("CPU time source"))
        .unwrap_or("")
        .to_string();
    println!("daemon: {source}");
    let ebpf = source.contains("ebpf");
    let baseline = d.metric("rebalancer_ebpf_map_entries");
    let log_start = log.len();

    // Twins (eBPF map entries) only where a cgroup2 hierarchy sits beside a v1 cpuset or
    // is the cpuset hierarchy itself (then the container cgroup is its own twin: it gets the
    // process directly).
    let twins_root = if hybrid { unified.clone() } else { None };
    let burstable = tree.burstable.clone();

    // A monitor thread samples the daemon once a second (RSS, map entries, liveness) so the
    // churn loop never waits for it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (pid, port) = (d.pid(), d.metrics_port);
    let cpu_start = common::cpu_secs_of(pid).unwrap_or(0.0);
    let t0 = Instant::now();
    let monitor = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut samples: Vec<(Duration, u64, Option<f64>, Option<f64>)> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Some(rss) = common::rss_kb_of(pid) else {
                    break; // died: the main thread reports it
                };
                let m = common::metrics_at(port);
                let entries = common::metric_value(&m, "rebalancer_ebpf_map_entries");
                let stale = common::metric_value(&m, "rebalancer_ebpf_map_stale_entries");
                samples.push((t0.elapsed(), rss, entries, stale));
                std::thread::sleep(Duration::from_secs(1));
            }
            samples
        })
    };
    let warmup = Duration::from_secs((secs / 6).max(1));
    let tick = Duration::from_millis(10);
    // At most a tenth of a second's cgroups at once, so the removals keep their pace too.
    let burst = (rate / 10).max(1);
    let mut made = 0u64;
    // (remove at, pod rel, container rel, must be answered)
    let mut pending: VecDeque<(Instant, String, String, bool)> = VecDeque::new();
    let (mut answered, mut unanswered, mut late) = (0u64, 0u64, 0u64);
    let mut next_check = t0;
    let mut twin_threads = Vec::new();
    let mut retry: Vec<(Instant, String, String)> = Vec::new();
    let mut next_tick = t0;
    let (mut t_create, mut t_remove) = (Duration::ZERO, Duration::ZERO);
    while t0.elapsed() < Duration::from_secs(secs) {
        // What is due follows the wall clock, not the loop's iterations: an iteration longer
        // than the tick is caught up on by the next ones, so the rate achieved measures the
        // churn (the host and the daemon), not this loop's own pace.
        let due = (rate as f64 * t0.elapsed().as_secs_f64()) as u64;
        for _ in 0..due.saturating_sub(made).min(burst) {
            made += 1;
            let uid = format!("c0ffee00-0000-4000-8000-{made:012}");
            let id = format!("{:064x}", made);
            let tc = Instant::now();
            let (pod, c) = tree.pod_with_container(&uid, &id);
            t_create += tc.elapsed();
            let long = made.is_multiple_of(2);
            let life = if long { 400 } else { 0 };
            pending.push_back((Instant::now() + Duration::from_millis(life), pod, c, long));
            if made.is_multiple_of(50) {
                if let Some(u) = &twins_root {
                    twin_threads.push(twin(u.clone(), format!("{burstable}/pod{uid}/{id}")));
                }
            }
        }
        let now = Instant::now();
        let tr = Instant::now();
        while pending.front().is_some_and(|p| p.0 <= now) {
            let (_, pod, c, long) = pending.pop_front().unwrap();
            if long {
                let written = std::fs::read_to_string(tree.mount.join(&c).join("cpuset.cpus"))
                    .is_ok_and(|s| !s.trim().is_empty());
                if !written {
                    // Grace: look again for up to 5 s before calling it unanswered.
                    retry.push((now + Duration::from_secs(5), pod, c));
                    continue;
                }
                answered += 1;
            }
            tree.rmdir(&c).expect("rmdir container");
            tree.rmdir(&pod).expect("rmdir pod");
        }
        retry.retain(|(deadline, pod, c)| {
            let written = std::fs::read_to_string(tree.mount.join(c).join("cpuset.cpus"))
                .is_ok_and(|s| !s.trim().is_empty());
            if written || now >= *deadline {
                if written {
                    late += 1;
                } else {
                    unanswered += 1;
                }
                tree.rmdir(c).expect("rmdir container");
                tree.rmdir(pod).expect("rmdir pod");
                false
            } else {
                true
            }
        });
        t_remove += tr.elapsed();
        if now >= next_check {
            assert!(d.alive(), "daemon died during churn:\n{}", d.log_text());
            tree.forget_removed();
            next_check += Duration::from_secs(1);
        }
        next_tick += tick;
        if let Some(wait) = next_tick.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let churn_time = t0.elapsed();
    let cpu_used = common::cpu_secs_of(pid).unwrap_or(0.0) - cpu_start;
    // Drain: remove what is left.
    for (_, pod, c, long) in pending.drain(..) {
        if long {
            if std::fs::read_to_string(tree.mount.join(&c).join("cpuset.cpus"))
                .is_ok_and(|s| !s.trim().is_empty())
            {
                answered += 1;
            } else {
                late += 1; // removed before its 400 ms were up
            }
        }
        tree.rmdir(&c).unwrap();
        tree.rmdir(&pod).unwrap();
    }
    for (_, pod, c) in retry.drain(..) {
        unanswered += 1;
        tree.rmdir(&c).unwrap();
        tree.rmdir(&pod).unwrap();
    }
    for t in twin_threads {
        t.join().unwrap();
    }
    if let Some(u) = &twins_root {
        for rel in [
            burstable.clone(),
            format!("{}/kubepods", tree.prefix),
            tree.prefix.clone(),
        ] {
            let _ = std::fs::remove_dir(u.join(rel));
        }
    }

    // Every admission released: no binding or pod of the churn tree left.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let st = d.status();
        let left = st["bindings"]
            .as_object()
            .map(|b| b.keys().filter(|k| k.starts_with(&tree.prefix)).count())
            .unwrap_or(0);
        let pods = st["pods"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter(|p| p["uid"].as_str().is_some_and(|u| u.starts_with("c0ffee00")))
                    .count()
            })
            .unwrap_or(0);
        if left == 0 && pods == 0 {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "{left} bindings and {pods} pods of the churn tree never released"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The cleanup interval of the eBPF maps: two rounds that find a cgroup gone, plus one.
    d.wait_rounds(3, Duration::from_secs(30));
    let end_entries = d.metric("rebalancer_ebpf_map_entries");
    let end_stale = d.metric("rebalancer_ebpf_map_stale_entries");
    let deleted = d.metric("rebalancer_ebpf_map_deleted_entries_total");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = monitor.join().unwrap();
    let mut rss: Vec<(Duration, u64)> = samples.iter().map(|s| (s.0, s.1)).collect();
    rss.push((t0.elapsed(), d.rss_kb()));
    let peak_entries = samples
        .iter()
        .filter_map(|s| s.2)
        .fold(baseline.unwrap_or(0.0), f64::max);
    let peak_stale = samples.iter().filter_map(|s| s.3).fold(0.0, f64::max);
    assert!(d.alive(), "daemon died:\n{}", d.log_text());

    let log = d.log_text();
    // Only this tree's cgroups (another test's daemon may run on this host).
    let count = |what: &str| {
        log[log_start..]
            .lines()
            .filter(|l| l.contains(what) && l.contains(&tree.prefix))
            .count()
    };
    let admitted = count("container cgroup admitted");
    let released = count("container cgroup removed; released");
    let start_rss = rss
        .iter()
        .find(|(t, _)| *t >= warmup)
        .map(|r| r.1)
        .unwrap_or(rss[0].1);
    let peak_rss = rss
        .iter()
        .filter(|(t, _)| *t >= warmup)
        .map(|r| r.1)
        .max()
        .unwrap_or(start_rss);
    let end_rss = rss.last().unwrap().1;
    let growth = (end_rss as f64 - start_rss as f64) / start_rss as f64 * 100.0;
    let achieved = made as f64 / churn_time.as_secs_f64();
    println!(
        "churn: {made} container cgroups (+{made} pod cgroups) in {:.1} s = {achieved:.1}/s (target {rate}/s)",
        churn_time.as_secs_f64()
    );
    println!(
        "test loop: {:.1} s creating, {:.1} s removing; daemon CPU {cpu_used:.1} s during the churn",
        t_create.as_secs_f64(),
        t_remove.as_secs_f64(),
    );
    println!(
        "watcher: {admitted} admitted, {released} released; long-lived answered {answered}, late {late}, unanswered {unanswered}"
    );
    println!(
        "RSS: start {start_rss} kB (after {} s warm-up), peak {peak_rss} kB, end {end_rss} kB, growth {growth:+.2}%",
        warmup.as_secs()
    );
    println!(
        "eBPF map entries: baseline {baseline:?}, peak {peak_entries}, end {end_entries:?}; of removed cgroups: peak {peak_stale}, end {end_stale:?}, deleted {deleted:?} (twins {})",
        if twins_root.is_some() { "on" } else { "off" }
    );

    let bad = common::warnings(&log[log_start..]);
    assert!(
        bad.is_empty(),
        "{} WARN/ERROR lines during churn, e.g.:\n{}",
        bad.len(),
        bad.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    assert!(
        achieved >= rate as f64 * 0.9,
        "churn rate {achieved:.1}/s below 90% of {rate}/s"
    );
    assert_eq!(unanswered, 0, "long-lived containers never given a cpuset");
    assert_eq!(
        admitted, released,
        "every admission is released once its cgroup is gone"
    );
    if ebpf {
        assert_eq!(
            end_stale,
            Some(0.0),
            "stale eBPF map entries (of removed cgroups) after the cleanup interval"
        );
        let (b, e) = (baseline.unwrap(), end_entries.unwrap());
        // Live cgroups (the root, others' on this host) may gain an entry meanwhile (a first
        // migration, a page-migration reason); the removed ones' are all gone (stale = 0).
        assert!(
            e <= b + 2.0,
            "map entries grew from {b} to {e} over churn of removed cgroups"
        );
        if twins_root.is_some() {
            // The twins were counted while watched and their entries deleted once their
            // containers were gone (the entries gauge, read after each read's deletions, need
            // not show them).
            assert!(
                deleted.is_some_and(|n| n > 0.0),
                "twins with busy processes never showed up in the eBPF maps (deleted {deleted:?})"
            );
        }
    } else {
        println!("eBPF not running here: map entries not checked ({source})");
    }
    assert!(
        growth < 5.0,
        "RSS grew {growth:.2}% ({start_rss} → {end_rss} kB)"
    );
    assert_invariants(&tree, &status, None, budget_mib);
    let st = d.signal_and_wait(libc::SIGTERM);
    assert!(st.success(), "daemon exit {st}");
    assert_invariants(&tree, &status, d.checkpoint().as_ref(), budget_mib);
}

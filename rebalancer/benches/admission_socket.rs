//! Admission load over the real unix socket of a real daemon process (`rebalancer run`, release
//! build, EPYC NPS4 fixture topology: 8 nodes, 128 CPUs; dry-run, eBPF off): 1,000 pod admissions
//! (a fixed mix of Guaranteed 1–4 CPU, Burstable and BestEffort pods), each followed, once 48 pods
//! are live, by the release of the oldest — so the allocator stays about half full, as on a busy
//! node. Each request is timed at the client, connect to last byte (one connection per request,
//! as the CLI and kubelet-side clients do). Prints p50 / p90 / p99 / max for admissions and for
//! releases, and whether the p99 target (< 2 ms, PRODUCT.md) is met.
//!
//! Every admission is checkpointed (fsync of the file and its directory) before it is answered,
//! so the checkpoint's filesystem sets the floor: the run is made twice, with the state directory
//! on tmpfs (/dev/shm, as the default /run/rebalancer is on a systemd host) and on the disk
//! (/var/tmp).
//!
//! `cargo bench -p rebalancer --bench admission_socket` (as root, or with socket access).
//! `REBALANCER_ADMISSIONS=N` changes the count. The rate limit is off in this daemon's config
//! (`server.requests_per_second = 0`): it is policy, not latency.
use std::{
    collections::VecDeque,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use rebalancer::serve::client;

fn pod(i: usize) -> String {
    let uid = format!("bench-{i}");
    let g = |cpus: u64, mem_gib: u64| {
        format!(
            r#"{{"uid":"{uid}","containers":[{{"name":"c","cpu_request_millis":{m},"cpu_limit_millis":{m},"memory_bytes":{b},"memory_limit_bytes":{b}}}]}}"#,
            m = cpus * 1000,
            b = mem_gib << 30
        )
    };
    match i % 8 {
        0 | 1 => g(1, 1),
        2 => g(2, 2),
        3 => g(4, 4),
        4 | 5 => format!(
            r#"{{"uid":"{uid}","containers":[{{"name":"app","cpu_request_millis":500,"cpu_limit_millis":2000,"memory_bytes":536870912}},{{"name":"sidecar","cpu_request_millis":100}}]}}"#
        ),
        _ => format!(r#"{{"uid":"{uid}","containers":[{{"name":"c"}}]}}"#),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(what: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{what:<10} n={:<5} p50={:>7.0} µs  p90={:>7.0} µs  p99={:>7.0} µs  max={:>7.0} µs",
        v.len(),
        us(percentile(&v, 0.50)),
        us(percentile(&v, 0.90)),
        us(percentile(&v, 0.99)),
        us(*v.last().unwrap()),
    );
    percentile(&v, 0.99)
}

fn timed(sock: &Path, method: &str, target: &str, body: Option<&[u8]>) -> (u16, Duration, String) {
    let t0 = Instant::now();
    let (code, text) = client::request(sock, method, target, body).expect("request");
    let took = t0.elapsed();
    assert!(code < 500, "{method} {target}: {code} {text}");
    (code, took, text)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with no argument: keep
    // that quick.
    let benching = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("REBALANCER_ADMISSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 1000 } else { 50 });
    for (fs, parent) in [("tmpfs", "/dev/shm"), ("disk", "/var/tmp")] {
        if !Path::new(parent).is_dir() {
            println!("SKIP state on {fs}: no {parent}");
            continue;
        }
        println!("--- checkpoint on {fs} ({parent})");
        run(n, Path::new(parent));
    }
}

fn run(n: usize, state_parent: &Path) {
    let dir = tempfile::Builder::new()
        .prefix("rb-admit-bench")
        .tempdir_in(state_parent)
        .unwrap();
    let sock = dir.path().join("api.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.path().join("c.toml");
    // Non-root: let the caller's own group through the peer check.
    let group = if unsafe { libc::geteuid() } == 0 {
        String::new()
    } else {
        let gid = unsafe { libc::getegid() };
        let name = unsafe { std::ffi::CStr::from_ptr((*libc::getgrgid(gid)).gr_name) };
        format!("socket_group = \"{}\"\n", name.to_string_lossy())
    };
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ndry_run = true\nlog_level = \"warn\"\nstate_dir = \"{}\"\n[ebpf]\nenabled = false\n[server]\nsocket = \"{}\"\nmetrics_listen = \"127.0.0.1:{port}\"\nrequests_per_second = 0\n{group}",
            dir.path().join("state").display(),
            sock.display()
        ),
    )
    .unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/epyc-nps4");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["run", "--config"])
        .arg(&cfg)
        .arg("--sysfs-root")
        .arg(&fixture)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the daemon");
    let deadline = Instant::now() + Duration::from_secs(30);
    while client::request(&sock, "GET", "/v1/status", None).is_err() {
        assert!(
            daemon.try_wait().unwrap().is_none(),
            "the daemon exited early"
        );
        assert!(Instant::now() < deadline, "the daemon never answered");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Warm-up (connection path, allocator, checkpoint file): not measured.
    for i in 0..20 {
        timed(
            &sock,
            "POST",
            "/v1/admit",
            Some(pod(1_000_000 + i).as_bytes()),
        );
        timed(
            &sock,
            "DELETE",
            &format!("/v1/pods/bench-{}", 1_000_000 + i),
            None,
        );
    }

    let mut admits = Vec::with_capacity(n);
    let mut releases = Vec::with_capacity(n);
    let mut live = VecDeque::new();
    let mut rejected = 0;
    let mut first_rejection = None;
    let t0 = Instant::now();
    for i in 0..n {
        let (code, took, text) = timed(&sock, "POST", "/v1/admit", Some(pod(i).as_bytes()));
        admits.push(took);
        match code {
            200 => live.push_back(i),
            409 => {
                rejected += 1;
                if first_rejection.is_none() {
                    first_rejection = Some(format!("pod {i}: {text}"));
                }
            }
            c => panic!("admission {i}: unexpected status {c}"),
        }
        if live.len() > 48 {
            let old = live.pop_front().unwrap();
            let (code, took, _) = timed(&sock, "DELETE", &format!("/v1/pods/bench-{old}"), None);
            assert_eq!(code, 200, "release of bench-{old}");
            releases.push(took);
        }
    }
    let wall = t0.elapsed();
    let _ = daemon.kill();
    let _ = daemon.wait();

    println!(
        "admission load over the unix socket: {n} admissions ({rejected} rejected with 409), {} releases, {:.2} s wall",
        releases.len(),
        wall.as_secs_f64()
    );
    if let Some(r) = first_rejection {
        println!("first rejection: {r}");
    }
    let p99 = report("admit", admits);
    if !releases.is_empty() {
        report("release", releases);
    }
    println!(
        "target p99 < 2 ms: {}",
        if p99 < Duration::from_millis(2) {
            "met"
        } else {
            "NOT met"
        }
    );
}

//! A real Prometheus server (Debian package `prometheus`) scrapes a real running daemon, and a
//! `rebalancer_` metric is read back through Prometheus's HTTP query API; every metric name
//! the Grafana dashboard and the alert rules use has series in what Prometheus stored (as
//! root, with a managed workload so the per-cgroup series exist too).
//! Skips with a printed reason when the `prometheus` binary is absent (`cargo xtask setup`
//! installs it).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn prometheus_bin() -> Option<String> {
    ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .map(|p| p.to_string())
}

/// A cgroup the daemon manages (a child of a configured root, in the cpuset, cpu and memory
/// hierarchies) with a process in it that spins over memory it touched there, so a round
/// scores it and the per-cgroup series exist. Removed when dropped.
struct Workload {
    dirs: Vec<std::path::PathBuf>,
    child: Option<Child>,
    root: String,
}

impl Workload {
    /// None (with the reason printed) when cgroups cannot be made here.
    fn start() -> Option<Workload> {
        use rebalancer::cgroup::{Cgroups, Controller, Version};
        if unsafe { libc::geteuid() } != 0 {
            println!("not root: no managed cgroup, so the per-cgroup series are not checked");
            return None;
        }
        let cg = Cgroups::detect(
            std::path::Path::new("/sys/fs/cgroup"),
            std::path::Path::new("/proc/self/mountinfo"),
        )
        .ok()?;
        let root = format!("rbt-scrape-{}", std::process::id());
        let mut w = Workload {
            dirs: Vec::new(),
            child: None,
            root: root.clone(),
        };
        let mut procs = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for c in [Controller::Cpuset, Controller::Cpu, Controller::Memory] {
            let Ok((mount, version)) = cg.hierarchy(c).map(|(p, v)| (p.to_path_buf(), v)) else {
                continue;
            };
            if !seen.insert(mount.clone()) {
                continue;
            }
            for rel in [root.clone(), format!("{root}/w")] {
                let d = mount.join(&rel);
                std::fs::create_dir(&d).ok()?;
                w.dirs.push(d.clone());
                if c == Controller::Cpuset && version == Version::V1 {
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        let v = std::fs::read_to_string(mount.join(f)).ok()?;
                        std::fs::write(d.join(f), v.trim()).ok()?;
                    }
                }
                if c == Controller::Cpuset && version == Version::V2 {
                    let _ = cg.enable_cpuset_v2(&rel);
                }
            }
            procs.push(mount.join(&root).join("w/cgroup.procs"));
        }
        // moves itself in first, then touches 8 MB (charged there) and spins
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"for f; do echo $$ > "$f"; done; x=$(head -c 8000000 /dev/zero | tr '\0' a); while :; do :; done"#)
            .arg("sh")
            .args(&procs)
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        w.child = Some(child);
        Some(w)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.dirs
            .sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in &self.dirs {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn prometheus_scrapes_the_daemon() {
    let Some(prom) = prometheus_bin() else {
        println!("SKIP: prometheus binary not installed (apt-get install prometheus; `cargo xtask setup` does it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let cfg = dir.path().join("rebalancer.toml");
    let workload = Workload::start();
    let roots = workload
        .as_ref()
        .map(|w| format!("[cgroups]\nroots = [\"{}\"]\n", w.root))
        .unwrap_or_default();
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ndry_run = true\nstate_dir = \"{}\"\n[ebpf]\nenabled = false\n[server]\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\nsocket = \"{}\"\n[controller]\nperiod_ms = 500\n{roots}",
            dir.path().join("state").display(),
            dir.path().join("api.sock").display()
        ),
    )
    .unwrap();
    let mut daemon = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_rebalancer"))
            .args(["run", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start rebalancer"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_get(metrics_port, "/healthz").is_none_or(|b| !b.contains("ok")) {
        if let Ok(Some(status)) = daemon.0.try_wait() {
            panic!("rebalancer run exited early with {status} (its stderr is above)");
        }
        assert!(
            Instant::now() < deadline,
            "daemon did not serve /healthz on port {metrics_port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let prom_port = free_port();
    let prom_cfg = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: rebalancer\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        ),
    )
    .unwrap();
    let _prom = KillOnDrop(
        Command::new(prom)
            .arg(format!("--config.file={}", prom_cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        if let Some(body) = http_get(prom_port, "/api/v1/query?query=rebalancer_managed_cgroups") {
            if body.contains("\"status\":\"success\"") && body.contains("\"job\":\"rebalancer\"") {
                println!("prometheus answered: {}", body.lines().last().unwrap_or(""));
                break;
            }
            last = body;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never returned rebalancer_managed_cgroups; last answer:\n{last}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The scrape itself must be healthy.
    let up = http_get(
        prom_port,
        "/api/v1/query?query=up%7Bjob%3D%22rebalancer%22%7D",
    )
    .unwrap_or_default();
    assert!(up.contains("\"1\""), "target not up: {up}");

    // Every metric the dashboard and the alert rules name has series in what Prometheus
    // scraped from this fresh daemon: a family known only by its `# TYPE` line stores nothing,
    // and an alert or panel on it would see no data rather than 0.
    // Per-cgroup series exist only for managed cgroups a round scored: waited for (a few
    // rounds) where the test could make one, left out of the check where it could not.
    let per_cgroup = [
        "rebalancer_cgroup_locality_ratio",
        "rebalancer_cgroup_remote_access_ratio",
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let names = loop {
        let names = http_get(prom_port, "/api/v1/label/__name__/values").unwrap_or_default();
        if workload.is_none() || per_cgroup.iter().all(|n| names.contains(n)) {
            break names;
        }
        assert!(
            Instant::now() < deadline,
            "no per-cgroup series for the managed workload; Prometheus's names: {names}\n{}",
            http_get(metrics_port, "/metrics").unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut stored = named_metrics(&names);
    if workload.is_none() {
        stored.extend(per_cgroup.map(String::from));
    }
    assert!(
        stored.contains("rebalancer_managed_cgroups"),
        "Prometheus's metric names: {names}"
    );
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut missing = Vec::new();
    for file in [
        "config/grafana-dashboard.json",
        "config/prometheus/rules.yaml",
        "config/kubernetes/prometheusrule.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let named = named_metrics(&text);
        assert!(
            named.len() > 3,
            "{file} names few rebalancer_ metrics: {named:?}"
        );
        missing.extend(
            named
                .iter()
                .filter(|n| !stored.contains(*n))
                .map(|n| format!("{file}: {n}")),
        );
        println!("{file}: {} metric names", named.len());
    }
    assert!(
        missing.is_empty(),
        "named but without series in a real scrape: {missing:#?}"
    );
    drop(daemon);
}

/// Every `rebalancer_…` identifier in a text (a dashboard's expressions, a rule file, the
/// names Prometheus stored): the metric names it uses.
fn named_metrics(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("rebalancer_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let before = rest[..i].chars().last();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

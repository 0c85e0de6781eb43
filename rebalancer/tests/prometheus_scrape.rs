//! A real Prometheus server (Debian package `prometheus`) scrapes a real running daemon, and a
//! `rebalancer_` metric is read back through Prometheus's HTTP query API.
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

#[test]
fn prometheus_scrapes_the_daemon() {
    let Some(prom) = prometheus_bin() else {
        println!("SKIP: prometheus binary not installed (apt-get install prometheus; `cargo xtask setup` does it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let cfg = dir.path().join("rebalancer.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ndry_run = true\nstate_dir = \"{}\"\n[ebpf]\nenabled = false\n[server]\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\nsocket = \"{}\"\n",
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
    drop(daemon);
}

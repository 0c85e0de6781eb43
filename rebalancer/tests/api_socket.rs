//! The admission API over a real unix socket of a real daemon process (on the EPYC NPS4
//! fixture topology): admit, reject with a reason, release, malformed bodies → 4xx with no state
//! change, and a non-root client refused (by the socket's mode, and by SO_PEERCRED).

use std::{
    io::{Read, Write},
    os::unix::{net::UnixStream, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

struct Daemon {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sysfs")
        .join(name)
}

fn start(sysfs: &str, extra: &str) -> Daemon {
    let dir = tempfile::Builder::new()
        .prefix("rb-api")
        .tempdir_in("/tmp")
        .unwrap();
    let socket = dir.path().join("api.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\ndry_run = true\nstate_dir = \"{}\"\n[ebpf]\nenabled = false\n[server]\nsocket = \"{}\"\nmetrics_listen = \"127.0.0.1:{port}\"\n{extra}",
            dir.path().join("state").display(),
            socket.display()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["run", "--config"])
        .arg(&cfg)
        .arg("--sysfs-root")
        .arg(fixture(sysfs))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut d = Daemon {
        child,
        socket,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(&d.socket).is_err() {
        if let Ok(Some(st)) = d.child.try_wait() {
            panic!("daemon exited early: {st}");
        }
        assert!(Instant::now() < deadline, "daemon socket never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    d
}

fn req(sock: &Path, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let mut s = UnixStream::connect(sock).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (
        code,
        serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_string())),
    )
}

const GUARANTEED_4: &str = r#"{"uid":"pod-g","containers":[{"name":"db","cpu_request_millis":4000,"cpu_limit_millis":4000,"memory_bytes":1073741824,"memory_limit_bytes":1073741824}]}"#;

#[test]
fn admit_reject_release_and_malformed_requests() {
    let d = start("epyc-nps4", "[placement]\npolicy = \"single-numa-node\"\n");
    let (code, status0) = req(&d.socket, "GET", "/v1/status", "");
    assert_eq!(code, 200);

    let (code, body) = req(&d.socket, "POST", "/v1/admit", GUARANTEED_4);
    assert_eq!(code, 200, "{body}");
    let c = &body["containers"][0];
    assert_eq!(c["exclusive"], true);
    assert_eq!(c["cpus"].as_array().unwrap().len(), 4);
    assert_eq!(
        c["mems"].as_array().unwrap().len(),
        1,
        "single-numa-node gives one node: {body}"
    );

    // A pod no single node can hold (a node has 16 CPUs) is rejected with kubelet's reason.
    let big = r#"{"uid":"pod-big","containers":[{"name":"x","cpu_request_millis":20000,"cpu_limit_millis":20000,"memory_bytes":1024,"memory_limit_bytes":1024}]}"#;
    let (code, body) = req(&d.socket, "POST", "/v1/admit", big);
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["reason"], "TopologyAffinityError", "{body}");

    // Same uid twice is refused, not double-allocated.
    let (code, _) = req(&d.socket, "POST", "/v1/admit", GUARANTEED_4);
    assert_eq!(code, 409);

    let (_, status1) = req(&d.socket, "GET", "/v1/status", "");
    for (bad, want) in [
        ("{", 400),
        (r#"{"uid":"u","containers":[{"name":"a","cpu":1}]}"#, 400),
        (
            r#"{"uid":"u","containers":[{"name":"a","cpu_request_millis":2000,"cpu_limit_millis":1000}]}"#,
            422,
        ),
        ("[]", 400),
    ] {
        let (code, body) = req(&d.socket, "POST", "/v1/admit", bad);
        assert_eq!(code, want, "{bad} → {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
    }
    let huge = format!(r#"{{"uid":"{}","containers":[]}}"#, "x".repeat(100_000));
    let (code, _) = req(&d.socket, "POST", "/v1/admit", &huge);
    assert_eq!(code, 413);
    let (_, status2) = req(&d.socket, "GET", "/v1/status", "");
    assert_eq!(
        status1["pods"], status2["pods"],
        "bad requests changed the state"
    );

    let (code, _) = req(&d.socket, "DELETE", "/v1/pods/pod-g", "");
    assert_eq!(code, 200);
    let (code, _) = req(&d.socket, "DELETE", "/v1/pods/pod-g", "");
    assert_eq!(code, 404);
    let (_, status3) = req(&d.socket, "GET", "/v1/status", "");
    assert_eq!(status0["pods"], status3["pods"]);
    assert_eq!(status3["exclusive_cpus"], serde_json::json!([]));

    let (code, _) = req(&d.socket, "GET", "/v1/explain/a/../../etc", "");
    assert_eq!(code, 400);
}

#[test]
fn the_cli_client_admits_and_reports_rejections() {
    let d = start("epyc-nps4", "");
    let dir = tempfile::tempdir().unwrap();
    let pod = dir.path().join("pod.json");
    std::fs::write(&pod, GUARANTEED_4).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["admit", "--pod"])
        .arg(&pod)
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"exclusive\":true"));
    let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["admit", "--pod"])
        .arg(&pod)
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "a rejection exits 3");
    let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["status", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("pod-g/db"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn non_root_clients_are_refused() {
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: needs root to run a client as another user");
        return;
    }
    let d = start("epyc-nps4", "");
    // The socket's own mode (0600, root) keeps other users out at connect().
    let as_nobody = |sock: &Path| {
        Command::new(env!("CARGO_BIN_EXE_rebalancer"))
            .args(["status", "--json", "--socket"])
            .arg(sock)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let out = as_nobody(&d.socket);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Even if the mode were loosened (or the directory shared), SO_PEERCRED refuses the peer.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let dirmode = std::fs::metadata(d.socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    std::fs::set_permissions(
        d.socket.parent().unwrap(),
        std::fs::Permissions::from_mode(dirmode | 0o011),
    )
    .unwrap();
    let out = as_nobody(&d.socket);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("permission denied"),
        "stdout={stdout} stderr={}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_client_past_its_rate_limit_gets_429_then_is_served_again() {
    let d = start("epyc-nps4", "requests_per_second = 5\n");
    let answers: Vec<(u16, serde_json::Value)> = (0..20)
        .map(|_| req(&d.socket, "GET", "/v1/status", ""))
        .collect();
    let codes: Vec<u16> = answers.iter().map(|a| a.0).collect();
    let served = codes.iter().filter(|&&c| c == 200).count();
    let limited: Vec<&serde_json::Value> = answers
        .iter()
        .filter(|a| a.0 == 429)
        .map(|a| &a.1)
        .collect();
    assert_eq!(served + limited.len(), 20, "{codes:?}");
    // One second of burst (5) plus whatever refilled while the 20 requests ran.
    assert!((5..20).contains(&served), "{codes:?}");
    assert!(!limited.is_empty(), "{codes:?}");
    for body in limited {
        let msg = body["error"].as_str().unwrap_or_default();
        assert!(msg.contains("rate limited"), "{body}");
    }
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(req(&d.socket, "GET", "/v1/status", "").0, 200);
}

#[test]
fn top_view_lists_every_node_and_refuses_a_bad_query() {
    let d = start("epyc-nps4", "");
    let (code, v) = req(&d.socket, "GET", "/v1/top?limit=5", "");
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["nodes"].as_array().unwrap().len(), 8, "{v}");
    for q in ["/v1/top?limit=x", "/v1/top?limit=-1", "/v1/top?bogus=1"] {
        let (code, v) = req(&d.socket, "GET", q, "");
        assert_eq!(code, 400, "{q}: {v}");
        assert!(v["error"].as_str().unwrap().contains("bad query"), "{v}");
    }
}

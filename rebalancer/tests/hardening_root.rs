//! Hardening against real daemons on this machine's cgroupfs: a root daemon that cannot be fooled
//! (kubepods decoys in a user-owned cgroup; a failed cpuset write keeps nothing), starved (1,100
//! half-sent requests held on the metrics port with the fd soft limit at 1,024) or left
//! half-alive (a killed watcher shows in /healthz and a metric, then the daemon exits to be
//! restarted; a second daemon on the same state refuses to start).
//!
//! Skips with a printed reason when not root, without a cpuset controller or with < 2 CPUs.
mod common;

use std::{
    io::{Read, Write},
    net::TcpStream,
    os::unix::{fs::PermissionsExt, net::UnixStream, process::CommandExt},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{wait_for, Daemon, KubeTree};

const NOBODY: u32 = 65534;

fn bindings(d: &Daemon) -> Vec<String> {
    d.status()["bindings"]
        .as_object()
        .map(|b| b.keys().cloned().collect())
        .unwrap_or_default()
}

fn pods(d: &Daemon) -> Vec<String> {
    d.status()["pods"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter_map(|p| p["uid"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `GET path` on 127.0.0.1:`port` with a read timeout; (status code, body).
fn get_tcp(port: u16, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

/// An HTTP request over the admission socket; (status code, body).
fn req_unix(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

/// Sends `sig` and waits up to `bound` for the exit: (status, time taken).
fn signal_within(
    d: &mut Daemon,
    sig: i32,
    bound: Duration,
) -> (std::process::ExitStatus, Duration) {
    let mut c = d.child.take().unwrap();
    let t0 = Instant::now();
    unsafe { libc::kill(c.id() as i32, sig) };
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return (st, t0.elapsed());
        }
        if t0.elapsed() > bound {
            let _ = c.kill();
            let _ = c.wait();
            panic!("daemon did not exit within {bound:?} of signal {sig}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A top-level cgroup handed to `nobody` (as systemd delegates `user@.service`), in which that
/// user makes a Kubernetes-looking tree of its own. Removed on drop.
struct UserCgroup {
    root: std::path::PathBuf,
    dirs: Vec<std::path::PathBuf>,
}

impl UserCgroup {
    fn new(mount: &Path, name: &str, v1_cpus: &str, v1_mems: &str, v1: bool) -> UserCgroup {
        let root = mount.join(name);
        std::fs::create_dir(&root).unwrap();
        if v1 {
            std::fs::write(root.join("cpuset.cpus"), v1_cpus).unwrap();
            std::fs::write(root.join("cpuset.mems"), v1_mems).unwrap();
        }
        // Delegation: the directory and its cgroup.* files belong to the user.
        std::os::unix::fs::chown(&root, Some(NOBODY), Some(NOBODY)).unwrap();
        for f in std::fs::read_dir(&root).unwrap().flatten() {
            let n = f.file_name().to_string_lossy().to_string();
            if n.starts_with("cgroup.") || n == "tasks" {
                let _ = std::os::unix::fs::chown(f.path(), Some(NOBODY), Some(NOBODY));
            }
        }
        UserCgroup {
            root,
            dirs: Vec::new(),
        }
    }

    /// `mkdir` of `rel` (and its parents) run as the user.
    fn mkdir_as_user(&mut self, rel: &str) {
        let path = self.root.join(rel);
        let st = Command::new("mkdir")
            .arg("-p")
            .arg(&path)
            .uid(NOBODY)
            .gid(NOBODY)
            .status()
            .unwrap();
        assert!(st.success(), "mkdir -p {} as nobody", path.display());
        let mut p = path.as_path();
        while p != self.root {
            if !self.dirs.iter().any(|d| d == p) {
                self.dirs.push(p.to_path_buf());
            }
            p = p.parent().unwrap();
        }
        let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&path).unwrap());
        assert_eq!(owner, NOBODY, "the decoy is the user's own");
    }
}

impl Drop for UserCgroup {
    fn drop(&mut self) {
        self.dirs
            .sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in self.dirs.iter().chain(std::iter::once(&self.root)) {
            for _ in 0..50 {
                if !d.exists() || std::fs::remove_dir(d).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The moment of a stop signal, on the clock of file times: a marker's mtime (file times come
/// from the kernel's coarse clock, up to a tick behind `SystemTime::now()`), and the inode of the
/// checkpoint then on disk (a write renames a new file into place: another inode). The old file
/// is held open: a free inode number is reused by the file system (ext4 does at once), so after
/// two writes the newest file could carry the number the stop saw; an open file keeps it taken.
struct StopMark {
    time: std::time::SystemTime,
    ino: Option<u64>,
    _held: Option<std::fs::File>,
}

fn stop_mark(d: &Daemon) -> StopMark {
    use std::os::unix::fs::MetadataExt;
    let mark = d.state_dir.join("test-stop-mark");
    std::fs::write(&mark, b"").unwrap();
    let file = d.state_dir.join(rebalancer::checkpoint::FILE_NAME);
    let held = std::fs::File::open(file).ok();
    StopMark {
        time: std::fs::metadata(&mark).unwrap().modified().unwrap(),
        ino: held.as_ref().map(|f| f.metadata().unwrap().ino()),
        _held: held,
    }
}

/// The final checkpoint is on disk: the log says so and a new file was renamed into place after
/// the stop signal ([`stop_mark`]), so the line cannot stand for a write that did not happen.
fn final_checkpoint_written(d: &Daemon, since: StopMark) {
    use std::os::unix::fs::MetadataExt;
    let log = d.log_text();
    assert!(log.contains("final checkpoint written"), "{log}");
    let file = d.state_dir.join(rebalancer::checkpoint::FILE_NAME);
    let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mtime = meta.modified().unwrap();
    assert!(
        mtime >= since.time,
        "{} last written {mtime:?}, before the stop at {:?}",
        file.display(),
        since.time
    );
    assert_ne!(
        Some(meta.ino()),
        since.ino,
        "{}: the file on disk at the stop is still there",
        file.display()
    );
}

/// Item 1: decoys. A real container under the managed Kubernetes root is admitted (the control);
/// kubepods-looking trees made by `nobody` in its own top-level cgroup are never admitted nor
/// bound — neither by the watcher nor by the reconcile of a restart — and their cpusets stay
/// as the user left them.
#[test]
fn kubepods_decoys_in_a_user_owned_cgroup_are_never_admitted_or_bound() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg, "decoy");
    let mut d = Daemon::start(
        "",
        &format!(
            "{}[ebpf]\nenabled = false\n[controller]\nperiod_ms = 500\n",
            tree.cgroups_toml()
        ),
    );
    let v1 = tree.version == rebalancer::cgroup::Version::V1;
    let mut user = UserCgroup::new(
        &tree.mount,
        &format!("rbt-user-{}", std::process::id()),
        &tree.all_cpus.to_string(),
        &tree.all_mems.to_string(),
        v1,
    );
    let id = "d".repeat(64);
    let uid_us = "dec0y000_0000_4000_8000_000000000001";
    let decoys = [
        // systemd-driver layout under the user's own cgroup (BestEffort and Guaranteed forms).
        format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_us}.slice/cri-containerd-{id}.scope"),
        format!("kubepods.slice/kubepods-pod{uid_us}.slice/cri-containerd-{id}.scope"),
        // cgroupfs layout, mimicking the managed root's own path below the user's cgroup.
        format!("{}/kubepods/burstable/poddec0y000-0000-4000-8000-000000000002/{id}", tree.prefix),
    ];
    for rel in &decoys {
        user.mkdir_as_user(rel);
    }
    if !v1 {
        // On v2 a decoy has a cpuset.cpus file only with the controller enabled down to it,
        // as a user who delegates cpuset would: then a write by the daemon would show.
        for rel in &decoys {
            let _ = std::fs::write(tree.mount.join("cgroup.subtree_control"), "+cpuset");
            let mut dir = user.root.clone();
            for comp in Path::new(rel).components() {
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+cpuset");
                dir.push(comp);
            }
        }
    }
    // The control: a real container under the managed root.
    let (_, real) =
        tree.pod_with_container("dec0y000-0000-4000-8000-0000000000aa", &"a".repeat(64));
    wait_for(20, "the real container bound", || {
        bindings(&d).contains(&real)
    });
    let user_prefix = user.root.file_name().unwrap().to_string_lossy().to_string();
    let check = |d: &Daemon| {
        let b = bindings(d);
        assert!(
            !b.iter().any(|k| k.starts_with(&user_prefix)),
            "a decoy was bound: {b:?}"
        );
        let p = pods(d);
        assert!(
            !p.iter()
                .any(|u| u.contains("dec0y000-0000-4000-8000-00000000000")),
            "a decoy was admitted: {p:?}"
        );
        for rel in &decoys {
            // As mkdir left it: empty (v1: not set; v2: not restricted).
            let file = user.root.join(rel).join("cpuset.cpus");
            let cpus = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(cpus.trim(), "", "{rel}: the daemon wrote its cpuset");
        }
    };
    d.wait_rounds(2, Duration::from_secs(20));
    check(&d);
    // A restart reconciles from the live cgroups: still never a decoy.
    assert!(d.signal_and_wait(libc::SIGTERM).success());
    d.restart();
    wait_for(20, "the real container bound again", || {
        bindings(&d).contains(&real)
    });
    check(&d);
}

/// Item 1: a cpuset write that fails for a live container (its pod cgroup was narrowed to one
/// CPU, so the shared pool cannot be written below it) leaves no admission and no binding.
#[test]
fn a_failed_cpuset_write_leaves_no_admission() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg, "wfail");
    if tree.version != rebalancer::cgroup::Version::V1 {
        println!("SKIP: needs the cpuset controller on cgroup v1 (a v2 child may name CPUs its parent lacks)");
        return;
    }
    let d = Daemon::start(
        "",
        &format!(
            "{}[ebpf]\nenabled = false\n[controller]\nperiod_ms = 500\n",
            tree.cgroups_toml()
        ),
    );
    let uid = "wf000000-0000-4000-8000-000000000001";
    let pod = format!("{}/pod{uid}", tree.burstable);
    tree.mkdir(&pod).unwrap();
    std::fs::write(tree.mount.join(&pod).join("cpuset.cpus"), "0").unwrap();
    let c = format!("{pod}/{}", "e".repeat(64));
    tree.mkdir_container(&c).unwrap();
    wait_for(10, "the failed write counted", || {
        d.metric("rebalancer_admission_requests_total{result=\"write_failed\"}")
            .is_some_and(|v| v >= 1.0)
    });
    d.wait_rounds(1, Duration::from_secs(10));
    assert!(
        !bindings(&d).contains(&c),
        "bound although its cpuset was not written"
    );
    assert!(
        !pods(&d).iter().any(|p| p.starts_with(uid)),
        "admission kept after a failed write: {:?}",
        pods(&d)
    );
    assert!(d
        .log_text()
        .contains("admission undone: its cpuset could not be written"));
}

/// Item 2: starvation. 1,100 half-sent requests held on the metrics port of a daemon whose fd
/// soft limit is 1,024: /healthz answers within 1 s, an admission over the socket succeeds, the
/// daemon holds fewer than 1,024 fds, and SIGTERM ends it within 5 s with its final
/// checkpoint written (holding that admission).
#[test]
fn held_half_sent_requests_starve_nothing_and_sigterm_ends_within_5s() {
    let _serial = common::serial();
    if common::root_cgroups().is_none() {
        return;
    }
    // This test process holds the 1,100 connections itself.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if lim.rlim_max < 4096 {
        println!("SKIP: the hard fd limit ({}) is below 4096", lim.rlim_max);
        return;
    }
    lim.rlim_cur = lim.rlim_max;
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);

    let mut d = Daemon::start(
        "",
        "[ebpf]\nenabled = false\n[controller]\nperiod_ms = 500\n",
    );
    let pid = d.pid();
    let soft = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    assert_eq!(
        unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &soft, std::ptr::null_mut()) },
        0,
        "prlimit on the daemon"
    );
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..1100 {
        match TcpStream::connect_timeout(
            &([127, 0, 0, 1], d.metrics_port).into(),
            Duration::from_secs(2),
        ) {
            Ok(mut s) => {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
                held.push(s);
            }
            Err(_) => refused += 1,
        }
    }
    println!(
        "held {} half-sent requests ({refused} connects failed)",
        held.len()
    );
    assert!(
        held.len() >= 1000,
        "could not open the connections: {refused} failed"
    );
    std::thread::sleep(Duration::from_millis(300));
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    println!("daemon fds while held: {fds}");
    assert!(fds < 1024, "the daemon holds {fds} fds");

    let t0 = Instant::now();
    let (code, body) =
        get_tcp(d.metrics_port, "/healthz", Duration::from_secs(1)).expect("/healthz answered");
    let took = t0.elapsed();
    println!(
        "/healthz under load: {code} in {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    assert!(took < Duration::from_secs(1), "{took:?}");

    let t0 = Instant::now();
    let (code, body) = req_unix(
        &d.socket,
        "POST",
        "/v1/admit",
        r#"{"uid":"pod-held","containers":[{"name":"c","cpu_request_millis":100,"memory_bytes":67108864}]}"#,
    );
    println!(
        "admission under load: {code} in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(code, 200, "{body}");
    let evicted = d
        .metric("rebalancer_http_connections_closed_total{listener=\"metrics\",reason=\"evicted\"}")
        .unwrap_or(0.0);
    println!("evicted: {evicted}");
    assert!(evicted >= 800.0, "{evicted}");

    // SIGTERM with the connections still held.
    let stop = stop_mark(&d);
    let (st, took) = signal_within(&mut d, libc::SIGTERM, Duration::from_secs(5));
    println!("SIGTERM -> exit {st} in {:.1} ms", took.as_secs_f64() * 1e3);
    assert!(st.success(), "{st}\n{}", d.log_text());
    assert!(took < Duration::from_secs(5));
    final_checkpoint_written(&d, stop);
    let cp = d.checkpoint().expect("a checkpoint");
    assert!(cp.allocator.pods.contains_key("pod-held"));
    drop(held);
}

/// Item 3: the watcher thread killed (a test hook of debug builds panics it on a cgroup named
/// `rebalancer-test-kill-watcher`): /healthz turns 503 naming it, `rebalancer_component_up`
/// says 0, and within 10 s the daemon exits non-zero (to be restarted) with its final
/// checkpoint written.
#[test]
fn a_killed_watcher_shows_in_healthz_and_a_metric_then_the_daemon_exits_non_zero() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    if !cfg!(debug_assertions) {
        println!("SKIP: the watcher's kill hook exists in debug builds only");
        return;
    }
    let mount = cg
        .hierarchy(rebalancer::cgroup::Controller::Cpuset)
        .unwrap()
        .0
        .to_path_buf();
    // The daemon runs with REBALANCER_TEST_HOOKS=1 (common::Daemon); the hook needs the name.
    let mut d = Daemon::start(
        "",
        "[ebpf]\nenabled = false\n[controller]\nperiod_ms = 500\n",
    );
    assert_eq!(
        get_tcp(d.metrics_port, "/healthz", Duration::from_secs(2)).unwrap(),
        (200, "ok\n".into())
    );
    assert_eq!(
        d.metric("rebalancer_component_up{component=\"watcher\"}"),
        Some(1.0)
    );
    let kill = mount.join("rebalancer-test-kill-watcher");
    std::fs::create_dir(&kill).unwrap();
    let t0 = Instant::now();
    let mut last = (0, String::new());
    wait_for(3, "/healthz 503", || {
        last = get_tcp(d.metrics_port, "/healthz", Duration::from_secs(1)).unwrap_or_default();
        last.0 == 503
    });
    println!(
        "/healthz after the kill ({:.0} ms): {last:?}",
        t0.elapsed().as_secs_f64() * 1e3
    );
    assert!(last.1.contains("watcher: thread panicked"), "{last:?}");
    let m = d.metrics();
    assert_eq!(
        common::metric_value(&m, "rebalancer_component_up{component=\"watcher\"}"),
        Some(0.0),
        "{m}"
    );
    // Signal 0 sends nothing: this only waits for the daemon's own exit.
    let stop = stop_mark(&d);
    let (st, took) = signal_within(&mut d, 0, Duration::from_secs(15));
    let _ = std::fs::remove_dir(&kill);
    println!(
        "daemon exit after the kill: {st} in {:.1} s",
        took.as_secs_f64()
    );
    assert!(!st.success(), "{st}");
    let log = d.log_text();
    assert!(log.contains("component watcher dead"), "{log}");
    assert!(!log.contains("component checkpointer dead"), "{log}");
    final_checkpoint_written(&d, stop);
}

/// Item 4: a second daemon on the same state directory refuses to start, naming the first's
/// pid, and changes nothing: the first keeps its socket. A daemon on another state directory
/// but the same socket path refuses to take over the live socket.
#[test]
fn a_second_daemon_on_the_same_state_refuses_to_start_and_steals_nothing() {
    let _serial = common::serial();
    if common::root_cgroups().is_none() {
        return;
    }
    let d = Daemon::start(
        "",
        "[ebpf]\nenabled = false\n[controller]\nperiod_ms = 500\n",
    );
    let second = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["run", "--config"])
        .arg(&d.config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    println!("second daemon: {}: {err}", second.status);
    assert!(!second.status.success());
    assert!(
        err.contains(&format!(
            "another rebalancer (pid {}) is running on state directory",
            d.pid()
        )),
        "{err}"
    );
    assert!(
        d.status()["controller"].is_object(),
        "the first still serves its socket"
    );
    let mode = std::fs::metadata(&d.state_dir)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700, "state directory mode");

    // Another state directory, the same socket: refused, the socket stays the first's.
    let other = d.dir.path().join("other.toml");
    let text = std::fs::read_to_string(&d.config)
        .unwrap()
        .replace(
            &d.state_dir.display().to_string(),
            &d.dir.path().join("state2").display().to_string(),
        )
        .replace(&format!("127.0.0.1:{}", d.metrics_port), "127.0.0.1:0");
    std::fs::write(&other, text).unwrap();
    let third = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["run", "--config"])
        .arg(&other)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&third.stderr);
    println!("third daemon: {}: {err}", third.status);
    assert!(!third.status.success());
    assert!(err.contains("is the socket of a running daemon"), "{err}");
    assert!(
        d.status()["controller"].is_object(),
        "the first still serves its socket"
    );
}

/// The capabilities the unit and the DaemonSet grant, by number (capability.h).
const GRANTED: [u32; 5] = [
    21, // CAP_SYS_ADMIN
    23, // CAP_SYS_NICE
    19, // CAP_SYS_PTRACE
    38, // CAP_PERFMON
    39, // CAP_BPF
];

/// In the daemon child: every capability but [`GRANTED`] dropped from the bounding set, so
/// the exec'd daemon (uid 0) holds exactly those, as under the unit or the DaemonSet.
fn only_granted_caps() -> std::io::Result<()> {
    for cap in 0..=63u32 {
        if GRANTED.contains(&cap) {
            continue;
        }
        // SAFETY: prctl is async-signal-safe; EINVAL past the last capability is ignored.
        let _ = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    }
    Ok(())
}

/// Item 5: the daemon needs no more than the five capabilities SECURITY.md lists (no
/// CAP_SYS_RESOURCE, no CAP_DAC_OVERRIDE): with only those it attaches the same eBPF sources as
/// with all of them, admits a container and writes its cpuset, and stops cleanly.
#[test]
fn the_daemon_works_with_only_the_five_granted_capabilities() {
    let _serial = common::serial();
    let Some(cg) = common::root_cgroups() else {
        return;
    };
    let mut tree = KubeTree::new(cg, "caps");
    let extra = format!("{}[controller]\nperiod_ms = 500\n", tree.cgroups_toml());
    let sources = |d: &Daemon| -> Vec<(String, bool)> {
        d.status()["sources"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|s| {
                (
                    s["name"].as_str().unwrap_or("").to_string(),
                    s["available"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    };
    let mut full = Daemon::start("", &extra);
    // The sources are known once the rounds run (eBPF loads after the listeners).
    full.wait_rounds(1, Duration::from_secs(60));
    let with_all = sources(&full);
    assert!(!with_all.is_empty(), "no eBPF source status at all");
    assert!(full.signal_and_wait(libc::SIGTERM).success());
    drop(full);
    let mut d = Daemon::start_with("", &extra, Some(only_granted_caps));
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    // Capabilities past the kernel's last one (CAP_BPF/CAP_PERFMON before 5.8) do not exist.
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    let want: u64 = GRANTED
        .iter()
        .filter(|c| **c <= last)
        .map(|c| 1u64 << c)
        .sum();
    assert_eq!(eff, want, "CapEff {eff:#x}");
    d.wait_rounds(1, Duration::from_secs(60));
    let with_five = sources(&d);
    println!("eBPF sources, all caps: {with_all:?}\nfive caps: {with_five:?}");
    assert_eq!(
        with_five, with_all,
        "the same sources attach with the five capabilities"
    );
    let (_, c) = tree.pod_with_container("ca950000-0000-4000-8000-000000000001", &"c".repeat(64));
    wait_for(20, "the container bound", || bindings(&d).contains(&c));
    assert!(
        !tree.cg.cpus(&c).unwrap().is_empty(),
        "its cpuset was written\n{}",
        d.log_text()
    );
    let stop = stop_mark(&d);
    assert!(
        d.signal_and_wait(libc::SIGTERM).success(),
        "{}",
        d.log_text()
    );
    final_checkpoint_written(&d, stop);
}

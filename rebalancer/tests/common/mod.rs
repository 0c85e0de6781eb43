//! Helpers shared by the root integration tests that run a real daemon on real cgroups
//! (`churn_root`, `faults_root`): the skip checks, a Kubernetes-layout cgroup tree under a
//! private prefix (removed deepest-first on drop), a daemon process with a temp config and
//! its log in a file, the status / metrics / log readers, and [`assert_invariants`].
//!
//! The daemon watches the whole cpuset hierarchy, so two daemons must not run at once: every
//! test that starts one holds [`serial`] for its whole run.
//!
//! `containerd`: a private containerd driven through its CRI (`nri_root`, `deploy_root`).
#![allow(dead_code)]

pub mod containerd;

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use rebalancer::{
    cgroup::{Cgroups, Controller, Version},
    cpuset::CpuSet,
    daemon::Persisted,
};

/// Waits for `cond` (polled every 50 ms) up to `secs`.
pub fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Serialises the tests of one binary that start a daemon.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The host's cgroups when the test can run: root, a cpuset controller, ≥ 2 CPUs. Prints
/// `SKIP: <reason>` and returns None otherwise.
pub fn root_cgroups() -> Option<Cgroups> {
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return None;
    }
    let cg = match Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) {
        Ok(c) => c,
        Err(e) => {
            println!("SKIP: no cgroups: {e}");
            return None;
        }
    };
    let Ok((_, v)) = cg.hierarchy(Controller::Cpuset) else {
        println!("SKIP: no cpuset controller");
        return None;
    };
    if v == Version::V2 {
        let _ = cg.enable_cpuset_v2("");
    }
    match cg.effective_cpus("") {
        Ok(c) if c.len() >= 2 => Some(cg),
        other => {
            println!("SKIP: needs 2 CPUs, the root cpuset has {other:?}");
            None
        }
    }
}

/// A Kubernetes cgroupfs-driver tree `<prefix>/kubepods/burstable/pod<uid>/<container>` in the
/// cpuset hierarchy, made the way a runtime makes it (each pod's cpuset copied from its parent
/// on v1). Removed deepest first on drop.
pub struct KubeTree {
    pub cg: Cgroups,
    pub mount: PathBuf,
    pub version: Version,
    /// `<prefix>/kubepods/burstable`, relative to the hierarchy.
    pub burstable: String,
    pub prefix: String,
    pub all_cpus: CpuSet,
    pub all_mems: CpuSet,
    dirs: Vec<PathBuf>,
}

impl KubeTree {
    pub fn new(cg: Cgroups, name: &str) -> KubeTree {
        let (mount, version) = cg
            .hierarchy(Controller::Cpuset)
            .map(|(p, v)| (p.to_path_buf(), v))
            .unwrap();
        let all_cpus = cg.effective_cpus("").unwrap();
        let all_mems = cg.effective_mems("").unwrap();
        let prefix = format!("rbt-{name}-{}", std::process::id());
        let mut t = KubeTree {
            cg,
            mount,
            version,
            burstable: format!("{prefix}/kubepods/burstable"),
            prefix,
            all_cpus,
            all_mems,
            dirs: Vec::new(),
        };
        for rel in [
            t.prefix.clone(),
            format!("{}/kubepods", t.prefix),
            t.burstable.clone(),
        ] {
            t.mkdir(&rel).expect("create the kubepods tree");
        }
        t
    }

    /// The `[cgroups]` section naming the tree's kubepods as kubelet's cgroup root (the daemon
    /// admits containers only there, see `cgroup::kube`).
    pub fn cgroups_toml(&self) -> String {
        format!(
            "[cgroups]\nkubernetes_root = \"{}/kubepods\"\n",
            self.prefix
        )
    }

    /// Makes one cgroup directory (cpuset copied from the parent on v1, as runc does).
    pub fn mkdir(&mut self, rel: &str) -> std::io::Result<()> {
        let dir = self.mount.join(rel);
        std::fs::create_dir(&dir)?;
        self.dirs.push(dir.clone());
        if self.version == Version::V1 {
            std::fs::write(dir.join("cpuset.cpus"), self.all_cpus.to_string())?;
            std::fs::write(dir.join("cpuset.mems"), self.all_mems.to_string())?;
        } else {
            let _ = self.cg.enable_cpuset_v2(rel);
        }
        Ok(())
    }

    /// Makes a container cgroup (no cpuset of its own: the daemon's watcher writes it).
    pub fn mkdir_container(&mut self, rel: &str) -> std::io::Result<()> {
        let dir = self.mount.join(rel);
        std::fs::create_dir(&dir)?;
        self.dirs.push(dir);
        Ok(())
    }

    /// `burstable/pod<uid>` and its container `<id>`: returns (pod rel, container rel).
    pub fn pod_with_container(&mut self, uid: &str, id: &str) -> (String, String) {
        let pod = format!("{}/pod{uid}", self.burstable);
        let c = format!("{pod}/{id}");
        self.mkdir(&pod).expect("create pod cgroup");
        self.mkdir_container(&c).expect("create container cgroup");
        (pod, c)
    }

    pub fn rmdir(&self, rel: &str) -> std::io::Result<()> {
        std::fs::remove_dir(self.mount.join(rel))
    }

    /// Container cgroups (depth 5 below the prefix's parent) that exist now.
    pub fn live_containers(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let Ok(pods) = std::fs::read_dir(self.mount.join(&self.burstable)) else {
            return out;
        };
        for p in pods.flatten().filter(|e| e.path().is_dir()) {
            let Ok(cs) = std::fs::read_dir(p.path()) else {
                continue;
            };
            for c in cs.flatten().filter(|e| e.path().is_dir()) {
                out.insert(format!(
                    "{}/{}/{}",
                    self.burstable,
                    p.file_name().to_string_lossy(),
                    c.file_name().to_string_lossy()
                ));
            }
        }
        out
    }

    /// Forgets directories already removed (keeps the drop list short in long tests).
    pub fn forget_removed(&mut self) {
        self.dirs.retain(|d| d.exists());
    }
}

impl Drop for KubeTree {
    fn drop(&mut self) {
        self.dirs
            .sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in &self.dirs {
            for _ in 0..50 {
                if !dir.exists() || std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A daemon process on a temp state dir; its stderr (the log) goes to `log`.
pub struct Daemon {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub metrics_port: u16,
    pub config: PathBuf,
    /// Run in the daemon child before exec (e.g. dropping capabilities).
    pub pre_exec: Option<fn() -> std::io::Result<()>>,
}

impl Daemon {
    /// Writes a config (`extra` is appended TOML: whole sections) and starts the daemon.
    pub fn start(server_extra: &str, extra: &str) -> Daemon {
        Daemon::start_full("", server_extra, extra, None)
    }

    /// [`Daemon::start`] with `pre_exec` run in the child before exec.
    pub fn start_with(
        server_extra: &str,
        extra: &str,
        pre_exec: Option<fn() -> std::io::Result<()>>,
    ) -> Daemon {
        Daemon::start_full("", server_extra, extra, pre_exec)
    }

    /// [`Daemon::start`] with `daemon_extra` keys in the `[daemon]` section too.
    pub fn start_daemon_extra(daemon_extra: &str, server_extra: &str, extra: &str) -> Daemon {
        Daemon::start_full(daemon_extra, server_extra, extra, None)
    }

    fn start_full(
        daemon_extra: &str,
        server_extra: &str,
        extra: &str,
        pre_exec: Option<fn() -> std::io::Result<()>>,
    ) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("rb-root")
            .tempdir_in("/tmp")
            .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let socket = dir.path().join("s.sock");
        let state_dir = dir.path().join("state");
        let config = dir.path().join("c.toml");
        std::fs::write(
            &config,
            format!(
                "[daemon]\nstate_dir = \"{}\"\n{daemon_extra}\n[server]\nsocket = \"{}\"\nmetrics_listen = \"127.0.0.1:{port}\"\n{server_extra}\n{extra}",
                state_dir.display(),
                socket.display()
            ),
        )
        .unwrap();
        let mut d = Daemon {
            child: None,
            log: dir.path().join("daemon.log"),
            dir,
            socket,
            state_dir,
            metrics_port: port,
            config,
            pre_exec,
        };
        d.restart();
        d
    }

    /// (Re)starts the daemon process on the same config and state (the log is appended to).
    pub fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rebalancer"));
        cmd.args(["run", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "rebalancer=debug")
            // debug builds' test hooks (named cgroups, files in the state dir), inert otherwise
            .env("REBALANCER_TEST_HOOKS", "1")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(f) = self.pre_exec {
            use std::os::unix::process::CommandExt;
            // SAFETY: `f` only makes async-signal-safe calls (prctl, setrlimit).
            unsafe { cmd.pre_exec(f) };
        }
        let child = cmd.spawn().unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        // up once the API answers: the socket is bound early and served after start-up
        // (reconcile, watcher, rounds), so an answer shows start-up's state
        while !answers(&self.socket) {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("daemon exited at start ({st}):\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not start:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` and waits (up to 20 s) for the exit; returns the exit status.
    pub fn signal_and_wait(&mut self, sig: i32) -> std::process::ExitStatus {
        self.signal(sig);
        self.wait_exit(sig)
    }

    /// Sends `sig` to the running daemon.
    pub fn signal(&self, sig: i32) {
        let c = self.child.as_ref().unwrap();
        unsafe { libc::kill(c.id() as i32, sig) };
    }

    /// Waits (up to 20 s) for the exit after `sig` was sent; returns the exit status.
    pub fn wait_exit(&mut self, sig: i32) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("daemon did not exit after signal {sig}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `GET /v1/status` over the socket.
    pub fn status(&self) -> serde_json::Value {
        let body = http(
            std::os::unix::net::UnixStream::connect(&self.socket).expect("connect socket"),
            "/v1/status",
        );
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("status: {e}: {body}"))
    }

    /// The /metrics text.
    pub fn metrics(&self) -> String {
        metrics_at(self.metrics_port)
    }

    /// A metric's value (the first series whose name and labels start with `series`).
    pub fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.metrics(), series)
    }

    /// VmRSS of the daemon in kB.
    pub fn rss_kb(&self) -> u64 {
        rss_kb_of(self.pid()).unwrap()
    }

    /// The checkpoint now on disk.
    pub fn checkpoint(&self) -> Option<Persisted> {
        rebalancer::checkpoint::load(&self.state_dir).expect("checkpoint loads")
    }

    /// Waits until the controller counted `n` more rounds than now.
    pub fn wait_rounds(&self, n: u64, timeout: Duration) {
        let start = self.status()["controller"]["rounds"].as_u64().unwrap_or(0);
        let deadline = Instant::now() + timeout;
        while self.status()["controller"]["rounds"].as_u64().unwrap_or(0) < start + n {
            assert!(Instant::now() < deadline, "{n} rounds did not happen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            let keep = format!("/tmp/rebalancer-failed-{}.log", std::process::id());
            if std::fs::copy(&self.log, &keep).is_ok() {
                println!("daemon log kept at {keep}");
            }
        }
    }
}

/// The /metrics text of a daemon listening on 127.0.0.1:`port`.
pub fn metrics_at(port: u16) -> String {
    http(
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"),
        "/metrics",
    )
}

/// VmRSS of process `pid` in kB (None once it is gone).
pub fn rss_kb_of(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU time (user + system) of process `pid` in seconds.
pub fn cpu_secs_of(pid: i32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = s.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// Whether the daemon's API on `socket` answers a status request (within 10 s).
pub fn answers(socket: &std::path::Path) -> bool {
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    if write!(
        s,
        "GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

fn http(mut s: impl Read + Write, path: &str) -> String {
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of the first line of an OpenMetrics text starting with `series` followed by a
/// space or a `{`.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        let rest = if series.ends_with('}') {
            rest
        } else if let Some(r) = rest.strip_prefix('{') {
            r.split_once('}')?.1
        } else {
            rest
        };
        rest.trim().split(' ').next()?.parse().ok()
    })
}

/// WARN and ERROR lines of a daemon log.
pub fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

fn set(v: &serde_json::Value) -> CpuSet {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// Checks every invariant of PRODUCT.md that can be seen from outside on the tree's cgroups
/// and the daemon's state (`status`, and `checkpoint` when the daemon is stopped or quiet):
/// - every cgroup the daemon bound has a non-empty cpuset (CPUs and memory nodes), within its
///   parent's effective set;
/// - exclusive CPUs of admitted containers are pairwise disjoint, never reserved, and no other
///   bound container's cpuset includes them;
/// - every binding under the tree names a live cgroup (nothing leaked) and every live
///   container of the tree is bound (every admission answered);
/// - the migration budget was kept (bytes migrated ≤ rounds × budget);
/// - the checkpoint, when given, holds exactly the status' pods and bindings.
pub fn assert_invariants(
    tree: &KubeTree,
    status: &serde_json::Value,
    checkpoint: Option<&Persisted>,
    budget_mib: u64,
) {
    let cg = &tree.cg;
    let bindings = status["bindings"].as_object().cloned().unwrap_or_default();
    let ours: BTreeSet<String> = bindings
        .keys()
        .filter(|k| k.starts_with(&format!("{}/", tree.prefix)))
        .cloned()
        .collect();
    let live = tree.live_containers();
    assert_eq!(
        ours, live,
        "bindings under the tree must be exactly its live container cgroups"
    );
    let parent = |rel: &str| rel.rsplit_once('/').map_or("", |(p, _)| p).to_string();
    for rel in &ours {
        let cpus = cg.effective_cpus(rel).unwrap();
        let mems = cg.effective_mems(rel).unwrap();
        assert!(
            !cpus.is_empty() && !mems.is_empty(),
            "{rel}: empty cpuset {cpus}/{mems}"
        );
        let (pc, pm) = (
            cg.effective_cpus(&parent(rel)).unwrap(),
            cg.effective_mems(&parent(rel)).unwrap(),
        );
        assert!(
            cpus.is_subset(&pc) && mems.is_subset(&pm),
            "{rel}: {cpus}/{mems} outside the parent's {pc}/{pm}"
        );
    }
    let reserved = set(&status["reserved_cpus"]);
    let mut exclusive: Vec<(String, CpuSet)> = Vec::new();
    for pod in status["pods"].as_array().cloned().unwrap_or_default() {
        for c in pod["containers"].as_array().cloned().unwrap_or_default() {
            if c["exclusive"].as_bool() == Some(true) {
                let cpus = set(&c["cpus"]);
                assert!(
                    cpus.intersection(&reserved).is_empty(),
                    "exclusive {cpus} includes reserved {reserved}"
                );
                for (other, o) in &exclusive {
                    assert!(
                        o.intersection(&cpus).is_empty(),
                        "exclusive sets overlap: {other} {o} and {} {cpus}",
                        pod["uid"]
                    );
                }
                exclusive.push((pod["uid"].to_string(), cpus));
            }
        }
    }
    for (uid, ex) in &exclusive {
        for rel in &ours {
            let b = &bindings[rel];
            if format!("{}", b["pod_uid"]) == *uid {
                continue;
            }
            let cpus = cg.effective_cpus(rel).unwrap();
            assert!(
                cpus.intersection(ex).is_empty(),
                "{rel} ({cpus}) includes exclusive CPUs {ex} of {uid}"
            );
        }
    }
    let ctl = &status["controller"];
    let (rounds, bytes) = (
        ctl["rounds"].as_u64().unwrap_or(0),
        ctl["bytes_migrated_total"].as_u64().unwrap_or(0),
    );
    assert!(
        bytes <= rounds.saturating_mul(budget_mib << 20),
        "{bytes} bytes migrated in {rounds} rounds exceeds the budget of {budget_mib} MiB/round"
    );
    if let Some(cp) = checkpoint {
        // Only the tree's own cgroups: another test's daemon on this host may come and go.
        let mine = |k: &String| k.starts_with(&format!("{}/", tree.prefix));
        let cp_bindings: BTreeSet<(String, String)> = cp
            .bindings
            .iter()
            .filter(|(k, _)| mine(k))
            .map(|(k, b)| (k.clone(), b.pod_uid.to_string()))
            .collect();
        let st_bindings: BTreeSet<(String, String)> = bindings
            .iter()
            .filter(|(k, _)| mine(k))
            .map(|(k, b)| (k.clone(), b["pod_uid"].as_str().unwrap_or("").to_string()))
            .collect();
        assert_eq!(
            cp_bindings, st_bindings,
            "checkpoint bindings differ from the daemon's"
        );
        let st_pods: BTreeSet<String> = status["pods"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p["uid"].as_str().map(str::to_string))
            .collect();
        for (rel, uid) in &cp_bindings {
            assert!(
                cp.allocator.pods.contains_key(uid) && st_pods.contains(uid),
                "{rel}: pod {uid} missing from the checkpoint or the daemon"
            );
        }
    }
}

/// The environment variable that makes a test binary a spinning child (see [`spin_threads`]):
/// `<threads>:<parent pid>`.
const SPIN_THREADS: &str = "RB_TEST_SPIN_THREADS";

/// A child process spinning in `n` threads, killed when this is dropped (and by the kernel
/// when the test process dies: `PR_SET_PDEATHSIG`): this test binary run again with only its
/// `spin_threads_child` test, which calls [`spin_threads_entry`]. (A process of one thread
/// would not tell a reader of threads from a reader of processes.)
pub struct Spinner(Child);

impl Spinner {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spin_threads(n: usize) -> Spinner {
    let child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "spin_threads_child", "--nocapture"])
        .env(SPIN_THREADS, format!("{n}:{}", std::process::id()))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the spinning child");
    let s = Spinner(child);
    // Its spinning threads started (the harness's own threads come first).
    wait_for(10, "the spinner's threads", || tids_of(s.id()).len() > n);
    s
}

/// The body of each binary's `spin_threads_child` test: spins in the number of threads the
/// environment asks for until its parent dies (never returns), or returns at once in a normal
/// test run (the variable unset, or naming another parent).
pub fn spin_threads_entry() {
    let Some((n, parent)) = std::env::var(SPIN_THREADS).ok().and_then(|v| {
        let (n, p) = v.split_once(':')?;
        Some((n.parse::<usize>().ok()?, p.parse::<i32>().ok()?))
    }) else {
        return;
    };
    // SAFETY: prctl and getppid have no memory-safety preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            return;
        }
    }
    for _ in 1..n {
        std::thread::spawn(|| loop {
            std::hint::spin_loop()
        });
    }
    loop {
        std::hint::spin_loop()
    }
}

/// The tids of process `pid` (`/proc/<pid>/task`), sorted.
pub fn tids_of(pid: u32) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

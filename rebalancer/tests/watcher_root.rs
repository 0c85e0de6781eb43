//! Root test of the cgroup watcher with real cgroups and a real daemon: container cgroups made
//! in the Kubernetes cgroupfs-driver layout (kubepods/<qos>/pod<uid>/<id>, under a test-owned
//! directory given as `cgroups.kubernetes_root`) get their cpuset
//! from the daemon (the latency from mkdir to the cpuset being written is measured and
//! printed), a Guaranteed one gets exclusive CPUs, and a removed one is released (its CPUs can
//! be handed out again). A restart reconciles from the checkpoint without double allocation.
//! Under `placement.scope = "pod"` a pod's containers, made one at a time, share the affinity
//! computed from the pod cgroup's limits, and the pod's remaining CPUs are held for them.
//! With every inotify instance of its user taken (by another process of the same uid, under a
//! lowered `fs.inotify.max_user_instances`), the daemon reports it in /healthz and still places
//! new containers within two control periods, and recovers once an instance is free.
//! A refused container never shares a CPU later given exclusively to another.
mod common;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use rebalancer::{
    cgroup::{Cgroups, Controller, Version},
    cpuset::CpuSet,
};

struct Cleanup {
    dirs: Vec<PathBuf>,
    daemon: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(d) = &mut self.daemon {
            let _ = d.kill();
            let _ = d.wait();
        }
        // Deepest first, whatever the order they were made in.
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

fn start_daemon(dir: &Path, kubernetes_root: &str) -> Child {
    start_daemon_with(dir, kubernetes_root, "")
}

/// [`start_daemon`] with `extra` appended to the config file (more sections).
fn start_daemon_with(dir: &Path, kubernetes_root: &str, extra: &str) -> Child {
    start_daemon_every(dir, kubernetes_root, extra, 60_000).0
}

/// [`start_daemon_with`] with a control period of `period_ms`; the child and its metrics port.
fn start_daemon_every(
    dir: &Path,
    kubernetes_root: &str,
    extra: &str,
    period_ms: u64,
) -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\nstate_dir = \"{0}/state\"\n[ebpf]\nenabled = false\n[controller]\nperiod_ms = {period_ms}\n[server]\nsocket = \"{0}/s.sock\"\nmetrics_listen = \"127.0.0.1:{port}\"\n[cgroups]\nkubernetes_root = \"/{kubernetes_root}\"\n{extra}",
            dir.display()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["run", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "rebalancer=info")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // up once the API answers (the socket is bound early, served after start-up)
    while !answers(&dir.join("s.sock")) {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, port)
}

/// Polls until `file` reads non-empty; returns the time it took.
fn wait_written(file: &Path, since: Instant) -> Option<Duration> {
    while since.elapsed() < Duration::from_secs(10) {
        if std::fs::read_to_string(file).is_ok_and(|s| !s.trim().is_empty()) {
            return Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    None
}

#[test]
fn new_container_cgroups_get_a_cpuset_and_removed_ones_are_released() {
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let Ok(cg) = Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) else {
        println!("SKIP: no cgroups");
        return;
    };
    let Ok((root, version)) = cg
        .hierarchy(Controller::Cpuset)
        .map(|(p, v)| (p.to_path_buf(), v))
    else {
        println!("SKIP: no cpuset controller");
        return;
    };
    if version == Version::V2 {
        let _ = cg.enable_cpuset_v2("");
    }
    // kubelet's root under a directory of this test's own (cgroups.kubernetes_root): a real or
    // leftover top-level kubepods tree on the host is neither touched nor a reason to skip.
    let top = format!("rbt-watcher-{}", std::process::id());
    let kube = format!("{top}/kubepods");
    let all = cg.effective_cpus("").unwrap();
    let mems = cg.effective_mems("").unwrap();
    if all.len() < 2 {
        println!("SKIP: needs 2 CPUs");
        return;
    }
    let uid = format!("0000aaaa-bbbb-cccc-dddd-{:012}", std::process::id());
    let mut clean = Cleanup {
        dirs: Vec::new(),
        daemon: None,
    };
    for rel in [
        top.as_str(),
        &kube,
        &format!("{kube}/burstable"),
        &format!("{kube}/pod{uid}"),
        &format!("{kube}/burstable/pod{uid}"),
    ] {
        cg.create_cpuset(rel, &all, &mems).expect("create parent");
        if version == Version::V2 {
            let _ = cg.enable_cpuset_v2(rel);
        }
        clean.dirs.push(root.join(rel));
    }
    let state = tempfile::tempdir().unwrap();
    clean.daemon = Some(start_daemon(state.path(), &kube));

    // A Guaranteed container: 1 CPU limit (cpu.max / cfs quota) → one exclusive CPU. The
    // runtime sets the CPU limit first (on v1 in the separate cpu hierarchy), then the cpuset.
    let g_rel = format!("{kube}/pod{uid}/{}", "a".repeat(64));
    let g_dir = root.join(&g_rel);
    let mut limits_set = 0;
    for (ctl, file, value) in [
        (Controller::Cpu, "cpu.cfs_quota_us", "100000"),
        (Controller::Memory, "memory.limit_in_bytes", "268435456"),
    ] {
        let Ok((ctl_root, Version::V1)) = cg.hierarchy(ctl).map(|(p, v)| (p.to_path_buf(), v))
        else {
            continue;
        };
        if ctl_root == root {
            continue;
        }
        let mut rel = PathBuf::new();
        for part in Path::new(&g_rel).components() {
            rel.push(part);
            let d = ctl_root.join(&rel);
            if !d.exists() {
                std::fs::create_dir(&d).unwrap();
                clean.dirs.push(d);
            }
        }
        if std::fs::write(ctl_root.join(&g_rel).join(file), value).is_ok() {
            limits_set += 1;
        }
    }
    // On v2 the limits live in the same directory, which appears with the cpuset: skip the
    // exclusivity check there (the watcher reads whatever is set at that instant).
    let guaranteed_limit = limits_set == 2;
    let t0 = Instant::now();
    std::fs::create_dir(&g_dir).unwrap();
    clean.dirs.push(g_dir.clone());
    let lat = wait_written(&g_dir.join("cpuset.cpus"), t0)
        .expect("the watcher never wrote the new cgroup's cpuset");
    let cpus = CpuSet::parse(&std::fs::read_to_string(g_dir.join("cpuset.cpus")).unwrap()).unwrap();
    println!(
        "guaranteed container: cpuset {cpus} written {:.2} ms after mkdir",
        lat.as_secs_f64() * 1e3
    );
    assert!(!cpus.is_empty() && cpus.is_subset(&all));
    if guaranteed_limit {
        assert_eq!(
            cpus.len(),
            1,
            "a 1-CPU Guaranteed container gets one exclusive CPU"
        );
    }

    // A Burstable container next to it: a shared cpuset, never the exclusive CPUs... but with no
    // cpu limit set on this test cgroup it is a Burstable share of the pool.
    let b_rel = format!("{kube}/burstable/pod{uid}/{}", "b".repeat(64));
    let b_dir = root.join(&b_rel);
    let t1 = Instant::now();
    std::fs::create_dir(&b_dir).unwrap();
    clean.dirs.push(b_dir.clone());
    let lat =
        wait_written(&b_dir.join("cpuset.cpus"), t1).expect("burstable container not admitted");
    let bcpus =
        CpuSet::parse(&std::fs::read_to_string(b_dir.join("cpuset.cpus")).unwrap()).unwrap();
    println!(
        "burstable container: cpuset {bcpus} written {:.2} ms after mkdir",
        lat.as_secs_f64() * 1e3
    );
    assert!(!bcpus.is_empty());

    // Remove the burstable container: released (its binding disappears from status).
    std::fs::remove_dir(&b_dir).unwrap();
    let sock = state.path().join("s.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
            .args(["status", "--json", "--socket"])
            .arg(&sock)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let bindings = v["bindings"].as_object().cloned().unwrap_or_default();
        if !bindings.contains_key(&b_rel) {
            assert!(
                bindings.contains_key(&g_rel),
                "the guaranteed binding must stay: {v}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "removed cgroup never released: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Restart: the checkpoint is reconciled; the guaranteed container keeps its CPUs, nothing
    // is admitted twice.
    let mut d = clean.daemon.take().unwrap();
    unsafe { libc::kill(d.id() as i32, libc::SIGKILL) };
    let _ = d.wait();
    clean.daemon = Some(start_daemon(state.path(), &kube));
    let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["status", "--json", "--socket"])
        .arg(&sock)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["pods"].as_array().map(|a| a.len()),
        Some(1),
        "after kill -9 and restart: {v}"
    );
    let after =
        CpuSet::parse(&std::fs::read_to_string(g_dir.join("cpuset.cpus")).unwrap()).unwrap();
    assert_eq!(after, cpus);
}

/// Makes `rel` (and its missing parents) in the v1 `ctl` hierarchy and writes `file` there.
/// False when `ctl` is not a v1 hierarchy of its own.
fn v1_limit(
    cg: &Cgroups,
    ctl: Controller,
    rel: &str,
    file: &str,
    value: &str,
    clean: &mut Cleanup,
) -> bool {
    let Ok((ctl_root, Version::V1)) = cg.hierarchy(ctl).map(|(p, v)| (p.to_path_buf(), v)) else {
        return false;
    };
    if Some(ctl_root.as_path()) == cg.hierarchy(Controller::Cpuset).ok().map(|(p, _)| p) {
        return false;
    }
    let mut path = PathBuf::new();
    for part in Path::new(rel).components() {
        path.push(part);
        let d = ctl_root.join(&path);
        if !d.exists() {
            std::fs::create_dir(&d).unwrap();
            clean.dirs.push(d);
        }
    }
    std::fs::write(ctl_root.join(rel).join(file), value).is_ok()
}

/// Whether the daemon on `sock` answers `status`.
fn answers(sock: &Path) -> bool {
    Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["status", "--json", "--socket"])
        .arg(sock)
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

fn status(sock: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
        .args(["status", "--json", "--socket"])
        .arg(sock)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Pod scope with real cgroups (v1 cpu / memory hierarchies, as this host and kubelet's
/// cgroupfs driver have them): a Guaranteed pod cgroup of 2 CPUs (kubelet's summed quota)
/// whose first 1-CPU container is admitted holds the pod's second CPU: another pod's 1-CPU
/// container is refused (nothing else is free), the pod's second container gets the held CPU;
/// once both containers and the pod cgroup are gone the CPUs are free again.
#[test]
fn pod_scope_holds_the_pods_cpus_for_its_containers() {
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let Ok(cg) = Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) else {
        println!("SKIP: no cgroups");
        return;
    };
    let Ok(root) = cg
        .hierarchy(Controller::Cpuset)
        .map(|(p, _)| p.to_path_buf())
    else {
        println!("SKIP: no cpuset controller");
        return;
    };
    let top = format!("rbt-podscope-{}", std::process::id());
    let kube = format!("{top}/kubepods");
    let all = cg.effective_cpus("").unwrap();
    let mems = cg.effective_mems("").unwrap();
    if all.len() < 2 {
        println!("SKIP: needs 2 CPUs");
        return;
    }
    let pid = std::process::id();
    let (p_uid, q_uid) = (
        format!("0000aaaa-bbbb-cccc-dddd-{pid:012}"),
        format!("0000aaaa-bbbb-cccc-eeee-{pid:012}"),
    );
    let (p_rel, q_rel) = (format!("{kube}/pod{p_uid}"), format!("{kube}/pod{q_uid}"));
    let mut clean = Cleanup {
        dirs: Vec::new(),
        daemon: None,
    };
    // kubelet's pod cgroups with the pods' sums: P 2 CPUs (or all of them), Q 1 CPU
    let n = all.len();
    let quota = |cpus: usize| (cpus * 100_000).to_string();
    let mut v1 = true;
    for (rel, cpus) in [(&p_rel, 2), (&q_rel, 1)] {
        v1 &= v1_limit(
            &cg,
            Controller::Cpu,
            rel,
            "cpu.cfs_quota_us",
            &quota(cpus),
            &mut clean,
        );
        v1 &= v1_limit(
            &cg,
            Controller::Memory,
            rel,
            "memory.limit_in_bytes",
            &(cpus << 28).to_string(),
            &mut clean,
        );
    }
    if !v1 {
        println!("SKIP: needs separate v1 cpu and memory hierarchies (the limits of a v2 container cgroup appear with it)");
        return;
    }
    for rel in [top.as_str(), &kube, &p_rel, &q_rel] {
        cg.create_cpuset(rel, &all, &mems).expect("create parent");
        clean.dirs.push(root.join(rel));
    }
    let state = tempfile::tempdir().unwrap();
    clean.daemon = Some(start_daemon_with(
        state.path(),
        &kube,
        "[placement]\nscope = \"pod\"\n",
    ));
    let sock = state.path().join("s.sock");
    // A Guaranteed 1-CPU container: its limits first (as the runtime writes them), then the
    // cpuset directory the watcher sees.
    let make = |pod_rel: &str, id: &str, clean: &mut Cleanup| -> PathBuf {
        let rel = format!("{pod_rel}/{}", id.repeat(64));
        assert!(v1_limit(
            &cg,
            Controller::Cpu,
            &rel,
            "cpu.cfs_quota_us",
            "100000",
            clean
        ));
        assert!(v1_limit(
            &cg,
            Controller::Memory,
            &rel,
            "memory.limit_in_bytes",
            "268435456",
            clean
        ));
        let dir = root.join(&rel);
        std::fs::create_dir(&dir).unwrap();
        clean.dirs.push(dir.clone());
        dir
    };
    let read = |dir: &Path| {
        CpuSet::parse(&std::fs::read_to_string(dir.join("cpuset.cpus")).unwrap()).unwrap()
    };
    let a = make(&p_rel, "a", &mut clean);
    wait_written(&a.join("cpuset.cpus"), Instant::now())
        .expect("the pod's first container was never admitted");
    let ca = read(&a);
    assert_eq!(ca.len(), 1, "one exclusive CPU: {ca}");
    let held: CpuSet = serde_json::from_value(status(&sock)["exclusive_cpus"].clone()).unwrap();
    assert_eq!(held.len(), 2, "a's CPU and the one held for b: {held}");
    // the pod holds its second CPU: with 2 CPUs on the machine nothing is left for Q
    let c = make(&q_rel, "c", &mut clean);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = status(&sock);
        let pods: Vec<String> = v["pods"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p["uid"].as_str().map(str::to_string))
            .collect();
        assert!(pods.iter().any(|u| u == &p_uid), "pod P admitted: {v}");
        let bound = v["bindings"].as_object().cloned().unwrap_or_default();
        let c_rel = c.strip_prefix(&root).unwrap().to_string_lossy().to_string();
        if n == 2 {
            // refused (and left as the runtime made it): never bound
            assert!(
                !bound.contains_key(&c_rel),
                "Q got a CPU the pod holds: {v}"
            );
            if Instant::now() > deadline - Duration::from_secs(8) {
                break;
            }
        } else if bound.contains_key(&c_rel) {
            assert!(read(&c).is_disjoint(&ca));
            break;
        }
        assert!(Instant::now() < deadline, "Q never admitted: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = make(&p_rel, "b", &mut clean);
    wait_written(&b.join("cpuset.cpus"), Instant::now())
        .expect("the pod's second container was never admitted");
    let cb = read(&b);
    assert_eq!(cb.len(), 1);
    assert!(cb.is_disjoint(&ca), "{cb} vs {ca}");
    if n > 2 {
        assert!(cb.is_disjoint(&read(&c)), "the held CPU went to Q");
    }
    // the pod's containers and then its cgroup gone: released
    for d in [&b, &a] {
        std::fs::remove_dir(d).unwrap();
    }
    std::fs::remove_dir(root.join(&p_rel)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = status(&sock);
        let gone = !v["pods"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .any(|p| p["uid"].as_str() == Some(&p_uid));
        if gone {
            break;
        }
        assert!(Instant::now() < deadline, "pod P never released: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every inotify instance root may have, held by this process (another process of the
/// daemon's uid, as a uid-0 tenant container would): `fs.inotify.max_user_instances` lowered
/// to a few while held. Dropped: the limit restored and the instances closed.
struct InotifyHog {
    prev: Option<String>,
    fds: Vec<i32>,
}

const MAX_USER_INSTANCES: &str = "/proc/sys/fs/inotify/max_user_instances";

impl InotifyHog {
    fn take_all(limit: u32) -> InotifyHog {
        let prev = std::fs::read_to_string(MAX_USER_INSTANCES).unwrap();
        std::fs::write(MAX_USER_INSTANCES, limit.to_string()).unwrap();
        let mut hog = InotifyHog {
            prev: Some(prev),
            fds: Vec::new(),
        };
        loop {
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
            if fd < 0 {
                let e = std::io::Error::last_os_error();
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                break;
            }
            hog.fds.push(fd);
            assert!(
                hog.fds.len() <= limit as usize,
                "the per-user limit did not hold"
            );
        }
        hog
    }

    /// The limit back as it was (the instances still held).
    fn restore(&mut self) {
        if let Some(prev) = self.prev.take() {
            let _ = std::fs::write(MAX_USER_INSTANCES, prev.trim());
        }
    }
}

impl Drop for InotifyHog {
    fn drop(&mut self) {
        self.restore();
        for fd in self.fds.drain(..) {
            unsafe { libc::close(fd) };
        }
    }
}

/// /healthz on the metrics port: (status code, body).
fn healthz(port: u16) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, body.to_string())
}

/// A process of the daemon's uid holds every inotify instance the user may have when the
/// daemon starts: its watcher cannot start. /healthz turns non-200 naming the cause, the
/// daemon does not exit, and a new container is still placed — by the reconcile of each
/// control period — within two periods. Once an instance can be had again, the watcher
/// starts, /healthz is 200, and containers are placed at once again.
#[test]
fn without_inotify_instances_health_fails_and_containers_are_still_placed() {
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let Ok(cg) = Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) else {
        println!("SKIP: no cgroups");
        return;
    };
    let Ok((root, version)) = cg
        .hierarchy(Controller::Cpuset)
        .map(|(p, v)| (p.to_path_buf(), v))
    else {
        println!("SKIP: no cpuset controller");
        return;
    };
    if !Path::new(MAX_USER_INSTANCES).exists() {
        println!("SKIP: no {MAX_USER_INSTANCES}");
        return;
    }
    if version == Version::V2 {
        let _ = cg.enable_cpuset_v2("");
    }
    let top = format!("rbt-inotify-{}", std::process::id());
    let kube = format!("{top}/kubepods");
    let all = cg.effective_cpus("").unwrap();
    let mems = cg.effective_mems("").unwrap();
    let mut clean = Cleanup {
        dirs: Vec::new(),
        daemon: None,
    };
    let uid = format!("0000eeee-bbbb-cccc-dddd-{:012}", std::process::id());
    let pod = format!("{kube}/besteffort/pod{uid}");
    for rel in [top.as_str(), &kube, &format!("{kube}/besteffort"), &pod] {
        cg.create_cpuset(rel, &all, &mems).expect("create parent");
        if version == Version::V2 {
            let _ = cg.enable_cpuset_v2(rel);
        }
        clean.dirs.push(root.join(rel));
    }
    let period = Duration::from_millis(1000);
    let mut hog = InotifyHog::take_all(16);
    println!("holding {} inotify instances", hog.fds.len());
    let state = tempfile::tempdir().unwrap();
    let (child, port) = start_daemon_every(state.path(), &kube, "", period.as_millis() as u64);
    clean.daemon = Some(child);
    let t0 = Instant::now();
    let (code, body) = loop {
        let (code, body) = healthz(port);
        if code != 200 && code != 0 {
            break (code, body);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "/healthz stayed {code}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!("/healthz without inotify: {code} {}", body.trim());
    assert!(
        body.contains("inotify") && body.contains("max_user_instances"),
        "{body}"
    );

    // A new container: placed by a period's reconcile, within two periods.
    let c_dir = root.join(&pod).join("c".repeat(64));
    let t1 = Instant::now();
    std::fs::create_dir(&c_dir).unwrap();
    clean.dirs.push(c_dir.clone());
    let lat = wait_written(&c_dir.join("cpuset.cpus"), t1)
        .expect("a container made without inotify was never placed");
    println!(
        "placed without inotify {:.0} ms after mkdir",
        lat.as_secs_f64() * 1e3
    );
    assert!(
        lat <= 2 * period,
        "placed after {lat:?}, more than two periods"
    );
    let alive = clean.daemon.as_mut().unwrap().try_wait().unwrap().is_none();
    assert!(alive, "the daemon exited for want of inotify");
    assert_eq!(healthz(port).0, 503, "still failing while inotify is short");

    // An instance can be had again: the watcher starts within a period or two.
    hog.restore();
    let t2 = Instant::now();
    while healthz(port).0 != 200 {
        assert!(
            t2.elapsed() < 3 * period,
            "/healthz never recovered: {:?}",
            healthz(port)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "healthy again {:.0} ms after the limit was restored",
        t2.elapsed().as_secs_f64() * 1e3
    );
    drop(hog);
    let d_dir = root.join(&pod).join("d".repeat(64));
    let t3 = Instant::now();
    std::fs::create_dir(&d_dir).unwrap();
    clean.dirs.push(d_dir.clone());
    let lat = wait_written(&d_dir.join("cpuset.cpus"), t3).expect("never placed with inotify");
    println!(
        "placed with inotify again {:.1} ms after mkdir",
        lat.as_secs_f64() * 1e3
    );
}

/// A process that is killed (and reaped) on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `Cpus_allowed_list` of a process: where the kernel lets it run now.
fn allowed_cpus(pid: u32) -> CpuSet {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let v = st
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    CpuSet::parse(v.trim()).unwrap()
}

/// A refused container never shares a CPU later given exclusively (real cgroups in kubelet's
/// cgroupfs layout, v1 cpu / memory limits written before the cpuset directory appears, as
/// the runtime writes them, and a process in each container). Under single-numa-node, a
/// Burstable container asking for more CPUs than the machine has is refused and runs where the
/// runtime put it (every CPU); a Guaranteed 1-CPU container admitted after it gets a CPU the
/// refused one is moved off; a Guaranteed container that would take every CPU left is refused
/// too (the refused one would have nowhere to go). Checked in both cgroups and in the refused
/// container's process's own `Cpus_allowed_list`, over a few control rounds.
#[test]
fn a_refused_container_never_shares_a_cpu_given_exclusively() {
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let Ok(cg) = Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) else {
        println!("SKIP: no cgroups");
        return;
    };
    let Ok(root) = cg
        .hierarchy(Controller::Cpuset)
        .map(|(p, _)| p.to_path_buf())
    else {
        println!("SKIP: no cpuset controller");
        return;
    };
    let all = cg.effective_cpus("").unwrap();
    let mems = cg.effective_mems("").unwrap();
    let n = all.len();
    if n < 2 {
        println!("SKIP: needs 2 CPUs");
        return;
    }
    let pid = std::process::id();
    let top = format!("rbt-refused-{pid}");
    let kube = format!("{top}/kubepods");
    let (r_pod, g_pod, h_pod) = (
        format!("{kube}/burstable/pod0000aaaa-bbbb-cccc-dddd-{pid:012}"),
        format!("{kube}/pod0000aaaa-bbbb-cccc-eeee-{pid:012}"),
        format!("{kube}/pod0000aaaa-bbbb-cccc-ffff-{pid:012}"),
    );
    let (r_rel, g_rel, h_rel) = (
        format!("{r_pod}/{}", "e".repeat(64)),
        format!("{g_pod}/{}", "a".repeat(64)),
        format!("{h_pod}/{}", "b".repeat(64)),
    );
    let mut clean = Cleanup {
        dirs: Vec::new(),
        daemon: None,
    };
    // the runtime's limits first: the refused one asks for more than the machine, g for one
    // CPU, h for every CPU g leaves
    let shares = ((n + 2) * 1024).to_string();
    let mut v1 = v1_limit(
        &cg,
        Controller::Cpu,
        &r_rel,
        "cpu.shares",
        &shares,
        &mut clean,
    );
    for (rel, cpus) in [(&g_rel, 1), (&h_rel, n - 1)] {
        let quota = (cpus * 100_000).to_string();
        v1 &= v1_limit(
            &cg,
            Controller::Cpu,
            rel,
            "cpu.cfs_quota_us",
            &quota,
            &mut clean,
        );
        v1 &= v1_limit(
            &cg,
            Controller::Memory,
            rel,
            "memory.limit_in_bytes",
            "268435456",
            &mut clean,
        );
    }
    if !v1 {
        println!("SKIP: needs separate v1 cpu and memory hierarchies (the limits of a v2 container cgroup appear with it)");
        return;
    }
    for rel in [
        top.as_str(),
        &kube,
        &format!("{kube}/burstable"),
        &r_pod,
        &g_pod,
        &h_pod,
    ] {
        cg.create_cpuset(rel, &all, &mems).expect("create parent");
        clean.dirs.push(root.join(rel));
    }
    let state = tempfile::tempdir().unwrap();
    let (daemon, port) = start_daemon_every(
        state.path(),
        &kube,
        "[placement]\npolicy = \"single-numa-node\"\n",
        500,
    );
    clean.daemon = Some(daemon);
    let sock = state.path().join("s.sock");
    let rejected = || {
        common::metric_value(
            &common::metrics_at(port),
            "rebalancer_admission_requests_total{result=\"rejected\"}",
        )
        .unwrap_or(0.0)
    };
    let read = |rel: &str| cg.cpus(rel).unwrap();

    // the refused container, as runc makes it: its cpuset, then its process in it
    cg.create_cpuset(&r_rel, &all, &mems).unwrap();
    clean.dirs.push(root.join(&r_rel));
    let sleeper = Process(Command::new("sleep").arg("600").spawn().unwrap());
    cg.add_proc(Controller::Cpuset, &r_rel, sleeper.0.id())
        .unwrap();
    common::wait_for(10, "the refusal", || rejected() >= 1.0);
    assert!(status(&sock)["bindings"].get(&r_rel).is_none());
    assert_eq!(read(&r_rel), all, "refused: left as the runtime made it");

    let g = root.join(&g_rel);
    std::fs::create_dir(&g).unwrap();
    clean.dirs.push(g.clone());
    wait_written(&g.join("cpuset.cpus"), Instant::now()).expect("g never admitted");
    let excl = read(&g_rel);
    assert_eq!(excl.len(), 1, "{excl}");
    let booked: CpuSet = serde_json::from_value(status(&sock)["exclusive_cpus"].clone()).unwrap();
    assert_eq!(booked, excl);
    common::wait_for(
        10,
        "the refused container moved off the exclusive CPU",
        || read(&r_rel).is_disjoint(&excl),
    );

    let h = root.join(&h_rel);
    std::fs::create_dir(&h).unwrap();
    clean.dirs.push(h.clone());
    common::wait_for(10, "h's refusal", || rejected() >= 2.0);
    let booked: CpuSet = serde_json::from_value(status(&sock)["exclusive_cpus"].clone()).unwrap();
    assert_eq!(booked, excl, "h was not given the refused container's CPUs");
    // a few control rounds (every 500 ms): it stays off every exclusive CPU, never empty
    for _ in 0..6 {
        let (r, mine) = (read(&r_rel), allowed_cpus(sleeper.0.id()));
        assert!(
            !r.is_empty() && r.is_disjoint(&excl),
            "refused on {r}, {excl} exclusive"
        );
        assert!(mine.is_disjoint(&excl), "its process may run on {mine}");
        assert!(read(&g_rel).is_disjoint(&r), "cgroupfs of both");
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("refused container on {}, exclusive {excl}", read(&r_rel));
    drop(sleeper);
}

/// kubelet's in-place resize in watcher mode (real v1 cgroups, kubelet's cgroupfs layout): the
/// container's CFS quota written anew after its admission. Raised from 1 to 2 CPUs, a control
/// round gives it 2 exclusive CPUs, the one it had kept, and the books agree; lowered back, it
/// gives one back to the pool; raised to every CPU with a Burstable container beside it (which
/// keeps one), the resize is refused with its reason (counted) and nothing moves.
#[test]
fn a_resize_written_to_a_containers_limits_follows_in_watcher_mode() {
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: not root");
        return;
    }
    let Ok(cg) = Cgroups::detect(
        Path::new("/sys/fs/cgroup"),
        Path::new("/proc/self/mountinfo"),
    ) else {
        println!("SKIP: no cgroups");
        return;
    };
    let Ok(root) = cg
        .hierarchy(Controller::Cpuset)
        .map(|(p, _)| p.to_path_buf())
    else {
        println!("SKIP: no cpuset controller");
        return;
    };
    let all = cg.effective_cpus("").unwrap();
    let mems = cg.effective_mems("").unwrap();
    let n = all.len();
    if n < 2 {
        println!("SKIP: needs 2 CPUs");
        return;
    }
    let pid = std::process::id();
    let top = format!("rbt-resize-{pid}");
    let kube = format!("{top}/kubepods");
    let (g_pod, b_pod) = (
        format!("{kube}/pod0000aaaa-bbbb-cccc-dddd-{pid:012}"),
        format!("{kube}/burstable/pod0000aaaa-bbbb-cccc-eeee-{pid:012}"),
    );
    let (g_rel, b_rel) = (
        format!("{g_pod}/{}", "a".repeat(64)),
        format!("{b_pod}/{}", "b".repeat(64)),
    );
    let mut clean = Cleanup {
        dirs: Vec::new(),
        daemon: None,
    };
    let quota = |cpus: usize, clean: &mut Cleanup| {
        let q = (cpus * 100_000).to_string();
        v1_limit(&cg, Controller::Cpu, &g_rel, "cpu.cfs_quota_us", &q, clean)
    };
    let mut v1 = quota(1, &mut clean);
    v1 &= v1_limit(
        &cg,
        Controller::Memory,
        &g_rel,
        "memory.limit_in_bytes",
        "268435456",
        &mut clean,
    );
    v1 &= v1_limit(
        &cg,
        Controller::Cpu,
        &b_rel,
        "cpu.shares",
        "512",
        &mut clean,
    );
    if !v1 {
        println!("SKIP: needs separate v1 cpu and memory hierarchies (the limits of a v2 container cgroup appear with it)");
        return;
    }
    for rel in [
        top.as_str(),
        &kube,
        &format!("{kube}/burstable"),
        &g_pod,
        &b_pod,
    ] {
        cg.create_cpuset(rel, &all, &mems).expect("create parent");
        clean.dirs.push(root.join(rel));
    }
    let state = tempfile::tempdir().unwrap();
    let (daemon, port) = start_daemon_every(state.path(), &kube, "", 300);
    clean.daemon = Some(daemon);
    let sock = state.path().join("s.sock");
    let read = |rel: &str| cg.cpus(rel).unwrap();
    let booked =
        || -> CpuSet { serde_json::from_value(status(&sock)["exclusive_cpus"].clone()).unwrap() };

    let g = root.join(&g_rel);
    std::fs::create_dir(&g).unwrap();
    clean.dirs.push(g.clone());
    wait_written(&g.join("cpuset.cpus"), Instant::now()).expect("g never admitted");
    let one = read(&g_rel);
    assert_eq!(one.len(), 1, "{one}");
    assert_eq!(booked(), one);

    assert!(quota(2, &mut clean));
    common::wait_for(10, "the raise to 2 CPUs", || read(&g_rel).len() == 2);
    let two = read(&g_rel);
    assert!(one.is_subset(&two), "its CPU kept: {one} of {two}");
    assert_eq!(booked(), two, "the books give it both exclusively");

    assert!(quota(1, &mut clean));
    common::wait_for(10, "the lowering to 1 CPU", || read(&g_rel).len() == 1);
    let back = read(&g_rel);
    assert!(back.is_subset(&two));
    assert_eq!(booked(), back, "the other CPU is back in the pool");

    let b = root.join(&b_rel);
    std::fs::create_dir(&b).unwrap();
    clean.dirs.push(b.clone());
    wait_written(&b.join("cpuset.cpus"), Instant::now()).expect("b never admitted");
    let shared = read(&b_rel);
    assert!(shared.is_disjoint(&back), "{shared} beside {back}");
    let books = status(&sock)["pods"].clone();
    let refused = || {
        common::metric_value(
            &common::metrics_at(port),
            "rebalancer_admission_rejections_total{reason=\"InsufficientCPU\"}",
        )
        .unwrap_or(0.0)
    };
    assert!(quota(n, &mut clean));
    common::wait_for(10, "the resize's refusal", || refused() >= 1.0);
    assert_eq!(
        status(&sock)["pods"],
        books,
        "a refused resize changes nothing"
    );
    assert_eq!(read(&g_rel), back);
    assert_eq!(read(&b_rel), shared);
    println!("raised to {two}, lowered to {back}, refused {n} CPUs beside a shared container on {shared}");
}

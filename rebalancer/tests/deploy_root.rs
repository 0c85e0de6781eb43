//! Root test of the shipped deployment: the DaemonSet in config/kubernetes/daemonset.yaml run
//! on a real containerd (installed by `cargo xtask setup`) as kubelet would run its pod, driven
//! through the CRI by `tests/cri-tool`.
//!
//! Everything about the pod is read from the manifest, not restated here: the image (the
//! project's own, imported from `cargo xtask image`'s archive), args with `$(NODE_IP)` expanded
//! from the downward API, hostPID / hostNetwork, capabilities, the security context, resources,
//! every volume mount (hostPath, and the ConfigMap written to a directory as kubelet does), and
//! the readiness probe. The node's IP is 127.0.0.1. Host paths outside /sys (kubelet's state
//! directory, the NRI socket's directory, /run/rebalancer) are taken under a private directory
//! standing for the host's root, so the test touches no real kubelet or runtime state; the
//! private containerd serves NRI at that root's /var/run/nri/nri.sock.
//!
//! What it proves: the pod becomes ready (its readiness probe answers 200); the daemon in it
//! registers over NRI (`rebalancer_nri_connected 1`); it adopts the kubelet `cpu_manager_state`
//! written into the host directory the manifest mounts (a Burstable container created next
//! does not get kubelet's CPU); once kubelet's file releases that CPU, a Guaranteed 1-CPU
//! container prints, as its first instruction, an exclusive CPU the daemon gave it, and the
//! Burstable container leaves that CPU.
//!
//! Skips (printing why) as nri_root does: not root, fewer than 2 CPUs, no overlayfs, or (unless
//! `REBALANCER_REQUIRE_CONTAINERD=1`) no containerd installed.
mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use rebalancer::{
    cpuset::CpuSet,
    kubelet_files::{fnv1a32, spew_cpu, CpuCheckpoint},
};
use serde_yaml_ng::Value;

use common::containerd::{install_dir, workspace, Containerd};

const NODE_IP: &str = "127.0.0.1";

/// `cargo xtask image`: the archive's path (the last line it prints).
fn build_image() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["run", "--quiet", "-p", "xtask", "--", "image"])
        .current_dir(workspace())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo xtask image failed");
    let text = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(text.lines().last().expect("the archive's path").trim())
}

/// The manifest's documents by kind.
fn manifest() -> (Value, Value) {
    let text = std::fs::read_to_string(workspace().join("config/kubernetes/daemonset.yaml"))
        .expect("config/kubernetes/daemonset.yaml");
    let mut ds = None;
    let mut cm = None;
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        match v["kind"].as_str() {
            Some("DaemonSet") => ds = Some(v),
            Some("ConfigMap") => cm = Some(v),
            _ => {}
        }
    }
    (ds.expect("a DaemonSet"), cm.expect("a ConfigMap"))
}

fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// Kubernetes quantities as kubelet reads them: CPU in millicores, memory in bytes.
fn millicores(q: &str) -> i64 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => (q.parse::<f64>().unwrap() * 1000.0) as i64,
    }
}

fn bytes(q: &str) -> i64 {
    let units = [("Ki", 1i64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)];
    for (u, m) in units {
        if let Some(n) = q.strip_suffix(u) {
            return n.parse::<i64>().unwrap() * m;
        }
    }
    q.parse().unwrap()
}

/// `$(VAR)` in args, as kubelet expands them from the container's env.
fn expand(arg: &str, env: &[(String, String)]) -> String {
    let mut out = arg.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// A kubelet CPU Manager checkpoint (static policy) with kubelet's checksum.
fn cpu_manager_state(default: &str, entries: &[(&str, &str, &str)]) -> String {
    let mut map: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (pod, ctr, cpus) in entries {
        map.entry(pod.to_string())
            .or_default()
            .insert(ctr.to_string(), cpus.to_string());
    }
    let c = CpuCheckpoint {
        policy_name: "static".into(),
        default_cpu_set: default.into(),
        entries: Some(map.clone()),
        checksum: 0,
    };
    let sum = fnv1a32(&spew_cpu(&c));
    format!(
        r#"{{"policyName":"static","defaultCpuSet":"{default}","entries":{},"checksum":{sum}}}"#,
        serde_json::to_string(&map).unwrap()
    )
}

/// The DaemonSet test's pods and containers: cri-tool specs as kubelet would send them.
impl Containerd {
    /// RunPodSandbox; returns (sandbox id, pod spec for its containers).
    fn pod(&mut self, pod: serde_json::Value) -> (String, serde_json::Value) {
        (self.run_pod(&pod), pod)
    }

    /// CreateContainer + StartContainer; the container id.
    fn container(&self, spec: serde_json::Value) -> String {
        let id = self
            .cri(&["container", &spec.to_string()])
            .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", self.log()));
        self.cri(&["start", &id])
            .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", self.log()));
        id
    }
}

fn wait(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((NODE_IP, port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split(' ').nth(1)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
}

/// The daemon's log and containerd's last lines, for a failure message.
fn show(containerd: &Containerd, daemon_log: &Path) -> String {
    format!(
        "daemon log:\n{}\ncontainerd log (tail):\n{}",
        std::fs::read_to_string(daemon_log).unwrap_or_default(),
        containerd
            .log()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    )
}

fn uid(tag: u64) -> String {
    format!("{:08x}-0000-4000-8000-{tag:012x}", std::process::id())
}

/// The first `Cpus_allowed_list` a container printed.
fn first_cpus(log: &Path) -> CpuSet {
    let mut found = None;
    wait(&format!("{} to print its cpus", log.display()), 30, || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        found = text.lines().find_map(|l| {
            l.split_once("Cpus_allowed_list:")
                .map(|(_, v)| CpuSet::parse(v.trim()).unwrap())
        });
        found.is_some()
    });
    found.unwrap()
}

#[test]
fn the_daemonset_runs_on_containerd_as_its_manifest_says() {
    let Some(install) = install_dir() else { return };
    let _serial = common::serial();
    let (ds, cm) = manifest();
    let pod = &ds["spec"]["template"]["spec"];
    let ctr = &pod["containers"][0];
    assert_eq!(
        pod["hostNetwork"].as_bool(),
        Some(true),
        "cri-tool runs pods on the host network only"
    );
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));

    // The host: a private root for host paths outside /sys.
    let host = tempfile::Builder::new()
        .prefix("rb-host")
        .tempdir_in("/tmp")
        .unwrap();
    let on_host = |p: &str| -> PathBuf {
        if p == "/sys" || p.starts_with("/sys/") {
            PathBuf::from(p)
        } else {
            host.path().join(p.trim_start_matches('/'))
        }
    };
    // kubelet's node: its state directory exists, and its CPU Manager pins CPU 1 to a pod.
    let kubelet_dir = on_host("/var/lib/kubelet");
    std::fs::create_dir_all(&kubelet_dir).unwrap();
    let kubelet_pod = uid(0xcbe1);
    std::fs::write(
        kubelet_dir.join("cpu_manager_state"),
        cpu_manager_state("0", &[(&kubelet_pod, "pinned", "1")]),
    )
    .unwrap();

    // Volumes as kubelet sets them up: hostPath by its type, the ConfigMap as files.
    let mut volumes: BTreeMap<String, PathBuf> = BTreeMap::new();
    for v in pod["volumes"].as_sequence().unwrap() {
        let name = v["name"].as_str().unwrap().to_string();
        let path = if let Some(hp) = v["hostPath"].as_mapping() {
            let p = on_host(hp["path"].as_str().unwrap());
            match v["hostPath"]["type"].as_str().unwrap_or("") {
                "DirectoryOrCreate" => std::fs::create_dir_all(&p).unwrap(),
                "Directory" => assert!(p.is_dir(), "{} must exist", p.display()),
                _ => {}
            }
            p
        } else {
            assert_eq!(
                v["configMap"]["name"].as_str(),
                cm["metadata"]["name"].as_str(),
                "volume {name}: a hostPath or the manifest's ConfigMap"
            );
            let d = host.path().join("configmap").join(&name);
            std::fs::create_dir_all(&d).unwrap();
            for (k, val) in cm["data"].as_mapping().unwrap() {
                std::fs::write(d.join(k.as_str().unwrap()), val.as_str().unwrap()).unwrap();
            }
            d
        };
        volumes.insert(name, path);
    }
    let mounts: Vec<serde_json::Value> = ctr["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| {
            serde_json::json!({
                "host_path": volumes[m["name"].as_str().unwrap()],
                "container_path": m["mountPath"].as_str().unwrap(),
                "readonly": m["readOnly"].as_bool().unwrap_or(false),
            })
        })
        .collect();
    let nri_sock = on_host("/var/run/nri/nri.sock");
    assert!(
        mounts
            .iter()
            .any(|m| m["container_path"] == "/var/lib/kubelet" && m["readonly"] == true),
        "kubelet's state directory mounted read-only"
    );

    let mut containerd = Containerd::start(&install, Some(&nri_sock));
    containerd.import(&build_image());

    // The DaemonSet's pod and container, as kubelet would create them.
    let env: Vec<(String, String)> = ctr["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("status.hostIP") => NODE_IP.to_string(),
                Some(f) => panic!("env {f}: not a field this test knows"),
                None => e["value"].as_str().unwrap().to_string(),
            };
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect();
    let args: Vec<String> = strs(&ctr["args"]).iter().map(|a| expand(a, &env)).collect();
    let sc = &ctr["securityContext"];
    let requests = &ctr["resources"]["requests"];
    let limits = &ctr["resources"]["limits"];
    assert!(
        limits["cpu"].is_null(),
        "a CPU limit would make it Guaranteed"
    );
    let shares = (millicores(requests["cpu"].as_str().unwrap()) * 1024 / 1000).max(2);
    let log_dir = host.path().join("pod-logs/rebalancer");
    std::fs::create_dir_all(&log_dir).unwrap();
    let (ds_pod_id, ds_pod) = containerd.pod(serde_json::json!({
        "name": "rebalancer-node", "uid": uid(0xd5), "qos": "burstable",
        "namespace": ds["metadata"]["namespace"].as_str().unwrap(),
        "log_dir": log_dir, "host_pid": pod["hostPID"].as_bool().unwrap_or(false),
    }));
    let daemon_ctr = containerd.container(serde_json::json!({
        "pod_id": ds_pod_id, "pod": ds_pod,
        "name": ctr["name"].as_str().unwrap(),
        "image": ctr["image"].as_str().unwrap(),
        "command": strs(&ctr["command"]), "args": args, "env": env,
        "cpu_shares": shares,
        "memory_limit": bytes(limits["memory"].as_str().unwrap()),
        "mounts": mounts,
        "security": {
            "add_capabilities": strs(&sc["capabilities"]["add"]),
            "drop_capabilities": strs(&sc["capabilities"]["drop"]),
            "readonly_rootfs": sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
            "no_new_privs": sc["allowPrivilegeEscalation"].as_bool() == Some(false),
            "seccomp_runtime_default": sc["seccompProfile"]["type"].as_str() == Some("RuntimeDefault"),
        },
        "log_path": "rebalancer.log",
    }));
    let daemon_log = log_dir.join("rebalancer.log");

    // Ready as kubelet's readiness probe sees it.
    let probe = &ctr["readinessProbe"]["httpGet"];
    let port_name = probe["port"].as_str().unwrap();
    let port = ctr["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str() == Some(port_name))
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap() as u16;
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(port, probe["path"].as_str().unwrap()).map(|r| r.0) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "never ready\n{}",
            show(&containerd, &daemon_log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Ready means the daemon is healthy; its NRI registration is asynchronous (the plugin
    // thread dials and registers beside the listeners), so it is waited for, within bounds.
    let registered = |m: &str| common::metric_value(m, "rebalancer_nri_connected");
    let mut metrics = get(port, "/metrics").unwrap().1;
    let deadline = Instant::now() + Duration::from_secs(30);
    while registered(&metrics) != Some(1.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        metrics = get(port, "/metrics").unwrap().1;
    }
    assert_eq!(
        registered(&metrics),
        Some(1.0),
        "registered over NRI\n{}",
        show(&containerd, &daemon_log)
    );

    // kubelet's pinned CPU 1 is adopted: a Burstable container is kept off it.
    let status = || -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
            .args(["status", "--json", "--socket"])
            .arg(on_host("/run/rebalancer/rebalancer.sock"))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("status: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    let st = status();
    assert_eq!(
        st["admission"]["kubelet"]["adopted"],
        serde_json::json!([format!("{kubelet_pod}/pinned")]),
        "{st}\n{}",
        show(&containerd, &daemon_log)
    );
    assert!(st["admission"]["kubelet"]["warnings"]
        .as_array()
        .unwrap()
        .is_empty());
    let print = [
        "/bin/sh",
        "-c",
        "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status; exec sleep 3600",
    ];
    let work_logs = host.path().join("pod-logs/work");
    std::fs::create_dir_all(&work_logs).unwrap();
    let (b_id, b_pod) = containerd.pod(serde_json::json!({
        "name": "shared", "uid": uid(0xb1), "qos": "burstable", "log_dir": work_logs,
    }));
    let burstable = containerd.container(serde_json::json!({
        "pod_id": b_id, "pod": b_pod, "name": "b", "cpu_shares": 512,
        "command": print, "log_path": "b.log",
    }));
    assert_eq!(
        first_cpus(&work_logs.join("b.log")),
        CpuSet::parse("0").unwrap(),
        "kubelet's CPU 1 is not shared\n{}",
        show(&containerd, &daemon_log)
    );

    // kubelet releases its pod: the Guaranteed container gets an exclusive CPU at its start.
    std::fs::write(
        kubelet_dir.join("cpu_manager_state"),
        cpu_manager_state("0-1", &[]),
    )
    .unwrap();
    let (g_id, g_pod) = containerd.pod(serde_json::json!({
        "name": "exclusive", "uid": uid(0x91), "qos": "guaranteed", "log_dir": work_logs,
    }));
    let guaranteed = containerd.container(serde_json::json!({
        "pod_id": g_id, "pod": g_pod, "name": "g",
        "cpu_quota": 100_000, "cpu_period": 100_000, "cpu_shares": 1024,
        "memory_limit": 64 << 20, "command": print, "log_path": "g.log",
    }));
    let g_cpus = first_cpus(&work_logs.join("g.log"));
    assert_eq!(
        g_cpus.len(),
        1,
        "{g_cpus}\n{}",
        show(&containerd, &daemon_log)
    );
    let st = status();
    let decided = st["pods"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["containers"].as_array().unwrap().iter())
        .find(|c| c["exclusive"].as_bool() == Some(true))
        .unwrap_or_else(|| panic!("an exclusive container in {st}"));
    assert_eq!(
        serde_json::from_value::<CpuSet>(decided["cpus"].clone()).unwrap(),
        g_cpus,
        "{st}"
    );
    assert!(st["admission"]["kubelet"]["adopted"]
        .as_array()
        .unwrap()
        .is_empty());
    wait(
        "the Burstable container to leave the exclusive CPU",
        30,
        || {
            containerd
                .spec_cpus(&burstable)
                .intersection(&g_cpus)
                .is_empty()
        },
    );
    assert_eq!(containerd.spec_cpus(&guaranteed), g_cpus);
    let _ = containerd.cri(&["stop", &daemon_ctr]);
}

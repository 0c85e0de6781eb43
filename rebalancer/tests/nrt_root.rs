//! The NodeResourceTopology export against a real Kubernetes API server: etcd and Kubernetes'
//! own CRD server (`apiextensions-apiserver`, built by `cargo xtask setup` from Debian's Go
//! packages into target/apiserver), a test CA with an admin client certificate
//! (`O=system:masters`) and a kubeconfig, the upstream CRD installed and Established. A
//! daemon (dry run, on a 5-node fixture machine) exports its books; pods are admitted and
//! released through its API, and the object read back through the API server must equal the
//! books each time — also after the API server was hung, stopped and started again, and after
//! the daemon restarts over an object someone else changed. With the API server hung or down,
//! admissions answer at once and the exporter is degraded in /healthz, `status` and a metric.
//!
//! Needs the binaries: skipped with a printed reason without them, except under
//! `cargo xtask test` (`REBALANCER_REQUIRE_APISERVER=1`), where their absence fails.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use rebalancer::nrt::client::Client;
use serde_json::{json, Value};

const NODE: &str = "worker-1";
const CRD: &str = "noderesourcetopologies.topology.node.k8s.io";
const GIB: u64 = 1 << 30;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let st = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(st.success(), "openssl {args:?}");
}

/// A CA, a serving certificate for 127.0.0.1 and an admin client certificate.
fn pki(dir: &Path) {
    let key = |name: &str| {
        openssl(
            dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                name,
            ],
        )
    };
    key("ca.key");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=test-ca",
            "-days",
            "2",
            "-out",
            "ca.crt",
        ],
    );
    for (name, subj, ext) in [
        (
            "server",
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
        ),
        (
            "admin",
            "/O=system:masters/CN=admin",
            "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        ),
    ] {
        key(&format!("{name}.key"));
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-subj",
                subj,
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.crt"),
            ],
        );
    }
}

struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    etcd_port: u16,
    api_port: u16,
    _etcd: Proc,
    api: Option<Proc>,
}

impl Cluster {
    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn start(bin: &Path, etcd: &Path) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("rb-nrt")
            .tempdir_in("/tmp")
            .unwrap();
        pki(dir.path());
        let (etcd_port, peer_port, api_port) = (port(), port(), port());
        let etcd = Command::new(etcd)
            .arg(format!("--data-dir={}", dir.path().join("etcd").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
            ))
            .arg(format!(
                "--initial-cluster=default=http://127.0.0.1:{peer_port}"
            ))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
            .spawn()
            .expect("etcd");
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: https://127.0.0.1:{api_port}\n    certificate-authority: {d}/ca.crt\nusers:\n- name: admin\n  user:\n    client-certificate: {d}/admin.crt\n    client-key: {d}/admin.key\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\ncurrent-context: test\n"
            ),
        )
        .unwrap();
        let mut c = Cluster {
            bin: bin.to_path_buf(),
            dir,
            etcd_port,
            api_port,
            _etcd: Proc(etcd),
            api: None,
        };
        c.start_api();
        c
    }

    fn start_api(&mut self) {
        let d = self.dir.path();
        let kc = self.kubeconfig();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("apiserver.log"))
            .unwrap();
        let child = Command::new(&self.bin)
            .arg(format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.api_port))
            .arg(format!("--cert-dir={}", d.join("certs").display()))
            .arg(format!("--tls-cert-file={}", d.join("server.crt").display()))
            .arg(format!(
                "--tls-private-key-file={}",
                d.join("server.key").display()
            ))
            .arg(format!("--client-ca-file={}", d.join("ca.crt").display()))
            .arg(format!("--authentication-kubeconfig={}", kc.display()))
            .arg(format!("--authorization-kubeconfig={}", kc.display()))
            .arg(format!("--kubeconfig={}", kc.display()))
            .arg("--authentication-skip-lookup")
            .arg("--enable-priority-and-fairness=false")
            .arg("--disable-admission-plugins=NamespaceLifecycle,MutatingAdmissionPolicy,MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("apiextensions-apiserver");
        self.api = Some(Proc(child));
        let client = self.client();
        wait_for(90, "the API server to answer", || {
            client
                .request("GET", "/apis/apiextensions.k8s.io/v1", None)
                .is_ok_and(|r| r.status == 200)
        });
    }

    fn client(&self) -> Client {
        Client::from_kubeconfig(&self.kubeconfig()).unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default()
    }

    fn install_crd(&self) {
        let yaml = std::fs::read_to_string(
            workspace().join("config/kubernetes/noderesourcetopology-crd.yaml"),
        )
        .unwrap();
        let crd: Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert!(
            crd["metadata"]["annotations"]["api-approved.kubernetes.io"].is_string(),
            "a *.k8s.io CRD needs the api-approved annotation"
        );
        let c = self.client();
        let r = c
            .request(
                "POST",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                Some(&serde_json::to_vec(&crd).unwrap()),
            )
            .unwrap();
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        wait_for(60, "the CRD to be Established", || {
            c.request(
                "GET",
                &format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}"),
                None,
            )
            .ok()
            .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok())
            .and_then(|v| {
                v["status"]["conditions"].as_array().map(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                })
            })
            .unwrap_or(false)
        });
    }

    /// The exported object, or None.
    fn object(&self) -> Option<Value> {
        let r = self
            .client()
            .request(
                "GET",
                &format!("{}/{NODE}", rebalancer::nrt::COLLECTION),
                None,
            )
            .ok()?;
        (r.status == 200).then(|| serde_json::from_slice(&r.body).unwrap())
    }

    fn signal_api(&self, sig: i32) {
        let pid = self.api.as_ref().unwrap().0.id() as i32;
        unsafe { libc::kill(pid, sig) };
    }
}

struct Daemon {
    child: Option<Child>,
    socket: PathBuf,
    metrics_port: u16,
    config: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(kubeconfig: &Path) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("rb-nrtd")
            .tempdir_in("/tmp")
            .unwrap();
        let socket = dir.path().join("api.sock");
        let metrics_port = port();
        let config = dir.path().join("c.toml");
        std::fs::write(
            &config,
            format!(
                "[daemon]\ndry_run = true\nstate_dir = \"{}\"\n[ebpf]\nenabled = false\n[server]\nsocket = \"{}\"\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\n[kubernetes]\nadmission = \"off\"\nkubelet_state_dir = \"\"\nexport_topology = true\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\nexport_interval_ms = 200\n",
                dir.path().join("state").display(),
                socket.display(),
                kubeconfig.display()
            ),
        )
        .unwrap();
        let mut d = Daemon {
            child: None,
            socket,
            metrics_port,
            config,
            log: dir.path().join("daemon.log"),
            _dir: dir,
        };
        d.restart();
        d
    }

    fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_rebalancer"))
            .args(["run", "--config"])
            .arg(&self.config)
            .arg("--sysfs-root")
            .arg(workspace().join("tests/fixtures/sysfs/small-snc"))
            .env("RUST_LOG", "rebalancer=info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_for(30, "the daemon's API", || {
            UnixStream::connect(&self.socket).is_ok()
                && req(&self.socket, "GET", "/v1/status", "").0 == 200
        });
    }

    fn status(&self) -> Value {
        req(&self.socket, "GET", "/v1/status", "").1
    }

    fn healthz(&self) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        write!(
            s,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        (
            head.split_whitespace().nth(1).unwrap().parse().unwrap(),
            body.to_string(),
        )
    }

    fn metrics(&self) -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn req(sock: &Path, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut s = UnixStream::connect(sock).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (
        code,
        serde_json::from_str(body).unwrap_or(Value::String(body.to_string())),
    )
}

/// Admits a pod through the daemon's API; how long the answer took.
fn admit(d: &Daemon, pod: &Value) -> Duration {
    let t = Instant::now();
    let (code, body) = req(&d.socket, "POST", "/v1/admit", &pod.to_string());
    let took = t.elapsed();
    assert_eq!(code, 200, "{body}");
    took
}

fn guaranteed(uid: &str, cpus: u64, mem: u64) -> Value {
    json!({"uid": uid, "containers": [{"name": "c", "cpu_request_millis": cpus * 1000,
        "cpu_limit_millis": cpus * 1000, "memory_bytes": mem, "memory_limit_bytes": mem}]})
}

fn burstable(uid: &str) -> Value {
    json!({"uid": uid, "containers": [{"name": "c", "cpu_request_millis": 500,
        "memory_bytes": 256u64 << 20}]})
}

/// A CPU set as `status` sends it: a JSON array of CPU ids.
fn cpuset(s: &Value) -> Vec<u32> {
    s.as_array()
        .unwrap_or_else(|| panic!("a CPU set as a JSON array, got {s}"))
        .iter()
        .map(|v| v.as_u64().expect("a CPU id") as u32)
        .collect()
}

/// zone name → resource name → available.
fn available(
    obj: &Value,
) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>> {
    obj["zones"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| {
            let res = z["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["name"].as_str().unwrap().to_string(),
                        r["available"].as_str().unwrap().parse().unwrap(),
                    )
                })
                .collect();
            (z["name"].as_str().unwrap().to_string(), res)
        })
        .collect()
}

/// Each zone's available CPUs as the books (`status`) say: the node's CPUs less the reserved
/// and the exclusive ones.
fn cpus_per_books(status: &Value) -> std::collections::BTreeMap<String, u64> {
    let taken: Vec<u32> = cpuset(&status["exclusive_cpus"])
        .into_iter()
        .chain(cpuset(&status["reserved_cpus"]))
        .collect();
    status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let free = cpuset(&n["cpus"])
                .into_iter()
                .filter(|c| !taken.contains(c))
                .count() as u64;
            (format!("node-{}", n["id"]), free)
        })
        .collect()
}

/// The memory node the pod's container was given (a Guaranteed pod's memory is booked there).
fn mem_node(status: &Value, uid: &str) -> String {
    let pod = status["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["uid"] == uid)
        .unwrap();
    let mems = cpuset(&pod["containers"][0]["mems"]);
    assert_eq!(mems.len(), 1, "{pod}");
    format!("node-{}", mems[0])
}

/// Waits until the object's available CPUs equal the books' and its available memory equals
/// `base` less `booked` (zone → bytes).
fn converges(c: &Cluster, d: &Daemon, base: &Value, booked: &[(String, u64)], what: &str) {
    let mut last = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = d.status();
        let want_cpus = cpus_per_books(&st);
        let mut want_mem: std::collections::BTreeMap<String, u64> = available(base)
            .into_iter()
            .map(|(z, r)| (z, r["memory"]))
            .collect();
        for (z, b) in booked {
            *want_mem.get_mut(z).unwrap() -= b;
        }
        if let Some(obj) = c.object() {
            let got = available(&obj);
            let cpus: std::collections::BTreeMap<_, _> =
                got.iter().map(|(z, r)| (z.clone(), r["cpu"])).collect();
            let mem: std::collections::BTreeMap<_, _> =
                got.iter().map(|(z, r)| (z.clone(), r["memory"])).collect();
            if cpus == want_cpus && mem == want_mem {
                return;
            }
            last = Some(format!(
                "cpus {cpus:?} want {want_cpus:?}; memory {mem:?} want {want_mem:?}"
            ));
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the object did not converge to the books: {last:?}\ndaemon log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_object_follows_the_books_through_api_server_outages_and_restarts() {
    let dir = std::env::var_os("REBALANCER_APISERVER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/apiserver"));
    let bin = dir.join("bin/apiextensions-apiserver");
    let etcd = dir.join("root/usr/bin/etcd");
    if !bin.exists() || !etcd.exists() {
        let msg = format!(
            "no {} or {} (cargo xtask setup builds them)",
            bin.display(),
            etcd.display()
        );
        assert!(
            std::env::var_os("REBALANCER_REQUIRE_APISERVER").is_none(),
            "{msg}"
        );
        println!("SKIP: {msg}");
        return;
    }
    let mut cluster = Cluster::start(&bin, &etcd);
    cluster.install_crd();

    let mut d = Daemon::start(&cluster.kubeconfig());
    wait_for(30, "the first export", || cluster.object().is_some());
    let base = cluster.object().unwrap();
    // What the scheduler plugin reads.
    assert_eq!(base["apiVersion"], "topology.node.k8s.io/v1alpha2");
    assert_eq!(base["zones"].as_array().unwrap().len(), 5, "{base}");
    assert_eq!(base["zones"][0]["type"], "Node");
    assert!(base["zones"][0]["costs"].as_array().unwrap().len() == 5);
    let attrs: Vec<&str> = base["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(attrs, ["topologyManagerPolicy", "topologyManagerScope"]);
    converges(&cluster, &d, &base, &[], "at start");
    assert_eq!(d.status()["topology_export"]["state"], "ok");
    assert_eq!(d.healthz(), (200, "ok\n".into()));

    // A Guaranteed pod takes exclusive CPUs and memory on one node; a Burstable one neither.
    let normal = admit(&d, &guaranteed("pod-g", 2, GIB));
    admit(&d, &burstable("pod-b"));
    let st = d.status();
    let g_node = mem_node(&st, "pod-g");
    assert_eq!(cpuset(&st["exclusive_cpus"]).len(), 2);
    converges(
        &cluster,
        &d,
        &base,
        &[(g_node.clone(), GIB)],
        "after admissions",
    );

    // A release follows.
    assert_eq!(req(&d.socket, "DELETE", "/v1/pods/pod-g", "").0, 200);
    converges(&cluster, &d, &base, &[], "after the release");

    // A hung API server (stopped: connections are accepted, nothing answers), then a dead
    // one: admissions answer as before, the exporter is degraded.
    cluster.signal_api(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(500));
    let hung = admit(&d, &guaranteed("pod-h", 2, GIB));
    cluster.signal_api(libc::SIGCONT);
    cluster.api = None;
    let down = admit(&d, &guaranteed("pod-d", 1, GIB));
    let limit = normal.max(Duration::from_millis(50)) * 20;
    assert!(
        hung < limit && down < limit,
        "admission took {hung:?} (API server hung) / {down:?} (down), {normal:?} with it up"
    );
    wait_for(30, "the exporter to be degraded", || {
        d.status()["topology_export"]["state"] == "degraded"
    });
    let (code, text) = d.healthz();
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("degraded: kubernetes: "), "{text}");
    assert!(
        d.metrics()
            .contains("rebalancer_component_degraded{component=\"kubernetes\"} 1"),
        "{}",
        d.metrics()
    );
    let reason = d.status()["topology_export"]["reason"].clone();
    assert!(reason.as_str().unwrap().contains("127.0.0.1"), "{reason}");

    // The API server back: converges to the books with what was admitted meanwhile.
    cluster.start_api();
    let st = d.status();
    let booked = vec![(mem_node(&st, "pod-h"), GIB), (mem_node(&st, "pod-d"), GIB)];
    let mut booked_sum: Vec<(String, u64)> = Vec::new();
    for (z, b) in booked {
        match booked_sum.iter_mut().find(|(x, _)| *x == z) {
            Some(e) => e.1 += b,
            None => booked_sum.push((z, b)),
        }
    }
    converges(
        &cluster,
        &d,
        &base,
        &booked_sum,
        "after the API server came back",
    );
    wait_for(30, "health to recover", || {
        d.healthz() == (200, "ok\n".into())
    });
    assert!(d
        .metrics()
        .contains("rebalancer_component_degraded{component=\"kubernetes\"} 0"));

    // Someone else changes the object while the daemon is down; a restart repairs it.
    d.child.take().map(|mut c| {
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait()
    });
    let mut obj = cluster.object().unwrap();
    for z in obj["zones"].as_array_mut().unwrap() {
        for r in z["resources"].as_array_mut().unwrap() {
            r["available"] = json!("0");
        }
    }
    let r = cluster
        .client()
        .request(
            "PUT",
            &format!("{}/{NODE}", rebalancer::nrt::COLLECTION),
            Some(&serde_json::to_vec(&obj).unwrap()),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    d.restart();
    let st = d.status();
    let mut booked: Vec<(String, u64)> = Vec::new();
    for p in st["pods"].as_array().unwrap() {
        if p["qos"] == "Guaranteed" {
            let z = mem_node(&st, p["uid"].as_str().unwrap());
            match booked.iter_mut().find(|(x, _)| *x == z) {
                Some(e) => e.1 += GIB,
                None => booked.push((z, GIB)),
            }
        }
    }
    converges(&cluster, &d, &base, &booked, "after the daemon restarted");
    let _ = cluster.log();
}

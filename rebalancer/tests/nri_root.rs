//! Root test of the NRI plugin against a real containerd (Debian trixie's 1.7.24, installed
//! into `target/containerd` by `cargo xtask setup`), driven through its CRI as kubelet would
//! (`tests/cri-tool`): cgroupfs driver, host network, a `cgroup_parent` per pod.
//!
//! What it proves: a Guaranteed 1-CPU, a Burstable and a BestEffort container each print, as
//! their very first action, `Cpus_allowed_list` / `Mems_allowed_list`, and these equal the
//! daemon's decision; the Guaranteed CPU leaves the Burstable container's cpuset (an NRI
//! update, through the runtime); a container that does not fit fails CreateContainer with the
//! reason; a change the daemon makes outside the hooks (the control round's CPU-hotplug
//! replacement, a CPU taken offline in a sysfs copy of this machine) reaches the runtime as an
//! NRI UpdateContainers, not a cgroupfs write (containerd logs the request; its container spec,
//! read through the CRI, agrees); a daemon restart adopts the running containers with no double allocation; a
//! containerd restart is survived (the plugin reconnects, and admits again); removal releases
//! and the shared container gets the CPU back; under single-numa-node on a 4-node topology
//! (a fixture as `daemon.sysfs_root`) a pod that cannot be aligned is refused with
//! TopologyAffinityError; per-pod annotations: a pod left to the runtime keeps its cpuset, and
//! a pod annotated never to move is not moved by the control round that moves its twin.
//!
//! Skips (printing why) when not root, without 2 CPUs or cgroups, or when the kernel has no
//! overlayfs. Missing containerd binaries skip too, unless `REBALANCER_REQUIRE_CONTAINERD=1`
//! (`cargo xtask test` sets it), where they fail the test.
mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use rebalancer::cpuset::CpuSet;

use common::containerd::{install_dir as preflight, workspace, Containerd};

/// The plugin-side view of pods and containers this file's tests make.
impl Containerd {
    fn pod(&mut self, name: &str, qos: &str) -> Pod {
        self.pod_with(name, qos, None)
    }

    /// RunPodSandbox; `totals` (cpu_quota / cpu_period / cpu_shares / memory_limit) set on the
    /// sandbox's `linux.resources` as kubelet ≥ 1.26 does.
    fn pod_with(&mut self, name: &str, qos: &str, totals: Option<serde_json::Value>) -> Pod {
        self.pod_full(name, qos, totals, serde_json::json!({}))
    }

    fn pod_full(
        &mut self,
        name: &str,
        qos: &str,
        totals: Option<serde_json::Value>,
        annotations: serde_json::Value,
    ) -> Pod {
        let uid = format!(
            "{:08x}-0000-4000-8000-{:012x}",
            std::process::id(),
            rand_u64() & 0xffff_ffff_ffff
        );
        let log_dir = self.log_dir().join(name);
        std::fs::create_dir_all(&log_dir).unwrap();
        let mut spec = serde_json::json!({"name": name, "uid": uid, "qos": qos,
            "log_dir": log_dir, "annotations": annotations});
        if let Some(t) = totals {
            spec["resources"] = t;
        }
        let id = self.run_pod(&spec);
        Pod {
            id,
            spec,
            log_dir,
            uid,
            qos: qos.into(),
        }
    }

    /// RunPodSandbox of a pod with these annotations (kubelet passes a pod's annotations to
    /// the sandbox; NRI shows them to plugins).
    fn pod_annotated(&mut self, name: &str, qos: &str, annotations: &[(&str, &str)]) -> Pod {
        let ann: serde_json::Map<_, _> = (annotations.iter())
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        self.pod_full(name, qos, None, ann.into())
    }

    /// CreateContainer + StartContainer; Err(CreateContainer's error).
    fn container(&self, pod: &Pod, name: &str, res: serde_json::Value) -> Result<Ctr, String> {
        self.container_running(pod, name, res, "exec sleep 3600")
    }

    /// [`Containerd::container`] whose process, after printing where it may run, runs `then`
    /// (a busybox shell command line).
    fn container_running(
        &self,
        pod: &Pod,
        name: &str,
        res: serde_json::Value,
        then: &str,
    ) -> Result<Ctr, String> {
        let mut spec = serde_json::json!({
            "pod_id": pod.id, "pod": pod.spec, "name": name,
            "command": ["/bin/sh", "-c",
                format!("grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status; {then}")],
            "log_path": format!("{name}.log"),
        });
        for (k, v) in res.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let id = self.cri(&["container", &spec.to_string()])?;
        self.cri(&["start", &id])
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}"));
        let cgroup = format!(
            "{}/pod{}/{id}",
            match pod.qos.as_str() {
                "guaranteed" => "kubepods".to_string(),
                q => format!("kubepods/{q}"),
            },
            pod.uid
        );
        Ok(Ctr {
            id,
            log: pod.log_dir.join(format!("{name}.log")),
            cgroup,
        })
    }

    /// The runtime's view of a container's cpus: the OCI spec it keeps for it.
    fn inspect(&self, id: &str) -> CpuSet {
        self.spec_cpus(id)
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u64::from_le_bytes(b)
}

struct Pod {
    id: String,
    spec: serde_json::Value,
    log_dir: PathBuf,
    uid: String,
    qos: String,
}

struct Ctr {
    id: String,
    log: PathBuf,
    cgroup: String,
}

impl Ctr {
    /// (Cpus_allowed_list, Mems_allowed_list) the container printed first.
    fn first_print(&self) -> (CpuSet, CpuSet) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.split_once(&format!("{name}:")).map(|(_, v)| v.trim()))
                    .map(|v| CpuSet::parse(v).unwrap())
            };
            if let (Some(c), Some(m)) = (field("Cpus_allowed_list"), field("Mems_allowed_list")) {
                return (c, m);
            }
            assert!(
                Instant::now() < deadline,
                "container {} printed nothing: {text:?}",
                self.id
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The live cpuset.cpus of its cgroup.
    fn live_cpus(&self) -> CpuSet {
        let cg = common::root_cgroups().unwrap();
        cg.cpus(&self.cgroup)
            .unwrap_or_else(|e| panic!("cpuset of {}: {e}", self.cgroup))
    }
}

/// The daemon's decision for a container: (cpus, mems, exclusive) from `status`.
fn decision(d: &common::Daemon, id: &str) -> Option<(CpuSet, CpuSet, bool)> {
    let st = d.status();
    let key_end = format!("/{}", &id[..12]);
    st["pods"].as_array()?.iter().find_map(|p| {
        if !p["uid"].as_str()?.ends_with(&key_end) {
            return None;
        }
        let c = &p["containers"][0];
        let parse = |v: &serde_json::Value| {
            serde_json::from_value::<CpuSet>(v.clone()).expect("cpuset in status")
        };
        Some((
            parse(&c["cpus"]),
            parse(&c["mems"]),
            c["exclusive"].as_bool()?,
        ))
    })
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn nri_daemon(nri_sock: &Path, daemon_extra: &str, extra: &str) -> common::Daemon {
    common::Daemon::start_daemon_extra(
        daemon_extra,
        "",
        &format!(
            // Unsolicited runtime updates forced on (`auto` turns them off for this containerd
            // 1.7, containerd#13733): what this test proves is that, on, the daemon's own
            // changes reach the runtime.
            "[ebpf]\nenabled = false\n[kubernetes]\nadmission = \"nri\"\nnri_socket = \"{}\"\nnri_runtime_updates = true\n{extra}",
            nri_sock.display()
        ),
    )
}

fn connected(d: &common::Daemon) -> bool {
    d.status()["admission"]["nri_connected"].as_bool() == Some(true)
}

const GUARANTEED_1CPU: &str =
    r#"{"cpu_quota":100000,"cpu_period":100000,"cpu_shares":1024,"memory_limit":67108864}"#;
const BURSTABLE: &str = r#"{"cpu_shares":256}"#;
const BESTEFFORT: &str = r#"{"cpu_shares":2}"#;

fn res(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap()
}

#[test]
fn containers_are_placed_at_creation_through_nri() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let t0 = Instant::now();
    let mut ctd = Containerd::start(&install, None);
    // This machine's topology as a sysfs copy the test can take a CPU offline in.
    let sysfs = tempfile::tempdir().unwrap();
    let cp = Command::new("cp")
        .arg("-r")
        .arg(workspace().join("tests/fixtures/sysfs/this-machine/."))
        .arg(sysfs.path())
        .status()
        .unwrap();
    assert!(cp.success());
    let cpu_online = sysfs.path().join("devices/system/cpu/online");
    let mut d = nri_daemon(
        &ctd.nri_sock(),
        &format!("sysfs_root = \"{}\"", sysfs.path().display()),
        "",
    );
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    assert_eq!(d.status()["admission"]["mode"], "nri");
    assert_eq!(d.metric("rebalancer_nri_connected"), Some(1.0));
    let all = common::root_cgroups().unwrap().effective_cpus("").unwrap();

    // Burstable first: it gets the whole shared pool, from its first instruction.
    let bp = ctd.pod("burstable", "burstable");
    let b = ctd.container(&bp, "b", res(BURSTABLE)).unwrap();
    let (b_cpus, b_mems) = b.first_print();
    let (dc, dm, excl) = decision(&d, &b.id).expect("burstable admitted");
    assert_eq!((&b_cpus, &b_mems, excl), (&dc, &dm, false));
    assert_eq!(
        b_cpus, all,
        "the burstable container starts on the whole shared pool"
    );

    // Guaranteed 1 CPU: exclusive from its first instruction; the burstable one loses it.
    let gp = ctd.pod("guaranteed", "guaranteed");
    let g = ctd.container(&gp, "g", res(GUARANTEED_1CPU)).unwrap();
    let (g_cpus, g_mems) = g.first_print();
    let (dc, dm, excl) = decision(&d, &g.id).expect("guaranteed admitted");
    assert_eq!((&g_cpus, &g_mems, excl), (&dc, &dm, true));
    assert_eq!(g_cpus.len(), 1);
    wait_for(
        "the burstable cpuset to shrink",
        Duration::from_secs(5),
        || b.live_cpus().is_disjoint(&g_cpus),
    );
    assert_eq!(b.live_cpus(), all.difference(&g_cpus));

    // BestEffort after: never on the exclusive CPU.
    let ep = ctd.pod("besteffort", "besteffort");
    let e = ctd.container(&ep, "e", res(BESTEFFORT)).unwrap();
    let (e_cpus, e_mems) = e.first_print();
    let (dc, dm, _) = decision(&d, &e.id).expect("besteffort admitted");
    assert_eq!((&e_cpus, &e_mems), (&dc, &dm));
    assert!(e_cpus.is_disjoint(&g_cpus), "{e_cpus} overlaps {g_cpus}");
    println!(
        "guaranteed {g_cpus}/{g_mems}, burstable {b_cpus} -> {}, besteffort {e_cpus}",
        b.live_cpus()
    );

    // A change the daemon makes outside the NRI hooks — here the control round's CPU-hotplug
    // replacement of the Guaranteed container's CPU, which went offline (in the sysfs copy) —
    // goes to the runtime as an NRI UpdateContainers (applied by runc update), not to
    // cgroupfs behind its back: containerd logs the plugin's request and its spec of the
    // container holds the CPUs the daemon gave. (Two CPUs leave no spare one to replace it
    // with: the books keep its CPU for its return, and it runs on the shared pool meanwhile,
    // written through the runtime.)
    let asked = || ctd.log().matches("requested container updates").count();
    let asked_before = asked();
    let applied = |d: &common::Daemon| {
        d.metric("rebalancer_nri_updates_total{reason=\"applied\"}")
            .unwrap_or(0.0)
    };
    let applied_before = applied(&d);
    std::fs::write(&cpu_online, format!("{}\n", all.difference(&g_cpus))).unwrap();
    wait_for(
        "the hotplug replacement to reach the runtime",
        Duration::from_secs(15),
        || applied(&d) > applied_before,
    );
    assert!(
        d.log_text().contains("exclusive CPUs went offline"),
        "{}",
        d.log_text()
    );
    assert!(
        asked() > asked_before,
        "containerd saw no NRI container update"
    );
    assert_eq!(
        ctd.inspect(&g.id),
        all.difference(&g_cpus),
        "the runtime's spec of the container: the shared pool"
    );
    // (its series exist from the start, at 0)
    let direct: f64 = (d.metrics().lines())
        .filter(|l| l.starts_with("rebalancer_nri_direct_writes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        direct,
        0.0,
        "a change of a runtime container was written to cgroupfs directly: {}",
        d.metrics()
    );
    std::fs::write(&cpu_online, format!("{all}\n")).unwrap();
    wait_for(
        "the topology to have the CPU back",
        Duration::from_secs(15),
        || d.log_text().matches("topology rebuilt").count() >= 2,
    );

    // Does not fit: CreateContainer fails with the reason; nothing changes.
    let before = d.status()["pods"].clone();
    let big = ctd.pod("too-big", "guaranteed");
    let n = all.len() as i64 + 1;
    let err = ctd
        .container(
            &big,
            "big",
            serde_json::json!({"cpu_quota": n * 100000, "cpu_period": 100000, "cpu_shares": n * 1024, "memory_limit": 67108864}),
        )
        .err()
        .expect("a container larger than the machine is refused");
    assert!(err.contains("InsufficientCPU"), "{err}");
    assert!(err.contains("rebalancer refused container big"), "{err}");
    assert_eq!(d.status()["pods"], before, "a refusal changes nothing");

    // Daemon restart: Synchronize adopts from the checkpoint, no double allocation.
    let excl_before = d.status()["exclusive_cpus"].clone();
    // the log is appended across restarts: this run's Synchronize is one more line
    let syncs = |d: &common::Daemon| {
        d.log_text()
            .matches("synchronized with the runtime")
            .count()
    };
    let synced_before = syncs(&d);
    d.signal_and_wait(libc::SIGTERM);
    d.restart();
    wait_for("the plugin to re-register", Duration::from_secs(20), || {
        connected(&d)
    });
    wait_for(
        "the runtime's Synchronize after the restart",
        Duration::from_secs(20),
        || syncs(&d) > synced_before,
    );
    assert_eq!(
        d.status()["pods"],
        before,
        "restart keeps every allocation once"
    );
    assert_eq!(d.status()["exclusive_cpus"], excl_before);

    // containerd restart: the plugin reconnects and admits again.
    ctd.stop();
    wait_for("the plugin to notice", Duration::from_secs(10), || {
        !connected(&d)
    });
    assert_eq!(d.metric("rebalancer_nri_connected"), Some(0.0));
    ctd.spawn();
    wait_for("the plugin to reconnect", Duration::from_secs(20), || {
        connected(&d)
    });
    assert_eq!(
        d.status()["pods"],
        before,
        "reconnect keeps every allocation once"
    );
    let e2 = ctd.container(&ep, "e2", res(BESTEFFORT)).unwrap();
    let (e2_cpus, _) = e2.first_print();
    assert!(e2_cpus.is_disjoint(&g_cpus));
    assert!(decision(&d, &e2.id).is_some());

    // Removal releases; the shared containers get the CPU back.
    ctd.cri(&["stop", &g.id]).unwrap();
    ctd.cri(&["rm", &g.id]).unwrap();
    wait_for("the release", Duration::from_secs(5), || {
        decision(&d, &g.id).is_none()
    });
    assert_eq!(d.status()["exclusive_cpus"], serde_json::json!([]));
    wait_for(
        "the burstable cpuset to grow back",
        Duration::from_secs(5),
        || b.live_cpus() == all && ctd.inspect(&b.id) == all,
    );

    ctd.remove_pods();
    wait_for(
        "pod removal to release everything",
        Duration::from_secs(5),
        || d.status()["pods"].as_array().is_some_and(|p| p.is_empty()),
    );
    assert!(
        d.status()["bindings"]
            .as_object()
            .is_some_and(|b| b.is_empty()),
        "{}",
        d.status()["bindings"]
    );
    d.signal_and_wait(libc::SIGTERM);

    // single-numa-node on a 4-node machine (fixture): 21 CPUs fit no node of 20.
    let fixture = workspace().join("tests/fixtures/sysfs/intel-snc");
    let d2 = nri_daemon(
        &ctd.nri_sock(),
        &format!("sysfs_root = \"{}\"", fixture.display()),
        "[placement]\npolicy = \"single-numa-node\"\n",
    );
    wait_for(
        "the second plugin to register",
        Duration::from_secs(20),
        || connected(&d2),
    );
    let wide = ctd.pod("unaligned", "guaranteed");
    let err = ctd
        .container(
            &wide,
            "wide",
            serde_json::json!({"cpu_quota": 2_100_000, "cpu_period": 100000, "cpu_shares": 21 * 1024, "memory_limit": 67108864}),
        )
        .err()
        .expect("21 CPUs on nodes of 20 cannot be aligned under single-numa-node");
    assert!(err.contains("TopologyAffinityError"), "{err}");
    assert!(err.contains("SingleNumaNode"), "{err}");
    assert!(d2.status()["pods"].as_array().is_some_and(|p| p.is_empty()));
    println!("refusal as the runtime reports it: {}", err.trim());
    println!("containerd tests took {:?}", t0.elapsed());
}

/// Pod scope through a real containerd: the sandbox carries the pod's totals in
/// `linux.resources` (as kubelet ≥ 1.26 sets them), containerd passes them to the plugin as
/// `PodSandbox.linux.pod_resources`, and the pod's two 1-CPU containers arrive one at a time.
/// The first is placed and the pod holds the second CPU for the container still to come (seen
/// in `status`); the second container gets exactly the held CPU, from its first instruction.
#[test]
fn a_pod_scope_pod_is_admitted_one_container_at_a_time_through_nri() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let mut ctd = Containerd::start(&install, None);
    let online = common::root_cgroups()
        .unwrap()
        .effective_cpus("")
        .unwrap_or_default();
    if online.len() < 2 {
        eprintln!("SKIP: pod scope needs 2 CPUs, this machine has {online}");
        return;
    }
    let d = nri_daemon(&ctd.nri_sock(), "", "[placement]\nscope = \"pod\"\n");
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    // The runtime that configured the plugin, and the unsolicited-updates decision (forced on
    // here; containerd 1.7 is named as affected by containerd#13733).
    let rt = d.status()["admission"]["nri_runtime"].clone();
    assert_eq!(rt["name"], "containerd", "{rt}");
    assert!(rt["version"].as_str().unwrap().contains("1.7"), "{rt}");
    assert_eq!(rt["unsolicited_updates"], true, "{rt}");
    assert!(rt["reason"].as_str().unwrap().contains("13733"), "{rt}");
    let pod = ctd.pod_with(
        "scoped",
        "guaranteed",
        Some(res(
            r#"{"cpu_quota":200000,"cpu_period":100000,"cpu_shares":2048,"memory_limit":134217728}"#,
        )),
    );
    let a = ctd
        .container(&pod, "a", res(GUARANTEED_1CPU))
        .unwrap_or_else(|e| panic!("CreateContainer a: {e}\n{}", d.log_text()));
    let (a_cpus, _) = a.first_print();
    assert_eq!(a_cpus.len(), 1, "{a_cpus}");
    let held = |d: &common::Daemon| {
        let st = d.status();
        let p = st["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["uid"].as_str() == Some(pod.uid.as_str()))
            .cloned()
            .unwrap_or_else(|| panic!("pod {} admitted under pod scope: {st:#}", pod.uid));
        p["hold"].clone()
    };
    let hold = held(&d);
    assert_eq!(
        hold["totals_cpu_millis"].as_u64(),
        Some(2000),
        "the pod's totals came from pod_resources: {hold}"
    );
    let hold_cpus: CpuSet = serde_json::from_value(hold["cpus"].clone()).unwrap();
    assert_eq!(hold_cpus.len(), 1, "{hold}");
    assert!(hold_cpus.is_disjoint(&a_cpus));
    let b = ctd
        .container(&pod, "b", res(GUARANTEED_1CPU))
        .unwrap_or_else(|e| panic!("CreateContainer b: {e}\n{}", d.log_text()));
    let (b_cpus, _) = b.first_print();
    assert_eq!(
        b_cpus, hold_cpus,
        "the second container gets what the pod held"
    );
    assert_eq!(b.live_cpus(), b_cpus);
    assert_eq!(a.live_cpus(), a_cpus);
    ctd.remove_pods();
}

/// A dry run under single-numa-node on a 4-node topology (fixture): the pod it would refuse
/// (21 CPUs fit no node of 20) starts, untouched — its cpuset is the runtime's (every CPU of
/// the machine, from its first instruction and in the runtime's spec), nothing is booked, and
/// the refusal it would have made is logged and counted.
#[test]
fn a_dry_run_lets_a_pod_it_would_refuse_start_untouched() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let mut ctd = Containerd::start(&install, None);
    let all = common::root_cgroups().unwrap().effective_cpus("").unwrap();
    let fixture = workspace().join("tests/fixtures/sysfs/intel-snc");
    let d = nri_daemon(
        &ctd.nri_sock(),
        &format!("sysfs_root = \"{}\"\ndry_run = true", fixture.display()),
        "[placement]\npolicy = \"single-numa-node\"\n",
    );
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    let wide = ctd.pod("unaligned", "guaranteed");
    let w = ctd
        .container(
            &wide,
            "wide",
            serde_json::json!({"cpu_quota": 2_100_000, "cpu_period": 100000, "cpu_shares": 21 * 1024, "memory_limit": 67108864}),
        )
        .unwrap_or_else(|e| panic!("a dry run refused CreateContainer: {e}\n{}", d.log_text()));
    let (cpus, _) = w.first_print();
    assert_eq!(cpus, all, "the container runs where the runtime put it");
    assert_eq!(w.live_cpus(), all);
    assert!(d.status()["pods"].as_array().is_some_and(|p| p.is_empty()));
    assert_eq!(d.metric("rebalancer_dry_run_refusals_total"), Some(1.0));
    let log = d.log_text();
    assert!(
        log.contains("dry run: CreateContainer would be refused") && log.contains("SingleNumaNode"),
        "{log}"
    );
    ctd.remove_pods();
}

/// kubelet with `cpuCFSQuota: false`: a Guaranteed container created with `cpu_quota = 0`
/// and `cpu_shares = 2048` asks for 2 CPUs through its shares and runs, from its first
/// instruction, on 2 CPUs the daemon gives it exclusively.
#[test]
fn a_guaranteed_container_without_a_cfs_quota_runs_on_exclusive_cpus() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let all = common::root_cgroups().unwrap().effective_cpus("").unwrap();
    if all.len() < 2 {
        println!("SKIP: 2 exclusive CPUs need 2 CPUs, this machine has {all}");
        return;
    }
    let mut ctd = Containerd::start(&install, None);
    let d = nri_daemon(&ctd.nri_sock(), "", "");
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    let gp = ctd.pod("no-quota", "guaranteed");
    let g = ctd
        .container(
            &gp,
            "g",
            res(r#"{"cpu_quota":0,"cpu_period":100000,"cpu_shares":2048,"memory_limit":67108864}"#),
        )
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", d.log_text()));
    let (cpus, mems) = g.first_print();
    assert_eq!(cpus.len(), 2, "{cpus}");
    let (dc, dm, excl) = decision(&d, &g.id).expect("admitted");
    assert_eq!((&cpus, &mems, excl), (&dc, &dm, true));
    let excl_cpus: CpuSet = serde_json::from_value(d.status()["exclusive_cpus"].clone()).unwrap();
    assert_eq!(excl_cpus, cpus, "the books give it its CPUs exclusively");
    assert_eq!(g.live_cpus(), cpus);
    ctd.remove_pods();
}

/// What a process started in the container now is allowed to run on (`Cpus_allowed_list` of
/// an exec'd process's /proc/self/status): what the container runs on, not what the books say.
fn exec_cpus(ctd: &Containerd, id: &str) -> CpuSet {
    let out = ctd
        .cri(&["exec", id, "grep", "Cpus_allowed_list", "/proc/self/status"])
        .unwrap_or_else(|e| panic!("exec in {id}: {e}"));
    let v = out
        .split_once(':')
        .unwrap_or_else(|| panic!("Cpus_allowed_list in {out:?}"))
        .1;
    CpuSet::parse(v.trim()).unwrap_or_else(|e| panic!("{out:?}: {e}"))
}

/// A CreateContainer answer the runtime gave up waiting for: the daemon is stopped (SIGSTOP)
/// once the Guaranteed pod's sandbox exists, so containerd waits its plugin_request_timeout
/// (2 s here), closes the plugin and creates and starts the container with no adjustment, on
/// every CPU. Continued, the daemon books the container late and its answer is lost; at the
/// reconnect's Synchronize the runtime reports the container running unplaced, and within a
/// few seconds it runs on its booked exclusive CPU and the shared container off it — read
/// from inside both containers, by a process exec'd there. Control rounds are set 10 minutes
/// apart, so the repair seen is the reconnect's, not a round's.
#[test]
fn an_answer_the_runtime_gave_up_on_is_repaired_at_the_reconnect() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let all = common::root_cgroups()
        .unwrap()
        .effective_cpus("")
        .unwrap_or_default();
    if all.len() < 2 {
        eprintln!(
            "SKIP: an exclusive CPU beside a shared one needs 2 CPUs, this machine has {all}"
        );
        return;
    }
    let mut ctd = Containerd::start(&install, None);
    let d = nri_daemon(&ctd.nri_sock(), "", "[controller]\nperiod_ms = 600000\n");
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    let bp = ctd.pod("burstable", "burstable");
    let b = ctd.container(&bp, "b", res(BURSTABLE)).unwrap();
    assert_eq!(b.first_print().0, all);
    let syncs = |d: &common::Daemon| {
        d.log_text()
            .matches("synchronized with the runtime")
            .count()
    };
    let synced_before = syncs(&d);

    let gp = ctd.pod("guaranteed", "guaranteed");
    d.signal(libc::SIGSTOP);
    let created = ctd.container(&gp, "g", res(GUARANTEED_1CPU));
    let timed_out = ctd.log().contains("context deadline exceeded");
    let g = match created {
        Ok(g) => g,
        Err(e) => {
            d.signal(libc::SIGCONT);
            panic!("CreateContainer g: {e}\n{}", ctd.log());
        }
    };
    let (first, _) = g.first_print();
    d.signal(libc::SIGCONT);
    assert!(
        timed_out,
        "containerd did not give up on the plugin:\n{}",
        ctd.log()
    );
    assert_eq!(first, all, "the container started unplaced");

    wait_for(
        "the reconnect's Synchronize",
        Duration::from_secs(20),
        || syncs(&d) > synced_before,
    );
    let t_sync = Instant::now();
    let (booked, _, excl) = decision(&d, &g.id).expect("the late answer's booking");
    assert!(excl && booked.len() == 1, "{booked} exclusive {excl}");
    let (mut g_runs, mut b_runs) = (CpuSet::new(), CpuSet::new());
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        (g_runs, b_runs) = (exec_cpus(&ctd, &g.id), exec_cpus(&ctd, &b.id));
        if g_runs == booked && b_runs.is_disjoint(&booked) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        g_runs,
        booked,
        "the Guaranteed container runs on its booked CPU:\n{}",
        d.log_text()
    );
    assert_eq!(
        b_runs,
        all.difference(&booked),
        "the shared container runs off the exclusive CPU"
    );
    assert_eq!(g.live_cpus(), booked);
    assert_eq!(ctd.inspect(&g.id), booked, "the runtime's spec agrees");
    println!(
        "late answer repaired {:?} after the reconnect's Synchronize: guaranteed on {g_runs}, burstable on {b_runs}",
        t_sync.elapsed()
    );
    ctd.remove_pods();
}

/// Per-pod annotations, read from the NRI PodSandbox: a pod annotated
/// `rebalancer.io/admission: runtime` keeps the cpuset the runtime gave it (its unannotated
/// twin, given the same, is placed by the daemon) and is not booked, yet it is fenced off a
/// CPU given exclusively later; a pod annotated `rebalancer.io/rebalance: never` is admitted as
/// usual and its ask is in the checkpoint, so a restart honours it from the first round.
#[test]
fn annotated_pods_keep_what_the_runtime_gave_them_and_are_fenced() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let mut ctd = Containerd::start(&install, None);
    let all = common::root_cgroups().unwrap().effective_cpus("").unwrap();
    let d = nri_daemon(&ctd.nri_sock(), "", "");
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    // what kubelet's static CPU Manager would give a Burstable container: one CPU
    let one: CpuSet = all.iter().last().into_iter().collect();
    let mut given = res(BURSTABLE);
    given["cpuset_cpus"] = one.to_string().into();

    let lp = ctd.pod_annotated(
        "left",
        "burstable",
        &[("rebalancer.io/admission", "runtime")],
    );
    let l = ctd.container(&lp, "l", given.clone()).unwrap();
    // no cpuset from the runtime: it runs on its parent's CPUs, as the runtime left it
    let l2 = ctd.container(&lp, "l2", res(BURSTABLE)).unwrap();
    let tp = ctd.pod("twin", "burstable");
    let t = ctd.container(&tp, "t", given).unwrap();
    let (l_cpus, _) = l.first_print();
    let (t_cpus, _) = t.first_print();
    assert_eq!(l_cpus, one, "left to the runtime: the runtime's cpuset");
    assert_eq!(ctd.inspect(&l.id), one);
    assert_eq!(l2.first_print().0, all);
    assert_ne!(t_cpus, one, "the unannotated twin is placed by the daemon");
    assert_eq!(decision(&d, &t.id).map(|x| x.0), Some(t_cpus.clone()));
    assert!(decision(&d, &l.id).is_none() && decision(&d, &l2.id).is_none());
    let bound = d.status()["bindings"].clone();
    for c in [&l, &l2] {
        assert!(
            bound.get(&c.cgroup).is_none(),
            "{} booked: {bound}",
            c.cgroup
        );
    }

    let kp = ctd.pod_annotated("kept", "burstable", &[("rebalancer.io/rebalance", "never")]);
    let k = ctd.container(&kp, "k", res(BURSTABLE)).unwrap();
    let (k_cpus, _) = k.first_print();
    assert_eq!(
        decision(&d, &k.id).map(|x| x.0),
        Some(k_cpus.clone()),
        "admitted as usual"
    );
    wait_for("the ask in the checkpoint", Duration::from_secs(10), || {
        d.checkpoint().is_some_and(|p| {
            p.annotated.get(&kp.uid).is_some_and(|a| a.never_move)
                && p.annotated.get(&lp.uid).is_some_and(|a| a.runtime)
                && !p.annotated.contains_key(&tp.uid)
        })
    });

    // an exclusive CPU for a Guaranteed pod: the left-alone containers keep off it
    let gp = ctd.pod("guaranteed", "guaranteed");
    let g = ctd.container(&gp, "g", res(GUARANTEED_1CPU)).unwrap();
    let (g_cpus, _) = g.first_print();
    wait_for(
        "the left-alone containers fenced",
        Duration::from_secs(10),
        || {
            [&l, &l2]
                .iter()
                .all(|c| c.live_cpus().is_disjoint(&g_cpus) && !c.live_cpus().is_empty())
        },
    );
    assert_eq!(l2.live_cpus(), all.difference(&g_cpus));
    println!(
        "runtime gave {one}: left {l_cpus} -> {}, twin {t_cpus}, kept {k_cpus}, guaranteed {g_cpus}",
        l.live_cpus()
    );
    ctd.remove_pods();
    wait_for(
        "pod removal to forget the asks",
        Duration::from_secs(10),
        || d.checkpoint().is_some_and(|p| p.annotated.is_empty()),
    );
}

/// Sets the CPU affinity of every task of `c`'s cgroup to `cpu` (as a process that pins its
/// own threads would); whether every task took it (a cpuset without `cpu` refuses it).
fn pin_tasks(c: &Ctr, cpu: u32) -> bool {
    let cg = common::root_cgroups().unwrap();
    let pids = cg
        .procs(rebalancer::cgroup::Controller::Cpuset, &c.cgroup)
        .unwrap_or_default();
    !pids.is_empty()
        && pids.iter().all(|pid| {
            Command::new("taskset")
                .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// `rebalancer.io/rebalance: never` holds against the control round that moves its unannotated
/// twin. On the two-node fixture with this machine's memory (node 0 = CPU 1 with all the
/// memory, node 1 = CPU 0 without any), two Burstable pods, one annotated, each run one busy
/// process; the test pins both processes' affinity to CPU 0 (their threads run off their
/// memory: both score poor locality) and then to CPU 1, back and forth. With its threads
/// already on node 0 and its smoothed score still poor, a move of a pod's CPUs to node 0 adds
/// no load there, so no busy host refuses it: a round moves the twin's cpuset (to node 0's CPU;
/// its books, the runtime's spec and a process started inside it follow), while the annotated
/// pod, a candidate for the same move, is skipped as pinned and keeps its CPUs — in cgroupfs,
/// in the books, in the runtime's spec and for a process started inside it.
#[test]
fn a_pod_annotated_never_is_not_moved_by_the_round_that_moves_its_twin() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let all = common::root_cgroups()
        .unwrap()
        .effective_cpus("")
        .unwrap_or_default();
    if all != CpuSet::parse("0-1").unwrap() {
        println!("SKIP: the two-node fixture stands for a machine of CPUs 0-1, this one has {all}");
        return;
    }
    let fixture = tempfile::tempdir().unwrap();
    two_node_fixture_with(fixture.path(), false);
    let mut ctd = Containerd::start(&install, None);
    let d = nri_daemon(
        &ctd.nri_sock(),
        &format!("sysfs_root = \"{}\"", fixture.path().display()),
        "[controller]\nperiod_ms = 500\n",
    );
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    let busy = "exec sh -c 'while :; do :; done'";
    // BestEffort: no request, given the whole shared pool (both nodes' CPUs)
    let wide = res(BESTEFFORT);
    let tp = ctd.pod("twin", "besteffort");
    let t = ctd.container_running(&tp, "t", wide.clone(), busy).unwrap();
    let kp = ctd.pod_annotated(
        "kept",
        "besteffort",
        &[("rebalancer.io/rebalance", "never")],
    );
    let k = ctd.container_running(&kp, "k", wide, busy).unwrap();
    let (t_cpus, _) = t.first_print();
    let (k_cpus, _) = k.first_print();
    assert_eq!(
        (&t_cpus, &k_cpus),
        (&all, &all),
        "both admitted to the shared CPUs"
    );
    let last_decision = |c: &Ctr| -> serde_json::Value {
        let e: serde_json::Value =
            serde_json::from_str(&api_get(&d, &format!("/v1/explain/{}", c.cgroup))).unwrap();
        e["last_decision"].clone()
    };
    let smoothed = |c: &Ctr| last_decision(c)["smoothed"].as_f64();
    // Moved by a round: the only writer of its cpuset here (no exclusive CPUs are handed out).
    let twin_moved = || t.live_cpus() != t_cpus;
    // The annotated pod as a candidate (a trigger) skipped as pinned, once seen.
    let pinned_seen: std::cell::RefCell<Option<serde_json::Value>> = Default::default();
    let check_kept = |k: &Ctr| {
        assert_eq!(k.live_cpus(), k_cpus, "the annotated pod was moved");
        let ld = last_decision(k);
        if ld["trigger"].is_object() && ld["outcome"]["kind"] == "pinned" {
            pinned_seen.borrow_mut().get_or_insert(ld);
        }
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut flips = 0;
    while !twin_moved() || pinned_seen.borrow().is_none() {
        assert!(
            Instant::now() < deadline,
            "no round moved the twin (on {}) and skipped the annotated pod as pinned ({:?}) in {flips} flips:\ntwin {}\nkept {}\n{}",
            t.live_cpus(),
            pinned_seen.borrow(),
            last_decision(&t),
            last_decision(&k),
            d.log_text()
        );
        // Off their memory until both score it, then next to it until the twin moved or its
        // score recovered (the rounds in between see a poor score and a move that adds no
        // load to node 0).
        assert!(
            pin_tasks(&k, 0),
            "the annotated pod's process pinned to CPU 0"
        );
        let twin_there = pin_tasks(&t, 0);
        wait_for(
            "both scored off their memory",
            Duration::from_secs(30),
            || {
                check_kept(&k);
                smoothed(&k).is_some_and(|s| s < 0.3)
                    && (!twin_there || twin_moved() || smoothed(&t).is_some_and(|s| s < 0.3))
            },
        );
        assert!(
            pin_tasks(&k, 1),
            "the annotated pod's process pinned to CPU 1"
        );
        pin_tasks(&t, 1);
        wait_for("the scores recovered", Duration::from_secs(30), || {
            check_kept(&k);
            twin_moved() || smoothed(&t).is_some_and(|s| s > 0.9)
        });
        flips += 1;
    }
    // (its cpuset is written before the move is settled and logged)
    let applied = || {
        d.log_text()
            .lines()
            .find(|l| l.contains("move applied") && l.contains(&t.cgroup))
            .map(str::to_string)
    };
    wait_for(
        "the twin's move in the log",
        Duration::from_secs(10),
        || applied().is_some(),
    );
    let applied = applied().unwrap();
    let moved_to = t.live_cpus();
    println!(
        "twin moved {t_cpus} -> {moved_to} after {flips} flips ({applied}); the annotated pod kept {k_cpus}: {}",
        pinned_seen.borrow().as_ref().unwrap()
    );
    // The move is the twin's alone, everywhere; the annotated pod is where it was admitted.
    assert_eq!(
        decision(&d, &t.id).map(|x| x.0),
        Some(moved_to.clone()),
        "the twin's books"
    );
    wait_for(
        "the runtime told of the twin's move",
        Duration::from_secs(10),
        || ctd.inspect(&t.id) == moved_to,
    );
    assert_eq!(exec_cpus(&ctd, &t.id), moved_to);
    assert_eq!(k.live_cpus(), k_cpus);
    assert_eq!(decision(&d, &k.id).map(|x| x.0), Some(k_cpus.clone()));
    assert_eq!(
        ctd.inspect(&k.id),
        k_cpus,
        "the runtime's spec of the annotated pod"
    );
    assert_eq!(exec_cpus(&ctd, &k.id), k_cpus);
    ctd.remove_pods();
}

/// The books' exclusive CPUs, from `status`.
fn exclusive_cpus(d: &common::Daemon) -> CpuSet {
    serde_json::from_value(d.status()["exclusive_cpus"].clone()).expect("exclusive_cpus")
}

/// A Guaranteed container's CRI resources with `cpus` CPUs (kubelet's quota and shares).
fn guaranteed(cpus: i64) -> String {
    serde_json::json!({
        "cpu_quota": cpus * 100_000, "cpu_period": 100_000,
        "cpu_shares": cpus * 1024, "memory_limit": 67_108_864,
    })
    .to_string()
}

/// In-place resize through the CRI (kubelet's `UpdateContainerResources`, which containerd
/// hands the plugin as NRI UpdateContainer): a Guaranteed container raised from 1 to 2 CPUs
/// runs on 2 exclusive CPUs, the one it had kept — read from inside it (an exec'd process),
/// from cgroupfs and from the runtime's spec — and the books agree; lowered back to 1 it gives
/// a CPU back. With a shared container beside it (this machine has 2 CPUs, and a shared
/// container keeps one), the same raise fails the CRI call with the reason, and nothing moves.
#[test]
fn a_cri_resize_grows_exclusive_cpus_or_is_refused_with_the_reason() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let all = common::root_cgroups().unwrap().effective_cpus("").unwrap();
    if all.len() != 2 {
        println!("SKIP: the refusal needs exactly 2 CPUs (a shared container keeps one), this machine has {all}");
        return;
    }
    let mut ctd = Containerd::start(&install, None);
    let d = nri_daemon(&ctd.nri_sock(), "", "[controller]\nperiod_ms = 600000\n");
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    let gp = ctd.pod("resize", "guaranteed");
    let g = ctd.container(&gp, "g", res(GUARANTEED_1CPU)).unwrap();
    let (one, _) = g.first_print();
    assert_eq!(one.len(), 1, "{one}");

    let t = Instant::now();
    ctd.cri(&["update", &g.id, &guaranteed(2)])
        .unwrap_or_else(|e| panic!("the raise to 2 CPUs: {e}\n{}", d.log_text()));
    let took = t.elapsed();
    let runs = exec_cpus(&ctd, &g.id);
    assert_eq!(runs, all, "the container runs on 2 CPUs:\n{}", d.log_text());
    assert!(one.is_subset(&runs));
    assert_eq!(g.live_cpus(), all, "cgroupfs");
    assert_eq!(ctd.inspect(&g.id), all, "the runtime's spec");
    let (booked, _, excl) = decision(&d, &g.id).expect("admitted");
    assert_eq!((&booked, excl), (&all, true), "the books agree");
    assert_eq!(
        exclusive_cpus(&d),
        all,
        "the books give it both exclusively"
    );
    println!("raised to 2 exclusive CPUs in {took:?}: {runs}");

    ctd.cri(&["update", &g.id, &guaranteed(1)])
        .unwrap_or_else(|e| panic!("the lowering to 1 CPU: {e}\n{}", d.log_text()));
    let back = exec_cpus(&ctd, &g.id);
    assert_eq!(back.len(), 1, "{back}");
    assert_eq!(g.live_cpus(), back);
    assert_eq!(ctd.inspect(&g.id), back);
    assert_eq!(
        exclusive_cpus(&d),
        back,
        "the other CPU is back in the pool"
    );

    let bp = ctd.pod("beside", "burstable");
    let b = ctd.container(&bp, "b", res(BURSTABLE)).unwrap();
    let shared = all.difference(&back);
    assert_eq!(b.first_print().0, shared);
    let books = d.status()["pods"].clone();
    let e = ctd
        .cri(&["update", &g.id, &guaranteed(2)])
        .expect_err("a raise that would leave the shared container no CPU");
    assert!(
        e.contains("rebalancer refused the resize") && e.contains("InsufficientCPU"),
        "the reason: {e}"
    );
    println!("refused: {}", e.trim());
    assert_eq!(
        d.status()["pods"],
        books,
        "a refused resize changes nothing"
    );
    assert_eq!(exec_cpus(&ctd, &g.id), back);
    assert_eq!(exec_cpus(&ctd, &b.id), shared);
    assert_eq!(b.live_cpus(), shared);
    assert_eq!(ctd.inspect(&g.id), back);
    ctd.remove_pods();
}

/// `ctr` on the test's containerd, in kubelet's namespace.
fn ctr(ctd: &Containerd, args: &[&str]) {
    let out = Command::new(ctd.install.join("root/usr/bin/ctr"))
        .arg("--address")
        .arg(ctd.sock())
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A paused container (`ctr task pause`: the cgroup freezer) keeps its exclusive CPU through
/// a Synchronize (containerd restarted, the plugin reconnects): the books still give it the
/// CPU, its cgroup still has it, and a Guaranteed container created afterwards gets the other
/// CPU, never the paused one's. containerd 1.7, restarted, finds the task paused, counts the
/// container unknown and leaves it out of the Synchronize: the daemon keeps it because its
/// cgroup still holds processes.
#[test]
fn a_paused_container_keeps_its_exclusive_cpus_through_a_synchronize() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let all = common::root_cgroups().unwrap().effective_cpus("").unwrap();
    if all.len() < 2 {
        println!("SKIP: 2 exclusive CPUs need 2 CPUs, this machine has {all}");
        return;
    }
    let mut ctd = Containerd::start(&install, None);
    let d = nri_daemon(&ctd.nri_sock(), "", "[controller]\nperiod_ms = 600000\n");
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });
    let pp = ctd.pod("paused", "guaranteed");
    let p = ctd.container(&pp, "p", res(GUARANTEED_1CPU)).unwrap();
    let (mine, _) = p.first_print();
    ctr(&ctd, &["task", "pause", &p.id]);
    let syncs = |d: &common::Daemon| {
        d.log_text()
            .matches("synchronized with the runtime")
            .count()
    };
    let before = syncs(&d);
    ctd.stop();
    ctd.spawn();
    wait_for(
        "the reconnect's Synchronize",
        Duration::from_secs(30),
        || syncs(&d) > before && connected(&d),
    );
    let sync = d
        .log_text()
        .lines()
        .rev()
        .find(|l| l.contains("synchronized with the runtime"))
        .unwrap_or_default()
        .to_string();
    println!("after the restart: {sync}");
    assert_eq!(
        decision(&d, &p.id).map(|x| x.0),
        Some(mine.clone()),
        "{sync}"
    );
    assert!(mine.is_subset(&exclusive_cpus(&d)));
    assert_eq!(p.live_cpus(), mine, "cgroupfs of the paused container");
    let gp = ctd.pod("after", "guaranteed");
    let g = ctd.container(&gp, "g", res(GUARANTEED_1CPU)).unwrap();
    let (theirs, _) = g.first_print();
    assert!(theirs.is_disjoint(&mine), "{theirs} vs the paused {mine}");
    assert!(
        g.live_cpus().is_disjoint(&p.live_cpus()),
        "cgroupfs of both"
    );
    ctr(&ctd, &["task", "resume", &p.id]);
    // (the runtime counts it unknown now: no exec into it; its cgroup says where it runs)
    assert_eq!(p.live_cpus(), mine, "resumed, it runs on its CPU alone");
    assert!(g.live_cpus().is_disjoint(&mine));
    ctd.remove_pods();
}

/// A sysfs root standing for this 2-CPU machine split into two NUMA nodes, node 0 = CPU 1 and
/// node 1 = CPU 0 (so the one real memory node, 0, is paired with the CPU a default placement
/// does not take first), with two GPUs: `0000:41:00.0` on node 0 and `0000:c1:00.0` on node
/// 1, each behind the character device `241:<node>` (`dev/char/241:N/device` → the PCI
/// function, as the kernel links them).
fn two_node_fixture(root: &Path) {
    two_node_fixture_with(root, true)
}

/// [`two_node_fixture`]; without `node1_memory`, node 1 has CPU 0 and no memory, as on this
/// machine (MemTotal 0: a move there writes the nearest memory node, 0, into cpuset.mems).
fn two_node_fixture_with(root: &Path, node1_memory: bool) {
    let src = workspace().join("tests/fixtures/sysfs/this-machine");
    let st = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", src.display()))
        .arg(root)
        .status()
        .unwrap();
    assert!(st.success());
    let nodes = root.join("devices/system/node");
    let node0 = nodes.join("node0");
    let meminfo = std::fs::read_to_string(node0.join("meminfo")).unwrap();
    std::fs::create_dir_all(nodes.join("node1")).unwrap();
    if node1_memory {
        let st = Command::new("cp")
            .arg("-a")
            .arg(node0.join("hugepages"))
            .arg(nodes.join("node1"))
            .status()
            .unwrap();
        assert!(st.success());
    }
    for (n, cpu, other) in [(0, 1, 0), (1, 0, 1)] {
        let d = nodes.join(format!("node{n}"));
        let _ = std::fs::remove_file(d.join(format!("cpu{other}")));
        let _ = std::fs::remove_file(d.join(format!("cpu{cpu}")));
        std::os::unix::fs::symlink(format!("../../cpu/cpu{cpu}"), d.join(format!("cpu{cpu}")))
            .unwrap();
        std::fs::write(d.join("cpulist"), format!("{cpu}\n")).unwrap();
        std::fs::write(
            d.join("distance"),
            if n == 0 { "10 21\n" } else { "21 10\n" },
        )
        .unwrap();
        let mem = if n == 1 && !node1_memory {
            "Node 1 MemTotal:       0 kB\nNode 1 MemFree:        0 kB\n".to_string()
        } else {
            meminfo.replace("Node 0", &format!("Node {n}"))
        };
        std::fs::write(d.join("meminfo"), mem).unwrap();
        let pci = root.join(format!("bus/pci/devices/0000:{}:00.0", ["41", "c1"][n]));
        std::fs::create_dir_all(&pci).unwrap();
        for (f, v) in [
            ("class", "0x030200"),
            ("vendor", "0x10de"),
            ("device", "0x20b0"),
            ("numa_node", &n.to_string()),
        ] {
            std::fs::write(pci.join(f), format!("{v}\n")).unwrap();
        }
        let entry = root.join(format!("dev/char/241:{n}"));
        std::fs::create_dir_all(&entry).unwrap();
        std::os::unix::fs::symlink(&pci, entry.join("device")).unwrap();
    }
    std::fs::write(nodes.join("online"), "0-1\n").unwrap();
}

/// CreateContainer alone (no start); Ok(container id) or Err(the runtime's error).
fn create_only(
    ctd: &Containerd,
    pod: &Pod,
    name: &str,
    res: serde_json::Value,
) -> Result<String, String> {
    let mut spec = serde_json::json!({
        "pod_id": pod.id, "pod": pod.spec, "name": name,
        "command": ["/bin/sh", "-c", "exec sleep 3600"],
        "log_path": format!("{name}.log"),
    });
    for (k, v) in res.as_object().unwrap() {
        spec[k] = v.clone();
    }
    ctd.cri(&["container", &spec.to_string()])
}

/// `GET path` on the daemon's API socket: the body.
fn api_get(d: &common::Daemon, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or(out)
}

/// Devices on the NRI door: a container given a device node (a char device made with mknod,
/// major:minor 241:N, which the fixture sysfs root maps to a GPU on NUMA node N) gets its
/// exclusive CPU and cpuset.mems on the GPU's node under single-numa-node, and is refused
/// with the reason when that node has no CPU left.
///
/// The fixture's node 0 is CPU 1 (the machine's only memory node is 0, so a container on
/// node 0 starts and prints what it runs on). A container with the node-1 GPU is answered
/// node 1 (CPU 0, mems 1) — where no placement without the device would put it on an empty
/// machine (kubelet's merge takes the lowest node) — and, this machine having no memory node
/// 1, runc cannot apply those mems: the answer is read from the books and from the runtime's
/// spec, and the start's failure names cpuset.mems.
#[test]
fn a_containers_device_node_aligns_its_cpus_and_memory_through_nri() {
    let _serial = common::serial();
    let Some(install) = preflight() else { return };
    let all = common::root_cgroups()
        .unwrap()
        .effective_cpus("")
        .unwrap_or_default();
    if all != CpuSet::parse("0-1").unwrap() {
        println!("SKIP: the two-node fixture stands for a machine of CPUs 0-1, this one has {all}");
        return;
    }
    let fixture = tempfile::tempdir().unwrap();
    two_node_fixture(fixture.path());
    let devs = tempfile::tempdir().unwrap();
    for n in 0..2 {
        let p = devs.path().join(format!("gpu{n}"));
        let st = Command::new("mknod")
            .arg(&p)
            .args(["c", "241", &n.to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "mknod {}", p.display());
    }
    let gpu = |n: u32| {
        serde_json::json!([{
            "host_path": devs.path().join(format!("gpu{n}")),
            "container_path": format!("/dev/gpu{n}"),
        }])
    };
    let guaranteed_with = |n: u32| {
        let mut r = res(GUARANTEED_1CPU);
        r["devices"] = gpu(n);
        r
    };
    let mut ctd = Containerd::start(&install, None);
    let d = nri_daemon(
        &ctd.nri_sock(),
        &format!("sysfs_root = \"{}\"", fixture.path().display()),
        "[controller]\nperiod_ms = 600000\n[placement]\npolicy = \"single-numa-node\"\n",
    );
    wait_for("the plugin to register", Duration::from_secs(20), || {
        connected(&d)
    });

    // The node-1 GPU: answered node 1, which this machine cannot give memory on.
    let p1 = ctd.pod("gpu-node1", "guaranteed");
    let id1 = create_only(&ctd, &p1, "g1", guaranteed_with(1))
        .unwrap_or_else(|e| panic!("CreateContainer g1: {e}\n{}", d.log_text()));
    let (cpus, mems, excl) = decision(&d, &id1).expect("g1 admitted");
    assert_eq!(
        (cpus.to_string(), mems.to_string(), excl),
        ("0".into(), "1".into(), true)
    );
    assert_eq!(
        ctd.inspect(&id1).to_string(),
        "0",
        "the runtime's spec has the answer"
    );
    let started = ctd.cri(&["start", &id1]);
    println!("start of g1 (mems 1 on a one-node machine): {started:?}");
    assert!(
        started.as_ref().is_err_and(|e| e.contains("cpuset.mems")),
        "{started:?}"
    );
    ctd.cri(&["rm", &id1]).unwrap();
    wait_for("g1's release", Duration::from_secs(5), || {
        decision(&d, &id1).is_none()
    });

    // The node-0 GPU: on node 0 (CPU 1, mems 0) from the first instruction.
    let p0 = ctd.pod("gpu-node0", "guaranteed");
    let g0 = ctd
        .container(&p0, "g0", guaranteed_with(0))
        .unwrap_or_else(|e| panic!("CreateContainer g0: {e}\n{}", d.log_text()));
    let (c0, m0) = g0.first_print();
    assert_eq!((c0.to_string(), m0.to_string()), ("1".into(), "0".into()));
    assert_eq!(
        decision(&d, &g0.id),
        Some((c0.clone(), m0.clone(), true)),
        "the books agree with what it runs on"
    );
    let explained: serde_json::Value =
        serde_json::from_str(&api_get(&d, &format!("/v1/explain/{}", g0.cgroup))).unwrap();
    assert!(explained["binding"].is_object(), "{explained}");
    // the Topology Manager decision, in explain and in the log: the device's hint, the
    // CPU provider's, the merged one
    let topology = &explained["admission"]["topology"];
    assert_eq!(
        topology["providers"]["device"]["pci:0000:41:00.0"], "[0 preferred]",
        "{explained}"
    );
    assert_eq!(
        topology["providers"]["cpu"]["cpu"], "[0 preferred, 1 preferred, 0-1]",
        "{explained}"
    );
    assert_eq!(topology["merged"], "0 preferred", "{explained}");
    let line = d
        .log_text()
        .lines()
        .find(|l| l.contains("topology hints merged") && l.contains(&g0.id[..12]))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no decision log line:\n{}", d.log_text()));
    println!("decision log line: {line}");
    assert!(
        line.contains("cpu: cpu [0 preferred, 1 preferred, 0-1]"),
        "{line}"
    );
    assert!(
        line.contains("device: pci:0000:41:00.0 [0 preferred]"),
        "{line}"
    );
    assert!(line.contains("merged=0 preferred"), "{line}");

    // Another container with the same GPU (shared, not busy): node 0 has no CPU left.
    let p0b = ctd.pod("gpu-node0-b", "guaranteed");
    let err = ctd
        .container(&p0b, "g0b", guaranteed_with(0))
        .err()
        .expect("node 0 is full: single-numa-node cannot align the GPU's container");
    println!("refusal as the runtime reports it: {}", err.trim());
    assert!(err.contains("TopologyAffinityError"), "{err}");
    assert!(err.contains("0000:41:00.0 on node 0"), "{err}");
    assert!(err.contains("node 0: 0 of 1 CPUs free"), "{err}");
    ctd.remove_pods();
}

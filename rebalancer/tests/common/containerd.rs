//! A private containerd for the root tests that drive a real runtime through its CRI as kubelet
//! would (`nri_root`, `deploy_root`): Debian trixie's 1.7 with bookworm's runc, installed into
//! `target/containerd` by `cargo xtask setup`; its own root, state and sockets in a temp folder,
//! NRI on, `restrict_oom_score_adj` (root here lacks CAP_SYS_RESOURCE), the cgroupfs driver,
//! and the busybox test image imported as the sandbox image. `tests/cri-tool` is the CRI
//! client. Dropping it removes its pods, stops it, and removes the pod cgroups runc made.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// The busybox-static rootfs as an OCI archive, under the install directory.
pub const BUSYBOX_TAR: &str = "image/rb-busybox.oci.tar";

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Where containerd is installed, when the test can run here; prints `SKIP: …` when not
/// (not root, no cgroups or < 2 CPUs, no overlayfs). Missing binaries skip too, unless
/// `REBALANCER_REQUIRE_CONTAINERD=1` (`cargo xtask test` sets it), where they fail the test.
pub fn install_dir() -> Option<PathBuf> {
    super::root_cgroups()?;
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.lines().any(|l| l.trim_end().ends_with("overlay")) {
        println!("SKIP: the kernel has no overlayfs (containerd's snapshotter needs it)");
        return None;
    }
    let dir = std::env::var_os("REBALANCER_CONTAINERD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/containerd"));
    let need = [
        "root/usr/bin/containerd",
        "root/usr/bin/ctr",
        "root/usr/sbin/runc",
        BUSYBOX_TAR,
    ];
    if let Some(missing) = need.iter().find(|p| !dir.join(p).exists()) {
        let msg = format!(
            "{} missing: run `cargo xtask setup` (installs containerd, runc and the test image)",
            dir.join(missing).display()
        );
        if std::env::var_os("REBALANCER_REQUIRE_CONTAINERD").is_some_and(|v| v == "1") {
            panic!("{msg}");
        }
        println!("SKIP: {msg}");
        return None;
    }
    Some(dir)
}

/// The CRI test client, built (or brought up to date) once per test run.
pub fn cri_tool() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("cri-tool");
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "--quiet", "-p", "cri-tool"])
            .current_dir(workspace())
            .status()
            .unwrap();
        assert!(st.success(), "building cri-tool failed");
    });
    bin
}

pub struct Containerd {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub install: PathBuf,
    nri_sock: PathBuf,
    /// Pod sandboxes made, removed (last first) on drop.
    pub pods: Vec<String>,
    /// Pod cgroup parents made (kubelet would remove them; here the drop does).
    pub parents: Vec<String>,
}

impl Containerd {
    /// Starts containerd with NRI on `nri_sock` (None: its own folder's `nri.sock`), and imports
    /// the busybox test image.
    pub fn start(install: &Path, nri_sock: Option<&Path>) -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("rb-containerd")
            .tempdir_in("/tmp")
            .unwrap();
        let d = dir.path();
        for sub in [
            "root",
            "state",
            "cni",
            "opt",
            "nri/conf.d",
            "nri/plugins",
            "logs",
        ] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let nri_sock = nri_sock.map_or_else(|| d.join("nri.sock"), Path::to_path_buf);
        let cfg = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/library/rb-busybox:test"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni"
    conf_dir = "{d}/cni"
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  disable_connections = false
  plugin_config_path = "{d}/nri/conf.d"
  plugin_path = "{d}/nri/plugins"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
  socket_path = "{nri}"
"#,
            d = d.display(),
            runc = install.join("root/usr/sbin/runc").display(),
            nri = nri_sock.display(),
        );
        std::fs::write(d.join("config.toml"), cfg).unwrap();
        let mut c = Containerd {
            child: None,
            dir,
            install: install.to_path_buf(),
            nri_sock,
            pods: Vec::new(),
            parents: Vec::new(),
        };
        c.spawn();
        c.import(&install.join(BUSYBOX_TAR));
        c
    }

    fn path_env(&self) -> String {
        format!(
            "{}:{}:{}",
            self.install.join("root/usr/bin").display(),
            self.install.join("root/usr/sbin").display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// Starts (again) the containerd process, and waits for its sockets.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("containerd.log"))
            .unwrap();
        let child = Command::new(self.install.join("root/usr/bin/containerd"))
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .env("PATH", self.path_env())
            .current_dir(self.dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(self.sock().exists() && self.nri_sock().exists()) {
            assert!(
                Instant::now() < deadline,
                "containerd did not start:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM and wait; the containers keep running in their shims.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = std::fs::remove_file(self.nri_sock());
            let _ = std::fs::remove_file(self.sock());
        }
    }

    pub fn sock(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    pub fn nri_sock(&self) -> PathBuf {
        self.nri_sock.clone()
    }

    /// A folder for pods' log directories.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr images import` into the CRI's namespace.
    pub fn import(&self, archive: &Path) {
        let out = Command::new(self.install.join("root/usr/bin/ctr"))
            .arg("-a")
            .arg(self.sock())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctr images import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs cri-tool; Ok(stdout) or Err(stderr).
    pub fn cri(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(cri_tool())
            .arg("--socket")
            .arg(self.sock())
            .args(args)
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// RunPodSandbox of cri-tool's pod `spec` (its `uid` and `qos` name the pod cgroup);
    /// the sandbox id.
    pub fn run_pod(&mut self, spec: &serde_json::Value) -> String {
        let id = self
            .cri(&["pod", &spec.to_string()])
            .unwrap_or_else(|e| panic!("RunPodSandbox {}: {e}\n{}", spec["name"], self.log()));
        self.pods.push(id.clone());
        let uid = spec["uid"].as_str().unwrap();
        self.parents.push(match spec["qos"].as_str().unwrap() {
            "guaranteed" => format!("kubepods/pod{uid}"),
            q => format!("kubepods/{q}/pod{uid}"),
        });
        id
    }

    /// The cpus of the OCI spec the runtime keeps for a container.
    pub fn spec_cpus(&self, id: &str) -> rebalancer::cpuset::CpuSet {
        let out = self
            .cri(&["inspect", id])
            .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let cpus = v["spec_cpus"]
            .as_str()
            .unwrap_or_else(|| panic!("spec_cpus in {out}"));
        rebalancer::cpuset::CpuSet::parse(cpus)
            .unwrap_or_else(|e| panic!("spec_cpus in {out}: {e}"))
    }

    /// Stops and removes every pod (their containers with them), last made first.
    pub fn remove_pods(&mut self) {
        for p in std::mem::take(&mut self.pods).iter().rev() {
            let _ = self.cri(&["stop-pod", p]);
            let _ = self.cri(&["rm-pod", p]);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_none() && !self.pods.is_empty() {
            self.spawn();
        }
        self.remove_pods();
        self.stop();
        // The pod cgroups runc made (every v1 hierarchy, or the v2 one); then the QoS tiers
        // and kubepods if nothing else is in them (rmdir refuses a non-empty cgroup).
        let mut dirs: Vec<String> = self.parents.clone();
        dirs.extend(["kubepods/burstable", "kubepods/besteffort", "kubepods"].map(String::from));
        let hierarchies: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        for d in &dirs {
            let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(d));
            for h in &hierarchies {
                let _ = std::fs::remove_dir(h.join(d));
            }
        }
        // Leftover mounts (a failed run) must go before the folder can.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let base = self.dir.path().to_string_lossy().into_owned();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&base))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = Command::new("umount").arg("-l").arg(p).status();
        }
    }
}

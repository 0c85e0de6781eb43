//! A real Kubernetes API server for the NodeResourceTopology export test
//! (`rebalancer/tests/nrt_root.rs`): Kubernetes' own CRD server, `apiextensions-apiserver`,
//! built from Debian's Go source packages (sid has `golang-k8s-apiextensions-apiserver-dev` and
//! the matching k8s.io libraries and Go toolchain; there is no network for a module proxy), and
//! bookworm's etcd. Like containerd (see `containerd.rs`), everything is fetched through a
//! private apt configuration and unpacked into the project's own folder; nothing on the host
//! changes.
//!
//! Layout of `target/apiserver/` (or `$REBALANCER_APISERVER_DIR`):
//! - `bin/apiextensions-apiserver`: the built server (built once per machine, reused)
//! - `root/`: the unpacked packages (`root/usr/bin/etcd`, the Go toolchain and GOPATH)
//! - `apt/`, `debs/`: the private apt state and the downloaded packages
//! - `build.log`: the Go build's output; `STAMP`: what was installed
//!
//! The Go build takes minutes of both cores, so [`install`] starts it as a child process and
//! returns: `cargo xtask test` runs fmt and clippy meanwhile and waits for it before the tests.
use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::sh;

/// The Go package built, and the packages fetched: its `golang-*-dev` dependencies (found
/// with `apt-cache depends --recurse`), the Go toolchain and etcd.
const SERVER_PACKAGE: &str = "golang-k8s-apiextensions-apiserver-dev/sid";
const GO: &str = "golang-1.26";
const ETCD: &str = "etcd-server/bookworm";

pub fn dir() -> PathBuf {
    std::env::var_os("REBALANCER_APISERVER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::root().join("target/apiserver"))
}

/// A Go build still running; [`Build::wait`] before the tests need the server.
pub struct Build(Option<Child>);

impl Build {
    /// Nothing to wait for.
    pub fn done() -> Build {
        Build(None)
    }

    pub fn wait(self) -> Result<()> {
        let Some(mut child) = self.0 else {
            return Ok(());
        };
        eprintln!("waiting for the apiextensions-apiserver build");
        let st = child.wait()?;
        if !st.success() {
            bail!(
                "building apiextensions-apiserver failed ({st}); see {}",
                dir().join("build.log").display()
            );
        }
        eprintln!("apiextensions-apiserver built in {}", dir().display());
        Ok(())
    }
}

/// Fetches and unpacks the packages and starts the Go build (idempotent: nothing is done when
/// the server and etcd are there for the same package set).
pub fn install() -> Result<Build> {
    let dir = dir();
    let server = dir.join("bin/apiextensions-apiserver");
    let stamp = dir.join("STAMP");
    let want = format!("{SERVER_PACKAGE} {GO} {ETCD}\n");
    let root = dir.join("root");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == want)
        && server.exists()
        && root.join("usr/bin/etcd").exists()
    {
        return Ok(Build(None));
    }
    let _ = fs::remove_file(&stamp);
    fs::create_dir_all(dir.join("bin"))?;
    let apt = crate::containerd::private_apt(&dir, &["sid", "bookworm"])?;
    let deps = Command::new("apt-cache")
        .args(&apt)
        .args([
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            SERVER_PACKAGE.split('/').next().unwrap_or_default(),
        ])
        .output()
        .context("apt-cache depends")?;
    let mut pkgs: Vec<String> = String::from_utf8_lossy(&deps.stdout)
        .lines()
        .filter(|l| l.starts_with("golang-") && l.ends_with("-dev"))
        .map(|l| format!("{l}/sid"))
        .collect();
    pkgs.sort();
    pkgs.dedup();
    if pkgs.is_empty() {
        bail!("apt-cache found no dependencies of {SERVER_PACKAGE}");
    }
    pkgs.extend([
        SERVER_PACKAGE.to_string(),
        format!("{GO}-go/sid"),
        format!("{GO}-src/sid"),
        ETCD.to_string(),
    ]);
    let debs = dir.join("debs");
    let _ = fs::remove_dir_all(&debs);
    fs::create_dir_all(&debs)?;
    sh(Command::new("apt-get")
        .args(&apt)
        .current_dir(&debs)
        .args(["download", "-q"])
        .args(&pkgs))?;
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root)?;
    for e in fs::read_dir(&debs)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "deb") {
            let st = Command::new("dpkg-deb")
                .arg("-x")
                .arg(&p)
                .arg(&root)
                .status()?;
            if !st.success() {
                bail!("dpkg-deb -x {} failed: {st}", p.display());
            }
        }
    }
    let goroot = root.join(format!("usr/lib/go-{}", GO.trim_start_matches("golang-")));
    for p in [goroot.join("bin/go"), root.join("usr/bin/etcd")] {
        if !p.exists() {
            bail!("{} missing after unpacking the packages", p.display());
        }
    }
    fs::write(&stamp, want)?;
    // GOPATH mode over the packages' sources: no module proxy, no network. Built to a
    // temporary name and renamed, so an interrupted build never leaves a half binary.
    let tmp = dir.join("bin/apiextensions-apiserver.tmp");
    let log = fs::File::create(dir.join("build.log"))?;
    eprintln!(
        "building apiextensions-apiserver in the background (a few minutes; log in {})",
        dir.join("build.log").display()
    );
    let child = Command::new("nice")
        .args(["-n", "5", "sh", "-c", "\"$0\" build -ldflags='-s -w' -o \"$1\" k8s.io/apiextensions-apiserver && mv \"$1\" \"$2\""])
        .arg(goroot.join("bin/go"))
        .arg(&tmp)
        .arg(&server)
        .env("GO111MODULE", "off")
        .env("GOPATH", root.join("usr/share/gocode"))
        .env("GOROOT", &goroot)
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", dir.join("gocache"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the Go build")?;
    Ok(Build(Some(child)))
}

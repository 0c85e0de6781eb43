//! The exporter thread: keeps the node's NodeResourceTopology object equal to the books. It
//! wakes when the books change (every change is checkpointed, and the checkpoint bumps
//! `Daemon::books`), builds the object under the state lock (no I/O there), and writes it
//! outside any lock — create, or replace with the `resourceVersion` it just read — at most
//! once per `kubernetes.export_interval_ms`, changes in between coalesced. Admission never
//! waits for it. Every minute it writes again even without a change, which repairs an object
//! someone else changed or deleted.
//!
//! An API server that is down, slow or refuses (RBAC 403, a missing CRD 404) makes the
//! `kubernetes` health component degraded with the reason (`/healthz`, `status`,
//! `rebalancer_component_degraded`); the write is retried with a doubling backoff (1 s to
//! 30 s) and the object converges once the server answers. A daemon restart converges the
//! same way (the object is read back and replaced).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::client::{Client, KubeClientError};
use crate::daemon::{Daemon, Io};

const RESYNC: Duration = Duration::from_secs(60);
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The exporter's state as `status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportStatus {
    /// The object's name (the node's).
    pub node: String,
    /// The API server (`host:port`), once its config was read.
    pub server: String,
    /// `starting`, `ok` (the object equals the books as of `written_at_books`) or `degraded`.
    pub state: String,
    /// Why it is degraded (empty otherwise).
    pub reason: String,
    /// Successful writes since start.
    pub writes: u64,
    /// The books' change count the object was last written for.
    pub written_at_books: u64,
}

/// Whether the API server's answer is worth a message: its `message` field or the status.
fn failure(method: &str, path: &str, status: u16, body: &[u8]) -> String {
    let msg = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_default();
    let hint = match status {
        401 => " (credentials refused)",
        403 => " (RBAC: see config/overlays/noderesourcetopology/rbac.yaml)",
        404 => " (is the NodeResourceTopology CRD installed? config/kubernetes/noderesourcetopology-crd.yaml)",
        _ => "",
    };
    format!("{method} {path}: HTTP {status}{hint}: {msg}")
}

/// Creates the object or replaces it (with the resourceVersion read just before).
pub fn write(client: &Client, body: &Value) -> Result<(), String> {
    let name = body["metadata"]["name"].as_str().unwrap_or_default();
    let path = format!("{}/{name}", super::COLLECTION);
    let err = |e: KubeClientError| e.to_string();
    // A conflict (someone wrote in between) is read and replaced again, a few times.
    for _ in 0..3 {
        let got = client.request("GET", &path, None).map_err(err)?;
        let (method, target, mut obj) = match got.status {
            200 => {
                let current: Value =
                    serde_json::from_slice(&got.body).map_err(|e| format!("GET {path}: {e}"))?;
                let mut obj = body.clone();
                obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
                ("PUT", path.clone(), obj)
            }
            404 => ("POST", super::COLLECTION.to_string(), body.clone()),
            s => return Err(failure("GET", &path, s, &got.body)),
        };
        if method == "POST" {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
        }
        let bytes = serde_json::to_vec(&obj).map_err(|e| e.to_string())?;
        let put = client.request(method, &target, Some(&bytes)).map_err(err)?;
        match put.status {
            200 | 201 => return Ok(()),
            409 => continue,
            s => return Err(failure(method, &target, s, &put.body)),
        }
    }
    Err(format!("{path}: kept conflicting with another writer"))
}

/// The object's name: the config's, else `$NODE_NAME`, else the hostname.
pub fn node_name(configured: &str) -> String {
    if !configured.is_empty() {
        return configured.to_string();
    }
    if let Ok(n) = std::env::var("NODE_NAME") {
        if !n.is_empty() {
            return n;
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_default()
}

/// Starts the exporter thread (when `kubernetes.export_topology` is on).
pub fn spawn(daemon: Daemon) -> std::io::Result<()> {
    let health = daemon.metrics.health.register("kubernetes", None);
    std::thread::Builder::new()
        .name("nrt-export".into())
        .spawn(move || {
            run(&mut Io::new(), &daemon, &health);
            health.stopped();
        })?;
    Ok(())
}

fn set_status(io: &mut Io, daemon: &Daemon, f: impl FnOnce(&mut ExportStatus)) {
    let mut s = daemon.lock(io);
    f(s.topology_export.get_or_insert_with(Default::default));
}

/// Sleeps `d`, waking early when the daemon stops; false when it stops.
fn pause(daemon: &Daemon, d: Duration) -> bool {
    let until = Instant::now() + d;
    loop {
        if daemon.stopping() {
            return false;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

fn run(io: &mut Io, daemon: &Daemon, health: &crate::health::Reporter) {
    let (configured, kubeconfig, interval) = {
        let s = daemon.lock(io);
        let k = &s.cfg.kubernetes;
        (
            k.node_name.clone(),
            k.kubeconfig.clone(),
            Duration::from_millis(k.export_interval_ms),
        )
    };
    let node = node_name(&configured);
    set_status(io, daemon, |st| {
        st.node = node.clone();
        st.state = "starting".into();
    });
    let mut backoff = BACKOFF_MIN;
    let degraded = |io: &mut Io, why: String, backoff: &mut Duration| {
        tracing::warn!(reason = %why, retry_in = ?*backoff, "NodeResourceTopology export degraded");
        health.set_degraded(Some(why.clone()));
        set_status(io, daemon, |st| {
            st.state = "degraded".into();
            st.reason = why;
        });
        let go_on = pause(daemon, *backoff);
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
        go_on
    };
    if node.is_empty() {
        health.set_degraded(Some(
            "no node name (set kubernetes.node_name or NODE_NAME)".into(),
        ));
        return;
    }
    let client = loop {
        let c = if kubeconfig.as_os_str().is_empty() {
            Client::in_cluster(Path::new(super::client::SERVICE_ACCOUNT))
        } else {
            Client::from_kubeconfig(&kubeconfig)
        };
        match c {
            Ok(c) => break c,
            Err(e) => {
                if !degraded(io, e.to_string(), &mut backoff) {
                    return;
                }
            }
        }
    };
    set_status(io, daemon, |st| st.server = client.server());
    let mut written: Option<Value> = None;
    let mut last_write = Instant::now() - RESYNC;
    let mut built_for = None;
    loop {
        if daemon.stopping() {
            return;
        }
        let seen = daemon.books.count();
        if built_for == Some(seen) && written.is_some() && last_write.elapsed() < RESYNC {
            daemon.books.wait_past(seen, Duration::from_millis(500));
            continue;
        }
        built_for = Some(seen);
        let body = {
            let s = daemon.lock(io);
            let zones = super::zones(&s.topo, &s.state.allocator, &s.cfg.placement);
            super::object(&node, &zones, &s.cfg.placement)
        };
        if written.as_ref() != Some(&body) || last_write.elapsed() >= RESYNC {
            match write(&client, &body) {
                Ok(()) => {
                    if written.is_none() || health_was_degraded(io, daemon) {
                        tracing::info!(node = %node, server = %client.server(), "NodeResourceTopology object written");
                    }
                    written = Some(body);
                    last_write = Instant::now();
                    backoff = BACKOFF_MIN;
                    health.set_degraded(None);
                    set_status(io, daemon, |st| {
                        st.state = "ok".into();
                        st.reason.clear();
                        st.writes += 1;
                        st.written_at_books = seen;
                    });
                }
                Err(why) => {
                    written = None;
                    if !degraded(io, why, &mut backoff) {
                        return;
                    }
                    continue;
                }
            }
            if !pause(daemon, interval) {
                return;
            }
        }
    }
}

fn health_was_degraded(io: &mut Io, daemon: &Daemon) -> bool {
    daemon
        .lock(io)
        .topology_export
        .as_ref()
        .is_some_and(|s| s.state == "degraded")
}

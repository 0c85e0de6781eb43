//! The admission API (HTTP + JSON over the unix socket; see `socket` for who may connect):
//!
//! - `POST /v1/admit` with a pod → 200 `{uid, containers:[{container,cpus,mems,affinity,exclusive}]}`
//!   or 409 `{error, reason, details}` (kubelet-like reason, e.g. TopologyAffinityError);
//! - `DELETE /v1/pods/{uid}` → 200, 404 when the pod is unknown, or 409 `{error, reason:
//!   "ContainersStillBound", cgroups}` while containers of it are bound and running (their
//!   CPUs would be handed to the next admission);
//! - `GET /v1/status` → pods, placements, exclusive CPUs, sources, controller counters;
//! - `GET /v1/explain/{cgroup}` → the cgroup's binding, its admission (placement and the
//!   Topology Manager decision: each provider's hints, the merged hint) and the controller's last decision;
//! - `GET /v1/top?limit=N` → nodes × the N busiest workloads of the last round (`serve::top`).
//!
//! Bodies are limited to [`MAX_BODY`] bytes and parsed strictly (unknown fields refused); a bad
//! request gets a 4xx with a message and changes nothing. Admission and release keep to the
//! request's deadline themselves (`serve::conn` does not cut them): a body not read within it
//! is a 408, and a change that could only start after it is refused with a 503, nothing done;
//! once started, the answer is what happened. Admission and release go through the
//! admission service (`daemon::admission`, `Durability::Durable`: checkpointed before they are
//! acknowledged, undone with a 500 if that fails), on a blocking thread so the fsync never
//! holds up the runtime. The read-only handlers take the state lock briefly (never held
//! across I/O anywhere). The transport (socket, peer check, rate limit) is `serve::socket`.

use std::time::Instant;

use axum::{
    body::Bytes,
    extract::{
        rejection::QueryRejection, DefaultBodyLimit, FromRequest, Path, Query, Request, State,
    },
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, get, post},
    Extension, Json, Router,
};
use serde_json::json;

use super::admission::{Admission, AdmitError, AdmitRequest, Durability, ReleaseError};
use super::Io;
use crate::{placement::pod::Pod, serve::conn::RequestDeadline};

/// Largest accepted request body.
pub const MAX_BODY: usize = 64 * 1024;

pub fn router(adm: Admission) -> Router {
    Router::new()
        .route("/v1/admit", post(admit))
        .route("/v1/pods/{uid}", delete(release))
        .route("/v1/status", get(status))
        .route("/v1/explain/{*cgroup}", get(explain))
        .route("/v1/top", get(top))
        .fallback(|| async {
            err(
                StatusCode::NOT_FOUND,
                "no such endpoint; see /v1/admit, /v1/pods/{uid}, /v1/status, /v1/explain/{cgroup}",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(adm)
}

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(json!({"error": msg.into()}))).into_response()
}

/// Runs `f` on the blocking pool (it locks and may fsync).
async fn blocking(f: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        err(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("handler failed: {e}"),
        )
    })
}

/// The request's deadline (`serve::conn` puts it there; None when served without it).
fn deadline_of(req: &Request) -> Option<Instant> {
    req.extensions().get::<RequestDeadline>().map(|d| d.0)
}

async fn admit(State(adm): State<Admission>, req: Request) -> Response {
    let since = Instant::now();
    let deadline = deadline_of(&req);
    // The transport does not cut this request (see `serve::conn`): the body is read within
    // the deadline here, and the admission refuses if it could only start after it.
    let read = Bytes::from_request(req, &adm);
    let body = match deadline {
        Some(t) => match tokio::time::timeout_at(t.into(), read).await {
            Ok(r) => r,
            Err(_) => {
                return err(
                    StatusCode::REQUEST_TIMEOUT,
                    "request body not received in time; nothing admitted",
                )
            }
        },
        None => read.await,
    };
    let body = match body {
        Ok(b) => b,
        Err(rejection) => return rejection.into_response(),
    };
    blocking(move || admit_blocking(&mut Io::new(), &adm, &body, since, deadline)).await
}

fn admit_blocking(
    io: &mut Io,
    adm: &Admission,
    body: &[u8],
    since: Instant,
    deadline: Option<Instant>,
) -> Response {
    let pod: Pod = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => {
            adm.record_invalid();
            return err(StatusCode::BAD_REQUEST, format!("invalid pod JSON: {e}"));
        }
    };
    match adm.admit_by(
        io,
        AdmitRequest {
            pod: &pod,
            bind: None,
            durability: Durability::Durable,
            since,
        },
        deadline,
    ) {
        Ok(a) => {
            tracing::info!(uid = %a.uid, containers = a.placements.len(), "pod admitted");
            (
                StatusCode::OK,
                Json(json!({"uid": a.uid, "containers": a.placements})),
            )
                .into_response()
        }
        Err(AdmitError::Invalid(e)) => err(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid pod: {e}"),
        ),
        Err(AdmitError::Rejected { rejection: rej, .. }) => {
            tracing::info!(uid = %pod.uid, reason = %rej.reason, details = %rej.details, "pod rejected");
            (
                StatusCode::CONFLICT,
                Json(
                    json!({"error": rej.to_string(), "reason": rej.reason, "details": rej.details}),
                ),
            )
                .into_response()
        }
        Err(e @ AdmitError::DeadlinePassed) => err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn release(
    State(adm): State<Admission>,
    Path(uid): Path<String>,
    deadline: Option<Extension<RequestDeadline>>,
) -> Response {
    let deadline = deadline.map(|Extension(d)| d.0);
    blocking(
        move || match adm.release_unbound(&mut Io::new(), &uid, Durability::Durable, deadline) {
            Ok(()) => {
                (StatusCode::OK, Json(json!({"uid": uid, "released": true}))).into_response()
            }
            Err(e @ ReleaseError::NotAdmitted(_)) => err(StatusCode::NOT_FOUND, e.to_string()),
            Err(ReleaseError::StillBound { uid, cgroups }) => (
                StatusCode::CONFLICT,
                Json(json!({
                    "error": format!("pod {uid:?} still has running containers bound to its CPUs; release it once they are gone"),
                    "reason": "ContainersStillBound",
                    "cgroups": cgroups,
                })),
            )
                .into_response(),
            Err(e @ ReleaseError::DeadlinePassed) => {
                err(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
            Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        },
    )
    .await
}

/// The status document as JSON (`StatusDoc`).
async fn status(State(adm): State<Admission>) -> Response {
    let io = &mut Io::new();
    let doc = super::status::StatusDoc::of(&adm.daemon.lock(io));
    (StatusCode::OK, Json(doc)).into_response()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TopQuery {
    limit: Option<usize>,
}

async fn top(State(adm): State<Admission>, q: Result<Query<TopQuery>, QueryRejection>) -> Response {
    let io = &mut Io::new();
    let limit = match q {
        Ok(Query(q)) => q.limit.unwrap_or(20).min(10_000),
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let s = adm.daemon.lock(io);
    let view = crate::serve::top::build(
        crate::serve::top::TopInput {
            topo: &s.topo,
            obs: s.last_obs.as_ref(),
            decisions: &s.decisions,
            rounds: s.state.controller.rounds,
            dry_run: s.cfg.daemon.dry_run,
        },
        limit,
    );
    (StatusCode::OK, Json(view)).into_response()
}

async fn explain(State(adm): State<Admission>, Path(cgroup): Path<String>) -> Response {
    let io = &mut Io::new();
    let cgroup = cgroup.trim_matches('/').to_string();
    if cgroup.split('/').any(|c| c == ".." || c == ".") {
        return err(
            StatusCode::BAD_REQUEST,
            "cgroup path may not contain `.` or `..` components",
        );
    }
    let s = adm.daemon.lock(io);
    let decision = s.decisions.get(&cgroup);
    let binding = s.state.bindings.get(&cgroup);
    let ctl = s.state.controller.cgroups.get(&cgroup);
    if decision.is_none() && binding.is_none() && ctl.is_none() {
        return err(
            StatusCode::NOT_FOUND,
            format!("cgroup {cgroup:?} is not managed"),
        );
    }
    // its admission: the placement booked for it, with the Topology Manager decision
    let admission = super::admission::bound_container(&s, &cgroup).map(|c| &c.placement);
    (StatusCode::OK, Json(json!({"cgroup": cgroup, "binding": binding, "admission": admission, "controller": ctl, "last_decision": decision}))).into_response()
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        sync::{mpsc, Arc, Mutex},
        time::Duration,
    };

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::{
        config::Config,
        cpuset::CpuSet,
        daemon::{
            writer::{CpusetChange, CpusetWriter, WriteError},
            Daemon, Shared,
        },
        serve::{conn, Metrics},
        topology::TopologyBuilder,
    };

    /// Container cgroups as a map: present = live.
    #[derive(Default)]
    struct Cgroups(Mutex<BTreeMap<String, CpuSet>>);

    impl CpusetWriter for Arc<Cgroups> {
        fn write(&self, _io: &Io, c: &CpusetChange) -> Result<(), WriteError> {
            match self.0.lock().unwrap().get_mut(&c.cgroup) {
                Some(cpus) => {
                    *cpus = c.cpus.clone();
                    Ok(())
                }
                None => Err(WriteError::Vanished {
                    cgroup: c.cgroup.clone(),
                }),
            }
        }
        fn cpus(&self, cgroup: &str) -> Option<CpuSet> {
            self.0.lock().unwrap().get(cgroup).cloned()
        }
    }

    fn admission(state: &std::path::Path, cgroups: Arc<Cgroups>) -> Admission {
        let topo = TopologyBuilder {
            sockets: 1,
            nodes_per_socket: 2,
            cores_per_node: 4,
            threads_per_core: 1,
            ..Default::default()
        }
        .build();
        let mut cfg = Config::load(None).unwrap();
        cfg.daemon.state_dir = state.to_path_buf();
        let d = Daemon::new(Shared::fresh(topo, cfg).unwrap(), Metrics::default());
        Admission::new(d, Arc::new(cgroups))
    }

    /// Serves the API router through `serve::conn` with a 300 ms request timeout.
    async fn serve(adm: &Admission) -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = conn::Limits {
            max_connections: 8,
            request_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_millis(200),
        };
        // Runs until the test's runtime ends.
        drop(conn::spawn(
            l,
            router(adm.clone()),
            limits,
            "test",
            Metrics::default(),
            tokio_util::sync::CancellationToken::new(),
        ));
        addr
    }

    async fn request(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
            .await
            .expect("answered")
            .unwrap();
        out
    }

    const POD: &str = r#"{"uid":"pod-late","containers":[{"name":"c","cpu_request_millis":2000,"cpu_limit_millis":2000,"memory_bytes":67108864,"memory_limit_bytes":67108864}]}"#;

    /// An admission still waiting for the state lock at the request timeout
    /// used to be answered 408 by the transport and then admitted anyway once the lock was
    /// free (CPUs held for a pod the client was told failed). Now it is refused, nothing
    /// admitted, and the answer says so; with the lock free the same request is admitted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_admission_past_its_request_timeout_is_refused_not_admitted_behind_a_408() {
        let io = &mut crate::daemon::Io::new();
        let state = tempfile::tempdir().unwrap();
        let adm = admission(state.path(), Default::default());
        let addr = serve(&adm).await;
        let (release, released) = mpsc::channel::<()>();
        let (taken, is_taken) = mpsc::channel::<()>();
        let holder = {
            let d = adm.daemon.clone();
            std::thread::spawn(move || {
                let mut io = Io::new();
                let _held = d.lock(&mut io);
                taken.send(()).unwrap();
                // Past the 300 ms request timeout: the request waits here until then.
                let _ = released.recv_timeout(Duration::from_secs(1));
            })
        };
        is_taken.recv().unwrap();
        let resp = request(addr, "POST", "/v1/admit", POD).await;
        let _ = release.send(()); // gone already: the answer came after the lock was free
        holder.join().unwrap();
        assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
        assert!(resp.contains("nothing was admitted"), "{resp}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            adm.daemon.lock(io).state.allocator.pods.is_empty(),
            "admitted behind the refusal"
        );
        let resp = request(addr, "POST", "/v1/admit", POD).await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(adm
            .daemon
            .lock(io)
            .state
            .allocator
            .pods
            .contains_key("pod-late"));
    }

    /// DELETE of a pod whose container is bound and running would free the
    /// CPUs it runs on for the next admission (an overlap of exclusive CPUs). It is refused
    /// with a 409 naming the cgroup, nothing released; once the cgroup is gone it succeeds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deleting_a_pod_whose_containers_still_run_is_refused_with_409() {
        let io = &mut crate::daemon::Io::new();
        let state = tempfile::tempdir().unwrap();
        let cgroups = Arc::new(Cgroups::default());
        let cg = "kubepods/podlate/c";
        cgroups
            .0
            .lock()
            .unwrap()
            .insert(cg.into(), CpuSet::parse("0-7").unwrap());
        let adm = admission(state.path(), cgroups.clone());
        let addr = serve(&adm).await;
        assert!(request(addr, "POST", "/v1/admit", POD)
            .await
            .starts_with("HTTP/1.1 200"));
        let first = adm.bind(io, cg, "pod-late", Durability::Durable, Instant::now());
        let cpus = first.unwrap().expect("bound").placements[0].cpus.clone();
        assert_eq!(cgroups.cpus(cg), Some(cpus.clone()));

        let resp = request(addr, "DELETE", "/v1/pods/pod-late", "").await;
        assert!(resp.starts_with("HTTP/1.1 409"), "{resp}");
        assert!(
            resp.contains("ContainersStillBound") && resp.contains(cg),
            "{resp}"
        );
        {
            let s = adm.daemon.lock(io);
            assert!(s.state.allocator.pods.contains_key("pod-late"));
            assert_eq!(
                s.state.allocator.exclusive_cpus(),
                cpus,
                "its CPUs stay its own"
            );
        }

        cgroups.0.lock().unwrap().remove(cg); // the container exited
        let resp = request(addr, "DELETE", "/v1/pods/pod-late", "").await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        let s = adm.daemon.lock(io);
        assert!(s.state.allocator.pods.is_empty());
        assert!(s.state.bindings.is_empty());
    }
}

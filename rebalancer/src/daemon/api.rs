//! The admission API (HTTP + JSON over the unix socket; see `socket` for who may connect):
//!
//! - `POST /v1/admit` with a pod → 200 `{uid, containers:[{container,cpus,mems,affinity,exclusive}]}`
//!   or 409 `{error, reason, details}` (kubelet-like reason, e.g. TopologyAffinityError);
//! - `DELETE /v1/pods/{uid}` → 200, or 404 when the pod is unknown;
//! - `GET /v1/status` → pods, placements, exclusive CPUs, sources, controller counters;
//! - `GET /v1/explain/{cgroup}` → the cgroup's binding and the controller's last decision;
//! - `GET /v1/top?limit=N` → nodes × the N busiest workloads of the last round (`serve::top`).
//!
//! Bodies are limited to [`MAX_BODY`] bytes and parsed strictly (unknown fields refused); a bad
//! request gets a 4xx with a message and changes nothing. Admission and release go through the
//! admission service (`daemon::admission`, `Durability::Durable`: checkpointed before they are
//! acknowledged, undone with a 500 if that fails), on a blocking thread so the fsync never
//! holds up the runtime. The read-only handlers take the state lock briefly (never held
//! across I/O anywhere). The transport (socket, peer check, rate limit) is `serve::socket`.

use std::time::Instant;

use axum::{
    body::Bytes,
    extract::{rejection::QueryRejection, DefaultBodyLimit, Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, get, post},
    Json, Router,
};
use serde_json::json;

use super::admission::{Admission, AdmitError, AdmitRequest, Durability, ReleaseError};
use crate::placement::pod::Pod;

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

async fn admit(State(adm): State<Admission>, body: Bytes) -> Response {
    let since = Instant::now();
    blocking(move || admit_blocking(&adm, &body, since)).await
}

fn admit_blocking(adm: &Admission, body: &[u8], since: Instant) -> Response {
    let pod: Pod = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => {
            adm.record_invalid();
            return err(StatusCode::BAD_REQUEST, format!("invalid pod JSON: {e}"));
        }
    };
    match adm.admit(AdmitRequest {
        pod: &pod,
        bind: None,
        durability: Durability::Durable,
        since,
    }) {
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
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn release(State(adm): State<Admission>, Path(uid): Path<String>) -> Response {
    blocking(move || match adm.release(&uid, Durability::Durable) {
        Ok(()) => (StatusCode::OK, Json(json!({"uid": uid, "released": true}))).into_response(),
        Err(e @ ReleaseError::NotAdmitted(_)) => err(StatusCode::NOT_FOUND, e.to_string()),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    })
    .await
}

/// The status document (also used by `rebalancer status --offline`).
pub fn status_json(s: &crate::daemon::Shared) -> serde_json::Value {
    let pods: Vec<_> = s
        .state
        .allocator
        .pods
        .iter()
        .map(|(uid, p)| json!({"uid": uid, "qos": p.qos, "containers": p.containers.iter().map(|c| &c.placement).collect::<Vec<_>>()}))
        .collect();
    json!({
        "nodes": s.topo.nodes.iter().map(|n| json!({"id": n.id, "cpus": n.cpus, "memory_free_bytes": n.memory_free_bytes})).collect::<Vec<_>>(),
        "pods": pods,
        "exclusive_cpus": s.state.allocator.exclusive_cpus(),
        "reserved_cpus": s.state.allocator.reserved_cpus,
        "bindings": s.state.bindings,
        "sources": s.sources,
        "controller": {
            "rounds": s.state.controller.rounds,
            "moves_total": s.state.controller.moves_total,
            "bytes_migrated_total": s.state.controller.bytes_migrated_total,
            "failed_moves_total": s.state.controller.failed_moves_total,
        },
        "decisions": s.decisions.values().collect::<Vec<_>>(),
        "dry_run": s.cfg.daemon.dry_run,
    })
}

async fn status(State(adm): State<Admission>) -> Response {
    let s = adm.daemon.lock();
    (StatusCode::OK, Json(status_json(&s))).into_response()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TopQuery {
    limit: Option<usize>,
}

async fn top(State(adm): State<Admission>, q: Result<Query<TopQuery>, QueryRejection>) -> Response {
    let limit = match q {
        Ok(Query(q)) => q.limit.unwrap_or(20).min(10_000),
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let s = adm.daemon.lock();
    let view = crate::serve::top::build(&s, s.last_obs.as_ref(), limit);
    (StatusCode::OK, Json(view)).into_response()
}

async fn explain(State(adm): State<Admission>, Path(cgroup): Path<String>) -> Response {
    let cgroup = cgroup.trim_matches('/').to_string();
    if cgroup.split('/').any(|c| c == ".." || c == ".") {
        return err(
            StatusCode::BAD_REQUEST,
            "cgroup path may not contain `.` or `..` components",
        );
    }
    let s = adm.daemon.lock();
    let decision = s.decisions.get(&cgroup);
    let binding = s.state.bindings.get(&cgroup);
    let ctl = s.state.controller.cgroups.get(&cgroup);
    if decision.is_none() && binding.is_none() && ctl.is_none() {
        return err(
            StatusCode::NOT_FOUND,
            format!("cgroup {cgroup:?} is not managed"),
        );
    }
    (StatusCode::OK, Json(json!({"cgroup": cgroup, "binding": binding, "controller": ctl, "last_decision": decision}))).into_response()
}

//! Serving: Prometheus `/metrics` and `/healthz` on a TCP listener (loopback by default),
//! and the admission API on a unix socket (root only).

pub mod client;
pub mod conn;
pub mod metrics;
pub mod ratelimit;
pub mod socket;
pub mod top;

use std::net::SocketAddr;

use axum::{
    http::{header, StatusCode},
    response::IntoResponse,
    routing::get,
    Router,
};
use tokio_util::sync::CancellationToken;

pub use metrics::Metrics;

fn metrics_router(m: Metrics) -> Router {
    let health = m.health.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.render(),
                    )
                        .into_response()
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let h = health.clone();
                async move {
                    match h.report() {
                        Ok(ok) => (StatusCode::OK, ok).into_response(),
                        Err(dead) => (StatusCode::SERVICE_UNAVAILABLE, dead).into_response(),
                    }
                }
            }),
        )
}

/// Binds the metrics listener; returns the bound address (useful with port 0) and the task.
/// Connections are bounded by `limits` (see [`conn`]).
pub async fn spawn_metrics(
    addr: SocketAddr,
    m: Metrics,
    limits: conn::Limits,
    cancel: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = conn::spawn(
        listener,
        metrics_router(m.clone()),
        limits,
        "metrics",
        m,
        cancel,
    );
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_healthz_on_loopback() {
        let m = Metrics::default();
        m.pages_migrated.inc_by(7);
        let tok = CancellationToken::new();
        let h = tok.clone();
        let health = m.health.clone();
        let (addr, task) = spawn_metrics(
            "127.0.0.1:0".parse().unwrap(),
            m,
            conn::Limits::new(16),
            tok,
        )
        .await
        .unwrap();
        let body = get(addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("rebalancer_pages_migrated_total 7"), "{body}");
        assert!(get(addr, "/healthz").await.ends_with("ok\n"));
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        // A dead component turns /healthz into 503 naming it.
        health
            .register("watcher", None)
            .failed("inotify read failed");
        let hz = get(addr, "/healthz").await;
        assert!(hz.starts_with("HTTP/1.1 503"), "{hz}");
        assert!(hz.ends_with("watcher: inotify read failed\n"), "{hz}");
        h.cancel();
        task.await.unwrap();
    }
}

//! Serving: Prometheus `/metrics` and `/healthz` on a TCP listener (loopback by default),
//! and the admission API on a unix socket (root only).

pub mod client;
pub mod metrics;
pub mod ratelimit;
pub mod socket;
pub mod top;

use std::net::SocketAddr;

use axum::{http::header, response::IntoResponse, routing::get, Router};
use tokio_util::sync::CancellationToken;

pub use metrics::Metrics;

fn metrics_router(m: Metrics) -> Router {
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
        .route("/healthz", get(|| async { "ok\n" }))
}

/// Binds the metrics listener; returns the bound address (useful with port 0) and the task.
pub async fn spawn_metrics(
    addr: SocketAddr,
    m: Metrics,
    cancel: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, metrics_router(m))
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics listener failed");
        }
    });
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
        let (addr, task) = spawn_metrics("127.0.0.1:0".parse().unwrap(), m, tok)
            .await
            .unwrap();
        let body = get(addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("rebalancer_pages_migrated_total 7"), "{body}");
        assert!(get(addr, "/healthz").await.ends_with("ok\n"));
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        h.cancel();
        task.await.unwrap();
    }
}

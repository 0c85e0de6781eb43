//! The transport under both HTTP listeners (`/metrics` + `/healthz` on TCP, the admission API on
//! the unix socket): an accept loop with a connection budget, and per connection hyper's HTTP/1
//! server with a timer, so that no client can hold the daemon's file descriptors or its shutdown.
//!
//! - **Budget** ([`Limits::max_connections`]): at the limit, a new connection evicts the oldest
//!   connection that has no request in flight (a half-sent request or an idle keep-alive one);
//!   when every connection is busy the new one is closed at once. So held connections never
//!   exhaust the fd limit, and a fresh request (a liveness probe) is always served.
//! - **Timeouts**: request headers must arrive within [`Limits::request_timeout`] (hyper's
//!   `header_read_timeout`), a request is answered within it (else 408: a trickled body cannot
//!   keep a slot busy), and a connection without a request for [`Limits::idle_timeout`] is closed.
//!   A request that changes state (POST, PUT, PATCH, DELETE) is not cut here: a 408 sent while
//!   its handler goes on would be a lie (the pod admitted after all). Its handler gets the
//!   deadline as a [`RequestDeadline`] extension and keeps to it itself: the body read within
//!   it, the change refused (nothing done) if it could only start after it.
//! - **Shutdown**: on cancel the listener is closed at once, every connection is asked to finish
//!   its request, and whatever is left after [`Limits::shutdown_grace`] is dropped.
//!
//! Each request carries `ConnectInfo<L::Info>` (the TCP peer address, or the unix peer's
//! credentials), as axum's own `serve` would put it.

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{
    extract::ConnectInfo,
    http::{Method, Request, StatusCode},
    response::{IntoResponse, Response},
    Router,
};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::metrics::{ListenerLabel, ListenerReasonLabel, Metrics};

/// When a request must be answered ([`Limits::request_timeout`] after it arrived); in the
/// extensions of every request. Handlers of state-changing requests keep to it themselves.
#[derive(Clone, Copy, Debug)]
pub struct RequestDeadline(pub Instant);

/// The bounds of one listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
    pub shutdown_grace: Duration,
}

impl Limits {
    /// `max_connections` (clamped to at least 1 and to a quarter of the fd soft limit, so two
    /// listeners at their limit still leave half the descriptors to cgroupfs, /proc and eBPF),
    /// with the daemon's timeouts: 5 s per request, 30 s idle, 1 s of shutdown grace.
    pub fn new(max_connections: usize) -> Limits {
        let fd_share = nofile_soft().map_or(usize::MAX, |n| (n / 4).max(1));
        Limits {
            max_connections: max_connections.clamp(1, fd_share),
            request_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard one (as systemd services may, and as every
/// per-CPU perf event, writer pidfd and connection needs a descriptor); returns the soft limit
/// in force after it. A failure leaves the limit as it was.
pub fn raise_nofile() -> Option<usize> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `r`; setrlimit reads an initialised rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                tracing::debug!(
                    soft = r.rlim_cur,
                    hard = r.rlim_max,
                    "raising RLIMIT_NOFILE failed"
                );
            }
        }
    }
    nofile_soft()
}

/// The soft RLIMIT_NOFILE of this process.
pub fn nofile_soft() -> Option<usize> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `r`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    usize::try_from(r.rlim_cur).ok()
}

/// Something that accepts connections and says who is on the other end.
pub trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    type Info: Clone + Send + Sync + 'static;
    fn accept_conn(
        &mut self,
    ) -> impl Future<Output = std::io::Result<(Self::Io, Self::Info)>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    type Info = SocketAddr;
    async fn accept_conn(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
        self.accept().await
    }
}

/// What the accept loop knows of one open connection.
struct Conn {
    opened: Instant,
    activity: Arc<Activity>,
    evict: CancellationToken,
}

/// Requests in flight on a connection and when it last did something.
#[derive(Default)]
struct Activity {
    busy: AtomicUsize,
    /// Milliseconds since `epoch` of the last request start or end.
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self, epoch: Instant) {
        self.last_ms
            .store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn idle_for(&self, epoch: Instant) -> Option<Duration> {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(epoch.elapsed().saturating_sub(last))
    }
}

/// A request in flight; counted until dropped (answered, timed out, or connection dropped).
struct InFlight(Arc<Activity>, Instant);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.touch(self.1);
    }
}

#[derive(Default)]
struct Table {
    next: u64,
    conns: HashMap<u64, Conn>,
}

impl Table {
    /// Makes room for one more connection: evicts the oldest idle one at the limit. False when
    /// every connection is busy.
    fn make_room(&mut self, max: usize) -> Result<Option<()>, ()> {
        if self.conns.len() < max {
            return Ok(None);
        }
        let oldest = self
            .conns
            .iter()
            .filter(|(_, c)| c.activity.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|(_, c)| c.opened)
            .map(|(id, _)| *id);
        match oldest {
            Some(id) => {
                if let Some(c) = self.conns.remove(&id) {
                    c.evict.cancel();
                }
                Ok(Some(()))
            }
            None => Err(()),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `cancel`; `name` labels the metrics
/// (`rebalancer_http_connections{listener}` and `..._closed_total{listener,reason}`).
pub fn spawn<L: Listener>(
    mut listener: L,
    router: Router,
    limits: Limits,
    name: &'static str,
    metrics: Metrics,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let table = Arc::new(Mutex::new(Table::default()));
        let epoch = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let open = metrics
            .http_connections
            .get_or_create(&ListenerLabel {
                listener: name.into(),
            })
            .clone();
        let closed = |reason: &str| {
            metrics
                .http_connections_closed
                .get_or_create(&ListenerReasonLabel {
                    listener: name.into(),
                    reason: reason.into(),
                })
                .inc();
        };
        let mut last_err: Option<Instant> = None;
        loop {
            let accepted = tokio::select! {
                _ = cancel.cancelled() => break,
                a = listener.accept_conn() => a,
            };
            while tasks.try_join_next().is_some() {}
            let (io, info) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: the connection stays queued; back off briefly.
                    if last_err.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(listener = name, error = %e, "accept failed");
                        last_err = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let (id, activity, evict) = {
                let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
                match t.make_room(limits.max_connections) {
                    Ok(None) => {}
                    Ok(Some(())) => closed("evicted"),
                    Err(()) => {
                        drop(t);
                        closed("refused");
                        drop(io);
                        continue;
                    }
                }
                t.next += 1;
                let id = t.next;
                let activity = Arc::new(Activity::default());
                activity.touch(epoch);
                let evict = CancellationToken::new();
                t.conns.insert(
                    id,
                    Conn {
                        opened: Instant::now(),
                        activity: activity.clone(),
                        evict: evict.clone(),
                    },
                );
                (id, activity, evict)
            };
            open.inc();
            let (router, cancel, table, open, metrics) = (
                router.clone(),
                cancel.clone(),
                table.clone(),
                open.clone(),
                metrics.clone(),
            );
            tasks.spawn(async move {
                let reason =
                    serve_one(io, info, router, limits, activity, epoch, evict, cancel).await;
                if let Some(reason) = reason {
                    metrics
                        .http_connections_closed
                        .get_or_create(&ListenerReasonLabel {
                            listener: name.into(),
                            reason: reason.into(),
                        })
                        .inc();
                }
                table
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .conns
                    .remove(&id);
                open.dec();
            });
        }
        // The listening socket closes here: nothing new is accepted during shutdown.
        drop(listener);
        let drain = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(limits.shutdown_grace + Duration::from_millis(500), drain)
            .await
            .is_err()
        {
            tasks.abort_all();
        }
    })
}

/// One connection until it ends, is evicted, idles out, or the daemon stops. Returns why the
/// daemon closed it, if it did.
#[allow(clippy::too_many_arguments)]
async fn serve_one<I, T>(
    io: I,
    info: T,
    router: Router,
    limits: Limits,
    activity: Arc<Activity>,
    epoch: Instant,
    evict: CancellationToken,
    cancel: CancellationToken,
) -> Option<&'static str>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: Clone + Send + Sync + 'static,
{
    let svc = TowerToHyperService::new(router);
    let act = activity.clone();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        act.busy.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(act.clone(), epoch);
        req.extensions_mut().insert(ConnectInfo(info.clone()));
        req.extensions_mut()
            .insert(RequestDeadline(Instant::now() + limits.request_timeout));
        let self_timed = matches!(
            *req.method(),
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        let fut = hyper::service::Service::call(&svc, req);
        async move {
            let _guard = guard;
            let bound = if self_timed {
                Duration::MAX
            } else {
                limits.request_timeout
            };
            let resp: Response = match tokio::time::timeout(bound, fut).await {
                Ok(Ok(r)) => r,
                Ok(Err(never)) => match never {},
                Err(_) => (
                    StatusCode::REQUEST_TIMEOUT,
                    "request not completed in time\n",
                )
                    .into_response(),
            };
            Ok::<_, Infallible>(resp)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    if e.is_timeout() {
                        return Some("request_timeout");
                    }
                    tracing::trace!(error = %e, "connection ended with an error");
                }
                return None;
            }
            _ = evict.cancelled() => return None,
            _ = cancel.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(limits.shutdown_grace, conn.as_mut()).await;
                return None;
            }
            _ = tick.tick() => {
                if activity.idle_for(epoch).is_some_and(|d| d > limits.idle_timeout) {
                    return Some("idle");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(
        limits: Limits,
    ) -> (
        SocketAddr,
        Metrics,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let m = Metrics::default();
        let cancel = CancellationToken::new();
        let router = Router::new().route("/", get(|| async { "hi\n" })).route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "late\n"
            }),
        );
        let t = spawn(l, router, limits, "test", m.clone(), cancel.clone());
        (addr, m, cancel, t)
    }

    async fn get_ok(addr: SocketAddr) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    fn limits(max: usize) -> Limits {
        Limits {
            max_connections: max,
            request_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(800),
            shutdown_grace: Duration::from_millis(200),
        }
    }

    #[tokio::test]
    async fn held_half_sent_requests_are_evicted_and_a_fresh_request_is_served() {
        let (addr, m, cancel, task) = start(limits(8)).await;
        let mut held = Vec::new();
        for _ in 0..40 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
            held.push(s);
        }
        let t0 = Instant::now();
        let out = get_ok(addr).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(
            t0.elapsed() < Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
        let text = m.render();
        assert!(
            text.contains("rebalancer_http_connections{listener=\"test\"}"),
            "{text}"
        );
        let evicted = crate::serve::metrics::ListenerReasonLabel {
            listener: "test".into(),
            reason: "evicted".into(),
        };
        assert!(m.http_connections_closed.get_or_create(&evicted).get() >= 32);
        let open = m
            .http_connections
            .get_or_create(&ListenerLabel {
                listener: "test".into(),
            })
            .get();
        assert!(open <= 8, "{open} open connections past the limit of 8");
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("shutdown bounded")
            .unwrap();
        drop(held);
    }

    #[tokio::test]
    async fn header_timeout_idle_timeout_and_bounded_shutdown_with_a_busy_request() {
        let (addr, m, cancel, task) = start(limits(4)).await;
        // Half-sent headers are cut after the request timeout.
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut buf = Vec::new();
        let t0 = Instant::now();
        let _ = tokio::time::timeout(Duration::from_secs(3), half.read_to_end(&mut buf))
            .await
            .expect("closed by the daemon");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        // A slow handler is answered 408 at the request timeout.
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(2), slow.read(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert!(
            out[..n].starts_with(b"HTTP/1.1 408"),
            "{:?}",
            String::from_utf8_lossy(&out[..n])
        );
        // That keep-alive connection is then closed: no next request within the timeout.
        let t0 = Instant::now();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), slow.read_to_end(&mut rest))
            .await
            .expect("idle connection closed");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        let closed = |reason: &str| {
            m.http_connections_closed
                .get_or_create(&ListenerReasonLabel {
                    listener: "test".into(),
                    reason: reason.into(),
                })
                .get()
        };
        assert_eq!(closed("request_timeout") + closed("idle"), 2);
        // Shutdown with a request in flight ends within the grace.
        let mut busy = tokio::net::TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("shutdown bounded")
            .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "listener closed"
        );
    }
}

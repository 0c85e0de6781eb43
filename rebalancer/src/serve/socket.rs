//! The admission socket: a unix socket served by axum, mode 0600 (0660 with a configured group),
//! whose peers are checked with SO_PEERCRED — root always, members of the configured group
//! when one is set, nobody else — and rate-limited per peer uid (`server.requests_per_second`).

use std::{
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use axum::{
    extract::{connect_info::Connected, ConnectInfo, Request},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    serve::IncomingStream,
    Json, Router,
};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::ratelimit::RateLimiter;

/// Credentials of the connecting process, from SO_PEERCRED.
#[derive(Clone, Copy, Debug)]
pub struct PeerCred {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub pid: Option<i32>,
}

impl Connected<IncomingStream<'_, UnixListener>> for PeerCred {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        match stream.io().peer_cred() {
            Ok(c) => PeerCred {
                uid: Some(c.uid()),
                gid: Some(c.gid()),
                pid: c.pid(),
            },
            Err(_) => PeerCred {
                uid: None,
                gid: None,
                pid: None,
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create socket directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("cannot bind admission socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown group {name:?} (server.socket_group)")]
    UnknownGroup { name: String },
}

/// Who may talk to the socket besides root.
#[derive(Clone, Copy, Debug, Default)]
pub struct Access {
    pub allowed_gid: Option<u32>,
}

impl Access {
    pub fn allows(&self, peer: &PeerCred) -> bool {
        match (peer.uid, peer.gid) {
            (Some(0), _) => true,
            (Some(_), Some(gid)) => self.allowed_gid == Some(gid),
            _ => false,
        }
    }
}

/// Looks up a group id by name (getgrnam_r).
pub fn group_id(name: &str) -> Result<u32, SocketError> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| SocketError::UnknownGroup { name: name.into() })?;
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buf outlives it.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    if rc != 0 || out.is_null() {
        return Err(SocketError::UnknownGroup { name: name.into() });
    }
    Ok(grp.gr_gid)
}

/// Binds `path` (removing a stale socket, never another kind of file) with mode 0600, or 0660
/// and group ownership when `group` is set.
pub fn bind(path: &Path, group: Option<u32>) -> Result<UnixListener, SocketError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| SocketError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if !md.file_type().is_socket() {
            return Err(SocketError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let bind_err = |source| SocketError::Bind {
        path: path.to_path_buf(),
        source,
    };
    // Bind under a restrictive umask so the socket is never briefly world-accessible.
    // SAFETY: umask is process-wide but has no memory-safety concerns.
    let old = unsafe { libc::umask(0o177) };
    let listener = UnixListener::bind(path);
    unsafe { libc::umask(old) };
    let listener = listener.map_err(bind_err)?;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(bind_err)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(bind_err)?;
    }
    Ok(listener)
}

/// What every request passes before its handler: the peer check, then the peer's rate limit.
#[derive(Clone)]
struct Gate {
    access: Access,
    limiter: Arc<Mutex<RateLimiter>>,
}

async fn check_peer(
    axum::extract::State(gate): axum::extract::State<Gate>,
    ConnectInfo(peer): ConnectInfo<PeerCred>,
    req: Request,
    next: Next,
) -> Response {
    let Some(uid) = peer.uid.filter(|_| gate.access.allows(&peer)) else {
        tracing::warn!(uid = ?peer.uid, pid = ?peer.pid, "admission socket: peer refused");
        return (StatusCode::FORBIDDEN, Json(serde_json::json!({"error": "permission denied: only root (or the configured group) may use this socket"})))
            .into_response();
    };
    let limited = gate
        .limiter
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .check(uid, std::time::Instant::now());
    if let Err(wait) = limited {
        tracing::debug!(uid, pid = ?peer.pid, "admission socket: rate limited");
        let secs = wait.as_secs() + 1;
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, secs.to_string())],
            Json(serde_json::json!({"error": format!("rate limited: more than server.requests_per_second requests from uid {uid}; retry in {wait:?}")})),
        )
            .into_response();
    }
    next.run(req).await
}

/// Serves `router` on `listener` with the peer check, until `cancel`.
pub fn spawn(
    listener: UnixListener,
    router: Router,
    access: Access,
    requests_per_second: u32,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let gate = Gate {
        access,
        limiter: Arc::new(Mutex::new(RateLimiter::new(requests_per_second))),
    };
    let app = router.layer(middleware::from_fn_with_state(gate, check_peer));
    tokio::spawn(async move {
        let served = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<PeerCred>(),
        )
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admission socket failed");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rules() {
        let root = PeerCred {
            uid: Some(0),
            gid: Some(0),
            pid: None,
        };
        let user = PeerCred {
            uid: Some(1000),
            gid: Some(1000),
            pid: None,
        };
        let unknown = PeerCred {
            uid: None,
            gid: None,
            pid: None,
        };
        assert!(Access::default().allows(&root));
        assert!(!Access::default().allows(&user));
        assert!(!Access::default().allows(&unknown));
        assert!(Access {
            allowed_gid: Some(1000)
        }
        .allows(&user));
        assert!(!Access {
            allowed_gid: Some(5)
        }
        .allows(&user));
    }

    #[tokio::test]
    async fn bind_refuses_to_replace_a_regular_file_and_sets_0600() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("not-a-socket");
        std::fs::write(&f, "keep me").unwrap();
        assert!(matches!(
            bind(&f, None),
            Err(SocketError::NotASocket { .. })
        ));
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "keep me");
        let s = dir.path().join("sub/api.sock");
        let l = bind(&s, None).unwrap();
        assert_eq!(
            std::fs::metadata(&s).unwrap().permissions().mode() & 0o777,
            0o600
        );
        drop(l);
        // A stale socket is replaced.
        bind(&s, None).unwrap();
    }
}

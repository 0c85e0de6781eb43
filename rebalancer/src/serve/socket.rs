//! The admission socket: a unix socket served by axum, mode 0600 (0660 with a configured group),
//! whose peers are checked with SO_PEERCRED — root always, members of the configured group
//! when one is set, nobody else — and rate-limited per peer uid (`server.requests_per_second`).

use std::{
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use std::os::unix::io::AsRawFd;

use axum::{
    extract::{ConnectInfo, Request},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    Json, Router,
};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::ratelimit::RateLimiter;

/// Credentials of the connecting process: uid, gid and pid from SO_PEERCRED, its supplementary
/// groups from SO_PEERGROUPS (as the kernel recorded them at connect time).
#[derive(Clone, Debug, Default)]
pub struct PeerCred {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub pid: Option<i32>,
    pub groups: Vec<u32>,
}

impl PeerCred {
    /// The credentials of the peer of `stream`.
    pub fn of(stream: &tokio::net::UnixStream) -> PeerCred {
        match stream.peer_cred() {
            Ok(c) => PeerCred {
                uid: Some(c.uid()),
                gid: Some(c.gid()),
                pid: c.pid(),
                groups: peer_groups(stream.as_raw_fd()),
            },
            Err(_) => PeerCred::default(),
        }
    }
}

/// `SO_PEERGROUPS` (asm-generic value, as on x86 and arm; not exported by the libc crate here).
const SO_PEERGROUPS: libc::c_int = 59;

/// The peer's supplementary groups (SO_PEERGROUPS, Linux 4.13+); empty when unavailable, so a
/// peer is then judged by its primary group only.
fn peer_groups(fd: std::os::unix::io::RawFd) -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: the buffer is `len` bytes long and outlives the call.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return groups;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= 65536 {
            groups.resize(n, 0);
            continue;
        }
        return Vec::new();
    }
}

/// The admission socket as a [`super::conn::Listener`]: each connection with its peer's
/// credentials.
pub struct PeerListener(pub UnixListener);

impl super::conn::Listener for PeerListener {
    type Io = tokio::net::UnixStream;
    type Info = PeerCred;
    async fn accept_conn(&mut self) -> std::io::Result<(Self::Io, PeerCred)> {
        let (s, _) = self.0.accept().await?;
        let cred = PeerCred::of(&s);
        Ok((s, cred))
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
    #[error("{path} is the socket of a running daemon (it accepts connections); refusing to take it over")]
    InUse { path: PathBuf },
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
    /// Root, or a member of the configured group: as primary group or a supplementary one.
    pub fn allows(&self, peer: &PeerCred) -> bool {
        match (peer.uid, peer.gid, self.allowed_gid) {
            (Some(0), _, _) => true,
            (Some(_), Some(gid), Some(allowed)) => gid == allowed || peer.groups.contains(&allowed),
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
        // A socket something still listens on is never stolen; only a stale one is replaced.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(SocketError::InUse {
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

/// Serves `router` on `listener` with the peer check, within `limits` (see [`super::conn`]),
/// until `cancel`.
pub fn spawn(
    listener: UnixListener,
    router: Router,
    access: Access,
    requests_per_second: u32,
    limits: super::conn::Limits,
    metrics: super::Metrics,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let gate = Gate {
        access,
        limiter: Arc::new(Mutex::new(RateLimiter::new(requests_per_second))),
    };
    let app = router.layer(middleware::from_fn_with_state(gate, check_peer));
    super::conn::spawn(PeerListener(listener), app, limits, "api", metrics, cancel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rules() {
        let root = PeerCred {
            uid: Some(0),
            gid: Some(0),
            ..Default::default()
        };
        let user = PeerCred {
            uid: Some(1000),
            gid: Some(1000),
            pid: None,
            groups: vec![1000, 27],
        };
        let unknown = PeerCred::default();
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
        // A supplementary group counts as membership.
        assert!(Access {
            allowed_gid: Some(27)
        }
        .allows(&user));
    }

    #[tokio::test]
    async fn supplementary_groups_come_from_so_peergroups() {
        let (a, _b) = tokio::net::UnixStream::pair().unwrap();
        let cred = PeerCred::of(&a);
        // SAFETY: getgroups with a buffer of the size it reports.
        let mut mine = vec![0 as libc::gid_t; 256];
        let n = unsafe { libc::getgroups(mine.len() as i32, mine.as_mut_ptr()) };
        assert!(n >= 0);
        mine.truncate(n as usize);
        mine.sort_unstable();
        let mut got = cred.groups.clone();
        got.sort_unstable();
        assert_eq!(got, mine, "SO_PEERGROUPS of our own socket pair");
        assert_eq!(cred.uid, Some(unsafe { libc::geteuid() }));
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
        // A live socket is never taken over.
        assert!(matches!(bind(&s, None), Err(SocketError::InUse { .. })));
        drop(l);
        // A stale socket is replaced.
        bind(&s, None).unwrap();
    }
}

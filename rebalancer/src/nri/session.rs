//! One plugin connection to the runtime's NRI socket, and the reconnect loop around it.
//!
//! The plugin dials the socket, registers on the Runtime service (mux conn 2), and then serves
//! the Plugin service (mux conn 1): Configure, Synchronize, CreateContainer, … Each request is
//! answered before the next is read; the [`Handler`] decides. Between messages (the socket is
//! read with a short timeout) the handler may hand over unsolicited container updates, sent as
//! `Runtime.UpdateContainers` — one request at a time, only once the connection has been quiet
//! for [`QUIET`] (see `daemon::nri_updates` for why), with the runtime's answer handed back
//! ([`Handler::updates_answered`]). When the runtime goes away (restart, EOF) [`run`]
//! reconnects with backoff.

use std::{
    io::{ErrorKind, Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use prost::Message as _;

use super::api;
use super::envelope::{Request, Response, Status};
use super::wire::{self, Demux, WireError};

pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// gRPC status codes used in answers.
pub const CODE_UNKNOWN: i32 = 2;
pub const CODE_INVALID_ARGUMENT: i32 = 3;
pub const CODE_UNIMPLEMENTED: i32 = 12;

/// What the plugin answers; an `Err` fails the runtime's request with that message (for
/// CreateContainer: the container is not created).
pub trait Handler {
    fn configure(&mut self, req: api::ConfigureRequest) -> Result<api::ConfigureResponse, String>;
    fn synchronize(
        &mut self,
        req: api::SynchronizeRequest,
    ) -> Result<api::SynchronizeResponse, String>;
    fn create_container(
        &mut self,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, String>;
    fn update_container(
        &mut self,
        _req: api::UpdateContainerRequest,
    ) -> Result<api::UpdateContainerResponse, String> {
        Ok(Default::default())
    }
    fn stop_container(
        &mut self,
        req: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse, String>;
    fn state_change(&mut self, ev: api::StateChangeEvent) -> Result<(), String>;
    /// The runtime is shutting down.
    fn shutdown(&mut self) {}
    /// Unsolicited updates to send now; polled between messages, once the previous ones were
    /// answered.
    fn pending_updates(&mut self) -> Vec<api::ContainerUpdate> {
        Vec::new()
    }
    /// The runtime answered the last unsolicited updates: `Ok(ids of the containers it failed
    /// to update)`, or the error of the whole request (also when the connection went first).
    fn updates_answered(&mut self, _result: Result<Vec<String>, String>) {}
    /// The runtime did not answer the last unsolicited updates within
    /// [`Options::update_deadline`]; the connection is closed after this call.
    fn updates_timed_out(&mut self) {
        self.updates_answered(Err("the runtime did not answer in time".into()));
    }
    /// The connection came up (registered) or went down.
    fn connection(&mut self, _up: bool) {}
    /// Registered and serving: called at every turn of the session's loop (every message, and
    /// at least every 25 ms while idle), for liveness.
    fn alive(&mut self) {}
    /// No runtime listens on the socket (absent, or refusing connections): called at each
    /// failed attempt, so waiting for a stopped runtime is not taken for a stuck plugin.
    fn runtime_absent(&mut self) {}
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("connecting to the NRI socket {path}: {err}")]
    Connect { path: PathBuf, err: std::io::Error },
    #[error("NRI socket I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the runtime closed the NRI connection")]
    Closed,
    #[error("malformed bytes from the runtime: {0}")]
    Wire(#[from] WireError),
    #[error("the runtime refused the plugin's registration: {0}")]
    Registration(String),
    #[error("the runtime did not answer the registration within {0:?}")]
    RegistrationTimeout(Duration),
    #[error("the runtime did not answer the plugin's UpdateContainers within {0:?}; connection treated as broken")]
    UpdateTimeout(Duration),
}

/// How to reach the runtime and who the plugin is.
#[derive(Clone, Debug)]
pub struct Options {
    pub socket: PathBuf,
    pub name: String,
    /// Two digits; plugins are called in ascending index order.
    pub index: String,
    /// How long an unsolicited UpdateContainers may go unanswered before the connection is
    /// treated as broken (closed, reconnected).
    pub update_deadline: Duration,
}

/// [`Options::update_deadline`]'s default: past NRI's own 2 s plugin request timeout, and
/// short enough that a wedged connection is noticed well within a control period.
pub const UPDATE_DEADLINE: Duration = Duration::from_secs(5);

/// The most memory a request may take once decoded, as [`decoded_bound`] estimates it: a
/// message within the byte limit can still decode to far more (an empty nested message is
/// 2 bytes on the wire and a whole struct in memory). A real node's Synchronize (hundreds of
/// containers, each with its env, mounts and annotations) stays well below it.
pub const MAX_DECODED: usize = 256 << 20;

/// An upper bound of what protobuf `b` takes once decoded into the NRI API's structs: each
/// length-delimited field that parses as a message counts as the largest struct it could be
/// (and its fields are counted within), every other field as a few words. None when it
/// passes `limit` (the walk stops there).
pub fn decoded_bound(b: &[u8], limit: usize) -> Option<usize> {
    const MESSAGE: usize = std::mem::size_of::<api::Container>();
    const FIELD: usize = 32;
    fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*i)?;
            *i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    enum Stop {
        Malformed,
        TooBig,
    }
    // The cost of `b` when it is a well-formed sequence of fields.
    fn walk(b: &[u8], depth: u32, used: usize, limit: usize) -> Result<usize, Stop> {
        let mut i = 0;
        let mut cost = 0usize;
        while i < b.len() {
            let key = varint(b, &mut i).ok_or(Stop::Malformed)?;
            if key >> 3 == 0 {
                return Err(Stop::Malformed);
            }
            cost += FIELD;
            let skip = |i: &mut usize, n: usize| {
                *i = i
                    .checked_add(n)
                    .filter(|&e| e <= b.len())
                    .ok_or(Stop::Malformed)?;
                Ok(())
            };
            match key & 7 {
                0 => {
                    varint(b, &mut i).ok_or(Stop::Malformed)?;
                }
                1 => skip(&mut i, 8)?,
                5 => skip(&mut i, 4)?,
                2 => {
                    let len = varint(b, &mut i)
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or(Stop::Malformed)?;
                    let start = i;
                    skip(&mut i, len)?;
                    cost += len;
                    if depth < 16 {
                        match walk(&b[start..i], depth + 1, used + cost, limit) {
                            Ok(c) => cost += MESSAGE + c,
                            // bytes or a string, not a message
                            Err(Stop::Malformed) => {}
                            Err(Stop::TooBig) => return Err(Stop::TooBig),
                        }
                    }
                }
                _ => return Err(Stop::Malformed),
            }
            if used + cost > limit {
                return Err(Stop::TooBig);
            }
        }
        Ok(cost)
    }
    match walk(b, 0, 0, limit) {
        Ok(c) => Some(c),
        // prost refuses it, with its own error
        Err(Stop::Malformed) => Some(b.len()),
        Err(Stop::TooBig) => None,
    }
}

/// Answers one request on the Plugin service: the response payload, or a status.
pub fn dispatch(h: &mut dyn Handler, req: &Request) -> Result<Vec<u8>, Status> {
    fn decode<M: prost::Message + Default>(what: &str, b: &[u8]) -> Result<M, Status> {
        if decoded_bound(b, MAX_DECODED).is_none() {
            return Err(Status {
                code: CODE_INVALID_ARGUMENT,
                message: format!(
                    "rebalancer: {what} of {} bytes would take more than {} MiB decoded",
                    b.len(),
                    MAX_DECODED >> 20
                ),
            });
        }
        M::decode(b).map_err(|e| Status {
            code: CODE_INVALID_ARGUMENT,
            message: format!("rebalancer: malformed {what}: {e}"),
        })
    }
    fn answer<M: prost::Message>(r: Result<M, String>) -> Result<Vec<u8>, Status> {
        r.map(|m| m.encode_to_vec()).map_err(|message| Status {
            code: CODE_UNKNOWN,
            message,
        })
    }
    if req.service != PLUGIN_SERVICE {
        return Err(Status {
            code: CODE_UNIMPLEMENTED,
            message: format!("rebalancer: unknown service {:?}", req.service),
        });
    }
    let p = &req.payload;
    match req.method.as_str() {
        "Configure" => answer(h.configure(decode("ConfigureRequest", p)?)),
        "Synchronize" => answer(h.synchronize(decode("SynchronizeRequest", p)?)),
        "CreateContainer" => answer(h.create_container(decode("CreateContainerRequest", p)?)),
        "UpdateContainer" => answer(h.update_container(decode("UpdateContainerRequest", p)?)),
        "StopContainer" => answer(h.stop_container(decode("StopContainerRequest", p)?)),
        "StateChange" => answer(
            h.state_change(decode("StateChangeEvent", p)?)
                .map(|()| api::Empty {}),
        ),
        "Shutdown" => {
            h.shutdown();
            Ok(api::Empty {}.encode_to_vec())
        }
        m => Err(Status {
            code: CODE_UNIMPLEMENTED,
            message: format!("rebalancer: unknown method {m:?}"),
        }),
    }
}

/// One connection, from dialing to the runtime closing it (or `stop`).
pub fn run_once(
    opts: &Options,
    h: &mut dyn Handler,
    stop: &AtomicBool,
) -> Result<(), SessionError> {
    let mut sock = UnixStream::connect(&opts.socket).map_err(|err| SessionError::Connect {
        path: opts.socket.clone(),
        err,
    })?;
    sock.set_read_timeout(Some(POLL))?;
    let register = api::RegisterPluginRequest {
        plugin_name: opts.name.clone(),
        plugin_idx: opts.index.clone(),
    };
    send_request(&mut sock, 1, "RegisterPlugin", &register.encode_to_vec())?;
    let mut conn = Conn {
        registered: false,
        next_stream: 3,
        awaiting: None,
    };
    let started = Instant::now();
    let mut last_message = Instant::now();
    let mut demux = Demux::default();
    let mut buf = vec![0u8; 64 << 10];
    let result = loop {
        if stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        if conn.registered {
            h.alive();
        }
        match sock.read(&mut buf) {
            Ok(0) => break Err(SessionError::Closed),
            Ok(n) => {
                last_message = Instant::now();
                if let Err(e) = demux.push(&buf[..n]) {
                    break Err(e.into());
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // Past the deadline only once nothing is left to read: an answer already
                // waiting (the plugin thread itself late) is not a timeout.
                if conn
                    .awaiting
                    .is_some_and(|(_, sent)| sent.elapsed() > opts.update_deadline)
                {
                    conn.awaiting = None;
                    h.updates_timed_out();
                    break Err(SessionError::UpdateTimeout(opts.update_deadline));
                }
                if !conn.registered && started.elapsed() > Duration::from_secs(10) {
                    break Err(SessionError::RegistrationTimeout(started.elapsed()));
                }
                if conn.registered && conn.awaiting.is_none() && last_message.elapsed() >= QUIET {
                    let updates = h.pending_updates();
                    if !updates.is_empty() {
                        let req = api::UpdateContainersRequest {
                            update: updates,
                            evict: vec![],
                        };
                        let stream = conn.next_stream;
                        conn.next_stream += 2;
                        conn.awaiting = Some((stream, Instant::now()));
                        if let Err(e) = send_request(
                            &mut sock,
                            stream,
                            "UpdateContainers",
                            &req.encode_to_vec(),
                        ) {
                            break Err(e.into());
                        }
                    }
                }
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => break Err(e.into()),
        }
        let mut failed = None;
        loop {
            let m = match demux.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    failed = Some(SessionError::from(e));
                    break;
                }
            };
            if let Err(e) = handle(&mut sock, h, &m, &mut conn) {
                failed = Some(e);
                break;
            }
        }
        if let Some(e) = failed {
            break Err(e);
        }
        // Checked here too: a runtime that keeps the socket busy never lets a read time out.
        if conn
            .awaiting
            .is_some_and(|(_, sent)| sent.elapsed() > opts.update_deadline)
        {
            conn.awaiting = None;
            h.updates_timed_out();
            break Err(SessionError::UpdateTimeout(opts.update_deadline));
        }
    };
    if conn.awaiting.is_some() {
        h.updates_answered(Err(
            "the NRI connection ended before the runtime answered".into()
        ));
    }
    if conn.registered {
        h.connection(false);
    }
    result
}

/// How often the socket is polled for quiet (unsolicited updates wait for it).
const POLL: Duration = Duration::from_millis(25);
/// How long the runtime must have sent nothing before unsolicited updates go out.
pub const QUIET: Duration = Duration::from_millis(50);

/// One connection's protocol state.
struct Conn {
    registered: bool,
    /// Stream id of the next request of ours (odd; 1 is RegisterPlugin).
    next_stream: u32,
    /// The UpdateContainers request not answered yet, and when it was sent.
    awaiting: Option<(u32, Instant)>,
}

fn handle(
    sock: &mut UnixStream,
    h: &mut dyn Handler,
    m: &wire::Message,
    conn: &mut Conn,
) -> Result<(), SessionError> {
    match (m.conn, m.kind) {
        (wire::PLUGIN_CONN, wire::TYPE_REQUEST) => {
            let resp = match Request::decode(m.payload.as_slice()) {
                Ok(req) => match dispatch(h, &req) {
                    Ok(payload) => Response {
                        status: Some(Status {
                            code: 0,
                            message: String::new(),
                        }),
                        payload,
                    },
                    Err(status) => {
                        tracing::warn!(method = %req.method, error = %status.message, "NRI request answered with an error");
                        Response {
                            status: Some(status),
                            payload: vec![],
                        }
                    }
                },
                Err(e) => Response {
                    status: Some(Status {
                        code: CODE_INVALID_ARGUMENT,
                        message: format!("rebalancer: malformed ttrpc request: {e}"),
                    }),
                    payload: vec![],
                },
            };
            sock.write_all(&wire::encode(
                wire::PLUGIN_CONN,
                m.stream,
                wire::TYPE_RESPONSE,
                &resp.encode_to_vec(),
            ))?;
        }
        (wire::RUNTIME_CONN, wire::TYPE_RESPONSE) => {
            let resp = Response::decode(m.payload.as_slice()).map_err(|e| {
                SessionError::Registration(format!("malformed response from the runtime: {e}"))
            })?;
            let status = resp.status.unwrap_or_default();
            if m.stream == 1 {
                if status.code != 0 {
                    return Err(SessionError::Registration(status.message));
                }
                conn.registered = true;
                h.connection(true);
            } else if conn.awaiting.is_some_and(|(s, _)| s == m.stream) {
                conn.awaiting = None;
                let result = if status.code != 0 {
                    tracing::warn!(error = %status.message, "the runtime refused container updates");
                    Err(status.message)
                } else {
                    match api::UpdateContainersResponse::decode(resp.payload.as_slice()) {
                        Ok(r) => Ok(r
                            .failed
                            .into_iter()
                            .inspect(|f| tracing::warn!(container = %f.container_id, "the runtime failed a container update"))
                            .map(|f| f.container_id)
                            .collect()),
                        Err(e) => Err(format!("malformed UpdateContainersResponse: {e}")),
                    }
                };
                h.updates_answered(result);
            } else {
                tracing::debug!(stream = m.stream, "answer to no request of ours ignored");
            }
        }
        (c, kind) => {
            tracing::debug!(conn = c, kind, "unexpected NRI message ignored");
        }
    }
    Ok(())
}

fn send_request(
    sock: &mut UnixStream,
    stream: u32,
    method: &str,
    payload: &[u8],
) -> std::io::Result<()> {
    let req = Request {
        service: RUNTIME_SERVICE.into(),
        method: method.into(),
        payload: payload.to_vec(),
        timeout_nano: 0,
        metadata: vec![],
    };
    sock.write_all(&wire::encode(
        wire::RUNTIME_CONN,
        stream,
        wire::TYPE_REQUEST,
        &req.encode_to_vec(),
    ))
}

/// Connects, serves until the runtime goes away, and reconnects with backoff (0.2 s doubling
/// to 5 s, reset after a session that registered), until `stop`.
pub fn run(opts: &Options, h: &mut dyn Handler, stop: &AtomicBool) {
    let mut backoff = Duration::from_millis(200);
    let mut last_err = String::new();
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        match run_once(opts, h, stop) {
            Ok(()) => return,
            // No runtime there (stopped, restarting): waiting for it is not a plugin failure.
            Err(SessionError::Connect { err, .. })
                if matches!(
                    err.kind(),
                    ErrorKind::NotFound | ErrorKind::ConnectionRefused
                ) =>
            {
                h.runtime_absent();
                let msg = format!("connecting to the NRI socket: {err}");
                if msg != last_err {
                    tracing::warn!(error = %msg, socket = %opts.socket.display(), "NRI runtime not there; reconnecting with backoff");
                    last_err = msg;
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if msg != last_err {
                    tracing::warn!(error = %msg, socket = %opts.socket.display(), "NRI connection down; reconnecting with backoff");
                    last_err = msg;
                }
            }
        }
        if t0.elapsed() > Duration::from_secs(5) {
            backoff = Duration::from_millis(200);
        }
        sleep_unless(stop, backoff);
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether an NRI socket exists at `path` (for `admission = "auto"`).
pub fn socket_exists(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A Synchronize of a million empty containers is 2 MiB on the wire (within the byte
    /// limit) but gigabytes decoded: refused before decoding, with the reason. A real one
    /// (containers with their fields) passes, and so does what is not a message at all
    /// (prost refuses that itself).
    #[test]
    fn a_message_small_on_the_wire_but_huge_decoded_is_refused_before_decoding() {
        let bomb = api::SynchronizeRequest {
            containers: vec![api::Container::default(); 1_000_000],
            ..Default::default()
        }
        .encode_to_vec();
        assert!(bomb.len() < crate::nri::wire::MAX_TTRPC, "{}", bomb.len());
        assert_eq!(decoded_bound(&bomb, MAX_DECODED), None);
        let req = Request {
            service: PLUGIN_SERVICE.into(),
            method: "Synchronize".into(),
            payload: bomb,
            ..Default::default()
        };
        let st = dispatch(&mut Plugin::default(), &req).unwrap_err();
        assert_eq!(st.code, CODE_INVALID_ARGUMENT);
        assert!(st.message.contains("decoded"), "{}", st.message);
        // a node's worth of real containers passes
        let c = api::Container {
            id: "a".repeat(64),
            name: "app".into(),
            args: vec!["sleep".into(), "3600".into()],
            env: (0..40).map(|i| format!("VAR{i}=value")).collect(),
            annotations: (0..20).map(|i| (format!("k{i}"), "v".into())).collect(),
            ..Default::default()
        };
        let real = api::SynchronizeRequest {
            containers: vec![c; 1000],
            ..Default::default()
        }
        .encode_to_vec();
        assert!(decoded_bound(&real, MAX_DECODED).is_some());
        assert!(decoded_bound(&[0xff, 0xff, 0xff], MAX_DECODED).is_some());
    }

    /// Registers, then wants to send one unsolicited update; records what it was told.
    #[derive(Default)]
    struct Plugin {
        timed_out: bool,
        down: bool,
        sent: bool,
        absent: u32,
    }

    impl Handler for Plugin {
        fn configure(
            &mut self,
            _: api::ConfigureRequest,
        ) -> Result<api::ConfigureResponse, String> {
            Ok(Default::default())
        }
        fn synchronize(
            &mut self,
            _: api::SynchronizeRequest,
        ) -> Result<api::SynchronizeResponse, String> {
            Ok(Default::default())
        }
        fn create_container(
            &mut self,
            _: api::CreateContainerRequest,
        ) -> Result<api::CreateContainerResponse, String> {
            Ok(Default::default())
        }
        fn stop_container(
            &mut self,
            _: api::StopContainerRequest,
        ) -> Result<api::StopContainerResponse, String> {
            Ok(Default::default())
        }
        fn state_change(&mut self, _: api::StateChangeEvent) -> Result<(), String> {
            Ok(())
        }
        fn pending_updates(&mut self) -> Vec<api::ContainerUpdate> {
            if self.sent {
                return Vec::new();
            }
            self.sent = true;
            vec![crate::daemon::nri_updates::update("c1", None, None)]
        }
        fn updates_timed_out(&mut self) {
            self.timed_out = true;
        }
        fn connection(&mut self, up: bool) {
            self.down |= !up;
        }
        fn runtime_absent(&mut self) {
            self.absent += 1;
        }
    }

    /// No runtime at the socket: each failed attempt tells the handler (its health waits for
    /// the runtime rather than counting the silence), and nothing else is called.
    #[test]
    fn an_absent_runtime_is_told_to_the_handler_at_each_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options {
            socket: dir.path().join("nri.sock"),
            name: "t".into(),
            index: "00".into(),
            update_deadline: Duration::from_secs(1),
        };
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let t = std::thread::spawn(move || {
            let mut p = Plugin::default();
            run(&opts, &mut p, &s2);
            p
        });
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        let p = t.join().unwrap();
        assert!(p.absent >= 2, "{}", p.absent);
        assert!(!p.down && !p.sent);
    }

    /// N3: a runtime that answers the registration but never the plugin's UpdateContainers
    /// (containerd#13733's wedge, a dropped request): the session gives up after the deadline
    /// — the handler is told, the connection is closed (and `run` reconnects) — instead of
    /// waiting for ever with every later update blocked behind it.
    #[test]
    fn an_unanswered_update_ends_the_connection_at_the_deadline() {
        unanswered_update(false);
    }

    /// The same while the runtime keeps the socket busy (an event every 5 ms, never a quiet
    /// poll): the deadline is still kept.
    #[test]
    fn an_unanswered_update_ends_a_busy_connection_at_the_deadline() {
        unanswered_update(true);
    }

    fn unanswered_update(busy: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let runtime = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut demux = Demux::default();
            let mut buf = vec![0u8; 1 << 16];
            let mut updates = 0;
            loop {
                let n = match s.read(&mut buf) {
                    Ok(0) | Err(_) => return updates,
                    Ok(n) => n,
                };
                demux.push(&buf[..n]).unwrap();
                while let Some(m) = demux.next_message().unwrap() {
                    let req = Request::decode(m.payload.as_slice()).unwrap();
                    if req.method == "RegisterPlugin" {
                        let resp = Response {
                            status: Some(Status::default()),
                            payload: api::Empty {}.encode_to_vec(),
                        };
                        s.write_all(&wire::encode(
                            wire::RUNTIME_CONN,
                            m.stream,
                            wire::TYPE_RESPONSE,
                            &resp.encode_to_vec(),
                        ))
                        .unwrap();
                    } else if req.method == "UpdateContainers" {
                        updates += 1; // never answered
                        if busy {
                            let mut w = s.try_clone().unwrap();
                            std::thread::spawn(move || {
                                let ev = Request {
                                    service: PLUGIN_SERVICE.into(),
                                    method: "StateChange".into(),
                                    payload: api::StateChangeEvent::default().encode_to_vec(),
                                    ..Default::default()
                                }
                                .encode_to_vec();
                                for stream in (2u32..).step_by(2) {
                                    let f = wire::encode(
                                        wire::PLUGIN_CONN,
                                        stream,
                                        wire::TYPE_REQUEST,
                                        &ev,
                                    );
                                    if w.write_all(&f).is_err() {
                                        return;
                                    }
                                    std::thread::sleep(Duration::from_millis(5));
                                }
                            });
                        }
                    }
                }
            }
        });
        let opts = Options {
            socket: path,
            name: "test".into(),
            index: "50".into(),
            update_deadline: Duration::from_millis(300),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let t0 = Instant::now();
        std::thread::spawn(move || {
            let mut p = Plugin::default();
            let r = run_once(&opts, &mut p, &AtomicBool::new(false));
            let _ = tx.send((r, p));
        });
        let (r, p) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the session kept waiting past the deadline");
        assert!(matches!(r, Err(SessionError::UpdateTimeout(_))), "{r:?}");
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(p.timed_out && p.down);
        assert_eq!(runtime.join().unwrap(), 1, "the update was sent once");
    }
}

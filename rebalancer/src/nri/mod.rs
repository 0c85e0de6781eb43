//! The NRI (Node Resource Interface) plugin's transport: containerd 1.7 / CRI-O ≥ 1.26 call
//! it on every pod and container lifecycle event, so admission happens *before* a container's
//! first instruction. Nothing here knows placement: `daemon::nri` is the policy behind the
//! [`session::Handler`] trait.
//!
//! - [`api`], [`envelope`]: protocol types generated at build time from NRI's own `api.proto`
//!   (`rebalancer/proto/`) and ttrpc's envelope.
//! - [`wire`]: pure framing — NRI's connection multiplexer (8-byte header: conn id, length)
//!   and ttrpc messages (10-byte header: length, stream id, type, flags) inside each conn.
//! - [`session`]: one connection to the runtime's socket — RegisterPlugin, then serving the
//!   Plugin service on mux conn 1 and calling the Runtime service on conn 2 — and the
//!   reconnect loop with backoff.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod envelope {
    include!(concat!(env!("OUT_DIR"), "/ttrpc.rs"));
}

pub mod session;
pub mod wire;

/// NRI's default socket (containerd and CRI-O).
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";

//! systemd's service notifications (sd_notify(3)) without libsystemd: one datagram to the unix
//! socket named by `$NOTIFY_SOCKET` (a leading `@` is the abstract namespace). A `Type=notify`
//! unit is started once `READY=1` arrives; with `WatchdogSec=` systemd restarts the service
//! when `WATCHDOG=1` stops arriving. Outside systemd (no `$NOTIFY_SOCKET`) every call is a no-op.
use std::{io, os::unix::net::UnixDatagram, path::PathBuf};

/// Where notifications go, read once from the environment.
#[derive(Debug)]
pub struct Notifier {
    target: Option<String>,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET` (unset or empty: notifications off).
    pub fn from_env() -> Notifier {
        Notifier::to(
            std::env::var("NOTIFY_SOCKET")
                .ok()
                .filter(|s| !s.is_empty()),
        )
    }

    pub fn to(target: Option<String>) -> Notifier {
        Notifier { target }
    }

    /// Whether a service manager listens.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `state` (e.g. "READY=1", "WATCHDOG=1", "STATUS=…"); Ok without a manager.
    pub fn send(&self, state: &str) -> io::Result<()> {
        let Some(target) = &self.target else {
            return Ok(());
        };
        let sock = UnixDatagram::unbound()?;
        if let Some(name) = target.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            sock.send_to(state.as_bytes(), PathBuf::from(target))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(s: &UnixDatagram) -> String {
        let mut buf = [0u8; 64];
        let n = s.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn sends_to_a_path_socket_and_an_abstract_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::to(Some(path.display().to_string()));
        assert!(n.enabled());
        n.send("READY=1").unwrap();
        assert_eq!(recv(&listener), "READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("rebalancer-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_listener = UnixDatagram::bind_addr(&addr).unwrap();
        Notifier::to(Some(format!("@{name}")))
            .send("WATCHDOG=1")
            .unwrap();
        assert_eq!(recv(&abstract_listener), "WATCHDOG=1");
    }

    #[test]
    fn without_a_manager_nothing_is_sent_and_nothing_fails() {
        let n = Notifier::to(None);
        assert!(!n.enabled());
        n.send("READY=1").unwrap();
    }
}

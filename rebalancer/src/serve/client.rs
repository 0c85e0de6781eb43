//! A minimal blocking HTTP/1.1 client over the admission unix socket, for the CLI (`admit`,
//! `status`, `explain`) and tests. One request per connection (`Connection: close`).

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {path} (is `rebalancer run` running, and are you root?)")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed HTTP response from {path}")]
    Malformed { path: String },
}

/// Sends one request; returns the status code and the body.
pub fn request(
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
) -> Result<(u16, String), ClientError> {
    let path = socket.display().to_string();
    let io = |source| ClientError::Io {
        path: path.clone(),
        source,
    };
    let mut s = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: path.clone(),
        source,
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: rebalancer\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).map_err(io)?;
    s.write_all(body).map_err(io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| ClientError::Malformed { path: path.clone() })?;
    let code = head
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| ClientError::Malformed { path: path.clone() })?;
    Ok((code, body.to_string()))
}

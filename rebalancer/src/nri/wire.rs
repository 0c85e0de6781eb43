//! Framing of NRI's single unix connection, pure over byte buffers.
//!
//! NRI multiplexes one socket into numbered connections (`pkg/net/multiplex`): each frame is
//! an 8-byte header — conn id (u32 BE), payload length (u32 BE, at most 16 MiB) — and the
//! payload. Conn 1 carries the Plugin service (the runtime calls, the plugin serves), conn 2
//! the Runtime service (the plugin calls). Each conn is a byte stream of ttrpc messages:
//! a 10-byte header — length (u32 BE, at most 4 MiB), stream id (u32 BE), type (1 request,
//! 2 response), flags — and a protobuf payload (`envelope::Request` / `Response`). A ttrpc
//! message may span mux frames, so each conn's bytes are reassembled before parsing.

use std::collections::BTreeMap;

/// Conn id of the Plugin service (served by the plugin).
pub const PLUGIN_CONN: u32 = 1;
/// Conn id of the Runtime service (called by the plugin).
pub const RUNTIME_CONN: u32 = 2;
pub const MUX_HEADER: usize = 8;
pub const MAX_MUX_PAYLOAD: usize = 1 << 24;
pub const TTRPC_HEADER: usize = 10;
pub const MAX_TTRPC: usize = 4 << 20;
pub const TYPE_REQUEST: u8 = 1;
pub const TYPE_RESPONSE: u8 = 2;

/// Malformed bytes from the peer: the connection cannot continue.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("mux frame on conn {conn} of {len} bytes exceeds the 16 MiB limit")]
    MuxTooLarge { conn: u32, len: usize },
    #[error("ttrpc message on conn {conn} of {len} bytes exceeds the 4 MiB limit")]
    TtrpcTooLarge { conn: u32, len: usize },
    #[error("mux frame for conn {0}, which is not NRI's plugin (1) or runtime (2) conn")]
    UnknownConn(u32),
}

/// One complete ttrpc message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub conn: u32,
    pub stream: u32,
    pub kind: u8,
    pub flags: u8,
    pub payload: Vec<u8>,
}

/// The bytes to send for one ttrpc message on `conn` (one mux frame per 16 MiB chunk; a
/// ttrpc message is at most 4 MiB so that is one frame).
pub fn encode(conn: u32, stream: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let inner = TTRPC_HEADER + payload.len();
    let mut out = Vec::with_capacity(MUX_HEADER + inner);
    out.extend_from_slice(&conn.to_be_bytes());
    out.extend_from_slice(&(inner as u32).to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&stream.to_be_bytes());
    out.push(kind);
    out.push(0);
    out.extend_from_slice(payload);
    out
}

/// Reassembles mux frames and the ttrpc messages inside each conn.
#[derive(Debug, Default)]
pub struct Demux {
    trunk: Vec<u8>,
    conns: BTreeMap<u32, Vec<u8>>,
}

impl Demux {
    /// Takes bytes read from the socket.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.trunk.extend_from_slice(bytes);
        let mut at = 0;
        while self.trunk.len() - at >= MUX_HEADER {
            let h = &self.trunk[at..at + MUX_HEADER];
            let conn = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
            let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
            if len > MAX_MUX_PAYLOAD {
                return Err(WireError::MuxTooLarge { conn, len });
            }
            if conn != PLUGIN_CONN && conn != RUNTIME_CONN {
                return Err(WireError::UnknownConn(conn));
            }
            if self.trunk.len() - at - MUX_HEADER < len {
                break;
            }
            let start = at + MUX_HEADER;
            self.conns
                .entry(conn)
                .or_default()
                .extend_from_slice(&self.trunk[start..start + len]);
            at = start + len;
        }
        self.trunk.drain(..at);
        Ok(())
    }

    /// The next complete ttrpc message of any conn, if one is buffered.
    pub fn next_message(&mut self) -> Result<Option<Message>, WireError> {
        for (&conn, buf) in self.conns.iter_mut() {
            if buf.len() < TTRPC_HEADER {
                continue;
            }
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if len > MAX_TTRPC {
                return Err(WireError::TtrpcTooLarge { conn, len });
            }
            if buf.len() < TTRPC_HEADER + len {
                continue;
            }
            let stream = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
            let (kind, flags) = (buf[8], buf[9]);
            let payload = buf[TTRPC_HEADER..TTRPC_HEADER + len].to_vec();
            buf.drain(..TTRPC_HEADER + len);
            return Ok(Some(Message {
                conn,
                stream,
                kind,
                flags,
                payload,
            }));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_any_split_of_the_byte_stream() {
        let mut bytes = encode(PLUGIN_CONN, 1, TYPE_REQUEST, b"hello");
        bytes.extend(encode(RUNTIME_CONN, 3, TYPE_RESPONSE, &[7u8; 3000]));
        for cut in 1..bytes.len() {
            let mut d = Demux::default();
            let mut got = Vec::new();
            for part in [&bytes[..cut], &bytes[cut..]] {
                d.push(part).unwrap();
                while let Some(m) = d.next_message().unwrap() {
                    got.push(m);
                }
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[0].payload, b"hello");
            assert_eq!((got[0].conn, got[0].stream, got[0].kind), (1, 1, 1));
            assert_eq!(
                (got[1].conn, got[1].stream, got[1].payload.len()),
                (2, 3, 3000)
            );
        }
    }

    #[test]
    fn a_ttrpc_message_split_over_mux_frames_is_reassembled() {
        let whole = encode(PLUGIN_CONN, 5, TYPE_REQUEST, b"0123456789");
        let inner = &whole[MUX_HEADER..];
        let mut d = Demux::default();
        for chunk in inner.chunks(4) {
            let mut f = PLUGIN_CONN.to_be_bytes().to_vec();
            f.extend((chunk.len() as u32).to_be_bytes());
            f.extend(chunk);
            d.push(&f).unwrap();
        }
        let m = d.next_message().unwrap().unwrap();
        assert_eq!((m.stream, m.payload.as_slice()), (5, &b"0123456789"[..]));
        assert_eq!(d.next_message().unwrap(), None);
    }

    #[test]
    fn oversized_or_foreign_frames_are_refused() {
        let mut d = Demux::default();
        let mut f = 1u32.to_be_bytes().to_vec();
        f.extend(((MAX_MUX_PAYLOAD + 1) as u32).to_be_bytes());
        assert!(matches!(d.push(&f), Err(WireError::MuxTooLarge { .. })));
        let mut d = Demux::default();
        let mut f = 9u32.to_be_bytes().to_vec();
        f.extend(0u32.to_be_bytes());
        assert_eq!(d.push(&f), Err(WireError::UnknownConn(9)));
        let mut d = Demux::default();
        let mut f = 1u32.to_be_bytes().to_vec();
        f.extend(10u32.to_be_bytes());
        f.extend(((MAX_TTRPC + 1) as u32).to_be_bytes());
        f.extend([0u8; 6]);
        d.push(&f).unwrap();
        assert!(matches!(
            d.next_message(),
            Err(WireError::TtrpcTooLarge { .. })
        ));
    }
}

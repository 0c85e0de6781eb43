//! A small Kubernetes API client: exactly what the exporter needs (GET, POST and PUT of one
//! JSON object) over HTTPS with the API server's CA, authenticated by a bearer token (the
//! pod's service account, re-read at every request because kubelet rotates it) or by a
//! kubeconfig's client certificate or token. One blocking request per connection
//! (`Connection: close`) on the exporter's own thread, with connect and I/O timeouts, so a
//! slow or dead API server holds up nothing else.
//!
//! Why not kube-rs: it needs k8s-openapi and an async HTTP stack of its own, a large compile
//! in a CI budget that is tight, for three calls on one object (46 more crates: the
//! measurement is in docs/noderesourcetopology.md). rustls on ring builds for the musl target with no C library to link.

use std::{
    io::{Read, Write},
    net::{TcpStream, ToSocketAddrs},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use base64::Engine;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use serde::Deserialize;

/// The in-cluster service account's files.
pub const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const TIMEOUT: Duration = Duration::from_secs(10);
/// Larger answers are refused (the object is a few KiB).
const MAX_RESPONSE: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("in-cluster config: {0} is not set (not in a pod? set kubernetes.kubeconfig)")]
    NotInCluster(&'static str),
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("connecting to {server}: {source}")]
    Connect {
        server: String,
        source: std::io::Error,
    },
    #[error("talking to {server}: {source}")]
    Io {
        server: String,
        source: std::io::Error,
    },
    #[error("malformed answer from {server}: {reason}")]
    Malformed { server: String, reason: String },
}

/// How requests authenticate.
#[derive(Clone)]
enum Auth {
    None,
    Token(String),
    /// A token file read at each request.
    TokenFile(PathBuf),
}

/// An API server and the credentials for it.
#[derive(Clone)]
pub struct Client {
    host: String,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
    auth: Auth,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Client {
    /// The in-cluster config: `KUBERNETES_SERVICE_HOST`/`_PORT`, the service account's CA and
    /// token under `sa_dir`.
    pub fn in_cluster(sa_dir: &Path) -> Result<Client, KubeClientError> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| KubeClientError::NotInCluster("KUBERNETES_SERVICE_HOST"))?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT")
            .map_err(|_| KubeClientError::NotInCluster("KUBERNETES_SERVICE_PORT"))?;
        let port = port
            .parse()
            .map_err(|_| KubeClientError::NotInCluster("KUBERNETES_SERVICE_PORT (a number)"))?;
        let ca = read(&sa_dir.join("ca.crt"))?;
        let tls = tls_config(&ca, None)?;
        Ok(Client {
            host,
            port,
            tls,
            auth: Auth::TokenFile(sa_dir.join("token")),
        })
    }

    /// The current context of a kubeconfig file (YAML or JSON): its cluster's server and CA,
    /// its user's client certificate and key or token.
    pub fn from_kubeconfig(path: &Path) -> Result<Client, KubeClientError> {
        let bad = |reason: String| KubeClientError::Kubeconfig {
            path: path.to_path_buf(),
            reason,
        };
        let text = read(path)?;
        let kc: Kubeconfig = serde_yaml_ng::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let ctx = kc
            .contexts
            .iter()
            .find(|c| c.name == kc.current_context)
            .ok_or_else(|| bad(format!("no context {:?}", kc.current_context)))?;
        let cluster = kc
            .clusters
            .iter()
            .find(|c| c.name == ctx.context.cluster)
            .ok_or_else(|| bad(format!("no cluster {:?}", ctx.context.cluster)))?;
        let user = kc.users.iter().find(|u| u.name == ctx.context.user);
        let server = cluster
            .cluster
            .server
            .strip_prefix("https://")
            .ok_or_else(|| bad("the server must be https://".into()))?
            .trim_end_matches('/');
        let (host, port) = match server.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || p.parse::<u16>().is_ok() => (
                h.trim_matches(['[', ']']).to_string(),
                p.parse().map_err(|_| bad(format!("port in {server:?}")))?,
            ),
            _ => (server.trim_matches(['[', ']']).to_string(), 443),
        };
        let data =
            |inline: &Option<String>, file: &Option<PathBuf>, what: &str| match (inline, file) {
                (Some(b64), _) => base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map(Some)
                    .map_err(|e| bad(format!("{what}: {e}"))),
                (None, Some(f)) => read(&base.join(f)).map(Some),
                (None, None) => Ok(None),
            };
        let c = &cluster.cluster;
        let ca = data(
            &c.certificate_authority_data,
            &c.certificate_authority,
            "certificate-authority-data",
        )?
        .ok_or_else(|| bad("the cluster has no certificate-authority(-data)".into()))?;
        let (mut identity, mut auth) = (None, Auth::None);
        if let Some(u) = user.map(|u| &u.user) {
            let cert = data(
                &u.client_certificate_data,
                &u.client_certificate,
                "client-certificate-data",
            )?;
            let key = data(&u.client_key_data, &u.client_key, "client-key-data")?;
            if let (Some(cert), Some(key)) = (cert, key) {
                identity = Some((cert, key));
            }
            if let Some(t) = &u.token {
                auth = Auth::Token(t.clone());
            } else if let Some(f) = &u.token_file {
                auth = Auth::TokenFile(base.join(f));
            }
        }
        let tls = tls_config(&ca, identity.as_ref().map(|(c, k)| (&c[..], &k[..])))?;
        Ok(Client {
            host,
            port,
            tls,
            auth,
        })
    }

    /// `host:port`, for messages.
    pub fn server(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// One request; `body` is JSON.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, KubeClientError> {
        let server = self.server();
        let io = |source| KubeClientError::Io {
            server: server.clone(),
            source,
        };
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {server}\r\nUser-Agent: rebalancer\r\nAccept: application/json\r\nConnection: close\r\n"
        );
        match &self.auth {
            Auth::None => {}
            Auth::Token(t) => head.push_str(&format!("Authorization: Bearer {}\r\n", t.trim())),
            Auth::TokenFile(f) => {
                let t = read(f)?;
                head.push_str(&format!(
                    "Authorization: Bearer {}\r\n",
                    String::from_utf8_lossy(&t).trim()
                ));
            }
        }
        if let Some(b) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        head.push_str("\r\n");
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|source| KubeClientError::Connect {
                server: server.clone(),
                source,
            })?
            .next()
            .ok_or_else(|| KubeClientError::Connect {
                server: server.clone(),
                source: std::io::ErrorKind::NotFound.into(),
            })?;
        let tcp = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|source| {
            KubeClientError::Connect {
                server: server.clone(),
                source,
            }
        })?;
        tcp.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
        tcp.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| KubeClientError::Tls(format!("server name {:?}: {e}", self.host)))?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), name)
            .map_err(|e| KubeClientError::Tls(e.to_string()))?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(head.as_bytes()).map_err(io)?;
        if let Some(b) = body {
            tls.write_all(b).map_err(io)?;
        }
        tls.flush().map_err(io)?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 << 10];
        loop {
            match tls.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                // A peer that closes without close_notify after a complete answer.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => break,
                Err(e) => return Err(io(e)),
            }
            if raw.len() > MAX_RESPONSE {
                return Err(KubeClientError::Malformed {
                    server,
                    reason: "answer too large".into(),
                });
            }
        }
        parse_response(&raw).map_err(|reason| KubeClientError::Malformed { server, reason })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KubeClientError> {
    std::fs::read(path).map_err(|source| KubeClientError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn tls_config(
    ca_pem: &[u8],
    identity: Option<(&[u8], &[u8])>,
) -> Result<Arc<rustls::ClientConfig>, KubeClientError> {
    let tls = |e: String| KubeClientError::Tls(e);
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem) {
        let c = c.map_err(|e| tls(format!("CA certificate: {e}")))?;
        roots
            .add(c)
            .map_err(|e| tls(format!("CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(tls("no CA certificate in the CA file".into()));
    }
    // ring's classic suites: the API server's ECDHE and signatures; no post-quantum needed.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| tls(format!("client certificate: {e}")))?;
            let key =
                PrivateKeyDer::from_pem_slice(key).map_err(|e| tls(format!("client key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls(format!("client certificate: {e}")))?
        }
    };
    Ok(Arc::new(config))
}

/// Status and body of an HTTP/1.1 answer read to its end (chunked or not).
fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "headers not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or("no status line")?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(Response { status, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size")?;
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .map(|s| s.split(';').next().unwrap_or("").trim())
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            .ok_or("bad chunk size")?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    users: Vec<NamedUser>,
    #[serde(default)]
    contexts: Vec<NamedContext>,
    #[serde(default)]
    current_context: String,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    cluster: T,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterEntry {
    server: String,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: UserEntry,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct UserEntry {
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    context: ContextEntry,
}

#[derive(Deserialize)]
struct ContextEntry {
    cluster: String,
    #[serde(default)]
    user: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_plain_and_chunked() {
        let r = parse_response(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((r.status, &r.body[..]), (404, &b"{}"[..]));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"{\"a\":1}"[..]));
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab")
                .is_err()
        );
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn a_kubeconfig_without_its_context_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("kc");
        std::fs::write(
            &p,
            "apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: []\ncontexts: []\nusers: []\n",
        )
        .unwrap();
        let e = Client::from_kubeconfig(&p).err().unwrap().to_string();
        assert!(e.contains("no context \"x\""), "{e}");
    }
}

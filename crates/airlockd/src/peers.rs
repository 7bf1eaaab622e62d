//! How nodes of a fleet reach each other: a request about a run or session another node owns
//! is forwarded to the URL that node advertises. With certificates (`https://`), the
//! connection is TLS (rustls) and the peer must present a certificate for the advertised
//! host (or `node.peer_name`, a name every node's certificate holds) that chains to the
//! operator's CA (`node.peer_ca`), and to nothing else: no system roots. The calling node
//! presents its own certificate (`node.cert`, `node.key`, signed by the same CA), which the
//! inter-node listener (`server.internal_listen`) requires: mutual TLS, so a peer is
//! authenticated by its certificate before its request (and the API key it carries) is read.
//! Plain HTTP (`http://`) carries the caller's API key in clear, so it is used only
//! when the operator says the network between nodes is trusted (`node.plain_http_peers`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::http::uri::Scheme;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use crate::config::Config;

/// How this node may reach its peers.
#[derive(Debug, Clone, Default)]
pub struct PeerLinks {
    /// TLS to `https://` peers, verified against `node.peer_ca` (absent: not configured).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `http://` peers are allowed (`node.plain_http_peers`).
    plain: bool,
    /// The name every peer's certificate must hold (`node.peer_name`; default: the host of
    /// the peer's advertised URL).
    name: Option<String>,
}

/// Time allowed to connect to a peer and, for TLS, to finish the handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl PeerLinks {
    pub fn from_config(config: &Config) -> Result<PeerLinks, NodeTlsError> {
        let tls = match &config.node.peer_ca {
            Some(ca) => Some(client_config(ca, NodeIdentity::of(config)?)?),
            None => None,
        };
        Ok(PeerLinks {
            tls,
            plain: config.node.plain_http_peers,
            name: config.node.peer_name.clone(),
        })
    }

    /// Sends `request` (origin-form URI; `Host` is set here) to the peer at `base`.
    pub async fn send(
        &self,
        base: &str,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<hyper::Response<Incoming>, String> {
        let base: Uri = base
            .parse()
            .map_err(|e| format!("its address {base:?} is not a URL: {e}"))?;
        let host = base.host().ok_or("its address has no host")?;
        let bare_host = host.trim_start_matches('[').trim_end_matches(']');
        let scheme = base.scheme().cloned().unwrap_or(Scheme::HTTP);
        let tls = if scheme == Scheme::HTTPS {
            Some(self.tls.clone().ok_or(
                "it is reached over TLS and this node has no CA to verify it (set node.peer_ca)",
            )?)
        } else if self.plain {
            None
        } else {
            return Err("it advertises plain HTTP and node.plain_http_peers is not set on this node: forwarding would send API keys in clear (give the nodes certificates and node.peer_ca, or set plain_http_peers = true on a trusted network)".into());
        };
        let port = base
            .port_u16()
            .unwrap_or(if tls.is_some() { 443 } else { 80 });
        let connect = async {
            let tcp = TcpStream::connect((bare_host, port))
                .await
                .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
            let _ = tcp.set_nodelay(true);
            match tls {
                Some(config) => {
                    let name = server_name(self.name.as_deref().unwrap_or(bare_host))?;
                    let stream = tokio_rustls::TlsConnector::from(config)
                        .connect(name, tcp)
                        .await
                        .map_err(|e| format!("TLS with {host}:{port} failed: {e}"))?;
                    send_on(stream, host, request).await
                }
                None => send_on(tcp, host, request).await,
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| format!("no answer from {host}:{port} within {CONNECT_TIMEOUT:?}"))?
    }
}

/// One HTTP/1.1 exchange on a fresh connection; the connection lives as long as the answer's
/// body is read (an event stream may last as long as the run).
async fn send_on<S>(
    stream: S,
    host: &str,
    mut request: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<Incoming>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("a forwarding connection ended: {e}");
        }
    });
    if let Ok(value) = hyper::header::HeaderValue::from_str(host) {
        request.headers_mut().insert(hyper::header::HOST, value);
    }
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("the request failed: {e}"))
}

fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    match host.parse::<IpAddr>() {
        Ok(ip) => Ok(ServerName::IpAddress(ip.into())),
        Err(_) => ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host:?} is not a name a certificate can hold: {e}")),
    }
}

/// What is wrong with the TLS settings between nodes; each names the key to mend and how.
#[derive(Debug, thiserror::Error)]
pub enum NodeTlsError {
    #[error("{key}: cannot read {path}: {cause}; point it at a readable PEM file")]
    Unreadable {
        key: &'static str,
        path: PathBuf,
        cause: String,
    },
    #[error("{key}: {path} holds no PEM certificate; give the certificate file (-----BEGIN CERTIFICATE-----)")]
    NoCertificate { key: &'static str, path: PathBuf },
    #[error("{key}: {path} holds a certificate rustls cannot use ({cause}); give an X.509 v3 CA certificate")]
    BadCa {
        key: &'static str,
        path: PathBuf,
        cause: String,
    },
    #[error("node.key: {path} is not the private key of node.cert ({cause}); give the key the certificate was issued for (PEM, PKCS#8, SEC1 or PKCS#1)")]
    BadKey { path: PathBuf, cause: String },
    #[error("node.cert: {path} is refused by the fleet's CA ({cause}); issue this node a certificate signed by the CA in node.peer_ca, with the clientAuth extended key usage, and renew it before it expires")]
    NotFromFleet { path: PathBuf, cause: String },
    #[error("{key}: {problem}; {fix}")]
    Missing {
        key: &'static str,
        problem: &'static str,
        fix: &'static str,
    },
}

impl NodeTlsError {
    /// The configuration key the error is about.
    pub fn key(&self) -> &'static str {
        match self {
            NodeTlsError::Unreadable { key, .. }
            | NodeTlsError::NoCertificate { key, .. }
            | NodeTlsError::BadCa { key, .. }
            | NodeTlsError::Missing { key, .. } => key,
            NodeTlsError::BadKey { .. } => "node.key",
            NodeTlsError::NotFromFleet { .. } => "node.cert",
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of the PEM file at `path` (the setting `key`).
fn certificates(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, NodeTlsError> {
    let unreadable = |cause: String| NodeTlsError::Unreadable {
        key,
        path: path.to_path_buf(),
        cause,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| unreadable(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| unreadable(e.to_string()))?;
    if certs.is_empty() {
        return Err(NodeTlsError::NoCertificate {
            key,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The fleet's CA (`node.peer_ca`) as the only roots a peer may chain to.
fn fleet_roots(ca: &Path) -> Result<Arc<rustls::RootCertStore>, NodeTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates("node.peer_ca", ca)? {
        roots.add(cert).map_err(|e| NodeTlsError::BadCa {
            key: "node.peer_ca",
            path: ca.to_path_buf(),
            cause: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

/// This node's certificate chain and key (`node.cert`, `node.key`).
pub struct NodeIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert_path: PathBuf,
}

impl NodeIdentity {
    pub fn load(cert: &Path, key: &Path) -> Result<NodeIdentity, NodeTlsError> {
        let chain = certificates("node.cert", cert)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| NodeTlsError::Unreadable {
            key: "node.key",
            path: key.to_path_buf(),
            cause: e.to_string(),
        })?;
        Ok(NodeIdentity {
            chain,
            key,
            cert_path: cert.to_path_buf(),
        })
    }

    /// The identity of the configuration, if both halves are set.
    pub fn of(config: &Config) -> Result<Option<NodeIdentity>, NodeTlsError> {
        match (&config.node.cert, &config.node.key) {
            (Some(cert), Some(key)) => NodeIdentity::load(cert, key).map(Some),
            (None, None) => Ok(None),
            _ => Err(NodeTlsError::Missing {
                key: "node.cert",
                problem: "node.cert and node.key come together",
                fix: "give both (the node's certificate and its key) or neither",
            }),
        }
    }

    /// Would the fleet's CA accept this certificate from a calling node now?
    pub fn check_against(&self, ca: &Path) -> Result<(), NodeTlsError> {
        let verifier = client_verifier(ca)?;
        let (leaf, intermediates) = self.chain.split_first().expect("a certificate");
        verifier
            .verify_client_cert(leaf, intermediates, rustls::pki_types::UnixTime::now())
            .map_err(|e| NodeTlsError::NotFromFleet {
                path: self.cert_path.clone(),
                cause: e.to_string(),
            })?;
        Ok(())
    }
}

/// A TLS client that trusts only the certificates in `ca` (PEM) and, with an `identity`,
/// presents it to the peer.
pub fn client_config(
    ca: &Path,
    identity: Option<NodeIdentity>,
) -> Result<Arc<rustls::ClientConfig>, NodeTlsError> {
    let roots = fleet_roots(ca)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports TLS 1.2 and 1.3")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(identity) => {
            let path = identity.cert_path.clone();
            builder
                .with_client_auth_cert(identity.chain, identity.key)
                .map_err(|e| NodeTlsError::BadKey {
                    path,
                    cause: e.to_string(),
                })?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What the inter-node listener asks of a calling node: a certificate chaining to `ca`
/// (`node.peer_ca`), valid now, with the `clientAuth` usage. No certificate, no connection.
pub fn client_verifier(
    ca: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, NodeTlsError> {
    let roots = fleet_roots(ca)?;
    rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| NodeTlsError::BadCa {
            key: "node.peer_ca",
            path: ca.to_path_buf(),
            cause: e.to_string(),
        })
}

/// What `--check-config` says about forwarding between nodes.
pub fn describe(config: &Config) -> String {
    let node = &config.node;
    match (&node.advertise, &node.peer_ca, node.plain_http_peers) {
        (None, None, false) => "forwarding between nodes: not configured (no node.advertise, no node.peer_ca)".into(),
        (_, Some(ca), plain) => format!(
            "forwarding between nodes: TLS, peers verified against {} only; {}{}",
            ca.display(),
            match &node.cert {
                Some(cert) => format!("this node presents {} (mutual TLS)", cert.display()),
                None => "this node presents no certificate (peers whose internal listener requires one refuse it)".into(),
            },
            if plain { "; plain HTTP to http:// peers too (node.plain_http_peers: a trusted network only)" } else { "" }
        ),
        (_, None, true) => "forwarding between nodes: plain HTTP (node.plain_http_peers = true): API keys cross the network in clear, for a trusted network only".into(),
        (Some(_), None, false) => "forwarding between nodes: refused (this node advertises an address but can reach no peer: set node.peer_ca, or node.plain_http_peers)".into(),
    }
}

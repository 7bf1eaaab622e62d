//! How nodes of a fleet reach each other: a request about a run or session another node owns
//! is forwarded to the URL that node advertises. With certificates (`https://`), the
//! connection is TLS (rustls) and the peer must present a certificate for the advertised
//! host (or `node.peer_name`, a name every node's certificate holds) that chains to the
//! operator's CA (`node.peer_ca`), and to nothing else: no system roots. Plain HTTP (`http://`) carries the caller's API key in clear, so it is used only
//! when the operator says the network between nodes is trusted (`node.plain_http_peers`).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::http::uri::Scheme;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
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
    pub fn from_config(config: &Config) -> anyhow::Result<PeerLinks> {
        let tls = match &config.node.peer_ca {
            Some(ca) => Some(client_config(ca)?),
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

/// A TLS client that trusts only the certificates in `ca` (PEM).
pub fn client_config(ca: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("cannot read the CA certificate {}", ca.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} is not a PEM certificate file", ca.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", ca.display());
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .with_context(|| format!("{} holds a certificate rustls cannot use", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What `--check-config` says about forwarding between nodes.
pub fn describe(config: &Config) -> String {
    let node = &config.node;
    match (&node.advertise, &node.peer_ca, node.plain_http_peers) {
        (None, None, false) => "forwarding between nodes: not configured (no node.advertise, no node.peer_ca)".into(),
        (_, Some(ca), plain) => format!(
            "forwarding between nodes: TLS, peers verified against {} only{}",
            ca.display(),
            if plain { "; plain HTTP to http:// peers too (node.plain_http_peers: a trusted network only)" } else { "" }
        ),
        (_, None, true) => "forwarding between nodes: plain HTTP (node.plain_http_peers = true): API keys cross the network in clear, for a trusted network only".into(),
        (Some(_), None, false) => "forwarding between nodes: refused (this node advertises an address but can reach no peer: set node.peer_ca, or node.plain_http_peers)".into(),
    }
}

//! Listening: a Unix socket by default (mode from the configuration, in the runtime
//! directory), TCP only when asked, TLS through rustls when a certificate is configured.
//!
//! Every connection is bounded: at most `max_connections` are served at once; a client must
//! send its request headers within `header_timeout`; a response the client stops reading for
//! `stall_timeout` is dropped (so a slow or stuck reader cannot pin a connection or make the
//! daemon buffer without bound: hyper's write buffer is bounded, and the event streams pull).

use std::future::Future;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::time::Sleep;

use crate::config::Config;

/// Loads a PEM certificate chain and key into a TLS server configuration (HTTP/1.1).
pub fn tls_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    server_tls(cert, key, None)
}

/// [`tls_config`] for the inter-node listener: the calling node must present a certificate
/// of the fleet's CA (`node.peer_ca`), or the handshake fails (mutual TLS).
pub fn internal_tls_config(
    cert: &Path,
    key: &Path,
    peer_ca: &Path,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    server_tls(cert, key, Some(crate::peers::client_verifier(peer_ca)?))
}

fn server_tls(
    cert: &Path,
    key: &Path,
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("cannot read the certificate {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} is not a PEM certificate chain", cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", cert.display());
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read a PEM private key from {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The limits applied to each connection.
#[derive(Clone)]
struct ConnectionLimits {
    slots: Arc<Semaphore>,
    header_timeout: Duration,
    stall_timeout: Duration,
}

/// Listens everywhere the configuration says until `stop` turns true, then lets open
/// connections finish (at most `drain` long).
pub async fn serve(
    config: &Config,
    extra_listen: &[String],
    app: Router,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
) -> anyhow::Result<()> {
    let limits = ConnectionLimits {
        slots: Arc::new(Semaphore::new(config.server.max_connections.max(1))),
        header_timeout: config.server.header_timeout.0,
        stall_timeout: config.server.stall_timeout.0,
    };
    let graceful = Arc::new(GracefulShutdown::new());
    let (tls, internal_tls) = acceptors(config)?;
    let for_clients = config.server.listen.iter().chain(extra_listen);
    let for_nodes = config.server.internal_listen.iter();
    let addrs = for_clients
        .map(|addr| (addr, "listening", &tls))
        .chain(for_nodes.map(|addr| (addr, "listening for other nodes", &internal_tls)));
    // Every TCP listener is bound before the Unix socket appears: the socket is the sign
    // that the daemon is ready (callers and tests wait for it), and a TCP address that
    // cannot be bound leaves no socket file behind.
    let mut tcp = Vec::new();
    for (addr, role, tls) in addrs {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        tracing::info!(
            "{role} on {}://{}",
            if tls.is_some() { "https" } else { "http" },
            listener.local_addr()?
        );
        tcp.push((listener, tls.clone()));
    }
    let socket = config.socket_path();
    let unix = bind_unix(&socket, config)?;
    tracing::info!("listening on unix:{}", socket.display());
    let mut tasks = vec![tokio::spawn(accept_loop(
        unix,
        None,
        app.clone(),
        limits.clone(),
        Arc::clone(&graceful),
        stop.clone(),
    ))];
    for (listener, tls) in tcp {
        tasks.push(tokio::spawn(accept_loop(
            nodelay(listener),
            tls,
            app.clone(),
            limits.clone(),
            Arc::clone(&graceful),
            stop.clone(),
        )));
    }
    let _ = stop.wait_for(|s| *s).await;
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    let Ok(graceful) = Arc::try_unwrap(graceful) else {
        anyhow::bail!("a listener still holds the connection tracker");
    };
    let _ = std::fs::remove_file(&socket);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open after {}s; closing them",
            drain.as_secs()
        );
    }
    Ok(())
}

/// The TLS of the client listeners, and of the inter-node ones (which require a calling
/// node's certificate); none without a certificate.
fn acceptors(
    config: &Config,
) -> anyhow::Result<(
    Option<tokio_rustls::TlsAcceptor>,
    Option<tokio_rustls::TlsAcceptor>,
)> {
    let (Some(cert), Some(key)) = (&config.server.tls_cert, &config.server.tls_key) else {
        return Ok((None, None));
    };
    let for_clients = tokio_rustls::TlsAcceptor::from(tls_config(cert, key)?);
    if config.server.internal_listen.is_empty() {
        return Ok((Some(for_clients), None));
    }
    let Some(peer_ca) = &config.node.peer_ca else {
        anyhow::bail!("server.internal_listen speaks TLS and must verify the calling nodes' certificates: set node.peer_ca to the fleet's CA");
    };
    let for_nodes = internal_tls_config(cert, key, peer_ca)?;
    Ok((Some(for_clients), Some(for_nodes.into())))
}

/// Binds the socket: a live daemon on it is an error; a stale socket file is replaced.
fn bind_unix(path: &Path, config: &Config) -> anyhow::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "another daemon is listening on {}; stop it or configure another server.socket",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    let mode = config.socket_mode().unwrap_or(0o660);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Some(gid) = config.server.socket_gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("cannot give {} to group {gid}", path.display()))?;
    }
    Ok(listener)
}

/// A TCP listener whose connections send small writes (event lines) at once.
fn nodelay(listener: TcpListener) -> impl axum::serve::Listener<Io = tokio::net::TcpStream> {
    use axum::serve::ListenerExt;
    listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    })
}

/// Accepts connections until `stop`, serving each (after a TLS handshake when `tls` is set)
/// while holding one of the connection slots.
async fn accept_loop<L>(
    mut listener: L,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    limits: ConnectionLimits,
    graceful: Arc<GracefulShutdown>,
    stop: watch::Receiver<bool>,
) where
    L: axum::serve::Listener,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    loop {
        let Ok(permit) = Arc::clone(&limits.slots).acquire_owned().await else {
            return;
        };
        // The listener retries transient accept errors itself.
        let (stream, _) = listener.accept().await;
        if *stop.borrow() {
            return;
        }
        let (app, limits, graceful, tls) =
            (app.clone(), limits.clone(), graceful.watcher(), tls.clone());
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, app, &limits, graceful).await,
                Some(acceptor) => {
                    // The handshake is bounded like the request headers.
                    let handshake =
                        tokio::time::timeout(limits.header_timeout, acceptor.accept(stream));
                    if let Ok(Ok(stream)) = handshake.await {
                        serve_connection(stream, app, &limits, graceful).await;
                    }
                }
            }
            drop(permit);
        });
    }
}

async fn serve_connection<IO>(
    io: IO,
    app: Router,
    limits: &ConnectionLimits,
    graceful: hyper_util::server::graceful::Watcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(StallGuard::new(io, limits.stall_timeout));
    let service = TowerToHyperService::new(app);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(256 * 1024);
    let connection = builder.serve_connection(io, service).into_owned();
    if let Err(e) = graceful.watch(connection).await {
        tracing::debug!("connection ended: {e}");
    }
}

/// Fails writes that make no progress for `timeout`: a client that stops reading a response
/// loses its connection instead of holding it (and the buffers behind it) forever.
struct StallGuard<IO> {
    inner: IO,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<IO> StallGuard<IO> {
    fn new(inner: IO, timeout: Duration) -> Self {
        StallGuard {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// Called when a write is pending: starts or checks the stall timer.
    fn check_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let timeout = self.timeout;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read the response in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for StallGuard<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for StallGuard<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.check_stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.check_stall(cx).map_ok(|_| ()),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.check_stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

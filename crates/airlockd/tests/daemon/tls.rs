//! TCP with TLS: the daemon serves HTTPS with the configured certificate, keys still apply,
//! and plain HTTP to the TLS port gets nothing.

use std::process::Command;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{Options, TestDaemon};

fn self_signed(dir: &std::path::Path) -> Option<(String, String)> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "extendedKeyUsage=serverAuth",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .is_ok_and(|o| o.status.success());
    if !made {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs openssl to make a test certificate"
        );
        eprintln!("skipped: openssl is not installed, so no test certificate can be made");
        return None;
    }
    Some((cert.display().to_string(), key.display().to_string()))
}

#[tokio::test(flavor = "multi_thread")]
async fn tcp_listeners_speak_tls_with_the_configured_certificate() {
    let certs = tempfile::tempdir().unwrap();
    let Some((cert, key)) = self_signed(certs.path()) else {
        return;
    };
    let daemon = TestDaemon::start(Options {
        tcp: true,
        extra: String::new(),
        tls: Some((cert.clone(), key)),
        ..Options::default()
    });
    let addr = daemon.tcp.clone().unwrap();
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for der in rustls::pki_types::CertificateDer::pem_file_iter(&cert).unwrap() {
        roots.add(der.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let get = |key: Option<String>| {
        let (config, addr) = (config.clone(), addr.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
                .unwrap();
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(connection);
            let mut request = hyper::Request::builder()
                .uri("/v1/capabilities")
                .header("host", "localhost");
            if let Some(key) = key {
                request = request.header("authorization", format!("Bearer {key}"));
            }
            let response = sender
                .send_request(request.body(Full::<Bytes>::default()).unwrap())
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (status, body) = get(Some(daemon.keys.beta.clone())).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"tenant\""));
    assert_eq!(get(None).await.0, 401);
    // Plain HTTP on the TLS port is not served.
    let mut plain = tokio::net::TcpStream::connect(&addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        plain.read_to_end(&mut answer),
    )
    .await;
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"));
}

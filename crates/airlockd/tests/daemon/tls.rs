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
    openssl_made(made, "test certificate")?;
    Some((cert.display().to_string(), key.display().to_string()))
}

/// `Some` when openssl made the test's `what`; outside CI its absence skips the test,
/// saying why (CI installs openssl).
fn openssl_made(made: bool, what: &str) -> Option<()> {
    if !made {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs openssl to make a {what}"
        );
        eprintln!("skipped: openssl is not installed, so no {what} can be made");
        return None;
    }
    Some(())
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

/// A test CA and a certificate it signs for 127.0.0.1 (the nodes' advertised address), made
/// with openssl in `dir`: (ca.pem, node.pem, node.key).
fn fleet_ca(dir: &std::path::Path, name: &str) -> Option<(String, String, String)> {
    let path = |file: &str| dir.join(format!("{name}-{file}"));
    let openssl = |args: &[&str]| {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    std::fs::write(
        path("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let s = |p: std::path::PathBuf| p.display().to_string();
    let made = openssl(&[
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
        &format!("/CN=airlockd test CA {name}"),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
        "-keyout",
        &s(path("ca.key")),
        "-out",
        &s(path("ca.pem")),
    ]) && openssl(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=airlockd node",
        "-keyout",
        &s(path("node.key")),
        "-out",
        &s(path("node.csr")),
    ]) && openssl(&[
        "x509",
        "-req",
        "-in",
        &s(path("node.csr")),
        "-CA",
        &s(path("ca.pem")),
        "-CAkey",
        &s(path("ca.key")),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &s(path("ext.cnf")),
        "-out",
        &s(path("node.pem")),
    ]);
    openssl_made(made, "test CA")?;
    Some((s(path("ca.pem")), s(path("node.pem")), s(path("node.key"))))
}

/// `--check-config`'s line about forwarding between nodes.
fn forwarding_line(daemon: &TestDaemon) -> String {
    let output = Command::new(crate::common::airlockd_bin())
        .arg("--config")
        .arg(&daemon.config)
        .arg("--check-config")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find(|l| l.starts_with("forwarding between nodes"))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_forward_to_each_other_over_tls_verified_against_the_fleet_ca() {
    let Some(url) = crate::common::postgres_database().await else {
        return;
    };
    let certs = tempfile::tempdir().unwrap();
    let (Some((ca, cert, key)), Some((rogue_ca, _, _))) = (
        fleet_ca(certs.path(), "fleet"),
        fleet_ca(certs.path(), "rogue"),
    ) else {
        return;
    };
    let options = |node: &str, peer_ca: &str| Options {
        store_url: Some(url.clone()),
        tcp: true,
        node: Some(node.into()),
        tls: Some((cert.clone(), key.clone())),
        peer_ca: Some(peer_ca.into()),
        ..Options::default()
    };
    let a = TestDaemon::start(options("node-a", &ca));
    let mut b = TestDaemon::start(options("node-b", &ca));
    b.keys = crate::common::Keys {
        alpha: a.keys.alpha.clone(),
        beta: a.keys.beta.clone(),
        gamma: a.keys.gamma.clone(),
    };
    b.stop();
    b.write_config(&options("node-b", &ca));
    b.spawn();
    assert!(
        forwarding_line(&b).contains(&format!("TLS, peers verified against {ca} only")),
        "{}",
        forwarding_line(&b)
    );
    let on_a = a.client(&a.keys.beta);
    let on_b = b.client(&a.keys.beta);
    let run = on_a
        .post(
            "/v1/runs",
            serde_json::json!({"command": ["/bin/sh", "-c", "echo over-tls; sleep 30"]}),
        )
        .await
        .json();
    let id = run["id"].as_str().unwrap().to_string();
    crate::api::wait_status(&on_b, &id, "running").await;
    // B forwards the event stream from A over TLS; A's TCP port speaks nothing else.
    let mut stream = on_b.open_events(&id).await;
    crate::common::read_until(&mut stream, "over-tls").await;
    drop(stream);

    // With another CA, B does not trust A's certificate: nothing is forwarded.
    b.stop();
    b.write_config(&options("node-b", &rogue_ca));
    b.spawn();
    let refused = on_b.get(&format!("/v1/runs/{id}/events")).await;
    assert_eq!(refused.status, 502, "{}", refused.text());
    assert!(
        refused.text().contains("TLS with 127.0.0.1"),
        "{}",
        refused.text()
    );
    let cancelled = on_a.delete(&format!("/v1/runs/{id}")).await;
    assert!(cancelled.status == 200 || cancelled.status == 202);

    // Plain HTTP between nodes only when declared: then --check-config says so.
    let plain = TestDaemon::start(Options {
        tcp: true,
        ..Options::default()
    });
    assert!(
        forwarding_line(&plain).contains("plain HTTP (node.plain_http_peers = true)"),
        "{}",
        forwarding_line(&plain)
    );
}

#[test]
fn plain_http_between_nodes_is_refused_unless_declared() {
    let daemon_dir = tempfile::tempdir().unwrap();
    let config = daemon_dir.path().join("airlockd.toml");
    let key = airlockd::auth::new_key();
    std::fs::write(
        &config,
        format!(
            r#"[paths]
state_dir = "{root}/state"
runtime_dir = "{root}/run"
[node]
advertise = "http://10.0.0.5:8080"
[[tenants]]
name = "t"
keys = [{{ name = "k", hash = "{hash}" }}]
"#,
            root = daemon_dir.path().display(),
            hash = airlockd::auth::hash_line(&key)
        ),
    )
    .unwrap();
    let output = Command::new(crate::common::airlockd_bin())
        .arg("--config")
        .arg(&config)
        .arg("--check-config")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("node.advertise") && stderr.contains("plain_http_peers"),
        "{stderr}"
    );
}

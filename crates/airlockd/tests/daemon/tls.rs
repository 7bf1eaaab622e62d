//! TCP with TLS: the daemon serves HTTPS with the configured certificate, keys still apply,
//! and plain HTTP to the TLS port gets nothing.

use std::process::Command;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use airlock_testworld::certs::{self, TestCa, Usage};

use crate::common::{Options, TestDaemon};

fn self_signed(dir: &std::path::Path) -> Option<(String, String)> {
    let names = ["DNS:localhost".to_string()];
    let made = certs::self_signed(dir, "localhost", "localhost", &names, Some(Usage::Server));
    openssl_made(made, "test certificate").map(|issued| issued.paths())
}

/// `Some` when openssl made the test's `what`; outside CI its absence skips the test,
/// saying why (CI installs openssl).
fn openssl_made<T>(made: Result<T, String>, what: &str) -> Option<T> {
    match made {
        Ok(made) => Some(made),
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs openssl to make a {what}: {e}"
            );
            eprintln!("skipped: openssl could not make a {what} ({e})");
            None
        }
    }
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

/// A test CA and a certificate it signs for 127.0.0.1 (the nodes' advertised address), for
/// serving and for calling other nodes: (ca.pem, node.pem, node.key).
fn fleet_ca(dir: &std::path::Path, name: &str) -> Option<(String, String, String)> {
    let ca = openssl_made(TestCa::new(dir, name), "test CA")?;
    let node = ca.issue("node", &["IP:127.0.0.1"], Usage::ServerAndClient);
    let (cert, key) = openssl_made(node, "node certificate")?.paths();
    Some((ca.cert_path(), cert, key))
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
    let (Some((ca, cert, key)), Some((rogue_ca, rogue_cert, rogue_key))) = (
        fleet_ca(certs.path(), "fleet"),
        fleet_ca(certs.path(), "rogue"),
    ) else {
        return;
    };
    let fleet = (ca.as_str(), cert.as_str(), key.as_str());
    let rogue = (rogue_ca.as_str(), rogue_cert.as_str(), rogue_key.as_str());
    let options = |node: &str, (peer_ca, cert, key): (&str, &str, &str)| Options {
        store_url: Some(url.clone()),
        tcp: true,
        node: Some(node.into()),
        tls: Some((cert.into(), key.into())),
        peer_ca: Some(peer_ca.into()),
        node_identity: Some((cert.into(), key.into())),
        ..Options::default()
    };
    let a = TestDaemon::start(options("node-a", fleet));
    let mut b = TestDaemon::start(options("node-b", fleet));
    b.keys = crate::common::Keys {
        alpha: a.keys.alpha.clone(),
        beta: a.keys.beta.clone(),
        gamma: a.keys.gamma.clone(),
    };
    b.stop();
    b.write_config(&options("node-b", fleet));
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
    b.write_config(&options("node-b", rogue));
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

/// The certificates of the mutual-TLS tests: the fleet's CA, a node certificate for the
/// listener (127.0.0.1), one for a calling peer, an expired one of the fleet, and one of a
/// rogue CA.
struct MutualTls {
    ca: String,
    listener: (String, String),
    peer: (String, String),
    expired: (String, String),
    rogue: (String, String),
    dir: tempfile::TempDir,
    fleet: TestCa,
}

fn mutual_tls() -> Option<MutualTls> {
    let dir = tempfile::tempdir().unwrap();
    let fleet = openssl_made(TestCa::new(dir.path(), "fleet"), "test CA")?;
    let rogue_ca = openssl_made(TestCa::new(dir.path(), "rogue"), "test CA")?;
    let both = Usage::ServerAndClient;
    let ip = ["IP:127.0.0.1"];
    let made = [
        fleet.issue("listener", &ip, both),
        fleet.issue("peer", &ip, both),
        fleet.issue_expired("expired", &ip, both),
        rogue_ca.issue("node", &ip, both),
    ];
    let mut made = made.into_iter();
    let mut next = || openssl_made(made.next().unwrap(), "node certificate").map(|i| i.paths());
    Some(MutualTls {
        ca: fleet.cert_path(),
        listener: next()?,
        peer: next()?,
        expired: next()?,
        rogue: next()?,
        dir,
        fleet,
    })
}

/// A node whose inter-node listener (`server.internal_listen`) serves with `listener`.
fn node_with_internal_listener(tls: &MutualTls, listener: &(String, String)) -> TestDaemon {
    TestDaemon::start(Options {
        internal: true,
        tls: Some(listener.clone()),
        peer_ca: Some(tls.ca.clone()),
        node_identity: Some(tls.peer.clone()),
        ..Options::default()
    })
}

/// How this node would reach its peers: the fleet's CA, `identity` as its certificate,
/// `peer_name` as the name every peer's certificate must hold.
fn links(
    ca: &str,
    identity: Option<&(String, String)>,
    peer_name: Option<&str>,
) -> airlockd::peers::PeerLinks {
    let mut text = format!("[node]\npeer_ca = \"{ca}\"\n");
    if let Some((cert, key)) = identity {
        text.push_str(&format!("cert = \"{cert}\"\nkey = \"{key}\"\n"));
    }
    if let Some(name) = peer_name {
        text.push_str(&format!("peer_name = \"{name}\"\n"));
    }
    let config = airlockd::config::Config::parse(&text, std::path::Path::new("t.toml")).unwrap();
    airlockd::peers::PeerLinks::from_config(&config).unwrap()
}

/// A forwarded request to `daemon`'s inter-node listener: the status, or why it failed.
async fn forward(links: &airlockd::peers::PeerLinks, daemon: &TestDaemon) -> Result<u16, String> {
    let request = hyper::Request::builder()
        .uri("/v1/capabilities")
        .header("authorization", format!("Bearer {}", daemon.keys.beta))
        .body(Full::<Bytes>::default())
        .unwrap();
    let base = format!("https://{}", daemon.internal.as_ref().unwrap());
    let response = links.send(&base, request).await?;
    let status = response.status().as_u16();
    // The answer is read to its end: a refused certificate may surface only here (TLS 1.3
    // sends the server's verdict after the client's handshake is over).
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the answer failed: {e}"))?;
    Ok(status)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_inter_node_listener_serves_only_nodes_with_a_certificate_of_the_fleet() {
    let Some(tls) = mutual_tls() else {
        return;
    };
    let node = node_with_internal_listener(&tls, &tls.listener);
    assert_eq!(
        forward(&links(&tls.ca, Some(&tls.peer), None), &node).await,
        Ok(200)
    );
    for (who, identity) in [
        ("no certificate", None),
        ("a certificate of another CA", Some(&tls.rogue)),
        ("an expired certificate of the fleet", Some(&tls.expired)),
    ] {
        let refused = forward(&links(&tls.ca, identity, None), &node).await;
        assert!(
            refused.is_err(),
            "a peer with {who} was served: {refused:?}"
        );
    }
    // The client listener (the Unix socket here) asks no certificate of API clients.
    let served = node.client(&node.keys.beta).get("/v1/capabilities").await;
    assert_eq!(served.status, 200);
    assert!(
        forwarding_line(&node).contains("(mutual TLS)"),
        "{}",
        forwarding_line(&node)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_must_hold_peer_name_when_it_is_set() {
    let Some(tls) = mutual_tls() else {
        return;
    };
    // A listener whose certificate holds the fleet name and not its address.
    let named = tls
        .fleet
        .issue("named", &["DNS:fleet.airlock.test"], Usage::ServerAndClient)
        .unwrap()
        .paths();
    let by_address = node_with_internal_listener(&tls, &tls.listener);
    let by_name = node_with_internal_listener(&tls, &named);
    let peer = Some(&tls.peer);
    let named_links = links(&tls.ca, peer, Some("fleet.airlock.test"));
    let address_links = links(&tls.ca, peer, None);
    assert_eq!(forward(&named_links, &by_name).await, Ok(200));
    assert_eq!(forward(&address_links, &by_address).await, Ok(200));
    // A certificate of the fleet for another name is refused either way.
    let refused = forward(&named_links, &by_address).await.unwrap_err();
    assert!(refused.contains("TLS with 127.0.0.1"), "{refused}");
    let refused = forward(&address_links, &by_name).await.unwrap_err();
    assert!(refused.contains("TLS with 127.0.0.1"), "{refused}");
    drop(tls.dir);
}

/// The configuration of a node with an inter-node listener and `node` settings, checked.
fn check_node(tls: &MutualTls, node: &str) -> Result<(), String> {
    let tenant = format!(
        "[[tenants]]\nname = \"t\"\nkeys = [{{ name = \"k\", hash = \"{}\" }}]\n",
        airlockd::auth::hash_line(&airlockd::auth::new_key())
    );
    let text = format!(
        "[server]\ninternal_listen = [\"127.0.0.1:1\"]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n[node]\n{node}\n{tenant}",
        tls.listener.0, tls.listener.1
    );
    let config = airlockd::config::Config::parse(&text, std::path::Path::new("t.toml")).unwrap();
    config.check().map_err(|e| e.to_string())
}

#[test]
fn check_config_names_what_is_wrong_with_the_node_certificates() {
    let Some(tls) = mutual_tls() else {
        return;
    };
    let identity = |(cert, key): &(String, String)| format!("cert = \"{cert}\"\nkey = \"{key}\"");
    let ca = format!("peer_ca = \"{}\"", tls.ca);
    assert_eq!(
        check_node(&tls, &format!("{ca}\n{}", identity(&tls.peer))),
        Ok(())
    );
    let problems = [
        // The inter-node listener could not verify callers.
        (String::new(), "node.peer_ca", "set node.peer_ca"),
        (
            format!("{ca}\ncert = \"{}\"", tls.peer.0),
            "node.cert",
            "give both",
        ),
        (
            format!("{ca}\n{}", identity(&tls.rogue)),
            "node.cert",
            "signed by the CA in node.peer_ca",
        ),
        (
            format!("{ca}\n{}", identity(&tls.expired)),
            "node.cert",
            "renew it",
        ),
        (
            format!("{ca}\ncert = \"{}\"\nkey = \"{}\"", tls.peer.0, tls.rogue.1),
            "node.key",
            "the key the certificate was issued for",
        ),
        (
            format!("peer_ca = \"{}\"\n{}", tls.peer.1, identity(&tls.peer)),
            "node.peer_ca",
            "certificate",
        ),
    ];
    for (node, key, fix) in problems {
        let error = check_node(&tls, &node).unwrap_err();
        assert!(
            error.contains(&format!("{key}: ")) && error.contains(fix),
            "[node]\n{node}\n-> {error}"
        );
    }
}

//! End-to-end: programs in an empty network namespace reach allowed names through the gate,
//! transparently and through the proxy endpoint. Needs root (see tests/world).

mod world;

use world::GateWorld as _;

use std::time::Duration;

use airlock_egress::report::{Channel, Decision, Reason};
use airlock_egress::{EgressConfig, GateMode};

fn allow(rules: &[&str]) -> EgressConfig {
    EgressConfig {
        allow: rules.iter().map(|r| r.to_string()).collect(),
        ..Default::default()
    }
}

/// The documentation ranges are non-public: the test hosts live there, so tests allow them.
const TEST_RANGES: [&str; 4] = [
    "192.0.2.0/24:80",
    "192.0.2.0/24:443",
    "[2001:db8::/32]:443",
    "[2001:db8::/32]:80",
];

fn with_test_ranges(rules: &[&str]) -> EgressConfig {
    let mut all: Vec<&str> = rules.to_vec();
    all.extend(TEST_RANGES);
    allow(&all)
}

#[test]
fn transparent_http_and_tls_reach_allowed_names() {
    let world = world_or_skip!();
    let started = world.start_gate(with_test_ranges(&["allowed.test"]));
    let (body, code) = world.curl(&["http://allowed.test/"]);
    assert_eq!((body.trim(), code), ("host=allowed.test", 0));
    let (body, code) = world.curl(&["https://allowed.test/"]);
    assert_eq!((body.trim(), code), ("sni=allowed.test", 0));
    let report = started.gate.finish();
    let allowed: Vec<_> = report
        .decisions
        .iter()
        .filter(|r| r.channel == Channel::Capture)
        .collect();
    assert_eq!(allowed.len(), 2, "{:#?}", report.decisions);
    assert!(allowed
        .iter()
        .all(|r| r.decision == Decision::Allow && r.name.as_deref() == Some("allowed.test")));
    assert!(allowed.iter().all(|r| r.bytes_in > 0 && r.bytes_out > 0));
    assert_eq!(report.counters.connections_allowed, 2);
}

#[test]
fn proxy_endpoint_speaks_connect_absolute_form_and_socks5() {
    let world = world_or_skip!();
    let started = world.start_gate(with_test_ranges(&["allowed.test"]));
    let proxy = started.proxy();
    let (body, code) = world.curl(&["-x", &proxy, "https://allowed.test/"]);
    assert_eq!((body.trim(), code), ("sni=allowed.test", 0), "CONNECT");
    let (body, code) = world.curl(&["-x", &proxy, "http://allowed.test/"]);
    assert_eq!(
        (body.trim(), code),
        ("host=allowed.test", 0),
        "absolute form"
    );
    let socks = format!("socks5h://127.0.0.1:{}", started.proxy_port);
    let (body, code) = world.curl(&["-x", &socks, "https://allowed.test/"]);
    assert_eq!((body.trim(), code), ("sni=allowed.test", 0), "SOCKS5");
    let report = started.gate.finish();
    let channels: Vec<Channel> = report
        .decisions
        .iter()
        .filter(|r| r.channel != Channel::Dns)
        .map(|r| r.channel)
        .collect();
    assert_eq!(
        channels,
        vec![Channel::HttpProxy, Channel::HttpProxy, Channel::Socks5]
    );
}

#[test]
fn proxy_variables_from_the_sockets_work_for_curl_and_python() {
    let world = world_or_skip!();
    let started = world.start_gate(with_test_ranges(&["allowed.test"]));
    let env: Vec<String> = airlock_egress::env::proxy_env(started.proxy_port)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let ca = world.ca();
    let mut args: Vec<&str> = env.iter().map(String::as_str).collect();
    args.extend([
        "curl",
        "-sS",
        "--max-time",
        "10",
        "--cacert",
        &ca,
        "https://allowed.test/",
    ]);
    let out = world.run(&args);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "sni=allowed.test"
    );
    let code = "import urllib.request,ssl;c=ssl.create_default_context(cafile='cert.pem');print(urllib.request.urlopen('https://allowed.test/',context=c,timeout=10).read().decode().strip())";
    let mut args: Vec<&str> = env.iter().map(String::as_str).collect();
    args.extend([world::PYTHON, "-c", code]);
    let out = world.run(&args);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "sni=allowed.test",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = started.gate.finish();
    assert!(
        report
            .decisions
            .iter()
            .filter(|r| r.channel == Channel::HttpProxy)
            .count()
            >= 2
    );
}

#[test]
fn websocket_upgrades_pass_transparently_and_through_connect() {
    let world = world_or_skip!();
    let started = world.start_gate(with_test_ranges(&["allowed.test"]));
    let plain = r#"
import socket
s = socket.create_connection(("allowed.test", 80), timeout=10)
s.sendall(b"GET /chat HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: x\r\nSec-WebSocket-Version: 13\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head: head += s.recv(1)
s.sendall(b"frame-1")
print(head.split(b"\r\n")[0].decode(), s.recv(100).decode())
"#;
    assert_eq!(
        world.python(plain).trim(),
        "HTTP/1.1 101 Switching Protocols frame-1"
    );
    let tunnelled = format!(
        r#"
import socket, ssl
s = socket.create_connection(("127.0.0.1", {port}), timeout=10)
s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head: head += s.recv(1)
t = ssl.create_default_context(cafile="cert.pem").wrap_socket(s, server_hostname="allowed.test")
t.sendall(b"GET /chat HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head: head += t.recv(1)
t.sendall(b"frame-2")
print(head.split(b"\r\n")[0].decode(), t.recv(100).decode())
"#,
        port = started.proxy_port
    );
    assert_eq!(
        world.python(&tunnelled).trim(),
        "HTTP/1.1 101 Switching Protocols frame-2"
    );
    started.gate.finish();
}

#[test]
fn h2c_is_refused_at_once_with_its_reason() {
    let world = world_or_skip!();
    let started = world.start_gate(with_test_ranges(&["allowed.test"]));
    let code = r#"
import socket, time
def attempt(opening):
    start = time.monotonic()
    s = socket.create_connection(("allowed.test", 80), timeout=10)
    s.sendall(opening)
    try:
        answer = s.recv(200).split(b"\r\n")[0].decode() or "closed"
    except ConnectionResetError:
        answer = "reset"
    return "%s %s" % (answer, time.monotonic() - start < 2)
print(attempt(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
print(attempt(b"GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"))
"#;
    let output = world.python(code);
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(
        lines,
        ["reset True", "HTTP/1.1 403 Forbidden True"],
        "{output}"
    );
    let report = started.gate.finish();
    let refused: Vec<_> = report
        .decisions
        .iter()
        .filter(|r| r.decision == Decision::Deny)
        .map(|r| (r.reason, r.detail.clone().unwrap_or_default()))
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[0].0, Reason::ProtocolNotAllowed);
    assert_eq!(refused[1].0, Reason::UnsafeRequest);
    assert!(
        refused.iter().all(|(_, detail)| detail.starts_with("h2c")),
        "{refused:?}"
    );
}

#[test]
fn raw_tcp_rules_and_address_ranges_relay_any_protocol() {
    let world = world_or_skip!();
    let started = world.start_gate(allow(&[
        "tcp://git.test:22",
        "198.51.100.0/24:22",
        "203.0.113.0/24:8080",
    ]));
    let banner = r#"
import socket
s = socket.create_connection(("git.test", 22), timeout=10)
print(s.recv(100).decode().strip())
s.sendall(b"SSH-2.0-client\r\n")
"#;
    assert_eq!(world.python(banner).trim(), "SSH-2.0-airlock-test");
    let direct = "import socket;s=socket.create_connection(('203.0.113.10',8080),timeout=10);s.sendall(b'x'*1000);s.close();print('sent')";
    assert_eq!(world.python(direct).trim(), "sent");
    assert!(world::eventually(Duration::from_secs(5), || world
        .seen
        .sunk
        .load(std::sync::atomic::Ordering::Relaxed)
        == 1000));
    let report = started.gate.finish();
    let named = report
        .decisions
        .iter()
        .find(|r| r.channel == Channel::Capture && r.name.as_deref() == Some("git.test"))
        .unwrap();
    assert_eq!(
        (named.decision, named.address),
        (Decision::Allow, Some("198.51.100.10".parse().unwrap()))
    );
}

#[test]
fn ipv6_destinations_and_placeholders_work() {
    let world = world_or_skip!();
    let started = world.start_gate(with_test_ranges(&["v6only.test"]));
    let (body, code) = world.curl(&["-6", "https://v6only.test/"]);
    assert_eq!((body.trim(), code), ("sni=v6only.test", 0));
    let report = started.gate.finish();
    let record = report
        .decisions
        .iter()
        .find(|r| r.channel == Channel::Capture)
        .unwrap();
    assert_eq!(record.address, Some("2001:db8::10".parse().unwrap()));
}

#[test]
fn report_mode_lets_traffic_flow_records_would_deny_and_suggests_rules() {
    let world = world_or_skip!();
    let mut config = allow(&["192.0.2.0/24:80", "192.0.2.0/24:443", "198.51.100.0/24:22"]);
    config.mode = GateMode::Report;
    let started = world.start_gate(config);
    let (body, code) = world.curl(&["https://other.test/"]);
    assert_eq!((body.trim(), code), ("sni=other.test", 0));
    let banner = "import socket;s=socket.create_connection(('git.test',22),timeout=10);print(s.recv(100).decode().strip())";
    assert_eq!(world.python(banner).trim(), "SSH-2.0-airlock-test");
    let (body, _) = world.curl(&["http://loop.test/"]);
    assert!(
        !body.contains("host="),
        "non-public stays refused in report mode: {body}"
    );
    let report = started.gate.finish();
    assert_eq!(report.mode, GateMode::Report);
    let other = report
        .decisions
        .iter()
        .find(|r| r.channel != Channel::Dns && r.name.as_deref() == Some("other.test"))
        .unwrap();
    assert_eq!(
        (other.decision, other.reason),
        (Decision::WouldDeny, Reason::NotAllowed)
    );
    let looped = report
        .decisions
        .iter()
        .find(|r| r.channel != Channel::Dns && r.name.as_deref() == Some("loop.test"))
        .unwrap();
    assert_eq!(
        (looped.decision, looped.reason),
        (Decision::Deny, Reason::NonPublicAddress)
    );
    assert_eq!(
        report.suggested_allow,
        vec!["other.test", "tcp://git.test:22"]
    );
    assert_eq!(world.seen.accepts("gate", 80), 0);
}

#[test]
fn events_stream_live_and_the_report_writes_ndjson() {
    let world = world_or_skip!();
    let started = world.start_gate(with_test_ranges(&["allowed.test"]));
    world.curl(&["http://allowed.test/"]);
    let report = started.gate.finish();
    let events: Vec<_> = started.events.try_iter().collect();
    let closed = events
        .iter()
        .filter(|e| matches!(e, airlock_egress::GateEvent::Closed(_)))
        .count();
    assert_eq!(closed, 1, "{events:#?}");
    assert_eq!(events.len(), report.decisions.len() + closed);
    let mut out = Vec::new();
    report.write_ndjson(&mut out).unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), report.decisions.len());
    let capture = lines.iter().find(|l| l["channel"] == "capture").unwrap();
    assert_eq!(capture["decision"], "allow");
    assert_eq!(capture["name"], "allowed.test");
    assert!(
        capture["bytes_in"].as_u64().unwrap() > 0 && capture["duration_ms"].as_f64().unwrap() > 0.0
    );
}

#[test]
fn a_proxied_raw_stream_may_stay_idle_longer_than_the_request_timeout() {
    let world = world_or_skip!();
    let started = world.start_gate(allow(&["198.51.100.0/24:22"]));
    let code = format!(
        r#"
import socket, time
s = socket.create_connection(("127.0.0.1", {port}), timeout=30)
s.sendall(b"\x05\x01\x00"); assert s.recv(2) == b"\x05\x00"
s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("198.51.100.10") + (22).to_bytes(2, "big"))
assert s.recv(10)[1] == 0
banner = s.recv(100)
time.sleep(11)
s.sendall(b"still-here")
print(banner.decode().strip(), s.recv(100).decode())
"#,
        port = started.proxy_port
    );
    assert_eq!(
        world.python(&code).trim(),
        "SSH-2.0-airlock-test still-here"
    );
    started.gate.finish();
}

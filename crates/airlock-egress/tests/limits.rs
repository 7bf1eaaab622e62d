//! Per-run caps and the end of the run, end to end. Needs root (see tests/world).

mod world;

use world::GateWorld as _;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use airlock_egress::policy::LimitsConfig;
use airlock_egress::report::{Channel, LimitKind, Reason};
use airlock_egress::EgressConfig;

fn config(rules: &[&str], limits: LimitsConfig) -> EgressConfig {
    EgressConfig {
        allow: rules.iter().map(|r| r.to_string()).collect(),
        limits,
        ..Default::default()
    }
}

const SINK: &str = "203.0.113.0/24:8080";
const SOURCE: &str = "203.0.113.0/24:8081";
const HOLD: &str = "203.0.113.0/24:9000";

#[test]
fn an_upload_past_bytes_out_is_cut_at_the_cap_and_later_connections_refused() {
    let world = world_or_skip!();
    let limits = LimitsConfig {
        bytes_out: Some(airlock_egress::policy::ByteSize::Text("1MiB".into())),
        ..Default::default()
    };
    let started = world.start_gate(config(&[SINK], limits));
    let upload = r#"
import socket
s = socket.create_connection(("203.0.113.10", 8080), timeout=10)
sent = 0
try:
    for _ in range(1024):
        s.sendall(b"u" * 65536); sent += 65536
    s.recv(1)
    print("not cut", sent)
except OSError as e:
    print("cut", type(e).__name__)
"#;
    assert!(
        world.python(upload).starts_with("cut"),
        "the upload must be cut"
    );
    assert!(world::eventually(Duration::from_secs(5), || world
        .seen
        .sunk
        .load(Ordering::Relaxed)
        == 1 << 20));
    let again = "import socket\ntry:\n s=socket.create_connection(('203.0.113.10',8080),timeout=5); s.sendall(b'x'); print(s.recv(1))\nexcept OSError as e: print(type(e).__name__)";
    assert_eq!(world.python(again).trim(), "ConnectionResetError");
    let report = started.gate.finish();
    assert_eq!(
        world.seen.sunk.load(Ordering::Relaxed),
        1 << 20,
        "not one byte past the cap"
    );
    assert!(report.hit(LimitKind::BytesOut));
    let cut = report
        .decisions
        .iter()
        .find(|r| r.ended_by == Some(Reason::LimitBytesOut))
        .expect("the cut stream");
    assert_eq!(cut.bytes_out, 1 << 20);
    assert!(report
        .decisions
        .iter()
        .any(|r| r.reason == Reason::LimitBytesOut && r.channel == Channel::Capture));
}

#[test]
fn a_download_past_bytes_in_is_cut_at_the_cap() {
    let world = world_or_skip!();
    let limits = LimitsConfig {
        bytes_in: Some(airlock_egress::policy::ByteSize::Bytes(3 << 20)),
        ..Default::default()
    };
    let started = world.start_gate(config(&[SOURCE], limits));
    let download = r#"
import socket
s = socket.create_connection(("203.0.113.10", 8081), timeout=10)
got = 0
try:
    while True:
        b = s.recv(1 << 20)
        if not b: break
        got += len(b)
except OSError: pass
print(got)
"#;
    assert_eq!(world.python(download).trim(), (3 << 20).to_string());
    let report = started.gate.finish();
    assert!(report.hit(LimitKind::BytesIn));
    assert_eq!(report.counters.bytes_in, 3 << 20);
}

#[test]
fn connection_caps_refuse_the_next_connection() {
    let world = world_or_skip!();
    let limits = LimitsConfig {
        connections: Some(3),
        concurrent: Some(1),
        ..Default::default()
    };
    let started = world.start_gate(config(&[HOLD], limits));
    let code = r#"
import socket
def attempt():
    try:
        s = socket.create_connection(("203.0.113.10", 9000), timeout=5)
        return s, s.recv(5).decode().strip()
    except OSError as e:
        return None, type(e).__name__
first, a = attempt()
_, b = attempt()          # over the concurrent cap while the first is open
first.close()
import time; time.sleep(0.3)
second, c = attempt(); second.close(); time.sleep(0.3)
third, d = attempt(); third.close(); time.sleep(0.3)
_, e = attempt()          # the fourth admitted would pass the total cap of 3
print(a, b, c, d, e)
"#;
    assert_eq!(
        world.python(code).trim(),
        "held ConnectionResetError held held ConnectionResetError"
    );
    let report = started.gate.finish();
    assert!(report.hit(LimitKind::Concurrent) && report.hit(LimitKind::Connections));
    let reasons: Vec<Reason> = report.decisions.iter().map(|r| r.reason).collect();
    assert!(
        reasons.contains(&Reason::LimitConcurrent) && reasons.contains(&Reason::LimitConnections),
        "{reasons:?}"
    );
}

#[test]
fn dns_queries_past_the_cap_are_refused() {
    let world = world_or_skip!();
    let limits = LimitsConfig {
        dns_queries: Some(4),
        ..Default::default()
    };
    let started = world.start_gate(config(&["allowed.test", "192.0.2.0/24:443"], limits));
    let code = r#"
import socket
out = []
for i in range(4):
    try:
        socket.getaddrinfo("allowed.test", 443, socket.AF_INET); out.append("ok")
    except socket.gaierror as e:
        out.append("refused")
print(" ".join(out))
"#;
    // Each getaddrinfo asks once (AF_INET): four queries pass, the fifth would be refused.
    let first = world.python(code);
    assert_eq!(first.trim(), "ok ok ok ok");
    assert_eq!(world.python(code).trim(), "refused refused refused refused");
    let report = started.gate.finish();
    assert!(report.hit(LimitKind::DnsQueries));
    assert_eq!(report.counters.dns_answered, 4);
}

#[test]
fn finish_closes_every_open_connection_at_once() {
    let world = world_or_skip!();
    let started = world.start_gate(config(&[HOLD], LimitsConfig::default()));
    let mut holder = std::process::Command::new("ip")
        .args(["netns", "exec", &world.sandbox_ns, world::PYTHON, "-c"])
        .arg(HOLDER)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(holder.stdout.take().unwrap());
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "held");
    let started_at = Instant::now();
    let report = started.gate.finish();
    assert!(
        started_at.elapsed() < Duration::from_secs(2),
        "finish took {:?}",
        started_at.elapsed()
    );
    line.clear();
    reader.read_line(&mut line).unwrap();
    assert!(
        ["b''", "ConnectionResetError"].contains(&line.trim()),
        "the sandbox side sees the stream end: {line}"
    );
    assert!(world::eventually(Duration::from_secs(5), || world
        .seen
        .held_closed
        .load(Ordering::Relaxed)
        == 1));
    let _ = holder.wait();
    let record = report
        .decisions
        .iter()
        .find(|r| r.channel == Channel::Capture)
        .unwrap();
    assert_eq!(record.ended_by, Some(Reason::GateShutdown));
    let refused = "import socket\ntry:\n socket.create_connection(('203.0.113.10',9000),timeout=5); print('connected')\nexcept OSError as e: print(type(e).__name__)";
    assert_eq!(
        world.python(refused).trim(),
        "ConnectionRefusedError",
        "no listener is left in the sandbox"
    );
}

/// Opens a held connection, says so, then reports how the stream ended.
const HOLDER: &str = r#"
import socket
s = socket.create_connection(("203.0.113.10", 9000), timeout=60)
print(s.recv(5).decode().strip(), flush=True)
try:
    print(repr(s.recv(5)), flush=True)
except OSError as e:
    print(type(e).__name__, flush=True)
"#;

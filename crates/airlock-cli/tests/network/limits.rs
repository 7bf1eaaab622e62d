//! Per-run caps of the gate (`[network.limits]` in a profile): an upload past `bytes_out`, more
//! connections than `connections`, and connections a program leaves open when its run ends.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use airlock_testworld::{eventually, World};

use crate::{allow_with_ranges, flags, python, stdout_ok};

/// A profile file in the world's directory extending `untrusted` with these network limits.
fn profile_with_limits(world: &World, limits: &str) -> Vec<String> {
    let path = world.dir.path().join("limits.toml");
    std::fs::write(
        &path,
        format!("extends = \"untrusted\"\n[network.limits]\n{limits}\n"),
    )
    .unwrap();
    flags(&["--profile", &path.display().to_string()])
}

#[test]
fn an_upload_past_bytes_out_is_cut_and_recorded() {
    let Some(world) = crate::world() else { return };
    let mut rules = profile_with_limits(&world, "bytes_out = \"256KiB\"");
    rules.extend(allow_with_ranges(&["192.0.2.10:8080"]));
    let code = r#"
import socket
s = socket.create_connection(("192.0.2.10", 8080), timeout=10)
sent = 0
try:
    for _ in range(512):
        s.sendall(b"x" * 65536); sent += 65536
    print("sent all")
except OSError as e:
    print("cut after", sent)
# A new connection is refused by the gate: it closes without a byte passing on.
try:
    c = socket.create_connection(("192.0.2.10", 8080), timeout=10)
    c.sendall(b"more")
    print("new connection answered" if c.recv(1) else "new connection closed")
except OSError as e:
    print("new connection closed")
"#;
    let result = python(&world, &rules, code);
    let out = stdout_ok(&result);
    assert!(out.contains("cut after"), "{out}");
    assert!(out.contains("new connection closed"), "{out}");
    assert!(
        crate::refusal_reasons(&result).contains(&"limit:bytes_out".to_string()),
        "{:#}",
        result["network"]
    );
    let network = &result["network"];
    assert!(
        network["limits_hit"]
            .as_array()
            .unwrap()
            .contains(&"limit:bytes_out".into()),
        "{network:#}"
    );
    assert!(network["counters"]["bytes_out"].as_u64() <= Some(256 << 10));
    let sunk = world.seen.sunk.load(Ordering::Relaxed);
    assert!(sunk <= 256 << 10, "{sunk} bytes reached the sink");
}

#[test]
fn connections_past_the_cap_are_refused_and_recorded() {
    let Some(world) = crate::world() else { return };
    let mut rules = profile_with_limits(&world, "connections = 3");
    rules.extend(allow_with_ranges(&["allowed.test"]));
    let code = r#"
import urllib.request, urllib.error
for _ in range(5):
    try:
        print(urllib.request.urlopen("http://allowed.test/", timeout=10).read().decode().strip())
    except urllib.error.HTTPError as e:
        print(e.code, e.headers.get("X-Airlock-Egress"))
    except OSError as e:
        print("refused")
"#;
    let result = python(&world, &rules, code);
    let out = stdout_ok(&result);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..3], ["host=allowed.test"; 3], "{out}");
    for line in &lines[3..] {
        assert!(
            line.contains("limit:connections") || *line == "refused",
            "{out}"
        );
    }
    let network = &result["network"];
    assert!(
        network["limits_hit"]
            .as_array()
            .unwrap()
            .contains(&"limit:connections".into()),
        "{network:#}"
    );
    assert_eq!(world.seen.hosts.lock().unwrap().len(), 3);
}

/// A program that leaves a daemon holding a connection: when the run ends, the tree is killed
/// and the gate closes every connection it still holds, so nothing stays open to the host.
#[test]
fn connections_held_open_end_with_the_run() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import os, socket, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        s = socket.create_connection(("192.0.2.10", 9000), timeout=10)
        s.recv(5)
        time.sleep(600)
    os._exit(0)
time.sleep(1)
print("left one behind")
"#;
    let rules = allow_with_ranges(&["192.0.2.10:9000"]);
    let result = python(&world, &rules, code);
    assert_eq!(stdout_ok(&result).trim(), "left one behind");
    assert!(
        eventually(Duration::from_secs(5), || world
            .seen
            .held_open
            .load(Ordering::Relaxed)
            == 0),
        "a connection outlived the run"
    );
    assert!(world.seen.held_closed.load(Ordering::Relaxed) >= 1);
    assert!(
        eventually(Duration::from_secs(5), || world.gate_established() == 0),
        "the gate namespace still has established connections"
    );
    let record = &result["network"]["decisions"][0];
    assert_eq!(record["decision"], "allow", "{record:#}");
}

/// A lookup the gate cannot finish (the resolver never answers) does not hold the end of the
/// run: the gate cancels it when the run ends, within its grace of 100 ms, and records the
/// refusal. Judged against the same program without the stuck connection: without the
/// cancellation the end waited for the resolver's timeouts (about 4 s).
#[test]
fn the_end_of_a_run_does_not_wait_for_a_stuck_lookup() {
    let Some(world) = crate::world() else { return };
    let code = r#"
import socket, sys, threading, time
def stuck():
    try:
        s = socket.create_connection(("silent.test", 80), timeout=30)
        s.sendall(b"GET / HTTP/1.1\r\nHost: silent.test\r\n\r\n"); s.recv(100)
    except OSError:
        pass
if sys.argv[1] == "stuck":
    threading.Thread(target=stuck, daemon=True).start()
time.sleep(1)
print("done")
"#;
    let rules = allow_with_ranges(&["silent.test"]);
    let timed = |mode: &str| {
        let started = Instant::now();
        let result = crate::run(
            &world,
            &rules,
            &[airlock_testworld::PYTHON, "-c", code, mode],
        );
        (started.elapsed(), result)
    };
    let (plain, result) = timed("plain");
    assert_eq!(stdout_ok(&result).trim(), "done");
    let (stuck, result) = timed("stuck");
    assert_eq!(stdout_ok(&result).trim(), "done");
    assert!(
        world.seen.asked(airlock_testworld::SILENT),
        "the gate never asked the resolver"
    );
    assert!(
        stuck < plain + Duration::from_millis(1500),
        "the run's end waited on the gate: {stuck:?} against {plain:?}"
    );
    let refused = crate::decisions(&result, "deny");
    assert!(
        refused
            .iter()
            .any(|d| d["name"] == "silent.test" && d["reason"] == "resolve_failed"),
        "{:#}",
        result["network"]
    );
}

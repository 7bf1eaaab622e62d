//! `resolver = "system"` with a system lookup that never answers: the gate runs getaddrinfo on
//! a thread of its own, and the end of the run neither waits for it nor leaves it behind.
//!
//! The gate runs in a child process of this test binary, in the world's gate network namespace
//! and a mount namespace of its own (`unshare --mount`, private propagation) where
//! /etc/resolv.conf names the world's DNS server on 192.0.2.53, which never answers
//! `silent.test`, and /etc/nsswitch.conf asks files then DNS. The host's files are never
//! touched and the queries stay in the world. Needs root (see tests/world).

mod world;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use airlock_egress::report::{Decision, Reason};
use airlock_egress::{EgressConfig, LOOKUP_THREAD};
use airlock_testworld::SILENT;

/// How long glibc waits for the silent server (one attempt): longer than any end of a run
/// may take, short enough for the test to see the lookup's thread end.
const SYSTEM_TIMEOUT_SECS: u64 = 4;
const CHILD: &str = "the_gate_in_its_namespaces";

#[test]
fn a_system_lookup_that_never_answers_neither_holds_the_run_nor_stays_behind() {
    let world = world_or_skip!();
    let etc = world.dir.path();
    std::fs::write(
        etc.join("resolv.conf"),
        format!(
            "nameserver {}\noptions timeout:{SYSTEM_TIMEOUT_SECS} attempts:1\n",
            world::RESOLVER
        ),
    )
    .unwrap();
    std::fs::write(etc.join("nsswitch.conf"), "hosts: files dns\n").unwrap();
    let script = format!(
        "mount --bind {0}/resolv.conf /etc/resolv.conf && \
         mount --bind {0}/nsswitch.conf /etc/nsswitch.conf && exec \"$0\" \"$@\"",
        etc.display()
    );
    let out = world
        .in_gate("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", CHILD, "--ignored", "--nocapture"])
        .env("AIRLOCK_TEST_SANDBOX_NS", &world.sandbox_ns)
        .env("AIRLOCK_TEST_GATE_NS", &world.gate_ns)
        .output()
        .expect("the child runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the child ran no test: {text}");
    assert!(
        world.seen.asked(SILENT),
        "the system resolver never asked the world's DNS server: {text}"
    );
}

/// The child's part, run by the test above in the namespaces it made (ignored otherwise).
#[test]
#[ignore = "run by a_system_lookup_that_never_answers_... in its namespaces"]
fn the_gate_in_its_namespaces() {
    let (Ok(sandbox_ns), Ok(gate_ns)) = (
        std::env::var("AIRLOCK_TEST_SANDBOX_NS"),
        std::env::var("AIRLOCK_TEST_GATE_NS"),
    ) else {
        panic!("run by a_system_lookup_that_never_answers_neither_holds_the_run_nor_stays_behind");
    };
    let fds_before = open_fds();
    let config = EgressConfig {
        allow: vec![format!("{SILENT}:443")],
        resolver: Some("system".into()),
        ..Default::default()
    };
    let started = world::start_gate_in(&sandbox_ns, &gate_ns, config);
    let port = started.proxy_port;
    let mut client = world::in_netns(&sandbox_ns, move || {
        let mut client = TcpStream::connect(("127.0.0.1", port)).expect("proxy");
        write!(
            client,
            "CONNECT {SILENT}:443 HTTP/1.1\r\nHost: {SILENT}:443\r\n\r\n"
        )
        .unwrap();
        client
    });
    assert!(
        world::eventually(Duration::from_secs(5), || lookup_threads() == 1),
        "no system lookup started"
    );
    // The query is out and unanswered; the run ends now.
    std::thread::sleep(Duration::from_millis(300));
    let ending = Instant::now();
    let report = started.gate.finish();
    let took = ending.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the end of the run waited on the system lookup: {took:?}"
    );
    let refused = report
        .decisions
        .iter()
        .find(|d| d.name.as_deref() == Some(SILENT))
        .unwrap_or_else(|| panic!("no record of {SILENT}: {:#?}", report.decisions));
    assert_eq!(
        (refused.decision, refused.reason),
        (Decision::Deny, Reason::ResolveFailed),
        "{refused:#?}"
    );
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut answer = Vec::new();
    let read = client.read_to_end(&mut answer);
    assert!(
        read.is_ok()
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the program's connection did not end with the run: {read:?}"
    );
    drop(client);
    // The lookup's thread outlives the run only until glibc gives up, holding nothing of it.
    let bound = Duration::from_secs(SYSTEM_TIMEOUT_SECS + 5);
    assert!(
        world::eventually(bound, || lookup_threads() == 0),
        "the lookup's thread is still there {bound:?} after the run"
    );
    assert!(
        world::eventually(Duration::from_secs(2), || open_fds() == fds_before),
        "descriptors left behind: {} before, {} after",
        fds_before,
        open_fds()
    );
}

/// Threads of this process running a system lookup.
fn lookup_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == LOOKUP_THREAD)
        .count()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

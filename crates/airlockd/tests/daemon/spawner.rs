//! The daemon's init spawner: cold runs' inits are forked by it, a spawner that dies is
//! replaced while runs go on (executed meanwhile), and nothing of it outlives the daemon.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{processes_with, settle, Options, TestDaemon};

/// What an init forked by the spawner keeps as its command line (it is never executed).
const SPAWNER_CMDLINE: &str = "__init spawner";

/// Live (not zombie) children of `parent` whose command line contains `SPAWNER_CMDLINE`: the
/// spawner and the inits it forked (`CLONE_PARENT`: the daemon's own children).
fn spawner_processes(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(SPAWNER_CMDLINE) && parent_and_state(pid) == Some((parent, true)) {
            found.push(pid);
        }
    }
    found.sort();
    found
}

/// The parent of `pid` and whether it is alive (not a zombie).
fn parent_and_state(pid: u32) -> Option<(u32, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name's closing parenthesis: state, then the parent's pid.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((parent, state != "Z"))
}

fn is_alive(pid: u32) -> bool {
    parent_and_state(pid).is_some_and(|(_, alive)| alive)
}

/// Waits for the daemon's one spawner (it starts in the background) and returns its pid.
fn wait_for_spawner(daemon: &TestDaemon, not: Option<u32>) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Vec<u32> = spawner_processes(daemon.pid())
            .into_iter()
            .filter(|pid| Some(*pid) != not)
            .collect();
        if let [pid] = found[..] {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no spawner of the daemon: {found:?}\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cold_inits_are_forked_by_the_spawner_which_is_replaced_when_it_dies() {
    let mut daemon = TestDaemon::start(Options::default());
    let marker = format!("airlockd-spawner-{}", daemon.cgroup_parent());
    let client = daemon.client(&daemon.keys.beta);
    let first = wait_for_spawner(&daemon, None);

    // A run in flight: its init is the daemon's child and, never executed, keeps the
    // spawner's command line.
    let long = json!({"command": ["/bin/sh", "-c", format!("sleep 60; : {marker}")]});
    let run = client.post("/v1/runs", long).await.json();
    let id = run["id"].as_str().unwrap().to_string();
    crate::api::wait_status(&client, &id, "running").await;
    let forked = settle(Duration::from_secs(10), || {
        let found = spawner_processes(daemon.pid());
        if found.len() >= 2 {
            Vec::new()
        } else {
            found
        }
    });
    assert!(
        forked.is_empty(),
        "the run's init was not forked by the spawner: {forked:?}"
    );
    let cancelled = client.delete(&format!("/v1/runs/{id}")).await;
    assert!(
        matches!(cancelled.status, 200 | 202),
        "{}",
        cancelled.text()
    );
    let ended = client.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");

    // The spawner dies: every run goes on (executed until a new spawner is up), the dead one
    // is reaped and a new one takes its place.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    // Dead before the next run asks it: this test covers a spawner found gone; one that dies
    // with a request unanswered is the library's
    // `cold_runs_go_on_when_their_init_spawner_dies_mid_request`.
    let killed = Instant::now();
    while is_alive(first) && killed.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut runs = 0;
    let second = loop {
        let run = client
            .run(json!({"command": ["/bin/echo", format!("after {runs}")]}))
            .await
            .json();
        assert_eq!(run["status"], "exited", "{run}");
        assert_eq!(run["result"]["stdout"], format!("after {runs}\n"), "{run}");
        runs += 1;
        let found: Vec<u32> = spawner_processes(daemon.pid())
            .into_iter()
            .filter(|pid| *pid != first)
            .collect();
        if let ([pid], true) = (&found[..], runs >= 3) {
            break *pid;
        }
        assert!(
            Instant::now() < deadline,
            "no new spawner after {runs} runs"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        settle(Duration::from_secs(10), || [first]
            .into_iter()
            .filter(|p| std::fs::metadata(format!("/proc/{p}")).is_ok())
            .collect())
        .is_empty(),
        "the dead spawner {first} was not reaped"
    );
    let run = client.run(json!({"command": ["/bin/true"]})).await.json();
    assert_eq!(run["status"], "exited", "{run}");
    assert!(
        daemon.log().contains("the init spawner is gone"),
        "{}",
        daemon.log()
    );

    // Nothing of the runs is left; the spawner ends with the daemon, killed or stopped.
    let left = settle(Duration::from_secs(15), || {
        let mut left = processes_with(&marker);
        left.extend(
            daemon
                .leftover_run_dirs()
                .iter()
                .map(|p| p.display().to_string()),
        );
        left.extend(
            daemon
                .leftover_cgroups()
                .iter()
                .map(|p| p.display().to_string()),
        );
        left
    });
    assert!(left.is_empty(), "left behind: {left:?}");
    daemon.kill();
    let alive = settle(Duration::from_secs(10), || {
        [second].into_iter().filter(|p| is_alive(*p)).collect()
    });
    assert!(alive.is_empty(), "the spawner outlived the killed daemon");
    daemon.spawn();
    let third = wait_for_spawner(&daemon, None);
    daemon.stop();
    let alive = settle(Duration::from_secs(10), || {
        [third].into_iter().filter(|p| is_alive(*p)).collect()
    });
    assert!(alive.is_empty(), "the spawner outlived the stopped daemon");
}

//! `[warm]`: runs through prepared sandboxes and interpreter zygotes, with the cold run's
//! isolation record, attacks contained, nothing crossing between runs, cancellation and
//! timeouts as cold, and nothing left after the daemon is killed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{settle, Client, Options, TestDaemon};

/// `airlock-zygote`, next to `airlockd`, rebuilt first: it is another package, so
/// `cargo test -p airlockd` alone would test a stale binary (a no-op when it is up to date).
fn zygote_bin() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "airlock-zygote"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cannot build airlock-zygote");
    });
    crate::common::airlockd_bin().with_file_name("airlock-zygote")
}

/// A profile file for tenant gamma: untrusted with a 2 s wall limit (timeouts through the
/// warm paths), in a directory of the test's own.
struct QuickProfile {
    dir: tempfile::TempDir,
}

impl QuickProfile {
    fn new() -> QuickProfile {
        let dir = tempfile::Builder::new()
            .prefix("airlockd-warm-")
            .tempdir()
            .unwrap();
        std::fs::write(
            dir.path().join("quick.toml"),
            "extends = \"untrusted\"\n[limits]\nmemory = \"128MiB\"\nwall_time = \"2s\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        QuickProfile { dir }
    }

    fn path(&self) -> String {
        self.dir.path().join("quick.toml").display().to_string()
    }
}

/// A daemon with two prepared sandboxes and a Python zygote (json, re) for `untrusted`
/// (tenant beta) and for gamma's quick profile.
fn warm_daemon(quick: &QuickProfile) -> TestDaemon {
    zygote_bin();
    let path = quick.path();
    TestDaemon::start(Options {
        extra: format!(
            "[warm]\nbudget = 12\n\n[warm.profiles.untrusted]\nready = 2\nzygotes = {{ python = {{ preload = [\"json\", \"re\"] }} }}\n\n[warm.profiles.\"{path}\"]\nready = 1\nzygotes = {{ python = {{ preload = [\"json\"] }} }}\n"
        ),
        gamma: format!("profiles = [\"{path}\"]"),
        ..Options::default()
    })
}

/// Waits until `/metrics` shows at least `prepared` ready sandboxes and `zygotes` zygotes
/// for `profile`.
async fn wait_warm(daemon: &TestDaemon, profile: &str, prepared: u64, zygotes: u64) {
    let admin = daemon.client(&daemon.keys.alpha);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let text = admin.get("/metrics").await.text();
        let count = |kind: &str| {
            let needle = format!("airlockd_warm_ready{{kind=\"{kind}\",profile=\"{profile}\"}} ");
            text.lines()
                .filter_map(|l| l.strip_prefix(&needle))
                .filter_map(|n| n.trim().parse::<u64>().ok())
                .sum::<u64>()
        };
        if count("prepared") >= prepared && count("zygote") >= zygotes {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "warm start not ready for {profile}:\n{text}\n{}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `body` until it takes the `start` path (a prepared sandbox is replaced after each
/// run, in the background), at most 20 tries; the last run.
async fn run_on(client: &Client, body: Value, start: &str) -> Value {
    let mut run = Value::Null;
    for _ in 0..20 {
        run = client.run(body.clone()).await.json();
        if run["start"] == start {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("never started {start}: {run}");
}

fn layers(run: &Value) -> Vec<String> {
    let mut layers: Vec<String> = run["result"]["isolation"]
        .as_array()
        .unwrap_or_else(|| panic!("no isolation: {run}"))
        .iter()
        .map(|l| l.as_str().unwrap_or_default().to_string())
        .collect();
    layers.sort();
    layers
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_and_zygote_runs_have_the_cold_runs_isolation_and_say_their_path() {
    let quick = QuickProfile::new();
    let cold_daemon = TestDaemon::start(Options::default());
    let cold_client = cold_daemon.client(&cold_daemon.keys.beta);
    let command = json!({"command": ["/bin/sh", "-c", "echo hi"]});
    let code = json!({"code": "import json, sys; print(json.dumps(sys.argv[1:]))", "language": "python", "args": ["a", "b"]});
    let cold = cold_client.run(command.clone()).await.json();
    let cold_code = cold_client.run(code.clone()).await.json();
    assert_eq!(cold["start"], "cold", "{cold}");
    assert_eq!(cold_code["start"], "cold", "{cold_code}");
    drop(cold_daemon);

    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 2, 1).await;
    let client = daemon.client(&daemon.keys.beta);
    let warm = run_on(&client, command, "warm").await;
    assert_eq!(warm["status"], "exited", "{warm}");
    assert_eq!(warm["result"]["stdout"], "hi\n");
    assert_eq!(layers(&warm), layers(&cold), "warm: {warm}\ncold: {cold}");
    let zygote = run_on(&client, code, "zygote").await;
    assert_eq!(zygote["result"]["stdout"], "[\"a\", \"b\"]\n", "{zygote}");
    assert_eq!(
        layers(&zygote),
        layers(&cold_code),
        "zygote: {zygote}\ncold: {cold_code}"
    );
    // The stored record says the same, and its events carry the run's layers and output.
    let id = zygote["id"].as_str().unwrap();
    let stored = client.get(&format!("/v1/runs/{id}")).await.json();
    assert_eq!(stored["start"], "zygote");
    // A run sent files runs cold (its workdir is a host directory); so does a request that
    // changes the policy (another policy than the pool's).
    let files = client
        .run(json!({"command": ["/bin/cat", "in.txt"], "files": [{"path": "in.txt", "content": "x"}]}))
        .await
        .json();
    assert_eq!(
        (files["start"].clone(), files["result"]["stdout"].clone()),
        (json!("cold"), json!("x")),
        "{files}"
    );
    let changed = client
        .run(json!({"command": ["/bin/true"], "policy": {"limits": {"processes": 17}}}))
        .await
        .json();
    assert_eq!(changed["start"], "cold", "{changed}");
    let metrics = daemon
        .client(&daemon.keys.alpha)
        .get("/metrics")
        .await
        .text();
    for needle in [
        "airlockd_runs_by_start_total{start=\"warm\",tenant=\"beta\"}",
        "airlockd_runs_by_start_total{start=\"zygote\",tenant=\"beta\"}",
        "airlockd_runs_by_start_total{start=\"cold\",tenant=\"beta\"}",
    ] {
        assert!(
            metrics.contains(needle),
            "metrics lack {needle}:\n{metrics}"
        );
    }
}

/// Attacks through the warm paths: the network, the host's secrets (files and the daemon's
/// environment), writes outside the workdir. Each is checked from inside and on the host.
/// A Python program trying the network, reading `/etc/shadow`, `/root/.ssh` and `reads`,
/// the daemon's environment, writing to `/etc`, `/usr` and `/`, then `tail`; it prints
/// `FOUND` and what succeeded.
fn attack_script(reads: &[String], tail: &str) -> String {
    let mut paths = vec!["/etc/shadow".to_string(), "/root/.ssh".to_string()];
    paths.extend(reads.iter().cloned());
    format!(
        r#"
import os, socket
found = []
try:
    socket.create_connection(("192.0.2.1", 80), timeout=2); found.append("net:tcp")
except OSError: pass
try:
    socket.getaddrinfo("example.com", 80); found.append("net:dns")
except OSError: pass
for path in {paths:?}:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path).read(); found.append("read:" + path)
    except OSError: pass
if any("AIRLOCKD" in k for k in os.environ): found.append("env")
for path in ["/etc/planted", "/usr/planted", "/planted"]:
    try:
        open(path, "w").write("x"); found.append("write:" + path)
    except OSError: pass
{tail}
print("FOUND", found)
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn attacks_through_the_warm_paths_are_contained() {
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 1, 1).await;
    let client = daemon.client(&daemon.keys.beta);
    let outside = daemon.dir.path().join("planted-by-a-run");
    let attack = attack_script(&[daemon.state().display().to_string()], "");
    let warm = run_on(
        &client,
        json!({"command": ["/usr/bin/python3", "-c", attack]}),
        "warm",
    )
    .await;
    let zygote = run_on(
        &client,
        json!({"code": attack, "language": "python"}),
        "zygote",
    )
    .await;
    for run in [&warm, &zygote] {
        assert_eq!(run["result"]["stdout"], "FOUND []\n", "{run}");
    }
    // A path of the host's outside the workdir: whatever the program believes, nothing lands
    // on the host (the workdir's parent directories in the sandbox are its own root's).
    let plant = format!("open('{}', 'w').write('x')", outside.display());
    let command = json!({"command": ["/usr/bin/python3", "-c", plant.clone()]});
    run_on(&client, command, "warm").await;
    run_on(
        &client,
        json!({"code": plant, "language": "python"}),
        "zygote",
    )
    .await;
    assert!(!outside.exists(), "a run wrote {}", outside.display());
    assert!(!Path::new("/etc/planted").exists() && !Path::new("/usr/planted").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_crosses_between_two_warm_runs() {
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 2, 1).await;
    let client = daemon.client(&daemon.keys.beta);
    let leave = "echo left > left.txt; echo left > /tmp/left.txt; export LEFT=1; echo done";
    let look = "cat left.txt /tmp/left.txt 2>/dev/null; echo LEFT=$LEFT";
    let first = run_on(
        &client,
        json!({"command": ["/bin/sh", "-c", leave], "env": {"ONLY_FIRST": "1"}}),
        "warm",
    )
    .await;
    assert_eq!(first["result"]["stdout"], "done\n", "{first}");
    let second = run_on(
        &client,
        json!({"command": ["/bin/sh", "-c", format!("{look}; echo ONLY_FIRST=$ONLY_FIRST")]}),
        "warm",
    )
    .await;
    assert_eq!(
        second["result"]["stdout"], "LEFT=\nONLY_FIRST=\n",
        "{second}"
    );
    let leave_code = "import json, os, random; json.leaked = 1; os.environ['LEFT'] = '1'; open('/tmp/left.txt', 'w').write('x'); print(random.random())";
    let look_code = "import json, os, random; print(hasattr(json, 'leaked'), os.environ.get('LEFT'), os.path.exists('/tmp/left.txt'), os.path.exists('left.txt'))";
    let one = run_on(
        &client,
        json!({"code": leave_code, "language": "python"}),
        "zygote",
    )
    .await;
    let two = run_on(
        &client,
        json!({"code": leave_code, "language": "python"}),
        "zygote",
    )
    .await;
    assert_ne!(
        one["result"]["stdout"], two["result"]["stdout"],
        "two zygote runs drew the same random numbers"
    );
    let after = run_on(
        &client,
        json!({"code": look_code, "language": "python"}),
        "zygote",
    )
    .await;
    assert_eq!(
        after["result"]["stdout"], "False None False False\n",
        "{after}"
    );
}

/// Cancellation and the wall limit end warm and zygote runs as they end cold ones.
#[tokio::test(flavor = "multi_thread")]
async fn cancellation_and_timeouts_through_the_warm_paths_behave_as_cold() {
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    let profile = quick.path();
    wait_warm(&daemon, &profile, 1, 1).await;
    let gamma = daemon.client(&daemon.keys.gamma);
    let slept = run_on(
        &gamma,
        json!({"command": ["/bin/sleep", "10"], "profile": profile}),
        "warm",
    )
    .await;
    assert_eq!(slept["status"], "timeout", "{slept}");
    let spun = run_on(
        &gamma,
        json!({"code": "import time; time.sleep(10)", "language": "python", "profile": profile}),
        "zygote",
    )
    .await;
    assert_eq!(spun["status"], "timeout", "{spun}");
    assert!(spun["wall_ms"].as_i64().unwrap() < 8_000, "{spun}");

    wait_warm(&daemon, "untrusted", 1, 1).await;
    let beta = daemon.client(&daemon.keys.beta);
    for body in [
        json!({"command": ["/bin/sleep", "30"]}),
        json!({"code": "import time; time.sleep(30)", "language": "python"}),
    ] {
        let run = cancel_while_running(&beta, "/v1/runs", body.clone()).await;
        assert_eq!(run["status"], "cancelled", "{body}: {run}");
    }
}

/// Submits `body` to `path`, cancels the run once it has been running for 0.5 s, and gives
/// back its terminal record; the cancel is accepted and the run ends well within its sleep.
async fn cancel_while_running(client: &Client, path: &str, body: Value) -> Value {
    let id = client.post(path, body).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    crate::api::wait_status(client, &id, "running").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopped = client.delete(&format!("/v1/runs/{id}")).await;
    assert!(matches!(stopped.status, 200 | 202), "{}", stopped.text());
    let run = client.wait_terminal(&id, Duration::from_secs(20)).await;
    assert!(run["wall_ms"].as_i64().unwrap() < 15_000, "{run}");
    run
}

/// A process's start time (field 22 of its stat), to tell it from a later one with its pid.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split(' ').nth(19).map(str::to_string)
}

fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split(' ').nth(1)?.parse().ok()
}

/// Kills the daemon (SIGKILL): none of the processes it `held` outlives it (a pid reused by
/// another process does not count: its start time differs), and no run directory is left.
fn kill_and_check_nothing_outlives(daemon: &mut TestDaemon, held: &HashSet<(u32, String)>) {
    daemon.kill();
    let left = settle(Duration::from_secs(30), || {
        held.iter()
            .filter(|(pid, time)| start_time(*pid).as_ref() == Some(time))
            .cloned()
            .collect()
    });
    assert!(left.is_empty(), "processes outlived the daemon: {left:?}");
    let dirs = settle(Duration::from_secs(30), || daemon.leftover_run_dirs());
    assert!(dirs.is_empty(), "run directories are left: {dirs:?}");
}

/// Every process descended from `root`, with its start time.
fn descendants(root: u32) -> HashSet<(u32, String)> {
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let mut found = HashSet::new();
    for pid in pids {
        let mut current = pid;
        for _ in 0..64 {
            match parent(current) {
                Some(p) if p == root => {
                    found.extend(start_time(pid).map(|t| (pid, t)));
                    break;
                }
                Some(p) if p > 1 => current = p,
                _ => break,
            }
        }
    }
    found
}

/// SIGKILL of a daemon holding prepared sandboxes and a zygote: their processes, run
/// directories, cgroups and mounts go with it.
#[tokio::test(flavor = "multi_thread")]
async fn killing_the_daemon_leaves_no_prepared_sandbox_or_zygote_behind() {
    let quick = QuickProfile::new();
    let mut daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 2, 1).await;
    wait_warm(&daemon, &quick.path(), 1, 1).await;
    // A used sandbox is being replaced while the daemon dies.
    let client = daemon.client(&daemon.keys.beta);
    run_on(&client, json!({"command": ["/bin/true"]}), "warm").await;
    let held = descendants(daemon.pid());
    assert!(
        held.len() >= 6,
        "the daemon holds too few processes: {held:?}"
    );
    kill_and_check_nothing_outlives(&mut daemon, &held);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = daemon.dir.path().display().to_string();
    let ours: Vec<&str> = mounts.lines().filter(|l| l.contains(&root)).collect();
    assert!(ours.is_empty(), "mounts are left: {ours:?}");
    // The cgroups of a zygote's children forked ahead are the daemon's own to remove: no
    // process is left in them, and the next start on this cgroup parent sweeps them.
    let left = daemon.leftover_cgroups();
    let occupied: Vec<&PathBuf> = left
        .iter()
        .filter(|c| {
            let tasks = std::fs::read_to_string(c.join("tasks")).unwrap_or_default();
            !tasks.trim().is_empty()
        })
        .collect();
    assert!(
        occupied.is_empty(),
        "cgroups still hold processes: {occupied:?}"
    );
    daemon.spawn();
    let cgroups = settle(Duration::from_secs(30), || {
        left.iter().filter(|c| c.exists()).cloned().collect()
    });
    assert!(
        cgroups.is_empty(),
        "cgroups are left after a restart: {cgroups:?}"
    );
}

/// A zygote run's output reaches its event stream as the program writes it: the client sees
/// the first line while the program sleeps, before the run ends (`started` first), and the
/// output cap holds on the stream as on the result.
#[tokio::test(flavor = "multi_thread")]
async fn a_zygote_runs_output_is_streamed_as_it_is_written() {
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 0, 1).await;
    let client = daemon.client(&daemon.keys.beta);
    let code =
        "import sys, time\nprint('first-line', flush=True)\ntime.sleep(4)\nprint('second-line')";
    for attempt in 0..5 {
        let accepted = client
            .post("/v1/runs", json!({"code": code, "language": "python"}))
            .await
            .json();
        let id = accepted["id"].as_str().unwrap().to_string();
        let mut stream = client.open_events(&id).await;
        let seen = crate::common::read_until(&mut stream, "first-line").await;
        let now = client.get(&format!("/v1/runs/{id}")).await.json();
        let run = client.wait_terminal(&id, Duration::from_secs(30)).await;
        if run["start"] != "zygote" {
            assert!(attempt < 4, "never ran on the zygote: {run}");
            continue;
        }
        assert_eq!(
            now["status"], "running",
            "the first line came only at the end: {now}"
        );
        assert!(!seen.contains("second-line"), "{seen}");
        let started = seen.find("\"event\":\"started\"").expect("started");
        assert!(started < seen.find("first-line").unwrap(), "{seen}");
        let rest = crate::common::read_until(&mut stream, "\"event\":\"ended\"").await;
        assert!(rest.contains("second-line"), "{rest}");
        assert_eq!(
            run["result"]["stdout"], "first-line\nsecond-line\n",
            "{run}"
        );
        break;
    }
    // Past the cap (1 MiB of stdout in untrusted) the stream carries no more than the result.
    let flood = "import sys\nfor _ in range(64): sys.stdout.write('x' * 65536)";
    let run = run_on(
        &client,
        json!({"code": flood, "language": "python"}),
        "zygote",
    )
    .await;
    let id = run["id"].as_str().unwrap();
    let events = client.get(&format!("/v1/runs/{id}/events")).await.text();
    let streamed: usize = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "stdout")
        .map(|e| e["text"].as_str().unwrap_or_default().len())
        .sum();
    assert_eq!(run["result"]["stdout_truncated"], true, "{run}");
    let kept = run["result"]["stdout"].as_str().unwrap().len();
    assert!(
        streamed > 0 && streamed <= 1 << 20,
        "streamed {streamed} bytes: {run}"
    );
    assert_eq!(streamed, kept, "the stream and the result differ: {run}");
}

/// Creates a session for `client` (body as `POST /v1/sessions` takes it); its id.
async fn new_session(client: &Client, body: Value) -> String {
    let created = client.post("/v1/sessions", body).await;
    assert_eq!(created.status, 201, "{}", created.text());
    created.json()["id"].as_str().unwrap().to_string()
}

/// Runs `body` in `session` (waiting for the result) until it takes the `start` path: the
/// session's first run makes its prepared sandbox, which is replaced after each run in the
/// background; at most 30 tries. The last run.
async fn session_run_on(client: &Client, session: &str, body: Value, start: &str) -> Value {
    let mut body = body;
    body["wait"] = json!(60);
    let mut run = Value::Null;
    for _ in 0..30 {
        run = client
            .post(&format!("/v1/sessions/{session}/runs"), body.clone())
            .await
            .json();
        if run["start"] == start {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("never started {start}: {run}");
}

/// The workspace on the host of the session a run ran in.
fn workspace_of(daemon: &TestDaemon, run: &Value) -> PathBuf {
    let session = run["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session: {run}"));
    let dir = daemon.state().join("sessions").join(session);
    assert!(dir.is_dir(), "no workspace at {}", dir.display());
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_session_runs_have_the_cold_session_runs_plan_and_share_the_workspace() {
    let quick = QuickProfile::new();
    let cold_daemon = TestDaemon::start(Options::default());
    let cold_client = cold_daemon.client(&cold_daemon.keys.beta);
    let command = json!({"command": ["/bin/sh", "-c", "echo made > made.txt; pwd; id -u"]});
    let cold_session = new_session(&cold_client, json!({"disk": "8MiB", "files": 100})).await;
    let cold = session_run_on(&cold_client, &cold_session, command.clone(), "cold").await;
    drop(cold_daemon);
    // The isolation record of a cold session run is what the warm one must show.

    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 1, 0).await;
    let client = daemon.client(&daemon.keys.beta);
    let session = new_session(&client, json!({"disk": "8MiB", "files": 100})).await;
    let warm = session_run_on(&client, &session, command, "warm").await;
    let workspace = workspace_of(&daemon, &warm);
    assert_eq!(warm["status"], "exited", "{warm}");
    assert_eq!(layers(&warm), layers(&cold), "warm: {warm}\ncold: {cold}");
    // The same plan: policy, limits, the workdir at the workspace's own path, the same user.
    assert_eq!(warm["policy"], cold["policy"]);
    let stdout = |run: &Value| run["result"]["stdout"].as_str().unwrap().to_string();
    let cold_session = cold["session_id"].as_str().unwrap();
    assert!(
        stdout(&cold).ends_with(&format!("/sessions/{cold_session}\n65534\n")),
        "{cold}"
    );
    assert_eq!(stdout(&warm), format!("{}\n65534\n", workspace.display()));
    assert!(warm["result"]["cpu_user_ms"].is_u64(), "{warm}");
    assert!(warm["result"]["peak_memory_bytes"].is_u64(), "{warm}");
    // What a warm run wrote is in the workspace, for the API and for the next (warm) run.
    let files = format!("/v1/sessions/{session}/files");
    assert_eq!(
        client.get(&format!("{files}/made.txt")).await.text(),
        "made\n"
    );
    let next = session_run_on(
        &client,
        &session,
        json!({"command": ["/bin/cat", "made.txt"]}),
        "warm",
    )
    .await;
    assert_eq!(next["result"]["stdout"], "made\n", "{next}");
    // Ending the session takes its prepared sandbox and its workspace.
    let ended = client.delete(&format!("/v1/sessions/{session}")).await;
    assert!(matches!(ended.status, 200 | 204), "{}", ended.text());
    assert!(!workspace.exists(), "the workspace is left");
    let dirs = settle(Duration::from_secs(30), || {
        daemon
            .leftover_run_dirs()
            .into_iter()
            .filter(|d| {
                std::fs::read_to_string(d.join("spec.json"))
                    .unwrap_or_default()
                    .contains(&workspace.display().to_string())
            })
            .collect()
    });
    assert!(dirs.is_empty(), "the session's sandbox is left: {dirs:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn attacks_through_a_warm_session_run_are_contained() {
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 1, 0).await;
    let client = daemon.client(&daemon.keys.beta);
    let session = new_session(&client, json!({})).await;
    let outside = daemon.dir.path().join("planted-by-a-session-run");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    // The workspace's parents exist in the sandbox only as its own mount points (under its
    // own /tmp here): what the program sees and writes there is checked on the host below.
    let tail = format!(
        r#"
try:
    print("STATE", sorted(os.listdir("{state}")))
except OSError: print("STATE", [])
for path in ["{outside}", "../planted-next-to-the-workspace"]:
    try: open(path, "w").write("x")
    except OSError: pass
here = os.getcwd()
try:
    os.rename(here, here + ".moved"); found.append("moved the workspace")
except OSError: pass
open("kept.txt", "w").write("kept")
"#,
        state = daemon.state().display(),
        outside = outside.display(),
    );
    let attack = attack_script(&[format!("{home}/.ssh")], &tail);
    let run = session_run_on(
        &client,
        &session,
        json!({"command": ["/usr/bin/python3", "-c", attack]}),
        "warm",
    )
    .await;
    let workspace = workspace_of(&daemon, &run);
    let stdout = run["result"]["stdout"].as_str().unwrap();
    assert!(stdout.ends_with("FOUND []\n"), "{run}");
    // Of the daemon's state directory the sandbox sees no entry but the path to the
    // workspace.
    let state_seen = stdout.lines().find(|l| l.starts_with("STATE")).unwrap();
    assert!(
        state_seen == "STATE []" || state_seen == "STATE ['sessions']",
        "{state_seen}"
    );
    assert!(std::fs::read_dir(daemon.state()).unwrap().count() > 1);
    assert!(!outside.exists(), "a run wrote {}", outside.display());
    let next_to = workspace.with_file_name("planted-next-to-the-workspace");
    assert!(!next_to.exists(), "a run wrote {}", next_to.display());
    assert!(!Path::new("/etc/planted").exists() && !Path::new("/planted").exists());
    assert!(workspace.join("kept.txt").is_file(), "the workspace moved");

    // A run of the session swaps `d` and `.git` between a directory and a symlink to the
    // host's `/` and `/etc` while warm runs are handed off and write through them.
    let swapper = r#"
import os, time
end = time.time() + 4
while time.time() < end:
    for name, target in (("d", "/"), (".git", "/etc")):
        try:
            if os.path.islink(name): os.unlink(name); os.mkdir(name)
            else:
                if os.path.isdir(name): os.rmdir(name)
                os.symlink(target, name)
        except OSError: pass
print("swapped")
"#;
    let swapping = client
        .post(
            &format!("/v1/sessions/{session}/runs"),
            json!({"command": ["/usr/bin/python3", "-c", swapper]}),
        )
        .await
        .json();
    let swapping = swapping["id"].as_str().unwrap().to_string();
    let writer = json!({"command": ["/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo x > d/planted-through-d 2>/dev/null; echo x > .git/planted-through-git 2>/dev/null; done; echo wrote"]});
    let mut warm_writes = 0;
    for _ in 0..10 {
        let run = session_run_on(&client, &session, writer.clone(), "warm").await;
        assert_eq!(run["result"]["stdout"], "wrote\n", "{run}");
        warm_writes += 1;
    }
    let swapped = client
        .wait_terminal(&swapping, Duration::from_secs(60))
        .await;
    assert_eq!(swapped["result"]["stdout"], "swapped\n", "{swapped}");
    assert_eq!(warm_writes, 10);
    for host in ["/planted-through-d", "/etc/planted-through-git"] {
        assert!(!Path::new(host).exists(), "a warm session run wrote {host}");
    }
    assert!(!daemon.dir.path().join("planted-through-d").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_crosses_between_two_warm_session_runs_but_the_workspace() {
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 1, 0).await;
    let client = daemon.client(&daemon.keys.beta);
    let session = new_session(&client, json!({})).await;
    let leave = "echo ws > ws.txt; echo tmp > /tmp/left.txt; echo shm > /dev/shm/left; (sleep 100 &); export LEFT=1; echo done";
    let first = session_run_on(
        &client,
        &session,
        json!({"command": ["/bin/sh", "-c", leave], "env": {"ONLY_FIRST": "1"}}),
        "warm",
    )
    .await;
    assert_eq!(first["result"]["stdout"], "done\n", "{first}");
    let look = "cat ws.txt; cat /tmp/left.txt /dev/shm/left 2>/dev/null; echo LEFT=$LEFT ONLY_FIRST=$ONLY_FIRST; cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'sleep [1]00'";
    let second = session_run_on(
        &client,
        &session,
        json!({"command": ["/bin/sh", "-c", look]}),
        "warm",
    )
    .await;
    assert_eq!(
        second["result"]["stdout"], "ws\nLEFT= ONLY_FIRST=\n0\n",
        "{second}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_caps_hold_on_its_warm_runs() {
    if !crate::common::is_root() {
        eprintln!("skipped: the workspace tmpfs needs root to mount");
        return;
    }
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 1, 0).await;
    let client = daemon.client(&daemon.keys.beta);
    let session = new_session(&client, json!({"disk": "1MiB", "files": 20})).await;
    let fill = "rm -f fill f*; head -c 2000000 /dev/zero > fill; echo $?; for i in $(seq 1 40); do touch f$i 2>/dev/null || { echo stop at $i; break; }; done";
    let run = session_run_on(
        &client,
        &session,
        json!({"command": ["/bin/sh", "-c", fill]}),
        "warm",
    )
    .await;
    let stdout = run["result"]["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with('1'),
        "the disk cap did not stop the program: {run}"
    );
    assert!(
        stdout.contains("stop at"),
        "the file cap did not stop the program: {run}"
    );
    // A run that narrows the session's policy gets its own limits: the session's prepared
    // sandbox was made for the session's policy, so this one runs cold (even with that
    // sandbox ready).
    wait_session_ready(&daemon).await;
    let narrowed = client
        .post(
            &format!("/v1/sessions/{session}/runs"),
            json!({"command": ["/bin/sleep", "5"], "policy": {"limits": {"wall_time": "1s"}}, "wait": 60}),
        )
        .await
        .json();
    assert_eq!(narrowed["status"], "timeout", "{narrowed}");
    assert_eq!(narrowed["start"], "cold", "{narrowed}");
}

/// Cancellation and the wall limit end warm session runs as they end cold ones.
#[tokio::test(flavor = "multi_thread")]
async fn cancellation_and_timeouts_of_warm_session_runs_behave_as_cold() {
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    let profile = quick.path();
    wait_warm(&daemon, &profile, 1, 0).await;
    let gamma = daemon.client(&daemon.keys.gamma);
    let session = new_session(&gamma, json!({"profile": profile})).await;
    let slept = session_run_on(
        &gamma,
        &session,
        json!({"command": ["/bin/sleep", "10"]}),
        "warm",
    )
    .await;
    assert_eq!(slept["status"], "timeout", "{slept}");
    assert!(slept["wall_ms"].as_i64().unwrap() < 8_000, "{slept}");

    wait_warm(&daemon, "untrusted", 1, 0).await;
    let beta = daemon.client(&daemon.keys.beta);
    let session = new_session(&beta, json!({})).await;
    session_run_on(&beta, &session, json!({"command": ["/bin/true"]}), "warm").await;
    for _ in 0..30 {
        let path = format!("/v1/sessions/{session}/runs");
        let run =
            cancel_while_running(&beta, &path, json!({"command": ["/bin/sleep", "30"]})).await;
        assert_eq!(run["status"], "cancelled", "{run}");
        if run["start"] == "warm" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("no session run was cancelled on a prepared sandbox");
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_daemon_leaves_no_sessions_prepared_sandbox_behind() {
    let quick = QuickProfile::new();
    let mut daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 1, 0).await;
    let client = daemon.client(&daemon.keys.beta);
    let session = new_session(&client, json!({})).await;
    let run = session_run_on(&client, &session, json!({"command": ["/bin/true"]}), "warm").await;
    let workspace = workspace_of(&daemon, &run);
    wait_session_ready(&daemon).await;
    let held = descendants(daemon.pid());
    kill_and_check_nothing_outlives(&mut daemon, &held);
    // Only the session's workspace stays mounted (sessions outlive a restart); nothing of the
    // prepared sandbox's (its namespace held the workspace) is left in the host's mounts.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = daemon.dir.path().display().to_string();
    let ours: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains(&root))
        .filter(|l| l.split(' ').nth(4) != Some(&workspace.display().to_string()))
        .collect();
    assert!(ours.is_empty(), "mounts are left: {ours:?}");
    // After a restart the session is adopted and its runs go warm again.
    daemon.spawn();
    let client = daemon.client(&daemon.keys.beta);
    wait_warm(&daemon, "untrusted", 1, 0).await;
    let run = session_run_on(&client, &session, json!({"command": ["/bin/true"]}), "warm").await;
    assert_eq!(run["status"], "exited", "{run}");
    client.delete(&format!("/v1/sessions/{session}")).await;
}

/// Waits until `/metrics` shows a session's sandbox ready.
async fn wait_session_ready(daemon: &TestDaemon) {
    let admin = daemon.client(&daemon.keys.alpha);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = admin.get("/metrics").await.text();
        if text
            .lines()
            .any(|l| l.starts_with("airlockd_warm_ready{kind=\"session\"") && !l.ends_with(" 0"))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no session sandbox ready:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

//! `[warm]`: runs through prepared sandboxes and interpreter zygotes, with the cold run's
//! isolation record, attacks contained, nothing crossing between runs, cancellation and
//! timeouts as cold, and nothing left after the daemon is killed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{settle, Client, Options, TestDaemon};

/// `airlock-zygote`, next to `airlockd` (built here if missing: it is another package).
fn zygote_bin() -> PathBuf {
    let bin = crate::common::airlockd_bin().with_file_name("airlock-zygote");
    if !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "airlock-zygote"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cannot build airlock-zygote");
    }
    bin
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
#[tokio::test(flavor = "multi_thread")]
async fn attacks_through_the_warm_paths_are_contained() {
    let quick = QuickProfile::new();
    let daemon = warm_daemon(&quick);
    wait_warm(&daemon, "untrusted", 1, 1).await;
    let client = daemon.client(&daemon.keys.beta);
    let outside = daemon.dir.path().join("planted-by-a-run");
    let attack = format!(
        r#"
import os, socket
found = []
try:
    socket.create_connection(("192.0.2.1", 80), timeout=2); found.append("net:tcp")
except OSError: pass
try:
    socket.getaddrinfo("example.com", 80); found.append("net:dns")
except OSError: pass
for path in ["/etc/shadow", "/root/.ssh", "{state}"]:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path).read(); found.append("read:" + path)
    except OSError: pass
if any("AIRLOCKD" in k for k in os.environ): found.append("env")
for path in ["/etc/planted", "/usr/planted", "/planted"]:
    try:
        open(path, "w").write("x"); found.append("write:" + path)
    except OSError: pass
print("FOUND", found)
"#,
        state = daemon.state().display(),
    );
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
        let id = beta.post("/v1/runs", body.clone()).await.json()["id"]
            .as_str()
            .unwrap()
            .to_string();
        crate::api::wait_status(&beta, &id, "running").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stopped = beta.delete(&format!("/v1/runs/{id}")).await;
        assert!(matches!(stopped.status, 200 | 202), "{}", stopped.text());
        let run = beta.wait_terminal(&id, Duration::from_secs(20)).await;
        assert_eq!(run["status"], "cancelled", "{body}: {run}");
        assert!(run["wall_ms"].as_i64().unwrap() < 15_000, "{run}");
    }
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

//! SIGKILL of the daemon during a batch of runs, many times: in-flight runs end `lost` with
//! the reason, finished runs keep their records, and no process, cgroup, run directory or
//! mount of the killed runs is left.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use crate::common::{processes_with, settle, Options, TestDaemon};

/// Rounds of kill and restart (`AIRLOCKD_KILL_ROUNDS`, default 5).
fn rounds() -> usize {
    std::env::var("AIRLOCKD_KILL_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5)
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_daemon_mid_batch_loses_no_record_and_leaves_nothing() {
    let mut daemon = TestDaemon::start(Options::default());
    let marker = format!("airlockd-kill-{}", daemon.cgroup_parent());
    let mut finished: HashMap<String, serde_json::Value> = HashMap::new();
    let mut in_flight: Vec<String> = Vec::new();
    let session = daemon
        .client(&daemon.keys.beta)
        .post("/v1/sessions", json!({}))
        .await
        .json();
    let sid = session["id"].as_str().unwrap().to_string();
    for round in 0..rounds() {
        let client = daemon.client(&daemon.keys.beta);
        client
            .put(
                &format!("/v1/sessions/{sid}/files/round"),
                round.to_string(),
            )
            .await;
        // Quick runs that finish (their result is seen), then long ones left in flight. Runs
        // waited for run on their request's own thread, the others on a thread of their own,
        // and one is handed over from its request's thread when its 1 s wait ends: runs of
        // each way are finished and killed.
        for i in 0..3 {
            let mut quick = json!({"command": ["/bin/echo", format!("{round}-{i}")]});
            if i % 2 == 0 {
                quick = on_request(quick);
            }
            let run = client.run(quick).await.json();
            assert_eq!(run["status"], "exited");
            finished.insert(run["id"].as_str().unwrap().to_string(), run);
        }
        let long = json!({"command": ["/bin/sh", "-c", format!("sleep 60; : {marker}")]});
        // Four slots: four running (one in the session), one queued when the daemon dies.
        let in_session = client
            .post(&format!("/v1/sessions/{sid}/runs"), long.clone())
            .await
            .json();
        let first = in_session["id"].as_str().unwrap().to_string();
        in_flight.push(first.clone());
        let waiting = daemon.client(&daemon.keys.beta);
        let waited_body = on_request(long.clone());
        let waited = tokio::spawn(async move { waiting.post("/v1/runs", waited_body).await });
        in_flight.push(newly_running(&client, &in_flight).await);
        for i in 0..3 {
            let mut body = long.clone();
            if i == 0 {
                // Waited for 1 s on its request's thread, then handed over to one of its own.
                body["wait"] = json!(1);
            }
            let run = client.post("/v1/runs", body).await.json();
            in_flight.push(run["id"].as_str().unwrap().to_string());
        }
        crate::api::wait_status(&client, &first, "running").await;
        daemon.kill();
        // Its request dies with the daemon; the run's record is checked like the others'.
        waited.abort();
        daemon.spawn();
        check_round(&daemon, &marker, &finished, &in_flight).await;
    }
    // The session survived every restart with its files.
    let client = daemon.client(&daemon.keys.beta);
    assert_eq!(
        client
            .get(&format!("/v1/sessions/{sid}/files/round"))
            .await
            .text(),
        (rounds() - 1).to_string()
    );
    let lost = client.get("/v1/runs?status=lost&limit=1000").await.json();
    assert_eq!(lost["runs"].as_array().unwrap().len(), in_flight.len());
    let audit = daemon
        .client(&daemon.keys.alpha)
        .get("/v1/audit?kind=run_lost&limit=1000")
        .await
        .json();
    assert_eq!(audit["records"].as_array().unwrap().len(), in_flight.len());
}

/// `run` with a wait that covers its limits (40 s of wall time, its grace and the daemon's
/// margin fit in 60 s): the daemon runs it on the request's own thread.
fn on_request(mut run: serde_json::Value) -> serde_json::Value {
    run["wait"] = json!(60);
    run["policy"] = json!({"limits": {"wall_time": "40s"}});
    run
}

/// The id of a running run not in `known`, polled for up to 20 s.
async fn newly_running(client: &crate::common::Client, known: &[String]) -> String {
    for _ in 0..400 {
        let page = client
            .get("/v1/runs?status=running&limit=1000")
            .await
            .json();
        let ids = page["runs"].as_array().cloned().unwrap_or_default();
        let new = ids
            .iter()
            .filter_map(|run| run["id"].as_str())
            .find(|id| !known.iter().any(|k| k == id));
        if let Some(id) = new {
            return id.to_string();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the waited run never became running");
}

async fn check_round(
    daemon: &TestDaemon,
    marker: &str,
    finished: &HashMap<String, serde_json::Value>,
    in_flight: &[String],
) {
    let client = daemon.client(&daemon.keys.beta);
    for (id, before) in finished {
        let after = client.get(&format!("/v1/runs/{id}")).await.json();
        assert_eq!(
            after["status"], before["status"],
            "finished run {id} changed"
        );
        assert_eq!(
            after["result"], before["result"],
            "finished run {id} changed"
        );
    }
    for id in in_flight {
        let run = client.get(&format!("/v1/runs/{id}")).await;
        assert_eq!(run.status, 200, "in-flight run {id} has no record");
        let run = run.json();
        assert_eq!(run["status"], "lost", "{run}");
        assert_eq!(run["error"]["kind"], "lost");
        assert!(run["error"]["message"]
            .as_str()
            .unwrap()
            .contains("killed or crashed"));
    }
    let processes = settle(Duration::from_secs(30), || processes_with(marker));
    assert!(
        processes.is_empty(),
        "processes of killed runs are left: {processes:?}"
    );
    let dirs = settle(Duration::from_secs(30), || daemon.leftover_run_dirs());
    assert!(dirs.is_empty(), "run directories are left: {dirs:?}");
    let cgroups = settle(Duration::from_secs(30), || daemon.leftover_cgroups());
    assert!(cgroups.is_empty(), "cgroups are left: {cgroups:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let state = daemon.dir.path().display().to_string();
    let ours: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains(&state) && !l.contains("/sessions/"))
        .collect();
    assert!(ours.is_empty(), "mounts of killed runs are left: {ours:?}");
}

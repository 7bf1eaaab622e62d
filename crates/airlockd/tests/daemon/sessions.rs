//! Sessions: files in and out, runs sharing the workspace in fresh sandboxes, caps, expiry
//! removing everything.

use std::time::Duration;

use serde_json::json;

use crate::common::{is_root, Options, TestDaemon};

#[tokio::test(flavor = "multi_thread")]
async fn session_runs_share_the_workspace_each_in_a_fresh_sandbox() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let created = client
        .post("/v1/sessions", json!({"disk": "8MiB", "files": 200}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    let session = created.json();
    let id = session["id"].as_str().unwrap();
    assert_eq!(session["workspace"]["quota_enforced"], is_root());
    let files = format!("/v1/sessions/{id}/files");
    assert_eq!(
        client
            .put(
                &format!("{files}/src/prog.py"),
                "print(open('src/data.txt').read().upper())"
            )
            .await
            .status,
        204
    );
    assert_eq!(
        client
            .put(&format!("{files}/src/data.txt"), "hello")
            .await
            .status,
        204
    );
    let run = client
        .post(&format!("/v1/sessions/{id}/runs"), json!({"command": ["/bin/sh", "-c", "(sleep 100 &); python3 src/prog.py > out.txt; echo $$ > pid.txt"], "wait": 30}))
        .await;
    assert_eq!(run.status, 200, "{}", run.text());
    assert_eq!(run.json()["status"], "exited", "{}", run.text());
    assert_eq!(run.json()["session_id"], id);
    assert_eq!(
        client.get(&format!("{files}/out.txt")).await.text(),
        "HELLO\n"
    );
    // A second run sees the first one's files but none of its processes (a fresh PID namespace).
    let second = client
        .post(&format!("/v1/sessions/{id}/runs"), json!({"command": ["/bin/sh", "-c", "cat out.txt; cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'sleep [1]00'"], "wait": 30}))
        .await
        .json();
    assert_eq!(second["result"]["stdout"], "HELLO\n0\n", "{second}");
    let listing = client.get(&files).await.json();
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["out.txt", "pid.txt", "src"]);
    assert_eq!(
        client.get(&format!("{files}/src")).await.json()["entries"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(client.delete(&format!("{files}/pid.txt")).await.status, 204);
    assert_eq!(client.get(&format!("{files}/pid.txt")).await.status, 404);
    assert_eq!(client.delete(&format!("{files}/src")).await.status, 409);
    let listed = client.get(&format!("/v1/runs?session={id}")).await.json();
    assert_eq!(listed["runs"].as_array().unwrap().len(), 2);
    // Deleting ends it and removes the workspace with everything in it.
    let workspace = daemon.state().join("sessions").join(id);
    assert!(workspace.is_dir());
    let ended = client.delete(&format!("/v1/sessions/{id}")).await;
    assert_eq!(ended.status, 200);
    assert_eq!(ended.json()["status"], "deleted");
    assert!(!workspace.exists(), "the workspace was not removed");
    assert_eq!(client.get(&format!("{files}/out.txt")).await.status, 409);
    assert_eq!(
        client.delete(&format!("/v1/sessions/{id}")).await.status,
        409
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repository_made_in_a_session_stays_usable_by_its_next_runs() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let created = client.post("/v1/sessions", json!({})).await;
    assert_eq!(created.status, 201, "{}", created.text());
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let git = "git -c user.name=a -c user.email=a@example.com";
    let init = format!("{git} init -q repo && cd repo && echo one > f && {git} add f && {git} commit -qm one && echo made");
    let first = client
        .post(
            &format!("/v1/sessions/{id}/runs"),
            json!({"command": ["/bin/sh", "-c", init], "wait": 30}),
        )
        .await
        .json();
    assert_eq!(first["result"]["stdout"], "made\n", "{first}");
    let commit = format!("cd repo && echo two > f && {git} commit -qam two && git log --format=%s");
    let second = client
        .post(
            &format!("/v1/sessions/{id}/runs"),
            json!({"command": ["/bin/sh", "-c", commit], "wait": 30}),
        )
        .await
        .json();
    assert_eq!(second["result"]["stdout"], "two\none\n", "{second}");
    assert!(
        !second["result"]["isolation"]
            .to_string()
            .contains("git_read_only"),
        "{second}"
    );
    client.delete(&format!("/v1/sessions/{id}")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn workspace_caps_hold_for_uploads_and_programs() {
    if !is_root() {
        eprintln!("skipped: the workspace tmpfs needs root to mount");
        return;
    }
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let id = client
        .post("/v1/sessions", json!({"disk": "1MiB", "files": 20}))
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let files = format!("/v1/sessions/{id}/files");
    let big = vec![b'x'; 700 * 1024];
    assert_eq!(
        client.put(&format!("{files}/a"), big.clone()).await.status,
        204
    );
    let full = client.put(&format!("{files}/b"), big).await;
    assert_eq!(full.status, 413, "{}", full.text());
    assert_eq!(full.kind(), "workspace_full");
    let over_file_cap = client
        .put_tolerant(&format!("{files}/c"), vec![b'x'; 2 << 20])
        .await;
    assert_eq!(over_file_cap.status, 413);
    let run = client
        .post(&format!("/v1/sessions/{id}/runs"), json!({"command": ["/bin/sh", "-c", "head -c 2000000 /dev/zero > fill; echo $?; for i in $(seq 1 40); do touch f$i 2>/dev/null || { echo stop at $i; break; }; done"], "wait": 30}))
        .await
        .json();
    let stdout = run["result"]["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with('1'),
        "the disk cap did not stop the program: {stdout}"
    );
    assert!(
        stdout.contains("stop at"),
        "the file cap did not stop the program: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_and_expired_sessions_are_removed_with_everything_they_held() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let idle = client
        .post("/v1/sessions", json!({"idle_timeout": "1s"}))
        .await
        .json();
    let short = client
        .post(
            "/v1/sessions",
            json!({"max_lifetime": "2s", "idle_timeout": "1m"}),
        )
        .await
        .json();
    let short_id = short["id"].as_str().unwrap().to_string();
    client
        .put(
            &format!("/v1/sessions/{}/files/x", idle["id"].as_str().unwrap()),
            "x",
        )
        .await;
    // A run in flight keeps the session from idling out, but not past its lifetime.
    let run = client
        .post(
            &format!("/v1/sessions/{short_id}/runs"),
            json!({"command": ["/bin/sleep", "30"]}),
        )
        .await
        .json();
    tokio::time::sleep(Duration::from_secs(4)).await;
    for session in [&idle, &short] {
        let id = session["id"].as_str().unwrap();
        let row = client.get(&format!("/v1/sessions/{id}")).await.json();
        assert_eq!(row["status"], "expired", "{row}");
        assert!(!daemon.state().join("sessions").join(id).exists());
    }
    let run = client
        .wait_terminal(run["id"].as_str().unwrap(), Duration::from_secs(20))
        .await;
    assert_eq!(run["status"], "cancelled");
    assert_eq!(run["error"]["kind"], "session_ended", "{run}");
}

#[tokio::test(flavor = "multi_thread")]
async fn session_limits_are_ceilings() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let too_long = client
        .post("/v1/sessions", json!({"max_lifetime": "30d"}))
        .await;
    assert_eq!(too_long.status, 403);
    assert!(
        too_long.text().contains("sessions.max_lifetime"),
        "{}",
        too_long.text()
    );
    let too_big = client.post("/v1/sessions", json!({"disk": "1TiB"})).await;
    assert_eq!(too_big.status, 403);
    for _ in 0..4 {
        assert_eq!(client.post("/v1/sessions", json!({})).await.status, 201);
    }
    let fifth = client.post("/v1/sessions", json!({})).await;
    assert_eq!(fifth.status, 429);
    assert_eq!(fifth.kind(), "session_limit");
}

//! SIGTERM: no new work, running runs get the grace period, then are cancelled; queued runs
//! are cancelled at once; every run gets a terminal record; slow and stalled clients.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{Options, TestDaemon};

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_then_cancels_and_records_every_run() {
    let mut daemon = TestDaemon::start(Options::default());
    let gamma = daemon.client(&daemon.keys.gamma);
    let beta = daemon.client(&daemon.keys.beta);
    let short = beta
        .post(
            "/v1/runs",
            json!({"command": ["/bin/sh", "-c", "sleep 1; echo finished"]}),
        )
        .await
        .json();
    let long = gamma
        .post("/v1/runs", json!({"command": ["/bin/sleep", "60"]}))
        .await
        .json();
    let queued = gamma
        .post("/v1/runs", json!({"command": ["/bin/true"]}))
        .await
        .json();
    crate::api::wait_status(&gamma, long["id"].as_str().unwrap(), "running").await;
    let pid = rustix::process::Pid::from_raw(daemon.pid() as i32).unwrap();
    let started = Instant::now();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = beta
        .post("/v1/runs", json!({"command": ["/bin/true"]}))
        .await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.kind(), "shutting_down");
    assert_eq!(daemon.anonymous().get("/healthz").await.status, 503);
    let status = daemon.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        daemon.log()
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "draining took {:?}",
        started.elapsed()
    );
    daemon.spawn();
    let get = |id: &serde_json::Value| {
        let client = daemon.client(&daemon.keys.alpha);
        let id = id.as_str().unwrap().to_string();
        async move { client.get(&format!("/v1/runs/{id}")).await.json() }
    };
    let short = get(&short["id"]).await;
    assert_eq!(
        short["status"], "exited",
        "the running run was not given its grace: {short}"
    );
    assert_eq!(short["result"]["stdout"], "finished\n");
    let long = get(&long["id"]).await;
    assert_eq!(long["status"], "cancelled", "{long}");
    assert_eq!(long["error"]["kind"], "shutting_down");
    let queued = get(&queued["id"]).await;
    assert_eq!(queued["status"], "cancelled", "{queued}");
    assert_eq!(queued["error"]["kind"], "shutting_down");
}

/// SIGTERM while one waited run is on its request's thread and another was handed over
/// after its caller's wait: the first finishes within the grace and its caller gets it; the
/// second is cancelled after the grace; both are recorded.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_runs_on_request_threads_and_handed_over() {
    let mut daemon = TestDaemon::start(Options::default());
    let beta = daemon.client(&daemon.keys.beta);
    let handed = beta
        .post(
            "/v1/runs",
            json!({"command": ["/bin/sleep", "60"], "wait": 1}),
        )
        .await;
    assert_eq!(handed.status, 202, "{}", handed.text());
    let handed = handed.json()["id"].as_str().unwrap().to_string();
    let waiting = daemon.client(&daemon.keys.beta);
    let waited = tokio::spawn(async move {
        let body = json!({"command": ["/bin/sh", "-c", "sleep 1; echo finished"], "wait": 30});
        waiting.post("/v1/runs", body).await
    });
    for _ in 0..400 {
        let running = beta.get("/v1/runs?status=running").await.json();
        if running["runs"].as_array().map_or(0, Vec::len) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pid = rustix::process::Pid::from_raw(daemon.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(20), waited)
        .await
        .expect("the waiting request is answered while draining")
        .unwrap();
    assert_eq!(waited.status, 200, "{}", waited.text());
    assert_eq!(waited.json()["result"]["stdout"], "finished\n");
    let status = daemon.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        daemon.log()
    );
    daemon.spawn();
    let run = daemon
        .client(&daemon.keys.beta)
        .get(&format!("/v1/runs/{handed}"))
        .await
        .json();
    assert_eq!(run["status"], "cancelled", "{run}");
    assert_eq!(run["error"]["kind"], "shutting_down", "{run}");
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_stalled_clients_are_bounded() {
    let daemon = TestDaemon::start(Options::default());
    // A client that never finishes its request headers is dropped (header timeout 10 s).
    let mut slow = tokio::net::UnixStream::connect(&daemon.socket)
        .await
        .unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // A client that asks for a large stream and never reads it is dropped (stall 5 s) while
    // the run itself completes and other clients are served.
    let client = daemon.client(&daemon.keys.beta);
    let flood = client
        .post(
            "/v1/runs",
            json!({"command": ["/bin/sh", "-c", "head -c 900000 /dev/zero | tr '\\0' x"]}),
        )
        .await
        .json();
    let id = flood["id"].as_str().unwrap().to_string();
    let mut stalled = tokio::net::UnixStream::connect(&daemon.socket)
        .await
        .unwrap();
    let request = format!(
        "GET /v1/runs/{id}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        daemon.keys.beta
    );
    stalled.write_all(request.as_bytes()).await.unwrap();
    let run = client.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "exited");
    assert_eq!(client.get("/healthz").await.status, 200);
    let started = Instant::now();
    let mut sink = vec![0u8; 1 << 16];
    tokio::time::sleep(Duration::from_secs(12)).await;
    // Both were closed by the server: reading reaches EOF (after whatever was buffered).
    let mut total = 0usize;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut sink)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => total += n,
            Err(_) => panic!("the stalled stream was not closed (read {total} bytes)"),
        }
    }
    assert!(
        total < 900_000 * 2,
        "the server buffered the whole stream for a stalled client"
    );
    let closed = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut sink)).await;
    assert!(
        matches!(closed, Ok(Ok(_)) | Ok(Err(_))),
        "the slow client was not dropped"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

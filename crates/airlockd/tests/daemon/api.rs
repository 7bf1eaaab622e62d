//! Runs: create (sync, async, code), read, list (paged), stream events, cancel, idempotency,
//! errors, admission (429, 503 + Retry-After), health, metrics, capabilities, queue, audit.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::json;

use crate::common::{Options, TestDaemon};

#[tokio::test(flavor = "multi_thread")]
async fn a_run_returns_its_result_and_is_recorded_with_its_isolation() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let response = client
        .run(json!({"command": ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], "env": {"SECRET": "hunter2"}}))
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let run = response.json();
    assert_eq!(run["status"], "exited");
    assert_eq!(run["result"]["exit_code"], 3);
    // The answer tells the library's share of its time from the daemon's whole time.
    let timing = response.header("server-timing").expect("Server-Timing");
    let ms = |name: &str| -> f64 {
        let metric = timing
            .split(',')
            .find_map(|m| m.trim().strip_prefix(&format!("{name};dur="))?.parse().ok());
        metric.unwrap_or_else(|| panic!("no {name} in {timing:?}"))
    };
    assert!(ms("daemon") >= ms("sandbox"), "{timing:?}");
    assert_eq!(run["result"]["stdout"], "out\n");
    assert_eq!(run["result"]["stderr"], "err\n");
    assert_eq!(run["tenant"], "beta");
    let layers = run["result"]["isolation"].as_array().unwrap();
    assert!(layers.iter().any(|l| l == "seccomp"), "{layers:?}");
    assert_eq!(
        run["request"]["env"]["SECRET"], "<redacted>",
        "env values are not stored"
    );
    assert!(!response.text().contains("hunter2"));
    let again = client
        .get(&format!("/v1/runs/{}", run["id"].as_str().unwrap()))
        .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["result"], run["result"]);
    assert_eq!(
        again.json(),
        run,
        "the answer (from memory) is the stored record"
    );
}

/// A run's whole event stream (NDJSON, keep-alives left out), read to its end, and the
/// stream's headers.
async fn streamed_events(
    client: &crate::common::Client,
    id: &str,
) -> (hyper::HeaderMap, Vec<serde_json::Value>) {
    let stream = client
        .open(
            client
                .request("GET", &format!("/v1/runs/{id}/events"))
                .body(Full::default())
                .unwrap(),
        )
        .await;
    let headers = stream.headers().clone();
    let body = stream.into_body().collect().await.unwrap().to_bytes();
    let events = String::from_utf8_lossy(&body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["event"] != "keepalive")
        .collect();
    (headers, events)
}

/// The text of a stream's `stdout` events, in order.
fn stdout_of(events: &[serde_json::Value]) -> String {
    events
        .iter()
        .filter(|e| e["event"] == "stdout")
        .map(|e| e["text"].as_str().unwrap())
        .collect()
}

/// A run the init cannot set up carries the library's typed kind in the record's
/// `error.kind`, as a refusal carries its `ErrorKind`.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_error_names_the_librarys_kind() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let missing = client
        .run(json!({"command": ["/no/such/program"]}))
        .await
        .json();
    assert_eq!(missing["status"], "sandbox_error", "{missing}");
    assert_eq!(missing["error"]["kind"], "program_not_found", "{missing}");
    assert_eq!(missing["result"]["error_kind"], "program_not_found");
    // A refusal before anything started (the host network drops net_ns, which `untrusted`
    // requires, and degradation was not accepted): the library's not-started result.
    let refused = daemon
        .client(&daemon.keys.alpha)
        .run(json!({"command": ["/bin/true"], "policy": {"network": {"mode": "host"}}}))
        .await
        .json();
    assert_eq!(refused["status"], "sandbox_error", "{refused}");
    assert_eq!(refused["result"]["status"], "sandbox_error", "{refused}");
    assert_eq!(
        refused["result"]["error_kind"], refused["error"]["kind"],
        "{refused}"
    );
    assert!(refused["result"]["isolation"]
        .as_array()
        .is_some_and(Vec::is_empty));
}

#[tokio::test(flavor = "multi_thread")]
async fn code_runs_through_the_interpreter_registry() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let run = client
        .run(json!({"code": "print(6 * 7)", "language": "python"}))
        .await
        .json();
    assert_eq!(run["result"]["stdout"], "42\n", "{run}");
    let bad = client.run(json!({"code": "x", "language": "cobol"})).await;
    assert_eq!(bad.status, 422);
    assert_eq!(bad.kind(), "interpreter_unknown");
    let both = client
        .run(json!({"code": "x", "command": ["/bin/true"]}))
        .await;
    assert_eq!(both.status, 400);
    let files = client
        .run(json!({"command": ["/bin/cat", "data/in.txt"], "files": [{"path": "data/in.txt", "content": "from a file"}], "stdin": "ignored"}))
        .await
        .json();
    assert_eq!(files["result"]["stdout"], "from a file", "{files}");
    assert_eq!(
        files["request"]["files"][0].get("content"),
        None,
        "file contents are not stored"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_wait_a_run_is_accepted_then_streams_its_events() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let response = client
        .post("/v1/runs", json!({"command": ["/bin/sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.2; done"]}))
        .await;
    assert_eq!(response.status, 202, "{}", response.text());
    let id = response.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        response.header("location").unwrap(),
        format!("/v1/runs/{id}")
    );
    let (headers, events) = streamed_events(&client, &id).await;
    assert_eq!(headers["content-type"], "application/x-ndjson");
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"started"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"ended"));
    assert_eq!(stdout_of(&events), "line1\nline2\nline3\n");
    assert_eq!(events.last().unwrap()["run"]["status"], "exited");
    // After the end the same stream is served from the store, from any position, as SSE.
    let sse = client
        .send(
            client
                .request("GET", &format!("/v1/runs/{id}/events?from=1"))
                .header("accept", "text/event-stream")
                .body(Full::default())
                .unwrap(),
        )
        .await;
    assert_eq!(sse.header("content-type").unwrap(), "text/event-stream");
    assert!(
        sse.text().starts_with("id: 1\nevent: stdout\n"),
        "{}",
        sse.text()
    );
    assert!(sse.text().contains("event: ended"));
    let resumed = client
        .send(
            client
                .request("GET", &format!("/v1/runs/{id}/events?format=sse"))
                .header("last-event-id", "3")
                .body(Full::default())
                .unwrap(),
        )
        .await;
    assert!(resumed.text().starts_with("id: 4\n"), "{}", resumed.text());
    assert_eq!(
        client
            .get(&format!("/v1/runs/{id}/events?format=xml"))
            .await
            .status,
        400
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_disconnecting_stream_client_does_not_stop_the_run() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let id = client
        .post(
            "/v1/runs",
            json!({"command": ["/bin/sh", "-c", "sleep 1; echo done"]}),
        )
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut stream = client
        .open(
            client
                .request("GET", &format!("/v1/runs/{id}/events"))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .into_body();
    let _first = stream.frame().await;
    drop(stream);
    let run = client.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "exited");
    assert_eq!(run["result"]["stdout"], "done\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_stops_a_running_run_and_dequeues_a_queued_one() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.gamma);
    let long = json!({"command": ["/bin/sleep", "30"]});
    let first = client.post("/v1/runs", long.clone()).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // gamma's share is 1: the second waits in the queue.
    let second = client.post("/v1/runs", long).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_status(&client, &first, "running").await;
    assert_eq!(
        client.get(&format!("/v1/runs/{second}")).await.json()["status"],
        "queued"
    );
    let cancelled = client.delete(&format!("/v1/runs/{second}")).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text());
    assert_eq!(cancelled.json()["status"], "cancelled");
    let stopped = client.delete(&format!("/v1/runs/{first}")).await;
    let run = client.wait_terminal(&first, Duration::from_secs(30)).await;
    assert!(matches!(stopped.status, 200 | 202));
    assert_eq!(run["status"], "cancelled", "{run}");
    assert!(run["wall_ms"].as_i64().unwrap() < 20_000);
    // Cancelling a finished run returns it unchanged.
    assert_eq!(
        client.delete(&format!("/v1/runs/{first}")).await.json()["status"],
        "cancelled"
    );
}

/// A waited run whose limits end it within `wait` runs on its request's own thread; meanwhile
/// it is live like any other run: listed and read as running from another connection, and
/// cancelled from there, whereupon the waiting request answers with the cancelled record.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_waited_for_on_its_request_is_visible_and_cancellable_meanwhile() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let waiting = daemon.client(&daemon.keys.beta);
    // A wall-time limit of 20 s (plus the grace and a margin) fits in a wait of 60 s.
    let long = json!({"command": ["/bin/sleep", "30"], "wait": 60, "policy": {"limits": {"wall_time": "20s"}}});
    let waited = tokio::spawn(async move { waiting.run(long).await });
    let id = first_running(&client).await;
    assert_eq!(
        client.get(&format!("/v1/runs/{id}")).await.json()["status"],
        "running"
    );
    let stopped = client.delete(&format!("/v1/runs/{id}")).await;
    assert!(matches!(stopped.status, 200 | 202), "{}", stopped.text());
    let answer = tokio::time::timeout(Duration::from_secs(20), waited)
        .await
        .expect("the waiting request answers once the run is cancelled")
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let run = answer.json();
    assert_eq!(
        (run["id"].as_str(), &run["status"]),
        (Some(id.as_str()), &json!("cancelled")),
        "{run}"
    );
    assert!(run["wall_ms"].as_i64().unwrap() < 15_000, "{run}");
}

/// A waited run still going when its caller's wait ends (here `untrusted`'s 180 s wall time
/// do not fit in a 1 s wait) is handed over from the request's thread to one of its own: the
/// caller gets 202 with the run in flight before the run could have ended, and the run goes on
/// to its end, recorded, its events whole across the hand-over.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_outlasting_its_wait_is_answered_in_flight_and_goes_on_to_its_end() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let asked = std::time::Instant::now();
    let answer = client
        .run(json!({"command": ["/bin/sh", "-c", "echo before; sleep 4; echo after"], "wait": 1}))
        .await;
    let answered = asked.elapsed();
    assert_eq!(answer.status, 202, "{}", answer.text());
    assert!(
        answered < Duration::from_secs(4),
        "answered after {answered:?}"
    );
    let run = answer.json();
    assert_eq!(run["status"], "running", "{run}");
    let id = run["id"].as_str().unwrap().to_string();
    assert_eq!(answer.header("location").unwrap(), format!("/v1/runs/{id}"));
    let (_, events) = streamed_events(&client, &id).await;
    assert_eq!(stdout_of(&events), "before\nafter\n", "{events:?}");
    assert_eq!(events.first().unwrap()["event"], "started", "{events:?}");
    assert_eq!(
        events.last().unwrap()["run"]["status"],
        "exited",
        "{events:?}"
    );
    let run = client.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(run["status"], "exited", "{run}");
    assert_eq!(run["result"]["stdout"], "before\nafter\n", "{run}");
    // It ran on the request's thread until the wait ended, not on a thread of its own.
    let metrics = daemon
        .client(&daemon.keys.alpha)
        .get("/metrics")
        .await
        .text();
    assert!(
        metrics.contains("airlockd_runs_handed_over_total 1\n"),
        "{metrics}"
    );
}

/// A run handed over after its caller's wait is cancelled as any other.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_handed_over_after_its_wait_is_cancellable() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let answer = client
        .run(json!({"command": ["/bin/sleep", "30"], "wait": 1}))
        .await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    let id = answer.json()["id"].as_str().unwrap().to_string();
    let stopped = client.delete(&format!("/v1/runs/{id}")).await;
    assert!(matches!(stopped.status, 200 | 202), "{}", stopped.text());
    let run = client.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    assert!(run["wall_ms"].as_i64().unwrap() < 15_000, "{run}");
}

/// The id of the first run listed as running, polled for up to 20 s.
async fn first_running(client: &crate::common::Client) -> String {
    for _ in 0..400 {
        let page = client.get("/v1/runs?status=running").await.json();
        if let Some(id) = page["runs"][0]["id"].as_str() {
            return id.to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no run became running");
}

pub async fn wait_status(client: &crate::common::Client, id: &str, status: &str) {
    for _ in 0..400 {
        if client.get(&format!("/v1/runs/{id}")).await.json()["status"] == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {id} never became {status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_is_paged_filtered_and_limited_to_the_tenant() {
    let daemon = TestDaemon::start(Options::default());
    let beta = daemon.client(&daemon.keys.beta);
    for i in 0..5 {
        assert_eq!(
            beta.run(json!({"command": ["/bin/echo", i.to_string()]}))
                .await
                .status,
            200
        );
    }
    daemon
        .client(&daemon.keys.gamma)
        .run(json!({"command": ["/bin/true"]}))
        .await;
    let first = beta.get("/v1/runs?limit=3").await.json();
    assert_eq!(first["runs"].as_array().unwrap().len(), 3);
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = beta
        .get(&format!("/v1/runs?limit=3&cursor={cursor}"))
        .await
        .json();
    assert_eq!(second["runs"].as_array().unwrap().len(), 2);
    assert!(second["next_cursor"].is_null());
    let all: Vec<_> = first["runs"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["runs"].as_array().unwrap())
        .collect();
    assert!(all.iter().all(|r| r["tenant"] == "beta"));
    assert_eq!(
        beta.get("/v1/runs?status=exited&since=0").await.json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert_eq!(
        beta.get("/v1/runs?status=lost").await.json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    assert_eq!(beta.get("/v1/runs?since=yesterday").await.status, 400);
    assert_eq!(beta.get("/v1/runs?tenant=gamma").await.status, 403);
    let admin = daemon.client(&daemon.keys.alpha);
    assert_eq!(
        admin.get("/v1/runs?tenant=gamma").await.json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        admin.get("/v1/runs").await.json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotency_key_returns_the_same_run_and_refuses_a_different_body() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let send = |body: serde_json::Value| {
        let client = client.clone();
        async move {
            let request = client
                .request("POST", "/v1/runs")
                .header("content-type", "application/json")
                .header("idempotency-key", "job-42")
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap();
            client.send(request).await
        }
    };
    let body = json!({"command": ["/bin/echo", "once"], "wait": 30});
    let first = send(body.clone()).await;
    let second = send(body).await;
    assert_eq!(first.status, 200);
    assert_eq!(second.status, 200);
    assert_eq!(first.json()["id"], second.json()["id"]);
    let other = send(json!({"command": ["/bin/echo", "twice"]})).await;
    assert_eq!(other.status, 409);
    assert_eq!(other.kind(), "idempotency_key_reused");
    // Another tenant's identical key is its own.
    let gamma = daemon.client(&daemon.keys.gamma);
    let request = gamma
        .request("POST", "/v1/runs")
        .header("content-type", "application/json")
        .header("idempotency-key", "job-42")
        .body(Full::new(Bytes::from(
            json!({"command": ["/bin/true"], "wait": 30}).to_string(),
        )))
        .unwrap();
    assert_ne!(gamma.send(request).await.json()["id"], first.json()["id"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_error_has_the_one_shape() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let cases = [
        (client.get("/v1/nothing").await, 404, "not_found"),
        (client.get("/v1/runs/run_missing").await, 404, "not_found"),
        (client.put("/v1/runs", "x").await, 405, "method_not_allowed"),
        (daemon.anonymous().get("/v1/runs").await, 401, "unauthorized"),
        (daemon.client("alk_wrong").get("/v1/runs").await, 401, "unauthorized"),
        (client.post("/v1/runs", json!({"command": ["x"], "bogus": 1})).await, 422, "invalid_request"),
        (client.post("/v1/runs", json!({})).await, 400, "bad_request"),
        (client.post("/v1/runs", json!({"command": []})).await, 400, "bad_request"),
        (client.post("/v1/runs", json!({"command": ["/bin/true"], "policy": {"limits": {"memory": "1MiB"}}})).await, 422, "invalid_policy"),
        // A number of seconds no Duration holds: the library's parser refuses it (it panicked).
        (client.post("/v1/runs", json!({"command": ["/bin/true"], "policy": {"limits": {"wall_time": 1e300}}})).await, 422, "invalid_request"),
        (client.post("/v1/runs", json!({"command": ["/bin/true"], "policy": {"network": {"mode": "allowlist", "allow": ["pypi.org"]}}})).await, 403, "ceiling"),
        (daemon.client(&daemon.keys.alpha).post("/v1/runs", json!({"command": ["/bin/true"], "policy": {"network": {"mode": "allowlist", "allow": ["pypi .org"]}}})).await, 422, "invalid_policy"),
        (client.get("/metrics").await, 403, "forbidden"),
    ];
    for (response, status, kind) in cases {
        assert_eq!(response.status, status, "{}", response.text());
        let error = &response.json()["error"];
        assert_eq!(error["kind"], kind, "{}", response.text());
        assert!(!error["message"].as_str().unwrap().is_empty());
        assert!(!error["fix"].as_str().unwrap().is_empty());
    }
    let syntax = client
        .send(
            client
                .request("POST", "/v1/runs")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from("{nope")))
                .unwrap(),
        )
        .await;
    assert_eq!(
        (syntax.status, syntax.kind().as_str()),
        (400, "bad_request")
    );
    let media = client
        .send(
            client
                .request("POST", "/v1/runs")
                .body(Full::new(Bytes::from("{}")))
                .unwrap(),
        )
        .await;
    assert_eq!(
        (media.status, media.kind().as_str()),
        (415, "unsupported_media_type")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_answers_429_and_a_queue_timeout_503_with_retry_after() {
    let pool = "[pool]\nmax_concurrent = 1\nmax_queued = 2\nqueue_timeout = \"1s\"".to_string();
    let daemon = TestDaemon::start(Options {
        pool: Some(pool),
        ..Options::default()
    });
    let client = daemon.client(&daemon.keys.beta);
    let long = json!({"command": ["/bin/sleep", "8"]});
    let holder = client.post("/v1/runs", long.clone()).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_status(&client, &holder, "running").await;
    let waiting1 = client.post("/v1/runs", long.clone()).await;
    let waiting2 = client.post("/v1/runs", long.clone()).await;
    assert_eq!((waiting1.status, waiting2.status), (202, 202));
    let refused = client.post("/v1/runs", long.clone()).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.kind(), "queue_full");
    assert!(
        refused
            .header("retry-after")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    // The queued ones time out after 1 s and end `rejected`.
    let id = waiting1.json()["id"].as_str().unwrap().to_string();
    let run = client.wait_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(run["status"], "rejected");
    assert_eq!(run["error"]["kind"], "busy");
    // A caller waiting for its run gets 503 with Retry-After.
    let busy = client
        .post("/v1/runs", json!({"command": ["/bin/true"], "wait": 5}))
        .await;
    assert_eq!(busy.status, 503, "{}", busy.text());
    assert_eq!(busy.kind(), "busy");
    assert!(busy.header("retry-after").is_some());
    client.delete(&format!("/v1/runs/{holder}")).await;
}

/// One pool holds every tenant's share and queue bound: gamma (share 1, at most 1 queued)
/// waits and then is refused 429 naming its own queue, while beta's run starts at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_at_its_share_queues_alone_and_its_own_queue_bound_holds() {
    let daemon = TestDaemon::start(Options {
        gamma: "max_queued = 1".into(),
        ..Options::default()
    });
    let gamma = daemon.client(&daemon.keys.gamma);
    let beta = daemon.client(&daemon.keys.beta);
    let long = json!({"command": ["/bin/sleep", "8"]});
    let holder = gamma.post("/v1/runs", long.clone()).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_status(&gamma, &holder, "running").await;
    let queued = gamma.post("/v1/runs", long.clone()).await;
    assert_eq!(queued.status, 202, "{}", queued.text());
    let refused = gamma.post("/v1/runs", long.clone()).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("for this tenant"),
        "{}",
        refused.text()
    );
    let other = beta
        .post("/v1/runs", json!({"command": ["/bin/true"], "wait": 20}))
        .await;
    assert_eq!(other.json()["status"], "exited", "{}", other.text());
    let queue = daemon
        .client(&daemon.keys.alpha)
        .get("/v1/queue")
        .await
        .json();
    assert_eq!(queue["queued_per_tenant"]["gamma"], 1, "{queue}");
    for id in [holder, queued.json()["id"].as_str().unwrap().to_string()] {
        gamma.delete(&format!("/v1/runs/{id}")).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn health_metrics_capabilities_queue_and_audit_answer() {
    let daemon = TestDaemon::start(Options::default());
    let anonymous = daemon.anonymous();
    let health = anonymous.get("/healthz").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");
    let beta = daemon.client(&daemon.keys.beta);
    beta.run(json!({"command": ["/bin/true"]})).await;
    let refused = beta
        .run(json!({"command": ["/bin/true"], "policy": {"limits": {"memory": "100GiB"}}}))
        .await;
    assert_eq!(refused.status, 403);
    let admin = daemon.client(&daemon.keys.alpha);
    let metrics = admin.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    for needle in [
        "airlockd_runs_total{status=\"exited\",backend=\"native\",tenant=\"beta\"} 1",
        "airlockd_denials_total{reason=\"ceiling\"}",
        "airlockd_queue_wait_seconds_bucket",
        "airlockd_run_duration_seconds_bucket",
        "airlockd_http_requests_total",
    ] {
        assert!(text.contains(needle), "metrics lack {needle}:\n{text}");
    }
    let caps = beta.get("/v1/capabilities").await.json();
    assert!(caps["host"]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["name"] == "native"));
    assert_eq!(caps["tenant"]["name"], "beta");
    assert!(
        caps["interpreters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i == "python3"),
        "{caps}"
    );
    let queue = beta.get("/v1/queue").await.json();
    assert_eq!(queue["max_concurrent"], 4);
    let audit = beta.get("/v1/audit").await.json();
    let kinds: Vec<&str> = audit["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"ceiling_refused") && kinds.contains(&"key_used"),
        "{kinds:?}"
    );
    assert!(audit["records"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["tenant"] == "beta"));
    let verify = admin.get("/v1/audit/verify").await.json();
    assert_eq!(verify["intact"], true, "{verify}");
    assert_eq!(beta.get("/v1/audit/verify").await.status, 403);
    let dashboard = anonymous.get("/dashboard").await;
    assert_eq!(dashboard.status, 200);
    assert!(dashboard.text().contains("Recent runs"));
}

/// A waited run's admission record commits while the library plans its sandbox, and the
/// library launches nothing before it has: when the store refuses the record (a trigger
/// added behind the daemon's back), the caller gets 503 `store_unavailable`, the program never
/// ran (its marker is not in the session's workspace), no record of it exists and nothing is
/// left behind; once the store takes records again, runs go on.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_record_the_store_refuses_never_starts() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let session = client.post("/v1/sessions", json!({})).await.json();
    let id = session["id"].as_str().unwrap().to_string();
    let store = rusqlite::Connection::open(daemon.state().join("airlockd.db")).unwrap();
    store
        .execute_batch(
            "CREATE TRIGGER refuse_runs BEFORE INSERT ON runs \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let runs = format!("/v1/sessions/{id}/runs");
    let marker = format!("/v1/sessions/{id}/files/marker");
    let write_marker = json!({"command": ["/bin/sh", "-c", "echo ran > marker"], "wait": 30});
    let refused = client.post(&runs, write_marker.clone()).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.kind(), "store_unavailable", "{}", refused.text());
    let plain = client
        .run(json!({"command": ["/bin/true"], "wait": 30}))
        .await;
    assert_eq!(plain.status, 503, "{}", plain.text());
    assert_eq!(
        client.get(&marker).await.status,
        404,
        "the program never ran"
    );
    let recorded: i64 = store
        .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(recorded, 0);
    assert!(daemon.leftover_run_dirs().is_empty());

    store.execute_batch("DROP TRIGGER refuse_runs").unwrap();
    let ran = client.post(&runs, write_marker).await;
    assert_eq!(ran.status, 200, "{}", ran.text());
    assert_eq!(ran.json()["status"], "exited", "{}", ran.text());
    assert_eq!(client.get(&marker).await.text(), "ran\n");
}

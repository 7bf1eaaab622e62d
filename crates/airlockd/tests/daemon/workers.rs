//! Workers (multipart inputs, progress events, outputs) and tool calls (typed errors).

use http_body_util::Full;
use hyper::body::Bytes;
use serde_json::json;

use crate::common::{Options, TestDaemon};

const WORKER: &str = r#"
import json, os, sys
job = os.environ["AIRLOCK_JOB_DIR"]
opts = json.load(open(os.path.join(job, "options.json")))
data = open(os.path.join(job, "in", "data.csv")).read()
print(json.dumps({"progress": 0.5, "message": "halfway"}), flush=True)
print("not an event", flush=True)
print(json.dumps({"log": "writing"}), flush=True)
with open(os.path.join(job, "out", "result.txt"), "w") as f:
    f.write(data.upper() * opts["times"])
os.symlink("/etc/passwd", os.path.join(job, "out", "escape"))
print(json.dumps({"progress": 1.0}), flush=True)
print(json.dumps({"done": True}), flush=True)
"#;

pub fn multipart(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "airlockd-test-boundary";
    let mut body = Vec::new();
    for (name, content) in parts {
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\n\r\n").as_bytes());
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_gets_its_inputs_reports_progress_and_its_outputs_come_back_safely() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let request = json!({"program": ["/usr/bin/python3", "in/worker.py"], "options": {"times": 2}, "wait": 60}).to_string();
    let (content_type, body) = multipart(&[
        ("request", request.as_bytes()),
        ("worker.py", WORKER.as_bytes()),
        ("data.csv", b"a,b\n"),
    ]);
    let post = client
        .request("POST", "/v1/workers")
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = client.send(post).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let run = response.json();
    assert_eq!(run["kind"], "worker");
    assert_eq!(run["status"], "exited", "{run}");
    assert_eq!(run["outputs"]["success"], true, "{run}");
    let ingest = &run["outputs"]["ingest"];
    assert_eq!(ingest["files"][0]["rel_path"], "result.txt");
    assert_eq!(ingest["skipped"][0]["reason"], "symlink");
    let id = run["id"].as_str().unwrap();
    let file = client
        .get(&format!("/v1/runs/{id}/outputs/result.txt"))
        .await;
    assert_eq!(file.text(), "A,B\nA,B\n");
    assert_eq!(
        client
            .get(&format!("/v1/runs/{id}/outputs/escape"))
            .await
            .status,
        404
    );
    assert_eq!(
        client.get(&format!("/v1/runs/{id}/outputs")).await.json()["entries"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let events = client.get(&format!("/v1/runs/{id}/events")).await.text();
    let kinds: Vec<String> = events
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        kinds.contains(&"progress".to_string()) && kinds.contains(&"log".to_string()),
        "{kinds:?}"
    );
    assert!(
        events.contains("halfway") && events.contains("not a worker event"),
        "{events}"
    );
    // Another tenant cannot download them.
    assert_eq!(
        daemon
            .client(&daemon.keys.gamma)
            .get(&format!("/v1/runs/{id}/outputs/result.txt"))
            .await
            .status,
        404
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_worker_forms_are_refused() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let send = |parts: Vec<(&'static str, Vec<u8>)>| {
        let client = client.clone();
        async move {
            let borrowed: Vec<(&str, &[u8])> =
                parts.iter().map(|(n, c)| (*n, c.as_slice())).collect();
            let (content_type, body) = multipart(&borrowed);
            let post = client
                .request("POST", "/v1/workers")
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            client.send(post).await
        }
    };
    assert_eq!(
        send(vec![("data.csv", b"x".to_vec())]).await.status,
        400,
        "no request part"
    );
    assert_eq!(send(vec![("request", b"{".to_vec())]).await.status, 422);
    let ok_request = json!({"program": ["/bin/true"]}).to_string().into_bytes();
    assert_eq!(
        send(vec![("request", ok_request.clone()), ("..", b"x".to_vec())])
            .await
            .status,
        400
    );
    assert_eq!(
        send(vec![("request", ok_request), ("big", vec![0u8; 2 << 20])])
            .await
            .status,
        413
    );
    assert!(
        std::fs::read_dir(daemon.state().join("uploads"))
            .unwrap()
            .next()
            .is_none(),
        "uploads were left behind"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_return_values_and_typed_errors() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let ok = client
        .post(
            "/v1/calls",
            json!({"toolset": "text", "target": "text:word_count", "args": {"text": "a b c"}}),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["ok"], true);
    assert_eq!(ok.json()["value"], 3);
    let raised = client
        .post(
            "/v1/calls",
            json!({"toolset": "text", "target": "text:boom"}),
        )
        .await
        .json();
    assert_eq!(raised["ok"], false);
    assert_eq!(raised["error"]["error"], "raised", "{raised}");
    let spin = client
        .post(
            "/v1/calls",
            json!({"toolset": "text", "target": "text:spin", "limits": {"wall_time": "1s"}}),
        )
        .await
        .json();
    assert_eq!(spin["error"]["error"], "timeout", "{spin}");
    let run = client
        .get(&format!("/v1/runs/{}", spin["run_id"].as_str().unwrap()))
        .await
        .json();
    assert_eq!(
        (run["kind"].as_str(), run["status"].as_str()),
        (Some("call"), Some("timeout"))
    );
    let missing = client
        .post(
            "/v1/calls",
            json!({"toolset": "text", "target": "text:nope"}),
        )
        .await
        .json();
    assert_eq!(missing["error"]["error"], "bad_tool");
    // A toolset the tenant may not use, and Tier 0 beyond the ceiling.
    let gamma = daemon.client(&daemon.keys.gamma);
    assert_eq!(
        gamma
            .post(
                "/v1/calls",
                json!({"toolset": "text", "target": "text:word_count"})
            )
            .await
            .status,
        403
    );
    let subprocess = client.post("/v1/calls", json!({"toolset": "text", "target": "text:word_count", "policy": "subprocess", "args": ["x"]})).await;
    assert_eq!(subprocess.status, 403, "{}", subprocess.text());
}

/// DELETE stops a running tool call (the library's call takes the run's cancel token): the
/// caller gets `cancelled` at once instead of after the call's 60 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_tool_call_is_cancelled() {
    let daemon = TestDaemon::start(Options::default());
    let client = daemon.client(&daemon.keys.beta);
    let caller = client.clone();
    let started = std::time::Instant::now();
    let call = tokio::spawn(async move {
        caller
            .post(
                "/v1/calls",
                json!({"toolset": "text", "target": "text:spin", "limits": {"wall_time": "60s"}}),
            )
            .await
            .json()
    });
    let mut running = None;
    for _ in 0..400 {
        let list = client.get("/v1/runs?status=running").await.json();
        running = list["runs"]
            .as_array()
            .and_then(|runs| runs.iter().find(|r| r["kind"] == "call"))
            .map(|r| r["id"].as_str().unwrap().to_string());
        if running.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let id = running.expect("the call is running");
    let cancelled = client.delete(&format!("/v1/runs/{id}")).await;
    assert!(cancelled.status < 300, "{}", cancelled.text());
    let answer = call.await.unwrap();
    assert_eq!(answer["error"]["error"], "cancelled", "{answer}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let run = client.get(&format!("/v1/runs/{id}")).await.json();
    assert_eq!(run["status"], "cancelled", "{run}");
}

//! The bounds of `/mcp`: MCP sessions per key, and the daemon sessions an MCP session made
//! ending with it (DELETE or idle expiry). Driven with raw JSON-RPC over the Unix socket (the
//! official SDK's end-to-end tests are in clients/python/tests/test_mcp_http.py).

use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use serde_json::{json, Value};

use crate::common::{Client, Options, Response, TestDaemon};

const PROTOCOL: &str = "2025-03-26";

async fn mcp_post(client: &Client, session: Option<&str>, message: Value) -> Response {
    let mut request = client
        .request("POST", "/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", PROTOCOL);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let body = Full::new(Bytes::from(message.to_string()));
    client.send(request.body(body).unwrap()).await
}

/// The JSON-RPC message of an answer sent as SSE (or as JSON).
fn answer(response: &Response) -> Value {
    let text = response.text();
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("jsonrpc").is_some())
        .or_else(|| serde_json::from_str(&text).ok())
        .unwrap_or_else(|| panic!("no JSON-RPC answer: {} {text}", response.status))
}

/// `initialize` and `notifications/initialized`: the new MCP session's id, or the refusal.
async fn open_mcp(client: &Client) -> Result<String, Response> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {},
        "clientInfo": {"name": "airlockd-test", "version": "1"}}});
    let response = mcp_post(client, None, init).await;
    if response.status != 200 {
        return Err(response);
    }
    let id = response
        .header("mcp-session-id")
        .expect("an Mcp-Session-Id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let accepted = mcp_post(client, Some(&id), initialized).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    Ok(id)
}

async fn close_mcp(client: &Client, session: &str) -> u16 {
    let request = client
        .request("DELETE", "/mcp")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", PROTOCOL)
        .body(Full::default())
        .unwrap();
    client.send(request).await.status
}

/// `session_create` in the MCP session: the daemon session's id.
async fn create_session(client: &Client, mcp: &str) -> String {
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "session_create", "arguments": {}}});
    let response = mcp_post(client, Some(mcp), call).await;
    let message = answer(&response);
    let id = message["result"]["structuredContent"]["session"]["session_id"].as_str();
    id.unwrap_or_else(|| panic!("no session id: {message}"))
        .to_string()
}

async fn session_status(client: &Client, id: &str) -> String {
    let row = client.get(&format!("/v1/sessions/{id}")).await.json();
    row["status"].as_str().unwrap_or_default().to_string()
}

/// Polls until the session is no longer active (at most `timeout`): its status.
async fn ended_status(client: &Client, id: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let status = session_status(client, id).await;
        if status != "active" || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_holds_at_most_its_mcp_sessions() {
    let daemon = TestDaemon::start(Options {
        extra: "[mcp]\nmax_sessions_per_key = 2".into(),
        ..Options::default()
    });
    let beta = daemon.client(&daemon.keys.beta);
    let first = open_mcp(&beta).await.expect("the first MCP session");
    let _second = open_mcp(&beta).await.expect("the second MCP session");
    let refused = open_mcp(&beta)
        .await
        .expect_err("a third is beyond the cap");
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.kind(), "mcp_sessions");
    let error = refused.json();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("beta-ci"),
        "{error}"
    );
    assert!(error["error"]["fix"].as_str().unwrap().contains("DELETE"));
    // Another key has its own count.
    let gamma = daemon.client(&daemon.keys.gamma);
    open_mcp(&gamma).await.expect("gamma's own MCP session");
    // Ending one makes room again.
    assert_eq!(close_mcp(&beta, &first).await, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    let reopened = loop {
        match open_mcp(&beta).await {
            Ok(id) => break id,
            Err(r) if r.status == 429 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(r) => panic!("no room after a DELETE: {} {}", r.status, r.text()),
        }
    };
    assert_ne!(reopened, first);
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_an_mcp_session_made_end_with_its_delete() {
    let daemon = TestDaemon::start(Options::default());
    let beta = daemon.client(&daemon.keys.beta);
    let mcp = open_mcp(&beta).await.unwrap();
    let made = create_session(&beta, &mcp).await;
    let kept = create_session(&beta, &mcp).await;
    // One it closed itself, one made through the API by the same key: neither is touched.
    let closing = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "session_close", "arguments": {"session_id": kept}}});
    let closed = answer(&mcp_post(&beta, Some(&mcp), closing).await);
    assert_eq!(closed["result"]["isError"], false, "{closed}");
    let rest = beta.post("/v1/sessions", json!({})).await.json();
    let rest = rest["id"].as_str().unwrap().to_string();
    beta.put(&format!("/v1/sessions/{made}/files/x"), "x").await;
    assert_eq!(session_status(&beta, &made).await, "active");

    assert_eq!(close_mcp(&beta, &mcp).await, 200);
    let status = ended_status(&beta, &made, Duration::from_secs(10)).await;
    assert_eq!(status, "deleted");
    let row = beta.get(&format!("/v1/sessions/{made}")).await.json();
    assert!(
        row["end_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("MCP"),
        "{row}"
    );
    assert!(!daemon.state().join("sessions").join(&made).exists());
    assert_eq!(session_status(&beta, &rest).await, "active");
    // The MCP session is gone too.
    let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"});
    assert_eq!(mcp_post(&beta, Some(&mcp), call).await.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_mcp_session_ends_with_its_sessions_and_frees_its_place() {
    let daemon = TestDaemon::start(Options {
        extra: "[mcp]\nmax_sessions_per_key = 1\nsession_idle_timeout = \"2s\"".into(),
        ..Options::default()
    });
    let beta = daemon.client(&daemon.keys.beta);
    let mcp = open_mcp(&beta).await.unwrap();
    let made = create_session(&beta, &mcp).await;
    assert_eq!(open_mcp(&beta).await.unwrap_err().status, 429);
    let status = ended_status(&beta, &made, Duration::from_secs(20)).await;
    assert_eq!(status, "deleted");
    let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"});
    assert_eq!(mcp_post(&beta, Some(&mcp), call).await.status, 404);
    open_mcp(&beta)
        .await
        .expect("room again once the idle MCP session ended");
}

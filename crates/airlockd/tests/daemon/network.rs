//! The network through the daemon: a request's mode and allow/deny rules reach the egress
//! gate, bounded by the tenant's ceiling; the record carries the gate's report and the stream
//! its decisions. The daemon runs inside an `airlock-testworld` world (its gate namespace,
//! entered with `nsenter --net`): the hosts live on the documentation ranges behind a veth,
//! the world's DNS server is the gate's resolver, and nothing touches the root namespace.

use serde_json::{json, Value};

use crate::common::{Options, TestDaemon};

/// Tenant `delta`: the untrusted profile with the world's resolver; its ceiling allows the
/// gate, names under `.test` and the world's HTTP range (its hosts are non-public addresses,
/// reachable only where a range rule lists them, as a company network would be).
fn delta_tenant(root: &std::path::Path, key_hash: &str) -> String {
    let profile = root.join("gated.toml");
    std::fs::write(
        &profile,
        format!(
            "extends = \"untrusted\"\n[network]\nresolver = \"{}\"\n",
            airlock_testworld::RESOLVER
        ),
    )
    .unwrap();
    format!(
        r#"[[tenants]]
name = "delta"
keys = [{{ name = "delta-ci", hash = "{key_hash}" }}]
profile = "{profile}"
toolsets = ["text"]
[tenants.ceiling]
network = "allowlist"
allowlist = ["**.test", "192.0.2.0/24:80"]
"#,
        profile = profile.display()
    )
}

const CLIENT: &str = r#"
import socket, urllib.request
print(urllib.request.urlopen("http://allowed.test/", timeout=10).read().decode().strip())
for name in ("other.test", "denied.test"):
    try:
        socket.getaddrinfo(name, 80)
        print(name, "resolved")
    except socket.gaierror:
        print(name, "no-address")
"#;

/// The run of CLIENT, which must have reached allowed.test and no other name.
fn client_ran(daemon: &TestDaemon, response: crate::common::Response) -> Value {
    assert_eq!(response.status, 200, "{}", response.text());
    let run = response.json();
    assert_eq!(run["status"], "exited", "{run:#}\n{}", daemon.log());
    assert_eq!(
        run["result"]["stdout"],
        "host=allowed.test\nother.test no-address\ndenied.test no-address\n",
        "{run:#}"
    );
    run
}

fn decisions<'a>(network: &'a Value, decision: &str, name: &str) -> Vec<&'a Value> {
    network["decisions"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|d| d["decision"] == decision && d["name"] == name)
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_name_is_reached_and_the_others_refused_with_the_decisions_recorded() {
    let Some((world, daemon, key, _profile)) = gated_daemon() else {
        return;
    };
    let client = daemon.client(&key);
    let response = client
        .run(json!({
            "command": [airlock_testworld::PYTHON, "-c", CLIENT],
            "wait": 60,
            "policy": {"network": {
                "mode": "allowlist",
                "allow": ["allowed.test", "192.0.2.0/24:80"],
                "deny": ["denied.test"],
            }},
        }))
        .await;
    let run = client_ran(&daemon, response);
    let seen = world.seen.hosts.lock().unwrap().clone();
    assert_eq!(
        seen,
        ["allowed.test"],
        "only the allowed name reached a host"
    );
    let layers = run["result"]["isolation"].as_array().unwrap();
    assert!(layers.iter().any(|l| l == "egress_gate"), "{layers:?}");
    let network = &run["network"];
    assert_eq!(network["mode"], "allowlist", "{run:#}");
    assert!(!decisions(network, "allow", "allowed.test").is_empty());
    let other = decisions(network, "deny", "other.test");
    assert!(
        other.iter().any(|d| d["reason"] == "not_allowed"),
        "{network:#}"
    );
    // The gate answers a deny-ruled name's DNS query as it does an unlisted one's.
    assert!(
        !decisions(network, "deny", "denied.test").is_empty(),
        "{network:#}"
    );

    // The stored record, its events and the metrics say the same.
    let id = run["id"].as_str().unwrap();
    let stored = client.get(&format!("/v1/runs/{id}")).await.json();
    assert_eq!(stored["network"], run["network"]);
    let events: Vec<Value> = client
        .get(&format!("/v1/runs/{id}/events"))
        .await
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let streamed: Vec<&Value> = events.iter().filter(|e| e["event"] == "network").collect();
    assert!(
        streamed
            .iter()
            .any(|e| e["decision"]["name"] == "other.test" && e["decision"]["decision"] == "deny"),
        "{events:#?}"
    );
    assert_eq!(events[0]["event"], "started", "started leads: {events:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_network_beyond_the_ceiling_is_refused_by_name_never_dropped() {
    let key = airlockd::auth::new_key();
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start(Options {
        extra: delta_tenant(dir.path(), &airlockd::auth::hash_line(&key)),
        ..Options::default()
    });
    let delta = daemon.client(&key);
    let beta = daemon.client(&daemon.keys.beta);
    let refused = [
        // beta's ceiling is `none`.
        (
            beta.run(json!({"command": ["/bin/true"], "policy": {"network": {"allow": ["allowed.test"]}}}))
                .await,
            "network.mode = allowlist",
        ),
        (
            delta
                .run(json!({"command": ["/bin/true"], "policy": {"network": {"mode": "report"}}}))
                .await,
            "network.mode = report",
        ),
        (
            delta
                .run(json!({"command": ["/bin/true"], "policy": {"network": {"allow": ["evil.example"]}}}))
                .await,
            "network.allow = evil.example",
        ),
        (
            delta
                .run(json!({"command": ["/bin/true"], "policy": {"network": {"allow": ["tcp://allowed.test:22"]}}}))
                .await,
            "network.allow = tcp://allowed.test:22",
        ),
        (
            delta
                .run(json!({"command": ["/bin/true"], "policy": {"network": {"allow": ["10.0.0.0/8"]}}}))
                .await,
            "network.allow = 10.0.0.0/8",
        ),
    ];
    for (response, named) in refused {
        assert_eq!(response.status, 403, "{}", response.text());
        let error = &response.json()["error"];
        assert_eq!(error["kind"], "ceiling", "{error}");
        assert!(
            error["message"].as_str().unwrap().contains(named),
            "{named}: {error}"
        );
    }
    let malformed = delta
        .run(json!({"command": ["/bin/true"], "policy": {"network": {"allow": ["exa mple.test"]}}}))
        .await;
    assert_eq!(malformed.status, 422, "{}", malformed.text());
    assert_eq!(malformed.json()["error"]["kind"], "invalid_policy");
    assert!(
        malformed.text().contains("network.allow"),
        "{}",
        malformed.text()
    );
}

/// A daemon inside a fresh test world, with tenant delta's key (and the directory holding
/// delta's profile).
type Gated = (
    airlock_testworld::World,
    TestDaemon,
    String,
    tempfile::TempDir,
);

fn gated_daemon() -> Option<Gated> {
    if let Some(reason) = airlock_testworld::skip_reason() {
        eprintln!("{reason}");
        return None;
    }
    let world = airlock_testworld::World::new();
    let key = airlockd::auth::new_key();
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = TestDaemon::start(Options {
        extra: delta_tenant(dir.path(), &airlockd::auth::hash_line(&key)),
        netns: Some(world.gate_ns.clone()),
        ..Options::default()
    });
    Some((world, daemon, key, dir))
}

/// The network every test below asks for: one allowed name, one denied.
fn gated_network() -> Value {
    json!({"mode": "allowlist", "allow": ["allowed.test", "192.0.2.0/24:80"], "deny": ["denied.test"]})
}

/// Only `allowed.test` reached a host, and the record holds the gate's decisions: the
/// allowed name allowed, the unlisted one denied as `not_allowed`.
fn assert_gated(world: &airlock_testworld::World, run: &Value) {
    let seen = world.seen.hosts.lock().unwrap().clone();
    assert_eq!(
        seen,
        ["allowed.test"],
        "only the allowed name reached a host"
    );
    let network = &run["network"];
    assert_eq!(network["mode"], "allowlist", "{run:#}");
    assert!(
        !decisions(network, "allow", "allowed.test").is_empty(),
        "{network:#}"
    );
    let other = decisions(network, "deny", "other.test");
    assert!(
        other.iter().any(|d| d["reason"] == "not_allowed"),
        "{network:#}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_run_reaches_only_its_allowed_names() {
    let Some((world, daemon, key, _profile)) = gated_daemon() else {
        return;
    };
    let client = daemon.client(&key);
    let session = client.post("/v1/sessions", json!({})).await;
    assert_eq!(session.status, 201, "{}", session.text());
    let id = session.json()["id"].as_str().unwrap().to_string();
    let response = client
        .post(
            &format!("/v1/sessions/{id}/runs"),
            json!({
                "command": [airlock_testworld::PYTHON, "-c", CLIENT],
                "wait": 60,
                "policy": {"network": gated_network()},
            }),
        )
        .await;
    let run = client_ran(&daemon, response);
    assert_gated(&world, &run);
    let stored = client
        .get(&format!("/v1/runs/{}", run["id"].as_str().unwrap()))
        .await
        .json();
    assert_eq!(stored["network"], run["network"]);
}

const NET_WORKER: &str = r#"
import json, os, socket, urllib.request
job = os.environ["AIRLOCK_JOB_DIR"]
lines = [urllib.request.urlopen("http://allowed.test/", timeout=10).read().decode().strip()]
try:
    socket.getaddrinfo("other.test", 80)
    lines.append("other.test resolved")
except socket.gaierror:
    lines.append("other.test no-address")
with open(os.path.join(job, "out", "seen.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
print(json.dumps({"done": True}), flush=True)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_reaches_only_its_allowed_names() {
    let Some((world, daemon, key, _profile)) = gated_daemon() else {
        return;
    };
    let client = daemon.client(&key);
    let request = json!({
        "program": [airlock_testworld::PYTHON, "in/worker.py"],
        "wait": 60,
        "policy": {"network": gated_network()},
    })
    .to_string();
    let (content_type, body) = crate::workers::multipart(&[
        ("request", request.as_bytes()),
        ("worker.py", NET_WORKER.as_bytes()),
    ]);
    let post = client
        .request("POST", "/v1/workers")
        .header("content-type", content_type)
        .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
        .unwrap();
    let response = client.send(post).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let run = response.json();
    assert_eq!(run["status"], "exited", "{run:#}\n{}", daemon.log());
    let id = run["id"].as_str().unwrap();
    let seen = client.get(&format!("/v1/runs/{id}/outputs/seen.txt")).await;
    assert_eq!(
        seen.text(),
        "host=allowed.test\nother.test no-address\n",
        "{run:#}"
    );
    assert_gated(&world, &run);
}

const NET_TOOL: &str = r#"
import socket, urllib.request

def fetch(url):
    return urllib.request.urlopen(url, timeout=10).read().decode().strip()

def resolves(name):
    try:
        socket.getaddrinfo(name, 80)
        return True
    except socket.gaierror:
        return False
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_reaches_only_its_allowed_names() {
    let Some((world, daemon, key, _profile)) = gated_daemon() else {
        return;
    };
    let tools = daemon.state().parent().unwrap().join("tools");
    std::fs::write(tools.join("net.py"), NET_TOOL).unwrap();
    let client = daemon.client(&key);
    let call = |target: &str, args: Value| {
        let client = client.clone();
        let body =
            json!({"toolset": "text", "target": target, "args": args, "network": gated_network()});
        async move { client.post("/v1/calls", body).await }
    };
    let fetched = call("net:fetch", json!(["http://allowed.test/"])).await;
    assert_eq!(fetched.status, 200, "{}", fetched.text());
    let fetched = fetched.json();
    assert_eq!(
        fetched["value"],
        "host=allowed.test",
        "{fetched:#}\n{}",
        daemon.log()
    );
    let resolved = call("net:resolves", json!(["other.test"])).await.json();
    assert_eq!(resolved["value"], false, "{resolved:#}");

    // The calls' run records hold the gate's decisions.
    let record = |response: &Value| {
        let client = client.clone();
        let id = response["run_id"].as_str().unwrap().to_string();
        async move { client.get(&format!("/v1/runs/{id}")).await.json() }
    };
    let (first, second) = (record(&fetched).await, record(&resolved).await);
    let mut network = first["network"].clone();
    let more = second["network"]["decisions"].as_array().unwrap().clone();
    network["decisions"].as_array_mut().unwrap().extend(more);
    assert_gated(&world, &json!({"network": network}));

    // Without network settings a call gets none, and beyond the ceiling it is refused.
    let unset = client
        .post(
            "/v1/calls",
            json!({"toolset": "text", "target": "net:resolves", "args": ["allowed.test"]}),
        )
        .await
        .json();
    assert_eq!(unset["value"], false, "{unset:#}");
    let beyond = client
        .post("/v1/calls", json!({"toolset": "text", "target": "net:fetch", "args": ["http://evil.example/"], "network": {"allow": ["evil.example"]}}))
        .await;
    assert_eq!(beyond.status, 403, "{}", beyond.text());
    assert!(
        beyond.text().contains("network.allow = evil.example"),
        "{}",
        beyond.text()
    );
}

//! Attacks on the API: other tenants' runs and sessions, traversal and link tricks in
//! session files (including a program swapping the tree during reads), oversized bodies,
//! requests beyond the ceiling, and the audit log's append-only guarantee.

use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use serde_json::json;

use crate::common::{Options, TestDaemon};

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cannot_see_cancel_or_read_another_tenants_runs_and_sessions() {
    let daemon = TestDaemon::start(Options::default());
    let beta = daemon.client(&daemon.keys.beta);
    let gamma = daemon.client(&daemon.keys.gamma);
    let run = beta
        .post("/v1/runs", json!({"command": ["/bin/sleep", "20"]}))
        .await
        .json();
    let run_id = run["id"].as_str().unwrap();
    let session = beta.post("/v1/sessions", json!({})).await.json();
    let sid = session["id"].as_str().unwrap();
    beta.put(
        &format!("/v1/sessions/{sid}/files/secret.txt"),
        "beta's secret",
    )
    .await;
    let attempts = [
        gamma.get(&format!("/v1/runs/{run_id}")).await,
        gamma.get(&format!("/v1/runs/{run_id}/events")).await,
        gamma.delete(&format!("/v1/runs/{run_id}")).await,
        gamma.get(&format!("/v1/runs/{run_id}/outputs")).await,
        gamma.get(&format!("/v1/sessions/{sid}")).await,
        gamma.get(&format!("/v1/sessions/{sid}/files")).await,
        gamma
            .get(&format!("/v1/sessions/{sid}/files/secret.txt"))
            .await,
        gamma
            .put(&format!("/v1/sessions/{sid}/files/planted"), "x")
            .await,
        gamma
            .delete(&format!("/v1/sessions/{sid}/files/secret.txt"))
            .await,
        gamma
            .post(
                &format!("/v1/sessions/{sid}/runs"),
                json!({"command": ["/bin/cat", "secret.txt"], "wait": 10}),
            )
            .await,
        gamma.delete(&format!("/v1/sessions/{sid}")).await,
    ];
    for response in attempts {
        assert_eq!(response.status, 404, "{}", response.text());
        assert!(!response.text().contains("beta's secret"));
    }
    assert!(gamma.get("/v1/runs").await.json()["runs"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(gamma.get("/v1/sessions").await.json()["sessions"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(gamma.get("/v1/runs?tenant=beta").await.status, 403);
    // Nothing changed for beta.
    assert_eq!(
        beta.get(&format!("/v1/runs/{run_id}")).await.json()["status"],
        "running"
    );
    assert_eq!(
        beta.get(&format!("/v1/sessions/{sid}/files/secret.txt"))
            .await
            .text(),
        "beta's secret"
    );
    assert_eq!(
        beta.get(&format!("/v1/sessions/{sid}/files/planted"))
            .await
            .status,
        404
    );
    // The admin tenant may cancel it.
    let admin = daemon.client(&daemon.keys.alpha);
    admin.delete(&format!("/v1/runs/{run_id}")).await;
    let ended = beta.wait_terminal(run_id, Duration::from_secs(20)).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
}

#[tokio::test(flavor = "multi_thread")]
async fn session_files_never_follow_links_or_dot_dot_out_of_the_workspace() {
    let daemon = TestDaemon::start(Options::default());
    let canary = daemon.dir.path().join("canary.txt");
    std::fs::write(&canary, "host canary").unwrap();
    let client = daemon.client(&daemon.keys.beta);
    let sid = client.post("/v1/sessions", json!({})).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let files = format!("/v1/sessions/{sid}/files");
    // The program plants every kind of link it can; the workspace is in its sandbox at the
    // same path as on the host, so absolute symlinks point at real host paths.
    let plant = format!(
        "ln -s {c} link; ln -s / rootlink; ln -s .. up; mkdir d; ln -s {c} d/deep; ln {c} hard 2>/dev/null; mkfifo fifo; echo planted",
        c = canary.display()
    );
    let run = client
        .post(
            &format!("/v1/sessions/{sid}/runs"),
            json!({"command": ["/bin/sh", "-c", plant], "wait": 30}),
        )
        .await
        .json();
    assert_eq!(run["result"]["stdout"], "planted\n", "{run}");
    for (path, status) in [
        ("link", 403),
        ("rootlink/etc/passwd", 403),
        ("up/canary.txt", 403),
        ("d/deep", 403),
        ("fifo", 409),
        ("../canary.txt", 400),
        ("d/../../canary.txt", 400),
        ("%2e%2e/canary.txt", 400),
        ("./link", 400),
        ("a//b", 400),
    ] {
        let response = client.get(&format!("{files}/{path}")).await;
        assert_eq!(response.status, status, "{path}: {}", response.text());
        assert!(
            !response.text().contains("host canary"),
            "{path} leaked the canary"
        );
    }
    // A hardlink cannot cross into the workspace's own tmpfs (as root); without root it can,
    // and the file is refused for having two links.
    for (path, status) in [("hard", if crate::common::is_root() { 404 } else { 403 })] {
        let response = client.get(&format!("{files}/{path}")).await;
        assert_eq!(response.status, status, "{path}: {}", response.text());
        assert!(
            !response.text().contains("host canary"),
            "{path} leaked the canary"
        );
    }
    // Writes through links are refused; a write over a link replaces the link, not its target.
    assert_eq!(
        client
            .put(&format!("{files}/rootlink/tmp/x"), "x")
            .await
            .status,
        403
    );
    assert_eq!(
        client
            .put(&format!("{files}/link"), "replaced")
            .await
            .status,
        204
    );
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "host canary");
    assert_eq!(
        client.get(&format!("{files}/link")).await.text(),
        "replaced"
    );
    assert_eq!(
        client.delete(&format!("{files}/up")).await.status,
        204,
        "removing a link removes the link"
    );
    assert!(daemon.dir.path().join("canary.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_stay_safe_while_a_program_swaps_files_for_links() {
    let daemon = TestDaemon::start(Options::default());
    let canary = daemon.dir.path().join("canary.txt");
    std::fs::write(&canary, "host canary").unwrap();
    let client = daemon.client(&daemon.keys.beta);
    let sid = client.post("/v1/sessions", json!({})).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The program flips `f` (and a directory `d`) between real entries and links to the host
    // as fast as it can, for a bounded time.
    let flip = format!(
        "end=$(( $(date +%s) + 6 )); while [ $(date +%s) -lt $end ]; do \
         echo safe > f.tmp; mv -f f.tmp f; ln -sfn {c} f.lnk; mv -f f.lnk f; \
         rm -rf d; mkdir d; echo safe > d/x; rm -rf d; ln -sfn / d; done",
        c = canary.display()
    );
    let flipper = client
        .post(
            &format!("/v1/sessions/{sid}/runs"),
            json!({"command": ["/bin/sh", "-c", flip]}),
        )
        .await
        .json();
    let files = format!("/v1/sessions/{sid}/files");
    let (mut served, mut refused) = (0, 0);
    for _ in 0..300 {
        for path in ["f", "d/x", "d/etc/hostname"] {
            let response = client.get(&format!("{files}/{path}")).await;
            assert!(
                !response.text().contains("host canary"),
                "{path} leaked the canary"
            );
            match response.status {
                200 => {
                    // `d/x` may be caught between its creation and its write: empty, never foreign.
                    assert!(
                        response.text() == "safe\n"
                            || (path == "d/x" && response.text().is_empty()),
                        "{path}: {:?}",
                        response.text()
                    );
                    served += 1;
                }
                403 | 404 | 409 => refused += 1,
                other => panic!("{path}: unexpected {other}: {}", response.text()),
            }
        }
    }
    assert!(
        served > 0 && refused > 0,
        "the race was not exercised: served {served}, refused {refused}"
    );
    client
        .wait_terminal(flipper["id"].as_str().unwrap(), Duration::from_secs(30))
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_bodies_are_refused_with_413() {
    let options = Options {
        extra: String::new(),
        ..Options::default()
    };
    let daemon = TestDaemon::start(options);
    let client = daemon.client(&daemon.keys.beta);
    let huge = "x".repeat(65 << 20);
    let request = client
        .request("POST", "/v1/runs")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(
            "{{\"command\":[\"/bin/true\"],\"stdin\":\"{huge}\"}}"
        ))))
        .unwrap();
    let response = client.send_tolerant(request).await;
    assert_eq!(
        response.status,
        413,
        "{}",
        &response.text()[..response.text().len().min(300)]
    );
    assert_eq!(response.kind(), "too_large");
    let sid = client.post("/v1/sessions", json!({})).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let file = client
        .put_tolerant(&format!("/v1/sessions/{sid}/files/big"), vec![0u8; 2 << 20])
        .await;
    assert_eq!(file.status, 413);
    // The daemon still serves.
    assert_eq!(
        client.run(json!({"command": ["/bin/true"]})).await.status,
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_beyond_the_ceiling_are_refused_naming_the_key_and_the_ceiling() {
    let daemon = TestDaemon::start(Options::default());
    let gamma = daemon.client(&daemon.keys.gamma);
    let cases = [
        (
            json!({"policy": {"limits": {"memory": "1GiB"}}}),
            "limits.memory",
        ),
        (
            json!({"policy": {"limits": {"wall_time": "1h"}}}),
            "limits.wall_time",
        ),
        (
            json!({"policy": {"limits": {"processes": 100000}}}),
            "limits.processes",
        ),
        (
            json!({"policy": {"network": {"mode": "host"}}}),
            "network.mode",
        ),
        (json!({"policy": {"backend": "none"}}), "backend"),
        (
            json!({"policy": {"min_isolation": "process"}}),
            "min_isolation",
        ),
        (
            json!({"policy": {"allow_degraded": true}}),
            "allow_degraded",
        ),
        (json!({"profile": "trusted"}), "profile"),
        (json!({"priority": 99}), "priority"),
    ];
    for (mut body, key) in cases {
        body["command"] = json!(["/bin/true"]);
        let response = gamma.run(body.clone()).await;
        assert_eq!(response.status, 403, "{body}: {}", response.text());
        let message = response.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            message.contains("\"gamma-ci\"")
                && message.contains(key)
                && message.contains("ceiling"),
            "{message}"
        );
    }
    // Within the ceiling is fine, and so is a stronger isolation level.
    let ok = gamma
        .run(json!({"command": ["/bin/true"], "policy": {"limits": {"memory": "200MiB"}}}))
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    // The admin's ceiling allows Tier 0 and the host network; the run says so.
    let admin = daemon.client(&daemon.keys.alpha);
    let tier0 = admin
        .run(json!({"command": ["/bin/true"], "profile": "trusted"}))
        .await
        .json();
    assert_eq!(tier0["backend"], "none", "{tier0}");
    let audit = admin.get("/v1/audit?kind=ceiling_refused").await.json();
    assert!(audit["records"].as_array().unwrap().len() >= 9);
    let unisolated = admin.get("/v1/audit?kind=unisolated_run").await.json();
    assert_eq!(unisolated["records"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_log_cannot_be_altered_and_tampering_is_detected() {
    let daemon = TestDaemon::start(Options::default());
    let beta = daemon.client(&daemon.keys.beta);
    beta.run(json!({"command": ["/bin/true"], "policy": {"limits": {"memory": "100GiB"}}}))
        .await;
    let admin = daemon.client(&daemon.keys.alpha);
    assert_eq!(admin.get("/v1/audit/verify").await.json()["intact"], true);
    // No endpoint writes it.
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let request = admin
            .request(method, "/v1/audit")
            .body(Full::default())
            .unwrap();
        assert_eq!(admin.send(request).await.status, 405, "{method}");
    }
    // The database itself refuses updates and young deletes.
    let store = airlockd::store::Store::open(
        &format!("sqlite://{}/airlockd.db", daemon.state().display()),
        1,
    )
    .await
    .unwrap();
    let update = sqlx::query("UPDATE audit SET detail = '{}'")
        .execute(store_pool(&store))
        .await;
    assert!(update.unwrap_err().to_string().contains("append-only"));
    let delete = sqlx::query("DELETE FROM audit")
        .execute(store_pool(&store))
        .await;
    assert!(delete
        .unwrap_err()
        .to_string()
        .contains("younger than a day"));
    // Someone with the database file who drops the trigger and edits a record is caught.
    sqlx::raw_sql(
        "DROP TRIGGER audit_no_update; UPDATE audit SET detail = '{\"forged\":true}' WHERE id = 2",
    )
    .execute(store_pool(&store))
    .await
    .unwrap();
    let verify = admin.get("/v1/audit/verify").await.json();
    assert_eq!(verify["intact"], false);
    assert_eq!(verify["first_broken_id"], 2);
}

fn store_pool(store: &airlockd::store::Store) -> &sqlx::AnyPool {
    store.raw_pool()
}

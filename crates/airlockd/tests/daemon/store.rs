//! The store on PostgreSQL (same schema and migrations as SQLite), and several daemons
//! sharing one: a run's events, cancel and session files are served through any node.

use std::time::Duration;

use serde_json::json;

use crate::common::{postgres_database, Options, TestDaemon};

#[tokio::test(flavor = "multi_thread")]
async fn both_stores_migrate_to_the_same_schema_and_record_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}/s.db", dir.path().display());
    let mut urls = vec![sqlite];
    if let Some(pg) = postgres_database().await {
        urls.push(pg);
    }
    let mut schemas = Vec::new();
    for url in &urls {
        let store = airlockd::store::Store::open(url, 2).await.unwrap();
        // Opening again applies nothing twice.
        let again = airlockd::store::Store::open(url, 2).await.unwrap();
        again.close().await;
        let run = airlockd::store::NewRun {
            id: "run_1".into(),
            tenant: "t".into(),
            key_name: "k".into(),
            kind: "run".into(),
            session_id: None,
            node: "n".into(),
            priority: 0,
            idempotency_key: Some("i".into()),
            request_hash: Some("h".into()),
            request: json!({"command": ["x"]}).into(),
            profile: None,
            policy: None,
            created_ms: 1,
        };
        assert!(matches!(
            store.insert_run(&run).await.unwrap(),
            airlockd::store::Inserted::New
        ));
        let mut dup = run.clone();
        dup.id = "run_2".into();
        assert!(matches!(
            store.insert_run(&dup).await.unwrap(),
            airlockd::store::Inserted::Existing(_)
        ));
        // A run's end: its events in one statement, then its status; a retry stores nothing
        // twice, and the stored row is the one the engine answers from memory.
        let mut finished = run.clone();
        (finished.id, finished.idempotency_key, finished.created_ms) = ("run_3".into(), None, 100);
        store.insert_run(&finished).await.unwrap();
        let events: Vec<airlockd::store::StoredEvent> = (0..3)
            .map(|seq| airlockd::store::StoredEvent {
                seq,
                at_ms: 101,
                kind: "stdout".into(),
                data: json!({"text": seq.to_string()}),
            })
            .collect();
        let ending = airlockd::store::Ending {
            status: "exited".into(),
            backend: Some("native".into()),
            result: Some(json!({"exit_code": 0}).into()),
            wall_ms: Some(3),
            started_ms: Some(102),
            queue_ms: Some(1),
            ended_ms: 105,
            ..Default::default()
        };
        for _ in 0..2 {
            store.finish_run("run_3", &ending, &events).await.unwrap();
        }
        assert_eq!(
            store.run("run_3").await.unwrap(),
            Some(ending.clone().into_row(finished.clone()))
        );
        assert_eq!(store.events("run_3").await.unwrap(), events);
        // A stream too long for the run's row: a row per event, read back the same.
        let mut long = finished.clone();
        long.id = "run_4".into();
        store.insert_run(&long).await.unwrap();
        let chunk = "x".repeat(1024);
        let long_events: Vec<airlockd::store::StoredEvent> = (0..40)
            .map(|seq| airlockd::store::StoredEvent {
                seq,
                at_ms: 101,
                kind: "stdout".into(),
                data: json!({"text": chunk}),
            })
            .collect();
        store
            .finish_run("run_4", &ending, &long_events)
            .await
            .unwrap();
        assert_eq!(store.events("run_4").await.unwrap(), long_events);
        let stored_rows = |id: &'static str| {
            let pool = store.raw_pool().clone();
            async move {
                sqlx::query("SELECT COUNT(*) FROM run_events WHERE run_id = $1")
                    .bind(id)
                    .fetch_one(&pool)
                    .await
                    .map(|row| sqlx::Row::get::<i64, _>(&row, 0))
                    .unwrap()
            }
        };
        assert_eq!(
            stored_rows("run_3").await,
            0,
            "a short stream is in the run's row"
        );
        assert_eq!(stored_rows("run_4").await, 40);
        store.mark_running("run_1", 2, 1).await.unwrap();
        assert_eq!(
            store
                .mark_lost("n", &json!({"kind": "lost"}))
                .await
                .unwrap(),
            vec!["run_1".to_string()]
        );
        let entry = airlockd::store::AuditEntry {
            kind: "daemon_started",
            tenant: None,
            key_name: None,
            run_id: None,
            detail: json!({}),
        };
        store.append_audit("n", &entry).await.unwrap();
        store.append_audit("n", &entry).await.unwrap();
        assert!(store.verify_audit().await.unwrap().intact);
        assert!(sqlx::query("UPDATE audit SET kind = 'x'")
            .execute(store.raw_pool())
            .await
            .is_err());
        assert_eq!(
            store.prune_runs(10).await.unwrap(),
            vec!["run_1".to_string()]
        );
        schemas.push(columns(&store).await);
        store.close().await;
    }
    if schemas.len() == 2 {
        assert_eq!(
            schemas[0], schemas[1],
            "SQLite and PostgreSQL schemas differ"
        );
    }
}

async fn columns(store: &airlockd::store::Store) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for table in [
        "runs",
        "run_events",
        "run_network",
        "sessions",
        "audit",
        "nodes",
        "airlockd_migrations",
    ] {
        let sql = format!("SELECT * FROM {table} LIMIT 0");
        let described = sqlx::Executor::describe(store.raw_pool(), &sql)
            .await
            .unwrap();
        for column in described.columns() {
            out.push((table.to_string(), sqlx::Column::name(column).to_string()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn two_daemons_share_one_postgresql_and_serve_each_others_runs() {
    let Some(url) = postgres_database().await else {
        return;
    };
    let options = |node: &str| Options {
        store_url: Some(url.clone()),
        tcp: true,
        node: Some(node.into()),
        ..Options::default()
    };
    let a = TestDaemon::start(options("node-a"));
    let mut b = TestDaemon::start(options("node-b"));
    // Both daemons must accept the same keys.
    b.keys = crate::common::Keys {
        alpha: a.keys.alpha.clone(),
        beta: a.keys.beta.clone(),
        gamma: a.keys.gamma.clone(),
    };
    b.stop();
    b.write_config(&options("node-b"));
    b.spawn();
    let on_a = a.client(&a.keys.beta);
    let on_b = b.client(&a.keys.beta);
    let run = on_a
        .post("/v1/runs", json!({"command": ["/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo tick$i; sleep 0.3; done; sleep 30"]}))
        .await
        .json();
    let id = run["id"].as_str().unwrap().to_string();
    assert_eq!(run["node"], "node-a");
    // B reads the record from the shared store and streams the live events from A.
    crate::api::wait_status(&on_b, &id, "running").await;
    let mut stream = on_b.open_events(&id).await;
    let seen = crate::common::read_until(&mut stream, "tick3").await;
    assert!(seen.contains("\"event\":\"started\""), "{seen}");
    // B cancels it on A.
    on_b.delete(&format!("/v1/runs/{id}")).await;
    let ended = on_b.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(ended["status"], "cancelled");
    // A session on A is used through B: files and runs.
    let sid = on_a.post("/v1/sessions", json!({})).await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        on_b.put(&format!("/v1/sessions/{sid}/files/x.txt"), "via b")
            .await
            .status,
        204
    );
    let ran = on_b
        .post(
            &format!("/v1/sessions/{sid}/runs"),
            json!({"command": ["/bin/cat", "x.txt"], "wait": 30}),
        )
        .await
        .json();
    assert_eq!(ran["result"]["stdout"], "via b", "{ran}");
    assert_eq!(ran["node"], "node-a");
    assert_eq!(
        on_a.get(&format!("/v1/sessions/{sid}/files/x.txt"))
            .await
            .text(),
        "via b"
    );
    // Listing from either node shows the fleet's runs.
    assert_eq!(
        on_b.get("/v1/runs").await.json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // When A dies for good, B marks A's in-flight runs lost once A's heartbeat stops.
    let stuck = on_a
        .post("/v1/runs", json!({"command": ["/bin/sleep", "60"]}))
        .await
        .json();
    let stuck_id = stuck["id"].as_str().unwrap().to_string();
    crate::api::wait_status(&on_b, &stuck_id, "running").await;
    let mut a = a;
    a.kill();
    // ... and A's sessions lost, with the reason.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let session = loop {
        let session = on_b.get(&format!("/v1/sessions/{sid}")).await.json();
        if session["status"] != "active" || std::time::Instant::now() > deadline {
            break session;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(session["status"], "lost", "{session}");
    assert!(
        session["end_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("node-a"),
        "{session}"
    );
    let lost = on_b.wait_terminal(&stuck_id, Duration::from_secs(30)).await;
    assert_eq!(lost["status"], "lost", "{lost}");
    assert!(lost["error"]["message"]
        .as_str()
        .unwrap()
        .contains("node-a"));
    let events = on_b
        .get(&format!("/v1/runs/{stuck_id}/events"))
        .await
        .text();
    assert!(events.contains("\"event\":\"ended\""), "{events}");
}

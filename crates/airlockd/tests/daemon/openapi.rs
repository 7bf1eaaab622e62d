//! The OpenAPI document: generated from the code, served, and checked in.

use crate::common::{Options, TestDaemon};

#[tokio::test(flavor = "multi_thread")]
async fn the_checked_in_openapi_document_matches_the_code_and_is_served() {
    let generated = airlockd::api::openapi_json();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    if std::env::var_os("AIRLOCKD_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "crates/airlockd/openapi.json differs from the code; regenerate it with \
         `AIRLOCKD_UPDATE_OPENAPI=1 cargo test -p airlockd --test daemon openapi` (or `airlockd openapi > crates/airlockd/openapi.json`)"
    );
    let document: serde_json::Value = serde_json::from_str(&generated).unwrap();
    assert_eq!(document["openapi"], "3.1.0");
    for path in [
        "/v1/runs",
        "/v1/runs/{id}",
        "/v1/runs/{id}/events",
        "/v1/sessions",
        "/v1/sessions/{id}/files/{path}",
        "/v1/sessions/{id}/runs",
        "/v1/workers",
        "/v1/calls",
        "/v1/capabilities",
        "/metrics",
        "/healthz",
    ] {
        assert!(
            document["paths"].get(path).is_some(),
            "{path} is not documented"
        );
    }
    let daemon = TestDaemon::start(Options::default());
    let served = daemon.anonymous().get("/v1/openapi.json").await;
    assert_eq!(served.status, 200);
    assert_eq!(served.text(), generated);
}

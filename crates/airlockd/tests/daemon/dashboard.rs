//! The dashboard in headless Chromium, against a daemon with real runs: the page loads with a
//! key, lists the runs with status, backend and duration, shows a run's detail (isolation,
//! limits, output) and the denials.

use std::process::Command;

use serde_json::json;

use crate::common::{Options, TestDaemon};

/// Chromium, from `AIRLOCKD_TEST_CHROMIUM` (set by `.ci/daemon-services`), else on PATH.
fn chromium() -> Option<String> {
    if let Ok(path) = std::env::var("AIRLOCKD_TEST_CHROMIUM") {
        return Some(path);
    }
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must provide Chromium (.ci/daemon-services installs it)"
        );
        eprintln!("skipped: no Chromium (apt-get install chromium, or set AIRLOCKD_TEST_CHROMIUM)");
    }
    found.map(str::to_string)
}

/// The page's DOM after its scripts ran.
fn render(chromium: &str, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let output = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page did not finish loading:\n{dom}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    dom
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_runs_their_detail_the_queue_and_denials() {
    let Some(chromium) = chromium() else { return };
    let daemon = TestDaemon::start(Options {
        tcp: true,
        ..Options::default()
    });
    let beta = daemon.client(&daemon.keys.beta);
    let ok = beta
        .run(json!({"command": ["/bin/echo", "dashboard-output-marker"]}))
        .await
        .json();
    let slow = beta
        .run(json!({"command": ["/bin/sleep", "10"], "policy": {"limits": {"wall_time": "1s"}}}))
        .await
        .json();
    assert_eq!(slow["status"], "timeout");
    let refused = beta
        .run(json!({"command": ["/bin/true"], "policy": {"network": {"mode": "host"}}}))
        .await;
    assert_eq!(refused.status, 403);
    let addr = daemon.tcp.clone().unwrap();
    let key = &daemon.keys.beta;
    let page = tokio::task::spawn_blocking({
        let (chromium, url) = (
            chromium.clone(),
            format!("http://{addr}/dashboard#key={key}"),
        );
        move || render(&chromium, &url)
    })
    .await
    .unwrap();
    for run in [&ok, &slow] {
        let id = run["id"].as_str().unwrap();
        assert!(
            page.contains(&format!("data-run-id=\"{id}\"")),
            "run {id} is not listed:\n{page}"
        );
    }
    assert!(page.contains("data-status=\"timeout\"") && page.contains("data-status=\"exited\""));
    assert!(page.contains(">native<"), "the backend is not shown");
    assert!(page.contains("tenant beta, key beta-ci"), "{page}");
    assert!(page.contains("id=\"queue\""));
    assert!(
        page.contains("ceiling_refused"),
        "the denial is not shown:\n{page}"
    );
    // A run's detail: isolation record, limits, output.
    let detail = tokio::task::spawn_blocking({
        let url = format!(
            "http://{addr}/dashboard#key={key}&run={}",
            ok["id"].as_str().unwrap()
        );
        let chromium = chromium.clone();
        move || render(&chromium, &url)
    })
    .await
    .unwrap();
    assert!(detail.contains("isolation in force: env_scrub"), "{detail}");
    assert!(detail.contains("seccomp") && detail.contains("landlock_fs"));
    assert!(
        detail.contains("no limit hit; limits: memory 512MiB"),
        "{detail}"
    );
    assert!(detail.contains("dashboard-output-marker"));
    assert!(detail.contains("network decisions: none recorded"));
    // Without a key the page shows nothing but the key prompt; with another tenant's key, none
    // of beta's runs.
    let gamma_page = tokio::task::spawn_blocking({
        let chromium =
            std::env::var("AIRLOCKD_TEST_CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let url = format!("http://{addr}/dashboard#key={}", daemon.keys.gamma);
        move || render(&chromium, &url)
    })
    .await
    .unwrap();
    assert!(
        !gamma_page.contains(ok["id"].as_str().unwrap()),
        "gamma sees beta's run"
    );
}

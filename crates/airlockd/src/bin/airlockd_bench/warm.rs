//! Warm start through the daemon, against the daemon cold and the library's own pool.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{json, Value};

use super::{percentile, start_daemon_with, verdict, Connection, Daemon};

/// Two prepared sandboxes for `untrusted` and a Python zygote (json, re).
const WARM: &str = r#"[warm]
budget = 4
[warm.profiles.untrusted]
ready = 2
zygotes = { python = { preload = ["json", "re"] } }
"#;

const SNIPPET: &str = "import json, re";

/// Interleaved: cold daemon, warm daemon, library warm pool (`/bin/true`); `/bin/true` in a
/// session of the cold daemon and of the warm one (the session's own prepared sandbox); the
/// snippet cold and on the zygote. Then a burst on the warm daemon.
pub async fn compare(cold: &Daemon, runs: usize) -> anyhow::Result<()> {
    let warm = start_daemon_with(WARM)?;
    let pool = library_pool(cold)?;
    let (mut to_cold, mut to_warm) = (
        Connection::open(cold).await?,
        Connection::open(&warm).await?,
    );
    wait_zygote(&mut to_warm).await?;
    let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut paths: BTreeMap<String, usize> = BTreeMap::new();
    let true_run = json!({"command": ["/bin/true"], "wait": 60});
    let snippet = json!({"code": SNIPPET, "language": "python", "wait": 60});
    let cold_session = format!("/v1/sessions/{}/runs", new_session(&mut to_cold).await?);
    let warm_session = format!("/v1/sessions/{}/runs", new_session(&mut to_warm).await?);
    let names = [
        "daemon cold /bin/true",
        "daemon warm /bin/true",
        "library warm /bin/true",
        "session cold /bin/true",
        "session warm /bin/true",
        "daemon cold snippet",
        "daemon zygote snippet",
    ];
    for i in 0..runs + 5 {
        // The order rotates: a pool replaces the sandbox a run used while the next one runs.
        for k in 0..names.len() {
            let name = names[(i + k) % names.len()];
            let (ms, path) = match name {
                "daemon cold /bin/true" => timed(&mut to_cold, &true_run, "cold").await?,
                "daemon warm /bin/true" => timed(&mut to_warm, &true_run, "warm").await?,
                "session cold /bin/true" => {
                    timed_at(&mut to_cold, &cold_session, &true_run, "cold").await?
                }
                "session warm /bin/true" => {
                    timed_at(&mut to_warm, &warm_session, &true_run, "warm").await?
                }
                "library warm /bin/true" => library_warm(&pool).await?,
                "daemon cold snippet" => timed(&mut to_cold, &snippet, "cold").await?,
                _ => timed(&mut to_warm, &snippet, "zygote").await?,
            };
            *paths.entry(format!("{name} -> {path}")).or_default() += 1;
            if i >= 5 {
                samples.entry(name).or_default().push(ms);
            }
        }
    }
    report(runs, &mut samples, &paths);
    burst(&warm, 16).await?;
    drop(pool);
    Ok(())
}

fn report(runs: usize, samples: &mut BTreeMap<&str, Vec<f64>>, paths: &BTreeMap<String, usize>) {
    println!("warm start through the daemon ({runs} runs each, interleaved, client-side time):");
    let mut p50 = BTreeMap::new();
    for (name, values) in samples.iter_mut() {
        let (median, p90) = (percentile(values, 0.5), percentile(values, 0.9));
        p50.insert(*name, median);
        println!("  {name:<24} p50 {median:6.2} ms, p90 {p90:6.2} ms");
    }
    println!("  paths taken: {paths:?}");
    let (cold, warm) = (p50["daemon cold /bin/true"], p50["daemon warm /bin/true"]);
    let library = p50["library warm /bin/true"];
    println!(
        "  daemon warm - library warm (the daemon's own cost): {:.2} ms; daemon cold / warm: {:.1}x",
        warm - library,
        cold / warm
    );
    let (session_cold, session_warm) =
        (p50["session cold /bin/true"], p50["session warm /bin/true"]);
    println!(
        "  target: a warm session run faster than a cold one: {:.1}x -> {}",
        session_cold / session_warm,
        verdict(session_warm < session_cold)
    );
    let zygote = p50["daemon zygote snippet"];
    println!(
        "  target: daemon warm /bin/true faster than daemon cold: {}",
        verdict(warm < cold)
    );
    println!(
        "  target: zygote snippet through the daemon p50 <= 3 ms + the daemon's own cost (daemon warm - library warm above): {:.2} ms -> {}",
        zygote,
        verdict(zygote <= 3.0 + (warm - library).max(0.0))
    );
}

/// `count` runs submitted at once from 4 connections to a pool of 2: the paths they took and
/// each path's median (a run finding no sandbox ready goes cold rather than waiting).
async fn burst(daemon: &Daemon, count: usize) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut connection = Connection::open(daemon).await?;
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..count / 4 {
                let body = json!({"command": ["/bin/true"], "wait": 60});
                let (ms, path) = timed(&mut connection, &body, "any").await?;
                seen.push((path, ms));
            }
            Ok::<_, anyhow::Error>(seen)
        }));
    }
    let mut by_path: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for task in tasks {
        for (path, ms) in task.await?? {
            by_path.entry(path).or_default().push(ms);
        }
    }
    println!("burst of {count} /bin/true from 4 clients on 2 prepared sandboxes (2 slots):");
    for (path, values) in by_path.iter_mut() {
        let n = values.len();
        println!(
            "  {path:<5} {n:3} runs, p50 {:6.2} ms",
            percentile(values, 0.5)
        );
    }
    Ok(())
}

/// One run through the API: client-side ms and the path it took (`expect` only labels).
async fn timed(
    connection: &mut Connection,
    body: &Value,
    expect: &str,
) -> anyhow::Result<(f64, String)> {
    timed_at(connection, "/v1/runs", body, expect).await
}

/// A session of the bench's tenant (default caps); its id.
async fn new_session(connection: &mut Connection) -> anyhow::Result<String> {
    let (status, session) = connection
        .call("POST", "/v1/sessions", Some(json!({})))
        .await?;
    match (status, session["id"].as_str()) {
        (201, Some(id)) => Ok(id.to_string()),
        _ => bail!("cannot create a session: {status} {session}"),
    }
}

/// [`timed`], posted to `path` (a session's runs).
async fn timed_at(
    connection: &mut Connection,
    path: &str,
    body: &Value,
    expect: &str,
) -> anyhow::Result<(f64, String)> {
    let started = Instant::now();
    let (status, run) = connection.call("POST", path, Some(body.clone())).await?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if status != 200 || run["status"] != "exited" {
        bail!("a run expected {expect} failed: {status} {run}");
    }
    Ok((ms, run["start"].as_str().unwrap_or("?").to_string()))
}

/// The zygote starts in the background: wait until a snippet takes it.
async fn wait_zygote(connection: &mut Connection) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let snippet = json!({"code": SNIPPET, "language": "python", "wait": 60});
    while timed(connection, &snippet, "zygote").await?.1 != "zygote" {
        if Instant::now() > deadline {
            bail!("the daemon's zygote did not start (see its log)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn library_pool(daemon: &Daemon) -> anyhow::Result<airlock::warm::WarmPool> {
    let options = airlock::SandboxOptions {
        init_program: Some(daemon.init.clone()),
        runtime_dir: Some(daemon.dir.path().join("run/library-warm")),
        cgroup: Some(airlock::CgroupConfig {
            parent: "airlockd-bench".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox =
        airlock::Sandbox::with_options(airlock::policy::load_profile("untrusted")?, options)?;
    let pool = sandbox.warm(airlock::warm::WarmOptions::new(2))?;
    if !pool.wait_settled(Duration::from_secs(60)) {
        bail!("the library's warm pool did not fill: {:?}", pool.stats());
    }
    Ok(pool)
}

async fn library_warm(pool: &airlock::warm::WarmPool) -> anyhow::Result<(f64, String)> {
    // As the daemon runs it: spawned, output streamed as events, then waited for.
    let started = Instant::now();
    let mut handle = pool.command("/bin/true").stream_output().spawn()?;
    if let Some(events) = handle.events() {
        for _ in events {}
    }
    let result = handle.wait()?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if !result.success() {
        bail!("the library warm run failed: {result:?}");
    }
    let warm = result
        .details
        .iter()
        .any(|d| d == airlock::warm::WARM_DETAIL);
    Ok((ms, if warm { "warm" } else { "cold" }.to_string()))
}

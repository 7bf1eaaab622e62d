//! airlockd-bench: what the daemon costs on top of the library, measured, with each target
//! printed as met / NOT met.
//!
//! 1. API overhead: the same run (`/bin/true`, profile `untrusted`) through the library in
//!    this process and through `POST /v1/runs` (wait) on the Unix socket, interleaved (the
//!    order rotates each iteration). Two targets of at most 1 ms: unpaired, what a user sees
//!    (the API's median minus the library `run()`'s median), and paired, per request (the
//!    API's time minus the library's time inside the daemon, `Server-Timing`). Also shown:
//!    the library's `run()` with its init forked by a spawner, as the daemon starts its cold
//!    runs' inits (`engine/spawner.rs`), for the comparison at equal start-up.
//! 2. Throughput with the pool saturated: runs per second through the API.
//! 3. Memory per idle session: the daemon's RSS (and the host's available memory, which
//!    includes each session's tmpfs) before and after creating many sessions.
//! 4. 1,000 runs queued at once are all drained, each with a terminal record.
//! 5. Warm start (`--only warm`, `--warm-runs`, first): `/bin/true` through a cold daemon, a daemon with
//!    `[warm]` (prepared sandboxes) and a library `WarmPool`, `/bin/true` in a session of each
//!    daemon (the warm one's session has its own prepared sandbox), and a Python snippet
//!    (`import json, re`) cold and on the daemon's zygote, interleaved; then a burst larger
//!    than the pool (runs that find no sandbox ready fall back to cold).
//!
//! Build both binaries first: `cargo build --release -p airlockd -p airlock-cli`, then run
//! `target/release/airlockd-bench` (as root, as the daemon runs in production).
//! `--only overhead` (repeatable) runs one part alone. The overhead part also prints where
//! the time goes: a do-nothing request's round trip on the same connection (HTTP on the
//! socket), and the run's time in the daemon's router beyond the library's (`Server-Timing`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

#[path = "airlockd_bench/warm.rs"]
mod warm;

#[derive(Parser, Debug)]
#[command(name = "airlockd-bench")]
struct Args {
    /// Runs per side for the overhead measurement.
    #[arg(long, default_value_t = 200)]
    overhead_runs: usize,
    /// Runs for the throughput measurement.
    #[arg(long, default_value_t = 300)]
    throughput_runs: usize,
    /// Sessions for the memory measurement.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// Runs queued at once for the drain measurement.
    #[arg(long, default_value_t = 1000)]
    queued_runs: usize,
    /// Runs per side for the warm start comparison (daemon cold, daemon warm, library warm,
    /// zygote snippet).
    #[arg(long, default_value_t = 100)]
    warm_runs: usize,
    /// Only these measurements (repeatable; all when not given).
    #[arg(long, value_enum)]
    only: Vec<Part>,
}

/// One of the measurements.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Overhead,
    Throughput,
    Sessions,
    Queued,
    /// Warm start: daemon cold vs warm vs library warm, the zygote snippet, a burst.
    Warm,
}

struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
    key: String,
    init: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.child.id() as i32).expect("a pid"),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
        // The daemon's log goes with its directory unless asked for (with
        // `AIRLOCKD_BENCH_LOG=airlockd=debug`, its `answered ... timeline=` lines).
        if let Some(keep) = std::env::var_os("AIRLOCKD_BENCH_KEEP_LOG") {
            let _ = std::fs::copy(self.dir.path().join("daemon.log"), keep);
        }
        for entry in std::fs::read_dir(self.dir.path().join("state/sessions"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = airlockd::workspace::remove_workspace_dir(&entry.path());
        }
    }
}

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} is missing: build it first (cargo build --release -p airlockd -p airlock-cli)",
            path.display()
        );
    }
    Ok(path)
}

fn start_daemon() -> anyhow::Result<Daemon> {
    start_daemon_with("")
}

/// A daemon with `extra` configuration (e.g. `[warm]`) before its tenant.
fn start_daemon_with(extra: &str) -> anyhow::Result<Daemon> {
    let dir = tempfile::Builder::new()
        .prefix("airlockd-bench-")
        .tempdir()?;
    let key = airlockd::auth::new_key();
    let init = sibling("airlock")?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let config = format!(
        r#"[server]
socket = "{root}/run/airlockd.sock"
max_wait = "600s"
[paths]
state_dir = "{root}/state"
runtime_dir = "{root}/run"
init_program = "{init}"
[pool]
max_concurrent = {cpus}
max_queued = 5000
queue_timeout = "600s"
[sessions]
max_per_tenant = 100000
[sandbox]
cgroup_parent = "airlockd-bench"
{extra}
[[tenants]]
name = "bench"
keys = [{{ name = "bench", hash = "{hash}" }}]
max_queued = 5000
"#,
        root = dir.path().display(),
        init = init.display(),
        hash = airlockd::auth::hash_line(&key),
        extra = extra,
    );
    std::fs::write(dir.path().join("airlockd.toml"), config)?;
    let child = Command::new(sibling("airlockd")?)
        .arg("--config")
        .arg(dir.path().join("airlockd.toml"))
        .env(
            "AIRLOCKD_LOG",
            std::env::var("AIRLOCKD_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("daemon.log"))?)
        .spawn()?;
    let socket = dir.path().join("run/airlockd.sock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            bail!("airlockd did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Daemon {
        child,
        dir,
        socket,
        key,
        init,
    })
}

/// One keep-alive connection to the daemon.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    key: String,
}

impl Connection {
    async fn open(daemon: &Daemon) -> anyhow::Result<Connection> {
        let stream = tokio::net::UnixStream::connect(&daemon.socket).await?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Connection {
            sender,
            key: daemon.key.clone(),
        })
    }

    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let (status, value, _) = self.call_timed(method, path, body).await?;
        Ok((status, value))
    }

    /// Also returns the daemon's `Server-Timing` metrics (`sandbox`: the library's share of
    /// the answer's time; `daemon`: the request's time in the daemon's router), ms.
    async fn call_timed(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value, ServerTiming)> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "airlockd")
            .header("authorization", format!("Bearer {}", self.key));
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        self.sender.ready().await?;
        let response = self
            .sender
            .send_request(request.body(Full::new(body))?)
            .await?;
        let status = response.status().as_u16();
        let timing = ServerTiming::parse(response.headers());
        let bytes = response.into_body().collect().await?.to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, value, timing))
    }
}

/// The metrics of a `Server-Timing` header the bench reads, ms.
#[derive(Default)]
struct ServerTiming {
    sandbox: Option<f64>,
    daemon: Option<f64>,
}

impl ServerTiming {
    fn parse(headers: &hyper::HeaderMap) -> ServerTiming {
        let mut timing = ServerTiming::default();
        let values = headers.get_all("server-timing").iter();
        let metrics = values
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','));
        for metric in metrics {
            let Some((name, ms)) = metric.trim().split_once(";dur=") else {
                continue;
            };
            let ms = ms.parse().ok();
            match name {
                "sandbox" => timing.sandbox = ms,
                "daemon" => timing.daemon = ms,
                _ => {}
            }
        }
        timing
    }
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// How the bench runs `/bin/true` through the library.
#[derive(Clone)]
enum LibraryWay {
    /// `run()`, served in the calling thread.
    Run,
    /// As the daemon runs it: spawned, output streamed as events, then waited for.
    Spawn,
    /// `run()` with its init forked by a spawner, as the daemon's cold runs are.
    RunWithSpawner(Arc<airlock::InitSpawner>),
}

/// The library's options for the bench's own runs: the daemon's init program and cgroup
/// parent, a runtime directory of their own.
fn library_options(init: &Path, runtime: &Path) -> airlock::SandboxOptions {
    airlock::SandboxOptions {
        init_program: Some(init.to_path_buf()),
        runtime_dir: Some(runtime.to_path_buf()),
        cgroup: Some(airlock::CgroupConfig {
            parent: "airlockd-bench".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn library_run(init: &Path, runtime: &Path, way: LibraryWay) -> anyhow::Result<Duration> {
    let policy = airlock::policy::load_profile("untrusted")?;
    let options = library_options(init, runtime);
    let started = Instant::now();
    let command = airlock::Sandbox::with_options(policy, options)?.command("/bin/true");
    let result = match way {
        LibraryWay::Run => command.run()?,
        LibraryWay::Spawn => {
            let mut handle = command.stream_output().spawn()?;
            if let Some(events) = handle.events() {
                for _ in events {}
            }
            handle.wait()?
        }
        LibraryWay::RunWithSpawner(spawner) => command.init_spawner(spawner).run()?,
    };
    let elapsed = started.elapsed();
    if !result.success() {
        bail!("the library run failed: {result:?}");
    }
    Ok(elapsed)
}

/// Two waited runs through the daemon: one whose limits end it within its wait (30 s of wall
/// time, its grace and the daemon's margin fit in 60 s), and one with `untrusted`'s default
/// limits (180 s do not fit in 60), which the daemon must be ready to hand over to a thread of
/// its own if it outlasts the wait. (Before the hand-over, only the first ran on the
/// request's own thread; a daemon that old shows the two ways apart.)
const WAITED_RUNS: [(&str, &str); 2] = [
    (
        "limits within the wait (30 s wall time)",
        r#"{"command": ["/bin/true"], "wait": 60, "policy": {"limits": {"wall_time": "30s"}}}"#,
    ),
    (
        "default limits (180 s wall time, beyond the wait)",
        r#"{"command": ["/bin/true"], "wait": 60}"#,
    ),
];

/// Per-request samples of one way through the daemon, ms.
#[derive(Default)]
struct ApiSamples {
    /// Client-side time of the request.
    total: Vec<f64>,
    /// That minus the library's time in the daemon (`Server-Timing: sandbox`).
    own: Vec<f64>,
    /// The daemon router's time minus the library's (`daemon - sandbox`).
    in_daemon: Vec<f64>,
    /// The library's time in the daemon (`Server-Timing: sandbox`).
    sandbox: Vec<f64>,
}

impl ApiSamples {
    async fn take(
        &mut self,
        connection: &mut Connection,
        body: &str,
        keep: bool,
    ) -> anyhow::Result<f64> {
        let started = Instant::now();
        let (status, run, timing) = connection
            .call_timed("POST", "/v1/runs", Some(serde_json::from_str(body)?))
            .await?;
        let through_api = started.elapsed().as_secs_f64() * 1000.0;
        if status != 200 || run["status"] != "exited" {
            bail!("the API run failed: {status} {run}");
        }
        if keep {
            self.total.push(through_api);
            if let Some(sandbox) = timing.sandbox {
                self.sandbox.push(sandbox);
                self.own.push(through_api - sandbox);
                self.in_daemon
                    .extend(timing.daemon.map(|daemon| daemon - sandbox));
            }
        }
        Ok(through_api)
    }

    fn report(&mut self, way: &str) {
        let (api50, api90) = (
            percentile(&mut self.total, 0.5),
            percentile(&mut self.total, 0.9),
        );
        println!("  API, unix socket, wait, {way}: p50 {api50:.2} ms, p90 {api90:.2} ms");
        if !self.in_daemon.is_empty() {
            println!(
                "    in the daemon's router minus the library (Server-Timing daemon - sandbox), p50 {:.3} ms",
                percentile(&mut self.in_daemon, 0.5)
            );
        }
        if !self.own.is_empty() {
            let (own50, own90) = (
                percentile(&mut self.own, 0.5),
                percentile(&mut self.own, 0.9),
            );
            println!(
                "    target: paired, per request: API time - the library's time in the daemon (Server-Timing) p50 <= 1 ms: p50 {own50:.2} ms, p90 {own90:.2} ms -> {}",
                verdict(own50 <= 1.0)
            );
        }
    }
}

async fn overhead(daemon: &Daemon, runs: usize) -> anyhow::Result<()> {
    let mut connection = Connection::open(daemon).await?;
    let runtime = daemon.dir.path().join("run/library");
    let (mut library, mut streamed, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    let mut with_spawner = Vec::new();
    let mut ways: Vec<ApiSamples> = WAITED_RUNS.iter().map(|_| ApiSamples::default()).collect();
    let spawner = Arc::new(airlock::InitSpawner::start_with(&library_options(
        &daemon.init,
        &runtime,
    ))?);
    let run_library = |way: LibraryWay| {
        let (init, dir) = (daemon.init.clone(), runtime.clone());
        tokio::task::spawn_blocking(move || library_run(&init, &dir, way))
    };
    // Each iteration runs the ways in an order rotated by one from the last, so that each
    // way comes first, second, ... equally often: a sandbox started right
    // after others pays for their teardown (the kernel frees a network namespace in the
    // background), and a fixed order would charge that to one way.
    let mut by_position = Positions::default();
    for i in 0..runs + 10 {
        let keep = i >= 10;
        for position in 0..WAYS {
            let way = (position + i) % WAYS;
            let library_way = match way {
                0 => Some(LibraryWay::Run),
                1 => Some(LibraryWay::Spawn),
                2 => Some(LibraryWay::RunWithSpawner(Arc::clone(&spawner))),
                _ => None,
            };
            let ms = match library_way {
                Some(library_way) => run_library(library_way).await??.as_secs_f64() * 1000.0,
                None => {
                    let api = &mut ways[way - LIBRARY_WAYS];
                    api.take(&mut connection, WAITED_RUNS[way - LIBRARY_WAYS].1, keep)
                        .await?
                }
            };
            if keep {
                by_position.push(way, position, ms);
                match way {
                    0 => library.push(ms),
                    1 => streamed.push(ms),
                    2 => with_spawner.push(ms),
                    _ => {}
                }
            }
        }
        let floor_ms = http_floor(&mut connection).await?;
        if keep {
            floor.push(floor_ms);
        }
    }
    // Per iteration (the samples are in run order until sorted): the daemon's sandbox minus
    // the library's run of the same iteration, which tells a slower sandbox in the daemon
    // from noise.
    let sandbox_gap: Vec<Vec<f64>> = ways
        .iter()
        .map(|way| paired_gap(&way.sandbox, &library))
        .collect();
    // And the API's whole time minus the same run(): what a user sees, per iteration, with
    // nothing taken from the daemon's own account (a daemon that moved work into the
    // library's share of `Server-Timing` would show here).
    let total_gap: Vec<Vec<f64>> = ways
        .iter()
        .map(|way| paired_gap(&way.total, &library))
        .collect();
    let (lib50, lib90) = (percentile(&mut library, 0.5), percentile(&mut library, 0.9));
    let (spawn50, spawn90) = (
        percentile(&mut streamed, 0.5),
        percentile(&mut streamed, 0.9),
    );
    println!("api overhead ({runs} runs each, interleaved):");
    println!("  library run():                 p50 {lib50:.2} ms, p90 {lib90:.2} ms");
    println!("  library spawn()+events+wait:   p50 {spawn50:.2} ms, p90 {spawn90:.2} ms (what the daemon calls)");
    let spawner50 = percentile(&mut with_spawner, 0.5);
    println!(
        "  library run(), init spawner:   p50 {spawner50:.2} ms, p90 {:.2} ms (as the daemon starts cold inits)",
        percentile(&mut with_spawner, 0.9)
    );
    println!(
        "  a request that does nothing (404, same connection), p50 {:.3} ms",
        percentile(&mut floor, 0.5)
    );
    by_position.report();
    let gaps = sandbox_gap.into_iter().zip(total_gap);
    for ((samples, (way, _)), (mut gap, mut whole)) in ways.iter_mut().zip(WAITED_RUNS).zip(gaps) {
        samples.report(way);
        // What a user sees: the API's median against the library's, in this process.
        let api50 = percentile(&mut samples.total, 0.5);
        if !samples.sandbox.is_empty() {
            println!(
                "    the library's time in the daemon p50 {:.2} ms; minus this process's run() of the same iteration, p50 {:+.3} ms",
                percentile(&mut samples.sandbox, 0.5),
                percentile(&mut gap, 0.5),
            );
        }
        println!(
            "    API time minus this process's run() of the same iteration, p50 {:+.3} ms",
            percentile(&mut whole, 0.5)
        );
        println!(
            "    API p50 - library spawn() p50: {:.2} ms; - library run() with an init spawner p50: {:.2} ms",
            api50 - spawn50,
            api50 - spawner50
        );
        println!(
            "    target: unpaired, what a user sees: API p50 - library run() p50 <= 1 ms: {:.2} ms -> {}",
            api50 - lib50,
            verdict(api50 - lib50 <= 1.0)
        );
    }
    Ok(())
}

/// The library's ways of the overhead measurement ([`LibraryWay`]).
const LIBRARY_WAYS: usize = 3;

/// The ways of the overhead measurement: the library's, then each of [`WAITED_RUNS`]
/// through the API.
const WAYS: usize = LIBRARY_WAYS + WAITED_RUNS.len();

/// Each way's samples by its place in its iteration, ms.
#[derive(Default)]
struct Positions([[Vec<f64>; WAYS]; WAYS]);

impl Positions {
    fn push(&mut self, way: usize, position: usize, ms: f64) {
        self.0[way][position].push(ms);
    }

    /// Each way's p50 when it ran first, second, ...: how much the order costs.
    fn report(&mut self) {
        let names = [
            "library run()",
            "library spawn()",
            "API, limits in the wait",
            "API, default limits",
        ];
        println!(
            "  p50 by place in the iteration (1st, 2nd, ...; the order rotates each iteration):"
        );
        for (name, places) in names.iter().zip(&mut self.0) {
            let p50s: Vec<String> = places
                .iter_mut()
                .filter(|samples| !samples.is_empty())
                .map(|samples| format!("{:.2}", percentile(samples, 0.5)))
                .collect();
            println!("    {name}: {} ms", p50s.join(" / "));
        }
    }
}

/// `a[i] - b[i]` for each iteration both have.
fn paired_gap(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a - b).collect()
}

/// The round trip of a request the daemon answers without work (an unknown path: no key,
/// no store), ms: what HTTP on the socket costs by itself.
async fn http_floor(connection: &mut Connection) -> anyhow::Result<f64> {
    let started = Instant::now();
    let (status, _) = connection.call("GET", "/bench/nothing", None).await?;
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    if status != 404 {
        bail!("GET /bench/nothing answered {status}, not 404");
    }
    Ok(elapsed)
}

/// Submits `count` runs from `clients` connections without waiting; returns their ids.
async fn submit_many(daemon: &Daemon, count: usize, clients: usize) -> anyhow::Result<Vec<String>> {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let share = count / clients + usize::from(c < count % clients);
        let mut connection = Connection::open(daemon).await?;
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..share {
                let (status, run) = connection
                    .call("POST", "/v1/runs", Some(json!({"command": ["/bin/true"]})))
                    .await?;
                if status != 202 && status != 200 {
                    bail!("submitting failed: {status} {run}");
                }
                ids.push(run["id"].as_str().unwrap_or_default().to_string());
            }
            Ok::<_, anyhow::Error>(ids)
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await??);
    }
    Ok(ids)
}

/// Waits until every run is terminal; returns how many ended `exited`.
async fn drain(daemon: &Daemon, ids: &[String], timeout: Duration) -> anyhow::Result<usize> {
    let mut connection = Connection::open(daemon).await?;
    let deadline = Instant::now() + timeout;
    let mut exited = 0;
    for id in ids {
        loop {
            let (status, run) = connection
                .call("GET", &format!("/v1/runs/{id}"), None)
                .await?;
            if status != 200 {
                bail!("run {id} has no record: {status} {run}");
            }
            match run["status"].as_str() {
                Some("queued") | Some("running") => {
                    if Instant::now() > deadline {
                        bail!("run {id} still in flight after {timeout:?}");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some("exited") => {
                    exited += 1;
                    break;
                }
                _ => break,
            }
        }
    }
    Ok(exited)
}

async fn throughput(daemon: &Daemon, runs: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let ids = submit_many(daemon, runs, 8).await?;
    let exited = drain(daemon, &ids, Duration::from_secs(600)).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("throughput (pool saturated, {cpus} slots): {runs} runs in {elapsed:.2} s = {:.1} runs/s ({exited} exited)", runs as f64 / elapsed);
    Ok(())
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn available_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

async fn session_memory(daemon: &Daemon, sessions: usize) -> anyhow::Result<()> {
    let mut connection = Connection::open(daemon).await?;
    // Warm the allocator and the store first.
    connection
        .call("POST", "/v1/sessions", Some(json!({})))
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_before, available_before) =
        (rss_kib(daemon.child.id()) as i64, available_kib() as i64);
    for _ in 0..sessions {
        let (status, session) = connection
            .call("POST", "/v1/sessions", Some(json!({})))
            .await?;
        if status != 201 {
            bail!("creating a session failed: {status} {session}");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_after, available_after) = (rss_kib(daemon.child.id()) as i64, available_kib() as i64);
    let per_rss = (rss_after - rss_before) as f64 / sessions as f64;
    let per_host = (available_before - available_after) as f64 / sessions as f64;
    println!("memory per idle session: daemon RSS {per_rss:.1} KiB, host (daemon + empty tmpfs + store) {per_host:.1} KiB ({sessions} sessions)");
    println!(
        "  target: daemon RSS <= 64 KiB per idle session: {}",
        verdict(per_rss <= 64.0)
    );
    Ok(())
}

async fn queued_drain(daemon: &Daemon, runs: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let ids = submit_many(daemon, runs, 16).await?;
    let submitted = started.elapsed().as_secs_f64();
    let exited = drain(daemon, &ids, Duration::from_secs(1200)).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    let lost = runs - exited;
    println!("{runs} queued runs: submitted in {submitted:.2} s, drained in {elapsed:.2} s; {exited} exited, {lost} without an `exited` record, {} distinct ids", unique.len());
    println!(
        "  target: {runs} queued runs drained, no record lost: {}",
        verdict(lost == 0 && unique.len() == runs)
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The client is one thread, as a client's own event loop is: its requests and their
    // connections' tasks on the same thread, so that no hand-off between the client's own
    // threads is counted as the daemon's time. The library's runs go to blocking threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let daemon = start_daemon().context("cannot start airlockd")?;
    println!(
        "airlockd-bench: {} CPUs, daemon pid {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        daemon.child.id()
    );
    let wanted = |part: Part| args.only.is_empty() || args.only.contains(&part);
    if wanted(Part::Warm) {
        runtime.block_on(warm::compare(&daemon, args.warm_runs))?;
    }
    runtime.block_on(async {
        if wanted(Part::Overhead) {
            overhead(&daemon, args.overhead_runs).await?;
        }
        if wanted(Part::Throughput) {
            throughput(&daemon, args.throughput_runs).await?;
        }
        if wanted(Part::Sessions) {
            session_memory(&daemon, args.sessions).await?;
        }
        if wanted(Part::Queued) {
            queued_drain(&daemon, args.queued_runs).await?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    if let Ok(path) = std::env::var("AIRLOCKD_BENCH_KEEP_LOG") {
        let _ = std::fs::copy(daemon.dir.path().join("daemon.log"), path);
    }
    drop(daemon);
    Ok(())
}

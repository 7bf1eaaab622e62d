//! Part 1, the API's overhead over the library: the same run through the library in this
//! process and through the daemon, interleaved, with the order rotated. Apart from the other
//! parts: it alone runs the library beside the daemon, and reads where the time goes
//! (`Server-Timing`, the round trip of a request without work).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::{percentile, verdict, Connection, Daemon};

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

pub(super) async fn overhead(daemon: &Daemon, runs: usize) -> anyhow::Result<()> {
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

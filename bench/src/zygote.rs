//! Interpreter zygotes (`airlock-zygote`, profile `untrusted`, `json` and `re` preloaded):
//! the snippet's latency from the call to the result, runs per second with the zygote
//! saturated, and the host memory of the template. Measured after the interleaved pairs, in
//! this process (as a library caller or daemon runs them), and printed with their targets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::zygote::{Zygote, ZygoteOptions, ZygoteRun};
use airlock::{RunStatus, Sandbox};

const SNIPPET: &str = "import json, re; print(json.dumps({'k': re.sub('b', 'c', 'abc')}))";
/// Callers at once for the throughput (2 cores: two runs in flight each).
const CALLERS: usize = 4;
const THROUGHPUT_TIME: Duration = Duration::from_secs(3);
const THROUGHPUT_MAX_RUNS: u64 = 20_000;

/// The zygote's lines for the report, or why there are none.
pub fn measure(runs: usize) -> Result<Vec<String>, String> {
    let policy = airlock::policy::load_profile("untrusted").map_err(|e| e.to_string())?;
    let mut options = ZygoteOptions::python(&["json", "re"]);
    options.max_forks = u64::MAX;
    let zygote = Sandbox::new(policy)
        .and_then(|sandbox| sandbox.zygote(options))
        .map_err(|e| format!("airlock-zygote: {e}"))?;
    let zygote = Arc::new(zygote);
    let mut samples = Vec::with_capacity(runs);
    for round in 0..runs + 10 {
        let started = Instant::now();
        run_once(&zygote)?;
        if round >= 10 {
            samples.push(started.elapsed());
        }
    }
    samples.sort();
    let p50 = samples[samples.len() / 2];
    let p90 = samples[samples.len() * 9 / 10];
    let on_path_before = zygote.stats().forks_on_path;
    let rate = throughput(&zygote)?;
    let on_path = zygote.stats().forks_on_path - on_path_before;
    let pss = zygote
        .stats()
        .template_pid
        .and_then(template_pss_kib)
        .map(|kib| format!("{:.1} MiB", kib as f64 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    Ok(vec![
        format!(
            "airlock-zygote snippet (json, re preloaded): p50 {:.2} ms, p90 {:.2} ms over {runs} runs; target p50 <= 3 ms: {}",
            ms(p50),
            ms(p90),
            verdict(p50 <= Duration::from_millis(3))
        ),
        format!(
            "airlock-zygote throughput, {CALLERS} callers: {rate:.0} runs/s ({on_path} found no child ready); target >= 1000/s: {}",
            verdict(rate >= 1000.0)
        ),
        kernel_floor(),
        format!(
            "airlock-zygote memory: template PSS {pss}; plus the children it keeps confined ahead (4 by default, sharing its pages; not counted here)"
        ),
    ])
}

fn run_once(zygote: &Zygote) -> Result<(), String> {
    let result = zygote
        .run(&ZygoteRun::code(SNIPPET))
        .map_err(|e| e.to_string())?;
    match result.status {
        RunStatus::Exited if result.exit_code == Some(0) => Ok(()),
        _ => Err(format!(
            "a zygote run failed: {:?} {:?}",
            result.status, result.error
        )),
    }
}

/// Runs per second with `CALLERS` callers, bounded in time and count.
fn throughput(zygote: &Arc<Zygote>) -> Result<f64, String> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (zygote, done) = (Arc::clone(zygote), Arc::clone(&done));
            std::thread::spawn(move || {
                while started.elapsed() < THROUGHPUT_TIME
                    && done.load(Ordering::SeqCst) < THROUGHPUT_MAX_RUNS
                {
                    run_once(&zygote)?;
                    done.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    for caller in callers {
        caller
            .join()
            .map_err(|_| "a caller panicked".to_string())??;
    }
    Ok(done.load(Ordering::SeqCst) as f64 / started.elapsed().as_secs_f64())
}

/// What the kernel alone needs for the isolation every zygote run gets (fresh namespaces and
/// a limited cgroup, no program: `bench/floor/fresh_isolation.c`), with as many callers: the
/// throughput no zygote of this design can pass on this host.
fn kernel_floor() -> String {
    let measured = (|| {
        if !nix::unistd::geteuid().is_root() {
            return Err("needs root (cgroups)".to_string());
        }
        let binary = crate::tools::compile_floor("fresh_isolation")?;
        let rate = |extra: &[&str]| -> Result<f64, String> {
            let mut args = vec![
                CALLERS.to_string(),
                THROUGHPUT_TIME.as_secs().to_string(),
                THROUGHPUT_MAX_RUNS.to_string(),
            ];
            args.extend(extra.iter().map(|arg| arg.to_string()));
            let fields = crate::floor::run(&binary, &args)?;
            Ok(fields[0] / fields[1])
        };
        Ok((rate(&[])?, rate(&["no-net"])?))
    })();
    match measured {
        Ok((all, without_net)) => format!(
            "kernel floor of a zygote run's isolation (fresh user, mount, PID, network, IPC and UTS namespaces, a limited cgroup in five hierarchies, no program), {CALLERS} callers: {all:.0} runs/s ({without_net:.0} without the network namespace)"
        ),
        Err(why) => format!("kernel floor of a zygote run's isolation: not measured ({why})"),
    }
}

fn template_pss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Pss:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

//! Where a zygote run's time goes: `runs` sequential snippet runs on one zygote (profile
//! `untrusted`, json and re preloaded); prints the median wall time and the CPU time per run
//! (this process's threads, plus the template's reaped children: every process of a run), a
//! figure the host's load does not inflate as it does wall times. Run it under
//! `strace -f -ttt -T` or `perf record -a -g` to split a run into its steps (docs/warm.md).
//! `zygote_profile RUNS [PAUSE_MS [READY_CHILDREN]]`. Needs `airlock-zygote` built next to it (cargo build --release -p airlock-zygote).

use std::time::{Duration, Instant};

use airlock::zygote::{ZygoteOptions, ZygoteRun};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args().nth(1).map_or(Ok(20), |n| n.parse())?;
    // A pause between runs (ms), as between an agent's tool calls: lets work prepared ahead
    // of a run happen off its clock.
    let pause: u64 = std::env::args().nth(2).map_or(Ok(0), |n| n.parse())?;
    let sandbox = airlock::Sandbox::new(airlock::policy::load_profile("untrusted")?)?;
    let mut options = ZygoteOptions::python(&["json", "re"]);
    if let Some(ready) = std::env::args().nth(3) {
        options.ready_children = ready.parse()?;
    }
    let zygote = sandbox.zygote(options)?;
    let snippet =
        ZygoteRun::code("import json, re; print(json.dumps({'k': re.sub('b', 'c', 'abc')}))");
    zygote.run(&snippet)?; // the first touch of the template's pages
    let template = zygote.stats().template_pid.ok_or("no template")?;
    let cpu_before = cpu_ms("self") + children_cpu_ms(template);
    let mut samples: Vec<Duration> = Vec::with_capacity(runs);
    for _ in 0..runs {
        std::thread::sleep(Duration::from_millis(pause));
        let started = Instant::now();
        let result = zygote.run(&snippet)?;
        samples.push(started.elapsed());
        if result.exit_code != Some(0) {
            return Err(format!("a run failed: {result:?}").into());
        }
    }
    let cpu = cpu_ms("self") + children_cpu_ms(template) - cpu_before;
    samples.sort();
    println!(
        "median {:?} of {runs} runs (min {:?}, p10 {:?}, p25 {:?}, p90 {:?}); CPU {:.2} ms per run; {} forked on the run's path",
        samples[runs / 2],
        samples[0],
        samples[runs / 10],
        samples[runs / 4],
        samples[runs * 9 / 10],
        cpu / runs as f64,
        zygote.stats().forks_on_path
    );
    Ok(())
}

/// Fields of /proc/<pid>/stat after the command name, in milliseconds where they are times.
fn stat_fields(pid: &str) -> Vec<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let tick_ms = 1000.0 / 100.0; // USER_HZ
    after_name
        .split_whitespace()
        .map(|f| f.parse::<f64>().unwrap_or(0.0) * tick_ms)
        .collect()
}

/// utime + stime (fields 14 and 15, here 11 and 12 after the name and state).
fn cpu_ms(pid: &str) -> f64 {
    let f = stat_fields(pid);
    f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)
}

/// cutime + cstime of the template: every run's processes once reaped.
fn children_cpu_ms(template: u32) -> f64 {
    let f = stat_fields(&template.to_string());
    f.get(13).unwrap_or(&0.0) + f.get(14).unwrap_or(&0.0)
}

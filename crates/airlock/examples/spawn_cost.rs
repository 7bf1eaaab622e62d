//! What serving a run costs the supervisor: `/bin/true` (profile `untrusted`) through
//! `run()` and through `spawn()` + events + `wait()` (output streamed, as the daemon calls it),
//! each cold and with its init forked by an `InitSpawner` (as the daemon starts cold inits),
//! interleaved (the order rotates each iteration). Prints each way's p50 wall time and its
//! CPU time per run in this process (user + system, all threads: the supervisor's side; the
//! init and the program are other processes), which stays meaningful on a loaded machine.
//!
//! Run as root: `cargo run --release -p airlock --example spawn_cost -- <init program> [runs]`
//! (the init program: a built `airlock` binary).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::{InitSpawner, Sandbox, SandboxOptions};

#[derive(Clone, Copy)]
enum Way {
    Run,
    Spawn,
    RunWithSpawner,
    SpawnWithSpawner,
}

const WAYS: [(Way, &str); 4] = [
    (Way::Run, "run()"),
    (Way::Spawn, "spawn()+events+wait"),
    (Way::RunWithSpawner, "run(), init spawner"),
    (Way::SpawnWithSpawner, "spawn()+events+wait, init spawner"),
];

fn main() {
    let mut args = std::env::args().skip(1);
    let init = PathBuf::from(
        args.next()
            .expect("usage: spawn_cost <init program> [runs]"),
    );
    let runs: usize = args
        .next()
        .map_or(200, |n| n.parse().expect("runs: a number"));
    let runtime = tempfile::tempdir().expect("a runtime directory");
    let options = SandboxOptions {
        init_program: Some(init),
        runtime_dir: Some(runtime.path().to_path_buf()),
        ..SandboxOptions::default()
    };
    let spawner = Arc::new(InitSpawner::start_with(&options).expect("an init spawner"));
    let sandbox = Sandbox::with_options(
        airlock::policy::load_profile("untrusted").expect("the untrusted profile"),
        options,
    )
    .expect("a sandbox");
    let mut samples: Vec<(Vec<f64>, Duration)> = WAYS.iter().map(|_| Default::default()).collect();
    for iteration in 0..runs + 5 {
        for position in 0..WAYS.len() {
            let index = (position + iteration) % WAYS.len();
            let (wall, cpu) = measure(&sandbox, &spawner, WAYS[index].0);
            if iteration >= 5 {
                samples[index].0.push(wall.as_secs_f64() * 1000.0);
                samples[index].1 += cpu;
            }
        }
    }
    println!("supervisor cost of /bin/true, {runs} runs each, interleaved:");
    for ((_, name), (mut walls, cpu)) in WAYS.iter().zip(samples) {
        walls.sort_by(f64::total_cmp);
        println!(
            "  {name:<36} p50 {:6.2} ms wall, {:6.3} ms CPU per run in this process",
            walls[walls.len() / 2],
            cpu.as_secs_f64() * 1000.0 / runs as f64
        );
    }
}

/// One run's wall time and this process's CPU time during it.
fn measure(sandbox: &Sandbox, spawner: &Arc<InitSpawner>, way: Way) -> (Duration, Duration) {
    let (cpu_before, started) = (process_cpu_time(), Instant::now());
    let command = sandbox.command("/bin/true");
    let command = match way {
        Way::RunWithSpawner | Way::SpawnWithSpawner => command.init_spawner(Arc::clone(spawner)),
        Way::Run | Way::Spawn => command,
    };
    let result = match way {
        Way::Run | Way::RunWithSpawner => command.run(),
        Way::Spawn | Way::SpawnWithSpawner => {
            let mut handle = command.stream_output().spawn().expect("spawn");
            for _ in handle.events().into_iter().flatten() {}
            handle.wait()
        }
    }
    .expect("the run");
    assert!(result.success(), "{result:?}");
    (started.elapsed(), process_cpu_time() - cpu_before)
}

fn process_cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage of this process");
    let to_duration = |time: nix::sys::time::TimeVal| {
        Duration::new(time.tv_sec() as u64, time.tv_usec() as u32 * 1000)
    };
    to_duration(usage.user_time()) + to_duration(usage.system_time())
}

//! Warm start through the library: prepared sandboxes give a run exactly a cold run's
//! isolation, account for the run alone, share nothing between runs, and leave nothing behind
//! (after a run, a shutdown, an expiry, or the death of the process holding the pool).

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::api::{
    load_profile, ErrorKind, Policy, RunStatus, Sandbox, SandboxOptions, WarmBudget,
    WarmInterpreter, WarmOptions, WarmPool,
};

/// The tests look for leftovers named after this process: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const READY: Duration = Duration::from_secs(30);

fn options() -> SandboxOptions {
    SandboxOptions {
        init_program: Some(env!("CARGO_BIN_EXE_airlock").into()),
        ..SandboxOptions::default()
    }
}

fn sandbox_with(policy: Policy, options: SandboxOptions) -> Sandbox {
    Sandbox::with_options(policy, options).unwrap()
}

fn untrusted() -> Sandbox {
    sandbox_with(load_profile("untrusted").unwrap(), options())
}

/// A pool of `target` ready sandboxes, or `None` (said) where the native backend cannot run.
fn ready_pool(sandbox: &Sandbox, target: usize) -> Option<WarmPool> {
    if !support::sandbox_available() {
        eprintln!("skipped: the native backend cannot run here");
        return None;
    }
    let pool = sandbox.warm(WarmOptions::new(target)).unwrap();
    assert!(pool.wait_ready(target, READY), "{:?}", pool.stats());
    Some(pool)
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The policies the comparison covers: the default profile, a tier, no network namespace,
/// extra paths, and the options that change the layers (no cgroup).
fn configurations() -> Vec<(&'static str, Sandbox)> {
    let base = || load_profile("untrusted").unwrap();
    let mut small = base();
    assert!(airlock::policy::tier(&mut small, "small"));
    let mut host_net = base();
    host_net.network.mode = airlock::policy::NetworkMode::Host;
    let mut paths = base();
    paths.filesystem.read_only.push("/usr/share/doc".into());
    let no_cgroup = SandboxOptions {
        no_cgroup: true,
        ..options()
    };
    vec![
        ("untrusted", sandbox_with(base(), options())),
        ("untrusted + tier small", sandbox_with(small, options())),
        // Host networking leaves the profile's required net_ns missing: accepted here, on
        // both paths alike, so that the comparison covers a run without one.
        (
            "untrusted + host network (degradation accepted)",
            sandbox_with(
                host_net,
                SandboxOptions {
                    allow_degraded: true,
                    ..options()
                },
            ),
        ),
        ("untrusted + read-only path", sandbox_with(paths, options())),
        ("untrusted --no-cgroup", sandbox_with(base(), no_cgroup)),
    ]
}

#[test]
fn a_warm_run_has_exactly_the_isolation_of_a_cold_run() {
    let _serial = serial();
    for (name, sandbox) in configurations() {
        let Some(pool) = ready_pool(&sandbox, 1) else {
            return;
        };
        let warm = pool.command("/bin/true").run().unwrap();
        let cold = sandbox.command("/bin/true").run().unwrap();
        assert!(
            warm.success() && cold.success(),
            "{name}: {warm:?} / {cold:?}"
        );
        assert_eq!(warm.isolation, cold.isolation, "{name}");
        assert_eq!(warm.warnings, cold.warnings, "{name}");
        assert_eq!(warm.backend, cold.backend, "{name}");
        assert_eq!(pool.stats().served, 1, "{name}: {:?}", pool.stats());
    }
}

#[test]
fn a_warm_run_takes_argv_env_stdin_and_files() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = ready_pool(&sandbox, 1) else {
        return;
    };
    let code = "import os, sys; print(open('in/data.txt').read(), os.environ['GREETING'], sys.stdin.read(), sys.argv[1], os.getcwd() == os.environ['HOME'])";
    let result = pool
        .command(support::PYTHON)
        .args(["-c", code, "arg"])
        .env("GREETING", "hi")
        .file("in/data.txt", "staged")
        .stdin("input")
        .run()
        .unwrap();
    assert!(result.success(), "{result:?}");
    assert_eq!(result.stdout.as_deref(), Some("staged hi input arg True\n"));
    let escaping = pool.command("/bin/true").file("../x", "no").run();
    assert_eq!(escaping.unwrap_err().kind(), ErrorKind::CommandInvalid);
}

/// Streaming and cancelling go through the same handle as a cold run's.
#[test]
fn a_warm_run_can_be_spawned_and_cancelled() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = ready_pool(&sandbox, 1) else {
        return;
    };
    let handle = pool.command("/bin/sleep").arg("30").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    handle.cancel();
    let result = handle.wait().unwrap();
    assert_eq!(result.status, RunStatus::Cancelled, "{result:?}");
    assert!(result.wall_ms < 10_000, "{result:?}");
}

/// What a warm run cannot do is refused with a typed error before a sandbox is spent; a
/// backend warm start does not prepare is refused when the pool is made.
#[test]
fn what_a_warm_run_cannot_do_is_refused() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = ready_pool(&sandbox, 1) else {
        return;
    };
    for command in [
        pool.command("/bin/true").tty(true),
        pool.command("/bin/true").keep_workdir(true),
        pool.command("/bin/true")
            .stdin_from(support::api::Input::Inherit),
    ] {
        let error = command.run().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::CommandInvalid, "{error}");
        assert!(error.to_string().contains("cold"), "{error}");
    }
    assert_eq!(pool.stats().served, 0);
    let trusted = sandbox_with(load_profile("trusted").unwrap(), options());
    let error = trusted.warm(WarmOptions::new(1)).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BackendUnavailable, "{error}");
}

/// The run's clocks start with its command: a sandbox ready for longer than the wall-clock
/// limit still gets the whole limit, and reports the run's time, not its idle time.
#[test]
fn the_clocks_start_when_the_command_arrives() {
    let _serial = serial();
    let mut policy = load_profile("untrusted").unwrap();
    policy.limits.wall_time = "1s".parse().unwrap();
    let sandbox = sandbox_with(policy, options());
    let Some(pool) = ready_pool(&sandbox, 1) else {
        return;
    };
    std::thread::sleep(Duration::from_millis(1500));
    let result = pool.command("/bin/sleep").arg("0.2").run().unwrap();
    assert!(result.success(), "{result:?}");
    assert!(result.wall_ms < 1000, "{result:?}");
    let timed_out = {
        pool.wait_ready(1, READY);
        pool.command("/bin/sleep").arg("5").run().unwrap()
    };
    assert_eq!(timed_out.status, RunStatus::Timeout, "{timed_out:?}");
}

/// The CPU time and peak memory are the run's: the preparation (the root built, the filters
/// compiled) is not in them, and what the program uses is.
#[test]
fn accounting_covers_the_run_not_the_preparation() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = ready_pool(&sandbox, 1) else {
        return;
    };
    let cpu = |r: &airlock::RunResult| r.cpu_user_ms + r.cpu_sys_ms;
    let mut idle = Vec::new();
    for _ in 0..3 {
        pool.wait_ready(1, READY);
        idle.push(pool.command("/bin/true").run().unwrap());
    }
    let least = idle.iter().map(cpu).min().unwrap();
    assert!(
        least <= 2,
        "a warm /bin/true reported {least} ms of CPU: {idle:?}"
    );
    pool.wait_ready(1, READY);
    let burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1";
    let busy = pool
        .command(support::PYTHON)
        .args(["-c", burn])
        .run()
        .unwrap();
    assert!(busy.success(), "{busy:?}");
    assert!(cpu(&busy) >= 250, "{busy:?}");
    let peak = busy.peak_memory_bytes.unwrap_or(0);
    assert!(peak >= 64 << 20, "{busy:?}");
    let quiet_peak = idle
        .iter()
        .filter_map(|r| r.peak_memory_bytes)
        .min()
        .unwrap_or(0);
    assert!(quiet_peak < 16 << 20, "{idle:?}");
}

/// Each run gets a sandbox of its own: a file, an environment change or a process of one run
/// is not there for the next.
#[test]
fn nothing_passes_from_one_warm_run_to_the_next() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = ready_pool(&sandbox, 2) else {
        return;
    };
    let first = "import os, subprocess\nopen('/tmp/mark', 'w').write('x')\nopen('mark', 'w').write('x')\nos.environ['MARK'] = '1'\nsubprocess.Popen(['/bin/sleep', '30'], start_new_session=True)\nprint(os.getpid())";
    let second = "import os\nprint(os.path.exists('/tmp/mark'), os.path.exists('mark'), 'MARK' in os.environ, [p for p in os.listdir('/proc') if p.isdigit()] == [str(os.getpid())])";
    let a = pool
        .command(support::PYTHON)
        .args(["-c", first])
        .run()
        .unwrap();
    assert!(a.success(), "{a:?}");
    let b = pool
        .command(support::PYTHON)
        .args(["-c", second])
        .run()
        .unwrap();
    assert!(b.success(), "{b:?}");
    assert_eq!(
        b.stdout.as_deref(),
        Some("False False False True\n"),
        "{b:?}"
    );
}

/// The sandboxes of one plan (a pool plans once and fills in each sandbox's own names): each
/// run has a workdir of its own, and its `HOME` is that workdir.
#[test]
fn the_sandboxes_of_one_plan_each_have_their_own_run() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = ready_pool(&sandbox, 3) else {
        return;
    };
    let mut seen = Vec::new();
    for _ in 0..3 {
        let result = pool
            .command("/bin/sh")
            .args(["-c", "pwd; echo \"$HOME\""])
            .run()
            .unwrap();
        assert!(result.success(), "{result:?}");
        let out = result.stdout.clone().unwrap();
        let (pwd, home) = out.trim().split_once('\n').unwrap();
        assert_eq!(pwd, home, "{result:?}");
        assert!(result
            .details
            .iter()
            .any(|d| d == airlock::warm::WARM_DETAIL));
        seen.push(pwd.to_string());
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 3, "{seen:?}");
}

/// Shutting a pool down tears every sandbox down; so do expiry and each run's end.
#[test]
fn shutdown_expiry_and_runs_leave_nothing_behind() {
    let _serial = serial();
    let sandbox = untrusted();
    let mut options = WarmOptions::new(3);
    options.idle_expiry = Some(Duration::from_millis(300));
    if !support::sandbox_available() {
        return;
    }
    let pool = sandbox.warm(options).unwrap();
    assert!(pool.wait_ready(3, READY), "{:?}", pool.stats());
    for _ in 0..3 {
        assert!(pool.command("/bin/true").run().unwrap().success());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.stats().expired < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(pool.stats().expired >= 3, "{:?}", pool.stats());
    pool.shutdown();
    assert_eq!(leftovers(std::process::id()), Vec::<String>::new());
}

#[test]
fn a_budget_caps_sandboxes_across_pools() {
    let _serial = serial();
    if !support::sandbox_available() {
        return;
    }
    let budget = WarmBudget::new(3);
    let mut options = WarmOptions::new(2);
    options.budget = Some(budget.clone());
    let first = untrusted().warm(options.clone()).unwrap();
    let second = untrusted().warm(options).unwrap();
    assert!(first.wait_ready(1, READY) && second.wait_ready(1, READY));
    std::thread::sleep(Duration::from_millis(500));
    let held = first.stats().ready + second.stats().ready;
    assert_eq!(held, 3, "{:?} {:?}", first.stats(), second.stats());
    assert!(budget.in_use() <= 3);
    drop((first, second));
    assert_eq!(budget.in_use(), 0);
}

/// This process's children started as `airlock __init spawner`: a pool's init spawner and
/// the inits it forked (`CLONE_PARENT` makes them this process's children too).
fn spawned_children() -> Vec<i32> {
    own_children(|pid, _| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        cmdline.ends_with(b"__init\0spawner\0")
    })
}

/// This process's children (by `/proc/<pid>/stat`) that `keep` takes, given their pid and state.
fn own_children(keep: impl Fn(i32, &str) -> bool) -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let mut fields = stat.rsplit(')').next().unwrap_or("").split_whitespace();
        let (state, parent) = (fields.next().unwrap_or(""), fields.next());
        if parent == Some(me.as_str()) && keep(pid, state) {
            found.push(pid);
        }
    }
    found
}

/// A pool's inits are forked by its one spawner as this process's own children (the pool
/// reaps them as executed ones); when the spawner dies, the pool executes its inits again,
/// and shutting the pool down leaves no spawner and no init behind.
#[test]
fn a_pool_forks_its_inits_from_one_spawner() {
    let _serial = serial();
    let sandbox = untrusted();
    let Some(pool) = ready_pool(&sandbox, 3) else {
        return;
    };
    assert!(pool.wait_settled(READY), "{:?}", pool.stats());
    let spawned = spawned_children();
    assert_eq!(spawned.len(), 4, "the spawner and 3 inits: {spawned:?}");
    let spawner = *spawned.iter().min().unwrap();
    let result = pool.command("/bin/true").run().unwrap();
    assert!(result.success(), "{result:?}");
    // Killed between requests (a request it dies in fails that one preparation).
    assert!(pool.wait_settled(READY), "{:?}", pool.stats());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(spawner),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for _ in 0..4 {
        assert!(pool.wait_ready(1, READY), "{:?}", pool.stats());
        let result = pool.command("/bin/true").run().unwrap();
        assert!(result.success(), "{result:?}");
    }
    assert_eq!(pool.stats().failed, 0, "{:?}", pool.stats());
    pool.shutdown();
    assert_eq!(spawned_children(), Vec::<i32>::new());
    assert_eq!(leftovers(std::process::id()), Vec::<String>::new());
}

/// A pool's command that finds no sandbox ready runs cold with its init forked by the pool's
/// spawner too (an executed init's start-up made the cold fallbacks of a saturated pool its
/// dearest runs); it is served like any cold run and leaves nothing behind.
#[test]
fn a_pools_cold_fallback_is_forked_by_its_spawner() {
    let _serial = serial();
    let sandbox = untrusted();
    if !support::sandbox_available() {
        eprintln!("skipped: the native backend cannot run here");
        return;
    }
    let mut options = WarmOptions::new(1);
    options.refill = false;
    let pool = sandbox.warm(options).unwrap();
    assert!(pool.wait_ready(1, READY), "{:?}", pool.stats());
    assert!(pool.command("/bin/true").run().unwrap().success());
    let handle = pool.command("/bin/sleep").arg("30").spawn().unwrap();
    let forked = spawned_children().contains(&(handle.init_pid() as i32));
    handle.cancel();
    let result = handle.wait().unwrap();
    assert_eq!(result.status, RunStatus::Cancelled, "{result:?}");
    let warm = airlock::warm::WARM_DETAIL;
    assert!(!result.details.iter().any(|d| d == warm), "{result:?}");
    assert_eq!(pool.stats().cold_fallbacks, 1, "{:?}", pool.stats());
    assert!(
        forked,
        "the cold run's init was executed, not forked by the pool's spawner"
    );
    pool.shutdown();
    assert_eq!(spawned_children(), Vec::<i32>::new());
    assert_eq!(leftovers(std::process::id()), Vec::<String>::new());
}

/// A long-lived caller's cold runs have their inits forked by a spawner
/// (`Command::init_spawner`). When it dies with a request in flight, that run's init is
/// executed on fresh descriptors: every run of a batch succeeds, and nothing is left (no
/// spawner, no init, not even a zombie; no cgroup, no run directory).
#[test]
fn cold_runs_go_on_when_their_init_spawner_dies_mid_request() {
    const ROUNDS: u64 = 6;
    const RUNS: usize = 6;
    let _serial = serial();
    if !support::sandbox_available() {
        eprintln!("skipped: the native backend cannot run here");
        return;
    }
    let sandbox = untrusted();
    let started = Instant::now();
    for round in 0..ROUNDS {
        let spawner = std::sync::Arc::new(airlock::InitSpawner::start(&sandbox).unwrap());
        let pid = nix::unistd::Pid::from_raw(spawner.pid().unwrap() as i32);
        // First stopped, so that a request surely waits for its answer when the kill comes;
        // then killed at different moments of a batch.
        if round == 0 {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        }
        std::thread::scope(|scope| {
            let runs: Vec<_> = (0..RUNS)
                .map(|i| {
                    let command = sandbox
                        .command("/bin/echo")
                        .arg(format!("{round}.{i}"))
                        .init_spawner(std::sync::Arc::clone(&spawner));
                    scope.spawn(move || command.run())
                })
                .collect();
            let delay = if round == 0 { 300 } else { 4 * round };
            std::thread::sleep(Duration::from_millis(delay));
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
            for (i, run) in runs.into_iter().enumerate() {
                let result = run.join().unwrap();
                let result = result.unwrap_or_else(|e| panic!("round {round}, run {i}: {e}"));
                assert!(result.success(), "round {round}, run {i}: {result:?}");
                assert_eq!(
                    result.stdout.as_deref(),
                    Some(format!("{round}.{i}\n").as_str())
                );
            }
        });
        if round == 0 {
            assert!(!spawner.is_usable(), "the stopped spawner was asked again");
        }
        spawner.close();
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let mut left: Vec<String> = spawned_children().iter().map(|p| p.to_string()).collect();
        left.extend(zombie_children().iter().map(|p| format!("zombie {p}")));
        left.extend(leftovers(std::process::id()));
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(left, Vec::<String>::new());
}

/// This process's children that ended and were not reaped.
fn zombie_children() -> Vec<i32> {
    own_children(|_, state| state == "Z")
}

/// SIGKILL of the process holding a pool: every prepared sandbox (and the one running) sees
/// its supervisor gone and tears itself down.
#[test]
fn killing_the_pool_owner_kills_its_sandboxes() {
    let _serial = serial();
    if !support::sandbox_available() {
        eprintln!("skipped: the native backend cannot run here");
        return;
    }
    let mut owner = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "pool_owner",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("AIRLOCK_WARM_POOL_OWNER", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(owner.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("OWNER READY"));
    let owner_pid = owner.id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(owner_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    owner.wait().unwrap();
    assert!(ready.is_some(), "the pool owner never got ready");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = leftovers(owner_pid);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = leftovers(owner_pid);
    }
    assert_eq!(left, Vec::<String>::new());
    let spawned: Vec<String> = ready
        .unwrap()
        .split_whitespace()
        .skip(2)
        .map(String::from)
        .collect();
    assert!(!spawned.is_empty(), "the pool owner has no init spawner");
    let alive = || {
        spawned
            .iter()
            .filter(|pid| Path::new(&format!("/proc/{pid}/cmdline")).exists())
            .filter(|pid| {
                !std::fs::read(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .is_empty()
            })
            .count()
    };
    while alive() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        alive(),
        0,
        "the spawner or an init outlived the pool owner: {spawned:?}"
    );
}

/// The process [`killing_the_pool_owner_kills_its_sandboxes`] kills: three sandboxes ready and
/// one run going.
#[test]
#[ignore = "run by killing_the_pool_owner_kills_its_sandboxes"]
fn pool_owner() {
    if std::env::var_os("AIRLOCK_WARM_POOL_OWNER").is_none() {
        return;
    }
    let pool = untrusted().warm(WarmOptions::new(4)).unwrap();
    assert!(pool.wait_ready(4, READY));
    let _running = pool.command("/bin/sleep").arg("60").spawn().unwrap();
    assert!(pool.wait_ready(3, READY));
    // The pool's init spawner and the inits it forked, which must not outlive this process.
    let spawned: Vec<String> = spawned_children().iter().map(i32::to_string).collect();
    println!("OWNER READY {}", spawned.join(" "));
    std::thread::sleep(Duration::from_secs(60));
}

/// What the runs of the supervisor `pid` left: processes in their cgroups, cgroups and run
/// directories named `run-<pid>-*`.
fn leftovers(pid: u32) -> Vec<String> {
    let prefix = format!("run-{pid}-");
    let mut found = Vec::new();
    let mut places = vec![Path::new("/run/airlock").to_path_buf()];
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        places.push(hierarchy.path().join("airlock"));
    }
    for place in places {
        for entry in std::fs::read_dir(&place).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(entry.path().display().to_string());
            }
        }
    }
    found
}

fn python_pool(preload: &[&str], target: usize) -> Option<WarmPool> {
    python_pool_of(&untrusted(), preload, target)
}

/// A ready pool of `sandbox`'s sandboxes with Python started and `preload` imported, or
/// `None` (said) where the native backend cannot run.
fn python_pool_of(sandbox: &Sandbox, preload: &[&str], target: usize) -> Option<WarmPool> {
    if !support::sandbox_available() {
        eprintln!("skipped: the native backend cannot run here");
        return None;
    }
    let mut options = WarmOptions::new(target);
    options.interpreter = Some(WarmInterpreter::python(support::PYTHON, preload));
    let pool = sandbox.warm(options).unwrap();
    assert!(pool.wait_ready(target, READY), "{:?}", pool.stats());
    Some(pool)
}

/// A started interpreter runs the code as `python3 -c` would, with its modules already
/// imported, the command's arguments, environment and stdin, and a cold run's isolation.
#[test]
fn a_started_interpreter_runs_code_with_its_modules_imported() {
    let _serial = serial();
    let Some(pool) = python_pool(&["json", "re"], 1) else {
        return;
    };
    let code = "import sys, os\nprint('json' in sys.modules, 're' in sys.modules, sys.argv, os.environ['GREETING'], sys.stdin.read(), __name__)";
    let warm = pool
        .code(code)
        .unwrap()
        .arg("one")
        .env("GREETING", "hi")
        .stdin("input")
        .run()
        .unwrap();
    assert!(warm.success(), "{warm:?}");
    assert_eq!(
        warm.stdout.as_deref(),
        Some("True True ['-c', 'one'] hi input __main__\n")
    );
    let cold = untrusted()
        .command(support::PYTHON)
        .args(["-c", "pass"])
        .run()
        .unwrap();
    assert_eq!(warm.isolation, cold.isolation);
    let failing = pool.code("raise SystemExit(3)").unwrap();
    pool.wait_ready(1, READY);
    assert_eq!(failing.run().unwrap().exit_code, Some(3));
    pool.wait_ready(1, READY);
    let error = pool.code("1/0").unwrap().run().unwrap();
    assert_eq!(error.exit_code, Some(1));
    assert!(error
        .stderr
        .unwrap_or_default()
        .contains("ZeroDivisionError"));
}

/// Each interpreter serves one run: a module attribute, an environment change, a file in
/// /tmp and /dev/shm, a background process, the `random` sequence, `os.urandom` and the hash
/// seed of one run are not the next one's (the two sandboxes were prepared side by side), and
/// the first run's background process is gone from the host too.
#[test]
fn nothing_passes_between_runs_of_started_interpreters() {
    let _serial = serial();
    let Some(pool) = python_pool(&["json", "random"], 2) else {
        return;
    };
    let marker = format!("31.{}", std::process::id());
    let probe = format!(
        r#"import json, os, random, subprocess
procs = [p for p in os.listdir('/proc') if p.isdigit()]
sleeping = any(b'{marker}' in open(f'/proc/{{p}}/cmdline', 'rb').read() for p in procs)
print(hasattr(json, 'marker'), 'MARK' in os.environ, os.path.exists('/tmp/mark'), os.path.exists('/dev/shm/mark'), sleeping, random.random(), os.urandom(16).hex(), hash('airlock'))
json.marker = 1
os.environ['MARK'] = '1'
open('/tmp/mark', 'w').write('x')
try:
    open('/dev/shm/mark', 'w').write('x')
except OSError:
    pass
subprocess.Popen(['/bin/sleep', '{marker}'], start_new_session=True)"#
    );
    let first = pool.code(&probe).unwrap().run().unwrap();
    let second = pool.code(&probe).unwrap().run().unwrap();
    assert!(first.success() && second.success(), "{first:?} {second:?}");
    let fields = |r: &airlock::RunResult| -> Vec<String> {
        r.stdout
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let (a, b) = (fields(&first), fields(&second));
    let clean = ["False", "False", "False", "False", "False"];
    assert_eq!(&a[..5], clean, "{first:?}");
    assert_eq!(&b[..5], clean, "{second:?}");
    assert_ne!(a[5], b[5], "the random sequence repeated");
    assert_ne!(a[6], b[6], "os.urandom repeated");
    assert_ne!(a[7], b[7], "the hash seed repeated");
    drop(pool);
    let deadline = Instant::now() + Duration::from_secs(3);
    while !support::all_processes_with(&marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = support::all_processes_with(&marker);
    assert!(
        left.is_empty(),
        "a run's background process outlived it: {left:?}"
    );
}

/// What the interpreter does ahead of its run (a rehearsal on empty code, its objects frozen
/// for the collector) shows nothing to the code: `sys.modules` is a cold `python3 -c`'s, and
/// the code's own garbage is still collected at its exit.
#[test]
fn a_started_interpreters_preparation_is_invisible_to_the_code() {
    let _serial = serial();
    let Some(pool) = python_pool(&[], 1) else {
        return;
    };
    let modules = "import sys; print(sorted(sys.modules))";
    let warm = pool.code(modules).unwrap().run().unwrap();
    let cold = untrusted()
        .command(support::PYTHON)
        .args(["-c", modules])
        .run()
        .unwrap();
    assert!(warm.success() && cold.success(), "{warm:?} {cold:?}");
    assert_eq!(warm.stdout, cold.stdout);
    pool.wait_ready(1, READY);
    let cycle = "class Cycle:\n    def __del__(self):\n        print('collected')\nc = Cycle()\nc.me = c\ndel c";
    let collected = pool.code(cycle).unwrap().run().unwrap();
    assert_eq!(
        collected.stdout.as_deref(),
        Some("collected\n"),
        "{collected:?}"
    );
}

/// A started interpreter's CPU is the run's: its start and its preloads' imports (tens of
/// milliseconds, spent while the sandbox was prepared) are not in `pass`'s figure, and code
/// that burns 200 ms of CPU reports about that.
#[test]
fn a_started_interpreters_cpu_is_the_runs() {
    let _serial = serial();
    let preload = ["json", "re", "decimal", "email.message", "http.client"];
    let Some(pool) = python_pool(&preload, 1) else {
        return;
    };
    let cpu = |r: &airlock::RunResult| r.cpu_user_ms + r.cpu_sys_ms;
    let cold_start = untrusted()
        .command(support::PYTHON)
        .args(["-c", &format!("import {}", preload.join(", "))])
        .run()
        .unwrap();
    let idle = pool.code("pass").unwrap().run().unwrap();
    assert!(idle.success(), "{idle:?}");
    assert!(
        cpu(&idle) * 4 < cpu(&cold_start) && cpu(&idle) <= 15,
        "a started interpreter's `pass` reported {} ms of CPU, the interpreter's start {} ms",
        cpu(&idle),
        cpu(&cold_start)
    );
    pool.wait_ready(1, READY);
    let burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass";
    let busy = pool.code(burn).unwrap().run().unwrap();
    assert!(busy.success(), "{busy:?}");
    assert!((195..=230).contains(&cpu(&busy)), "{busy:?}");
}

/// The process that holds a started interpreter's address space (so that its exit is
/// reported before the teardown) changes nothing the code relies on: `wait` finds no child,
/// `ctypes` imports, and output written before an `os._exit` (which skips the shim's own
/// closing of the descriptors the holder shares) still arrives, with the exit status.
#[test]
fn the_address_space_holder_is_invisible_to_the_code() {
    let _serial = serial();
    let Some(pool) = python_pool(&["json"], 1) else {
        return;
    };
    let code = "import os, sys, ctypes\ntry:\n    os.wait()\nexcept ChildProcessError:\n    print('no child', ctypes.sizeof(ctypes.c_int))\nsys.stdout.flush()\nos._exit(3)";
    let run = pool.code(code).unwrap().run().unwrap();
    assert_eq!(run.exit_code, Some(3), "{run:?}");
    assert_eq!(run.stdout.as_deref(), Some("no child 4\n"), "{run:?}");
}

/// The holder never holds a run back or outlives its sandbox: code that leaves without the
/// shim's closing of the shared descriptors (an `exec`, a signal, the wall-clock limit) still
/// ends with its own status and its output, within the limit, and once the pool is gone no
/// process of the shim (holder included) is left.
#[test]
fn the_address_space_holder_never_outlives_its_run() {
    let _serial = serial();
    let mut policy = load_profile("untrusted").unwrap();
    policy.limits.wall_time = "3s".parse().unwrap();
    let Some(pool) = python_pool_of(&sandbox_with(policy, options()), &["json"], 1) else {
        return;
    };
    let run = |code: &str| {
        assert!(pool.wait_ready(1, READY), "{:?}", pool.stats());
        pool.code(code).unwrap().run().unwrap()
    };
    let exec = run("import os\nos.execv('/bin/echo', ['echo', 'from echo'])");
    assert!(exec.success(), "{exec:?}");
    assert_eq!(exec.stdout.as_deref(), Some("from echo\n"), "{exec:?}");
    assert!(exec.wall_ms < 3000, "{exec:?}");
    let killed = run("import os\nprint('before', flush=True)\nos.kill(os.getpid(), 9)");
    assert_eq!(killed.signal, Some(9), "{killed:?}");
    assert_eq!(killed.stdout.as_deref(), Some("before\n"), "{killed:?}");
    assert!(killed.wall_ms < 3000, "{killed:?}");
    let looping = run("while True:\n    pass");
    assert_eq!(looping.status, RunStatus::Timeout, "{looping:?}");
    drop(pool);
    let left = shim_processes();
    assert!(left.is_empty(), "shim processes left: {left:?}");
}

#[test]
fn an_interpreter_that_cannot_start_is_reported() {
    let _serial = serial();
    if !support::sandbox_available() {
        return;
    }
    let mut options = WarmOptions::new(1);
    options.interpreter = Some(WarmInterpreter::python(
        support::PYTHON,
        &["no_such_module_xyz"],
    ));
    let pool = untrusted().warm(options).unwrap();
    assert!(!pool.wait_ready(1, Duration::from_secs(5)));
    let stats = pool.stats();
    assert!(stats.failed > 0, "{stats:?}");
    assert!(
        stats.last_error.unwrap_or_default().contains("preloaded"),
        "{:?}",
        pool.stats()
    );
    let plain = untrusted().warm(WarmOptions::new(0)).unwrap();
    assert_eq!(
        plain.code("pass").unwrap_err().kind(),
        ErrorKind::CommandInvalid
    );
}

/// `airlock exec --warm` hands Python code to an interpreter started in a prepared sandbox:
/// the code sees what `python3 -c` would (plus the preloads), and the CLI leaves nothing
/// behind.
#[test]
fn exec_warm_runs_code_on_a_started_interpreter() {
    let _serial = serial();
    if !support::sandbox_available() {
        return;
    }
    let code = "import sys; print('csv' in sys.modules, 'json' in sys.modules, sys.argv[1:])";
    let run = |flags: &[&str]| {
        let mut args = vec!["exec", "--json"];
        args.extend_from_slice(flags);
        args.extend(["python", code, "x"]);
        let out = support::airlock(&args);
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (result["stdout"].as_str().unwrap_or("").to_string(), result)
    };
    let (warm, result) = run(&["--warm", "--preload", "csv"]);
    assert_eq!(warm, "True False ['x']\n", "{result}");
    let (plain, _) = run(&["--warm"]);
    let (cold, _) = run(&[]);
    assert_eq!(plain, cold);
    assert_eq!(cold, "False False ['x']\n");
}

/// `airlock exec python` runs on an interpreter zygote when the registry configures one for
/// Python (`zygote = { preload = [...] }`), and with `--zygote`: the code sees the preloads
/// and its arguments, and the result says it was forked from a zygote. A zygote for another
/// interpreter is refused with the fix.
#[test]
fn exec_uses_the_zygote_configured_for_python() {
    let _serial = serial();
    if !support::sandbox_available() {
        eprintln!("skipped: the native backend is not available here");
        return;
    }
    support::fresh_zygote_bin();
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("interpreters.toml");
    std::fs::write(
        &registry,
        "[interpreters.python3]\nargv = [\"/usr/bin/python3\", \"-c\", \"{code}\"]\nzygote = { preload = [\"csv\"] }\n",
    )
    .unwrap();
    let code = "import sys; print('csv' in sys.modules, sys.argv[1:])";
    let run = |flags: &[&str]| {
        let mut args = vec!["exec", "--json"];
        args.extend_from_slice(flags);
        args.extend(["python", code, "x"]);
        let out = support::airlock(&args);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let forked = |result: &serde_json::Value| {
        result["details"]
            .as_array()
            .is_some_and(|d| d.iter().any(|l| l == "forked from an interpreter zygote"))
    };
    let configured = run(&["--interpreters", registry.to_str().unwrap()]);
    assert_eq!(configured["stdout"], "True ['x']\n", "{configured}");
    assert!(forked(&configured), "{configured}");
    let flagged = run(&["--zygote"]);
    assert_eq!(flagged["stdout"], "False ['x']\n", "{flagged}");
    assert!(forked(&flagged), "{flagged}");
    let cold = run(&[]);
    assert!(!forked(&cold), "{cold}");
    let bash = support::airlock(&["exec", "--zygote", "bash", "echo hi"]);
    assert_ne!(bash.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&bash.stderr).contains("Python code only"));
}

/// The shim's processes (a started interpreter and its address-space holder) alive now.
fn shim_processes() -> Vec<u32> {
    support::all_processes_with(support::SHIM_TEXT)
}

/// Waits up to 3 s for `pids`' processes to be gone; those still alive.
fn still_alive_after_teardown(pids: &[u32]) -> Vec<u32> {
    let alive = || -> Vec<u32> {
        let now = shim_processes();
        pids.iter().copied().filter(|p| now.contains(p)).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while !alive().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    alive()
}

/// The host's wall clock in nanoseconds (what the code's `time.time_ns()` reads too: no
/// time namespace).
fn host_clock_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The helpers' time stamps: the forked one must have written (or the test proves nothing),
/// and none may be later than the moment the caller had the result.
fn assert_no_stamp_after(stamps: &[(String, u128)], result_at: u128, run: &dyn std::fmt::Debug) {
    assert!(
        stamps.iter().any(|(name, _)| name.starts_with("late-fork")),
        "the forked helper never wrote, so this proves nothing: {stamps:?} {run:?}"
    );
    let late: Vec<String> = stamps
        .iter()
        .filter(|(_, stamp)| *stamp > result_at)
        .map(|(name, stamp)| {
            format!(
                "{name} wrote {} µs after the result",
                (stamp - result_at) / 1000
            )
        })
        .collect();
    assert!(late.is_empty(), "a helper acted after the result: {late:?}");
}

/// The latest time stamp the run's stragglers wrote in `dir` (one file each), by file.
fn latest_stamps(dir: &Path) -> Vec<(String, u128)> {
    let mut stamps = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if let Some(stamp) = text.split_whitespace().filter_map(|s| s.parse().ok()).max() {
            stamps.push((name, stamp));
        }
    }
    stamps
}

/// Code that leaves helpers behind cannot use them to act after its result is out: neither a
/// forked daemon, nor a clone of its own sharing its memory and descriptors (as the shim's
/// holder does, exit signal 0, invisible to `wait`) writes into the workdir (a host directory)
/// after the caller has the result, and none of them, nor the holder the code found and
/// stopped, outlives the sandbox. A cold run gives the same guarantee by ending every process before its
/// result; a warm run sends the outcome before its teardown, so this is the warm path's own.
#[test]
fn a_started_interpreters_helpers_cannot_act_after_its_result() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let workdir = dir.path().join("work");
    std::fs::create_dir(&workdir).unwrap();
    std::fs::set_permissions(
        &workdir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut policy = load_profile("untrusted").unwrap();
    policy.filesystem.workdir = Some(workdir.clone());
    let sandbox = sandbox_with(policy, options());
    let Some(pool) = python_pool_of(&sandbox, &["json"], 1) else {
        return;
    };
    let shims_before = shim_processes();
    let code = r#"
import ctypes, os, signal, time
def stamps(name):
    # A daemon's stdio: a helper holding the run's output pipes would hold its result back
    # until the teardown, hiding any window after it.
    null = os.open('/dev/null', os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    while True:
        os.pwrite(fd, str(time.time_ns()).encode().ljust(24), 0)
# More writers than the sandbox's one CPU: its cgroup is throttled, PID 1 with it.
writers = []
for i in range(3):
    writers.append(os.fork())
    if writers[-1] == 0:
        os.setsid()
        stamps(f'late-fork-{i}')
libc = ctypes.CDLL(None)
stack = ctypes.create_string_buffer(1 << 16)
top = ctypes.c_void_p(ctypes.addressof(stack) + (1 << 16) - 64)
loop = ctypes.c_char_p(b"exec </dev/null >/dev/null 2>&1; while :; do date +%s%N > late-clone.new; mv late-clone.new late-clone; done")
cloned = libc.clone(ctypes.cast(libc.system, ctypes.c_void_p), top, 0x100 | 0x400, loop)
print('clone', cloned)
ours = (os.getpid(), cloned, *writers)
holders = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in ours
           and open(f'/proc/{p}/cmdline', 'rb').read() == open('/proc/self/cmdline', 'rb').read()]
print('holders', holders)
for pid in holders:
    os.kill(pid, signal.SIGSTOP)
time.sleep(0.3)
print('leaving')
"#;
    let shims_during = |before: &[u32]| -> Vec<u32> {
        shim_processes()
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect()
    };
    let run = pool.code(code).unwrap().run().unwrap();
    let result_at = host_clock_ns();
    let ours = shims_during(&shims_before);
    assert!(run.success(), "{run:?}");
    let stdout = run.stdout.clone().unwrap_or_default();
    assert!(
        stdout.contains("holders [") && !stdout.contains("holders []"),
        "the code must have found the holder: {run:?}"
    );
    assert!(
        !stdout.contains("clone -1"),
        "the clone must have started: {run:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let stamps = latest_stamps(&workdir);
    for (name, stamp) in &stamps {
        let before = result_at as i128 - *stamp as i128;
        println!("{name}: last write {} µs before the result", before / 1000);
    }
    assert_no_stamp_after(&stamps, result_at, &run);
    drop(pool);
    let left = still_alive_after_teardown(&ours);
    assert!(left.is_empty(), "shim processes outlived the run: {left:?}");
}

/// Bytes of the one `write` in [`LARGE_WRITE_CODE`]: long enough (~0.3-1 s into the page
/// cache here) to be still running when the program ends.
const LARGE_WRITE: u64 = 768 << 20;

/// Code that leaves a helper (its own session, stdio on `/dev/null`) in one large `write`
/// from memory into `big` in the workdir (a host directory), and ends once the file has
/// started to grow: the write is in progress when the program ends. The buffer is untouched
/// zero pages, so it costs the run no memory of its own. With `HIDE = True` the helper makes
/// itself non-dumpable first, which hides it from PID 1's `/proc` (`hidepid=invisible`).
const LARGE_WRITE_CODE: &str = r#"
import ctypes, os, time
HIDE = False
data = bytes(768 << 20)
if os.fork() == 0:
    os.setsid()
    null = os.open('/dev/null', os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    if HIDE:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    fd = os.open('big', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    os.write(fd, data)
    os._exit(0)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        if os.stat('big').st_size > 0:
            break
    except FileNotFoundError:
        pass
    time.sleep(0.0002)
print('under way', os.stat('big').st_size)
"#;

/// A workdir on the host that the program's user owns (so that no run maps its owner, which
/// a zygote refuses), and the untrusted profile with room for [`LARGE_WRITE_CODE`]'s file
/// (its size and page cache) in it.
fn large_write_policy(dir: &Path) -> (Policy, std::path::PathBuf) {
    let workdir = dir.join("work");
    std::fs::create_dir(&workdir).unwrap();
    std::fs::set_permissions(
        &workdir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    if nix::unistd::geteuid().is_root() {
        let (uid, gid) = (
            nix::unistd::Uid::from_raw(65534),
            nix::unistd::Gid::from_raw(65534),
        );
        nix::unistd::chown(&workdir, Some(uid), Some(gid)).unwrap();
    }
    let mut policy = load_profile("untrusted").unwrap();
    policy.filesystem.workdir = Some(workdir.clone());
    policy.limits.file_size = "1GiB".parse().unwrap();
    policy.limits.memory = "2GiB".parse().unwrap();
    (policy, workdir)
}

/// Watches `file` for `span` from a run's result on: its size and modification time must not
/// change (nothing of the run writes after its result). Its size at the result.
fn unchanged_after_result(file: &Path, span: Duration) -> u64 {
    let look = || {
        let meta = std::fs::metadata(file).unwrap();
        (meta.len(), meta.modified().unwrap())
    };
    let (at_result, started) = (look(), Instant::now());
    let (mut last, mut changes) = (at_result, Vec::new());
    while started.elapsed() < span {
        let now = look();
        if now != last {
            changes.push((now.0, started.elapsed().as_micros()));
            last = now;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        changes.is_empty(),
        "{} had {} bytes at the result, then changed {} times, (bytes, µs after) first {:?}, last {:?}",
        file.display(),
        at_result.0,
        changes.len(),
        changes.first(),
        changes.last()
    );
    at_result.0
}

/// The size [`LARGE_WRITE_CODE`]'s file had at the result: the write had begun, and was cut
/// short (it was running when the program ended, so this proves something).
fn assert_large_write_cut_short(size: u64, stdout: &str) {
    println!("{} of {LARGE_WRITE} bytes written at the result", size);
    assert!(stdout.contains("under way"), "{stdout}");
    assert!(
        size > 0 && size < LARGE_WRITE,
        "the write must straddle the program's end: {size} of {LARGE_WRITE} bytes at the result"
    );
}

/// A helper's one large `write`, begun before the program ends and still running then, does
/// not go on after the result: PID 1's stop does not interrupt a system call already
/// running, so PID 1 waits until every process of its namespace is stopped or dead, and
/// kills one still busy after a few milliseconds (ending its write at the next page) before
/// it reports; a helper hidden from PID 1's `/proc` (non-dumpable) is found by its pid and
/// ends the whole namespace. With PID 1 held 300 ms after its report, the file grew for
/// those 300 ms before this wait existed (and, for the hidden helper, without the probe).
#[test]
fn a_started_interpreters_large_write_ends_before_its_result() {
    let _serial = serial();
    for hide in ["False", "True"] {
        let dir = tempfile::tempdir().unwrap();
        let (policy, workdir) = large_write_policy(dir.path());
        let sandbox = sandbox_with(policy, options());
        let Some(pool) = python_pool_of(&sandbox, &["json"], 1) else {
            return;
        };
        let code = LARGE_WRITE_CODE.replace("HIDE = False", &format!("HIDE = {hide}"));
        let run = pool.code(code).unwrap().run().unwrap();
        let size = unchanged_after_result(&workdir.join("big"), Duration::from_millis(500));
        assert!(run.success(), "hidden {hide}: {run:?}");
        assert_large_write_cut_short(size, run.stdout.as_deref().unwrap_or_default());
        drop(pool);
    }
}

/// A zygote run's helpers act no more after its result than a started interpreter's: forked
/// daemons and a clone sharing the program's memory, which write time stamps without pause,
/// and one large `write` still running when the program ends, change nothing in the
/// workdir (a host directory) once the caller has the result; and no process of the run
/// outlives the zygote.
#[test]
fn a_zygote_runs_helpers_cannot_act_after_its_result() {
    let _serial = serial();
    if !support::sandbox_available() {
        eprintln!("skipped: the native backend cannot run here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (policy, workdir) = large_write_policy(dir.path());
    let sandbox = sandbox_with(policy, options());
    let zygotes_before = support::all_processes_with(support::ZYGOTE_TEXT);
    let mut zygote_options = airlock::zygote::ZygoteOptions::python(&[]);
    zygote_options.binary = Some(support::fresh_zygote_bin());
    zygote_options.ready_children = 1;
    let zygote = sandbox.zygote(zygote_options).unwrap();
    let helpers = r#"
import ctypes, os, time
def stamps(name):
    null = os.open('/dev/null', os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    while True:
        os.pwrite(fd, str(time.time_ns()).encode().ljust(24), 0)
for i in range(3):
    if os.fork() == 0:
        os.setsid()
        stamps(f'late-fork-{i}')
libc = ctypes.CDLL(None)
stack = ctypes.create_string_buffer(1 << 16)
top = ctypes.c_void_p(ctypes.addressof(stack) + (1 << 16) - 64)
loop = ctypes.c_char_p(b"exec </dev/null >/dev/null 2>&1; while :; do date +%s%N > late-clone.new; mv late-clone.new late-clone; done")
print('clone', libc.clone(ctypes.cast(libc.system, ctypes.c_void_p), top, 0x100 | 0x400, loop))
time.sleep(0.3)
"#;
    let code = format!("{helpers}{LARGE_WRITE_CODE}");
    let run = zygote.run(&airlock::zygote::ZygoteRun::code(code)).unwrap();
    let result_at = host_clock_ns();
    let size = unchanged_after_result(&workdir.join("big"), Duration::from_millis(500));
    assert_eq!(run.status, RunStatus::Exited, "{run:?}");
    assert_eq!(run.exit_code, Some(0), "{run:?}");
    let stdout = run.stdout.clone().unwrap_or_default();
    assert!(
        !stdout.contains("clone -1"),
        "the clone must have started: {run:?}"
    );
    assert_large_write_cut_short(size, &stdout);
    std::fs::remove_file(workdir.join("big")).unwrap();
    let stamps = latest_stamps(&workdir);
    assert_no_stamp_after(&stamps, result_at, &run);
    drop(zygote);
    let deadline = Instant::now() + Duration::from_secs(5);
    let left = || -> Vec<u32> {
        support::all_processes_with(support::ZYGOTE_TEXT)
            .into_iter()
            .filter(|p| !zygotes_before.contains(p))
            .collect()
    };
    while !left().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        left().is_empty(),
        "zygote processes outlived the zygote: {:?}",
        left()
    );
}

/// The holder (pid 3 in the code's /proc: the interpreter's clone, sharing its memory and
/// descriptor table) gives code that goes after it nothing of the host: through `airlock exec
/// --warm`, with a secret in the CLI's environment and open on its descriptor 7, code that
/// reads every process's environment, command line and descriptors, tries to ptrace the
/// holder, writes its memory through /proc and signals it, finds neither secret; the run
/// still ends with its own status and leaves no shim process behind.
#[test]
fn the_holder_gives_code_that_takes_it_over_nothing_of_the_host() {
    let _serial = serial();
    if !support::sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    let (env_secret, fd_secret) = (
        format!("env-{}", std::process::id()),
        format!("fd-{}", host_clock_ns()),
    );
    std::fs::write(&secret_file, &fd_secret).unwrap();
    let code = r#"
import ctypes, os, signal
me = os.getpid()
seen = []
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    for name in ('environ', 'cmdline'):
        try:
            seen.append(open(f'/proc/{pid}/{name}', 'rb').read().decode('latin-1'))
        except OSError as e:
            seen.append(f'{pid}/{name}: {e}')
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            seen.append(os.readlink(f'/proc/{pid}/fd/{fd}'))
            with open(f'/proc/{pid}/fd/{fd}', 'rb') as f:
                seen.append(os.read(f.fileno(), 4096).decode('latin-1'))
        except OSError as e:
            seen.append(f'{pid}/fd/{fd}: {e}')
holders = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != me
           and open(f'/proc/{p}/cmdline', 'rb').read() == open('/proc/self/cmdline', 'rb').read()]
libc = ctypes.CDLL(None, use_errno=True)
for pid in holders:
    print('ptrace', libc.ptrace(16, pid, 0, 0), ctypes.get_errno())
    try:
        with open(f'/proc/{pid}/mem', 'r+b', buffering=0) as mem:
            buffer = ctypes.create_string_buffer(b'written through the holder')
            mem.seek(ctypes.addressof(buffer))
            mem.write(b'W')
            print('mem', buffer.value[:1])
    except OSError as e:
        print('mem', e)
    os.kill(pid, signal.SIGSTOP)
    os.kill(pid, signal.SIGCONT)
print('holders', holders)
print('\n'.join(seen))
"#;
    let shims_before = shim_processes();
    let script = "exec 7<\"$0\"; exec \"$@\"";
    let out = Command::new("/bin/bash")
        .args(["-c", script, secret_file.to_str().unwrap()])
        .arg(support::airlock_bin())
        .args(["exec", "--json", "--warm", "python", code])
        .env("AIRLOCK_HOLDER_SECRET", &env_secret)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let stdout = result["stdout"].as_str().unwrap_or_default();
    assert_eq!(result["status"], "exited", "{result}");
    assert_eq!(result["exit_code"], 0, "{result}");
    assert!(
        stdout.contains("holders [") && !stdout.contains("holders []"),
        "the code must have found the holder: {result}"
    );
    println!("{}", stdout.lines().take(3).collect::<Vec<_>>().join("\n"));
    for secret in [&env_secret, &fd_secret] {
        assert!(
            !stdout.contains(secret.as_str()),
            "{secret} reached the code: {stdout}"
        );
    }
    let ours: Vec<u32> = shim_processes()
        .into_iter()
        .filter(|p| !shims_before.contains(p))
        .collect();
    let left = still_alive_after_teardown(&ours);
    assert!(left.is_empty(), "shim processes outlived the CLI: {left:?}");
}

/// Stop games do not skew a started interpreter's CPU figure: PID 1 reads the interpreter's
/// CPU at the one stop of its preparation, so code that stops itself (continued by a child)
/// and has a child stop and continue it while it burns 300 ms of CPU reports at least that,
/// and the same games under a 1 s CPU limit end in `cpu_limit` (enforced on the host).
#[test]
fn stop_games_do_not_skew_a_started_interpreters_cpu() {
    let _serial = serial();
    let mut policy = load_profile("untrusted").unwrap();
    policy.limits.cpu_time = "1s".parse().unwrap();
    policy.limits.wall_time = "20s".parse().unwrap();
    let Some(pool) = python_pool_of(&sandbox_with(policy, options()), &["json"], 1) else {
        return;
    };
    let games = |burn: &str| {
        format!(
            r#"
import os, signal, time
me = os.getpid()
child = os.fork()
if child == 0:
    time.sleep(0.05)
    os.kill(me, signal.SIGCONT)
    while True:
        os.kill(me, signal.SIGSTOP)
        time.sleep(0.001)
        os.kill(me, signal.SIGCONT)
        time.sleep(0.002)
os.kill(me, signal.SIGSTOP)
t = time.process_time()
{burn}
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
"#
        )
    };
    let cpu = |r: &airlock::RunResult| r.cpu_user_ms + r.cpu_sys_ms;
    let busy = pool
        .code(games("while time.process_time() - t < 0.3: pass"))
        .unwrap()
        .run()
        .unwrap();
    assert!(busy.success(), "{busy:?}");
    assert!(cpu(&busy) >= 300, "the stop games hid CPU: {busy:?}");
    assert!(pool.wait_ready(1, READY), "{:?}", pool.stats());
    let endless = pool.code(games("while True: pass")).unwrap().run().unwrap();
    assert_eq!(endless.status, RunStatus::CpuLimit, "{endless:?}");
}

/// However the code leaves a started interpreter, the run ends with what happened, within its
/// limit, and no shim process (the holder included) outlives it: it stops itself with nobody
/// to continue it, crashes, kills the holder first, or execs a program that never ends.
#[test]
fn every_way_out_of_a_started_interpreter_ends_its_run() {
    let _serial = serial();
    let mut policy = load_profile("untrusted").unwrap();
    policy.limits.wall_time = "3s".parse().unwrap();
    let Some(pool) = python_pool_of(&sandbox_with(policy, options()), &[], 1) else {
        return;
    };
    let shims_before = shim_processes();
    let run = |code: &str| {
        assert!(pool.wait_ready(1, READY), "{:?}", pool.stats());
        pool.code(code).unwrap().run().unwrap()
    };
    let stopped = run(
        "import os, signal\nprint('stopping', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)",
    );
    assert_eq!(stopped.status, RunStatus::Timeout, "{stopped:?}");
    assert_eq!(stopped.stdout.as_deref(), Some("stopping\n"), "{stopped:?}");
    let crashed = run("import ctypes\nctypes.string_at(0)");
    assert_eq!(crashed.signal, Some(11), "{crashed:?}");
    let holder_killed = run("import os, signal\nfor p in os.listdir('/proc'):\n    if p.isdigit() and int(p) != os.getpid():\n        os.kill(int(p), signal.SIGKILL)\nprint('alone')");
    assert!(holder_killed.success(), "{holder_killed:?}");
    assert_eq!(holder_killed.stdout.as_deref(), Some("alone\n"));
    let sleeper = run("import os\nos.execv('/bin/sleep', ['sleep', '60'])");
    assert_eq!(sleeper.status, RunStatus::Timeout, "{sleeper:?}");
    assert!(sleeper.wall_ms < 4000, "{sleeper:?}");
    drop(pool);
    let ours: Vec<u32> = shim_processes()
        .into_iter()
        .filter(|p| !shims_before.contains(p))
        .collect();
    let left = still_alive_after_teardown(&ours);
    assert!(
        left.is_empty(),
        "shim processes outlived the pool: {left:?}"
    );
}

//! Interpreter zygotes end to end: each test forks runs from a real template (the
//! `airlock-zygote` built with these tests) and checks the result and the host.

use std::time::{Duration, Instant};

use airlock::zygote::{Zygote, ZygoteOptions, ZygoteRun};
use airlock::{Layer, Policy, RunResult, RunStatus, Sandbox};

/// Tests that count the zygote processes left over run alone: every other test's zygote
/// keeps children waiting for runs while it lives.
static LEFTOVERS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    LEFTOVERS.write().unwrap_or_else(|e| e.into_inner())
}

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    LEFTOVERS.read().unwrap_or_else(|e| e.into_inner())
}

fn untrusted() -> Policy {
    airlock::policy::load_profile("untrusted").expect("the untrusted profile")
}

fn zygote_of(policy: Policy, preload: &[&str]) -> Zygote {
    let sandbox = Sandbox::new(policy).expect("sandbox");
    let mut options = ZygoteOptions::python(preload);
    options.binary = Some(env!("CARGO_BIN_EXE_airlock-zygote").into());
    sandbox.zygote(options).expect("zygote")
}

/// A zygote of the untrusted profile with no preloads and `configure`'s options.
fn zygote_with(configure: impl FnOnce(&mut ZygoteOptions)) -> Zygote {
    let sandbox = Sandbox::new(untrusted()).expect("sandbox");
    let mut options = ZygoteOptions::python(&[]);
    options.binary = Some(env!("CARGO_BIN_EXE_airlock-zygote").into());
    configure(&mut options);
    sandbox.zygote(options).expect("zygote")
}

/// No zygote process started since `before` is left (waiting up to 10 s for the last ones
/// to exit).
fn assert_no_zygote_process_left(before: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = || -> Vec<i32> {
        zygote_processes()
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect()
    };
    while !left().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let describe = |pid: &i32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let keep = ["State", "PPid", "NSpid"];
        let fields: Vec<&str> = status
            .lines()
            .filter(|l| keep.iter().any(|k| l.starts_with(k)))
            .collect();
        format!("{pid} {fields:?}")
    };
    let left: Vec<String> = left().iter().map(describe).collect();
    assert!(left.is_empty(), "zygote processes left: {left:?}");
}

fn zygote(preload: &[&str]) -> Zygote {
    zygote_of(untrusted(), preload)
}

fn run(zygote: &Zygote, code: &str) -> RunResult {
    zygote.run(&ZygoteRun::code(code)).expect("run")
}

fn stdout(result: &RunResult) -> &str {
    assert_eq!(result.status, RunStatus::Exited, "{result:#?}");
    result.stdout.as_deref().unwrap_or_default()
}

/// Processes running the zygote binary built for these tests (other sessions on this host
/// run other builds).
fn zygote_processes() -> Vec<i32> {
    let ours = std::fs::canonicalize(env!("CARGO_BIN_EXE_airlock-zygote")).unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == ours))
        .collect()
}

#[test]
fn a_zygote_run_has_the_cold_runs_isolation() {
    let _guard = shared();
    let zygote = zygote(&["json", "re"]);
    let result = run(
        &zygote,
        "import json, re; print(json.dumps(re.findall('a', 'banana')))",
    );
    assert_eq!(stdout(&result), "[\"a\", \"a\", \"a\"]\n");
    // The cold run's layers as planned (a cold run needs the airlock binary as its init,
    // which this crate's tests do not build; tests/warm.rs compares real cold runs).
    let cold = Sandbox::new(untrusted())
        .unwrap()
        .command("/usr/bin/python3")
        .args(["-c", "pass"])
        .plan()
        .unwrap();
    let mut warm = result.isolation.clone();
    let mut cold_layers = cold.layers.clone();
    if cold.cgroup.is_some() {
        cold_layers.push(Layer::Cgroup); // planned apart from the layers
    }
    warm.sort();
    cold_layers.sort();
    assert_eq!(warm, cold_layers);
    for layer in [
        Layer::Seccomp,
        Layer::LandlockFs,
        Layer::NetNs,
        Layer::PidNs,
        Layer::Cgroup,
    ] {
        assert!(result.isolation.contains(&layer), "{layer:?}");
    }
}

#[test]
fn nothing_passes_between_two_runs() {
    let _guard = shared();
    let zygote = zygote(&["json", "random"]);
    let first = run(
        &zygote,
        "import json, os, random\n\
         open('/tmp/left', 'w').write('x'); open('left', 'w').write('x')\n\
         json.marker = 1; os.environ['LEFT'] = '1'\n\
         print(random.random(), random.random())",
    );
    let second = run(
        &zygote,
        "import json, os, random\n\
         print(os.path.exists('/tmp/left'), os.path.exists('left'), hasattr(json, 'marker'), 'LEFT' in os.environ)\n\
         print(random.random(), random.random())",
    );
    let second_out = stdout(&second);
    let mut lines = second_out.lines();
    assert_eq!(lines.next(), Some("False False False False"));
    assert_ne!(
        lines.next(),
        Some(stdout(&first).trim_end()),
        "the random sequence repeated"
    );
}

/// The template runs the runner on empty code before it forks (`warm_up` in runner.py) with
/// the steps that end a process stubbed out: each run still gets exactly its own environment
/// (the plan's plus its own variables), and its threads are joined and its atexit handlers
/// run at its end, as under `python3 -c`.
#[test]
fn a_run_has_its_own_environment_and_exit_work_after_the_warm_up() {
    let _guard = shared();
    let zygote = zygote(&["json", "threading"]);
    let keys = "import os; print(' '.join(sorted(os.environ)))";
    let plain = run(&zygote, keys);
    let mut expected: Vec<String> = stdout(&plain)
        .split_whitespace()
        .map(String::from)
        .collect();
    expected.extend(["EXTRA".to_string(), "HOME".to_string()]);
    expected.sort();
    expected.dedup();
    let mut own = ZygoteRun::code(format!(
        "{keys}\n\
         import atexit, threading, time\n\
         print(os.environ['EXTRA'], os.environ['HOME'], flush=True)\n\
         atexit.register(print, 'atexit ran')\n\
         threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined', flush=True))).start()"
    ));
    own.env = vec![
        ("EXTRA".into(), "1".into()),
        ("HOME".into(), "/elsewhere".into()),
    ];
    let result = zygote.run(&own).expect("run");
    let out = stdout(&result);
    let mut lines = out.lines();
    let seen: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(seen, expected, "{out}");
    assert_eq!(lines.next(), Some("1 /elsewhere"), "{out}");
    assert_eq!(lines.next(), Some("thread joined"), "{out}");
    assert_eq!(lines.next(), Some("atexit ran"), "{out}");
}

#[test]
fn concurrent_children_cannot_see_each_other() {
    let _guard = shared();
    let zygote = std::sync::Arc::new(zygote(&[]));
    let holder = {
        let zygote = std::sync::Arc::clone(&zygote);
        std::thread::spawn(move || {
            run(
                &zygote,
                "import socket, time, os\n\
                 s = socket.socket(socket.AF_UNIX); s.bind('\\0airlock-zygote-test'); s.listen()\n\
                 open('/tmp/mine', 'w').write('x')\n\
                 print(os.getpid(), flush=True); time.sleep(3)",
            )
        })
    };
    std::thread::sleep(Duration::from_millis(1200));
    let looker = run(
        &zygote,
        "import socket, os\n\
         s = socket.socket(socket.AF_UNIX)\n\
         try:\n    s.connect('\\0airlock-zygote-test'); print('connected')\n\
         except OSError: print('refused')\n\
         print(os.path.exists('/tmp/mine'))\n\
         print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
    );
    let out = stdout(&looker).to_string();
    let holder = holder.join().unwrap();
    assert_eq!(holder.status, RunStatus::Exited, "{holder:#?}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("refused"));
    assert_eq!(lines.next(), Some("False"));
    // At most PID 1 (hidden by hidepid) and the program: no process of the other run.
    let pids = lines.next().unwrap();
    assert!(pids == "[2]" || pids == "[1, 2]", "{pids}");
}

/// The program (same user, same namespaces as its PID 1, which is a copy of the template)
/// can neither read nor write PID 1's memory, descriptors or environment, and no signal it
/// sends changes the report PID 1 makes of its end.
#[test]
fn the_program_cannot_reach_its_pid_1() {
    let _guard = shared();
    let zygote = zygote(&[]);
    let result = run(
        &zygote,
        "import os, signal\n\
         reached = []\n\
         for what, mode in [('environ', 'rb'), ('maps', 'rb'), ('mem', 'r+b'), ('cmdline', 'rb'),\n\
                            ('fd/3', 'wb'), ('fd/0', 'rb'), ('status', 'rb')]:\n\
         \x20   try:\n\
         \x20       open('/proc/1/' + what, mode).read(1) if 'r' in mode else open('/proc/1/' + what, mode)\n\
         \x20       reached.append(what)\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGINT, signal.SIGCHLD):\n\
         \x20   try:\n\
         \x20       os.kill(1, sig)\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         print(reached, os.getppid())\n\
         raise SystemExit(7)",
    );
    assert_eq!(result.status, RunStatus::Exited, "{result:#?}");
    assert_eq!(result.exit_code, Some(7), "{result:#?}");
    assert_eq!(result.stdout.as_deref(), Some("[] 1\n"), "{result:#?}");
    // The next run is PID 1's first child again, in namespaces of its own.
    assert_eq!(
        stdout(&run(&zygote, "import os; print(os.getpid())")),
        "2\n"
    );
}

#[test]
fn memory_and_process_limits_hold_per_run() {
    let _guard = shared();
    let mut policy = untrusted();
    policy.limits.memory.0 = 96 << 20;
    policy.limits.processes = 16;
    let zygote = zygote_of(policy, &[]);
    let eater = run(&zygote, "b = []\nwhile True: b.append(bytearray(8 << 20))");
    assert_eq!(eater.status, RunStatus::MemoryLimit, "{eater:#?}");
    let bomb = run(
        &zygote,
        "import os\nn = 0\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n            import time; time.sleep(5); os._exit(0)\n        n += 1\n    except OSError:\n        break\nprint(n)",
    );
    let forked: u32 = stdout(&bomb).trim().parse().unwrap();
    assert!(forked < 16, "{forked} forks under a limit of 16");
    assert!(
        bomb.warnings.iter().any(|w| w.contains("process limit")),
        "{bomb:#?}"
    );
    // The next run is unaffected by either.
    assert_eq!(stdout(&run(&zygote, "print(1)")), "1\n");
}

/// Without a cgroup (`no_cgroup`) a run's memory limit falls back to `RLIMIT_AS`: the code gets
/// the address space up to it (nothing its fork sets up for itself reserves any), and no more.
#[test]
fn without_a_cgroup_the_memory_limit_is_the_address_space() {
    let _guard = shared();
    let mut policy = untrusted();
    policy.limits.memory.0 = 160 << 20;
    let options = airlock::SandboxOptions {
        no_cgroup: true,
        ..Default::default()
    };
    let sandbox = Sandbox::with_options(policy, options).expect("sandbox");
    let mut options = ZygoteOptions::python(&[]);
    options.binary = Some(env!("CARGO_BIN_EXE_airlock-zygote").into());
    let zygote = sandbox.zygote(options).expect("zygote");
    let fits = run(&zygote, "print(len(bytearray(96 << 20)))");
    assert_eq!(stdout(&fits), format!("{}\n", 96 << 20), "{fits:#?}");
    let over = run(&zygote, "bytearray(200 << 20)");
    assert_ne!(over.exit_code, Some(0), "{over:#?}");
    let stderr = over.stderr.as_deref().unwrap_or_default();
    assert!(stderr.contains("MemoryError"), "{over:#?}");
}

#[test]
fn attacks_through_the_zygote_are_contained() {
    let _guard = shared();
    let zygote = zygote(&[]);
    let attacks = [
        // host secrets and files outside the sandbox
        ("print(open('/etc/shadow').read())", "shadow"),
        ("print(os.listdir('/root'))", "root home"),
        ("print(open('/proc/1/environ').read())", "PID 1's environment"),
        // network: an empty network namespace (no traffic leaves)
        ("import socket; socket.create_connection(('192.0.2.1', 80), timeout=1)", "network"),
        // namespaces, mounts, privileges (seccomp, no capabilities)
        ("os.unshare(0x10000000) if hasattr(os, 'unshare') else os.setuid(0)", "setuid/unshare"),
        ("import ctypes; assert ctypes.CDLL(None).mount(b'none', b'/mnt', b'tmpfs', 0, None) == 0", "mount"),
        ("import ctypes; assert ctypes.CDLL(None).ptrace(16, 1, 0, 0) == 0", "ptrace"),
        ("open('/usr/bin/evil', 'w')", "write outside the workdir"),
    ];
    for (code, what) in attacks {
        let result = run(&zygote, &format!("import os\n{code}"));
        assert_ne!(result.exit_code, Some(0), "{what}: {result:#?}");
    }
}

#[test]
fn a_template_is_replaced_after_its_runs_and_nothing_is_left() {
    let _guard = exclusive();
    let before = zygote_processes();
    let zygote = zygote_with(|options| {
        options.max_forks = 2;
        options.ready_children = 0; // every fork is a run's
    });
    let first = zygote.stats().template_pid;
    // The template holds no capability, has no_new_privs and a seccomp filter of its own.
    let status = std::fs::read_to_string(format!("/proc/{}/status", first.unwrap())).unwrap();
    for (key, value) in [
        ("CapEff", "0000000000000000"),
        ("NoNewPrivs", "1"),
        ("Seccomp", "2"),
    ] {
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{key}:")))
            .unwrap();
        assert_eq!(line.split_whitespace().nth(1), Some(value), "{line}");
    }
    for _ in 0..3 {
        assert_eq!(stdout(&run(&zygote, "print(1)")), "1\n");
    }
    let stats = zygote.stats();
    assert_eq!((stats.templates, stats.runs), (2, 3));
    assert_ne!(stats.template_pid, first);
    zygote.shutdown();
    assert_no_zygote_process_left(&before);
}

/// A replacement starts in the background before its template is due: given time between
/// runs, no run waits for a template to start; the stats count each template, and none is
/// left after the shutdown.
#[test]
fn templates_are_replaced_in_the_background() {
    let _guard = exclusive();
    let before = zygote_processes();
    let zygote = zygote_with(|options| {
        options.max_forks = 3;
        options.ready_children = 0; // every fork is a run's
    });
    for round in 0..7 {
        assert_eq!(
            stdout(&run(&zygote, &format!("print({round})"))),
            format!("{round}\n")
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while zygote.stats().replacing && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let stats = zygote.stats();
    assert_eq!((stats.templates, stats.runs), (3, 7), "{stats:?}");
    assert_eq!(stats.template_waits, 0, "{stats:?}");
    zygote.shutdown();
    assert_no_zygote_process_left(&before);
}

/// The owner of a zygote dies (SIGKILL) with a run going: the run's PID 1 sees its report
/// socket close and ends the run, the template sees its control socket close and exits; no
/// process is left. The run's cgroup (named after the dead owner) is what a sweep of dead
/// supervisors' runs removes, which a daemon does at start: after it, nothing is left.
#[test]
fn killing_the_owner_ends_its_runs_and_template() {
    let _guard = exclusive();
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let before = zygote_processes();
    let mut owner = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "zygote_owner",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("AIRLOCK_ZYGOTE_OWNER", "1")
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
    assert!(ready.is_some(), "the zygote's owner never got ready");
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = || {
        let mut left: Vec<String> = zygote_processes()
            .into_iter()
            .filter(|p| !before.contains(p))
            .map(|p| format!("zygote process {p}"))
            .collect();
        left.extend(run_processes(owner_pid));
        left
    };
    while !left().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(left(), Vec::<String>::new());
    airlock::SandboxOptions::default().sweep_runs_of_dead_supervisor(owner_pid, Duration::ZERO);
    assert_eq!(run_cgroups(owner_pid), Vec::<String>::new());
}

/// The process [`killing_the_owner_ends_its_runs_and_template`] kills: a zygote with one run
/// going (a program sleeping for a minute).
#[test]
#[ignore = "run by killing_the_owner_ends_its_runs_and_template"]
fn zygote_owner() {
    if std::env::var_os("AIRLOCK_ZYGOTE_OWNER").is_none() {
        return;
    }
    let zygote = std::sync::Arc::new(zygote_with(|options| options.ready_children = 1));
    let running = std::sync::Arc::clone(&zygote);
    std::thread::spawn(move || run(&running, "import time; time.sleep(60)"));
    let deadline = Instant::now() + Duration::from_secs(20);
    // The run's PID 1 and program (which writes nothing: a closed output pipe must not be
    // what ends it), and a ready child's two; each process is listed once per hierarchy.
    let processes = || {
        let listed = run_processes(std::process::id());
        listed
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    while processes() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if processes() >= 4 {
        println!("OWNER READY");
    }
    std::thread::sleep(Duration::from_secs(60));
}

/// Children forked ahead: each waits in a cgroup of its own and a network namespace of its
/// own (every process of one cgroup in one namespace, no namespace in two cgroups), serves
/// one run, and none is left after the shutdown — processes or cgroups.
#[test]
fn ready_children_are_each_their_own_and_end_with_the_zygote() {
    let _guard = exclusive();
    let before = zygote_processes();
    let zygote = zygote_with(|options| options.ready_children = 3);
    let deadline = Instant::now() + Duration::from_secs(30);
    while zygote.stats().runs < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for round in 0..5 {
        assert_eq!(
            stdout(&run(&zygote, &format!("print({round})"))),
            format!("{round}\n")
        );
    }
    // The keeper forks the next children; each joins its cgroup and creates its namespaces
    // once the template forked it. Other tests of this process fork their own children
    // meanwhile: the property holds for theirs too.
    let template = zygote.stats().template_pid.expect("a template runs");
    let template_net = std::fs::read_link(format!("/proc/{template}/ns/net")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut namespaces = ready_namespaces(std::process::id(), &template_net);
    while namespaces.len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        namespaces = ready_namespaces(std::process::id(), &template_net);
    }
    assert!(
        namespaces.len() >= 3,
        "not three ready children, each in a network namespace of its own: {namespaces:?}"
    );
    let ours: Vec<String> = namespaces.into_values().collect();
    zygote.shutdown();
    assert_no_zygote_process_left(&before);
    let stale: Vec<String> = run_cgroups(std::process::id())
        .into_iter()
        .filter(|dir| ours.iter().any(|name| dir.ends_with(name.as_str())))
        .collect();
    assert!(stale.is_empty(), "cgroups left: {stale:?}");
}

/// The network namespaces of `owner`'s run children that have made their own (not the
/// template's), each with its cgroup's name; asserts that no cgroup holds two namespaces and
/// no namespace is in two cgroups.
fn ready_namespaces(
    owner: u32,
    template_net: &std::path::Path,
) -> std::collections::BTreeMap<std::path::PathBuf, String> {
    let mut namespaces = std::collections::BTreeMap::new();
    for dir in run_cgroups(owner) {
        let procs = std::fs::read_to_string(format!("{dir}/cgroup.procs")).unwrap_or_default();
        let nets: std::collections::BTreeSet<std::path::PathBuf> = procs
            .lines()
            .filter_map(|pid| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok())
            .filter(|net| net != template_net)
            .collect();
        assert!(
            nets.len() <= 1,
            "one cgroup holds several runs: {dir} {nets:?}"
        );
        if let Some(net) = nets.into_iter().next() {
            let base = dir.rsplit('/').next().unwrap().to_string();
            let other = namespaces.insert(net.clone(), base.clone());
            assert!(
                other.as_ref().is_none_or(|o| *o == base),
                "{net:?} in {other:?} and {base}"
            );
        }
    }
    namespaces
}

/// The cgroups of the runs of `owner` (named `run-<owner>-*`), in every hierarchy.
fn run_cgroups(owner: u32) -> Vec<String> {
    let prefix = format!("run-{owner}-");
    let mut found = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(path.display().to_string());
            } else if dir.components().count() < 6 {
                dirs.push(path);
            }
        }
    }
    found
}

/// The processes in those cgroups.
fn run_processes(owner: u32) -> Vec<String> {
    run_cgroups(owner)
        .into_iter()
        .filter_map(|dir| std::fs::read_to_string(format!("{dir}/cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .lines()
                .map(|p| format!("process {p}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A run past its wall time is killed and reported as a timeout, its processes gone.
/// PID 1 makes its cgroup namespace once it is in the run's cgroup: the run sees its own
/// cgroup as the root of every hierarchy and no path of the host's tree (a namespace made
/// before the join would show `/../run-...`).
#[test]
fn a_run_sees_its_own_cgroup_as_the_root() {
    let _guard = shared();
    let zygote = zygote(&[]);
    let result = run(&zygote, "print(open('/proc/self/cgroup').read(), end='')");
    let view = stdout(&result);
    assert!(view.lines().count() > 1, "{result:?}");
    for line in view.lines() {
        assert!(line.ends_with(":/"), "a host cgroup path shows: {view}");
    }
}

#[test]
fn a_run_past_its_wall_time_is_a_timeout() {
    let _guard = shared();
    let mut policy = untrusted();
    policy.limits.wall_time.0 = Duration::from_secs(1);
    let zygote = zygote_of(policy, &[]);
    let started = Instant::now();
    let result = run(
        &zygote,
        "import os, time\nos.fork()\nwhile True: time.sleep(1)",
    );
    assert_eq!(result.status, RunStatus::Timeout, "{result:#?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(stdout(&run(&zygote, "print(2)")), "2\n");
}

/// A run that writes without pause (under `truncate`, so its output never stops it) still
/// ends at its wall time: four writers keep its stdout readable at all times, and the
/// deadline must be checked without waiting for a quiet moment. The code stops itself after
/// 30 s, so that the assertion fails rather than hangs without the check.
#[test]
fn a_run_writing_without_pause_still_ends_at_its_wall_time() {
    let _guard = shared();
    let mut policy = untrusted();
    policy.limits.wall_time.0 = Duration::from_secs(1);
    policy.limits.on_output_limit = airlock::policy::OutputLimitAction::Truncate;
    let zygote = zygote_of(policy, &[]);
    let started = Instant::now();
    let result = run(
        &zygote,
        "import os, time\n\
        os.fork(); os.fork()\n\
        end = time.time() + 30\n\
        while time.time() < end:\n\
        \x20   os.write(1, b'x' * 65536)",
    );
    assert_eq!(result.status, RunStatus::Timeout, "{result:#?}");
    assert!(started.elapsed() < Duration::from_secs(15), "{result:#?}");
    assert!(result.stdout_truncated, "{result:#?}");
}

/// `on_output_limit = kill`: a run writing without end is stopped when its stdout passes the
/// cap (long before its wall time) and reported as `output_limit`; the next run is unharmed.
#[test]
fn output_past_its_cap_ends_the_run_under_kill() {
    let _guard = shared();
    let mut policy = untrusted();
    policy.limits.stdout.0 = 4096;
    policy.limits.wall_time.0 = Duration::from_secs(60);
    policy.limits.on_output_limit = airlock::policy::OutputLimitAction::Kill;
    let zygote = zygote_of(policy, &[]);
    let started = Instant::now();
    let result = run(
        &zygote,
        "import sys\nwhile True:\n    sys.stdout.write('x' * 1024)\n    sys.stdout.flush()",
    );
    assert_eq!(result.status, RunStatus::OutputLimit, "{result:#?}");
    assert!(result.stdout_truncated);
    assert!(started.elapsed() < Duration::from_secs(20), "{result:#?}");
    assert_eq!(stdout(&run(&zygote, "print(3)")), "3\n");
}

/// The root a template prepared ahead is shared, so it must be read-only to every run (and
/// stay so: the flag is locked in the run's namespace), while `/tmp`, `/dev/shm` and the
/// workdir are each run's own.
#[test]
fn the_prepared_root_is_read_only_and_writable_mounts_are_per_run() {
    let _guard = shared();
    let zygote = zygote(&[]);
    let probe = "import os\n\
        for p in ('/x', '/etc/x', '/dev/x', '/usr/x', '/proc/x'):\n\
        \x20   try:\n\
        \x20       open(p, 'w'); print('wrote', p)\n\
        \x20   except OSError:\n\
        \x20       pass\n\
        print(os.statvfs('/').f_flag & 1, sorted(os.listdir('/dev/shm')), sorted(os.listdir('.')))\n\
        open('/dev/shm/mark', 'w').write('1'); open('mark', 'w').write('1')";
    for _ in 0..2 {
        assert_eq!(stdout(&run(&zygote, probe)), "1 [] []\n");
    }
}

/// The report and both output streams are served from the caller's thread: output larger
/// than a pipe's buffer on both streams at once arrives whole (neither stream blocks the
/// other nor the report), and a streamed run sends `Started` first, then every byte within
/// the caps, in order per stream.
#[test]
fn both_streams_and_the_report_are_served_together_and_streamed_in_order() {
    let _guard = shared();
    let zygote = zygote(&[]);
    let code = "import sys\n\
        for i in range(64):\n\
        \x20   sys.stdout.write(str(i % 10) * 4096); sys.stderr.write(chr(97 + i % 26) * 4096)\n\
        sys.stdout.flush(); sys.stderr.flush()";
    let expected_out: String = (0..64).map(|i| (i % 10).to_string().repeat(4096)).collect();
    let expected_err: String = (0..64)
        .map(|i| char::from(b'a' + (i % 26) as u8).to_string().repeat(4096))
        .collect();
    let (events, received) = std::sync::mpsc::channel();
    let mut request = ZygoteRun::code(code);
    request.events = Some(events);
    let result = zygote.run(&request).expect("run");
    assert_eq!(stdout(&result), expected_out);
    assert_eq!(result.stderr.as_deref().unwrap_or_default(), expected_err);
    let events: Vec<airlock::RunEvent> = received.try_iter().collect();
    assert!(
        matches!(events.first(), Some(airlock::RunEvent::Started { layers }) if *layers == result.isolation),
        "Started is not first: {:?}",
        events.first()
    );
    let (mut streamed_out, mut streamed_err) = (Vec::new(), Vec::new());
    for event in &events[1..] {
        match event {
            airlock::RunEvent::Stdout(chunk) => streamed_out.extend_from_slice(chunk),
            airlock::RunEvent::Stderr(chunk) => streamed_err.extend_from_slice(chunk),
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(streamed_out, expected_out.as_bytes());
    assert_eq!(streamed_err, expected_err.as_bytes());
}

//! Every Tier-0 promise, proved from inside a run of the real binary, on the Tier-0-only
//! backend and (where it runs) the default native sandbox.

mod support;

use std::time::{Duration, Instant};

use support::*;

/// Tier 0 without a cgroup: only the init's own subreaper tracking can find the tree.
const TIER0_NO_CGROUP: &[&str] = &["--dev", "--backend", "none", "--no-cgroup"];

/// The modes for process-tree promises: each kill mechanism on its own as well.
fn tree_modes() -> Vec<(&'static str, &'static [&'static str])> {
    let mut modes = modes();
    modes.push(("tier0-no-cgroup", TIER0_NO_CGROUP));
    modes
}

fn modes() -> Vec<(&'static str, &'static [&'static str])> {
    let mut modes = vec![("tier0", TIER0)];
    if sandbox_available() {
        modes.push(("native", NATIVE));
    } else {
        eprintln!(
            "skipping the native mode: the native backend cannot run here (see `airlock doctor`)"
        );
    }
    modes
}

#[test]
fn parent_secrets_in_the_environment_never_reach_the_program() {
    let secret = unique("SECRET-TOKEN-");
    for (mode, base) in modes() {
        let out = airlock_command()
            .args(["run", "--json"])
            .args(base)
            .args(["--", "/usr/bin/env"])
            .env("AWS_SECRET_ACCESS_KEY", &secret)
            .env("LANG", "C.UTF-8")
            .output()
            .unwrap();
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let env = result["stdout"].as_str().unwrap();
        assert!(!env.contains(&secret), "{mode}: secret leaked: {env}");
        assert!(
            env.contains("PATH=/usr/local/bin:/usr/bin:/bin"),
            "{mode}: {env}"
        );
        assert!(
            env.contains("LANG=C.UTF-8"),
            "{mode}: allowlisted LANG missing: {env}"
        );
        assert!(env.lines().any(|l| l.starts_with("HOME=")), "{mode}: {env}");
        let layers = result["isolation"].as_array().unwrap();
        assert!(layers.iter().any(|l| l == "env_scrub"), "{mode}");
    }
}

#[test]
fn explicit_env_values_reach_the_program() {
    let result = run_json(
        &flags(TIER0, &["--env", "GREETING=hello there"]),
        &["/bin/sh", "-c", "echo \"$GREETING\""],
    );
    assert_eq!(result["stdout"], "hello there\n");
}

#[test]
fn inherited_descriptors_are_closed() {
    let secret_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret_file.path(), "fd-secret").unwrap();
    for (mode, base) in modes() {
        // bash opens descriptor 7 without close-on-exec, so airlock inherits it.
        let script = format!(
            "exec 7<{}; exec {} run --json {} -- {PYTHON} -c 'import os; print(sorted(os.listdir(\"/proc/self/fd\")))'",
            secret_file.path().display(),
            env!("CARGO_BIN_EXE_airlock"),
            base.join(" ")
        );
        let out = std::process::Command::new("/bin/bash")
            .arg("-c")
            .arg(script)
            .output()
            .unwrap();
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            result["stdout"], "['0', '1', '2', '3']\n",
            "{mode}: descriptors beyond stdio reached the program: {result}"
        );
    }
}

/// The program starts with a descriptor table of 1024 slots (`FDSize`) and still only stdio
/// open: a threaded program would otherwise wait for an RCU grace period (10-30 ms here)
/// each time its table grows past 64, 128, 256 and 512 descriptors.
#[test]
fn the_program_starts_with_a_presized_descriptor_table_and_no_extra_descriptors() {
    let code = "import os; print([l.split()[1] for l in open('/proc/self/status') if l.startswith('FDSize')][0], sorted(os.listdir('/proc/self/fd')))";
    for (mode, base) in modes() {
        let result = run_json(&flags(base, &["--nofile", "4096"]), &[PYTHON, "-c", code]);
        assert_eq!(
            result["stdout"], "1024 ['0', '1', '2', '3']\n",
            "{mode}: {result}"
        );
    }
}

/// airlock's own process ignores SIGPIPE (Rust's runtime does) and a caller may ignore
/// others (`nohup`, a shell's `trap ''`); ignored signals survive exec, so without a reset a
/// program writing into a closed pipe would see EPIPE instead of dying, and one told to stop
/// with SIGINT or SIGHUP would carry on.
#[test]
fn the_program_starts_with_default_signal_dispositions_and_no_blocked_signals() {
    for (mode, base) in modes() {
        let script = format!(
            "trap '' HUP INT; exec {} run --json {} -- /bin/grep -E '^Sig(Blk|Ign):' /proc/self/status",
            env!("CARGO_BIN_EXE_airlock"),
            base.join(" ")
        );
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .output()
            .unwrap();
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            result["stdout"], "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n",
            "{mode}: the program inherited blocked or ignored signals: {result}"
        );
    }
}

#[test]
fn an_infinite_loop_ends_at_the_wall_limit() {
    for (mode, base) in modes() {
        let started = Instant::now();
        let result = run_json(
            &flags(base, &["--wall", "2s", "--grace", "1s"]),
            &[PYTHON, "-c", "while True: pass"],
        );
        let elapsed = started.elapsed();
        assert_eq!(status(&result), "timeout", "{mode}: {result}");
        assert!(
            elapsed < Duration::from_secs(2 + 1 + 1),
            "{mode}: took {elapsed:?}"
        );
        assert!(
            elapsed >= Duration::from_secs(2),
            "{mode}: stopped early after {elapsed:?}"
        );
    }
}

#[test]
fn a_program_ignoring_sigterm_is_killed_after_the_grace_period() {
    for (mode, base) in modes() {
        let started = Instant::now();
        let code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\nwhile True: time.sleep(0.1)";
        let result = run_json(
            &flags(base, &["--wall", "1s", "--grace", "1s"]),
            &[PYTHON, "-c", code],
        );
        assert_eq!(status(&result), "timeout", "{mode}: {result}");
        assert_eq!(
            result["stdout"], "ready\n",
            "{mode}: output written before the timeout was lost"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1 + 1 + 1),
            "{mode}: {:?}",
            started.elapsed()
        );
    }
}

/// A program that handles SIGTERM gets the grace period to finish: the wall limit's SIGTERM
/// reaches it, and nothing of the run dies before the grace period ends (in the native
/// sandbox PID 1, which the program's end would take along, must not die of the stop: it is
/// the init's own child and dies only with it).
#[test]
fn a_program_handling_sigterm_finishes_within_the_grace_period() {
    for (mode, base) in modes() {
        let code = "import signal, sys, time\ndef stop(*_):\n    time.sleep(0.5)\n    print('cleaned up', flush=True)\n    sys.exit(3)\nsignal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\nwhile True: time.sleep(0.1)";
        let result = run_json(
            &flags(base, &["--wall", "1s", "--grace", "3s"]),
            &[PYTHON, "-c", code],
        );
        assert_eq!(status(&result), "timeout", "{mode}: {result}");
        assert_eq!(
            result["stdout"], "ready\ncleaned up\n",
            "{mode}: the program did not get its grace period: {result}"
        );
    }
}

/// A command that sleeps for a long time with `marker` in its command line.
fn sleeper(marker: &str) -> String {
    format!("{PYTHON} -c 'import time; time.sleep(1000)' {marker}")
}

#[test]
fn a_setsid_double_forked_grandchild_is_gone_after_the_run() {
    for (mode, base) in tree_modes() {
        let marker = unique("airlock-survivor-");
        // The grandchild leaves the session and the parent's tree; the program proves it is
        // alive (signal 0) before exiting, so the test can only pass if airlock kills it.
        let code = format!(
            "import os, time\nr, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.write(w, str(os.getpid()).encode()); os.close(w)\n        os.execv('{PYTHON}', ['{PYTHON}', '-c', 'import time; time.sleep(1000)', '{marker}'])\n    os._exit(0)\nos.close(w)\npid = int(os.read(r, 32))\ntime.sleep(0.5)\nos.kill(pid, 0)\nprint('alive', pid)"
        );
        let result = run_json(base, &[PYTHON, "-c", &code]);
        assert_eq!(status(&result), "exited", "{mode}: {result}");
        assert!(
            result["stdout"].as_str().unwrap().starts_with("alive"),
            "{mode}: the grandchild never ran: {result}"
        );
        let survivors = processes_with(&marker);
        assert!(
            survivors.is_empty(),
            "{mode}: processes survived the run: {survivors:?}"
        );
    }
}

#[test]
fn killing_airlock_kills_the_whole_tree() {
    for (mode, base) in tree_modes() {
        let marker = unique("airlock-orphan-");
        let script = format!("{} & setsid {} & wait", sleeper(&marker), sleeper(&marker));
        let mut child = airlock_command()
            .arg("run")
            .args(base)
            .args(["--", "/bin/sh", "-c", &script])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while processes_with(&marker).len() < 2 {
            assert!(
                Instant::now() < deadline,
                "{mode}: the program never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !processes_with(&marker).is_empty() {
            assert!(
                Instant::now() < deadline,
                "{mode}: the tree outlived airlock: {:?}",
                processes_with(&marker)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The native sandbox dies with its init, by parent-death signals alone (the init is
/// SIGKILLed, so nobody signals the tree or its cgroup): the init's child (which mirrors PID
/// 1's exit, sharing its memory), PID 1 and every process of the namespace, a new session's
/// included. Each link of the chain is a process started differently (fork, `CLONE_VM`,
/// `CLONE_VM | CLONE_VFORK`), and each must keep its parent-death signal.
#[test]
fn a_killed_init_takes_the_native_sandbox_with_it() {
    if !sandbox_available() {
        return skip("the native backend cannot run here (see `airlock doctor`)");
    }
    let marker = unique("airlock-init-killed-");
    let script = format!("{} & setsid {} & wait", sleeper(&marker), sleeper(&marker));
    let mut cli = airlock_command()
        .args(["run", "--", "/bin/sh", "-c", &script])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).len() < 2 {
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let init = children_of(cli.id());
    assert_eq!(init.len(), 1, "one init: {init:?}");
    let mirror = children_of(init[0]);
    assert_eq!(mirror.len(), 1, "the init's one child: {mirror:?}");
    let pid1 = children_of(mirror[0]);
    assert_eq!(pid1.len(), 1, "PID 1 under the mirror: {pid1:?}");
    let kill = |pid: u32| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
    };
    kill(init[0]).unwrap();
    let survivors = || -> Vec<u32> {
        let found = all_processes_with(&marker).into_iter();
        found.filter(|pid| *pid != cli.id()).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !survivors().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = survivors();
    // Nothing stays behind a failure either (PID 1 first: its namespace goes with it).
    pid1.iter().chain(&left).chain([&cli.id()]).for_each(|pid| {
        let _ = kill(*pid);
    });
    cli.wait().unwrap();
    assert!(
        left.is_empty(),
        "the sandbox outlived its init (mirror {mirror:?}, PID 1 {pid1:?}): {left:?}"
    );
}

/// The live children of `parent`, from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after_name = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        let mut fields = after_name.split_whitespace();
        let (state, ppid) = (fields.next(), fields.next().and_then(|p| p.parse().ok()));
        if ppid == Some(parent) && state != Some("Z") {
            children.push(pid);
        }
    }
    children
}

#[test]
fn a_huge_allocation_ends_with_memory_limit() {
    if !is_root() {
        eprintln!("skipping: memory_limit needs a cgroup (root here); unprivileged runs fall back to RLIMIT_AS, where the allocation fails inside the program");
        return;
    }
    for (mode, base) in modes() {
        let result = run_json(
            &flags(base, &["--mem", "256MiB"]),
            &[PYTHON, "-c", "x = b'x' * (4 << 30)"],
        );
        assert_eq!(status(&result), "memory_limit", "{mode}: {result}");
        let peak = result["peak_memory_bytes"].as_u64().unwrap();
        assert!(peak <= 256 << 20, "{mode}: peak {peak} above the limit");
    }
}

#[test]
fn a_fork_bomb_is_contained_by_the_process_limit() {
    for (mode, base) in modes() {
        let marker = unique("airlock-bomb-");
        let code = format!(
            "import os, sys, time\nsys.argv.append('{marker}')\nforks = 0\nfor _ in range(500):\n    try:\n        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n        forks += 1\n    except OSError:\n        break\nprint(forks)"
        );
        let result = run_json(
            &flags(base, &["--pids", "32", "--wall", "20s"]),
            &[PYTHON, "-c", &code],
        );
        assert_eq!(status(&result), "exited", "{mode}: {result}");
        let forks: u32 = result["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!(
            forks < 32,
            "{mode}: {forks} forks succeeded under --pids 32"
        );
        assert!(
            processes_with(&marker).is_empty(),
            "{mode}: bomb processes survived"
        );
    }
}

#[test]
fn a_gigabyte_write_stops_at_the_file_size_limit() {
    for (mode, base) in modes() {
        let code = "f = open('big', 'wb')\nfor _ in range(1024):\n    f.write(b'x' * (1 << 20))";
        let result = run_json(&flags(base, &["--fsize", "10MiB"]), &[PYTHON, "-c", code]);
        assert_eq!(status(&result), "file_size_limit", "{mode}: {result}");
    }
}

#[test]
fn output_past_the_cap_is_truncated_and_flagged() {
    for (mode, base) in modes() {
        let result = run_json(
            &flags(base, &["--stdout-cap", "1KiB"]),
            &[
                PYTHON,
                "-c",
                "import sys\nfor _ in range(10000): sys.stdout.write('y' * 100)",
            ],
        );
        assert_eq!(result["stdout_truncated"], true, "{mode}: {result}");
        assert_eq!(result["stdout"].as_str().unwrap().len(), 1024, "{mode}");
        assert_eq!(status(&result), "output_limit", "{mode}: {result}");
        assert_eq!(result["stderr_truncated"], false, "{mode}");
    }
}

#[test]
fn the_workdir_is_removed_after_the_run_even_after_a_timeout() {
    for (mode, base) in modes() {
        for (program, wall) in [
            ("print(__import__('os').getcwd(), flush=True)", "10s"),
            (
                "import os,time\nprint(os.getcwd(), flush=True)\ntime.sleep(60)",
                "1s",
            ),
        ] {
            let result = run_json(
                &flags(base, &["--wall", wall, "--grace", "1s"]),
                &[PYTHON, "-c", program],
            );
            let workdir = result["stdout"].as_str().unwrap().trim().to_string();
            assert!(
                workdir.contains("/run-"),
                "{mode}: unexpected workdir {workdir:?}"
            );
            let run_dir = std::path::Path::new(&workdir).parent().unwrap();
            assert!(
                !run_dir.exists(),
                "{mode}: {} left behind ({})",
                run_dir.display(),
                status(&result)
            );
        }
    }
}

#[test]
fn keep_preserves_the_workdir_and_reports_it() {
    let result = run_json(
        &flags(TIER0, &["--keep"]),
        &["/bin/sh", "-c", "echo data > kept.txt"],
    );
    let workdir = std::path::PathBuf::from(
        result["workdir"]
            .as_str()
            .expect("kept workdir in the result"),
    );
    assert_eq!(
        std::fs::read_to_string(workdir.join("kept.txt")).unwrap(),
        "data\n"
    );
    let run_dir = workdir.parent().unwrap();
    let mut left: Vec<String> = std::fs::read_dir(run_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [api::KEPT_MARKER, "work"], "only the workdir is kept");
    // Its supervisor is gone; once old enough, the next run's sweep must still leave it.
    age(run_dir);
    let runtime_dir = run_dir.parent().unwrap();
    let _ = std::fs::remove_file(runtime_dir.join(api::SWEEP_STAMP));
    assert_eq!(status(&run_json(TIER0, &["/bin/true"])), "exited");
    assert!(
        workdir.join("kept.txt").exists(),
        "the sweep removed a kept workdir"
    );
    std::fs::remove_dir_all(run_dir).unwrap();
}

#[test]
fn exit_codes_follow_the_program_signals_and_timeouts() {
    let code = |args: &[&str]| airlock(args).status.code().unwrap();
    assert_eq!(
        code(&[
            "run",
            "--dev",
            "--backend",
            "none",
            "--",
            "/bin/sh",
            "-c",
            "exit 3"
        ]),
        3
    );
    assert_eq!(
        code(&[
            "run",
            "--dev",
            "--backend",
            "none",
            "--",
            "/bin/sh",
            "-c",
            "kill -9 $$"
        ]),
        137
    );
    assert_eq!(
        code(&[
            "run",
            "--dev",
            "--backend",
            "none",
            "--wall",
            "1s",
            "--",
            "/bin/sleep",
            "10"
        ]),
        124
    );
    assert_eq!(
        code(&[
            "run",
            "--dev",
            "--backend",
            "none",
            "--",
            "no-such-program-anywhere"
        ]),
        125
    );
}

#[test]
fn stdin_streams_through() {
    let mut child = airlock_command()
        .args(["run", "--dev", "--backend", "none", "--", PYTHON, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"print(sum(range(10)))\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "45\n");
}

#[test]
fn result_file_is_written_while_output_streams() {
    let dir = tempfile::tempdir().unwrap();
    let result_path = dir.path().join("out.json");
    let out = airlock(&[
        "run",
        "--dev",
        "--backend",
        "none",
        "--result",
        result_path.to_str().unwrap(),
        "--",
        "/bin/echo",
        "streamed",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "streamed\n");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result_path).unwrap()).unwrap();
    assert_eq!(result["status"], "exited");
    assert!(
        result.get("stdout").is_none(),
        "streamed output is not captured: {result}"
    );
}

#[test]
fn root_drops_to_the_unprivileged_user() {
    if !is_root() {
        eprintln!("skipping: only a root caller drops privileges");
        return;
    }
    for (mode, base) in modes() {
        let result = run_json(base, &["/usr/bin/id", "-u"]);
        assert_eq!(result["stdout"], "65534\n", "{mode}: {result}");
    }
}

#[test]
fn the_next_run_sweeps_what_a_killed_supervisor_and_init_left_behind() {
    if !is_root() {
        eprintln!("skipping: finding orphans needs the run's cgroup (root here)");
        return;
    }
    // Its own runtime directory and cgroup parent: no other run on the host sweeps (or
    // stamps the sweep of) what this test leaves behind and checks.
    let private = PrivateRuns::new();
    let marker = unique("airlock-abandoned-");
    let script = format!("{} & wait", sleeper(&marker));
    let mut cli = airlock_command()
        .args(["run", "--dev", "--backend", "none"])
        .args(private.flags())
        .args(["--", "/bin/sh", "-c", &script])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL both airlock and its init: nobody is left to clean up.
    // The init is the CLI's one child process (forked or re-executed).
    let init = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after_name = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
            after_name
                .split_whitespace()
                .nth(1)
                .and_then(|ppid| ppid.parse::<u32>().ok())
                == Some(cli.id())
        });
    let init = init.expect("the init process of this run");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    cli.kill().unwrap();
    cli.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let prefix = format!("run-{}-", cli.id());
    let leftovers = private.entries_named(&prefix);
    assert!(
        !leftovers.is_empty(),
        "expected a run directory and cgroups to be left behind"
    );
    assert!(
        !processes_with(&marker).is_empty(),
        "expected the orphan to survive the double kill"
    );
    leftovers.iter().for_each(|p| age(p));
    // Runs sweep at most every few seconds; make this one due (the killed run swept first).
    age(&private.runtime.path().join(api::SWEEP_STAMP));
    let flags: Vec<String> = private.flags();
    let mut args: Vec<&str> = TIER0.to_vec();
    args.extend(flags.iter().map(String::as_str));
    let result = run_json(&args, &["/bin/true"]);
    assert_eq!(status(&result), "exited");
    assert!(
        private.entries_named(&prefix).is_empty(),
        "leftovers not swept: {leftovers:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the orphan survived the sweep");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// As root, the run directory lives in memory in the init's own mount namespace: it never
/// appears on the host, and the fresh workdir is a tmpfs capped by the profile's disk and
/// file limits even under Tier 0. `--disk-run-dir` puts it back on the host, uncapped.
#[test]
fn the_run_directory_is_in_memory_and_capped_unless_asked_for_on_disk() {
    use std::io::{BufRead, Read};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: an in-memory run directory needs CAP_SYS_ADMIN (root)");
        return;
    }
    let script = "pwd; read go; stat -f -c %T .; i=0; while [ $i -lt 60 ] && touch f$i 2>/dev/null; do i=$((i+1)); done; echo $i";
    let host_fs = filesystem_type("/run/airlock");
    for (flags, on_host) in [(&[][..], false), (&["--disk-run-dir"][..], true)] {
        let result_file = tempfile::NamedTempFile::new().unwrap();
        let mut child = airlock_command()
            .args(["run", "--files", "50", "--result"])
            .arg(result_file.path())
            .args(TIER0)
            .args(flags)
            .args(["--", "/bin/sh", "-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut workdir = String::new();
        stdout.read_line(&mut workdir).unwrap();
        let run_dir = std::path::Path::new(workdir.trim())
            .parent()
            .unwrap()
            .to_path_buf();
        assert_eq!(run_dir.exists(), on_host, "{flags:?}: {run_dir:?}");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        child.wait().unwrap();
        let result: serde_json::Value =
            serde_json::from_slice(&std::fs::read(result_file.path()).unwrap()).unwrap();
        let (filesystem, created) = if on_host {
            (host_fs.as_str(), "60")
        } else {
            // The tmpfs root is one of the 50 inodes.
            ("tmpfs", "49")
        };
        assert_eq!(
            rest,
            format!("{filesystem}\n{created}\n"),
            "{flags:?}: {result}"
        );
        let capped = result["isolation"]
            .as_array()
            .unwrap()
            .contains(&"inode_quota".into());
        assert_eq!(capped, !on_host, "{flags:?}: {result}");
        assert!(!run_dir.exists(), "{flags:?}: {run_dir:?} survived");
    }
}

fn filesystem_type(path: &str) -> String {
    let output = std::process::Command::new("stat")
        .args(["-f", "-c", "%T", path])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

//! The library API without the CLI: start, stream, cancel and account for a run, as the daemon
//! and other embedders will.

mod support;

use std::time::{Duration, Instant};

use support::api::{
    load_profile, CancelToken, Input, OutputLimitAction, RunEvent, RunStatus, Sandbox,
    SandboxOptions,
};

fn sandbox(profile: &str) -> Sandbox {
    let options = SandboxOptions {
        init_program: Some(env!("CARGO_BIN_EXE_airlock").into()),
        ..SandboxOptions::default()
    };
    Sandbox::with_options(load_profile(profile).unwrap(), options).unwrap()
}

fn profiles() -> Vec<&'static str> {
    if support::sandbox_available() {
        vec!["trusted", "untrusted"]
    } else {
        eprintln!("skipping untrusted: the native backend cannot run here");
        vec!["trusted"]
    }
}

#[test]
fn run_returns_a_result_with_accounting() {
    for profile in profiles() {
        let result = sandbox(profile)
            .command(support::PYTHON)
            .arg("-")
            .stdin("print(sum(range(10)))")
            .run()
            .unwrap();
        assert!(result.success(), "{profile}: {result:?}");
        assert_eq!(result.stdout.as_deref(), Some("45\n"));
        assert!(
            result.peak_memory_bytes.unwrap_or(0) > 1 << 20,
            "{profile}: no memory accounting"
        );
        assert!(
            result.cpu_user_ms + result.cpu_sys_ms > 0,
            "{profile}: no CPU accounting"
        );
    }
}

/// `run` serves every pipe from one loop: stdin larger than a pipe buffer must reach the
/// program while both output streams are drained, and the caps count what they cut.
#[test]
fn run_feeds_large_stdin_while_draining_both_streams() {
    let input: String = (0..40_000).map(|i| format!("{i}\n")).collect();
    let code = "import sys\ndata = sys.stdin.read()\nsys.stderr.write('e' * 300000)\nprint(len(data), data.count(chr(10)))";
    for profile in profiles() {
        let mut policy = load_profile(profile).unwrap();
        policy.limits.stderr = "100KiB".parse().unwrap();
        policy.limits.on_output_limit = OutputLimitAction::Truncate;
        let options = SandboxOptions {
            init_program: Some(env!("CARGO_BIN_EXE_airlock").into()),
            ..SandboxOptions::default()
        };
        let result = Sandbox::with_options(policy, options)
            .unwrap()
            .command(support::PYTHON)
            .args(["-c", code])
            .stdin(input.clone())
            .run()
            .unwrap();
        assert!(result.success(), "{profile}: {result:?}");
        assert_eq!(
            result.stdout.as_deref(),
            Some(format!("{} 40000\n", input.len()).as_str()),
            "{profile}"
        );
        assert_eq!(result.stderr_bytes, 300_000, "{profile}");
        assert!(result.stderr_truncated, "{profile}");
        assert_eq!(result.stderr.as_deref().map(str::len), Some(100 * 1024));
    }
}

#[test]
fn output_streams_as_events_before_the_run_ends() {
    for profile in profiles() {
        let code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)";
        let mut handle = sandbox(profile)
            .command(support::PYTHON)
            .args(["-c", code])
            .stream_output()
            .spawn()
            .unwrap();
        let events = handle.events().unwrap();
        let mut seen = String::new();
        let mut started = false;
        while let Ok(event) = events.recv_timeout(Duration::from_secs(10)) {
            match event {
                RunEvent::Started { layers } => started = !layers.is_empty(),
                RunEvent::Stdout(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
                _ => {}
            }
            if seen.contains('2') {
                break;
            }
        }
        assert!(started, "{profile}: no Started event");
        assert_eq!(seen, "0\n1\n2\n", "{profile}");
        let result = handle.wait().unwrap();
        assert_eq!(result.status, RunStatus::Exited);
        assert_eq!(result.stdout, None, "streamed output is not also captured");
    }
}

#[test]
fn cancel_stops_a_run_from_another_thread() {
    for profile in profiles() {
        let handle = sandbox(profile)
            .command("/bin/sleep")
            .arg("60")
            .stdin_from(Input::Null)
            .spawn()
            .unwrap();
        let canceller = handle.canceller();
        let started = Instant::now();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            canceller.cancel();
        });
        let result = handle.wait().unwrap();
        assert_eq!(result.status, RunStatus::Cancelled, "{profile}: {result:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{profile}: cancel took {:?}",
            started.elapsed()
        );
    }
}

/// A cancel token given to the command stops the run for `run` as for `spawn`, when it
/// fires during the run, and when it fired before the start: the sandbox's set-up is cut
/// short, which is a cancellation, not a sandbox error (it was `sandbox_error` before).
#[test]
fn a_cancel_token_stops_a_run_before_or_during_it() {
    for profile in profiles() {
        let sleeper = || sandbox(profile).command("/bin/sleep").arg("60");
        let early = CancelToken::new();
        early.cancel();
        let result = sleeper().cancel_on(&early).run().unwrap();
        assert_eq!(result.status, RunStatus::Cancelled, "{profile}: {result:?}");
        assert!(result.error.is_none(), "{profile}: {result:?}");
        let spawned = sleeper().cancel_on(&early).spawn().unwrap();
        let result = spawned.wait().unwrap();
        assert_eq!(result.status, RunStatus::Cancelled, "{profile}: {result:?}");

        let token = CancelToken::new();
        let canceller = token.clone();
        let started = Instant::now();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            canceller.cancel();
        });
        let result = sleeper().cancel_on(&token).run().unwrap();
        assert_eq!(result.status, RunStatus::Cancelled, "{profile}: {result:?}");
        assert!(!result.isolation.is_empty(), "it had started: {result:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{profile}: cancel took {:?}",
            started.elapsed()
        );
    }
}

/// A program that writes at once is heard after its start, every time.
#[test]
fn started_is_always_the_first_event() {
    for profile in profiles() {
        for _ in 0..10 {
            let mut handle = sandbox(profile)
                .command("/bin/echo")
                .arg("at once")
                .stream_output()
                .spawn()
                .unwrap();
            let first = handle.events().unwrap().recv().unwrap();
            assert!(
                matches!(first, RunEvent::Started { .. }),
                "{profile}: {first:?}"
            );
            handle.wait().unwrap();
        }
    }
}

#[test]
fn setup_failures_are_results_not_panics() {
    let result = sandbox("trusted")
        .command("definitely-not-installed")
        .run()
        .unwrap();
    assert_eq!(result.status, RunStatus::SandboxError);
    assert!(result.error.unwrap().contains("definitely-not-installed"));
}

/// `before_launch` runs once, before anything of the run starts: a check that passes (after
/// a while, as a daemon's commit would) lets the run go on; one that fails stops it with the
/// check's error, before any init is launched: no run directory is left or was made.
#[test]
fn a_launch_check_runs_once_before_the_run_and_a_failing_one_stops_it() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    for profile in profiles() {
        let runtime = tempfile::tempdir().unwrap();
        let options = SandboxOptions {
            init_program: Some(env!("CARGO_BIN_EXE_airlock").into()),
            runtime_dir: Some(runtime.path().to_path_buf()),
            ..SandboxOptions::default()
        };
        let sandbox = Sandbox::with_options(load_profile(profile).unwrap(), options).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let passed = sandbox
            .command("/bin/true")
            .before_launch(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                Ok(())
            })
            .run()
            .unwrap();
        assert!(passed.success(), "{profile}: {passed:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{profile}");
        let before = tree(runtime.path());

        let counted = Arc::clone(&calls);
        let stopped = sandbox
            .command("/bin/sh")
            .args(["-c", "echo ran"])
            .stream_output()
            .before_launch(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Err(std::io::Error::other("the record is not stored"))
            })
            .spawn();
        let Err(error) = stopped else {
            panic!("{profile}: a failed check stops the run");
        };
        assert!(
            error.to_string().contains("the record is not stored"),
            "{profile}: {error}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{profile}");
        assert_eq!(tree(runtime.path()), before, "{profile}: nothing made");
    }
}

/// Every path under `dir`, sorted.
fn tree(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            paths.extend(tree(&path));
        }
        paths.push(path);
    }
    paths.sort();
    paths
}

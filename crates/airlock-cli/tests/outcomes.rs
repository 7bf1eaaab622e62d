//! Errors a program can read: with `--json` every outcome of `run` and `exec` is exactly one
//! compact JSON line on stdout (refusals too, with status `sandbox_error` and `error_kind`);
//! `worker` and `call` answer a bad command line in their own JSON forms; an unwritable
//! `--result` file refuses the run before the program runs; SIGTERM and SIGINT end the run as
//! `cancelled` with the result written and nothing left behind; output that is not UTF-8
//! keeps its exact bytes; limits that cannot work are refused with the reason.

mod support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use support::*;

/// Runs airlock and returns (exit code, the one JSON line on stdout, stderr).
fn one_json_line(args: &[&str]) -> (i32, Value, String) {
    let out = airlock(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: expected exactly one line on stdout, got {stdout:?}; stderr: {stderr}"
    );
    let value = serde_json::from_str(lines[0])
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"));
    (out.status.code().unwrap_or(-1), value, stderr)
}

fn assert_refused(args: &[&str], kind: &str) -> Value {
    let (code, result, stderr) = one_json_line(args);
    assert_eq!(code, 125, "{args:?}: {result} {stderr}");
    assert_eq!(result["status"], "sandbox_error", "{args:?}: {result}");
    assert_eq!(result["error_kind"], kind, "{args:?}: {result}");
    assert!(result["error"].as_str().is_some_and(|e| !e.is_empty()));
    result
}

#[test]
fn every_refusal_of_run_and_exec_is_one_compact_json_line() {
    let missing = "/nonexistent/airlock-workdir";
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--json", "--bogus-flag", "--", "/bin/true"],
            "usage_invalid",
        ),
        (
            &["run", "--json", "--mem", "12XB", "--", "/bin/true"],
            "usage_invalid",
        ),
        (
            &["run", "--json", "--profile", "nosuch", "--", "/bin/true"],
            "profile_not_found",
        ),
        (
            &["run", "--json", "--workdir", missing, "--", "/bin/true"],
            "bad_path",
        ),
        (
            &["run", "--json", "--tier", "huge", "--", "/bin/true"],
            "value_invalid",
        ),
        (
            &["run", "--json", "--backend", "none", "--", "/bin/true"],
            "unisolated_refused",
        ),
        (
            &[
                "run",
                "--json",
                "--dev",
                "--backend",
                "none",
                "--",
                "no-such-program-xyz",
            ],
            "program_not_found",
        ),
        (
            &["exec", "--json", "--bogus-flag", "python", "print(1)"],
            "usage_invalid",
        ),
        (
            &["exec", "--json", "cobol", "DISPLAY 1"],
            "interpreter_unknown",
        ),
    ];
    for (args, kind) in cases {
        assert_refused(args, kind);
    }
    // --pretty is for people: the same object, indented.
    let out = airlock(&["run", "--pretty", "--profile", "nosuch", "--", "/bin/true"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().count() > 3, "{text}");
    let pretty: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(pretty["error_kind"], "profile_not_found");
}

#[test]
fn a_finished_run_is_one_compact_json_line_too() {
    let (code, result, _) = one_json_line(&[
        "run",
        "--json",
        "--dev",
        "--backend",
        "none",
        "--",
        "/bin/sh",
        "-c",
        "echo a; echo b; exit 3",
    ]);
    assert_eq!(code, 3);
    assert_eq!(result["status"], "exited");
    assert_eq!(result["stdout"], "a\nb\n");
}

#[test]
fn worker_and_call_answer_a_bad_command_line_in_their_own_json() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("out");
    let out = out.to_str().unwrap();
    // Set-up errors of a worker (an input that does not exist, a bad flag) end the NDJSON
    // stream with a result line like every other outcome.
    for args in [
        &[
            "worker",
            "--in",
            "data=/nonexistent/input.csv",
            "--out",
            out,
            "--",
            "/bin/true",
        ][..],
        &["worker", "--bogus-flag", "--out", out, "--", "/bin/true"],
    ] {
        let (code, line, _) = one_json_line(args);
        assert_eq!(code, 125, "{args:?}: {line}");
        assert_eq!(line["event"], "result", "{line}");
        assert_eq!(line["status"], "sandbox_error", "{line}");
        assert_eq!(line["success"], false, "{line}");
        assert!(line["error_kind"].is_string(), "{line}");
    }
    let (code, error, _) = one_json_line(&["call", "--bogus-flag", "m:f"]);
    assert_eq!(code, 125, "{error}");
    assert_eq!(error["error"], "sandbox_error", "{error}");
    assert_eq!(error["error_kind"], "usage_invalid", "{error}");
}

#[test]
fn an_unwritable_result_file_refuses_the_run_before_the_program_runs() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let directory = dir.path().to_str().unwrap();
    for target in ["/nonexistent/dir/result.json", directory] {
        let (code, result, stderr) = one_json_line(&[
            "run",
            "--json",
            "--dev",
            "--backend",
            "none",
            "--result",
            target,
            "--",
            "/bin/sh",
            "-c",
            &script,
        ]);
        assert_eq!(code, 125, "{target}: {result} {stderr}");
        assert_eq!(result["error_kind"], "result_unwritable", "{result}");
        assert!(!marker.exists(), "{target}: the program ran anyway");
    }
}

#[test]
fn output_that_is_not_utf8_keeps_its_exact_bytes() {
    let (_, result, _) = one_json_line(&[
        "run",
        "--json",
        "--dev",
        "--backend",
        "none",
        "--",
        "/usr/bin/printf",
        "ok \\377\\376\\000 end",
    ]);
    assert_eq!(result["stdout_lossy"], true, "{result}");
    let encoded = result["stdout_base64"].as_str().expect("stdout_base64");
    assert_eq!(decode_base64(encoded), b"ok \xff\xfe\x00 end");
    let (_, text, _) = one_json_line(&[
        "run",
        "--json",
        "--dev",
        "--backend",
        "none",
        "--",
        "/bin/echo",
        "h\u{e9}llo",
    ]);
    assert_eq!(text["stdout"], "h\u{e9}llo\n");
    assert!(
        text.get("stdout_base64").is_none() && text.get("stdout_lossy").is_none(),
        "{text}"
    );
}

fn decode_base64(text: &str) -> Vec<u8> {
    let out = std::process::Command::new("base64")
        .arg("-d")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    out.stdout
}

#[test]
fn limits_that_cannot_work_are_refused_with_the_reason() {
    let cases: &[(&[&str], &str)] = &[
        (&["--pids", "1"], "at least 3"),
        (&["--pids", "2"], "at least 3"),
        (&["--fsize", "1"], "at least 64KiB"),
        (&["--wall", "1000000000000s"], "at most 365d"),
        (&["--cpu", "1e30"], "duration"),
        (&["--grace", "2d"], "at most 1h"),
    ];
    for (flags, reason) in cases {
        let mut args = vec!["run", "--json"];
        args.extend_from_slice(flags);
        args.extend(["--", "/bin/true"]);
        let result = assert_refused(
            &args,
            if flags[1] == "1e30" {
                "usage_invalid"
            } else {
                "value_invalid"
            },
        );
        assert!(
            result["error"].as_str().unwrap().contains(reason),
            "{flags:?}: {result}"
        );
        assert!(
            result["error"].as_str().unwrap().contains(flags[0]),
            "names the flag: {result}"
        );
    }
    // More memory than the host has is no limit: the run goes ahead and says so.
    let result = run_json(
        &["--dev", "--backend", "none", "--mem", "1PiB"],
        &["/bin/true"],
    );
    assert_eq!(result["status"], "exited", "{result}");
    assert!(
        result["warnings"]
            .to_string()
            .contains("more than this host has"),
        "{result}"
    );
}

#[test]
fn a_failed_run_says_when_the_network_was_off_or_a_named_file_is_invisible() {
    if !native_available() {
        return eprintln!("skipped: the native backend cannot run here");
    }
    let lookup = "import socket\nsocket.getaddrinfo('example.com', 443)";
    let result = run_json(&[], &[PYTHON, "-c", lookup]);
    assert_eq!(result["status"], "exited", "{result}");
    assert!(
        result["hints"].to_string().contains("network is off"),
        "{result}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.py"), "print(1)\n").unwrap();
    let out = airlock_command()
        .args(["run", "--json", "--", PYTHON, "script.py"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        result["hints"]
            .to_string()
            .contains("script.py exists on the host but is not visible"),
        "{result}"
    );
}

fn wait_for_process_with(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_with(marker).is_empty() {
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM to airlock alone (a service manager) and SIGINT to its whole process group (Ctrl-C
/// in a terminal) both end the run as `cancelled`: the tree is stopped, the result file is
/// written, the exit code is 128+N, and no run directory or cgroup is left, at once.
#[test]
fn a_signal_to_airlock_cancels_the_run_and_leaves_nothing() {
    let mut modes: Vec<&[&str]> = vec![TIER0];
    if native_available() {
        modes.push(NATIVE);
    }
    for base in modes {
        for (signal, whole_group) in [(libc::SIGTERM, false), (libc::SIGINT, true)] {
            let marker = unique("airlock-cancel-");
            let result_file = tempfile::NamedTempFile::new().unwrap();
            let script = format!("{} ; echo not reached", sleeper(&marker));
            let mut child = airlock_command()
                .args(["run", "--result"])
                .arg(result_file.path())
                .args(base)
                .args(["--", "/bin/sh", "-c", &script])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap();
            wait_for_process_with(&marker);
            let target = if whole_group {
                -(child.id() as i32)
            } else {
                child.id() as i32
            };
            assert_eq!(unsafe_free_kill(target, signal), 0);
            let status = child.wait().unwrap();
            let what = format!("{base:?} signal {signal}");
            assert_eq!(status.code(), Some(128 + signal), "{what}");
            let result: Value =
                serde_json::from_slice(&std::fs::read(result_file.path()).unwrap()).unwrap();
            assert_eq!(result["status"], "cancelled", "{what}: {result}");
            assert_eq!(result["cancel_signal"], signal, "{what}: {result}");
            assert!(
                processes_with(&marker).is_empty(),
                "{what}: the program survived"
            );
            if is_root() {
                let left = runs_of_supervisor(child.id());
                assert!(left.is_empty(), "{what}: left behind: {left:?}");
            }
        }
    }
}

/// `kill(2)` through the `kill` command, so the test needs no unsafe code.
fn unsafe_free_kill(target: i32, signal: i32) -> i32 {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(target.to_string())
        .status()
        .unwrap();
    status.code().unwrap_or(-1)
}

/// A shell command that sleeps long with `marker` in its command line.
fn sleeper(marker: &str) -> String {
    format!("{PYTHON} -c 'import time; time.sleep(60)' {marker}")
}

#[test]
fn exec_takes_code_on_stdin_of_any_size() {
    let profile = if native_available() {
        "untrusted"
    } else {
        "trusted"
    };
    // ~200 KiB of code: more than one argument may hold (128 KiB).
    let mut code = String::from("total = 0\n");
    for i in 0..12_000 {
        code.push_str(&format!("total += {i}  # padding padding\n"));
    }
    assert!(code.len() > 192 * 1024, "{}", code.len());
    for code_arg in [&["-"][..], &[]] {
        let mut child = airlock_command()
            .args(["exec", "--json", "--profile", profile, "python"])
            .args(code_arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let body = format!("{code}print(total)\n");
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            stdin.write_all(body.as_bytes()).unwrap();
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        let expected = (0..12_000u64).sum::<u64>();
        assert_eq!(
            result["stdout"],
            format!("{expected}\n"),
            "{code_arg:?}: {result}"
        );
    }
}

#[test]
fn call_and_exec_take_the_same_sandbox_flags_as_run() {
    let dir = shared_dir();
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "shared data\n").unwrap();
    set_world_readable(&data);
    let tools = dir.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    std::fs::write(
        tools.join("readers.py"),
        "import os\ndef read(path):\n    return [open(path).read(), os.environ.get('GREETING'), os.getcwd()]\n",
    )
    .unwrap();
    set_world_readable(&tools);
    set_world_readable(&tools.join("readers.py"));
    let profile = if native_available() {
        "untrusted"
    } else {
        "trusted"
    };
    let data_arg = data.to_str().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    set_world_writable(&work);
    let work_arg = work.to_str().unwrap();
    let args = format!("{{\"path\": \"{data_arg}\"}}");
    let out = airlock(&[
        "call",
        "--profile",
        profile,
        "--path",
        tools.to_str().unwrap(),
        "--ro",
        data_arg,
        "--env",
        "GREETING=hi",
        "--workdir",
        work_arg,
        "--wall",
        "20s",
        "--args",
        &args,
        "readers:read",
    ]);
    let value: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(value, serde_json::json!(["shared data\n", "hi", work_arg]));
    let code = format!("import os; print(open('{data_arg}').read().strip(), os.getcwd())");
    let result = run_json_exec(
        &[
            "--profile",
            profile,
            "--ro",
            data_arg,
            "--workdir",
            work_arg,
            "--wall",
            "20s",
        ],
        &code,
    );
    assert_eq!(
        result["stdout"],
        format!("shared data {work_arg}\n"),
        "{result}"
    );
}

fn run_json_exec(flags: &[&str], code: &str) -> Value {
    let mut args = vec!["exec", "--json"];
    args.extend_from_slice(flags);
    args.extend(["python", code]);
    let (_, result, _) = one_json_line(&args);
    result
}

fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    dir
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn set_world_readable(path: &Path) {
    let mode = if path.is_dir() { 0o755 } else { 0o644 };
    set_mode(path, mode);
}

fn set_world_writable(path: &Path) {
    set_mode(path, 0o777);
}

//! The sandbox looks like a normal system from a terminal: `ls /` works and shows only what the
//! sandbox holds, `--tty` gives an interactive shell a terminal of its own (driven here through
//! a pseudo-terminal by `script`, as a person at a terminal would), and Ctrl-C at a terminal
//! cancels the run with nothing left behind, at once.

mod support;

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use support::*;

fn script_available() -> bool {
    let found = std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        eprintln!("skipped: `script` (util-linux) is not installed; .ci/run installs it");
    }
    found
}

/// Runs `command` (a shell command line) in a pseudo-terminal of `script`'s, typing `input`
/// into it once `ready` returns true; returns (exit code, everything the terminal showed).
fn at_a_terminal(command: &str, mut ready: impl FnMut() -> bool, input: &[u8]) -> (i32, String) {
    let mut child = std::process::Command::new("script")
        .args(["-q", "-e", "-c", command, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{command}: never ready for input"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stdin.write_all(input).unwrap();
    stdin.flush().unwrap();
    let out = wait_with_deadline(child, Duration::from_secs(60));
    drop(stdin);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

fn wait_with_deadline(mut child: std::process::Child, limit: Duration) -> std::process::Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the terminal session did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn modes() -> Vec<&'static [&'static str]> {
    let mut modes: Vec<&[&str]> = vec![TIER0];
    if native_available() {
        modes.push(NATIVE);
    }
    modes
}

#[test]
fn an_interactive_shell_works_through_a_terminal_of_its_own() {
    if !script_available() {
        return;
    }
    for base in modes() {
        let command = format!(
            "stty rows 40 cols 100; {} run --tty {} -- /bin/sh -i",
            env!("CARGO_BIN_EXE_airlock"),
            base.join(" ")
        );
        let typed = b"echo hello-$((6*7)); [ -t 0 ] && echo stdin-is-a-tty; stty size; exit 3\n";
        let (code, shown) = at_a_terminal(&command, || true, typed);
        assert_eq!(code, 3, "{base:?}: {shown}");
        for expected in ["hello-42", "stdin-is-a-tty", "40 100"] {
            assert!(
                shown.contains(expected),
                "{base:?}: no {expected:?} in {shown}"
            );
        }
        assert!(!shown.contains("Cannot set tty"), "{base:?}: {shown}");
    }
}

/// Ctrl-C typed at the terminal sends SIGINT to its whole foreground process group: airlock
/// and its init. The run ends `cancelled` with exit code 130, its result written, and no run
/// directory or cgroup left at the moment airlock exits.
#[test]
fn ctrl_c_at_a_terminal_cancels_the_run_and_leaves_nothing() {
    if !script_available() {
        return;
    }
    for base in modes() {
        let marker = unique("airlock-ctrl-c-");
        let result_file = tempfile::NamedTempFile::new().unwrap();
        let command = format!(
            "{} run --result {} {} -- {PYTHON} -c 'import time; time.sleep(60)' {marker}",
            env!("CARGO_BIN_EXE_airlock"),
            result_file.path().display(),
            base.join(" ")
        );
        // The supervisor's pid names its run directory and cgroups (`run-<pid>-...`).
        let mut supervisors = Vec::new();
        let started = Instant::now();
        let program_started = || {
            let started = !processes_named("python3", &marker).is_empty();
            if started {
                supervisors = processes_named("airlock", &marker);
            }
            started
        };
        let (code, shown) = at_a_terminal(&command, program_started, b"\x03");
        assert!(
            !supervisors.is_empty(),
            "{base:?}: airlock never ran: {shown}"
        );
        assert_eq!(code, 130, "{base:?}: {shown}");
        assert!(started.elapsed() < Duration::from_secs(30), "{base:?}");
        let result: Value =
            serde_json::from_slice(&std::fs::read(result_file.path()).unwrap()).unwrap();
        assert_eq!(result["status"], "cancelled", "{base:?}: {result}");
        assert_eq!(result["cancel_signal"], 2, "{base:?}: {result}");
        assert!(
            processes_with(&marker).is_empty(),
            "{base:?}: program survived"
        );
        for pid in supervisors {
            let left = runs_of_supervisor(pid);
            assert!(left.is_empty(), "{base:?}: left behind at once: {left:?}");
        }
    }
}

/// The processes called `name` whose command line holds `marker` (`script` and its shell
/// hold it too).
fn processes_named(name: &str, marker: &str) -> Vec<u32> {
    all_processes_with(marker)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == name)
        })
        .collect()
}

#[test]
fn the_root_is_listable_and_shows_only_what_the_sandbox_holds() {
    if !native_available() {
        return eprintln!("skipped: the native backend cannot run here");
    }
    let code = "import os, json; print(json.dumps(sorted(os.listdir('/'))))";
    let result = run_json(NATIVE, &[PYTHON, "-c", code]);
    assert_eq!(result["status"], "exited", "{result}");
    let listed: Vec<String> = serde_json::from_str(result["stdout"].as_str().unwrap()).unwrap();
    for present in ["dev", "etc", "proc", "tmp", "usr"] {
        assert!(listed.iter().any(|e| e == present), "{present}: {listed:?}");
    }
    for absent in ["home", "root", "srv", "boot", "var", "opt", "mnt"] {
        assert!(!listed.iter().any(|e| e == absent), "{absent}: {listed:?}");
    }
    let ls = run_json(NATIVE, &["/bin/ls", "/"]);
    assert_eq!(ls["exit_code"], 0, "{ls}");
    // Listing is all the new rule grants: the host's files stay unreadable where they were.
    let read = run_json(NATIVE, &["/bin/cat", "/etc/shadow"]);
    assert_ne!(read["exit_code"], 0, "{read}");
}

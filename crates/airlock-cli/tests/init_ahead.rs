//! The init the CLI forks first thing on a cold run, before it reads its arguments, profile and
//! plan (`airlock-cli/src/ahead.rs`, `InitSpawner::fork_ahead`): it holds nothing of the CLI
//! but its stdio and its socket, it ends at once when the CLI dies before handing it a run,
//! having created nothing, and a CLI that refuses its input reaps it before it exits.
//! `exec bash -` reads its code on stdin before it plans: the CLI waits there with the init
//! forked ahead, for as long as the test holds stdin open.

mod support;

use std::io::Write;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// Starts `airlock exec bash -` in a private runtime directory and cgroup parent, waiting on
/// its stdin, and returns it with the init it forked ahead.
fn cli_waiting_on_stdin(runs: &PrivateRuns, marker: &str) -> (Child, u32) {
    let mut cli = spawn_exec_on_stdin(runs, marker);
    let init = init_forked_ahead(&mut cli);
    (cli, init)
}

fn spawn_exec_on_stdin(runs: &PrivateRuns, marker: &str) -> Child {
    airlock_command()
        .args(["exec"])
        .args(runs.flags())
        .args(["bash", "-", marker])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The CLI's one child, once it has it (the CLI is killed and reaped when it has none).
fn init_forked_ahead(cli: &mut Child) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children = children_of(cli.id());
        if let [init] = children[..] {
            return init;
        }
        if Instant::now() > deadline {
            let _ = cli.kill();
            let _ = cli.wait();
            panic!("no init forked ahead: {children:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_init_forked_ahead_holds_only_its_socket_and_the_clis_stdio() {
    let runs = PrivateRuns::new();
    let marker = unique("airlock-ahead-fds-");
    let (mut cli, init) = cli_waiting_on_stdin(&runs, &marker);
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{init}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort();
    let socket = std::fs::read_link(format!("/proc/{init}/fd/3")).unwrap();
    let _ = cli.kill();
    cli.wait().unwrap();
    assert_eq!(fds, [0, 1, 2, 3], "the init forked ahead holds {fds:?}");
    assert!(
        socket.to_string_lossy().starts_with("socket:"),
        "{socket:?}"
    );
}

#[test]
fn a_cli_killed_before_it_hands_its_init_a_run_leaves_nothing() {
    let runs = PrivateRuns::new();
    let marker = unique("airlock-ahead-killed-");
    let (mut cli, init) = cli_waiting_on_stdin(&runs, &marker);
    // Half the code written, then the CLI dies (SIGKILL) before it has a run to hand over.
    cli.stdin.as_mut().unwrap().write_all(b"echo ").unwrap();
    cli.kill().unwrap();
    cli.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(init) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !alive(init),
        "the init forked ahead outlived its killed CLI"
    );
    let left = runs.entries_named("run-");
    assert!(left.is_empty(), "it created {left:?}");
    assert!(processes_with(&marker).is_empty());
}

#[test]
fn a_cli_refusing_its_input_reaps_its_init_before_it_exits() {
    let runs = PrivateRuns::new();
    let marker = unique("airlock-ahead-refused-");
    let (mut cli, init) = cli_waiting_on_stdin(&runs, &marker);
    // Code that is not UTF-8: refused after the init was forked, before any run.
    cli.stdin.take().unwrap().write_all(&[0xff, 0xfe]).unwrap();
    let output = cli.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(125), "{}", stderr_text(&output));
    let stderr = stderr_text(&output);
    assert!(
        stderr.contains("airlock: error [") && stderr.contains("UTF-8"),
        "{stderr}"
    );
    // Reaped, not left to exit on its own and wait, a zombie, for the host's reaper.
    assert!(
        !std::path::Path::new(&format!("/proc/{init}")).exists(),
        "the init forked ahead outlived its CLI"
    );
    assert!(runs.entries_named("run-").is_empty());
}

#[test]
fn a_run_uses_the_init_forked_ahead_and_its_result_is_unchanged() {
    let runs = PrivateRuns::new();
    let marker = unique("airlock-ahead-run-");
    let (mut cli, init) = cli_waiting_on_stdin(&runs, &marker);
    let mut stdin = cli.stdin.take().unwrap();
    stdin.write_all(b"echo ran; exit 3").unwrap();
    drop(stdin);
    let output = cli.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(3), "{}", stderr_text(&output));
    assert!(
        stdout_text(&output).contains("ran"),
        "{}",
        stdout_text(&output)
    );
    assert!(!alive(init), "the run's init outlived it");
    assert!(runs.entries_named("run-").is_empty());
}

/// Whether `pid` exists and is no zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
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
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after_name = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        let ppid = after_name.split_whitespace().nth(1);
        if ppid.and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            children.push(pid);
        }
    }
    children
}

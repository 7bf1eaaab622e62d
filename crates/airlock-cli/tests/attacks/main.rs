//! The attack suite: every attack of the catalogue (`crates/airlock-attack`) tries one escape,
//! and each is judged by evidence gathered on the host (a listener that got bytes, a file that
//! appeared, a victim process that died, a process that outlived its run, a secret in the
//! output).
//!
//! Two modes per attack:
//! - `escape`: the attack must WORK without the sandbox (Tier 0, `--dev --backend none`, or a
//!   bare process where Tier 0 itself already defends), which proves its check can fail;
//!   resource attacks that Tier 0 already contains assert containment here too.
//! - `contained`: under the default `untrusted` profile the evidence must be absent and airlock
//!   must return a sane result.
//!
//! After each suite: no process carrying the suite's marker, no new mount, no cgroup and no run
//! directory left by any airlock the suite started. See docs/attacks.md for the table.

#![cfg(target_os = "linux")]

mod leftovers;
mod suite;
#[path = "../support/mod.rs"]
mod support;
mod variants;

use std::path::Path;
use std::process::{Command, Stdio};

use airlock_attack::host::{is_root, random_hex};
use airlock_attack::program::program;
use serde_json::Value;

use suite::{run_suite, run_suite_on, run_suite_on_with, Mode, User, SERIAL, STARTED_INTERPRETER};
use support::{PYTHON, UNPRIVILEGED_UID};

#[test]
fn attacks_escape_without_sandbox_as_root() {
    run_suite(Mode::Escape, User::Root);
}

#[test]
fn attacks_contained_as_root() {
    run_suite(Mode::Contained, User::Root);
}

#[test]
fn attacks_contained_as_unprivileged_user() {
    run_suite(Mode::Contained, User::Unprivileged);
}

/// The untrusted profile with one layer switched off by a flag: the checks must see the attacks
/// that layer alone stopped, and keep seeing containment where another layer also stops them.
/// The same table on every other backend that can run here: the conformance matrix. Each
/// backend must stop every attack with the same default profile (or be skipped, saying why).
#[test]
fn attacks_contained_on_bwrap_as_root() {
    run_suite_on(Mode::Contained, User::Root, Some("bwrap"));
}

/// bwrap as an unprivileged user (no in-memory run directory: its tmpfs mounts have no inode
/// cap, a gap refused by default and then reported).
#[test]
fn attacks_contained_on_bwrap_as_unprivileged_user() {
    run_suite_on(Mode::Contained, User::Unprivileged, Some("bwrap"));
}

/// The warm path (issue 19): each run goes to a sandbox prepared ahead, which waited for its
/// command after every confinement step; the same catalogue must be contained.
#[test]
fn attacks_contained_on_warm_path_as_root() {
    run_suite_on_with(Mode::Contained, User::Root, None, &["--warm"]);
}

#[test]
fn attacks_contained_on_warm_path_as_unprivileged_user() {
    run_suite_on_with(Mode::Contained, User::Unprivileged, None, &["--warm"]);
}

/// Interpreter zygotes (issue 19): each attack program runs as code in a child forked from a
/// template interpreter (`airlock run --zygote`), confined by the cold run's steps.
#[test]
fn attacks_contained_on_zygote_path_as_root() {
    support::fresh_zygote_bin();
    run_suite_on_with(Mode::Contained, User::Root, None, &["--zygote"]);
}

#[test]
fn attacks_contained_on_zygote_path_as_unprivileged_user() {
    support::fresh_zygote_bin();
    run_suite_on_with(Mode::Contained, User::Unprivileged, None, &["--zygote"]);
}

/// Started interpreters (issue 19): each Python attack program runs as code handed to a Python
/// started ahead in a prepared sandbox (`airlock exec --warm python CODE ARGS...`: the shim, the
/// SIGSTOP handshake with PID 1, the address-space holder); every run must say it went warm,
/// and no interpreter or holder may outlive its run. Other programs are skipped, saying so.
#[test]
fn attacks_contained_on_started_interpreter_path_as_root() {
    run_suite_on_with(Mode::Contained, User::Root, None, STARTED_INTERPRETER);
}

#[test]
fn attacks_contained_on_started_interpreter_path_as_unprivileged_user() {
    run_suite_on_with(
        Mode::Contained,
        User::Unprivileged,
        None,
        STARTED_INTERPRETER,
    );
}

#[test]
fn attacks_contained_on_container_as_root() {
    run_suite_on(Mode::Contained, User::Root, Some("container"));
}

/// Rootless runc: the CLI runs unprivileged, so runc runs rootless (the program is the root
/// of a user namespace mapping only the caller, no cgroup: memory and processes are capped
/// by rlimits); runc's own tmpfs mounts, made in that user namespace, keep both caps.
#[test]
fn attacks_contained_on_container_as_unprivileged_user() {
    let flags = &["--container-runtime", "runc"];
    run_suite_on_with(
        Mode::Contained,
        User::Unprivileged,
        Some("container"),
        flags,
    );
}

#[test]
fn attacks_contained_on_crun_as_root() {
    if runtime_missing("crun") {
        return;
    }
    let flags = &["--container-runtime", "crun"];
    run_suite_on_with(Mode::Contained, User::Root, Some("container"), flags);
}

#[test]
fn attacks_contained_on_podman_as_root() {
    if runtime_missing("podman") {
        return;
    }
    let flags = &["--container-runtime", "podman"];
    run_suite_on_with(Mode::Contained, User::Root, Some("container"), flags);
}

fn runtime_missing(name: &str) -> bool {
    let missing = !["/usr/bin", "/usr/sbin"]
        .iter()
        .any(|dir| Path::new(dir).join(name).exists());
    if missing {
        eprintln!("skipped: {name} is not installed (apt-get install {name})");
    }
    missing
}

#[test]
fn attacks_contained_on_gvisor_as_root() {
    run_suite_on(Mode::Contained, User::Root, Some("gvisor"));
}

/// Rootless gVisor (`runsc --rootless`): no capped mounts from airlock, and runsc's own tmpfs
/// has no inode cap, a gap refused by default and then reported.
#[test]
fn attacks_contained_on_gvisor_as_unprivileged_user() {
    run_suite_on(Mode::Contained, User::Unprivileged, Some("gvisor"));
}

#[test]
fn attacks_against_weakened_untrusted_profiles_as_root() {
    run_suite(Mode::Weakened, User::Root);
}

/// Tier 0 without root runs the program as the caller's own uid: the env scrub means nothing if
/// the program can read the supervisor's /proc/PID/environ (or ptrace it) instead.
#[test]
fn tier0_without_root_keeps_the_supervisors_environment_private() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = is_root();
    if !Path::new(PYTHON).exists() || (root && !Path::new("/usr/bin/setpriv").exists()) {
        eprintln!("skipped: needs {PYTHON} and, as root, setpriv");
        return;
    }
    let secret = format!("secret-{}", random_hex());
    let run = |argv: &[String]| {
        let mut line: Vec<String> = Vec::new();
        if root {
            line.extend([
                "/usr/bin/setpriv".to_string(),
                format!("--reuid={UNPRIVILEGED_UID}"),
                format!("--regid={UNPRIVILEGED_UID}"),
                "--clear-groups".into(),
            ]);
        }
        line.extend(argv.iter().cloned());
        let output = Command::new(&line[0])
            .args(&line[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("AIRLOCK_ATTACK_SECRET", &secret)
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .expect("start the run");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let attack = program("parent_env.py").argv(PYTHON, ["AIRLOCK_ATTACK_SECRET"]);
    let bare = run(&attack);
    assert!(
        bare.contains(&secret),
        "the bare attack must find the secret, or this test proves nothing: {bare}"
    );
    let mut tier0 = vec![
        env!("CARGO_BIN_EXE_airlock").to_string(),
        "run".into(),
        "--json".into(),
        "--dev".into(),
        "--backend".into(),
        "none".into(),
        "--".into(),
    ];
    tier0.extend(attack);
    let result: Value = serde_json::from_str(&run(&tier0)).expect("airlock prints a JSON result");
    let stdout = result["stdout"].as_str().unwrap_or_default();
    assert_eq!(result["status"], "exited", "{result}");
    assert!(
        stdout.contains("BLOCKED"),
        "the attack must have tried: {result}"
    );
    assert!(
        !stdout.contains(&secret),
        "a Tier 0 program read the supervisor's environment: {stdout}"
    );
}

//! The egress gate through the real `airlock` binary: gated runs (`--allow-net`, network
//! `allowlist` and `report`) on every backend, the attacks of issue 16 from inside the sandbox
//! judged by what the test hosts saw, limits, host Unix sockets, package managers and the
//! worker's `fetch`. Everything happens in a test world of network namespaces
//! (`airlock-testworld`): the CLI runs in its gate namespace (`nsenter --net`), the test hosts
//! live on the documentation ranges behind a veth, and nothing touches the root namespace.
//! Needs root; each test says why it skips otherwise.

#![cfg(target_os = "linux")]

mod attacks;
mod backends;
mod limits;
mod packages;
#[path = "../support/mod.rs"]
mod support;
mod system_resolver;
mod unix_sockets;
mod worker;

use std::process::Output;

use airlock_testworld::{World, PYTHON, RESOLVER};
use serde_json::Value;

/// The test hosts live on the documentation ranges, which are non-public: a name reaches them
/// only where a range rule lists them, as a company network in 10.0.0.0/8 would be listed.
pub const TEST_RANGES: [&str; 4] = [
    "192.0.2.0/24:80",
    "192.0.2.0/24:443",
    "[2001:db8::/32]:80",
    "[2001:db8::/32]:443",
];

/// The world, or `None` after saying why the test skips.
pub fn world() -> Option<World> {
    if let Some(reason) = airlock_testworld::skip_reason() {
        eprintln!("{reason}");
        return None;
    }
    if !support::sandbox_available() {
        eprintln!("skipped: the untrusted profile cannot run here");
        return None;
    }
    Some(World::new())
}

/// `--allow-net` for each rule, then the test ranges.
pub fn allow_with_ranges(rules: &[&str]) -> Vec<String> {
    rules
        .iter()
        .chain(TEST_RANGES.iter())
        .flat_map(|rule| ["--allow-net".to_string(), rule.to_string()])
        .collect()
}

/// `airlock run --json --resolver <the test DNS> FLAGS -- PROGRAM` in the gate namespace, with
/// the test CA readable inside (no resolver for a run on the host's network, which has none).
pub fn airlock_in(world: &World, flags: &[String], program: &[&str]) -> Output {
    let mut command = world.in_gate(support::airlock_bin());
    command.args(["run", "--json", "--ro", &world.ca()]);
    if !flags.iter().any(|f| f == "host") {
        command.args(["--resolver", RESOLVER]);
    }
    command.args(flags).arg("--").args(program);
    command.output().expect("airlock runs")
}

/// The refusal of a run that must not start: exit 125 and the error line on stderr.
pub fn refusal(world: &World, flags: &[String]) -> String {
    let out = airlock_in(world, flags, &["/bin/true"]);
    let stderr = support::stderr_text(&out);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    stderr
}

/// [`airlock_in`], parsed.
pub fn run(world: &World, flags: &[String], program: &[&str]) -> Value {
    let out = airlock_in(world, flags, program);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}); stdout: {}\nstderr: {}",
            support::stdout_text(&out),
            support::stderr_text(&out)
        )
    })
}

/// Runs Python code under [`run`].
pub fn python(world: &World, flags: &[String], code: &str) -> Value {
    run(world, flags, &[PYTHON, "-c", code])
}

/// The program's stdout, after checking it exited 0.
pub fn stdout_ok(result: &Value) -> String {
    assert_eq!(
        (support::status(result), result["exit_code"].as_i64()),
        ("exited", Some(0)),
        "{result:#}"
    );
    result["stdout"].as_str().unwrap_or_default().to_string()
}

/// The decisions of the result's network report with this decision (`allow`, `deny`, ...).
pub fn decisions<'a>(result: &'a Value, decision: &str) -> Vec<&'a Value> {
    result["network"]["decisions"]
        .as_array()
        .map(|all| all.iter().filter(|d| d["decision"] == decision).collect())
        .unwrap_or_default()
}

/// The reasons of the connections refused (DNS refusals left out).
pub fn refusal_reasons(result: &Value) -> Vec<String> {
    decisions(result, "deny")
        .into_iter()
        .filter(|d| d["channel"] != "dns")
        .filter_map(|d| d["reason"].as_str().map(str::to_string))
        .collect()
}

/// The CA path for clients in the sandbox.
pub fn ca(world: &World) -> String {
    world.ca()
}

/// Python defining `found_sockets()`: every Unix socket file the sandbox can see. Every
/// visible file is under a mount point (listing `/` itself is not allowed by Landlock).
pub const FOUND_SOCKETS: &str = r#"
import os
def is_socket(path):
    try:
        return (os.lstat(path).st_mode & 0o170000) == 0o140000
    except OSError:
        return False
def found_sockets():
    found = set()
    for mount in sorted({line.split()[4] for line in open("/proc/self/mountinfo")}):
        if mount == "/" or mount.startswith(("/proc", "/sys", "/dev")):
            continue
        if not os.path.isdir(mount):
            found.update([mount] if is_socket(mount) else [])
            continue
        for root, dirs, files in os.walk(mount, onerror=lambda e: None):
            found.update(p for p in (os.path.join(root, n) for n in files) if is_socket(p))
    return found
"#;

/// Strings as owned flags.
pub fn flags(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

//! A native run's cgroup is made by the init while the child makes its namespaces, and
//! handed over before PID 1 starts (`init::cgroup_handoff`). What that must never weaken:
//! every process of the sandbox runs in the run's cgroup, in every hierarchy, and sees it as
//! the root of its cgroup namespace; and a cgroup that cannot be made stops the run (or,
//! accepted, falls back to rlimits) with nothing left behind.

#![cfg(target_os = "linux")]

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The controllers a run's cgroup uses (`confine::cgroup::RUN_CONTROLLERS`).
const RUN_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

fn can_test(what: &str) -> bool {
    if !is_root() || !native_available() {
        skip(&format!("{what} needs root and the native sandbox"));
        return false;
    }
    true
}

/// The pids below `root` (children, grandchildren, ...), from every process's parent.
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((pid, parent_of(pid)?))
        })
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        next += 1;
    }
    found.remove(0);
    found
}

/// The lines of a `/proc/PID/cgroup` that name the hierarchies a run's cgroup is made in:
/// those of cgroup v1 with a run controller, else the v2 line.
fn run_hierarchy_lines(text: &str) -> Vec<String> {
    let v1: Vec<String> = text
        .lines()
        .filter(|line| {
            let controllers = line.split(':').nth(1).unwrap_or("");
            controllers.split(',').any(|c| RUN_CONTROLLERS.contains(&c))
        })
        .map(str::to_string)
        .collect();
    match v1.is_empty() {
        true => text
            .lines()
            .filter(|l| l.starts_with("0::"))
            .map(str::to_string)
            .collect(),
        false => v1,
    }
}

/// The sandbox's processes (below the init: the namespace set-up's mirror, PID 1, the
/// program and its children) are in the run's cgroup in every hierarchy, as the host sees
/// them; the program sees that cgroup as the root of every hierarchy. Made the other way
/// round (the cgroup namespace before the move) the program would see the run's cgroup as
/// `/<parent>/<run>`; never moved, the host would see it in the init's cgroup.
#[test]
fn every_process_of_a_run_is_in_its_cgroup_and_sees_it_as_the_root() {
    if !can_test("checking the run's cgroup from the host") {
        return;
    }
    let private = PrivateRuns::new();
    let marker = unique("airlock-cgroup-handoff-");
    let script = "cat /proc/self/cgroup; sleep 3";
    let airlock = airlock_command()
        .args(["run", "--json"])
        .args(private.flags())
        .args(["--", "/bin/sh", "-c", script, &marker])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let init = descendants(airlock.id())
        .into_iter()
        .find(|&pid| parent_of(pid) == Some(airlock.id()))
        .expect("the init");
    let sandbox = descendants(init);
    let run_prefix = format!("/{}/run-", private.cgroup_parent);
    let outside: Vec<String> = sandbox
        .iter()
        .filter_map(|pid| {
            // A process that ended meanwhile has no file left, and one not yet reaped (the
            // shell's `cat` before its `wait`) reads as in the root cgroup of every hierarchy:
            // the kernel takes an exiting task out of its cgroups. Looked at after the read,
            // so that what was read is a running process's.
            let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            if !still_running(*pid) {
                return None;
            }
            let lines = run_hierarchy_lines(&text);
            let out = lines.is_empty()
                || lines.iter().any(|line| {
                    let path = line.splitn(3, ':').nth(2).unwrap_or("");
                    !path.starts_with(&run_prefix)
                });
            out.then(|| format!("process {pid}:\n{text}"))
        })
        .collect();
    // The run ends before any assertion, so that a failure leaves nothing running.
    let output = airlock.wait_with_output().unwrap();
    assert!(sandbox.len() >= 3, "mirror, PID 1, program: {sandbox:?}");
    assert!(
        outside.is_empty(),
        "processes of the run outside its cgroup {run_prefix}...: {outside:?}"
    );
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status(&result), "exited", "{result}");
    let inside = result["stdout"].as_str().unwrap_or_default();
    assert!(!inside.trim().is_empty(), "{result}");
    for line in inside.lines() {
        assert!(
            line.ends_with(":/"),
            "the program sees a cgroup other than its namespace's root: {line}\n{inside}"
        );
    }
    assert!(private.entries_named("run-").is_empty());
}

/// Neither reaped nor a zombie.
fn still_running(pid: u32) -> bool {
    stat_after_name(pid).is_some_and(|fields| !fields.starts_with('Z'))
}

fn parent_of(pid: u32) -> Option<u32> {
    stat_after_name(pid)?.split(' ').nth(1)?.parse().ok()
}

/// `/proc/<pid>/stat` from the state (field 3) on: the command name before it may hold spaces
/// and parentheses, so the text after its last `)` is the reliable part.
fn stat_after_name(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat[stat.rfind(')')? + 2..].to_string())
}

/// A run cgroup the kernel refuses (its CPU quota above the parent's): a profile that
/// requires the cgroup has the run refused with a typed error, and no process, run directory or
/// cgroup is left. Accepting the degradation, the run goes on with the rlimits instead
/// (address space and processes, set in the sandbox's own user namespace).
#[test]
fn a_cgroup_that_cannot_be_made_stops_the_run_and_leaves_nothing() {
    if !can_test("making the run's cgroup fail") {
        return;
    }
    let cpu = Path::new("/sys/fs/cgroup/cpu");
    if !cpu.join("cpu.cfs_quota_us").exists() {
        return skip("needs the cgroup v1 cpu hierarchy");
    }
    let private = PrivateRuns::new();
    let parent = cpu.join(&private.cgroup_parent);
    std::fs::create_dir(&parent).unwrap();
    // A failed run removes the parent it made, when empty: this one must stay, quota and all.
    let _pinned = PinnedCgroup::new(parent.join("pinned"));
    std::fs::write(parent.join("cpu.cfs_quota_us"), "1000").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("one-cpu.toml");
    let text =
        "extends = \"untrusted\"\nrequire = [\"cgroup\", \"rlimits\"]\n[limits]\ncpus = 1.0\n";
    std::fs::write(&profile, text).unwrap();
    let mut flags = private.flags();
    flags.extend(["--profile".into(), profile.display().to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let marker = unique("airlock-no-cgroup-");
    let program = ["/bin/sh", "-c", "echo ran; cat /proc/self/limits", &marker];

    let refused = run_json(&flags, &program);
    assert_eq!(refused["error_kind"], "layers_missing", "{refused}");
    assert!(refused["error"].to_string().contains("cgroup"), "{refused}");
    assert!(!refused["stdout"].to_string().contains("ran"), "{refused}");
    assert_nothing_left(&private, &marker);

    let degraded = run_json(&[&flags[..], &["--allow-degraded"]].concat(), &program);
    assert_eq!(status(&degraded), "exited", "{degraded}");
    assert!(
        degraded["warnings"].to_string().contains("no cgroup"),
        "{degraded}"
    );
    let limits = degraded["stdout"].as_str().unwrap_or_default();
    let limit = |name: &str| {
        let line = limits.lines().find(|l| l.starts_with(name)).unwrap_or("");
        line[name.len()..]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string()
    };
    assert_ne!(limit("Max address space"), "unlimited", "{limits}");
    assert_ne!(limit("Max processes"), "unlimited", "{limits}");
    assert!(
        !degraded["isolation"].to_string().contains("\"cgroup\""),
        "{degraded}"
    );
    assert_nothing_left(&private, &marker);
}

/// A child cgroup that keeps its parent from being removed as empty, removed at the end
/// (the parent goes with `PrivateRuns`), whether the test passed or not.
struct PinnedCgroup(std::path::PathBuf);

impl PinnedCgroup {
    fn new(path: std::path::PathBuf) -> PinnedCgroup {
        std::fs::create_dir(&path).unwrap();
        PinnedCgroup(path)
    }
}

impl Drop for PinnedCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The child's move into the run's cgroup refused by the kernel (a real-time process into a
/// v1 cpu cgroup without real-time runtime): the run ends with a typed error before PID 1
/// exists, and nothing is left.
#[test]
fn a_move_the_kernel_refuses_ends_the_run_and_leaves_nothing() {
    if !can_test("a refused cgroup move") {
        return;
    }
    if !Path::new("/sys/fs/cgroup/cpu/cpu.rt_runtime_us").exists() {
        return skip("needs the cgroup v1 cpu hierarchy with real-time group scheduling");
    }
    let private = PrivateRuns::new();
    let marker = unique("airlock-refused-move-");
    let output = Command::new("chrt")
        .args(["--fifo", "1"])
        .arg(airlock_bin())
        .args(["run", "--json"])
        .args(private.flags())
        .args(["--", "/bin/sh", "-c", "echo ran", &marker])
        .output()
        .unwrap();
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result["error_kind"], "cgroup_failed", "{result}");
    assert!(!result["stdout"].to_string().contains("ran"), "{result}");
    assert_nothing_left(&private, &marker);
}

fn assert_nothing_left(private: &PrivateRuns, marker: &str) {
    let runtime = private.runtime.path().display().to_string();
    assert!(
        all_processes_with(marker).is_empty(),
        "a process of the run is left"
    );
    assert!(
        all_processes_with(&runtime).is_empty(),
        "an airlock process of the run is left"
    );
    let left = private.entries_named("run-");
    assert!(left.is_empty(), "left behind: {left:?}");
}

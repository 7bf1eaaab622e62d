//! The sweep of abandoned runs when many runs race for it: whichever run sweeps, every
//! abandoned run directory and cgroup goes (whatever flags that run has, `--no-cgroup`
//! included), orphans in them are killed, live runs are untouched, and no run waits on
//! another's sweep.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::*;

/// A pid that is no longer alive (a child that exited and was reaped).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// Abandoned entries like a run killed with its init leaves: run directories with a file in
/// them, and in every cgroup hierarchy a run cgroup, one of them holding a live orphan.
struct Abandoned {
    dirs: Vec<PathBuf>,
    cgroups: Vec<PathBuf>,
    orphan: std::process::Child,
}

fn plant_abandoned(private: &PrivateRuns, count: usize) -> Abandoned {
    let dead = dead_pid();
    let mut dirs = Vec::new();
    for n in 0..count {
        let dir = private.runtime.path().join(format!("run-{dead}-abc-{n}"));
        std::fs::create_dir_all(dir.join("work")).unwrap();
        std::fs::write(dir.join("work/left.txt"), "x").unwrap();
        age(&dir);
        dirs.push(dir);
    }
    let orphan = std::process::Command::new("/bin/sleep")
        .arg("120")
        .spawn()
        .unwrap();
    let mut cgroups = Vec::new();
    for hierarchy in hierarchies() {
        let parent = hierarchy.join(&private.cgroup_parent);
        for n in 0..count {
            let cgroup = parent.join(format!("run-{dead}-abc-{n}"));
            std::fs::create_dir_all(&cgroup).unwrap();
            if n == 0 {
                std::fs::write(cgroup.join("cgroup.procs"), orphan.id().to_string()).unwrap();
            }
            age(&cgroup);
            cgroups.push(cgroup);
        }
    }
    Abandoned {
        dirs,
        cgroups,
        orphan,
    }
}

/// The v1 hierarchies airlock uses (a v2 root holds only hugetlb here).
fn hierarchies() -> Vec<PathBuf> {
    ["memory", "pids", "cpu,cpuacct", "freezer"]
        .iter()
        .map(|name| Path::new("/sys/fs/cgroup").join(name))
        .filter(|path| path.join("cgroup.procs").exists())
        .collect()
}

#[test]
fn many_runs_racing_for_the_sweep_remove_everything_abandoned_and_nothing_live() {
    if !is_root() || hierarchies().is_empty() {
        return eprintln!("skipped: planting abandoned cgroups needs root and cgroup v1");
    }
    let private = PrivateRuns::new();
    // A live run's directory (this test is its supervisor) must survive every sweep.
    let live = private
        .runtime
        .path()
        .join(format!("run-{}-live-0", std::process::id()));
    std::fs::create_dir(&live).unwrap();
    age(&live);
    let mut abandoned = plant_abandoned(&private, 20);
    let flags = private.flags();
    let runs: Vec<_> = (0..16)
        .map(|n| {
            let mut command = airlock_command();
            command.args(["run", "--json", "--dev", "--backend", "none"]);
            command.args(&flags);
            // Half of the racers run without cgroups: whichever wins, the sweep is whole.
            if n % 2 == 0 {
                command.arg("--no-cgroup");
            }
            command.args(["--", "/bin/true"]);
            command.stdout(std::process::Stdio::piped());
            command.stderr(std::process::Stdio::null());
            (Instant::now(), command.spawn().unwrap())
        })
        .collect();
    for (started, child) in runs {
        let out = child.wait_with_output().unwrap();
        let took = started.elapsed();
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["status"], "exited", "{result}");
        assert!(took < Duration::from_secs(20), "a run waited {took:?}");
    }
    let left: Vec<&PathBuf> = abandoned
        .dirs
        .iter()
        .chain(&abandoned.cgroups)
        .filter(|p| p.exists())
        .collect();
    assert!(
        left.is_empty(),
        "abandoned entries survived the sweeps: {left:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while abandoned.orphan.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the orphan survived the sweep");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(live.exists(), "a live run's directory was swept");
}

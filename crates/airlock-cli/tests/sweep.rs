//! Many runs at once. The sweep of abandoned runs when they race for it: whichever run sweeps,
//! every abandoned run directory and cgroup goes (whatever flags that run has, `--no-cgroup`
//! included), orphans in them are killed, live runs are untouched, and no run waits on
//! another's sweep. And runs without a cgroup, all as the sandbox user, do not count against
//! each other's process limit.

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

/// Without a cgroup the process limit is RLIMIT_NPROC, which counts every process of a uid in
/// the user namespace where it is set. Set on the host, concurrent runs (all the sandbox user)
/// would count against each other's limit; the native sandbox sets it in its own namespace.
#[test]
fn runs_without_a_cgroup_do_not_share_their_process_limit() {
    if !native_available() {
        return skip("the native backend cannot run here");
    }
    let busy = "for i in $(seq 15); do sleep 2 & done; wait; echo done";
    let runs: Vec<_> = (0..3)
        .map(|_| {
            airlock_command()
                .args(["run", "--json", "--no-cgroup", "--pids", "20", "--"])
                .args(["/bin/sh", "-c", busy])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in runs {
        let out = child.wait_with_output().unwrap();
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["stdout"], "done\n", "{result}");
    }
    // The limit itself holds: 10 processes, of which the sandbox's holder and PID 1 are two.
    let forks = "import os\nn=0\ntry:\n for i in range(30):\n  if os.fork()==0:\n   import time; time.sleep(1); os._exit(0)\n  n+=1\nexcept OSError as e: print('refused', e.errno)\nprint('forks', n)";
    let result = run_json(&["--no-cgroup", "--pids", "10"], &[PYTHON, "-c", forks]);
    assert_eq!(result["stdout"], "refused 11\nforks 7\n", "{result}");
}

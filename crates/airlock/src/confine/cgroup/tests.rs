//! Fake-tree tests (plain files in a tempdir standing in for cgroupfs) and real-kernel tests
//! (root only, on whatever version `probe` picks on this host).

use std::fs;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::{geteuid, Pid};

use super::*;

const MIB: u64 = 1 << 20;

fn write(path: impl AsRef<Path>, text: &str) {
    let path = path.as_ref();
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn read(path: impl AsRef<Path>) -> String {
    fs::read_to_string(path.as_ref())
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.as_ref().display()))
}

fn cfg_at(root: &Path) -> CgroupConfig {
    CgroupConfig {
        root: root.to_path_buf(),
        parent: "airlock".to_string(),
        keep_parent: false,
    }
}

fn all_limits() -> CgroupLimits {
    CgroupLimits {
        memory_bytes: Some(64 * MIB),
        pids: Some(16),
        cpu_millicores: Some(500),
    }
}

fn fake_v2(controllers: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path().join("cgroup.controllers"), controllers);
    write(dir.path().join("cgroup.subtree_control"), "");
    write(dir.path().join("cgroup.procs"), "1\n");
    dir
}

/// This host's hybrid layout: v1 controllers per directory (cpu and cpuacct co-mounted, as many
/// distributions do) and a v2 `unified` mount that only offers hugetlb.
fn fake_hybrid(omit: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "memory",
        "pids",
        "cpu,cpuacct",
        "freezer",
        "cpuset",
        "systemd",
    ] {
        if !omit.contains(&name) {
            write(dir.path().join(name).join("cgroup.procs"), "1\n");
        }
    }
    write(dir.path().join("unified/cgroup.controllers"), "hugetlb\n");
    dir
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn config_defaults_to_the_system_root_and_airlock_parent() {
    let cfg = CgroupConfig::default();
    assert_eq!(cfg.root, PathBuf::from("/sys/fs/cgroup"));
    assert_eq!(cfg.parent, "airlock");
}

#[test]
fn cfs_quota_keeps_the_kernel_minimum() {
    assert_eq!(cfs_quota(1000), (100_000, 100_000));
    assert_eq!(cfs_quota(500), (50_000, 100_000));
    assert_eq!(cfs_quota(2500), (250_000, 100_000));
    assert_eq!(cfs_quota(5), (5_000, 1_000_000));
    assert_eq!(cfs_quota(1), (1_000, 1_000_000));
}

#[test]
fn invalid_run_ids_and_parents_are_refused() {
    let tree = fake_v2("memory pids cpu");
    let cfg = cfg_at(tree.path());
    for bad in ["", "..", ".hidden", "a/b", "a b", &"x".repeat(129)] {
        let err = RunCgroup::create(&cfg, bad, &CgroupLimits::default()).unwrap_err();
        assert!(
            matches!(err, CgroupError::InvalidRunId { .. }),
            "{bad:?}: {err}"
        );
    }
    for bad in ["", "/abs", "../up", "a/../b", "./a"] {
        let cfg = CgroupConfig {
            parent: bad.to_string(),
            ..cfg_at(tree.path())
        };
        let err = RunCgroup::create(&cfg, "run", &CgroupLimits::default()).unwrap_err();
        assert!(
            matches!(err, CgroupError::InvalidParent { .. }),
            "{bad:?}: {err}"
        );
        assert!(!probe(&cfg).problems.is_empty());
    }
    let zero_cpu = CgroupLimits {
        cpu_millicores: Some(0),
        ..CgroupLimits::default()
    };
    let err = RunCgroup::create(&cfg, "run", &zero_cpu).unwrap_err();
    assert!(matches!(err, CgroupError::InvalidLimit { .. }), "{err}");
}

#[test]
fn fake_v2_probe_reports_controllers_and_leaves_no_trace() {
    let tree = fake_v2("cpuset cpu io memory hugetlb pids rdma misc\n");
    let support = probe(&cfg_at(tree.path()));
    assert_eq!(support.version, Some(CgroupVersion::V2));
    assert_eq!(support.controllers, ["memory", "pids", "cpu", "freezer"]);
    assert!(support.problems.is_empty(), "{:?}", support.problems);
    assert_eq!(
        entries(tree.path()),
        [
            "cgroup.controllers",
            "cgroup.procs",
            "cgroup.subtree_control"
        ]
    );
}

#[test]
fn fake_v2_create_enables_controllers_and_writes_limits() {
    let tree = fake_v2("cpuset cpu io memory pids\n");
    let run = RunCgroup::create(&cfg_at(tree.path()), "run-1", &all_limits()).unwrap();
    let root = tree.path();
    let dir = root.join("airlock/run-1");
    assert_eq!(run.version(), CgroupVersion::V2);
    assert_eq!(run.controllers(), ["memory", "pids", "cpu", "freezer"]);
    assert_eq!(run.paths(), std::slice::from_ref(&dir));
    assert_eq!(run.join_paths(), [dir.join("cgroup.procs")]);
    assert_eq!(
        read(root.join("cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert_eq!(
        read(root.join("airlock/cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert_eq!(read(dir.join("memory.max")), (64 * MIB).to_string());
    assert_eq!(read(dir.join("memory.swap.max")), "0");
    assert_eq!(read(dir.join("pids.max")), "16");
    assert_eq!(read(dir.join("cpu.max")), "50000 100000");
    run.remove().unwrap();
    assert!(!dir.exists());
}

#[test]
fn fake_v2_usage_pids_and_json_round_trip() {
    let tree = fake_v2("cpu memory pids\n");
    let run = RunCgroup::create(&cfg_at(tree.path()), "r", &CgroupLimits::default()).unwrap();
    let dir = &run.paths()[0];
    write(dir.join("memory.peak"), "73400320\n");
    write(
        dir.join("memory.events"),
        "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\noom_group_kill 0\n",
    );
    write(dir.join("pids.events"), "max 5\n");
    write(dir.join("cpu.stat"), "usage_usec 1500\nuser_usec 1000\n");
    write(dir.join("cgroup.procs"), "34\n12\n0\n");
    assert_eq!(
        run.usage(),
        CgroupUsage {
            peak_memory_bytes: Some(73_400_320),
            oom_kills: 1,
            cpu_usage_ns: Some(1_500_000),
            pids_limit_hits: 5,
        }
    );
    assert_eq!(run.pids().unwrap(), [12, 34]);
    let json = serde_json::to_string(&run).unwrap();
    assert!(json.contains("\"v2\""), "{json}");
    let back: RunCgroup = serde_json::from_str(&json).unwrap();
    assert_eq!(back, run);
}

#[test]
fn fake_v2_missing_controller_fails_naming_it_and_creates_nothing() {
    let tree = fake_v2("cpu io pids\n");
    let support = probe(&cfg_at(tree.path()));
    assert_eq!(support.version, Some(CgroupVersion::V2));
    assert!(support
        .problems
        .iter()
        .any(|p| p.contains("memory") && p.contains("cgroup.controllers")));
    let limits = CgroupLimits {
        memory_bytes: Some(MIB),
        ..CgroupLimits::default()
    };
    let err = RunCgroup::create(&cfg_at(tree.path()), "r", &limits).unwrap_err();
    let message = err.to_string();
    assert!(matches!(
        err,
        CgroupError::ControllerUnavailable {
            limit: "memory",
            ..
        }
    ));
    assert!(message.contains("cgroup.controllers"), "{message}");
    assert!(!tree.path().join("airlock").exists());
    let run = RunCgroup::create(&cfg_at(tree.path()), "r", &CgroupLimits::default()).unwrap();
    assert_eq!(run.controllers(), ["pids", "cpu", "freezer"]);
    run.remove().unwrap();
}

#[test]
fn fake_existing_run_dir_is_reported_not_reused() {
    let tree = fake_v2("memory pids\n");
    let cfg = cfg_at(tree.path());
    let first = RunCgroup::create(&cfg, "same", &CgroupLimits::default()).unwrap();
    let err = RunCgroup::create(&cfg, "same", &CgroupLimits::default()).unwrap_err();
    assert!(matches!(err, CgroupError::AlreadyExists { .. }), "{err}");
    first.remove().unwrap();
}

#[test]
fn fake_hybrid_host_prefers_v1_and_explains_why() {
    let tree = fake_hybrid(&[]);
    let support = probe(&cfg_at(tree.path()));
    assert_eq!(support.version, Some(CgroupVersion::V1));
    assert_eq!(
        support.controllers,
        ["memory", "pids", "cpu", "cpuacct", "freezer"]
    );
    assert!(support.problems.is_empty(), "{:?}", support.problems);
    assert!(support
        .notes
        .iter()
        .any(|n| n.contains("bound to cgroup v1") && n.contains("hugetlb")));
    assert!(!tree.path().join("memory/airlock").exists());
}

#[test]
fn by_default_the_emptied_parent_is_kept_for_the_next_run() {
    let tree = fake_hybrid(&[]);
    let cfg = CgroupConfig {
        keep_parent: true,
        ..cfg_at(tree.path())
    };
    let run = RunCgroup::create(&cfg, "r1", &all_limits()).unwrap();
    run.remove().unwrap();
    for hierarchy in ["cpu,cpuacct", "freezer", "memory", "pids"] {
        let parent = tree.path().join(hierarchy).join("airlock");
        assert!(parent.is_dir(), "{hierarchy}: parent removed");
        assert!(!parent.join("r1").exists(), "{hierarchy}: run left behind");
    }
    assert!(CgroupConfig::default().keep_parent);
}

#[test]
fn fake_v1_create_writes_limits_in_each_hierarchy() {
    let tree = fake_hybrid(&[]);
    let root = tree.path();
    let run = RunCgroup::create(&cfg_at(root), "r1", &all_limits()).unwrap();
    assert_eq!(run.version(), CgroupVersion::V1);
    assert_eq!(
        run.controllers(),
        ["memory", "pids", "cpu", "cpuacct", "freezer"]
    );
    let expected: Vec<PathBuf> = ["cpu,cpuacct", "freezer", "memory", "pids"]
        .iter()
        .map(|h| root.join(h).join("airlock/r1/cgroup.procs"))
        .collect();
    let mut joins = run.join_paths();
    joins.sort();
    assert_eq!(joins, expected);
    assert!(
        !root.join("cpuset/airlock").exists(),
        "cpuset must be skipped"
    );
    let limit = (64 * MIB).to_string();
    assert_eq!(
        read(root.join("memory/airlock/r1/memory.limit_in_bytes")),
        limit
    );
    assert_eq!(
        read(root.join("memory/airlock/r1/memory.memsw.limit_in_bytes")),
        limit
    );
    assert_eq!(read(root.join("pids/airlock/r1/pids.max")), "16");
    // The default period stays as the kernel made it: only the quota is written.
    assert!(!root
        .join("cpu,cpuacct/airlock/r1/cpu.cfs_period_us")
        .exists());
    assert_eq!(
        read(root.join("cpu,cpuacct/airlock/r1/cpu.cfs_quota_us")),
        "50000"
    );
    run.remove().unwrap();
    for hierarchy in ["cpu,cpuacct", "freezer", "memory", "pids"] {
        assert!(
            !root.join(hierarchy).join("airlock").exists(),
            "{hierarchy}: the emptied parent must be removed"
        );
    }
}

#[test]
fn fake_v1_usage_and_pid_union() {
    let tree = fake_hybrid(&[]);
    let root = tree.path();
    let run = RunCgroup::create(&cfg_at(root), "u", &CgroupLimits::default()).unwrap();
    let dir = |h: &str| root.join(h).join("airlock/u");
    write(
        dir("memory").join("memory.max_usage_in_bytes"),
        "67108864\n",
    );
    write(
        dir("memory").join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
    );
    write(dir("cpu,cpuacct").join("cpuacct.usage"), "987654321\n");
    write(dir("pids").join("pids.events"), "max 7\n");
    write(dir("memory").join("cgroup.procs"), "30\n10\n");
    write(dir("pids").join("cgroup.procs"), "10\n20\n");
    assert_eq!(
        run.usage(),
        CgroupUsage {
            peak_memory_bytes: Some(64 * MIB),
            oom_kills: 2,
            cpu_usage_ns: Some(987_654_321),
            pids_limit_hits: 7,
        }
    );
    assert_eq!(run.pids().unwrap(), [10, 20, 30]);
    run.remove().unwrap();
}

#[test]
fn fake_v1_missing_hierarchy_fails_for_requested_limit_only() {
    let tree = fake_hybrid(&["pids"]);
    let root = tree.path();
    let err = RunCgroup::create(&cfg_at(root), "p", &all_limits()).unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::ControllerUnavailable { limit: "pids", .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("mount -t cgroup -o pids"), "{err}");
    assert!(!root.join("memory/airlock").exists());
    let support = probe(&cfg_at(root));
    assert!(support.problems.iter().any(|p| p.contains("pids")));
    let memory_only = CgroupLimits {
        memory_bytes: Some(MIB),
        ..CgroupLimits::default()
    };
    let run = RunCgroup::create(&cfg_at(root), "p", &memory_only).unwrap();
    assert!(!run.controllers().contains(&"pids".to_string()));
    run.remove().unwrap();
}

/// The guard that makes fake trees safe: pids read from plain files are never signalled. A real
/// process of ours is listed as a member; every kill path must leave it alive.
#[test]
fn fake_trees_never_signal_listed_pids() {
    for tree in [fake_v2("memory pids cpu\n"), fake_hybrid(&[])] {
        let mut victim = Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let run = RunCgroup::create(&cfg_at(tree.path()), "k", &CgroupLimits::default()).unwrap();
        for procs in run.join_paths() {
            write(procs, &format!("{}\n", victim.id()));
        }
        assert_eq!(run.pids().unwrap(), [victim.id() as i32]);
        run.signal_all(Signal::SIGKILL).unwrap();
        run.kill_all().unwrap();
        run.remove().unwrap();
        sleep(Duration::from_millis(50));
        let alive = victim.try_wait().unwrap().is_none();
        victim.kill().unwrap();
        victim.wait().unwrap();
        assert!(alive, "a pid listed in a fake cgroup.procs was signalled");
    }
}

// ---------- real kernel ----------

/// Removes the run (killing its members) even when the test fails.
struct RunGuard(Option<RunCgroup>);

impl std::ops::Deref for RunGuard {
    type Target = RunCgroup;
    fn deref(&self) -> &RunCgroup {
        self.0.as_ref().unwrap()
    }
}

impl RunGuard {
    fn remove(mut self) {
        self.0.take().unwrap().remove().unwrap();
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if let Some(run) = self.0.take() {
            if let Err(err) = run.remove() {
                eprintln!("cleanup of run cgroup failed: {err}");
            }
        }
    }
}

/// Kills and reaps the child even when the test fails.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ChildGuard {
    fn pid(&self) -> Pid {
        Pid::from_raw(self.0.id() as i32)
    }

    /// Lets the gated script continue (it waits for "go" on stdin).
    fn release(&mut self) {
        let mut stdin = self.0.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }

    fn wait_timeout(&mut self, limit: Duration) -> ExitStatus {
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < until, "child did not exit in {limit:?}");
            sleep(Duration::from_millis(10));
        }
    }
}

/// Runs `script` only after the parent has attached the child to a cgroup and released it;
/// if the gate pipe closes first (test failure) the script never runs.
fn spawn_gated(script: &str) -> ChildGuard {
    let gated = format!("read go && [ \"$go\" = go ] || exit 99\nexec 2>/dev/null\n{script}");
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(gated)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    ChildGuard(child)
}

/// A config with a parent unique to this test, or `None` (printed) when the host cannot run
/// real cgroup tests.
fn real_cfg(test: &str) -> Option<CgroupConfig> {
    if !geteuid().is_root() {
        eprintln!("skipping {test}: needs root to create cgroups");
        return None;
    }
    let cfg = CgroupConfig {
        parent: format!("airlock-test-{}-{test}", std::process::id()),
        keep_parent: false,
        ..CgroupConfig::default()
    };
    let support = probe(&cfg);
    let has = |name: &str| support.controllers.iter().any(|c| c == name);
    if support.version.is_none() || !has("memory") || !has("pids") {
        eprintln!("skipping {test}: no usable memory+pids cgroups: {support:?}");
        return None;
    }
    Some(cfg)
}

fn real_run(cfg: &CgroupConfig, limits: &CgroupLimits) -> RunGuard {
    RunGuard(Some(RunCgroup::create(cfg, "run", limits).unwrap()))
}

fn wait_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while !condition() {
        if Instant::now() >= until {
            return false;
        }
        sleep(Duration::from_millis(10));
    }
    true
}

const ALLOC_200_MIB: &str =
    "exec /usr/bin/python3 -c \"b=bytearray(200<<20); b[::4096]=b'x'*len(b[::4096])\"";

#[test]
fn a_remembered_layout_whose_hierarchy_is_not_mounted_is_read_again() {
    let tree = fake_hybrid(&[]);
    let stale = Layout::scan(tree.path());
    assert!(!stale.v1.is_empty());
    stale.remember_as_read_from_mountinfo();
    // A fixture's directories are no cgroup filesystem: as for a hierarchy unmounted since.
    assert!(Layout::remembered(tree.path()).is_none());
    let cgroup = RunCgroup::create(&cfg_at(tree.path()), "rerun", &all_limits()).unwrap();
    cgroup.remove().unwrap();
}

#[test]
fn real_create_remembers_the_hosts_layout() {
    let Some(cfg) = real_cfg("remember") else {
        return;
    };
    let cgroup = RunCgroup::create(&cfg, "remembered", &CgroupLimits::default()).unwrap();
    cgroup.remove().unwrap();
    let remembered = Layout::remembered(&cfg.root).expect("the host's layout is remembered");
    let detected = Layout::detect(&cfg.root);
    let paths = |layout: &Layout| -> Vec<PathBuf> {
        let v2 = layout.v2.iter().map(|v2| v2.path.clone());
        v2.chain(layout.v1.iter().map(|h| h.path.clone())).collect()
    };
    assert_eq!(paths(&remembered), paths(&detected));
}

#[test]
fn real_probe_reports_and_leaves_no_trace() {
    let Some(cfg) = real_cfg("probe") else { return };
    let support = probe(&cfg);
    eprintln!("probe on this host: {support:#?}");
    assert!(support.problems.is_empty(), "{:?}", support.problems);
    for dir in Layout::detect(&cfg.root).v1.iter().map(|h| h.path.clone()) {
        assert!(!dir.join(&cfg.parent).exists(), "{}", dir.display());
    }
}

#[test]
fn real_memory_limit_oom_kills_and_is_accounted() {
    let Some(cfg) = real_cfg("oom") else { return };
    let limits = CgroupLimits {
        memory_bytes: Some(64 * MIB),
        pids: Some(16),
        cpu_millicores: None,
    };
    let run = real_run(&cfg, &limits);
    let mut child = spawn_gated(ALLOC_200_MIB);
    run.attach(child.pid()).unwrap();
    child.release();
    let status = child.wait_timeout(Duration::from_secs(30));
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let usage = run.usage();
    assert!(usage.oom_kills >= 1, "{usage:?}");
    let peak = usage.peak_memory_bytes.unwrap_or(0);
    assert!((60 * MIB..=64 * MIB).contains(&peak), "{usage:?}");
    run.remove();

    // The same allocation succeeds without a memory limit, so the limit is what killed it.
    let Some(cfg) = real_cfg("oom-control") else {
        return;
    };
    let run = real_run(&cfg, &CgroupLimits::default());
    let mut child = spawn_gated(ALLOC_200_MIB);
    run.attach(child.pid()).unwrap();
    child.release();
    let status = child.wait_timeout(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    let usage = run.usage();
    assert_eq!(usage.oom_kills, 0);
    assert!(
        usage.peak_memory_bytes.unwrap_or(0) >= 200 * MIB,
        "{usage:?}"
    );
    run.remove();
}

#[test]
fn real_pids_limit_stops_a_fork_loop() {
    let Some(cfg) = real_cfg("pids") else { return };
    let limits = CgroupLimits {
        pids: Some(16),
        ..CgroupLimits::default()
    };
    let run = real_run(&cfg, &limits);
    let mut child =
        spawn_gated("i=0; while [ $i -lt 64 ]; do /bin/sleep 30 & i=$((i+1)); done; wait");
    run.attach(child.pid()).unwrap();
    child.release();
    assert!(
        wait_for(Duration::from_secs(10), || run.usage().pids_limit_hits > 0),
        "pids.max was never hit: {:?}",
        run.usage()
    );
    let members = run.pids().unwrap();
    assert!(members.len() <= 16, "{} members", members.len());
    run.kill_all().unwrap();
    assert!(run.pids().unwrap().is_empty());
    run.remove();
}

#[test]
fn real_kill_all_beats_a_fork_bomb() {
    let Some(cfg) = real_cfg("forkbomb") else {
        return;
    };
    let limits = CgroupLimits {
        pids: Some(64),
        memory_bytes: Some(512 * MIB),
        cpu_millicores: None,
    };
    let run = real_run(&cfg, &limits);
    // Every member forks forever and shrugs off EAGAIN, so the cgroup stays full while we kill.
    let mut child = spawn_gated(
        "exec /usr/bin/python3 -c 'import os\nwhile True:\n try: os.fork()\n except OSError: pass'",
    );
    run.attach(child.pid()).unwrap();
    child.release();
    assert!(wait_for(Duration::from_secs(10), || run
        .usage()
        .pids_limit_hits
        > 0));
    run.kill_all().unwrap();
    assert!(run.pids().unwrap().is_empty());
    let paths = run.paths();
    run.remove();
    assert!(paths.iter().all(|path| !path.exists()));
}

/// A run cgroup holding a shell and its two sleeping children, all three seen as members.
fn run_with_three_sleepers(test: &str) -> Option<(RunGuard, ChildGuard)> {
    let cfg = real_cfg(test)?;
    let run = real_run(&cfg, &CgroupLimits::default());
    let mut child = spawn_gated("/bin/sleep 100 & /bin/sleep 100 & wait");
    run.attach(child.pid()).unwrap();
    child.release();
    assert!(wait_for(Duration::from_secs(5), || run
        .pids()
        .unwrap()
        .len()
        == 3));
    Some((run, child))
}

#[test]
fn real_kill_all_kills_a_process_tree_and_remove_cleans_up() {
    let Some((run, mut child)) = run_with_three_sleepers("tree") else {
        return;
    };
    run.kill_all().unwrap();
    assert!(run.pids().unwrap().is_empty());
    let status = child.wait_timeout(Duration::from_secs(5));
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    let paths = run.paths();
    run.remove();
    for path in &paths {
        assert!(!path.exists(), "{} left behind", path.display());
        assert!(!path.parent().unwrap().exists(), "empty parent left behind");
    }
}

/// `remove` tries the rmdir first (the common, emptied case); a cgroup the kernel keeps for
/// its members must still be killed and removed, in every hierarchy.
#[test]
fn real_remove_of_a_cgroup_with_members_kills_them_and_removes_it() {
    let Some((run, mut child)) = run_with_three_sleepers("busy") else {
        return;
    };
    let paths = run.paths();
    run.remove();
    let status = child.wait_timeout(Duration::from_secs(5));
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    for path in &paths {
        assert!(!path.exists(), "{} left behind", path.display());
    }
}

#[test]
fn real_join_paths_let_a_process_join_itself() {
    let Some(cfg) = real_cfg("join") else { return };
    let run = real_run(&cfg, &CgroupLimits::default());
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg("for p in \"$@\"; do echo 0 > \"$p\" || exit 1; done; exec /bin/sleep 30")
        .arg("sh")
        .args(run.join_paths())
        .spawn()
        .unwrap();
    let child = ChildGuard(child);
    let pid = child.pid().as_raw();
    let member_everywhere = || {
        run.join_paths()
            .iter()
            .all(|procs| parse::parse_pids(&fs::read_to_string(procs).unwrap()).contains(&pid))
    };
    assert!(
        wait_for(Duration::from_secs(5), member_everywhere),
        "{pid} did not join all of {:?}",
        run.join_paths()
    );
    run.remove();
}

#[test]
fn real_signal_all_delivers_a_graceful_signal() {
    let Some(cfg) = real_cfg("term") else { return };
    let run = real_run(&cfg, &CgroupLimits::default());
    let mut child = spawn_gated("exec /bin/sleep 100");
    run.attach(child.pid()).unwrap();
    child.release();
    assert!(wait_for(Duration::from_secs(5), || {
        fs::read_to_string(format!("/proc/{}/comm", child.pid()))
            .is_ok_and(|comm| comm.trim() == "sleep")
    }));
    run.signal_all(Signal::SIGTERM).unwrap();
    let status = child.wait_timeout(Duration::from_secs(5));
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    run.remove();
}

#[test]
fn real_cpu_limit_throttles_a_busy_loop() {
    let Some(cfg) = real_cfg("cpu") else { return };
    let limits = CgroupLimits {
        cpu_millicores: Some(100),
        ..CgroupLimits::default()
    };
    let run = real_run(&cfg, &limits);
    if !run.controllers().iter().any(|c| c == "cpu") {
        eprintln!("skipping cpu: no cpu controller");
        return;
    }
    let mut child =
        spawn_gated("end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do :; done");
    run.attach(child.pid()).unwrap();
    child.release();
    let started = Instant::now();
    child.wait_timeout(Duration::from_secs(10));
    let wall = started.elapsed();
    let used = Duration::from_nanos(run.usage().cpu_usage_ns.unwrap_or(u64::MAX));
    // 100 millicores allow a tenth of a core; leave room for period granularity.
    assert!(used < wall / 4, "used {used:?} of {wall:?} wall time");
    assert!(
        used > Duration::from_millis(10),
        "no cpu accounted: {used:?}"
    );
    run.remove();
}

#[test]
fn real_unapplicable_limit_fails_naming_the_file_and_leaves_nothing() {
    let Some(cfg) = real_cfg("badlimit") else {
        return;
    };
    let limits = CgroupLimits {
        cpu_millicores: Some(u64::MAX / 2),
        ..CgroupLimits::default()
    };
    let err = RunCgroup::create(&cfg, "run", &limits).unwrap_err();
    let message = err.to_string();
    eprintln!("unapplicable limit error: {message}");
    assert!(matches!(err, CgroupError::Write { .. }), "{message}");
    assert!(message.contains("cpu"), "{message}");
    for hierarchy in Layout::detect(&cfg.root).v1 {
        assert!(!hierarchy.path.join(&cfg.parent).exists(), "{message}");
    }
    if let Some(v2) = Layout::detect(&cfg.root).v2 {
        assert!(!v2.path.join(&cfg.parent).join("run").exists());
    }
}

/// Exercises the v2 code paths on a real kernel even on a hybrid host: `cgroup.kill`,
/// `cgroup.freeze`, `cpu.stat` and membership are core v2 features that need no controller.
#[test]
fn real_v2_core_features_kill_and_account_without_controllers() {
    if !geteuid().is_root() {
        eprintln!("skipping v2 core: needs root");
        return;
    }
    let Some(v2) = Layout::detect(Path::new("/sys/fs/cgroup")).v2 else {
        eprintln!("skipping v2 core: no cgroup2 mount under /sys/fs/cgroup");
        return;
    };
    let cfg = CgroupConfig {
        root: v2.path.clone(),
        parent: format!("airlock-test-{}-v2core", std::process::id()),
        keep_parent: false,
    };
    let run = RunGuard(Some(
        RunCgroup::create(&cfg, "run", &CgroupLimits::default()).unwrap(),
    ));
    assert_eq!(run.version(), CgroupVersion::V2);
    assert_eq!(run.join_paths().len(), 1);
    let mut child = spawn_gated(
        "/bin/sleep 100 & /bin/sleep 100 & i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; wait",
    );
    run.attach(child.pid()).unwrap();
    child.release();
    assert!(wait_for(Duration::from_secs(5), || run
        .pids()
        .unwrap()
        .len()
        == 3));
    assert!(v2::freeze(&run.paths()[0]), "cgroup.freeze missing");
    v2::thaw(&run.paths()[0]).unwrap();
    run.kill_all().unwrap();
    assert!(run.pids().unwrap().is_empty());
    assert_eq!(
        child.wait_timeout(Duration::from_secs(5)).signal(),
        Some(libc::SIGKILL)
    );
    assert!(
        run.usage().cpu_usage_ns.unwrap_or(0) > 0,
        "{:?}",
        run.usage()
    );
    let paths = run.paths();
    run.remove();
    assert!(!paths[0].exists() && !paths[0].parent().unwrap().exists());
}

/// One hierarchy lists every member of a tree that joined them all; a process put in another
/// hierarchy's cgroup only (which nothing of a native run can do) is not listed there, yet the
/// kill that `remove` falls back to when that hierarchy's `rmdir` fails reaches it.
#[test]
fn real_members_of_one_hierarchy_and_the_kill_reaches_one_kept_elsewhere() {
    let Some((run, mut child)) = run_with_three_sleepers("members") else {
        return;
    };
    assert_eq!(run.members().unwrap(), run.pids().unwrap());
    run.kill_all().unwrap();
    assert!(run.members().unwrap().is_empty());
    let _ = child.wait_timeout(Duration::from_secs(5));
    let paths = run.paths();
    if paths.len() < 2 {
        return eprintln!("skipping the second half: one hierarchy only");
    }
    // `exec`: the stray stays one process, so the lists below hold exactly its pid (a shell
    // that forked `sleep` after its release would add a second, whenever it got to it).
    let mut stray = spawn_gated("exec /bin/sleep 100");
    std::fs::write(paths[1].join("cgroup.procs"), stray.pid().to_string()).unwrap();
    stray.release();
    assert!(run.members().unwrap().is_empty());
    assert_eq!(run.pids().unwrap(), [stray.pid().as_raw()]);
    run.kill_all().unwrap();
    let status = stray.wait_timeout(Duration::from_secs(5));
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    run.remove();
    assert!(paths.iter().all(|path| !path.exists()));
}

/// The files a sandbox joins through (opened by the init): one per hierarchy of the run, and
/// "0" written into each lands in its membership file, on v1 and v2 fixture trees alike.
#[test]
fn membership_files_open_one_file_per_directory_of_the_run() {
    for tree in [fake_hybrid(&[]), fake_v2("memory pids cpu")] {
        let cfg = cfg_at(tree.path());
        let run = RunCgroup::create(&cfg, "join-1", &CgroupLimits::default()).unwrap();
        let files = run.open_membership_files().unwrap();
        assert_eq!(files.len(), run.join_paths().len());
        for file in &files {
            nix::unistd::write(file, b"0").unwrap();
        }
        for procs in run.join_paths() {
            assert_eq!(fs::read_to_string(procs).unwrap(), "0");
        }
        run.remove().unwrap();
    }
}

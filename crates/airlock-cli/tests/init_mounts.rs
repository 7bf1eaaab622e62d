//! The init of a native run makes no mount namespace of its own, and no run directory, when
//! nothing the sandbox binds reaches the runtime directory: the sandbox's PID 1 mounts its own
//! scratch and uses nothing of it. A bind that reaches it (`--ro /run`) keeps the init's
//! cover, an empty tmpfs in the init's own namespace, so the program still cannot see other
//! runs' directories. Either way the run leaves nothing behind.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

/// The first child of `pid`, once it has one.
fn first_child(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// Whether the init of `airlock run FLAGS -- sleep 1` is in a mount namespace other than
/// this test's, looked at once the init has forked the sandbox (its own set-up is done).
fn init_has_own_mount_namespace(flags: &[&str]) -> bool {
    let mut cli = airlock_command()
        .arg("run")
        .args(flags)
        .args(["--", "sleep", "1"])
        .stdout(Stdio::null())
        .spawn()
        .expect("airlock starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    let namespace = loop {
        let init = first_child(cli.id());
        if let Some(init) = init.filter(|&init| first_child(init).is_some()) {
            break std::fs::read_link(format!("/proc/{init}/ns/mnt")).expect("the init is alive");
        }
        assert!(Instant::now() < deadline, "the run did not start");
        std::thread::sleep(Duration::from_millis(5));
    };
    let status = cli.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(
        runs_of_supervisor(cli.id()),
        Vec::<std::path::PathBuf>::new()
    );
    namespace != std::fs::read_link("/proc/self/ns/mnt").unwrap()
}

#[test]
fn the_init_covers_the_runtime_directory_only_where_a_bind_reaches_it() {
    if !is_root() || !native_available() {
        return skip("needs root and the native backend");
    }
    assert!(!init_has_own_mount_namespace(&[]));
    assert!(init_has_own_mount_namespace(&["--ro", "/run"]));
}

/// The runtime directory's own files (the sweep's stamp, which every run's sweep keeps) are
/// on the host; under `--ro /run` the program sees the init's empty cover instead.
#[test]
fn other_runs_directories_stay_hidden_from_a_bind_of_run() {
    let stamp = Path::new("/run/airlock/.last-sweep");
    if !is_root() || !native_available() || !stamp.exists() {
        return skip("needs root, the native backend and /run/airlock/.last-sweep");
    }
    let probe = "test -e /run/airlock/.last-sweep && echo visible || echo hidden";
    let result = run_json(&["--ro", "/run"], &["sh", "-c", probe]);
    assert_eq!(result["stdout"].as_str(), Some("hidden\n"), "{result}");
}

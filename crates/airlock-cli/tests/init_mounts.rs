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

/// Points `link` at `target` in one step (a new link renamed over the old one), so that a
/// run resolving it sees one target or the other, never no link.
fn repoint(link: &Path, target: &Path) {
    let fresh = link.with_extension("next");
    let _ = std::fs::remove_file(&fresh);
    std::os::unix::fs::symlink(target, &fresh).unwrap();
    std::fs::rename(&fresh, link).unwrap();
}

/// The attack on the uncovered runtime directory: a bind source that is a symlink to a
/// harmless directory when the run is planned (so the init makes no cover) and to the runtime
/// directory when the sandbox's PID 1 binds it. A host thread flips the link all along;
/// whatever each run catches, the program never sees the runtime directory's own files:
/// either both saw the same target (harmless, or covered) or PID 1 refuses the run.
#[test]
fn a_symlink_swapped_to_the_runtime_directory_after_planning_never_exposes_it() {
    let runtime_dir = Path::new("/run/airlock");
    if !is_root() || !native_available() || !runtime_dir.join(".last-sweep").exists() {
        return skip("needs root, the native backend and /run/airlock/.last-sweep");
    }
    let dir = shared_tempdir();
    let harmless = dir.path().join("harmless");
    std::fs::create_dir(&harmless).unwrap();
    std::fs::write(harmless.join("marker"), "").unwrap();
    let link = dir.path().join("source");
    repoint(&link, &harmless);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (stop, link, harmless) = (stop.clone(), link.clone(), harmless.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            for flip in 0u64.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) || Instant::now() > deadline {
                    break;
                }
                repoint(
                    &link,
                    if flip % 2 == 0 {
                        runtime_dir
                    } else {
                        &harmless
                    },
                );
                std::thread::sleep(Duration::from_micros(300));
            }
        })
    };
    let mount_point = link.to_str().unwrap().to_string();
    let probe = format!(
        "test -e {mount_point}/.last-sweep && echo visible; \
         test -e {mount_point}/marker && echo harmless; true"
    );
    let (mut harmless_runs, mut covered, mut refused) = (0, 0, 0);
    for _ in 0..40 {
        let result = run_json(&["--ro", &mount_point], &["sh", "-c", &probe]);
        let stdout = result["stdout"].as_str().unwrap_or_default();
        assert!(
            !stdout.contains("visible"),
            "the runtime directory leaked: {result}"
        );
        if stdout.contains("harmless") {
            harmless_runs += 1;
        } else if result["status"] == "exited" {
            covered += 1;
        } else {
            assert!(result.to_string().contains("reaches"), "{result}");
            refused += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().unwrap();
    eprintln!(
        "40 runs: {harmless_runs} saw the harmless directory, {covered} the init's cover, \
         {refused} were refused"
    );
}

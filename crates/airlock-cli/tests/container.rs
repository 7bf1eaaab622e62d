//! `airlock run --backend container` end to end, through the real binary, once per runtime
//! (`auto`, i.e. runc here, then crun and podman named with `--container-runtime`), as root
//! and, for runc and crun, rootless: the CLI run as an unprivileged user (through setpriv when
//! the tests run as root). Skips (with the reason printed) when a rootful suite is not run as
//! root or when the runtime is not installed.

mod support;

use support::command_lines_with as processes_with;
use support::oci::{py, stdout, Oci, User, ROOTFUL};

const CONTAINER: Oci = Oci {
    backend: "container",
    runtimes: &["runc", "crun"],
    install: "apt-get install runc",
    state_dirs: &["/run/runc", "/run/crun", "/var/run/runsc"],
    refusal_message: "runc run failed",
    ..ROOTFUL
};

const CRUN: Oci = Oci {
    runtimes: &["crun"],
    install: "apt-get install crun",
    flags: &["--container-runtime", "crun"],
    refusal_message: "/proc/self/cwd/marker",
    ..CONTAINER
};

const PODMAN: Oci = Oci {
    runtimes: &["podman"],
    install: "apt-get install podman",
    // podman refuses `nr_inodes`: its workdir, /tmp and /dev/shm are the init's capped tmpfs
    // mounts, so airlock must be able to mount (root) for the untrusted profile to run.
    flags: &["--container-runtime", "podman"],
    refusal_message: "/proc/self/cwd/marker",
    ..CONTAINER
};

/// runc run by an unprivileged user: rootless, no cgroup.
const ROOTLESS_RUNC: Oci = Oci {
    runtimes: &["runc"],
    flags: &["--container-runtime", "runc"],
    user: User::Unprivileged,
    ..CONTAINER
};

/// crun run by an unprivileged user (behind the hybrid-cgroup workaround in a user namespace
/// of its own here).
const ROOTLESS_CRUN: Oci = Oci {
    user: User::Unprivileged,
    ..CRUN
};

/// The shared checks and the capability check, for one runtime.
macro_rules! container_tests {
    ($module:ident, $oci:expr) => {
        mod $module {
            use super::*;

            shared_oci_tests!($oci);

            #[test]
            fn python_runs_unprivileged_with_no_capabilities_and_seccomp() {
                require_runtime!($oci);
                unprivileged_without_capabilities(&$oci);
            }

            #[test]
            fn the_runtime_is_reported_as_a_detail_not_a_warning() {
                require_runtime!($oci);
                runtime_in_details(&$oci);
            }
        }
    };
}

container_tests!(runc_or_auto, CONTAINER);
container_tests!(crun, CRUN);
container_tests!(podman, PODMAN);
container_tests!(rootless_runc, ROOTLESS_RUNC);
container_tests!(rootless_crun, ROOTLESS_CRUN);

mod rootless_runc_layers {
    use super::*;

    shared_oci_tests!(ROOTLESS_RUNC; required_layers_rootless_lacks_are_refused_then_reported);
}

/// Which runtime ran (and any host workaround) is a fact of the run, in `details`; a run
/// as root with nothing missing has no warnings at all.
fn runtime_in_details(oci: &Oci) {
    let result = oci.run(&[], &["/bin/true"]);
    assert_eq!(result["exit_code"], 0, "{result}");
    let details = result["details"].to_string();
    assert!(details.contains("container: runtime"), "{result}");
    let warnings = &result["warnings"];
    if oci.rootless() {
        assert!(warnings.to_string().contains("rootless"), "{result}");
    } else {
        assert!(warnings.is_null(), "{result}");
    }
}

/// The program has no capability, no_new_privs and our seccomp filter, and cannot act as
/// anyone but an unprivileged user on the host: uid 65534 under rootful runtimes; rootless,
/// root of its own user namespace, whose one id is the caller's (a file it writes to a
/// `--rw` directory is the caller's on the host).
fn unprivileged_without_capabilities(oci: &Oci) {
    let out = tempfile::Builder::new()
        .prefix("airlock-owner")
        .tempdir_in("/var/tmp")
        .unwrap();
    let owner = if oci.rootless() { oci.cli_uid() } else { 65534 };
    nix::unistd::chown(out.path(), Some(owner.into()), None).unwrap();
    let file = out.path().join("made");
    let code = format!("import os; s=open('/proc/self/status').read(); print(os.getuid(), [l.split()[1] for l in s.splitlines() if l.startswith(('CapEff','CapBnd','Seccomp:','NoNewPrivs'))]); open('f','w').write('x'); open('/tmp/t','w').write('y'); open('{}','w').write('z'); print('wrote')", file.display());
    let dir = out.path().to_str().unwrap();
    let result = oci.run(&["--rw", dir], &py(&code));
    assert_eq!(result["exit_code"], 0, "{result}");
    let inside = if oci.rootless() { 0 } else { 65534 };
    assert_eq!(
        stdout(&result),
        format!("{inside} ['0000000000000000', '0000000000000000', '1', '2']\nwrote\n"),
        "{result}"
    );
    let made = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&file).unwrap());
    assert_eq!(made, owner, "the file's owner on the host: {result}");
}

/// Without root, a runtime airlock cannot drive is refused before anything starts (exit 125,
/// the reason and the fix), never run and reported as the program's exit.
#[test]
fn engines_without_root_are_refused_up_front() {
    require_runtime!(ROOTLESS_RUNC);
    for (runtime, says) in [
        ("podman", "rootless podman"),
        ("docker", "docker only as root"),
    ] {
        let output = ROOTLESS_RUNC
            .airlock()
            .args([
                "run",
                "--backend",
                "container",
                "--container-runtime",
                runtime,
            ])
            .args(["--", "/bin/true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(125), "{runtime}: {stderr}");
        assert!(output.stdout.is_empty(), "{runtime}: {stderr}");
        if !stderr.contains("is not installed") {
            assert!(
                stderr.contains("backend container is not available here")
                    && stderr.contains(says)
                    && stderr.contains("run airlock as root"),
                "{runtime}: {stderr}"
            );
        }
    }
}

/// Starts `airlock run` on `oci`'s runtime with a shell `script` that first prints its
/// workdir, and returns the CLI, the run directory and the run id read from that line.
/// `own_group` puts the CLI in a new process group, so the test can kill the CLI and its init
/// together.
fn start_run(
    oci: &Oci,
    script: &str,
    own_group: bool,
) -> (std::process::Child, std::path::PathBuf, String) {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_airlock"));
    command
        .args(["run", "--backend", "container"])
        .args(oci.flags)
        .args(["--", "/bin/sh", "-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    if own_group {
        command.process_group(0);
    }
    let mut child = command.spawn().expect("airlock starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let run_dir = std::path::Path::new(line.trim())
        .parent()
        .unwrap()
        .to_path_buf();
    let run_id = run_dir.file_name().unwrap().to_str().unwrap().to_string();
    (child, run_dir, run_id)
}

/// conmon daemonizes, so nothing ties the container to the init. When the supervisor and the
/// init are both SIGKILLed, podman's guard (a child subreaper that outlives the init) must kill
/// conmon and the container at once and remove the run directory, which holds podman's whole
/// state. The run's cgroups are left, empty, to the next run's sweep: this test removes them,
/// and `rmdir` succeeds only on a cgroup without processes.
#[test]
fn podman_container_dies_with_its_killed_supervisor_and_init() {
    require_runtime!(PODMAN);
    use std::time::{Duration, Instant};
    let marker = format!("1000.{}", std::process::id());
    let (mut child, run_dir, run_id) =
        start_run(&PODMAN, &format!("pwd; exec sleep {marker}"), true);
    let program = format!("sleep {marker} ");
    let started = Instant::now();
    while !processes_with(&marker)
        .iter()
        .any(|p| p.starts_with(&program))
    {
        assert!(started.elapsed() < Duration::from_secs(10), "no container");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The init shares the supervisor's process group; the guard and podman have their own.
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let leftover = || {
        let mut alive = processes_with(&marker);
        alive.extend(processes_with(&run_id));
        alive
    };
    while (!leftover().is_empty() || run_dir.exists()) && killed.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        leftover(),
        Vec::<String>::new(),
        "the run outlived its init"
    );
    assert!(!run_dir.exists(), "podman's state in {run_dir:?} survived");
    assert_eq!(podman_names_in(&run_dir), Vec::<String>::new());
    std::fs::remove_dir_all(&run_dir).unwrap();
    remove_empty_run_cgroups(&run_id);
    PODMAN.assert_no_leftovers(&run_dir, &run_id);
}

/// crun copies itself into a temporary file as it starts, in `$_LIBCONTAINER_STATEDIR` or
/// else in /tmp, and unlinks it moments later: a crun killed in between (a run cancelled as it
/// starts) left an empty `/tmp/crun.XXXXXX` on the host. airlock starts crun with that
/// directory in the run's bundle, which goes with the run.
#[test]
fn crun_makes_its_temporary_copy_in_the_run_directory() {
    require_runtime!(CRUN);
    use std::time::{Duration, Instant};
    let marker = format!("1000.{}", std::process::id() + 1);
    let (mut child, run_dir, run_id) =
        start_run(&CRUN, &format!("pwd; exec sleep {marker}"), false);
    let container = format!("airlock-{run_id}");
    let started = Instant::now();
    let crun = loop {
        // Not /proc/PID/exe: crun runs from its unlinked copy.
        let crun_command = format!("/usr/bin/crun --root {}", run_dir.display());
        if let Some((pid, _)) = pids_with_command(&container)
            .into_iter()
            .find(|(_, command)| command.starts_with(&crun_command))
        {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no crun for {container}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let environ = std::fs::read(format!("/proc/{crun}/environ")).unwrap_or_default();
    let expected = format!("_LIBCONTAINER_STATEDIR={}", run_dir.join("oci").display());
    let found = environ
        .split(|b| *b == 0)
        .any(|var| var == expected.as_bytes());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
    assert!(found, "crun ran without {expected}");
    CRUN.assert_no_leftovers(&run_dir, &run_id);
}

/// The processes whose command line contains `needle`, with their command lines.
fn pids_with_command(needle: &str) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| p.file_name().to_string_lossy().parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
        })
        .filter(|(_, command)| command.contains(needle))
        .collect()
}

/// What `podman ps -a` lists with the run's own state directories (which it creates afresh
/// when they are gone).
fn podman_names_in(run_dir: &std::path::Path) -> Vec<String> {
    let dir = |name: &str| run_dir.join(name).display().to_string();
    let output = std::process::Command::new("podman")
        .args([
            "--root",
            &dir("pr"),
            "--runroot",
            &dir("pu"),
            "--tmpdir",
            &dir("pt"),
        ])
        .args(["--storage-driver", "vfs", "--events-backend", "none"])
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .output()
        .expect("podman ps runs");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn remove_empty_run_cgroups(run_id: &str) {
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let cgroup = hierarchy.path().join("airlock").join(run_id);
        if cgroup.exists() {
            std::fs::remove_dir(&cgroup)
                .unwrap_or_else(|e| panic!("{} is not empty: {e}", cgroup.display()));
        }
    }
}

/// `airlock doctor` as an unprivileged user: the container and gVisor backends are available
/// rootless (when installed), each runtime airlock cannot drive without root says why and
/// how to fix it, and what a rootless run lacks (its cgroup) is said too.
#[test]
fn doctor_reports_rootless_runtimes_for_the_user() {
    require_runtime!(ROOTLESS_RUNC);
    let output = ROOTLESS_RUNC
        .airlock()
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["running_as_root"], false, "{report}");
    let backend = |name: &str| {
        report["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap()
            .clone()
    };
    let container = backend("container");
    assert_eq!(container["available"], true, "{container}");
    assert!(!container["layers"]
        .as_array()
        .unwrap()
        .contains(&"cgroup".into()));
    let problems = container["problems"].to_string();
    assert!(
        problems.contains("no uid_drop") && problems.contains("no cgroup"),
        "{problems}"
    );
    assert!(
        !report.to_string().contains("not supported yet"),
        "{report}"
    );
    let runtimes = report["container_runtimes"].as_array().unwrap();
    for runtime in runtimes {
        let installed = !runtime["path"].is_null();
        match runtime["name"].as_str().unwrap() {
            "runc" => assert_eq!(runtime["usable"], true, "{runtime}"),
            "podman" | "docker" if installed => {
                assert_eq!(runtime["usable"], false, "{runtime}");
                let problem = runtime["problem"].as_str().unwrap();
                assert!(problem.contains("run airlock as root"), "{problem}");
            }
            _ => {}
        }
    }
    let gvisor = backend("gvisor");
    let runsc = ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    assert_eq!(gvisor["available"], runsc, "{gvisor}");
}

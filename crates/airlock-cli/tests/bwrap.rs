//! The bwrap backend and backend selection, driven through the real `airlock` binary.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

mod support;

use support::{airlock_command, PYTHON};

fn run_json(args: &[&str]) -> (Value, Output) {
    let output = airlock_command()
        .arg("run")
        .arg("--json")
        .args(args)
        .output()
        .expect("airlock runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (value, output)
}

fn stdout_of(result: &Value) -> &str {
    result["stdout"].as_str().unwrap_or("")
}

/// Returns false (and says why) when bwrap cannot run here.
fn bwrap_usable() -> bool {
    let output = airlock_command()
        .args(["doctor", "--json"])
        .output()
        .expect("doctor runs");
    let report: Value = serde_json::from_slice(&output.stdout).expect("doctor prints JSON");
    let bwrap = report["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["name"] == "bwrap")
        .cloned()
        .unwrap_or(Value::Null);
    if bwrap["available"] == true {
        return true;
    }
    eprintln!("skipped: bwrap is not usable here: {}", bwrap["problems"]);
    false
}

/// A run on bwrap that accepts its one gap (no inode cap; see
/// `untrusted_refuses_bwrap_by_default_for_its_missing_inode_cap`).
fn python_bwrap(code: &str, extra: &[&str]) -> Value {
    let mut args = vec!["--backend", "bwrap", "--allow-degraded"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", PYTHON, "-c", code]);
    let (result, output) = run_json(&args);
    assert_ne!(
        result,
        Value::Null,
        "no JSON result: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    result
}

#[test]
fn python_and_bash_run_under_bwrap() {
    if !bwrap_usable() {
        return;
    }
    let result = python_bwrap("print(6 * 7)", &[]);
    assert_eq!(stdout_of(&result), "42\n", "{result}");
    assert_eq!(result["backend"], "bwrap");
    let (result, _) = run_json(&[
        "--backend",
        "bwrap",
        "--allow-degraded",
        "--",
        "/bin/bash",
        "-c",
        "echo $((6 * 7)) && hostname",
    ]);
    assert_eq!(stdout_of(&result), "42\nairlock\n", "{result}");
}

#[test]
fn host_listener_is_unreachable_and_inet_sockets_are_refused() {
    if !bwrap_usable() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)"
    );
    let result = python_bwrap(&code, &[]);
    // EPERM from seccomp (AF_INET sockets are not allowed without network), not ECONNREFUSED.
    assert_eq!(stdout_of(&result), "refused 1\n", "{result}");
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    let isolation = result["isolation"].as_array().unwrap();
    assert!(
        isolation.contains(&Value::from("net_ns")) && isolation.contains(&Value::from("seccomp")),
        "{result}"
    );

    // The same attempt with the network on reaches the listener: the test can fail.
    // untrusted requires net_ns, which a host network cannot have (the native backend alike).
    let result = python_bwrap(&code, &["--network", "host"]);
    assert_eq!(stdout_of(&result), "connected\n", "{result}");
    assert!(listener.accept().is_ok());
}

#[test]
fn seccomp_denies_what_namespaces_alone_would_allow() {
    if !bwrap_usable() {
        return;
    }
    // Inside bwrap's own network namespace an AF_INET socket is harmless to the kernel, so
    // only our seccomp filter refuses it; a user namespace is refused by the filter (and by
    // --disable-userns).
    let code = "import ctypes, socket\nlibc = ctypes.CDLL(None, use_errno=True)\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    print('socket ok')\nexcept OSError as e:\n    print('socket', e.errno)\nprint('unshare', libc.unshare(0x10000000), ctypes.get_errno())";
    let result = python_bwrap(code, &[]);
    assert_eq!(stdout_of(&result), "socket 1\nunshare -1 1\n", "{result}");
}

#[test]
fn host_files_are_invisible_and_capabilities_are_gone() {
    if !bwrap_usable() {
        return;
    }
    let secret = tempfile::Builder::new()
        .prefix("airlock-bwrap-secret")
        .tempdir_in("/var/tmp")
        .unwrap();
    let file = secret.path().join("secret");
    std::fs::write(&file, "top secret").unwrap();
    let code = format!(
        "import os\nprint(os.path.exists({path:?}), os.path.exists('/root'), os.path.exists('/home'))\nprint(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]) < 5)",
        path = file.display().to_string()
    );
    let result = python_bwrap(&code, &[]);
    assert_eq!(
        stdout_of(&result),
        "False False False\n0000000000000000\nTrue\n",
        "{result}"
    );
}

#[test]
fn fresh_workdir_is_private_and_gone_after_the_run() {
    if !bwrap_usable() {
        return;
    }
    let result = python_bwrap(
        "import os\nopen('f', 'w').write('x')\nprint(os.getcwd())",
        &[],
    );
    let workdir = PathBuf::from(stdout_of(&result).trim());
    assert!(workdir.is_absolute(), "{result}");
    assert!(
        !workdir.exists() && !workdir.parent().unwrap().exists(),
        "{} survived the run",
        workdir.display()
    );

    let result = python_bwrap(
        "import os\nopen('kept', 'w').write('x')\nprint(os.getcwd())",
        &["--keep"],
    );
    let kept = PathBuf::from(
        result["workdir"]
            .as_str()
            .expect("kept workdir in the result"),
    );
    assert!(kept.join("kept").is_file(), "{result}");
    std::fs::remove_dir_all(kept.parent().unwrap()).unwrap();
}

/// The init counts a bwrap run's members in one hierarchy (`MembersStayInRunCgroup`): a
/// process the program leaves running in the background still ends with the run.
#[test]
fn a_background_process_ends_with_the_run() {
    if !bwrap_usable() {
        return;
    }
    let marker = format!("{}.{}", 600, std::process::id());
    let started = std::time::Instant::now();
    let (result, output) = run_json(&[
        "--backend",
        "bwrap",
        "--allow-degraded",
        "--",
        "/bin/sh",
        "-c",
        &format!("setsid sleep {marker} > /dev/null 2>&1 & echo started"),
    ]);
    assert_eq!(
        stdout_of(&result).trim(),
        "started",
        "{result} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&marker))
        .collect();
    assert!(survivors.is_empty(), "outlived the run: {survivors:?}");
}

#[test]
fn tmp_is_size_capped() {
    if !bwrap_usable() {
        return;
    }
    let code = "try:\n    open('/tmp/big', 'wb').write(b'x' * (3 << 20))\n    print('wrote')\nexcept OSError as e:\n    print('full', e.errno)";
    let result = python_bwrap(code, &["--disk", "2MiB"]);
    assert_eq!(stdout_of(&result), "full 28\n", "{result}");
}

#[test]
fn extra_paths_keep_their_access() {
    if !bwrap_usable() {
        return;
    }
    let ro = tempfile::tempdir_in("/var/tmp").unwrap();
    let rw = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(ro.path().join("in"), "data").unwrap();
    for dir in [ro.path(), rw.path()] {
        open_up(dir);
    }
    let code = format!(
        "print(open({input:?}).read())\ntry:\n    open({ro_out:?}, 'w')\nexcept OSError as e:\n    print('ro', e.errno)\nopen({rw_out:?}, 'w').write('out')",
        input = ro.path().join("in").display().to_string(),
        ro_out = ro.path().join("x").display().to_string(),
        rw_out = rw.path().join("out").display().to_string(),
    );
    let ro_arg = ro.path().display().to_string();
    let rw_arg = rw.path().display().to_string();
    let result = python_bwrap(&code, &["--ro", &ro_arg, "--rw", &rw_arg]);
    assert_eq!(stdout_of(&result), "data\nro 30\n", "{result}");
    assert_eq!(
        std::fs::read_to_string(rw.path().join("out")).unwrap(),
        "out"
    );
}

fn open_up(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

/// `airlock run ARGS` refused before anything started: exit 125, nothing ran; its stderr.
fn refused(args: &[&str]) -> String {
    let output = airlock_command().arg("run").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(nothing_ran(&output.stdout), "{stderr}");
    stderr
}

/// Nothing ran: no output, or (with `--json`) the one refusal object of a run that never
/// started (status `sandbox_error`, no backend).
fn nothing_ran(stdout: &[u8]) -> bool {
    stdout.is_empty()
        || serde_json::from_slice::<serde_json::Value>(stdout)
            .is_ok_and(|r| r["status"] == "sandbox_error" && r["backend"] == "")
}

fn profile(contents: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::io::Write::write_all(&mut file, contents.as_bytes()).unwrap();
    file
}

#[test]
fn min_isolation_above_every_backend_is_refused_with_the_reason() {
    let file = profile("min_isolation = \"vm\"\n");
    let stderr = refused(&[
        "--profile",
        file.path().to_str().unwrap(),
        "--",
        "/bin/true",
    ]);
    assert!(
        stderr.contains("min_isolation = \"vm\"") && stderr.contains("lower min_isolation"),
        "{stderr}"
    );
}

#[test]
fn min_isolation_kernel_picks_the_fastest_kernel_backend() {
    let file = profile("min_isolation = \"kernel\"\n");
    let (result, output) = run_json(&[
        "--profile",
        file.path().to_str().unwrap(),
        "--",
        "/bin/true",
    ]);
    let native_runs = result["status"] == "exited";
    if !native_runs {
        eprintln!(
            "skipped: native cannot run here: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        return;
    }
    assert_eq!(result["backend"], "native", "{result}");
}

#[test]
fn a_profile_requiring_landlock_refuses_bwrap_unless_degraded() {
    if !bwrap_usable() {
        return;
    }
    let file = profile("require = [\"env_scrub\", \"seccomp\", \"landlock_fs\"]\n");
    let path = file.path().to_str().unwrap();
    let stderr = refused(&["--profile", path, "--backend", "bwrap", "--", "/bin/true"]);
    assert!(
        stderr.contains("landlock_fs") && stderr.contains("--allow-degraded"),
        "{stderr}"
    );

    let (result, _) = run_json(&[
        "--profile",
        path,
        "--backend",
        "bwrap",
        "--allow-degraded",
        "--",
        "/bin/true",
    ]);
    assert_eq!(result["status"], "exited", "{result}");
    assert!(
        result["warnings"].to_string().contains("landlock_fs"),
        "{result}"
    );
    assert!(
        !result["isolation"]
            .as_array()
            .unwrap()
            .contains(&Value::from("landlock_fs")),
        "{result}"
    );
}

/// bwrap cannot cap the number of files in its own tmpfs mounts, which the untrusted
/// profile's `limits.files` promises. When airlock can mount, the init premounts capped tmpfs
/// mounts for bwrap to bind (its in-memory run directory): the run goes ahead by default and
/// the cap holds. Without them (`--disk-run-dir`, or no CAP_SYS_ADMIN) the run is refused by
/// default, and runs with exactly that gap, warned once, when accepted.
#[test]
fn bwrap_caps_inodes_only_with_the_inits_capped_mounts() {
    if !bwrap_usable() {
        return;
    }
    let bomb = "import os\nn = 0\ntry:\n    for i in range(400):\n        open(f'f{i}', 'w').close(); n += 1\nexcept OSError as e:\n    print('refused', e.errno)\nprint(n)";
    let capped = [
        "--backend",
        "bwrap",
        "--files",
        "100",
        "--",
        "/usr/bin/python3",
        "-c",
        bomb,
    ];
    if nix::unistd::geteuid().is_root() {
        let (result, output) = run_json(&capped);
        assert_eq!(
            result["status"],
            "exited",
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(stdout_of(&result), "refused 28\n99\n", "{result}");
        let isolation = result["isolation"].as_array().unwrap();
        assert!(isolation.contains(&Value::from("inode_quota")), "{result}");
        assert!(
            !result["warnings"].to_string().contains("degraded"),
            "{result}"
        );
    }
    let stderr = refused(&[
        "--json",
        "--backend",
        "bwrap",
        "--disk-run-dir",
        "--",
        "/bin/true",
    ]);
    assert!(
        stderr.contains("backend bwrap cannot enforce inode_quota")
            && stderr.contains("--allow-degraded"),
        "{stderr}"
    );
    let mut uncapped = vec!["--disk-run-dir", "--allow-degraded"];
    uncapped.extend(capped);
    let (result, output) = run_json(&uncapped);
    assert_eq!(
        result["status"],
        "exited",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout_of(&result),
        "400\n",
        "no cap without the init's mounts: {result}"
    );
    let warnings = result["warnings"].to_string();
    assert!(
        warnings.contains("degraded") && warnings.contains("inode_quota"),
        "{result}"
    );
    assert_eq!(
        warnings.matches("inode_quota").count(),
        1,
        "the accepted gap is warned once: {result}"
    );
    let isolation = result["isolation"].as_array().unwrap();
    assert!(isolation.contains(&Value::from("disk_quota")), "{result}");
    assert!(!isolation.contains(&Value::from("inode_quota")), "{result}");
}

/// A caller's workdir is not capped by any backend, so it is not required: bwrap runs.
#[test]
fn a_callers_workdir_needs_no_disk_caps() {
    if !bwrap_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    open_up(dir.path());
    let workdir = dir.path().to_str().unwrap();
    let (result, output) = run_json(&[
        "--backend",
        "bwrap",
        "--workdir",
        workdir,
        "--",
        "/bin/true",
    ]);
    assert_eq!(
        result["status"],
        "exited",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn doctor_lists_bwrap_with_its_level() {
    let output = airlock_command()
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let bwrap = report["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "bwrap")
        .expect("bwrap is listed")
        .clone();
    assert_eq!(bwrap["level"], "kernel");
    if bwrap["available"] == false {
        let problems = bwrap["problems"].to_string();
        assert!(
            problems.contains("apt-get install bubblewrap")
                || problems.contains("sysctl")
                || problems.contains("setuid"),
            "{problems}"
        );
    }
}

#[test]
fn conformance_grades_bare_and_airlock_by_host_evidence() {
    if !Path::new(PYTHON).exists() {
        eprintln!("skipped: {PYTHON} is missing");
        return;
    }
    let me = env!("CARGO_BIN_EXE_airlock");
    let airlock_prefix = format!("{me} run --");
    let mut child = airlock_command()
        .args([
            "conformance",
            "--json",
            "--prefix",
            "env",
            "--name",
            "bare",
            "--prefix",
            &airlock_prefix,
            "--name",
            "airlock",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child.wait().unwrap();
    let rows: Value = serde_json::from_str(&stdout).expect("conformance prints JSON");
    let verdicts = |row: usize| -> Vec<(String, String)> {
        rows[row]["attacks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["class"].as_str().unwrap().to_string(),
                    a["verdict"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let bare = verdicts(0);
    for class in ["fs-read", "fs-write", "network", "env"] {
        assert!(
            bare.contains(&(class.to_string(), "escaped".to_string())),
            "bare must fail {class}: {bare:?}"
        );
    }
    for (class, verdict) in verdicts(1) {
        assert_eq!(verdict, "blocked", "airlock {class}: {}", rows[1]);
    }
    // The real attacks of the suite, one result each; only limit-bound ones are skipped.
    let results = |row: usize| rows[row]["results"].as_array().unwrap().clone();
    let catalogue = airlock_attack::catalogue();
    assert_eq!(results(0).len(), catalogue.len(), "{}", rows[0]);
    for (result, attack) in results(1).iter().zip(&catalogue) {
        assert_eq!(result["attack"], attack.name);
        assert_ne!(result["verdict"], "escaped", "airlock: {result}");
    }
    let escaped_bare = results(0)
        .iter()
        .filter(|r| r["verdict"] == "escaped")
        .count();
    assert!(
        escaped_bare >= 40,
        "bare must fail most attacks: {escaped_bare}"
    );
    for skipped in results(0).iter().filter(|r| r["verdict"] == "skipped") {
        let evidence = skipped["evidence"].as_str().unwrap();
        assert!(
            evidence.contains("limits only airlock") || evidence.contains("needs root"),
            "{skipped}"
        );
    }
}

#[test]
fn min_isolation_picks_the_fastest_backend_at_or_above_the_level() {
    let runtime_present = |tool: &str| {
        ["/usr/bin/", "/usr/sbin/"]
            .iter()
            .any(|dir| std::path::Path::new(&format!("{dir}{tool}")).exists())
    };
    if !nix::unistd::geteuid().is_root() || !runtime_present("runc") || !runtime_present("runsc") {
        eprintln!("skipping: needs root with runc and runsc installed (.ci/run installs them)");
        return;
    }
    // gVisor has no inode cap, so it runs only with the degradation accepted.
    for (level, expected, flag) in [
        ("container", "container", "--wall=10s"),
        ("user-kernel", "gvisor", "--allow-degraded"),
    ] {
        let file = profile(&format!("min_isolation = \"{level}\"\n"));
        let (result, output) = run_json(&[
            "--profile",
            file.path().to_str().unwrap(),
            flag,
            "--",
            "/bin/true",
        ]);
        assert!(
            output.status.success(),
            "{level}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(result["backend"], expected, "{level}: {result}");
    }
}

/// bwrap exits 1 when it cannot build the sandbox, like a program that exits 1. Its status
/// stream tells the two apart: a bind it cannot make (a root-only directory, while bwrap runs
/// as the sandbox's unprivileged uid) is a sandbox error with bwrap's own message.
#[test]
fn a_bwrap_setup_failure_is_a_sandbox_error_not_the_programs_exit() {
    if !bwrap_usable() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to make a directory the sandbox uid cannot enter");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let private = parent.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let ro = private.to_str().unwrap();
    let (result, output) = run_json(&[
        "--backend",
        "bwrap",
        "--allow-degraded",
        "--ro",
        ro,
        "--",
        "/bin/true",
    ]);
    assert_eq!(output.status.code(), Some(125), "{result}");
    assert_eq!(result["status"], "sandbox_error", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap_or("")
            .contains("failed before the program started"),
        "{result}"
    );
    assert!(stdout_of(&result).is_empty(), "{result}");
    assert!(
        result["stderr"].as_str().unwrap_or("").contains(ro),
        "bwrap's own message names the path: {result}"
    );
    // The same exit code from the program itself stays the program's.
    let (result, _) = run_json(&[
        "--backend",
        "bwrap",
        "--allow-degraded",
        "--",
        "/bin/sh",
        "-c",
        "exit 1",
    ]);
    assert_eq!(result["status"], "exited", "{result}");
    assert_eq!(result["exit_code"], 1, "{result}");
}

/// Without a cgroup (an unprivileged caller) the process cap is RLIMIT_NPROC, which counts
/// every process of the caller's uid. Set before bwrap's namespace, it counted the caller's
/// own processes on the host: a user with more of them than `--pids` could not start bwrap
/// at all ("Creating new namespace failed: Resource temporarily unavailable"), and concurrent
/// runs of one user failed each other. Now set inside a user namespace of the run's own: the
/// run starts with 200 of the caller's processes alive, and the cap still stops a fork loop.
#[test]
fn an_unprivileged_callers_own_processes_do_not_count_against_the_cap() {
    if !bwrap_usable() {
        return;
    }
    const CALLER_PROCESSES: usize = 200;
    const PIDS: usize = 16;
    let fork_loop = "import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n            time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)\nelse:\n    print('forked', n)\n";
    let script = format!(
        "for i in $(seq {CALLER_PROCESSES}); do sleep 30 & done\n\
         \"$0\" run --json --backend bwrap --allow-degraded --pids {PIDS} -- {PYTHON} -c \"$1\"\n\
         kill $(jobs -p) 2>/dev/null\n"
    );
    let mut command = if nix::unistd::geteuid().is_root() {
        let uid = support::UNPRIVILEGED_UID.to_string();
        let mut c = std::process::Command::new("/usr/bin/setpriv");
        c.args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
        ]);
        c.arg("/bin/bash");
        c
    } else {
        std::process::Command::new("/bin/bash")
    };
    let output = command
        .args(["-c", &script])
        .arg(support::airlock_bin())
        .arg(fork_loop)
        .current_dir("/tmp")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(result["status"], "exited", "{result}");
    let said = stdout_of(&result);
    let forked: usize = said
        .strip_prefix("stopped ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the fork loop was not stopped: {said:?}"));
    assert!(
        forked < PIDS,
        "{forked} processes forked under --pids {PIDS}"
    );
}

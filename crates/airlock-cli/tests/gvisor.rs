//! `airlock run --backend gvisor` end to end, through the real binary and runsc: rootful,
//! and rootless (`runsc --rootless`, the CLI run as an unprivileged user, through setpriv
//! when the tests run as root). Skips (with the reason printed) when the rootful suite is
//! not run as root or when runsc is not installed.

mod support;

use support::oci::{self, py, stdout, Oci, User, ROOTFUL};

const GVISOR: Oci = Oci {
    backend: "gvisor",
    runtimes: &["runsc"],
    install: "apt-get install runsc",
    state_dirs: &["/var/run/runsc", "/run/runsc"],
    inet_refusal_errno: 1,
    // runsc's own tmpfs has no inode cap: the workdir, /tmp and /dev/shm are the init's capped
    // tmpfs mounts (see `gvisor_caps_inodes_only_with_the_inits_capped_mounts`).
    flags: &[],
    refusal_message: "running container",
    ..ROOTFUL
};

/// runsc run by an unprivileged user. airlock cannot mount the capped tmpfs mounts runsc
/// binds as root, and runsc's own tmpfs ignores `nr_inodes`: the untrusted profile refuses
/// the missing `inode_quota` by default (see `rootless_gvisor_has_no_inode_cap_and_says_so`),
/// so every other check accepts that one degradation.
const ROOTLESS_GVISOR: Oci = Oci {
    flags: &["--allow-degraded"],
    user: User::Unprivileged,
    ..GVISOR
};

shared_oci_tests!(GVISOR);

mod rootless {
    use super::*;

    shared_oci_tests!(ROOTLESS_GVISOR;
        exit_codes_propagate,
        namespaces_cannot_be_created,
        root_filesystem_is_read_only,
        network_is_only_loopback,
        host_canary_is_invisible,
        memory_limit_is_reported,
        pids_limit_refuses_forks_without_killing_the_run,
        wall_timeout_kills_the_container_and_leaves_nothing,
        normal_runs_leave_nothing_either,
        killed_supervisor_leaves_nothing,
        a_refused_bundle_is_a_sandbox_error_not_the_programs_exit,
        required_layers_rootless_lacks_are_refused_then_reported,
    );

    #[test]
    fn python_runs_in_the_user_space_kernel_unprivileged() {
        require_runtime!(ROOTLESS_GVISOR);
        python_in_the_user_space_kernel(&ROOTLESS_GVISOR);
    }

    #[test]
    fn a_program_runsc_cannot_load_is_a_sandbox_error() {
        require_runtime!(ROOTLESS_GVISOR);
        program_runsc_cannot_load(&ROOTLESS_GVISOR);
    }

    /// Without the init's capped mounts the workdir is runsc's own tmpfs.
    #[test]
    fn rootless_gvisor_has_no_inode_cap_and_says_so() {
        require_runtime!(ROOTLESS_GVISOR);
        no_inode_cap_is_refused_then_reported(&ROOTLESS_GVISOR, &[]);
    }
}

#[test]
fn python_runs_in_the_user_space_kernel_unprivileged() {
    require_runtime!(GVISOR);
    python_in_the_user_space_kernel(&GVISOR);
}

#[test]
fn a_program_runsc_cannot_load_is_a_sandbox_error() {
    require_runtime!(GVISOR);
    program_runsc_cannot_load(&GVISOR);
}

/// runsc writes its pid file once the sandbox exists, before it loads the program: a program
/// that does not exist fails after that, with runsc's exit code 128. Its log says the `run`
/// command failed, which airlock reads: a sandbox error, not the program exiting 128.
fn program_runsc_cannot_load(oci: &Oci) {
    let (result, output) = oci.run_output(&[], &["/no/such/program"]);
    assert_eq!(output.status.code(), Some(125), "{result}");
    assert_eq!(result["status"], "sandbox_error", "{result}");
    let stderr = result["stderr"].as_str().unwrap_or("");
    assert!(
        stderr.contains("/no/such/program"),
        "runsc's own message: {result}"
    );
}

/// Python runs with no capabilities under gVisor's own kernel, as uid 65534 (rootful) or the
/// caller's uid (rootless, inside the sentry: the sentry itself runs as the caller).
fn python_in_the_user_space_kernel(oci: &Oci) {
    let code = "import os; s=open('/proc/self/status').read(); print(os.getuid(), [l.split()[1] for l in s.splitlines() if l.startswith(('CapEff','CapBnd'))]); open('f','w').write('x'); open('/tmp/t','w').write('y'); print('wrote')";
    let result = oci.run(&[], &py(code));
    assert_eq!(result["exit_code"], 0, "{result}");
    let uid = if oci.rootless() { oci.cli_uid() } else { 65534 };
    assert_eq!(
        stdout(&result),
        format!("{uid} ['0000000000000000', '0000000000000000']\nwrote\n"),
        "{result}"
    );
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let inside = oci.run(&[], &py("import os; print(os.uname().release)"));
    assert_ne!(
        stdout(&inside).trim(),
        host_release.trim(),
        "gVisor reports its own kernel release: {inside}"
    );
}

#[test]
fn threads_start_under_the_user_space_kernel() {
    require_runtime!(GVISOR);
    let result = GVISOR.run(&[], &py("import threading; t = threading.Thread(target=lambda: None); t.start(); t.join(); print('thread ok')"));
    assert_eq!(stdout(&result), "thread ok\n", "{result}");
}

#[test]
fn the_platform_is_reported() {
    require_runtime!(GVISOR);
    let result = GVISOR.run(&[], &["/bin/true"]);
    // The platform is a fact of the run; the pids limit's other enforcement is a gap.
    let details = result["details"].to_string();
    assert!(details.contains("runsc platform"), "{result}");
    let warnings = result["warnings"].to_string();
    assert!(warnings.contains("RLIMIT_NPROC"), "{result}");
    assert!(!warnings.contains("runsc platform"), "{result}");
}

/// runsc's tmpfs ignores `nr_inodes`: the untrusted profile's `limits.files` holds only on
/// the init's capped tmpfs mounts, bound into the sandbox (the shared check
/// `sandbox_workdir_caps_size_and_files`). Without them (`--disk-run-dir`) the run is refused
/// by default; accepted, the result says so, and the size cap holds while the file count does
/// not.
#[test]
fn gvisor_without_the_inits_capped_mounts_has_no_inode_cap() {
    require_runtime!(GVISOR);
    no_inode_cap_is_refused_then_reported(&GVISOR, &["--disk-run-dir"]);
}

/// runsc's own tmpfs caps the workdir's size but not its file count: refused by default,
/// naming `inode_quota`; accepted, the result claims `disk_quota` and not `inode_quota`, and
/// both are what happens.
fn no_inode_cap_is_refused_then_reported(oci: &Oci, flags: &[&str]) {
    let output = oci
        .airlock()
        .args(["run", "--json", "--backend", "gvisor"])
        .args(flags)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(nothing_ran(&output.stdout), "{stderr}");
    assert!(
        stderr.contains("backend gvisor cannot enforce inode_quota")
            && stderr.contains("--allow-degraded"),
        "{stderr}"
    );
    let mut accepted = flags.to_vec();
    accepted.push("--allow-degraded");
    accepted.extend(oci::FILL_LIMITS);
    let result = oci.run(&accepted, &py(oci::FILL_WORKDIR));
    assert_eq!(stdout(&result), "400\nbytes refused 28\n", "{result}");
    let isolation = result["isolation"].as_array().unwrap();
    assert!(isolation.contains(&"disk_quota".into()), "{result}");
    assert!(!isolation.contains(&"inode_quota".into()), "{result}");
}

/// runsc's processes start with a descriptor table of 1024 slots (`/dev/null` held at 1023),
/// so the threaded sandbox and gofer never wait for an RCU grace period to grow it; the
/// program in the sandbox sees none of it.
#[test]
fn runsc_starts_with_a_presized_descriptor_table_the_program_never_sees() {
    require_runtime!(GVISOR);
    let code = "import os, time; print(sorted(os.listdir('/proc/self/fd'))); time.sleep(3)";
    let child = GVISOR
        .airlock()
        .args(["run", "--json", "--backend", "gvisor", "--"])
        .args(py(code))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let tools = wait_for_descendants(child.id() as i32, &["runsc", "exe"], 4);
    let output = child.wait_with_output().unwrap();
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(!tools.is_empty(), "no runsc process seen: {result}");
    for (pid, held) in &tools {
        assert_eq!(
            held.as_deref(),
            Some("/dev/null"),
            "runsc process {pid}: {result}"
        );
    }
    assert_eq!(stdout(&result), "['0', '1', '2', '3']\n", "{result}");
}

/// The descendants of `root` named one of `names`, with where each one's descriptor 1023
/// points, once at least `count` of them exist (or after 10 s).
fn wait_for_descendants(root: i32, names: &[&str], count: usize) -> Vec<(i32, Option<String>)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let found: Vec<(i32, Option<String>)> = descendants(root)
            .into_iter()
            .filter(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                names.contains(&comm.trim())
            })
            .map(|pid| {
                let target = std::fs::read_link(format!("/proc/{pid}/fd/1023")).ok();
                (pid, target.map(|t| t.display().to_string()))
            })
            .collect();
        if found.len() >= count || std::time::Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn descendants(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after_comm = stat.rsplit_once(')')?.1;
            Some((pid, after_comm.split_whitespace().nth(1)?.parse().ok()?))
        })
        .collect();
    let mut found = vec![root];
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(pid, _)| *pid),
        );
        index += 1;
    }
    found.split_off(1)
}

/// Nothing ran: no output, or (with `--json`) the one refusal object of a run that never
/// started (status `sandbox_error`, no backend).
fn nothing_ran(stdout: &[u8]) -> bool {
    stdout.is_empty()
        || serde_json::from_slice::<serde_json::Value>(stdout)
            .is_ok_and(|r| r["status"] == "sandbox_error" && r["backend"] == "")
}

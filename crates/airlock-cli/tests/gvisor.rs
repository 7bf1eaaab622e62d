//! `airlock run --backend gvisor` end to end, through the real binary and runsc.
//! Skips (with the reason printed) when not root or when runsc is not installed.

mod oci;

use oci::{py, stdout, Oci};

const GVISOR: Oci = Oci {
    backend: "gvisor",
    runtimes: &["runsc"],
    install: "apt-get install runsc",
    state_dirs: &["/var/run/runsc", "/run/runsc"],
    inet_refusal_errno: 1,
    flags: &[],
};

shared_oci_tests!(GVISOR;
    exit_codes_propagate,
    namespaces_cannot_be_created,
    root_filesystem_is_read_only,
    network_is_only_loopback,
    host_canary_is_invisible,
    memory_limit_is_reported,
    pids_limit_refuses_forks_without_killing_the_run,
    wall_timeout_kills_the_container_and_leaves_nothing,
    normal_runs_leave_nothing_either,
);

#[test]
fn python_runs_in_the_user_space_kernel_unprivileged() {
    require_runtime!(GVISOR);
    let code = "import os; s=open('/proc/self/status').read(); print(os.getuid(), [l.split()[1] for l in s.splitlines() if l.startswith(('CapEff','CapBnd'))]); open('f','w').write('x'); open('/tmp/t','w').write('y'); print('wrote')";
    let result = GVISOR.run(&[], &py(code));
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(
        stdout(&result),
        "65534 ['0000000000000000', '0000000000000000']\nwrote\n",
        "{result}"
    );
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let inside = GVISOR.run(&[], &py("import os; print(os.uname().release)"));
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
    let warnings = result["warnings"].to_string();
    assert!(warnings.contains("runsc platform"), "{result}");
    assert!(warnings.contains("RLIMIT_NPROC"), "{result}");
}

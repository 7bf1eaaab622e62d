//! `airlock run --backend container` end to end, through the real binary and runc/crun.
//! Skips (with the reason printed) when not root or when no OCI runtime is installed.

mod oci;

use oci::{py, stdout, Oci};

const CONTAINER: Oci = Oci {
    backend: "container",
    runtimes: &["runc", "crun"],
    install: "apt-get install runc",
    state_dirs: &["/run/runc", "/run/crun", "/var/run/runsc"],
    inet_refusal_errno: 97,
    flags: &[],
};

shared_oci_tests!(CONTAINER;
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
fn python_runs_unprivileged_with_no_capabilities_and_seccomp() {
    require_runtime!(CONTAINER);
    let code = "import os; s=open('/proc/self/status').read(); print(os.getuid(), [l.split()[1] for l in s.splitlines() if l.startswith(('CapEff','CapBnd','Seccomp:','NoNewPrivs'))]); open('f','w').write('x'); open('/tmp/t','w').write('y'); print('wrote')";
    let result = CONTAINER.run(&[], &py(code));
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(
        stdout(&result),
        "65534 ['0000000000000000', '0000000000000000', '1', '2']\nwrote\n",
        "{result}"
    );
}

/// The workdir the sandbox creates is a tmpfs with the `/tmp` caps: both caps hold there and
/// the result claims them.
#[test]
fn the_sandbox_workdir_caps_size_and_files() {
    require_runtime!(CONTAINER);
    let code = "import os\nn = 0\ntry:\n    for i in range(400):\n        open(f'f{i}', 'w').close(); n += 1\nexcept OSError as e:\n    print('files refused', e.errno)\nfor i in range(n): os.unlink(f'f{i}')\ntry:\n    open('big', 'wb').write(b'x' * (40 << 20))\n    print('wrote 40MiB')\nexcept OSError as e:\n    print('bytes refused', e.errno)";
    let result = CONTAINER.run(&["--files", "100", "--disk", "16MiB"], &py(code));
    assert_eq!(
        stdout(&result),
        "files refused 28\nbytes refused 28\n",
        "{result}"
    );
    let isolation = result["isolation"].as_array().unwrap();
    for layer in ["disk_quota", "inode_quota"] {
        assert!(isolation.contains(&layer.into()), "{layer}: {result}");
    }
}

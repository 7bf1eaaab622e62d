//! `airlock run --backend container` end to end, through the real binary, once per runtime
//! (`auto`, i.e. runc here, then crun and podman named with `--container-runtime`).
//! Skips (with the reason printed) when not root or when the runtime is not installed.

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

const CRUN: Oci = Oci {
    runtimes: &["crun"],
    install: "apt-get install crun",
    flags: &["--container-runtime", "crun"],
    ..CONTAINER
};

const PODMAN: Oci = Oci {
    runtimes: &["podman"],
    install: "apt-get install podman",
    flags: &["--container-runtime", "podman"],
    ..CONTAINER
};

/// The shared checks and the capability check, for one runtime.
macro_rules! container_tests {
    ($module:ident, $oci:expr) => {
        mod $module {
            use super::*;

            shared_oci_tests!($oci;
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
                require_runtime!($oci);
                unprivileged_without_capabilities(&$oci);
            }
        }
    };
}

container_tests!(runc_or_auto, CONTAINER);
container_tests!(crun, CRUN);
container_tests!(podman, PODMAN);

fn unprivileged_without_capabilities(oci: &Oci) {
    let code = "import os; s=open('/proc/self/status').read(); print(os.getuid(), [l.split()[1] for l in s.splitlines() if l.startswith(('CapEff','CapBnd','Seccomp:','NoNewPrivs'))]); open('f','w').write('x'); open('/tmp/t','w').write('y'); print('wrote')";
    let result = oci.run(&[], &py(code));
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(
        stdout(&result),
        "65534 ['0000000000000000', '0000000000000000', '1', '2']\nwrote\n",
        "{result}"
    );
}

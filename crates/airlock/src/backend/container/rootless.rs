//! OCI runtimes run by a caller without root ("rootless"): runc and crun here, runsc in
//! `gvisor.rs`. What changes against a rootful run, and why:
//!
//! - ids: an unprivileged process may write a user namespace map of one line, mapping its own
//!   ids, and runc and crun need the container's root mapped (they become it to set the
//!   container up). So the container's root is the caller and the program runs as that root,
//!   with every capability dropped, no_new_privs and seccomp as in a rootful run.
//! - cgroups: none is delegated to a non-root user on this kind of host (cgroup v1), and
//!   rootless runc refuses limits it cannot write. The container gets no cgroup; memory and
//!   processes fall back to rlimits, as for any non-root run (Tier 0): address space per
//!   process, and RLIMIT_NPROC, which the kernel counts per user namespace, so it covers the
//!   container's processes. There is no peak-memory accounting from a cgroup.
//! - tmpfs: the runtime mounts the workdir, `/tmp` and `/dev/shm` inside its own user
//!   namespace, where the kernel honours `size` and `nr_inodes`: runc and crun keep the disk
//!   and inode caps without airlock mounting anything.

use nix::unistd::{getegid, geteuid};

use super::runtime::RuntimeKind;
use crate::backend::oci::{HostIds, OciInput, OciResources, OciRlimit};
use crate::policy::Policy;

/// Whether airlock runs without root, so every runtime must run rootless.
pub(crate) fn is_rootless() -> bool {
    !geteuid().is_root()
}

/// The caller's own ids: the only ones a rootless runtime may map.
pub(crate) fn caller_ids() -> HostIds {
    HostIds {
        uid: geteuid().as_raw(),
        gid: getegid().as_raw(),
    }
}

/// Turns a rootful runc/crun input into a rootless one: the program is the root of a user
/// namespace whose only id maps to `root` (the caller, as seen where the runtime runs), and
/// the cgroup limits become rlimits set by `prlimit` right before the program: runc applies
/// `process.rlimits` in its own Go init, which then cannot allocate under an address-space
/// cap (libseccomp fails with ENOMEM), and whose threads would count against RLIMIT_NPROC.
pub(crate) fn adapt_input(input: &mut OciInput, policy: &Policy, root: HostIds) {
    input.uid = 0;
    input.gid = 0;
    input.user_namespace = Some(root);
    input.cgroups_path = None;
    input.resources = OciResources::default();
    // prlimit's options are the limits' names: `--as`, `--nproc`.
    let mut argv: Vec<String> = vec![PRLIMIT.into()];
    argv.extend(fallback_rlimits(policy).iter().map(|r| {
        let name = r.kind.trim_start_matches("RLIMIT_").to_ascii_lowercase();
        format!("--{name}={}", r.hard)
    }));
    argv.push("--".into());
    argv.append(&mut input.argv);
    input.argv = argv;
}

/// Where `prlimit` (util-linux) is, on the host and in every bundle (`/usr` is bound).
const PRLIMIT: &str = "/usr/bin/prlimit";

/// No cgroup (runsc, whose sentry applies `process.rlimits` to the program itself): the
/// limits a cgroup would hold become the program's rlimits.
pub(crate) fn drop_cgroup(input: &mut OciInput, policy: &Policy) {
    input.cgroups_path = None;
    input.resources = OciResources::default();
    input
        .rlimits
        .retain(|r| !matches!(r.kind, "RLIMIT_AS" | "RLIMIT_NPROC"));
    input.rlimits.extend(fallback_rlimits(policy));
}

/// The rlimits that stand in for a cgroup: address space per process for memory (the
/// allocation fails inside the program: status `exited`, not `memory_limit`) and
/// RLIMIT_NPROC for processes.
pub(crate) fn fallback_rlimits(policy: &Policy) -> Vec<OciRlimit> {
    use nix::sys::resource::Resource;
    let limits = &policy.limits;
    vec![
        super::bundle::clamped_rlimit("RLIMIT_AS", Resource::RLIMIT_AS, limits.memory.0),
        super::bundle::clamped_rlimit("RLIMIT_NPROC", Resource::RLIMIT_NPROC, limits.processes),
    ]
}

/// Why a runtime cannot run for this non-root caller, with the fix; `None` when it can.
pub(crate) fn runtime_problem(kind: RuntimeKind) -> Option<String> {
    match kind {
        RuntimeKind::Runc | RuntimeKind::Crun => user_namespaces_problem().or_else(|| {
            (!std::path::Path::new(PRLIMIT).exists()).then(|| {
                format!("{PRLIMIT} (util-linux) caps memory and processes without a cgroup: install util-linux")
            })
        }),
        RuntimeKind::Podman => Some(
            "airlock drives podman only as root (rootless podman needs subordinate ids and its own per-user storage, not wired here): run airlock as root, or use --container-runtime runc or crun".into(),
        ),
        RuntimeKind::Docker => Some(
            "airlock drives docker only as root (the daemon makes the container as root, outside airlock's reach): run airlock as root, or use --container-runtime runc or crun".into(),
        ),
    }
}

/// A rootless runtime creates its user namespace unprivileged.
pub(crate) fn user_namespaces_problem() -> Option<String> {
    let mut problems = Vec::new();
    if crate::backend::native::user_namespaces_usable(&mut problems) {
        return None;
    }
    Some(format!(
        "a rootless runtime needs unprivileged user namespaces: {}",
        problems.join("; ")
    ))
}

/// What a rootless container run does not have, for the probe and every run's warnings.
pub(crate) const ROOTLESS_NOTE: &str = "container (rootless): airlock is not root, so runc and crun run rootless: no uid_drop (the program is root of a user namespace whose only id is your uid, with no capabilities) and no cgroup (none is delegated to a non-root user here): memory is capped per process (RLIMIT_AS: an allocation past it fails inside the program), processes by RLIMIT_NPROC, CPU time by RLIMIT_CPU, and the result has no cgroup accounting; run airlock as root for both (or give it a delegated cgroup v2 subtree for the cgroup)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::oci::{oci_spec, OciMounts};
    use serde_json::json;

    fn rootful_input() -> OciInput {
        OciInput {
            argv: vec!["/usr/bin/python3".into()],
            env: vec![],
            cwd: "/w".into(),
            uid: 65534,
            gid: 65534,
            hostname: "airlock".into(),
            rootfs: "rootfs".into(),
            mounts: OciMounts::default(),
            host_network: false,
            gated: false,
            resolv_conf: None,
            resources: OciResources {
                memory_bytes: Some(1 << 30),
                pids: Some(64),
                cpus: Some(1.0),
            },
            rlimits: vec![],
            cgroups_path: Some("/airlock/r1".into()),
            seccomp: None,
            user_namespace: Some(HostIds {
                uid: 100_000,
                gid: 100_000,
            }),
        }
    }

    #[test]
    fn rootless_maps_only_the_callers_ids_and_sets_no_cgroup_or_groups() {
        let policy = crate::policy::builtin("untrusted").unwrap();
        let mut input = rootful_input();
        adapt_input(
            &mut input,
            &policy,
            HostIds {
                uid: 1000,
                gid: 1001,
            },
        );
        let spec = oci_spec(&input);
        let linux = &spec["linux"];
        assert_eq!(
            linux["uidMappings"],
            json!([{ "containerID": 0, "hostID": 1000, "size": 1 }])
        );
        assert_eq!(
            linux["gidMappings"],
            json!([{ "containerID": 0, "hostID": 1001, "size": 1 }])
        );
        assert!(linux.get("cgroupsPath").is_none(), "{linux}");
        assert!(linux["resources"].get("memory").is_none(), "{linux}");
        assert!(linux["resources"].get("pids").is_none(), "{linux}");
        assert_eq!(spec["process"]["user"], json!({ "uid": 0, "gid": 0 }));
    }

    #[test]
    fn rootless_limits_are_set_by_prlimit_right_before_the_program() {
        let policy = crate::policy::builtin("untrusted").unwrap();
        let mut input = rootful_input();
        adapt_input(&mut input, &policy, caller_ids());
        let limits = fallback_rlimits(&policy);
        let expected = [
            PRLIMIT.to_string(),
            format!("--as={}", limits[0].hard),
            format!("--nproc={}", limits[1].hard),
            "--".into(),
            "/usr/bin/python3".into(),
        ];
        assert_eq!(input.argv, expected);
        assert!(limits[0].hard <= policy.limits.memory.0);
        assert!(limits[1].hard <= policy.limits.processes);
    }

    #[test]
    fn runsc_gets_the_fallback_as_process_rlimits() {
        let policy = crate::policy::builtin("untrusted").unwrap();
        let mut input = rootful_input();
        input.rlimits = fallback_rlimits(&policy);
        drop_cgroup(&mut input, &policy);
        let kinds: Vec<&str> = input.rlimits.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            ["RLIMIT_AS", "RLIMIT_NPROC"],
            "replaced, not doubled"
        );
        assert!(input.cgroups_path.is_none());
    }
}

//! The OCI runtime spec (`config.json`) shared by the `container` (runc, crun) and `gvisor`
//! (runsc) backends. [`oci_spec`] is pure: every host fact (which paths exist, the current hard
//! rlimits, the cgroup path) is decided by the caller and passed in [`OciInput`].
//!
//! The root is an empty directory made read-only; the host's system directories, a few `/etc`
//! entries and the generated identity files are bound read-only at their own paths, the
//! workdir and the policy's `read_write` paths read-write. The seccomp section is airlock's own
//! policy translated to OCI: the allowlist and refusal lists are those of
//! `confine/seccomp/lists.rs`, by name, so both sandboxes share one list.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// The OCI spec version we write.
pub const OCI_VERSION: &str = "1.0.2";

mod seccomp;

pub use seccomp::docker_seccomp_profile;
use seccomp::seccomp_section;

/// Everything [`oci_spec`] needs, already resolved against the host.
#[derive(Debug, Clone, PartialEq)]
pub struct OciInput {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The program's working directory inside (the same path as outside).
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    /// The root directory: an empty directory, absolute or relative to the bundle.
    pub rootfs: PathBuf,
    pub mounts: OciMounts,
    /// No network namespace of the container's own: the host's network, or the egress gate's
    /// namespace the runtime was started in.
    pub host_network: bool,
    /// The runtime is started in the egress gate's network namespace, which the init prepared
    /// (network `allowlist` or `report`): the container keeps it (`host_network` is set too),
    /// and an engine is told `--network host`, never to make its own.
    pub gated: bool,
    /// `/etc/resolv.conf` generated into the root (the egress gate's DNS stub), instead of
    /// none (no network) or the host's (host network).
    pub resolv_conf: Option<String>,
    pub resources: OciResources,
    /// `process.rlimits`; callers keep them at or below their own hard limits (raising needs
    /// CAP_SYS_RESOURCE, which the runtime may lack).
    pub rlimits: Vec<OciRlimit>,
    /// `linux.cgroupsPath`: absolute paths are taken from each hierarchy's root.
    pub cgroups_path: Option<String>,
    /// Translate airlock's seccomp policy into `linux.seccomp`.
    pub seccomp: Option<OciSeccomp>,
    /// Add a user namespace mapping the container's root to these ids (seen from where the
    /// runtime runs) and, when the program is not root, the program's id to itself; nothing
    /// else. Rootful: an otherwise unused host id. Rootless: the caller's own ids, the only ones
    /// an unprivileged runtime may map.
    pub user_namespace: Option<HostIds>,
}

/// A uid and gid on the host (or in the namespace the runtime itself runs in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIds {
    pub uid: u32,
    pub gid: u32,
}

/// What is visible inside, beyond the empty root.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OciMounts {
    /// Host directories bound read-only at the same path (`/usr`, `/lib`, ...).
    pub system_ro: Vec<PathBuf>,
    /// Files bound read-only: (host source, destination inside).
    pub files_ro: Vec<(PathBuf, PathBuf)>,
    /// The policy's `read_only` paths, at the same path.
    pub read_only: Vec<PathBuf>,
    /// The policy's `read_write` paths, at the same path.
    pub read_write: Vec<PathBuf>,
    /// The workdir, bound read-write at the same path.
    pub workdir: PathBuf,
    /// Git metadata in the writable paths, bound read-only over them (`protect_git`).
    pub git_read_only: Vec<PathBuf>,
    /// Directories holding a nested git directory, bound onto themselves like the path
    /// holding them so that they cannot be renamed (`protect_git`).
    pub git_pinned: Vec<PathBuf>,
    /// Where the tool binds each of `git_read_only` and `git_pinned` from, when not from the
    /// path itself: (path, source), the source a mount the init made from the object the
    /// walk found (see `WrapStep::BindFoundPrivately`).
    pub git_sources: Vec<(PathBuf, PathBuf)>,
    /// The workdir exists only for this run: mount a tmpfs with the `/tmp` caps there, owned
    /// by the program, instead of binding the host directory.
    pub workdir_tmpfs: bool,
    /// The caller's workdir is bound read-only.
    pub workdir_read_only: bool,
    /// Size and inode caps of the private `/tmp`.
    pub tmp_bytes: u64,
    pub tmp_files: u64,
    /// Size of the private `/dev/shm`.
    pub shm_bytes: u64,
    /// Allow executing files from the writable mounts.
    pub exec_writable: bool,
    /// The caller's workdir and `read_write` paths are a workspace whose programs may run.
    pub workspace: bool,
    /// Capped tmpfs mounts the init made for `/tmp` and `/dev/shm` (its in-memory run
    /// directory), bound instead of asking the runtime for tmpfs mounts it cannot cap.
    pub scratch_binds: Option<ScratchBinds>,
}

/// Host sources of `/tmp` and `/dev/shm` (see [`OciMounts::scratch_binds`]).
impl OciMounts {
    /// What the tool binds at `path`, one of protect_git's paths.
    pub fn git_source(&self, path: &Path) -> PathBuf {
        let staged = self.git_sources.iter().find(|(p, _)| p == path);
        staged.map_or_else(|| path.to_path_buf(), |(_, source)| source.clone())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ScratchBinds {
    pub tmp: PathBuf,
    pub shm: PathBuf,
}

/// `linux.resources`; `None` leaves a resource unlimited.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OciResources {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// CPU cores of CFS quota (0.5 = half a core).
    pub cpus: Option<f64>,
}

/// One `process.rlimits` entry, e.g. `RLIMIT_NOFILE`.
#[derive(Debug, Clone, PartialEq)]
pub struct OciRlimit {
    pub kind: &'static str,
    pub soft: u64,
    pub hard: u64,
}

/// The knobs of the translated seccomp policy.
#[derive(Debug, Clone, PartialEq)]
pub struct OciSeccomp {
    /// Allow sockets of every family; when false only `AF_UNIX` sockets may be made (and IP
    /// stream and datagram ones with `allow_inet`).
    pub allow_network: bool,
    /// IP stream and datagram sockets, nothing else (the egress gate's sandboxes).
    pub allow_inet: bool,
    /// Allow `clone3`. Needed under gVisor, which turns every seccomp refusal into EPERM, so the
    /// ENOSYS that makes glibc fall back to `clone` never arrives and no thread can start. Safe
    /// there: a namespace created inside gVisor belongs to its user-space kernel.
    pub allow_clone3: bool,
}

/// The CFS period the quota is expressed in.
const CPU_PERIOD_US: u64 = 100_000;

/// runc's default masks: kernel interfaces that leak host data or allow host changes.
const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Builds the complete `config.json`.
pub fn oci_spec(input: &OciInput) -> Value {
    json!({
        "ociVersion": OCI_VERSION,
        "process": process(input),
        "root": { "path": input.rootfs, "readonly": true },
        "hostname": input.hostname,
        "mounts": mounts(input),
        "linux": linux(input),
    })
}

fn process(input: &OciInput) -> Value {
    let env: Vec<String> = input.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let rlimits: Vec<Value> = input
        .rlimits
        .iter()
        .map(|r| json!({ "type": r.kind, "soft": r.soft, "hard": r.hard }))
        .collect();
    let no_caps: Vec<String> = Vec::new();
    // The program's group is its only supplementary one. Root gets none: a rootless runtime
    // may not call setgroups in its single-id user namespace (runc refuses any).
    let mut user = json!({ "uid": input.uid, "gid": input.gid });
    if input.gid != 0 {
        user["additionalGids"] = json!([input.gid]);
    }
    json!({
        "terminal": false,
        "user": user,
        "args": input.argv,
        "env": env,
        "cwd": input.cwd,
        "capabilities": { "bounding": no_caps, "effective": no_caps, "inheritable": no_caps, "permitted": no_caps, "ambient": no_caps },
        "rlimits": rlimits,
        "noNewPrivileges": true,
    })
}

fn mounts(input: &OciInput) -> Vec<Value> {
    let m = &input.mounts;
    let noexec = |mut options: Vec<String>| {
        if !m.exec_writable {
            options.push("noexec".into());
        }
        options
    };
    let mut list = vec![
        json!({ "destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"] }),
        json!({ "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "noexec", "strictatime", "mode=755", "size=65536k"] }),
        json!({ "destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] }),
    ];
    let rw = || {
        noexec(vec![
            "rbind".to_string(),
            "rw".into(),
            "nosuid".into(),
            "nodev".into(),
        ])
    };
    match &m.scratch_binds {
        Some(scratch) => list.extend([
            bind(&scratch.shm, Path::new("/dev/shm"), rw()),
            bind(&scratch.tmp, Path::new("/tmp"), rw()),
        ]),
        None => list.extend([
            tmpfs(
                "/dev/shm",
                noexec(vec![
                    "nosuid".into(),
                    "nodev".into(),
                    "mode=1777".into(),
                    format!("size={}", m.shm_bytes),
                ]),
            ),
            tmpfs(
                "/tmp",
                noexec(vec![
                    "nosuid".into(),
                    "nodev".into(),
                    "mode=1777".into(),
                    format!("size={}", m.tmp_bytes),
                    format!("nr_inodes={}", m.tmp_files),
                ]),
            ),
        ]),
    }
    let mut binds: Vec<(PathBuf, PathBuf, Vec<String>)> = Vec::new();
    let ro = || {
        vec![
            "rbind".to_string(),
            "ro".into(),
            "nosuid".into(),
            "nodev".into(),
        ]
    };
    binds.extend(m.system_ro.iter().map(|p| (p.clone(), p.clone(), ro())));
    binds.extend(
        m.files_ro
            .iter()
            .map(|(src, dst)| (src.clone(), dst.clone(), ro())),
    );
    binds.extend(m.read_only.iter().map(|p| (p.clone(), p.clone(), ro())));
    // The caller's own directories: a workspace whose programs may run (no noexec).
    let workspace = || match m.workspace {
        true => vec![
            "rbind".to_string(),
            "rw".into(),
            "nosuid".into(),
            "nodev".into(),
        ],
        false => rw(),
    };
    binds.extend(
        m.read_write
            .iter()
            .map(|p| (p.clone(), p.clone(), workspace())),
    );
    if !m.workdir_tmpfs {
        let options = match m.workdir_read_only {
            true => ro(),
            false => workspace(),
        };
        binds.push((m.workdir.clone(), m.workdir.clone(), options));
    }
    // Last among equals (the sort is stable), so each lands on top of the path holding it.
    binds.extend(
        m.git_pinned
            .iter()
            .map(|p| (m.git_source(p), p.clone(), workspace())),
    );
    binds.extend(
        m.git_read_only
            .iter()
            .map(|p| (m.git_source(p), p.clone(), ro())),
    );
    // Parents before children, so a nested path is not hidden by a later mount of its parent.
    binds.sort_by_key(|(_, dst, _)| dst.components().count());
    list.extend(
        binds
            .into_iter()
            .map(|(src, dst, options)| bind(&src, &dst, options)),
    );
    // After the binds: a policy path that is a parent of the workdir must not hide it.
    if m.workdir_tmpfs {
        list.push(tmpfs(
            &m.workdir.to_string_lossy(),
            noexec(vec![
                "nosuid".into(),
                "nodev".into(),
                "mode=700".into(),
                format!("uid={}", input.uid),
                format!("gid={}", input.gid),
                format!("size={}", m.tmp_bytes),
                format!("nr_inodes={}", m.tmp_files),
            ]),
        ));
    }
    list
}

fn bind(source: &Path, destination: &Path, options: Vec<String>) -> Value {
    json!({ "destination": destination, "type": "bind", "source": source, "options": options })
}

fn tmpfs(destination: &str, options: Vec<String>) -> Value {
    json!({ "destination": destination, "type": "tmpfs", "source": "tmpfs", "options": options })
}

fn linux(input: &OciInput) -> Value {
    let mut namespaces = vec!["pid", "ipc", "uts", "mount", "cgroup"];
    if !input.host_network {
        namespaces.push("network");
    }
    if input.user_namespace.is_some() {
        namespaces.push("user");
    }
    let namespaces: Vec<Value> = namespaces
        .into_iter()
        .map(|kind| json!({ "type": kind }))
        .collect();
    let mut linux = json!({
        "namespaces": namespaces,
        "resources": resources(&input.resources),
        "maskedPaths": MASKED_PATHS,
        "readonlyPaths": READONLY_PATHS,
    });
    if let Some(path) = &input.cgroups_path {
        linux["cgroupsPath"] = json!(path);
    }
    if let Some(seccomp) = &input.seccomp {
        linux["seccomp"] = seccomp_section(seccomp);
    }
    if let Some(root) = input.user_namespace {
        linux["uidMappings"] = id_mappings(root.uid, input.uid);
        linux["gidMappings"] = id_mappings(root.gid, input.gid);
    }
    linux
}

fn id_mappings(root_host_id: u32, id: u32) -> Value {
    let mut mappings = vec![json!({ "containerID": 0, "hostID": root_host_id, "size": 1 })];
    if id != 0 {
        mappings.push(json!({ "containerID": id, "hostID": id, "size": 1 }));
    }
    json!(mappings)
}

fn resources(r: &OciResources) -> Value {
    let mut resources = json!({ "devices": [{ "allow": false, "access": "rwm" }] });
    if let Some(bytes) = r.memory_bytes {
        // `swap` is memory plus swap: equal to the limit means no swap on top.
        resources["memory"] = json!({ "limit": bytes, "swap": bytes });
    }
    if let Some(pids) = r.pids {
        resources["pids"] = json!({ "limit": pids });
    }
    if let Some(cpus) = r.cpus.filter(|c| *c > 0.0) {
        let quota = ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1000);
        resources["cpu"] = json!({ "quota": quota, "period": CPU_PERIOD_US });
    }
    resources
}

/// Paths of `candidates` that exist on this host (symlinks count: binding follows them).
pub fn existing(candidates: &[PathBuf]) -> Vec<PathBuf> {
    candidates.iter().filter(|p| p.exists()).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OciInput {
        OciInput {
            argv: vec!["/usr/bin/python3".into(), "-c".into(), "print(1)".into()],
            env: vec![
                ("HOME".into(), "/run/airlock/r1/work".into()),
                ("PATH".into(), "/usr/bin:/bin".into()),
            ],
            cwd: "/run/airlock/r1/work".into(),
            uid: 65534,
            gid: 65534,
            hostname: "airlock".into(),
            rootfs: "rootfs".into(),
            mounts: OciMounts {
                system_ro: vec!["/usr".into(), "/lib".into(), "/lib64".into(), "/bin".into()],
                files_ro: vec![
                    ("/etc/ld.so.cache".into(), "/etc/ld.so.cache".into()),
                    (
                        "/run/airlock/r1/oci/etc/passwd".into(),
                        "/etc/passwd".into(),
                    ),
                ],
                read_only: vec!["/opt/data".into()],
                read_write: vec!["/srv/out".into()],
                git_read_only: Vec::new(),
                git_pinned: Vec::new(),
                git_sources: Vec::new(),
                workdir: "/run/airlock/r1/work".into(),
                workdir_tmpfs: false,
                workdir_read_only: false,
                tmp_bytes: 256 << 20,
                tmp_files: 10000,
                shm_bytes: 64 << 20,
                exec_writable: false,
                workspace: true,
                scratch_binds: None,
            },
            host_network: false,
            gated: false,
            resolv_conf: None,
            resources: OciResources {
                memory_bytes: Some(512 << 20),
                pids: Some(64),
                cpus: Some(1.0),
            },
            rlimits: vec![
                OciRlimit {
                    kind: "RLIMIT_NOFILE",
                    soft: 256,
                    hard: 256,
                },
                OciRlimit {
                    kind: "RLIMIT_FSIZE",
                    soft: 64 << 20,
                    hard: 64 << 20,
                },
                OciRlimit {
                    kind: "RLIMIT_CORE",
                    soft: 0,
                    hard: 0,
                },
            ],
            cgroups_path: Some("/airlock/r1".into()),
            seccomp: None,
            user_namespace: Some(HostIds {
                uid: 100_000,
                gid: 100_000,
            }),
        }
    }

    fn golden(name: &str, value: &Value) {
        let rendered = serde_json::to_string_pretty(value).unwrap() + "\n";
        crate::golden::assert_golden("oci", name, &rendered);
    }

    /// Git protection lands on top of the workspace: pinned directories (writable like it)
    /// after it, parents first, and each `.git` read-only after them.
    #[test]
    fn git_mounts_come_after_the_workspace_read_only() {
        let mut input = sample();
        let work = "/run/airlock/r1/work";
        input.mounts.git_pinned = vec![format!("{work}/vendor").into()];
        input.mounts.git_read_only = vec![
            format!("{work}/.git").into(),
            format!("{work}/vendor/lib/.git").into(),
        ];
        let spec = oci_spec(&input);
        let mounts = spec["mounts"].as_array().unwrap();
        let position = |dst: &str| {
            mounts
                .iter()
                .position(|m| m["destination"] == dst)
                .unwrap_or_else(|| panic!("no mount at {dst}"))
        };
        let options = |dst: &str| mounts[position(dst)]["options"].clone();
        assert!(position(work) < position(&format!("{work}/vendor")));
        assert!(position(&format!("{work}/vendor")) < position(&format!("{work}/vendor/lib/.git")));
        for git in [format!("{work}/.git"), format!("{work}/vendor/lib/.git")] {
            assert!(position(work) < position(&git));
            assert!(
                options(&git).as_array().unwrap().contains(&json!("ro")),
                "{git}"
            );
        }
        assert_eq!(options(&format!("{work}/vendor")), options(work));
    }

    #[test]
    fn sample_policy_matches_golden_spec() {
        golden("sample.json", &oci_spec(&sample()));
    }

    #[test]
    fn sample_with_seccomp_matches_golden_spec() {
        let mut input = sample();
        input.seccomp = Some(OciSeccomp {
            allow_network: false,
            allow_inet: false,
            allow_clone3: false,
        });
        golden("sample-seccomp.json", &oci_spec(&input));
    }

    fn mount_at<'a>(spec: &'a Value, destination: &str) -> Vec<&'a Value> {
        spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["destination"] == destination)
            .collect()
    }

    #[test]
    fn scratch_binds_replace_the_runtimes_tmp_and_shm() {
        let mut input = sample();
        input.mounts.scratch_binds = Some(ScratchBinds {
            tmp: "/run/airlock/r1/tmp".into(),
            shm: "/run/airlock/r1/shm".into(),
        });
        let spec = oci_spec(&input);
        for (destination, source) in [
            ("/tmp", "/run/airlock/r1/tmp"),
            ("/dev/shm", "/run/airlock/r1/shm"),
        ] {
            let mounts = mount_at(&spec, destination);
            assert_eq!(mounts.len(), 1, "{mounts:?}");
            assert_eq!(mounts[0]["type"], "bind");
            assert_eq!(mounts[0]["source"], source);
            assert!(mounts[0]["options"]
                .as_array()
                .unwrap()
                .contains(&"noexec".into()));
        }
    }

    #[test]
    fn a_workdir_of_the_sandbox_is_a_capped_tmpfs_owned_by_the_program() {
        let mut input = sample();
        input.mounts.workdir_tmpfs = true;
        input.mounts.read_only.push("/run".into());
        let spec = oci_spec(&input);
        let workdir = mount_at(&spec, "/run/airlock/r1/work");
        assert_eq!(workdir.len(), 1, "one mount, no bind: {workdir:?}");
        assert_eq!(workdir[0]["type"], "tmpfs");
        let options: Vec<&str> = workdir[0]["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        for wanted in [
            "size=268435456",
            "nr_inodes=10000",
            "uid=65534",
            "gid=65534",
            "mode=700",
            "noexec",
        ] {
            assert!(options.contains(&wanted), "{wanted} missing: {options:?}");
        }
        let all = spec["mounts"].as_array().unwrap();
        let position = |dst: &str| all.iter().position(|m| m["destination"] == dst).unwrap();
        assert!(
            position("/run") < position("/run/airlock/r1/work"),
            "a parent mounted later would hide the workdir"
        );
    }

    #[test]
    fn a_callers_workdir_is_bound() {
        let spec = oci_spec(&sample());
        let workdir = mount_at(&spec, "/run/airlock/r1/work");
        assert_eq!(workdir.len(), 1);
        assert_eq!(workdir[0]["type"], "bind");
    }

    #[test]
    fn spec_is_locked_down() {
        let spec = oci_spec(&sample());
        assert_eq!(spec["root"]["readonly"], true);
        assert_eq!(spec["process"]["noNewPrivileges"], true);
        for set in [
            "bounding",
            "effective",
            "inheritable",
            "permitted",
            "ambient",
        ] {
            assert_eq!(spec["process"]["capabilities"][set], json!([]), "{set}");
        }
        let namespaces: Vec<&str> = spec["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert!(
            namespaces.contains(&"network")
                && namespaces.contains(&"pid")
                && namespaces.contains(&"mount")
        );
        assert_eq!(spec["linux"]["resources"]["memory"]["limit"], 512u64 << 20);
        assert_eq!(spec["linux"]["resources"]["pids"]["limit"], 64);
        assert_eq!(spec["linux"]["resources"]["cpu"]["quota"], 100_000);
    }

    #[test]
    fn host_network_drops_the_network_namespace() {
        let mut input = sample();
        input.host_network = true;
        let spec = oci_spec(&input);
        assert!(!spec["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "network"));
    }

    /// The sandbox's scratch (`/tmp`) is noexec unless asked; the caller's own directories
    /// (a `--rw` path, its workdir) are a workspace whose programs run either way.
    #[test]
    fn writable_mounts_are_noexec_unless_asked() {
        let at = |spec: &Value, paths: &[&str]| -> Vec<Value> {
            spec["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| paths.contains(&m["destination"].as_str().unwrap()))
                .cloned()
                .collect()
        };
        let noexec = |m: &Value| m["options"].as_array().unwrap().contains(&json!("noexec"));
        let workspace = ["/srv/out", "/run/airlock/r1/work"];
        let mut input = sample();
        assert!(at(&oci_spec(&input), &["/tmp"]).iter().all(noexec));
        assert!(!at(&oci_spec(&input), &workspace).iter().any(noexec));
        input.mounts.exec_writable = true;
        assert!(!at(&oci_spec(&input), &["/tmp"]).iter().any(noexec));
        input.mounts.workdir_read_only = true;
        let workdir = at(&oci_spec(&input), &["/run/airlock/r1/work"]);
        assert!(workdir[0]["options"]
            .as_array()
            .unwrap()
            .contains(&json!("ro")));
    }

    #[test]
    fn parent_mounts_come_before_nested_ones() {
        let mut input = sample();
        input.mounts.read_only = vec!["/usr/share/x".into()];
        let spec = oci_spec(&input);
        let order: Vec<&str> = spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        let position = |p: &str| order.iter().position(|d| *d == p).unwrap();
        assert!(position("/usr") < position("/usr/share/x"));
    }
}

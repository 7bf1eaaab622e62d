//! The OCI bundle every container and gVisor run shares: an empty read-only root with the
//! host's system directories bound, generated identity files, and the mounts, limits and
//! seccomp policy of the run.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{cgroups_path, CONTAINER_HOSTNAME};
use crate::backend::oci::{
    docker_seccomp_profile, existing, oci_spec, OciInput, OciMounts, OciResources, OciRlimit,
    OciSeccomp, ScratchBinds,
};
use crate::backend::PlanContext;
use crate::confine::rootfs::{default_etc_files, default_system_ro};
use crate::rundir::{self, RunFile};

/// The bundle directory of one run and the files that make it up.
pub(crate) struct Bundle {
    pub dir: PathBuf,
    pub rootfs: PathBuf,
}

impl Bundle {
    pub fn new(ctx: &PlanContext) -> Bundle {
        let dir = ctx.run_dir.join("oci");
        Bundle {
            rootfs: dir.join("rootfs"),
            dir,
        }
    }

    /// The OCI input every OCI backend shares; callers add backend-specific facets.
    pub fn oci_input(&self, ctx: &PlanContext) -> OciInput {
        let policy = ctx.policy;
        let limits = &policy.limits;
        let (uid, gid) = crate::backend::native::sandbox_ids(policy);
        let mut files_ro: Vec<(PathBuf, PathBuf)> = existing(&default_etc_files())
            .into_iter()
            .map(|p| (p.clone(), p))
            .collect();
        let gated = ctx.egress.is_some();
        if policy.has_network() && !gated && Path::new("/etc/resolv.conf").exists() {
            files_ro.push(("/etc/resolv.conf".into(), "/etc/resolv.conf".into()));
        }
        let mut read_only = policy.filesystem.read_only.clone();
        read_only.extend(ctx.unix_sockets.iter().cloned());
        OciInput {
            argv: ctx.argv.to_vec(),
            env: ctx.env.to_vec(),
            cwd: ctx.workdir.to_path_buf(),
            uid,
            gid,
            hostname: CONTAINER_HOSTNAME.into(),
            rootfs: self.rootfs.clone(),
            mounts: OciMounts {
                system_ro: existing(&default_system_ro()),
                files_ro,
                read_only,
                read_write: policy.filesystem.read_write.clone(),
                workdir: ctx.workdir.to_path_buf(),
                git_read_only: ctx.git_read_only.to_vec(),
                git_pinned: ctx.git_pinned.to_vec(),
                git_sources: Vec::new(),
                workdir_tmpfs: ctx.sandbox_owns_workdir(),
                workdir_read_only: policy.filesystem.workdir_read_only,
                tmp_bytes: limits.disk.0,
                tmp_files: limits.files,
                shm_bytes: limits.shm_caps().0,
                exec_writable: policy.filesystem.exec_writable,
                workspace: policy.filesystem.workspace,
                scratch_binds: None,
            },
            // A gated run keeps the namespace the init prepared and started the runtime in.
            host_network: policy.has_network() || gated,
            gated,
            resolv_conf: gated.then(|| crate::backend::GATED_RESOLV_CONF.to_string()),
            resources: OciResources {
                memory_bytes: Some(limits.memory.0),
                pids: None,
                cpus: (limits.cpus > 0.0).then_some(limits.cpus),
            },
            rlimits: rlimits(policy),
            cgroups_path: cgroups_path(ctx),
            seccomp: None,
            user_namespace: None,
        }
    }

    pub fn config_file(&self, input: &OciInput) -> RunFile {
        let json = serde_json::to_vec_pretty(&oci_spec(input)).unwrap_or_default();
        RunFile {
            path: self.dir.join("config.json"),
            contents: json,
            mode: 0o600,
        }
    }

    /// The root's skeleton: identity files and a mountpoint for every mount, made in advance so
    /// that a runtime working as an unprivileged container root never needs to create them.
    pub fn skeleton_files(&self, input: &OciInput) -> Vec<RunFile> {
        let mut files = identity_files(&self.rootfs, input);
        let m = &input.mounts;
        // The workdir may not exist yet: the init creates it.
        let mut dirs: Vec<PathBuf> = vec![
            "/proc".into(),
            "/dev".into(),
            "/tmp".into(),
            m.workdir.clone(),
        ];
        let mut plain_files = Vec::new();
        let binds = m.system_ro.iter().chain(&m.read_only).chain(&m.read_write);
        for target in binds.chain(m.files_ro.iter().map(|(_, dst)| dst)) {
            let source = m
                .files_ro
                .iter()
                .find(|(_, dst)| dst == target)
                .map(|(src, _)| src)
                .unwrap_or(target);
            if source.is_dir() {
                dirs.push(target.clone());
            } else {
                plain_files.push(target.clone());
            }
        }
        for dir in dirs {
            // runc gives a tmpfs the mode of its mountpoint.
            let mode = if dir == Path::new("/tmp") {
                0o1777
            } else {
                0o755
            };
            files.push(RunFile {
                path: dir_marker(&self.rootfs.join(relative(&dir))),
                contents: Vec::new(),
                mode,
            });
        }
        files.extend(plain_files.into_iter().map(|f| RunFile {
            path: self.rootfs.join(relative(&f)),
            contents: Vec::new(),
            mode: 0o444,
        }));
        files
    }
}

/// Binds the init's capped tmpfs mounts (its in-memory run directory) as the workdir, `/tmp`
/// and `/dev/shm`, for tools whose own tmpfs has no inode cap (runsc's ignores `nr_inodes`,
/// podman 4 refuses it): every file is then created on the host tmpfs, whose caps hold. True
/// when the run has them.
pub(crate) fn bind_scratch_mounts(ctx: &PlanContext, mounts: &mut OciMounts) -> bool {
    let Some(scratch) = ctx.scratch else {
        return false;
    };
    let (tmp, shm) = (rundir::tmp_dir(ctx.run_dir), rundir::shm_dir(ctx.run_dir));
    if scratch.mount_at(&tmp).is_none() || scratch.mount_at(&shm).is_none() {
        return false;
    }
    if mounts.workdir_tmpfs {
        if scratch.mount_at(ctx.workdir).is_none() {
            return false;
        }
        // The workdir path is itself the capped tmpfs: bind it like a caller's workdir.
        mounts.workdir_tmpfs = false;
    }
    mounts.scratch_binds = Some(ScratchBinds { tmp, shm });
    true
}

/// airlock's seccomp policy in the Docker/podman profile format.
pub(super) fn seccomp_file(path: &Path, ctx: &PlanContext) -> RunFile {
    let profile = docker_seccomp_profile(&OciSeccomp {
        allow_network: ctx.policy.has_network(),
        allow_inet: ctx.egress.is_some(),
        allow_clone3: false,
    });
    RunFile {
        path: path.to_path_buf(),
        contents: serde_json::to_vec_pretty(&profile).unwrap_or_default(),
        mode: 0o644,
    }
}

/// The generated identity files, bound over the engines' own `/etc/hosts` and user entries
/// (and `resolv.conf`, the egress gate's stub, when the input has one).
pub(super) fn identity_bind_list(rootfs: &Path, input: &OciInput) -> Vec<(PathBuf, PathBuf)> {
    let resolv = input.resolv_conf.as_ref().map(|_| "resolv.conf");
    IDENTITY_FILES
        .iter()
        .copied()
        .chain(resolv)
        .map(|name| (rootfs.join("etc").join(name), Path::new("/etc").join(name)))
        .collect()
}

const IDENTITY_FILES: [&str; 4] = ["passwd", "group", "hosts", "hostname"];

/// A directory entry for the init: a path ending in `/` is created as a directory.
pub(super) fn dir_marker(path: &Path) -> PathBuf {
    let mut bytes = path.as_os_str().as_bytes().to_vec();
    bytes.push(b'/');
    PathBuf::from(std::ffi::OsStr::from_bytes(&bytes))
}

fn relative(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

/// passwd, group, hosts and hostname naming only the sandbox user and host.
fn identity_files(rootfs: &Path, input: &OciInput) -> Vec<RunFile> {
    let (uid, gid, home) = (input.uid, input.gid, input.cwd.display());
    [
        (
            "etc/passwd",
            format!("sandbox:x:{uid}:{gid}:airlock sandbox:{home}:/bin/sh\n"),
        ),
        ("etc/group", format!("sandbox:x:{gid}:\n")),
        (
            "etc/hosts",
            format!("127.0.0.1 localhost {CONTAINER_HOSTNAME}\n::1 localhost\n"),
        ),
        ("etc/hostname", format!("{CONTAINER_HOSTNAME}\n")),
    ]
    .into_iter()
    .chain(
        input
            .resolv_conf
            .clone()
            .map(|text| ("etc/resolv.conf", text)),
    )
    .map(|(path, contents)| RunFile {
        path: rootfs.join(path),
        contents: contents.into_bytes(),
        mode: 0o644,
    })
    .collect()
}

/// The program's rlimits, never above this process's hard limits (raising needs
/// CAP_SYS_RESOURCE).
pub(crate) fn rlimits(policy: &crate::policy::Policy) -> Vec<OciRlimit> {
    use nix::sys::resource::Resource;
    let l = &policy.limits;
    vec![
        clamped_rlimit("RLIMIT_NOFILE", Resource::RLIMIT_NOFILE, l.open_files),
        clamped_rlimit("RLIMIT_FSIZE", Resource::RLIMIT_FSIZE, l.file_size.0),
        OciRlimit {
            kind: "RLIMIT_CORE",
            soft: 0,
            hard: 0,
        },
    ]
}

/// `kind` at `value`, or at this process's hard limit when that is lower.
pub(crate) fn clamped_rlimit(
    kind: &'static str,
    resource: nix::sys::resource::Resource,
    value: u64,
) -> OciRlimit {
    let hard = nix::sys::resource::getrlimit(resource)
        .map(|(_, hard)| hard)
        .unwrap_or(value)
        .min(value);
    OciRlimit {
        kind,
        soft: hard,
        hard,
    }
}

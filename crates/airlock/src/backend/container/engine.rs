//! Container engines as front-ends: `podman run` and `docker run` command lines built by one
//! pure function ([`engine_argv`]) from the same facts the OCI generator uses ([`OciInput`]).
//!
//! podman: the root is the bundle's skeleton directory (`--rootfs`), and all of podman's own
//! state (its database, storage, locks, conmon's files) lives under the run directory
//! (`--root`/`--runroot`/`--tmpdir`), so the init's removal of the run directory removes it
//! too and the host's `podman ps -a` never lists a run. conmon daemonizes: podman runs under
//! a guard (`WrapStep::GuardToolTree`), a child subreaper that conmon and the container are
//! reparented to, which the init kills with its tree and which kills them itself if the init
//! is SIGKILLed.
//!
//! docker: no `--rootfs`: the container starts from `airlock/empty:1`, an image imported once
//! from an empty tar, with the system directories bound read-only. The container is the
//! engine's child, not the init's: see [`EngineInput::self_destruct_after`].

use std::path::{Path, PathBuf};

use crate::backend::oci::{OciInput, OciMounts};

/// Which engine's command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Podman,
    Docker,
}

/// The image Docker containers start from: no files at all.
pub const DOCKER_EMPTY_IMAGE: &str = "airlock/empty:1";

/// Where the container's cgroup goes.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineCgroups {
    /// No cgroup of its own (`--cgroups=disabled`, crun only): the container stays in the
    /// caller's cgroup, the run's, which holds the limits and is what the init accounts and
    /// kills.
    Inherit,
    /// A cgroup of the engine's beneath `parent` (or the engine's default place), with the
    /// policy's limits set on it.
    Own { parent: Option<String> },
}

/// podman's per-run state directories.
#[derive(Debug, Clone, PartialEq)]
pub struct PodmanStorage {
    pub root: PathBuf,
    pub runroot: PathBuf,
    pub tmpdir: PathBuf,
}

/// Everything [`engine_argv`] needs, already resolved against the host.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInput {
    pub engine: Engine,
    pub binary: PathBuf,
    /// The container's name.
    pub name: String,
    pub oci: OciInput,
    /// Files bound read-only over the generated ones: (source, destination), e.g. the
    /// identity files, so the engine's own `/etc/hosts` and user entries never appear.
    pub identity_files: Vec<(PathBuf, PathBuf)>,
    /// The seccomp profile file (Docker/podman format).
    pub seccomp_profile: Option<PathBuf>,
    pub cgroups: EngineCgroups,
    /// podman only: its state directories.
    pub storage: Option<PodmanStorage>,
    /// podman only: the OCI runtime it drives (`--runtime`).
    pub oci_runtime: Option<PathBuf>,
    /// `RLIMIT_NPROC` for the container (engines raise it past our hard limit by default,
    /// which needs CAP_SYS_RESOURCE); at or below the caller's hard limit.
    pub nproc: u64,
    /// podman only: `--pidfile`, written once the container's process exists, so a podman
    /// that failed before (exit 125, like a program could) is told from the program's exit.
    pub pid_file: Option<PathBuf>,
    /// docker only: the container kills its program after this many seconds on its own, so a
    /// container whose `docker run` client was killed does not outlive the run's budget.
    pub self_destruct_after: Option<u64>,
}

/// The engine's full command line, program argv included.
pub fn engine_argv(input: &EngineInput) -> Vec<String> {
    let mut argv = vec![input.binary.display().to_string()];
    argv.extend(global_flags(input));
    argv.extend(["run", "--rm", "--interactive"].map(String::from));
    argv.extend(["--name".into(), input.name.clone()]);
    if let Some(pid_file) = &input.pid_file {
        argv.extend(pair("--pidfile", pid_file));
    }
    argv.extend(isolation_flags(input));
    argv.extend(mount_flags(input));
    argv.extend(cgroup_flags(input));
    argv.extend(process_flags(input));
    argv.extend(image(input));
    argv.extend(program(input));
    argv
}

fn global_flags(input: &EngineInput) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(storage) = &input.storage {
        flags.extend(pair("--root", &storage.root));
        flags.extend(pair("--runroot", &storage.runroot));
        flags.extend(pair("--tmpdir", &storage.tmpdir));
        flags.extend(
            [
                "--storage-driver",
                "vfs",
                "--events-backend",
                "none",
                "--cgroup-manager",
                "cgroupfs",
            ]
            .map(String::from),
        );
    }
    if let Some(runtime) = &input.oci_runtime {
        flags.extend(pair("--runtime", runtime));
    }
    flags
}

fn isolation_flags(input: &EngineInput) -> Vec<String> {
    let oci = &input.oci;
    let mut flags: Vec<String> = Vec::new();
    if !oci.host_network {
        flags.extend(["--network", "none"].map(String::from));
    }
    // The egress gate's namespace, which the engine was started in: no bridge of its own.
    if oci.gated {
        flags.extend(["--network", "host"].map(String::from));
    }
    flags.extend(
        [
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            "--cgroupns",
            "private",
            "--ipc",
            "private",
            "--log-driver",
            "none",
        ]
        .map(String::from),
    );
    if let Some(profile) = &input.seccomp_profile {
        flags.extend([
            "--security-opt".into(),
            format!("seccomp={}", profile.display()),
        ]);
    }
    if let (Engine::Podman, Some(root)) = (input.engine, oci.user_namespace) {
        flags.extend(id_maps("--uidmap", root.uid, oci.uid));
        flags.extend(id_maps("--gidmap", root.gid, oci.gid));
    }
    flags.extend(["--hostname".into(), oci.hostname.clone()]);
    flags
}

/// Container root maps to an unused host id, the program's id to itself, nothing else.
fn id_maps(flag: &str, root_host_id: u32, id: u32) -> Vec<String> {
    let mut flags = vec![flag.to_string(), format!("0:{root_host_id}:1")];
    if id != 0 {
        flags.extend([flag.to_string(), format!("{id}:{id}:1")]);
    }
    flags
}

fn mount_flags(input: &EngineInput) -> Vec<String> {
    let m = &input.oci.mounts;
    let mut flags = vec!["--read-only".to_string()];
    if input.engine == Engine::Podman {
        // Otherwise podman adds writable tmpfs on /run and /var/tmp.
        flags.push("--read-only-tmpfs=false".into());
    }
    let noexec = if m.exec_writable { "exec" } else { "noexec" };
    let mut binds: Vec<(PathBuf, PathBuf, bool)> = Vec::new();
    match &m.scratch_binds {
        Some(scratch) => binds.extend([
            (scratch.tmp.clone(), "/tmp".into(), true),
            (scratch.shm.clone(), "/dev/shm".into(), true),
        ]),
        None => flags.extend(engine_tmpfs_flags(input.engine, m, noexec)),
    }
    binds.extend(m.system_ro.iter().map(|p| (p.clone(), p.clone(), false)));
    binds.extend(
        m.files_ro
            .iter()
            .map(|(s, d)| (s.clone(), d.clone(), false)),
    );
    binds.extend(
        input
            .identity_files
            .iter()
            .map(|(s, d)| (s.clone(), d.clone(), false)),
    );
    binds.extend(m.read_only.iter().map(|p| (p.clone(), p.clone(), false)));
    binds.extend(m.read_write.iter().map(|p| (p.clone(), p.clone(), true)));
    binds.push((m.workdir.clone(), m.workdir.clone(), !m.workdir_read_only));
    binds.extend(
        m.git_pinned
            .iter()
            .map(|p| (m.git_source(p), p.clone(), true)),
    );
    binds.extend(
        m.git_read_only
            .iter()
            .map(|p| (m.git_source(p), p.clone(), false)),
    );
    // Parents before children, so a nested path is not hidden by a later mount of its parent.
    binds.sort_by_key(|(_, dst, _)| dst.components().count());
    for (source, destination, writable) in binds {
        flags.push("--volume".into());
        flags.push(volume(
            input.engine,
            &source,
            &destination,
            writable,
            noexec,
        ));
    }
    flags
}

/// The engine's own `/tmp` and `/dev/shm`, when the init premounted none.
fn engine_tmpfs_flags(engine: Engine, m: &OciMounts, noexec: &str) -> Vec<String> {
    let mut tmp = format!(
        "/tmp:rw,nosuid,nodev,{noexec},mode=1777,size={}",
        m.tmp_bytes
    );
    if engine == Engine::Docker {
        // podman 4 refuses nr_inodes (only size and mode pass); its /tmp has no file cap.
        tmp.push_str(&format!(",nr_inodes={}", m.tmp_files));
    }
    vec![
        "--tmpfs".into(),
        tmp,
        "--shm-size".into(),
        m.shm_bytes.to_string(),
    ]
}

/// `SRC:DST:OPTIONS`; Docker's `-v` knows only ro/rw (and relabelling), podman's takes the
/// mount flags too.
fn volume(
    engine: Engine,
    source: &Path,
    destination: &Path,
    writable: bool,
    noexec: &str,
) -> String {
    let mode = if writable { "rw" } else { "ro" };
    let options = match (engine, writable) {
        (Engine::Docker, _) => mode.to_string(),
        (Engine::Podman, false) => format!("{mode},nosuid,nodev"),
        (Engine::Podman, true) => format!("{mode},nosuid,nodev,{noexec}"),
    };
    format!("{}:{}:{options}", source.display(), destination.display())
}

fn cgroup_flags(input: &EngineInput) -> Vec<String> {
    let parent = match &input.cgroups {
        EngineCgroups::Inherit => return vec!["--cgroups=disabled".into()],
        EngineCgroups::Own { parent } => parent,
    };
    let mut flags = Vec::new();
    if let Some(parent) = parent {
        flags.extend(["--cgroup-parent".into(), parent.clone()]);
    }
    let r = &input.oci.resources;
    if let Some(bytes) = r.memory_bytes {
        // Equal to the memory limit: no swap on top.
        flags.extend([
            "--memory".into(),
            bytes.to_string(),
            "--memory-swap".into(),
            bytes.to_string(),
        ]);
    }
    if let Some(pids) = r.pids {
        flags.extend(["--pids-limit".into(), pids.to_string()]);
    }
    if let Some(cpus) = r.cpus.filter(|c| *c > 0.0) {
        flags.extend(["--cpus".into(), cpus.to_string()]);
    }
    flags
}

fn process_flags(input: &EngineInput) -> Vec<String> {
    let oci = &input.oci;
    let mut flags = vec!["--user".into(), format!("{}:{}", oci.uid, oci.gid)];
    for limit in &oci.rlimits {
        let name = limit
            .kind
            .trim_start_matches("RLIMIT_")
            .to_ascii_lowercase();
        flags.extend([
            "--ulimit".into(),
            format!("{name}={}:{}", limit.soft, limit.hard),
        ]);
    }
    flags.extend(["--ulimit".into(), format!("nproc={0}:{0}", input.nproc)]);
    for (key, value) in &oci.env {
        flags.extend(["--env".into(), format!("{key}={value}")]);
    }
    flags.extend(["--workdir".into(), oci.cwd.display().to_string()]);
    flags
}

fn image(input: &EngineInput) -> Vec<String> {
    match input.engine {
        // `--rootfs` is a flag; the image argument is then the root directory.
        Engine::Podman => vec!["--rootfs".into(), input.oci.rootfs.display().to_string()],
        Engine::Docker => vec!["--pull".into(), "never".into(), DOCKER_EMPTY_IMAGE.into()],
    }
}

fn program(input: &EngineInput) -> Vec<String> {
    let mut argv = Vec::new();
    if let Some(seconds) = input.self_destruct_after {
        argv.extend(
            ["/usr/bin/timeout", "--signal", "KILL"]
                .map(String::from)
                .to_vec(),
        );
        argv.push(format!("{seconds}s"));
    }
    argv.extend(input.oci.argv.iter().cloned());
    argv
}

fn pair(flag: &str, path: &Path) -> [String; 2] {
    [flag.to_string(), path.display().to_string()]
}

/// The shell command that makes sure [`DOCKER_EMPTY_IMAGE`] exists (imported once from an
/// empty tar) and then execs `docker run`.
pub fn docker_script(docker: &Path, run_argv: &[String]) -> String {
    let docker = super::crun_hybrid::shell_quote(&docker.display().to_string());
    let quoted: Vec<String> = run_argv
        .iter()
        .map(|a| super::crun_hybrid::shell_quote(a))
        .collect();
    format!(
        "{docker} image inspect {DOCKER_EMPTY_IMAGE} >/dev/null 2>&1 || tar -cf - --files-from /dev/null | {docker} import - {DOCKER_EMPTY_IMAGE} >/dev/null || exit 125; exec {}",
        quoted.join(" ")
    )
}

/// The container's RLIMIT_NPROC: our own hard limit, capped where podman caps its own before
/// it starts the runtime (raising needs CAP_SYS_RESOURCE; the pids limit is the cgroup's job).
pub(super) fn nproc_limit() -> u64 {
    use nix::sys::resource::{getrlimit, Resource};
    const PODMAN_NPROC_CAP: u64 = 32_768;
    getrlimit(Resource::RLIMIT_NPROC)
        .map(|(_, hard)| hard)
        .unwrap_or(PODMAN_NPROC_CAP)
        .min(PODMAN_NPROC_CAP)
}

#[cfg(test)]
mod tests;

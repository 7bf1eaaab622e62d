//! `container`: the program runs in an OCI container started by `runc` or `crun` directly,
//! from a bundle the init writes into the run directory, or by `podman`/`docker` (see
//! [`engine`]); `[container] runtime` picks which (`auto`: runc, crun, podman, docker, the
//! first installed). No image: the root is an empty read-only directory with the host's
//! system directories bound read-only.
//!
//! cgroups: the init puts the runtime into the run's own cgroup and `linux.cgroupsPath` names
//! that same cgroup, so the container's processes, limits, OOM kills and CPU time are all
//! accounted where the init reads them. `run --keep` stops runc from removing the cgroup before
//! the init has read it (and from retrying for 150 ms because the runtime itself is still in
//! it). `runc delete` is not needed afterwards: the container's state lives in the run
//! directory, and the init removes the cgroup and the empty directories the runtime created in
//! the other hierarchies once every process is dead.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

mod engine;
pub(crate) mod rootless;
mod runtime;
#[cfg(test)]
mod tests;

use engine::{engine_argv, Engine, EngineCgroups, EngineInput, PodmanStorage};
pub use runtime::{report_all as container_runtimes, RuntimeReport};

use super::oci::{
    docker_seccomp_profile, existing, oci_spec, HostIds, OciInput, OciMounts, OciResources,
    OciRlimit, OciSeccomp, ScratchBinds,
};
use super::{tier0_layers, Backend, PlanContext, Probe};
use crate::error::Error;
use crate::layer::{IsolationLevel, Layer};
use crate::sandbox::rootfs::{default_etc_files, default_system_ro};
use crate::spec::{Confinement, HiddenFile, StartEvidence, WrapFile, WrapSpec};
use runtime::RuntimeKind;

/// The hostname inside every container.
pub const CONTAINER_HOSTNAME: &str = "airlock";
/// The host uid/gid that the container's root maps to while a rootful runtime sets it up:
/// never host root, never the program's own id.
pub const CONTAINER_ROOT_HOST_ID: u32 = 100_000;
const CONTAINER_ROOT: HostIds = HostIds {
    uid: CONTAINER_ROOT_HOST_ID,
    gid: CONTAINER_ROOT_HOST_ID,
};
/// Where the cgroup filesystem lives.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// An OCI runtime binary this backend can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OciRuntime {
    Runc,
    Crun,
}

/// The container backend, for one `[container] runtime` choice (`auto` by default).
#[derive(Debug, Clone, Copy, Default)]
pub struct ContainerBackend {
    runtime: crate::policy::ContainerRuntime,
}

impl ContainerBackend {
    /// The backend as a policy with this runtime choice would use it.
    pub fn with_runtime(runtime: crate::policy::ContainerRuntime) -> ContainerBackend {
        ContainerBackend { runtime }
    }
}

impl Backend for ContainerBackend {
    fn name(&self) -> &'static str {
        "container"
    }

    fn level(&self) -> IsolationLevel {
        IsolationLevel::Container
    }

    fn probe(&self) -> Probe {
        let mut probe = self.quick_probe();
        // Runtimes the choice passes over, so `--container-runtime NAME` failures are foreseen.
        if probe.available {
            for problem in runtime::report_all().into_iter().filter_map(|r| r.problem) {
                if !probe.problems.contains(&problem) {
                    probe.problems.push(problem);
                }
            }
        }
        probe
    }

    fn quick_probe(&self) -> Probe {
        let mut problems = Vec::new();
        let runtime = runtime::resolve(self.runtime);
        if let Err(problem) = &runtime {
            problems.push(problem.clone());
        }
        if runtime.is_ok() && rootless::is_rootless() {
            problems.push(rootless::ROOTLESS_NOTE.into());
        }
        Probe {
            available: runtime.is_ok(),
            layers: container_layers(false, true),
            problems,
        }
    }

    fn plan(&self, ctx: &PlanContext) -> Result<Confinement, Error> {
        let found = runtime::resolve(ctx.policy.container.runtime).map_err(|reason| {
            Error::BackendUnavailable {
                backend: "container".into(),
                reason,
            }
        })?;
        let mut wrap = match found.kind {
            RuntimeKind::Runc => plan_oci(ctx, OciRuntime::Runc, &found.binary),
            RuntimeKind::Crun => plan_oci(ctx, OciRuntime::Crun, &found.binary),
            RuntimeKind::Podman => plan_podman(ctx, &found.binary),
            RuntimeKind::Docker => plan_docker(ctx, &found.binary),
        };
        wrap.details.push(format!(
            "container: runtime {} ({})",
            found.kind.name(),
            found.binary.display()
        ));
        Ok(Confinement::Wrapped(wrap))
    }
}

/// runc or crun driven directly with a bundle; rootless when airlock runs without root (see
/// [`rootless`]).
fn plan_oci(ctx: &PlanContext, runtime: OciRuntime, binary: &Path) -> WrapSpec {
    let run = OciRun {
        runtime,
        rootless: rootless::is_rootless(),
        crun_workaround: runtime == OciRuntime::Crun && crun_host() == CrunHost::Workaround,
    };
    let bundle = Bundle::new(ctx);
    let (input, cgroup_dirs) = run.input(ctx, &bundle);
    let mut files = bundle.skeleton_files(&input);
    files.push(bundle.config_file(&input));
    // crun manages no cgroup when the run's own (or none at all) must hold the container.
    let cgroup_manager = runtime == OciRuntime::Runc || (ctx.cgroup.is_none() && !run.rootless);
    let tool_argv = run.argv(binary, &bundle, ctx.run_id, cgroup_manager);
    let hybrid = match run.crun_workaround {
        true => crun_hybrid_workaround(tool_argv, &bundle, &mut files, ctx, run.rootless),
        false => HybridWorkaround::none(tool_argv),
    };
    let notes = match run.rootless {
        true => vec![rootless::ROOTLESS_NOTE.into()],
        false => Vec::new(),
    };
    WrapSpec {
        tool_argv: hybrid.tool_argv,
        files,
        keep_root: true,
        no_new_privs: true,
        layers: container_layers(ctx.policy.has_network(), ctx.sandbox_owns_workdir()),
        argv_in_files: true,
        rlimits_by_tool: true,
        notes,
        details: hybrid.details,
        cleanup_dirs: cgroup_dirs,
        hidden_files: hybrid.hidden_files,
        start_evidence: Some(StartEvidence {
            tool: run.name().into(),
            pid_file: bundle.dir.join("pid"),
            failure_log: None,
        }),
        ..WrapSpec::default()
    }
}

/// How one runc or crun run is driven.
struct OciRun {
    runtime: OciRuntime,
    /// airlock runs without root (see [`rootless`]).
    rootless: bool,
    /// crun runs behind [`crun_hybrid_workaround`].
    crun_workaround: bool,
}

impl OciRun {
    fn name(&self) -> &'static str {
        match self.runtime {
            OciRuntime::Runc => "runc",
            OciRuntime::Crun => "crun",
        }
    }

    /// The bundle's input, and the cgroup directories the runtime may leave behind.
    fn input(&self, ctx: &PlanContext, bundle: &Bundle) -> (OciInput, Vec<PathBuf>) {
        let mut input = bundle.oci_input(ctx);
        input.resources.pids = Some(ctx.policy.limits.processes);
        input.seccomp = Some(OciSeccomp {
            allow_network: ctx.policy.has_network(),
            allow_clone3: false,
        });
        input.user_namespace = Some(CONTAINER_ROOT);
        let mut cgroup_dirs = runtime_cgroup_dirs(ctx);
        if self.rootless {
            // crun in the workaround's user namespace sees the caller as root there.
            let root = match self.crun_workaround {
                true => HostIds { uid: 0, gid: 0 },
                false => rootless::caller_ids(),
            };
            rootless::adapt_input(&mut input, ctx.policy, root);
            cgroup_dirs.clear();
        }
        // crun deletes its container's cgroup by freezing it first: with crun itself inside
        // the run's cgroup (runc's `--keep` has no crun equivalent) it would freeze itself for
        // good, and a child cgroup would hide OOM kills from the run's (cgroup v1 counts them
        // only where the victim lives). So crun manages no cgroup at all: the container stays
        // in the run's cgroup, whose limits the init set and whose usage, OOM kills and kill
        // it reads.
        if self.runtime == OciRuntime::Crun && input.cgroups_path.is_some() {
            input.cgroups_path = None;
            input.resources = OciResources::default();
            cgroup_dirs.clear();
        }
        input.argv = die_with_runtime(&input.argv);
        (input, cgroup_dirs)
    }

    /// `runc|crun [global options] run [options] ID`, with a pid file that shows whether the
    /// program was started.
    fn argv(&self, binary: &Path, bundle: &Bundle, run_id: &str, cgroups: bool) -> Vec<String> {
        let path = |name: &str| bundle.dir.join(name).display().to_string();
        let mut argv = vec![binary.display().to_string(), "--root".into(), path("state")];
        if !cgroups {
            argv.push("--cgroup-manager=disabled".into());
        }
        if self.runtime == OciRuntime::Runc {
            // runc logs its failed attempt to remove a busy cgroup; keep that off the
            // program's stderr.
            argv.extend(["--log".to_string(), path("runtime.log")]);
            if self.rootless {
                argv.extend(["--rootless".to_string(), "true".into()]);
            }
        }
        argv.push("run".into());
        if self.runtime == OciRuntime::Runc {
            // Not crun: it has no such option (and keeps nothing it could lose).
            argv.push("--keep".into());
        }
        argv.extend([
            "--pid-file".to_string(),
            path("pid"),
            "--bundle".into(),
            bundle.dir.display().to_string(),
            container_id(run_id),
        ]);
        argv
    }
}

/// `podman run --rootfs` on the bundle's skeleton, with podman's state inside the run directory.
///
/// cgroups: with crun, the container gets no cgroup of its own (`--cgroups=disabled`) and
/// stays in the run's cgroup with podman and conmon, so the run's limits, accounting, OOM
/// detection and kill cover it exactly and no cgroup directory is left behind. With runc
/// (which cannot run without a cgroup) the container's cgroup is `libpod-<id>` beneath the
/// run's, with the policy's limits set on it: accounted and OOM-reported through the run's
/// cgroup too, but a run killed before podman cleans up leaves that empty directory (and so
/// the run's) behind, since its id is podman's random one.
fn plan_podman(ctx: &PlanContext, podman: &Path) -> WrapSpec {
    let bundle = Bundle::new(ctx);
    let mut oci = bundle.oci_input(ctx);
    let capped = bind_scratch_mounts(ctx, &mut oci.mounts) && ctx.sandbox_owns_workdir();
    oci.resources.pids = Some(ctx.policy.limits.processes);
    oci.user_namespace = Some(CONTAINER_ROOT);
    let mut files = bundle.skeleton_files(&oci);
    files.extend(podman_mountpoints(&bundle.rootfs));
    let seccomp = bundle.dir.join("seccomp.json");
    files.push(seccomp_file(&seccomp, ctx));
    let runc = find_binary("runc");
    let crun = find_binary("crun");
    let (oci_runtime, cgroups) = match (&crun, &runc, ctx.cgroup.is_some()) {
        (Some(crun), _, true) => (Some(crun.clone()), EngineCgroups::Inherit),
        (_, Some(runc), _) => (
            Some(runc.clone()),
            EngineCgroups::Own {
                parent: cgroups_path(ctx),
            },
        ),
        (crun, None, _) => (crun.clone(), EngineCgroups::Own { parent: None }),
    };
    let own_cgroup = matches!(cgroups, EngineCgroups::Own { .. });
    // podman refuses a runroot longer than 50 bytes (conmon's sockets live there).
    let podman_dir = ctx.run_dir;
    let input = EngineInput {
        engine: Engine::Podman,
        binary: podman.to_path_buf(),
        name: container_id(ctx.run_id),
        identity_files: identity_bind_list(&bundle.rootfs),
        oci,
        seccomp_profile: Some(seccomp),
        cgroups,
        storage: Some(PodmanStorage {
            root: podman_dir.join("pr"),
            runroot: podman_dir.join("pu"),
            tmpdir: podman_dir.join("pt"),
        }),
        oci_runtime: oci_runtime.clone(),
        nproc: nproc_limit(),
        pid_file: Some(bundle.dir.join("pid")),
        self_destruct_after: None,
    };
    let argv = engine_argv(&input);
    let uses_crun = oci_runtime.as_deref() == crun.as_deref() && crun.is_some();
    let hybrid = if uses_crun && crun_host() == CrunHost::Workaround {
        crun_hybrid_workaround(argv, &bundle, &mut files, ctx, false)
    } else {
        HybridWorkaround::none(argv)
    };
    let mut details = hybrid.details;
    if let Some(runtime) = &oci_runtime {
        details.push(format!("container: podman drives {}", runtime.display()));
    }
    let mut cleanup_dirs = Vec::new();
    if own_cgroup {
        cleanup_dirs.extend(runtime_cgroup_dirs(ctx).iter().map(|d| d.join("conmon")));
        cleanup_dirs.extend(runtime_cgroup_dirs(ctx));
    }
    WrapSpec {
        tool_argv: hybrid.tool_argv,
        hidden_files: hybrid.hidden_files,
        files,
        keep_root: true,
        no_new_privs: true,
        layers: container_layers(ctx.policy.has_network(), capped),
        argv_in_files: true,
        rlimits_by_tool: true,
        // podman's own threads would count against the limit when the container has its own.
        no_cgroup_pids_limit: own_cgroup,
        details,
        cleanup_dirs,
        // conmon daemonizes: only a guard that outlives the init stops it (and the container).
        guard_tool_tree: true,
        start_evidence: Some(StartEvidence {
            tool: "podman".into(),
            pid_file: bundle.dir.join("pid"),
            failure_log: None,
        }),
        ..WrapSpec::default()
    }
}

/// `docker run` from the empty image. The container is dockerd's child, outside the init's
/// process tree and cgroup: the init stops it only through the client (which forwards
/// signals and removes it), and the container kills its own program once the run's wall
/// time and grace have passed, in case the client was killed first.
fn plan_docker(ctx: &PlanContext, docker: &Path) -> WrapSpec {
    let bundle = Bundle::new(ctx);
    let mut oci = bundle.oci_input(ctx);
    oci.resources.pids = Some(ctx.policy.limits.processes);
    let mut files = bundle.skeleton_files(&oci);
    let seccomp = bundle.dir.join("seccomp.json");
    files.push(seccomp_file(&seccomp, ctx));
    let limits = &ctx.policy.limits;
    let input = EngineInput {
        engine: Engine::Docker,
        binary: docker.to_path_buf(),
        name: container_id(ctx.run_id),
        identity_files: identity_bind_list(&bundle.rootfs),
        oci,
        seccomp_profile: Some(seccomp),
        cgroups: EngineCgroups::Own { parent: None },
        storage: None,
        oci_runtime: None,
        nproc: nproc_limit(),
        pid_file: None,
        self_destruct_after: Some((limits.wall_time.0 + limits.grace.0).as_secs() + 1),
    };
    let script = engine::docker_script(docker, &engine_argv(&input));
    let mut layers = container_layers(ctx.policy.has_network(), false);
    // Docker maps users only daemon-wide (userns-remap), never per container.
    layers.retain(|l| *l != Layer::UserNs);
    WrapSpec {
        tool_argv: vec!["/bin/sh".into(), "-c".into(), script],
        files,
        keep_root: true,
        no_new_privs: true,
        layers,
        argv_in_files: true,
        rlimits_by_tool: true,
        notes: vec!["container: docker runs the container outside airlock's cgroup: memory, CPU and OOM are enforced by the engine but not accounted in the result".into()],
        served_by_daemon: true,
        ..WrapSpec::default()
    }
}

/// Mountpoints of podman's own mounts (`/sys`, `/run/.containerenv`): the runtime works as
/// the user namespace's root, which may not create anything in the root-owned skeleton.
fn podman_mountpoints(rootfs: &Path) -> Vec<WrapFile> {
    let dir = |name: &str| WrapFile {
        path: dir_marker(&rootfs.join(name)),
        contents: Vec::new(),
        mode: 0o755,
    };
    vec![
        dir("sys"),
        dir("run"),
        dir("var"),
        WrapFile {
            path: rootfs.join("run/.containerenv"),
            contents: Vec::new(),
            mode: 0o444,
        },
    ]
}

/// airlock's seccomp policy in the Docker/podman profile format.
fn seccomp_file(path: &Path, ctx: &PlanContext) -> WrapFile {
    let profile = docker_seccomp_profile(&OciSeccomp {
        allow_network: ctx.policy.has_network(),
        allow_clone3: false,
    });
    WrapFile {
        path: path.to_path_buf(),
        contents: serde_json::to_vec_pretty(&profile).unwrap_or_default(),
        mode: 0o644,
    }
}

/// The generated identity files, bound over the engines' own `/etc/hosts` and user entries.
fn identity_bind_list(rootfs: &Path) -> Vec<(PathBuf, PathBuf)> {
    IDENTITY_FILES
        .iter()
        .map(|name| (rootfs.join("etc").join(name), Path::new("/etc").join(name)))
        .collect()
}

const IDENTITY_FILES: [&str; 4] = ["passwd", "group", "hosts", "hostname"];

/// The container's RLIMIT_NPROC: our own hard limit, capped where podman caps its own before
/// it starts the runtime (raising needs CAP_SYS_RESOURCE; the pids limit is the cgroup's job).
fn nproc_limit() -> u64 {
    use nix::sys::resource::{getrlimit, Resource};
    const PODMAN_NPROC_CAP: u64 = 32_768;
    getrlimit(Resource::RLIMIT_NPROC)
        .map(|(_, hard)| hard)
        .unwrap_or(PODMAN_NPROC_CAP)
        .min(PODMAN_NPROC_CAP)
}

/// The layers the container gives on top of Tier 0. Every writable area is a size- and
/// inode-capped tmpfs when the workdir is the sandbox's own (runc and crun; the engines bind
/// the workdir, and podman 4.3 refuses `nr_inodes`).
/// Binds the init's capped tmpfs mounts (its in-memory run directory) as the workdir, `/tmp`
/// and `/dev/shm`, for tools whose own tmpfs has no inode cap (runsc's ignores `nr_inodes`,
/// podman 4 refuses it): every file is then created on the host tmpfs, whose caps hold. True
/// when the run has them.
pub(crate) fn bind_scratch_mounts(ctx: &PlanContext, mounts: &mut OciMounts) -> bool {
    let Some(scratch) = ctx.scratch else {
        return false;
    };
    let (tmp, shm) = (ctx.run_dir.join("tmp"), ctx.run_dir.join("shm"));
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

fn container_layers(host_network: bool, owns_workdir: bool) -> Vec<Layer> {
    let mut layers = tier0_layers();
    layers.extend(Layer::NAMESPACES_BUT_NET);
    layers.extend([Layer::Rootfs, Layer::CapsDropped, Layer::Seccomp]);
    if !host_network {
        layers.push(Layer::NetNs);
    }
    if owns_workdir {
        layers.extend([Layer::DiskQuota, Layer::InodeQuota]);
    }
    layers
}

/// An executable named `name` in the usual system directories (not the caller's PATH, which
/// may be a user-writable shim).
pub(crate) fn find_binary(name: &str) -> Option<PathBuf> {
    [
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
        "/usr/local/sbin",
        "/usr/local/bin",
    ]
    .iter()
    .map(|dir| Path::new(dir).join(name))
    .find(|path| {
        std::fs::metadata(path)
            .map(|m| m.is_file())
            .unwrap_or(false)
    })
}

/// A container id unique to the run.
pub(crate) fn container_id(run_id: &str) -> String {
    format!("airlock-{run_id}")
}

/// The run's cgroup directories in every hierarchy (the run's first, then the shared parent):
/// the runtime also creates them in hierarchies airlock itself does not use.
pub(crate) fn runtime_cgroup_dirs(ctx: &PlanContext) -> Vec<PathBuf> {
    let Some(path) = cgroups_path(ctx) else {
        return Vec::new();
    };
    let hierarchies: Vec<PathBuf> = std::fs::read_dir(CGROUP_ROOT)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    // Only the run's own directories: the shared `airlock` parent stays, because removing it
    // when it looks empty races with another run's runc creating its cgroup beneath it (runc
    // does not retry, and the run fails). The parent is infrastructure, like /run/airlock.
    let run = path.trim_start_matches('/');
    hierarchies.iter().map(|h| h.join(run)).collect()
}

/// The run's own cgroup, as an absolute path inside every hierarchy.
pub(crate) fn cgroups_path(ctx: &PlanContext) -> Option<String> {
    let request = ctx.cgroup?;
    Some(format!(
        "/{}/{}",
        request.config.parent.trim_matches('/'),
        request.run_id
    ))
}

/// How crun can run on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CrunHost {
    /// As it is.
    Plain,
    /// crun 1.8 refuses a hybrid cgroup layout whose v2 mount offers any controller: it runs
    /// behind [`crun_hybrid_workaround`].
    Workaround,
    /// Not at all, for this reason (with the fix).
    Unusable(String),
}

pub(crate) fn crun_host() -> CrunHost {
    let controllers = Path::new(CGROUP_ROOT).join("unified/cgroup.controllers");
    let hybrid = std::fs::read_to_string(controllers)
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false);
    match (hybrid, find_binary("unshare")) {
        (false, _) => CrunHost::Plain,
        (true, Some(_)) => CrunHost::Workaround,
        (true, None) => CrunHost::Unusable("crun 1.8 refuses this host's hybrid cgroups (a cgroup v2 mount that offers controllers), and hiding them needs `unshare`: install util-linux, or use --container-runtime runc".into()),
    }
}

/// The tool's argv and what hides the v2 controller list from crun.
struct HybridWorkaround {
    tool_argv: Vec<String>,
    hidden_files: Vec<HiddenFile>,
    details: Vec<String>,
}

impl HybridWorkaround {
    fn none(tool_argv: Vec<String>) -> HybridWorkaround {
        HybridWorkaround {
            tool_argv,
            hidden_files: Vec::new(),
            details: Vec::new(),
        }
    }
}

/// Hides the controller list so crun uses v1 like runc. With an in-memory run directory the
/// init covers it in its own mount namespace (one bind mount); otherwise the argv does, with
/// `unshare`, `sh` and `mount` (about 2.3 ms of three more execs per run).
fn crun_hybrid_workaround(
    tool_argv: Vec<String>,
    bundle: &Bundle,
    files: &mut Vec<WrapFile>,
    ctx: &PlanContext,
    rootless: bool,
) -> HybridWorkaround {
    let empty = bundle.dir.join("empty");
    files.push(WrapFile {
        path: empty.clone(),
        contents: Vec::new(),
        mode: 0o444,
    });
    let hidden = vec![HiddenFile {
        target: Path::new(CGROUP_ROOT).join("unified/cgroup.controllers"),
        empty,
    }];
    if ctx.scratch.is_some() && !rootless {
        return HybridWorkaround {
            tool_argv,
            hidden_files: hidden,
            details: vec!["container: crun runs with the v2 controller list hidden in the init's own mount namespace (hybrid cgroups)".into()],
        };
    }
    let Some(tool_argv) = hide_files_with_unshare(tool_argv.clone(), &hidden, rootless) else {
        return HybridWorkaround::none(tool_argv);
    };
    let note = match rootless {
        false => "container: crun runs with the v2 controller list hidden in a private mount namespace (hybrid cgroups)",
        true => "container: crun runs with the v2 controller list hidden in a private mount namespace, inside a user namespace that maps the caller to root (hybrid cgroups, no root)",
    };
    HybridWorkaround {
        tool_argv,
        hidden_files: Vec::new(),
        details: vec![note.into()],
    }
}

/// `tool_argv` started by `unshare` in a private mount namespace where a shell first covers
/// each hidden file: for a tool started outside airlock's init. Root can mount there directly;
/// `rootless` first enters a user namespace that maps the caller to root. `None` without
/// `unshare`.
pub fn hide_files_with_unshare(
    tool_argv: Vec<String>,
    hidden: &[HiddenFile],
    rootless: bool,
) -> Option<Vec<String>> {
    let unshare = find_binary("unshare")?;
    let covers: Vec<String> = hidden
        .iter()
        .map(|file| {
            format!(
                "mount --bind -o ro {} {} && ",
                shell_quote(&file.empty.display().to_string()),
                shell_quote(&file.target.display().to_string())
            )
        })
        .collect();
    let quoted: Vec<String> = tool_argv.iter().map(|a| shell_quote(a)).collect();
    let script = format!("{}exec {}", covers.concat(), quoted.join(" "));
    let mut argv = vec![unshare.display().to_string()];
    if rootless {
        argv.extend(["--user".to_string(), "--map-root-user".into()]);
    }
    argv.extend(
        ["-m", "--propagation", "private", "/bin/sh", "-c"]
            .map(String::from)
            .into_iter()
            .chain([script]),
    );
    Some(argv)
}

fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

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
        let (uid, gid) = super::native::sandbox_ids(policy);
        let mut files_ro: Vec<(PathBuf, PathBuf)> = existing(&default_etc_files())
            .into_iter()
            .map(|p| (p.clone(), p))
            .collect();
        if policy.has_network() && Path::new("/etc/resolv.conf").exists() {
            files_ro.push(("/etc/resolv.conf".into(), "/etc/resolv.conf".into()));
        }
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
                read_only: policy.filesystem.read_only.clone(),
                read_write: policy.filesystem.read_write.clone(),
                workdir: ctx.workdir.to_path_buf(),
                workdir_tmpfs: ctx.sandbox_owns_workdir(),
                tmp_bytes: limits.disk.0,
                tmp_files: limits.files,
                shm_bytes: super::shm_caps(limits).0,
                exec_writable: policy.filesystem.exec_writable,
                scratch_binds: None,
            },
            host_network: policy.has_network(),
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

    pub fn config_file(&self, input: &OciInput) -> WrapFile {
        let json = serde_json::to_vec_pretty(&oci_spec(input)).unwrap_or_default();
        WrapFile {
            path: self.dir.join("config.json"),
            contents: json,
            mode: 0o600,
        }
    }

    /// The root's skeleton: identity files and a mountpoint for every mount, made in advance so
    /// that a runtime working as an unprivileged container root never needs to create them.
    pub fn skeleton_files(&self, input: &OciInput) -> Vec<WrapFile> {
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
            files.push(WrapFile {
                path: dir_marker(&self.rootfs.join(relative(&dir))),
                contents: Vec::new(),
                mode,
            });
        }
        files.extend(plain_files.into_iter().map(|f| WrapFile {
            path: self.rootfs.join(relative(&f)),
            contents: Vec::new(),
            mode: 0o444,
        }));
        files
    }
}

/// A directory entry for the init: a path ending in `/` is created as a directory.
fn dir_marker(path: &Path) -> PathBuf {
    let mut bytes = path.as_os_str().as_bytes().to_vec();
    bytes.push(b'/');
    PathBuf::from(std::ffi::OsStr::from_bytes(&bytes))
}

fn relative(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

/// passwd, group, hosts and hostname naming only the sandbox user and host.
fn identity_files(rootfs: &Path, input: &OciInput) -> Vec<WrapFile> {
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
    .map(|(path, contents)| WrapFile {
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

/// A container outlives a killed `runc run` by design; ours must not outlive the init that
/// watches it. The container's first process is a child of `runc run` (which dies with the
/// init), so a parent-death signal on it takes the whole container PID namespace down.
/// `setpriv` comes from the host's /usr, which every bundle binds read-only.
fn die_with_runtime(argv: &[String]) -> Vec<String> {
    const SETPRIV: &str = "/usr/bin/setpriv";
    if !std::path::Path::new(SETPRIV).exists() {
        return argv.to_vec();
    }
    let mut wrapped: Vec<String> = [SETPRIV, "--pdeathsig", "KILL", "--"]
        .map(String::from)
        .to_vec();
    wrapped.extend(argv.iter().cloned());
    wrapped
}

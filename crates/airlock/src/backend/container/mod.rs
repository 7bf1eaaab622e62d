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

//!
//! One file per way of starting the container: [`oci_runtime`] (runc and crun with a bundle),
//! [`podman`] and [`docker`] (the engines' CLIs, argv from [`engine`]), with the bundle they
//! share in [`bundle`] and crun's hybrid-cgroup workaround in [`crun_hybrid`].

use std::path::{Path, PathBuf};

mod bundle;
mod crun_hybrid;
mod docker;
mod engine;
mod oci_runtime;
mod podman;
pub(crate) mod rootless;
mod runtime;

pub(crate) use bundle::{bind_scratch_mounts, rlimits, Bundle};
pub use crun_hybrid::hide_files_with_unshare;
pub use runtime::{report_all as container_runtimes, RuntimeReport};

use super::oci::{HostIds, OciMounts};
use super::{tier0_layers, Backend, PlanContext, Probe};
use crate::error::Error;
use crate::layer::{IsolationLevel, Layer};
use crate::policy::Policy;
use crate::rundir::RunFile;
use crate::spec::{Confinement, GitBind, WrapStep};
use runtime::RuntimeKind;

/// The fewest processes runc and podman start a container with: Go programs whose own threads
/// count against the run's pids limit while they set it up (runc failed below 15 on a 2-core
/// host). crun is C and needs no more than the policy's minimum; Docker's daemon runs outside
/// the run's cgroup.
const GO_RUNTIME_MIN_PROCESSES: u64 = 16;

fn check_processes(policy: &Policy, kind: RuntimeKind) -> Result<(), Error> {
    let processes = policy.limits.processes;
    let go = matches!(kind, RuntimeKind::Runc | RuntimeKind::Podman);
    if !go || processes >= GO_RUNTIME_MIN_PROCESSES {
        return Ok(());
    }
    Err(Error::Invalid(crate::policy::InvalidValue {
        key: "limits.processes",
        value: processes.to_string(),
        allowed: format!(
            "at least {GO_RUNTIME_MIN_PROCESSES} with {}: its own threads count against the \
             limit while it starts the container (or use --container-runtime crun)",
            kind.name()
        ),
    }))
}

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
            layers: {
                let mut layers = container_layers(false, true);
                layers.push(Layer::GitReadOnly);
                layers
            },
            problems,
            notes: Vec::new(),
        }
    }

    /// Docker's daemon builds the container from host paths in its own mount namespace.
    fn builds_in_init_mount_namespace(&self, policy: &Policy) -> bool {
        runtime::resolve(policy.container.runtime)
            .is_ok_and(|found| found.kind != RuntimeKind::Docker)
    }

    fn plan(&self, ctx: &PlanContext) -> Result<Confinement, Error> {
        let found = runtime::resolve(ctx.policy.container.runtime).map_err(|reason| {
            Error::BackendUnavailable {
                backend: "container".into(),
                reason,
            }
        })?;
        check_processes(ctx.policy, found.kind)?;
        let mut wrap = match found.kind {
            RuntimeKind::Runc => oci_runtime::plan(ctx, OciRuntime::Runc, &found.binary)?,
            RuntimeKind::Crun => oci_runtime::plan(ctx, OciRuntime::Crun, &found.binary)?,
            RuntimeKind::Podman => podman::plan(ctx, &found.binary)?,
            RuntimeKind::Docker => docker::plan(ctx, &found.binary)?,
        };
        wrap.layers.extend(super::git_layer(ctx));
        wrap.details.push(format!(
            "container: runtime {} ({})",
            found.kind.name(),
            found.binary.display()
        ));
        Ok(Confinement::Wrapped(wrap))
    }
}

/// The layers the container gives on top of Tier 0. Every writable area is a size- and
/// inode-capped tmpfs when the workdir is the sandbox's own (runc and crun; the engines bind
/// the workdir, and podman 4.3 refuses `nr_inodes`).
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

/// The steps every tool driven with an OCI bundle (or an engine's equivalent) shares: write
/// its files, keep root for the rootful set-up (the tool runs the program unprivileged), let
/// the tool apply the program's rlimits, and no_new_privs; then protect_git's binds (see
/// [`GitBinds`]).
pub(crate) fn bundle_steps(files: Vec<RunFile>, git: GitBinds) -> Vec<WrapStep> {
    let mut steps: Vec<WrapStep> = files.into_iter().map(WrapStep::WriteFile).collect();
    steps.extend([
        WrapStep::KeepRoot,
        WrapStep::RlimitsByTool,
        WrapStep::NoNewPrivs,
    ]);
    steps.extend(git.step);
    steps
}

/// How protect_git's binds reach a tool that binds by path. Given the workspace's paths,
/// the tool would open each source by path after the walk: another program sharing the
/// workspace could swap a directory on the way for a symlink meanwhile and have a host
/// directory bound into the sandbox. So where the tool runs in the init's mount namespace
/// with root (runc, crun, podman, runsc), the init binds each object from a checked
/// descriptor onto a staging path of the run directory, in a private mount namespace of the
/// tool's ([`WrapStep::BindFoundPrivately`]), and the tool binds from there. Only where it
/// cannot (docker's daemon mounts in its own namespace; a runtime without root may not
/// mount) the tool binds by path and what was found is checked just before it starts
/// ([`WrapStep::CheckFound`], which narrows the race but does not close it).
pub(crate) struct GitBinds {
    step: Option<WrapStep>,
}

impl GitBinds {
    /// The binds for this run: staged by the init in `staging` when given (and the tool's
    /// mounts then take their sources from there), else checked just before the tool starts.
    pub(crate) fn of(
        ctx: &PlanContext,
        mounts: &mut OciMounts,
        staging: Option<PathBuf>,
    ) -> GitBinds {
        if ctx.git_found.is_empty() {
            return GitBinds { step: None };
        }
        let Some(staging) = staging else {
            return GitBinds {
                step: Some(WrapStep::CheckFound(ctx.git_found.to_vec())),
            };
        };
        let binds: Vec<GitBind> = ctx
            .git_found
            .iter()
            .map(|found| GitBind {
                found: found.clone(),
                read_only: ctx.git_read_only.contains(&found.path),
            })
            .collect();
        mounts.git_sources = binds
            .iter()
            .enumerate()
            .map(|(n, bind)| (bind.found.path.clone(), staging.join(n.to_string())))
            .collect();
        GitBinds {
            step: Some(WrapStep::BindFoundPrivately { binds, staging }),
        }
    }
}

/// Where the init stages protect_git's objects for a tool (see [`GitBinds`]): in the
/// bundle's directory, unless the init runs without root and may not mount.
pub(crate) fn git_staging(bundle: &Bundle, rootless: bool) -> Option<PathBuf> {
    (!rootless).then(|| bundle.dir.join("git"))
}

/// A gated run under a tool that keeps root: the init makes the network namespace (owned by
/// the host's user namespace, so the container's root cannot change it), hands the gate its
/// sockets and starts the tool inside it; the tool makes no network namespace of its own.
/// Without root the runtimes build their own user namespace, and one made by the init would
/// have to own the network namespace they join: not done, so such runs are refused.
pub(crate) fn gate_for_rootful_tool(
    ctx: &PlanContext,
    backend: &str,
    tool: &str,
    rootless: bool,
) -> Result<Option<WrapStep>, Error> {
    if ctx.egress.is_none() {
        return Ok(None);
    }
    if rootless {
        return Err(super::network_unsupported(
            backend,
            ctx.policy,
            format!("{tool} without root builds its own user namespace, which airlock cannot hand a prepared network namespace: run airlock as root, or use the native or bwrap backend"),
        ));
    }
    Ok(Some(WrapStep::EgressNamespace {
        own_user_namespace: false,
    }))
}

/// The network layers of a container plan: its own namespace unless the host's network, and
/// the egress gate when the run is gated.
pub(crate) fn with_gate_layer(mut layers: Vec<Layer>, ctx: &PlanContext) -> Vec<Layer> {
    if ctx.egress.is_some() {
        layers.push(Layer::EgressGate);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confine::found::Found;

    fn found(path: &str) -> Found {
        Found {
            path: path.into(),
            root: "/ws".into(),
            dev: 1,
            ino: 2,
        }
    }

    fn ctx<'a>(
        policy: &'a Policy,
        read_only: &'a [PathBuf],
        pinned: &'a [PathBuf],
        found: &'a [Found],
    ) -> PlanContext<'a> {
        PlanContext {
            git_read_only: read_only,
            git_pinned: pinned,
            git_found: found,
            ..PlanContext::for_test(policy, Path::new("/ws"), Path::new("/run/airlock/r1"))
        }
    }

    fn mounts(read_only: &[PathBuf], pinned: &[PathBuf]) -> OciMounts {
        OciMounts {
            git_read_only: read_only.to_vec(),
            git_pinned: pinned.to_vec(),
            ..OciMounts::default()
        }
    }

    #[test]
    fn the_tool_binds_what_was_found_from_where_the_init_staged_it() {
        let policy = crate::policy::builtin("untrusted").expect("built-in profile");
        let read_only = vec![PathBuf::from("/ws/nest/lib/.git")];
        let pinned = vec![PathBuf::from("/ws/nest"), PathBuf::from("/ws/nest/lib")];
        let listed: Vec<Found> = read_only
            .iter()
            .chain(&pinned)
            .map(|p| found(p.to_str().unwrap()))
            .collect();
        let ctx = ctx(&policy, &read_only, &pinned, &listed);
        let mut tool = mounts(&read_only, &pinned);
        let git = GitBinds::of(&ctx, &mut tool, Some("/run/r1/git".into()));
        let Some(WrapStep::BindFoundPrivately { binds, staging }) = git.step else {
            panic!("nothing staged by the init");
        };
        assert_eq!(staging, Path::new("/run/r1/git"));
        let flags: Vec<bool> = binds.iter().map(|b| b.read_only).collect();
        assert_eq!(flags, [true, false, false]);
        assert_eq!(
            tool.git_source(Path::new("/ws/nest/lib/.git")),
            Path::new("/run/r1/git/0")
        );
        assert_eq!(
            tool.git_source(Path::new("/ws/nest/lib")),
            Path::new("/run/r1/git/2")
        );
    }

    #[test]
    fn a_tool_the_init_cannot_prepare_binds_by_path_after_a_last_check() {
        let policy = crate::policy::builtin("untrusted").expect("built-in profile");
        let read_only = vec![PathBuf::from("/ws/.git")];
        let listed = vec![found("/ws/.git")];
        let ctx = ctx(&policy, &read_only, &[], &listed);
        let mut tool = mounts(&read_only, &[]);
        let git = GitBinds::of(&ctx, &mut tool, None);
        assert_eq!(
            tool.git_source(Path::new("/ws/.git")),
            Path::new("/ws/.git")
        );
        assert_eq!(git.step, Some(WrapStep::CheckFound(listed)));
    }
}

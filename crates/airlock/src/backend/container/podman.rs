//! `podman run --rootfs` on the bundle's skeleton (see [`plan`]).

use std::path::Path;

use super::bundle::{bind_scratch_mounts, dir_marker, identity_bind_list, seccomp_file, Bundle};
use super::crun_hybrid::{crun_host, crun_hybrid_workaround, CrunHost, HybridWorkaround};
use super::engine::{engine_argv, nproc_limit, Engine, EngineCgroups, EngineInput, PodmanStorage};
use super::{
    bundle_steps, cgroups_path, container_id, container_layers, find_binary, gate_for_rootful_tool,
    runtime_cgroup_dirs, with_gate_layer, CONTAINER_ROOT,
};
use crate::backend::PlanContext;
use crate::error::Error;
use crate::rundir::RunFile;
use crate::spec::{StartEvidence, WrapSpec, WrapStep};

/// `podman run --rootfs` on the bundle's skeleton, with podman's state inside the run directory.
///
/// cgroups: with crun, the container gets no cgroup of its own (`--cgroups=disabled`) and
/// stays in the run's cgroup with podman and conmon, so the run's limits, accounting, OOM
/// detection and kill cover it exactly and no cgroup directory is left behind. With runc
/// (which cannot run without a cgroup) the container's cgroup is `libpod-<id>` beneath the
/// run's, with the policy's limits set on it: accounted and OOM-reported through the run's
/// cgroup too, but a run killed before podman cleans up leaves that empty directory (and so
/// the run's) behind, since its id is podman's random one.
pub(super) fn plan(ctx: &PlanContext, podman: &Path) -> Result<WrapSpec, Error> {
    let gate = gate_for_rootful_tool(ctx, "container", "podman", super::rootless::is_rootless())?;
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
        identity_files: identity_bind_list(&bundle.rootfs, &oci),
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
    let mut steps = bundle_steps(files, ctx.git_found);
    steps.extend(gate);
    steps.extend(hybrid.hidden_files.into_iter().map(WrapStep::HideFile));
    if own_cgroup {
        // podman's own threads would count against the limit when the container has its own.
        steps.push(WrapStep::NoCgroupPidsLimit);
    }
    // conmon daemonizes: only a guard that outlives the init stops it (and the container).
    steps.push(WrapStep::GuardToolTree);
    steps.push(WrapStep::CheckStarted(StartEvidence {
        tool: "podman".into(),
        pid_file: bundle.dir.join("pid"),
        failure_log: None,
    }));
    if own_cgroup {
        let dirs = runtime_cgroup_dirs(ctx);
        steps.extend(dirs.iter().map(|d| WrapStep::RemoveDir(d.join("conmon"))));
        steps.extend(dirs.into_iter().map(WrapStep::RemoveDir));
    }
    Ok(WrapSpec {
        wrapper_argv: hybrid.wrapper_argv,
        argv_in_files: true,
        layers: with_gate_layer(container_layers(ctx.policy.has_network(), capped), ctx),
        notes: Vec::new(),
        details,
        steps,
    })
}

/// Mountpoints of podman's own mounts (`/sys`, `/run/.containerenv`): the runtime works as
/// the user namespace's root, which may not create anything in the root-owned skeleton.
fn podman_mountpoints(rootfs: &Path) -> Vec<RunFile> {
    let dir = |name: &str| RunFile {
        path: dir_marker(&rootfs.join(name)),
        contents: Vec::new(),
        mode: 0o755,
    };
    vec![
        dir("sys"),
        dir("run"),
        dir("var"),
        RunFile {
            path: rootfs.join("run/.containerenv"),
            contents: Vec::new(),
            mode: 0o444,
        },
    ]
}

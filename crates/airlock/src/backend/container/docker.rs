//! `docker run` from the empty image (see [`plan`]).

use std::path::Path;

use super::bundle::{identity_bind_list, seccomp_file, Bundle};
use super::engine::{self, engine_argv, nproc_limit, Engine, EngineCgroups, EngineInput};
use super::{bundle_steps, container_id, container_layers};
use crate::backend::PlanContext;
use crate::error::Error;
use crate::layer::Layer;
use crate::spec::WrapSpec;

/// `docker run` from the empty image. The container is dockerd's child, outside the init's
/// process tree and cgroup: the init stops it only through the client (which forwards
/// signals and removes it), and the container kills its own program once the run's wall
/// time and grace have passed, in case the client was killed first.
pub(super) fn plan(ctx: &PlanContext, docker: &Path) -> Result<WrapSpec, Error> {
    if ctx.egress.is_some() {
        return Err(crate::backend::network_unsupported(
            "container",
            ctx.policy,
            "docker's daemon creates the container's network namespace itself and cannot be handed the egress gate's: choose runc, crun or podman (--container-runtime), or the native backend",
        ));
    }
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
        identity_files: identity_bind_list(&bundle.rootfs, &oci),
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
    Ok(WrapSpec {
        wrapper_argv: vec!["/bin/sh".into(), "-c".into(), script],
        argv_in_files: true,
        layers,
        notes: vec!["container: docker runs the container outside airlock's cgroup: memory, CPU and OOM are enforced by the engine but not accounted in the result".into()],
        details: Vec::new(),
        steps: bundle_steps(files, ctx.git_found),
    })
}

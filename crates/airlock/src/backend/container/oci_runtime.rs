//! runc and crun driven directly: the init writes an OCI bundle into the run directory and
//! execs `runc|crun run` on it; rootless when airlock runs without root (see
//! [`super::rootless`]).

use std::path::{Path, PathBuf};

use super::bundle::Bundle;
use super::crun_hybrid::{crun_host, crun_hybrid_workaround, CrunHost, HybridWorkaround};
use super::{
    bundle_steps, container_id, container_layers, gate_for_rootful_tool, git_staging, rootless,
    runtime_cgroup_dirs, with_gate_layer, GitBinds, OciRuntime, CONTAINER_ROOT,
};
use crate::backend::oci::{HostIds, OciInput, OciResources, OciSeccomp};
use crate::backend::PlanContext;
use crate::error::Error;
use crate::spec::{StartEvidence, WrapSpec, WrapStep};

/// runc or crun driven directly with a bundle; rootless when airlock runs without root (see
/// [`rootless`]).
pub(super) fn plan(
    ctx: &PlanContext,
    runtime: OciRuntime,
    binary: &Path,
) -> Result<WrapSpec, Error> {
    let run = OciRun {
        runtime,
        rootless: rootless::is_rootless(),
        crun_workaround: runtime == OciRuntime::Crun && crun_host() == CrunHost::Workaround,
    };
    let gate = gate_for_rootful_tool(ctx, "container", run.name(), run.rootless)?;
    let bundle = Bundle::new(ctx);
    let (mut input, cgroup_dirs) = run.input(ctx, &bundle);
    let git = GitBinds::of(ctx, &mut input.mounts, git_staging(&bundle, run.rootless));
    let mut files = bundle.skeleton_files(&input);
    files.push(bundle.config_file(&input));
    // crun manages no cgroup when the run's own (or none at all) must hold the container.
    let cgroup_manager = runtime == OciRuntime::Runc || (ctx.cgroup.is_none() && !run.rootless);
    let wrapper_argv = run.argv(binary, &bundle, ctx.run_id, cgroup_manager);
    let hybrid = match run.crun_workaround {
        true => crun_hybrid_workaround(wrapper_argv, &bundle, &mut files, ctx, run.rootless),
        false => HybridWorkaround::none(wrapper_argv),
    };
    let notes = match run.rootless {
        true => vec![rootless::ROOTLESS_NOTE.into()],
        false => Vec::new(),
    };
    let mut steps = bundle_steps(files, git);
    steps.extend(run.scratch_in_bundle(&bundle));
    steps.extend(gate);
    steps.extend(hybrid.hidden_files.into_iter().map(WrapStep::HideFile));
    steps.push(WrapStep::CheckStarted(StartEvidence {
        tool: run.name().into(),
        pid_file: bundle.dir.join("pid"),
        failure_log: None,
    }));
    steps.extend(cgroup_dirs.into_iter().map(WrapStep::RemoveDir));
    let layers = container_layers(ctx.policy.has_network(), ctx.sandbox_owns_workdir());
    Ok(WrapSpec {
        wrapper_argv: hybrid.wrapper_argv,
        argv_in_files: true,
        layers: with_gate_layer(layers, ctx),
        notes,
        details: hybrid.details,
        steps,
    })
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
            allow_inet: ctx.egress.is_some(),
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

    /// crun (1.8) makes a temporary copy of itself in `$_LIBCONTAINER_STATEDIR`, or in /tmp
    /// when that is unset, and unlinks it moments later: a crun killed in between (a run
    /// cancelled or timed out as it starts) left an empty `/tmp/crun.XXXXXX` on the host.
    /// In the bundle, the file goes with the run directory.
    fn scratch_in_bundle(&self, bundle: &Bundle) -> Option<WrapStep> {
        (self.runtime == OciRuntime::Crun).then(|| WrapStep::ToolEnv {
            name: "_LIBCONTAINER_STATEDIR".into(),
            value: bundle.dir.display().to_string(),
        })
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

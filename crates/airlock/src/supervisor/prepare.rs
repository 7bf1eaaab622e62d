//! Preparing a run: policy + command → the [`Plan`] the caller can read and the [`InitSpec`]
//! the init executes. The one place where the backend is chosen, the run directory planned and
//! missing layers judged.

use std::path::{Path, PathBuf};

use super::builder::{Command, SandboxOptions};
use super::describe;
use super::judge::{host_limit_warnings, judge, Judged};
use super::staged;
use super::{gitguard, workspace};
use crate::backend::{self, Backend, PlanContext};
use crate::confine::cgroup::CgroupLimits;
use crate::confine::idmap::MappedPath;
use crate::confine::Credentials;
use crate::error::Error;
use crate::net::{self, EgressPlan};
use crate::plan::Plan;
use crate::policy::{BackendChoice, Policy};
use crate::rundir::{self, MemoryScratch};
use crate::spec::{CgroupRequest, Confinement, InitSpec, SpecLimits};

/// What preparing may change on the host besides computing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effects {
    /// Nothing: a plan for the caller to read. The runtime directory is not created (a tool's
    /// version is remembered there only when it already exists).
    None,
    /// A run: the runtime directory is created and abandoned runs are swept first.
    Run,
}

/// A run ready to start: the plan, the init's spec and what the supervisor itself warns about.
pub(super) struct Prepared {
    pub plan: Plan,
    pub spec: InitSpec,
    /// Warnings the supervisor adds to the result (the init reports the others).
    pub warnings: Vec<String>,
    /// The egress gate the supervisor starts once the sandbox hands it its sockets.
    pub egress: Option<EgressPlan>,
    /// What the supervisor checks for planted git metadata after the run.
    pub git_watch: Option<gitguard::PlantWatch>,
    /// The run's id, which every name of the run's own in `spec` contains (its directory,
    /// workdir, cgroup): a warm pool's plan is filled in for each sandbox by replacing it
    /// (`super::standby_plan`).
    pub run_id: String,
}

/// Prepares a run, refusing a plan whose required layers are missing unless the caller
/// accepted degradation.
pub(super) fn prepare_to_run(command: &Command) -> Result<Prepared, Error> {
    let prepared = prepare(command, Effects::Run)?;
    match prepared.plan.refusal() {
        Some(refused) => Err(refused),
        None => Ok(prepared),
    }
}

/// Every decision about a run, in order; only `effects` decides what is touched on the host.
pub(super) fn prepare(command: &Command, effects: Effects) -> Result<Prepared, Error> {
    check_command(command)?;
    let policy = &command.sandbox.policy;
    let selected = backend::select(policy)?;
    let network = Network::of(policy)?;
    let mut placement = Placement::of(command, selected.backend.as_ref(), effects)?;
    let plan_env = program_env(
        policy,
        &command.env,
        &placement.workdir.path,
        None,
        &network.env,
    );
    // Checked here, once for every backend (Tier 0 included), not in each backend's plan.
    backend::check_policy_paths(policy)?;
    let mut confinement = selected
        .backend
        .plan(&placement.context(command, &plan_env, &network))?;
    staged::check(command, &confinement, placement.workdir.fresh)?;
    leave_unused_run_dir_unmade(placement.scratch.as_mut(), &mut confinement);
    let mut judged = judge(command, &selected, &confinement, &placement, &network);
    let workdir_kind = placement.workdir.kind(command);
    judged.warnings.extend(host_limit_warnings(policy));
    let git_details = gitguard::details(&placement.git);
    let git_watch = gitguard::PlantWatch::of(
        policy,
        &placement.workdir,
        &placement.git,
        &placement.run_id,
        &judged.layers,
    );
    let run_id = placement.run_id.clone();
    let spec = init_spec(command, placement, confinement, &judged, &network);
    let planned = describe::PlannedNetwork {
        egress: network.egress.as_ref(),
        unix_sockets: network.unix_sockets.clone(),
    };
    let mut plan = describe::plan(&selected, &spec, &judged, &workdir_kind, policy, planned);
    plan.details.extend(workspace::details(&spec.mapped));
    plan.details.extend(git_details);
    Ok(Prepared {
        plan,
        spec,
        warnings: judged.warnings,
        egress: network.egress,
        git_watch,
        run_id,
    })
}

/// The network of a run, decided before the backend plans it: the egress gate's plan (network
/// `allowlist` or `report`), the host Unix sockets the program sees, and the proxy variables
/// of its environment.
pub(super) struct Network {
    pub egress: Option<EgressPlan>,
    pub unix_sockets: Vec<PathBuf>,
    env: Vec<(String, String)>,
}

impl Network {
    fn of(policy: &Policy) -> Result<Network, Error> {
        let egress = net::plan(policy)?;
        Ok(Network {
            unix_sockets: net::unix_sockets(policy)?,
            env: net::program_env(egress.as_ref()),
            egress,
        })
    }
}

/// Where a run is placed on the host, decided before the backend plans it.
pub(super) struct Placement {
    run_id: String,
    run_dir: PathBuf,
    /// Where the host's tools' versions are remembered (the runtime directory, if it exists).
    tool_cache: Option<PathBuf>,
    pub workdir: Workdir,
    cgroup: Option<CgroupRequest>,
    pub scratch: Option<MemoryScratch>,
    /// The caller's paths shown to the program as its own (see [`workspace`]).
    pub mapped: Vec<MappedPath>,
    /// Git metadata in the caller's writable paths, bound read-only (see [`gitguard`]).
    pub git: gitguard::GitMounts,
}

impl Placement {
    fn of(command: &Command, backend: &dyn Backend, effects: Effects) -> Result<Placement, Error> {
        let run_id = rundir::new_run_id();
        let runtime = runtime_dir(&command.sandbox.options, effects)?;
        let run_dir = runtime.join(&run_id);
        let workdir = Workdir::of(command, &run_dir)?;
        let scratch = plan_scratch(command, backend, &runtime, &run_dir, &workdir);
        let mapped = workspace::mapped_paths(command, backend, &workdir)?;
        let git = gitguard::protected_paths(&command.sandbox.policy, &workdir)?;
        Ok(Placement {
            mapped,
            git,
            cgroup: cgroup_request(command, &run_id),
            tool_cache: runtime.exists().then_some(runtime),
            run_id,
            run_dir,
            workdir,
            scratch,
        })
    }

    /// The facts a backend plans from.
    fn context<'a>(
        &'a self,
        command: &'a Command,
        env: &'a [(String, String)],
        network: &'a Network,
    ) -> PlanContext<'a> {
        PlanContext {
            policy: &command.sandbox.policy,
            workdir: &self.workdir.path,
            fresh_workdir: self.workdir.fresh,
            keep: command.keep,
            tty: command.tty,
            run_dir: &self.run_dir,
            tool_cache: self.tool_cache.as_deref(),
            run_id: &self.run_id,
            argv: &command.argv,
            env,
            cgroup: self.cgroup.as_ref(),
            scratch: self.scratch.as_ref(),
            egress: network.egress.as_ref().map(|e| &e.sandbox),
            unix_sockets: &network.unix_sockets,
            git_read_only: &self.git.read_only,
            git_pinned: &self.git.pinned,
            git_found: &self.git.found,
        }
    }
}

/// The init's spec: the plan's confinement, placement and judged layers, in the init's terms.
fn init_spec(
    command: &Command,
    placement: Placement,
    confinement: Confinement,
    judged: &Judged,
    network: &Network,
) -> InitSpec {
    let (policy, options) = (&command.sandbox.policy, &command.sandbox.options);
    let tier0 = matches!(confinement, Confinement::Tier0);
    let workdir = placement.workdir;
    let tmpdir = tier0.then(|| rundir::tmp_dir(&placement.run_dir));
    InitSpec {
        argv: command.argv.clone(),
        env: program_env(policy, &command.env, &workdir.path, tmpdir, &network.env),
        run_dir: placement.run_dir,
        workdir_is_callers: !workdir.fresh,
        workdir: workdir.path,
        keep: command.keep,
        limits: spec_limits(policy),
        credentials: credentials(policy),
        cgroup: placement.cgroup,
        confinement,
        require: judged.require.clone(),
        allow_degraded: options.allow_degraded,
        accepted_missing: judged.accepted(),
        tty: command.tty,
        scratch: placement.scratch,
        files: command.files.clone(),
        warm: false,
        warm_prestart: false,
        shared_root: false,
        mapped: placement.mapped,
        egress: network.egress.as_ref().map(|e| e.sandbox.clone()),
    }
}

/// Refusals that need no plan: a command that cannot be represented, a program the policy
/// does not allow, and backend `none` without its opt-in.
pub(super) fn check_command(command: &Command) -> Result<(), Error> {
    if command.argv.iter().any(|a| a.contains('\0')) {
        return Err(Error::Command(
            "arguments must not contain NUL bytes".into(),
        ));
    }
    let sandbox = &command.sandbox;
    let policy = &sandbox.policy;
    if !policy.allows_program(&command.argv[0]) {
        let allowed = policy.allowed_programs.clone().unwrap_or_default();
        return Err(Error::ProgramNotAllowed {
            program: command.argv[0].clone(),
            allowed,
        });
    }
    let options = &sandbox.options;
    let opted_in = options.dev || options.trusted_profile || policy.origin().allows_no_boundary();
    if policy.backend == BackendChoice::None && !opted_in {
        return Err(Error::UnisolatedRefused);
    }
    Ok(())
}

/// The runtime directory: created for a run (after which abandoned runs are swept), only
/// resolved for a plan.
pub(super) fn runtime_dir(options: &SandboxOptions, effects: Effects) -> Result<PathBuf, Error> {
    let configured = options.runtime_dir.as_deref();
    if effects == Effects::None {
        return rundir::existing_runtime_dir(configured);
    }
    let runtime = rundir::runtime_dir(configured)?;
    // The cgroups too when this run uses none: the sweep it may win stands for every run of
    // this runtime directory, and a partial one would leave their abandoned cgroups for good.
    let cgroup_config = options.cgroup.clone().unwrap_or_default();
    rundir::sweep_if_due(&runtime, Some(&cgroup_config));
    Ok(runtime)
}

/// The program's working directory.
pub(super) struct Workdir {
    pub path: PathBuf,
    /// Made for this run (not the caller's own directory).
    pub fresh: bool,
    /// Made for this run and gone with it: the sandbox owns it.
    pub owned: bool,
}

impl Workdir {
    fn of(command: &Command, run_dir: &Path) -> Result<Workdir, Error> {
        let (path, fresh) = match &command.sandbox.policy.filesystem.workdir {
            Some(dir) => (callers_workdir(dir)?, false),
            None => (rundir::fresh_workdir(run_dir), true),
        };
        Ok(Workdir {
            path,
            fresh,
            owned: fresh && !command.keep,
        })
    }

    fn kind(&self, command: &Command) -> crate::plan::WorkdirKind {
        use crate::plan::WorkdirKind;
        match (self.fresh, command.keep) {
            (false, _) => WorkdirKind::Callers,
            (true, true) => WorkdirKind::Kept,
            (true, false) => WorkdirKind::Fresh,
        }
    }
}

fn callers_workdir(dir: &Path) -> Result<PathBuf, Error> {
    let absolute = std::path::absolute(dir)
        .map_err(|e| Error::io(format!("cannot resolve workdir {}", dir.display()), e))?;
    if !absolute.is_dir() {
        return Err(Error::BadPath {
            what: "workdir",
            path: absolute,
            reason: "is not an existing directory; create it first".into(),
        });
    }
    Ok(absolute)
}

/// The run directory in memory, decided once: when nothing of it must outlive the run, the
/// caller did not ask for disk, airlock can mount, and the backend's boundary is built in the
/// init's mount namespace (Docker's daemon builds it in its own, from host paths). Its capped
/// mounts only where the boundary does not mount its own.
fn plan_scratch(
    command: &Command,
    backend: &dyn Backend,
    runtime: &Path,
    run_dir: &Path,
    workdir: &Workdir,
) -> Option<MemoryScratch> {
    let (policy, options) = (&command.sandbox.policy, &command.sandbox.options);
    let wanted = !command.keep && !options.disk_run_dir && crate::confine::caps::can_mount();
    (wanted && backend.builds_in_init_mount_namespace(policy)).then(|| {
        let mut scratch = rundir::memory_scratch(
            policy,
            runtime,
            run_dir,
            workdir.owned.then_some(workdir.path.as_path()),
            credentials(policy),
        );
        // Capped mounts the program would never see cost the init three mounts and their
        // teardown: the boundary's own are the program's.
        if backend.mounts_own_scratch() {
            scratch.mounts.clear();
        }
        scratch
    })
}

/// The native sandbox uses nothing of an in-memory run directory (its PID 1 mounts its own
/// scratch): where nothing it binds reaches the runtime directory, which the init's cover
/// would hide, the init makes none and needs no mount namespace of its own. Its PID 1 checks
/// again what each source resolves to (a symlink may change meanwhile).
fn leave_unused_run_dir_unmade(scratch: Option<&mut MemoryScratch>, confinement: &mut Confinement) {
    let (Some(scratch), Confinement::Native(native)) = (scratch, confinement) else {
        return;
    };
    if !scratch.mounts.is_empty() || native.rootfs.reaches(&scratch.runtime_dir) {
        return;
    }
    scratch.needed = false;
    native.rootfs.unreachable = Some(scratch.runtime_dir.clone());
}

/// The program's complete environment: HOME, the egress gate's proxy variables, the policy's
/// passed and fixed variables, then the command's own.
pub(super) fn program_env(
    policy: &Policy,
    extra: &[(String, String)],
    workdir: &Path,
    tmpdir: Option<PathBuf>,
    network: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env = std::collections::BTreeMap::new();
    env.insert("HOME".to_string(), workdir.display().to_string());
    if let Some(tmp) = tmpdir {
        env.insert("TMPDIR".to_string(), tmp.display().to_string());
    }
    env.extend(network.iter().cloned());
    for name in &policy.env.pass {
        if let Ok(value) = std::env::var(name) {
            env.insert(name.clone(), value);
        }
    }
    env.extend(policy.env.set.clone());
    env.extend(extra.iter().cloned());
    env.into_iter().collect()
}

fn spec_limits(policy: &Policy) -> SpecLimits {
    let l = &policy.limits;
    SpecLimits {
        memory_bytes: l.memory.0,
        cpu_time: l.cpu_time.0,
        wall_time: l.wall_time.0,
        grace: l.grace.0,
        processes: l.processes,
        open_files: l.open_files,
        file_size_bytes: l.file_size.0,
        disk_bytes: l.disk.0,
        files: l.files,
        cpus: l.cpus,
    }
}

/// The unprivileged identity the program runs as, when airlock is root and drops it.
pub(super) fn credentials(policy: &Policy) -> Option<Credentials> {
    (nix::unistd::geteuid().is_root() && policy.user.drop_root).then_some(Credentials {
        uid: policy.user.uid,
        gid: policy.user.gid,
    })
}

fn cgroup_request(command: &Command, run_id: &str) -> Option<CgroupRequest> {
    let config = command.sandbox.options.cgroup_config()?;
    let l = &command.sandbox.policy.limits;
    let limits = CgroupLimits {
        memory_bytes: Some(l.memory.0),
        pids: Some(l.processes),
        cpu_millicores: (l.cpus > 0.0).then(|| (l.cpus * 1000.0).round() as u64),
    };
    Some(CgroupRequest {
        config,
        run_id: run_id.to_string(),
        limits,
    })
}

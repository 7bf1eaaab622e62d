//! Backends: how the program is started inside a boundary. A backend only plans the
//! confinement the init applies; the supervisor owns timeouts, output and accounting.

mod bwrap;
mod container;
mod gvisor;
mod native;
mod none;
pub mod oci;
mod wrapper_version;

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::layer::{IsolationLevel, Layer};
use crate::policy::{BackendChoice, ContainerRuntime, Policy};
use crate::spec::Confinement;

pub use bwrap::BwrapBackend;
pub use container::{container_runtimes, hide_files_with_unshare, ContainerBackend, RuntimeReport};
pub use gvisor::GvisorBackend;
pub use native::NativeBackend;
pub use none::NoneBackend;

/// What a backend can enforce on this host.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// Whether the backend can run at all.
    pub available: bool,
    /// Layers it would put in force here.
    pub layers: Vec<Layer>,
    /// Why a layer or the backend is missing, each with the fix.
    pub problems: Vec<String>,
    /// Facts about how the backend will run here (gVisor's platform), nothing to fix.
    pub notes: Vec<String>,
}

/// Facts about one run that a backend plans around.
#[derive(Debug, Clone)]
pub struct PlanContext<'a> {
    pub policy: &'a Policy,
    /// The program's working directory (same path inside and outside).
    pub workdir: &'a Path,
    /// The per-run directory the init creates and removes; files a tool reads (bwrap's /etc
    /// files, an OCI bundle) go here.
    pub run_dir: &'a Path,
    /// Where facts about the host's tools are remembered between runs (the runtime
    /// directory); `None` to ask the tools every time.
    pub tool_cache: Option<&'a Path>,
    /// The workdir is created for this run (not the caller's).
    pub fresh_workdir: bool,
    /// The workdir must survive the run, so it cannot live only in the sandbox.
    pub keep: bool,
    pub tty: bool,
    /// The run's id (unique, usable as a container id).
    pub run_id: &'a str,
    /// The program's argv, for backends that put it in a config file.
    pub argv: &'a [String],
    /// The program's environment (without Tier 0's TMPDIR), for the same backends.
    pub env: &'a [(String, String)],
    /// The cgroup the init creates for the run, if any.
    pub cgroup: Option<&'a crate::spec::CgroupRequest>,
    /// The run directory will be in memory with these capped tmpfs mounts, for a tool that
    /// runs in the init's mount namespace; a backend may bind them instead of asking its tool
    /// for a tmpfs it cannot cap.
    pub scratch: Option<&'a crate::rundir::MemoryScratch>,
    /// What the sandbox's network namespace must hold for the egress gate (network
    /// `allowlist` or `report`): a backend gives the program a namespace of its own prepared
    /// by the init (`InitSpec::egress`), or refuses with [`Error::NetworkUnsupported`].
    pub egress: Option<&'a airlock_egress::SandboxPlan>,
    /// The host Unix sockets (`network.unix_sockets`, expanded) the program sees at the same
    /// path, read-only binds (connecting to a socket needs no write access to its mount).
    pub unix_sockets: &'a [PathBuf],
    /// Git metadata in the caller's writable paths (`filesystem.protect_git`), parents first:
    /// a backend that gives the program a writable caller path binds each of these read-only
    /// on top of it and reports [`Layer::GitReadOnly`].
    pub git_read_only: &'a [PathBuf],
    /// Directories between a writable path and a nested git directory, parents first: bound
    /// onto themselves as writable as the path holding them (before `git_read_only`), so
    /// that the program cannot rename them and plant a repository in their place.
    pub git_pinned: &'a [PathBuf],
    /// Which object each of `git_read_only` and `git_pinned` was when found: a backend binds
    /// that object (from a descriptor opened again below the writable root and checked),
    /// never whatever the path names by the time it mounts.
    pub git_found: &'a [crate::confine::found::Found],
}

#[cfg(test)]
impl<'a> PlanContext<'a> {
    /// A run of `policy` in the caller's `workdir` with nothing else set (run id `r1`), for
    /// plan tests to change what they test with struct update syntax.
    pub(crate) fn for_test(policy: &'a Policy, workdir: &'a Path, run_dir: &'a Path) -> Self {
        PlanContext {
            policy,
            workdir,
            run_dir,
            tool_cache: None,
            fresh_workdir: false,
            keep: false,
            tty: false,
            run_id: "r1",
            argv: &[],
            env: &[],
            cgroup: None,
            scratch: None,
            egress: None,
            unix_sockets: &[],
            git_read_only: &[],
            git_pinned: &[],
            git_found: &[],
        }
    }
}

/// [`Layer::GitReadOnly`] when the policy asks for it: a backend that binds
/// [`PlanContext::git_read_only`] over its writable mounts reports it with this.
pub(crate) fn git_layer(ctx: &PlanContext) -> Option<Layer> {
    (ctx.policy.filesystem.protect_git == crate::policy::GitProtection::ReadOnly)
        .then_some(Layer::GitReadOnly)
}

/// The TCP ports a gated sandbox may connect to (Landlock's port rules): the gate's
/// captured ports, its DNS stub (over TCP) and the proxy endpoint.
pub(crate) fn gate_ports(plan: &airlock_egress::SandboxPlan) -> Vec<u16> {
    let mut ports = plan.capture_ports.clone();
    ports.extend([DNS_PORT, plan.proxy_port]);
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The port of the gate's DNS stub inside the sandbox.
const DNS_PORT: u16 = 53;

/// The generated `/etc/resolv.conf` of a sandbox whose network goes through the gate: its DNS
/// stub, which answers allowed names at once and refuses the rest at once.
pub(crate) const GATED_RESOLV_CONF: &str =
    "# airlock: the egress gate's DNS stub\nnameserver 127.0.0.1\noptions timeout:2 attempts:2\n";

/// The refusal of a gated network mode (or host Unix sockets) by a backend that cannot give
/// it, with the reason: the run never goes ahead with another network.
pub(crate) fn network_unsupported(
    backend: &str,
    policy: &Policy,
    reason: impl Into<String>,
) -> Error {
    Error::NetworkUnsupported {
        backend: backend.into(),
        mode: policy.network.mode.name().into(),
        unix_sockets: !policy.network.unix_sockets.is_empty() && !policy.network.mode.is_gated(),
        reason: reason.into(),
    }
}

impl PlanContext<'_> {
    /// The workdir exists only for this run and only inside the sandbox, so it can be a
    /// capped tmpfs like every other writable area.
    pub fn sandbox_owns_workdir(&self) -> bool {
        self.fresh_workdir && !self.keep
    }
}

/// A way to start a program inside a boundary.
pub trait Backend: Send + Sync {
    /// The name used in profiles and results.
    fn name(&self) -> &'static str;
    /// How strong the boundary is.
    fn level(&self) -> IsolationLevel;
    /// What this host supports, checked thoroughly (a trial run where one is needed): for
    /// `doctor` and for `auto` selection, which must not pick a backend that cannot start.
    fn probe(&self) -> Probe;
    /// The same answer from static facts only (is the tool installed, what would it put in
    /// force), for the check every run makes: no trial run and no tool started. A backend
    /// whose full probe is already cheap keeps this default. A run on a host where the
    /// backend turns out not to work fails at start with the tool's own message.
    fn quick_probe(&self) -> Probe {
        self.probe()
    }
    /// Whether the boundary is built in the init's mount namespace, where the run directory
    /// can be in memory. Not for a daemon that builds it from host paths in its own (Docker).
    fn builds_in_init_mount_namespace(&self, _policy: &Policy) -> bool {
        true
    }
    /// Whether the boundary mounts its own capped scratch (the program's `/tmp`, `/dev/shm`
    /// and fresh workdir), so that an in-memory run directory needs no capped mount of its
    /// own: the native sandbox's PID 1 mounts fresh ones in the root it builds and never
    /// binds the run directory's.
    fn mounts_own_scratch(&self) -> bool {
        false
    }
    /// Whether the program can work in a caller's directory that the init shows it as its
    /// own through an idmapped mount (see `confine::idmap`); why not, with the fix, if not.
    fn works_in_mapped_paths(&self, policy: &Policy) -> Result<(), String> {
        match self.builds_in_init_mount_namespace(policy) {
            true => Ok(()),
            false => Err(format!(
                "backend {} builds the sandbox in its daemon's mount namespace, where the init cannot show the directory's owner as the program's user",
                self.name()
            )),
        }
    }
    /// The confinement the init applies for this run.
    fn plan(&self, ctx: &PlanContext) -> Result<Confinement, Error>;
}

/// The backend chosen for a policy, and why.
pub struct Selected {
    pub backend: Box<dyn Backend>,
    /// Named by the policy, or what `auto` picked and passed over.
    pub reason: String,
}

/// Every backend: by level, then fastest first within a level, so `auto` can take the first
/// available one at or above `min_isolation` (container starts faster than gVisor here).
pub fn all_backends() -> Vec<Box<dyn Backend>> {
    backends_with(ContainerRuntime::Auto)
}

/// [`all_backends`], with the container backend using the policy's runtime choice.
fn backends_with(runtime: ContainerRuntime) -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(NativeBackend),
        Box::new(BwrapBackend),
        Box::new(ContainerBackend::with_runtime(runtime)),
        Box::new(GvisorBackend),
        Box::new(NoneBackend),
    ]
}

/// Picks the backend for a policy: `auto` means the fastest available one at or above
/// `min_isolation` (default `kernel`), never silently a weaker one.
pub fn select(policy: &Policy) -> Result<Selected, Error> {
    let named = |backend: Box<dyn Backend>| Selected {
        reason: format!("the policy names backend {}", backend.name()),
        backend,
    };
    match policy.backend {
        BackendChoice::Native => Ok(named(Box::new(NativeBackend))),
        BackendChoice::Bwrap => require_installed(Box::new(BwrapBackend)).map(named),
        BackendChoice::None => Ok(named(Box::new(NoneBackend))),
        BackendChoice::Gvisor => require_installed(Box::new(GvisorBackend)).map(named),
        BackendChoice::Container => require_installed(Box::new(ContainerBackend::with_runtime(
            policy.container.runtime,
        )))
        .map(named),
        BackendChoice::Auto => select_auto(
            policy.min_isolation.unwrap_or(IsolationLevel::Kernel),
            backends_with(policy.container.runtime),
        ),
    }
}

/// A backend named explicitly must be able to run here for this user (installed, and usable
/// with or without root as airlock runs); otherwise say why and how to fix it, before
/// anything starts: a tool that fails to start is not the program exiting.
fn require_installed(backend: Box<dyn Backend>) -> Result<Box<dyn Backend>, Error> {
    let probe = backend.quick_probe();
    if probe.available {
        return Ok(backend);
    }
    Err(Error::BackendUnavailable {
        backend: backend.name().into(),
        reason: probe.problems.join("; "),
    })
}

/// The weakest level at or above `min` is the fastest; `none` is never picked implicitly
/// (it needs an explicit opt-in).
fn select_auto(min: IsolationLevel, backends: Vec<Box<dyn Backend>>) -> Result<Selected, Error> {
    let mut candidates: Vec<Box<dyn Backend>> = backends
        .into_iter()
        .filter(|b| b.level() >= min && b.level() > IsolationLevel::Process)
        .collect();
    candidates.sort_by_key(|b| b.level());
    let mut reasons = Vec::new();
    for backend in candidates {
        let probe = backend.probe();
        if probe.available {
            let mut reason = format!(
                "auto: the fastest backend at level \"{}\" or above that can run here",
                level_name(min)
            );
            if !reasons.is_empty() {
                reason.push_str(&format!(" (passed over: {})", reasons.join(" | ")));
            }
            return Ok(Selected { backend, reason });
        }
        reasons.push(format!("{}: {}", backend.name(), probe.problems.join("; ")));
    }
    let level = level_name(min);
    Err(Error::BackendUnavailable {
        backend: format!("auto (min_isolation = \"{level}\")"),
        reason: if reasons.is_empty() {
            format!("no backend at level \"{level}\" or above is built into this airlock; lower min_isolation or name a backend")
        } else {
            format!(
                "no backend at level \"{level}\" or above can run here: {}",
                reasons.join(" | ")
            )
        },
    })
}

/// The name of a level as written in profiles.
pub fn level_name(level: IsolationLevel) -> String {
    crate::layer::serde_name(&level)
}

/// The Tier-0 layers every backend gets from the init.
pub(crate) fn tier0_layers() -> Vec<Layer> {
    let mut layers = vec![
        Layer::EnvScrub,
        Layer::FdClose,
        Layer::NewSession,
        Layer::Rlimits,
        Layer::Workdir,
        Layer::TreeKill,
        Layer::NoNewPrivs,
    ];
    if nix::unistd::geteuid().is_root() {
        layers.push(Layer::UidDrop);
    }
    layers
}

/// Checks that every extra path of the policy exists, naming the key and the fix otherwise.
pub(crate) fn check_policy_paths(policy: &Policy) -> Result<(), Error> {
    let fs = &policy.filesystem;
    let listed = fs
        .read_only
        .iter()
        .map(|p| ("filesystem.read_only path", p))
        .chain(
            fs.read_write
                .iter()
                .map(|p| ("filesystem.read_write path", p)),
        );
    for (what, path) in listed {
        if !path.exists() {
            return Err(Error::BadPath {
                what,
                path: PathBuf::from(path),
                reason: "does not exist; create it or remove it from the profile".into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod selection_tests {
    use super::*;

    struct Fake(&'static str, IsolationLevel, bool);

    impl Backend for Fake {
        fn name(&self) -> &'static str {
            self.0
        }
        fn level(&self) -> IsolationLevel {
            self.1
        }
        fn probe(&self) -> Probe {
            Probe {
                available: self.2,
                layers: vec![],
                problems: if self.2 {
                    vec![]
                } else {
                    vec![format!("{} missing: install it", self.0)]
                },
                notes: vec![],
            }
        }
        fn plan(&self, _ctx: &PlanContext) -> Result<Confinement, Error> {
            Ok(Confinement::Tier0)
        }
    }

    fn pick(min: IsolationLevel, backends: Vec<Fake>) -> Result<&'static str, String> {
        let boxed = backends
            .into_iter()
            .map(|b| Box::new(b) as Box<dyn Backend>)
            .collect();
        select_auto(min, boxed)
            .map(|s| s.backend.name())
            .map_err(|e| e.to_string())
    }

    use IsolationLevel::{Container, Kernel, Process, UserKernel};

    /// `BackendChoice::level`, which callers read before any backend is built, says what
    /// each backend's own `level` says.
    #[test]
    fn each_backend_has_the_level_its_choice_names() {
        for backend in all_backends() {
            let name = serde_json::Value::String(backend.name().into());
            let choice: crate::policy::BackendChoice = serde_json::from_value(name).unwrap();
            assert_eq!(choice.level(), Some(backend.level()), "{}", backend.name());
        }
    }

    #[test]
    fn the_fastest_level_at_or_above_the_minimum_wins() {
        let hosts = || {
            vec![
                Fake("gvisor", UserKernel, true),
                Fake("container", Container, true),
                Fake("native", Kernel, true),
                Fake("bwrap", Kernel, true),
            ]
        };
        assert_eq!(pick(Kernel, hosts()), Ok("native"));
        assert_eq!(pick(Container, hosts()), Ok("container"));
        assert_eq!(pick(UserKernel, hosts()), Ok("gvisor"));
    }

    #[test]
    fn bwrap_stands_in_when_native_cannot_run() {
        assert_eq!(
            pick(
                Kernel,
                vec![Fake("native", Kernel, false), Fake("bwrap", Kernel, true)]
            ),
            Ok("bwrap")
        );
    }

    #[test]
    fn a_weaker_backend_is_never_picked() {
        let err = pick(
            Container,
            vec![Fake("native", Kernel, true), Fake("none", Process, true)],
        )
        .unwrap_err();
        assert!(
            err.contains("min_isolation = \"container\"") && err.contains("lower min_isolation"),
            "{err}"
        );
        let err = pick(
            Container,
            vec![
                Fake("container", Container, false),
                Fake("native", Kernel, true),
            ],
        )
        .unwrap_err();
        assert!(err.contains("container missing: install it"), "{err}");
    }

    #[test]
    fn none_is_never_picked_implicitly() {
        let err = pick(
            Process,
            vec![Fake("native", Kernel, false), Fake("none", Process, true)],
        )
        .unwrap_err();
        assert!(err.contains("native missing"), "{err}");
    }

    #[test]
    fn the_real_list_is_ordered_by_level_then_speed() {
        let names: Vec<&str> = all_backends().iter().map(|b| b.name()).collect();
        let native = names.iter().position(|n| *n == "native").unwrap();
        let bwrap = names.iter().position(|n| *n == "bwrap").unwrap();
        assert!(native < bwrap, "{names:?}");
    }
}

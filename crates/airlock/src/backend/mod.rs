//! Backends: how the program is started inside a boundary. A backend only plans the
//! confinement the init applies; the supervisor owns timeouts, output and accounting.

mod container;
mod gvisor;
mod native;
mod none;
pub mod oci;

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::layer::{IsolationLevel, Layer};
use crate::policy::{BackendChoice, Policy};
use crate::spec::Confinement;

pub use container::ContainerBackend;
pub use gvisor::{decide_platform, GvisorBackend, KvmFacts, PlatformChoice};
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
}

/// Facts about one run that a backend plans around.
#[derive(Debug, Clone)]
pub struct PlanContext<'a> {
    pub policy: &'a Policy,
    /// The program's working directory (same path inside and outside).
    pub workdir: &'a Path,
    /// The workdir is created for this run (not the caller's).
    pub fresh_workdir: bool,
    /// The workdir must survive the run, so it cannot live only in the sandbox.
    pub keep: bool,
    pub tty: bool,
    /// The per-run directory the init creates; files a tool reads (an OCI bundle) go here.
    pub run_dir: &'a Path,
    /// The run's id (unique, usable as a container id).
    pub run_id: &'a str,
    /// The program's argv, for backends that put it in a config file.
    pub argv: &'a [String],
    /// The program's environment (without Tier 0's TMPDIR), for the same backends.
    pub env: &'a [(String, String)],
    /// The cgroup the init creates for the run, if any.
    pub cgroup: Option<&'a crate::spec::CgroupRequest>,
}

/// A way to start a program inside a boundary.
pub trait Backend: Send + Sync {
    /// The name used in profiles and results.
    fn name(&self) -> &'static str;
    /// How strong the boundary is.
    fn level(&self) -> IsolationLevel;
    /// What this host supports (cheap; cached by callers that care).
    fn probe(&self) -> Probe;
    /// The confinement the init applies for this run.
    fn plan(&self, ctx: &PlanContext) -> Result<Confinement, Error>;
}

/// Every backend in `auto`'s order of preference: native first (fast, complete layers); the
/// stronger boundaries (gvisor, then container) only when `min_isolation` rules native out.
pub fn all_backends() -> Vec<Box<dyn Backend>> {
    vec![Box::new(NativeBackend), Box::new(GvisorBackend), Box::new(ContainerBackend), Box::new(NoneBackend)]
}

/// Picks the backend for a policy: `auto` means the strongest available one at or above
/// `min_isolation`, never silently a weaker one.
pub fn select(policy: &Policy) -> Result<Box<dyn Backend>, Error> {
    match policy.backend {
        BackendChoice::Native => Ok(Box::new(NativeBackend)),
        BackendChoice::None => Ok(Box::new(NoneBackend)),
        BackendChoice::Gvisor => Ok(Box::new(GvisorBackend)),
        BackendChoice::Container => Ok(Box::new(ContainerBackend)),
        BackendChoice::Auto => select_auto(policy.min_isolation.unwrap_or(IsolationLevel::Kernel)),
    }
}

fn select_auto(min: IsolationLevel) -> Result<Box<dyn Backend>, Error> {
    let mut reasons = Vec::new();
    for backend in all_backends().into_iter().filter(|b| b.level() >= min) {
        let probe = backend.probe();
        if probe.available {
            return Ok(backend);
        }
        reasons.push(format!("{}: {}", backend.name(), probe.problems.join("; ")));
    }
    Err(Error::BackendUnavailable {
        backend: format!("auto (min_isolation {min:?})"),
        reason: if reasons.is_empty() { "no backend reaches that level yet".into() } else { reasons.join(" | ") },
    })
}

/// The Tier-0 layers every backend gets from the init.
pub(crate) fn tier0_layers() -> Vec<Layer> {
    let mut layers = vec![Layer::EnvScrub, Layer::FdClose, Layer::NewSession, Layer::Rlimits, Layer::Workdir, Layer::TreeKill, Layer::NoNewPrivs];
    if nix::unistd::geteuid().is_root() {
        layers.push(Layer::UidDrop);
    }
    layers
}

/// Checks that every extra path of the policy exists, naming the key and the fix otherwise.
pub(crate) fn check_policy_paths(policy: &Policy) -> Result<(), Error> {
    let fs = &policy.filesystem;
    let listed = fs.read_only.iter().map(|p| ("filesystem.read_only path", p)).chain(fs.read_write.iter().map(|p| ("filesystem.read_write path", p)));
    for (what, path) in listed {
        if !path.exists() {
            return Err(Error::BadPath { what, path: PathBuf::from(path), reason: "does not exist; create it or remove it from the profile".into() });
        }
    }
    Ok(())
}

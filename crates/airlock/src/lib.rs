//! airlock: run untrusted code behind an OS-enforced boundary with real resource limits.
//!
//! A [`Policy`] (usually from a TOML profile) says what a run may see, touch and consume. A
//! [`Sandbox`] turns a command plus that policy into a supervised run whose outcome is one
//! [`RunResult`]. Timeouts, limits and crashes are results, not errors: an `Err` always means
//! the sandbox could not be set up or was misused.
//!
//! ```no_run
//! # fn main() -> Result<(), airlock::Error> {
//! let policy = airlock::policy::load_profile("untrusted")?;
//! let result = airlock::Sandbox::new(policy)?
//!     .command("/usr/bin/python3")
//!     .arg("-")
//!     .stdin("print(6 * 7)")
//!     .run()?;
//! assert_eq!(result.stdout.as_deref(), Some("42\n"));
//! # Ok(()) }
//! ```
//!
//! Each run has an init process that sets up the boundary and watches the program. A
//! single-threaded caller forks it; a caller with threads executes an init program instead
//! (`airlock __init`): by default the current executable, so a program embedding this crate
//! must call [`init::init_main`] first thing in `main` when its first argument is
//! [`init::INIT_ARG`] — or point [`SandboxOptions::init_program`] (or `AIRLOCK_INIT`) at the
//! `airlock` binary.

//! # The crate's rooms
//!
//! The API is the root and six modules: [`policy`] (what a run may do), [`plan`] (what a run
//! will be), [`result`] (what it was), [`error`], [`layer`] and [`cancel`] (one token to
//! cancel a run, a worker job, a tool call or a place in the pool's queue). Features built on that API each
//! have a module: [`call`] (Python function calls), [`worker`] (jobs with staged inputs and
//! outputs), [`pool`] (admission and scheduling), [`warm`] (sandboxes prepared ahead of their
//! runs), [`interp`] (code strings by interpreter),
//! [`doctor`] (what this host supports), [`init`] (the entry point of the init process) and
//! [`macos`] (Seatbelt); [`network`] names what the egress gate reports. Everything else is
//! the machinery of a run (the egress gate's host side among it, see
//! `docs/architecture.md`), private; [`internals`] lends a few of its pieces to airlock's own
//! tests, examples and tools, without any compatibility promise.

// The API.
pub mod cancel;
pub mod error;
pub mod layer;
pub mod plan;
pub mod policy;
pub mod result;

// Features built on the API.
#[cfg(target_os = "linux")]
pub mod call;
#[cfg(target_os = "linux")]
pub mod doctor;
#[cfg(target_os = "linux")]
pub mod init;
pub mod interp;
pub mod macos;
pub mod pool;
#[cfg(target_os = "linux")]
pub mod warm;
pub mod worker;
#[cfg(target_os = "linux")]
pub mod zygote;

// The import rules of docs/architecture.md, checked.
#[cfg(test)]
mod architecture;

// The machinery of a run: policy → prepare (supervisor) → launch → init → result.
#[cfg(target_os = "linux")]
mod backend;
#[cfg(target_os = "linux")]
mod confine;
#[cfg(test)]
mod golden;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
mod net;
#[cfg(target_os = "linux")]
mod rundir;
#[cfg(target_os = "linux")]
mod spec;
#[cfg(target_os = "linux")]
mod supervisor;

pub use cancel::{CancelRegistration, CancelToken};
#[cfg(target_os = "linux")]
pub use confine::cgroup::CgroupConfig;
pub use error::{
    Error, ErrorKind, FailureKind, PolicyError, SetupError, SetupErrorKind, SetupStep,
};
pub use layer::{IsolationLevel, Layer};
#[cfg(target_os = "linux")]
pub use linux::beneath;
pub use macos::seatbelt;
pub use network::{DecisionRecord, GateEvent, NetworkReport};
pub use plan::Plan;
pub use policy::Policy;
pub use result::{RunResult, RunStatus};
#[cfg(target_os = "linux")]
pub use supervisor::{
    Canceller, Command, InitSpawner, Input, RunEvent, RunHandle, Sandbox, SandboxOptions,
    StandaloneWrapper,
};

/// What the egress gate reports (network `allowlist` and `report`): the result's
/// [`RunResult::network`], the live [`RunEvent::Network`] decisions, and the words they use.
/// The types come from the `airlock-egress` crate, which holds the gate.
pub mod network {
    pub use airlock_egress::report::{
        Channel, Counters, Decision, DecisionRecord, GateEvent, LimitKind, NetworkReport, Protocol,
        Reason,
    };
    pub use airlock_egress::{GateMode, Limits, Resolver};
}

/// The old name of [`call`], kept for callers written before the rename.
#[cfg(target_os = "linux")]
#[doc(hidden)]
pub use call as tool;

/// Unstable: pieces of the machinery that airlock's own tests, examples and benchmark reach
/// (the root filesystem builder, the run directory's names, the types in a standalone
/// wrapper's description). Not part of the API: anything here may change in any release.
#[cfg(target_os = "linux")]
pub mod internals {
    pub use crate::confine::rootfs;
    pub use crate::confine::Credentials;
    pub use crate::rundir::{RunFile, KEPT_MARKER, SWEEP_STAMP};
}

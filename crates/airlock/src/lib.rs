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

pub mod error;
#[cfg(test)]
mod golden;
pub mod interp;
pub mod layer;
pub mod macos;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod result;
pub mod worker;

#[cfg(target_os = "linux")]
pub mod backend;
#[cfg(target_os = "linux")]
pub mod call;
/// The old name of [`call`], kept for callers written before the rename.
#[cfg(target_os = "linux")]
#[doc(hidden)]
pub use call as tool;
#[cfg(target_os = "linux")]
pub mod confine;
#[cfg(target_os = "linux")]
pub mod doctor;
#[cfg(target_os = "linux")]
pub mod init;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub mod rundir;
#[cfg(target_os = "linux")]
pub mod spec;
#[cfg(target_os = "linux")]
pub mod supervisor;

#[cfg(target_os = "linux")]
pub use confine::cgroup::CgroupConfig;
pub use error::{
    Error, ErrorKind, FailureKind, PolicyError, SetupError, SetupErrorKind, SetupStep,
};
pub use layer::{IsolationLevel, Layer};
pub use macos::seatbelt;
pub use plan::Plan;
pub use policy::Policy;
pub use result::{RunResult, RunStatus};
#[cfg(target_os = "linux")]
pub use supervisor::{
    Canceller, Command, Input, RunEvent, RunHandle, Sandbox, SandboxOptions, StandaloneWrapper,
};

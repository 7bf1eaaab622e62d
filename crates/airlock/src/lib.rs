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
//! Each run re-executes an init program (`airlock __init`): by default the current
//! executable, so a program embedding this crate must call [`init::init_main`] first thing in
//! `main` when its first argument is [`init::INIT_ARG`] — or point
//! [`SandboxOptions::init_program`] (or `AIRLOCK_INIT`) at the `airlock` binary.

pub mod error;
#[cfg(test)]
mod golden;
pub mod interp;
pub mod layer;
pub mod policy;
pub mod pool;
pub mod result;
/// macOS's Seatbelt backend: a pure SBPL generator everywhere, the runner on macOS only.
#[path = "backend/seatbelt.rs"]
pub mod seatbelt;
pub mod worker;

#[cfg(target_os = "linux")]
pub mod backend;
#[cfg(target_os = "linux")]
pub mod doctor;
#[cfg(target_os = "linux")]
pub mod init;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub mod sandbox;
#[cfg(target_os = "linux")]
pub mod spec;
#[cfg(target_os = "linux")]
pub mod supervisor;
#[cfg(target_os = "linux")]
pub mod tool;

pub use error::{Error, PolicyError};
pub use layer::{IsolationLevel, Layer};
pub use policy::Policy;
pub use result::{RunResult, RunStatus};
#[cfg(target_os = "linux")]
pub use supervisor::{Canceller, Command, Input, RunEvent, RunHandle, Sandbox, SandboxOptions};

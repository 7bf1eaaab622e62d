//! airlock: run untrusted code behind an OS-enforced boundary with real resource limits.
//!
//! The model: a [`policy::Policy`] (built from a TOML profile) says what a run may do; a
//! [`Sandbox`] turns a command plus that policy into a supervised run whose outcome is one
//! [`RunResult`] value. Timeouts, limits and crashes are results, not errors: an `Err` from this
//! crate always means the sandbox itself could not be set up or was misused.

pub mod pool;
pub mod worker;

#[cfg(target_os = "linux")]
pub mod sandbox;

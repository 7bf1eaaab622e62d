//! Interpreter zygotes: a template interpreter, started once inside a sandbox of its own with
//! its preloads imported, from which each run forks (see `docs/warm.md`).
//!
//! The template (`airlock-zygote`, which embeds CPython) never runs user code. Each run's
//! child joins a cgroup this host created for the run, creates fresh user, mount, PID, IPC,
//! UTS, cgroup and network namespaces, and applies the cold run's confinement by the cold
//! run's code (`init::zygote`): the root built from scratch with its own `/tmp` and workdir,
//! the hostname, Landlock, `no_new_privs`, no capabilities and seccomp. Its result is an
//! ordinary [`RunResult`] whose `isolation` lists the layers the child reported.
//!
//! ```no_run
//! # fn main() -> Result<(), airlock::Error> {
//! let sandbox = airlock::Sandbox::new(airlock::policy::load_profile("untrusted")?)?;
//! let zygote = sandbox.zygote(airlock::zygote::ZygoteOptions::python(&["json", "re"]))?;
//! let result = zygote.run(&airlock::zygote::ZygoteRun::code("print(6 * 7)"))?;
//! assert_eq!(result.stdout.as_deref(), Some("42\n"));
//! # Ok(()) }
//! ```

mod host;
mod pipes;
mod ready;
mod recycle;
mod run;
mod template;
mod wire;

pub use crate::linux::sys::{ForkArena, Forked};
pub use host::{Zygote, ZygoteOptions, ZygoteRun, ZygoteStats};
pub use nix::unistd::Pid;

/// The Python a template runs each request's code with (its `run(code, args, env)`), for the
/// embedding binary: the warm shim's way of running code as `-c` would, then the zygote's
/// environment and reseeding.
pub const RUNNER: &str = concat!(
    include_str!("../warm/run_code.py"),
    include_str!("runner.py")
);
pub use template::{Interpreter, Template};

//! The supervisor: the in-process half of a run, one file per step.
//!
//! ```text
//! builder   Sandbox + Command (the public API)
//!    │ plan / run / spawn
//! prepare   policy + command → Plan (read by the caller) + InitSpec (run by the init)
//!    │        backend chosen, run directory planned, missing layers judged once
//! launch    start the init (fork, or exec `airlock __init`), hand it the spec
//!    │
//! serve     one poll loop over stdin, stdout, stderr and the init's events (`run`)
//! handle    or a thread per pipe and a RunHandle (`spawn`)
//!    │
//! finish    reap the init, assemble the RunResult
//! ```

mod builder;
mod describe;
mod finish;
mod handle;
mod hints;
mod launch;
mod output;
mod prepare;
mod serve;
mod signals;
mod standalone;

use std::path::Path;

pub use crate::rundir::{
    default_runtime_dir, new_run_id, runtime_dir, sweep as sweep_abandoned_runs, KEPT_MARKER,
    SWEEP_STAMP,
};
pub use builder::{Command, Input, RunEvent, Sandbox, SandboxOptions};
pub use handle::{Canceller, RunHandle};
pub use output::{Drained, OutputSink, StreamKind};
pub use signals::CANCEL_SIGNALS;
pub use standalone::StandaloneWrapper;

use crate::policy::Policy;
use crate::rundir::MemoryScratch;

/// The in-memory run directory as a run plans it (see [`crate::rundir::memory_scratch`]).
/// Public for tools that plan a run outside the supervisor (the benchmark's same-config peers).
pub fn memory_scratch(
    policy: &Policy,
    runtime: &Path,
    run_dir: &Path,
    owned_workdir: Option<&Path>,
) -> MemoryScratch {
    crate::rundir::memory_scratch(
        policy,
        runtime,
        run_dir,
        owned_workdir,
        prepare::credentials(policy),
    )
}

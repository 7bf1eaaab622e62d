//! The supervisor: the in-process half of a run, one file per step.
//!
//! ```text
//! builder   Sandbox + Command (the public API)
//!    │ plan / run / spawn
//! prepare   policy + command → Plan (read by the caller) + InitSpec (run by the init)
//!    │        backend chosen, run directory planned, missing layers judged once
//! launch    start the init (fork, or exec `airlock __init`), hand it the spec
//!    │
//! serve     one poll loop over stdin, stdout, stderr and the init's events: in the calling
//!    │        thread (`run`), or in one thread of its own behind a RunHandle (`spawn`)
//! handle    the RunHandle: stream, cancel, wait
//!    │
//! finish    reap the init, assemble the RunResult
//! ```

mod builder;
mod cleanup;
mod describe;
mod finish;
mod gitguard;
mod handle;
mod hints;
mod input;
mod judge;
mod launch;
pub(crate) mod output;
mod prepare;
mod serve;
mod shared_root;
mod signals;
mod spawner;
mod staged;
mod standalone;
mod standby;
mod standby_gate;
mod standby_plan;
mod terminal;
mod workspace;

pub use builder::{Command, Input, RunEvent, Sandbox, SandboxOptions};
pub use handle::{Canceller, RunHandle};
pub(crate) use shared_root::SharedRoots;
pub use spawner::InitSpawner;
pub use standalone::StandaloneWrapper;
pub use standby::WARM_DETAIL;
pub(crate) use standby::{plan_zygote, Prestart, Readiness, Standby, StandbySource, ZygotePlan};
pub(crate) use standby_plan::StandbyPlans;

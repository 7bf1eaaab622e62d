//! airlock's attacks, in one place for the test suite (`crates/airlock-cli/tests/attacks`) and
//! `airlock conformance`.
//!
//! - [`catalogue()`]: every attack with its threat class, the evidence it is judged on, the
//!   layers that stop it, and how to set it up ([`Attack::prepare`]).
//! - [`program`]: the attack programs, small Python scripts compiled in as static strings and
//!   run as `python3 -B -c <text>`, so the sandbox needs nothing but an interpreter.
//! - [`scene`]: the host-side bait of each attack (secrets, victims, listeners) and its cleanup.
//! - [`harness`]: runs a [`Plan`] under any sandbox command line and collects the [`Outcome`].
//! - [`judge`]: verdicts from host-side evidence, never from what the program claims where the
//!   attack has an effect outside the sandbox.
//!
//! Linux only, and light on purpose (std, `nix`, `serde_json`): the `airlock` binary links it.

pub mod bait;
mod catalogue;
pub mod harness;
pub mod host;
pub mod judge;
pub mod plan;
pub mod program;
pub mod scene;

pub use catalogue::{catalogue, Attack, Baseline, Group, Prepare, Threat};
pub use plan::{Lifecycle, Outcome, Plan};
pub use scene::{Scene, Stage};

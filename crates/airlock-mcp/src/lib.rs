//! airlock's Model Context Protocol server: sandboxed runs, sessions and their files as MCP
//! tools, under a policy the operator chose and no tool can widen.
//!
//! The tools (see [`server::AirlockMcp`]) only translate MCP requests into calls on an
//! [`Executor`], the seam between "what the model asked for" and "how it is run":
//!
//! - [`local::LocalExecutor`] runs each request through the airlock library in this process,
//!   re-executing the lean `airlock` binary as each run's init (what `airlock-mcp` serves over
//!   stdio);
//! - the daemon (`airlockd`) implements [`Executor`] over its own queue, store and tenant
//!   ceilings and mounts the same [`server::AirlockMcp`] at `/mcp` over streamable HTTP.
//!
//! Every tool answers with one JSON object carrying a `status` (see [`report`]): a run's own
//! status (`exited`, `timeout`, `memory_limit`, ...) or a refusal (`denied` with its reason,
//! `invalid`, `not_found`, `busy`, `sandbox_error`).

#![cfg(target_os = "linux")]

pub mod executor;
pub mod local;
pub mod report;
pub mod server;
pub mod workspace;

pub use executor::{Executor, Failure, FailureKind, Program, RunRequest};
pub use local::{LocalConfig, LocalExecutor};
pub use server::AirlockMcp;

//! airlockd: airlock as a service. A thin layer over the airlock library: an HTTP API (Unix
//! socket by default, TCP and TLS when asked, API keys always), tenants with ceilings,
//! admission through the library's pool, sessions with workspaces, workers and tool calls, a
//! run store (SQLite or PostgreSQL) with an append-only audit log, metrics and a dashboard.
//!
//! Each run executes the lean `airlock` binary as its init (`SandboxOptions::init_program`),
//! never this daemon: the per-run exec stays as light as the CLI's.

pub mod api;
pub mod audit;
pub mod auth;
pub mod config;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod mcp;
pub mod metrics;
pub mod peers;
pub mod recovery;
pub mod resolve;
pub mod server;
pub mod sessions;
pub mod store;
pub mod tenant;
pub mod workspace;

//! airlock's egress gate: allowlisted network access for a sandbox whose network namespace
//! holds nothing but loopback. A leaf crate: it knows nothing of the rest of airlock.
//!
//! # How traffic leaves
//!
//! The sandbox keeps a fresh network namespace with `lo` only. Inside it,
//! [`sandbox_side::configure`] gives `lo` `local` routes for two placeholder ranges
//! (198.18.0.0/15 and 2001:2::/48) and for the allowed address ranges, and binds the gate's
//! sockets there: one listener per allowed port (dual-stack, on every local address), the DNS
//! stub on `127.0.0.1:53` and `[::1]:53`, and the proxy endpoint on 127.0.0.1. Every other
//! destination has no route (ENETUNREACH at once) or no listener (ECONNREFUSED at once).
//! The sockets travel to the gate, outside the namespace, over a socketpair
//! ([`SandboxSockets::send`] / [`SandboxSockets::receive`], `SCM_RIGHTS`); the gate's channel is
//! never a path or an abstract name the program could open.
//!
//! - DNS: an allowed name gets a placeholder address (one slot per name per run, TTL 1);
//!   anything else gets NXDOMAIN at once. Nothing is resolved or forwarded for a query.
//! - A connection to a placeholder is captured; the gate knows the name from the slot, checks
//!   the rules for name and port, ties the stream to the name (the SNI of every clear
//!   ClientHello, a second one after HelloRetryRequest included; the `Host` of every HTTP
//!   request on a kept-alive connection, with its framing checked against smuggling; missing
//!   SNI, ECH under another outer name, a CONNECT inside the stream are refused), resolves
//!   the name itself (`resolver`), refuses non-public addresses ([`address`]) and the host's
//!   own, and dials exactly the address it checked.
//! - Programs honouring proxy variables ([`env::proxy_env`]) use the proxy endpoint: HTTP
//!   CONNECT, absolute-form HTTP, SOCKS5 — the same checks, refusals said in-band.
//! - Caps per run ([`Limits`]) refuse the next connection or query, or cut the stream that
//!   crosses a byte cap; [`RunningGate::finish`] closes everything and returns the
//!   [`NetworkReport`] (one [`DecisionRecord`] per decision, NDJSON-ready; live
//!   [`GateEvent`]s through the [`EventSink`]).
//!
//! # Use
//!
//! ```no_run
//! # fn main() -> Result<(), airlock_egress::EgressError> {
//! use airlock_egress::{EgressConfig, EgressPolicy, Gate, SandboxSockets};
//! let config = EgressConfig { allow: vec!["api.example.com".into()], ..Default::default() };
//! let policy = EgressPolicy::parse(&config)?;          // typed errors name rule and fix
//! let plan = policy.sandbox_plan()?;                   // serde: ship it to the child
//! let (child_end, gate_end) = std::os::unix::net::UnixStream::pair().unwrap();
//! // In the sandbox's child, inside its new network namespace, before dropping CAP_NET_ADMIN:
//! airlock_egress::sandbox_side::configure(&plan)?.send(&child_end)?;
//! // In the supervisor:
//! let sockets = SandboxSockets::receive(&gate_end)?;
//! let env = sockets.proxy_env();                       // for the program's environment
//! let gate = Gate::start(policy, sockets, None)?;
//! // ... the run ...
//! let report = gate.finish();
//! # let _ = (env, report); Ok(()) }
//! ```
//!
//! The gate runs on std threads with blocking I/O: one acceptor thread per gate polls every
//! socket (an idle gate costs that thread and its sockets, about 20 KiB resident); each
//! connection gets a thread, a relayed one a second for its other direction, and bytes move
//! with splice(2).
#![forbid(unsafe_code)]

// The policy model, the plan and the report: every platform (airlock's portable policy
// model and results use them).
pub mod address;
pub mod env;
pub mod error;
pub mod host;
pub mod plan;
pub mod policy;
pub mod report;
pub mod rules;
pub mod unix_sockets;

// The gate itself and the sandbox's side: Linux (network namespaces, splice, SCM_RIGHTS).
#[cfg(target_os = "linux")]
mod audit;
#[cfg(target_os = "linux")]
mod dns;
#[cfg(target_os = "linux")]
mod flow;
#[cfg(target_os = "linux")]
pub mod gate;
#[cfg(target_os = "linux")]
mod http_relay;
#[cfg(target_os = "linux")]
mod meter;
#[cfg(target_os = "linux")]
mod own_addresses;
#[cfg(target_os = "linux")]
mod proxy;
#[cfg(target_os = "linux")]
mod relay;
#[cfg(target_os = "linux")]
mod resolve;
#[cfg(target_os = "linux")]
pub mod sandbox_side;
#[cfg(target_os = "linux")]
mod sniff;
#[cfg(target_os = "linux")]
pub mod sockets;
#[cfg(target_os = "linux")]
mod tls_relay;

#[cfg(target_os = "linux")]
pub use audit::{EventSink, MAX_RECORDS};
pub use error::{EgressError, RuleError};
#[cfg(target_os = "linux")]
pub use gate::{Gate, RunningGate};
pub use plan::SandboxPlan;
pub use policy::{EgressConfig, EgressPolicy, GateMode, Limits, Resolver};
pub use report::{DecisionRecord, GateEvent, NetworkReport};
#[cfg(target_os = "linux")]
pub use resolve::LOOKUP_THREAD;
#[cfg(target_os = "linux")]
pub use sockets::SandboxSockets;
pub use unix_sockets::expand as expand_unix_sockets;

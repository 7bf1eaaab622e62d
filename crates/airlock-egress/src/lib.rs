//! airlock's egress gate: allowlisted network access for a sandbox whose network namespace
//! holds nothing but loopback.
#![forbid(unsafe_code)]

pub mod address;
mod audit;
pub mod dns;
pub mod env;
pub mod error;
mod flow;
pub mod gate;
pub mod host;
mod meter;
mod own_addresses;
pub mod plan;
pub mod policy;
mod proxy;
mod relay;
pub mod report;
pub mod resolve;
pub mod rules;
#[cfg(target_os = "linux")]
pub mod sandbox_side;
pub mod sniff;
pub mod sockets;

pub use audit::{EventSink, MAX_RECORDS};
pub use error::{EgressError, RuleError};
pub use gate::{Gate, RunningGate};
pub use plan::SandboxPlan;
pub use policy::{EgressConfig, EgressPolicy, GateMode, Limits, Resolver};
pub use report::{DecisionRecord, GateEvent, NetworkReport};
pub use sockets::SandboxSockets;

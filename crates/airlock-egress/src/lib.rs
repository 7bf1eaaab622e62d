//! airlock's egress gate: allowlisted network access for a sandbox whose network namespace
//! holds nothing but loopback.
#![forbid(unsafe_code)]

pub mod address;
pub mod dns;
pub mod error;
pub mod host;
pub mod plan;
pub mod policy;
pub mod report;
pub mod rules;

pub use error::{EgressError, RuleError};
pub use plan::SandboxPlan;
pub use policy::{EgressConfig, EgressPolicy, GateMode, Limits, Resolver};
pub use report::{DecisionRecord, GateEvent, NetworkReport};

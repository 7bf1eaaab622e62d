//! `none`: Tier 0 only. Limits and hygiene, no boundary.

use super::{tier0_layers, Backend, PlanContext, Probe};
use crate::error::Error;
use crate::layer::IsolationLevel;
use crate::spec::Confinement;

/// The Tier-0-only backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoneBackend;

impl Backend for NoneBackend {
    fn name(&self) -> &'static str {
        "none"
    }

    fn level(&self) -> IsolationLevel {
        IsolationLevel::Process
    }

    fn probe(&self) -> Probe {
        Probe {
            available: true,
            layers: tier0_layers(),
            problems: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Tier 0 has no network namespace (the program has the host's network) and no
    /// filesystem boundary (it sees every host socket): a gated network or `unix_sockets`
    /// cannot be honoured, and is refused rather than run with the host's network.
    fn plan(&self, ctx: &PlanContext) -> Result<Confinement, Error> {
        if ctx.egress.is_some() {
            return Err(super::network_unsupported(
                self.name(),
                ctx.policy,
                "Tier 0 has no network namespace, so nothing can route its traffic through the egress gate: use a boundary backend (native, bwrap, container, gvisor)",
            ));
        }
        if !ctx.unix_sockets.is_empty() {
            return Err(super::network_unsupported(
                self.name(),
                ctx.policy,
                "Tier 0 has no filesystem boundary: every host socket stays reachable, so listing some cannot restrict it",
            ));
        }
        Ok(Confinement::Tier0)
    }
}

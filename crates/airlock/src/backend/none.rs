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

    fn plan(&self, _ctx: &PlanContext) -> Result<Confinement, Error> {
        Ok(Confinement::Tier0)
    }
}

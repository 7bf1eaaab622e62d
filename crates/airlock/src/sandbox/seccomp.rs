//! STUB until the seccomp branch merges.
use serde::{Deserialize, Serialize};
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SeccompConfig { pub allow_network: bool }
#[derive(Debug, thiserror::Error)]
#[error("seccomp: {0}")]
pub struct SeccompError(String);
pub fn install(_cfg: &SeccompConfig) -> Result<(), SeccompError> { Err(SeccompError("not built yet".into())) }

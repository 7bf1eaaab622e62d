//! STUB until the landlock branch merges.
use std::path::PathBuf;
use serde::{Deserialize, Serialize};
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct LandlockRules { pub read_exec: Vec<PathBuf>, pub read_write: Vec<PathBuf>, pub deny_tcp: bool, pub scope_ipc: bool, pub exec_writable: bool }
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement { Full, Partial, None }
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct LandlockReport { pub abi: u32, pub filesystem: Enforcement, pub network: Enforcement, pub scope: Enforcement, pub skipped_paths: Vec<PathBuf> }
#[derive(Debug, thiserror::Error)]
#[error("landlock: {0}")]
pub struct LandlockError(String);
pub fn restrict_self(_r: &LandlockRules) -> Result<LandlockReport, LandlockError> { Err(LandlockError("not built yet".into())) }
pub fn probe_abi() -> u32 { 0 }

//! STUB until the cgroup branch merges.
use std::path::PathBuf;
use serde::{Deserialize, Serialize};
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CgroupLimits { pub memory_bytes: Option<u64>, pub pids: Option<u64>, pub cpu_millicores: Option<u64> }
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CgroupConfig { pub root: PathBuf, pub parent: String }
impl Default for CgroupConfig { fn default() -> Self { CgroupConfig { root: "/sys/fs/cgroup".into(), parent: "airlock".into() } } }
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion { V1, V2 }
#[derive(Debug, Clone)]
pub struct CgroupSupport { pub version: Option<CgroupVersion>, pub controllers: Vec<String>, pub problems: Vec<String> }
pub fn probe(_c: &CgroupConfig) -> CgroupSupport { CgroupSupport { version: None, controllers: vec![], problems: vec!["stub".into()] } }
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CgroupUsage { pub peak_memory_bytes: Option<u64>, pub oom_kills: u64, pub cpu_usage_ns: Option<u64>, pub pids_limit_hits: u64 }
#[derive(Debug, thiserror::Error)]
#[error("cgroup: {0}")]
pub struct CgroupError(String);
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunCgroup {}
impl RunCgroup {
  pub fn create(_c: &CgroupConfig, _id: &str, _l: &CgroupLimits) -> Result<RunCgroup, CgroupError> { Err(CgroupError("not built yet".into())) }
  pub fn join_self(&self) -> Result<(), CgroupError> { Ok(()) }
  pub fn pids(&self) -> Result<Vec<i32>, CgroupError> { Ok(vec![]) }
  pub fn kill_all(&self) -> Result<(), CgroupError> { Ok(()) }
  pub fn signal_all(&self, _s: nix::sys::signal::Signal) -> Result<(), CgroupError> { Ok(()) }
  pub fn usage(&self) -> CgroupUsage { CgroupUsage::default() }
  pub fn remove(self) -> Result<(), CgroupError> { Ok(()) }
}

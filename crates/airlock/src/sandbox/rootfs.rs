//! STUB until the rootfs branch merges.
use std::path::PathBuf;
use serde::{Deserialize, Serialize};
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GeneratedFile { pub path: PathBuf, pub contents: String, pub mode: u32 }
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Workdir { Bind { host: PathBuf }, Tmpfs { path: PathBuf, size_bytes: u64, max_files: u64 } }
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TmpfsSpec { pub size_bytes: u64, pub max_files: u64 }
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RootfsPlan {
  pub system_ro: Vec<PathBuf>, pub etc_files: Vec<PathBuf>, pub generated_files: Vec<GeneratedFile>,
  pub read_only: Vec<PathBuf>, pub read_write: Vec<PathBuf>, pub workdir: Workdir, pub tmp: TmpfsSpec,
  pub dev_shm: TmpfsSpec, pub exec_writable: bool, pub tty: bool, pub hostname: String, pub proc_hidepid: bool,
}
#[derive(Debug, Default)]
pub struct RootfsReport { pub skipped: Vec<PathBuf> }
#[derive(Debug, thiserror::Error)]
#[error("rootfs: {0}")]
pub struct RootfsError(String);
pub fn default_system_ro() -> Vec<PathBuf> { vec![] }
pub fn default_etc_files() -> Vec<PathBuf> { vec![] }
pub fn validate(_p: &RootfsPlan) -> Result<(), RootfsError> { Ok(()) }
pub fn enter(_p: &RootfsPlan) -> Result<RootfsReport, RootfsError> { Err(RootfsError("not built yet".into())) }

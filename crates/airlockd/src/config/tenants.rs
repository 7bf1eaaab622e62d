//! A tenant's part of the configuration: its keys, profiles, priorities and the ceiling of
//! what its requests may ask for.

use std::path::PathBuf;

use airlock::policy::units::{ByteSize, Seconds};
use airlock::policy::NetworkMode;
use airlock::IsolationLevel;
use serde::Deserialize;

/// A directory of Python tools.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct ToolsetConfig {
    pub path: PathBuf,
}

/// One tenant: who it is, how it proves it, and what it may ask for.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Its API keys, stored hashed.
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    /// Sees every tenant's runs, sessions, queue and audit records (read and cancel).
    #[serde(default)]
    pub admin: bool,
    /// The profile runs start from (built-in name or path), unless a request names another
    /// of `profiles`.
    #[serde(default = "default_profile")]
    pub profile: String,
    /// Other profiles a request may name.
    #[serde(default)]
    pub profiles: Vec<String>,
    /// Sandboxes of this tenant running at once (default: the pool's cap).
    pub share: Option<usize>,
    /// Runs of this tenant waiting at once (default: the pool's `max_queued`).
    pub max_queued: Option<usize>,
    #[serde(default)]
    pub priority: PriorityRange,
    #[serde(default)]
    pub ceiling: Ceiling,
    /// Toolsets `POST /v1/calls` may use.
    #[serde(default)]
    pub toolsets: Vec<String>,
}

fn default_profile() -> String {
    "untrusted".into()
}

/// One API key: a name for logs and refusals, and the SHA-256 of the key.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub name: String,
    /// `sha256:<64 hex digits>`, as printed by `airlockd new-key`.
    pub hash: String,
}

/// The priorities a tenant may use.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityRange {
    pub min: i32,
    pub max: i32,
    pub default: i32,
}

/// Network modes ordered by how much they open: `none` < `allowlist` (what the allow rules
/// name, through the egress gate) < `report` (any public address, every decision recorded) <
/// `host`.
#[derive(
    Deserialize,
    serde::Serialize,
    utoipa::ToSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum NetworkLevel {
    None,
    Allowlist,
    Report,
    Host,
}

impl NetworkLevel {
    /// The level of a policy's network mode.
    pub fn of(mode: NetworkMode) -> NetworkLevel {
        match mode {
            NetworkMode::None => NetworkLevel::None,
            NetworkMode::Allowlist => NetworkLevel::Allowlist,
            NetworkMode::Report => NetworkLevel::Report,
            NetworkMode::Host => NetworkLevel::Host,
        }
    }

    /// The policy's network mode at this level.
    pub fn mode(self) -> NetworkMode {
        match self {
            NetworkLevel::None => NetworkMode::None,
            NetworkLevel::Allowlist => NetworkMode::Allowlist,
            NetworkLevel::Report => NetworkMode::Report,
            NetworkLevel::Host => NetworkMode::Host,
        }
    }

    /// The name as written in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            NetworkLevel::None => "none",
            NetworkLevel::Allowlist => "allowlist",
            NetworkLevel::Report => "report",
            NetworkLevel::Host => "host",
        }
    }
}

/// The most a tenant may ask for. Limits left out are capped by the tenant's profile.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct Ceiling {
    /// The widest network mode.
    pub network: NetworkLevel,
    /// The egress rules a request's `allow` rules must stay within (the gate's grammar; `*`
    /// covers every name rule, never an address range). Ignored for a tenant allowed `host`.
    pub allowlist: Vec<String>,
    /// The weakest isolation level a run may get.
    pub min_isolation: IsolationLevel,
    /// Whether a request may accept missing layers (`allow_degraded`).
    pub allow_degraded: bool,
    pub memory: Option<ByteSize>,
    pub cpu_time: Option<Seconds>,
    pub wall_time: Option<Seconds>,
    pub processes: Option<u64>,
    pub open_files: Option<u64>,
    pub file_size: Option<ByteSize>,
    pub disk: Option<ByteSize>,
    pub files: Option<u64>,
    pub stdout: Option<ByteSize>,
    pub stderr: Option<ByteSize>,
    pub cpus: Option<f64>,
}

impl Default for Ceiling {
    fn default() -> Self {
        Self {
            network: NetworkLevel::None,
            allowlist: Vec::new(),
            min_isolation: IsolationLevel::Kernel,
            allow_degraded: false,
            memory: None,
            cpu_time: None,
            wall_time: None,
            processes: None,
            open_files: None,
            file_size: None,
            disk: None,
            files: None,
            stdout: None,
            stderr: None,
            cpus: None,
        }
    }
}

//! The daemon's one TOML configuration file: where it listens, where it keeps state, the store,
//! the pool, sessions, and the tenants with their keys and ceilings. Unknown keys are errors;
//! [`Config::check`] reports every problem at once, each naming its key and the fix.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock::policy::units::{ByteSize, Seconds};
use airlock::policy::NetworkMode;
use airlock::IsolationLevel;
use serde::Deserialize;

/// The whole configuration file.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub paths: PathsConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub node: NodeConfig,
    #[serde(default)]
    pub pool: PoolSection,
    #[serde(default)]
    pub sessions: SessionsConfig,
    #[serde(default)]
    pub sandbox: SandboxSection,
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Directories of Python tools that `POST /v1/calls` may name, by toolset name.
    #[serde(default)]
    pub toolsets: BTreeMap<String, ToolsetConfig>,
}

/// Listeners and request handling.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// The Unix socket (default: `airlockd.sock` in the runtime directory).
    pub socket: Option<PathBuf>,
    /// Permission bits of the socket, octal (`"0660"`): owner and group may connect.
    pub socket_mode: String,
    /// Group id given the socket, so that members of that group may connect.
    pub socket_gid: Option<u32>,
    /// TCP addresses to listen on as well (`--listen` adds to them).
    pub listen: Vec<String>,
    /// Plain-HTTP TCP addresses for node-to-node forwarding (`node.advertise` points here).
    /// Every request still needs a key; restrict these to the fleet (a NetworkPolicy).
    pub internal_listen: Vec<String>,
    /// PEM certificate chain and key: TCP listeners speak TLS when both are given.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a TCP address that is not loopback (keys then travel in clear).
    pub allow_insecure_tcp: bool,
    /// Largest request body (JSON, uploads, multipart).
    pub max_body: ByteSize,
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Time a client has to send its request headers (slow-loris bound).
    pub header_timeout: Seconds,
    /// A response that the client does not read for this long is dropped (slow-reader bound).
    pub stall_timeout: Seconds,
    /// The longest `wait` a run request may ask for.
    pub max_wait: Seconds,
    /// On SIGTERM: how long running runs may finish before they are cancelled.
    pub shutdown_grace: Seconds,
    /// Interval of keep-alive comments on event streams.
    pub stream_keepalive: Seconds,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            socket: None,
            socket_mode: "0660".into(),
            socket_gid: None,
            listen: Vec::new(),
            internal_listen: Vec::new(),
            tls_cert: None,
            tls_key: None,
            allow_insecure_tcp: false,
            max_body: ByteSize(64 << 20),
            max_connections: 1024,
            header_timeout: Seconds(Duration::from_secs(10)),
            stall_timeout: Seconds(Duration::from_secs(30)),
            max_wait: Seconds(Duration::from_secs(60)),
            shutdown_grace: Seconds(Duration::from_secs(30)),
            stream_keepalive: Seconds(Duration::from_secs(15)),
        }
    }
}

/// Where the daemon keeps things.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PathsConfig {
    /// The store (SQLite), session workspaces, worker jobs and outputs.
    pub state_dir: Option<PathBuf>,
    /// The socket and the per-run directories of the sandboxes.
    pub runtime_dir: Option<PathBuf>,
    /// The `airlock` binary each run executes as its init (default: next to `airlockd`).
    pub init_program: Option<PathBuf>,
}

/// The run store.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite:///path/airlockd.db` (default, in the state directory) or `postgres://...`.
    pub url: Option<String>,
    /// Connections to the database.
    pub max_connections: u32,
    /// Run records (and their events and worker outputs) older than this are pruned.
    pub retention: Seconds,
    /// Audit records older than this are pruned (never less than a day).
    pub audit_retention: Seconds,
    /// How often pruning runs.
    pub prune_every: Seconds,
    /// Keep the runs' stdout and stderr in the store.
    pub keep_output: bool,
    /// Keep environment values of requests (names are always kept).
    pub keep_env_values: bool,
    /// Keep stdin and the contents of files sent with requests (names and sizes are kept).
    pub keep_file_contents: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: None,
            max_connections: 8,
            retention: Seconds(Duration::from_secs(30 * 86400)),
            audit_retention: Seconds(Duration::from_secs(365 * 86400)),
            prune_every: Seconds(Duration::from_secs(3600)),
            keep_output: true,
            keep_env_values: false,
            keep_file_contents: false,
        }
    }
}

/// This daemon's place in a fleet sharing one store.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Unique per daemon (default: the host name).
    pub id: Option<String>,
    /// The URL other daemons use to reach this one (for events and files of its runs).
    pub advertise: Option<String>,
    /// How often the node records that it is alive.
    pub heartbeat: Seconds,
    /// A node silent for this long is dead: its in-flight runs are marked lost by the others.
    pub dead_after: Seconds,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            id: None,
            advertise: None,
            heartbeat: Seconds(Duration::from_secs(5)),
            dead_after: Seconds(Duration::from_secs(60)),
        }
    }
}

/// Admission.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSection {
    /// Sandboxes running at once on this node (default: the number of CPUs).
    pub max_concurrent: Option<usize>,
    /// Runs waiting for a slot at once; more are refused with 429.
    pub max_queued: usize,
    /// How long a run may wait for a slot before it is refused (503 / status `rejected`).
    pub queue_timeout: Seconds,
}

impl Default for PoolSection {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            max_queued: 1000,
            queue_timeout: Seconds(Duration::from_secs(60)),
        }
    }
}

/// Sessions: defaults and the largest values a request may ask for.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    pub default_idle_timeout: Seconds,
    pub max_idle_timeout: Seconds,
    pub default_lifetime: Seconds,
    pub max_lifetime: Seconds,
    /// Bytes of a workspace (a tmpfs `size=` when the daemon runs as root).
    pub default_disk: ByteSize,
    pub max_disk: ByteSize,
    /// Files of a workspace (tmpfs `nr_inodes=`).
    pub default_files: u64,
    pub max_files: u64,
    /// Largest single file uploaded or downloaded.
    pub max_file_bytes: ByteSize,
    /// Sessions one tenant may hold at once.
    pub max_per_tenant: usize,
    /// How often expired sessions are looked for.
    pub sweep_every: Seconds,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            default_idle_timeout: Seconds(Duration::from_secs(15 * 60)),
            max_idle_timeout: Seconds(Duration::from_secs(3600)),
            default_lifetime: Seconds(Duration::from_secs(3600)),
            max_lifetime: Seconds(Duration::from_secs(86400)),
            default_disk: ByteSize(256 << 20),
            max_disk: ByteSize(1 << 30),
            default_files: 10_000,
            max_files: 100_000,
            max_file_bytes: ByteSize(64 << 20),
            max_per_tenant: 16,
            sweep_every: Seconds(Duration::from_secs(5)),
        }
    }
}

/// How sandboxes are set up on this node.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxSection {
    /// Do not use cgroups.
    pub no_cgroup: bool,
    /// The cgroup directory (in each hierarchy) dedicated to this daemon's runs.
    pub cgroup_parent: String,
    /// An interpreter registry file layered on the built-in one (`code` + `language`).
    pub interpreters: Option<PathBuf>,
    /// The Python used for tool calls.
    pub python: String,
    /// Worker outputs: the caps of ingestion.
    pub worker_max_output_bytes: ByteSize,
    pub worker_max_output_files: u64,
}

impl Default for SandboxSection {
    fn default() -> Self {
        Self {
            no_cgroup: false,
            cgroup_parent: "airlockd".into(),
            interpreters: None,
            python: "/usr/bin/python3".into(),
            worker_max_output_bytes: ByteSize(100 << 20),
            worker_max_output_files: 1000,
        }
    }
}

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

/// A problem in the configuration: the key and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Reading or checking the configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{} problem(s) in the configuration:\n  {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    Invalid(Vec<ConfigProblem>),
}

impl Config {
    /// Parses a configuration file (without checking it).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.to_owned(),
            cause,
        })?;
        Config::parse(&text, path)
    }

    /// Parses configuration text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_owned(),
            message: e.to_string(),
        })
    }

    /// The state directory: configured, else `/var/lib/airlockd` for root, else
    /// `$XDG_STATE_HOME/airlockd` or `~/.local/state/airlockd`.
    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.paths.state_dir {
            return dir.clone();
        }
        if rustix::process::geteuid().is_root() {
            return PathBuf::from("/var/lib/airlockd");
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/state")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("airlockd")
    }

    /// The runtime directory: configured, else `/run/airlockd` for root, else
    /// `$XDG_RUNTIME_DIR/airlockd` or `/tmp/airlockd-<uid>`.
    pub fn runtime_dir(&self) -> PathBuf {
        if let Some(dir) = &self.paths.runtime_dir {
            return dir.clone();
        }
        let uid = rustix::process::geteuid();
        if uid.is_root() {
            return PathBuf::from("/run/airlockd");
        }
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(xdg) if Path::new(&xdg).is_dir() => Path::new(&xdg).join("airlockd"),
            _ => PathBuf::from(format!("/tmp/airlockd-{}", uid.as_raw())),
        }
    }

    pub fn socket_path(&self) -> PathBuf {
        self.server
            .socket
            .clone()
            .unwrap_or_else(|| self.runtime_dir().join("airlockd.sock"))
    }

    pub fn store_url(&self) -> String {
        self.store.url.clone().unwrap_or_else(|| {
            format!(
                "sqlite://{}",
                self.state_dir().join("airlockd.db").display()
            )
        })
    }

    pub fn node_id(&self) -> String {
        self.node.id.clone().unwrap_or_else(|| {
            let uname = rustix::system::uname();
            uname.nodename().to_string_lossy().into_owned()
        })
    }

    pub fn max_concurrent(&self) -> usize {
        self.pool
            .max_concurrent
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The socket mode as bits.
    pub fn socket_mode(&self) -> Option<u32> {
        u32::from_str_radix(self.server.socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|mode| *mode <= 0o777)
    }

    /// Every problem of the configuration, or `Ok`.
    pub fn check(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        self.check_server(&mut problems);
        self.check_store(&mut problems);
        self.check_pool(&mut problems);
        crate::tenant::check_tenants(self, &mut problems);
        for (name, toolset) in &self.toolsets {
            if !toolset.path.is_absolute() || !toolset.path.is_dir() {
                problems.add(
                    format!("toolsets.{name}.path"),
                    format!(
                        "{} is not an existing absolute directory; point it at the directory holding the tools",
                        toolset.path.display()
                    ),
                );
            }
        }
        problems.into_result()
    }

    fn check_server(&self, problems: &mut Problems) {
        if self.socket_mode().is_none() {
            problems.add(
                "server.socket_mode",
                format!(
                    "{:?} is not an octal mode; write e.g. \"0660\"",
                    self.server.socket_mode
                ),
            );
        }
        if self.server.tls_cert.is_some() != self.server.tls_key.is_some() {
            problems.add(
                "server.tls_cert",
                "give both tls_cert and tls_key, or neither",
            );
        }
        if let (Some(cert), Some(key)) = (&self.server.tls_cert, &self.server.tls_key) {
            if let Err(e) = crate::server::tls_config(cert, key) {
                problems.add("server.tls_cert", format!("{e:#}"));
            }
        }
        for addr in &self.server.listen {
            self.check_listen(addr, problems);
        }
        for addr in &self.server.internal_listen {
            if addr.parse::<SocketAddr>().is_err() {
                problems.add(
                    "server.internal_listen",
                    format!("{addr:?} is not an address; write e.g. \"10.0.0.5:8080\""),
                );
            }
        }
        if self.server.max_connections == 0 {
            problems.add("server.max_connections", "must be at least 1");
        }
    }

    /// A TCP address must parse, and plain HTTP is refused off loopback unless allowed.
    pub fn check_listen(&self, addr: &str, problems: &mut Problems) {
        let Ok(parsed) = addr.parse::<SocketAddr>() else {
            problems.add(
                "server.listen",
                format!("{addr:?} is not an address; write e.g. \"127.0.0.1:8080\""),
            );
            return;
        };
        let tls = self.server.tls_cert.is_some();
        if !tls && !parsed.ip().is_loopback() && !self.server.allow_insecure_tcp {
            problems.add(
                "server.listen",
                format!("{addr} is not loopback and no TLS certificate is configured: API keys would travel in clear; set server.tls_cert and server.tls_key (or allow_insecure_tcp = true behind a TLS-terminating proxy)"),
            );
        }
    }

    fn check_store(&self, problems: &mut Problems) {
        let url = self.store_url();
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres:")
            || url.starts_with("postgresql:"))
        {
            problems.add(
                "store.url",
                format!("{url:?} is neither sqlite:// nor postgres://; use one of them"),
            );
        }
        if self.store.max_connections == 0 {
            problems.add("store.max_connections", "must be at least 1");
        }
        if self.store.audit_retention.0 < Duration::from_secs(86400) {
            problems.add(
                "store.audit_retention",
                "must be at least 1d: audit records younger than a day cannot be deleted",
            );
        }
    }

    fn check_pool(&self, problems: &mut Problems) {
        if self.pool.max_concurrent == Some(0) {
            problems.add("pool.max_concurrent", "must be at least 1");
        }
        if self.pool.max_queued == 0 {
            problems.add("pool.max_queued", "must be at least 1");
        }
        if let Some(advertise) = &self.node.advertise {
            if !advertise.starts_with("http://") && !advertise.starts_with("https://") {
                problems.add(
                    "node.advertise",
                    "must be an http:// or https:// URL other daemons can reach",
                );
            }
        }
    }
}

/// Collects configuration problems.
#[derive(Default, Debug)]
pub struct Problems(Vec<ConfigProblem>);

impl Problems {
    pub fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem {
            key: key.into(),
            message: message.into(),
        });
    }

    pub fn into_result(self) -> Result<(), ConfigError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(self.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_errors_that_name_the_key() {
        let err = Config::parse("[server]\nsokcet = \"/x\"\n", Path::new("t.toml")).unwrap_err();
        assert!(err.to_string().contains("sokcet"), "{err}");
    }

    #[test]
    fn plain_tcp_off_loopback_is_refused() {
        let config = Config::parse(
            "[server]\nlisten = [\"0.0.0.0:8080\", \"127.0.0.1:1\"]\n",
            Path::new("t.toml"),
        )
        .unwrap();
        let mut problems = Problems::default();
        config.check_listen("0.0.0.0:8080", &mut problems);
        config.check_listen("127.0.0.1:1", &mut problems);
        assert_eq!(problems.0.len(), 1, "{problems:?}");
        assert!(problems.0[0].message.contains("tls_cert"));
    }

    #[test]
    fn socket_mode_is_octal() {
        let mut config = Config::default();
        assert_eq!(config.socket_mode(), Some(0o660));
        config.server.socket_mode = "999".into();
        assert_eq!(config.socket_mode(), None);
    }
}

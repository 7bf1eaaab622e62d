//! The daemon's one TOML configuration file: where it listens, where it keeps state, the store,
//! the pool, sessions, and the tenants with their keys and ceilings. Unknown keys are errors;
//! [`Config::check`] reports every problem at once, each naming its key and the fix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock::policy::units::{ByteSize, Seconds};
use serde::Deserialize;
mod check;
mod tenants;
mod warm;

pub use check::{ConfigError, ConfigProblem, Problems};
pub use tenants::{Ceiling, KeyConfig, NetworkLevel, PriorityRange, TenantConfig, ToolsetConfig};
pub use warm::{WarmProfile, WarmSection};

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
    /// The MCP server at `/mcp`.
    #[serde(default)]
    pub mcp: McpConfig,
    /// Prepared sandboxes and interpreter zygotes (off unless a profile is listed).
    #[serde(default)]
    pub warm: WarmSection,
}

/// The MCP server over streamable HTTP at `/mcp` (behind the same keys as the API).
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Serve `/mcp` at all.
    pub enabled: bool,
    /// Browser origins (`scheme://host:port`) allowed to call `/mcp`; a request with any
    /// other `Origin` is refused (403). Programs send no `Origin` and need no entry.
    pub allowed_origins: Vec<String>,
    /// MCP sessions one API key may hold open at once; an `initialize` beyond it gets 429.
    pub max_sessions_per_key: usize,
    /// An MCP session no request used for this long is ended, with the sessions it created.
    pub session_idle_timeout: Seconds,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            enabled: true,
            allowed_origins: Vec::new(),
            max_sessions_per_key: 16,
            session_idle_timeout: Seconds(Duration::from_secs(300)),
        }
    }
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
    /// TCP addresses for node-to-node forwarding (`node.advertise` points here): TLS with the
    /// node's certificate when `tls_cert` is set, else plain HTTP (which needs
    /// `node.plain_http_peers`). Every request still needs a key; restrict these to the fleet.
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
    /// PEM CA certificate(s) that other nodes' certificates must chain to: requests forwarded
    /// to an `https://` peer verify it against these, and only these.
    pub peer_ca: Option<PathBuf>,
    /// The name a peer's certificate must hold, when the nodes share one certificate for a
    /// fleet name (e.g. `airlockd.airlock.svc`) rather than one per advertised address.
    pub peer_name: Option<String>,
    /// This node's own certificate (PEM chain signed by the CA in `peer_ca`, with the
    /// `clientAuth` usage) and its key: presented to peers when forwarding (mutual TLS), as
    /// their `server.internal_listen` requires of every calling node.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Forward to `http://` peers in clear (API keys included): only on a network the operator
    /// trusts. Without it, a plain-HTTP peer is never sent a request.
    pub plain_http_peers: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            id: None,
            advertise: None,
            heartbeat: Seconds(Duration::from_secs(5)),
            dead_after: Seconds(Duration::from_secs(60)),
            peer_ca: None,
            peer_name: None,
            cert: None,
            key: None,
            plain_http_peers: false,
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
}

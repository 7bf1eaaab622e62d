//! The daemon's state and its life: start-up (directories, store, recovery), the background
//! tasks (heartbeat, session expiry, pruning, sweeping), and shutdown.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use airlock::interp::InterpreterRegistry;
use airlock::SandboxOptions;
use anyhow::Context;
use serde_json::json;

use crate::audit::Audit;
use crate::auth::KeyRegistry;
use crate::config::Config;
use crate::engine::admission::Admission;
use crate::engine::{Engine, EnginePaths};
use crate::metrics::Metrics;
use crate::recovery;
use crate::sessions::Sessions;
use crate::store::{now_ms, Store};
use crate::tenant::{build_tenants, Tenant};

/// Everything a request handler may need.
#[derive(Debug)]
pub struct Daemon {
    pub config: Config,
    pub node: String,
    pub advertise: Option<String>,
    pub started_ms: i64,
    pub keys: KeyRegistry,
    pub tenants: Vec<Arc<Tenant>>,
    pub store: Store,
    pub engine: Arc<Engine>,
    pub sessions: Arc<Sessions>,
    pub metrics: Arc<Metrics>,
    pub audit: Arc<Audit>,
    pub sandbox_options: SandboxOptions,
    pub interpreters: InterpreterRegistry,
    /// `airlock doctor`'s report, probed once at start-up.
    pub doctor: serde_json::Value,
    pub paths: DaemonPaths,
    /// How requests are forwarded to other nodes.
    pub peers: crate::peers::PeerLinks,
}

/// The directories of this node.
#[derive(Debug, Clone)]
pub struct DaemonPaths {
    pub state: PathBuf,
    pub runtime: PathBuf,
    pub runs: PathBuf,
    pub sessions: PathBuf,
    pub work: PathBuf,
    pub outputs: PathBuf,
    pub uploads: PathBuf,
}

impl DaemonPaths {
    fn new(config: &Config) -> DaemonPaths {
        let state = config.state_dir();
        let runtime = config.runtime_dir();
        DaemonPaths {
            runs: runtime.join("runs"),
            sessions: state.join("sessions"),
            work: state.join("work"),
            outputs: state.join("outputs"),
            uploads: state.join("uploads"),
            state,
            runtime,
        }
    }

    /// Creates the directories. Those sandboxed programs traverse (to reach a workspace bound
    /// at the same path) are 0711; the rest are the daemon's alone.
    fn create(&self) -> anyhow::Result<()> {
        for (dir, mode) in [
            (&self.state, 0o711),
            (&self.runtime, 0o711),
            (&self.sessions, 0o711),
            (&self.work, 0o711),
            (&self.outputs, 0o700),
            (&self.uploads, 0o700),
        ] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
        }
        Ok(())
    }
}

/// The `airlock` binary each run executes as its init: configured, else next to this
/// executable, else `airlock` on PATH.
pub fn init_program(config: &Config) -> PathBuf {
    if let Some(path) = &config.paths.init_program {
        return path.clone();
    }
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("airlock")));
    match sibling {
        Some(path) if path.is_file() => path,
        _ => find_on_path("airlock").unwrap_or_else(|| PathBuf::from("airlock")),
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

impl Daemon {
    /// Starts the daemon's state: checks the configuration, prepares directories, opens the
    /// store, recovers from a crash, and starts the background tasks.
    pub async fn start(config: Config) -> anyhow::Result<Arc<Daemon>> {
        config.check()?;
        let paths = DaemonPaths::new(&config);
        paths.create()?;
        let node = config.node_id();
        let store = Store::open(&config.store_url(), config.store.max_connections)
            .await
            .context("cannot open the run store")?;
        let metrics = Arc::new(Metrics::new());
        let audit = Arc::new(Audit::new(store.clone(), node.clone()));
        let tenants = build_tenants(&config).map_err(anyhow::Error::msg)?;
        let sandbox_options = sandbox_options(&config, &paths);
        let started_ms = now_ms();
        recovery::recover(&store, &audit, &node, &paths, &sandbox_options).await?;
        store
            .heartbeat(&node, config.node.advertise.as_deref(), started_ms)
            .await?;
        let sessions = Arc::new(Sessions::new(
            paths.sessions.clone(),
            store.clone(),
            node.clone(),
            Arc::clone(&metrics),
        ));
        sessions.recover().await?;
        let engine = Arc::new(Engine::new(
            store.clone(),
            node.clone(),
            Admission::new(config.max_concurrent(), config.pool.max_queued, &tenants),
            Arc::clone(&metrics),
            Arc::clone(&audit),
            EnginePaths {
                work: paths.work.clone(),
                outputs: paths.outputs.clone(),
            },
            config.sandbox.python.clone(),
            config.store.keep_output,
        ));
        let interpreters = match &config.sandbox.interpreters {
            Some(path) => InterpreterRegistry::load(path)?,
            None => InterpreterRegistry::builtin(),
        };
        start_warm(&engine, &config, &tenants, &sandbox_options, &interpreters);
        let (spawner, options) = (Arc::clone(&engine.spawner), sandbox_options.clone());
        tokio::task::spawn_blocking(move || spawner.start(&options));
        let doctor = tokio::task::spawn_blocking({
            let cgroup = sandbox_options.cgroup.clone().unwrap_or_default();
            move || serde_json::to_value(airlock::doctor::diagnose(&cgroup)).unwrap_or_default()
        })
        .await?;
        let daemon = Arc::new(Daemon {
            node,
            advertise: config.node.advertise.clone(),
            started_ms,
            keys: KeyRegistry::new(&tenants),
            tenants,
            store,
            engine,
            sessions,
            metrics,
            audit,
            sandbox_options,
            interpreters,
            doctor,
            paths,
            peers: crate::peers::PeerLinks::from_config(&config)?,
            config,
        });
        daemon
            .audit
            .system(
                "daemon_started",
                None,
                json!({"pid": std::process::id(), "version": env!("CARGO_PKG_VERSION")}),
            )
            .await;
        spawn_background(&daemon);
        Ok(daemon)
    }

    /// SIGTERM: drain the engine (grace for running runs), end nothing else (sessions keep
    /// their workspaces for the next start), record the stop.
    pub async fn shutdown(&self) {
        self.engine.drain(self.config.server.shutdown_grace.0).await;
        let engine = Arc::clone(&self.engine);
        let _ = tokio::task::spawn_blocking(move || {
            engine.warm.shutdown();
            engine.spawner.close();
        })
        .await;
        self.audit
            .system("daemon_stopped", None, json!({"pid": std::process::id()}))
            .await;
    }

    pub fn tenant(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.tenants.iter().find(|t| t.name == name)
    }
}

/// Starts the prepared sandboxes and zygotes of `[warm]` in the background: readiness does
/// not wait for them (runs go cold until they are ready).
fn start_warm(
    engine: &Arc<Engine>,
    config: &Config,
    tenants: &[Arc<Tenant>],
    options: &SandboxOptions,
    interpreters: &InterpreterRegistry,
) {
    if config.warm.profiles.is_empty() {
        return;
    }
    let (engine, section) = (Arc::clone(engine), config.warm.clone());
    let (tenants, options, interpreters) =
        (tenants.to_vec(), options.clone(), interpreters.clone());
    tokio::task::spawn_blocking(move || {
        engine
            .warm
            .start(&section, &tenants, &options, &interpreters)
    });
}

fn sandbox_options(config: &Config, paths: &DaemonPaths) -> SandboxOptions {
    let cgroup = airlock::CgroupConfig {
        parent: config.sandbox.cgroup_parent.clone(),
        ..Default::default()
    };
    SandboxOptions {
        init_program: Some(init_program(config)),
        runtime_dir: Some(paths.runs.clone()),
        cgroup: Some(cgroup),
        no_cgroup: config.sandbox.no_cgroup,
        ..SandboxOptions::default()
    }
}

fn spawn_background(daemon: &Arc<Daemon>) {
    let every = |d: Duration| d.max(Duration::from_millis(100));
    let heartbeat = every(daemon.config.node.heartbeat.0);
    let sweep = every(daemon.config.sessions.sweep_every.0);
    let prune = every(daemon.config.store.prune_every.0);
    spawn_loop(
        daemon,
        heartbeat,
        |d| async move { d.heartbeat_tick().await },
    );
    spawn_loop(daemon, sweep, |d| async move {
        d.sessions.sweep(&d.engine).await
    });
    spawn_loop(daemon, prune, |d| async move { d.prune_tick().await });
    spawn_loop(daemon, Duration::from_secs(10), |d| async move {
        let options = d.sandbox_options.clone();
        let _ = tokio::task::spawn_blocking(move || options.sweep_abandoned_runs()).await;
    });
}

fn spawn_loop<F, Fut>(daemon: &Arc<Daemon>, period: Duration, tick: F)
where
    F: Fn(Arc<Daemon>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let weak = Arc::downgrade(daemon);
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let Some(daemon) = weak.upgrade() else { break };
            tick(daemon).await;
        }
    });
}

impl Daemon {
    /// Says this node is alive, and marks lost the in-flight runs of nodes that went silent.
    async fn heartbeat_tick(&self) {
        if let Err(e) = self
            .store
            .heartbeat(&self.node, self.advertise.as_deref(), self.started_ms)
            .await
        {
            tracing::warn!("heartbeat: {e}");
            return;
        }
        let silent_since = now_ms() - self.config.node.dead_after.0.as_millis() as i64;
        let Ok(silent) = self.store.silent_nodes(&self.node, silent_since).await else {
            return;
        };
        for node in silent {
            let reason = recovery::lost_reason(&format!(
                "node {node} stopped sending heartbeats while the run was in flight"
            ));
            if let Ok(ids) = self.store.mark_lost(&node, &reason).await {
                for id in ids {
                    self.audit
                        .system("run_lost", Some(&id), json!({"node": node}))
                        .await;
                }
            }
            let reason = format!("its node {node} stopped sending heartbeats");
            if let Ok(ids) = self.store.mark_sessions_lost(&node, &reason).await {
                for id in ids {
                    self.audit
                        .system("session_lost", Some(&id), json!({"node": node}))
                        .await;
                }
            }
        }
        // This node was silent too long once (paused, cut off): sessions the fleet recorded
        // lost meanwhile are ended here too, so none is served against its record.
        self.sessions.drop_ended_elsewhere(&self.engine).await;
    }

    /// Removes records (and worker outputs) past their retention.
    async fn prune_tick(&self) {
        let now = now_ms();
        let runs_before = now - self.config.store.retention.0.as_millis() as i64;
        match self.store.prune_runs(runs_before).await {
            Ok(ids) => {
                for id in ids {
                    let _ = std::fs::remove_dir_all(self.paths.outputs.join(&id));
                }
            }
            Err(e) => tracing::warn!("pruning runs: {e}"),
        }
        if let Err(e) = self.store.prune_sessions(runs_before).await {
            tracing::warn!("pruning sessions: {e}");
        }
        let audit_before = now - self.config.store.audit_retention.0.as_millis() as i64;
        if let Err(e) = self.store.prune_audit(audit_before).await {
            tracing::warn!("pruning the audit log: {e}");
        }
    }
}

//! Command line and start-up of `airlock-mcp`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use rmcp::ServiceExt;

use airlock::interp::InterpreterRegistry;
use airlock::policy::units::ByteSize;
use airlock::SandboxOptions;
use airlock_mcp::{AirlockMcp, LocalConfig, LocalExecutor};

/// Serve airlock's sandbox as Model Context Protocol tools over stdio.
///
/// Tools: run_code, run_command, session_create, session_close, file_read, file_write,
/// describe_policy. The profile decides what every run may do; no tool can widen it.
#[derive(Parser, Debug)]
#[command(name = "airlock-mcp", version)]
struct Args {
    /// The policy of every run: a built-in profile (untrusted, trusted) or a profile file.
    #[arg(long, default_value = "untrusted")]
    profile: String,
    /// Interpreter registry TOML for run_code (default: the built-ins).
    #[arg(long, value_name = "FILE")]
    interpreters: Option<PathBuf>,
    /// Only these interpreters may run (comma-separated names or aliases).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    allow: Option<Vec<String>>,
    /// Sessions open at once.
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_sessions: usize,
    /// Largest file file_read and file_write move.
    #[arg(long, value_name = "SIZE", default_value = "16MiB")]
    max_file_bytes: ByteSize,
    /// Runs at once; more wait for a slot.
    #[arg(long, value_name = "N", default_value_t = 4)]
    max_concurrent_runs: usize,
    /// The airlock binary that starts each run (default: next to airlock-mcp, else on PATH).
    #[arg(long, value_name = "PATH")]
    airlock: Option<PathBuf>,
    /// Run even if a layer the profile requires is missing on this host.
    #[arg(long)]
    allow_degraded: bool,
    /// Do not use cgroups.
    #[arg(long)]
    no_cgroup: bool,
    /// Allow backend "none" (Tier 0 only) outside the trusted profile.
    #[arg(long)]
    dev: bool,
}

pub fn main() -> ExitCode {
    if std::env::var_os("AIRLOCK_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("AIRLOCK_LOG"))
            .with_writer(std::io::stderr)
            .init();
    }
    let args = Args::parse();
    // stdout is the protocol: every message of ours goes to stderr.
    match config(&args).and_then(serve) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("airlock-mcp: error: {error:#}");
            ExitCode::from(125)
        }
    }
}

fn config(args: &Args) -> Result<LocalConfig> {
    let policy = airlock::policy::load_profile(&args.profile)?;
    let options = SandboxOptions {
        init_program: Some(airlock_binary(args.airlock.as_deref())?),
        allow_degraded: args.allow_degraded,
        no_cgroup: args.no_cgroup,
        dev: args.dev,
        trusted_profile: args.profile == "trusted",
        ..SandboxOptions::default()
    };
    let mut config = LocalConfig::new(&args.profile, policy, options);
    config.interpreters = match &args.interpreters {
        Some(path) => InterpreterRegistry::load(path)?,
        None => InterpreterRegistry::builtin(),
    };
    if let Some(allow) = &args.allow {
        config.interpreters.set_allowed(allow)?;
    }
    config.max_sessions = args.max_sessions;
    config.max_file_bytes = args.max_file_bytes.0;
    config.max_concurrent_runs = args.max_concurrent_runs;
    Ok(config)
}

/// The `airlock` binary: as given, else next to this executable, else on PATH.
fn airlock_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = given {
        if !is_executable(path) {
            bail!("--airlock {}: not an executable file", path.display());
        }
        return Ok(path.to_path_buf());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("airlock")));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("airlock"));
    beside
        .into_iter()
        .chain(on_path)
        .find(|candidate| is_executable(candidate))
        .context("cannot find the airlock binary next to airlock-mcp or on PATH; install it there or pass --airlock PATH")
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn serve(config: LocalConfig) -> Result<()> {
    let executor = LocalExecutor::new(config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // The executor is dropped after the runtime stops, removing every session's workspace.
    let executor = Arc::new(executor);
    let server = AirlockMcp::new(executor.clone());
    runtime.block_on(async move {
        let service = match server.serve(rmcp::transport::stdio()).await {
            Ok(service) => service,
            // The client went away before initializing: nothing to serve, not a failure.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
            Err(e) => return Err(anyhow::Error::new(e).context("MCP handshake failed")),
        };
        tokio::select! {
            quit = service.waiting() => { quit.context("MCP service failed")?; }
            _ = shutdown_signal() => {}
        }
        anyhow::Ok(())
    })?;
    // Dropped requests cancel their runs; give them time to end and clean up.
    runtime.shutdown_timeout(std::time::Duration::from_secs(10));
    drop(executor);
    Ok(())
}

/// SIGTERM or SIGINT: stop serving so that sessions are cleaned up.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

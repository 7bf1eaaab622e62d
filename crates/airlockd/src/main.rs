//! The `airlockd` binary: serve, check a configuration, print the OpenAPI document, make keys.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use airlockd::config::Config;
use airlockd::daemon::Daemon;

/// mimalloc rather than glibc's malloc: a request allocates and frees many small buffers
/// across the runtime's threads, which glibc's arenas pay for in locking and consolidation
/// (~10 % of the daemon's CPU in a profile); mimalloc takes ~0.05-0.1 ms off the paired API
/// overhead (docs/daemon.md, "Not yet").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// airlock's daemon: the sandbox as a service.
#[derive(Parser, Debug)]
#[command(name = "airlockd", version)]
struct Cli {
    /// The configuration file (default: /etc/airlockd/airlockd.toml, or $AIRLOCKD_CONFIG).
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    /// Also listen on this TCP address (TLS when the configuration has a certificate).
    #[arg(long)]
    listen: Vec<String>,
    /// Also listen on this TCP address for other nodes only (server.internal_listen): mutual
    /// TLS with a certificate (node.peer_ca verifies the callers), else plain HTTP.
    #[arg(long)]
    internal_listen: Vec<String>,
    /// The Unix socket (overrides server.socket).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Check the configuration and exit (0 when valid, 1 with every problem listed).
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a new API key and the line to put in the configuration.
    NewKey {
        /// The key's name in the configuration.
        #[arg(long, default_value = "default")]
        name: String,
    },
    /// Print the configuration hash of a key read from stdin.
    HashKey,
    /// Print the OpenAPI document.
    Openapi,
}

fn config_path(cli: &Cli) -> PathBuf {
    cli.config
        .clone()
        .or_else(|| std::env::var_os("AIRLOCKD_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/etc/airlockd/airlockd.toml"))
}

fn load(cli: &Cli) -> anyhow::Result<Config> {
    let path = config_path(cli);
    let mut config = Config::load(&path)?;
    if let Some(socket) = &cli.socket {
        config.server.socket = Some(socket.clone());
    }
    config.server.listen.extend(cli.listen.iter().cloned());
    config
        .server
        .internal_listen
        .extend(cli.internal_listen.iter().cloned());
    Ok(config)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AIRLOCKD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlockd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Some(Command::NewKey { name }) => {
            let key = airlockd::auth::new_key();
            println!("key:    {key}");
            println!(
                "config: {{ name = \"{name}\", hash = \"{}\" }}",
                airlockd::auth::hash_line(&key)
            );
            return Ok(());
        }
        Some(Command::HashKey) => {
            let mut key = String::new();
            std::io::stdin().read_to_string(&mut key)?;
            println!("{}", airlockd::auth::hash_line(key.trim()));
            return Ok(());
        }
        Some(Command::Openapi) => {
            print!("{}", airlockd::api::openapi_json());
            return Ok(());
        }
        None => {}
    }
    let config = load(&cli)?;
    if cli.check_config {
        config.check()?;
        println!(
            "{}: the configuration is valid",
            config_path(&cli).display()
        );
        println!("{}", airlockd::peers::describe(&config));
        return Ok(());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(serve(config))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let daemon = Daemon::start(config.clone()).await?;
    let mcp = airlockd::mcp::McpHttp::new(Arc::clone(&daemon), config.mcp.clone());
    let mcp_router = config.mcp.enabled.then(|| ("/mcp", mcp.router()));
    let app = airlockd::api::router(Arc::clone(&daemon), mcp_router);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn({
        let config = config.clone();
        async move { airlockd::server::serve(&config, &[], app, stop_rx, Duration::from_secs(5)).await }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
        outcome = server => return outcome.context("the server task failed")?,
    }
    // Keep serving reads while draining: clients wait for results and stream events.
    daemon.shutdown().await;
    mcp.shutdown();
    let _ = stop_tx.send(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    daemon.store.close().await;
    tracing::info!("stopped");
    Ok(())
}

//! Command-line definitions and the small subcommands (profile, doctor).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// Run untrusted code behind an OS-enforced boundary with real resource limits.
#[derive(Parser, Debug)]
#[command(name = "airlock", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Commands,
}

/// Each subcommand's flags are built only when it is the one invoked (`defer`): every run
/// parses its command line, and building the flag sets of all five commands that run
/// programs cost about 170,000 instructions a run.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum Commands {
    /// Run a command in the sandbox: `airlock run [OPTIONS] -- PROGRAM [ARGS...]`.
    Run(Box<crate::run::RunArgs>),
    /// Show or check profiles.
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// Show which isolation layers this host supports and what each profile gets here.
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Grade a sandbox command line (or several) with airlock's attacks: one table row each.
    Conformance(crate::conformance_cmd::ConformanceArgs),
    /// Run a worker on staged inputs and ingest its out/: `airlock worker --in NAME=PATH --out DIR -- PROGRAM`.
    Worker(Box<crate::worker_cmd::WorkerArgs>),
    /// Call a Python function with JSON arguments: `airlock call module:function --args '{"x":1}'`.
    Call(Box<crate::call_cmd::CallArgs>),
    /// Run code given as a string or on stdin: `airlock exec python 'print(1)'`, `airlock exec python - < job.py`.
    Exec(Box<crate::exec_cmd::ExecArgs>),
    /// Run the daemon (`airlockd`) with these arguments, e.g. `airlock serve --check-config`.
    #[command(disable_help_flag = true)]
    Serve {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Serve the sandbox as MCP tools over stdio: runs `airlock-mcp ARGS` (see `airlock mcp --help`).
    #[command(disable_help_flag = true)]
    Mcp {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ProfileCommand {
    /// Print the fully resolved policy of a built-in profile or a profile file, as TOML.
    Show { profile: String },
    /// Validate a profile file; errors name the line, the key and what is allowed.
    Check { file: PathBuf },
}

pub fn dispatch(cli: Cli) -> Result<u8> {
    match cli.command {
        Commands::Run(args) => crate::run::run(*args),
        Commands::Serve { args } => crate::serve_cmd::serve(args),
        Commands::Profile(ProfileCommand::Show { profile }) => {
            let policy = airlock::policy::load_profile(&profile)?;
            print!("# resolved profile: {profile}\n{}", policy.to_toml());
            Ok(0)
        }
        Commands::Profile(ProfileCommand::Check { file }) => {
            let path = file.to_str().context("profile path is not valid UTF-8")?;
            let reference = if path.contains('/') {
                path.to_string()
            } else {
                format!("./{path}")
            };
            airlock::policy::load_profile(&reference)?;
            println!("{}: ok", file.display());
            Ok(0)
        }
        Commands::Doctor { json } => doctor(json),
        Commands::Conformance(args) => crate::conformance_cmd::run(args),
        Commands::Worker(args) => crate::worker_cmd::worker(*args),
        Commands::Call(args) => crate::call_cmd::call_tool(*args),
        Commands::Exec(args) => crate::exec_cmd::exec(*args),
        Commands::Mcp { args } => mcp(&args),
    }
}

/// Replaces this process with `airlock-mcp` (next to this binary, else on PATH): the MCP
/// server lives in its own crate so that the per-run init stays this lean binary.
fn mcp(args: &[String]) -> Result<u8> {
    use std::os::unix::process::CommandExt;
    let program = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("airlock-mcp")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("airlock-mcp"));
    let error = std::process::Command::new(&program).args(args).exec();
    anyhow::bail!(
        "cannot run {}: {error}; install airlock-mcp next to airlock or on PATH",
        program.display()
    )
}

fn doctor(json: bool) -> Result<u8> {
    let report = airlock::doctor::diagnose(&Default::default());
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let names = |layers: &[airlock::Layer]| {
        layers
            .iter()
            .map(|l| airlock::result::layer_name(*l))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("kernel            {}", report.kernel);
    println!("running as root   {}", report.running_as_root);
    println!("landlock ABI      {}", report.landlock_abi);
    println!(
        "seccomp           {}",
        if report.seccomp { "yes" } else { "no" }
    );
    println!(
        "cgroup            {} [{}]",
        report.cgroup.version.as_deref().unwrap_or("unusable"),
        report.cgroup.controllers.join(", ")
    );
    for problem in &report.cgroup.problems {
        println!("  problem: {problem}");
    }
    println!(
        "runtime dir       {} ({})",
        report.runtime_dir.path, report.runtime_dir.filesystem
    );
    if let Some(note) = &report.runtime_dir.note {
        println!("  note: {note}");
    }
    println!("\nbackends:");
    for b in &report.backends {
        println!(
            "  {:<8} level={:?} available={} layers: {}",
            b.name,
            b.level,
            b.available,
            names(&b.layers)
        );
        for problem in &b.problems {
            println!("    problem: {problem}");
        }
        for note in &b.notes {
            println!("    note: {note}");
        }
    }
    println!("\ncontainer runtimes (--container-runtime, `auto` takes the first usable):");
    for r in &report.container_runtimes {
        match &r.problem {
            None => println!("  {:<8} usable", r.name),
            Some(problem) => println!("  {:<8} not usable: {problem}", r.name),
        }
    }
    println!("\nprofiles:");
    for p in &report.profiles {
        println!(
            "  {:<10} backend={} runs={} layers: {}",
            p.name,
            p.backend.as_deref().unwrap_or("-"),
            p.runs,
            names(&p.layers)
        );
        if !p.missing_required.is_empty() {
            println!("    missing required: {}", names(&p.missing_required));
        }
        if let Some(note) = &p.note {
            println!("    note: {note}");
        }
    }
    Ok(0)
}

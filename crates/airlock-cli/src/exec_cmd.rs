//! `airlock exec`: run code given as a string with a registered interpreter, e.g.
//! `airlock exec python 'print(1)'`. Unknown or disallowed interpreters are refused (exit 125).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use airlock::interp::InterpreterRegistry;
use airlock::{Input, RunResult, Sandbox};

use crate::sandbox_flags::{print_warnings, ProfileFlags};

/// Environment variable naming the interpreter registry file when --interpreters is absent.
pub const REGISTRY_ENV: &str = "AIRLOCK_INTERPRETERS";

#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub sandbox: ProfileFlags,
    /// Interpreter registry TOML (default: $AIRLOCK_INTERPRETERS, else the built-ins).
    #[arg(long, value_name = "FILE")]
    pub interpreters: Option<PathBuf>,
    /// Only these interpreters may run (comma-separated names or aliases); overrides the
    /// registry's allowed_programs.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub allow: Option<Vec<String>>,
    /// Print one JSON result object instead of streaming the program's output.
    #[arg(long)]
    pub json: bool,
    /// Run on a sandbox prepared ahead, with Python started in it (see `run --warm`; stdin
    /// is read to its end first).
    #[arg(long)]
    pub warm: bool,
    /// With --warm and Python: modules the started interpreter imports first.
    #[arg(long, value_name = "MODULES", value_delimiter = ',', requires = "warm")]
    pub preload: Vec<String>,
    /// The interpreter, e.g. python, node, bash.
    pub interpreter: String,
    /// The code to run.
    pub code: String,
    /// Arguments passed to the program after the code.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

pub fn exec(args: ExecArgs) -> Result<u8> {
    let registry = registry(&args)?;
    let invocation = registry.invocation(&args.interpreter, &args.code, &args.args)?;
    invocation.check_installed()?;
    let sandbox = Sandbox::with_options(args.sandbox.policy()?, args.sandbox.options())?;
    let (program, rest) = invocation
        .argv
        .split_first()
        .context("interpreter argv is empty")?;
    let pool = args
        .warm
        .then(|| crate::warm_cmd::pool_for_code(&sandbox, &invocation.argv, &args.preload))
        .transpose()?;
    let mut command = match &pool {
        Some(pool) => pool.command(program.clone()),
        None => sandbox.command(program.clone()),
    }
    .args(rest.iter().cloned());
    command = match (invocation.stdin, &pool) {
        (Some(code), _) => command.stdin(code),
        (None, Some(_)) => command.stdin(crate::warm_cmd::read_stdin()?),
        (None, None) => command.stdin_from(Input::Inherit),
    };
    for (key, value) in &args.sandbox.env {
        command = command.env(key.clone(), value.clone());
    }
    if !args.json {
        command = command.forward_output();
    }
    let result = command.run()?;
    report(&args, &result)?;
    Ok(u8::try_from(result.cli_exit_code()).unwrap_or(125))
}

fn registry(args: &ExecArgs) -> Result<InterpreterRegistry> {
    let file = args
        .interpreters
        .clone()
        .or_else(|| std::env::var_os(REGISTRY_ENV).map(PathBuf::from));
    let mut registry = match file {
        Some(path) => InterpreterRegistry::load(&path)?,
        None => InterpreterRegistry::builtin(),
    };
    if let Some(allow) = &args.allow {
        registry.set_allowed(allow)?;
    }
    Ok(registry)
}

fn report(args: &ExecArgs, result: &RunResult) -> Result<()> {
    args.sandbox.network.write_log(result.network.as_ref())?;
    print_warnings(&result.warnings);
    if args.json {
        println!("{}", serde_json::to_string_pretty(result)?);
        return Ok(());
    }
    if let Some(error) = &result.error {
        eprintln!("airlock: sandbox error: {error}");
    }
    if let Some(network) = &result.network {
        crate::net_flags::print_report(network);
    }
    Ok(())
}

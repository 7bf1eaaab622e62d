//! `airlock exec`: run code given as a string (or on stdin) with a registered interpreter,
//! e.g. `airlock exec python 'print(1)'` or `airlock exec python - < job.py`. Unknown or
//! disallowed interpreters are refused (exit 125).

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use airlock::interp::InterpreterRegistry;
use airlock::warm::WarmPool;
use airlock::{Input, Sandbox};

use crate::outcome::{run_reported, OutputFlags};
use crate::sandbox_flags::SandboxFlags;

/// Environment variable naming the interpreter registry file when --interpreters is absent.
pub const REGISTRY_ENV: &str = "AIRLOCK_INTERPRETERS";

/// The code argument that means "read the code on stdin".
const CODE_ON_STDIN: &str = "-";

#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub sandbox: SandboxFlags,
    #[command(flatten)]
    pub output: OutputFlags,
    /// Interpreter registry TOML (default: $AIRLOCK_INTERPRETERS, else the built-ins).
    #[arg(long, value_name = "FILE")]
    pub interpreters: Option<PathBuf>,
    /// Only these interpreters may run (comma-separated names or aliases); overrides the
    /// registry's allowed_programs.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub allow: Option<Vec<String>>,
    /// Run on a sandbox prepared ahead, with Python started in it (see `run --warm`; stdin
    /// is read to its end first).
    #[arg(long)]
    pub warm: bool,
    /// Run Python code in a child forked from an interpreter zygote (see `run --zygote`; the
    /// default for an interpreter whose registry entry has `zygote = { preload = [...] }`).
    #[arg(long, conflicts_with = "warm")]
    pub zygote: bool,
    /// With --warm or a zygote and Python: modules the interpreter imports first.
    #[arg(long, value_name = "MODULES", value_delimiter = ',')]
    pub preload: Vec<String>,
    /// The interpreter, e.g. python, node, bash.
    pub interpreter: String,
    /// The code to run; `-` or nothing reads it from stdin (any size: code too large for one
    /// argument reaches the interpreter on its stdin).
    pub code: Option<String>,
    /// Arguments passed to the program after the code.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

pub fn exec(args: ExecArgs) -> Result<u8> {
    if let Some(preload) = zygote_preload(&args)? {
        return exec_on_zygote(&args, &preload);
    }
    // A warm run's pool outlives the run (its sandbox is reaped when the pool is dropped).
    let mut pool = None;
    Ok(run_reported(&args.output, &args.sandbox.network, || {
        build_command(&args, &mut pool)
    }))
}

fn build_command(args: &ExecArgs, pool: &mut Option<WarmPool>) -> Result<airlock::Command> {
    let code = code(args)?;
    let invocation = registry(args)?.invocation(&args.interpreter, &code, &args.args)?;
    invocation.check_installed()?;
    let sandbox = Sandbox::with_options(args.sandbox.policy("untrusted")?, args.sandbox.options())?;
    let (program, rest) = invocation
        .argv
        .split_first()
        .context("interpreter argv is empty")?;
    let pool = match args.warm {
        true => Some(&*pool.insert(crate::warm_cmd::pool_for_code(
            &sandbox,
            &invocation.argv,
            &args.preload,
        )?)),
        false => None,
    };
    let mut command = match pool {
        Some(pool) => pool.command(program.clone()),
        None => sandbox.command(program.clone()),
    }
    .args(rest.iter().cloned())
    .cancel_on_signals(true);
    command = match (invocation.stdin, pool) {
        (Some(code), _) => command.stdin(code),
        (None, Some(_)) => command.stdin(crate::warm_cmd::read_stdin()?),
        (None, None) => command.stdin_from(Input::Inherit),
    };
    for (key, value) in &args.sandbox.env {
        command = command.env(key.clone(), value.clone());
    }
    if !args.output.captures() {
        command = command.forward_output();
    }
    Ok(command)
}

/// The modules to preload when the run goes to a zygote: asked for with `--zygote`, or
/// configured for the interpreter in the registry (unless `--warm` asks for a warm pool).
fn zygote_preload(args: &ExecArgs) -> Result<Option<Vec<String>>> {
    let registry = registry(args)?;
    let configured = registry
        .get(&args.interpreter)
        .and_then(|(_, interpreter)| interpreter.zygote.clone());
    let preload = |from: Vec<String>| match args.preload.is_empty() {
        true => from,
        false => args.preload.clone(),
    };
    Ok(match (args.zygote, configured) {
        (_, Some(config)) if !args.warm => Some(preload(config.preload)),
        (true, None) => Some(args.preload.clone()),
        _ if !args.preload.is_empty() && !args.warm => {
            anyhow::bail!("--preload needs --warm or --zygote (or a zygote in the registry)")
        }
        _ => None,
    })
}

fn exec_on_zygote(args: &ExecArgs, preload: &[String]) -> Result<u8> {
    let registry = registry(args)?;
    let code = code(args)?;
    // The registry's checks (known, allowed, installed) hold for the zygote too.
    registry
        .invocation(&args.interpreter, &code, &args.args)?
        .check_installed()?;
    let (_, interpreter) = registry
        .get(&args.interpreter)
        .context("the interpreter is not in the registry")?;
    let program = &interpreter.argv[0];
    if !program
        .rsplit('/')
        .next()
        .is_some_and(|n| n.starts_with("python"))
    {
        anyhow::bail!("a zygote runs Python code only; {program} is not Python (drop --zygote)");
    }
    let code = crate::zygote_cmd::ZygoteCode {
        program,
        code: &code,
        args: &args.args,
        preload,
    };
    Ok(crate::zygote_cmd::run_code(
        &args.sandbox,
        &args.output,
        &code,
    ))
}

/// The code: the argument, or all of stdin for `-` or none.
fn code(args: &ExecArgs) -> Result<String> {
    match args.code.as_deref() {
        Some(code) if code != CODE_ON_STDIN => Ok(code.to_string()),
        _ => {
            let mut code = Vec::new();
            std::io::stdin()
                .read_to_end(&mut code)
                .context("cannot read the code from stdin")?;
            String::from_utf8(code).context("the code on stdin is not valid UTF-8")
        }
    }
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

//! `airlock run`: builds the policy from the profile and flags, runs, reports.

use anyhow::{Context, Result};
use clap::Args;

use airlock::warm::WarmPool;
use airlock::{Input, Sandbox};

use crate::outcome::{run_reported, OutputFlags, Reporter};
use crate::sandbox_flags::SandboxFlags;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub sandbox: SandboxFlags,
    #[command(flatten)]
    pub output: OutputFlags,
    /// Keep the run's working directory afterwards (its path is in the result).
    #[arg(long)]
    pub keep: bool,
    /// Give the program a terminal of its own, relayed to this one (an interactive shell:
    /// keys pass through as typed, Ctrl-C included; output caps do not apply).
    #[arg(long)]
    pub tty: bool,
    /// Print the plan of the run as JSON (backend and why, layers, mounts, limits) and run
    /// nothing: no run directory, cgroup or process is created.
    #[arg(long)]
    pub dry_run: bool,
    /// Run on a sandbox prepared ahead (the warm path a daemon uses; stdin is read to its end
    /// first). One CLI call gains no time from it: it prepares the sandbox, then runs.
    #[arg(long, conflicts_with_all = ["tty", "keep", "dry_run"])]
    pub warm: bool,
    /// Run Python code (`-- python3 [-B] -c CODE [ARGS...]`) in a child forked from an
    /// interpreter zygote (see docs/warm.md). One CLI call starts the template, runs once and
    /// stops it: it gains no time; it exercises the zygote path end to end.
    #[arg(long, conflicts_with_all = ["tty", "keep", "dry_run", "warm"])]
    pub zygote: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

pub fn run(args: RunArgs) -> Result<u8> {
    if args.dry_run {
        return Ok(dry_run(&args));
    }
    if args.zygote {
        return Ok(crate::zygote_cmd::run(
            &args.sandbox,
            &args.output,
            &args.command,
        ));
    }
    // A warm run's pool outlives the run (its sandbox is reaped when the pool is dropped).
    let mut pool = None;
    Ok(run_reported(&args.output, &args.sandbox.network, || {
        build_command(&args, &mut pool)
    }))
}

fn build_command(args: &RunArgs, pool: &mut Option<WarmPool>) -> Result<airlock::Command> {
    let policy = args.sandbox.policy("untrusted")?;
    let sandbox = Sandbox::with_options(policy, args.sandbox.options())?;
    let (program, rest) = args
        .command
        .split_first()
        .context("no program given after --")?;
    let pool = match args.warm {
        true => Some(&*pool.insert(crate::warm_cmd::one_sandbox(&sandbox)?)),
        false => None,
    };
    let mut command = match pool {
        Some(pool) => pool
            .command(program.clone())
            .stdin(crate::warm_cmd::read_stdin()?),
        None => sandbox.command(program.clone()).stdin_from(Input::Inherit),
    }
    .args(rest.iter().cloned())
    .keep_workdir(args.keep)
    .tty(args.tty)
    .cancel_on_signals(true);
    for (key, value) in &args.sandbox.env {
        command = command.env(key.clone(), value.clone());
    }
    if !args.output.captures() {
        command = command.forward_output();
    }
    Ok(command)
}

/// Prints the plan as JSON without running anything; a plan the run would refuse exits as
/// the refused run would, with its error on stderr (stdout holds the plan alone).
fn dry_run(args: &RunArgs) -> u8 {
    let (output, mut reporter) = (&args.output, Reporter::printing(&args.output));
    let plan = match build_command(args, &mut None).and_then(|command| Ok(command.plan()?)) {
        Ok(plan) => plan,
        Err(error) => return reporter.refused(&error),
    };
    let text = match output.json && !output.pretty {
        true => serde_json::to_string(&plan),
        false => serde_json::to_string_pretty(&plan),
    };
    println!("{}", text.unwrap_or_default());
    match plan.refusal() {
        Some(refused) => {
            eprintln!("airlock: error [{}]: {refused}", refused.kind().name());
            crate::SETUP_FAILURE
        }
        None => 0,
    }
}

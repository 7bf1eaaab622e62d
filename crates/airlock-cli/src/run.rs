//! `airlock run`: builds the policy from the profile and flags, runs, reports.

use anyhow::{bail, Context, Result};

use airlock::policy::{self, BackendChoice, Policy};
use airlock::{Input, RunResult, Sandbox};

use crate::cli::{BackendArg, RunArgs};
use crate::sandbox_flags::print_warnings;

pub fn run(args: RunArgs) -> Result<u8> {
    let policy = build_policy(&args)?;
    let sandbox = Sandbox::with_options(policy, args.profile.options())?;
    let (program, rest) = args
        .command
        .split_first()
        .context("no program given after --")?;
    let pool = args
        .warm
        .then(|| crate::warm_cmd::one_sandbox(&sandbox))
        .transpose()?;
    let mut command = match &pool {
        Some(pool) => pool
            .command(program.clone())
            .stdin(crate::warm_cmd::read_stdin()?),
        None => sandbox.command(program.clone()).stdin_from(Input::Inherit),
    }
    .args(rest.iter().cloned())
    .keep_workdir(args.keep)
    .tty(args.tty);
    for (key, value) in &args.profile.env {
        command = command.env(key.clone(), value.clone());
    }
    if args.dry_run {
        return dry_run(&command);
    }
    if !args.json {
        command = command.forward_output();
    }
    let result = command.run()?;
    report(&args, &result)?;
    Ok(exit_code(&result))
}

/// Prints the plan as JSON without running anything; a plan the run would refuse exits as
/// the refused run would, with its error.
fn dry_run(command: &airlock::Command) -> Result<u8> {
    let plan = command.plan()?;
    println!("{}", serde_json::to_string_pretty(&plan)?);
    match plan.refusal() {
        Some(refused) => Err(refused.into()),
        None => Ok(0),
    }
}

fn exit_code(result: &RunResult) -> u8 {
    u8::try_from(result.cli_exit_code()).unwrap_or(125)
}

fn report(args: &RunArgs, result: &RunResult) -> Result<()> {
    let json = serde_json::to_string_pretty(result)?;
    if let Some(path) = &args.result {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("cannot write the result to {}", path.display()))?;
    }
    args.profile.network.write_log(result.network.as_ref())?;
    print_warnings(&result.warnings);
    if args.json {
        println!("{json}");
        return Ok(());
    }
    if let Some(network) = &result.network {
        crate::net_flags::print_report(network);
    }
    if let Some(error) = &result.error {
        eprintln!("airlock: sandbox error: {error}");
    } else if result.status != airlock::RunStatus::Exited
        && result.status != airlock::RunStatus::Signaled
    {
        let status = serde_json::to_value(result.status)?;
        eprintln!(
            "airlock: run ended: {} after {} ms",
            status.as_str().unwrap_or("?"),
            result.wall_ms
        );
    }
    if result.stdout_truncated || result.stderr_truncated {
        eprintln!(
            "airlock: output truncated (stdout {} bytes, stderr {} bytes written)",
            result.stdout_bytes, result.stderr_bytes
        );
    }
    Ok(())
}

fn build_policy(args: &RunArgs) -> Result<Policy> {
    let mut policy = policy::load_profile(&args.profile.profile)?;
    if let Some(tier) = &args.tier {
        if !policy::tier(&mut policy, tier) {
            bail!(
                "unknown tier {tier:?} for --tier: use one of {}",
                policy::tier_names().join(", ")
            );
        }
    }
    if let Some(backend) = args.backend {
        policy.backend = match backend {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Native => BackendChoice::Native,
            BackendArg::Bwrap => BackendChoice::Bwrap,
            BackendArg::None => BackendChoice::None,
            BackendArg::Gvisor => BackendChoice::Gvisor,
            BackendArg::Container => BackendChoice::Container,
        };
    }
    // After the tier, so flags override it.
    args.profile.adjust(&mut policy)?;
    apply_run_limit_flags(&mut policy, args);
    policy.filesystem.read_write.extend(
        args.read_write
            .iter()
            .map(|p| absolute(p))
            .collect::<Result<Vec<_>>>()?,
    );
    if let Some(dir) = &args.workdir {
        policy.filesystem.workdir = Some(absolute(dir)?);
    }
    policy
        .validate()
        .map_err(|e| anyhow::anyhow!("{e} (from the command-line flags)"))?;
    Ok(policy)
}

/// The limits only `run` has flags for (the shared ones are applied by `ProfileFlags`).
fn apply_run_limit_flags(policy: &mut Policy, args: &RunArgs) {
    let l = &mut policy.limits;
    set(&mut l.grace, args.grace);
    set(&mut l.file_size, args.fsize);
    set(&mut l.disk, args.disk);
    set(&mut l.stdout, args.stdout_cap);
    set(&mut l.stderr, args.stderr_cap);
    set(&mut l.open_files, args.nofile);
    set(&mut l.files, args.files);
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

fn absolute(path: &std::path::Path) -> Result<std::path::PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}

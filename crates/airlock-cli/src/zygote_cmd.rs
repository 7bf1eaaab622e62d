//! `airlock run --zygote -- python3 [-B] -c CODE [ARGS...]`: the code runs in a child forked
//! from an interpreter zygote (`airlock::zygote`) instead of a fresh interpreter. One CLI call
//! starts the template, runs once and stops it: it gains no time, and exists so that the
//! zygote path can be exercised end to end (the attack suite runs through it).

use anyhow::{bail, Context, Result};

use airlock::zygote::{ZygoteOptions, ZygoteRun};
use airlock::{RunResult, Sandbox};

use crate::outcome::{OutputFlags, Reporter};
use crate::sandbox_flags::SandboxFlags;

/// Python code for a zygote: the program the plan is made for, the code, `sys.argv[1:]` and
/// the modules the template imports first.
pub struct ZygoteCode<'a> {
    pub program: &'a str,
    pub code: &'a str,
    pub args: &'a [String],
    pub preload: &'a [String],
}

/// Runs `command` on a zygote of the sandbox the flags describe and reports it.
pub fn run(sandbox: &SandboxFlags, output: &OutputFlags, command: &[String]) -> u8 {
    match python_code(command) {
        Ok((program, code, args)) => {
            let code = ZygoteCode {
                program,
                code,
                args,
                preload: &[],
            };
            run_code(sandbox, output, &code)
        }
        Err(error) => Reporter::new(output).0.refused(&error),
    }
}

/// Runs `code` on a zygote (`airlock exec` with a zygote configured) and reports it.
pub fn run_code(sandbox: &SandboxFlags, output: &OutputFlags, code: &ZygoteCode) -> u8 {
    let (mut reporter, refusal) = Reporter::new(output);
    if let Some(error) = refusal {
        return reporter.refused(&error);
    }
    match run_once(sandbox, code) {
        Ok(mut result) => {
            if !output.captures() {
                forward(&mut result);
            }
            reporter.finished(&result)
        }
        Err(error) => reporter.refused(&error),
    }
}

fn run_once(flags: &SandboxFlags, code: &ZygoteCode) -> Result<RunResult> {
    let sandbox = Sandbox::with_options(flags.policy("untrusted")?, flags.options())?;
    let mut options = ZygoteOptions::python(&[]);
    options.program = code.program.into();
    options.preload = code.preload.to_vec();
    // One run: one child forked ahead (the path a long-lived caller's runs take), not more.
    options.ready_children = 1;
    let zygote = sandbox.zygote(options)?;
    let run = ZygoteRun {
        code: code.code.to_string(),
        args: code.args.to_vec(),
        env: flags.env.clone(),
        stdin: crate::warm_cmd::read_stdin()?,
        cancel: None,
        events: None,
    };
    Ok(zygote.run(&run)?)
}

/// `python3 [-B] -c CODE [ARGS...]`: the program, the code and its arguments. `-B` (write no
/// bytecode) changes nothing in a sandbox whose system files are read-only.
fn python_code(command: &[String]) -> Result<(&str, &str, &[String])> {
    let (program, rest) = command.split_first().context("no program given after --")?;
    let name = std::path::Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if !name.starts_with("python") {
        bail!("--zygote runs Python code: `-- /usr/bin/python3 -c CODE [ARGS...]`");
    }
    let rest = match rest.first().map(String::as_str) {
        Some("-B") => &rest[1..],
        _ => rest,
    };
    match rest {
        [flag, code, args @ ..] if flag == "-c" => Ok((program, code, args)),
        _ => bail!("--zygote runs Python code: `-- {program} [-B] -c CODE [ARGS...]`"),
    }
}

/// Without capture the program's output goes to this process's own, as a cold run's would
/// (after the run: a zygote run's output is collected).
fn forward(result: &mut RunResult) {
    use std::io::Write;
    if let Some(bytes) = result.stdout_raw() {
        let _ = std::io::stdout()
            .write_all(&bytes)
            .and_then(|()| std::io::stdout().flush());
    }
    if let Some(bytes) = result.stderr_raw() {
        let _ = std::io::stderr()
            .write_all(&bytes)
            .and_then(|()| std::io::stderr().flush());
    }
    (result.stdout, result.stderr) = (None, None);
    (result.stdout_base64, result.stderr_base64) = (None, None);
}

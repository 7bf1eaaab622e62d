//! `airlock run --warm`: the run goes to a sandbox prepared ahead, through the same library
//! path a daemon's runs take (a prepared sandbox waiting for its command, the outcome before
//! the teardown). A one-shot CLI prepares that sandbox itself, so it gains no time: the flag
//! exists so that the warm path can be exercised end to end (the attack suite runs through
//! it). Speed comes from a long-lived process that keeps the pool: the daemon.

use std::io::Read;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use airlock::warm::{WarmInterpreter, WarmOptions, WarmPool};
use airlock::Sandbox;

/// A pool holding one prepared sandbox, ready.
pub fn one_sandbox(sandbox: &Sandbox) -> Result<WarmPool> {
    one_ready(sandbox, None)
}

/// A pool for `airlock exec --warm`: with Python started in the sandbox when the invocation
/// is `python -c CODE ...` (the shape the started interpreter runs), else a plain one.
pub fn pool_for_code(sandbox: &Sandbox, argv: &[String], preload: &[String]) -> Result<WarmPool> {
    let is_python = argv.get(1).is_some_and(|a| a == "-c")
        && argv.first().is_some_and(|p| {
            p.rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with("python"))
        });
    if !is_python && !preload.is_empty() {
        bail!("--preload needs a Python interpreter run as `python -c CODE`");
    }
    let interpreter = is_python.then(|| {
        let modules: Vec<&str> = preload.iter().map(String::as_str).collect();
        WarmInterpreter::python(&argv[0], &modules)
    });
    one_ready(sandbox, interpreter)
}

fn one_ready(sandbox: &Sandbox, interpreter: Option<WarmInterpreter>) -> Result<WarmPool> {
    let mut options = WarmOptions::new(1);
    options.parallel = 1;
    options.refill = false;
    options.interpreter = interpreter;
    let pool = sandbox.warm(options)?;
    if !pool.wait_ready(1, Duration::from_secs(30)) {
        let stats = pool.stats();
        bail!(
            "no warm sandbox became ready: {}",
            stats.last_error.as_deref().unwrap_or("timed out")
        );
    }
    Ok(pool)
}

/// A warm run takes its stdin as bytes: the CLI's own, read to its end; a terminal is never
/// handed over (the program gets empty stdin).
pub fn read_stdin() -> Result<Vec<u8>> {
    use std::io::IsTerminal;
    let mut bytes = Vec::new();
    if std::io::stdin().is_terminal() {
        return Ok(bytes);
    }
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("cannot read stdin for the warm run")?;
    Ok(bytes)
}

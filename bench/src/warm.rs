//! The warm configurations: runs handed to sandboxes a [`WarmPool`] prepared ahead, timed in
//! this process from the call to the result (no CLI process per run, as a daemon or library
//! caller runs them). Between measured runs of any pair, every pool is left to settle (full,
//! nothing being prepared or torn down), so its background work never lands on a measured run.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::warm::{WarmInterpreter, WarmOptions, WarmPool};
use airlock::{Sandbox, SandboxOptions};

use crate::tools::{Tool, SNIPPET};

/// The warm configuration the targets are about: profile `untrusted`, every layer.
pub const WARM: &str = "airlock-warm";
/// The same with Python started in each sandbox, `json` and `re` imported: the snippet's
/// code is all a run hands it.
pub const WARM_PYTHON: &str = "airlock-warm-python";

/// Prepared sandboxes kept by each warm configuration.
const TARGET: usize = 2;

/// The warm tools, or a note on why there are none.
pub fn tools(airlock: &Path, notes: &mut Vec<String>) -> Vec<Tool> {
    let python = WarmInterpreter::python("/usr/bin/python3", &["json", "re"]);
    let mut tools = Vec::new();
    for (name, interpreter) in [(WARM, None), (WARM_PYTHON, Some(python))] {
        match pool(airlock, interpreter.clone()) {
            Ok(pool) => {
                let mut tool = Tool::prefixed(name, Vec::new());
                if interpreter.is_some() {
                    let snippet = crate::tools::all_workloads()
                        .into_iter()
                        .find(|w| w.name == SNIPPET);
                    tool.per_workload = snippet.into_iter().map(|w| (w.name, w.argv)).collect();
                }
                tool.warm = Some(Arc::new(pool));
                tools.push(tool);
            }
            Err(why) => notes.push(format!("{name}: {why}, skipped")),
        }
    }
    tools
}

fn pool(airlock: &Path, interpreter: Option<WarmInterpreter>) -> Result<WarmPool, String> {
    let policy = airlock::policy::load_profile("untrusted").map_err(|e| e.to_string())?;
    let options = SandboxOptions {
        init_program: Some(airlock.to_path_buf()),
        ..SandboxOptions::default()
    };
    let mut warm = WarmOptions::new(TARGET);
    warm.interpreter = interpreter;
    let pool = Sandbox::with_options(policy, options)
        .and_then(|sandbox| sandbox.warm(warm))
        .map_err(|e| e.to_string())?;
    if !pool.wait_ready(TARGET, Duration::from_secs(30)) {
        return Err(format!("no sandbox became ready: {:?}", pool.stats()));
    }
    Ok(pool)
}

/// Waits until every pool is at rest.
pub fn settle(tools: &[&WarmPool]) {
    for pool in tools {
        pool.wait_settled(Duration::from_secs(10));
    }
}

/// One warm run: wall time from the call to the result, and the run's own CPU time.
pub fn time_once(pool: &WarmPool, argv: &[String]) -> Result<(Duration, Duration), String> {
    let (program, rest) = argv.split_first().ok_or("empty argv")?;
    let start = Instant::now();
    // A pool with a started interpreter takes `python3 -c CODE` as the code to hand it.
    let command = match (
        pool.code(rest.get(1).cloned().unwrap_or_default()),
        rest.first(),
    ) {
        (Ok(code), Some(flag)) if flag == "-c" => code,
        _ => pool.command(program.clone()).args(rest.iter().cloned()),
    };
    let result = command.discard_output().run();
    let elapsed = start.elapsed();
    let result = result.map_err(|e| e.to_string())?;
    if !result.success() {
        return Err(format!(
            "{} ended {:?}: {:?}",
            argv.join(" "),
            result.status,
            result.error
        ));
    }
    if pool.stats().cold_fallbacks > 0 {
        return Err("the run found no prepared sandbox and ran cold".into());
    }
    let cpu = Duration::from_millis(result.cpu_user_ms + result.cpu_sys_ms);
    Ok((elapsed, cpu))
}

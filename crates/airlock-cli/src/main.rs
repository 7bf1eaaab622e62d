//! `airlock`: run untrusted code behind an OS-enforced boundary. A thin layer over the
//! `airlock` library: argument parsing, printing and exit codes live here, nothing else.

mod call_cmd;
mod cli;
mod conformance_cmd;
mod exec_cmd;
mod net_flags;
mod outcome;
mod run;
mod sandbox_flags;
mod serve_cmd;
mod warm_cmd;
mod worker_cmd;
mod zygote_cmd;

use std::process::ExitCode;

use clap::Parser;

/// Exit code for a failure of airlock itself (bad flags, bad profile, sandbox setup).
pub const SETUP_FAILURE: u8 = 125;

fn main() -> ExitCode {
    // The init must start before anything else: no threads, no allocator-heavy setup.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == airlock::init::INIT_ARG)
    {
        airlock::init::init_main();
    }
    // Without root, a Tier-0 program runs as our uid: as a dumpable process we would let it read
    // our /proc/PID/environ (undoing the env scrub) or ptrace us. Non-dumpable makes our /proc
    // entries root-owned. Failure only means an older kernel; the sandbox layers still apply.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_dumpable(false);
    // Only when asked for: building the filter and subscriber costs ~0.1 ms of every run.
    if std::env::var_os("AIRLOCK_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("AIRLOCK_LOG"))
            .with_writer(std::io::stderr)
            .init();
    }
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(e) => return ExitCode::from(refuse_command_line(&e)),
    };
    match cli::dispatch(args) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            let kind = outcome::error_kind(&error);
            eprintln!("airlock: error [{}]: {error:#}", kind.name());
            ExitCode::from(SETUP_FAILURE)
        }
    }
}

/// A command line clap cannot parse: its message on stderr and, for a caller that reads
/// JSON from stdout (`run --json`, `exec --json`, `call`, `worker` into a pipe), the same
/// refusal as any other, in that command's form. `--help` and `--version` exit 0.
fn refuse_command_line(e: &clap::Error) -> u8 {
    let _ = e.print();
    if !e.use_stderr() {
        return 0;
    }
    let rendered = e.render().to_string();
    let first_line = rendered.lines().next().unwrap_or_default();
    let error = anyhow::anyhow!("{}", first_line.trim_start_matches("error: "));
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let flag_before_program =
        |flag: &str| args.iter().take_while(|a| *a != "--").any(|a| a == flag);
    match args.first().and_then(|a| a.to_str()) {
        Some("run" | "exec")
            if flag_before_program("--json") || flag_before_program("--pretty") =>
        {
            outcome::Reporter::json_only().refused_silently(&error);
        }
        Some("call") => {
            let error = airlock::call::ToolError::SandboxError {
                message: format!("{error:#}"),
                error_kind: Some(airlock::ErrorKind::UsageInvalid.into()),
            };
            println!("{}", call_cmd::error_json(&error));
        }
        Some("worker") if !std::io::IsTerminal::is_terminal(&std::io::stdout()) => {
            println!("{}", worker_cmd::refusal_line(&error));
        }
        _ => {}
    }
    SETUP_FAILURE
}

//! `airlock`: run untrusted code behind an OS-enforced boundary. A thin layer over the
//! `airlock` library: argument parsing, printing and exit codes live here, nothing else.

mod call_cmd;
mod cli;
mod conformance_cmd;
mod exec_cmd;
mod net_flags;
mod run;
mod sandbox_flags;
mod warm_cmd;
mod worker_cmd;

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
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { SETUP_FAILURE } else { 0 });
        }
    };
    match cli::dispatch(args) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            match error_kind(&error) {
                Some(kind) => eprintln!("airlock: error [{}]: {error:#}", kind.name()),
                None => eprintln!("airlock: error: {error:#}"),
            }
            ExitCode::from(SETUP_FAILURE)
        }
    }
}

/// The library's kind of a refusal (policy, degraded, not allowed, bad path, ...), for the
/// error line; the CLI's own errors (bad flags, files it writes) have none.
fn error_kind(error: &anyhow::Error) -> Option<airlock::ErrorKind> {
    error.chain().find_map(|cause| {
        if let Some(e) = cause.downcast_ref::<airlock::Error>() {
            return Some(e.kind());
        }
        if let Some(e) = cause.downcast_ref::<airlock::PolicyError>() {
            return Some(e.kind());
        }
        cause
            .downcast_ref::<airlock::interp::InterpError>()
            .map(|e| e.kind())
    })
}

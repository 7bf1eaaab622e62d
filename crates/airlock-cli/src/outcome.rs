//! How `run` and `exec` report an outcome. Every outcome is one [`RunResult`]: a finished run,
//! or a run refused before it started (bad flags, profile, path, an unwritable `--result`
//! file), which is status `sandbox_error` with its `error_kind`. With `--json` it is printed as
//! exactly one compact JSON line on stdout (NDJSON-friendly; `--pretty` indents it for
//! people); `--result FILE` gets it too, whatever the outcome; errors and warnings also go to
//! stderr in every mode.

use std::fs::File;
use std::io::{Seek, Write};
use std::path::PathBuf;

use clap::Args;

use airlock::{ErrorKind, FailureKind, RunResult, RunStatus};

use crate::net_flags::NetworkFlags;
use crate::sandbox_flags::print_warnings;
use crate::SETUP_FAILURE;

// The flags that choose how the outcome is reported.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Output")]
pub struct OutputFlags {
    /// Print one JSON result object on stdout (one line) instead of streaming the program's
    /// output; a refusal prints one too, with status "sandbox_error" and its error_kind.
    #[arg(long)]
    pub json: bool,
    /// Indent the JSON (with --json, or alone).
    #[arg(long)]
    pub pretty: bool,
    /// Also write the JSON result object to this file; a file that cannot be written refuses
    /// the run before anything runs.
    #[arg(long, value_name = "FILE")]
    pub result: Option<PathBuf>,
}

impl OutputFlags {
    /// Whether the program's output is captured into the result instead of streamed.
    pub fn captures(&self) -> bool {
        self.json || self.pretty
    }
}

/// Prints outcomes as the flags ask.
pub struct Reporter {
    json: Option<Style>,
    /// Opened before the run, written after it.
    result_file: Option<File>,
}

#[derive(Clone, Copy)]
enum Style {
    Compact,
    Pretty,
}

impl Reporter {
    /// A reporter for `flags`, and the refusal to report when the result file cannot be
    /// opened for writing.
    pub fn new(flags: &OutputFlags) -> (Reporter, Option<anyhow::Error>) {
        let mut reporter = Reporter::printing(flags);
        let Some(path) = &flags.result else {
            return (reporter, None);
        };
        match open_result_file(path) {
            Ok(file) => {
                reporter.result_file = Some(file);
                (reporter, None)
            }
            Err(error) => (reporter, Some(error)),
        }
    }

    /// A reporter that prints as `flags` ask and writes no result file (a dry run's).
    pub fn printing(flags: &OutputFlags) -> Reporter {
        let json = match (flags.json, flags.pretty) {
            (_, true) => Some(Style::Pretty),
            (true, false) => Some(Style::Compact),
            (false, false) => None,
        };
        Reporter {
            json,
            result_file: None,
        }
    }

    /// A reporter that prints one compact JSON object (a refusal of the command line).
    pub fn json_only() -> Reporter {
        Reporter {
            json: Some(Style::Compact),
            result_file: None,
        }
    }

    /// Reports a run that never started; returns the exit code (125).
    pub fn refused(&mut self, error: &anyhow::Error) -> u8 {
        eprintln!("airlock: error [{}]: {error:#}", error_kind(error).name());
        self.refused_silently(error)
    }

    /// Like [`refused`](Self::refused), for an error already printed on stderr.
    pub fn refused_silently(&mut self, error: &anyhow::Error) -> u8 {
        let result = RunResult::not_started(error_kind(error), format!("{error:#}"));
        self.write_result_file(&result);
        self.print_json(&result);
        SETUP_FAILURE
    }

    /// Reports a finished run; returns its exit code.
    pub fn finished(&mut self, result: &RunResult) -> u8 {
        self.write_result_file(result);
        print_warnings(&result.warnings);
        if self.json.is_some() {
            self.print_json(result);
        } else {
            print_human(result);
        }
        u8::try_from(result.cli_exit_code()).unwrap_or(SETUP_FAILURE)
    }

    fn print_json(&self, result: &RunResult) {
        let text = match self.json {
            Some(Style::Compact) => serde_json::to_string(result),
            Some(Style::Pretty) => serde_json::to_string_pretty(result),
            None => return,
        };
        // A reader that went away (`| head`) is no reason to panic.
        let _ = writeln!(std::io::stdout(), "{}", text.unwrap_or_default());
    }

    fn write_result_file(&mut self, result: &RunResult) {
        let Some(file) = &mut self.result_file else {
            return;
        };
        let json = serde_json::to_string_pretty(result).unwrap_or_default();
        let written = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(format!("{json}\n").as_bytes()))
            .and_then(|()| file.flush());
        if let Err(e) = written {
            eprintln!("airlock: error: cannot write the result file: {e}");
        }
    }
}

/// Runs the command `build` makes and reports the outcome as `flags` ask, refusals included
/// (the result file first: one that cannot be written refuses the run before it is built).
/// `--net-log` gets the egress gate's decisions (an empty file when there was no gate).
pub fn run_reported(
    flags: &OutputFlags,
    network: &NetworkFlags,
    build: impl FnOnce() -> anyhow::Result<airlock::Command>,
) -> u8 {
    let (mut reporter, refusal) = Reporter::new(flags);
    if let Some(error) = refusal {
        return reporter.refused(&error);
    }
    let result = match build().and_then(|command| Ok(command.run()?)) {
        Ok(result) => result,
        Err(error) => {
            let _ = network.write_log(None);
            return reporter.refused(&error);
        }
    };
    if let Err(error) = network.write_log(result.network.as_ref()) {
        eprintln!("airlock: error: {error:#}");
    }
    reporter.finished(&result)
}

/// Opens (creating, not yet truncating) the file the result will be written to.
fn open_result_file(path: &std::path::Path) -> anyhow::Result<File> {
    File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|cause| {
            ResultUnwritable {
                path: path.to_path_buf(),
                cause,
            }
            .into()
        })
}

/// The refusal whose kind is `result_unwritable`.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the result to {} ({cause}); nothing was run", path.display())]
struct ResultUnwritable {
    path: PathBuf,
    cause: std::io::Error,
}

/// What a person reads on stderr after the program's own output.
fn print_human(result: &RunResult) {
    if let Some(error) = &result.error {
        eprintln!("airlock: sandbox error: {error}");
    } else if !matches!(result.status, RunStatus::Exited | RunStatus::Signaled) {
        let status = serde_json::to_value(result.status).unwrap_or_default();
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
    if let Some(network) = &result.network {
        crate::net_flags::print_report(network);
    }
    for hint in &result.hints {
        eprintln!("airlock: hint: {hint}");
    }
}

/// The library's kind of a refusal (policy, degraded, not allowed, bad path, ...); the CLI's
/// own errors are usage errors, an unwritable result file is its own kind.
pub fn error_kind(error: &anyhow::Error) -> ErrorKind {
    for cause in error.chain() {
        if let Some(e) = cause.downcast_ref::<airlock::Error>() {
            return e.kind();
        }
        if let Some(e) = cause.downcast_ref::<airlock::PolicyError>() {
            return e.kind();
        }
        if let Some(e) = cause.downcast_ref::<airlock::interp::InterpError>() {
            return e.kind();
        }
        if cause.is::<airlock::policy::InvalidValue>() {
            return ErrorKind::ValueInvalid;
        }
        if cause.is::<ResultUnwritable>() {
            return ErrorKind::ResultUnwritable;
        }
        if cause.is::<std::io::Error>() {
            return ErrorKind::Io;
        }
    }
    ErrorKind::UsageInvalid
}

/// The `error_kind` of a refusal, as a run's result carries it.
pub fn failure_kind(error: &anyhow::Error) -> FailureKind {
    error_kind(error).into()
}

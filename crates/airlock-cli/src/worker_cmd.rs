//! `airlock worker`: stage inputs, run a worker in the sandbox, stream its events, ingest `out/`.
//!
//! On a terminal the events become a progress bar on stderr; otherwise they are NDJSON on
//! stdout (the host form of docs/worker-protocol.md), ended by one `result` line.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use airlock::policy::units::ByteSize;
use airlock::worker::run::{run_worker, EventSummary, WorkerJob, WorkerOutcome, WorkerUpdate};
use airlock::worker::{IngestLimits, InputFile, WorkerEvent, PROTOCOL_VERSION};
use airlock::RunStatus;

use crate::sandbox_flags::{print_warnings, SandboxFlags};

#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub sandbox: SandboxFlags,
    /// An input file staged read-only as in/NAME (repeatable).
    #[arg(long = "in", value_name = "NAME=PATH", value_parser = parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// A JSON file staged as options.json (default: `{}`).
    #[arg(long, value_name = "FILE")]
    pub options: Option<PathBuf>,
    /// Where to copy the worker's out/: must not exist, or be an empty directory.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Most bytes ingested from out/ in total (default 100MiB).
    #[arg(long, value_name = "SIZE")]
    pub max_total_bytes: Option<ByteSize>,
    /// Most entries examined in out/ (default 1000).
    #[arg(long, value_name = "N")]
    pub max_files: Option<u64>,
    /// Largest single file ingested (default 50MiB).
    #[arg(long, value_name = "SIZE")]
    pub max_file_bytes: Option<ByteSize>,
    /// The worker program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

fn parse_input(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH, got {text:?}")),
    }
}

pub fn worker(args: WorkerArgs) -> Result<u8> {
    let mut display = Display::new(std::io::stdout().is_terminal());
    match run(&args, &mut display) {
        Ok(code) => Ok(code),
        Err(error) => Ok(display.refused(&error)),
    }
}

fn run(args: &WorkerArgs, display: &mut Display) -> Result<u8> {
    if args.sandbox.workdir.is_some() {
        anyhow::bail!("--workdir is not for workers: the job directory is the worker's workdir (its inputs are in/, its results go to out/)");
    }
    let policy = args.sandbox.policy("untrusted")?;
    let job = build_job(args)?;
    let outcome = run_worker(&policy, &args.sandbox.options(), &job, |update| {
        display.update(update)
    })?;
    display.finish(&outcome, &job.out_dir)?;
    args.sandbox
        .network
        .write_log(outcome.result.network.as_ref())?;
    Ok(exit_code(&outcome))
}

/// The result line of a worker that never started: the same fields as a finished one's, with
/// status `sandbox_error` and the error's kind.
pub fn refusal_line(error: &anyhow::Error) -> serde_json::Value {
    json!({
        "event": "result",
        "success": false,
        "done_seen": false,
        "status": RunStatus::SandboxError,
        "exit_code": null,
        "signal": null,
        "error": format!("{error:#}"),
        "error_kind": crate::outcome::failure_kind(error),
        "events": EventSummary::default(),
        "ingest": null,
        "v": PROTOCOL_VERSION,
    })
}

fn build_job(args: &WorkerArgs) -> Result<WorkerJob> {
    let mut job = WorkerJob::new(args.command.clone(), &args.out);
    job.inputs = args
        .inputs
        .iter()
        .map(|(name, path)| InputFile::new(name.clone(), path.clone()))
        .collect();
    job.options = match &args.options {
        Some(path) => read_options(path)?,
        None => json!({}),
    };
    job.env = args.sandbox.env.clone();
    job.ingest_limits = ingest_limits(args);
    Ok(job)
}

fn read_options(path: &PathBuf) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read options file {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("options file {} is not valid JSON", path.display()))
}

fn ingest_limits(args: &WorkerArgs) -> IngestLimits {
    let mut limits = IngestLimits::default();
    if let Some(size) = args.max_total_bytes {
        limits.max_total_bytes = size.0;
    }
    if let Some(files) = args.max_files {
        limits.max_files = files;
    }
    if let Some(size) = args.max_file_bytes {
        limits.max_file_bytes = size.0;
    }
    limits
}

/// 0 on success; the worker's own code if it failed; 1 if it exited 0 without `done`.
fn exit_code(outcome: &WorkerOutcome) -> u8 {
    if outcome.success {
        return 0;
    }
    match u8::try_from(outcome.result.cli_exit_code()) {
        Ok(0) => 1,
        Ok(code) => code,
        Err(_) => 125,
    }
}

/// Shows worker updates: a progress bar on a terminal, NDJSON otherwise.
struct Display {
    terminal: bool,
    bar_shown: bool,
}

const BAR_WIDTH: usize = 30;

impl Display {
    fn new(terminal: bool) -> Self {
        Self {
            terminal,
            bar_shown: false,
        }
    }

    fn update(&mut self, update: WorkerUpdate<'_>) {
        match update {
            WorkerUpdate::Stderr(bytes) => {
                self.clear_bar();
                let _ = std::io::stderr().write_all(bytes);
            }
            WorkerUpdate::Event(event) if self.terminal => self.show(event),
            WorkerUpdate::Event(event) => {
                let mut stdout = std::io::stdout().lock();
                let _ = stdout.write_all(event.to_ndjson().as_bytes());
                let _ = stdout.flush();
            }
            _ => {}
        }
    }

    fn show(&mut self, event: &WorkerEvent) {
        match event {
            WorkerEvent::Progress { fraction, message } => {
                draw_bar(*fraction, message.as_deref().unwrap_or(""));
                self.bar_shown = true;
            }
            WorkerEvent::Log { message } => self.line(&format!("worker: {message}")),
            WorkerEvent::Error { line, reason } => {
                self.line(&format!("worker: bad output line ({reason}): {line}"))
            }
            _ => {}
        }
    }

    fn line(&mut self, text: &str) {
        self.clear_bar();
        eprintln!("{}", printable(text));
    }

    fn clear_bar(&mut self) {
        if std::mem::take(&mut self.bar_shown) {
            eprint!("\r\x1b[2K");
        }
    }

    /// Reports a worker that never started: the error on stderr and, for a program reading
    /// the NDJSON stream, its result line. Returns the exit code (125).
    fn refused(&mut self, error: &anyhow::Error) -> u8 {
        self.clear_bar();
        let kind = crate::outcome::error_kind(error);
        eprintln!("airlock: error [{}]: {error:#}", kind.name());
        if !self.terminal {
            println!("{}", refusal_line(error));
        }
        crate::SETUP_FAILURE
    }

    fn finish(&mut self, outcome: &WorkerOutcome, out_dir: &std::path::Path) -> Result<()> {
        self.clear_bar();
        print_warnings(&outcome.result.warnings);
        print_warnings(&outcome.warnings);
        if self.terminal {
            if let Some(network) = &outcome.result.network {
                crate::net_flags::print_report(network);
            }
            eprintln!("{}", summary(outcome, out_dir));
            return Ok(());
        }
        let mut line = json!({
            "event": "result",
            "success": outcome.success,
            "done_seen": outcome.done_seen,
            "status": outcome.result.status,
            "exit_code": outcome.result.exit_code,
            "signal": outcome.result.signal,
            "error": outcome.result.error,
            "error_kind": outcome.result.error_kind,
            "events": outcome.events,
            "ingest": outcome.ingest,
            "v": PROTOCOL_VERSION,
        });
        if let Some(network) = &outcome.result.network {
            line["network"] = json!(network);
        }
        println!("{line}");
        Ok(())
    }
}

fn draw_bar(fraction: f64, message: &str) {
    let filled = ((fraction * BAR_WIDTH as f64).round() as usize).min(BAR_WIDTH);
    let bar = format!("{}{}", "#".repeat(filled), " ".repeat(BAR_WIDTH - filled));
    let message: String = message
        .chars()
        .filter(|c| !c.is_control())
        .take(60)
        .collect();
    eprint!("\r\x1b[2K[{bar}] {:>3.0}% {message}", fraction * 100.0);
    let _ = std::io::stderr().flush();
}

/// The text with control characters escaped, so a worker cannot drive the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

fn summary(outcome: &WorkerOutcome, out_dir: &std::path::Path) -> String {
    let copied = outcome
        .ingest
        .as_ref()
        .map_or(0, |report| report.files.len());
    let skipped = outcome
        .ingest
        .as_ref()
        .map_or(0, |report| report.skipped.len());
    let result = &outcome.result;
    let exited_zero = result.status == RunStatus::Exited && result.exit_code == Some(0);
    let verdict = if outcome.success {
        "worker succeeded".to_string()
    } else if exited_zero {
        "worker failed: it exited 0 without reporting done".to_string()
    } else if let Some(error) = &result.error {
        format!("worker failed: sandbox error: {error}")
    } else {
        let status = serde_json::to_value(result.status).unwrap_or_default();
        format!("worker failed: {status} (exit code {:?})", result.exit_code)
    };
    format!(
        "airlock: {verdict}; {copied} files copied to {}, {skipped} skipped",
        out_dir.display()
    )
}

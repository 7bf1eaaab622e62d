//! Running a worker end to end: stage the job, run the worker in the sandbox while decoding its
//! stdout events, then ingest `out/` under caps and remove the job directory.
//!
//! The job directory becomes the run's working directory (`filesystem.workdir`, bound
//! read-write at the same path), with `in/` bound read-only on top: the inputs are protected by
//! a read-only mount and not only by their permissions, which a worker running as the file
//! owner (a non-root host) could change. Everything in the job directory is a copy, so even a
//! worker that rewrote it could not reach the host's originals.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ingest, stage, EventDecoder, IngestLimits, IngestReport, InputFile, WorkerError};
use super::{StagedJob, WorkerEvent};
use crate::cancel::CancelToken;
use crate::error::Error;
use crate::layer::Layer;
use crate::policy::Policy;
use crate::result::{RunResult, RunStatus};
use crate::rundir::new_run_id;
use crate::{RunEvent, Sandbox, SandboxOptions};

/// Environment variable that tells the worker where its job directory is.
pub const JOB_DIR_ENV: &str = "AIRLOCK_JOB_DIR";

/// How much of the worker's stderr the outcome keeps (the end of it).
pub const STDERR_TAIL_BYTES: usize = 4096;

/// One job for a worker program.
#[derive(Debug, Clone)]
pub struct WorkerJob {
    /// Files staged read-only into `in/`.
    pub inputs: Vec<InputFile>,
    /// Written to `options.json`.
    pub options: serde_json::Value,
    /// Host destination of `out/`: must not exist, or be an empty directory.
    pub out_dir: PathBuf,
    /// The worker program and its arguments.
    pub program: Vec<String>,
    /// Extra environment for the worker (wins over the policy).
    pub env: Vec<(String, String)>,
    /// Caps on what ingestion brings back.
    pub ingest_limits: IngestLimits,
    /// Where the job directory is created (default: the system temp directory). The worker's
    /// user must be able to traverse it.
    pub jobs_root: Option<PathBuf>,
    /// Stops the worker when cancelled (status `cancelled`; a token cancelled before the
    /// worker starts stops the sandbox's set-up). `out/` is still ingested.
    pub cancel: Option<CancelToken>,
}

impl WorkerJob {
    /// A job with no inputs, `null` options and default ingestion caps.
    pub fn new(program: Vec<String>, out_dir: impl Into<PathBuf>) -> Self {
        Self {
            inputs: Vec::new(),
            options: serde_json::Value::Null,
            out_dir: out_dir.into(),
            program,
            env: Vec::new(),
            ingest_limits: IngestLimits::default(),
            jobs_root: None,
            cancel: None,
        }
    }
}

/// Something the worker said while running.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum WorkerUpdate<'a> {
    /// The worker was started with these layers in force (always the first update).
    Started(&'a [Layer]),
    /// A decoded stdout line (an error event for a line that is not a valid event).
    Event(&'a WorkerEvent),
    /// A chunk of the worker's free-form stderr.
    Stderr(&'a [u8]),
    /// A decision of the egress gate (network `allowlist` or `report`).
    Network(&'a airlock_egress::GateEvent),
}

/// Counts of the events a worker emitted.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct EventSummary {
    pub progress: u64,
    pub log: u64,
    /// Stdout lines that were not valid events.
    pub errors: u64,
    /// The last progress fraction reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress: Option<f64>,
}

impl EventSummary {
    fn count(&mut self, event: &WorkerEvent) {
        match event {
            WorkerEvent::Progress { fraction, .. } => {
                self.progress += 1;
                self.last_progress = Some(*fraction);
            }
            WorkerEvent::Log { .. } => self.log += 1,
            WorkerEvent::Error { .. } => self.errors += 1,
            _ => {}
        }
    }
}

/// What happened to a worker job.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WorkerOutcome {
    /// Exit status 0 and a `done` event.
    pub success: bool,
    pub done_seen: bool,
    pub events: EventSummary,
    /// The run itself (stdout and stderr are streamed, so not captured here).
    pub result: RunResult,
    /// The end of the worker's stderr (lossy UTF-8), at most [`STDERR_TAIL_BYTES`].
    pub stderr_tail: String,
    /// What was copied from `out/`; `None` when the sandbox never ran the worker.
    pub ingest: Option<IngestReport>,
    /// Problems that did not change the outcome, e.g. a job directory left behind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Why a worker job could not be carried out (as opposed to the worker failing).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerRunError {
    #[error("worker job has no program; give the worker command after --")]
    NoProgram,
    #[error("failed to stage the worker job: {0}")]
    Stage(WorkerError),
    #[error(transparent)]
    Sandbox(#[from] Error),
    #[error("failed to ingest the worker's out/: {0}")]
    Ingest(WorkerError),
}

/// Runs `job` in a sandbox built from `policy` and `options`, reporting events to `on_update`.
///
/// The policy's `filesystem.workdir` is replaced by the job directory. Ingestion happens
/// whenever the worker ran, successful or not, so a failed job's partial output can be
/// inspected; check [`WorkerOutcome::success`].
pub fn run_worker(
    policy: &Policy,
    options: &SandboxOptions,
    job: &WorkerJob,
    mut on_update: impl FnMut(WorkerUpdate<'_>),
) -> Result<WorkerOutcome, WorkerRunError> {
    if job.program.is_empty() {
        return Err(WorkerRunError::NoProgram);
    }
    check_destination(&job.out_dir)?;
    let staged = stage_job(policy, job)?;
    let outcome = run_and_ingest(policy, options, job, &staged, &mut on_update);
    let cleanup = staged.remove();
    let mut outcome = outcome?;
    if let Err(err) = cleanup {
        let dir = staged.job_dir.display();
        outcome
            .warnings
            .push(format!("failed to remove job directory {dir}: {err}"));
    }
    Ok(outcome)
}

fn check_destination(dest: &Path) -> Result<(), WorkerRunError> {
    let not_empty = || {
        WorkerRunError::Stage(WorkerError::DestNotEmpty {
            path: dest.to_owned(),
        })
    };
    match std::fs::symlink_metadata(dest) {
        Err(_) => Ok(()),
        Ok(meta) if !meta.is_dir() => Err(not_empty()),
        Ok(_) => match std::fs::read_dir(dest).map(|mut d| d.next().is_none()) {
            Ok(true) => Ok(()),
            _ => Err(not_empty()),
        },
    }
}

fn stage_job(policy: &Policy, job: &WorkerJob) -> Result<StagedJob, WorkerRunError> {
    let root = match &job.jobs_root {
        Some(root) => root.clone(),
        None => std::env::temp_dir(),
    };
    let root = std::path::absolute(&root)
        .map_err(|err| WorkerRunError::Stage(WorkerError::io("resolve", &root, err)))?;
    let job_dir = root.join(format!("airlock-job-{}", new_run_id()));
    let owner = worker_identity(policy);
    stage(&job_dir, &job.inputs, &job.options, owner).map_err(|err| {
        let _ = std::fs::remove_dir_all(&job_dir);
        WorkerRunError::Stage(err)
    })
}

/// The uid/gid the worker will run as when it differs from ours (root dropping privileges).
fn worker_identity(policy: &Policy) -> Option<(u32, u32)> {
    let dropping = nix::unistd::geteuid().is_root() && policy.user.drop_root;
    dropping.then_some((policy.user.uid, policy.user.gid))
}

fn job_policy(policy: &Policy, staged: &StagedJob) -> Policy {
    let mut policy = policy.clone();
    policy.filesystem.workdir = Some(staged.job_dir.clone());
    // The job directory is staged for the worker's user (in/ read-only, out/ its own): no
    // owner mapping, which would hand it all of it, and no programs run from out/.
    policy.filesystem.workspace = false;
    // options.json is not bound: binding a file inside the bound workdir needs a writable
    // mount point, and the worker gets a copy of the options anyway.
    policy.filesystem.read_only.push(staged.in_dir.clone());
    policy
}

fn run_and_ingest(
    policy: &Policy,
    options: &SandboxOptions,
    job: &WorkerJob,
    staged: &StagedJob,
    on_update: &mut dyn FnMut(WorkerUpdate<'_>),
) -> Result<WorkerOutcome, WorkerRunError> {
    let sandbox = Sandbox::with_options(job_policy(policy, staged), options.clone())?;
    let (program, args) = job.program.split_first().ok_or(WorkerRunError::NoProgram)?;
    let mut command = sandbox
        .command(program.clone())
        .args(args.iter().cloned())
        .env(JOB_DIR_ENV, staged.job_dir.display().to_string())
        .stream_output();
    for (key, value) in &job.env {
        command = command.env(key.clone(), value.clone());
    }
    if let Some(token) = &job.cancel {
        command = command.cancel_on(token);
    }
    let mut handle = command.spawn()?;
    let mut watch = Watch::default();
    if let Some(events) = handle.events() {
        for event in events {
            watch.observe(event, on_update);
        }
    }
    let result = handle.wait()?;
    watch.finish(on_update);
    let ingest = match result.status {
        RunStatus::SandboxError => None,
        _ => Some(
            ingest(&staged.out_dir, &job.out_dir, &job.ingest_limits)
                .map_err(WorkerRunError::Ingest)?,
        ),
    };
    Ok(watch.into_outcome(result, ingest))
}

/// Decodes the event stream of one run.
#[derive(Default)]
struct Watch {
    decoder: EventDecoder,
    summary: EventSummary,
    done_seen: bool,
    stderr_tail: Vec<u8>,
}

impl Watch {
    fn observe(&mut self, event: RunEvent, on_update: &mut dyn FnMut(WorkerUpdate<'_>)) {
        match event {
            RunEvent::Stdout(chunk) => {
                for decoded in self.decoder.feed(&chunk) {
                    self.deliver(&decoded, on_update);
                }
            }
            RunEvent::Stderr(chunk) => {
                on_update(WorkerUpdate::Stderr(&chunk));
                keep_tail(&mut self.stderr_tail, &chunk, STDERR_TAIL_BYTES);
            }
            RunEvent::Started { layers } => on_update(WorkerUpdate::Started(&layers)),
            RunEvent::Network(event) => on_update(WorkerUpdate::Network(&event)),
        }
    }

    fn deliver(&mut self, event: &WorkerEvent, on_update: &mut dyn FnMut(WorkerUpdate<'_>)) {
        self.summary.count(event);
        self.done_seen |= event.is_done();
        on_update(WorkerUpdate::Event(event));
    }

    fn finish(&mut self, on_update: &mut dyn FnMut(WorkerUpdate<'_>)) {
        for decoded in std::mem::take(&mut self.decoder).finish() {
            self.deliver(&decoded, on_update);
        }
    }

    fn into_outcome(self, result: RunResult, ingest: Option<IngestReport>) -> WorkerOutcome {
        let exited_zero = result.status == RunStatus::Exited && result.exit_code == Some(0);
        WorkerOutcome {
            success: exited_zero && self.done_seen,
            done_seen: self.done_seen,
            events: self.summary,
            stderr_tail: String::from_utf8_lossy(&self.stderr_tail).into_owned(),
            result,
            ingest,
            warnings: Vec::new(),
        }
    }
}

/// Appends `chunk` to `tail`, keeping only the last `max` bytes.
pub(crate) fn keep_tail(tail: &mut Vec<u8>, chunk: &[u8], max: usize) {
    tail.extend_from_slice(chunk);
    if tail.len() > max {
        tail.drain(..tail.len() - max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_tail_keeps_the_end() {
        let mut tail = Vec::new();
        keep_tail(&mut tail, b"abcdef", 4);
        assert_eq!(tail, b"cdef");
        keep_tail(&mut tail, b"gh", 4);
        assert_eq!(tail, b"efgh");
        keep_tail(&mut tail, b"", 4);
        assert_eq!(tail, b"efgh");
    }

    #[test]
    fn summary_counts_events_and_remembers_last_progress() {
        let mut watch = Watch::default();
        let mut seen = Vec::new();
        let mut record = |update: WorkerUpdate<'_>| {
            if let WorkerUpdate::Event(event) = update {
                seen.push(event.clone());
            }
        };
        let chunk =
            b"{\"progress\":0.2}\nnoise\n{\"log\":\"x\"}\n{\"progress\":0.9}\n{\"done\":true}";
        watch.observe(RunEvent::Stdout(chunk.to_vec()), &mut record);
        assert!(
            !watch.done_seen,
            "the unterminated last line is not decoded yet"
        );
        watch.finish(&mut record);
        assert!(watch.done_seen);
        assert_eq!(seen.len(), 5);
        assert_eq!(watch.summary.progress, 2);
        assert_eq!(watch.summary.log, 1);
        assert_eq!(watch.summary.errors, 1);
        assert_eq!(watch.summary.last_progress, Some(0.9));
    }

    #[test]
    fn destination_must_be_absent_or_empty() {
        let root = tempfile::tempdir().unwrap();
        assert!(check_destination(&root.path().join("absent")).is_ok());
        assert!(check_destination(root.path()).is_ok());
        std::fs::write(root.path().join("f"), "x").unwrap();
        assert!(check_destination(root.path()).is_err());
        assert!(check_destination(&root.path().join("f")).is_err());
    }
}

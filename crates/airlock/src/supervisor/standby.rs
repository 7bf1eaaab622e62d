//! Prepared (warm) sandboxes, the supervisor's half: a [`Standby`] is an init started ahead
//! of its run with a spec planned exactly as a cold run's (same backend, root, layers,
//! cgroup and limits) and its pipes already made. Its sandbox is set up up to the program's
//! exec and waits; [`start_on`] hands it a command, after which the run is served and ended
//! by the same code as a cold run. The init sends the outcome before it tears the sandbox
//! down, and the [`StandbySource`] that lent the standby reaps the init in the background.
//!
//! The pool that keeps standbys ready is `crate::warm`; this file knows nothing of it.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::builder::{Command, Input, Sandbox, Sink};
use super::finish::Ending;
use super::launch::{self, InitProcess, Started};
use super::prepare::{self, Effects};
use super::serve;
use crate::error::{Error, SetupError};
use crate::spec::{Confinement, InitEvent, WarmGo};

/// Where a warm command gets its prepared sandbox, and where the sandbox's init goes to be
/// reaped after the run. `crate::warm::WarmPool` is the implementation.
pub trait StandbySource: Send + Sync + std::fmt::Debug {
    /// A ready standby, or `None` when the command should run cold.
    fn take(&self) -> Option<Standby>;
    /// The init of a run that has ended: it is tearing its sandbox down; reap it.
    fn retire(&self, init_pid: u32);
}

/// An init whose sandbox is prepared (or being prepared) and waits for its command.
#[derive(Debug)]
pub struct Standby {
    init: InitProcess,
    control: std::fs::File,
    /// The command pipe's write end; its read end is the sandbox's PID 1's.
    go: std::fs::File,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    events: std::fs::File,
    event_bytes: Vec<u8>,
    workdir: PathBuf,
    backend: String,
    details: Vec<String>,
    warnings: Vec<String>,
}

/// What a standby's init has said so far.
#[derive(Debug)]
pub enum Readiness {
    /// Still setting up.
    Pending,
    /// Set up and waiting for a command.
    Ready,
    /// The setup failed (the sandbox is gone or going).
    Failed(Error),
}

impl Standby {
    /// Starts preparing a sandbox for `sandbox`'s policy and options: plans the run as a cold
    /// one (refusing what a cold run would refuse), then starts its init. Does not wait.
    pub fn prepare(sandbox: &Sandbox) -> Result<Standby, Error> {
        let mut prepared = plan_standby(sandbox, Effects::Run)?;
        prepared.spec.warm = true;
        prepared.spec.argv = Vec::new();
        let (stdin_read, stdin) = launch::pipe()?;
        let (stdout, stdout_write) = launch::pipe()?;
        let (stderr, stderr_write) = launch::pipe()?;
        let stdio = launch::InitStdio {
            stdin: Some(stdin_read),
            stdout: Some(stdout_write),
            stderr: Some(stderr_write),
        };
        let (go_read, go) = launch::pipe()?;
        let (init, control, events) =
            launch::start_executed(&sandbox.options, stdio, go_read, &prepared.spec)?;
        Ok(Standby {
            init,
            control,
            go: std::fs::File::from(go),
            stdin,
            stdout,
            stderr,
            events: std::fs::File::from(events),
            event_bytes: Vec::new(),
            workdir: prepared.spec.workdir.clone(),
            backend: prepared.plan.backend.clone(),
            details: prepared.plan.details.clone(),
            warnings: prepared.warnings,
        })
    }

    /// Whether sandboxes of `sandbox` can be prepared: what a cold run would refuse, and
    /// backends other than native, are refused. Creates nothing.
    pub fn check(sandbox: &Sandbox) -> Result<(), Error> {
        plan_standby(sandbox, Effects::None).map(drop)
    }

    /// The event pipe, to poll for readiness.
    pub fn events_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }

    /// Reads what the init has sent; call when [`Standby::events_fd`] is readable (it blocks
    /// otherwise).
    pub fn read_readiness(&mut self) -> Readiness {
        let mut chunk = [0u8; 4096];
        let n = match self.events.read(&mut chunk) {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        if n == 0 {
            return Readiness::Failed(self.setup_failure().unwrap_or_else(|| {
                Error::io(
                    "the warm sandbox's init ended before it was ready",
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                )
            }));
        }
        self.event_bytes.extend_from_slice(&chunk[..n]);
        if let Some(error) = self.setup_failure() {
            return Readiness::Failed(error);
        }
        let ready = self.event_bytes.ends_with(b"\n")
            && self.lines().any(|event| matches!(event, InitEvent::Ready));
        if ready {
            Readiness::Ready
        } else {
            Readiness::Pending
        }
    }

    fn lines(&self) -> impl Iterator<Item = InitEvent> + '_ {
        self.event_bytes
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice(line).ok())
    }

    fn setup_failure(&self) -> Option<Error> {
        self.lines().find_map(|event| match event {
            InitEvent::SetupFailed { error } => Some(setup_failed(error)),
            _ => None,
        })
    }

    /// Gives the sandbox up without a run: its init tears it down. Returns the init's pid to
    /// reap.
    pub fn retire(self) -> u32 {
        self.init.id()
    }
}

/// A cold run's plan and spec for `sandbox`, refused unless it runs natively.
fn plan_standby(sandbox: &Sandbox, effects: Effects) -> Result<prepare::Prepared, Error> {
    let prepared = prepare::prepare(&sandbox.command("/bin/true"), effects)?;
    if let Some(refused) = prepared.plan.refusal() {
        return Err(refused);
    }
    if !matches!(prepared.spec.confinement, Confinement::Native(_)) {
        return Err(Error::BackendUnavailable {
            backend: prepared.plan.backend.clone(),
            reason: "warm pools prepare native sandboxes only; choose backend = \"native\" (or auto on a host that has it) or run cold".into(),
        });
    }
    Ok(prepared)
}

fn setup_failed(error: SetupError) -> Error {
    Error::io(
        format!("preparing a warm sandbox failed at {:?}", error.step),
        std::io::Error::other(error.message),
    )
}

/// A warm command's run on a standby from its source, or `None` to run it cold (a cold
/// command, no standby ready, or one whose init died while it waited).
pub(super) fn start_warm(command: &Command) -> Result<Option<(Started, Ending)>, Error> {
    let Some(source) = command.standby.clone() else {
        return Ok(None);
    };
    check_warm_command(command)?;
    crate::spec::check_staged_files(&command.files)?;
    let Some(standby) = source.take() else {
        return Ok(None);
    };
    Ok(start_on(command, standby, source).ok())
}

/// What a warm run cannot do, refused before a standby is spent.
fn check_warm_command(command: &Command) -> Result<(), Error> {
    let refuse = |what: &str| {
        Err(Error::Command(format!(
            "a warm run {what}; run it cold (Sandbox::command) instead"
        )))
    };
    if command.tty {
        return refuse("cannot have a terminal");
    }
    if command.keep {
        return refuse("cannot keep its workdir (it lives in the sandbox's memory)");
    }
    if matches!(command.stdin, Input::Inherit) {
        return refuse("takes stdin as bytes or none, not the caller's own");
    }
    prepare::check_command(command)
}

/// Hands `command` to a ready standby and returns the run as a cold start would.
fn start_on(
    command: &Command,
    standby: Standby,
    source: Arc<dyn StandbySource>,
) -> Result<(Started, Ending), Error> {
    let Standby {
        init,
        control,
        go: mut command_pipe,
        stdin,
        stdout,
        stderr,
        events,
        workdir,
        backend,
        details,
        warnings,
        ..
    } = standby;
    let policy = &command.sandbox.policy;
    let go = WarmGo {
        argv: command.argv.clone(),
        env: prepare::program_env(policy, &command.env, &workdir, None),
        files: command.files.clone(),
    };
    let body =
        serde_json::to_vec(&go).map_err(|e| Error::io("cannot encode the command", e.into()))?;
    // Straight to PID 1, which reads it to EOF: the init learns the run started when the
    // program reports its layers.
    let start = Instant::now();
    let sent = command_pipe.write_all(&body);
    drop(command_pipe);
    if let Err(e) = sent {
        source.retire(init.id());
        return Err(Error::io("the warm sandbox's init is gone", e));
    }
    let stdin = match &command.stdin {
        Input::Bytes(bytes) => Some((stdin, bytes.clone())),
        _ => None,
    };
    let started = Started {
        control,
        pipes: serve::Pipes {
            stdin,
            stdout: Some(stdout),
            stderr: Some(stderr),
            events: OwnedFd::from(events),
            end_at_finished: true,
        },
    };
    let ending = Ending {
        init,
        backend,
        warnings,
        details,
        start,
        capture: (
            command.stdout == Sink::Capture,
            command.stderr == Sink::Capture,
        ),
        keep: false,
        retire: Some(source),
    };
    Ok((started, ending))
}

//! The public way in: a [`Sandbox`] (a policy plus set-up options) makes [`Command`]s, which
//! plan, run or spawn.

use std::path::PathBuf;
use std::sync::Arc;

use super::output::{OutputSink, StartGate};
use super::signals::{BlockedSignals, CANCEL_SIGNALS};
use super::spawner::InitSpawner;
use super::standby::{self, StandbySource};
use super::terminal::RawTerminal;
use super::{finish, handle, launch, prepare};
use crate::cancel::CancelToken;
use crate::confine::cgroup::CgroupConfig;
use crate::error::Error;
use crate::layer::Layer;
use crate::plan::Plan;
use crate::policy::Policy;
use crate::result::RunResult;
use crate::spec::StagedFile;

/// How the sandbox itself is set up, as opposed to what the program may do (the policy).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxOptions {
    /// Allow `backend = "none"` (Tier 0 only) with any policy; without it only a policy from
    /// the built-in `trusted` profile may use it (see [`crate::policy::PolicyOrigin`]).
    pub dev: bool,
    /// Run even when a layer the policy requires is missing; the result lists what was in force.
    pub allow_degraded: bool,
    /// The binary to execute as the init when the supervisor has threads (default:
    /// `AIRLOCK_INIT`, else the current executable); when set, it is always executed.
    pub init_program: Option<PathBuf>,
    /// Where per-run directories are made (default: `/run/airlock` for root,
    /// `$XDG_RUNTIME_DIR/airlock` or `/tmp/airlock-<uid>` otherwise).
    pub runtime_dir: Option<PathBuf>,
    /// Where per-run cgroups are made; `None` uses the default parent `airlock`.
    pub cgroup: Option<CgroupConfig>,
    /// Do not use cgroups even when available.
    pub no_cgroup: bool,
    /// Keep the run directory on the runtime directory's filesystem even when the init could
    /// keep it in memory (a tmpfs in the init's own mount namespace, with capped mounts for the
    /// workdir, `/tmp` and `/dev/shm`).
    pub disk_run_dir: bool,
    /// Also allow backend `none`, as a policy from the built-in `trusted` profile does. The
    /// policy's own origin decides that now; this stays for callers that set it.
    pub trusted_profile: bool,
}

/// A policy plus sandbox options: the factory for commands.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub(super) policy: Policy,
    pub(super) options: SandboxOptions,
}

/// The program's stdin.
#[derive(Debug, Clone)]
pub enum Input {
    /// The supervisor's own stdin.
    Inherit,
    /// Empty.
    Null,
    /// These bytes, then EOF.
    Bytes(Vec<u8>),
}

/// Something that happens during a run, for callers that stream. New kinds may come: match
/// with a wildcard arm.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RunEvent {
    /// The program was exec'd with these layers in force; always the first event (output
    /// the program wrote at once is held until this is sent).
    Started { layers: Vec<Layer> },
    /// A chunk of stdout (within the cap).
    Stdout(Vec<u8>),
    /// A chunk of stderr (within the cap).
    Stderr(Vec<u8>),
    /// A decision of the egress gate as it was made (a DNS answer, a refused or allowed
    /// connection), or an allowed connection that closed with its bytes and duration
    /// (network `allowlist` or `report`).
    Network(airlock_egress::GateEvent),
}

/// One program to run in the sandbox.
#[derive(Debug, Clone)]
pub struct Command {
    pub(super) sandbox: Sandbox,
    pub(super) argv: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) stdin: Input,
    pub(super) stdout: Sink,
    pub(super) stderr: Sink,
    pub(super) keep: bool,
    pub(super) tty: bool,
    pub(super) cancel: Option<CancelToken>,
    pub(super) files: Vec<StagedFile>,
    /// Where a prepared sandbox comes from (a command made by a warm pool).
    pub(super) standby: Option<Arc<dyn StandbySource>>,
    pub(super) cancel_on_signals: bool,
    /// Forks the init of a cold run instead of executing it (see [`Command::init_spawner`]).
    pub(super) spawner: Option<Arc<InitSpawner>>,
    /// The caller's check before anything of the run starts (see [`Command::before_launch`]).
    pub(super) before_launch: Option<LaunchCheck>,
}

/// A caller's check that must pass before a run's sandbox is launched
/// ([`Command::before_launch`]).
#[derive(Clone)]
pub(super) struct LaunchCheck(Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>);

impl std::fmt::Debug for LaunchCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LaunchCheck")
    }
}

/// Where one output stream goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sink {
    Capture,
    Forward,
    Stream,
    Discard,
}

impl Sink {
    /// Where a blocking run sends a stream: streamed output has no reader there, so it is
    /// only counted.
    pub(super) fn blocking_sink(self) -> OutputSink {
        match self {
            Sink::Capture => OutputSink::Capture,
            Sink::Forward => OutputSink::Forward,
            Sink::Stream | Sink::Discard => OutputSink::Discard,
        }
    }
}

impl Sandbox {
    /// A sandbox for `policy` with default options.
    pub fn new(policy: Policy) -> Result<Sandbox, Error> {
        Sandbox::with_options(policy, SandboxOptions::default())
    }

    /// A sandbox with explicit options.
    pub fn with_options(policy: Policy, options: SandboxOptions) -> Result<Sandbox, Error> {
        policy.validate()?;
        Ok(Sandbox { policy, options })
    }

    /// The policy runs will follow.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Starts building a command; stdout and stderr are captured by default.
    pub fn command(&self, program: impl Into<String>) -> Command {
        Command {
            sandbox: self.clone(),
            argv: vec![program.into()],
            env: Vec::new(),
            stdin: Input::Null,
            stdout: Sink::Capture,
            stderr: Sink::Capture,
            keep: false,
            tty: false,
            cancel: None,
            files: Vec::new(),
            standby: None,
            cancel_on_signals: false,
            spawner: None,
            before_launch: None,
        }
    }
}

impl Command {
    /// Adds one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.argv.push(arg.into());
        self
    }

    /// Adds arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the program (wins over the policy).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Feeds these bytes on stdin.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = Input::Bytes(bytes.into());
        self
    }

    /// Chooses stdin.
    pub fn stdin_from(mut self, input: Input) -> Self {
        self.stdin = input;
        self
    }

    /// Copies output to the supervisor's own stdout/stderr as it arrives (still capped).
    pub fn forward_output(mut self) -> Self {
        self.stdout = Sink::Forward;
        self.stderr = Sink::Forward;
        self
    }

    /// Sends output as [`RunEvent`]s on the handle's event channel.
    pub fn stream_output(mut self) -> Self {
        self.stdout = Sink::Stream;
        self.stderr = Sink::Stream;
        self
    }

    /// Counts output but keeps none.
    pub fn discard_output(mut self) -> Self {
        self.stdout = Sink::Discard;
        self.stderr = Sink::Discard;
        self
    }

    /// Writes a file into the run's fresh workdir before the program starts (`path` relative
    /// to it; parent directories are made). Native backend, workdir made by the sandbox.
    pub fn file(mut self, path: impl Into<PathBuf>, contents: impl Into<Vec<u8>>) -> Self {
        self.files.push(StagedFile {
            path: path.into(),
            contents: contents.into(),
            mode: 0o644,
        });
        self
    }

    /// Runs this command on a sandbox `source` prepared ahead (a warm pool's), or cold when
    /// it has none ready.
    pub(crate) fn with_standby(mut self, source: Arc<dyn StandbySource>) -> Self {
        self.standby = Some(source);
        self
    }

    /// Has `spawner` fork this run's init instead of executing the init program, when the
    /// init would be executed (a supervisor with threads) and gets its stdio from the run
    /// (not [`Input::Inherit`] or the caller's own output): the cost of a fork of a small
    /// process instead of the binary's loader, relocations and first page touches, for a
    /// long-lived caller (a daemon) that keeps one spawner for its cold runs. A spawner that
    /// is gone is not asked: the init is executed.
    pub fn init_spawner(mut self, spawner: Arc<InitSpawner>) -> Self {
        self.spawner = Some(spawner);
        self
    }

    /// Calls `check` once before anything of the run starts: after the run is planned (backend
    /// chosen, layers judged, the init's spec built) and just before its init is launched, or,
    /// for a command of a warm pool, before a prepared sandbox is taken. An error stops the run
    /// there, with nothing of it started: `run` and `spawn` return [`Error::Io`] carrying it.
    /// For a caller that must finish something before the program may start (a daemon
    /// committing the run's record) and would rather do it while the run is planned than
    /// before: `check` waits for it.
    pub fn before_launch(
        mut self,
        check: impl Fn() -> std::io::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.before_launch = Some(LaunchCheck(Arc::new(check)));
        self
    }

    /// Passes the caller's [`Command::before_launch`] check, if any.
    fn pass_launch_check(&self) -> Result<(), Error> {
        match &self.before_launch {
            Some(LaunchCheck(check)) => {
                check().map_err(|e| Error::io("the caller stopped the run before its launch", e))
            }
            None => Ok(()),
        }
    }

    /// Keeps the run's working directory after the run.
    pub fn keep_workdir(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    /// Gives the program a terminal of its own (a pseudo-terminal as its stdin, stdout and
    /// controlling terminal, in its own session): its output is the stdout stream (no cap
    /// applies), and with [`Input::Inherit`] `run` relays the caller's terminal to it in raw
    /// mode, resizes included. The program never holds the caller's terminal.
    pub fn tty(mut self, tty: bool) -> Self {
        self.tty = tty;
        self
    }

    /// Stops the run when `token` is cancelled (as [`RunHandle::cancel`](super::RunHandle::cancel)
    /// does: SIGTERM, then SIGKILL after the grace period; status `cancelled`), for `run` as
    /// for `spawn`. A token cancelled before the program starts, even before `run` is called,
    /// stops the sandbox's set-up: status `cancelled`, no layers, nothing left behind.
    pub fn cancel_on(mut self, token: &CancelToken) -> Self {
        self.cancel = Some(token.clone());
        self
    }

    /// Makes [`run`](Command::run) end the run as `cancelled` (the process tree stopped,
    /// everything removed, the result returned with `cancel_signal`) when the calling process
    /// receives SIGINT, SIGTERM or SIGHUP, instead of dying of the signal with the run's
    /// result lost. For a caller that owns its process, like a CLI: the signals are blocked in
    /// the calling thread while the run lasts. `spawn` ignores it (cancel with a
    /// [`super::Canceller`]).
    pub fn cancel_on_signals(mut self, cancel: bool) -> Self {
        self.cancel_on_signals = cancel;
        self
    }

    /// What a run of this command would be, without running anything: the backend and why,
    /// the layers that will be in force and why any required one is missing, the mounts, the
    /// limits. Creates nothing (no run directory, no cgroup, no process). A plan whose
    /// verdict is [`Refused`](crate::plan::Verdict::Refused) is returned as a plan; `run`
    /// refuses it with [`Error::Degraded`].
    pub fn plan(&self) -> Result<Plan, Error> {
        prepare::prepare(self, prepare::Effects::None).map(|prepared| prepared.plan)
    }

    /// Runs to completion, serving the run's pipes from the calling thread.
    pub fn run(self) -> Result<RunResult, Error> {
        // Blocked before the init starts, so that it inherits the mask (see `signals`).
        let signals = self.blocked_signals()?;
        let warm_source = self.standby.is_some();
        if warm_source {
            self.pass_launch_check()?;
        }
        if let Some(warm) = standby::start_warm(&self)? {
            return finish::serve_in_this_thread(
                &self,
                warm.started,
                warm.ending,
                signals.as_ref(),
            );
        }
        let prepared = prepare::prepare_to_run(&self)?;
        if !warm_source {
            self.pass_launch_check()?;
        }
        // The caller's terminal, relayed to the program's own, passes every key through.
        let _raw = match (self.tty, &self.stdin) {
            (true, Input::Inherit) => RawTerminal::enter(),
            _ => None,
        };
        let (started, ending) = launch::start(&self, prepared, None)?;
        finish::serve_in_this_thread(&self, started, ending, signals.as_ref())
    }

    /// The signals a blocking run reacts to: the cancel signals when asked for, and window
    /// resizes for a terminal.
    fn blocked_signals(&self) -> Result<Option<BlockedSignals>, Error> {
        let mut wanted = Vec::new();
        if self.cancel_on_signals {
            wanted.extend(CANCEL_SIGNALS);
        }
        if self.tty {
            wanted.push(nix::sys::signal::Signal::SIGWINCH);
        }
        match wanted.is_empty() {
            true => Ok(None),
            false => BlockedSignals::block(&wanted).map(Some),
        }
    }

    /// Starts the run and returns a handle to stream, cancel and wait for it.
    pub fn spawn(self) -> Result<handle::RunHandle, Error> {
        let (events, receiver) = std::sync::mpsc::channel();
        let start = Arc::new(StartGate::default());
        let warm_source = self.standby.is_some();
        if warm_source {
            self.pass_launch_check()?;
        }
        if let Some(warm) = standby::start_warm(&self)? {
            if let Some(network) = &warm.network {
                *network.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((events.clone(), Arc::clone(&start)));
            }
            return Ok(handle::serve_in_background(
                &self,
                warm.started,
                warm.ending,
                (events, receiver),
                start,
                warm.network,
            ));
        }
        let prepared = prepare::prepare_to_run(&self)?;
        if !warm_source {
            self.pass_launch_check()?;
        }
        let (on_network, network) = match prepared.egress.is_some() {
            true => {
                let (sink, sender) = handle::network_events(events.clone(), Arc::clone(&start));
                (Some(sink), Some(sender))
            }
            false => (None, None),
        };
        let (started, ending) = launch::start(&self, prepared, on_network)?;
        Ok(handle::serve_in_background(
            &self,
            started,
            ending,
            (events, receiver),
            start,
            network,
        ))
    }
}

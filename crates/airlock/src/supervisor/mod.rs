//! The supervisor: the in-process half of a run. It resolves the backend, starts the init
//! (`airlock __init`), feeds stdin, drains output under caps, relays cancellation and turns
//! the init's report into a [`RunResult`].

mod init_process;
mod output;
mod serve;

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

pub use crate::rundir::{
    default_runtime_dir, new_run_id, runtime_dir, sweep as sweep_abandoned_runs, KEPT_MARKER,
    SWEEP_STAMP,
};
use init_process::{InitLaunch, InitPipes, InitProcess, InitStdio};
use output::Collector;
pub use output::{Drained, OutputSink, StreamKind};

use crate::backend::{self, Backend, PlanContext};
use crate::confine::cgroup::{CgroupConfig, CgroupLimits};
use crate::confine::Credentials;
use crate::error::Error;
use crate::layer::Layer;
use crate::policy::{BackendChoice, OutputLimitAction, Policy};
use crate::result::{RunResult, RunStatus};
use crate::rundir::{self, MemoryScratch};
use crate::spec::{CgroupRequest, InitEvent, InitSpec, Outcome, SpecLimits, StopReason};

/// How the sandbox itself is set up, as opposed to what the program may do (the policy).
#[derive(Debug, Clone, Default)]
pub struct SandboxOptions {
    /// Allow `backend = "none"` (Tier 0 only) outside the `trusted` profile.
    pub dev: bool,
    /// Run even when a layer the policy requires is missing; the result lists what was in force.
    pub allow_degraded: bool,
    /// The binary to re-execute as the init (default: `AIRLOCK_INIT`, else the current exe).
    pub init_program: Option<PathBuf>,
    /// Where per-run directories are made (default: see [`runtime_dir`]).
    pub runtime_dir: Option<PathBuf>,
    /// Where per-run cgroups are made; `None` uses the default parent `airlock`.
    pub cgroup: Option<CgroupConfig>,
    /// Do not use cgroups even when available.
    pub no_cgroup: bool,
    /// Keep the run directory on the runtime directory's filesystem even when the init could
    /// keep it in memory (see [`MemoryScratch`]).
    pub disk_run_dir: bool,
    /// The policy came from the built-in `trusted` profile, which may use backend none.
    pub trusted_profile: bool,
}

/// A policy plus sandbox options: the factory for commands.
#[derive(Debug, Clone)]
pub struct Sandbox {
    policy: Policy,
    options: SandboxOptions,
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

/// Something that happens during a run, for callers that stream.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// The program was exec'd with these layers in force.
    Started { layers: Vec<Layer> },
    /// A chunk of stdout (within the cap).
    Stdout(Vec<u8>),
    /// A chunk of stderr (within the cap).
    Stderr(Vec<u8>),
}

/// One program to run in the sandbox.
#[derive(Debug, Clone)]
pub struct Command {
    sandbox: Sandbox,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Input,
    stdout: Sink,
    stderr: Sink,
    keep: bool,
    tty: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    Capture,
    Forward,
    Stream,
    Discard,
}

impl Sink {
    /// Where a blocking run sends a stream: streamed output has no reader there, so it is
    /// only counted.
    fn blocking_sink(self) -> OutputSink {
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

    /// Keeps the run's working directory after the run.
    pub fn keep_workdir(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    /// Gives the program the caller's terminal (stdio inherited, no caps on output).
    pub fn tty(mut self, tty: bool) -> Self {
        self.tty = tty;
        self
    }

    /// Runs to completion, serving the run's pipes from the calling thread.
    pub fn run(self) -> Result<RunResult, Error> {
        let prepared = Prepared::new(&self)?;
        let (started, mut ending) = start(&self, prepared)?;
        let policy = &self.sandbox.policy;
        let sinks = (self.stdout.blocking_sink(), self.stderr.blocking_sink());
        let outputs = serve::Outputs {
            stdout: Collector::new(StreamKind::Stdout, &sinks.0, policy.limits.stdout.0),
            stderr: Collector::new(StreamKind::Stderr, &sinks.1, policy.limits.stderr.0),
        };
        let kill_on_overflow = policy.limits.on_output_limit == OutputLimitAction::Kill;
        let control = Mutex::new(started.control);
        let served = serve::serve(started.pipes, outputs, || {
            if kill_on_overflow {
                send_stop(&control, StopReason::OutputLimit);
            }
        });
        let result = ending.conclude(served);
        // Open until the init is gone: its end reading EOF means the supervisor died.
        drop(control);
        result
    }

    /// Starts the run and returns a handle to stream, cancel and wait for it.
    pub fn spawn(self) -> Result<RunHandle, Error> {
        let prepared = Prepared::new(&self)?;
        let (started, ending) = start(&self, prepared)?;
        Ok(serve_from_threads(&self, started, ending))
    }
}

/// Host-side decisions made before the init starts.
struct Prepared {
    backend: Box<dyn Backend>,
    spec: InitSpec,
    warnings: Vec<String>,
    details: Vec<String>,
}

impl Prepared {
    fn new(command: &Command) -> Result<Prepared, Error> {
        if command.argv.iter().any(|a| a.contains('\0')) {
            return Err(Error::Command(
                "arguments must not contain NUL bytes".into(),
            ));
        }
        let sandbox = &command.sandbox;
        let policy = &sandbox.policy;
        if !policy.allows_program(&command.argv[0]) {
            let allowed = policy.allowed_programs.clone().unwrap_or_default();
            return Err(Error::ProgramNotAllowed {
                program: command.argv[0].clone(),
                allowed,
            });
        }
        let options = &sandbox.options;
        if policy.backend == BackendChoice::None && !options.dev && !options.trusted_profile {
            return Err(Error::UnisolatedRefused);
        }
        let backend = backend::select(policy)?;
        let mut warnings = Vec::new();
        let owns_workdir = policy.filesystem.workdir.is_none() && !command.keep;
        let require = required_layers(policy, owns_workdir);
        let accepted_missing = check_degradation(
            &require,
            backend.as_ref(),
            options.allow_degraded,
            &mut warnings,
        )?;
        let run_id = new_run_id();
        let runtime = runtime_dir(options.runtime_dir.as_deref())?;
        let cgroup_config =
            (!options.no_cgroup).then(|| options.cgroup.clone().unwrap_or_default());
        rundir::sweep_if_due(&runtime, cgroup_config.as_ref());
        let run_dir = runtime.join(&run_id);
        let (workdir, fresh) = match &policy.filesystem.workdir {
            Some(dir) => (prepare_callers_workdir(dir)?, false),
            None => (rundir::fresh_workdir(&run_dir), true),
        };
        let cgroup = cgroup_request(policy, options, &run_id);
        let owned_workdir = (fresh && !command.keep).then_some(workdir.as_path());
        let mut scratch =
            (!command.keep && !options.disk_run_dir && crate::confine::caps::can_mount())
                .then(|| memory_scratch(policy, &runtime, &run_dir, owned_workdir));
        let plan_env = program_env(policy, &command.env, &workdir, None);
        let ctx = PlanContext {
            policy,
            workdir: &workdir,
            fresh_workdir: fresh,
            keep: command.keep,
            tty: command.tty,
            run_dir: &run_dir,
            run_id: &run_id,
            argv: &command.argv,
            env: &plan_env,
            cgroup: cgroup.as_ref(),
            scratch: scratch.as_ref(),
        };
        // Checked here, once for every backend (Tier 0 included), not in each backend's plan.
        backend::check_policy_paths(policy)?;
        let confinement = backend.plan(&ctx)?;
        check_wrapped_plan(
            &require,
            &confinement,
            backend.name(),
            options.allow_degraded,
        )?;
        if matches!(&confinement, crate::spec::Confinement::Wrapped(w) if w.served_by_daemon) {
            scratch = None;
        }
        let tier0 = matches!(confinement, crate::spec::Confinement::Tier0);
        let details = match &confinement {
            crate::spec::Confinement::Wrapped(wrap) => wrap.details.clone(),
            _ => Vec::new(),
        };
        let spec = InitSpec {
            argv: command.argv.clone(),
            env: program_env(
                policy,
                &command.env,
                &workdir,
                tier0.then(|| rundir::tmp_dir(&run_dir)),
            ),
            run_dir,
            workdir,
            workdir_is_callers: !fresh,
            keep: command.keep,
            limits: spec_limits(policy),
            credentials: credentials(policy),
            cgroup,
            confinement,
            require,
            allow_degraded: options.allow_degraded,
            accepted_missing,
            tty: command.tty,
            scratch,
        };
        Ok(Prepared {
            backend,
            spec,
            warnings,
            details,
        })
    }
}

/// The layers a run must have. The profile's list grows by what its limits promise: when the
/// sandbox creates the workdir, `limits.disk` and `limits.files` cap every writable area, so a
/// backend that cannot cap them is refused unless the caller accepts the degradation.
/// Explicit choices narrow the list: the host network means no network namespace, and backend
/// `none` (which needs its own opt-in) means Tier 0.
fn required_layers(policy: &Policy, owns_workdir: bool) -> Vec<Layer> {
    let mut require = policy.require.clone();
    // A profile that requires nothing asks for no refusals.
    if owns_workdir && !require.is_empty() {
        require.extend([Layer::DiskQuota, Layer::InodeQuota]);
        require.sort();
        require.dedup();
    }
    // Asking for the host network is asking for no network namespace.
    if policy.has_network() {
        require.retain(|l| *l != Layer::NetNs && *l != Layer::LandlockNet);
    }
    if policy.backend == BackendChoice::None {
        let tier0 = backend::NoneBackend.probe().layers;
        require.retain(|l| tier0.contains(l) || *l == Layer::Cgroup);
    }
    require
}

fn check_degradation(
    require: &[Layer],
    backend: &dyn Backend,
    allow: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<Layer>, Error> {
    let probe = backend.quick_probe();
    let missing = missing_layers(require, &probe.layers);
    if missing.is_empty() {
        return Ok(missing);
    }
    let problems: Vec<&str> = probe
        .problems
        .iter()
        .map(String::as_str)
        .filter(|p| !p.starts_with("note:"))
        .collect();
    let reason = if problems.is_empty() {
        "it does not provide them".to_string()
    } else {
        problems.join("; ")
    };
    if !allow {
        return Err(Error::Degraded {
            backend: backend.name().into(),
            missing,
            reason,
        });
    }
    let names: Vec<String> = missing
        .iter()
        .map(|l| crate::result::layer_name(*l))
        .collect();
    warnings.push(format!(
        "degraded: running without {} ({reason})",
        names.join(", ")
    ));
    Ok(missing)
}

/// The required layers not `offered`. The cgroup is left to the init, which knows whether one
/// could be created (rlimits stand in for it otherwise).
fn missing_layers(require: &[Layer], offered: &[Layer]) -> Vec<Layer> {
    require
        .iter()
        .copied()
        .filter(|l| *l != Layer::Cgroup && !offered.contains(l))
        .collect()
}

/// A wrapped backend's plan names every layer the tool will give: a required one it lacks
/// (e.g. podman cannot cap its workdir) refuses the run here, before anything starts. The
/// init checks the layers in force again; this check only makes the refusal early and clear.
fn check_wrapped_plan(
    require: &[Layer],
    confinement: &crate::spec::Confinement,
    backend: &str,
    allow: bool,
) -> Result<(), Error> {
    let crate::spec::Confinement::Wrapped(wrap) = confinement else {
        return Ok(());
    };
    let mut offered = backend::tier0_layers();
    offered.extend(wrap.layers.iter().copied());
    let missing = missing_layers(require, &offered);
    if missing.is_empty() || allow {
        return Ok(());
    }
    let caps = missing
        .iter()
        .any(|l| matches!(l, Layer::DiskQuota | Layer::InodeQuota));
    let hint = if caps {
        ": a wrapping tool's writable areas are capped by the init's tmpfs mounts, which need CAP_SYS_ADMIN (run as root) and an in-memory run directory (no --disk-run-dir)"
    } else {
        ""
    };
    Err(Error::Degraded {
        backend: backend.into(),
        missing,
        reason: format!(
            "this run's plan does not provide them{hint} (see the backend's row in docs/isolation.md)"
        ),
    })
}

fn prepare_callers_workdir(dir: &Path) -> Result<PathBuf, Error> {
    let absolute = std::path::absolute(dir)
        .map_err(|e| Error::io(format!("cannot resolve workdir {}", dir.display()), e))?;
    if !absolute.is_dir() {
        return Err(Error::BadPath {
            what: "workdir",
            path: absolute,
            reason: "is not an existing directory; create it first".into(),
        });
    }
    Ok(absolute)
}

fn program_env(
    policy: &Policy,
    extra: &[(String, String)],
    workdir: &Path,
    tmpdir: Option<PathBuf>,
) -> Vec<(String, String)> {
    let mut env = std::collections::BTreeMap::new();
    env.insert("HOME".to_string(), workdir.display().to_string());
    if let Some(tmp) = tmpdir {
        env.insert("TMPDIR".to_string(), tmp.display().to_string());
    }
    for name in &policy.env.pass {
        if let Ok(value) = std::env::var(name) {
            env.insert(name.clone(), value);
        }
    }
    env.extend(policy.env.set.clone());
    env.extend(extra.iter().cloned());
    env.into_iter().collect()
}

fn spec_limits(policy: &Policy) -> SpecLimits {
    let l = &policy.limits;
    SpecLimits {
        memory_bytes: l.memory.0,
        cpu_time: l.cpu_time.0,
        wall_time: l.wall_time.0,
        grace: l.grace.0,
        processes: l.processes,
        open_files: l.open_files,
        file_size_bytes: l.file_size.0,
        disk_bytes: l.disk.0,
        files: l.files,
        cpus: l.cpus,
    }
}

/// The in-memory run directory as a run plans it (see [`rundir::memory_scratch`]). Public for
/// tools that plan a run outside the supervisor (the benchmark's same-config peers).
pub fn memory_scratch(
    policy: &Policy,
    runtime: &Path,
    run_dir: &Path,
    owned_workdir: Option<&Path>,
) -> MemoryScratch {
    rundir::memory_scratch(policy, runtime, run_dir, owned_workdir, credentials(policy))
}

fn credentials(policy: &Policy) -> Option<Credentials> {
    (nix::unistd::geteuid().is_root() && policy.user.drop_root).then_some(Credentials {
        uid: policy.user.uid,
        gid: policy.user.gid,
    })
}

fn cgroup_request(
    policy: &Policy,
    options: &SandboxOptions,
    run_id: &str,
) -> Option<CgroupRequest> {
    if options.no_cgroup {
        return None;
    }
    let l = &policy.limits;
    let limits = CgroupLimits {
        memory_bytes: Some(l.memory.0),
        pids: Some(l.processes),
        cpu_millicores: (l.cpus > 0.0).then(|| (l.cpus * 1000.0).round() as u64),
    };
    Some(CgroupRequest {
        config: options.cgroup.clone().unwrap_or_default(),
        run_id: run_id.to_string(),
        limits,
    })
}

/// A running program.
#[derive(Debug)]
pub struct RunHandle {
    ending: Ending,
    control: Arc<Mutex<std::fs::File>>,
    events_reader: JoinHandle<Vec<InitEvent>>,
    stdout_reader: Option<JoinHandle<Drained>>,
    stderr_reader: Option<JoinHandle<Drained>>,
    stdin_writer: Option<JoinHandle<()>>,
    events: Option<Receiver<RunEvent>>,
}

/// What turns a served run into its result: the init to reap and the facts the result
/// carries besides what the pipes said.
#[derive(Debug)]
struct Ending {
    init: InitProcess,
    backend: String,
    warnings: Vec<String>,
    details: Vec<String>,
    start: Instant,
    capture: (bool, bool),
    keep: bool,
}

/// A run whose init has its spec: the control pipe and the pipes the supervisor serves.
struct Started {
    control: std::fs::File,
    pipes: serve::Pipes,
}

/// A cloneable way to cancel a run from another thread.
#[derive(Debug, Clone)]
pub struct Canceller {
    control: Arc<Mutex<std::fs::File>>,
}

impl Canceller {
    /// Asks the init to stop the run (SIGTERM, then SIGKILL after the grace period).
    pub fn cancel(&self) {
        send_stop(&self.control, StopReason::Cancelled);
    }
}

fn send_stop(control: &Mutex<std::fs::File>, reason: StopReason) {
    if let (Ok(mut pipe), Ok(mut line)) = (control.lock(), serde_json::to_vec(&reason)) {
        line.push(b'\n');
        let _ = pipe.write_all(&line);
    }
}

/// Starts the init and sends it the spec.
fn start(command: &Command, prepared: Prepared) -> Result<(Started, Ending), Error> {
    let Prepared {
        backend,
        spec,
        warnings,
        details,
    } = prepared;
    let (control_read, control_write) = pipe()?;
    let (events_read, events_write) = pipe()?;
    let (stdio, stdin_pipe, out_pipes) = stdio_for(command)?;
    let launch = init_launch(&command.sandbox.options);
    let pipes = InitPipes {
        control: control_read,
        events: events_write,
    };
    let mut init = init_process::start(&launch, stdio, pipes, &spec)?;
    let mut control = std::fs::File::from(control_write);
    if init.reads_spec() {
        if let Err(e) = write_spec(&mut control, &spec) {
            init.kill();
            let _ = init.wait();
            return Err(Error::io("cannot send the run spec to the init", e));
        }
    }
    let stdin = match (&command.stdin, stdin_pipe) {
        (Input::Bytes(bytes), Some(pipe)) => Some((pipe, bytes.clone())),
        _ => None,
    };
    let started = Started {
        control,
        pipes: serve::Pipes {
            stdin,
            stdout: out_pipes.0,
            stderr: out_pipes.1,
            events: events_read,
        },
    };
    let ending = Ending {
        init,
        backend: backend.name().to_string(),
        warnings,
        details,
        start: Instant::now(),
        capture: (
            command.stdout == Sink::Capture,
            command.stderr == Sink::Capture,
        ),
        keep: command.keep,
    };
    Ok((started, ending))
}

/// A thread per pipe, so the caller of [`Command::spawn`] stays free to stream and cancel.
fn serve_from_threads(command: &Command, started: Started, ending: Ending) -> RunHandle {
    let policy = &command.sandbox.policy;
    let control = Arc::new(Mutex::new(started.control));
    let pipes = started.pipes;
    let stdin_writer = pipes.stdin.map(|(pipe, bytes)| {
        std::thread::spawn(move || {
            let _ = std::fs::File::from(pipe).write_all(&bytes);
        })
    });
    let (event_tx, event_rx) = channel();
    let kill_on_overflow = policy.limits.on_output_limit == OutputLimitAction::Kill;
    let reader = |pipe: Option<OwnedFd>, sink: Sink, kind: StreamKind, cap: u64| {
        pipe.map(|fd| {
            let sink = match sink {
                Sink::Stream => OutputSink::Stream(event_tx.clone()),
                other => other.blocking_sink(),
            };
            let control = Arc::clone(&control);
            std::thread::spawn(move || {
                output::drain(std::fs::File::from(fd), kind, &sink, cap, || {
                    if kill_on_overflow {
                        send_stop(&control, StopReason::OutputLimit);
                    }
                })
            })
        })
    };
    let stdout_reader = reader(
        pipes.stdout,
        command.stdout,
        StreamKind::Stdout,
        policy.limits.stdout.0,
    );
    let stderr_reader = reader(
        pipes.stderr,
        command.stderr,
        StreamKind::Stderr,
        policy.limits.stderr.0,
    );
    let events_reader = spawn_event_reader(pipes.events, event_tx);
    RunHandle {
        ending,
        control,
        events_reader,
        stdout_reader,
        stderr_reader,
        stdin_writer,
        events: Some(event_rx),
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("cannot create a pipe", e.into()))
}

/// The read ends of the program's stdout and stderr pipes (none on a terminal).
type OutputPipes = (Option<OwnedFd>, Option<OwnedFd>);

/// The init's stdio, the write end of a stdin pipe to fill, and the output pipes to drain.
fn stdio_for(command: &Command) -> Result<(InitStdio, Option<OwnedFd>, OutputPipes), Error> {
    let mut stdio = InitStdio::default();
    let mut stdin_bytes = None;
    match command.stdin {
        Input::Inherit => {}
        Input::Null => {
            let null = std::fs::File::open("/dev/null")
                .map_err(|e| Error::io("cannot open /dev/null", e))?;
            stdio.stdin = Some(null.into());
        }
        Input::Bytes(_) => {
            let (read, write) = pipe()?;
            stdio.stdin = Some(read);
            stdin_bytes = Some(write);
        }
    }
    if command.tty {
        return Ok((stdio, stdin_bytes, (None, None)));
    }
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    stdio.stdout = Some(stdout_write);
    stdio.stderr = Some(stderr_write);
    Ok((stdio, stdin_bytes, (Some(stdout_read), Some(stderr_read))))
}

/// An explicit init program (option or `AIRLOCK_INIT`) is always executed; otherwise the
/// supervisor may fork the init from itself.
fn init_launch(options: &SandboxOptions) -> InitLaunch {
    let explicit = options
        .init_program
        .clone()
        .or_else(|| std::env::var_os("AIRLOCK_INIT").map(PathBuf::from));
    InitLaunch {
        may_fork: explicit.is_none(),
        program: explicit
            .or_else(|| std::env::current_exe().ok())
            .unwrap_or_else(|| PathBuf::from("airlock")),
    }
}

fn write_spec(control: &mut std::fs::File, spec: &InitSpec) -> std::io::Result<()> {
    let body = serde_json::to_vec(spec)?;
    control.write_all(&(body.len() as u64).to_le_bytes())?;
    control.write_all(&body)
}

fn spawn_event_reader(
    events: OwnedFd,
    tx: std::sync::mpsc::Sender<RunEvent>,
) -> JoinHandle<Vec<InitEvent>> {
    std::thread::spawn(move || {
        let mut log = serve::EventLog::default();
        let mut pipe = std::fs::File::from(events);
        let mut buffer = vec![0u8; 4096];
        while let Some(chunk) = output::read_chunk(&mut pipe, &mut buffer) {
            for event in log.feed(chunk) {
                if let InitEvent::Started { layers, .. } = event {
                    let _ = tx.send(RunEvent::Started {
                        layers: layers.clone(),
                    });
                }
            }
        }
        log.finish()
    })
}

impl RunHandle {
    /// The stream of [`RunEvent`]s (once; later calls return `None`).
    pub fn events(&mut self) -> Option<Receiver<RunEvent>> {
        self.events.take()
    }

    /// Asks the init to stop the run; `wait` then returns status `cancelled`.
    pub fn cancel(&self) {
        send_stop(&self.control, StopReason::Cancelled);
    }

    /// A cancel handle that can move to another thread.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            control: Arc::clone(&self.control),
        }
    }

    /// The pid of the init process watching this run.
    pub fn init_pid(&self) -> u32 {
        self.ending.init.id()
    }

    /// Waits for the run to end and everything it started to be gone.
    pub fn wait(mut self) -> Result<RunResult, Error> {
        let join =
            |h: Option<JoinHandle<Drained>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        let stdout = join(self.stdout_reader.take());
        let stderr = join(self.stderr_reader.take());
        let events = self.events_reader.join().unwrap_or_default();
        if let Some(writer) = self.stdin_writer.take() {
            let _ = writer.join();
        }
        self.ending.conclude(serve::Served {
            stdout,
            stderr,
            events,
        })
    }
}

impl Ending {
    /// Reaps the init (every process of the run is gone by then) and builds the result.
    fn conclude(&mut self, served: serve::Served) -> Result<RunResult, Error> {
        let init_status = self
            .init
            .wait()
            .map_err(|e| Error::io("cannot wait for the init", e))?;
        let wall_ms = self.start.elapsed().as_millis() as u64;
        let mut result = assemble(&served.events, init_status, &self.backend, wall_ms);
        result.warnings.splice(0..0, self.warnings.clone());
        result.details = self.details.clone();
        if !self.keep {
            result.workdir = None;
        }
        let (stdout, stderr) = (&served.stdout, &served.stderr);
        let text = |d: &Drained| String::from_utf8_lossy(&d.kept).into_owned();
        result.stdout = self.capture.0.then(|| text(stdout));
        result.stderr = self.capture.1.then(|| text(stderr));
        (result.stdout_truncated, result.stdout_bytes) = (stdout.truncated, stdout.total);
        (result.stderr_truncated, result.stderr_bytes) = (stderr.truncated, stderr.total);
        Ok(result)
    }
}

fn assemble(
    events: &[InitEvent],
    init_status: std::process::ExitStatus,
    backend: &str,
    wall_ms: u64,
) -> RunResult {
    let mut result = RunResult {
        status: RunStatus::SandboxError,
        exit_code: None,
        signal: None,
        wall_ms,
        cpu_user_ms: 0,
        cpu_sys_ms: 0,
        peak_memory_bytes: None,
        stdout: None,
        stderr: None,
        stdout_truncated: false,
        stderr_truncated: false,
        stdout_bytes: 0,
        stderr_bytes: 0,
        backend: backend.to_string(),
        isolation: Vec::new(),
        error: None,
        warnings: Vec::new(),
        details: Vec::new(),
        workdir: None,
    };
    for event in events {
        match event {
            InitEvent::Started {
                layers,
                warnings,
                workdir,
            } => {
                result.isolation = layers.clone();
                result.warnings.extend(warnings.iter().cloned());
                result.workdir = Some(workdir.clone());
            }
            InitEvent::SetupFailed { error } => {
                result.error.get_or_insert_with(|| error.clone());
            }
            InitEvent::Finished(outcome) => apply_outcome(&mut result, outcome),
        }
    }
    if result.status == RunStatus::SandboxError && result.error.is_none() {
        result.error = Some(format!(
            "the airlock init ended without a report ({init_status})"
        ));
    }
    result
}

fn apply_outcome(result: &mut RunResult, outcome: &Outcome) {
    if result.error.is_some() {
        return;
    }
    result.status = outcome.status;
    result.exit_code = outcome.exit_code;
    result.signal = outcome.signal;
    result.cpu_user_ms = outcome.cpu_user_ms;
    result.cpu_sys_ms = outcome.cpu_sys_ms;
    result.peak_memory_bytes = outcome.peak_memory_bytes;
    result.warnings.extend(outcome.warnings.iter().cloned());
}

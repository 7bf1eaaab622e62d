//! Prepared (warm) sandboxes, the supervisor's half: a [`Standby`] is an init started ahead
//! of its run with a spec planned exactly as a cold run's (same backend, root, layers,
//! cgroup and limits) and its pipes already made. Its sandbox is set up up to the program's
//! exec and waits; [`start_on`] hands it a command, after which the run is served and ended
//! by the same code as a cold run. The init sends the outcome before it tears the sandbox
//! down, and the [`StandbySource`] that lent the standby reaps the init in the background.
//!
//! The pool that keeps standbys ready is `crate::warm`; this file knows nothing of it.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::builder::{Command, Input, Sandbox, Sink};
use super::finish::Ending;
use super::handle::NetworkSender;
use super::hints::HintFacts;
use super::launch::{self, InitProcess, Started};
use super::prepare::{self, Effects};
use super::serve;
use super::standby_gate::StandbyGate;
use super::standby_plan::StandbyPlans;
use crate::error::{Error, SetupError};
use crate::net;
use crate::spec::{Confinement, InitEvent, WarmGo};

/// A program a standby starts ahead of its run (an interpreter that then reads its code on
/// stdin: see `crate::warm`).
#[derive(Debug, Clone)]
pub struct Prestart {
    pub argv: Vec<String>,
    /// What the program writes on stdout when it is ready, before anything else.
    pub ready_marker: &'static [u8],
}

/// Where a warm command gets its prepared sandbox, and where the sandbox's init goes to be
/// reaped after the run. `crate::warm::WarmPool` is the implementation.
pub trait StandbySource: Send + Sync + std::fmt::Debug {
    /// A ready standby, or `None` when the command should run cold.
    fn take(&self) -> Option<Standby>;
    /// The init of a run that has ended: it is tearing its sandbox down; reap it.
    fn retire(&self, init_pid: u32);
    /// The shared roots the source prepares its standbys on: a command that found no standby
    /// runs cold on the current one when it serves its plan (`SharedRoots::existing_for`,
    /// see `launch::start`).
    fn shared_roots(&self) -> &super::SharedRoots;
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
    /// A started interpreter's ready marker, when the sandbox has one, and what of it came.
    prestart: Option<(&'static [u8], Vec<u8>)>,
    init_ready: bool,
    /// When the shared root this sandbox is prepared on (and its `/etc` snapshot) was made.
    snapshot: Option<Instant>,
    workdir: PathBuf,
    /// The program's environment from the network plan (a gated run's proxy variables).
    network_env: Vec<(String, String)>,
    /// A gated sandbox's egress gate, started while the sandbox is prepared.
    gate: Option<StandbyGate>,
    /// What a failed run's hints are judged from (the plan's; the argv is the run's).
    hints: HintFacts,
    backend: String,
    details: Vec<String>,
    warnings: Vec<String>,
    /// Checks for git metadata planted in the caller's paths after the run.
    git_watch: Option<super::gitguard::PlantWatch>,
}

/// A warm run handed to its standby: what the caller serves, how it ends, and for a gated run
/// the slot the gate's decisions go to.
pub(super) struct WarmStart {
    pub started: Started,
    pub ending: Ending,
    pub network: Option<NetworkSender>,
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
    /// Starts preparing a sandbox for `sandbox`'s policy and options: its plan is a cold run's
    /// (refusing what a cold run would refuse), made by `plans` once for many sandboxes and
    /// filled in for this one (see `super::standby_plan`); then starts its init (forked by
    /// `spawner` when given, else executed). Does not wait.
    pub fn prepare(
        sandbox: &Sandbox,
        prestart: Option<&Prestart>,
        spawner: Option<&super::InitSpawner>,
        (plans, shared_roots): (&StandbyPlans, Option<&super::SharedRoots>),
    ) -> Result<Standby, Error> {
        let planned = plans.next(sandbox, prestart, shared_roots)?;
        let (stdin_read, stdin) = launch::pipe()?;
        let (stdout, stdout_write) = launch::pipe()?;
        let (stderr, stderr_write) = launch::pipe()?;
        let stdio = launch::InitStdio {
            stdin: Some(stdin_read),
            stdout: Some(stdout_write),
            stderr: Some(stderr_write),
        };
        let (go_read, go) = launch::pipe()?;
        let network_env = net::program_env(planned.egress.as_ref());
        let (gate, gate_channel) = match planned.egress {
            Some(egress) => {
                let (gate, channel) = StandbyGate::launch(egress)?;
                (Some(gate), Some(channel))
            }
            None => (None, None),
        };
        let shared_root = planned.shared_root;
        let (init, control, events) = launch::start_executed(
            &sandbox.options,
            stdio,
            (go_read, gate_channel),
            shared_root.as_deref(),
            &planned.body,
            spawner,
        )?;
        Ok(Standby {
            init,
            control,
            go: std::fs::File::from(go),
            stdin,
            stdout,
            stderr,
            events: std::fs::File::from(events),
            event_bytes: Vec::new(),
            prestart: prestart.map(|p| (p.ready_marker, Vec::new())),
            init_ready: false,
            snapshot: shared_root.map(|root| root.built()),
            workdir: planned.workdir,
            network_env,
            gate,
            hints: planned.hints,
            backend: planned.backend,
            details: planned.details,
            warnings: planned.warnings,
            git_watch: planned.git_watch,
        })
    }

    /// Whether sandboxes of `sandbox` can be prepared: what a cold run would refuse, and
    /// backends other than native, are refused. Creates nothing.
    pub fn check(sandbox: &Sandbox) -> Result<(), Error> {
        plan_standby(sandbox, Effects::None).map(drop)
    }

    /// What to poll for readiness: the event pipe, then a started interpreter's stdout.
    pub fn readiness_fd(&self) -> BorrowedFd<'_> {
        match (&self.prestart, self.init_ready) {
            (Some(_), true) => self.stdout.as_fd(),
            _ => self.events.as_fd(),
        }
    }

    /// Reads what the init has sent; call when [`Standby::events_fd`] is readable (it blocks
    /// otherwise).
    pub fn read_readiness(&mut self) -> Readiness {
        if self.init_ready {
            return self.read_marker();
        }
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
        self.init_ready = self.event_bytes.ends_with(b"\n")
            && self.lines().any(|event| matches!(event, InitEvent::Ready));
        match (self.init_ready, &self.prestart) {
            (true, None) => Readiness::Ready,
            _ => Readiness::Pending,
        }
    }

    /// A started interpreter's ready marker on stdout, read exactly (what follows is the
    /// run's output).
    fn read_marker(&mut self) -> Readiness {
        let Some((marker, seen)) = self.prestart.as_mut() else {
            return Readiness::Ready;
        };
        let mut chunk = vec![0u8; marker.len() - seen.len()];
        let n = nix::unistd::read(self.stdout.as_raw_fd(), &mut chunk).unwrap_or(0);
        if n == 0 {
            return Readiness::Failed(Error::io(
                "the warm sandbox's interpreter exited before it was ready (does every preloaded module import?)",
                std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            ));
        }
        seen.extend_from_slice(&chunk[..n]);
        match (seen.len() == marker.len(), seen == marker) {
            (false, _) => Readiness::Pending,
            (true, true) => Readiness::Ready,
            (true, false) => Readiness::Failed(Error::io(
                "the warm sandbox's interpreter wrote something else than its ready marker",
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            )),
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

    /// When the sandbox's `/etc` snapshot was taken, if before its preparation (it is
    /// prepared on a pool's shared root).
    pub fn snapshot_taken(&self) -> Option<Instant> {
        self.snapshot
    }

    /// Gives the sandbox up without a run: its init tears it down. Returns the init's pid to
    /// reap.
    pub fn retire(self) -> u32 {
        self.init.id()
    }
}

/// A cold run's plan and spec for `sandbox`, refused unless it runs natively.
pub(super) fn plan_standby(
    sandbox: &Sandbox,
    effects: Effects,
) -> Result<prepare::Prepared, Error> {
    plan_native(&sandbox.command("/bin/true"), effects)
}

/// What an interpreter zygote's children are confined by: a cold run's spec for `program`
/// (the plan, the native confinement, the required layers, limits and environment), with the
/// plan's warnings and details; refused as a warm pool is (see [`plan_standby`]).
pub(crate) fn plan_zygote(sandbox: &Sandbox, program: &str) -> Result<ZygotePlan, Error> {
    let prepared = plan_native(&sandbox.command(program), Effects::Run)?;
    Ok(ZygotePlan {
        backend: prepared.plan.backend.clone(),
        details: prepared.plan.details.clone(),
        spec: prepared.spec,
        warnings: prepared.warnings,
        kill_on_output_limit: sandbox.policy().limits.on_output_limit
            == crate::policy::OutputLimitAction::Kill,
        git_watch: prepared.git_watch,
    })
}

/// A zygote's plan (see [`plan_zygote`]).
#[derive(Debug, Clone)]
pub(crate) struct ZygotePlan {
    pub spec: crate::spec::InitSpec,
    pub warnings: Vec<String>,
    pub details: Vec<String>,
    pub backend: String,
    /// The policy's `on_output_limit = kill`.
    pub kill_on_output_limit: bool,
    /// Checks for git metadata planted in the caller's paths after each child's run.
    git_watch: Option<super::gitguard::PlantWatch>,
}

impl ZygotePlan {
    /// Once a child's processes are gone: the git metadata it planted, moved aside (see
    /// `supervisor::gitguard::PlantWatch`), as the run's warnings.
    pub(crate) fn planted_git_warnings(&self) -> Vec<String> {
        self.git_watch
            .as_ref()
            .map(|watch| watch.quarantine())
            .unwrap_or_default()
    }
}

fn plan_native(command: &Command, effects: Effects) -> Result<prepare::Prepared, Error> {
    let prepared = prepare::prepare(command, effects)?;
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

/// What a started interpreter reads on stdin: the length, then NUL-separated fields: the code
/// (argv `[interpreter, "-c", code, args...]`), the number of arguments, the arguments and
/// the environment as `KEY=VALUE` (plain bytes, so that the interpreter needs no module to
/// read them).
fn code_request(go: &WarmGo) -> Result<Vec<u8>, Error> {
    let (Some("-c"), Some(code)) = (go.argv.get(1).map(String::as_str), go.argv.get(2)) else {
        return Err(Error::Command(
            "a pool with a started interpreter runs code: use WarmPool::code".into(),
        ));
    };
    if !go.files.is_empty() {
        return Err(Error::Command(
            "a pool with a started interpreter does not stage files; use a warm pool without one"
                .into(),
        ));
    }
    let args = &go.argv[3..];
    let mut fields = vec![code.clone(), args.len().to_string()];
    fields.extend(args.iter().cloned());
    fields.extend(go.env.iter().map(|(key, value)| format!("{key}={value}")));
    if fields.iter().any(|f| f.contains('\0')) || go.env.iter().any(|(k, _)| k.contains('=')) {
        return Err(Error::Command(
            "code, arguments and environment must not contain NUL bytes (nor names `=`)".into(),
        ));
    }
    let body = fields.join("\0").into_bytes();
    let mut framed = (body.len() as u64).to_le_bytes().to_vec();
    framed.extend_from_slice(&body);
    Ok(framed)
}

fn setup_failed(error: SetupError) -> Error {
    Error::io(
        format!("preparing a warm sandbox failed at {:?}", error.step),
        std::io::Error::other(error.message),
    )
}

/// A warm command's run on a standby from its source, or `None` to run it cold (a cold
/// command, no standby ready, or one whose init died while it waited).
pub(super) fn start_warm(command: &Command) -> Result<Option<WarmStart>, Error> {
    let Some(source) = command.standby.clone() else {
        return Ok(None);
    };
    check_warm_command(command)?;
    crate::spec::check_staged_files(&command.files)?;
    let Some(standby) = source.take() else {
        return Ok(None);
    };
    start_on(command, standby, source)
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

/// The detail a run started on a prepared sandbox carries in its result.
pub const WARM_DETAIL: &str = "started on a prepared sandbox (warm pool)";

/// Hands `command` to a ready standby and returns the run as a cold start would; `None` when
/// the standby's init is gone (the command then runs cold).
fn start_on(
    command: &Command,
    standby: Standby,
    source: Arc<dyn StandbySource>,
) -> Result<Option<WarmStart>, Error> {
    let prestarted = standby.prestart.is_some();
    let Standby {
        init,
        mut control,
        go: mut command_pipe,
        stdin,
        stdout,
        stderr,
        events,
        workdir,
        network_env,
        gate,
        hints,
        backend,
        mut details,
        warnings,
        git_watch,
        ..
    } = standby;
    // Says which path the run took (the daemon's `start`); the isolation record is the cold
    // run's either way.
    details.push(WARM_DETAIL.into());
    let (gate, network) = match gate.map(StandbyGate::running).transpose() {
        Ok(None) => (None, None),
        Ok(Some(Some((gate, network)))) => (Some(gate), Some(network)),
        // The setup ended before handing the gate its sockets: the sandbox is not usable.
        Ok(Some(None)) => {
            source.retire(init.id());
            return Ok(None);
        }
        // Listeners nobody serves: the program must never run.
        Err(e) => {
            source.retire(init.id());
            return Err(e);
        }
    };
    let policy = &command.sandbox.policy;
    let go = WarmGo {
        argv: command.argv.clone(),
        env: prepare::program_env(policy, &command.env, &workdir, None, &network_env),
        files: command.files.clone(),
    };
    let start = Instant::now();
    let mut stdin_bytes = match &command.stdin {
        Input::Bytes(bytes) => bytes.clone(),
        _ => Vec::new(),
    };
    // The command goes straight to PID 1 (which reads it to EOF), or the code to the
    // interpreter started in the sandbox (ahead of the program's own stdin, fed once the run
    // is on).
    let encoded = match prestarted {
        true => code_request(&go).map(|request| {
            drop(stdin_bytes.splice(0..0, request));
            Vec::new()
        }),
        false => serde_json::to_vec(&go)
            .map_err(|e| Error::io("cannot encode the command", std::io::Error::from(e))),
    };
    let command_body = match encoded {
        Ok(body) => body,
        Err(e) => {
            source.retire(init.id());
            return Err(e);
        }
    };
    // The init hears that the run started (and starts its clocks) before PID 1 gets the
    // command: a sandbox whose init is gone is then found before anything of the run was
    // handed over, and the command runs cold once. In the other order a program that ended
    // before the word reached its init (`/bin/true` while this thread waited for a CPU) had
    // run, its init had ended with no run to report, and the command ran a second time, cold.
    let sent = control
        .write_all(crate::spec::WARM_STARTED_LINE)
        .and_then(|()| command_pipe.write_all(&command_body));
    drop(command_pipe);
    if sent.is_err() {
        source.retire(init.id());
        return Ok(None);
    }
    let stdin = (!stdin_bytes.is_empty()).then_some(serve::StdinSource::Pipe(stdin, stdin_bytes));
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
        gate,
        hints: hints.for_argv(&command.argv),
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
        git_watch,
    };
    Ok(Some(WarmStart {
        started,
        ending,
        network,
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::supervisor::SharedRoots;

    /// A source that records the inits it is asked to reap.
    #[derive(Debug)]
    struct Retired(Mutex<Vec<u32>>, SharedRoots);

    impl StandbySource for Retired {
        fn take(&self) -> Option<Standby> {
            None
        }
        fn retire(&self, init_pid: u32) {
            self.0.lock().unwrap().push(init_pid);
        }
        fn shared_roots(&self) -> &SharedRoots {
            &self.1
        }
    }

    fn null() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    /// A ready standby whose init is gone (its control pipe has no reader) while its PID 1
    /// still reads the command pipe: the command must not reach PID 1, since the command then
    /// runs cold. Sent first, a program that ends before the init hears of the run runs twice.
    #[test]
    fn a_command_never_reaches_a_sandbox_whose_init_is_gone() {
        let sandbox = Sandbox::new(crate::policy::load_profile("untrusted").unwrap()).unwrap();
        let prepared = plan_standby(&sandbox, Effects::None).unwrap();
        let (control_read, control) = launch::pipe().unwrap();
        drop(control_read);
        let (pid1_end, go) = launch::pipe().unwrap();
        let (events, _events_write) = launch::pipe().unwrap();
        let standby = Standby {
            init: InitProcess::Executed(nix::unistd::Pid::from_raw(999_999)),
            control: control.into(),
            go: go.into(),
            stdin: null(),
            stdout: null(),
            stderr: null(),
            events: events.into(),
            event_bytes: Vec::new(),
            prestart: None,
            init_ready: true,
            snapshot: None,
            workdir: prepared.spec.workdir.clone(),
            network_env: Vec::new(),
            gate: None,
            hints: HintFacts::of(&prepared.plan),
            backend: prepared.plan.backend.clone(),
            details: Vec::new(),
            warnings: Vec::new(),
            git_watch: None,
        };
        let source = Arc::new(Retired(Mutex::new(Vec::new()), SharedRoots::new(None)));
        let command = sandbox.command("/bin/true");
        let started = start_on(&command, standby, source.clone()).unwrap();
        assert!(started.is_none(), "the run went on without its init");
        assert_eq!(*source.0.lock().unwrap(), [999_999]);
        let mut handed = Vec::new();
        std::fs::File::from(pid1_end)
            .read_to_end(&mut handed)
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&handed),
            "",
            "PID 1 got the command of a run that then ran cold"
        );
    }
}

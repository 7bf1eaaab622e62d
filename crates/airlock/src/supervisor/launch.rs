//! Starting the init with its pipes and stdio, and handing it the spec. A supervisor with one
//! thread (the CLI) forks it and the child becomes
//! the init at once, with the run's spec already in its memory: no exec, no dynamic load of
//! the airlock binary and no spec on the control pipe, about 1 ms per run (more for a
//! container bundle, whose files are part of the spec). A supervisor with threads (a library
//! caller, the pool, a test harness) re-executes the binary as `airlock __init` instead,
//! because a forked child could inherit a lock another thread holds, and sends the spec on the
//! control pipe. Both run the same init with the same descriptors.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Instant;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use super::builder::{Command, Input, SandboxOptions, Sink};
use super::finish::Ending;
use super::hints::HintFacts;
use super::prepare::Prepared;
use super::serve;
use super::shared_root::SharedRoot;
use super::spawner::{InitSpawner, Spawned};
use super::terminal;
use crate::error::Error;
use crate::init::INIT_ARG;
use crate::linux::sys::{self, Forked};
use crate::net;
use crate::spec::{InitSpec, CONTROL_FD, EVENTS_FD, GATE_FD, GO_FD};
use airlock_egress::EventSink;

/// A run whose init has its spec: the control pipe and the pipes the supervisor serves.
pub(super) struct Started {
    pub control: std::fs::File,
    pub pipes: serve::Pipes,
}

/// Starts the init and sends it the spec; for a gated run, starts the egress gate once the
/// sandbox hands it its sockets (`on_network` receives the gate's decisions as they happen).
pub(super) fn start(
    command: &Command,
    prepared: Prepared,
    on_network: Option<EventSink>,
) -> Result<(Started, Ending), Error> {
    let Prepared {
        plan,
        mut spec,
        warnings,
        egress,
        git_watch,
        ..
    } = prepared;
    let launch = init_launch(&command.sandbox.options);
    let gated = egress.is_some();
    let spawner = command.spawner.as_deref();
    // A warm pool's command that found no sandbox ready: on the pool's shared root when it has
    // one for this plan, so that its PID 1 adds only the run's own mounts, as a prepared one's.
    let pool = command.standby.as_ref();
    let root = pool.and_then(|pool| pool.shared_roots().existing_for(&spec));
    spec.shared_root = root.is_some();
    let on = (spawner, root.as_deref());
    let (mut init, ours) = start_init_on_new_descriptors(command, &launch, &spec, gated, on)?;
    let OurEnds {
        control,
        events_read,
        stdin,
        out_pipes,
        gate_end,
    } = ours;
    let gate = match (egress, gate_end) {
        (Some(egress), Some(gate_end)) => match net::start(egress, &gate_end, on_network) {
            Ok(gate) => gate,
            Err(e) => {
                init.kill();
                let _ = init.wait();
                return Err(e);
            }
        },
        _ => None,
    };
    let started = Started {
        control,
        pipes: serve::Pipes {
            stdin,
            stdout: out_pipes.0,
            stderr: out_pipes.1,
            events: events_read,
            end_at_finished: false,
        },
    };
    let ending = Ending {
        init,
        hints: HintFacts::of(&plan),
        gate,
        backend: plan.backend,
        warnings,
        details: plan.details,
        start: Instant::now(),
        capture: (
            command.stdout == Sink::Capture,
            command.stderr == Sink::Capture,
        ),
        keep: command.keep,
        retire: None,
        git_watch,
    };
    Ok((started, ending))
}

/// The supervisor's ends of a run's descriptors: the init's control pipe (the spec already
/// sent), its event pipe, the program's input and output, and the gate's end of its channel.
struct OurEnds {
    control: std::fs::File,
    events_read: OwnedFd,
    stdin: Option<serve::StdinSource>,
    out_pipes: OutputPipes,
    gate_end: Option<std::os::unix::net::UnixStream>,
}

/// Whether an init started, with the supervisor's ends of its descriptors.
enum Launched<T> {
    Started(InitProcess, T),
    /// The spawner took the request and no init answered (see [`Spawned::Unanswered`]).
    SpawnerLost(std::io::Error),
}

/// Opens a run's pipes (and a gated run's channel), starts its init on them and sends it the
/// spec when it reads it. When the spawner took the request and no init answered, those
/// descriptors are closed (an init it may have forked reads EOF on its control pipe and ends
/// before it creates anything) and the init is executed on new ones.
fn start_init_on_new_descriptors(
    command: &Command,
    launch: &InitLaunch,
    spec: &InitSpec,
    gated: bool,
    (spawner, shared_root): (Option<&InitSpawner>, Option<&SharedRoot>),
) -> Result<(InitProcess, OurEnds), Error> {
    match start_on_new_descriptors(command, launch, spec, gated, (spawner, shared_root))? {
        Launched::Started(init, ours) => Ok((init, ours)),
        Launched::SpawnerLost(e) if spawner.is_some() => {
            tracing::warn!("the init spawner did not answer ({e}): the init is executed");
            start_init_on_new_descriptors(command, launch, spec, gated, (None, shared_root))
        }
        Launched::SpawnerLost(e) => Err(Error::io("the init spawner did not answer", e)),
    }
}

/// Opens a run's descriptors and starts its init on them (see
/// [`start_init_on_new_descriptors`]).
fn start_on_new_descriptors(
    command: &Command,
    launch: &InitLaunch,
    spec: &InitSpec,
    gated: bool,
    (spawner, shared_root): (Option<&InitSpawner>, Option<&SharedRoot>),
) -> Result<Launched<OurEnds>, Error> {
    let (control_read, control_write) = pipe()?;
    let (events_read, events_write) = pipe()?;
    let (stdio, stdin, out_pipes) = stdio_for(command)?;
    let channel = gated.then(net::Channel::new).transpose()?;
    let (gate_end, sandbox_end) = match channel {
        Some(channel) => (Some(channel.gate_end), Some(channel.sandbox_end)),
        None => (None, None),
    };
    let pipes = InitPipes {
        control: control_read,
        events: events_write,
        gate: sandbox_end,
        go: None,
        shared_root: shared_root.map(SharedRoot::fds),
    };
    let mut init = match start_init(launch, stdio, pipes, spec, spawner)? {
        Launched::Started(init, ()) => init,
        Launched::SpawnerLost(e) => return Ok(Launched::SpawnerLost(e)),
    };
    let mut control = std::fs::File::from(control_write);
    if init.reads_spec() {
        let body = serde_json::to_vec(spec).map_err(std::io::Error::from);
        send_spec(&mut init, &mut control, body)?;
    }
    let ours = OurEnds {
        control,
        events_read,
        stdin,
        out_pipes,
        gate_end,
    };
    Ok(Launched::Started(init, ours))
}

/// Sends the init its spec (the JSON, or why it could not be made); an init that cannot be
/// sent it is killed and reaped.
fn send_spec<B: AsRef<[u8]>>(
    init: &mut InitProcess,
    control: &mut std::fs::File,
    body: std::io::Result<B>,
) -> Result<(), Error> {
    body.and_then(|body| write_spec(control, body.as_ref()))
        .map_err(|e| {
            init.kill();
            let _ = init.wait();
            Error::io("cannot send the run spec to the init", e)
        })
}

pub(super) fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("cannot create a pipe", e.into()))
}

/// The read ends of the program's stdout and stderr pipes (a terminal's master side alone).
type OutputPipes = (Option<OwnedFd>, Option<OwnedFd>);

/// The init's stdio, what feeds the program's input, and the output pipes to drain.
fn stdio_for(
    command: &Command,
) -> Result<(InitStdio, Option<serve::StdinSource>, OutputPipes), Error> {
    if command.tty {
        return terminal_stdio(command);
    }
    let mut stdio = InitStdio::default();
    let mut stdin = None;
    match &command.stdin {
        Input::Inherit => {}
        Input::Null => stdio.stdin = Some(dev_null()?),
        Input::Bytes(bytes) => {
            let (read, write) = pipe()?;
            stdio.stdin = Some(read);
            stdin = Some(serve::StdinSource::Pipe(write, bytes.clone()));
        }
    }
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    stdio.stdout = Some(stdout_write);
    stdio.stderr = Some(stderr_write);
    Ok((stdio, stdin, (Some(stdout_read), Some(stderr_read))))
}

/// A terminal of the program's own: the slave side as all three of its stdio, the master
/// side read as its output and written with its input (see [`super::terminal`]).
fn terminal_stdio(
    command: &Command,
) -> Result<(InitStdio, Option<serve::StdinSource>, OutputPipes), Error> {
    let pty = terminal::open_pty()?;
    let copy = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|e| Error::io("cannot duplicate the terminal", e))
    };
    let stdio = InitStdio {
        stdin: Some(copy(&pty.slave)?),
        stdout: Some(copy(&pty.slave)?),
        stderr: Some(pty.slave),
    };
    let (bytes, relay) = match &command.stdin {
        Input::Inherit => (Vec::new(), true),
        Input::Null => (Vec::new(), false),
        Input::Bytes(bytes) => (bytes.clone(), false),
    };
    let input = serve::StdinSource::Terminal {
        master: copy(&pty.master)?,
        bytes,
        relay,
    };
    Ok((stdio, Some(input), (Some(pty.master), None)))
}

fn dev_null() -> Result<OwnedFd, Error> {
    std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| Error::io("cannot open /dev/null", e))
}

/// An explicit init program (option or `AIRLOCK_INIT`) is always executed; otherwise the
/// supervisor may fork the init from itself.
fn init_launch(options: &SandboxOptions) -> InitLaunch {
    InitLaunch {
        may_fork: explicit_init_program(options).is_none(),
        program: init_program(options),
    }
}

fn explicit_init_program(options: &SandboxOptions) -> Option<PathBuf> {
    options
        .init_program
        .clone()
        .or_else(|| std::env::var_os("AIRLOCK_INIT").map(PathBuf::from))
}

/// The program executed as the init: the explicit one, else this process's own binary.
pub(super) fn init_program(options: &SandboxOptions) -> PathBuf {
    explicit_init_program(options)
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| PathBuf::from("airlock"))
}

/// Executes an init (never forks one from this process: a warm sandbox's init outlives the
/// moment it was started in), or has the pool's `spawner` fork it, with `stdio`, its command
/// pipe and, for a gated run, the gate's channel, sends it its spec (`spec`: the JSON,
/// `super::standby_plan`), and returns it with its control pipe and the read end of its
/// event pipe.
pub(super) fn start_executed(
    options: &SandboxOptions,
    stdio: InitStdio,
    (go, gate): (OwnedFd, Option<OwnedFd>),
    shared_root: Option<&SharedRoot>,
    spec: &[u8],
    spawner: Option<&InitSpawner>,
) -> Result<(InitProcess, std::fs::File, OwnedFd), Error> {
    let (control_read, control_write) = pipe()?;
    let (events_read, events_write) = pipe()?;
    let launch = InitLaunch {
        may_fork: false,
        ..init_launch(options)
    };
    let pipes = InitPipes {
        control: control_read,
        events: events_write,
        gate,
        go: Some(go),
        shared_root: shared_root.map(|root| root.fds()),
    };
    // The pool prepares another sandbox when this one fails.
    let mut init = match spawn_or_fork_by(&launch, stdio, pipes, spawner)? {
        Launched::Started(init, ()) => init,
        Launched::SpawnerLost(e) => return Err(Error::io("the init spawner did not answer", e)),
    };
    let mut control = std::fs::File::from(control_write);
    send_spec(&mut init, &mut control, Ok(spec))?;
    Ok((init, control, events_read))
}

fn write_spec(control: &mut std::fs::File, body: &[u8]) -> std::io::Result<()> {
    control.write_all(&(body.len() as u64).to_le_bytes())?;
    control.write_all(body)
}

/// The init's standard descriptors; `None` inherits the supervisor's own.
#[derive(Debug, Default)]
pub(super) struct InitStdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// The pipe ends the init keeps at [`CONTROL_FD`] and [`EVENTS_FD`], and the egress gate's
/// channel at [`GATE_FD`] for a gated run.
#[derive(Debug)]
struct InitPipes {
    control: OwnedFd,
    events: OwnedFd,
    gate: Option<OwnedFd>,
    /// A warm init's command pipe (read end).
    go: Option<OwnedFd>,
    /// A warm init's shared root (its user and mount namespaces), borrowed from the pool
    /// until the init has its copies.
    shared_root: Option<[RawFd; 2]>,
}

impl InitPipes {
    /// Where each descriptor goes in the init.
    fn placements(&self) -> Vec<(RawFd, RawFd)> {
        let mut placed = vec![
            (self.control.as_raw_fd(), CONTROL_FD),
            (self.events.as_raw_fd(), EVENTS_FD),
        ];
        placed.extend(self.gate.as_ref().map(|fd| (fd.as_raw_fd(), GATE_FD)));
        placed.extend(self.go.as_ref().map(|fd| (fd.as_raw_fd(), GO_FD)));
        let shared_root = self.shared_root.iter().flatten().copied();
        placed.extend(shared_root.zip(crate::spec::fds::SHARED_ROOT_FDS));
        placed
    }
}

/// How to start the init: re-execute this binary, or fork when the supervisor allows it.
#[derive(Debug)]
struct InitLaunch {
    program: PathBuf,
    may_fork: bool,
}

/// The init process of one run.
#[derive(Debug)]
pub(super) enum InitProcess {
    /// Executed as `airlock __init`: it reads the spec on its control pipe.
    Executed(Pid),
    /// Forked with the spec already in its memory.
    Forked(Pid),
}

impl InitProcess {
    /// Whether the init still needs the spec on its control pipe (it was executed, not forked
    /// with the spec in memory).
    pub fn reads_spec(&self) -> bool {
        matches!(self, InitProcess::Executed(_))
    }

    fn pid(&self) -> Pid {
        match self {
            InitProcess::Executed(pid) | InitProcess::Forked(pid) => *pid,
        }
    }

    pub fn id(&self) -> u32 {
        self.pid().as_raw() as u32
    }

    pub fn kill(&mut self) {
        let _ = kill(self.pid(), Signal::SIGKILL);
    }

    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            match waitpid(self.pid(), None) {
                Ok(WaitStatus::Exited(_, code)) => return Ok(ExitStatus::from_raw(code << 8)),
                Ok(WaitStatus::Signaled(_, signal, _)) => {
                    return Ok(ExitStatus::from_raw(signal as i32))
                }
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Starts the init with `stdio` and `pipes` in place: forked from this process when it may
/// be, else forked by `spawner` when given, else executed. The caller's copies may be dropped
/// once this returns.
fn start_init(
    launch: &InitLaunch,
    stdio: InitStdio,
    pipes: InitPipes,
    spec: &InitSpec,
    spawner: Option<&InitSpawner>,
) -> Result<Launched<()>, Error> {
    if launch.may_fork {
        match sys::fork_if_single_threaded() {
            Ok(Some(Forked::Child)) => become_init(&stdio, &pipes, spec),
            Ok(Some(Forked::Parent(pid))) => {
                return Ok(Launched::Started(InitProcess::Forked(pid), ()))
            }
            Ok(None) => {}
            Err(cause) => {
                return Err(Error::Spawn {
                    program: launch.program.clone(),
                    cause,
                })
            }
        }
    }
    spawn_or_fork_by(launch, stdio, pipes, spawner)
}

/// Has `spawner` fork the init (it then reads its spec on the control pipe, as an executed
/// one), else executes it: when there is no spawner, it is gone, or the init would inherit
/// some of its stdio from this process (the spawner's own are not this process's). Neither
/// when the spawner took the request and no init answered: these descriptors are then not
/// used again.
fn spawn_or_fork_by(
    launch: &InitLaunch,
    stdio: InitStdio,
    pipes: InitPipes,
    spawner: Option<&InitSpawner>,
) -> Result<Launched<()>, Error> {
    let own_stdio = stdio.stdin.is_some() && stdio.stdout.is_some() && stdio.stderr.is_some();
    let spawned = match spawner {
        Some(spawner) if own_stdio => spawner.spawn(&placements(&stdio, &pipes)),
        _ => Spawned::NotAsked,
    };
    match spawned {
        Spawned::Forked(pid) => Ok(Launched::Started(InitProcess::Executed(pid), ())),
        Spawned::NotAsked => spawn(launch, stdio, pipes).map(|init| Launched::Started(init, ())),
        Spawned::Unanswered(e) => Ok(Launched::SpawnerLost(e)),
    }
}

/// Where each of the init's descriptors goes: the pipes at [`CONTROL_FD`], [`EVENTS_FD`] (and
/// [`GATE_FD`]), the given stdio at 0, 1 and 2 (an absent one is inherited).
fn placements(stdio: &InitStdio, pipes: &InitPipes) -> Vec<(RawFd, RawFd)> {
    let mut placed = pipes.placements();
    let standard = [&stdio.stdin, &stdio.stdout, &stdio.stderr];
    for (target, fd) in standard.into_iter().enumerate() {
        if let Some(fd) = fd {
            placed.push((fd.as_raw_fd(), target as RawFd));
        }
    }
    placed
}

/// In the forked child: the descriptors go where an exec'd init finds them, signal handlers
/// are reset as exec would, and the child never returns into the supervisor's code.
fn become_init(stdio: &InitStdio, pipes: &InitPipes, spec: &InitSpec) -> ! {
    let placed = placements(stdio, pipes);
    let highest = placed
        .iter()
        .map(|(_, target)| *target)
        .max()
        .unwrap_or(EVENTS_FD);
    if sys::place_fds_inheritable(&placed).is_err() || sys::close_from(highest + 1).is_err() {
        sys::exit_now(127);
    }
    sys::reset_caught_signals();
    let _ = std::panic::catch_unwind(|| crate::init::init_main_with(Some(spec)));
    sys::exit_now(101)
}

/// Executes the init (`posix_spawn`: no copy of a large caller's memory, see
/// [`sys::spawn_with_fds`]) with an empty environment and its descriptors in place.
fn spawn(launch: &InitLaunch, stdio: InitStdio, pipes: InitPipes) -> Result<InitProcess, Error> {
    sys::spawn_with_fds(&launch.program, &[INIT_ARG], &placements(&stdio, &pipes))
        .map(InitProcess::Executed)
        .map_err(|cause| Error::Spawn {
            program: launch.program.clone(),
            cause,
        })
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsRawFd;

    use super::*;

    /// What an executed init starts with, as before `posix_spawn`: stdio and the two pipes at
    /// their numbers and no other descriptor, an empty environment, no blocked signal and
    /// SIGPIPE at its default (this process, like every Rust program, ignores it).
    #[test]
    fn an_executed_init_gets_exactly_its_descriptors_and_a_clean_start() {
        let (out_read, out_write) = pipe().unwrap();
        let (control_read, _control_write) = pipe().unwrap();
        let (_events_read, events_write) = pipe().unwrap();
        let _stray = std::fs::File::open("/dev/null").unwrap();
        let script = "ls /proc/self/fd; env; grep -E '^Sig(Blk|Ign)' /proc/self/status";
        let stdio = InitStdio {
            stdout: Some(out_write),
            ..InitStdio::default()
        };
        let pipes = InitPipes {
            control: control_read,
            events: events_write,
            gate: None,
            go: None,
            shared_root: None,
        };
        let pid = sys::spawn_with_fds(
            std::path::Path::new("/bin/sh"),
            &["-c", script],
            &placements(&stdio, &pipes),
        )
        .unwrap();
        drop((stdio, pipes));
        let mut report = String::new();
        std::fs::File::from(out_read)
            .read_to_string(&mut report)
            .unwrap();
        let mut init = InitProcess::Executed(pid);
        assert!(init.wait().unwrap().success(), "{report}");
        let fds: Vec<i32> = report
            .lines()
            .take_while(|l| !l.contains('='))
            .map(|l| l.parse().unwrap())
            .collect();
        assert!((0..=4).all(|fd| fds.contains(&fd)), "{report}");
        // Besides 0-4, only what this process holds without close-on-exec (a test harness
        // may) and the descriptor `ls` opens on /proc/self/fd: none of the close-on-exec
        // ones (the stray file, the other pipe ends, the copies made while placing).
        let inheritable = inheritable_fds();
        let extra: Vec<&i32> = fds
            .iter()
            .filter(|fd| **fd > 4 && !inheritable.contains(fd))
            .collect();
        assert!(extra.len() <= 1, "leaked {extra:?}: {report}");
        let env: Vec<&str> = report.lines().filter(|l| l.contains('=')).collect();
        assert!(
            env.iter()
                .all(|v| ["PWD=", "SHLVL=", "_="].iter().any(|s| v.starts_with(s))),
            "only what sh sets itself: {env:?}"
        );
        assert!(report.contains("SigBlk:\t0000000000000000"), "{report}");
        let ignored = report.lines().find(|l| l.starts_with("SigIgn")).unwrap();
        let mask = u64::from_str_radix(ignored.split_whitespace().nth(1).unwrap(), 16).unwrap();
        assert_eq!(
            mask & (1 << (libc::SIGPIPE - 1)),
            0,
            "SIGPIPE ignored: {report}"
        );
        assert!(_stray.as_raw_fd() > 4);
    }

    /// This process's descriptors without close-on-exec.
    fn inheritable_fds() -> Vec<i32> {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|fd| {
                nix::fcntl::fcntl(*fd, nix::fcntl::FcntlArg::F_GETFD)
                    .is_ok_and(|flags| flags & libc::FD_CLOEXEC == 0)
            })
            .collect()
    }

    #[test]
    fn a_missing_init_program_is_a_spawn_error() {
        let error = sys::spawn_with_fds(std::path::Path::new("/no/such/airlock"), &[], &[]);
        assert_eq!(error.unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }
}

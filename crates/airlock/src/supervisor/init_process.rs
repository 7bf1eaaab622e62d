//! Starting the init. A supervisor with one thread (the CLI) forks it and the child becomes
//! the init at once, with the run's spec already in its memory: no exec, no dynamic load of
//! the airlock binary and no spec on the control pipe, about 1 ms per run (more for a
//! container bundle, whose files are part of the spec). A supervisor with threads (a library
//! caller, the pool, a test harness) re-executes the binary as `airlock __init` instead,
//! because a forked child could inherit a lock another thread holds, and sends the spec on the
//! control pipe. Both run the same init with the same descriptors.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::error::Error;
use crate::init::INIT_ARG;
use crate::linux::sys::{self, Forked};
use crate::spec::{InitSpec, CONTROL_FD, EVENTS_FD};

/// The init's standard descriptors; `None` inherits the supervisor's own.
#[derive(Debug, Default)]
pub(super) struct InitStdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// The pipe ends the init keeps at [`CONTROL_FD`] and [`EVENTS_FD`].
#[derive(Debug)]
pub(super) struct InitPipes {
    pub control: OwnedFd,
    pub events: OwnedFd,
}

/// How to start the init: re-execute this binary, or fork when the supervisor allows it.
#[derive(Debug)]
pub(super) struct InitLaunch {
    pub program: PathBuf,
    pub may_fork: bool,
}

/// The init process of one run.
#[derive(Debug)]
pub(super) enum InitProcess {
    Spawned(Child),
    Forked(Pid),
}

impl InitProcess {
    /// Whether the init still needs the spec on its control pipe (it was executed, not forked
    /// with the spec in memory).
    pub fn reads_spec(&self) -> bool {
        matches!(self, InitProcess::Spawned(_))
    }

    pub fn id(&self) -> u32 {
        match self {
            InitProcess::Spawned(child) => child.id(),
            InitProcess::Forked(pid) => pid.as_raw() as u32,
        }
    }

    pub fn kill(&mut self) {
        match self {
            InitProcess::Spawned(child) => drop(child.kill()),
            InitProcess::Forked(pid) => drop(kill(*pid, Signal::SIGKILL)),
        }
    }

    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            InitProcess::Spawned(child) => child.wait(),
            InitProcess::Forked(pid) => loop {
                match waitpid(*pid, None) {
                    Ok(WaitStatus::Exited(_, code)) => return Ok(ExitStatus::from_raw(code << 8)),
                    Ok(WaitStatus::Signaled(_, signal, _)) => {
                        return Ok(ExitStatus::from_raw(signal as i32))
                    }
                    Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            },
        }
    }
}

/// Starts the init with `stdio` and `pipes` in place. The caller's copies may be dropped once
/// this returns.
pub(super) fn start(
    launch: &InitLaunch,
    stdio: InitStdio,
    pipes: InitPipes,
    spec: &InitSpec,
) -> Result<InitProcess, Error> {
    if launch.may_fork {
        match sys::fork_if_single_threaded() {
            Ok(Some(Forked::Child)) => become_init(&stdio, &pipes, spec),
            Ok(Some(Forked::Parent(pid))) => return Ok(InitProcess::Forked(pid)),
            Ok(None) => {}
            Err(cause) => {
                return Err(Error::Spawn {
                    program: launch.program.clone(),
                    cause,
                })
            }
        }
    }
    spawn(launch, stdio, pipes)
}

/// In the forked child: the descriptors go where an exec'd init finds them, signal handlers
/// are reset as exec would, and the child never returns into the supervisor's code.
fn become_init(stdio: &InitStdio, pipes: &InitPipes, spec: &InitSpec) -> ! {
    let mut placed: Vec<(RawFd, RawFd)> = vec![
        (pipes.control.as_raw_fd(), CONTROL_FD),
        (pipes.events.as_raw_fd(), EVENTS_FD),
    ];
    let standard = [&stdio.stdin, &stdio.stdout, &stdio.stderr];
    for (target, fd) in standard.into_iter().enumerate() {
        if let Some(fd) = fd {
            placed.push((fd.as_raw_fd(), target as RawFd));
        }
    }
    if sys::place_fds_inheritable(&placed).is_err() || sys::close_from(EVENTS_FD + 1).is_err() {
        sys::exit_now(127);
    }
    sys::reset_caught_signals();
    let _ = std::panic::catch_unwind(|| crate::init::init_main_with(Some(spec)));
    sys::exit_now(101)
}

fn spawn(launch: &InitLaunch, stdio: InitStdio, pipes: InitPipes) -> Result<InitProcess, Error> {
    let mut init = std::process::Command::new(&launch.program);
    init.arg(INIT_ARG).env_clear();
    let or_inherit = |fd: Option<OwnedFd>| fd.map_or_else(Stdio::inherit, Stdio::from);
    init.stdin(or_inherit(stdio.stdin));
    init.stdout(or_inherit(stdio.stdout));
    init.stderr(or_inherit(stdio.stderr));
    sys::map_fds_on_spawn(
        &mut init,
        [
            (pipes.control.as_raw_fd(), CONTROL_FD),
            (pipes.events.as_raw_fd(), EVENTS_FD),
        ],
    );
    init.spawn()
        .map(InitProcess::Spawned)
        .map_err(|cause| Error::Spawn {
            program: launch.program.clone(),
            cause,
        })
}

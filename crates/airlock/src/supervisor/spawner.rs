//! The pool's half of the init spawner (the spawner itself: `init::spawner`): one airlock
//! process executed per warm pool that forks each prepared sandbox's init, so that an init
//! costs a fork of a small process instead of an exec of the airlock binary (its loader,
//! relocations and first touches: about 250 page faults). The init it forks is the pool's
//! own child, with exactly the descriptors an executed init gets, and reads its spec on the
//! control pipe as one.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, MsgFlags};
use nix::unistd::Pid;

use super::builder::{Sandbox, SandboxOptions};
use crate::error::Error;
use crate::init::INIT_ARG;
use crate::linux::sys;
use crate::spec::{CONTROL_FD, SPAWNER_ARG};

/// How long the pool waits for the spawner's greeting or an answer (a fork takes
/// milliseconds; a spawner that does not answer in this time is not asked again).
const ANSWER_TIMEOUT_S: i64 = 10;

/// Executes the init program of `options` as `__init ROLE` (the spawner, a shared root's
/// builder: a threaded pool must not fork), its stdio on `/dev/null` and one end of a
/// socket at [`CONTROL_FD`]; returns the other end and its pid. Only the helper holds its
/// end, so a helper that ends reads as EOF here. `what` names it in errors.
pub(super) fn execute_init_helper(
    options: &SandboxOptions,
    role: &str,
    what: &str,
) -> Result<(OwnedFd, Pid), Error> {
    let (ours, theirs) = crate::linux::seqpacket_pair()
        .map_err(|e| Error::io(format!("cannot create {what}'s socket"), e))?;
    let null =
        std::fs::File::open("/dev/null").map_err(|e| Error::io("cannot open /dev/null", e))?;
    let program = super::launch::init_program(options);
    let placed = [
        (null.as_raw_fd(), 0),
        (null.as_raw_fd(), 1),
        (null.as_raw_fd(), 2),
        (theirs.as_raw_fd(), CONTROL_FD),
    ];
    let pid = sys::spawn_with_fds(&program, &[INIT_ARG, role], &placed)
        .map_err(|cause| Error::Spawn { program, cause })?;
    Ok((ours, pid))
}

/// A running init spawner. [`InitSpawner::close`] (or dropping it) closes its socket, which
/// ends it, and reaps it.
#[derive(Debug)]
pub struct InitSpawner {
    /// `None` once the spawner failed or was closed: later inits are executed.
    socket: Mutex<Option<OwnedFd>>,
    /// `None` once reaped.
    pid: Mutex<Option<Pid>>,
}

impl InitSpawner {
    /// Executes the spawner: the init program of `sandbox`'s options, as `__init spawner`.
    pub fn start(sandbox: &Sandbox) -> Result<InitSpawner, Error> {
        InitSpawner::start_with(&sandbox.options)
    }

    /// Executes the spawner: the init program of `options`, as `__init spawner`.
    pub fn start_with(options: &SandboxOptions) -> Result<InitSpawner, Error> {
        let (ours, pid) = execute_init_helper(options, SPAWNER_ARG, "the init spawner")?;
        let spawner = InitSpawner {
            socket: Mutex::new(None),
            pid: Mutex::new(Some(pid)),
        };
        // A binary that does not know the spawner (an older init program) ends without the
        // greeting; one that hangs is not waited for longer than the timeout.
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT_S, 0);
        nix::sys::socket::setsockopt(&ours, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| Error::io("cannot set the init spawner's timeout", e.into()))?;
        read_pid(&ours).map_err(|e| Error::io("the init spawner did not start", e))?;
        *spawner.socket.lock().unwrap_or_else(|p| p.into_inner()) = Some(ours);
        Ok(spawner)
    }

    /// Forks an init with each `(source, target)` descriptor at `target`, or says why not.
    pub(super) fn spawn(&self, placed: &[(RawFd, RawFd)]) -> Spawned {
        let mut socket = self.socket.lock().unwrap_or_else(|p| p.into_inner());
        let Some(connected) = socket.as_ref() else {
            return Spawned::NotAsked;
        };
        if send_request(connected, placed).is_err() {
            *socket = None;
            return Spawned::NotAsked;
        }
        match read_pid(connected) {
            Ok(pid) => Spawned::Forked(pid),
            Err(e) => {
                // A spawner that failed once is not asked again, and one that hangs is
                // ended: it must not fork an init for this request later. It is reaped by
                // `close`.
                if let Some(pid) = *self.pid.lock().unwrap_or_else(|p| p.into_inner()) {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }
                *socket = None;
                Spawned::Unanswered(e)
            }
        }
    }
}

/// What became of a request to the spawner.
#[derive(Debug)]
pub(super) enum Spawned {
    /// It forked the init (the init's own answer: see `init::spawner`).
    Forked(Pid),
    /// It cannot be asked (it failed before, or was found gone before the request went
    /// out): the init is executed with the same descriptors.
    NotAsked,
    /// The request went out and no init answered (the spawner died, hung or could not
    /// fork): the init is executed on fresh descriptors, since the spawner held these.
    Unanswered(std::io::Error),
}

impl InitSpawner {
    /// Whether inits are still asked of it: false once it failed to answer, was found gone
    /// or was closed (a spawner killed since its last answer is found gone at the next
    /// request, whose init is then executed).
    pub fn is_usable(&self) -> bool {
        self.socket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Its process id, until it is reaped.
    pub fn pid(&self) -> Option<u32> {
        let pid = self.pid.lock().unwrap_or_else(|p| p.into_inner());
        pid.map(|pid| pid.as_raw() as u32)
    }
}

fn send_request(socket: &OwnedFd, placed: &[(RawFd, RawFd)]) -> std::io::Result<()> {
    let fds: Vec<RawFd> = placed.iter().map(|(source, _)| *source).collect();
    let targets: Vec<u8> = placed
        .iter()
        .map(|(_, target)| u8::try_from(*target).ok())
        .collect::<Option<_>>()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let rights = [ControlMessage::ScmRights(&fds)];
    let flags = MsgFlags::MSG_NOSIGNAL;
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(&targets)],
        &rights,
        flags,
        None,
    )?;
    Ok(())
}

fn read_pid(socket: &OwnedFd) -> std::io::Result<Pid> {
    let mut reply = [0u8; 4];
    let mut iov = [IoSliceMut::new(&mut reply)];
    let bytes = recvmsg::<()>(socket.as_raw_fd(), &mut iov, None, MsgFlags::empty())?.bytes;
    let pid = i32::from_le_bytes(reply);
    match (bytes == reply.len(), pid) {
        (true, 1..) => Ok(Pid::from_raw(pid)),
        (true, errno) => Err(std::io::Error::from_raw_os_error(-errno)),
        (false, _) => Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
    }
}

impl InitSpawner {
    /// Ends the spawner and reaps it; inits asked for later are executed.
    pub fn close(&self) {
        drop(self.socket.lock().map(|mut socket| socket.take()));
        let pid = self.pid.lock().ok().and_then(|mut pid| pid.take());
        if let Some(pid) = pid {
            while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
        }
    }
}

impl Drop for InitSpawner {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::SandboxOptions;

    /// An init program that is no spawner (an older airlock binary, here `/bin/true`) ends
    /// without the greeting: refused at once, and the pool executes its inits.
    #[test]
    fn a_program_that_is_no_spawner_is_refused_at_once() {
        let options = SandboxOptions {
            init_program: Some("/bin/true".into()),
            ..SandboxOptions::default()
        };
        let policy = crate::policy::load_profile("untrusted").unwrap();
        let sandbox = Sandbox::with_options(policy, options).unwrap();
        let started = std::time::Instant::now();
        assert!(InitSpawner::start(&sandbox).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}

//! The prepared sandboxes' init spawner (`airlock __init spawner`): one single-threaded
//! process per warm pool, executed once, that forks each prepared sandbox's init instead of
//! the pool executing the airlock binary for every one. An executed init pays the dynamic
//! loader, the relocation of a 4.5 MB binary and the first touch of its text and data (about
//! 250 page faults) before it does any work; a forked one starts with all of that done.
//!
//! The pool sends one packet per init on the socket at [`CONTROL_FD`]: the descriptors the
//! init needs (stdio, control and event pipes, the command pipe, a gate's channel) and, as
//! the payload, the number each goes to. The spawner forks with `CLONE_PARENT`, so that the
//! init is the pool's own child (the pool reaps and signals it as it would one it executed),
//! and closes its copies (it answers with its own pid once, as a greeting, and with an errno
//! when it cannot fork). The child answers with its own pid, so that every init forked is
//! known to the pool even when the spawner is killed right after the fork, puts the
//! descriptors at their numbers, closes every other one (the spawner's socket included), and
//! becomes an init exactly as an executed one: it reads its spec on the control pipe. The
//! spawner exits when the pool closes the socket (the pool dropped, or its process died).
//!
//! A spawner that dies (or hangs) with a request unanswered has forked no init for it: the
//! pool executes that init instead, on fresh descriptors (see `supervisor::launch`).

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};

use nix::sys::socket::{sendmsg, MsgFlags};

use crate::confine::cgroup;
use crate::linux;
use crate::linux::sys::{self, Forked};
use crate::spec::CONTROL_FD;

/// The most descriptors one init gets (stdio, control, events, gate, command pipe, a shared
/// root's two namespaces).
const MAX_FDS: usize = 10;

/// Serves the pool until it closes the socket, then exits.
pub(super) fn serve() -> ! {
    // Borrowed, not claimed: each init forked from here claims its control pipe, which it
    // finds at this same number.
    let socket = sys::borrow_fd(CONTROL_FD);
    // The greeting (its own pid): the pool knows this binary is a spawner.
    let mut serving = answer(socket, std::process::id() as i32);
    // Every init forked from here creates a run cgroup: each inherits the layout read once.
    cgroup::remember_layout(&cgroup::CgroupConfig::default().root);
    while serving {
        let Some((fds, targets)) = receive(socket) else {
            break;
        };
        serving = match crate::linux::fork_as_sibling() {
            // The init answers itself: a spawner killed right after the fork cannot leave an
            // init the pool does not know of.
            Ok(Forked::Child) if answer(socket, std::process::id() as i32) => {
                become_init(fds, &targets)
            }
            Ok(Forked::Child) => sys::exit_now(0),
            Ok(Forked::Parent(_)) => true,
            Err(e) => answer(socket, -e.raw_os_error().unwrap_or(libc::EIO)),
        };
    }
    sys::exit_now(0)
}

/// Sends the pool a pid (or a negative errno); false when the pool is gone.
fn answer(socket: BorrowedFd, reply: i32) -> bool {
    let bytes = reply.to_le_bytes();
    let iov = [IoSlice::new(&bytes)];
    let flags = MsgFlags::MSG_NOSIGNAL;
    sendmsg::<()>(socket.as_raw_fd(), &iov, &[], flags, None).is_ok()
}

/// One request: the descriptors and the number each goes to; `None` when the pool closed the
/// socket (or sent something malformed, which ends the spawner too).
fn receive(socket: BorrowedFd) -> Option<(Vec<OwnedFd>, Vec<u8>)> {
    let mut targets = [0u8; MAX_FDS];
    let message = linux::receive_with_fds::<MAX_FDS>(socket, &mut targets).ok()?;
    let count = message.bytes;
    (count > 0 && count == message.fds.len() && !message.truncated)
        .then(|| (message.fds, targets[..count].to_vec()))
}

/// In the forked child: the descriptors at their numbers and no other, signal handlers as
/// exec leaves them, then the init, which reads its spec on the control pipe.
fn become_init(fds: Vec<OwnedFd>, targets: &[u8]) -> ! {
    let placed: Vec<(RawFd, RawFd)> = fds
        .into_iter()
        .map(IntoRawFd::into_raw_fd)
        .zip(targets.iter().map(|&target| RawFd::from(target)))
        .collect();
    let highest = placed.iter().map(|(_, target)| *target).max().unwrap_or(2);
    if sys::place_fds_inheritable(&placed).is_err() {
        sys::exit_now(127);
    }
    for fd in 0..highest {
        if !placed.iter().any(|(_, target)| *target == fd) {
            let _ = nix::unistd::close(fd);
        }
    }
    if sys::close_from(highest + 1).is_err() {
        sys::exit_now(127);
    }
    sys::reset_caught_signals();
    let _ = std::panic::catch_unwind(|| super::init_main_with(None));
    sys::exit_now(101)
}

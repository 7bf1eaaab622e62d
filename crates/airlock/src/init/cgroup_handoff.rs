//! The native sandbox's cgroup, made while its child makes the namespaces. Both take most of
//! a cold start's set-up (five v1 hierarchies: mkdir, limits; a network namespace), so the
//! init forks the child first: the child drops to the sandbox user and makes every namespace
//! but the cgroup namespace while the init makes and limits the run's cgroup. The init then
//! opens the cgroup's membership files and sends them on the hand-off socket
//! ([`CGROUP_HANDOFF_FD`] in the child); the child writes "0" into each (it moves itself: a
//! move of another pid takes the kernel's global lock, see
//! `RunCgroup::open_membership_files`), makes its cgroup namespace there (a cgroup
//! namespace is rooted where it is made) and only then starts PID 1. So nothing of the
//! program runs outside the run's cgroup and its limits. What the kernel charged before the
//! move (the namespaces' own memory) stays with the init's cgroup: cgroup v1 moves no charge.
//!
//! A message without descriptors means no cgroup (its creation failed: the init warns and
//! the child falls back to rlimits, as for any run without one). EOF, the init gone or unable
//! to send, ends the child's set-up with an error.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};

use super::run::PreparedRun;
use super::{Setup, Step};
use crate::confine::cgroup::{self, RunCgroup};
use crate::error::SetupError;
use crate::linux::{self, sys};
use crate::spec::fds::CGROUP_HANDOFF_FD;
use crate::spec::{Confinement, InitSpec};

/// The message of a run with a cgroup (its files alongside).
const WITH_CGROUP: u8 = b'c';
/// The message of a run without one.
const WITHOUT_CGROUP: u8 = b'n';
/// The most membership files a run has (one per v1 hierarchy of `RUN_CONTROLLERS`).
const MAX_FILES: usize = 8;

/// Whether the init makes the run's cgroup after forking the child: a native run with one.
/// Tier 0 and the wrapping tools join it before they start anything, as made before the fork.
pub(super) fn deferred(spec: &InitSpec) -> bool {
    spec.cgroup.is_some() && matches!(spec.confinement, Confinement::Native(_))
}

/// The two ends of the hand-off (the init's, the child's), for a run whose cgroup is
/// [`deferred`].
pub(super) fn channel(spec: &InitSpec) -> Setup<Option<(OwnedFd, OwnedFd)>> {
    if !deferred(spec) {
        return Ok(None);
    }
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map(Some)
    .map_err(|e| {
        SetupError::at(
            Step::Init,
            format!("cannot create the cgroup hand-off: {e}"),
        )
    })
}

/// In the init, the child forked with the other end of `handoff`: makes the run's cgroup
/// (while the child makes its namespaces) and hands it over.
pub(super) fn make_and_hand_over(
    spec: &InitSpec,
    run: &mut PreparedRun,
    handoff: Option<(OwnedFd, OwnedFd)>,
) {
    let Some((init_end, child_end)) = handoff else {
        return;
    };
    drop(child_end);
    run.make_cgroup(spec);
    let files = membership_files(&mut run.cgroup, &mut run.cgroup_warning);
    send(init_end, &files);
}

/// In the init: sends the child the run's membership files (none: no cgroup) and closes its
/// end. A child that has already ended cannot be told (no SIGPIPE: the watch loop hears of
/// its end); one that is waiting and gets nothing sees EOF and fails.
fn send(socket: OwnedFd, files: &[OwnedFd]) {
    let fds: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
    let (byte, control) = match fds.is_empty() {
        true => ([WITHOUT_CGROUP], vec![]),
        false => ([WITH_CGROUP], vec![ControlMessage::ScmRights(&fds)]),
    };
    let _ = sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(&byte)],
        &control,
        MsgFlags::MSG_NOSIGNAL,
        None,
    );
}

/// In the child, its namespaces made: waits for the init's word and joins the run's cgroup.
/// True when it joined one, false when the run has none.
pub(super) fn join_when_made() -> Setup<bool> {
    let failed = |message: String| SetupError::at(Step::Cgroup, message);
    let socket = sys::claim_inherited_fd(CGROUP_HANDOFF_FD)
        .map_err(|e| failed(format!("cannot take the cgroup hand-off: {e}")))?;
    let mut byte = [0u8; 1];
    let message = linux::receive_with_fds::<MAX_FILES>(socket.as_fd(), &mut byte)
        .map_err(|e| failed(format!("cannot read the cgroup hand-off: {e}")))?;
    let (files, truncated) = (message.fds, message.truncated);
    match (message.bytes, byte[0], files.is_empty()) {
        (1, WITH_CGROUP, false) if !truncated => join_through(&files).map(|()| true),
        (1, WITHOUT_CGROUP, true) => Ok(false),
        (0, _, _) => Err(failed(
            "the init ended before the run's cgroup was made".into(),
        )),
        _ => Err(failed("malformed cgroup hand-off".into())),
    }
}

/// Moves this (single-threaded) process into the run's cgroup through files the init (or a
/// zygote's host) opened: "0" moves the caller, which the sandbox user may do through a
/// file opened by a process allowed to move it.
pub(super) fn join_through(files: &[OwnedFd]) -> Setup<()> {
    for file in files {
        nix::unistd::write(file, b"0").map_err(|e| {
            let why = match e {
                nix::errno::Errno::EINVAL => " (the kernel refused the move: a real-time process cannot join a v1 cpu cgroup without real-time runtime)",
                _ => "",
            };
            SetupError::at(
                Step::Cgroup,
                format!("cannot join the run's cgroup: {e}{why}"),
            )
        })?;
    }
    Ok(())
}

/// In the init, the cgroup made (or not): the files the child joins through. Files that
/// cannot be opened mean no cgroup, like a cgroup that could not be made: it is removed,
/// with a warning, and the run falls back to rlimits.
fn membership_files(cgroup: &mut Option<RunCgroup>, warning: &mut Option<String>) -> Vec<OwnedFd> {
    let Some(made) = cgroup.as_ref() else {
        return Vec::new();
    };
    match made.open_membership_files() {
        Ok(files) => files,
        Err(e) => {
            if let Some(made) = cgroup.take() {
                let _ = made.remove();
            }
            *warning = Some(cgroup::no_cgroup_warning(&e));
            Vec::new()
        }
    }
}

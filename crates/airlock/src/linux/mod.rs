//! Linux-only plumbing: the raw syscall facade (`sys`, the only module allowed `unsafe`) and
//! process-tree helpers built on it.

pub mod beneath;
#[allow(unsafe_code)]
pub mod sys;
pub mod tree;

use std::io::{IoSliceMut, Read};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::fcntl::OFlag;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

/// Reads a pipe or a kernel file (procfs, kernfs) to its end, 4 KiB per `read`: for a report
/// or a control file, one read for the contents and one for the end. `File::read_to_end`
/// would first `statx` (and `lseek`) it for a size, which these report as 0, then read in
/// pieces growing from 32 bytes: mountinfo took eight reads, a ~120-byte report five syscalls.
pub fn read_to_end_unsized(mut from: impl Read, into: &mut Vec<u8>) -> std::io::Result<usize> {
    let (start, mut chunk) = (into.len(), [0u8; 4096]);
    loop {
        match from.read(&mut chunk) {
            Ok(0) => return Ok(into.len() - start),
            Ok(read) => into.extend_from_slice(&chunk[..read]),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
}

/// Converts strings to the C strings `execve` needs; an interior NUL is an error naming it.
pub fn c_strings(items: &[String]) -> std::io::Result<Vec<std::ffi::CString>> {
    items
        .iter()
        .map(|s| {
            std::ffi::CString::new(s.as_bytes()).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{s:?} contains a NUL byte"),
                )
            })
        })
        .collect()
}

/// A connected pair of close-on-exec Unix sequenced-packet sockets: the channel to a helper
/// process of ours (a zygote template, an init spawner), one message per request, which
/// reads as closed the moment the helper ends.
pub fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let flags = SockFlag::SOCK_CLOEXEC;
    Ok(socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        flags,
    )?)
}

/// Forks the calling process if it has exactly one thread, so that the child may run any
/// code; `None` when other threads exist (their locks could stay held in the child).
pub fn fork_if_single_threaded() -> std::io::Result<Option<sys::Forked>> {
    if !single_threaded()? {
        return Ok(None);
    }
    sys::fork_single_threaded().map(Some)
}

/// Whether this process has exactly one thread. Only this thread could start another one, so
/// the answer cannot change under the caller.
pub(crate) fn single_threaded() -> std::io::Result<bool> {
    Ok(std::fs::read_dir("/proc/self/task")?.count() == 1)
}

/// Writes all of `data` to a descriptor this process owns for its whole life (the init's
/// pipes, which sit at fixed numbers after fork and have no Rust owner).
pub fn write_all_to_fd(fd: RawFd, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        match nix::unistd::write(sys::borrow_fd(fd), data) {
            Ok(written) => data = &data[written..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// In a freshly forked child: puts each `(source, target)` at `target`, close-on-exec (these
/// pipes must not reach the program), then closes every other descriptor above stderr (the
/// gaps between targets too).
pub fn place_fds(pairs: &[(RawFd, RawFd)]) -> std::io::Result<()> {
    move_fds(pairs, OFlag::O_CLOEXEC)?;
    let highest = pairs.iter().map(|(_, target)| *target).max().unwrap_or(2);
    for gap in 3..highest {
        if !pairs.iter().any(|(_, target)| *target == gap) {
            // Nothing in a freshly forked child owns a descriptor that is not one of the
            // targets; closing one that is not open only returns EBADF.
            let _ = nix::unistd::close(gap);
        }
    }
    sys::close_from(highest + 1)
}

/// Like [`place_fds`] but leaves the targets inheritable across exec (for descriptors a
/// wrapper tool must receive) and closes nothing.
pub fn place_fds_inheritable(pairs: &[(RawFd, RawFd)]) -> std::io::Result<()> {
    move_fds(pairs, OFlag::empty())
}

/// Puts each source at its target with `dup3(flags)`, moving every source above the targets
/// first so that one placement never overwrites a later source.
fn move_fds(pairs: &[(RawFd, RawFd)], flags: OFlag) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let highest = pairs.iter().map(|(_, target)| *target).max().unwrap_or(2);
    let above = highest.max(63) + 1;
    let mut moved = Vec::with_capacity(pairs.len());
    for (source, _) in pairs {
        moved.push(fcntl(*source, FcntlArg::F_DUPFD_CLOEXEC(above))?);
    }
    for (moved_fd, (_, target)) in moved.iter().zip(pairs) {
        nix::unistd::dup3(*moved_fd, *target, flags)?;
        // The temporary copy is ours alone and no longer needed.
        let _ = nix::unistd::close(*moved_fd);
    }
    Ok(())
}

/// Forks the caller (single-threaded) as a child of its own parent (`CLONE_PARENT`): a warm
/// pool's init spawner starts each init as the pool's child, which the pool reaps and
/// signals as one it executed. The child's exit signal is the caller's own (SIGCHLD).
pub fn fork_as_sibling() -> std::io::Result<sys::Forked> {
    sys::fork_with_flags(nix::sched::CloneFlags::CLONE_PARENT)?.ok_or_else(|| {
        std::io::Error::other("the init spawner must be single-threaded to fork an init")
    })
}

/// One message received on a socket, with the descriptors sent alongside it.
pub struct ReceivedMessage {
    /// The message's length; 0 at end of file.
    pub bytes: usize,
    /// The descriptors, each owned here and close-on-exec.
    pub fds: Vec<OwnedFd>,
    /// The kernel dropped descriptors that did not fit (`MSG_CTRUNC`).
    pub truncated: bool,
}

/// Receives one message into `body` and up to `MAX_FDS` descriptors sent with it
/// (`SCM_RIGHTS`), each close-on-exec from the moment it exists (`MSG_CMSG_CLOEXEC`: no
/// fork or exec of another thread can inherit it).
pub fn receive_with_fds<const MAX_FDS: usize>(
    socket: BorrowedFd,
    body: &mut [u8],
) -> nix::Result<ReceivedMessage> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(body)];
    let message = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in message.cmsgs().into_iter().flatten() {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            fds.extend(received.into_iter().map(sys::own_received_fd));
        }
    }
    Ok(ReceivedMessage {
        bytes: message.bytes,
        fds,
        truncated: message.flags.contains(MsgFlags::MSG_CTRUNC),
    })
}

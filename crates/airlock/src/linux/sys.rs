//! The only place in airlock with `unsafe`: thin, documented wrappers whose callers stay safe.
//! Each wrapper states the contract that makes it sound.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::unistd::{ForkResult, Pid};

/// Which side of a fork the caller is on.
#[derive(Debug)]
pub enum Forked {
    /// The original process; holds the child's pid.
    Parent(Pid),
    /// The new process.
    Child,
}

/// Forks the calling process.
///
/// Only single-threaded callers use this: the init (it never starts threads, and it was
/// forked from a single-threaded supervisor or freshly exec'd) and
/// [`fork_if_single_threaded`] after its check. So the child may run any code, not only
/// async-signal-safe functions.
pub fn fork_single_threaded() -> io::Result<Forked> {
    // SAFETY: the caller is single-threaded (see above), so no other thread can hold a lock
    // (malloc, stdio) that would stay locked forever in the child.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        ForkResult::Parent { child } => Ok(Forked::Parent(child)),
        ForkResult::Child => Ok(Forked::Child),
    }
}

/// Forks the calling process if it has exactly one thread, so that the child may run any
/// code; `None` when other threads exist (their locks could stay held in the child).
pub fn fork_if_single_threaded() -> io::Result<Option<Forked>> {
    // Only this thread could start another one, so the count cannot change under us.
    if std::fs::read_dir("/proc/self/task")?.count() != 1 {
        return Ok(None);
    }
    fork_single_threaded().map(Some)
}

/// Sets every signal the process catches back to its default action, as exec would; ignored
/// signals stay ignored. For a forked child that will not exec.
pub fn reset_caught_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for signal in Signal::iterator() {
        if matches!(signal, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: installing SIG_DFL (or putting back SIG_IGN) runs no code of ours in a
        // signal context.
        if let Ok(previous) = unsafe { sigaction(signal, &default) } {
            if previous.handler() == SigHandler::SigIgn {
                // SAFETY: as above.
                let _ = unsafe { sigaction(signal, &previous) };
            }
        }
    }
}

/// Sets every signal, real-time ones and those the C library reserves included, to its
/// default action, for a process about to exec a program. Ignored signals survive exec (Rust's
/// runtime ignores SIGPIPE, and a caller may ignore SIGHUP or SIGINT); a program must not start
/// deaf to them. Uses the raw system call: the C library refuses its reserved signals.
pub fn default_all_signal_actions() {
    // _NSIG on every architecture airlock builds for.
    const LAST_SIGNAL: libc::c_int = 64;
    // The kernel's `struct sigaction` (handler, flags, restorer, mask): all zero is SIG_DFL with
    // no flags and an empty mask, whatever the field order.
    let default = [0u64; 4];
    let set_size = std::mem::size_of::<u64>();
    for signal in 1..=LAST_SIGNAL {
        // SAFETY: `default` outlives the call, is as large as the kernel's struct, and no old
        // action is asked for. The kernel refuses SIGKILL, SIGSTOP and numbers past its last
        // signal with EINVAL, which changes nothing.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                default.as_ptr(),
                std::ptr::null_mut::<u64>(),
                set_size,
            )
        };
    }
}

/// The most descriptors [`map_fds_on_spawn`] places: enough for every fixed number of the init.
pub const MAX_SPAWN_FDS: usize = 8;

/// Makes each `(source, target)` pair's source appear as descriptor `target` in the child
/// spawned by `command`. The caller keeps the sources open until `spawn` returns. Every other
/// descriptor of the parent is close-on-exec (Rust opens everything that way), so the child
/// gets stdio plus exactly these. At most [`MAX_SPAWN_FDS`] pairs; the pairs are copied into a
/// fixed array before the fork, so the child allocates nothing.
pub fn map_fds_on_spawn(command: &mut Command, pairs: &[(RawFd, RawFd)]) {
    assert!(
        pairs.len() <= MAX_SPAWN_FDS,
        "too many descriptors to place"
    );
    let count = pairs.len();
    let mut fixed = [(0 as RawFd, 0 as RawFd); MAX_SPAWN_FDS];
    fixed[..count].copy_from_slice(pairs);
    // SAFETY: the closure only calls fcntl and dup2, which are async-signal-safe, and only
    // reads `fixed`, a Copy array moved into the closure before the fork.
    unsafe {
        command.pre_exec(move || {
            let pairs = &fixed[..count];
            // Move every source above the targets first, so a dup2 never clobbers a later source.
            let mut moved = [0 as RawFd; MAX_SPAWN_FDS];
            for (slot, (source, _)) in moved.iter_mut().zip(pairs.iter()) {
                *slot = check(libc::fcntl(*source, libc::F_DUPFD_CLOEXEC, 64))?;
            }
            for (moved_fd, (_, target)) in moved.iter().zip(pairs.iter()) {
                check(libc::dup2(*moved_fd, *target))?;
            }
            Ok(())
        });
    }
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Marks every descriptor from `first` upwards close-on-exec (close_range with
/// CLOSE_RANGE_CLOEXEC), so nothing inherited leaks into the program.
pub fn cloexec_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range only changes descriptor flags; it dereferences no memory.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes every descriptor from `first` upwards.
pub fn close_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; none of them is owned by Rust code that
    // will use it afterwards (the init calls this right after fork, before touching files).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ends the process at once, without running atexit handlers or flushing stdio buffers that a
/// forked child shares with its parent.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// Makes `fd` this process's controlling terminal (after `setsid`).
pub fn set_controlling_tty(fd: RawFd) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument, no pointer.
    check(unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) }).map(|_| ())
}

/// Converts strings to the C strings `execve` needs; an interior NUL is an error naming it.
pub fn c_strings(items: &[String]) -> io::Result<Vec<CString>> {
    items
        .iter()
        .map(|s| {
            CString::new(s.as_bytes()).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{s:?} contains a NUL byte"),
                )
            })
        })
        .collect()
}

/// Writes all of `data` to a descriptor this process owns for its whole life (the init's
/// pipes, which sit at fixed numbers after fork and have no Rust owner).
pub fn write_all_to_fd(fd: RawFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a live slice; write reads at most `data.len()` bytes from it.
        let written = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if written < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        data = &data[written as usize..];
    }
    Ok(())
}

/// Takes ownership of a descriptor this process inherited at a fixed number for itself alone
/// (the init's control pipe from the supervisor). Each number can be claimed once per process
/// and the claim checks that the descriptor is open, so the returned owner is the only one:
/// no second `OwnedFd` can close it under the first. (Writes to the event pipe go through
/// [`write_all_to_fd`], which never owns a descriptor.)
pub fn claim_inherited_fd(fd: RawFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::sync::atomic::{AtomicU64, Ordering};
    static CLAIMED: AtomicU64 = AtomicU64::new(0);
    let bit = u32::try_from(fd)
        .ok()
        .filter(|n| *n < u64::BITS)
        .map(|n| 1u64 << n)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "only descriptors 0-63 can be claimed",
            )
        })?;
    if CLAIMED.fetch_or(bit, Ordering::SeqCst) & bit != 0 {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("descriptor {fd} was already claimed"),
        ));
    }
    // SAFETY: F_GETFD only reads the descriptor's flags.
    check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: the descriptor is open (checked just now) and this is the only claim on it in
    // this process (the bit above): nothing else owns or closes it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// In a freshly forked child: puts each `(source, target)` at `target`, close-on-exec (these
/// pipes must not reach the program), then closes every other descriptor above stderr (the
/// gaps between targets too).
pub fn place_fds(pairs: &[(RawFd, RawFd)]) -> io::Result<()> {
    move_fds(pairs, libc::O_CLOEXEC)?;
    let highest = pairs.iter().map(|(_, target)| *target).max().unwrap_or(2);
    for gap in 3..highest {
        if !pairs.iter().any(|(_, target)| *target == gap) {
            // SAFETY: nothing in a freshly forked child owns a descriptor that is not one of
            // the targets; closing one that is not open only returns EBADF.
            unsafe { libc::close(gap) };
        }
    }
    close_from(highest + 1)
}

/// Like [`place_fds`] but leaves the targets inheritable across exec (for descriptors a
/// wrapper tool must receive) and closes nothing.
pub fn place_fds_inheritable(pairs: &[(RawFd, RawFd)]) -> io::Result<()> {
    move_fds(pairs, 0)
}

/// Puts each source at its target with `dup3(flags)`, moving every source above the targets
/// first so that one placement never overwrites a later source.
fn move_fds(pairs: &[(RawFd, RawFd)], flags: libc::c_int) -> io::Result<()> {
    let mut moved = Vec::with_capacity(pairs.len());
    for (source, _) in pairs {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) only duplicates a descriptor.
        moved.push(check(unsafe {
            libc::fcntl(*source, libc::F_DUPFD_CLOEXEC, 64)
        })?);
    }
    for (moved_fd, (_, target)) in moved.iter().zip(pairs) {
        // SAFETY: dup3 only manipulates descriptors.
        check(unsafe { libc::dup3(*moved_fd, *target, flags) })?;
        // SAFETY: the temporary copy is ours alone and no longer needed.
        unsafe { libc::close(*moved_fd) };
    }
    Ok(())
}

/// `struct mount_attr` of `mount_setattr(2)` (linux/mount.h); no crate offers the call yet
/// (rustix lists it as not implemented).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Makes the detached mount tree `tree` (from `open_tree(OPEN_TREE_CLONE)`) an idmapped
/// mount: its files' owners are shown through `userns`'s id maps, and ids written through it
/// are mapped back. `recursive` applies it to every mount of the tree.
pub fn set_mount_idmap(
    tree: std::os::fd::BorrowedFd,
    userns: std::os::fd::BorrowedFd,
    recursive: bool,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let flags = libc::AT_EMPTY_PATH | if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: both descriptors are borrowed for the call, the path is a static empty C
    // string (AT_EMPTY_PATH acts on `tree` itself), and `attr` is a live `struct mount_attr`
    // whose size is passed with it; the kernel reads it and writes nothing back.
    let result = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(result as i32).map(|_| ())
}

//! The only place in airlock with `unsafe` (this module and its files `mount.rs` and
//! `spawn.rs`): thin, documented wrappers whose callers stay safe. Each wrapper states the
//! contract that makes it sound.

use std::io;
use std::os::fd::{FromRawFd, RawFd};

use nix::unistd::{ForkResult, Pid};

mod arena;
mod mount;
mod spawn;

pub use arena::{use_fresh_arena, ForkArena};

pub use mount::{
    add_mount_flags, set_mount_idmap, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
};
pub use spawn::spawn_with_fds;

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

/// Stack of a [`spawn_sharing_memory`] child (errors and JSON, nothing recursive), above a
/// guard page that turns an overflow into a fault.
const SPAWN_STACK: usize = 256 * 1024;
const GUARD: usize = 4096;

/// Runs `child` in a process sharing the caller's memory until it execs or exits
/// (`CLONE_VM | CLONE_VFORK`, as `posix_spawn`) and returns its pid then: no page tables
/// copied for it, none torn down at its exec. For a single-threaded caller (suspended
/// meanwhile, so the child may allocate: no other thread holds the allocator's lock) and a
/// `child` ending in exec or [`exit_now`], never returning into the caller's frames.
pub fn spawn_sharing_memory(
    child: &mut dyn FnMut() -> std::convert::Infallible,
) -> io::Result<Pid> {
    let (len, prot) = (SPAWN_STACK + GUARD, libc::PROT_READ | libc::PROT_WRITE);
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK;
    // SAFETY: a fresh private anonymous mapping, unmapped below once no child runs on it.
    let base = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the lowest page of the mapping just made, which nothing uses yet.
    let spawned = match unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } {
        0 => clone_sharing_memory(base, child),
        _ => Err(io::Error::last_os_error()),
    };
    // SAFETY: the mapping made above; the child has left it (exec'd or exited).
    unsafe { libc::munmap(base, len) };
    spawned
}

fn clone_sharing_memory(
    base: *mut libc::c_void,
    child: &mut dyn FnMut() -> std::convert::Infallible,
) -> io::Result<Pid> {
    // SAFETY: `base` starts the mapping `spawn_sharing_memory` made, GUARD + SPAWN_STACK long.
    let stack =
        unsafe { std::slice::from_raw_parts_mut(base.cast::<u8>().add(GUARD), SPAWN_STACK) };
    let flags = nix::sched::CloneFlags::CLONE_VM | nix::sched::CloneFlags::CLONE_VFORK;
    let cb = Box::new(|| match child() {});
    // SAFETY: `spawn_sharing_memory`'s contract: the caller waits (CLONE_VFORK) until the
    // child, which never returns, execs or exits.
    unsafe { nix::sched::clone(cb, stack, flags, Some(libc::SIGCHLD)) }.map_err(io::Error::from)
}

/// Stack of a [`clone_and_mirror`] child: a main thread's size; only pages it touches are
/// ever allocated.
const MIRRORED_STACK: usize = 8 << 20;

/// A process body that never returns (it execs or exits).
pub type Body<'a> = Box<dyn FnOnce() -> std::convert::Infallible + 'a>;

/// Starts `child` in a process sharing the caller's memory for good (`CLONE_VM`, no
/// `CLONE_VFORK`) on a stack of its own, and makes the caller its mirror (see [`mirror`]):
/// no page table copied, no copy-on-write fault, one teardown at the end. Sound because the
/// mirror touches no shared memory but its own frames below this call (never returning into
/// the caller's, which stay as the child may borrow them) and `errno` on a failed wait,
/// which cannot fail; glibc reads the thread id from the kernel (`raise`, `abort`). For a
/// single-threaded caller with no signal handler. Returns only when no child started.
pub fn clone_and_mirror(child: Body) -> io::Error {
    extern "C" fn start(data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `data` is the box leaked below for this child alone.
        let child = unsafe { Box::from_raw(data.cast::<Body>()) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || match child() {}));
        exit_now(101)
    }
    let (len, prot) = (MIRRORED_STACK + GUARD, libc::PROT_READ | libc::PROT_WRITE);
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE;
    // SAFETY: a fresh private anonymous mapping, never unmapped: the child runs on it until
    // it exits, and it goes with the last process sharing the memory.
    let base = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
    // SAFETY: the lowest page of the mapping just made (if made), which nothing uses yet.
    if base == libc::MAP_FAILED || unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } != 0 {
        return io::Error::last_os_error();
    }
    let data = Box::into_raw(Box::new(child)).cast::<libc::c_void>();
    // SAFETY: the stack's top is the mapping's end (page-aligned); `start` owns `data` and
    // never returns; the caller mirrors the child without touching what they share.
    let pid = unsafe { libc::clone(start, base.add(len), libc::CLONE_VM | libc::SIGCHLD, data) };
    if pid < 0 {
        let error = io::Error::last_os_error();
        // SAFETY: no child started, so the box is still ours alone.
        drop(unsafe { Box::from_raw(data.cast::<Body>()) });
        return error;
    }
    mirror(pid)
}

/// Closes this process's descriptors (its own table: no `CLONE_FILES`), waits for `pid` and
/// exits with its code, or 128 + the signal that killed it. Raw calls only: glibc's `syscall`
/// writes nothing but `errno`, on failure.
fn mirror(pid: libc::pid_t) -> ! {
    let _ = close_from(0);
    let mut status: libc::c_int = 0;
    let status_at = &mut status as *mut libc::c_int;
    // SAFETY: `status` is on this frame; no rusage is asked for. A child of ours, waited for
    // without handlers that could interrupt: it only fails if the kernel refuses.
    let waited = unsafe { libc::syscall(libc::SYS_wait4, pid, status_at, 0, 0usize) };
    let code = match (waited == pid as libc::c_long, status) {
        (false, _) => 125,
        (true, s) if libc::WIFEXITED(s) => libc::WEXITSTATUS(s),
        (true, s) => 128 + libc::WTERMSIG(s),
    };
    exit_now(code)
}

pub use super::fork_if_single_threaded;

/// Forks the caller straight into the new namespaces `flags` names (or as its parent's child,
/// `CLONE_PARENT`), as `fork` would: with `CLONE_NEWPID` the child is PID 1. `None` when the
/// caller has other threads: the raw call skips glibc's `fork` work (at-fork handlers; the
/// child keeps the parent's thread id, read only by robust mutexes).
pub fn fork_with_flags(flags: nix::sched::CloneFlags) -> io::Result<Option<Forked>> {
    let namespaces = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;
    let namespaces = namespaces | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNET;
    if flags.bits() & !(namespaces | libc::CLONE_NEWCGROUP | libc::CLONE_PARENT) != 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    if !super::single_threaded()? {
        return Ok(None);
    }
    let (flags, null) = ((flags.bits() | libc::SIGCHLD) as libc::c_ulong, 0usize);
    // SAFETY: namespace flags or CLONE_PARENT (no VM, VFORK, SETTLS, *TID), a null stack.
    match unsafe { libc::syscall(libc::SYS_clone, flags, null, null, null, null) } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Some(Forked::Child)),
        pid => Ok(Some(Forked::Parent(Pid::from_raw(pid as libc::pid_t)))),
    }
}

/// Gives the private file mapping `start..start + len` (readable, not writable, mapped with
/// `prot`) a private page: its first page copied, holding the same bytes. The kernel copies a
/// file mapping's page-table entries at `fork` only when the mapping has private pages;
/// without one, every child faults the file's pages (an interpreter's code) back in. The
/// mapping is writable only between the two `mprotect`s (its `prot` kept, so code in it runs
/// on), and the byte written is the one read. For a single-threaded caller (no other thread
/// maps or unmaps meanwhile) and a range read from `/proc/self/maps` (whose first page lies
/// in the file: a mapping past a truncated file's end would fault here, loudly).
pub fn give_file_mapping_a_private_page(
    start: usize,
    len: usize,
    prot: libc::c_int,
) -> io::Result<()> {
    let addr = start as *mut libc::c_void;
    // SAFETY: only the protection of an existing mapping of this process changes (an address
    // range that is not one fails with ENOMEM), and `prot` keeps read and execute as they were.
    check(unsafe { libc::mprotect(addr, len, prot | libc::PROT_WRITE) })?;
    let first = start as *mut u8;
    // SAFETY: the first byte of a mapping that is readable and, since the call above,
    // writable; it gets the value it holds.
    unsafe { first.write_volatile(first.read_volatile()) };
    // SAFETY: as above: the mapping's own protection back.
    check(unsafe { libc::mprotect(addr, len, prot) }).map(|_| ())
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

pub(super) fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Marks every descriptor from `first` upwards close-on-exec (close_range with
/// CLOSE_RANGE_CLOEXEC), so nothing inherited leaks into the program.
pub fn cloexec_from(first: RawFd) -> io::Result<()> {
    close_range(first, libc::CLOSE_RANGE_CLOEXEC)
}

fn close_range(first: RawFd, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors or changes their flags; it dereferences no
    // memory. None closed is owned by Rust code that will use it afterwards (see the callers).
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, flags) };
    check(ret as libc::c_int).map(|_| ())
}

/// A descriptor the process holds at a fixed number for the rest of its life (a zygote
/// child's report socket), borrowed for a call that needs a `BorrowedFd`.
pub fn borrow_fd(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: callers pass only descriptors placed at fixed numbers that nothing closes while
    // the process runs (see `spec::fds`); a closed one would make calls fail with EBADF, not
    // touch memory.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// Owns a descriptor the kernel just installed in this process for a received
/// `SCM_RIGHTS` message.
pub fn own_received_fd(fd: RawFd) -> std::os::fd::OwnedFd {
    // SAFETY: the kernel created this descriptor for the message just received; nothing
    // else in the process knows its number, so this is its only owner.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// Closes every descriptor from `first` upwards (the init calls this right after fork,
/// before touching files).
pub fn close_from(first: RawFd) -> io::Result<()> {
    close_range(first, 0)
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

pub use super::c_strings;

pub use super::{place_fds, place_fds_inheritable, write_all_to_fd};

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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{waitpid, WaitStatus};

    /// The child runs in the caller's memory, and the caller goes on only once it is gone
    /// (the test harness has threads, so this child allocates nothing).
    #[test]
    fn a_child_sharing_memory_ends_before_the_caller_goes_on() {
        let mut written = 0u32;
        let pid = spawn_sharing_memory(&mut || {
            written = 7;
            exit_now(3)
        })
        .unwrap();
        assert_eq!(written, 7, "the child's write is the caller's memory");
        assert_eq!(waitpid(pid, None).unwrap(), WaitStatus::Exited(pid, 3));
    }
}

//! Starting a program with descriptors at fixed numbers through `posix_spawnp`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use nix::unistd::Pid;

use super::check;

/// Starts `program` (a name without `/` is looked up on the caller's PATH) with `args` (after
/// `argv[0]`, the program itself), an empty environment and each `(source, target)` pair's
/// source as descriptor `target` (stdio included), through `posix_spawnp`. The caller keeps the sources open until this returns. Every other descriptor
/// of the parent is close-on-exec (Rust opens everything that way), so the child gets exactly
/// these; its signal mask is emptied and SIGPIPE reset to default, as std's `Command` does.
///
/// Why not std's `Command`: placing descriptors at fixed numbers needs a `pre_exec` closure,
/// and with one std forks (copying the caller's page tables, which grows with its memory: a
/// daemon's fork costs tenths of a millisecond more than a small program's), where glibc's
/// `posix_spawn` starts the child with `clone(CLONE_VM | CLONE_VFORK)` and no copy. nix 0.29
/// has no `posix_spawn` wrapper.
pub fn spawn_with_fds(
    program: &std::path::Path,
    args: &[&str],
    pairs: &[(RawFd, RawFd)],
) -> io::Result<Pid> {
    use std::os::unix::ffi::OsStrExt;
    let nul = |e: std::ffi::NulError| io::Error::new(io::ErrorKind::InvalidInput, e);
    let program = CString::new(program.as_os_str().as_bytes()).map_err(nul)?;
    let mut argv = vec![program.clone()];
    for arg in args {
        argv.push(CString::new(*arg).map_err(nul)?);
    }
    let mut argv_ptrs: Vec<*mut libc::c_char> =
        argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv_ptrs.push(std::ptr::null_mut());
    let envp: [*mut libc::c_char; 1] = [std::ptr::null_mut()];
    // Each source moves above every target first, so one placement never clobbers a later
    // source, and no source is its own target (whose close-on-exec flag dup2 would keep).
    let above = pairs.iter().map(|(_, target)| *target).max().unwrap_or(2) + 1;
    let mut moved = Vec::with_capacity(pairs.len());
    for (source, _) in pairs {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) only duplicates a descriptor; the copy is owned here.
        let fd = check(unsafe { libc::fcntl(*source, libc::F_DUPFD_CLOEXEC, above) })?;
        // SAFETY: `fd` was just created and nothing else owns it.
        moved.push(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    }
    let placed: Vec<(RawFd, RawFd)> = moved
        .iter()
        .zip(pairs)
        .map(|(fd, (_, target))| (fd.as_raw_fd(), *target))
        .collect();
    let mut pid: libc::pid_t = 0;
    let ret = with_spawn_setup(&placed, |actions, attr| {
        // SAFETY: every pointer is valid for the call: the program and argv strings live in
        // `program` and `argv` (argv_ptrs ends with NULL), envp is an empty NULL-terminated
        // list, and `actions` and `attr` were initialised by `with_spawn_setup`.
        unsafe {
            libc::posix_spawnp(
                &mut pid,
                program.as_ptr(),
                actions,
                attr,
                argv_ptrs.as_ptr(),
                envp.as_ptr(),
            )
        }
    })?;
    drop(moved);
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    Ok(Pid::from_raw(pid))
}

/// Runs `spawn` with file actions that place each `(source, target)` and attributes that
/// empty the signal mask and reset SIGPIPE, and destroys both afterwards.
fn with_spawn_setup(
    placed: &[(RawFd, RawFd)],
    spawn: impl FnOnce(
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
    ) -> libc::c_int,
) -> io::Result<libc::c_int> {
    let spawn_error = |ret: libc::c_int| match ret {
        0 => Ok(()),
        code => Err(io::Error::from_raw_os_error(code)),
    };
    // SAFETY: zeroed storage is what the init functions expect to fill in; each init is
    // paired with a destroy below, and the structures are not moved in between.
    let mut actions: libc::posix_spawn_file_actions_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut attr: libc::posix_spawnattr_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointers are to live, owned storage.
    spawn_error(unsafe { libc::posix_spawn_file_actions_init(&mut actions) })?;
    // SAFETY: as above.
    if let Err(e) = spawn_error(unsafe { libc::posix_spawnattr_init(&mut attr) }) {
        // SAFETY: `actions` was initialised.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut actions) };
        return Err(e);
    }
    let configured = (|| {
        for (source, target) in placed {
            // SAFETY: `actions` is initialised; adddup2 only records the descriptors.
            spawn_error(unsafe {
                libc::posix_spawn_file_actions_adddup2(&mut actions, *source, *target)
            })?;
        }
        // SAFETY: the sigset functions only write the sets, which live on this stack frame;
        // `attr` is initialised.
        unsafe {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            let mut pipe: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            spawn_error(libc::posix_spawnattr_setsigmask(&mut attr, &empty))?;
            spawn_error(libc::posix_spawnattr_setsigdefault(&mut attr, &pipe))?;
            let flags = libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
            spawn_error(libc::posix_spawnattr_setflags(
                &mut attr,
                flags as libc::c_short,
            ))
        }
    })();
    let result = configured.map(|()| spawn(&actions, &attr));
    // SAFETY: both were initialised above and are destroyed once.
    unsafe {
        libc::posix_spawn_file_actions_destroy(&mut actions);
        libc::posix_spawnattr_destroy(&mut attr);
    }
    result
}

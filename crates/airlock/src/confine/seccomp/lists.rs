//! The syscall policy as data: what is allowed, what is refused and which argument patterns
//! are, each list with the reason. `docs/seccomp.md` explains the choices; `build_filters`
//! compiles them.

/// A syscall by name (for messages and docs) and number (for the filter).
pub(super) type Syscall = (&'static str, i64);

/// libc's syscall numbers plus the few it lacks on some architecture (local items shadow the
/// glob import). Syscalls numbered 403 and up share one number on every architecture.
#[allow(non_upper_case_globals)] // spelled like the libc constants they stand in for
pub(super) mod sysno {
    pub use libc::*;
    pub const SYS_fchmodat2: i64 = 452;
    // arm64 uses the generic table (include/uapi/asm-generic/unistd.h) with these enabled.
    #[cfg(target_arch = "aarch64")]
    pub const SYS_renameat: i64 = 38;
    #[cfg(target_arch = "aarch64")]
    pub const SYS_sync_file_range: i64 = 84;
    #[cfg(target_arch = "aarch64")]
    pub const SYS_getrlimit: i64 = 163;
    #[cfg(target_arch = "aarch64")]
    pub const SYS_setrlimit: i64 = 164;
}

macro_rules! syscalls {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), sysno::$name)),*]
    };
}

// ---------------------------------------------------------------------------------------------
// Allowlist. Compiled from strace runs of python3 (json, subprocess, threading, multiprocessing,
// asyncio), node (fs, child_process, worker_threads, net), bash + coreutils pipelines, perl and
// gcc/g++ compiling and running a program, then widened with harmless relatives (the `*at`,
// vectored and 2/3 variants) so that other libcs and runtimes find what they need.
// ---------------------------------------------------------------------------------------------

/// Reading and writing open descriptors: everything an interpreter does with a file or pipe.
#[rustfmt::skip]
pub(super) const DESCRIPTOR_IO: &[Syscall] = syscalls![
    SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_pread64, SYS_pwrite64, SYS_preadv,
    SYS_pwritev, SYS_preadv2, SYS_pwritev2, SYS_lseek, SYS_close, SYS_close_range, SYS_dup,
    SYS_dup3, SYS_fcntl, SYS_ioctl, SYS_flock, SYS_fsync, SYS_fdatasync, SYS_sync, SYS_syncfs,
    SYS_sync_file_range, SYS_fallocate, SYS_ftruncate, SYS_truncate, SYS_fadvise64,
    SYS_readahead, SYS_sendfile, SYS_splice, SYS_tee, SYS_vmsplice, SYS_copy_file_range,
    SYS_pipe2,
];

/// Path lookups and metadata. Which paths are reachable is decided by the mount namespace and
/// Landlock, not here.
#[rustfmt::skip]
pub(super) const PATHS: &[Syscall] = syscalls![
    SYS_openat, SYS_newfstatat, SYS_fstat, SYS_statx, SYS_statfs, SYS_fstatfs,
    SYS_faccessat, SYS_faccessat2, SYS_readlinkat, SYS_getdents64, SYS_mkdirat, SYS_mknodat,
    SYS_unlinkat, SYS_renameat2, SYS_linkat, SYS_symlinkat, SYS_fchmod, SYS_fchmodat,
    SYS_fchmodat2, SYS_fchown, SYS_fchownat, SYS_utimensat, SYS_getcwd, SYS_chdir, SYS_fchdir,
    SYS_umask, SYS_getxattr, SYS_lgetxattr, SYS_fgetxattr, SYS_listxattr, SYS_llistxattr,
    SYS_flistxattr, SYS_setxattr, SYS_lsetxattr, SYS_fsetxattr, SYS_removexattr,
    SYS_lremovexattr, SYS_fremovexattr, SYS_inotify_init1, SYS_inotify_add_watch,
    SYS_inotify_rm_watch,
];

/// Address-space management of the process itself (allocators, JITs, thread stacks).
#[rustfmt::skip]
pub(super) const MEMORY: &[Syscall] = syscalls![
    SYS_brk, SYS_mmap, SYS_munmap, SYS_mremap, SYS_mprotect, SYS_madvise, SYS_msync,
    SYS_mincore, SYS_mlock, SYS_mlock2, SYS_munlock, SYS_mlockall, SYS_munlockall,
    SYS_membarrier, SYS_memfd_create, SYS_pkey_alloc, SYS_pkey_free, SYS_pkey_mprotect,
    SYS_get_mempolicy, SYS_set_mempolicy, SYS_mbind, SYS_mseal,
];

/// Creating, running and reaping processes and threads. `clone` is narrowed by the denylist.
///
/// `clone3` is deliberately absent, so it gets ENOSYS: it passes its flags in memory, which
/// seccomp cannot read, so it would bypass the `CLONE_NEW*` check on `clone`. ENOSYS rather than
/// EPERM because glibc (2.34+) falls back to `clone` on ENOSYS only, so threads, `fork` and
/// `posix_spawn` keep working; musl and older glibc never call `clone3`.
#[rustfmt::skip]
pub(super) const PROCESSES: &[Syscall] = syscalls![
    SYS_clone, SYS_execve, SYS_execveat, SYS_exit, SYS_exit_group, SYS_wait4, SYS_waitid,
    SYS_set_tid_address, SYS_set_robust_list, SYS_get_robust_list, SYS_rseq, SYS_futex,
    SYS_futex_waitv, SYS_getpid, SYS_getppid, SYS_gettid, SYS_getpgid, SYS_setpgid, SYS_getsid,
    SYS_setsid, SYS_prctl, SYS_personality, SYS_prlimit64, SYS_getrusage, SYS_times,
    SYS_getpriority, SYS_setpriority, SYS_ioprio_get, SYS_ioprio_set, SYS_pidfd_open,
    SYS_pidfd_send_signal, SYS_restart_syscall,
];

/// Scheduling hints; thread pools size themselves with `sched_getaffinity`.
#[rustfmt::skip]
pub(super) const SCHEDULING: &[Syscall] = syscalls![
    SYS_sched_yield, SYS_sched_getaffinity, SYS_sched_setaffinity, SYS_sched_getparam,
    SYS_sched_setparam, SYS_sched_getscheduler, SYS_sched_setscheduler,
    SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_sched_rr_get_interval,
    SYS_sched_getattr, SYS_sched_setattr, SYS_getcpu,
];

/// Credentials. With every capability dropped these can only read or shuffle the ids the
/// process already has; `capset` can only lower capabilities.
#[rustfmt::skip]
pub(super) const IDENTITY: &[Syscall] = syscalls![
    SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid, SYS_getresuid, SYS_getresgid,
    SYS_getgroups, SYS_setuid, SYS_setgid, SYS_setreuid, SYS_setregid, SYS_setresuid,
    SYS_setresgid, SYS_setgroups, SYS_setfsuid, SYS_setfsgid, SYS_capget, SYS_capset,
];

/// Self-confinement the sandboxed program may add on top of ours (it can only narrow).
#[rustfmt::skip]
pub(super) const SELF_CONFINEMENT: &[Syscall] = syscalls![
    SYS_seccomp, SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self,
];

/// Signals. `kill` is confined to the sandbox's processes by the pid namespace.
#[rustfmt::skip]
pub(super) const SIGNALS: &[Syscall] = syscalls![
    SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigpending,
    SYS_rt_sigtimedwait, SYS_rt_sigsuspend, SYS_rt_sigqueueinfo, SYS_rt_tgsigqueueinfo,
    SYS_sigaltstack, SYS_kill, SYS_tkill, SYS_tgkill, SYS_signalfd4,
];

/// Reading clocks, sleeping and timers (setting clocks is refused).
#[rustfmt::skip]
pub(super) const TIME: &[Syscall] = syscalls![
    SYS_clock_gettime, SYS_clock_getres, SYS_clock_nanosleep, SYS_nanosleep, SYS_gettimeofday,
    SYS_getitimer, SYS_setitimer, SYS_timer_create, SYS_timer_settime, SYS_timer_gettime,
    SYS_timer_getoverrun, SYS_timer_delete, SYS_timerfd_create, SYS_timerfd_settime,
    SYS_timerfd_gettime,
];

/// Event loops (asyncio, libuv) and classic multiplexing.
#[rustfmt::skip]
pub(super) const EVENTS: &[Syscall] = syscalls![
    SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_ppoll,
    SYS_pselect6, SYS_eventfd2, SYS_io_setup, SYS_io_destroy, SYS_io_submit, SYS_io_cancel,
    SYS_io_getevents,
];

/// Socket calls. Creating a socket is narrowed to `AF_UNIX` by the denylist when the network is
/// off; the network namespace decides what a socket can reach.
#[rustfmt::skip]
pub(super) const SOCKETS: &[Syscall] = syscalls![
    SYS_socket, SYS_socketpair, SYS_bind, SYS_listen, SYS_accept, SYS_accept4, SYS_connect,
    SYS_getsockname, SYS_getpeername, SYS_sendto, SYS_recvfrom, SYS_sendmsg, SYS_recvmsg,
    SYS_sendmmsg, SYS_recvmmsg, SYS_shutdown, SYS_setsockopt, SYS_getsockopt,
];

/// Facts about the system a program commonly asks for.
#[rustfmt::skip]
pub(super) const SYSTEM_INFO: &[Syscall] = syscalls![SYS_uname, SYS_sysinfo, SYS_getrandom];

/// x86_64 keeps the pre-`*at` calls that the generic syscall table (aarch64) dropped; old
/// binaries and some static runtimes still use them.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
pub(super) const LEGACY: &[Syscall] = syscalls![
    SYS_open, SYS_creat, SYS_stat, SYS_lstat, SYS_access, SYS_readlink, SYS_getdents,
    SYS_mkdir, SYS_rmdir, SYS_unlink, SYS_rename, SYS_renameat, SYS_link, SYS_symlink,
    SYS_chmod, SYS_chown, SYS_lchown, SYS_mknod, SYS_utime, SYS_utimes, SYS_futimesat,
    SYS_pipe, SYS_dup2, SYS_poll, SYS_select, SYS_epoll_create, SYS_epoll_wait, SYS_eventfd,
    SYS_signalfd, SYS_inotify_init, SYS_alarm, SYS_pause, SYS_time, SYS_fork, SYS_vfork,
    SYS_getpgrp, SYS_getrlimit, SYS_setrlimit, SYS_arch_prctl,
];
#[cfg(target_arch = "aarch64")]
#[rustfmt::skip]
pub(super) const LEGACY: &[Syscall] = syscalls![SYS_renameat, SYS_getrlimit, SYS_setrlimit];

pub(super) const ALLOWED: &[&[Syscall]] = &[
    DESCRIPTOR_IO,
    PATHS,
    MEMORY,
    PROCESSES,
    SCHEDULING,
    IDENTITY,
    SELF_CONFINEMENT,
    SIGNALS,
    TIME,
    EVENTS,
    SOCKETS,
    SYSTEM_INFO,
    LEGACY,
];

// ---------------------------------------------------------------------------------------------
// Refusals (EPERM). None of these is on the allowlist; listing them here turns the generic
// ENOSYS into an explicit EPERM, which programs treat as "not permitted" instead of "try the
// old way". See docs/seccomp.md for the threat each group closes.
// ---------------------------------------------------------------------------------------------

/// Re-arranging namespaces and mounts would let code escape or rebuild the sandbox's view.
#[rustfmt::skip]
pub(super) const REFUSED_NAMESPACES_AND_MOUNTS: &[Syscall] = syscalls![
    SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot, SYS_unshare, SYS_setns,
    SYS_mount_setattr, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_move_mount, SYS_open_tree,
    SYS_fspick,
];

/// Reading or writing another process's memory or descriptors.
#[rustfmt::skip]
pub(super) const REFUSED_CROSS_PROCESS: &[Syscall] = syscalls![
    SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_pidfd_getfd,
];

/// Large kernel attack surfaces with a history of privilege-escalation bugs.
#[rustfmt::skip]
pub(super) const REFUSED_KERNEL_SURFACE: &[Syscall] = syscalls![
    SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_io_uring_setup, SYS_io_uring_enter,
    SYS_io_uring_register,
];

/// The kernel keyring is not namespaced: keys could leak between sandboxes and the host.
#[rustfmt::skip]
pub(super) const REFUSED_KEYRING: &[Syscall] = syscalls![SYS_keyctl, SYS_add_key, SYS_request_key];

/// Changing the running kernel or machine.
#[rustfmt::skip]
pub(super) const REFUSED_MACHINE: &[Syscall] = syscalls![
    SYS_kexec_load, SYS_kexec_file_load, SYS_init_module, SYS_finit_module,
    SYS_delete_module, SYS_reboot, SYS_swapon, SYS_swapoff, SYS_acct, SYS_quotactl,
    SYS_quotactl_fd, SYS_syslog, SYS_lookup_dcookie, SYS_sethostname, SYS_setdomainname,
];

/// Opening files by handle bypasses path-based confinement (mount namespace, Landlock);
/// fanotify watches whole filesystems.
#[rustfmt::skip]
pub(super) const REFUSED_FILE_HANDLES: &[Syscall] =
    syscalls![SYS_open_by_handle_at, SYS_name_to_handle_at, SYS_fanotify_init];

/// Clocks are global: setting one affects the host and every other sandbox.
#[rustfmt::skip]
pub(super) const REFUSED_CLOCKS: &[Syscall] =
    syscalls![SYS_settimeofday, SYS_clock_settime, SYS_adjtimex, SYS_clock_adjtime];

/// Raw port I/O on x86.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
pub(super) const REFUSED_ARCH: &[Syscall] = syscalls![SYS_iopl, SYS_ioperm];
#[cfg(target_arch = "aarch64")]
#[rustfmt::skip]
pub(super) const REFUSED_ARCH: &[Syscall] = &[];

pub(super) const REFUSED: &[&[Syscall]] = &[
    REFUSED_NAMESPACES_AND_MOUNTS,
    REFUSED_CROSS_PROCESS,
    REFUSED_KERNEL_SURFACE,
    REFUSED_KEYRING,
    REFUSED_MACHINE,
    REFUSED_FILE_HANDLES,
    REFUSED_CLOCKS,
    REFUSED_ARCH,
];

/// Namespace-creating `clone` flags. `CLONE_NEWTIME` (0x80) is not among them: in `clone` that
/// bit belongs to the exit-signal field, and a time namespace can only be made with `clone3` or
/// `unshare`, both refused.
pub(super) const CLONE_NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// `personality(0xffffffff)` only queries; `PER_LINUX` (0) is the default. Anything else could
/// switch off ASLR (`ADDR_NO_RANDOMIZE`) or change how the kernel treats the process.
pub(super) const PERSONALITY_QUERY: u64 = 0xffff_ffff;
pub(super) const PER_LINUX: u64 = 0;

/// The socket type bits of `socket`'s second argument (the rest are `SOCK_NONBLOCK` and
/// `SOCK_CLOEXEC`).
pub(super) const SOCKET_TYPE_MASK: u64 = 0xf;

/// IP socket types refused when IP sockets are allowed (`allow_inet`): everything but stream
/// (TCP) and datagram (UDP). Raw and packet sockets would bypass the gate's listeners (they
/// need CAP_NET_RAW, which the program lacks anyway); the others are protocols the gate does
/// not relay.
pub const IP_SOCKET_TYPES_REFUSED: &[libc::c_int] = &[
    libc::SOCK_RAW,
    libc::SOCK_RDM,
    libc::SOCK_SEQPACKET,
    libc::SOCK_DCCP,
    SOCK_PACKET,
];

/// The obsolete packet socket type (libc deprecates the name in favour of `AF_PACKET`, which
/// is refused as a family anyway).
const SOCK_PACKET: libc::c_int = 10;

/// The setuid and setgid mode bits.
pub const SETID_BITS: u64 = (libc::S_ISUID | libc::S_ISGID) as u64;

/// Calls that give a file its mode bits, with the index of the mode argument. A mode with
/// the setuid or setgid bit is refused: a file the program makes in a directory that outlives
/// the run (`--workdir`, `--rw`, a session's workspace) belongs on the host to the
/// directory's owner (root, for a root-owned workspace mapped to the sandbox user), so a
/// setuid copy of a shell planted there would run as that owner for anyone who executes it.
/// `open` and `openat` are checked whatever the flags (libc passes 0 without `O_CREAT`);
/// `openat2` hides its mode in a struct the filter cannot read and is left unlisted
/// (ENOSYS), as on a kernel before 5.6: libc's `open` never uses it.
#[cfg(target_arch = "x86_64")]
pub(super) const MODE_ARGUMENTS: &[(Syscall, u8)] = &[
    (("SYS_open", sysno::SYS_open), 2),
    (("SYS_creat", sysno::SYS_creat), 1),
    (("SYS_openat", sysno::SYS_openat), 3),
    (("SYS_chmod", sysno::SYS_chmod), 1),
    (("SYS_fchmod", sysno::SYS_fchmod), 1),
    (("SYS_fchmodat", sysno::SYS_fchmodat), 2),
    (("SYS_fchmodat2", sysno::SYS_fchmodat2), 2),
    (("SYS_mknod", sysno::SYS_mknod), 1),
    (("SYS_mknodat", sysno::SYS_mknodat), 2),
];
#[cfg(target_arch = "aarch64")]
pub(super) const MODE_ARGUMENTS: &[(Syscall, u8)] = &[
    (("SYS_openat", sysno::SYS_openat), 3),
    (("SYS_fchmod", sysno::SYS_fchmod), 1),
    (("SYS_fchmodat", sysno::SYS_fchmodat), 2),
    (("SYS_fchmodat2", sysno::SYS_fchmodat2), 2),
    (("SYS_mknodat", sysno::SYS_mknodat), 2),
];

/// `TIOCSTI` pushes input into a terminal, `TIOCLINUX` can read the virtual console: both let a
/// sandbox type commands into a terminal it shares with the host.
#[allow(clippy::unnecessary_cast)] // the request type is u64 in glibc but i32 in musl
pub(super) const REFUSED_IOCTLS: &[u64] = &[libc::TIOCSTI as u64, libc::TIOCLINUX as u64];

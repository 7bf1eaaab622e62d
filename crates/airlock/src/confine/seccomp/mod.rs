//! The seccomp policy: an allowlist of what interpreters (python3, node, bash, perl, ruby, the
//! gcc toolchain, coreutils) need, plus explicit refusals for the dangerous calls.
//!
//! Two stacked filters:
//!
//! 1. the *syscall table* (installed first): listed syscalls -> `ALLOW`, refused syscalls ->
//!    `EPERM`, anything else -> `ENOSYS`, found by binary search over ranges of numbers
//!    ([`table`]);
//! 2. the *argument checks* (installed second, compiled by seccompiler): refused argument
//!    patterns of allowed syscalls (`clone(CLONE_NEWUSER)`, `ioctl(TIOCSTI)`, ...) -> `EPERM`,
//!    anything else -> `ALLOW`.
//!
//! The kernel runs every installed filter and keeps the result with the highest precedence
//! (`KILL` > `TRAP` > `ERRNO` > `USER_NOTIF` > `TRACE` > `LOG` > `ALLOW`); among results with
//! the same action it keeps the one from the most recently installed filter, because it walks
//! the filters newest first and only replaces its pick with a strictly higher precedence one
//! (`seccomp_run_filters` in `kernel/seccomp.c`). So:
//! * a refused argument pattern of an allowed syscall gets `ALLOW` and `ERRNO(EPERM)`: `ERRNO`
//!   outranks `ALLOW`, the caller sees `EPERM`;
//! * a refused syscall gets `ERRNO(EPERM)` from the table and `ALLOW` from the argument checks;
//! * a syscall neither filter knows gets `ENOSYS` and `ALLOW`: the caller sees `ENOSYS`, just as
//!   on a kernel that lacks it, which well-written programs handle by falling back.
//!
//! `later_filter_errno_wins_for_equal_actions` checks the precedence rule on the running kernel.
//! Nothing here ever kills: a syscall under a foreign architecture token gets ENOSYS from the
//! table, and seccompiler's arch check (which kills) is rewritten to ALLOW in the argument
//! checks, see [`soften_arch_check`]. The policy and its reasons are documented in
//! `docs/seccomp.md`.

mod table;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The knobs of the policy that differ between sandboxes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SeccompConfig {
    /// Allow sockets of every address family; when false only `AF_UNIX` sockets may be made.
    pub allow_network: bool,
}

/// Why the seccomp filters could not be built or installed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeccompError {
    #[error("failed to build the seccomp {filter} filter: {source}")]
    Build {
        filter: &'static str,
        #[source]
        source: seccompiler::BackendError,
    },
    #[error("seccompiler emitted an unexpected architecture check in the {filter} filter")]
    UnexpectedArchCheck { filter: &'static str },
    #[error("failed to install the seccomp {filter} filter: {source}")]
    Install {
        filter: &'static str,
        #[source]
        source: seccompiler::Error,
    },
}

/// A syscall by name (for messages and docs) and number (for the filter).
type Syscall = (&'static str, i64);

/// libc's syscall numbers plus the few it lacks on some architecture (local items shadow the
/// glob import). Syscalls numbered 403 and up share one number on every architecture.
#[allow(non_upper_case_globals)] // spelled like the libc constants they stand in for
mod sysno {
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
const DESCRIPTOR_IO: &[Syscall] = syscalls![
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
const PATHS: &[Syscall] = syscalls![
    SYS_openat, SYS_openat2, SYS_newfstatat, SYS_fstat, SYS_statx, SYS_statfs, SYS_fstatfs,
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
const MEMORY: &[Syscall] = syscalls![
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
const PROCESSES: &[Syscall] = syscalls![
    SYS_clone, SYS_execve, SYS_execveat, SYS_exit, SYS_exit_group, SYS_wait4, SYS_waitid,
    SYS_set_tid_address, SYS_set_robust_list, SYS_get_robust_list, SYS_rseq, SYS_futex,
    SYS_futex_waitv, SYS_getpid, SYS_getppid, SYS_gettid, SYS_getpgid, SYS_setpgid, SYS_getsid,
    SYS_setsid, SYS_prctl, SYS_personality, SYS_prlimit64, SYS_getrusage, SYS_times,
    SYS_getpriority, SYS_setpriority, SYS_ioprio_get, SYS_ioprio_set, SYS_pidfd_open,
    SYS_pidfd_send_signal, SYS_restart_syscall,
];

/// Scheduling hints; thread pools size themselves with `sched_getaffinity`.
#[rustfmt::skip]
const SCHEDULING: &[Syscall] = syscalls![
    SYS_sched_yield, SYS_sched_getaffinity, SYS_sched_setaffinity, SYS_sched_getparam,
    SYS_sched_setparam, SYS_sched_getscheduler, SYS_sched_setscheduler,
    SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_sched_rr_get_interval,
    SYS_sched_getattr, SYS_sched_setattr, SYS_getcpu,
];

/// Credentials. With every capability dropped these can only read or shuffle the ids the
/// process already has; `capset` can only lower capabilities.
#[rustfmt::skip]
const IDENTITY: &[Syscall] = syscalls![
    SYS_getuid, SYS_geteuid, SYS_getgid, SYS_getegid, SYS_getresuid, SYS_getresgid,
    SYS_getgroups, SYS_setuid, SYS_setgid, SYS_setreuid, SYS_setregid, SYS_setresuid,
    SYS_setresgid, SYS_setgroups, SYS_setfsuid, SYS_setfsgid, SYS_capget, SYS_capset,
];

/// Self-confinement the sandboxed program may add on top of ours (it can only narrow).
#[rustfmt::skip]
const SELF_CONFINEMENT: &[Syscall] = syscalls![
    SYS_seccomp, SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self,
];

/// Signals. `kill` is confined to the sandbox's processes by the pid namespace.
#[rustfmt::skip]
const SIGNALS: &[Syscall] = syscalls![
    SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigpending,
    SYS_rt_sigtimedwait, SYS_rt_sigsuspend, SYS_rt_sigqueueinfo, SYS_rt_tgsigqueueinfo,
    SYS_sigaltstack, SYS_kill, SYS_tkill, SYS_tgkill, SYS_signalfd4,
];

/// Reading clocks, sleeping and timers (setting clocks is refused).
#[rustfmt::skip]
const TIME: &[Syscall] = syscalls![
    SYS_clock_gettime, SYS_clock_getres, SYS_clock_nanosleep, SYS_nanosleep, SYS_gettimeofday,
    SYS_getitimer, SYS_setitimer, SYS_timer_create, SYS_timer_settime, SYS_timer_gettime,
    SYS_timer_getoverrun, SYS_timer_delete, SYS_timerfd_create, SYS_timerfd_settime,
    SYS_timerfd_gettime,
];

/// Event loops (asyncio, libuv) and classic multiplexing.
#[rustfmt::skip]
const EVENTS: &[Syscall] = syscalls![
    SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_ppoll,
    SYS_pselect6, SYS_eventfd2, SYS_io_setup, SYS_io_destroy, SYS_io_submit, SYS_io_cancel,
    SYS_io_getevents,
];

/// Socket calls. Creating a socket is narrowed to `AF_UNIX` by the denylist when the network is
/// off; the network namespace decides what a socket can reach.
#[rustfmt::skip]
const SOCKETS: &[Syscall] = syscalls![
    SYS_socket, SYS_socketpair, SYS_bind, SYS_listen, SYS_accept, SYS_accept4, SYS_connect,
    SYS_getsockname, SYS_getpeername, SYS_sendto, SYS_recvfrom, SYS_sendmsg, SYS_recvmsg,
    SYS_sendmmsg, SYS_recvmmsg, SYS_shutdown, SYS_setsockopt, SYS_getsockopt,
];

/// Facts about the system a program commonly asks for.
#[rustfmt::skip]
const SYSTEM_INFO: &[Syscall] = syscalls![SYS_uname, SYS_sysinfo, SYS_getrandom];

/// x86_64 keeps the pre-`*at` calls that the generic syscall table (aarch64) dropped; old
/// binaries and some static runtimes still use them.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
const LEGACY: &[Syscall] = syscalls![
    SYS_open, SYS_creat, SYS_stat, SYS_lstat, SYS_access, SYS_readlink, SYS_getdents,
    SYS_mkdir, SYS_rmdir, SYS_unlink, SYS_rename, SYS_renameat, SYS_link, SYS_symlink,
    SYS_chmod, SYS_chown, SYS_lchown, SYS_mknod, SYS_utime, SYS_utimes, SYS_futimesat,
    SYS_pipe, SYS_dup2, SYS_poll, SYS_select, SYS_epoll_create, SYS_epoll_wait, SYS_eventfd,
    SYS_signalfd, SYS_inotify_init, SYS_alarm, SYS_pause, SYS_time, SYS_fork, SYS_vfork,
    SYS_getpgrp, SYS_getrlimit, SYS_setrlimit, SYS_arch_prctl,
];
#[cfg(target_arch = "aarch64")]
#[rustfmt::skip]
const LEGACY: &[Syscall] = syscalls![SYS_renameat, SYS_getrlimit, SYS_setrlimit];

const ALLOWED: &[&[Syscall]] = &[
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
const REFUSED_NAMESPACES_AND_MOUNTS: &[Syscall] = syscalls![
    SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot, SYS_unshare, SYS_setns,
    SYS_mount_setattr, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_move_mount, SYS_open_tree,
    SYS_fspick,
];

/// Reading or writing another process's memory or descriptors.
#[rustfmt::skip]
const REFUSED_CROSS_PROCESS: &[Syscall] = syscalls![
    SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_pidfd_getfd,
];

/// Large kernel attack surfaces with a history of privilege-escalation bugs.
#[rustfmt::skip]
const REFUSED_KERNEL_SURFACE: &[Syscall] = syscalls![
    SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_io_uring_setup, SYS_io_uring_enter,
    SYS_io_uring_register,
];

/// The kernel keyring is not namespaced: keys could leak between sandboxes and the host.
#[rustfmt::skip]
const REFUSED_KEYRING: &[Syscall] = syscalls![SYS_keyctl, SYS_add_key, SYS_request_key];

/// Changing the running kernel or machine.
#[rustfmt::skip]
const REFUSED_MACHINE: &[Syscall] = syscalls![
    SYS_kexec_load, SYS_kexec_file_load, SYS_init_module, SYS_finit_module,
    SYS_delete_module, SYS_reboot, SYS_swapon, SYS_swapoff, SYS_acct, SYS_quotactl,
    SYS_quotactl_fd, SYS_syslog, SYS_lookup_dcookie, SYS_sethostname, SYS_setdomainname,
];

/// Opening files by handle bypasses path-based confinement (mount namespace, Landlock);
/// fanotify watches whole filesystems.
#[rustfmt::skip]
const REFUSED_FILE_HANDLES: &[Syscall] =
    syscalls![SYS_open_by_handle_at, SYS_name_to_handle_at, SYS_fanotify_init];

/// Clocks are global: setting one affects the host and every other sandbox.
#[rustfmt::skip]
const REFUSED_CLOCKS: &[Syscall] =
    syscalls![SYS_settimeofday, SYS_clock_settime, SYS_adjtimex, SYS_clock_adjtime];

/// Raw port I/O on x86.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
const REFUSED_ARCH: &[Syscall] = syscalls![SYS_iopl, SYS_ioperm];
#[cfg(target_arch = "aarch64")]
#[rustfmt::skip]
const REFUSED_ARCH: &[Syscall] = &[];

const REFUSED: &[&[Syscall]] = &[
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
const CLONE_NAMESPACE_FLAGS: &[u64] = &[
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
const PERSONALITY_QUERY: u64 = 0xffff_ffff;
const PER_LINUX: u64 = 0;

/// `TIOCSTI` pushes input into a terminal, `TIOCLINUX` can read the virtual console: both let a
/// sandbox type commands into a terminal it shares with the host.
#[allow(clippy::unnecessary_cast)] // the request type is u64 in glibc but i32 in musl
const REFUSED_IOCTLS: &[u64] = &[libc::TIOCSTI as u64, libc::TIOCLINUX as u64];

#[cfg(target_arch = "x86_64")]
const TARGET_ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const TARGET_ARCH: TargetArch = TargetArch::aarch64;
/// The same architecture's `AUDIT_ARCH_*` token (linux/audit.h: the ELF machine number, 64-bit,
/// little-endian), which seccompiler keeps private.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;

/// The two filters in installation order: the syscall table, then the argument checks.
pub fn build_filters(cfg: &SeccompConfig) -> Result<Vec<BpfProgram>, SeccompError> {
    let arguments = compile(
        "argument checks",
        argument_rules(cfg)?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )?;
    Ok(vec![syscall_table().compile(), arguments])
}

/// Allowed syscalls, refused ones (EPERM) and ENOSYS for every other number and for foreign
/// architectures.
fn syscall_table() -> table::SyscallTable {
    let action = |action: SeccompAction| u32::from(action);
    let eperm = action(SeccompAction::Errno(libc::EPERM as u32));
    let enosys = action(SeccompAction::Errno(libc::ENOSYS as u32));
    let listed =
        |groups, verdict: u32| every(groups).map(move |&(_, number)| (number as u32, verdict));
    table::SyscallTable {
        arch: AUDIT_ARCH,
        actions: listed(ALLOWED, action(SeccompAction::Allow))
            .chain(listed(REFUSED, eperm))
            .collect(),
        default: enosys,
        foreign_arch: enosys,
    }
}

/// The names (without `SYS_`) of this architecture's allowed and refused syscalls, for
/// policies written with names (OCI and Docker seccomp profiles).
pub fn syscall_names() -> (Vec<&'static str>, Vec<&'static str>) {
    let names = |groups| -> Vec<&'static str> {
        every(groups)
            .map(|&(name, _)| name.strip_prefix("SYS_").unwrap_or(name))
            .collect()
    };
    (names(ALLOWED), names(REFUSED))
}

/// Every syscall of a list of groups (`ALLOWED`, `REFUSED`).
fn every(groups: &'static [&'static [Syscall]]) -> impl Iterator<Item = &'static Syscall> {
    groups.iter().flat_map(|group| group.iter())
}

/// A program as the raw `struct sock_filter` array a tool reads from a descriptor (bwrap's
/// `--add-seccomp-fd`).
pub fn filter_bytes(program: &[sock_filter]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for insn in program {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    bytes
}

/// Installs the filters on the calling thread; they are inherited by every process it forks
/// and kept across `execve`. Requires `no_new_privs` (or `CAP_SYS_ADMIN`), which the caller sets.
pub fn install(cfg: &SeccompConfig) -> Result<(), SeccompError> {
    let filters = build_filters(cfg)?;
    for (filter, program) in ["syscall table", "argument checks"]
        .into_iter()
        .zip(&filters)
    {
        seccompiler::apply_filter(program)
            .map_err(|source| SeccompError::Install { filter, source })?;
    }
    Ok(())
}

fn compile(
    filter: &'static str,
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    let build = |source| SeccompError::Build { filter, source };
    let seccomp_filter =
        SeccompFilter::new(rules, mismatch.clone(), matched, TARGET_ARCH).map_err(build)?;
    let mut program = BpfProgram::try_from(seccomp_filter).map_err(build)?;
    soften_arch_check(&mut program, mismatch)
        .ok_or(SeccompError::UnexpectedArchCheck { filter })?;
    Ok(program)
}

/// seccompiler starts every program with "load arch; if arch == target skip 1; return
/// KILL_PROCESS". A foreign-arch syscall (e.g. `int 0x80` i386 calls on x86_64, whose numbers
/// mean different syscalls) must not be checked against our rules, but killing would break the
/// never-kill rule, so the kill becomes the filter's mismatch action: ALLOW in the argument
/// checks, which leaves the syscall table's ENOSYS standing. Returns `None` if the prologue is
/// not the one expected, so a seccompiler upgrade cannot silently change the meaning of the
/// patch.
fn soften_arch_check(program: &mut BpfProgram, mismatch: SeccompAction) -> Option<()> {
    const BPF_RET_K: u16 = 0x06;
    let kill = sock_filter {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_KILL_PROCESS,
    };
    let instruction = program
        .get_mut(2)
        .filter(|instruction| **instruction == kill)?;
    instruction.k = u32::from(mismatch);
    Some(())
}

/// The refused argument patterns, per syscall; every syscall here is on the allowlist.
fn argument_rules(cfg: &SeccompConfig) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules = BTreeMap::new();
    rules.insert(libc::SYS_clone, clone_namespace_rules()?);
    rules.insert(libc::SYS_personality, personality_rules()?);
    rules.insert(libc::SYS_ioctl, ioctl_rules()?);
    rules.insert(libc::SYS_mknod, device_node_rules(1)?);
    rules.insert(libc::SYS_mknodat, device_node_rules(2)?);
    if !cfg.allow_network {
        rules.insert(libc::SYS_socket, non_unix_socket_rules()?);
        rules.insert(libc::SYS_socketpair, non_unix_socket_rules()?);
    }
    Ok(rules)
}

// The argument checks below compare 32-bit words (`Dword`): the kernel reads clone's flags,
// personality, the ioctl request and the socket family as 32-bit values, so garbage in the
// upper half cannot smuggle a refused value past the filter.

fn arg_condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(argument_rule_error)
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conditions).map_err(argument_rule_error)
}

fn argument_rule_error(source: seccompiler::BackendError) -> SeccompError {
    SeccompError::Build {
        filter: "argument checks",
        source,
    }
}

/// One rule per flag: rules of a syscall are alternatives, so any one flag set matches.
fn clone_namespace_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    CLONE_NAMESPACE_FLAGS
        .iter()
        .map(|&flag| rule(vec![arg_condition(0, SeccompCmpOp::MaskedEq(flag), flag)?]))
        .collect()
}

/// Conditions of one rule must all hold: "neither the query nor PER_LINUX".
fn personality_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    Ok(vec![rule(vec![
        arg_condition(0, SeccompCmpOp::Ne, PERSONALITY_QUERY)?,
        arg_condition(0, SeccompCmpOp::Ne, PER_LINUX)?,
    ])?])
}

fn ioctl_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    REFUSED_IOCTLS
        .iter()
        .map(|&request| rule(vec![arg_condition(1, SeccompCmpOp::Eq, request)?]))
        .collect()
}

/// Device nodes, whatever the mount flags and capabilities say: a user-space kernel (gVisor)
/// lets an unprivileged program make them in its own tmpfs. FIFOs and sockets stay allowed.
/// `mode_arg` is the index of the mode argument (1 for mknod, 2 for mknodat).
fn device_node_rules(mode_arg: u8) -> Result<Vec<SeccompRule>, SeccompError> {
    let file_type = u64::from(libc::S_IFMT);
    [libc::S_IFCHR, libc::S_IFBLK]
        .iter()
        .map(|&kind| {
            let condition =
                arg_condition(mode_arg, SeccompCmpOp::MaskedEq(file_type), u64::from(kind))?;
            rule(vec![condition])
        })
        .collect()
}

fn non_unix_socket_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    let unix = libc::AF_UNIX as u64;
    Ok(vec![rule(vec![arg_condition(0, SeccompCmpOp::Ne, unix)?])?])
}

#[cfg(test)]
mod tests;

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
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::path::Path;
    use std::process::{Command, Output};

    const OFFLINE: SeccompConfig = SeccompConfig {
        allow_network: false,
    };
    const ONLINE: SeccompConfig = SeccompConfig {
        allow_network: true,
    };
    const EPERM: &str = "1";
    const ENOSYS: &str = "38";
    const PYTHON: &str = "/usr/bin/python3";

    /// Runs `program` from a fresh thread, under the filters when `cfg` is given. The child
    /// inherits the thread's filters through fork+exec, exactly as the sandbox's payload does.
    fn run(cfg: Option<SeccompConfig>, program: &str, args: &[&str]) -> Output {
        let program = program.to_owned();
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        std::thread::spawn(move || {
            if let Some(cfg) = cfg {
                crate::sandbox::caps::set_no_new_privs().unwrap();
                install(&cfg).unwrap();
            }
            Command::new(program).args(args).output().unwrap()
        })
        .join()
        .expect("the filtered thread panicked")
    }

    fn stdout_of(output: &Output) -> String {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{:?}: {stderr}", output.status);
        String::from_utf8(output.stdout.clone()).unwrap()
    }

    fn missing(program: &str) -> bool {
        let absent = !Path::new(program).exists();
        if absent {
            eprintln!("skipped: {program} is not installed");
        }
        absent
    }

    /// Calls raw syscalls through ctypes and prints "label errno" (or "label ok") per call.
    /// A successful raw clone returns 0 in the child, which must leave at once.
    const PROBE_SCRIPT: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for spec in sys.argv[1:]:
    label, *numbers = spec.split(":")
    number, *args = (int(n, 0) for n in numbers)
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *(ctypes.c_ulong(a) for a in args))
    if label.startswith("clone") and result == 0:
        os._exit(0)
    if label.startswith("clone") and result > 0:
        os.waitpid(result, 0)
    print(label, ctypes.get_errno() if result == -1 else "ok", flush=True)
"#;

    struct Probe {
        label: String,
        number: i64,
        args: Vec<u64>,
    }

    fn probe(label: &str, number: i64, args: &[u64]) -> Probe {
        let label = label.to_owned();
        let args = args.to_vec();
        Probe {
            label,
            number,
            args,
        }
    }

    /// Runs the probes under `cfg` (or unfiltered) and maps each label to its outcome.
    fn outcomes(cfg: Option<SeccompConfig>, probes: &[Probe]) -> HashMap<String, String> {
        let specs: Vec<String> = probes
            .iter()
            .map(|probe| {
                let numbers = std::iter::once(probe.number.to_string())
                    .chain(probe.args.iter().map(u64::to_string));
                std::iter::once(probe.label.clone())
                    .chain(numbers)
                    .collect::<Vec<_>>()
                    .join(":")
            })
            .collect();
        let mut args = vec!["-c", PROBE_SCRIPT];
        args.extend(specs.iter().map(String::as_str));
        let stdout = stdout_of(&run(cfg, PYTHON, &args));
        stdout
            .lines()
            .filter_map(|line| line.split_once(' '))
            .map(|(label, outcome)| (label.to_owned(), outcome.to_owned()))
            .collect()
    }

    /// Arguments that make each refused call harmless should the filter ever let it through
    /// (bad pointers, invalid descriptors or flags); all others are called with zeros.
    fn harmless_args(name: &str) -> Vec<u64> {
        match name {
            "SYS_ptrace" => vec![libc::PTRACE_ATTACH as u64, 0],
            "SYS_acct" | "SYS_sethostname" | "SYS_setdomainname" => vec![1, 1],
            "SYS_kexec_load" => vec![0, 0, 0, u64::from(u32::MAX)],
            "SYS_kexec_file_load" | "SYS_finit_module" | "SYS_setns" | "SYS_pidfd_getfd" => {
                vec![u64::MAX; 5]
            }
            _ => vec![0; 6],
        }
    }

    #[test]
    fn later_filter_errno_wins_for_equal_actions() {
        let refuse_getcwd = |errno: i32| {
            let rules = BTreeMap::from([(libc::SYS_getcwd, Vec::new())]);
            let errno = SeccompAction::Errno(errno as u32);
            let filter = SeccompFilter::new(rules, SeccompAction::Allow, errno, TARGET_ARCH);
            BpfProgram::try_from(filter.unwrap()).unwrap()
        };
        let first = refuse_getcwd(libc::EXDEV);
        let second = refuse_getcwd(libc::ELOOP);
        let seen = std::thread::spawn(move || {
            crate::sandbox::caps::set_no_new_privs().unwrap();
            seccompiler::apply_filter(&first).unwrap();
            seccompiler::apply_filter(&second).unwrap();
            nix::unistd::getcwd()
        })
        .join()
        .unwrap();
        assert_eq!(seen, Err(nix::errno::Errno::ELOOP));
        assert!(
            nix::unistd::getcwd().is_ok(),
            "the test thread must be unfiltered"
        );
    }

    #[test]
    fn every_refused_syscall_gets_eperm() {
        if missing(PYTHON) {
            return;
        }
        let probes: Vec<Probe> = every(REFUSED)
            .map(|&(name, number)| probe(name, number, &harmless_args(name)))
            .collect();
        let seen = outcomes(Some(OFFLINE), &probes);
        for probe in &probes {
            assert_eq!(
                seen.get(&probe.label).map(String::as_str),
                Some(EPERM),
                "{}",
                probe.label
            );
        }
    }

    #[test]
    fn unknown_and_unlisted_syscalls_get_enosys() {
        if missing(PYTHON) {
            return;
        }
        let mut probes = vec![
            probe("made_up_1000", 1000, &[]),
            probe("clone3", libc::SYS_clone3, &[0, 0]),
            probe("kcmp", libc::SYS_kcmp, &[0, 0, 0, 0, 0]),
        ];
        if cfg!(target_arch = "x86_64") {
            // The x32 ABI shares the x86_64 arch token; its numbers carry bit 30.
            probes.push(probe("x32_getpid", 0x4000_0000 | libc::SYS_getpid, &[]));
        }
        let seen = outcomes(Some(OFFLINE), &probes);
        for probe in &probes {
            assert_eq!(
                seen.get(&probe.label).map(String::as_str),
                Some(ENOSYS),
                "{}",
                probe.label
            );
        }
        let free = outcomes(None, &probes);
        assert_ne!(free["clone3"], ENOSYS, "the kernel itself must know clone3");
        assert_ne!(free["kcmp"], ENOSYS, "the kernel itself must know kcmp");
    }

    #[test]
    fn namespace_clone_is_refused_but_fork_style_clone_works() {
        if missing(PYTHON) {
            return;
        }
        let sigchld = libc::SIGCHLD as u64;
        let newuser = libc::CLONE_NEWUSER as u64 | sigchld;
        let probes = [
            probe("clone_newuser", libc::SYS_clone, &[newuser, 0, 0, 0, 0]),
            probe(
                "clone_newnet",
                libc::SYS_clone,
                &[libc::CLONE_NEWNET as u64 | sigchld],
            ),
            probe(
                "clone_upper_bits",
                libc::SYS_clone,
                &[(1 << 32) | newuser, 0, 0, 0, 0],
            ),
            probe("clone_fork", libc::SYS_clone, &[sigchld, 0, 0, 0, 0]),
        ];
        let seen = outcomes(Some(OFFLINE), &probes);
        assert_eq!(seen["clone_newuser"], EPERM);
        assert_eq!(seen["clone_newnet"], EPERM);
        assert_eq!(seen["clone_upper_bits"], EPERM);
        assert_eq!(seen["clone_fork"], "ok");
        let free = outcomes(None, &probes[..1]);
        assert_eq!(
            free["clone_newuser"], "ok",
            "unfiltered, the kernel must allow it"
        );
    }

    fn socket_probes() -> Vec<Probe> {
        let stream = libc::SOCK_STREAM as u64;
        let (inet, inet6, unix) = (libc::AF_INET as u64, libc::AF_INET6 as u64, libc::AF_UNIX);
        vec![
            probe("socket_inet", libc::SYS_socket, &[inet, stream, 0]),
            probe("socket_inet6", libc::SYS_socket, &[inet6, stream, 0]),
            probe(
                "socket_netlink",
                libc::SYS_socket,
                &[libc::AF_NETLINK as u64, 3, 0],
            ),
            probe("socket_unix", libc::SYS_socket, &[unix as u64, stream, 0]),
            probe(
                "socketpair_inet",
                libc::SYS_socketpair,
                &[inet, stream, 0, 0],
            ),
        ]
    }

    /// NULL paths: a call the filter lets through fails with EFAULT, never creating anything.
    fn mknod_probes() -> Vec<Probe> {
        let at_fdcwd = libc::AT_FDCWD as u64;
        let mode = |kind: libc::mode_t| u64::from(kind | 0o600);
        let mem = libc::makedev(1, 1);
        vec![
            probe(
                "mknodat_chr",
                libc::SYS_mknodat,
                &[at_fdcwd, 0, mode(libc::S_IFCHR), mem],
            ),
            probe(
                "mknodat_blk",
                libc::SYS_mknodat,
                &[at_fdcwd, 0, mode(libc::S_IFBLK), mem],
            ),
            probe("mknod_chr", libc::SYS_mknod, &[0, mode(libc::S_IFCHR), mem]),
            probe(
                "mknodat_fifo",
                libc::SYS_mknodat,
                &[at_fdcwd, 0, mode(libc::S_IFIFO), 0],
            ),
        ]
    }

    #[test]
    fn device_nodes_are_refused_and_fifos_are_not() {
        if missing(PYTHON) {
            return;
        }
        const EFAULT: &str = "14";
        let seen = outcomes(Some(OFFLINE), &mknod_probes());
        for label in ["mknodat_chr", "mknodat_blk", "mknod_chr"] {
            assert_eq!(seen[label], EPERM, "{label}");
        }
        assert_eq!(seen["mknodat_fifo"], EFAULT, "FIFOs reach the kernel");
        let free = outcomes(None, &mknod_probes());
        assert_eq!(
            free["mknodat_chr"], EFAULT,
            "unfiltered, the kernel decides"
        );
    }

    #[test]
    fn network_off_allows_only_unix_sockets() {
        if missing(PYTHON) {
            return;
        }
        let seen = outcomes(Some(OFFLINE), &socket_probes());
        assert_eq!(seen["socket_inet"], EPERM);
        assert_eq!(seen["socket_inet6"], EPERM);
        assert_eq!(seen["socket_netlink"], EPERM);
        assert_eq!(seen["socketpair_inet"], EPERM);
        assert_eq!(seen["socket_unix"], "ok");
    }

    #[test]
    fn network_on_allows_inet_sockets() {
        if missing(PYTHON) {
            return;
        }
        let seen = outcomes(Some(ONLINE), &socket_probes());
        assert_eq!(seen["socket_inet"], "ok");
        assert_eq!(seen["socket_inet6"], "ok");
        assert_eq!(seen["socket_unix"], "ok");
        assert_ne!(
            seen["socketpair_inet"], EPERM,
            "the kernel, not the filter, decides"
        );
    }

    #[test]
    #[allow(clippy::unnecessary_cast)] // the request type is u64 in glibc but i32 in musl
    fn personality_changes_and_terminal_injection_are_refused() {
        if missing(PYTHON) {
            return;
        }
        let personality = libc::SYS_personality;
        let (tiocsti, tioclinux) = (libc::TIOCSTI as u64, libc::TIOCLINUX as u64);
        let probes = [
            probe("personality_query", personality, &[PERSONALITY_QUERY]),
            probe("personality_linux", personality, &[PER_LINUX]),
            probe(
                "personality_no_aslr",
                personality,
                &[libc::ADDR_NO_RANDOMIZE as u64],
            ),
            probe("ioctl_tiocsti", libc::SYS_ioctl, &[0, tiocsti, 0]),
            probe(
                "ioctl_tiocsti_upper",
                libc::SYS_ioctl,
                &[0, (1 << 32) | tiocsti, 0],
            ),
            probe("ioctl_tioclinux", libc::SYS_ioctl, &[0, tioclinux, 0]),
            probe(
                "ioctl_fionread",
                libc::SYS_ioctl,
                &[0, libc::FIONREAD as u64, 0],
            ),
        ];
        let seen = outcomes(Some(OFFLINE), &probes);
        assert_eq!(seen["personality_query"], "ok");
        assert_eq!(seen["personality_linux"], "ok");
        assert_eq!(seen["personality_no_aslr"], EPERM);
        assert_eq!(seen["ioctl_tiocsti"], EPERM);
        assert_eq!(seen["ioctl_tiocsti_upper"], EPERM);
        assert_eq!(seen["ioctl_tioclinux"], EPERM);
        assert_ne!(
            seen["ioctl_fionread"], EPERM,
            "other ioctls reach the kernel"
        );
        assert_ne!(
            seen["ioctl_fionread"], ENOSYS,
            "other ioctls reach the kernel"
        );
    }

    const PYTHON_WORK: &str = r#"
import asyncio, concurrent.futures, hashlib, json, multiprocessing, os, socket, subprocess
import tempfile, threading
def square(x):
    return x * x
with multiprocessing.Pool(2) as pool:
    squares = pool.map(square, range(4))
with concurrent.futures.ProcessPoolExecutor(2) as executor:
    cubes = list(executor.map(pow, [2, 3], [3, 3]))
child = subprocess.run(["/bin/echo", "child"], capture_output=True, text=True).stdout.strip()
box = []
worker = threading.Thread(target=box.append, args=(1,))
worker.start()
worker.join()
with tempfile.TemporaryDirectory() as directory:
    path = os.path.join(directory, "f")
    with open(path, "w") as f:
        f.write("data")
    with open(path) as f:
        data = f.read()
left, right = socket.socketpair()
left.send(b"x")
echoed = right.recv(1).decode()
asyncio.run(asyncio.sleep(0))
digest = hashlib.sha256(b"").hexdigest()[:8]
print(json.dumps([squares, cubes, child, box, data, echoed, digest]))
"#;

    #[test]
    fn python_does_real_work_under_the_filter() {
        if missing(PYTHON) {
            return;
        }
        let stdout = stdout_of(&run(Some(OFFLINE), PYTHON, &["-c", PYTHON_WORK]));
        let expected = r#"[[0, 1, 4, 9], [8, 27], "child", [1], "data", "x", "e3b0c442"]"#;
        assert_eq!(stdout.trim(), expected);
    }

    #[test]
    fn bash_pipelines_work_under_the_filter() {
        if missing("/bin/bash") {
            return;
        }
        let script = r#"set -euo pipefail
seq 1 100 | sort -rn | head -3 | tr '\n' ' '; echo
dir=$(mktemp -d); echo hi > "$dir/f"; cp "$dir/f" "$dir/g"; cat "$dir/g"; rm -r "$dir"
(sleep 0.01 &); wait
echo $(( 6 * 7 )) | awk '{ print $1 + 0 }'
grep -E '^Seccomp(_filters)?:' /proc/self/status | tr -s '\t' ' '"#;
        let stdout = stdout_of(&run(Some(OFFLINE), "/bin/bash", &["-c", script]));
        let inherited = "Seccomp: 2\nSeccomp_filters: 2\n";
        assert_eq!(stdout, format!("100 99 98 \nhi\n42\n{inherited}"));
    }

    #[test]
    fn perl_works_under_the_filter() {
        if missing("/usr/bin/perl") {
            return;
        }
        let script = r#"pipe(my $r, my $w) or die;
my $pid = fork() // die;
if ($pid == 0) { close $r; print $w "from child\n"; exit 0 }
close $w; my $line = <$r>; waitpid($pid, 0); print $line;
print join(",", sort { $a <=> $b } (3, 1, 2)), "\n";
print `echo backtick`;"#;
        let stdout = stdout_of(&run(Some(OFFLINE), "/usr/bin/perl", &["-e", script]));
        assert_eq!(stdout, "from child\n1,2,3\nbacktick\n");
    }

    #[test]
    fn node_works_under_the_filter() {
        if missing("/usr/bin/node") {
            return;
        }
        let script = r#"const cp = require("child_process"), fs = require("fs");
const os = require("os"), path = require("path"), wt = require("worker_threads");
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "airlock-"));
fs.writeFileSync(path.join(dir, "f"), "hi");
const text = fs.readFileSync(path.join(dir, "f"), "utf8");
fs.rmSync(dir, { recursive: true });
const child = cp.execFileSync("/bin/echo", ["child"]).toString().trim();
const code = "require('worker_threads').parentPort.postMessage(6 * 7)";
const worker = new wt.Worker(code, { eval: true });
worker.on("message", (answer) => { console.log(text, child, answer); worker.terminate(); });"#;
        let stdout = stdout_of(&run(Some(OFFLINE), "/usr/bin/node", &["-e", script]));
        assert_eq!(stdout, "hi child 42\n");
    }

    #[test]
    fn gcc_compiles_and_runs_a_threaded_program_under_the_filter() {
        if missing("/usr/bin/gcc") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let source = r#"#include <pthread.h>
#include <stdio.h>
static void *work(void *arg) { return arg; }
int main(void) { pthread_t t; void *r; pthread_create(&t, 0, work, "thread"); pthread_join(t, &r);
printf("hi from %s\n", (char *)r); return 0; }"#;
        std::fs::write(dir.path().join("x.c"), source).unwrap();
        let script = format!(
            "cd {} && gcc -O1 -pthread x.c -o x && ./x",
            dir.path().display()
        );
        let stdout = stdout_of(&run(Some(OFFLINE), "/bin/sh", &["-c", &script]));
        assert_eq!(stdout, "hi from thread\n");
    }

    /// The init's order (landlock, no_new_privs, drop capabilities, seccomp last) must leave a
    /// working interpreter: seccomp is installed without any capability left.
    #[test]
    fn full_confinement_sequence_still_runs_python() {
        use crate::sandbox::{caps, landlock};
        if missing(PYTHON) {
            return;
        }
        if landlock::probe_abi() == 0 {
            eprintln!("skipped: landlock is unavailable");
            return;
        }
        let work = tempfile::tempdir().unwrap();
        let rules = landlock::LandlockRules {
            read_exec: ["/usr", "/bin", "/lib", "/lib64", "/etc"]
                .map(Into::into)
                .to_vec(),
            read_write: vec![work.path().to_path_buf(), "/dev/null".into()],
            deny_tcp: true,
            scope_ipc: true,
            ..Default::default()
        };
        let script = format!(
            "import subprocess, threading; open('{}/f', 'w').write('x'); \
             t = threading.Thread(target=print, args=('thread',)); t.start(); t.join(); \
             print(subprocess.run(['/bin/cat', '{}/f'], capture_output=True, text=True).stdout)",
            work.path().display(),
            work.path().display()
        );
        let output = std::thread::spawn(move || {
            landlock::restrict_self(&rules).unwrap();
            caps::set_no_new_privs().unwrap();
            caps::drop_all_capabilities().unwrap();
            install(&OFFLINE).unwrap();
            Command::new(PYTHON).args(["-c", &script]).output().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(stdout_of(&output), "thread\nx\n");
    }

    fn names(groups: &'static [&'static [Syscall]]) -> Vec<&'static str> {
        every(groups).map(|&(name, _)| name).collect()
    }

    #[test]
    fn lists_have_no_duplicates_and_never_overlap() {
        let allowed = names(ALLOWED);
        let refused = names(REFUSED);
        let unique_allowed: HashSet<_> = allowed.iter().collect();
        let unique_refused: HashSet<_> = refused.iter().collect();
        assert_eq!(
            unique_allowed.len(),
            allowed.len(),
            "duplicate in the allowlist"
        );
        assert_eq!(
            unique_refused.len(),
            refused.len(),
            "duplicate in the refusals"
        );
        let overlap: Vec<_> = unique_allowed.intersection(&unique_refused).collect();
        assert!(overlap.is_empty(), "both allowed and refused: {overlap:?}");
        assert!(!unique_allowed.contains(&"SYS_clone3"));
    }

    #[test]
    fn programs_never_kill_on_a_foreign_architecture() {
        for cfg in [OFFLINE, ONLINE] {
            let filters = build_filters(&cfg).unwrap();
            assert_eq!(filters.len(), 2);
            let enosys = u32::from(SeccompAction::Errno(libc::ENOSYS as u32));
            assert_eq!(filters[0][2].k, enosys);
            assert_eq!(filters[1][2].k, u32::from(SeccompAction::Allow));
            for program in &filters {
                let kills = program.iter().filter(|insn| insn.code == 0x06);
                let kills = kills.filter(|insn| insn.k == libc::SECCOMP_RET_KILL_PROCESS);
                assert_eq!(kills.count(), 0);
            }
        }
    }

    /// The table filter answers for every number the way the lists say, and checks the same
    /// architecture token as seccompiler's program.
    #[test]
    fn the_syscall_table_follows_the_lists() {
        let program = syscall_table().compile();
        let arguments = &build_filters(&OFFLINE).unwrap()[1];
        assert_eq!(program[1].k, arguments[1].k, "the same architecture check");
        let allow = u32::from(SeccompAction::Allow);
        let eperm = u32::from(SeccompAction::Errno(libc::EPERM as u32));
        let enosys = u32::from(SeccompAction::Errno(libc::ENOSYS as u32));
        let listed = |groups| -> HashSet<u32> { every(groups).map(|&(_, nr)| nr as u32).collect() };
        let (allowed, refused) = (listed(ALLOWED), listed(REFUSED));
        for nr in (0..1024).chain([0x4000_0000 | 39, u32::MAX]) {
            let want = if allowed.contains(&nr) {
                allow
            } else if refused.contains(&nr) {
                eperm
            } else {
                enosys
            };
            assert_eq!(
                table::tests::evaluate(&program, nr, AUDIT_ARCH),
                want,
                "{nr}"
            );
        }
        let i386 = 0x4000_0003;
        assert_eq!(table::tests::evaluate(&program, 20, i386), enosys);
        assert!(
            program.len() < 300,
            "{} instructions: the table should be a search, not a chain",
            program.len()
        );
    }

    #[test]
    fn config_round_trips_through_json() {
        let json = serde_json::to_string(&ONLINE).unwrap();
        assert_eq!(json, r#"{"allow_network":true}"#);
        assert_eq!(
            serde_json::from_str::<SeccompConfig>(&json).unwrap(),
            ONLINE
        );
    }
}

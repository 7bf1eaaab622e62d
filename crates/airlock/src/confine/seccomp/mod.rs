//! The seccomp policy: an allowlist of what interpreters (python3, node, bash, perl, ruby, the
//! gcc toolchain, coreutils) need, plus explicit refusals for the dangerous calls.
//!
//! Two stacked filters:
//!
//! 1. the *syscall table* (installed first): listed syscalls -> `ALLOW`, refused syscalls ->
//!    `EPERM`, anything else -> `ENOSYS`, found by binary search over ranges of numbers
//!    ([`table`]);
//! 2. the *argument checks* (installed second, [`arguments`]): refused argument patterns of
//!    allowed syscalls (`clone(CLONE_NEWUSER)`, `ioctl(TIOCSTI)`, ...) -> `EPERM`, anything
//!    else (a foreign architecture included) -> `ALLOW`.
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
//! table and ALLOW from the argument checks; seccompiler's arch check (which kills), in a zygote
//! template's own filter, is rewritten to its mismatch action, see [`soften_arch_check`]. The
//! policy and its reasons are documented in `docs/seccomp.md`.

mod arguments;
mod bpf;
mod lists;
mod prebuilt;
#[cfg(test)]
mod seccompiler_oracle;
mod table;

use arguments::{ArgumentChecks, Check, Refusal};
use lists::*;

pub use lists::{IP_SOCKET_TYPES_REFUSED, SETID_BITS};

use seccompiler::{sock_filter, BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The knobs of the policy that differ between sandboxes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SeccompConfig {
    /// Allow sockets of every address family; when false only `AF_UNIX` sockets may be made
    /// (and IP ones with `allow_inet`).
    pub allow_network: bool,
    /// With `allow_network` off: also `AF_INET` and `AF_INET6` stream and datagram sockets,
    /// never raw or packet ones, nor any other family (netlink, packet, vsock). For the egress
    /// gate's sandboxes, whose network namespace holds only loopback and the gate's sockets.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_inet: bool,
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
    #[error("the seccomp argument checks of one syscall outgrew an 8-bit jump")]
    ArgumentChecksTooLong,
    #[error("seccompiler emitted an unexpected architecture check in the {filter} filter")]
    UnexpectedArchCheck { filter: &'static str },
    #[error("failed to install the seccomp {filter} filter: {source}")]
    Install {
        filter: &'static str,
        #[source]
        source: seccompiler::Error,
    },
}

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

/// The two filters in installation order: the syscall table, then the argument checks;
/// the ones compiled ahead when this architecture has them ([`prebuilt`]).
pub fn build_filters(cfg: &SeccompConfig) -> Result<Vec<BpfProgram>, SeccompError> {
    let prebuilt = prebuilt::images(cfg).and_then(|images| {
        images
            .into_iter()
            .map(prebuilt::program)
            .collect::<Option<Vec<_>>>()
    });
    match prebuilt {
        Some(programs) => Ok(programs),
        None => compile_filters(cfg),
    }
}

/// The two filters as the raw `struct sock_filter` arrays a tool reads from a descriptor
/// (bwrap's `--add-seccomp-fd`), in installation order: the prebuilt files as they are, or
/// the compiled programs' bytes.
pub fn filter_images(cfg: &SeccompConfig) -> Result<Vec<Cow<'static, [u8]>>, SeccompError> {
    if let Some(images) = prebuilt::images(cfg) {
        return Ok(prebuilt::borrowed(images));
    }
    let programs = compile_filters(cfg)?;
    Ok(programs
        .iter()
        .map(|program| Cow::Owned(filter_bytes(program)))
        .collect())
}

/// The two filters compiled from the lists.
fn compile_filters(cfg: &SeccompConfig) -> Result<Vec<BpfProgram>, SeccompError> {
    let arguments = argument_checks(cfg)
        .compile()
        .ok_or(SeccompError::ArgumentChecksTooLong)?;
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

/// An interpreter zygote's template's own filter, installed before its interpreter starts:
/// every refused syscall of the policy but the namespace and mount calls (and `sethostname`)
/// its children need to set themselves up, refused with `EPERM`; everything else allowed.
/// Each child installs the full policy ([`install`]) on top before any user code runs.
pub fn install_template_filter() -> Result<(), SeccompError> {
    let child_setup = |syscall: &&Syscall| {
        syscall.1 == libc::SYS_sethostname || REFUSED_NAMESPACES_AND_MOUNTS.contains(*syscall)
    };
    let rules: BTreeMap<i64, Vec<SeccompRule>> = every(REFUSED)
        .filter(|syscall| !child_setup(syscall))
        .map(|&(_, number)| (number, Vec::new()))
        .collect();
    let filter = "template filter";
    let program = compile(
        filter,
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )?;
    seccompiler::apply_filter(&program).map_err(|source| SeccompError::Install { filter, source })
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
/// never-kill rule, so the kill becomes the filter's mismatch action (ALLOW in a zygote
/// template's filter). Returns `None` if the prologue is not the one expected, so a
/// seccompiler upgrade cannot silently change the meaning of the patch.
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

/// The refused argument patterns, per syscall; every syscall here is on the allowlist. The
/// checks compare the low 32 bits: the kernel reads clone's flags, personality, the ioctl
/// request, modes and the socket family as 32-bit values, so garbage in the upper half cannot
/// smuggle a refused value past the filter.
fn argument_checks(cfg: &SeccompConfig) -> ArgumentChecks {
    let mut syscalls: BTreeMap<u32, Vec<Refusal>> = BTreeMap::new();
    let mut refuse = |number: i64, refusals: Vec<Refusal>| {
        syscalls.entry(number as u32).or_default().extend(refusals);
    };
    refuse(libc::SYS_clone, vec![any_bit(0, CLONE_NAMESPACE_FLAGS)]);
    refuse(libc::SYS_personality, vec![personality_refusal()]);
    refuse(libc::SYS_ioctl, ioctl_refusals());
    #[cfg(target_arch = "x86_64")]
    refuse(libc::SYS_mknod, device_node_refusals(1));
    refuse(libc::SYS_mknodat, device_node_refusals(2));
    for &((_, number), mode_arg) in MODE_ARGUMENTS {
        refuse(number, vec![any_bit(mode_arg, &[SETID_BITS])]);
    }
    if !cfg.allow_network {
        let socket_refusals = match cfg.allow_inet {
            true => non_ip_socket_refusals(),
            false => vec![non_unix_socket_refusal()],
        };
        refuse(libc::SYS_socket, socket_refusals);
        refuse(libc::SYS_socketpair, vec![non_unix_socket_refusal()]);
    }
    let action = |action: SeccompAction| u32::from(action);
    ArgumentChecks {
        arch: AUDIT_ARCH,
        syscalls,
        refused: action(SeccompAction::Errno(libc::EPERM as u32)),
        allowed: action(SeccompAction::Allow),
    }
}

/// A 32-bit argument value of the lists. Every constant the lists hold fits (flags, modes,
/// ioctl requests); one that did not would be a wrong rule, so it stops the build of the filter
/// instead of being cut to its low half (the tests compare every answer with seccompiler's).
fn word(value: u64) -> u32 {
    u32::try_from(value).expect("seccomp argument constants fit in 32 bits")
}

/// Any one of `flags` set: one namespace flag of `clone`, the setuid or setgid bit of a mode.
fn any_bit(arg: u8, flags: &[u64]) -> Refusal {
    let bits = flags.iter().fold(0, |bits, &flag| bits | word(flag));
    Refusal(vec![Check::AnyBit { arg, bits }])
}

/// "Neither the query nor PER_LINUX".
fn personality_refusal() -> Refusal {
    Refusal(vec![
        Check::Ne {
            arg: 0,
            value: word(PERSONALITY_QUERY),
        },
        Check::Ne {
            arg: 0,
            value: word(PER_LINUX),
        },
    ])
}

fn ioctl_refusals() -> Vec<Refusal> {
    REFUSED_IOCTLS
        .iter()
        .map(|&request| {
            let value = word(request);
            Refusal(vec![Check::Eq { arg: 1, value }])
        })
        .collect()
}

/// Device nodes, whatever the mount flags and capabilities say: a user-space kernel (gVisor)
/// lets an unprivileged program make them in its own tmpfs. FIFOs and sockets stay allowed.
/// `mode_arg` is the index of the mode argument (1 for mknod, 2 for mknodat).
fn device_node_refusals(mode_arg: u8) -> Vec<Refusal> {
    [libc::S_IFCHR, libc::S_IFBLK]
        .iter()
        .map(|&kind| {
            Refusal(vec![Check::MaskedEq {
                arg: mode_arg,
                mask: libc::S_IFMT,
                value: kind,
            }])
        })
        .collect()
}

/// The calls whose mode argument may not carry the setuid or setgid bit, by name without
/// `SYS_`, with the index of that argument (for policies written with names: OCI, Docker).
pub fn setid_mode_arguments() -> impl Iterator<Item = (&'static str, u8)> {
    MODE_ARGUMENTS
        .iter()
        .map(|&((name, _), index)| (name.strip_prefix("SYS_").unwrap_or(name), index))
}

/// Families other than unix, IPv4 and IPv6 (all checks of a pattern must hold), and IP
/// sockets of a type other than stream or datagram (raw, packet, SCTP's seqpacket, ...).
fn non_ip_socket_refusals() -> Vec<Refusal> {
    let not = |family: libc::c_int| Check::Ne {
        arg: 0,
        value: family as u32,
    };
    let mut refusals = vec![Refusal(vec![
        not(libc::AF_UNIX),
        not(libc::AF_INET),
        not(libc::AF_INET6),
    ])];
    for ip in [libc::AF_INET, libc::AF_INET6] {
        for &kind in IP_SOCKET_TYPES_REFUSED {
            refusals.push(Refusal(vec![
                Check::Eq {
                    arg: 0,
                    value: ip as u32,
                },
                Check::MaskedEq {
                    arg: 1,
                    mask: word(SOCKET_TYPE_MASK),
                    value: kind as u32,
                },
            ]));
        }
    }
    refusals
}

fn non_unix_socket_refusal() -> Refusal {
    Refusal(vec![Check::Ne {
        arg: 0,
        value: libc::AF_UNIX as u32,
    }])
}

#[cfg(test)]
mod tests;

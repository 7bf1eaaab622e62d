//! The argument checks as seccompiler compiled them before `arguments` took over: the same
//! rules, written with seccompiler's types, as an independent oracle the tests compare the
//! compact program with, input by input.

use super::*;
use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition};

/// seccompiler's program for the refused argument patterns of `cfg` (arch check softened).
pub fn program(cfg: &SeccompConfig) -> BpfProgram {
    compile(
        "argument checks",
        argument_rules(cfg).unwrap(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )
    .unwrap()
}

/// The refused argument patterns, per syscall; every syscall here is on the allowlist.
fn argument_rules(cfg: &SeccompConfig) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules = BTreeMap::new();
    rules.insert(libc::SYS_clone, clone_namespace_rules()?);
    rules.insert(libc::SYS_personality, personality_rules()?);
    rules.insert(libc::SYS_ioctl, ioctl_rules()?);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_mknod, device_node_rules(1)?);
    rules.insert(libc::SYS_mknodat, device_node_rules(2)?);
    for &((_, number), mode_arg) in MODE_ARGUMENTS {
        rules
            .entry(number)
            .or_insert_with(Vec::new)
            .extend(setid_mode_rules(mode_arg)?);
    }
    if !cfg.allow_network {
        let socket_rules = match cfg.allow_inet {
            true => non_ip_socket_rules()?,
            false => non_unix_socket_rules()?,
        };
        rules.insert(libc::SYS_socket, socket_rules);
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

/// A mode with the setuid or the setgid bit (one rule per bit: rules are alternatives).
fn setid_mode_rules(mode_arg: u8) -> Result<Vec<SeccompRule>, SeccompError> {
    [libc::S_ISUID, libc::S_ISGID]
        .iter()
        .map(|&bit| {
            let bit = u64::from(bit);
            rule(vec![arg_condition(
                mode_arg,
                SeccompCmpOp::MaskedEq(bit),
                bit,
            )?])
        })
        .collect()
}

/// Families other than unix, IPv4 and IPv6 (all conditions of a rule must hold), and IP
/// sockets of a type other than stream or datagram (raw, packet, SCTP's seqpacket, ...).
fn non_ip_socket_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    let mut rules = vec![rule(vec![
        arg_condition(0, SeccompCmpOp::Ne, libc::AF_UNIX as u64)?,
        arg_condition(0, SeccompCmpOp::Ne, libc::AF_INET as u64)?,
        arg_condition(0, SeccompCmpOp::Ne, libc::AF_INET6 as u64)?,
    ])?];
    for ip in [libc::AF_INET, libc::AF_INET6] {
        for kind in IP_SOCKET_TYPES_REFUSED {
            rules.push(rule(vec![
                arg_condition(0, SeccompCmpOp::Eq, ip as u64)?,
                arg_condition(1, SeccompCmpOp::MaskedEq(SOCKET_TYPE_MASK), *kind as u64)?,
            ])?);
        }
    }
    Ok(rules)
}

fn non_unix_socket_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    let unix = libc::AF_UNIX as u64;
    Ok(vec![rule(vec![arg_condition(0, SeccompCmpOp::Ne, unix)?])?])
}

/// Interesting 32-bit words for the checks: zero, all ones, every single bit, every constant
/// of the lists and its neighbours.
fn interesting_words() -> Vec<u64> {
    let mut words = vec![0, u64::from(u32::MAX), 0xf, 0xfff, 0xf000, 0x7e02_0000];
    words.extend((0..32).map(|bit| 1u64 << bit));
    let constants = CLONE_NAMESPACE_FLAGS
        .iter()
        .chain(REFUSED_IOCTLS)
        .chain(&[PERSONALITY_QUERY, PER_LINUX, SETID_BITS, SOCKET_TYPE_MASK])
        .copied()
        .chain([libc::S_IFCHR, libc::S_IFBLK, libc::S_IFIFO, libc::S_IFSOCK].map(u64::from))
        .chain(
            [
                libc::AF_UNIX,
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
            ]
            .map(|f| f as u64),
        )
        .chain(IP_SOCKET_TYPES_REFUSED.iter().map(|&t| t as u64))
        .chain([libc::SOCK_STREAM, libc::SOCK_DGRAM].map(|t| t as u64));
    for constant in constants {
        words.extend([
            constant,
            constant.wrapping_sub(1) & 0xffff_ffff,
            constant + 1,
        ]);
        words.extend([constant | 0o4000, constant | 0o2000, constant | 0o6755]);
    }
    words
}

/// A xorshift generator: the same "random" inputs on every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The compact argument checks answer exactly as seccompiler's program for the same rules, for
/// every syscall with rules and a few without, on structured and random arguments (upper halves
/// included), and for a foreign architecture.
#[test]
fn the_compact_argument_checks_answer_as_seccompiler_did() {
    use super::bpf::tests::{evaluate, Data};
    let configs = [(false, false), (true, false), (false, true)];
    for (allow_network, allow_inet) in configs {
        let cfg = SeccompConfig {
            allow_network,
            allow_inet,
        };
        let oracle = program(&cfg);
        let compact = build_filters(&cfg).unwrap().remove(1);
        assert!(
            compact.len() * 2 < oracle.len(),
            "{} against {} instructions",
            compact.len(),
            oracle.len()
        );
        let mut numbers: Vec<u32> = argument_checks(&cfg).syscalls.keys().copied().collect();
        numbers.extend([0, 1, 59, 1000, 0x4000_0000 | 56, u32::MAX]);
        let words = interesting_words();
        let (mut state, mut compared) = (0x9e37_79b9_7f4a_7c15u64, 0usize);
        for &nr in &numbers {
            for arch in [AUDIT_ARCH, 0x4000_0003] {
                for arg in 0..6 {
                    for (index, &word) in words.iter().enumerate() {
                        let mut args = [0u64; 6];
                        for other in args.iter_mut() {
                            *other = words[(index * 7 + 3) % words.len()];
                        }
                        args[arg] = word | (next(&mut state) & 0xffff_ffff_0000_0000);
                        let data = Data { nr, arch, args };
                        assert_eq!(
                            evaluate(&compact, &data),
                            evaluate(&oracle, &data),
                            "{nr} {arch:#x} {args:x?}"
                        );
                        let random = Data {
                            nr,
                            arch,
                            args: [0; 6].map(|_: u64| next(&mut state)),
                        };
                        assert_eq!(
                            evaluate(&compact, &random),
                            evaluate(&oracle, &random),
                            "{nr} {:x?}",
                            random.args
                        );
                        compared += 2;
                    }
                }
            }
        }
        assert!(compared > 10_000);
    }
}

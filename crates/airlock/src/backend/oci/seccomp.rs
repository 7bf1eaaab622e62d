//! The OCI seccomp section: airlock's allowlist (ENOSYS for anything unlisted) and refusals
//! (EPERM), as in `confine/seccomp/lists.rs`, expressed as one libseccomp-style profile (the
//! same document is a Docker/podman seccomp profile).

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde_json::{json, Value};

use super::OciSeccomp;
use crate::confine::seccomp::{setid_mode_arguments, SETID_BITS};

pub(super) const ENOSYS: u32 = libc::ENOSYS as u32;
const EPERM: u32 = libc::EPERM as u32;
const EAFNOSUPPORT: u32 = libc::EAFNOSUPPORT as u32;

/// Allowed syscalls that get argument rules instead of a plain allow.
const NARROWED: &[&str] = &[
    "clone",
    "socket",
    "socketpair",
    "personality",
    "mknod",
    "mknodat",
    "open",
    "creat",
    "openat",
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
];

pub(super) fn seccomp_section(cfg: &OciSeccomp) -> Value {
    let lists = seccomp_lists();
    let plain: Vec<&str> = lists
        .allowed
        .iter()
        .map(String::as_str)
        .filter(|name| !NARROWED.contains(name))
        .collect();
    let refused: Vec<&str> = lists.refused.iter().map(String::as_str).collect();
    let mut rules = vec![
        json!({ "names": plain, "action": "SCMP_ACT_ALLOW" }),
        json!({ "names": refused, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM }),
    ];
    rules.extend(clone_rules());
    if cfg.allow_clone3 {
        rules.push(json!({ "names": ["clone3"], "action": "SCMP_ACT_ALLOW" }));
    }
    rules.extend(personality_rules());
    rules.extend(device_node_rules());
    rules.extend(setid_mode_rules());
    rules.extend(socket_rules(cfg));
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": ENOSYS,
        "architectures": architectures(),
        "syscalls": rules,
    })
}

/// airlock's seccomp policy as a Docker/podman seccomp profile (`--security-opt seccomp=FILE`).
/// That format is the OCI section's own field for field (`defaultAction`, `defaultErrnoRet`,
/// `architectures`, `syscalls[].names/action/errnoRet/args[].index/value/valueTwo/op`): the
/// engines parse it into the same structure they later write into the runtime's spec.
pub fn docker_seccomp_profile(cfg: &OciSeccomp) -> Value {
    seccomp_section(cfg)
}

/// `clone` without any namespace flag is allowed; with one it is refused. `clone3` stays
/// unlisted (ENOSYS), so glibc falls back to `clone`, whose flags seccomp can read.
fn clone_rules() -> Vec<Value> {
    let flags = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ]
    .map(|f| f as u64);
    let all = flags.iter().fold(0, |acc, f| acc | f);
    // libseccomp's MASKED_EQ takes the mask in `value` and the expected bits in `valueTwo`.
    let mut rules = vec![json!({ "names": ["clone"], "action": "SCMP_ACT_ALLOW",
        "args": [{ "index": 0, "value": all, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ" }] })];
    rules.extend(flags.iter().map(|flag| {
        json!({ "names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
            "args": [{ "index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ" }] })
    }));
    rules
}

/// Only querying the persona (0xffffffff) or asking for the default (`PER_LINUX`, 0).
fn personality_rules() -> Vec<Value> {
    [0u64, 0xffff_ffff]
        .iter()
        .map(|value| json!({ "names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [{ "index": 0, "value": value, "op": "SCMP_CMP_EQ" }] }))
        .collect()
}

/// mknod of files, FIFOs and sockets only, without the setuid or setgid bit: a device node
/// is refused even where the kernel behind the program would allow it (gVisor's tmpfs does,
/// for an unprivileged program). The rules compare the mode once each and never overlap
/// (libseccomp resolves overlapping rules of different actions by its own tree order).
fn device_node_rules() -> Vec<Value> {
    let file_type = u64::from(libc::S_IFMT);
    let mut rules = Vec::new();
    for (name, index) in setid_mode_arguments().filter(|(name, _)| name.starts_with("mknod")) {
        let mode_is = |mask: u64, value: u64| masked_mode_rule(name, index, mask, value);
        for kind in [0, libc::S_IFREG, libc::S_IFIFO, libc::S_IFSOCK].map(u64::from) {
            rules.push(mode_is(file_type | SETID_BITS, kind));
            rules.extend(setid_variants().map(|bits| mode_is(file_type | SETID_BITS, kind | bits)));
        }
        for kind in [libc::S_IFCHR, libc::S_IFBLK].map(u64::from) {
            rules.push(mode_is(file_type, kind));
        }
    }
    rules
}

/// The other calls that give a file its mode (open, creat, openat, the chmods): allowed
/// without the setuid and setgid bits, refused with either (`confine/seccomp` says why).
fn setid_mode_rules() -> Vec<Value> {
    let mut rules = Vec::new();
    for (name, index) in setid_mode_arguments().filter(|(name, _)| !name.starts_with("mknod")) {
        rules.push(masked_mode_rule(name, index, SETID_BITS, 0));
        rules.extend(setid_variants().map(|bits| masked_mode_rule(name, index, SETID_BITS, bits)));
    }
    rules
}

/// Setuid, setgid, both: the mode bits refused, as three values that never overlap.
fn setid_variants() -> impl Iterator<Item = u64> {
    [
        u64::from(libc::S_ISUID),
        u64::from(libc::S_ISGID),
        SETID_BITS,
    ]
    .into_iter()
}

/// `name` when `mode & mask == value`: refused if the value holds a device type or a setuid
/// or setgid bit, allowed otherwise.
fn masked_mode_rule(name: &str, index: u8, mask: u64, value: u64) -> Value {
    let devices = [libc::S_IFCHR, libc::S_IFBLK].map(u64::from);
    let refused = value & SETID_BITS != 0 || devices.contains(&(value & u64::from(libc::S_IFMT)));
    let args =
        json!([{ "index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ" }]);
    if refused {
        json!({ "names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM, "args": args })
    } else {
        json!({ "names": [name], "action": "SCMP_ACT_ALLOW", "args": args })
    }
}

fn socket_rules(cfg: &OciSeccomp) -> Vec<Value> {
    if cfg.allow_network {
        return vec![json!({ "names": ["socket", "socketpair"], "action": "SCMP_ACT_ALLOW" })];
    }
    let unix = libc::AF_UNIX as u64;
    if cfg.allow_inet {
        return ip_socket_rules();
    }
    vec![
        json!({ "names": ["socket", "socketpair"], "action": "SCMP_ACT_ALLOW", "args": [{ "index": 0, "value": unix, "op": "SCMP_CMP_EQ" }] }),
        json!({ "names": ["socket", "socketpair"], "action": "SCMP_ACT_ERRNO", "errnoRet": EAFNOSUPPORT,
            "args": [{ "index": 0, "value": unix, "op": "SCMP_CMP_NE" }] }),
    ]
}

/// Unix sockets, and IP stream and datagram sockets; every other family is refused with
/// EAFNOSUPPORT and other IP socket types with EPERM. Each rule compares an argument once
/// (libseccomp's rules are conjunctions over distinct arguments), and no two rules overlap.
fn ip_socket_rules() -> Vec<Value> {
    let arg =
        |index: u32, value: u64, op: &str| json!({ "index": index, "value": value, "op": op });
    let type_is = |kind: libc::c_int| json!({ "index": 1, "value": 0xf, "valueTwo": kind as u64, "op": "SCMP_CMP_MASKED_EQ" });
    let unix = libc::AF_UNIX as u64;
    let mut rules = vec![
        json!({ "names": ["socket", "socketpair"], "action": "SCMP_ACT_ALLOW", "args": [arg(0, unix, "SCMP_CMP_EQ")] }),
        json!({ "names": ["socketpair"], "action": "SCMP_ACT_ERRNO", "errnoRet": EAFNOSUPPORT, "args": [arg(0, unix, "SCMP_CMP_NE")] }),
    ];
    for ip in [libc::AF_INET, libc::AF_INET6] {
        for kind in [libc::SOCK_STREAM, libc::SOCK_DGRAM] {
            rules.push(json!({ "names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [arg(0, ip as u64, "SCMP_CMP_EQ"), type_is(kind)] }));
        }
        for &kind in crate::confine::seccomp::IP_SOCKET_TYPES_REFUSED {
            rules.push(json!({ "names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM, "args": [arg(0, ip as u64, "SCMP_CMP_EQ"), type_is(kind)] }));
        }
    }
    // Every family but unix (1), IPv4 (2) and IPv6 (10), one comparison each.
    let other_families =
        (0..libc::AF_INET6 as u64).filter(|f| ![unix, libc::AF_INET as u64].contains(f));
    for family in other_families {
        rules.push(json!({ "names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": EAFNOSUPPORT, "args": [arg(0, family, "SCMP_CMP_EQ")] }));
    }
    rules.push(json!({ "names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": EAFNOSUPPORT, "args": [arg(0, libc::AF_INET6 as u64, "SCMP_CMP_GT")] }));
    rules
}

fn architectures() -> Vec<&'static str> {
    if cfg!(target_arch = "aarch64") {
        vec!["SCMP_ARCH_AARCH64"]
    } else {
        vec!["SCMP_ARCH_X86_64"]
    }
}

/// Syscall names of airlock's seccomp policy.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeccompLists {
    pub allowed: BTreeSet<String>,
    pub refused: BTreeSet<String>,
}

/// The allow and refuse lists of `confine/seccomp/lists.rs`, by name, so the two sandboxes
/// share one policy.
pub fn seccomp_lists() -> &'static SeccompLists {
    static LISTS: OnceLock<SeccompLists> = OnceLock::new();
    LISTS.get_or_init(|| {
        let (allowed, refused) = crate::confine::seccomp::syscall_names();
        let owned = |names: Vec<&str>| names.into_iter().map(str::to_string).collect();
        SeccompLists {
            allowed: owned(allowed),
            refused: owned(refused),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seccomp_lists_come_from_the_native_policy() {
        let lists = seccomp_lists();
        for name in ["read", "execve", "futex", "clone", "openat", "exit_group"] {
            assert!(lists.allowed.contains(name), "{name} should be allowed");
        }
        for name in [
            "mount",
            "unshare",
            "setns",
            "bpf",
            "ptrace",
            "keyctl",
            "kexec_load",
        ] {
            assert!(lists.refused.contains(name), "{name} should be refused");
        }
        assert!(
            lists.allowed.len() > 150,
            "only {} allowed syscalls parsed",
            lists.allowed.len()
        );
        assert!(lists.allowed.is_disjoint(&lists.refused));
        assert!(!lists.allowed.contains("clone3"), "clone3 must stay ENOSYS");
    }

    #[test]
    fn seccomp_section_refuses_namespaces_and_foreign_sockets() {
        let section = seccomp_section(&OciSeccomp {
            allow_network: false,
            allow_inet: false,
            allow_clone3: false,
        });
        assert_eq!(section["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(section["defaultErrnoRet"], ENOSYS);
        let rules = section["syscalls"].as_array().unwrap();
        let plain = rules[0]["names"].as_array().unwrap();
        assert!(!plain.contains(&json!("clone")) && !plain.contains(&json!("socket")));
        let clone_refusals = rules
            .iter()
            .filter(|r| r["names"] == json!(["clone"]) && r["action"] == "SCMP_ACT_ERRNO")
            .count();
        assert_eq!(clone_refusals, 7);
        assert!(rules.iter().any(
            |r| r["names"] == json!(["socket", "socketpair"]) && r["errnoRet"] == EAFNOSUPPORT
        ));
    }
}

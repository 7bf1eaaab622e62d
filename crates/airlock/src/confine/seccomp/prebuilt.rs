//! The policy's filters compiled ahead, as the raw `struct sock_filter` arrays the kernel and
//! bwrap's `--add-seccomp-fd` read, so that a run's process loads them instead of compiling
//! them: every native PID 1 and every bwrap run's child did (sorting the lists into ranges,
//! building the argument checks' map), ~30-50 µs of its CPU on the run's path.
//!
//! One syscall table (the same for every configuration) and one argument-check program per
//! distinct configuration: the network left open, IP sockets only (the egress gate's
//! sandboxes), unix sockets only. `prebuilt_filters_are_the_compiled_ones` (in the tests)
//! compiles each configuration and compares it with these files byte for byte; with
//! `AIRLOCK_WRITE_PREBUILT_SECCOMP=1` it writes them instead (after a change to the lists).
//! Only x86_64 has them; another architecture compiles its filters as before.

use std::borrow::Cow;

use seccompiler::{sock_filter, BpfProgram};

use super::SeccompConfig;

/// Size of one `struct sock_filter`: code (u16), jt, jf (u8), k (u32).
const INSTRUCTION_BYTES: usize = 8;

/// The file each prebuilt program is in, under `prebuilt/<arch>/`.
pub(super) const TABLE: &str = "table.bpf";

/// The argument-check program's file for a configuration. Every knob is named here, so that
/// a knob added to [`SeccompConfig`] cannot be left out of the choice without a compile error.
pub(super) fn arguments_file(cfg: &SeccompConfig) -> &'static str {
    let SeccompConfig {
        allow_network,
        allow_inet,
    } = *cfg;
    match (allow_network, allow_inet) {
        (true, _) => "arguments-network.bpf",
        (false, true) => "arguments-inet.bpf",
        (false, false) => "arguments-unix.bpf",
    }
}

#[cfg(target_arch = "x86_64")]
fn prebuilt(file: &str) -> Option<&'static [u8]> {
    Some(match file {
        TABLE => include_bytes!("prebuilt/x86_64/table.bpf"),
        "arguments-network.bpf" => include_bytes!("prebuilt/x86_64/arguments-network.bpf"),
        "arguments-inet.bpf" => include_bytes!("prebuilt/x86_64/arguments-inet.bpf"),
        "arguments-unix.bpf" => include_bytes!("prebuilt/x86_64/arguments-unix.bpf"),
        _ => return None,
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn prebuilt(_file: &str) -> Option<&'static [u8]> {
    None
}

/// The two programs of `cfg` (syscall table, argument checks) as `sock_filter` arrays, when
/// they were compiled ahead.
pub(super) fn images(cfg: &SeccompConfig) -> Option<[&'static [u8]; 2]> {
    Some([prebuilt(TABLE)?, prebuilt(arguments_file(cfg))?])
}

/// A raw `sock_filter` array back as a program; `None` if its length is not a whole number of
/// instructions.
pub(super) fn program(image: &[u8]) -> Option<BpfProgram> {
    if image.is_empty() || !image.len().is_multiple_of(INSTRUCTION_BYTES) {
        return None;
    }
    let program = image
        .chunks_exact(INSTRUCTION_BYTES)
        .map(|bytes| sock_filter {
            code: u16::from_ne_bytes([bytes[0], bytes[1]]),
            jt: bytes[2],
            jf: bytes[3],
            k: u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        })
        .collect();
    Some(program)
}

/// Borrowed images as the owned-or-borrowed form [`super::filter_images`] returns.
pub(super) fn borrowed(images: [&'static [u8]; 2]) -> Vec<Cow<'static, [u8]>> {
    images.into_iter().map(Cow::Borrowed).collect()
}

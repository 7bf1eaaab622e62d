//! The `airlock` binary is a static PIE on x86_64 glibc (`build.rs` says why): it asks for no
//! program interpreter and names no shared library, so it starts without the dynamic loader,
//! and it keeps what a dynamic PIE has for the host side's safety: a position-independent
//! image (ASLR), relocations applied before `main` and then read-only (full RELRO: `BIND_NOW`
//! and a `GNU_RELRO` segment), and a non-executable stack.

#![cfg(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu"))]

/// `e_type` of a position-independent executable (or shared object).
const ET_DYN: u16 = 3;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const PT_GNU_STACK: u32 = 0x6474_e551;
const PT_GNU_RELRO: u32 = 0x6474_e552;
/// Execute permission in a segment's `p_flags`.
const PF_X: u32 = 1;
const DT_NEEDED: u64 = 1;
const DT_FLAGS: u64 = 30;
const DT_FLAGS_1: u64 = 0x6fff_fffb;
const DF_BIND_NOW: u64 = 8;
const DF_1_NOW: u64 = 1;
const DF_1_PIE: u64 = 0x0800_0000;

/// A program header of an ELF64 little-endian file.
struct Segment {
    kind: u32,
    flags: u32,
    offset: usize,
    size: usize,
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap())
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn airlock_binary() -> Vec<u8> {
    let bytes = std::fs::read(env!("CARGO_BIN_EXE_airlock")).expect("the airlock binary reads");
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(bytes[4], 2, "not a 64-bit ELF file");
    assert_eq!(bytes[5], 1, "not a little-endian ELF file");
    bytes
}

fn segments(elf: &[u8]) -> Vec<Segment> {
    let table = u64_at(elf, 0x20) as usize;
    let entry_size = u16_at(elf, 0x36) as usize;
    let count = u16_at(elf, 0x38) as usize;
    (0..count)
        .map(|i| {
            let header = table + i * entry_size;
            Segment {
                kind: u32_at(elf, header),
                flags: u32_at(elf, header + 4),
                offset: u64_at(elf, header + 8) as usize,
                size: u64_at(elf, header + 0x20) as usize,
            }
        })
        .collect()
}

/// The `(tag, value)` entries of the dynamic section.
fn dynamic_entries(elf: &[u8]) -> Vec<(u64, u64)> {
    let dynamic = segments(elf)
        .into_iter()
        .find(|s| s.kind == PT_DYNAMIC)
        .expect("a PIE has a dynamic section (its relocations)");
    (0..dynamic.size / 16)
        .map(|i| dynamic.offset + i * 16)
        .map(|at| (u64_at(elf, at), u64_at(elf, at + 8)))
        .take_while(|&(tag, _)| tag != 0)
        .collect()
}

fn dynamic_value(elf: &[u8], tag: u64) -> u64 {
    dynamic_entries(elf)
        .into_iter()
        .find(|&(t, _)| t == tag)
        .map_or(0, |(_, value)| value)
}

#[test]
fn airlock_starts_without_the_dynamic_loader() {
    let elf = airlock_binary();
    let interp = segments(&elf).iter().any(|s| s.kind == PT_INTERP);
    assert!(!interp, "airlock asks for a program interpreter (ld.so)");
    let needed = dynamic_entries(&elf)
        .iter()
        .filter(|&&(tag, _)| tag == DT_NEEDED)
        .count();
    assert_eq!(needed, 0, "airlock names {needed} shared libraries");
}

#[test]
fn airlock_is_position_independent() {
    let elf = airlock_binary();
    assert_eq!(u16_at(&elf, 0x10), ET_DYN, "airlock is not a PIE");
    assert_ne!(dynamic_value(&elf, DT_FLAGS_1) & DF_1_PIE, 0, "no DF_1_PIE");
}

#[test]
fn airlock_relocations_become_read_only() {
    let elf = airlock_binary();
    let relro = segments(&elf).iter().any(|s| s.kind == PT_GNU_RELRO);
    assert!(relro, "airlock has no GNU_RELRO segment");
    let bind_now = dynamic_value(&elf, DT_FLAGS) & DF_BIND_NOW != 0
        || dynamic_value(&elf, DT_FLAGS_1) & DF_1_NOW != 0;
    assert!(bind_now, "airlock is not linked with -z now");
}

#[test]
fn airlock_stack_is_not_executable() {
    let elf = airlock_binary();
    let stack = segments(&elf)
        .into_iter()
        .find(|s| s.kind == PT_GNU_STACK)
        .expect("airlock has a GNU_STACK segment");
    assert_eq!(stack.flags & PF_X, 0, "airlock's stack is executable");
}

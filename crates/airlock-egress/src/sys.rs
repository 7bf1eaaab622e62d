//! The gate's only `unsafe` code: the raw calls `rustix` does not offer. bpf(2) (create a map,
//! load a program, attach it, read and write map entries), `TCP_INFO` and `SO_RCVLOWAT`.
//! Each wrapper takes and returns owned, typed values; nothing here keeps a raw pointer past
//! the call that uses it.
//!
//! Written by hand because no well-kept crate loads a BPF program from instructions: `aya`
//! and `libbpf-rs` load ELF objects (built with clang or bpf-linker), and the gate's program
//! is 26 instructions (see `kernel_relay`).
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;

/// The leading fields of `union bpf_attr` for `BPF_MAP_CREATE` (the kernel zero-fills the rest).
#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// `union bpf_attr` for the element commands.
#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to the program's name.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_PROG_ATTACH`.
#[repr(C)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised `repr(C)` prefix of `union bpf_attr` of the size
    // passed; the kernel reads (and for lookups writes through) only the pointers it holds,
    // which the callers keep alive for the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T,
            size_of::<T>() as libc::c_uint,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(result)
}

fn owned_fd(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// Creates a map.
pub(crate) fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
) -> io::Result<OwnedFd> {
    let mut attr = MapCreate {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags,
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned_fd)
}

/// Sets `key` to `value` in the map (`BPF_ANY`).
pub(crate) fn map_update(map: &OwnedFd, key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: key.as_ptr() as u64,
        value: value.as_ptr() as u64,
        flags: 0,
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Reads `key`'s value into `value` (which must be the map's value size).
pub(crate) fn map_lookup(map: &OwnedFd, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: key.as_ptr() as u64,
        value: value.as_mut_ptr() as u64,
        flags: 0,
    };
    bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).map(drop)
}

/// Removes `key` from the map.
pub(crate) fn map_delete(map: &OwnedFd, key: &[u8]) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: key.as_ptr() as u64,
        value: 0,
        flags: 0,
    };
    bpf(BPF_MAP_DELETE_ELEM, &mut attr).map(drop)
}

/// Loads a GPL program of `prog_type` from encoded instructions; on refusal the error carries
/// the verifier's log.
pub(crate) fn prog_load(prog_type: u32, insns: &[u64], name: &str) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut prog_name = [0u8; 16];
    for (slot, byte) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *slot = byte;
    }
    let mut attr = ProgLoad {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name,
    };
    bpf(BPF_PROG_LOAD, &mut attr).map(owned_fd).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        io::Error::new(e.kind(), format!("{e}: {}", text.trim()))
    })
}

/// Attaches a program to a map (a sockmap's stream verdict).
pub(crate) fn prog_attach(map: &OwnedFd, prog: &OwnedFd, attach_type: u32) -> io::Result<()> {
    let mut attr = ProgAttach {
        target_fd: map.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type,
        attach_flags: 0,
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// Bytes a TCP socket has taken to send since it opened (acknowledged, then `SIOCOUTQ`:
/// in flight or not yet sent; read in that order, the sum never over-counts), and whether
/// it can still send (established or close-wait).
pub(crate) fn tcp_send_progress(socket: impl AsFd) -> io::Result<(u64, bool)> {
    const ESTABLISHED: u8 = 1;
    const CLOSE_WAIT: u8 = 8;
    // SAFETY: all-zero is a valid `tcp_info`.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a writable `tcp_info` of `len` bytes.
    let result = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut unacknowledged: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one `c_int` through the pointer.
    let result = unsafe {
        libc::ioctl(
            socket.as_fd().as_raw_fd(),
            libc::TIOCOUTQ,
            &mut unacknowledged as *mut libc::c_int,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    let queued = info.tcpi_bytes_acked + unacknowledged.max(0) as u64;
    let open = matches!(info.tcpi_state, ESTABLISHED | CLOSE_WAIT);
    Ok((queued, open))
}

/// Sets `SO_RCVLOWAT`, which also re-runs the socket's data-ready callback on what is queued.
pub(crate) fn set_rcvlowat(socket: impl AsFd, bytes: i32) -> io::Result<()> {
    // SAFETY: the option value is a live `c_int` of the size passed.
    let result = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&bytes as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

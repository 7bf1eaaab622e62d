//! Experiment (issue 16): an sk_msg program redirecting the client's sendmsg straight to the
//! gate's upstream socket (`bpf_msg_redirect_hash`, egress, in the sender's own context), the
//! best case of that path: the client socket and the upstream socket are put in a sockhash
//! from user space before a byte is sent (in a gated run a cgroup sock_ops program would have
//! to catch the program's socket), and the program redirects every message with no
//! accounting. If even this is not faster than splicing in the gate, the full path is not
//! worth building.
#![allow(unsafe_code)]

use std::io::{self, Read, Write};
use std::mem::size_of;
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::thread;
use std::time::Instant;

use nix::libc;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const MAP_TYPE_SOCKHASH: u32 = 18;
const PROG_TYPE_SK_MSG: u32 = 16;
const ATTACH_SK_MSG_VERDICT: u32 = 7;
const MSG_REDIRECT_HASH: i32 = 71;

#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
}

#[repr(C)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live repr(C) prefix of `union bpf_attr` of the size passed; the
    // pointers it holds stay alive for the call.
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
    // SAFETY: a descriptor the kernel just returned (the commands without one return 0,
    // which the callers forget at once).
    Ok(unsafe { OwnedFd::from_raw_fd(result as i32) })
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst & 0xf) << 8)
        | (u64::from(src & 0xf) << 12)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

/// The sockhash (key 0: the client, key 1: upstream) and the attached sk_msg program.
pub struct Redirect {
    sockets: OwnedFd,
    _program: OwnedFd,
}

impl Redirect {
    pub fn load() -> io::Result<Redirect> {
        let mut create = MapCreate {
            map_type: MAP_TYPE_SOCKHASH,
            key_size: 4,
            value_size: 4,
            max_entries: 16,
            map_flags: 0,
        };
        let sockets = bpf(BPF_MAP_CREATE, &mut create)?;
        // *(u32 *)(r10 - 4) = 1; r2 = sockets; r3 = r10 - 4; r4 = 0;
        // return msg_redirect_hash(ctx, sockets, &1, 0)
        let insns = [
            insn(0x62, 10, 0, -4, 1),
            insn(0x18, 2, 1, 0, sockets.as_raw_fd()),
            0,
            insn(0xbf, 3, 10, 0, 0),
            insn(0x07, 3, 0, 0, -4),
            insn(0xb7, 4, 0, 0, 0),
            insn(0x85, 0, 0, 0, MSG_REDIRECT_HASH),
            insn(0x95, 0, 0, 0, 0),
        ];
        let mut log = vec![0u8; 16 * 1024];
        let mut load = ProgLoad {
            prog_type: PROG_TYPE_SK_MSG,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: c"GPL".as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
        };
        let program = bpf(BPF_PROG_LOAD, &mut load).map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(0);
            io::Error::other(format!("{e}: {}", String::from_utf8_lossy(&log[..end])))
        })?;
        let mut attach = ProgAttach {
            target_fd: sockets.as_raw_fd() as u32,
            attach_bpf_fd: program.as_raw_fd() as u32,
            attach_type: ATTACH_SK_MSG_VERDICT,
            attach_flags: 0,
        };
        std::mem::forget(bpf(BPF_PROG_ATTACH, &mut attach)?);
        Ok(Redirect {
            sockets,
            _program: program,
        })
    }

    fn insert(&self, key: u32, socket: &TcpStream) -> io::Result<()> {
        let fd = socket.as_raw_fd() as u32;
        let mut update = MapElem {
            map_fd: self.sockets.as_raw_fd() as u32,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: &fd as *const u32 as u64,
            flags: 0,
        };
        std::mem::forget(bpf(BPF_MAP_UPDATE_ELEM, &mut update)?);
        Ok(())
    }
}

/// Bytes per second sending `bytes` to the bench's server through a relay whose upload
/// direction is the sk_msg redirect (the answer comes back through a plain copy).
pub fn bulk(redirect: &Redirect, server_port: u16, bytes: u64) -> io::Result<f64> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let mut client = TcpStream::connect(listener.local_addr()?)?;
    let (accepted, _) = listener.accept()?;
    let upstream = TcpStream::connect((Ipv4Addr::LOCALHOST, server_port))?;
    redirect.insert(1, &upstream)?;
    redirect.insert(0, &client)?;
    let (mut answer_from, mut answer_to) = (upstream.try_clone()?, accepted.try_clone()?);
    let answers = thread::spawn(move || {
        // A socket in a sockhash may end a blocking read with EAGAIN when woken by its
        // own send side (the redirected pushes): read again.
        let mut buffer = [0u8; 4096];
        loop {
            match answer_from.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    if answer_to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = answer_to.shutdown(Shutdown::Write);
    });
    // The gate's own relay stays in place for what is not redirected (nothing, here).
    let (mut leftover_from, mut leftover_to) = (accepted, upstream);
    let leftovers = thread::spawn(move || io::copy(&mut leftover_from, &mut leftover_to));
    let chunk = vec![7u8; 1 << 20];
    let start = Instant::now();
    client.write_all(&bytes.to_be_bytes())?;
    for _ in 0..(bytes >> 20) {
        client.write_all(&chunk)?;
    }
    let mut done = [0u8; 1];
    client.read_exact(&mut done)?;
    let rate = bytes as f64 / start.elapsed().as_secs_f64();
    drop(client);
    let leftover = leftovers.join().map_err(|_| io::Error::other("relay"))??;
    let _ = answers.join();
    if leftover != 0 {
        return Err(io::Error::other(format!(
            "{leftover} bytes were not redirected"
        )));
    }
    Ok(rate)
}

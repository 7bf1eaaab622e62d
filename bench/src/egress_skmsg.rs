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
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const MAP_TYPE_SOCKHASH: u32 = 18;
const PROG_TYPE_SK_MSG: u32 = 16;
const ATTACH_SK_MSG_VERDICT: u32 = 7;
const MSG_REDIRECT_HASH: i32 = 71;
const MAP_TYPE_ARRAY: u32 = 2;
const PROG_TYPE_SOCK_OPS: u32 = 13;
const ATTACH_CGROUP_SOCK_OPS: u32 = 3;
const MAP_LOOKUP_ELEM: i32 = 1;
const SOCK_HASH_UPDATE: i32 = 70;

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

fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
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
    Ok(result)
}

/// A command that returns a new descriptor (map create, program load).
fn bpf_fd<T>(command: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf(command, attr)?;
    // SAFETY: a descriptor the kernel just returned; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
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
        let sockets = map_create(MAP_TYPE_SOCKHASH, 4, 4, 16)?;
        // *(u32 *)(r10 - 4) = 1; return msg_redirect_hash(ctx, sockets, r10 - 4, 0)
        let mut insns = vec![insn(0x62, 10, 0, -4, 1)];
        insns.extend(load_map(2, &sockets));
        insns.extend([
            insn(0xbf, 3, 10, 0, 0),
            insn(0x07, 3, 0, 0, -4),
            insn(0xb7, 4, 0, 0, 0),
            insn(0x85, 0, 0, 0, MSG_REDIRECT_HASH),
            insn(0x95, 0, 0, 0, 0),
        ]);
        let program = prog_load(PROG_TYPE_SK_MSG, &insns)?;
        prog_attach(&sockets, &program, ATTACH_SK_MSG_VERDICT)?;
        Ok(Redirect {
            sockets,
            _program: program,
        })
    }

    fn insert(&self, key: u32, socket: &TcpStream) -> io::Result<()> {
        map_update(
            &self.sockets,
            key,
            &(socket.as_raw_fd() as u32).to_ne_bytes(),
        )
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
    let answers = answer_relay(upstream.try_clone()?, accepted.try_clone()?);
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

fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
) -> io::Result<OwnedFd> {
    let mut create = MapCreate {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags: 0,
    };
    bpf_fd(BPF_MAP_CREATE, &mut create)
}

fn map_update(map: &OwnedFd, key: u32, value: &[u8]) -> io::Result<()> {
    map_element(BPF_MAP_UPDATE_ELEM, map, key, value.as_ptr() as u64)
}

fn map_lookup(map: &OwnedFd, key: u32, value: &mut [u8]) -> io::Result<()> {
    map_element(BPF_MAP_LOOKUP_ELEM, map, key, value.as_mut_ptr() as u64)
}

/// An element command on `key`, whose value the kernel reads or writes at `value` (a buffer
/// of the map's value size the caller keeps alive).
fn map_element(command: libc::c_long, map: &OwnedFd, key: u32, value: u64) -> io::Result<()> {
    let mut element = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value,
        flags: 0,
    };
    bpf(command, &mut element).map(drop)
}

fn prog_load(prog_type: u32, insns: &[u64]) -> io::Result<OwnedFd> {
    let mut log = vec![0u8; 64 * 1024];
    let mut load = ProgLoad {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: c"GPL".as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
    };
    bpf_fd(BPF_PROG_LOAD, &mut load).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(0);
        io::Error::other(format!("{e}: {}", String::from_utf8_lossy(&log[..end])))
    })
}

fn prog_attach(target: &impl AsRawFd, program: &OwnedFd, attach_type: u32) -> io::Result<()> {
    let mut attach = ProgAttach {
        target_fd: target.as_raw_fd() as u32,
        attach_bpf_fd: program.as_raw_fd() as u32,
        attach_type,
        attach_flags: 0,
    };
    bpf(BPF_PROG_ATTACH, &mut attach).map(drop)
}

fn load_map(dst: u8, map: &OwnedFd) -> [u64; 2] {
    [insn(0x18, dst, 1, 0, map.as_raw_fd()), 0]
}

/// The full mechanism, as a gated run would use it: a cgroup (v2) sock_ops program puts the
/// client's socket in the sockhash when it connects (key 0); the relay adds its upstream
/// socket (key 1) once its checks are done and arms the redirect; the sk_msg program starts
/// redirecting only when every byte the client sent before is relayed (`passed ==
/// relayed`: no reordering), and only while the bytes it moved stay within the lease
/// (a byte cap); past the lease, or when the redirect fails, messages take the relay's path
/// for good.
pub struct Mechanism {
    sockets: OwnedFd,
    /// Key 0, the relay's: lease, relayed, armed. Key 1, the program's: moved, passed, state.
    state: OwnedFd,
    _programs: [OwnedFd; 2],
    cgroup: std::path::PathBuf,
}

impl Mechanism {
    pub fn load() -> io::Result<Mechanism> {
        let sockets = map_create(MAP_TYPE_SOCKHASH, 4, 4, 16)?;
        let state = map_create(MAP_TYPE_ARRAY, 4, 24, 2)?;
        let verdict = prog_load(PROG_TYPE_SK_MSG, &verdict_program(&sockets, &state))?;
        prog_attach(&sockets, &verdict, ATTACH_SK_MSG_VERDICT)?;
        let catcher = prog_load(PROG_TYPE_SOCK_OPS, &catch_program(&sockets))?;
        let cgroup = cgroup2_root()?.join(format!("airlock-bench-skmsg-{}", std::process::id()));
        std::fs::create_dir(&cgroup)?;
        let dir = std::fs::File::open(&cgroup)?;
        if let Err(e) = prog_attach(&dir, &catcher, ATTACH_CGROUP_SOCK_OPS) {
            let _ = std::fs::remove_dir(&cgroup);
            return Err(e);
        }
        Ok(Mechanism {
            sockets,
            state,
            _programs: [verdict, catcher],
            cgroup,
        })
    }

    fn set_relay(&self, lease: u64, relayed: u64, armed: bool) -> io::Result<()> {
        let mut value = [0u8; 24];
        value[..8].copy_from_slice(&lease.to_ne_bytes());
        value[8..16].copy_from_slice(&relayed.to_ne_bytes());
        value[16..].copy_from_slice(&u64::from(armed).to_ne_bytes());
        map_update(&self.state, 0, &value)
    }

    /// The program's counters: bytes redirected, bytes passed to the relay, state
    /// (0 waiting, 1 redirecting, 2 spilled).
    fn program_counters(&self) -> io::Result<[u64; 3]> {
        let mut value = [0u8; 24];
        map_lookup(&self.state, 1, &mut value)?;
        let word = |i: usize| u64::from_ne_bytes(value[i * 8..i * 8 + 8].try_into().unwrap());
        Ok([word(0), word(1), word(2)])
    }
}

impl Drop for Mechanism {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

fn cgroup2_root() -> io::Result<std::path::PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| std::path::PathBuf::from(f[1]))
        .ok_or_else(|| io::Error::other("no cgroup2 mount"))
}

/// sock_ops: on an active connection's establishment, the socket goes into the sockhash at key 0.
fn catch_program(sockets: &OwnedFd) -> Vec<u64> {
    const ACTIVE_ESTABLISHED: i32 = 4;
    let mut insns = vec![
        insn(0xbf, 6, 1, 0, 0),                  // r6 = ctx
        insn(0x61, 2, 6, 0, 0),                  // r2 = ctx->op
        insn(0x55, 2, 0, 8, ACTIVE_ESTABLISHED), // if r2 != 4 goto out
        insn(0x62, 10, 0, -4, 0),                // *(u32 *)(r10 - 4) = 0
        insn(0xbf, 1, 6, 0, 0),                  // r1 = ctx
    ];
    insns.extend(load_map(2, sockets));
    insns.extend([
        insn(0xbf, 3, 10, 0, 0), // r3 = r10
        insn(0x07, 3, 0, 0, -4), // r3 -= 4
        insn(0xb7, 4, 0, 0, 0),  // r4 = BPF_ANY
        insn(0x85, 0, 0, 0, SOCK_HASH_UPDATE),
        insn(0xb7, 0, 0, 0, 1), // out: r0 = 1
        insn(0x95, 0, 0, 0, 0),
    ]);
    insns
}

/// sk_msg verdict with the ordering and lease rules (see [`Mechanism`]).
fn verdict_program(sockets: &OwnedFd, state: &OwnedFd) -> Vec<u64> {
    const SIZE: i16 = 68; // sk_msg_md.size
                          // Jumps are written with a label number in `off` and patched at the end.
    const PLAIN: i16 = 1;
    const REDIRECT: i16 = 2;
    const SPILL: i16 = 3;
    const COUNT: i16 = 4;
    let mut p: Vec<u64> = Vec::new();
    let mut jumps: Vec<(usize, i16)> = Vec::new();
    let mut labels = [0usize; 5];
    let mut jump = |p: &mut Vec<u64>, code: u8, dst: u8, src: u8, imm: i32, label: i16| {
        jumps.push((p.len(), label));
        p.push(insn(code, dst, src, 0, imm));
    };
    p.extend([insn(0xbf, 6, 1, 0, 0), insn(0x62, 10, 0, -4, 0)]); // r6 = ctx; key 0
    p.extend(load_map(1, state));
    p.extend([
        insn(0xbf, 2, 10, 0, 0),
        insn(0x07, 2, 0, 0, -4),
        insn(0x85, 0, 0, 0, MAP_LOOKUP_ELEM),
    ]);
    jump(&mut p, 0x15, 0, 0, 0, PLAIN); // no relay entry
    p.extend([insn(0xbf, 7, 0, 0, 0), insn(0x62, 10, 0, -8, 1)]); // r7 = relay's; key 1
    p.extend(load_map(1, state));
    p.extend([
        insn(0xbf, 2, 10, 0, 0),
        insn(0x07, 2, 0, 0, -8),
        insn(0x85, 0, 0, 0, MAP_LOOKUP_ELEM),
    ]);
    jump(&mut p, 0x15, 0, 0, 0, PLAIN);
    p.extend([
        insn(0xbf, 8, 0, 0, 0),    // r8 = program's entry
        insn(0x61, 9, 6, SIZE, 0), // r9 = msg->size
        insn(0x79, 1, 8, 16, 0),   // r1 = state
    ]);
    jump(&mut p, 0x15, 1, 0, 1, REDIRECT); // redirecting
    jump(&mut p, 0x55, 1, 0, 0, COUNT); // spilled
    p.push(insn(0x79, 1, 7, 16, 0)); // r1 = armed
    jump(&mut p, 0x15, 1, 0, 0, COUNT);
    p.extend([insn(0x79, 1, 8, 8, 0), insn(0x79, 2, 7, 8, 0)]); // passed, relayed
    jump(&mut p, 0x5d, 1, 2, 0, COUNT); // bytes still on the relay's path
    p.push(insn(0x7a, 8, 0, 16, 1)); // state = redirecting
    labels[REDIRECT as usize] = p.len();
    p.extend([
        insn(0x79, 1, 8, 0, 0), // r1 = moved + size
        insn(0x0f, 1, 9, 0, 0),
        insn(0x79, 2, 7, 0, 0), // r2 = lease
    ]);
    jump(&mut p, 0x2d, 1, 2, 0, SPILL);
    p.extend([
        insn(0x7b, 8, 1, 0, 0),    // moved = r1
        insn(0x62, 10, 0, -12, 1), // key 1: upstream
        insn(0xbf, 1, 6, 0, 0),
    ]);
    p.extend(load_map(2, sockets));
    p.extend([
        insn(0xbf, 3, 10, 0, 0),
        insn(0x07, 3, 0, 0, -12),
        insn(0xb7, 4, 0, 0, 0),
        insn(0x85, 0, 0, 0, MSG_REDIRECT_HASH),
        insn(0x55, 0, 0, 1, 1), // if r0 != SK_PASS skip the exit
        insn(0x95, 0, 0, 0, 0), // redirected
        insn(0x79, 1, 8, 0, 0), // the redirect failed: moved -= size
        insn(0x1f, 1, 9, 0, 0),
        insn(0x7b, 8, 1, 0, 0),
    ]);
    labels[SPILL as usize] = p.len();
    p.push(insn(0x7a, 8, 0, 16, 2)); // state = spilled, for good
    labels[COUNT as usize] = p.len();
    p.extend([
        insn(0x79, 1, 8, 8, 0), // passed += size
        insn(0x0f, 1, 9, 0, 0),
        insn(0x7b, 8, 1, 8, 0),
    ]);
    labels[PLAIN as usize] = p.len();
    p.extend([insn(0xb7, 0, 0, 0, 1), insn(0x95, 0, 0, 0, 0)]); // SK_PASS
    for (at, label) in jumps {
        let off = (labels[label as usize] - at - 1) as u16;
        p[at] = (p[at] & !(0xffff << 16)) | (u64::from(off) << 16);
    }
    p
}

/// A client (Python, in the mechanism's cgroup, so that the sock_ops program sees its socket)
/// sending `bytes` to the server through a relay using the mechanism; the client's own rate
/// and the program's counters (moved, passed, state) and what the relay moved.
pub fn mechanism_bulk(
    mechanism: &Mechanism,
    server_port: u16,
    bytes: u64,
    lease: u64,
) -> io::Result<(f64, [u64; 3], u64)> {
    mechanism.set_relay(0, 0, false)?;
    map_update(&mechanism.state, 1, &[0u8; 24])?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let port = listener.local_addr()?.port();
    let client = python_client(&mechanism.cgroup, port, bytes, true)?;
    let (accepted, _) = listener.accept()?;
    let upstream = TcpStream::connect((Ipv4Addr::LOCALHOST, server_port))?;
    map_update(
        &mechanism.sockets,
        1,
        &(upstream.as_raw_fd() as u32).to_ne_bytes(),
    )?;
    mechanism.set_relay(lease, 0, true)?;
    let answers = answer_relay(upstream.try_clone()?, accepted.try_clone()?);
    (&accepted).write_all(b"g")?; // the "handshake" the client waits for
    let relayed = relay_counting(mechanism, accepted, upstream, lease)?;
    let rate = client_rate(client)?;
    let _ = answers.join();
    Ok((rate, mechanism.program_counters()?, relayed))
}

/// The same Python client straight to the server.
pub fn python_direct(server_port: u16, bytes: u64) -> io::Result<f64> {
    client_rate(python_client(
        std::path::Path::new(""),
        server_port,
        bytes,
        false,
    )?)
}

fn python_client(
    cgroup: &std::path::Path,
    port: u16,
    bytes: u64,
    handshake: bool,
) -> io::Result<std::process::Child> {
    const CLIENT: &str = r#"
import socket, sys, time
port, n, handshake = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
s = socket.create_connection(("127.0.0.1", port))
if handshake:
    s.recv(1)
chunk = b"\x07" * (1 << 20)
start = time.perf_counter()
s.sendall(n.to_bytes(8, "big"))
for _ in range(n >> 20):
    s.sendall(chunk)
assert s.recv(1) == b"\x01"
print(n / (time.perf_counter() - start))
"#;
    let enter = if cgroup.as_os_str().is_empty() {
        String::new()
    } else {
        format!("echo $$ > {}/cgroup.procs && ", cgroup.display())
    };
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{enter}exec /usr/bin/python3 -c \"$0\" \"$@\""))
        .args([CLIENT, &port.to_string(), &bytes.to_string()])
        .arg(if handshake { "1" } else { "0" })
        .stdout(std::process::Stdio::piped())
        .spawn()
}

fn client_rate(client: std::process::Child) -> io::Result<f64> {
    let out = client.wait_with_output()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| io::Error::other(format!("the client failed ({})", out.status)))
}

/// Copies the server's answers back to the client. A socket in a sockhash may end a blocking
/// read with EAGAIN when woken by its own send side (the redirected pushes): it reads again.
fn answer_relay(mut from: TcpStream, mut to: TcpStream) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        loop {
            match from.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) if to.write_all(&buffer[..n]).is_ok() => {}
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    })
}

/// The relay's own path (what was not redirected), telling the program after each chunk
/// how much it relayed; returns the bytes it moved.
fn relay_counting(
    mechanism: &Mechanism,
    mut from: TcpStream,
    mut to: TcpStream,
    lease: u64,
) -> io::Result<u64> {
    let mut buffer = vec![0u8; 1 << 20];
    let mut relayed = 0u64;
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buffer[..n])?;
        relayed += n as u64;
        mechanism.set_relay(lease, relayed, true)?;
    }
    let _ = to.shutdown(Shutdown::Write);
    Ok(relayed)
}

/// A round whose lease is smaller than the upload: the program must stop redirecting at the
/// lease and the relay carry the rest, in order, nothing lost or counted twice.
pub fn capped_round(
    mechanism: &Mechanism,
    server_port: u16,
    bytes: u64,
    lease: u64,
) -> io::Result<String> {
    let (_, [moved, passed, state], relayed) =
        mechanism_bulk(mechanism, server_port, bytes, lease)?;
    let whole = bytes + 8;
    // The program's `passed` may count a message twice (one whose push the kernel retried):
    // an upper bound, which only ever delays a redirect.
    let held = moved <= lease && moved + relayed == whole && passed >= relayed && state == 2;
    Ok(format!(
        "lease {lease}: moved {moved}, relayed {relayed} (program passed {passed}, state {state}) of {whole} ({})",
        if held { "the cap held" } else { "THE CAP DID NOT HOLD" }
    ))
}

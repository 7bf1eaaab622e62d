//! In-kernel forwarding for streams whose later bytes need no inspection (raw TCP, TLS past
//! its hellos, WebSocket past its 101). Both sockets go into a BPF sockhash whose stream
//! verdict program redirects each socket's data straight to its peer's send queue: the payload
//! never wakes the gate.
//!
//! Byte caps hold exactly. Each direction leases part of the run's remaining budget from the
//! [`Meter`] (half of it: other connections keep the rest); the program counts the bytes it
//! redirects against the lease, and the first chunk that would cross it, and every chunk after
//! it, is handed to the gate instead (in order: once spilled, a direction never goes back to
//! the kernel). The gate relays spilled bytes through the meter as before, granting exactly
//! up to the cap, and gives the unspent lease back when the stream ends. A direction whose
//! lease is spent while other connections hold theirs may be cut before the run's total
//! reaches the cap, never after.
//!
//! The gate still learns how each direction ends: its thread blocks reading the source, which
//! yields spilled bytes or the end. On a clean end it waits until the destination socket has
//! taken every byte the kernel redirected (`TCP_INFO`) before passing the close on.
//!
//! Needs CAP_BPF and CAP_NET_ADMIN; without them (or when the kernel refuses the program, or
//! the maps are full) streams are spliced as before. The record's `relay` says which was used.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use rustix::net::sockopt::socket_cookie;

use crate::meter::{Direction, Meter};
use crate::sys;

const MAP_TYPE_HASH: u32 = 1;
const MAP_TYPE_SOCKHASH: u32 = 18;
const MAP_NO_PREALLOC: u32 = 1;
const PROG_TYPE_SK_SKB: u32 = 14;
const ATTACH_SK_SKB_STREAM_VERDICT: u32 = 5;
/// Sockets in the process's sockhash at most (two per offloaded connection).
const MAX_SOCKETS: u32 = 16 * 1024;
/// How often a forwarded direction's lease is checked for being spent.
const SPILL_CHECK: Duration = Duration::from_millis(20);
/// How long the gate waits for a destination socket that takes no redirected byte.
const DRAIN_STALL: Duration = Duration::from_secs(5);

/// Whether streams may be forwarded in the kernel (on unless turned off).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns in-kernel forwarding on or off for the process's gates (streams that start
/// afterwards): off, every stream is spliced. For comparisons (`airlock-bench`) and for hosts
/// whose operators want no BPF program loaded.
pub fn set_kernel_forwarding(enabled: bool) {
    ENABLED.store(enabled, Ordering::Release);
}

/// The process's sockhash, its per-socket state and the attached program.
struct Forwarder {
    sockets: OwnedFd,
    peers: OwnedFd,
    _program: OwnedFd,
}

/// One socket's entry in `peers`: where its data goes, the lease, and what was redirected.
/// The program sets `lease` to 0 when a chunk would cross it (every later chunk spills too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct PeerEntry {
    peer: u64,
    lease: u64,
    moved: u64,
}

impl PeerEntry {
    fn encode(self) -> [u8; 24] {
        let mut bytes = [0u8; 24];
        bytes[..8].copy_from_slice(&self.peer.to_ne_bytes());
        bytes[8..16].copy_from_slice(&self.lease.to_ne_bytes());
        bytes[16..].copy_from_slice(&self.moved.to_ne_bytes());
        bytes
    }

    fn decode(bytes: &[u8; 24]) -> PeerEntry {
        let word = |i: usize| u64::from_ne_bytes(bytes[i..i + 8].try_into().unwrap_or_default());
        PeerEntry {
            peer: word(0),
            lease: word(8),
            moved: word(16),
        }
    }
}

/// The forwarder, set up at the first offload; `None` when the kernel refuses it (the reason
/// is kept for the report's detail).
fn forwarder() -> Result<&'static Forwarder, &'static str> {
    static FORWARDER: OnceLock<Result<Forwarder, String>> = OnceLock::new();
    FORWARDER
        .get_or_init(|| Forwarder::load().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(String::as_str)
}

impl Forwarder {
    fn load() -> io::Result<Forwarder> {
        let sockets = sys::map_create(MAP_TYPE_SOCKHASH, 8, 4, MAX_SOCKETS, 0)?;
        let peers = sys::map_create(MAP_TYPE_HASH, 8, 24, MAX_SOCKETS, MAP_NO_PREALLOC)?;
        let program = sys::prog_load(
            PROG_TYPE_SK_SKB,
            &verdict_program(peers.as_raw_fd(), sockets.as_raw_fd()),
            "airlock_relay",
        )?;
        sys::prog_attach(&sockets, &program, ATTACH_SK_SKB_STREAM_VERDICT)?;
        Ok(Forwarder {
            sockets,
            peers,
            _program: program,
        })
    }
}

/// The stream verdict program, in BPF instructions:
///
/// ```text
///  r6 = ctx; key = get_socket_cookie(ctx)
///  entry = peers[key]; if !entry: return SK_PASS           (not offloaded: to the gate)
///  total = entry.moved + skb.len
///  if total > entry.lease: entry.lease = 0; return SK_PASS (spill, in order, for good)
///  entry.moved = total
///  return sk_redirect_hash(ctx, sockets, &entry.peer, 0)   (the peer's send queue)
/// ```
fn verdict_program(peers: i32, sockets: i32) -> Vec<u64> {
    const GET_SOCKET_COOKIE: i32 = 46;
    const MAP_LOOKUP_ELEM: i32 = 1;
    const SK_REDIRECT_HASH: i32 = 72;
    const SK_PASS: i32 = 1;
    let mut insns = vec![
        mov_reg(6, 1),
        call(GET_SOCKET_COOKIE),
        insn(0x7b, 10, 0, -8, 0), // *(u64 *)(r10 - 8) = r0
    ];
    insns.extend(load_map_fd(1, peers));
    insns.extend([
        mov_reg(2, 10),
        insn(0x07, 2, 0, 0, -8), // r2 += -8
        call(MAP_LOOKUP_ELEM),
        insn(0x15, 0, 0, 15, 0), // if r0 == 0 goto pass
        mov_reg(7, 0),
        insn(0x61, 1, 6, 0, 0),  // r1 = skb->len (u32)
        insn(0x79, 2, 7, 16, 0), // r2 = entry.moved
        insn(0x0f, 2, 1, 0, 0),  // r2 += r1
        insn(0x79, 3, 7, 8, 0),  // r3 = entry.lease
        insn(0x2d, 2, 3, 8, 0),  // if r2 > r3 goto spill
        insn(0x7b, 7, 2, 16, 0), // entry.moved = r2
        mov_reg(1, 6),
    ]);
    insns.extend(load_map_fd(2, sockets));
    insns.extend([
        mov_reg(3, 7),
        insn(0xb7, 4, 0, 0, 0), // r4 = 0: the peer's egress
        call(SK_REDIRECT_HASH),
        insn(0x95, 0, 0, 0, 0),       // exit
        insn(0x7a, 7, 0, 8, 0),       // spill: entry.lease = 0
        insn(0xb7, 0, 0, 0, SK_PASS), // pass: r0 = SK_PASS
        insn(0x95, 0, 0, 0, 0),       // exit
    ]);
    insns
}

/// One instruction: opcode, destination and source registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst & 0xf) << 8)
        | (u64::from(src & 0xf) << 12)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

fn mov_reg(dst: u8, src: u8) -> u64 {
    insn(0xbf, dst, src, 0, 0)
}

fn call(helper: i32) -> u64 {
    insn(0x85, 0, 0, 0, helper)
}

/// `dst = map` (a 64-bit load the kernel rewrites from the map's descriptor).
fn load_map_fd(dst: u8, map: i32) -> [u64; 2] {
    const PSEUDO_MAP_FD: u8 = 1;
    [insn(0x18, dst, PSEUDO_MAP_FD, 0, map), 0]
}

/// A connection handed to the kernel; [`Offload::finish`] takes it back.
pub(crate) struct Offload<'a> {
    forwarder: &'static Forwarder,
    meter: &'a Meter,
    client: u64,
    upstream: u64,
    /// The leases taken from the meter and not yet given back (out, in).
    leases: [AtomicU64; 2],
    /// Bytes each destination socket had taken before the offload (out: upstream, in: client).
    queued_before: [u64; 2],
}

/// What the kernel moved, per direction.
pub(crate) struct KernelMoved {
    pub(crate) bytes_out: u64,
    pub(crate) bytes_in: u64,
}

impl<'a> Offload<'a> {
    /// Hands both sockets to the kernel with a lease each way; `Err` with the reason when
    /// the kernel refuses (nothing is left in the maps then, and the caller splices).
    pub(crate) fn begin(
        meter: &'a Meter,
        client: &TcpStream,
        upstream: &TcpStream,
    ) -> Result<Offload<'a>, String> {
        if !ENABLED.load(Ordering::Acquire) {
            return Err("in-kernel forwarding is turned off".into());
        }
        let forwarder = forwarder()?;
        let cookie = |s: &TcpStream| socket_cookie(s).map_err(|e| e.to_string());
        let mut offload = Offload {
            forwarder,
            meter,
            client: cookie(client)?,
            upstream: cookie(upstream)?,
            leases: [AtomicU64::new(0), AtomicU64::new(0)],
            queued_before: [0; 2],
        };
        offload.queued_before = [
            sys::tcp_send_progress(upstream)
                .map_err(|e| e.to_string())?
                .0,
            sys::tcp_send_progress(client).map_err(|e| e.to_string())?.0,
        ];
        for direction in [Direction::Out, Direction::In] {
            offload.leases[index(direction)].store(meter.lease(direction), Ordering::Release);
        }
        if let Err(e) = offload.insert(client, upstream) {
            offload.remove();
            offload.give_back(Direction::Out, 0);
            offload.give_back(Direction::In, 0);
            return Err(e.to_string());
        }
        // Bytes that arrived before the insert wait for the next arrival's data-ready call;
        // this runs it now, so a client that already sent everything is not left waiting.
        let _ = sys::set_rcvlowat(client, 1);
        let _ = sys::set_rcvlowat(upstream, 1);
        Ok(offload)
    }

    fn insert(&self, client: &TcpStream, upstream: &TcpStream) -> io::Result<()> {
        let f = self.forwarder;
        let lease = |direction| self.leases[index(direction)].load(Ordering::Acquire);
        let (lease_out, lease_in) = (lease(Direction::Out), lease(Direction::In));
        let entry = |peer, lease| PeerEntry {
            peer,
            lease,
            moved: 0,
        };
        sys::map_update(
            &f.peers,
            &self.client.to_ne_bytes(),
            &entry(self.upstream, lease_out).encode(),
        )?;
        sys::map_update(
            &f.peers,
            &self.upstream.to_ne_bytes(),
            &entry(self.client, lease_in).encode(),
        )?;
        for (cookie, socket) in [(self.client, client), (self.upstream, upstream)] {
            let fd = socket.as_raw_fd() as u32;
            sys::map_update(&f.sockets, &cookie.to_ne_bytes(), &fd.to_ne_bytes())?;
        }
        Ok(())
    }

    fn entry(&self, cookie: u64) -> PeerEntry {
        let mut bytes = [0u8; 24];
        match sys::map_lookup(&self.forwarder.peers, &cookie.to_ne_bytes(), &mut bytes) {
            Ok(()) => PeerEntry::decode(&bytes),
            Err(_) => PeerEntry::default(),
        }
    }

    /// Bytes the kernel redirected so far in `direction`.
    pub(crate) fn moved(&self, direction: Direction) -> u64 {
        self.entry(self.source(direction)).moved
    }

    fn source(&self, direction: Direction) -> u64 {
        match direction {
            Direction::Out => self.client,
            Direction::In => self.upstream,
        }
    }

    /// Waits until `to` has taken every byte the kernel redirected to it (the kernel sends
    /// them from a work queue, after the verdict), so that a close passed on, or a spilled
    /// byte the gate writes itself, comes after them. `copied` counts bytes the gate wrote.
    /// Gives up when `to` is no longer open for sending or takes nothing for a while.
    pub(crate) fn drain(&self, direction: Direction, to: &TcpStream, copied: u64) {
        let wanted = self.queued_before[index(direction)] + self.moved(direction) + copied;
        let (mut last, mut since) = (0, Instant::now());
        while since.elapsed() < DRAIN_STALL {
            match sys::tcp_send_progress(to) {
                Ok((queued, true)) if queued < wanted => {
                    if queued != last {
                        (last, since) = (queued, Instant::now());
                    }
                    thread::sleep(Duration::from_micros(200));
                }
                _ => return,
            }
        }
    }

    /// Takes the sockets back: the bytes the kernel moved each way, the unspent leases
    /// returned to the meter.
    pub(crate) fn finish(self) -> KernelMoved {
        let (out, back) = (self.entry(self.client), self.entry(self.upstream));
        self.remove();
        self.give_back(Direction::Out, out.moved);
        self.give_back(Direction::In, back.moved);
        KernelMoved {
            bytes_out: out.moved,
            bytes_in: back.moved,
        }
    }

    /// Waits until the source of `direction` closes or fails, or its lease is spent. Not by
    /// reading: the kernel wakes a socket's readers for every chunk it redirects, so a
    /// blocked read would cost the gate a wake-up per chunk. An epoll set that wants only the
    /// hang-up is woken by the close alone; the lease is checked every [`SPILL_CHECK`].
    pub(crate) fn wait_quietly(&self, direction: Direction, from: &TcpStream) {
        use rustix::event::epoll;
        let watch = || -> io::Result<OwnedFd> {
            let set = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            let wanted = epoll::EventFlags::RDHUP | epoll::EventFlags::HUP | epoll::EventFlags::ERR;
            epoll::add(&set, from, epoll::EventData::new_u64(0), wanted)?;
            Ok(set)
        };
        let (Ok(set), Ok(period)) = (watch(), rustix::event::Timespec::try_from(SPILL_CHECK))
        else {
            return;
        };
        loop {
            let mut events = Vec::with_capacity(1);
            match epoll::wait(
                &set,
                rustix::buffer::spare_capacity(&mut events),
                Some(&period),
            ) {
                Ok(0) if !self.is_spent(direction) => {}
                Err(rustix::io::Errno::INTR) => {}
                _ => return,
            }
        }
    }

    /// True once the program handed this direction's bytes back (or it had no lease).
    fn is_spent(&self, direction: Direction) -> bool {
        self.entry(self.source(direction)).lease == 0
    }

    /// Once `direction` spilled, the kernel redirects no more of it: its unspent lease goes
    /// back to the meter at once, for the gate to grant the bytes it relays from now on.
    pub(crate) fn spilled(&self, direction: Direction) {
        self.give_back(direction, self.moved(direction));
    }

    /// Returns the lease of `direction` less the `spent` bytes (once).
    fn give_back(&self, direction: Direction, spent: u64) {
        let lease = self.leases[index(direction)].swap(0, Ordering::AcqRel);
        self.meter.refund(direction, lease.saturating_sub(spent));
    }

    fn remove(&self) {
        for cookie in [self.client, self.upstream] {
            let key = cookie.to_ne_bytes();
            let _ = sys::map_delete(&self.forwarder.sockets, &key);
            let _ = sys::map_delete(&self.forwarder.peers, &key);
        }
    }
}

/// The slot of a direction in per-direction arrays.
fn index(direction: Direction) -> usize {
    usize::from(direction == Direction::In)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        // r0 = 1 ; exit
        assert_eq!(insn(0xb7, 0, 0, 0, 1), 0x0000_0001_0000_00b7);
        // if r0 == 0 goto +15
        assert_eq!(insn(0x15, 0, 0, 15, 0), 0x0000_0000_000f_0015);
        // *(u64 *)(r10 - 8) = r0
        assert_eq!(insn(0x7b, 10, 0, -8, 0), 0x0000_0000_fff8_0a7b);
        assert_eq!(verdict_program(3, 4).len(), 26);
    }

    #[test]
    fn entries_round_trip() {
        let entry = PeerEntry {
            peer: 7,
            lease: u64::MAX,
            moved: 42,
        };
        assert_eq!(PeerEntry::decode(&entry.encode()), entry);
    }
}

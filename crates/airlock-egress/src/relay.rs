//! Moves bytes both ways between the sandbox's stream and the destination, counting them
//! against the run's caps. Linux moves them with splice(2) through a pipe, so the payload
//! never enters user space (this is what keeps the gate near a direct connection's
//! throughput); elsewhere, or where splice is refused, a plain copy loop does the same.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::thread;
use std::time::Instant;

use crate::audit::Traffic;
use crate::kernel_relay::Offload;
use crate::meter::{Direction, Meter};
use crate::report::{LimitKind, Reason, RelayPath};

/// The most bytes moved per splice or copy.
const CHUNK: usize = 1 << 20;
/// The pipe size asked for (the kernel may grant less).
const PIPE_SIZE: usize = 1 << 20;
/// The buffer of a copy loop.
const COPY_CHUNK: usize = 64 * 1024;
/// Stack of the thread pumping the second direction: it holds no large buffers.
const PUMP_STACK: usize = 64 * 1024;

/// How one direction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The source closed its side.
    Eof,
    /// A socket failed (reset, shut down by the gate).
    Broken,
    /// The cap was reached.
    Limit(LimitKind),
    /// The gate refused what the stream carried next (a request naming another host).
    Refused(Reason),
}

/// Relays until both directions end; returns what flowed. A cap reached or a broken side
/// closes both sides at once. The kernel forwards the bytes when it can ([`Offload`]),
/// splice(2) moves them otherwise.
pub(crate) fn relay(
    meter: &Meter,
    client: TcpStream,
    upstream: TcpStream,
    started: Instant,
) -> io::Result<Traffic> {
    match Offload::begin(meter, &client, &upstream) {
        Ok(offload) => relay_in_kernel(meter, offload, client, upstream, started),
        Err(_) => {
            let mut traffic = relay_pumps(
                meter,
                client,
                upstream,
                started,
                |from, to| move_bytes(meter, Direction::Out, from, to),
                |from, to| move_bytes(meter, Direction::In, from, to),
            )?;
            traffic.path = Some(RelayPath::Splice);
            Ok(traffic)
        }
    }
}

/// Relays a stream the kernel forwards: each direction's thread waits for the end or for
/// the bytes the kernel hands back past the lease, then relays those through the meter.
fn relay_in_kernel(
    meter: &Meter,
    offload: Offload<'_>,
    client: TcpStream,
    upstream: TcpStream,
    started: Instant,
) -> io::Result<Traffic> {
    let shared = &offload;
    let traffic = relay_pumps(
        meter,
        client,
        upstream,
        started,
        |from, to| pump_offloaded(shared, meter, Direction::Out, from, to),
        |from, to| pump_offloaded(shared, meter, Direction::In, from, to),
    );
    let moved = offload.finish();
    let mut traffic = traffic?;
    traffic.bytes_out += moved.bytes_out;
    traffic.bytes_in += moved.bytes_in;
    traffic.path = Some(RelayPath::Kernel);
    Ok(traffic)
}

/// One offloaded direction: blocks until the source ends or the kernel hands bytes back
/// (the lease is spent); either way the kernel's redirected bytes reach `to` first.
fn pump_offloaded(
    offload: &Offload<'_>,
    meter: &Meter,
    direction: Direction,
    mut from: &TcpStream,
    to: &TcpStream,
) -> (u64, End) {
    offload.wait_quietly(direction, from);
    let mut buffer = vec![0u8; COPY_CHUNK];
    let n = loop {
        match from.read(&mut buffer) {
            Ok(n) => break n,
            Err(e) if retry(&e) => {}
            Err(_) => return (0, End::Broken),
        }
    };
    offload.drain(direction, to, 0);
    if n == 0 {
        return (0, End::Eof);
    }
    offload.spilled(direction);
    match forward(meter, direction, &buffer[..n], to) {
        (granted, Some(end)) => (granted, end),
        (granted, None) => {
            let (moved, end) = pump_copy(meter, direction, from, to);
            (granted + moved, end)
        }
    }
}

/// Relays with `outbound` moving the sandbox's bytes (it returns the bytes delivered and how
/// it ended) while the destination's bytes flow back unchanged.
pub(crate) fn relay_with(
    meter: &Meter,
    client: TcpStream,
    upstream: TcpStream,
    started: Instant,
    outbound: impl FnOnce(&TcpStream, &TcpStream) -> (u64, End),
) -> io::Result<Traffic> {
    let mut traffic = relay_pumps(meter, client, upstream, started, outbound, |from, to| {
        move_bytes(meter, Direction::In, from, to)
    })?;
    traffic.path = Some(RelayPath::Inspected);
    Ok(traffic)
}

/// Runs `outbound` here and `inbound` on a second thread until both directions end.
fn relay_pumps(
    _meter: &Meter,
    client: TcpStream,
    upstream: TcpStream,
    started: Instant,
    outbound: impl FnOnce(&TcpStream, &TcpStream) -> (u64, End),
    inbound: impl FnOnce(&TcpStream, &TcpStream) -> (u64, End) + Send,
) -> io::Result<Traffic> {
    let (client_in, upstream_out) = (client.try_clone()?, upstream.try_clone()?);
    let ((bytes_out, end_out), (bytes_in, end_in)) = thread::scope(|scope| -> io::Result<_> {
        let inbound = thread::Builder::new()
            .stack_size(PUMP_STACK)
            .spawn_scoped(scope, || {
                let (moved, end) = inbound(&upstream_out, &client_in);
                end_direction(end, &upstream_out, &client_in);
                (moved, end)
            })?;
        let (moved, end) = outbound(&client, &upstream);
        end_direction(end, &client, &upstream);
        Ok(((moved, end), inbound.join().unwrap_or((0, End::Broken))))
    })?;
    let ended_by = [end_out, end_in].into_iter().find_map(|end| match end {
        End::Limit(kind) => Some(Reason::limit(kind)),
        End::Refused(reason) => Some(reason),
        End::Eof | End::Broken => None,
    });
    Ok(Traffic {
        bytes_out,
        bytes_in,
        duration: started.elapsed(),
        ended_by,
        path: None,
    })
}

/// Moves one direction's bytes until it ends; returns the bytes delivered.
pub(crate) fn move_bytes(
    meter: &Meter,
    direction: Direction,
    from: &TcpStream,
    to: &TcpStream,
) -> (u64, End) {
    pump_splice(meter, direction, from, to).unwrap_or_else(|| pump_copy(meter, direction, from, to))
}

/// A clean end passes the close on, and so does a refused request: the destination still
/// answers what came before it, then closes, and the program reads those answers before
/// the end. A cap reached or a broken side closes both sides at once.
fn end_direction(end: End, from: &TcpStream, to: &TcpStream) {
    match end {
        End::Eof | End::Refused(_) => {
            let _ = to.shutdown(Shutdown::Write);
        }
        End::Broken | End::Limit(_) => {
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        }
    }
}

/// splice(2) through a pipe; `None` when splice is unavailable before any byte moved.
#[cfg(target_os = "linux")]
fn pump_splice(
    meter: &Meter,
    direction: Direction,
    from: &TcpStream,
    to: &TcpStream,
) -> Option<(u64, End)> {
    use rustix::pipe::{fcntl_setpipe_size, pipe_with, splice, PipeFlags, SpliceFlags};
    let (pipe_read, pipe_write): (OwnedFd, OwnedFd) = pipe_with(PipeFlags::CLOEXEC).ok()?;
    let _ = fcntl_setpipe_size(&pipe_write, PIPE_SIZE);
    let mut moved = 0u64;
    loop {
        let n = match splice(from, None, &pipe_write, None, CHUNK, SpliceFlags::MOVE) {
            Ok(0) => return Some((moved, End::Eof)),
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::INVAL) if moved == 0 => return None,
            Err(_) => return Some((moved, End::Broken)),
        };
        let granted = meter.take_bytes(direction, n as u64) as usize;
        if !drain_pipe(&pipe_read, to, granted) {
            return Some((moved, End::Broken));
        }
        moved += granted as u64;
        if granted < n {
            return Some((moved, End::Limit(direction.limit())));
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn pump_splice(_: &Meter, _: Direction, _: &TcpStream, _: &TcpStream) -> Option<(u64, End)> {
    None
}

/// Moves `len` bytes from the pipe to the socket; false when the socket fails.
#[cfg(target_os = "linux")]
fn drain_pipe(pipe_read: &OwnedFd, to: &TcpStream, mut len: usize) -> bool {
    use rustix::pipe::{splice, SpliceFlags};
    while len > 0 {
        match splice(pipe_read, None, to, None, len, SpliceFlags::MOVE) {
            Ok(0) => return false,
            Ok(n) => len -= n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
    }
    true
}

fn pump_copy(
    meter: &Meter,
    direction: Direction,
    mut from: &TcpStream,
    to: &TcpStream,
) -> (u64, End) {
    let mut buffer = vec![0u8; COPY_CHUNK];
    let mut moved = 0u64;
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => return (moved, End::Eof),
            Ok(n) => n,
            Err(e) if retry(&e) => continue,
            Err(_) => return (moved, End::Broken),
        };
        let (granted, end) = forward(meter, direction, &buffer[..n], to);
        moved += granted;
        if let Some(end) = end {
            return (moved, end);
        }
    }
}

/// A read to try again: interrupted, or (a socket the kernel forwards, whose reads wake
/// on bytes it then redirects) nothing left to read after all. Relayed sockets have no
/// read timeout, so this is never a timeout.
fn retry(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
    )
}

/// Sends `chunk` as far as the cap allows: the bytes delivered, and the end when the cap cut
/// it or `to` failed.
fn forward(
    meter: &Meter,
    direction: Direction,
    chunk: &[u8],
    mut to: &TcpStream,
) -> (u64, Option<End>) {
    let granted = meter.take_bytes(direction, chunk.len() as u64) as usize;
    if to.write_all(&chunk[..granted]).is_err() {
        return (0, Some(End::Broken));
    }
    let end = (granted < chunk.len()).then_some(End::Limit(direction.limit()));
    (granted as u64, end)
}

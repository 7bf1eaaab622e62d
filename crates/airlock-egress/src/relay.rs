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
use crate::meter::{Direction, Meter};
use crate::report::{LimitKind, Reason};

/// The most bytes moved per splice or copy.
const CHUNK: usize = 1 << 20;
/// The pipe size asked for (the kernel may grant less).
const PIPE_SIZE: usize = 1 << 20;
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
/// closes both sides at once.
pub(crate) fn relay(
    meter: &Meter,
    client: TcpStream,
    upstream: TcpStream,
    started: Instant,
) -> io::Result<Traffic> {
    relay_with(meter, client, upstream, started, |from, to| {
        move_bytes(meter, Direction::Out, from, to)
    })
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
    let (client_in, upstream_out) = (client.try_clone()?, upstream.try_clone()?);
    let ((bytes_out, end_out), (bytes_in, end_in)) = thread::scope(|scope| -> io::Result<_> {
        let inbound = thread::Builder::new()
            .stack_size(PUMP_STACK)
            .spawn_scoped(scope, || {
                let (moved, end) = move_bytes(meter, Direction::In, &upstream_out, &client_in);
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
    mut to: &TcpStream,
) -> (u64, End) {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut moved = 0u64;
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => return (moved, End::Eof),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return (moved, End::Broken),
        };
        let granted = meter.take_bytes(direction, n as u64) as usize;
        if to.write_all(&buffer[..granted]).is_err() {
            return (moved, End::Broken);
        }
        moved += granted as u64;
        if granted < n {
            return (moved, End::Limit(direction.limit()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Limits;
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Both ends of a loopback connection.
    fn connected() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (near, listener.accept().unwrap().0)
    }

    /// A conversation: each message must arrive before the next is sent (an answer to a
    /// request, while the destination keeps the connection open). The relay must not hold
    /// a message back waiting for the next one: a splice from TCP waits for data holding the
    /// pipe's lock, so a relay draining the pipe from a second thread would, unless it
    /// polled first (tried in 45f33f3; this fails 3 of 3 without the poll).
    #[test]
    fn each_message_arrives_before_the_next_is_sent() {
        let meter = Meter::new(Limits::default());
        let (mut sender, from) = connected();
        let (to, mut receiver) = connected();
        let (arrived, wait_arrival) = mpsc::channel();
        let talk = thread::spawn(move || {
            for round in 0..50u8 {
                sender.write_all(&[round; 7]).unwrap();
                wait_arrival
                    .recv_timeout(Duration::from_secs(5))
                    .expect("the message was relayed while the connection stayed open");
            }
        });
        let listen = thread::spawn(move || {
            let mut message = [0u8; 7];
            for round in 0..50u8 {
                receiver.read_exact(&mut message).unwrap();
                assert_eq!(message, [round; 7]);
                arrived.send(()).unwrap();
            }
        });
        let relayed = thread::spawn(move || move_bytes(&meter, Direction::In, &from, &to));
        talk.join().unwrap();
        listen.join().unwrap();
        assert_eq!(relayed.join().unwrap(), (350, End::Eof));
    }
}

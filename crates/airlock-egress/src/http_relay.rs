//! Plain HTTP through the gate, request by request. A kept-alive connection carries many
//! requests: each one is read, its `Host` (and absolute-form target) checked against the name
//! the connection was opened for, its framing checked to be one every server reads the same
//! way, and only then forwarded with its body. The first request that names another host or
//! that the gate cannot frame safely ends the connection: a second request must not ride a
//! connection checked for the first (domain fronting), nor hide inside its body (request
//! smuggling).
//!
//! Answers flow back unparsed: nothing the server sends can re-point the stream. The one
//! exception is a WebSocket upgrade, which must be the connection's first request: the gate
//! reads the answer's status line, and only a `101` turns the stream into opaque frames.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use crate::audit::Traffic;
use crate::flow::{check_head, Refusal};
use crate::meter::{Direction, Meter};
use crate::relay::{move_bytes, relay, relay_with, End};
use crate::report::Reason;
use crate::sniff::{parse_request_head, Parsed, RequestHead, MAX_OPENING};

/// The longest chunk-size or trailer line read.
const MAX_LINE: usize = 8 * 1024;
/// How much is read from a socket at once.
const READ_CHUNK: usize = 16 * 1024;

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// The name a connection is bound to, and what to do when a request names another.
pub(crate) struct Binding<'a> {
    pub(crate) name: &'a str,
    pub(crate) port: u16,
    /// Records a refused request; true when the run goes on anyway (report mode).
    pub(crate) on_refusal: &'a dyn Fn(Refusal) -> bool,
}

/// A request's body framing, or a refusal when servers could disagree about it: both
/// `Transfer-Encoding` and `Content-Length`, several of either, a coding other than `chunked`,
/// chunked HTTP/1.0, or a length that is not plain digits.
pub(crate) fn framing(head: &RequestHead) -> Result<Body, Refusal> {
    let values = |wanted: &str| -> Vec<&str> {
        head.headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(wanted))
            .map(|(_, value)| value.as_str())
            .collect()
    };
    let unsafe_request = |why: &str| Refusal::with(Reason::UnsafeRequest, why);
    match (
        values("transfer-encoding").as_slice(),
        values("content-length").as_slice(),
    ) {
        ([], []) => Ok(Body::Empty),
        ([], [length]) => parse_length(length)
            .map(Body::Length)
            .ok_or_else(|| unsafe_request("Content-Length is not a number")),
        ([coding], []) if coding.eq_ignore_ascii_case("chunked") && head.version == 1 => {
            Ok(Body::Chunked)
        }
        ([_], []) => Err(unsafe_request("a Transfer-Encoding other than chunked")),
        ([], _) => Err(unsafe_request("several Content-Length headers")),
        (_, []) => Err(unsafe_request("several Transfer-Encoding headers")),
        (_, _) => Err(unsafe_request("both Transfer-Encoding and Content-Length")),
    }
}

fn parse_length(text: &str) -> Option<u64> {
    let digits = !text.is_empty() && text.len() <= 18 && text.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| text.parse().ok()).flatten()
}

/// True when the request asks to upgrade the connection (any `Upgrade` header).
pub(crate) fn upgrade_of(head: &RequestHead) -> Option<&str> {
    head.headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("upgrade"))
        .map(|(_, value)| value.as_str())
}

/// Relays a plain-HTTP stream whose first request (in `preface`) was checked: a WebSocket
/// upgrade goes opaque only once the server answers 101; every other request is checked
/// before it is forwarded.
pub(crate) fn relay_requests(
    meter: &Meter,
    client: TcpStream,
    upstream: TcpStream,
    started: Instant,
    binding: &Binding<'_>,
    preface: Vec<u8>,
) -> io::Result<Traffic> {
    let mut handshake = Traffic::default();
    let mut pending = preface;
    if let Parsed::Complete(head) = parse_request_head(&pending) {
        if upgrade_of(&head).is_some() {
            let rest = pending.split_off(head.len);
            let switched = upgrade(meter, &client, &upstream, &pending, &mut handshake)?;
            pending = rest;
            if switched {
                let mut sink = Sink::new(meter, Direction::Out, &upstream);
                sink.send(&pending).map_err(|_| io::ErrorKind::BrokenPipe)?;
                let sent = sink.moved;
                let mut traffic = relay(meter, client, upstream, started)?;
                traffic.bytes_out += handshake.bytes_out + sent;
                traffic.bytes_in += handshake.bytes_in;
                return Ok(traffic);
            }
        }
    }
    let mut traffic = relay_with(meter, client, upstream, started, |from, to| {
        pump_requests(meter, from, to, binding, pending)
    })?;
    traffic.bytes_out += handshake.bytes_out;
    traffic.bytes_in += handshake.bytes_in;
    Ok(traffic)
}

/// Sends an upgrade request and passes the answer's head back; true when it is a 101.
fn upgrade(
    meter: &Meter,
    client: &TcpStream,
    upstream: &TcpStream,
    request: &[u8],
    traffic: &mut Traffic,
) -> io::Result<bool> {
    let mut sink = Sink::new(meter, Direction::Out, upstream);
    sink.send(request).map_err(|_| io::ErrorKind::BrokenPipe)?;
    traffic.bytes_out = sink.moved;
    let mut answer = Vec::new();
    let status = loop {
        let mut headers = [httparse::EMPTY_HEADER; 96];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&answer) {
            Ok(httparse::Status::Complete(_)) => break response.code,
            Ok(httparse::Status::Partial) if answer.len() < MAX_OPENING => {}
            _ => break None,
        }
        if !read_more(upstream, &mut answer)? {
            break None;
        }
    };
    let mut back = Sink::new(meter, Direction::In, client);
    back.send(&answer).map_err(|_| io::ErrorKind::BrokenPipe)?;
    traffic.bytes_in = back.moved;
    Ok(status == Some(101))
}

/// Why forwarding stopped.
enum Stop {
    End(End),
    Refuse(Refusal),
}

impl From<End> for Stop {
    fn from(end: End) -> Stop {
        Stop::End(end)
    }
}

fn unsafe_request(why: &str) -> Stop {
    Stop::Refuse(Refusal::with(Reason::UnsafeRequest, why))
}

/// Forwards requests one at a time, each checked; returns the bytes delivered.
fn pump_requests(
    meter: &Meter,
    client: &TcpStream,
    upstream: &TcpStream,
    binding: &Binding<'_>,
    pending: Vec<u8>,
) -> (u64, End) {
    let mut requests = Requests {
        from: client,
        buffer: pending,
    };
    let mut sink = Sink::new(meter, Direction::Out, upstream);
    let end = loop {
        let stop = match forward_request(&mut requests, &mut sink, binding) {
            Ok(()) => continue,
            Err(stop) => stop,
        };
        match stop {
            Stop::End(end) => break end,
            Stop::Refuse(refusal) => {
                let reason = refusal.reason;
                if !(binding.on_refusal)(refusal) {
                    break End::Refused(reason);
                }
                // Report mode: the rest flows unchecked, as it would without the gate.
                if sink.send(&requests.buffer).is_err() {
                    break End::Broken;
                }
                let (moved, end) = move_bytes(meter, Direction::Out, client, upstream);
                sink.moved += moved;
                break end;
            }
        }
    };
    (sink.moved, end)
}

/// Reads one request, checks it and forwards it with its body.
fn forward_request(
    requests: &mut Requests<'_>,
    sink: &mut Sink<'_>,
    binding: &Binding<'_>,
) -> Result<(), Stop> {
    let Some((head, raw)) = requests.head()? else {
        return Err(End::Eof.into());
    };
    check_head(binding.name, binding.port, &head).map_err(Stop::Refuse)?;
    if upgrade_of(&head).is_some() {
        return Err(unsafe_request(
            "an Upgrade that is not the connection's first request",
        ));
    }
    let body = framing(&head).map_err(Stop::Refuse)?;
    sink.send(&raw)?;
    match body {
        Body::Empty => Ok(()),
        Body::Length(len) => requests.forward_exact(sink, len),
        Body::Chunked => requests.forward_chunked(sink),
    }
}

/// The sandbox's side of the stream, read as requests.
struct Requests<'a> {
    from: &'a TcpStream,
    buffer: Vec<u8>,
}

impl Requests<'_> {
    /// The next request head and its bytes; `None` when the stream ends between requests.
    fn head(&mut self) -> Result<Option<(RequestHead, Vec<u8>)>, Stop> {
        loop {
            if !self.buffer.is_empty() {
                match parse_request_head(&self.buffer) {
                    Parsed::Complete(head) => {
                        let raw = self.buffer.drain(..head.len).collect();
                        return Ok(Some((head, raw)));
                    }
                    Parsed::Invalid => {
                        return Err(unsafe_request("a request the gate cannot read"))
                    }
                    Parsed::Incomplete if self.buffer.len() >= MAX_OPENING => {
                        return Err(unsafe_request("a request head over 64 KiB"))
                    }
                    Parsed::Incomplete => {}
                }
            }
            if !self.fill()? {
                // A stream cut mid-head ends without the partial head being forwarded.
                return Ok(None);
            }
        }
    }

    /// Forwards exactly `len` body bytes.
    fn forward_exact(&mut self, sink: &mut Sink<'_>, mut len: u64) -> Result<(), Stop> {
        while len > 0 {
            if self.buffer.is_empty() && !self.fill()? {
                return Err(End::Eof.into());
            }
            let take = usize::try_from(len).map_or(self.buffer.len(), |n| n.min(self.buffer.len()));
            sink.send(&self.buffer[..take])?;
            self.buffer.drain(..take);
            len -= take as u64;
        }
        Ok(())
    }

    /// Forwards a chunked body, trailers included, checking every chunk's framing.
    fn forward_chunked(&mut self, sink: &mut Sink<'_>) -> Result<(), Stop> {
        loop {
            let line = self.line()?;
            let size = chunk_size(&line)?;
            sink.send(&line)?;
            if size == 0 {
                return self.forward_trailers(sink);
            }
            self.forward_exact(sink, size)?;
            let end = self.line()?;
            if end != b"\r\n" {
                return Err(unsafe_request("chunk data longer than its size"));
            }
            sink.send(&end)?;
        }
    }

    fn forward_trailers(&mut self, sink: &mut Sink<'_>) -> Result<(), Stop> {
        let mut total = 0;
        loop {
            let line = self.line()?;
            total += line.len();
            if total > MAX_OPENING {
                return Err(unsafe_request("trailers over 64 KiB"));
            }
            sink.send(&line)?;
            if line == b"\r\n" {
                return Ok(());
            }
        }
    }

    /// One line, CRLF included; a bare CR or LF inside it is refused.
    fn line(&mut self) -> Result<Vec<u8>, Stop> {
        loop {
            if let Some(lf) = self.buffer.iter().position(|&b| b == b'\n') {
                let cr_only_at_end = lf > 0
                    && self.buffer[lf - 1] == b'\r'
                    && !self.buffer[..lf - 1].contains(&b'\r');
                if !cr_only_at_end {
                    return Err(unsafe_request("a chunk line not ended by CRLF"));
                }
                return Ok(self.buffer.drain(..=lf).collect());
            }
            if self.buffer.len() >= MAX_LINE {
                return Err(unsafe_request("a chunk line over 8 KiB"));
            }
            if !self.fill()? {
                return Err(End::Eof.into());
            }
        }
    }

    /// Reads more; false at the end of the stream.
    fn fill(&mut self) -> Result<bool, Stop> {
        read_more(self.from, &mut self.buffer).map_err(|_| Stop::End(End::Broken))
    }
}

/// Appends what the socket has (up to `READ_CHUNK`); false at the end of the stream.
pub(crate) fn read_more(mut from: &TcpStream, buffer: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; READ_CHUNK];
    loop {
        match from.read(&mut chunk) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                buffer.extend_from_slice(&chunk[..n]);
                return Ok(true);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A chunk-size line's size: hex digits, then nothing or `;` and extensions without
/// control characters.
fn chunk_size(line: &[u8]) -> Result<u64, Stop> {
    let text = &line[..line.len() - 2];
    let digits_end = text.iter().position(|&b| b == b';').unwrap_or(text.len());
    let (digits, extension) = text.split_at(digits_end);
    let clean_extension = extension
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80);
    if digits.is_empty() || digits.len() > 15 || !clean_extension {
        return Err(unsafe_request("a malformed chunk size"));
    }
    std::str::from_utf8(digits)
        .ok()
        .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|d| u64::from_str_radix(d, 16).ok())
        .ok_or_else(|| unsafe_request("a malformed chunk size"))
}

/// Writes to one side, counting against the run's cap.
pub(crate) struct Sink<'a> {
    meter: &'a Meter,
    direction: Direction,
    to: &'a TcpStream,
    pub(crate) moved: u64,
}

impl<'a> Sink<'a> {
    pub(crate) fn new(meter: &'a Meter, direction: Direction, to: &'a TcpStream) -> Sink<'a> {
        Sink {
            meter,
            direction,
            to,
            moved: 0,
        }
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) -> Result<(), End> {
        let granted = self.meter.take_bytes(self.direction, bytes.len() as u64) as usize;
        if (&*self.to).write_all(&bytes[..granted]).is_err() {
            return Err(End::Broken);
        }
        self.moved += granted as u64;
        if granted < bytes.len() {
            return Err(End::Limit(self.direction.limit()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> RequestHead {
        match parse_request_head(text.as_bytes()) {
            Parsed::Complete(head) => head,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn framing_is_refused_when_servers_could_disagree() {
        let frame = |headers: &str| {
            framing(&head(&format!(
                "POST / HTTP/1.1\r\nHost: a\r\n{headers}\r\n"
            )))
        };
        assert_eq!(frame(""), Ok(Body::Empty));
        assert_eq!(frame("Content-Length: 12\r\n"), Ok(Body::Length(12)));
        assert_eq!(frame("Transfer-Encoding: Chunked\r\n"), Ok(Body::Chunked));
        for ambiguous in [
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            "Content-Length: +5\r\n",
            "Content-Length: 5, 5\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: xchunked\r\n",
        ] {
            assert_eq!(
                frame(ambiguous).map_err(|r| r.reason),
                Err(Reason::UnsafeRequest),
                "{ambiguous:?}"
            );
        }
        let old = framing(&head(
            "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        ));
        assert!(old.is_err());
    }

    #[test]
    fn chunk_sizes() {
        let size = |line: &str| chunk_size(line.as_bytes()).ok();
        assert_eq!(size("1a\r\n"), Some(26));
        assert_eq!(size("0\r\n"), Some(0));
        assert_eq!(size("5;name=value\r\n"), Some(5));
        for bad in [
            "\r\n",
            "0x5\r\n",
            "5 \r\n",
            "-1\r\n",
            "fffffffffffffffff\r\n",
            "5;\x01\r\n",
        ] {
            assert_eq!(size(bad), None, "{bad:?}");
        }
    }
}

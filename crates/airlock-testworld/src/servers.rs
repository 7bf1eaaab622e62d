//! The plain TCP servers of the test hosts, each on its port of every host address.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;

use crate::Seen;

pub(crate) type Handler = fn(TcpStream, &Seen);

/// HTTP on 80, an SSH-like banner and echo on 22, a sink on 8080, an 8 MiB source on 8081,
/// a server that holds connections open on 9000 and a TLS front that asks for a retry on 4433.
pub(crate) const HANDLERS: [(u16, Handler); 6] = [
    (80, serve_http),
    (22, serve_banner_echo),
    (8080, serve_sink),
    (8081, serve_source),
    (9000, serve_hold),
    (4433, serve_tls_retry),
];

/// HTTP/1.1 with keep-alive, as a real origin server reads it: answers `host=<Host>` per
/// request (an absolute-form target's authority wins over `Host`, as RFC 9112 says), skips a
/// request's body (`Transfer-Encoding: chunked` wins over `Content-Length`), closes after a
/// request asking for it; an `Upgrade` request gets 101 and an echo. Each host it answered is
/// recorded: a request that slipped past the gate on a kept-alive connection shows here.
fn serve_http(mut stream: TcpStream, seen: &Seen) {
    while let Some(head) = read_head(&mut stream) {
        let header = |name: &str| {
            head.lines().find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.trim().to_string())
            })
        };
        let target = head.split(' ').nth(1).unwrap_or_default();
        let host = target
            .strip_prefix("http://")
            .map(|rest| rest.split('/').next().unwrap_or_default().to_string())
            .or_else(|| header("host"))
            .unwrap_or_default();
        seen.hosts.lock().unwrap().push(host.clone());
        if head.to_ascii_lowercase().contains("upgrade: websocket") {
            let _ = stream.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
            return serve_echo(stream);
        }
        let chunked =
            header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let length = header("content-length").and_then(|v| v.parse::<u64>().ok());
        let skipped = if chunked {
            skip_chunked(&mut stream)
        } else {
            skip_exact(&mut stream, length.unwrap_or(0))
        };
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let body = format!("host={host}\n");
        let connection = if close { "close" } else { "keep-alive" };
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{body}",
            body.len()
        );
        if close || skipped.is_none() {
            return;
        }
    }
}

fn skip_exact(stream: &mut TcpStream, len: u64) -> Option<()> {
    let copied = std::io::copy(&mut Read::by_ref(stream).take(len), &mut std::io::sink()).ok()?;
    (copied == len).then_some(())
}

fn skip_chunked(stream: &mut TcpStream) -> Option<()> {
    loop {
        let line = read_line(stream)?;
        let size = u64::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            while !read_line(stream)?.is_empty() {}
            return Some(());
        }
        skip_exact(stream, size + 2)?;
    }
}

fn read_line(stream: &mut TcpStream) -> Option<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") && line.len() < 8192 {
        if stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        line.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&line).trim_end().to_string())
}

fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
        if stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).to_string())
}

fn serve_echo(mut stream: TcpStream) {
    let mut buffer = [0u8; 16384];
    while let Ok(n) = stream.read(&mut buffer) {
        if n == 0 || stream.write_all(&buffer[..n]).is_err() {
            return;
        }
    }
}

fn serve_banner_echo(mut stream: TcpStream, _: &Seen) {
    let _ = stream.write_all(b"SSH-2.0-airlock-test\r\n");
    serve_echo(stream);
}

fn serve_sink(mut stream: TcpStream, seen: &Seen) {
    let mut buffer = [0u8; 65536];
    while let Ok(n) = stream.read(&mut buffer) {
        if n == 0 {
            break;
        }
        seen.sunk.fetch_add(n, Ordering::Relaxed);
    }
}

/// Sends 8 MiB, then closes.
fn serve_source(mut stream: TcpStream, _: &Seen) {
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..8 {
        if stream.write_all(&chunk).is_err() {
            return;
        }
    }
}

/// Holds the connection until the peer closes it; counts the open and closed ones.
fn serve_hold(mut stream: TcpStream, seen: &Seen) {
    seen.held_open.fetch_add(1, Ordering::Relaxed);
    let _ = stream.write_all(b"held\n");
    let mut buffer = [0u8; 1024];
    while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
    seen.held_open.fetch_sub(1, Ordering::Relaxed);
    seen.held_closed.fetch_add(1, Ordering::Relaxed);
}

/// A ServerHello that is a HelloRetryRequest (its random is RFC 8446's fixed value), asking
/// for an x25519 key share, in one record.
const HELLO_RETRY_REQUEST: [u8; 61] = [
    0x16, 3, 3, 0, 56, 2, 0, 0, 52, 3, 3, 0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe,
    0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91, 0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07,
    0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c, 0, 0x13, 0x01, 0, 0, 12, 0, 0x2b, 0, 2, 3, 4, 0,
    0x33, 0, 2, 0, 0x1d,
];

/// A TLS front that routes by the last ClientHello it reads, as a lenient server may: it
/// records each ClientHello, answers the first with a HelloRetryRequest, and answers `ok`
/// after the second (no real handshake: the records are the evidence).
fn serve_tls_retry(mut stream: TcpStream, seen: &Seen) {
    let mut hellos = 0;
    while let Some(record) = read_record(&mut stream) {
        if record.first() != Some(&0x16) {
            continue;
        }
        seen.client_hellos
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(&record).to_string());
        hellos += 1;
        let reply: &[u8] = if hellos == 1 {
            &HELLO_RETRY_REQUEST
        } else {
            b"ok"
        };
        if stream.write_all(reply).is_err() || hellos == 2 {
            return;
        }
    }
}

fn read_record(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut record = vec![0u8; 5];
    stream.read_exact(&mut record).ok()?;
    let len = usize::from(u16::from_be_bytes([record[3], record[4]]));
    record.resize(5 + len, 0);
    stream.read_exact(&mut record[5..]).ok()?;
    Some(record)
}

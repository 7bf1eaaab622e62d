//! The first bytes of a stream: a TLS ClientHello (its SNI, and whether it is encrypted) or
//! an HTTP request head (method, target, `Host`). The gate ties the stream to its name with
//! them, then forwards the bytes it read unchanged.
//!
//! The ClientHello walk is written here rather than taken from `tls-parser`: the gate needs
//! two extensions (server_name and encrypted_client_hello) and must never refuse a valid
//! ClientHello because a parser is strict about an extension it does not need (new key-share
//! groups, GREASE values). A bounds-checked walk over the extension list does exactly that.
//! HTTP heads are read with `httparse`.

use std::io::{self, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The largest request head or ClientHello the gate reads before deciding.
pub const MAX_OPENING: usize = 64 * 1024;

pub(crate) const HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ECH: u16 = 0xfe0d;
const EXT_ESNI_DRAFT: u16 = 0xffce;

/// What a stream opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opening {
    /// A TLS ClientHello.
    Tls(ClientHello),
    /// An HTTP/1 request head.
    Http(RequestHead),
    /// Anything else (or a stream closed before a full opening).
    Other,
}

/// What the gate reads from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The host_name of the server_name extension, if any.
    pub sni: Option<String>,
    /// An encrypted_client_hello (or draft ESNI) extension is present.
    pub encrypted: bool,
}

/// What the gate reads from an HTTP request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method (`GET`, `CONNECT`, ...).
    pub method: String,
    /// The request target as sent (origin-form, absolute-form or authority-form).
    pub target: String,
    /// Every `Host` header value (more than one is refused).
    pub hosts: Vec<String>,
    /// The head's length in bytes, blank line included.
    pub len: usize,
    /// Headers, in order, as (name, value).
    pub headers: Vec<(String, String)>,
    /// The minor version (`HTTP/1.0` or `HTTP/1.1`).
    pub version: u8,
}

/// Reads until the opening is known, the stream ends, `MAX_OPENING` bytes are read or the
/// deadline passes (then the opening is `Other`). Returns what was seen and every byte read
/// (to forward unchanged). `prefix` holds bytes already read from the stream.
pub fn read_opening(
    stream: &mut TcpStream,
    prefix: Vec<u8>,
    timeout: Duration,
) -> io::Result<(Opening, Vec<u8>)> {
    let deadline = Instant::now() + timeout;
    let mut buffer = prefix;
    loop {
        match classify(&buffer) {
            Progress::Done(opening) => return Ok((opening, buffer)),
            Progress::NeedMore if buffer.len() >= MAX_OPENING => {
                return Ok((Opening::Other, buffer))
            }
            Progress::NeedMore => {}
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Ok((Opening::Other, buffer));
        }
        stream.set_read_timeout(Some(remaining))?;
        let mut chunk = [0u8; 4096];
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if is_timeout(&e) => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok((Opening::Other, buffer));
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// True for the error a read timeout gives (EAGAIN on Linux, ETIMEDOUT elsewhere).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

enum Progress {
    Done(Opening),
    NeedMore,
}

fn classify(bytes: &[u8]) -> Progress {
    match bytes.first() {
        None => Progress::NeedMore,
        Some(&HANDSHAKE) => match parse_client_hello(bytes) {
            Parsed::Complete(hello) => Progress::Done(Opening::Tls(hello)),
            Parsed::Incomplete => Progress::NeedMore,
            Parsed::Invalid => Progress::Done(Opening::Other),
        },
        Some(b) if b.is_ascii_uppercase() => match parse_request_head(bytes) {
            Parsed::Complete(head) => Progress::Done(Opening::Http(head)),
            Parsed::Incomplete => Progress::NeedMore,
            Parsed::Invalid => Progress::Done(Opening::Other),
        },
        Some(_) => Progress::Done(Opening::Other),
    }
}

/// The outcome of parsing a prefix of a stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<T> {
    /// The whole structure was read.
    Complete(T),
    /// More bytes are needed.
    Incomplete,
    /// Not this structure.
    Invalid,
}

/// Reads a request head with `httparse`. A head with a line ended by a bare LF is invalid:
/// servers disagree about it, and a request two parsers read differently is how requests
/// are smuggled past a check.
pub fn parse_request_head(bytes: &[u8]) -> Parsed<RequestHead> {
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Complete(len)) if has_bare_line_feed(&bytes[..len]) => Parsed::Invalid,
        Ok(httparse::Status::Complete(len)) => Parsed::Complete(head_of(&request, len)),
        Ok(httparse::Status::Partial) => Parsed::Incomplete,
        Err(_) => Parsed::Invalid,
    }
}

fn has_bare_line_feed(head: &[u8]) -> bool {
    head.iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
}

fn head_of(request: &httparse::Request<'_, '_>, len: usize) -> RequestHead {
    let headers: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).trim().to_string(),
            )
        })
        .collect();
    let hosts = headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("host"))
        .map(|(_, value)| value.clone())
        .collect();
    RequestHead {
        method: request.method.unwrap_or_default().to_string(),
        target: request.path.unwrap_or_default().to_string(),
        hosts,
        len,
        headers,
        version: request.version.unwrap_or_default(),
    }
}

/// Reads a ClientHello from TLS records (a handshake message may span several records).
pub fn parse_client_hello(bytes: &[u8]) -> Parsed<ClientHello> {
    match client_hello_records(bytes) {
        Parsed::Complete((hello, _)) => Parsed::Complete(hello),
        Parsed::Incomplete => Parsed::Incomplete,
        Parsed::Invalid => Parsed::Invalid,
    }
}

/// A ClientHello and the length of the records that carried it. The hello must end where a
/// record ends: a record that goes on after it would hide a second handshake message (a
/// second ClientHello) that the server reads and the gate did not.
pub fn client_hello_records(bytes: &[u8]) -> Parsed<(ClientHello, usize)> {
    let mut handshake = Vec::new();
    let mut rest = bytes;
    loop {
        let Some((content_type, payload, after)) = take_record(rest) else {
            return Parsed::Incomplete;
        };
        if content_type != HANDSHAKE {
            return Parsed::Invalid;
        }
        handshake.extend_from_slice(payload);
        rest = after;
        if handshake.len() >= 4 {
            let body_len = read_u24(&handshake[1..4]);
            if handshake[0] != CLIENT_HELLO || handshake.len() > 4 + body_len {
                return Parsed::Invalid;
            }
            if handshake.len() == 4 + body_len {
                return read_hello_body(&handshake[4..]).map_or(Parsed::Invalid, |hello| {
                    Parsed::Complete((hello, bytes.len() - rest.len()))
                });
            }
        }
    }
}

/// One TLS record: (content type, payload, the bytes after it); `None` when incomplete.
pub(crate) fn take_record(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let header = bytes.get(..5)?;
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let payload = bytes.get(5..5 + len)?;
    Some((header[0], payload, &bytes[5 + len..]))
}

fn read_u24(bytes: &[u8]) -> usize {
    (usize::from(bytes[0]) << 16) | (usize::from(bytes[1]) << 8) | usize::from(bytes[2])
}

/// A bounds-checked reader over a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

fn read_hello_body(body: &[u8]) -> Option<ClientHello> {
    let mut cursor = Cursor(body);
    cursor.take(2 + 32)?; // legacy_version, random
    cursor.vec8()?; // legacy_session_id
    cursor.vec16()?; // cipher_suites
    cursor.vec8()?; // legacy_compression_methods
    let mut hello = ClientHello {
        sni: None,
        encrypted: false,
    };
    if cursor.0.is_empty() {
        return Some(hello); // no extensions at all (old clients): no SNI
    }
    let mut extensions = Cursor(cursor.vec16()?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec16()?;
        match kind {
            EXT_SERVER_NAME => hello.sni = Some(read_server_name(data)?),
            EXT_ECH | EXT_ESNI_DRAFT => hello.encrypted = true,
            _ => {}
        }
    }
    Some(hello)
}

fn read_server_name(data: &[u8]) -> Option<String> {
    let mut list = Cursor(Cursor(data).vec16()?);
    while !list.0.is_empty() {
        let name_type = list.u8()?;
        let name = list.vec16()?;
        if name_type == 0 {
            return std::str::from_utf8(name).ok().map(str::to_string);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello with the given extensions, in one record or split over two.
    pub(crate) fn client_hello(extensions: &[(u16, Vec<u8>)], split: bool) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.extend([32]);
        body.extend([1u8; 32]);
        body.extend([0, 4, 0x13, 0x01, 0x13, 0x02]);
        body.extend([1, 0]);
        let mut ext = Vec::new();
        for (kind, data) in extensions {
            ext.extend(kind.to_be_bytes());
            ext.extend((data.len() as u16).to_be_bytes());
            ext.extend(data);
        }
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut handshake = vec![CLIENT_HELLO];
        handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
        handshake.extend(body);
        let parts: Vec<&[u8]> = if split {
            let (a, b) = handshake.split_at(handshake.len() / 2);
            vec![a, b]
        } else {
            vec![&handshake]
        };
        parts
            .iter()
            .flat_map(|part| {
                let mut record = vec![HANDSHAKE, 3, 1];
                record.extend((part.len() as u16).to_be_bytes());
                record.extend(*part);
                record
            })
            .collect()
    }

    pub(crate) fn sni_extension(name: &str) -> (u16, Vec<u8>) {
        let mut entry = vec![0];
        entry.extend((name.len() as u16).to_be_bytes());
        entry.extend(name.as_bytes());
        let mut data = (entry.len() as u16).to_be_bytes().to_vec();
        data.extend(entry);
        (EXT_SERVER_NAME, data)
    }

    #[test]
    fn sni_is_read_across_records_and_unknown_extensions() {
        let hello = client_hello(
            &[
                (0x0a0a, vec![]),
                sni_extension("api.example.com"),
                (0x11ec, vec![9; 1200]),
            ],
            true,
        );
        let expected = ClientHello {
            sni: Some("api.example.com".into()),
            encrypted: false,
        };
        assert_eq!(parse_client_hello(&hello), Parsed::Complete(expected));
        for cut in [1, 5, 40, hello.len() - 1] {
            assert_eq!(
                parse_client_hello(&hello[..cut]),
                Parsed::Incomplete,
                "{cut}"
            );
        }
    }

    #[test]
    fn ech_and_missing_sni_are_seen() {
        let hello = client_hello(
            &[sni_extension("public.example"), (EXT_ECH, vec![0; 40])],
            false,
        );
        assert!(matches!(
            parse_client_hello(&hello),
            Parsed::Complete(ClientHello {
                encrypted: true,
                ..
            })
        ));
        let hello = client_hello(&[(0x000a, vec![0, 2, 0, 29])], false);
        assert_eq!(
            parse_client_hello(&hello),
            Parsed::Complete(ClientHello {
                sni: None,
                encrypted: false
            })
        );
    }

    #[test]
    fn malformed_hellos_are_invalid_not_panics() {
        let mut hello = client_hello(&[sni_extension("a.test")], false);
        let len = hello.len();
        hello[len - 3] = 0xff; // a server name that is not UTF-8
        assert_eq!(parse_client_hello(&hello), Parsed::Invalid);
        assert_eq!(
            parse_client_hello(&[HANDSHAKE, 3, 1, 0, 4, 2, 0, 0, 0]),
            Parsed::Invalid
        );
        assert_eq!(parse_client_hello(&[0x17, 3, 3, 0, 1, 0]), Parsed::Invalid);
    }

    #[test]
    fn a_hello_must_end_with_its_record() {
        let hello = client_hello(&[sni_extension("a.test")], false);
        assert!(matches!(
            client_hello_records(&[hello.clone(), vec![0x14, 3, 3, 0, 1, 1]].concat()),
            Parsed::Complete((_, len)) if len == hello.len()
        ));
        // A second handshake message packed into the hello's record.
        let mut packed = hello.clone();
        packed.extend([1, 0, 0, 0]);
        let record_len = u16::from_be_bytes([packed[3], packed[4]]) + 4;
        packed[3..5].copy_from_slice(&record_len.to_be_bytes());
        assert_eq!(client_hello_records(&packed), Parsed::Invalid);
    }

    #[test]
    fn request_heads() {
        let Parsed::Complete(head) =
            parse_request_head(b"GET /x HTTP/1.1\r\nHost: a.test\r\nHOST: b.test\r\n\r\nbody")
        else {
            panic!()
        };
        assert_eq!(head.method, "GET");
        assert_eq!(head.hosts, vec!["a.test", "b.test"]);
        assert_eq!(head.len, 47);
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\r\nHost: a"),
            Parsed::Incomplete
        );
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\r\n\x01\r\n\r\n"),
            Parsed::Invalid
        );
    }

    /// Heads two parsers could read differently are invalid: bare LF line ends, folded
    /// (obs-fold) header lines, whitespace before a header's colon.
    #[test]
    fn ambiguous_heads_are_invalid() {
        for text in [
            "GET / HTTP/1.1\nHost: a.test\n\n",
            "GET / HTTP/1.1\r\nHost: a.test\nX: y\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a.test\r\nX: y\r\n z\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding : chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a.test\r\n\tHost: b.test\r\n\r\n",
            "GET / HTTP/2.0\r\nHost: a.test\r\n\r\n",
        ] {
            assert_eq!(
                parse_request_head(text.as_bytes()),
                Parsed::Invalid,
                "{text:?}"
            );
        }
    }
}

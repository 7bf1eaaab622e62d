//! TLS through the gate. The first ClientHello's SNI was checked before the dial; a server
//! that answers with a HelloRetryRequest gets a second ClientHello in clear, and a program
//! could name another server in it. So the gate forwards the first hello, reads the server's
//! first handshake message, and when it is a HelloRetryRequest reads the client's second
//! hello and checks it the same way before anything more flows. After that the handshake is
//! encrypted (TLS 1.3) or past its hellos (TLS 1.2, whose renegotiation hellos are
//! encrypted): the stream is relayed opaque.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::time::Instant;

use crate::audit::Traffic;
use crate::flow::{check_hello, Refusal};
use crate::http_relay::{read_more, Sink};
use crate::meter::{Direction, Meter};
use crate::relay::relay;
use crate::report::Reason;
use crate::sniff::{client_hello_records, take_record, Parsed, HANDSHAKE, MAX_OPENING};

const CHANGE_CIPHER_SPEC: u8 = 0x14;
const APPLICATION_DATA: u8 = 0x17;
const SERVER_HELLO: u8 = 2;
/// A ServerHello with this random is a HelloRetryRequest (RFC 8446, 4.1.3).
const RETRY_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// The name a TLS stream is bound to, and what to do when a second hello names another.
pub(crate) struct TlsBinding<'a> {
    pub(crate) name: &'a str,
    /// Records the refusal; true when the run goes on anyway (report mode).
    pub(crate) on_refusal: &'a dyn Fn(Refusal) -> bool,
}

/// Relays a TLS stream whose first ClientHello (at the start of `preface`) was checked.
pub(crate) fn relay_tls(
    meter: &Meter,
    client: TcpStream,
    upstream: TcpStream,
    started: Instant,
    binding: &TlsBinding<'_>,
    mut preface: Vec<u8>,
) -> io::Result<Traffic> {
    let first_len = match client_hello_records(&preface) {
        Parsed::Complete((_, len)) => len,
        _ => preface.len(),
    };
    let mut pending = preface.split_off(first_len);
    let mut out = Sink::new(meter, Direction::Out, &upstream);
    let mut back = Sink::new(meter, Direction::In, &client);
    out.send(&preface).map_err(|_| io::ErrorKind::BrokenPipe)?;
    let (answer, retry) = read_server_hello(&upstream)?;
    back.send(&answer).map_err(|_| io::ErrorKind::BrokenPipe)?;
    if retry {
        if let Err(refusal) = second_hello(&client, &mut pending, binding.name) {
            let reason = refusal.reason;
            if !(binding.on_refusal)(refusal) {
                let _ = client.shutdown(Shutdown::Both);
                let _ = upstream.shutdown(Shutdown::Both);
                return Ok(Traffic {
                    bytes_out: out.moved,
                    bytes_in: back.moved,
                    ended_by: Some(reason),
                    ..Traffic::default()
                });
            }
        }
    }
    out.send(&pending).map_err(|_| io::ErrorKind::BrokenPipe)?;
    let (sent, received) = (out.moved, back.moved);
    let mut traffic = relay(meter, client, upstream, started)?;
    traffic.bytes_out += sent;
    traffic.bytes_in += received;
    Ok(traffic)
}

/// Reads the server's first handshake message: the bytes read, and whether it is a
/// HelloRetryRequest. Anything else (an alert, a TLS 1.2 ServerHello) ends the inspection.
fn read_server_hello(upstream: &TcpStream) -> io::Result<(Vec<u8>, bool)> {
    let mut answer = Vec::new();
    loop {
        let mut handshake = Vec::new();
        let mut rest = answer.as_slice();
        while let Some((kind, payload, after)) = take_record(rest) {
            if kind != HANDSHAKE {
                return Ok((answer, false));
            }
            handshake.extend_from_slice(payload);
            rest = after;
        }
        // type (1), length (3), legacy_version (2), then the random.
        if let Some(random) = handshake.get(6..38) {
            return Ok((
                answer,
                handshake[0] == SERVER_HELLO && random == RETRY_RANDOM,
            ));
        }
        if answer.len() >= MAX_OPENING || !read_more(upstream, &mut answer)? {
            return Ok((answer, false));
        }
    }
}

/// Reads the client's second ClientHello into `pending` (past change_cipher_spec and early
/// data records) and checks it. A client that sends something else instead (an alert) is
/// relayed as it is: no hello, nothing to check.
fn second_hello(client: &TcpStream, pending: &mut Vec<u8>, name: &str) -> Result<(), Refusal> {
    let unreadable = || {
        Refusal::with(
            Reason::UnsafeRequest,
            "a second ClientHello the gate cannot read",
        )
    };
    loop {
        let mut offset = 0;
        while let Some((kind, _, after)) = take_record(&pending[offset..]) {
            if kind != CHANGE_CIPHER_SPEC && kind != APPLICATION_DATA {
                break;
            }
            offset = pending.len() - after.len();
        }
        match pending.get(offset) {
            Some(&HANDSHAKE) => match client_hello_records(&pending[offset..]) {
                Parsed::Complete((hello, _)) => return check_hello(name, &hello),
                Parsed::Invalid => return Err(unreadable()),
                Parsed::Incomplete => {}
            },
            Some(_) => return Ok(()),
            None => {}
        }
        if pending.len() >= MAX_OPENING {
            return Err(unreadable());
        }
        match read_more(client, pending) {
            Ok(true) => {}
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn server_hello(random: [u8; 32], split: bool) -> Vec<u8> {
        let mut body = vec![SERVER_HELLO, 0, 0, 38, 3, 3];
        body.extend(random);
        let parts = if split {
            body.chunks(10).collect()
        } else {
            vec![&body[..]]
        };
        parts
            .into_iter()
            .flat_map(|part| [&[HANDSHAKE, 3, 3, 0, part.len() as u8][..], part].concat())
            .collect()
    }

    /// What `read_server_hello` makes of these bytes, sent over loopback.
    fn read(bytes: &[u8]) -> (usize, bool) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut server = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (gate_side, _) = listener.accept().unwrap();
        server.write_all(bytes).unwrap();
        server.shutdown(Shutdown::Write).unwrap();
        let (answer, retry) = read_server_hello(&gate_side).unwrap();
        (answer.len(), retry)
    }

    #[test]
    fn a_hello_retry_request_is_recognised_across_records() {
        let retry = server_hello(RETRY_RANDOM, true);
        assert_eq!(read(&retry), (retry.len(), true));
        let plain = server_hello([7; 32], false);
        assert_eq!(read(&plain), (plain.len(), false));
        let alert = [0x15, 3, 3, 0, 2, 2, 40];
        assert_eq!(read(&alert), (alert.len(), false));
        assert_eq!(read(&retry[..20]), (20, false));
    }
}

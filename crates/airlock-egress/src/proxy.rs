//! The in-sandbox proxy endpoint, for programs that honour proxy variables: HTTP CONNECT,
//! absolute-form HTTP and SOCKS5 (CONNECT only) on one port, told apart by the first byte.
//! Refusals are said in-band: an HTTP status with an `X-Airlock-Egress` header naming the
//! reason, or the SOCKS5 reply code for "not allowed by ruleset".

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::sync::Arc;

use crate::flow::{
    absolute_authority, authority_names, reset, Attempt, Destination, Refusal, SNIFF_TIMEOUT,
};
use crate::gate::{Shared, StreamKey};
use crate::host::split_host_port;
use crate::http_relay::framing;
use crate::report::{Channel, Protocol, Reason};
use crate::rules::Access;
use crate::sniff::{read_opening, Opening, RequestHead};

const SOCKS_VERSION: u8 = 5;

/// Serves one connection to the proxy endpoint.
pub(crate) fn serve_proxy(shared: Arc<Shared>, mut client: TcpStream) {
    let registration = shared.register(&client);
    let mut first = [0u8; 1];
    let read = client
        .set_read_timeout(Some(SNIFF_TIMEOUT))
        .and_then(|()| client.read(&mut first));
    if !matches!(read, Ok(1)) {
        return;
    }
    if first[0] == SOCKS_VERSION {
        serve_socks5(&shared, client, &registration);
    } else {
        serve_http(&shared, client, &registration, first[0]);
    }
}

/// The gate's part once a proxy request names its destination: rules, caps, dial.
fn open(
    attempt: &mut Attempt<'_>,
    destination: &Destination,
    port: u16,
    registration: &StreamKey<'_>,
) -> Result<(Access, TcpStream), Refusal> {
    attempt.set_target(destination, port);
    let access = attempt.check_rules(destination, port)?;
    attempt.admit()?;
    let upstream = attempt.connect(destination, port, registration)?;
    Ok((access, upstream))
}

fn serve_http(shared: &Shared, mut client: TcpStream, registration: &StreamKey<'_>, first: u8) {
    let attempt = Attempt::new(shared, Channel::HttpProxy);
    let head = match read_opening(&mut client, vec![first], SNIFF_TIMEOUT) {
        Ok((Opening::Http(head), bytes)) => (head, bytes),
        _ => return refuse_http(attempt, &mut client, Refusal::new(Reason::BadRequest)),
    };
    let (head, bytes) = head;
    if head.method.eq_ignore_ascii_case("CONNECT") {
        connect_tunnel(attempt, client, registration, &head, bytes);
    } else {
        forward_request(attempt, client, registration, &head, bytes);
    }
}

/// `CONNECT host:port`: checks and dials, answers 200, then ties the tunnel's stream to the
/// name as a captured stream is.
fn connect_tunnel(
    mut attempt: Attempt<'_>,
    mut client: TcpStream,
    registration: &StreamKey<'_>,
    head: &RequestHead,
    bytes: Vec<u8>,
) {
    let Some((destination, port)) = parse_authority(&head.target, None) else {
        return refuse_http(
            attempt,
            &mut client,
            Refusal::with(Reason::BadRequest, head.target.clone()),
        );
    };
    let (access, upstream) = match open(&mut attempt, &destination, port, registration) {
        Ok(opened) => opened,
        Err(refusal) => return refuse_http(attempt, &mut client, refusal),
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let leftover = bytes[head.len..].to_vec();
    match attempt.check_stream(&mut client, leftover, &destination, access, port) {
        Ok(preface) => attempt.relay(client, upstream, &preface),
        Err(refusal) => {
            attempt.refuse(refusal);
            reset(&client);
        }
    }
}

/// Absolute-form `GET http://host[:port]/path`: checks the URL's host (and `Host`) and the
/// body's framing, dials, and forwards the request in origin form with `Connection: close`;
/// any later request the program sends on the connection is checked against the same name
/// (and refused, closing the connection, when it names another).
fn forward_request(
    mut attempt: Attempt<'_>,
    mut client: TcpStream,
    registration: &StreamKey<'_>,
    head: &RequestHead,
    bytes: Vec<u8>,
) {
    attempt.record.protocol = Some(Protocol::Http);
    let target = match split_absolute(&head.target) {
        Some(target) => target,
        None => {
            return refuse_http(
                attempt,
                &mut client,
                Refusal::with(Reason::BadRequest, head.target.clone()),
            )
        }
    };
    let Some((destination, port)) = parse_authority(target.authority, Some(80)) else {
        return refuse_http(
            attempt,
            &mut client,
            Refusal::with(Reason::BadRequest, head.target.clone()),
        );
    };
    if let Some(refusal) = host_headers_disagree(head, &destination, port) {
        return refuse_http(attempt, &mut client, refusal);
    }
    if let Err(refusal) = framing(head) {
        return refuse_http(attempt, &mut client, refusal);
    }
    let (access, upstream) = match open(&mut attempt, &destination, port, registration) {
        Ok(opened) => opened,
        Err(refusal) => return refuse_http(attempt, &mut client, refusal),
    };
    if let (Destination::Name(name), Access::NameBound) = (&destination, access) {
        attempt.bind_requests(name, port);
    }
    let mut preface = origin_form_head(head, target.authority, target.path);
    preface.extend_from_slice(&bytes[head.len..]);
    attempt.relay(client, upstream, &preface);
}

/// The parts of `http://authority/path`.
struct AbsoluteTarget<'a> {
    authority: &'a str,
    path: &'a str,
}

fn split_absolute(target: &str) -> Option<AbsoluteTarget<'_>> {
    let scheme_end = target.find("://")?;
    if !target[..scheme_end].eq_ignore_ascii_case("http") {
        return None;
    }
    let authority = absolute_authority(target)?;
    let rest = &target[scheme_end + 3..];
    let path_start = rest.find(['/', '?']).unwrap_or(rest.len());
    let path = &rest[path_start..];
    Some(AbsoluteTarget {
        authority,
        path: if path.is_empty() { "/" } else { path },
    })
}

/// Every `Host` header must name the URL's host.
fn host_headers_disagree(
    head: &RequestHead,
    destination: &Destination,
    port: u16,
) -> Option<Refusal> {
    let Destination::Name(name) = destination else {
        return None;
    };
    head.hosts
        .iter()
        .find(|host| !authority_names(host, name, port))
        .map(|host| Refusal::with(Reason::HostMismatch, host.clone()))
}

/// The request head in origin form, proxy headers dropped, `Host` set to the authority and
/// `Connection: close` unless the request upgrades (WebSocket).
fn origin_form_head(head: &RequestHead, authority: &str, path: &str) -> Vec<u8> {
    let version = "HTTP/1.1";
    let upgrading = head
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("upgrade"));
    let mut text = format!(
        "{} {} {}\r\nHost: {}\r\n",
        head.method, path, version, authority
    );
    let dropped = [
        "host",
        "proxy-connection",
        "proxy-authorization",
        "connection",
        "keep-alive",
    ];
    for (name, value) in &head.headers {
        if !dropped.iter().any(|d| name.eq_ignore_ascii_case(d)) {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    text.push_str(if upgrading {
        "Connection: Upgrade\r\n\r\n"
    } else {
        "Connection: close\r\n\r\n"
    });
    text.into_bytes()
}

/// `host:port` (port required unless a default is given); numeric hosts are addresses.
fn parse_authority(authority: &str, default_port: Option<u16>) -> Option<(Destination, u16)> {
    let (host, port) = split_host_port(authority).ok()?;
    let port = match port {
        Some(text) => text.parse::<u16>().ok().filter(|&p| p != 0)?,
        None => default_port?,
    };
    Some((Destination::parse(host)?, port))
}

fn refuse_http(attempt: Attempt<'_>, client: &mut TcpStream, refusal: Refusal) {
    let reason = refusal.reason;
    attempt.refuse(refusal);
    let _ = write_http_refusal(client, reason);
}

/// An HTTP refusal naming the reason (403 for policy, 429 for caps, 502 when the
/// destination could not be reached, 400 for a request the gate cannot read).
pub(crate) fn write_http_refusal(client: &mut TcpStream, reason: Reason) -> io::Result<()> {
    let status = match reason {
        Reason::BadRequest | Reason::UnsupportedCommand => "400 Bad Request",
        Reason::ResolveFailed | Reason::ConnectFailed => "502 Bad Gateway",
        Reason::LimitConnections
        | Reason::LimitConcurrent
        | Reason::LimitBytesOut
        | Reason::LimitBytesIn
        | Reason::LimitDnsQueries => "429 Too Many Requests",
        _ => "403 Forbidden",
    };
    let reason = reason.as_str();
    let body = format!("airlock egress refused this connection: {reason}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nX-Airlock-Egress: {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes())
}

/// SOCKS5 (RFC 1928), no authentication, CONNECT only.
fn serve_socks5(shared: &Shared, mut client: TcpStream, registration: &StreamKey<'_>) {
    let mut attempt = Attempt::new(shared, Channel::Socks5);
    let request = match read_socks_request(&mut client) {
        Ok(request) => request,
        Err(code) => {
            let _ = socks_reply(&mut client, code);
            return attempt.refuse(Refusal::new(if code == 7 {
                Reason::UnsupportedCommand
            } else {
                Reason::BadRequest
            }));
        }
    };
    let (destination, port) = request;
    let (access, upstream) = match open(&mut attempt, &destination, port, registration) {
        Ok(opened) => opened,
        Err(refusal) => {
            let _ = socks_reply(&mut client, socks_code(refusal.reason));
            return attempt.refuse(refusal);
        }
    };
    if socks_reply(&mut client, 0).is_err() {
        return;
    }
    match attempt.check_stream(&mut client, Vec::new(), &destination, access, port) {
        Ok(preface) => attempt.relay(client, upstream, &preface),
        Err(refusal) => {
            attempt.refuse(refusal);
            reset(&client);
        }
    }
}

/// Reads the greeting (version byte already read) and the request; `Err` carries the SOCKS
/// reply code to send.
fn read_socks_request(client: &mut TcpStream) -> Result<(Destination, u16), u8> {
    let general_failure = 1;
    let methods = read_vec8(client).map_err(|_| general_failure)?;
    if !methods.contains(&0) {
        let _ = client.write_all(&[SOCKS_VERSION, 0xff]);
        return Err(general_failure);
    }
    client
        .write_all(&[SOCKS_VERSION, 0])
        .map_err(|_| general_failure)?;
    let mut header = [0u8; 4];
    client
        .read_exact(&mut header)
        .map_err(|_| general_failure)?;
    let [version, command, _, address_type] = header;
    if version != SOCKS_VERSION {
        return Err(general_failure);
    }
    let destination = read_socks_address(client, address_type)?;
    let mut port = [0u8; 2];
    client.read_exact(&mut port).map_err(|_| general_failure)?;
    if command != 1 {
        return Err(7); // command not supported: BIND and UDP ASSOCIATE are refused
    }
    Ok((destination, u16::from_be_bytes(port)))
}

fn read_socks_address(client: &mut TcpStream, address_type: u8) -> Result<Destination, u8> {
    let general_failure = 1;
    match address_type {
        1 => {
            let mut octets = [0u8; 4];
            client
                .read_exact(&mut octets)
                .map_err(|_| general_failure)?;
            Ok(Destination::Address(IpAddr::V4(Ipv4Addr::from(octets))))
        }
        4 => {
            let mut octets = [0u8; 16];
            client
                .read_exact(&mut octets)
                .map_err(|_| general_failure)?;
            Ok(Destination::Address(IpAddr::V6(Ipv6Addr::from(octets))))
        }
        3 => {
            let name = read_vec8(client).map_err(|_| general_failure)?;
            let name = String::from_utf8(name).map_err(|_| general_failure)?;
            Destination::parse(&name).ok_or(general_failure)
        }
        _ => Err(8), // address type not supported
    }
}

fn read_vec8(client: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 1];
    client.read_exact(&mut len)?;
    let mut bytes = vec![0u8; usize::from(len[0])];
    client.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// The SOCKS5 reply code for a refusal.
fn socks_code(reason: Reason) -> u8 {
    match reason {
        Reason::ResolveFailed => 4, // host unreachable
        Reason::ConnectFailed => 5, // connection refused
        Reason::BadRequest => 1,    // general failure
        _ => 2,                     // connection not allowed by ruleset
    }
}

fn socks_reply(client: &mut TcpStream, code: u8) -> io::Result<()> {
    client.write_all(&[SOCKS_VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sniff::{parse_request_head, Parsed};

    #[test]
    fn absolute_form_is_rewritten_to_origin_form() {
        let Parsed::Complete(head) = parse_request_head(
            b"GET http://a.test:8080/p?q HTTP/1.1\r\nHost: a.test:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
        ) else {
            panic!()
        };
        let target = split_absolute(&head.target).unwrap();
        assert_eq!((target.authority, target.path), ("a.test:8080", "/p?q"));
        let text =
            String::from_utf8(origin_form_head(&head, target.authority, target.path)).unwrap();
        assert_eq!(
            text,
            "GET /p?q HTTP/1.1\r\nHost: a.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        assert!(split_absolute("https://a.test/").is_none());
        assert!(split_absolute("/relative").is_none());
    }

    #[test]
    fn authorities_with_numeric_hosts_are_addresses() {
        let parse = |t| parse_authority(t, Some(80));
        assert_eq!(
            parse("2130706433:80"),
            Some((Destination::Address("127.0.0.1".parse().unwrap()), 80))
        );
        assert_eq!(
            parse("0x7f.1"),
            Some((Destination::Address("127.0.0.1".parse().unwrap()), 80))
        );
        assert_eq!(
            parse("[::ffff:127.0.0.1]:443"),
            Some((
                Destination::Address("::ffff:127.0.0.1".parse().unwrap()),
                443
            ))
        );
        assert_eq!(
            parse("A.test"),
            Some((Destination::Name("a.test".into()), 80))
        );
        assert_eq!(parse_authority("a.test", None), None);
        assert_eq!(parse("a.test:0"), None);
    }
}

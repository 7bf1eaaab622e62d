//! One connection's way through the gate, shared by captured streams and proxy requests:
//! rules, the name tied to the stream, caps, resolution, address classes, the dial, the relay.
//!
//! Under `report` mode a policy refusal (not allowed, denied, SNI or Host mismatch) is noted as
//! `would_deny` and the connection goes on; non-public addresses, caps and failures refuse in
//! every mode.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{connect, socket_with, sockopt, AddressFamily, SocketFlags, SocketType};

use crate::address::classify;
use crate::dns::is_placeholder;
use crate::gate::{Shared, StreamKey};
use crate::host::{parse_host, split_host_port, Host};
use crate::http_relay::{framing, relay_requests, upgrade_of, Binding};
use crate::meter::Direction;
use crate::policy::GateMode;
use crate::report::{Channel, Decision, DecisionRecord, Protocol, Reason};
use crate::rules::{Access, RuleVerdict};
use crate::sniff::{read_opening, ClientHello, Opening, RequestHead};
use crate::tls_relay::{relay_tls, TlsBinding};

/// How long the gate waits for a ClientHello or a request head.
pub(crate) const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// In report mode, how long before a silent stream (a server-speaks-first protocol) is
/// relayed as raw TCP.
const REPORT_SNIFF_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a dial may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a connection wants to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Destination {
    /// A name (from a placeholder, a proxy request or a SOCKS request).
    Name(String),
    /// An address asked for directly.
    Address(IpAddr),
}

impl Destination {
    /// Reads a host from a proxy request: numeric forms are addresses.
    pub(crate) fn parse(host: &str) -> Option<Destination> {
        match parse_host(host).ok()? {
            Host::Name(name) => Some(Destination::Name(name)),
            Host::Address(ip) => Some(Destination::Address(ip)),
        }
    }
}

/// Why a connection is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: Reason,
    pub(crate) detail: Option<String>,
}

impl Refusal {
    pub(crate) fn new(reason: Reason) -> Refusal {
        Refusal {
            reason,
            detail: None,
        }
    }

    pub(crate) fn with(reason: Reason, detail: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            detail: Some(detail.into()),
        }
    }
}

/// One connection being decided.
pub(crate) struct Attempt<'a> {
    shared: &'a Shared,
    pub(crate) record: DecisionRecord,
    would_deny: Option<Refusal>,
    started: Instant,
    /// What the stream is bound to once its opening was read: later requests or hellos on
    /// it are checked against the same name.
    bound: Option<Bound>,
}

/// A stream bound to a name by its opening.
enum Bound {
    /// Plain HTTP: every request must name it (and the port).
    Http(String, u16),
    /// TLS: a second ClientHello (after HelloRetryRequest) must name it too.
    Tls(String),
}

impl<'a> Attempt<'a> {
    pub(crate) fn new(shared: &'a Shared, channel: Channel) -> Attempt<'a> {
        Attempt {
            shared,
            record: shared.audit.new_record(channel),
            would_deny: None,
            started: Instant::now(),
            bound: None,
        }
    }

    /// Notes the destination in the record.
    pub(crate) fn set_target(&mut self, destination: &Destination, port: u16) {
        self.record.port = Some(port);
        match destination {
            Destination::Name(name) => self.record.name = Some(name.clone()),
            Destination::Address(ip) => self.record.address = Some(*ip),
        }
    }

    /// A policy refusal: final under `allowlist`, noted under `report`.
    fn soft(&mut self, refusal: Refusal) -> Result<(), Refusal> {
        match self.shared.policy.mode {
            GateMode::Allowlist => Err(refusal),
            GateMode::Report => {
                self.would_deny.get_or_insert(refusal);
                Ok(())
            }
        }
    }

    /// What the rules allow for this destination and port.
    pub(crate) fn check_rules(
        &mut self,
        destination: &Destination,
        port: u16,
    ) -> Result<Access, Refusal> {
        let rules = &self.shared.policy.rules;
        let verdict = match destination {
            Destination::Name(name) => rules.check_name(name, port),
            Destination::Address(ip) => rules.check_address(*ip, port),
        };
        let refusal = match verdict {
            RuleVerdict::Allowed(access) => return Ok(access),
            RuleVerdict::Denied(rule) => Refusal::with(Reason::Denied, rule),
            RuleVerdict::NotAllowed => Refusal::new(Reason::NotAllowed),
        };
        self.soft(refusal)?;
        // Report mode goes on: sniff names (to learn their protocol), relay addresses raw.
        Ok(match destination {
            Destination::Name(_) => Access::NameBound,
            Destination::Address(_) => Access::RawTcp,
        })
    }

    /// Reads the stream's opening when the name must be tied to it (TLS SNI or HTTP `Host`),
    /// checks it, and returns every byte read (to forward). `prefix` holds bytes already read.
    pub(crate) fn check_stream(
        &mut self,
        client: &mut TcpStream,
        prefix: Vec<u8>,
        destination: &Destination,
        access: Access,
        port: u16,
    ) -> Result<Vec<u8>, Refusal> {
        let name = match (destination, access) {
            (Destination::Name(name), Access::NameBound) => name.clone(),
            (Destination::Name(_), Access::RawTcp) => {
                self.record.protocol = Some(Protocol::Tcp);
                return Ok(prefix);
            }
            (Destination::Address(_), _) => return Ok(prefix),
        };
        let timeout = match self.shared.policy.mode {
            GateMode::Allowlist => SNIFF_TIMEOUT,
            GateMode::Report => REPORT_SNIFF_TIMEOUT,
        };
        let (opening, bytes) =
            read_opening(client, prefix, timeout).map_err(|_| Refusal::new(Reason::NoRequest))?;
        let _ = client.set_read_timeout(None);
        self.record.protocol = Some(protocol_of(&opening));
        if let Err(refusal) = check_opening(&name, port, &opening, &bytes) {
            self.soft(refusal)?;
        }
        match &opening {
            Opening::Http(_) => self.bind_requests(&name, port),
            Opening::Tls(hello) => {
                if hello.encrypted {
                    self.record.detail = Some(ECH_OUTER.to_string());
                }
                self.bound = Some(Bound::Tls(name));
            }
            Opening::Other => {}
        }
        Ok(bytes)
    }

    /// Checks every later request of this plain-HTTP stream against the name, not only the
    /// first.
    pub(crate) fn bind_requests(&mut self, name: &str, port: u16) {
        self.bound = Some(Bound::Http(name.to_string(), port));
    }

    /// Takes a connection slot under the caps.
    pub(crate) fn admit(&mut self) -> Result<(), Refusal> {
        self.shared
            .meter
            .admit_connection()
            .map_err(|kind| Refusal::new(Reason::limit(kind)))
    }

    /// Resolves (for names), classifies every address and dials the first usable one,
    /// exactly the address checked.
    pub(crate) fn connect(
        &mut self,
        destination: &Destination,
        port: u16,
        registration: &StreamKey<'_>,
    ) -> Result<TcpStream, Refusal> {
        let candidates = self.candidates(destination, port)?;
        let mut last_error = String::new();
        for ip in candidates {
            self.record.address = Some(ip);
            match dial(SocketAddr::new(ip, port), registration) {
                Ok(stream) => return Ok(stream),
                Err(e) => last_error = e.to_string(),
            }
        }
        Err(Refusal::with(Reason::ConnectFailed, last_error))
    }

    fn candidates(&mut self, destination: &Destination, port: u16) -> Result<Vec<IpAddr>, Refusal> {
        let addresses = match destination {
            Destination::Address(ip) => vec![*ip],
            Destination::Name(name) => self
                .shared
                .resolver
                .resolve(name)
                .map_err(|e| Refusal::with(Reason::ResolveFailed, e.to_string()))?,
        };
        let mut first_refusal = None;
        let mut usable = Vec::new();
        for ip in addresses {
            match self.check_address(ip, port) {
                Ok(()) => usable.push(ip),
                Err(refusal) => {
                    first_refusal.get_or_insert((ip, refusal));
                }
            }
        }
        if !usable.is_empty() {
            return Ok(usable);
        }
        let (ip, refusal) =
            first_refusal.ok_or_else(|| Refusal::with(Reason::ResolveFailed, "no address"))?;
        self.record.address = Some(ip);
        Err(refusal)
    }

    /// Every non-public class and the gate's own addresses are refused in every mode unless an
    /// allow range opens them explicitly (a single-address range for its own addresses); deny ranges apply to resolved addresses too.
    fn check_address(&mut self, ip: IpAddr, port: u16) -> Result<(), Refusal> {
        let rules = &self.shared.policy.rules;
        let (class, range) = classify(ip);
        if !class.is_public() && !rules.exempts(ip, port, range, false) {
            let detail = serde_json::to_value(class)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string));
            return Err(Refusal {
                reason: Reason::NonPublicAddress,
                detail,
            });
        }
        if self.shared.own.contains(ip) && !rules.exempts(ip, port, Some(ip.into()), true) {
            return Err(Refusal::with(Reason::OwnAddress, ip.to_string()));
        }
        match rules.denying_address(ip, port) {
            Some(rule) => self.soft(Refusal::with(Reason::Denied, rule.text.clone())),
            None => Ok(()),
        }
    }

    /// Records the refusal.
    pub(crate) fn refuse(mut self, refusal: Refusal) {
        self.record.decision = Decision::Deny;
        self.record.reason = refusal.reason;
        self.record.detail = refusal.detail;
        self.record.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.shared.audit.decide(self.record);
    }

    /// Records the decision, forwards `preface` and relays until both sides close.
    pub(crate) fn relay(mut self, client: TcpStream, upstream: TcpStream, preface: &[u8]) {
        let (decision, reason, detail) = match self.would_deny.take() {
            Some(refusal) => (Decision::WouldDeny, refusal.reason, refusal.detail),
            None => (Decision::Allow, Reason::Allowed, self.record.detail.take()),
        };
        self.record.decision = decision;
        self.record.reason = reason;
        self.record.detail = detail;
        // The proxy's request reading left a timeout on the stream: a relayed stream may idle.
        let _ = client.set_read_timeout(None);
        let slot = self.shared.audit.decide(self.record.clone());
        let mut traffic = self.relay_stream(client, upstream, preface);
        traffic.duration = self.started.elapsed();
        if traffic.ended_by.is_none() && self.shared.closing() {
            traffic.ended_by = Some(Reason::GateShutdown);
        }
        self.shared.audit.close(slot, traffic);
    }
}

impl Attempt<'_> {
    /// Relays as the stream's binding asks: request by request (plain HTTP), past the hellos
    /// (TLS), or opaque.
    fn relay_stream(
        &self,
        client: TcpStream,
        upstream: TcpStream,
        preface: &[u8],
    ) -> crate::audit::Traffic {
        let on_refusal = |refusal: Refusal| self.refuse_request(refusal);
        let (meter, started) = (&self.shared.meter, self.started);
        let relayed = match &self.bound {
            Some(Bound::Http(name, port)) => {
                let binding = Binding {
                    name,
                    port: *port,
                    on_refusal: &on_refusal,
                };
                relay_requests(meter, client, upstream, started, &binding, preface.to_vec())
            }
            Some(Bound::Tls(name)) => {
                let binding = TlsBinding {
                    name,
                    on_refusal: &on_refusal,
                };
                relay_tls(meter, client, upstream, started, &binding, preface.to_vec())
            }
            None => Ok(self.relay_opaque(client, upstream, preface)),
        };
        relayed.unwrap_or_default()
    }

    /// Forwards `preface`, then relays both ways unparsed.
    fn relay_opaque(
        &self,
        client: TcpStream,
        mut upstream: TcpStream,
        preface: &[u8],
    ) -> crate::audit::Traffic {
        let meter = &self.shared.meter;
        let granted = meter.take_bytes(Direction::Out, preface.len() as u64) as usize;
        let sent = upstream.write_all(&preface[..granted]).is_ok() && granted == preface.len();
        let mut traffic = if sent {
            crate::relay::relay(meter, client, upstream, self.started).unwrap_or_default()
        } else {
            crate::audit::Traffic {
                ended_by: (granted < preface.len()).then_some(Reason::LimitBytesOut),
                ..Default::default()
            }
        };
        traffic.bytes_out += granted as u64;
        traffic
    }

    /// Records a later request on an allowed stream that the gate refused (a decision of its
    /// own); true when the stream goes on (report mode).
    fn refuse_request(&self, refusal: Refusal) -> bool {
        let allowed = &self.record;
        let mut record = self.shared.audit.new_record(allowed.channel);
        record.name = allowed.name.clone();
        record.port = allowed.port;
        record.address = allowed.address;
        record.protocol = allowed.protocol;
        record.reason = refusal.reason;
        record.detail = refusal.detail;
        record.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let goes_on = self.shared.policy.mode == GateMode::Report;
        record.decision = if goes_on {
            Decision::WouldDeny
        } else {
            Decision::Deny
        };
        self.shared.audit.decide(record);
        goes_on
    }
}

/// A non-blocking connect the end of the run can abort (the socket is registered first, and
/// shutting down a connecting socket wakes the wait).
fn dial(address: SocketAddr, registration: &StreamKey<'_>) -> std::io::Result<TcpStream> {
    let family = if address.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    let stream = TcpStream::from(fd);
    if !registration.add(&stream) {
        return Err(std::io::ErrorKind::ConnectionAborted.into());
    }
    match connect(&stream, &address) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let timeout = Timespec::try_from(CONNECT_TIMEOUT).map_err(std::io::Error::other)?;
    let mut fds = [PollFd::new(&stream, PollFlags::OUT)];
    if poll(&mut fds, Some(&timeout))? == 0 {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    if let Some(error) = stream.take_error()? {
        return Err(error);
    }
    stream.peer_addr()?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}

fn protocol_of(opening: &Opening) -> Protocol {
    match opening {
        Opening::Tls(_) => Protocol::Tls,
        Opening::Http(_) => Protocol::Http,
        Opening::Other => Protocol::Tcp,
    }
}

/// Ties the stream to the name: TLS must name it in clear SNI, HTTP in its one `Host` (and
/// in an absolute-form target); anything else is refused on a name-bound rule. `bytes` is
/// what the stream sent.
pub(crate) fn check_opening(
    name: &str,
    port: u16,
    opening: &Opening,
    bytes: &[u8],
) -> Result<(), Refusal> {
    match opening {
        Opening::Tls(hello) => check_hello(name, hello),
        Opening::Http(head) => check_head(name, port, head),
        Opening::Other if bytes.is_empty() => Err(Refusal::new(Reason::NoRequest)),
        Opening::Other if bytes.starts_with(H2_PREFACE) => {
            Err(Refusal::with(Reason::ProtocolNotAllowed, H2C_REFUSED))
        }
        Opening::Other => Err(Refusal::new(Reason::ProtocolNotAllowed)),
    }
}

/// The start of HTTP/2's connection preface (prior knowledge: HTTP/2 without TLS).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2";
/// Why h2c is refused: each HTTP/2 stream could name another host (`:authority`), and the
/// gate checks names per request on HTTP/1.1 only.
pub(crate) const H2C_REFUSED: &str =
    "h2c (HTTP/2 without TLS) is not relayed: use HTTP/1.1, or HTTPS (HTTP/2 over TLS works)";

/// The detail of an allowed stream whose ClientHello carried ECH: its outer SNI is the
/// allowed name; an inner ClientHello, if real, is not seen.
const ECH_OUTER: &str = "ech: outer SNI checked, inner hello not seen";

/// The ClientHello's SNI must be the name. An encrypted ClientHello (ECH, or Chromium's
/// GREASE ECH) passes only when its outer SNI is the name: GREASE keeps the real name
/// outside, and a real ECH whose public name is the allowed name reaches the same server.
pub(crate) fn check_hello(name: &str, hello: &ClientHello) -> Result<(), Refusal> {
    let Some(sni) = hello.sni.as_deref() else {
        let reason = if hello.encrypted {
            Reason::EchRefused
        } else {
            Reason::SniMissing
        };
        return Err(Refusal::new(reason));
    };
    match parse_host(sni) {
        Ok(Host::Name(seen)) if seen == name => Ok(()),
        _ if hello.encrypted => Err(Refusal::with(Reason::EchRefused, sni)),
        _ => Err(Refusal::with(Reason::SniMismatch, sni)),
    }
}

pub(crate) fn check_head(name: &str, port: u16, head: &RequestHead) -> Result<(), Refusal> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        return Err(Refusal::with(Reason::ConnectInTunnel, head.target.clone()));
    }
    let host = match head.hosts.as_slice() {
        [] => return Err(Refusal::new(Reason::HostMissing)),
        [one] => one,
        several => return Err(Refusal::with(Reason::HostMismatch, several.join(", "))),
    };
    if !authority_names(host, name, port) {
        return Err(Refusal::with(Reason::HostMismatch, host.clone()));
    }
    if let Some(authority) = absolute_authority(&head.target) {
        if !authority_names(authority, name, port) {
            return Err(Refusal::with(Reason::HostMismatch, head.target.clone()));
        }
    }
    match upgrade_of(head) {
        Some(protocol) if protocol.eq_ignore_ascii_case("h2c") => {
            Err(Refusal::with(Reason::UnsafeRequest, H2C_REFUSED))
        }
        Some(protocol) if !protocol.eq_ignore_ascii_case("websocket") => Err(Refusal::with(
            Reason::UnsafeRequest,
            format!("an Upgrade to {protocol} (only WebSocket is followed)"),
        )),
        _ => framing(head).map(|_| ()),
    }
}

/// True when `host[:port]` names exactly this name (and this port, when it has one).
pub(crate) fn authority_names(authority: &str, name: &str, port: u16) -> bool {
    let Ok((host, port_text)) = split_host_port(authority) else {
        return false;
    };
    let same_port = port_text.is_none_or(|p| p.parse::<u16>() == Ok(port));
    same_port && matches!(parse_host(host), Ok(Host::Name(seen)) if seen == name)
}

/// The authority of an absolute-form target (`http://host:port/path`).
pub(crate) fn absolute_authority(target: &str) -> Option<&str> {
    let (_, rest) = target.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    Some(
        authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host),
    )
}

/// Serves a connection captured from the sandbox (a program connecting to a placeholder or
/// an allowed address without a proxy).
pub(crate) fn serve_captured(shared: Arc<Shared>, mut client: TcpStream) {
    let registration = shared.register(&client);
    let mut attempt = Attempt::new(&shared, Channel::Capture);
    match captured_flow(&mut attempt, &mut client, &registration) {
        Ok((upstream, preface)) => attempt.relay(client, upstream, &preface),
        Err(refusal) => {
            let plain_http = attempt.record.protocol == Some(Protocol::Http);
            let reason = refusal.reason;
            attempt.refuse(refusal);
            // Plain HTTP hears why (a 403 naming the reason, then a clean close, so the
            // response is not lost to a reset); anything else is reset at once.
            if plain_http {
                let _ = crate::proxy::write_http_refusal(&mut client, reason);
                let _ = client.shutdown(std::net::Shutdown::Write);
            } else {
                reset(&client);
            }
        }
    }
}

fn captured_flow(
    attempt: &mut Attempt<'_>,
    client: &mut TcpStream,
    registration: &StreamKey<'_>,
) -> Result<(TcpStream, Vec<u8>), Refusal> {
    let local = client
        .local_addr()
        .map_err(|e| Refusal::with(Reason::BadRequest, e.to_string()))?;
    let (ip, port) = (local.ip().to_canonical(), local.port());
    let destination = if is_placeholder(ip) {
        let book = attempt
            .shared
            .book
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let name = book.name_for(ip).map(str::to_string);
        drop(book);
        attempt.record.address = Some(ip);
        Destination::Name(name.ok_or_else(|| Refusal::new(Reason::UnknownPlaceholder))?)
    } else {
        Destination::Address(ip)
    };
    attempt.set_target(&destination, port);
    let access = attempt.check_rules(&destination, port)?;
    let preface = attempt.check_stream(client, Vec::new(), &destination, access, port)?;
    attempt.admit()?;
    let upstream = attempt.connect(&destination, port, registration)?;
    Ok((upstream, preface))
}

/// Closes with a reset, so the program sees ECONNRESET at once rather than a clean end.
pub(crate) fn reset(stream: &TcpStream) {
    let _ = sockopt::set_socket_linger(stream, Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> RequestHead {
        match crate::sniff::parse_request_head(text.as_bytes()) {
            crate::sniff::Parsed::Complete(head) => head,
            other => panic!("{other:?}"),
        }
    }

    fn reason(result: Result<(), Refusal>) -> Option<Reason> {
        result.err().map(|r| r.reason)
    }

    #[test]
    fn tls_must_name_the_allowed_name_in_clear() {
        let hello = |sni: Option<&str>, encrypted| ClientHello {
            sni: sni.map(str::to_string),
            encrypted,
        };
        assert_eq!(
            reason(check_hello("a.test", &hello(Some("A.test."), false))),
            None
        );
        assert_eq!(
            reason(check_hello("a.test", &hello(Some("b.test"), false))),
            Some(Reason::SniMismatch)
        );
        assert_eq!(
            reason(check_hello("a.test", &hello(None, false))),
            Some(Reason::SniMissing)
        );
        assert_eq!(
            reason(check_hello("a.test", &hello(Some("a.test"), true))),
            None
        );
        assert_eq!(
            reason(check_hello("a.test", &hello(Some("public.example"), true))),
            Some(Reason::EchRefused)
        );
        assert_eq!(
            reason(check_hello("a.test", &hello(None, true))),
            Some(Reason::EchRefused)
        );
    }

    #[test]
    fn http_must_name_the_allowed_name() {
        let check = |text: &str| reason(check_head("a.test", 80, &head(text)));
        assert_eq!(check("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"), None);
        assert_eq!(check("GET / HTTP/1.1\r\nHost: A.TEST:80\r\n\r\n"), None);
        assert_eq!(
            check("GET / HTTP/1.1\r\nHost: a.test:8080\r\n\r\n"),
            Some(Reason::HostMismatch)
        );
        assert_eq!(
            check("GET / HTTP/1.1\r\nHost: b.test\r\n\r\n"),
            Some(Reason::HostMismatch)
        );
        assert_eq!(check("GET / HTTP/1.1\r\n\r\n"), Some(Reason::HostMissing));
        assert_eq!(
            check("GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Some(Reason::HostMismatch)
        );
        assert_eq!(
            check("GET http://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            Some(Reason::HostMismatch)
        );
        assert_eq!(
            check("CONNECT b.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            Some(Reason::ConnectInTunnel)
        );
        assert_eq!(
            check("GET /chat HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"),
            None
        );
    }

    #[test]
    fn authorities() {
        assert_eq!(
            absolute_authority("http://user@a.test:8080/x?y"),
            Some("a.test:8080")
        );
        assert_eq!(absolute_authority("/x"), None);
        assert!(!authority_names("[::1]:80", "a.test", 80));
        assert!(authority_names("a.test", "a.test", 443));
    }
}

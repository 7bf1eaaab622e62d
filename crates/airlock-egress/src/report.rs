//! The audit: one record per decision, counters, the limits hit, and (in report mode) a
//! suggested allow list. Everything serialises with serde; [`NetworkReport::write_ndjson`]
//! writes one JSON object per line.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::policy::GateMode;
use crate::rules::DEFAULT_PORTS;

/// A per-run cap, named as the reason a refusal records (`limit:bytes_out`), so a result's
/// `limits_hit` and its decisions use the same words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LimitKind {
    /// Connections in total.
    #[serde(rename = "limit:connections")]
    Connections,
    /// Connections at once.
    #[serde(rename = "limit:concurrent")]
    Concurrent,
    /// Bytes sent by the sandbox.
    #[serde(rename = "limit:bytes_out")]
    BytesOut,
    /// Bytes received by the sandbox.
    #[serde(rename = "limit:bytes_in")]
    BytesIn,
    /// DNS queries.
    #[serde(rename = "limit:dns_queries")]
    DnsQueries,
}

/// Why the gate decided as it did (or why an allowed stream ended early).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// The rules allow it.
    #[serde(rename = "allowed")]
    Allowed,
    /// No allow rule covers the name or address on that port.
    #[serde(rename = "not_allowed")]
    NotAllowed,
    /// A deny rule covers it.
    #[serde(rename = "denied")]
    Denied,
    /// Every address the name resolves to (or the address asked for) is not globally routable.
    #[serde(rename = "non_public_address")]
    NonPublicAddress,
    /// The address belongs to the machine running the gate.
    #[serde(rename = "own_address")]
    OwnAddress,
    /// The TLS ClientHello names another server than the allowed name.
    #[serde(rename = "sni_mismatch")]
    SniMismatch,
    /// The TLS ClientHello names no server.
    #[serde(rename = "sni_missing")]
    SniMissing,
    /// The TLS ClientHello is encrypted (ECH), so the name cannot be checked.
    #[serde(rename = "ech_refused")]
    EchRefused,
    /// The HTTP request names another host than the allowed name.
    #[serde(rename = "host_mismatch")]
    HostMismatch,
    /// The HTTP request names no host.
    #[serde(rename = "host_missing")]
    HostMissing,
    /// An HTTP CONNECT inside a stream (a proxy inside the tunnel).
    #[serde(rename = "connect_in_tunnel")]
    ConnectInTunnel,
    /// An HTTP request the gate cannot frame the way every server would (both
    /// `Transfer-Encoding` and `Content-Length`, an unknown coding, a malformed chunk, a head
    /// it cannot read), or an `Upgrade` it cannot follow: refused, never passed on unchecked.
    #[serde(rename = "unsafe_request")]
    UnsafeRequest,
    /// Neither TLS nor HTTP on a name rule without `tcp://`.
    #[serde(rename = "protocol_not_allowed")]
    ProtocolNotAllowed,
    /// The stream sent nothing the gate could check in time.
    #[serde(rename = "no_request")]
    NoRequest,
    /// The name has no address.
    #[serde(rename = "resolve_failed")]
    ResolveFailed,
    /// The checked address did not accept the connection.
    #[serde(rename = "connect_failed")]
    ConnectFailed,
    /// A placeholder address the DNS stub never handed out.
    #[serde(rename = "unknown_placeholder")]
    UnknownPlaceholder,
    /// A proxy request the gate cannot read.
    #[serde(rename = "bad_request")]
    BadRequest,
    /// A proxy command other than CONNECT (SOCKS BIND or UDP ASSOCIATE).
    #[serde(rename = "unsupported_command")]
    UnsupportedCommand,
    /// The connection cap.
    #[serde(rename = "limit:connections")]
    LimitConnections,
    /// The concurrent-connection cap.
    #[serde(rename = "limit:concurrent")]
    LimitConcurrent,
    /// The bytes-out cap.
    #[serde(rename = "limit:bytes_out")]
    LimitBytesOut,
    /// The bytes-in cap.
    #[serde(rename = "limit:bytes_in")]
    LimitBytesIn,
    /// The DNS-query cap.
    #[serde(rename = "limit:dns_queries")]
    LimitDnsQueries,
    /// The run ended while the stream was open.
    #[serde(rename = "gate_shutdown")]
    GateShutdown,
}

impl Reason {
    /// The reason for hitting a limit.
    pub fn limit(kind: LimitKind) -> Reason {
        match kind {
            LimitKind::Connections => Reason::LimitConnections,
            LimitKind::Concurrent => Reason::LimitConcurrent,
            LimitKind::BytesOut => Reason::LimitBytesOut,
            LimitKind::BytesIn => Reason::LimitBytesIn,
            LimitKind::DnsQueries => Reason::LimitDnsQueries,
        }
    }

    /// The reason as it appears in records (`not_allowed`, `limit:bytes_out`, ...).
    pub fn as_str(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// What the gate did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Let through.
    Allow,
    /// Refused.
    Deny,
    /// Report mode: let through, but the allowlist would have refused it.
    WouldDeny,
}

/// Where a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// A query to the in-sandbox DNS stub.
    Dns,
    /// A connection captured transparently (a program that ignores proxy variables).
    Capture,
    /// The in-sandbox HTTP proxy (CONNECT or absolute-form).
    HttpProxy,
    /// The in-sandbox SOCKS5 proxy.
    Socks5,
}

/// What a stream turned out to carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// TLS (SNI checked for names).
    Tls,
    /// Plain HTTP (`Host` checked for names).
    Http,
    /// Anything else (allowed only by `tcp://` and address rules).
    Tcp,
}

/// One decision of the gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// Sequence number within the run.
    pub id: u64,
    /// When the decision was made (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// Where the request came from.
    pub channel: Channel,
    /// The name asked for, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port asked for (none for DNS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The address dialled, or the address refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// What the stream carried, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Allow, deny or (report mode) would-deny.
    pub decision: Decision,
    /// Why.
    pub reason: Reason,
    /// Supporting detail: the SNI or Host seen, the deny rule, the DNS query type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Bytes from the sandbox to the destination.
    pub bytes_out: u64,
    /// Bytes from the destination to the sandbox.
    pub bytes_in: u64,
    /// How long the stream lasted, in milliseconds.
    pub duration_ms: f64,
    /// Why an allowed stream was cut short (`limit:bytes_out`, `gate_shutdown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<Reason>,
}

/// A decision as it happens (streamed to the daemon).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum GateEvent {
    /// A decision was made (a DNS answer, a refused or an accepted connection).
    Decided(DecisionRecord),
    /// An accepted connection closed; the record carries its bytes and duration.
    Closed(DecisionRecord),
}

/// Totals for the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Connections let through.
    pub connections_allowed: u64,
    /// Connections refused.
    pub connections_denied: u64,
    /// Bytes from the sandbox.
    pub bytes_out: u64,
    /// Bytes to the sandbox.
    pub bytes_in: u64,
    /// DNS queries answered with an address or an empty answer.
    pub dns_answered: u64,
    /// DNS queries refused (NXDOMAIN or REFUSED).
    pub dns_refused: u64,
}

/// The network part of a run's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkReport {
    /// Allowlist or report.
    pub mode: GateMode,
    /// Totals.
    pub counters: Counters,
    /// Every cap reached during the run.
    pub limits_hit: Vec<LimitKind>,
    /// One record per decision, in order.
    pub decisions: Vec<DecisionRecord>,
    /// Records not kept because the run made more than the gate keeps
    /// ([`crate::MAX_RECORDS`]); the counters still count them.
    pub decisions_dropped: u64,
    /// Report mode: allow rules that would let this run's traffic through.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub suggested_allow: Vec<String>,
}

impl NetworkReport {
    /// Writes every decision as one JSON object per line (NDJSON).
    pub fn write_ndjson(&self, mut out: impl Write) -> io::Result<()> {
        for record in &self.decisions {
            serde_json::to_writer(&mut out, record)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }

    /// True when the run reached this cap.
    pub fn hit(&self, kind: LimitKind) -> bool {
        self.limits_hit.contains(&kind)
    }
}

/// The allow rules that would have let the recorded connections through: a name on the
/// default ports as itself, on another port with `:PORT`, raw TCP as `tcp://name:PORT`, and
/// direct address connections as the address and port. Non-public refusals are left out:
/// they are refused in every mode.
pub fn suggest_allow(records: &[DecisionRecord]) -> Vec<String> {
    let suggestions: BTreeSet<String> = records
        .iter()
        .filter(|r| r.channel != Channel::Dns && r.decision != Decision::Deny)
        .filter_map(suggestion)
        .collect();
    suggestions.into_iter().collect()
}

fn suggestion(record: &DecisionRecord) -> Option<String> {
    let port = record.port?;
    match (&record.name, record.protocol) {
        (Some(name), Some(Protocol::Tcp)) => Some(format!("tcp://{name}:{port}")),
        (Some(name), _) if DEFAULT_PORTS.contains(&port) => Some(name.clone()),
        (Some(name), _) => Some(format!("{name}:{port}")),
        (None, _) => match record.address? {
            IpAddr::V4(ip) => Some(format!("{ip}:{port}")),
            IpAddr::V6(ip) => Some(format!("[{ip}]:{port}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        name: Option<&str>,
        port: u16,
        protocol: Protocol,
        decision: Decision,
    ) -> DecisionRecord {
        DecisionRecord {
            id: 0,
            time: String::new(),
            channel: Channel::Capture,
            name: name.map(str::to_string),
            port: Some(port),
            address: Some("203.0.113.9".parse().unwrap()),
            protocol: Some(protocol),
            decision,
            reason: Reason::NotAllowed,
            detail: None,
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: 0.0,
            ended_by: None,
        }
    }

    #[test]
    fn reasons_serialise_as_the_issue_spells_them() {
        assert_eq!(Reason::LimitBytesOut.as_str(), "limit:bytes_out");
        for kind in [
            LimitKind::Connections,
            LimitKind::Concurrent,
            LimitKind::BytesOut,
            LimitKind::BytesIn,
            LimitKind::DnsQueries,
        ] {
            let named = serde_json::to_value(kind).unwrap();
            assert_eq!(named, Reason::limit(kind).as_str(), "{kind:?}");
        }
        assert_eq!(Reason::NonPublicAddress.as_str(), "non_public_address");
        assert_eq!(Reason::SniMismatch.as_str(), "sni_mismatch");
    }

    #[test]
    fn suggestions_cover_each_shape() {
        let records = [
            record(Some("a.test"), 443, Protocol::Tls, Decision::WouldDeny),
            record(Some("a.test"), 80, Protocol::Http, Decision::Allow),
            record(Some("b.test"), 8443, Protocol::Tls, Decision::WouldDeny),
            record(Some("git.test"), 22, Protocol::Tcp, Decision::WouldDeny),
            record(None, 5432, Protocol::Tcp, Decision::WouldDeny),
            record(Some("never.test"), 443, Protocol::Tls, Decision::Deny),
        ];
        assert_eq!(
            suggest_allow(&records),
            vec![
                "203.0.113.9:5432",
                "a.test",
                "b.test:8443",
                "tcp://git.test:22"
            ]
        );
    }

    #[test]
    fn ndjson_has_one_object_per_line() {
        let report = NetworkReport {
            mode: GateMode::Allowlist,
            counters: Counters::default(),
            limits_hit: vec![LimitKind::BytesOut],
            decisions: vec![
                record(Some("a.test"), 443, Protocol::Tls, Decision::Allow),
                record(None, 80, Protocol::Http, Decision::Deny),
            ],
            decisions_dropped: 0,
            suggested_allow: vec![],
        };
        let mut out = Vec::new();
        report.write_ndjson(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2);
        for line in text.lines() {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(value["decision"].is_string() && value["reason"] == "not_allowed");
        }
        assert!(report.hit(LimitKind::BytesOut));
    }
}

//! The in-sandbox DNS stub's logic: placeholder addresses for allowed names, NXDOMAIN for the
//! rest, and nothing ever forwarded.
//!
//! A query never leaves the gate: an allowed name gets a placeholder address (a slot in
//! [`PLACEHOLDER_V4`] and the same slot in [`PLACEHOLDER_V6`]), and the gate resolves the real
//! name only when the program connects to that placeholder. A name that is not allowed gets
//! NXDOMAIN at once, so `secret-data.attacker.example` carries nothing out.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};

use crate::host::{parse_host, Host};
use crate::plan::{PLACEHOLDER_V4, PLACEHOLDER_V6};
use crate::policy::{EgressPolicy, GateMode};
use crate::report::{Decision, Reason};

/// The TTL of placeholder answers: short, so a program re-asks rather than caching across
/// runs (the placeholder of a name is stable within a run anyway).
pub const PLACEHOLDER_TTL: u32 = 1;

/// Usable placeholder slots: the /15 minus its first and last address.
const SLOTS: u32 = (1 << 17) - 2;

/// The placeholder address of each name asked for in this run. A slot is the name's FNV-1a
/// hash (deterministic), probed linearly on collision, and never reused within a run.
#[derive(Debug, Default)]
pub struct PlaceholderBook {
    by_name: HashMap<String, u32>,
    by_slot: HashMap<u32, String>,
}

impl PlaceholderBook {
    /// The placeholder slot of a name, assigned on first use; `None` when every slot is taken.
    pub fn slot_for(&mut self, name: &str) -> Option<u32> {
        if let Some(&slot) = self.by_name.get(name) {
            return Some(slot);
        }
        let start = fnv1a(name.as_bytes()) % SLOTS;
        let slot = (0..SLOTS)
            .map(|step| 1 + (start + step) % SLOTS)
            .find(|slot| !self.by_slot.contains_key(slot))?;
        self.by_name.insert(name.to_string(), slot);
        self.by_slot.insert(slot, name.to_string());
        Some(slot)
    }

    /// The name a placeholder address stands for, if the stub handed it out.
    pub fn name_for(&self, ip: IpAddr) -> Option<&str> {
        let slot = slot_of(ip)?;
        self.by_slot.get(&slot).map(String::as_str)
    }
}

/// True when the address lies in a placeholder range.
pub fn is_placeholder(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => PLACEHOLDER_V4.contains(&v4),
        IpAddr::V6(v6) => PLACEHOLDER_V6.contains(&v6),
    }
}

/// The IPv4 placeholder of a slot.
pub fn placeholder_v4(slot: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(PLACEHOLDER_V4.network()) + slot)
}

/// The IPv6 placeholder of a slot.
pub fn placeholder_v6(slot: u32) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(PLACEHOLDER_V6.network()) + u128::from(slot))
}

fn slot_of(ip: IpAddr) -> Option<u32> {
    match ip {
        IpAddr::V4(v4) if PLACEHOLDER_V4.contains(&v4) => {
            Some(u32::from(v4) - u32::from(PLACEHOLDER_V4.network()))
        }
        IpAddr::V6(v6) if PLACEHOLDER_V6.contains(&v6) => {
            u32::try_from(u128::from(v6) - u128::from(PLACEHOLDER_V6.network())).ok()
        }
        _ => None,
    }
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// What the stub did with one query.
#[derive(Debug, Clone)]
pub struct StubOutcome {
    /// The wire reply.
    pub reply: Vec<u8>,
    /// The name asked for, normalised when it is a name.
    pub name: Option<String>,
    /// The query type (`A`, `AAAA`, ...).
    pub query_type: String,
    /// Allow, deny, or would-deny in report mode.
    pub decision: Decision,
    /// Why.
    pub reason: Reason,
}

/// What the stub needs to answer.
pub struct StubContext<'a> {
    /// The policy.
    pub policy: &'a EgressPolicy,
    /// The run's placeholders.
    pub book: &'a mut PlaceholderBook,
    /// The sandbox captures IPv6 (AAAA queries get placeholders).
    pub ipv6: bool,
    /// The DNS-query cap is reached: refuse.
    pub over_limit: bool,
}

/// Answers one query in wire format; `None` when the bytes are not a DNS message at all.
pub fn answer(query: &[u8], context: StubContext<'_>) -> Option<StubOutcome> {
    let request = Message::from_vec(query).ok()?;
    if request.message_type() != MessageType::Query {
        return None;
    }
    let single = request.queries().len() == 1 && request.op_code() == OpCode::Query;
    let Some(question) = request.queries().first().filter(|_| single) else {
        return Some(refusal(
            &request,
            None,
            ResponseCode::NotImp,
            Reason::BadRequest,
        ));
    };
    let query_type = question.query_type().to_string();
    let name = match parse_host(&question.name().to_ascii()) {
        Ok(Host::Name(name)) => name,
        _ => {
            return Some(refusal(
                &request,
                None,
                ResponseCode::NXDomain,
                Reason::NotAllowed,
            ))
        }
    };
    if context.over_limit {
        return Some(refusal(
            &request,
            Some(name),
            ResponseCode::Refused,
            Reason::LimitDnsQueries,
        ));
    }
    if question.query_class() != DNSClass::IN {
        return Some(refusal(
            &request,
            Some(name),
            ResponseCode::Refused,
            Reason::BadRequest,
        ));
    }
    decide_and_answer(&request, name, query_type, context)
}

fn decide_and_answer(
    request: &Message,
    name: String,
    query_type: String,
    context: StubContext<'_>,
) -> Option<StubOutcome> {
    let qtype = request.queries()[0].query_type();
    if name == "localhost" || name.ends_with(".localhost") {
        let records = loopback_records(request, qtype);
        return Some(answered(
            request,
            records,
            name,
            query_type,
            Decision::Allow,
            Reason::Allowed,
        ));
    }
    let listed = context.policy.rules.answers_name(&name);
    let decision = match (listed, context.policy.mode) {
        (true, _) => Decision::Allow,
        (false, GateMode::Report) => Decision::WouldDeny,
        (false, GateMode::Allowlist) => {
            return Some(refusal(
                request,
                Some(name),
                ResponseCode::NXDomain,
                Reason::NotAllowed,
            ));
        }
    };
    let reason = if listed {
        Reason::Allowed
    } else {
        Reason::NotAllowed
    };
    let Some(slot) = context.book.slot_for(&name) else {
        return Some(refusal(
            request,
            Some(name),
            ResponseCode::Refused,
            Reason::LimitDnsQueries,
        ));
    };
    let records = placeholder_records(request, qtype, slot, context.ipv6);
    Some(answered(
        request, records, name, query_type, decision, reason,
    ))
}

fn placeholder_records(request: &Message, qtype: RecordType, slot: u32, ipv6: bool) -> Vec<Record> {
    let owner = request.queries()[0].name().clone();
    match qtype {
        RecordType::A => vec![Record::from_rdata(
            owner,
            PLACEHOLDER_TTL,
            RData::A(A(placeholder_v4(slot))),
        )],
        RecordType::AAAA if ipv6 => {
            vec![Record::from_rdata(
                owner,
                PLACEHOLDER_TTL,
                RData::AAAA(AAAA(placeholder_v6(slot))),
            )]
        }
        _ => Vec::new(),
    }
}

fn loopback_records(request: &Message, qtype: RecordType) -> Vec<Record> {
    let owner = request.queries()[0].name().clone();
    match qtype {
        RecordType::A => vec![Record::from_rdata(
            owner,
            PLACEHOLDER_TTL,
            RData::A(A(Ipv4Addr::LOCALHOST)),
        )],
        RecordType::AAAA => vec![Record::from_rdata(
            owner,
            PLACEHOLDER_TTL,
            RData::AAAA(AAAA(Ipv6Addr::LOCALHOST)),
        )],
        _ => Vec::new(),
    }
}

fn response_to(request: &Message, code: ResponseCode) -> Message {
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(code);
    response.add_queries(request.queries().iter().cloned());
    response
}

fn answered(
    request: &Message,
    records: Vec<Record>,
    name: String,
    query_type: String,
    decision: Decision,
    reason: Reason,
) -> StubOutcome {
    let mut response = response_to(request, ResponseCode::NoError);
    response.add_answers(records);
    StubOutcome {
        reply: response.to_vec().unwrap_or_default(),
        name: Some(name),
        query_type,
        decision,
        reason,
    }
}

fn refusal(
    request: &Message,
    name: Option<String>,
    code: ResponseCode,
    reason: Reason,
) -> StubOutcome {
    let query_type = request
        .queries()
        .first()
        .map(|q| q.query_type().to_string())
        .unwrap_or_default();
    StubOutcome {
        reply: response_to(request, code).to_vec().unwrap_or_default(),
        name,
        query_type,
        decision: Decision::Deny,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::EgressConfig;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;

    fn query(name: &str, qtype: RecordType) -> Vec<u8> {
        let mut message = Message::new();
        message.set_id(4242).set_recursion_desired(true);
        message.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        message.to_vec().unwrap()
    }

    fn policy(mode: GateMode) -> EgressPolicy {
        EgressPolicy::parse(&EgressConfig {
            mode,
            allow: vec!["api.example.com".into(), "*.files.example.org".into()],
            deny: vec!["bad.files.example.org".into()],
            ..Default::default()
        })
        .unwrap()
    }

    fn ask(
        policy: &EgressPolicy,
        book: &mut PlaceholderBook,
        name: &str,
        qtype: RecordType,
    ) -> (StubOutcome, Message) {
        let context = StubContext {
            policy,
            book,
            ipv6: true,
            over_limit: false,
        };
        let outcome = answer(&query(name, qtype), context).unwrap();
        let reply = Message::from_vec(&outcome.reply).unwrap();
        assert_eq!(reply.id(), 4242);
        (outcome, reply)
    }

    #[test]
    fn allowed_names_get_stable_placeholders_others_nxdomain() {
        let policy = policy(GateMode::Allowlist);
        let mut book = PlaceholderBook::default();
        let (outcome, reply) = ask(&policy, &mut book, "API.example.com.", RecordType::A);
        assert_eq!(outcome.decision, Decision::Allow);
        let RData::A(A(ip)) = reply.answers()[0].data() else {
            panic!()
        };
        assert!(PLACEHOLDER_V4.contains(ip));
        assert_eq!(reply.answers()[0].ttl(), PLACEHOLDER_TTL);
        assert_eq!(book.name_for(IpAddr::V4(*ip)), Some("api.example.com"));
        let (_, again) = ask(&policy, &mut book, "api.example.com", RecordType::A);
        assert_eq!(again.answers()[0].data(), reply.answers()[0].data());
        let (_, v6) = ask(&policy, &mut book, "api.example.com", RecordType::AAAA);
        let RData::AAAA(AAAA(ip6)) = v6.answers()[0].data() else {
            panic!()
        };
        assert_eq!(book.name_for(IpAddr::V6(*ip6)), Some("api.example.com"));

        for refused in [
            "secret-data.attacker.example",
            "files.example.org",
            "bad.files.example.org",
        ] {
            let (outcome, reply) = ask(&policy, &mut book, refused, RecordType::A);
            assert_eq!(reply.response_code(), ResponseCode::NXDomain, "{refused}");
            assert!(reply.answers().is_empty());
            assert_eq!(outcome.reason, Reason::NotAllowed);
        }
        let (_, txt) = ask(&policy, &mut book, "x.files.example.org", RecordType::TXT);
        assert_eq!(txt.response_code(), ResponseCode::NoError);
        assert!(txt.answers().is_empty());
    }

    #[test]
    fn limit_refuses_and_report_mode_answers_everything() {
        let policy_allow = policy(GateMode::Allowlist);
        let mut book = PlaceholderBook::default();
        let context = StubContext {
            policy: &policy_allow,
            book: &mut book,
            ipv6: false,
            over_limit: true,
        };
        let outcome = answer(&query("api.example.com", RecordType::A), context).unwrap();
        assert_eq!(outcome.reason, Reason::LimitDnsQueries);
        assert_eq!(
            Message::from_vec(&outcome.reply).unwrap().response_code(),
            ResponseCode::Refused
        );

        let report = policy(GateMode::Report);
        let (outcome, reply) = ask(&report, &mut book, "unlisted.example", RecordType::A);
        assert_eq!(outcome.decision, Decision::WouldDeny);
        assert_eq!(reply.answers().len(), 1);
    }

    #[test]
    fn placeholder_slots_are_never_reused() {
        let mut book = PlaceholderBook::default();
        let slots: std::collections::HashSet<u32> = (0..5000)
            .map(|i| book.slot_for(&format!("n{i}.test")).unwrap())
            .collect();
        assert_eq!(slots.len(), 5000);
        assert!(slots.iter().all(|&s| (1..=SLOTS).contains(&s)));
    }

    #[test]
    fn garbage_is_dropped() {
        let policy = policy(GateMode::Allowlist);
        let mut book = PlaceholderBook::default();
        let context = StubContext {
            policy: &policy,
            book: &mut book,
            ipv6: true,
            over_limit: false,
        };
        assert!(answer(b"\x01\x02", context).is_none());
    }
}

//! The test DNS server: names of the test hosts, some with answer sets that change between
//! queries (rebinding) or point at non-public addresses.

use std::collections::HashMap;
use std::net::{IpAddr, UdpSocket};
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};

use crate::Seen;

/// The names the TLS server's certificate covers.
pub(crate) const TLS_NAMES: [&str; 9] = [
    "allowed.test",
    "other.test",
    "denied.test",
    "rebind.test",
    "v6only.test",
    "cidr.test",
    "pypi.test",
    "registry.test",
    "gitsrv.test",
];

/// A name the test DNS server never answers (a resolver that hangs).
pub const SILENT: &str = "silent.test";

/// Names the test DNS server knows; a name with several answer sets gives them in turn
/// (rebinding), the last one forever after.
fn table() -> HashMap<&'static str, Vec<Vec<&'static str>>> {
    HashMap::from([
        ("allowed.test", vec![vec!["192.0.2.10", "2001:db8::10"]]),
        ("other.test", vec![vec!["192.0.2.11"]]),
        ("denied.test", vec![vec!["192.0.2.10"]]),
        ("git.test", vec![vec!["198.51.100.10"]]),
        ("cidr.test", vec![vec!["203.0.113.10"]]),
        ("rebind.test", vec![vec!["192.0.2.10"], vec!["127.0.0.1"]]),
        ("loop.test", vec![vec!["127.0.0.1"]]),
        ("meta.test", vec![vec!["169.254.169.254"]]),
        ("nat64.test", vec![vec!["64:ff9b::7f00:1"]]),
        ("mapped.test", vec![vec!["::ffff:127.0.0.1"]]),
        ("own.test", vec![vec!["192.0.2.1"]]),
        ("v6only.test", vec![vec!["2001:db8::10"]]),
        ("pypi.test", vec![vec!["203.0.113.30"]]),
        ("registry.test", vec![vec!["203.0.113.31"]]),
        ("gitsrv.test", vec![vec!["203.0.113.32"]]),
    ])
}

pub(crate) fn serve(socket: UdpSocket, seen: Arc<Seen>) {
    let table = table();
    let mut asked: HashMap<String, usize> = HashMap::new();
    let mut buffer = [0u8; 2048];
    while let Ok((n, peer)) = socket.recv_from(&mut buffer) {
        if n == 0 {
            return;
        }
        let Ok(query) = Message::from_vec(&buffer[..n]) else {
            continue;
        };
        let Some(question) = query.queries().first().cloned() else {
            continue;
        };
        let name = question
            .name()
            .to_ascii()
            .trim_end_matches('.')
            .to_lowercase();
        seen.dns_names.lock().unwrap().push(name.clone());
        if name == SILENT {
            continue;
        }
        let mut reply = Message::new();
        reply
            .set_id(query.id())
            .set_message_type(MessageType::Response)
            .set_recursion_available(true);
        reply.add_query(question.clone());
        match table.get(name.as_str()) {
            None => {
                reply.set_response_code(ResponseCode::NXDomain);
            }
            Some(sets) => {
                let turn = asked
                    .entry(format!("{name}/{}", question.query_type()))
                    .or_default();
                let set = &sets[(*turn).min(sets.len() - 1)];
                *turn += 1;
                for ip in set.iter().map(|a| a.parse::<IpAddr>().unwrap()) {
                    let data = match (ip, question.query_type()) {
                        (IpAddr::V4(v4), RecordType::A) => RData::A(A(v4)),
                        (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(v6)),
                        _ => continue,
                    };
                    reply.add_answer(Record::from_rdata(question.name().clone(), 0, data));
                }
            }
        }
        let _ = socket.send_to(&reply.to_vec().unwrap(), peer);
    }
}

//! End-to-end: programs in an empty network namespace reach allowed names through the gate,
//! transparently and through the proxy endpoint. Needs root (see tests/world).

mod world;

use std::time::Duration;

use airlock_egress::report::{Channel, Decision, Reason};
use airlock_egress::{EgressConfig, GateMode};

fn allow(rules: &[&str]) -> EgressConfig {
    EgressConfig {
        allow: rules.iter().map(|r| r.to_string()).collect(),
        ..Default::default()
    }
}

/// The documentation ranges are non-public: the test hosts live there, so tests allow them.
const TEST_RANGES: [&str; 4] = ["192.0.2.0/24:80", "192.0.2.0/24:443", "[2001:db8::/32]:443", "[2001:db8::/32]:80"];

fn with_test_ranges(rules: &[&str]) -> EgressConfig {
    let mut all: Vec<&str> = rules.to_vec();
    all.extend(TEST_RANGES);
    allow(&all)
}

#[test]
fn transparent_http_and_tls_reach_allowed_names() {
    let world = world_or_skip!();
    let started = world.start_gate(with_test_ranges(&["allowed.test"]));
    let (body, code) = world.curl(&["http://allowed.test/"]);
    assert_eq!((body.trim(), code), ("host=allowed.test", 0));
    let (body, code) = world.curl(&["https://allowed.test/"]);
    assert_eq!((body.trim(), code), ("sni=allowed.test", 0));
    let report = started.gate.finish();
    let allowed: Vec<_> = report.decisions.iter().filter(|r| r.channel == Channel::Capture).collect();
    assert_eq!(allowed.len(), 2, "{:#?}", report.decisions);
    assert!(allowed.iter().all(|r| r.decision == Decision::Allow && r.name.as_deref() == Some("allowed.test")));
    assert!(allowed.iter().all(|r| r.bytes_in > 0 && r.bytes_out > 0));
    assert_eq!(report.counters.connections_allowed, 2);
}

//! Whether a tenant's ceiling allowlist covers a rule a request asks for. Both are read with the
//! egress gate's own grammar (`airlock_egress::Rule`), so the ceiling judges exactly what the
//! gate will enforce: a rule is covered when one ceiling rule allows every name (or address)
//! and every port it does, with no wider access (raw TCP is wider than name-bound HTTP/TLS).

use airlock_egress::rules::{NamePattern, Rule, Target};
use ipnet::IpNet;

/// The ceiling entry that stands for every name rule (any name, port and access), never for
/// an address range: address ranges reach non-public networks and must be listed as such.
pub const ANY_NAME: &str = "*";

/// Whether one of the ceiling's rules covers `asked`. Unreadable rules cover nothing (the
/// configuration check reports a bad ceiling; the request's own is refused before this).
pub fn ceiling_covers(ceiling: &[String], asked: &str) -> bool {
    let Ok(asked) = Rule::parse_allow(asked) else {
        return false;
    };
    ceiling.iter().any(|entry| match entry.trim() {
        ANY_NAME => matches!(asked.target, Target::Name { .. }),
        text => Rule::parse_allow(text).is_ok_and(|rule| rule_covers(&rule, &asked)),
    })
}

fn rule_covers(ceiling: &Rule, asked: &Rule) -> bool {
    ports_cover(ceiling, asked) && target_covers(&ceiling.target, &asked.target)
}

fn ports_cover(ceiling: &Rule, asked: &Rule) -> bool {
    asked.ports.iter().all(|wanted| {
        ceiling
            .ports
            .iter()
            .any(|have| have.start() <= wanted.start() && wanted.end() <= have.end())
    })
}

fn target_covers(ceiling: &Target, asked: &Target) -> bool {
    match (ceiling, asked) {
        (Target::Range(have), Target::Range(wanted)) => range_covers(have, wanted),
        (
            Target::Name {
                pattern: have,
                raw_tcp: have_raw,
            },
            Target::Name {
                pattern: wanted,
                raw_tcp: wanted_raw,
            },
        ) => (*have_raw || !*wanted_raw) && pattern_covers(have, wanted),
        _ => false,
    }
}

fn range_covers(have: &IpNet, wanted: &IpNet) -> bool {
    have.contains(wanted)
}

/// Whether every name `wanted` matches is matched by `have`.
fn pattern_covers(have: &NamePattern, wanted: &NamePattern) -> bool {
    // Every name `wanted` matches is its base or under it (`Subdomains` only strictly under).
    let (base, strictly_under) = match wanted {
        NamePattern::Exact(name) => return have.matches(name),
        NamePattern::Subdomains(base) => (base, true),
        NamePattern::NameAndSubdomains(base) => (base, false),
    };
    match have {
        NamePattern::Exact(_) => false,
        NamePattern::NameAndSubdomains(suffix) => base == suffix || have.matches(base),
        NamePattern::Subdomains(suffix) => (strictly_under && base == suffix) || have.matches(base),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(ceiling: &[&str], asked: &str) -> bool {
        let ceiling: Vec<String> = ceiling.iter().map(|s| s.to_string()).collect();
        ceiling_covers(&ceiling, asked)
    }

    #[test]
    fn names_are_covered_only_as_far_as_the_ceiling_reaches() {
        assert!(covers(&["*"], "anything.example"));
        assert!(covers(&["*"], "tcp://ssh.example.com:22"));
        assert!(covers(&["pypi.org"], "PyPI.org."));
        assert!(!covers(&["pypi.org"], "files.pypi.org"));
        assert!(covers(&["*.pypi.org"], "files.pypi.org"));
        assert!(covers(&["*.pypi.org"], "*.files.pypi.org"));
        assert!(covers(&["*.pypi.org"], "**.files.pypi.org"));
        assert!(covers(&["*.pypi.org"], "*.pypi.org"));
        assert!(!covers(&["*.pypi.org"], "pypi.org"));
        assert!(!covers(&["*.pypi.org"], "**.pypi.org"));
        assert!(!covers(&["*.pypi.org"], "evilpypi.org"));
        assert!(covers(&["**.pypi.org"], "pypi.org"));
        assert!(covers(&["**.pypi.org"], "**.pypi.org"));
        assert!(!covers(&["pypi.org"], "*.pypi.org"));
    }

    #[test]
    fn ports_and_raw_tcp_are_never_widened() {
        assert!(covers(&["github.com:443"], "github.com:443"));
        assert!(!covers(&["github.com:443"], "github.com:22"));
        assert!(
            !covers(&["github.com:443"], "github.com"),
            "80 is not in 443"
        );
        assert!(covers(&["github.com"], "github.com:443"));
        assert!(!covers(&["github.com"], "github.com:8443"));
        assert!(covers(
            &["api.example.com:8000-8100"],
            "api.example.com:8080"
        ));
        assert!(
            !covers(&["github.com:22"], "tcp://github.com:22"),
            "raw is wider"
        );
        assert!(covers(&["tcp://github.com:22"], "github.com:22"));
    }

    #[test]
    fn address_ranges_need_a_range_in_the_ceiling() {
        assert!(!covers(&["*"], "10.0.0.0/8"));
        assert!(covers(&["203.0.113.0/24"], "203.0.113.7"));
        assert!(covers(&["203.0.113.0/24"], "203.0.113.0/25:443"));
        assert!(!covers(&["203.0.113.0/25"], "203.0.113.0/24"));
        assert!(!covers(&["203.0.113.0/24:443"], "203.0.113.0/24:80"));
        assert!(covers(&["[2001:db8::/32]:443"], "[2001:db8:1::/48]:443"));
        assert!(!covers(&["example.com"], "203.0.113.7"));
        assert!(!covers(&["*"], "not a rule"));
    }
}

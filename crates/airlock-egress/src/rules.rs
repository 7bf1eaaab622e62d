//! The allow/deny rule grammar and its matching.
//!
//! | rule | means |
//! |---|---|
//! | `api.openai.com` | that name, on ports 80 (HTTP, `Host` checked) and 443 (TLS, SNI checked) |
//! | `*.example.org` | its subdomains only, not `example.org` itself |
//! | `**.example.org` | `example.org` and its subdomains |
//! | `name:8443`, `name:8000-8100` | those ports instead of 80 and 443, still HTTP or TLS bound to the name |
//! | `tcp://ssh.github.com:22` | raw TCP to the name on that port (a port is required) |
//! | `203.0.113.0/24`, `203.0.113.7`, `203.0.113.0/24:8080` | raw TCP to those addresses (ports 80 and 443 unless given) |
//! | `[2001:db8::/32]:443`, `2001:db8::/32` | the same for IPv6 (brackets when a port follows) |
//!
//! `deny` takes the same forms without `tcp://`; a deny rule without a port covers every port,
//! and deny wins over allow. Names are normalised (case, trailing dot, IDNA to punycode);
//! numeric hosts must be written in their canonical form.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::ops::RangeInclusive;

use ipnet::IpNet;

use crate::error::RuleError;
use crate::host::{normalize_name, parse_ipv4_any, split_host_port};

/// Ports a name rule without a port allows: HTTP and TLS.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Which names a name rule covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePattern {
    /// Exactly this name.
    Exact(String),
    /// `*.suffix`: subdomains of the suffix, not the suffix itself.
    Subdomains(String),
    /// `**.suffix`: the suffix and its subdomains.
    NameAndSubdomains(String),
}

impl NamePattern {
    /// True when the (normalised) name is covered.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Exact(exact) => name == exact,
            NamePattern::Subdomains(suffix) => is_subdomain(name, suffix),
            NamePattern::NameAndSubdomains(suffix) => name == suffix || is_subdomain(name, suffix),
        }
    }
}

fn is_subdomain(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

/// What a rule is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Names; `raw_tcp` for `tcp://` rules, otherwise HTTP or TLS bound to the name.
    Name {
        /// The names covered.
        pattern: NamePattern,
        /// Raw TCP allowed (a `tcp://` rule).
        raw_tcp: bool,
    },
    /// An address range (a single address is a /32 or /128).
    Range(IpNet),
}

/// How a stream to an allowed destination may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// TLS whose SNI is the name, or HTTP whose `Host` is the name.
    NameBound,
    /// Any TCP stream.
    RawTcp,
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The rule as written.
    pub text: String,
    /// What it covers.
    pub target: Target,
    /// The ports it covers.
    pub ports: Vec<RangeInclusive<u16>>,
}

/// Which list a rule comes from: defaults differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Allow,
    Deny,
}

const GRAMMAR_HINT: &str = "write `name`, `*.name`, `**.name`, `name:PORT`, `name:LO-HI`, \
`tcp://name:PORT`, `203.0.113.0/24[:PORT]` or `[2001:db8::/32]:PORT`";

impl Rule {
    /// Reads an `allow` rule.
    pub fn parse_allow(text: &str) -> Result<Rule, RuleError> {
        parse_rule(text, Side::Allow)
    }

    /// Reads a `deny` rule (no `tcp://`; no port means every port).
    pub fn parse_deny(text: &str) -> Result<Rule, RuleError> {
        parse_rule(text, Side::Deny)
    }

    /// True when the rule covers this port.
    pub fn covers_port(&self, port: u16) -> bool {
        self.ports.iter().any(|range| range.contains(&port))
    }

    /// True when the rule covers this (normalised) name, on any port.
    pub fn covers_name(&self, name: &str) -> bool {
        matches!(&self.target, Target::Name { pattern, .. } if pattern.matches(name))
    }

    /// True when the rule is an address range holding this address.
    pub fn covers_address(&self, ip: IpAddr) -> bool {
        matches!(&self.target, Target::Range(net) if net.contains(&ip))
    }

    fn access(&self) -> Access {
        match self.target {
            Target::Name { raw_tcp: false, .. } => Access::NameBound,
            _ => Access::RawTcp,
        }
    }

    fn covers_every_port(&self) -> bool {
        self.ports.contains(&(1..=u16::MAX))
    }
}

fn parse_rule(text: &str, side: Side) -> Result<Rule, RuleError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(RuleError::new(text, "the rule is empty", GRAMMAR_HINT));
    }
    let (raw_tcp, rest) = strip_scheme(trimmed)?;
    if raw_tcp && side == Side::Deny {
        return Err(RuleError::new(
            trimmed,
            "a deny rule covers every protocol, so `tcp://` means nothing here",
            "drop `tcp://`",
        ));
    }
    let (host, port_text) =
        split_host_port(rest).map_err(|e| RuleError::new(trimmed, e.0, GRAMMAR_HINT))?;
    let target = parse_target(trimmed, host, raw_tcp)?;
    let ports = match port_text {
        Some(port_text) => vec![parse_ports(trimmed, port_text)?],
        None => default_ports(trimmed, &target, side)?,
    };
    Ok(Rule {
        text: trimmed.to_string(),
        target,
        ports,
    })
}

fn strip_scheme(text: &str) -> Result<(bool, &str), RuleError> {
    match text.split_once("://") {
        None => Ok((false, text)),
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("tcp") => Ok((true, rest)),
        Some((scheme, _)) => Err(RuleError::new(
            text,
            format!("`{scheme}://` is not a rule scheme"),
            "write the name alone for HTTP and TLS (ports 80 and 443), or `tcp://name:PORT` for raw TCP",
        )),
    }
}

fn parse_target(rule: &str, host: &str, raw_tcp: bool) -> Result<Target, RuleError> {
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let bare = bracketed.unwrap_or(host);
    if bare.contains('/')
        || bare.parse::<IpAddr>().is_ok()
        || bracketed.is_some()
        || bare.contains(':')
    {
        if raw_tcp {
            return Err(RuleError::new(
                rule,
                "`tcp://` takes a name; an address rule already allows raw TCP",
                "drop `tcp://` from address rules",
            ));
        }
        return parse_range(rule, bare).map(Target::Range);
    }
    if let Ok(Some(ip)) = parse_ipv4_any(bare) {
        return Err(RuleError::new(
            rule,
            format!("`{bare}` is a non-canonical spelling of the address {ip}"),
            format!("write it as `{ip}`"),
        ));
    }
    let pattern = parse_name_pattern(rule, bare)?;
    Ok(Target::Name { pattern, raw_tcp })
}

fn parse_range(rule: &str, text: &str) -> Result<IpNet, RuleError> {
    if !text.contains('/') {
        let ip: IpAddr = text.parse().map_err(|_| {
            RuleError::new(rule, format!("`{text}` is not an address"), GRAMMAR_HINT)
        })?;
        return Ok(IpNet::from(ip));
    }
    let net: IpNet = text.parse().map_err(|_| {
        let fix = if text.matches(':').count() > 1 {
            "write IPv6 ranges as `2001:db8::/32`, or `[2001:db8::/32]:PORT` with a port"
                .to_string()
        } else {
            "write the range as `203.0.113.0/24` (canonical address, prefix 0-32 or 0-128)"
                .to_string()
        };
        RuleError::new(rule, format!("`{text}` is not an address range"), fix)
    })?;
    if net.trunc() != net {
        return Err(RuleError::new(
            rule,
            format!(
                "`{text}` has bits set past its /{} prefix",
                net.prefix_len()
            ),
            format!("write `{}`", net.trunc()),
        ));
    }
    Ok(net)
}

fn parse_name_pattern(rule: &str, text: &str) -> Result<NamePattern, RuleError> {
    let (make, name): (fn(String) -> NamePattern, &str) =
        if let Some(rest) = text.strip_prefix("**.") {
            (NamePattern::NameAndSubdomains, rest)
        } else if let Some(rest) = text.strip_prefix("*.") {
            (NamePattern::Subdomains, rest)
        } else {
            (NamePattern::Exact, text)
        };
    if name.contains('*') {
        return Err(RuleError::new(
            rule,
            "`*` may only stand as the whole first label",
            "write `*.example.com` (subdomains) or `**.example.com` (the name and its subdomains)",
        ));
    }
    let normalised = normalize_name(name).map_err(|e| RuleError::new(rule, e.0, GRAMMAR_HINT))?;
    Ok(make(normalised))
}

fn parse_ports(rule: &str, text: &str) -> Result<RangeInclusive<u16>, RuleError> {
    let bad = || {
        RuleError::new(
            rule,
            format!("`{text}` is not a port or a port range"),
            "write one port (`:443`) or an ascending range (`:8000-8100`) between 1 and 65535",
        )
    };
    let parse_one = |t: &str| t.trim().parse::<u16>().ok().filter(|&p| p != 0);
    let (lo, hi) = match text.split_once('-') {
        Some((lo, hi)) => (
            parse_one(lo).ok_or_else(bad)?,
            parse_one(hi).ok_or_else(bad)?,
        ),
        None => {
            let port = parse_one(text).ok_or_else(bad)?;
            (port, port)
        }
    };
    if lo > hi {
        return Err(bad());
    }
    Ok(lo..=hi)
}

fn default_ports(
    rule: &str,
    target: &Target,
    side: Side,
) -> Result<Vec<RangeInclusive<u16>>, RuleError> {
    match (side, target) {
        (Side::Deny, _) => Ok(vec![1..=u16::MAX]),
        (Side::Allow, Target::Name { raw_tcp: true, .. }) => Err(RuleError::new(
            rule,
            "a `tcp://` rule needs a port",
            "write `tcp://name:PORT`, for example `tcp://ssh.github.com:22`",
        )),
        (Side::Allow, _) => Ok(DEFAULT_PORTS.iter().map(|&p| p..=p).collect()),
    }
}

/// What the rules say about a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleVerdict {
    /// Allowed, used this way.
    Allowed(Access),
    /// A deny rule covers it (the rule's text).
    Denied(String),
    /// No allow rule covers it.
    NotAllowed,
}

/// The parsed `allow` and `deny` lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    /// Allow rules, in order.
    pub allow: Vec<Rule>,
    /// Deny rules, in order; they win over allow rules.
    pub deny: Vec<Rule>,
}

impl RuleSet {
    /// Reads both lists; the first malformed rule is the error.
    pub fn parse<S: AsRef<str>>(allow: &[S], deny: &[S]) -> Result<RuleSet, RuleError> {
        Ok(RuleSet {
            allow: allow
                .iter()
                .map(|r| Rule::parse_allow(r.as_ref()))
                .collect::<Result<_, _>>()?,
            deny: deny
                .iter()
                .map(|r| Rule::parse_deny(r.as_ref()))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The verdict for a (normalised) name on a port; deny wins.
    pub fn check_name(&self, name: &str, port: u16) -> RuleVerdict {
        if let Some(rule) = self
            .deny
            .iter()
            .find(|r| r.covers_name(name) && r.covers_port(port))
        {
            return RuleVerdict::Denied(rule.text.clone());
        }
        self.allow
            .iter()
            .filter(|r| r.covers_name(name) && r.covers_port(port))
            .map(Rule::access)
            .max()
            .map_or(RuleVerdict::NotAllowed, RuleVerdict::Allowed)
    }

    /// The verdict for a direct connection to an address; deny wins.
    pub fn check_address(&self, ip: IpAddr, port: u16) -> RuleVerdict {
        if let Some(rule) = self.denying_address(ip, port) {
            return RuleVerdict::Denied(rule.text.clone());
        }
        let allowed = self
            .allow
            .iter()
            .any(|r| r.covers_address(ip) && r.covers_port(port));
        if allowed {
            RuleVerdict::Allowed(Access::RawTcp)
        } else {
            RuleVerdict::NotAllowed
        }
    }

    /// The deny rule, if any, covering an address on a port (names resolving there included).
    pub fn denying_address(&self, ip: IpAddr, port: u16) -> Option<&Rule> {
        self.deny
            .iter()
            .find(|r| r.covers_address(ip) && r.covers_port(port))
    }

    /// True when DNS should answer this name: some allow rule covers it and no deny rule
    /// covers it on every port.
    pub fn answers_name(&self, name: &str) -> bool {
        let wholly_denied = self
            .deny
            .iter()
            .any(|r| r.covers_name(name) && r.covers_every_port());
        !wholly_denied && self.allow.iter().any(|r| r.covers_name(name))
    }

    /// True when an allow range explicitly opens a non-public address on a port: the range
    /// holds the address and lies wholly inside the special-purpose range `class_range` that
    /// makes it non-public, so a broad range such as `0.0.0.0/0` never opens the LAN, loopback
    /// or metadata. `exact` requires a single-address rule (for the gate's own addresses).
    pub fn exempts(&self, ip: IpAddr, port: u16, class_range: Option<IpNet>, exact: bool) -> bool {
        self.allow.iter().any(|rule| match &rule.target {
            Target::Range(net) => {
                let inside_class = class_range.is_some_and(|class| class.contains(net));
                let single = net.prefix_len() == net.max_prefix_len();
                net.contains(&ip) && rule.covers_port(port) && inside_class && (single || !exact)
            }
            Target::Name { .. } => false,
        })
    }

    /// Every port some allow rule covers.
    pub fn allowed_ports(&self) -> BTreeSet<u16> {
        self.allow
            .iter()
            .flat_map(|r| r.ports.iter().cloned().flatten())
            .collect()
    }

    /// Every allowed address range (they become local routes inside the sandbox).
    pub fn allowed_ranges(&self) -> Vec<IpNet> {
        self.allow
            .iter()
            .filter_map(|r| match r.target {
                Target::Range(net) => Some(net),
                Target::Name { .. } => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(text: &str) -> Rule {
        Rule::parse_allow(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn name(pattern: NamePattern, raw_tcp: bool) -> Target {
        Target::Name { pattern, raw_tcp }
    }

    #[test]
    fn the_issue_examples_parse() {
        let r = allow("api.openai.com");
        assert_eq!(
            r.target,
            name(NamePattern::Exact("api.openai.com".into()), false)
        );
        assert_eq!(r.ports, vec![80..=80, 443..=443]);
        assert_eq!(
            allow("*.files.example.org").target,
            name(NamePattern::Subdomains("files.example.org".into()), false)
        );
        let r = allow("**.github.com:443");
        assert_eq!(
            r.target,
            name(NamePattern::NameAndSubdomains("github.com".into()), false)
        );
        assert_eq!(r.ports, vec![443..=443]);
        let r = allow("tcp://ssh.github.com:22");
        assert_eq!(
            r.target,
            name(NamePattern::Exact("ssh.github.com".into()), true)
        );
        let r = allow("203.0.113.0/24:8080");
        assert_eq!(r.target, Target::Range("203.0.113.0/24".parse().unwrap()));
        assert_eq!(r.ports, vec![8080..=8080]);
        let r = allow("[2001:db8::/32]:443");
        assert_eq!(r.target, Target::Range("2001:db8::/32".parse().unwrap()));
        assert_eq!(r.ports, vec![443..=443]);
        assert_eq!(allow("2001:db8::/32").ports, vec![80..=80, 443..=443]);
        assert_eq!(allow("name.test:8000-8100").ports, vec![8000..=8100]);
        assert_eq!(
            allow("203.0.113.7").target,
            Target::Range("203.0.113.7/32".parse().unwrap())
        );
    }

    #[test]
    fn names_are_normalised_in_rules() {
        assert_eq!(
            allow("API.Example.COM.").target,
            name(NamePattern::Exact("api.example.com".into()), false)
        );
        assert_eq!(
            allow("*.Bücher.example").target,
            name(
                NamePattern::Subdomains("xn--bcher-kva.example".into()),
                false
            )
        );
    }

    #[test]
    fn malformed_rules_name_the_rule_and_the_fix() {
        let cases = [
            ("", "empty"),
            ("tcp://ssh.github.com", "needs a port"),
            ("https://a.com", "not a rule scheme"),
            ("a.*.com", "first label"),
            ("*", "first label"),
            ("a.com:0", "not a port"),
            ("a.com:90-80", "not a port"),
            ("a.com:http", "not a port"),
            ("2130706433", "non-canonical"),
            ("0x7f.1", "non-canonical"),
            ("203.0.113.5/24", "past its /24"),
            ("2001:db8::/32:443", "not an address range"),
            ("tcp://203.0.113.0/24:22", "takes a name"),
            ("exa mple.com", "invalid label"),
        ];
        for (text, expected) in cases {
            let err = Rule::parse_allow(text).expect_err(text).to_string();
            assert!(err.contains(expected), "{text}: {err}");
            assert!(err.contains(&format!("`{}`", text.trim())), "{text}: {err}");
        }
        assert!(Rule::parse_deny("tcp://a.com:22").is_err());
    }

    #[test]
    fn wildcards_match_as_documented() {
        let sub = NamePattern::Subdomains("example.com".into());
        assert!(sub.matches("a.example.com"));
        assert!(sub.matches("a.b.example.com"));
        assert!(!sub.matches("example.com"));
        assert!(!sub.matches("badexample.com"));
        let both = NamePattern::NameAndSubdomains("example.com".into());
        assert!(both.matches("example.com"));
        assert!(both.matches("x.example.com"));
        assert!(!both.matches("xexample.com"));
    }

    #[test]
    fn deny_wins_and_covers_every_port() {
        let rules = RuleSet::parse(
            &["**.github.com:443", "tcp://**.github.com:22"],
            &["uploads.github.com"],
        )
        .unwrap();
        assert_eq!(
            rules.check_name("api.github.com", 443),
            RuleVerdict::Allowed(Access::NameBound)
        );
        assert_eq!(
            rules.check_name("api.github.com", 22),
            RuleVerdict::Allowed(Access::RawTcp)
        );
        assert_eq!(
            rules.check_name("api.github.com", 80),
            RuleVerdict::NotAllowed
        );
        assert!(matches!(
            rules.check_name("uploads.github.com", 443),
            RuleVerdict::Denied(_)
        ));
        assert!(matches!(
            rules.check_name("uploads.github.com", 22),
            RuleVerdict::Denied(_)
        ));
        assert!(!rules.answers_name("uploads.github.com"));
        assert!(rules.answers_name("github.com"));
        assert!(!rules.answers_name("github.com.evil.example"));
    }

    #[test]
    fn address_rules_and_exemptions() {
        let rules = RuleSet::parse(
            &["10.1.2.0/24:443", "0.0.0.0/0:443", "192.0.2.1:80"],
            &["10.1.2.66"],
        )
        .unwrap();
        let ip = |t: &str| t.parse::<IpAddr>().unwrap();
        assert_eq!(
            rules.check_address(ip("10.1.2.5"), 443),
            RuleVerdict::Allowed(Access::RawTcp)
        );
        assert!(matches!(
            rules.check_address(ip("10.1.2.66"), 443),
            RuleVerdict::Denied(_)
        ));
        let private: IpNet = "10.0.0.0/8".parse().unwrap();
        assert!(rules.exempts(ip("10.1.2.5"), 443, Some(private), false));
        assert!(!rules.exempts(ip("10.1.2.5"), 80, Some(private), false));
        assert!(!rules.exempts(ip("10.9.9.9"), 443, Some(private), false));
        let loopback: IpNet = "127.0.0.0/8".parse().unwrap();
        assert!(
            !rules.exempts(ip("127.0.0.1"), 443, Some(loopback), false),
            "0.0.0.0/0 never opens loopback"
        );
        let doc: IpNet = "192.0.2.0/24".parse().unwrap();
        assert!(rules.exempts(ip("192.0.2.1"), 80, Some(doc), true));
        assert!(!rules.exempts(ip("10.1.2.5"), 443, Some(private), true));
        assert_eq!(rules.allowed_ports(), BTreeSet::from([80, 443]));
    }
}

//! The egress policy: rules, resolver, limits and mode, read from the `[network]` table.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::EgressError;
use crate::plan::SandboxPlan;
use crate::rules::RuleSet;

/// How the gate decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateMode {
    /// Only what the rules allow flows.
    #[default]
    Allowlist,
    /// Learning mode (trusted use only): everything flows as under `host` except non-public
    /// addresses, and every decision the allowlist would have made is recorded.
    Report,
}

/// A byte count written as a number or as text (`"64MiB"`, `"1 GiB"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ByteSize {
    /// A number of bytes.
    Bytes(u64),
    /// A size with a unit.
    Text(String),
}

/// `[network.limits]` as written; a missing entry takes its default from [`Limits::default`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Connections per run, in total.
    pub connections: Option<u64>,
    /// Connections open at once.
    pub concurrent: Option<u64>,
    /// Bytes sent by the sandbox, in total.
    pub bytes_out: Option<ByteSize>,
    /// Bytes received by the sandbox, in total.
    pub bytes_in: Option<ByteSize>,
    /// DNS queries per run.
    pub dns_queries: Option<u64>,
}

/// The `[network]` table of an allowlist (or report) run, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// Allowlist or report.
    pub mode: GateMode,
    /// Allow rules (see [`crate::rules`]).
    pub allow: Vec<String>,
    /// Deny rules; they win over allow rules.
    pub deny: Vec<String>,
    /// Host Unix sockets exposed at the same path (globs expanded at start).
    pub unix_sockets: Vec<String>,
    /// Where the gate resolves names: `"system"` (the default) or `"IP[:PORT]"`.
    pub resolver: Option<String>,
    /// Per-run caps.
    pub limits: LimitsConfig,
}

/// Per-run caps, in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Connections per run, in total.
    pub connections: u64,
    /// Connections open at once.
    pub concurrent: u64,
    /// Bytes sent by the sandbox.
    pub bytes_out: u64,
    /// Bytes received by the sandbox.
    pub bytes_in: u64,
    /// DNS queries per run.
    pub dns_queries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 256,
            concurrent: 32,
            bytes_out: 64 << 20,
            bytes_in: 1 << 30,
            dns_queries: 1024,
        }
    }
}

/// Where the gate resolves allowed names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolver {
    /// The host's resolver (getaddrinfo: /etc/hosts, nsswitch, /etc/resolv.conf).
    System,
    /// This DNS server, asked by the gate's own client (UDP, TCP on truncation).
    Server(SocketAddr),
}

/// A checked egress policy, ready for a gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Allowlist or report.
    pub mode: GateMode,
    /// The parsed rules.
    pub rules: RuleSet,
    /// Where names are resolved.
    pub resolver: Resolver,
    /// Per-run caps.
    pub limits: Limits,
    /// Unix socket paths or globs, as written (see [`crate::unix_sockets::expand`]).
    pub unix_sockets: Vec<String>,
}

/// The ports captured in report mode besides the allowed ones: the web, SSH, git and the
/// usual alternates, so that programs ignoring proxy variables are still observed there.
pub const REPORT_MODE_PORTS: [u16; 6] = [22, 80, 443, 8080, 8443, 9418];

/// The most distinct ports the sandbox captures (each is one listening socket).
pub const MAX_CAPTURE_PORTS: usize = 1024;

/// The preferred port of the in-sandbox proxy endpoint.
pub const PREFERRED_PROXY_PORT: u16 = 3128;

impl EgressPolicy {
    /// Checks a `[network]` table: every rule, the resolver and the limits.
    pub fn parse(config: &EgressConfig) -> Result<EgressPolicy, EgressError> {
        Ok(EgressPolicy {
            mode: config.mode,
            rules: RuleSet::parse(&config.allow, &config.deny)?,
            resolver: parse_resolver(config.resolver.as_deref())?,
            limits: parse_limits(&config.limits)?,
            unix_sockets: config.unix_sockets.clone(),
        })
    }

    /// What the sandbox's network namespace must hold for this policy: the ports to capture,
    /// the address ranges to make local, and the proxy endpoint's port.
    pub fn sandbox_plan(&self) -> Result<SandboxPlan, EgressError> {
        let mut ports = self.rules.allowed_ports();
        if self.mode == GateMode::Report {
            ports.extend(REPORT_MODE_PORTS);
        }
        check_capture_ports(&ports)?;
        let proxy_port = (PREFERRED_PROXY_PORT..=u16::MAX)
            .find(|p| !ports.contains(p))
            .expect("at most 1024 ports are captured");
        Ok(SandboxPlan {
            capture_ports: ports.into_iter().collect(),
            local_ranges: self.local_ranges(),
            proxy_port,
        })
    }

    fn local_ranges(&self) -> Vec<IpNet> {
        let mut ranges = self.rules.allowed_ranges();
        if self.mode == GateMode::Report {
            // Every address is captured: the gate checks each one.
            ranges.extend(["0.0.0.0/0", "::/0"].map(|n| n.parse::<IpNet>().expect("valid")));
        }
        ranges
    }
}

fn check_capture_ports(ports: &BTreeSet<u16>) -> Result<(), EgressError> {
    if ports.contains(&53) {
        return Err(EgressError::setting(
            "allow",
            "…:53",
            "port 53 inside the sandbox is the gate's DNS stub, which answers allowed names itself",
            "drop port 53 from the allow rules; names are resolved by the gate (see `resolver`)",
        ));
    }
    if ports.len() > MAX_CAPTURE_PORTS {
        return Err(EgressError::setting(
            "allow",
            &format!("{} ports", ports.len()),
            format!("the sandbox captures at most {MAX_CAPTURE_PORTS} distinct ports, one listener each"),
            "list the ports the program needs instead of wide ranges",
        ));
    }
    Ok(())
}

fn parse_resolver(text: Option<&str>) -> Result<Resolver, EgressError> {
    let text = match text.map(str::trim) {
        None | Some("system") => return Ok(Resolver::System),
        Some(text) => text,
    };
    let bad = || {
        EgressError::setting(
            "resolver",
            text,
            "not `system` nor an address",
            "write `system`, `IP`, `IP:PORT` or `[IPv6]:PORT`",
        )
    };
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(Resolver::Server(SocketAddr::new(ip, 53)));
    }
    text.parse::<SocketAddr>()
        .map(Resolver::Server)
        .map_err(|_| bad())
}

fn parse_limits(config: &LimitsConfig) -> Result<Limits, EgressError> {
    let default = Limits::default();
    Ok(Limits {
        connections: config.connections.unwrap_or(default.connections),
        concurrent: config.concurrent.unwrap_or(default.concurrent),
        bytes_out: parse_size(
            "limits.bytes_out",
            config.bytes_out.as_ref(),
            default.bytes_out,
        )?,
        bytes_in: parse_size(
            "limits.bytes_in",
            config.bytes_in.as_ref(),
            default.bytes_in,
        )?,
        dns_queries: config.dns_queries.unwrap_or(default.dns_queries),
    })
}

fn parse_size(setting: &str, value: Option<&ByteSize>, default: u64) -> Result<u64, EgressError> {
    match value {
        None => Ok(default),
        Some(ByteSize::Bytes(n)) => Ok(*n),
        Some(ByteSize::Text(text)) => parse_size::Config::new()
            .with_binary()
            .parse_size(text.trim())
            .map_err(|e| {
                EgressError::setting(
                    setting,
                    text,
                    e.to_string(),
                    "write bytes as `65536`, `64MiB` or `1 GiB`",
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(allow: &[&str]) -> EgressConfig {
        EgressConfig {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_issue_table_parses() {
        let toml_like = serde_json::json!({
            "mode": "allowlist",
            "allow": ["api.openai.com", "*.files.example.org", "**.github.com:443", "pkgs.example.com",
                      "tcp://ssh.github.com:22", "203.0.113.0/24:8080", "[2001:db8::/32]:443"],
            "deny": ["uploads.github.com"],
            "unix_sockets": ["/run/hero/sockets/*/rpc.sock"],
            "resolver": "system",
            "limits": {"connections": 256, "concurrent": 32, "bytes_out": "64MiB", "bytes_in": "1GiB", "dns_queries": 1024}
        });
        let config: EgressConfig = serde_json::from_value(toml_like).unwrap();
        let policy = EgressPolicy::parse(&config).unwrap();
        assert_eq!(policy.limits, Limits::default());
        assert_eq!(policy.resolver, Resolver::System);
        let plan = policy.sandbox_plan().unwrap();
        assert_eq!(plan.capture_ports, vec![22, 80, 443, 8080]);
        assert_eq!(plan.proxy_port, 3128);
        assert_eq!(plan.local_ranges.len(), 2);
    }

    #[test]
    fn resolver_forms() {
        assert_eq!(
            parse_resolver(Some("192.0.2.53")).unwrap(),
            Resolver::Server("192.0.2.53:53".parse().unwrap())
        );
        assert_eq!(
            parse_resolver(Some("192.0.2.53:5353")).unwrap(),
            Resolver::Server("192.0.2.53:5353".parse().unwrap())
        );
        assert_eq!(
            parse_resolver(Some("[2001:db8::53]:53")).unwrap(),
            Resolver::Server("[2001:db8::53]:53".parse().unwrap())
        );
        let err = parse_resolver(Some("dns.example")).unwrap_err().to_string();
        assert!(
            err.contains("`resolver`") && err.contains("IP:PORT"),
            "{err}"
        );
    }

    #[test]
    fn bad_sizes_and_port_53_are_typed_errors() {
        let mut c = config(&["a.test"]);
        c.limits.bytes_out = Some(ByteSize::Text("lots".into()));
        let err = EgressPolicy::parse(&c).unwrap_err().to_string();
        assert!(
            err.contains("limits.bytes_out") && err.contains("64MiB"),
            "{err}"
        );
        let policy = EgressPolicy::parse(&config(&["192.0.2.0/24:53"])).unwrap();
        assert!(policy
            .sandbox_plan()
            .unwrap_err()
            .to_string()
            .contains("DNS stub"));
        let policy = EgressPolicy::parse(&config(&["192.0.2.0/24:1-2000"])).unwrap();
        assert!(policy.sandbox_plan().is_err());
    }

    #[test]
    fn proxy_port_avoids_captured_ports() {
        let policy = EgressPolicy::parse(&config(&["a.test:3128-3130"])).unwrap();
        assert_eq!(policy.sandbox_plan().unwrap().proxy_port, 3131);
    }
}

//! The network flags every command that runs a program shares: the mode, the egress gate's
//! rules and resolver, the host Unix sockets, and the NDJSON log of the gate's decisions.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};

use airlock::network::Decision;
use airlock::policy::NetworkMode;
use airlock::NetworkReport;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkArg {
    /// No network: only loopback in a namespace of its own; DNS and connections fail at once.
    None,
    /// Only what --allow-net names, through airlock's egress gate (DNS, connections and bytes
    /// checked, counted and recorded).
    Allowlist,
    /// Learning mode for trusted code: any public address, every decision the allowlist would
    /// have made recorded, and a suggested allow list printed at the end.
    Report,
    /// The host's network, unfiltered.
    Host,
}

impl From<NetworkArg> for NetworkMode {
    fn from(arg: NetworkArg) -> Self {
        match arg {
            NetworkArg::None => NetworkMode::None,
            NetworkArg::Allowlist => NetworkMode::Allowlist,
            NetworkArg::Report => NetworkMode::Report,
            NetworkArg::Host => NetworkMode::Host,
        }
    }
}

/// Network overrides on top of a profile.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Network")]
pub struct NetworkFlags {
    /// The network mode (default: the profile's; `untrusted` has none).
    #[arg(long, value_enum)]
    pub network: Option<NetworkArg>,
    /// Allow traffic to RULE through the egress gate (repeatable; implies --network
    /// allowlist): `api.example.com`, `*.example.org` (subdomains), `**.example.org` (it and
    /// its subdomains), `name:8443`, `tcp://ssh.example.com:22`, `203.0.113.0/24:8080`,
    /// `[2001:db8::/32]:443`. Names reach public addresses only; a non-public range must be
    /// listed itself. See docs/network.md.
    #[arg(long = "allow-net", value_name = "RULE")]
    pub allow_net: Vec<String>,
    /// Refuse traffic to RULE even where an allow rule covers it (repeatable).
    #[arg(long = "deny-net", value_name = "RULE")]
    pub deny_net: Vec<String>,
    /// Expose the host Unix socket PATH (or a glob) at the same path (repeatable); no other
    /// host socket is reachable.
    #[arg(long = "unix-socket", value_name = "PATH")]
    pub unix_sockets: Vec<String>,
    /// Where the egress gate resolves allowed names: `system` or IP[:PORT].
    #[arg(long, value_name = "ADDR")]
    pub resolver: Option<String>,
    /// Write every decision of the egress gate to FILE, one JSON object per line.
    #[arg(long, value_name = "FILE")]
    pub net_log: Option<PathBuf>,
}

impl NetworkFlags {
    /// Writes the gate's decisions to `--net-log`, if asked; a run without the gate writes an
    /// empty file, so a caller always finds one.
    pub fn write_log(&self, report: Option<&NetworkReport>) -> Result<()> {
        let Some(path) = &self.net_log else {
            return Ok(());
        };
        let mut file = std::fs::File::create(path)
            .with_context(|| format!("cannot write the network log {}", path.display()))?;
        if let Some(report) = report {
            report
                .write_ndjson(&mut file)
                .with_context(|| format!("cannot write the network log {}", path.display()))?;
        }
        Ok(())
    }
}

/// What a person reads about the gate on stderr after a run: refusals (the first few), the
/// limits reached, and in report mode the suggested allow list.
pub fn print_report(report: &NetworkReport) {
    use airlock::DecisionRecord;
    const SHOWN: usize = 10;
    let refused: Vec<&DecisionRecord> = report
        .decisions
        .iter()
        .filter(|r| r.decision == Decision::Deny)
        .collect();
    for record in refused.iter().take(SHOWN) {
        eprintln!("airlock: network: refused {}", describe(record));
    }
    if refused.len() > SHOWN {
        eprintln!(
            "airlock: network: {} more refused (see --net-log or the JSON result)",
            refused.len() - SHOWN
        );
    }
    for limit in &report.limits_hit {
        let name = serde_json::to_value(limit).unwrap_or_default();
        eprintln!(
            "airlock: network: {} reached",
            name.as_str().unwrap_or("a limit")
        );
    }
    if !report.suggested_allow.is_empty() {
        eprintln!(
            "airlock: network report: suggested allow: {}",
            report.suggested_allow.join(" ")
        );
    }
}

/// `name:port (reason)`, `address:port (reason)` or `DNS name (reason)`.
fn describe(record: &airlock::DecisionRecord) -> String {
    let target = match (&record.name, record.address) {
        (Some(name), _) => name.clone(),
        (None, Some(address)) => address.to_string(),
        (None, None) => "?".into(),
    };
    let port = record.port.map(|p| format!(":{p}")).unwrap_or_default();
    let channel = serde_json::to_value(record.channel).unwrap_or_default();
    let via = channel.as_str().unwrap_or("");
    format!("{target}{port} ({}, {via})", record.reason.as_str())
}

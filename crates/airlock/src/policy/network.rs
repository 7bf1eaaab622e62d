//! `[network]`: no network, the host's, or traffic through airlock's egress gate (`allowlist`,
//! `report`) under its rules, resolver and per-run limits; and the host Unix sockets a run may
//! reach. The gate itself lives in the `airlock-egress` crate; this is what a policy says.

use serde::{Deserialize, Serialize};

use airlock_egress::{EgressConfig, EgressError, EgressPolicy, GateMode};

pub use airlock_egress::policy::LimitsConfig as NetworkLimits;

use crate::error::InvalidValue;

/// Network access of the sandbox.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// No network at all: a namespace with loopback only, sockets limited to AF_UNIX.
    None,
    /// Only what `allow` names, through airlock's egress gate: the sandbox keeps a namespace of
    /// its own whose only way out is the gate (DNS answered by it, every connection checked
    /// against the rules, tied to its name, counted and recorded).
    Allowlist,
    /// Learning mode, for trusted code only: traffic flows to any public address (never to
    /// non-public ones), and every decision the allowlist would have made is recorded, with a
    /// suggested `allow` list.
    Report,
    /// The host's network, unrestricted. Only when asked for explicitly.
    Host,
}

impl NetworkMode {
    /// Every mode, as written in profiles and on the command line.
    pub const ALL: [NetworkMode; 4] = [
        NetworkMode::None,
        NetworkMode::Allowlist,
        NetworkMode::Report,
        NetworkMode::Host,
    ];

    /// Traffic goes through the egress gate (`allowlist` or `report`).
    pub fn is_gated(self) -> bool {
        matches!(self, NetworkMode::Allowlist | NetworkMode::Report)
    }

    /// The name as written in profiles.
    pub fn name(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Allowlist => "allowlist",
            NetworkMode::Report => "report",
            NetworkMode::Host => "host",
        }
    }
}

impl std::str::FromStr for NetworkMode {
    type Err = InvalidValue;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        NetworkMode::ALL
            .into_iter()
            .find(|mode| mode.name() == text)
            .ok_or_else(|| InvalidValue {
                key: "network.mode",
                value: text.to_string(),
                allowed: "one of none, allowlist, report, host".into(),
            })
    }
}

/// `[network]`, resolved.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// The network mode.
    pub mode: NetworkMode,
    /// Allow rules of the egress gate (`allowlist` and `report`): names (`api.example.com`,
    /// `*.example.org`, `**.example.org`), optional `:port` or `:lo-hi`, `tcp://name:port`,
    /// address ranges with optional ports. See `docs/network.md`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Deny rules; they win over allow rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// Host Unix sockets (absolute paths or globs, expanded when the run starts) visible at the
    /// same path; no other host socket is reachable. Any mode with a boundary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unix_sockets: Vec<String>,
    /// Where the gate resolves allowed names: `system` (the default) or `IP[:PORT]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolver: Option<String>,
    /// Per-run caps of the gate: connections, concurrent, bytes_out, bytes_in, dns_queries.
    #[serde(default, skip_serializing_if = "is_default")]
    pub limits: NetworkLimits,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        NetworkPolicy {
            mode: NetworkMode::None,
            allow: Vec::new(),
            deny: Vec::new(),
            unix_sockets: Vec::new(),
            resolver: None,
            limits: NetworkLimits::default(),
        }
    }
}

impl NetworkPolicy {
    /// The gate's configuration, for a gated mode.
    pub fn egress_config(&self) -> Option<EgressConfig> {
        let mode = match self.mode {
            NetworkMode::Allowlist => GateMode::Allowlist,
            NetworkMode::Report => GateMode::Report,
            NetworkMode::None | NetworkMode::Host => return None,
        };
        Some(EgressConfig {
            mode,
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            unix_sockets: self.unix_sockets.clone(),
            resolver: self.resolver.clone(),
            limits: self.limits.clone(),
        })
    }

    /// The checked gate policy, for a gated mode; a bad rule or setting names itself and the fix.
    pub fn egress_policy(&self) -> Option<Result<EgressPolicy, InvalidValue>> {
        let config = self.egress_config()?;
        Some(EgressPolicy::parse(&config).map_err(|e| self.invalid(e)))
    }

    /// Checks every rule and setting; allow or deny rules in a mode without the gate are
    /// refused (they would silently do nothing). A resolver and limits are the gate's settings
    /// and wait for it: a profile may set them for runs that add rules.
    pub(super) fn validate(&self) -> Result<(), InvalidValue> {
        for pattern in &self.unix_sockets {
            if !pattern.starts_with('/') {
                return Err(InvalidValue {
                    key: "network.unix_sockets",
                    value: pattern.clone(),
                    allowed: "an absolute path or glob, e.g. /run/app/rpc.sock".into(),
                });
            }
        }
        match self.egress_policy() {
            Some(policy) => policy?
                .sandbox_plan()
                .map(drop)
                .map_err(|e| self.invalid(e)),
            None => {
                self.check_nothing_gated()?;
                // The gate's settings are still checked, for the runs that will use them.
                let settings = EgressConfig {
                    resolver: self.resolver.clone(),
                    limits: self.limits.clone(),
                    ..EgressConfig::default()
                };
                EgressPolicy::parse(&settings)
                    .map(drop)
                    .map_err(|e| self.invalid(e))
            }
        }
    }

    fn check_nothing_gated(&self) -> Result<(), InvalidValue> {
        let unused = |key: &'static str, value: String| {
            InvalidValue {
            key,
            value,
            allowed: format!(
                "only with network.mode = \"allowlist\" or \"report\" (the mode is \"{}\"): set the mode, or remove it",
                self.mode.name()
            ),
        }
        };
        if let Some(rule) = self.allow.first() {
            return Err(unused("network.allow", rule.clone()));
        }
        if let Some(rule) = self.deny.first() {
            return Err(unused("network.deny", rule.clone()));
        }
        Ok(())
    }

    /// The gate's error as the policy's: the setting, the value as written, the problem and fix.
    fn invalid(&self, error: EgressError) -> InvalidValue {
        match error {
            EgressError::Rule(rule) => InvalidValue {
                key: if self.deny.contains(&rule.rule) && !self.allow.contains(&rule.rule) {
                    "network.deny"
                } else {
                    "network.allow"
                },
                value: rule.rule,
                allowed: format!("{}; {}", rule.problem, rule.fix),
            },
            EgressError::Setting {
                setting,
                value,
                problem,
                fix,
            } => InvalidValue {
                key: match setting.as_str() {
                    "resolver" => "network.resolver",
                    "limits.bytes_out" => "network.limits.bytes_out",
                    "limits.bytes_in" => "network.limits.bytes_in",
                    "allow" => "network.allow",
                    _ => "network",
                },
                value,
                allowed: format!("{problem}; {fix}"),
            },
            other => InvalidValue {
                key: "network",
                value: String::new(),
                allowed: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gated(allow: &[&str]) -> NetworkPolicy {
        NetworkPolicy {
            mode: NetworkMode::Allowlist,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            ..NetworkPolicy::default()
        }
    }

    #[test]
    fn a_bad_rule_is_named_with_its_list_and_the_fix() {
        let error = gated(&["api.example.com:99999"]).validate().unwrap_err();
        assert_eq!(error.key, "network.allow");
        assert_eq!(error.value, "api.example.com:99999");
        let mut policy = gated(&["api.example.com"]);
        policy.deny = vec!["exa mple.com".into()];
        let error = policy.validate().unwrap_err();
        assert_eq!(error.key, "network.deny", "{error}");
        let mut policy = gated(&["api.example.com"]);
        policy.resolver = Some("dns.example".into());
        let error = policy.validate().unwrap_err();
        assert_eq!(error.key, "network.resolver");
        assert!(error.allowed.contains("IP:PORT"), "{error}");
        let error = gated(&["203.0.113.0/24:53"]).validate().unwrap_err();
        assert!(error.allowed.contains("DNS stub"), "{error}");
    }

    #[test]
    fn rules_without_the_gate_are_refused_not_ignored() {
        let mut policy = gated(&["api.example.com"]);
        policy.mode = NetworkMode::None;
        let error = policy.validate().unwrap_err();
        assert_eq!(error.key, "network.allow");
        assert!(error.allowed.contains("allowlist"), "{error}");
        let sockets = NetworkPolicy {
            unix_sockets: vec!["/run/app/rpc.sock".into()],
            ..NetworkPolicy::default()
        };
        assert!(sockets.validate().is_ok(), "sockets need no gate");
        let relative = NetworkPolicy {
            unix_sockets: vec!["run/app.sock".into()],
            ..NetworkPolicy::default()
        };
        assert_eq!(relative.validate().unwrap_err().key, "network.unix_sockets");
    }

    #[test]
    fn modes_read_and_name_themselves() {
        for mode in NetworkMode::ALL {
            assert_eq!(mode.name().parse::<NetworkMode>(), Ok(mode));
            assert_eq!(serde_json::to_value(mode).unwrap(), mode.name());
        }
        assert!(NetworkMode::Report.is_gated() && !NetworkMode::Host.is_gated());
        assert_eq!(
            "proxy".parse::<NetworkMode>().unwrap_err().key,
            "network.mode"
        );
    }
}

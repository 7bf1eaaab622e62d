//! Checking a parsed configuration: every problem at once, each naming its key and the fix.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::Config;

/// A problem in the configuration: the key and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Reading or checking the configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{} problem(s) in the configuration:\n  {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    Invalid(Vec<ConfigProblem>),
}
impl Config {
    /// Every problem of the configuration, or `Ok`.
    pub fn check(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        self.check_server(&mut problems);
        self.check_store(&mut problems);
        self.check_pool(&mut problems);
        self.check_mcp(&mut problems);
        self.check_warm(&mut problems);
        crate::tenant::check_tenants(self, &mut problems);
        for (name, toolset) in &self.toolsets {
            if !toolset.path.is_absolute() || !toolset.path.is_dir() {
                problems.add(
                    format!("toolsets.{name}.path"),
                    format!(
                        "{} is not an existing absolute directory; point it at the directory holding the tools",
                        toolset.path.display()
                    ),
                );
            }
        }
        problems.into_result()
    }

    fn check_server(&self, problems: &mut Problems) {
        if self.socket_mode().is_none() {
            problems.add(
                "server.socket_mode",
                format!(
                    "{:?} is not an octal mode; write e.g. \"0660\"",
                    self.server.socket_mode
                ),
            );
        }
        if self.server.tls_cert.is_some() != self.server.tls_key.is_some() {
            problems.add(
                "server.tls_cert",
                "give both tls_cert and tls_key, or neither",
            );
        }
        if let (Some(cert), Some(key)) = (&self.server.tls_cert, &self.server.tls_key) {
            if let Err(e) = crate::server::tls_config(cert, key) {
                problems.add("server.tls_cert", format!("{e:#}"));
            }
        }
        for addr in &self.server.listen {
            self.check_listen(addr, problems);
        }
        for addr in &self.server.internal_listen {
            if addr.parse::<SocketAddr>().is_err() {
                problems.add(
                    "server.internal_listen",
                    format!("{addr:?} is not an address; write e.g. \"10.0.0.5:8080\""),
                );
            }
        }
        if self.server.max_connections == 0 {
            problems.add("server.max_connections", "must be at least 1");
        }
    }

    /// A TCP address must parse, and plain HTTP is refused off loopback unless allowed.
    pub fn check_listen(&self, addr: &str, problems: &mut Problems) {
        let Ok(parsed) = addr.parse::<SocketAddr>() else {
            problems.add(
                "server.listen",
                format!("{addr:?} is not an address; write e.g. \"127.0.0.1:8080\""),
            );
            return;
        };
        let tls = self.server.tls_cert.is_some();
        if !tls && !parsed.ip().is_loopback() && !self.server.allow_insecure_tcp {
            problems.add(
                "server.listen",
                format!("{addr} is not loopback and no TLS certificate is configured: API keys would travel in clear; set server.tls_cert and server.tls_key (or allow_insecure_tcp = true behind a TLS-terminating proxy)"),
            );
        }
    }

    fn check_store(&self, problems: &mut Problems) {
        let url = self.store_url();
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres:")
            || url.starts_with("postgresql:"))
        {
            problems.add(
                "store.url",
                format!("{url:?} is neither sqlite:// nor postgres://; use one of them"),
            );
        }
        if self.store.max_connections == 0 {
            problems.add("store.max_connections", "must be at least 1");
        }
        if self.store.audit_retention.0 < Duration::from_secs(86400) {
            problems.add(
                "store.audit_retention",
                "must be at least 1d: audit records younger than a day cannot be deleted",
            );
        }
    }

    fn check_mcp(&self, problems: &mut Problems) {
        if self.mcp.max_sessions_per_key == 0 {
            problems.add(
                "mcp.max_sessions_per_key",
                "must be at least 1 (to serve no MCP at all, set mcp.enabled = false)",
            );
        }
        if self.mcp.session_idle_timeout.0 < Duration::from_secs(1) {
            problems.add("mcp.session_idle_timeout", "must be at least 1s");
        }
    }

    fn check_pool(&self, problems: &mut Problems) {
        if self.pool.max_concurrent == Some(0) {
            problems.add("pool.max_concurrent", "must be at least 1");
        }
        if self.pool.max_queued == 0 {
            problems.add("pool.max_queued", "must be at least 1");
        }
        self.check_node(problems);
    }

    /// The fleet's CA, this node's certificate (it must be one the CA accepts from a calling
    /// node, now), and an inter-node listener with TLS must be able to verify callers.
    fn check_node_tls(&self, problems: &mut Problems) {
        let node = &self.node;
        let mut report = |e: crate::peers::NodeTlsError| problems.add(e.key(), e.to_string());
        let ca_usable = match &node.peer_ca {
            Some(ca) => crate::peers::client_verifier(ca)
                .map_err(&mut report)
                .is_ok(),
            None => false,
        };
        match (crate::peers::NodeIdentity::of(self), &node.peer_ca) {
            (Ok(Some(identity)), Some(ca)) if ca_usable => {
                let accepted = identity.check_against(ca);
                // The key must be the certificate's: rustls compares them here.
                let usable = crate::peers::client_config(ca, Some(identity)).map(drop);
                if let Err(e) = accepted.and(usable) {
                    report(e);
                }
            }
            (Ok(Some(_)), None) => report(crate::peers::NodeTlsError::Missing {
                key: "node.peer_ca",
                problem: "node.cert is set but no CA says which certificates the fleet accepts",
                fix: "set node.peer_ca to the fleet's CA certificate (PEM)",
            }),
            (Err(e), _) => report(e),
            _ => {}
        }
        let tls = self.server.tls_cert.is_some();
        if tls && !self.server.internal_listen.is_empty() && node.peer_ca.is_none() {
            report(crate::peers::NodeTlsError::Missing {
                key: "node.peer_ca",
                problem: "server.internal_listen speaks TLS and must verify the calling nodes' certificates",
                fix: "set node.peer_ca to the fleet's CA certificate (PEM)",
            });
        }
    }

    /// Forwarding between nodes: TLS with a CA to verify peers, or plain HTTP only when the
    /// operator says the network is trusted.
    fn check_node(&self, problems: &mut Problems) {
        let node = &self.node;
        self.check_node_tls(problems);
        let Some(advertise) = &node.advertise else {
            return;
        };
        let tls = self.server.tls_cert.is_some();
        if advertise.starts_with("https://") {
            if !tls {
                problems.add("node.advertise", format!("{advertise} is https:// but this node has no certificate; set server.tls_cert and server.tls_key"));
            }
            if node.peer_ca.is_none() {
                problems.add("node.peer_ca", "this node advertises https:// but has no CA to verify the other nodes with; set peer_ca to the fleet's CA certificate (PEM)");
            }
            if node.cert.is_none() {
                problems.add("node.cert", "this node advertises https:// but has no certificate to present to the other nodes, whose server.internal_listen requires one; set node.cert and node.key (a certificate of the fleet's CA with the clientAuth usage)");
            }
        } else if advertise.starts_with("http://") {
            if !node.plain_http_peers {
                problems.add("node.advertise", format!("{advertise} is plain HTTP: other nodes would forward API keys to it in clear; give the nodes certificates (server.tls_cert, server.tls_key), advertise https:// and set node.peer_ca, or set node.plain_http_peers = true on a trusted network"));
            }
            if tls && !self.server.internal_listen.is_empty() {
                problems.add("node.advertise", format!("{advertise} is http:// but server.internal_listen speaks TLS (a certificate is set); advertise https://"));
            }
        } else {
            problems.add(
                "node.advertise",
                "must be an http:// or https:// URL other daemons can reach",
            );
        }
    }
}

/// Collects configuration problems.
#[derive(Default, Debug)]
pub struct Problems(Vec<ConfigProblem>);

impl Problems {
    pub fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem {
            key: key.into(),
            message: message.into(),
        });
    }

    pub fn into_result(self) -> Result<(), ConfigError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(self.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn unknown_keys_are_errors_that_name_the_key() {
        let err = Config::parse("[server]\nsokcet = \"/x\"\n", Path::new("t.toml")).unwrap_err();
        assert!(err.to_string().contains("sokcet"), "{err}");
    }

    #[test]
    fn plain_tcp_off_loopback_is_refused() {
        let config = Config::parse(
            "[server]\nlisten = [\"0.0.0.0:8080\", \"127.0.0.1:1\"]\n",
            Path::new("t.toml"),
        )
        .unwrap();
        let mut problems = Problems::default();
        config.check_listen("0.0.0.0:8080", &mut problems);
        config.check_listen("127.0.0.1:1", &mut problems);
        assert_eq!(problems.0.len(), 1, "{problems:?}");
        assert!(problems.0[0].message.contains("tls_cert"));
    }

    #[test]
    fn socket_mode_is_octal() {
        let mut config = Config::default();
        assert_eq!(config.socket_mode(), Some(0o660));
        config.server.socket_mode = "999".into();
        assert_eq!(config.socket_mode(), None);
    }
}

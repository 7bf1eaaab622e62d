//! What the sandbox's network namespace must hold: made on the host from the policy, carried
//! to the sandbox's child (serde), applied there by `sandbox_side::configure`.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

/// Placeholder IPv4 addresses the DNS stub hands out: the benchmarking range, which no real
/// destination uses (srt uses the same range).
pub const PLACEHOLDER_V4: Ipv4Net = match Ipv4Net::new(Ipv4Addr::new(198, 18, 0, 0), 15) {
    Ok(net) => net,
    Err(_) => panic!("valid prefix"),
};

/// Placeholder IPv6 addresses: the IPv6 benchmarking range (RFC 5180).
pub const PLACEHOLDER_V6: Ipv6Net =
    match Ipv6Net::new(Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0), 48) {
        Ok(net) => net,
        Err(_) => panic!("valid prefix"),
    };

/// The network plan of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// TCP ports captured on every local address (placeholders and allowed ranges).
    pub capture_ports: Vec<u16>,
    /// Allowed address ranges, made local inside the sandbox so connections to them are
    /// captured (every other address stays unroutable).
    pub local_ranges: Vec<IpNet>,
    /// The port of the in-sandbox proxy endpoint on 127.0.0.1.
    pub proxy_port: u16,
}

impl SandboxPlan {
    /// The environment pointing proxy-aware programs at the endpoint (known before the
    /// sandbox starts, so the launcher can put it in the program's environment).
    pub fn proxy_env(&self) -> Vec<(String, String)> {
        crate::env::proxy_env(self.proxy_port)
    }

    /// Every range given a `local` route on `lo`: the placeholders, then the allowed ranges.
    pub fn local_routes(&self) -> Vec<IpNet> {
        let mut routes = vec![IpNet::V4(PLACEHOLDER_V4), IpNet::V6(PLACEHOLDER_V6)];
        routes.extend(self.local_ranges.iter().copied());
        routes
    }
}

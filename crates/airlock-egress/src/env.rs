//! The environment that points proxy-aware programs at the in-sandbox proxy endpoint.
//!
//! Programs that ignore these variables still work for allowed names: their connections to
//! placeholder addresses are captured. The variables are a fast path, and the only path for
//! ports the sandbox does not capture.

/// Hosts that never go through the proxy: the sandbox's own loopback.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// Proxy variables for the endpoint on `127.0.0.1:port`: the conventional upper- and
/// lower-case names (curl reads `http_proxy` only in lower case), and the tool-specific ones
/// codex sets (npm, yarn, pip, bundler, docker), plus `NODE_USE_ENV_PROXY` for Node's
/// built-in fetch. `ALL_PROXY` uses `socks5h` so names are resolved by the gate.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    let mut env = Vec::new();
    let mut both_cases = |name: &str, value: &str| {
        env.push((name.to_string(), value.to_string()));
        env.push((name.to_lowercase(), value.to_string()));
    };
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "WS_PROXY", "WSS_PROXY"] {
        both_cases(name, &http);
    }
    both_cases("ALL_PROXY", &socks);
    both_cases("NO_PROXY", NO_PROXY);
    for name in [
        "NPM_CONFIG_PROXY",
        "NPM_CONFIG_HTTP_PROXY",
        "NPM_CONFIG_HTTPS_PROXY",
        "YARN_HTTP_PROXY",
        "YARN_HTTPS_PROXY",
        "PIP_PROXY",
        "BUNDLE_HTTP_PROXY",
        "BUNDLE_HTTPS_PROXY",
        "DOCKER_HTTP_PROXY",
        "DOCKER_HTTPS_PROXY",
    ] {
        both_cases(name, &http);
    }
    both_cases("NPM_CONFIG_NOPROXY", NO_PROXY);
    env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_gets_the_endpoint() {
        let env = proxy_env(3128);
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(get("https_proxy"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("HTTPS_PROXY"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("ALL_PROXY"), Some("socks5h://127.0.0.1:3128"));
        assert_eq!(get("PIP_PROXY"), Some("http://127.0.0.1:3128"));
        assert_eq!(get("no_proxy"), Some(NO_PROXY));
        assert_eq!(get("NODE_USE_ENV_PROXY"), Some("1"));
    }
}

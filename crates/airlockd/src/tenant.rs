//! Tenants as the daemon uses them: the configuration resolved into policies and digests, and
//! the checks `--check-config` runs on them.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use airlock::Policy;

use crate::auth;
use crate::config::{Ceiling, Config, PriorityRange, Problems, TenantConfig};
use crate::resolve;

/// A tenant ready to serve requests.
#[derive(Debug)]
pub struct Tenant {
    pub name: String,
    pub admin: bool,
    /// The profile used when a request names none.
    pub default_profile: String,
    /// Every profile a request may name, resolved.
    pub policies: BTreeMap<String, Policy>,
    pub share: usize,
    pub max_queued: usize,
    pub priority: PriorityRange,
    pub ceiling: Ceiling,
    pub toolsets: Vec<String>,
    /// (key name, digest)
    pub keys: Vec<(String, [u8; 32])>,
}

impl Tenant {
    /// The default profile's policy: what a request gets when it asks for nothing.
    pub fn default_policy(&self) -> &Policy {
        &self.policies[&self.default_profile]
    }
}

/// Resolves every tenant of a checked configuration.
pub fn build_tenants(config: &Config) -> Result<Vec<Arc<Tenant>>, String> {
    config
        .tenants
        .iter()
        .map(|t| build_tenant(config, t).map(Arc::new))
        .collect()
}

fn build_tenant(config: &Config, t: &TenantConfig) -> Result<Tenant, String> {
    let mut policies = BTreeMap::new();
    for name in profile_names(t) {
        let policy =
            airlock::policy::load_profile(&name).map_err(|e| format!("tenant {}: {e}", t.name))?;
        policies.insert(name, policy);
    }
    let keys = t
        .keys
        .iter()
        .map(|k| {
            auth::parse_hash(&k.hash)
                .map(|d| (k.name.clone(), d))
                .ok_or_else(|| format!("tenant {}: key {} has a malformed hash", t.name, k.name))
        })
        .collect::<Result<_, _>>()?;
    let pool_cap = config.max_concurrent();
    Ok(Tenant {
        name: t.name.clone(),
        admin: t.admin,
        default_profile: t.profile.clone(),
        policies,
        share: t.share.unwrap_or(pool_cap).min(pool_cap).max(1),
        max_queued: t.max_queued.unwrap_or(config.pool.max_queued),
        priority: t.priority,
        ceiling: t.ceiling.clone(),
        toolsets: t.toolsets.clone(),
        keys,
    })
}

fn profile_names(t: &TenantConfig) -> Vec<String> {
    let mut names = vec![t.profile.clone()];
    for name in &t.profiles {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

/// Checks every tenant: names, keys, profiles within their ceiling, priorities, toolsets.
pub fn check_tenants(config: &Config, problems: &mut Problems) {
    if config.tenants.is_empty() {
        problems.add(
            "tenants",
            "no tenant is configured, so no request could be authorised; add a [[tenants]] table with a key (`airlockd new-key` prints one)",
        );
    }
    let mut names = HashSet::new();
    let mut digests = HashSet::new();
    for (i, t) in config.tenants.iter().enumerate() {
        let key = format!("tenants[{i}] ({})", t.name);
        if !valid_name(&t.name) {
            problems.add(
                format!("tenants[{i}].name"),
                format!(
                    "{:?} must be 1-64 characters of a-z, 0-9, '-' and '_'",
                    t.name
                ),
            );
        }
        if !names.insert(t.name.clone()) {
            problems.add(&key, "the tenant name is used twice; names must be unique");
        }
        check_keys(t, &key, &mut digests, problems);
        check_priority(t, &key, problems);
        check_profiles(t, &key, problems);
        for toolset in &t.toolsets {
            if !config.toolsets.contains_key(toolset) {
                problems.add(
                    format!("{key}.toolsets"),
                    format!(
                        "toolset {toolset:?} is not defined; add [toolsets.{toolset}] with a path"
                    ),
                );
            }
        }
        if t.share == Some(0) || t.max_queued == Some(0) {
            problems.add(&key, "share and max_queued must be at least 1 when set");
        }
    }
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn check_keys(
    t: &TenantConfig,
    key: &str,
    digests: &mut HashSet<[u8; 32]>,
    problems: &mut Problems,
) {
    if t.keys.is_empty() {
        problems.add(
            format!("{key}.keys"),
            "the tenant has no key, so nobody can act as it; add one from `airlockd new-key`",
        );
    }
    for k in &t.keys {
        match auth::parse_hash(&k.hash) {
            None => problems.add(
                format!("{key}.keys.{}", k.name),
                "hash must be \"sha256:\" and 64 hex digits, as printed by `airlockd new-key` (never the key itself)",
            ),
            Some(d) if !digests.insert(d) => problems.add(
                format!("{key}.keys.{}", k.name),
                "the same key is configured twice; every key must belong to one tenant",
            ),
            Some(_) => {}
        }
    }
}

fn check_priority(t: &TenantConfig, key: &str, problems: &mut Problems) {
    let p = t.priority;
    if !(p.min <= p.default && p.default <= p.max) {
        problems.add(
            format!("{key}.priority"),
            format!(
                "needs min <= default <= max (got min {}, default {}, max {})",
                p.min, p.default, p.max
            ),
        );
    }
}

fn check_profiles(t: &TenantConfig, key: &str, problems: &mut Problems) {
    for name in profile_names(t) {
        let policy = match airlock::policy::load_profile(&name) {
            Ok(policy) => policy,
            Err(e) => {
                problems.add(format!("{key}.profile"), e.to_string());
                continue;
            }
        };
        if let Err(v) = resolve::within_ceiling(&policy, &[], false, &t.ceiling, &policy) {
            problems.add(
                format!("{key}.profile"),
                format!(
                    "profile {name:?} has {} = {}, beyond the tenant's ceiling ({}); raise tenants.ceiling or pick a stricter profile",
                    v.key, v.asked, v.ceiling
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(text: &str) -> Config {
        Config::parse(text, Path::new("t.toml")).unwrap()
    }

    #[test]
    fn a_tenant_needs_a_valid_key_and_a_profile_within_its_ceiling() {
        let hash = auth::hash_line("k");
        let good = config(&format!(
            "[[tenants]]\nname = \"a\"\nkeys = [{{name = \"ci\", hash = \"{hash}\"}}]\n"
        ));
        let mut problems = Problems::default();
        check_tenants(&good, &mut problems);
        assert!(problems.into_result().is_ok());

        let bad = config(
            "[[tenants]]\nname = \"A!\"\nprofile = \"trusted\"\nkeys = [{name = \"ci\", hash = \"k\"}]\n",
        );
        let mut problems = Problems::default();
        check_tenants(&bad, &mut problems);
        let text = problems.into_result().unwrap_err().to_string();
        assert!(text.contains("tenants[0].name"), "{text}");
        assert!(text.contains("sha256"), "{text}");
        // `trusted` is Tier 0 with the host network: beyond the default ceiling.
        assert!(text.contains("beyond the tenant's ceiling"), "{text}");
    }
}

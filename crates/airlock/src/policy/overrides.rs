//! What a caller changes on top of a profile for one run: the CLI's flags today, a daemon
//! request's fields or a client's arguments next. One builder for every command that runs a
//! program (`run`, `exec`, `call`, `worker`), so each offers the same choices with the same
//! checks, and a refusal names what was asked for.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::profile::{apply_limits, LimitsSection};
use super::{
    tier, tier_names, BackendChoice, ContainerRuntime, GitProtection, InvalidValue, NetworkMode,
    Policy,
};

/// Changes to a resolved profile. Every field is optional; an empty `Overrides` changes
/// nothing. Relative paths are taken from the caller's current directory.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Overrides {
    /// A resource tier (`small`, `standard`), applied before `limits`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_runtime: Option<ContainerRuntime>,
    /// The network mode. A mode that drops a layer the profile requires (`host` drops
    /// `net_ns` and `landlock_net`) makes the run refuse unless degradation is accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// Egress gate rules added to the profile's `allow` (without a `network` mode they
    /// imply `allowlist`); see docs/network.md.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_net: Vec<String>,
    /// Rules added to the profile's `deny`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny_net: Vec<String>,
    /// Host Unix sockets (paths or globs) the program may reach, at the same path.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unix_sockets: Vec<String>,
    /// Where the egress gate resolves allowed names: `system` or IP[:PORT].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolver: Option<String>,
    /// Limits, each replacing the profile's value.
    pub limits: LimitsSection,
    /// Host paths visible read-only at the same path, added to the profile's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<PathBuf>,
    /// Host paths visible read-write at the same path, added to the profile's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_write: Vec<PathBuf>,
    /// An existing host directory to work in, read-write, instead of a fresh one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
    /// Work in `workdir` read-only: the program reads it (runs a script from it) but writes
    /// only to `/tmp`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub workdir_read_only: bool,
    /// Replaces the profile's `filesystem.protect_git`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protect_git: Option<GitProtection>,
}

impl Overrides {
    /// Applies the overrides to `policy` and checks the result: an unknown tier or a value
    /// out of range is refused, naming the key, the value and what is allowed.
    pub fn apply(&self, policy: &mut Policy) -> Result<(), InvalidValue> {
        if let Some(name) = &self.tier {
            if !tier(policy, name) {
                return Err(InvalidValue {
                    key: "tier",
                    value: name.clone(),
                    allowed: format!("one of {}", tier_names().join(", ")),
                });
            }
        }
        set(&mut policy.backend, self.backend);
        set(&mut policy.container.runtime, self.container_runtime);
        self.apply_network(policy);
        apply_limits(&mut policy.limits, self.limits.clone());
        let fs = &mut policy.filesystem;
        fs.read_only.extend(absolute_all(&self.read_only)?);
        fs.read_write.extend(absolute_all(&self.read_write)?);
        if let Some(dir) = &self.workdir {
            fs.workdir = Some(absolute(dir)?);
            fs.workdir_read_only = self.workdir_read_only;
        }
        set(&mut fs.protect_git, self.protect_git);
        policy.validate()
    }
}

impl Overrides {
    fn apply_network(&self, policy: &mut Policy) {
        let network = &mut policy.network;
        match self.network {
            Some(mode) => network.mode = mode,
            None if !self.allow_net.is_empty() => network.mode = NetworkMode::Allowlist,
            None => {}
        }
        network.allow.extend(self.allow_net.iter().cloned());
        network.deny.extend(self.deny_net.iter().cloned());
        network
            .unix_sockets
            .extend(self.unix_sockets.iter().cloned());
        if self.resolver.is_some() {
            network.resolver = self.resolver.clone();
        }
    }
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

fn absolute_all(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InvalidValue> {
    paths.iter().map(|p| absolute(p)).collect()
}

fn absolute(path: &Path) -> Result<PathBuf, InvalidValue> {
    std::path::absolute(path).map_err(|e| InvalidValue {
        key: "filesystem paths",
        value: path.display().to_string(),
        allowed: format!("a path that can be resolved ({e})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::builtin;

    #[test]
    fn a_tier_then_limits_then_paths_are_applied() {
        let mut policy = builtin("untrusted").unwrap();
        let overrides = Overrides {
            tier: Some("small".into()),
            limits: LimitsSection {
                wall_time: "5s".parse().ok(),
                ..LimitsSection::default()
            },
            read_only: vec!["relative/dir".into()],
            ..Overrides::default()
        };
        overrides.apply(&mut policy).unwrap();
        assert_eq!(policy.limits.memory.0, 256 << 20, "from the tier");
        assert_eq!(policy.limits.wall_time.0.as_secs(), 5, "the limit wins");
        assert!(policy.filesystem.read_only[0].is_absolute());
    }

    #[test]
    fn an_unknown_tier_and_an_impossible_limit_are_refused_by_key() {
        let mut policy = builtin("untrusted").unwrap();
        let tier = Overrides {
            tier: Some("huge".into()),
            ..Overrides::default()
        };
        assert_eq!(tier.apply(&mut policy).unwrap_err().key, "tier");
        let pids = Overrides {
            limits: LimitsSection {
                processes: Some(2),
                ..LimitsSection::default()
            },
            ..Overrides::default()
        };
        let error = pids.apply(&mut policy).unwrap_err();
        assert_eq!(error.key, "limits.processes");
        assert!(error.allowed.contains("at least 3"), "{error}");
    }

    #[test]
    fn overrides_read_from_json_refuse_unknown_fields() {
        let parsed: Overrides =
            serde_json::from_str(r#"{"network": "host", "limits": {"memory": "1GiB"}}"#).unwrap();
        assert_eq!(parsed.network, Some(NetworkMode::Host));
        assert!(serde_json::from_str::<Overrides>(r#"{"netwrk": "host"}"#).is_err());
    }
}

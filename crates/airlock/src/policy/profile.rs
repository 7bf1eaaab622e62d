//! Profiles on disk: partial TOML documents that extend a base policy. Unknown keys are errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::units::{ByteSize, Seconds};
use super::{
    builtin, BackendChoice, ContainerRuntime, GitProtection, NetworkLimits, NetworkMode,
    NetworkPolicy, OutputLimitAction, Policy, PolicyOrigin,
};
use crate::error::PolicyError;
use crate::layer::{IsolationLevel, Layer};

/// A profile file as written: every key optional, layered over `extends` (default `untrusted`).
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// A built-in profile name or a path (relative to this file) to extend.
    pub extends: Option<String>,
    pub backend: Option<BackendChoice>,
    pub require: Option<Vec<Layer>>,
    pub min_isolation: Option<IsolationLevel>,
    pub filesystem: Option<FsSection>,
    pub network: Option<NetworkSection>,
    pub env: Option<EnvSection>,
    pub limits: Option<LimitsSection>,
    pub user: Option<UserSection>,
    /// Replaces the base profile's list.
    pub allowed_programs: Option<Vec<String>>,
    pub container: Option<ContainerSection>,
}

/// `[container]`.
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ContainerSection {
    pub runtime: Option<ContainerRuntime>,
}

/// `[filesystem]`: lists add to the base profile's lists.
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsSection {
    pub read_only: Option<Vec<PathBuf>>,
    pub read_write: Option<Vec<PathBuf>>,
    pub workdir: Option<PathBuf>,
    pub workdir_read_only: Option<bool>,
    pub exec_writable: Option<bool>,
    pub workspace: Option<bool>,
    pub protect_git: Option<GitProtection>,
}

/// `[network]`: lists add to the base profile's lists, other keys replace; `allow` rules in a
/// profile whose network would otherwise be `none` make it `allowlist` (rules are never
/// silently ignored).
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    pub mode: Option<NetworkMode>,
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
    pub unix_sockets: Option<Vec<String>>,
    pub resolver: Option<String>,
    pub limits: Option<NetworkLimits>,
}

/// `[env]`: `pass` adds names, `set` adds or replaces values.
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    pub pass: Option<Vec<String>>,
    pub set: Option<BTreeMap<String, String>>,
}

/// `[limits]`: each key replaces the base value.
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub memory: Option<ByteSize>,
    pub cpu_time: Option<Seconds>,
    pub wall_time: Option<Seconds>,
    pub grace: Option<Seconds>,
    pub processes: Option<u64>,
    pub open_files: Option<u64>,
    pub file_size: Option<ByteSize>,
    pub disk: Option<ByteSize>,
    pub files: Option<u64>,
    pub stdout: Option<ByteSize>,
    pub stderr: Option<ByteSize>,
    pub on_output_limit: Option<OutputLimitAction>,
    pub cpus: Option<f64>,
}

/// `[user]`.
#[derive(Deserialize, Serialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserSection {
    pub drop_root: Option<bool>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// Parses profile text; `origin` names the file in errors (which carry line and column).
pub fn parse_profile(text: &str, origin: &str) -> Result<ProfileFile, PolicyError> {
    toml::from_str(text).map_err(|e| PolicyError::Parse {
        origin: origin.to_string(),
        message: e.to_string().trim_end().to_string(),
    })
}

/// Resolves a built-in profile name or a profile file path into a validated policy.
pub fn load_profile(name_or_path: &str) -> Result<Policy, PolicyError> {
    let mut chain = Vec::new();
    let policy = resolve(name_or_path, None, &mut chain)?;
    policy.validate().map_err(|source| PolicyError::Invalid {
        origin: name_or_path.to_string(),
        problem: source,
    })?;
    Ok(policy)
}

fn resolve(
    reference: &str,
    relative_to: Option<&Path>,
    chain: &mut Vec<String>,
) -> Result<Policy, PolicyError> {
    if let Some(policy) = builtin(reference) {
        return Ok(policy);
    }
    if !looks_like_path(reference) {
        return Err(PolicyError::UnknownProfile {
            name: reference.to_string(),
        });
    }
    let path = match relative_to {
        Some(dir) if Path::new(reference).is_relative() => dir.join(reference),
        _ => PathBuf::from(reference),
    };
    let origin = std::fs::canonicalize(&path)
        .unwrap_or_else(|_| path.clone())
        .display()
        .to_string();
    if chain.contains(&origin) {
        chain.push(origin);
        return Err(PolicyError::ExtendsCycle {
            chain: chain.join(" -> "),
        });
    }
    chain.push(origin.clone());
    let text = std::fs::read_to_string(&path).map_err(|source| PolicyError::Read {
        path: path.clone(),
        cause: source,
    })?;
    let file = parse_profile(&text, &origin)?;
    let base_name = file
        .extends
        .clone()
        .unwrap_or_else(|| "untrusted".to_string());
    let base = resolve(&base_name, path.parent(), chain)?;
    Ok(apply(base, file).with_origin(PolicyOrigin::File(path)))
}

fn looks_like_path(reference: &str) -> bool {
    reference.contains('/') || reference.ends_with(".toml")
}

/// Layers a profile file over a base policy.
pub(crate) fn apply(mut policy: Policy, file: ProfileFile) -> Policy {
    set(&mut policy.backend, file.backend);
    let own_require = file.require.is_some();
    set(&mut policy.require, file.require);
    if file.min_isolation.is_some() {
        policy.min_isolation = file.min_isolation;
    }
    if let Some(fs) = file.filesystem {
        policy
            .filesystem
            .read_only
            .extend(fs.read_only.unwrap_or_default());
        policy
            .filesystem
            .read_write
            .extend(fs.read_write.unwrap_or_default());
        if fs.workdir.is_some() {
            policy.filesystem.workdir = fs.workdir;
        }
        set(
            &mut policy.filesystem.workdir_read_only,
            fs.workdir_read_only,
        );
        set(&mut policy.filesystem.exec_writable, fs.exec_writable);
        set(&mut policy.filesystem.workspace, fs.workspace);
        set(&mut policy.filesystem.protect_git, fs.protect_git);
    }
    if let Some(net) = file.network {
        // A profile that chooses the host network for itself drops the network layers it
        // inherited as required; naming them in its own `require` is a contradiction the
        // run then refuses (see `supervisor::prepare::required_layers`).
        if net.mode == Some(NetworkMode::Host) && !own_require {
            policy
                .require
                .retain(|l| *l != Layer::NetNs && *l != Layer::LandlockNet);
        }
        apply_network(&mut policy.network, net);
    }
    if let Some(env) = file.env {
        policy.env.pass.extend(env.pass.unwrap_or_default());
        policy.env.set.extend(env.set.unwrap_or_default());
    }
    if let Some(limits) = file.limits {
        apply_limits(&mut policy.limits, limits);
    }
    if file.allowed_programs.is_some() {
        policy.allowed_programs = file.allowed_programs;
    }
    if let Some(user) = file.user {
        set(&mut policy.user.drop_root, user.drop_root);
        set(&mut policy.user.uid, user.uid);
        set(&mut policy.user.gid, user.gid);
    }
    if let Some(container) = file.container {
        set(&mut policy.container.runtime, container.runtime);
    }
    policy
}

fn apply_network(network: &mut NetworkPolicy, section: NetworkSection) {
    let adds_rules = section
        .allow
        .as_ref()
        .is_some_and(|rules| !rules.is_empty());
    if section.mode.is_none() && adds_rules && network.mode == NetworkMode::None {
        network.mode = NetworkMode::Allowlist;
    }
    set(&mut network.mode, section.mode);
    network.allow.extend(section.allow.unwrap_or_default());
    network.deny.extend(section.deny.unwrap_or_default());
    network
        .unix_sockets
        .extend(section.unix_sockets.unwrap_or_default());
    if section.resolver.is_some() {
        network.resolver = section.resolver;
    }
    if let Some(limits) = section.limits {
        let current = &mut network.limits;
        set(&mut current.connections, limits.connections.map(Some));
        set(&mut current.concurrent, limits.concurrent.map(Some));
        set(&mut current.bytes_out, limits.bytes_out.map(Some));
        set(&mut current.bytes_in, limits.bytes_in.map(Some));
        set(&mut current.dns_queries, limits.dns_queries.map(Some));
    }
}

pub(crate) fn apply_limits(l: &mut super::Limits, s: LimitsSection) {
    set(&mut l.memory, s.memory);
    set(&mut l.cpu_time, s.cpu_time);
    set(&mut l.wall_time, s.wall_time);
    set(&mut l.grace, s.grace);
    set(&mut l.processes, s.processes);
    set(&mut l.open_files, s.open_files);
    set(&mut l.file_size, s.file_size);
    set(&mut l.disk, s.disk);
    set(&mut l.files, s.files);
    set(&mut l.stdout, s.stdout);
    set(&mut l.stderr, s.stderr);
    set(&mut l.on_output_limit, s.on_output_limit);
    set(&mut l.cpus, s.cpus);
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_runtime_is_chosen_by_a_profile() {
        let file = parse_profile("[container]\nruntime = \"podman\"\n", "t").unwrap();
        let policy = apply(builtin("untrusted").unwrap(), file);
        assert_eq!(policy.container.runtime, ContainerRuntime::Podman);
        assert_eq!(
            builtin("untrusted").unwrap().container.runtime,
            ContainerRuntime::Auto
        );
    }

    #[test]
    fn container_section_refuses_unknown_keys_and_runtimes() {
        let unknown_key = parse_profile("[container]\nengine = \"runc\"\n", "t").unwrap_err();
        assert!(unknown_key.to_string().contains("engine"), "{unknown_key}");
        let unknown_runtime = parse_profile("[container]\nruntime = \"lxc\"\n", "t").unwrap_err();
        assert!(
            unknown_runtime.to_string().contains("lxc"),
            "{unknown_runtime}"
        );
    }

    #[test]
    fn a_network_section_adds_rules_and_turns_none_into_allowlist() {
        let text = r#"
[network]
allow = ["api.example.com", "203.0.113.0/24:8080"]
deny = ["uploads.example.com"]
unix_sockets = ["/run/app/*.sock"]
resolver = "192.0.2.53"
[network.limits]
bytes_out = "64MiB"
connections = 10
"#;
        let policy = apply(
            builtin("untrusted").unwrap(),
            parse_profile(text, "t").unwrap(),
        );
        let network = &policy.network;
        assert_eq!(network.mode, NetworkMode::Allowlist);
        assert_eq!(network.allow.len(), 2);
        assert_eq!(network.limits.connections, Some(10));
        policy.validate().unwrap();
        let explicit = "[network]\nmode = \"report\"\nallow = [\"a.example\"]\n";
        let policy = apply(
            builtin("untrusted").unwrap(),
            parse_profile(explicit, "t").unwrap(),
        );
        assert_eq!(policy.network.mode, NetworkMode::Report);
        let back: Policy = toml::from_str(&policy.to_toml()).unwrap();
        assert_eq!(back.network, policy.network);
        let unknown = parse_profile("[network]\nallowed = []\n", "t").unwrap_err();
        assert!(unknown.to_string().contains("allowed"), "{unknown}");
    }

    #[test]
    fn container_runtime_names_round_trip() {
        for runtime in ContainerRuntime::ALL {
            assert_eq!(runtime.name().parse::<ContainerRuntime>(), Ok(runtime));
            let rendered = serde_json::to_value(runtime).unwrap();
            assert_eq!(rendered, runtime.name());
        }
        let error = "rkt".parse::<ContainerRuntime>().unwrap_err();
        assert_eq!(error.key, "container.runtime");
    }
}

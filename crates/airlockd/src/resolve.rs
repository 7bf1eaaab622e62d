//! Turning a request's policy wishes into a resolved [`Policy`], within the tenant's ceiling.
//!
//! A request starts from one of its tenant's profiles and may change the backend, the minimum
//! isolation, the network and the limits. Anything beyond the ceiling (a wider network, a
//! larger limit, a weaker backend, accepting degradation when not allowed) is refused with 403
//! naming the key, the value and the ceiling; the daemon never silently lowers a request.

use airlock::policy::units::{ByteSize, Seconds};
use airlock::policy::{BackendChoice, NetworkMode};
use airlock::{IsolationLevel, Policy, SandboxOptions};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::config::{Ceiling, NetworkLevel};
use crate::error::ApiError;

/// Which backend runs the program.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BackendName {
    Auto,
    Native,
    Bwrap,
    Container,
    Gvisor,
    None,
}

impl BackendName {
    fn choice(self) -> BackendChoice {
        match self {
            BackendName::Auto => BackendChoice::Auto,
            BackendName::Native => BackendChoice::Native,
            BackendName::Bwrap => BackendChoice::Bwrap,
            BackendName::Container => BackendChoice::Container,
            BackendName::Gvisor => BackendChoice::Gvisor,
            BackendName::None => BackendChoice::None,
        }
    }
}

/// Isolation levels, weakest first.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationName {
    Process,
    Kernel,
    Container,
    UserKernel,
    Vm,
}

impl IsolationName {
    fn level(self) -> IsolationLevel {
        match self {
            IsolationName::Process => IsolationLevel::Process,
            IsolationName::Kernel => IsolationLevel::Kernel,
            IsolationName::Container => IsolationLevel::Container,
            IsolationName::UserKernel => IsolationLevel::UserKernel,
            IsolationName::Vm => IsolationLevel::Vm,
        }
    }
}

/// The network a run asks for.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// `none` (default), `allowlist` (through the egress gate) or `host`.
    #[schema(value_type = String, example = "none")]
    pub mode: NetworkLevel,
    /// Host patterns for `allowlist`: `a.com`, `*.a.com` (subdomains), `**.a.com` (both).
    #[serde(default)]
    pub allow: Vec<String>,
}

/// Limits a run asks for; each must stay within the tenant's ceiling. Sizes take units
/// (`512MiB`), durations too (`30s`, `2m`).
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    #[schema(value_type = Option<String>, example = "512MiB")]
    pub memory: Option<ByteSize>,
    #[schema(value_type = Option<String>, example = "10s")]
    pub cpu_time: Option<Seconds>,
    #[schema(value_type = Option<String>, example = "30s")]
    pub wall_time: Option<Seconds>,
    pub processes: Option<u64>,
    pub open_files: Option<u64>,
    #[schema(value_type = Option<String>)]
    pub file_size: Option<ByteSize>,
    #[schema(value_type = Option<String>)]
    pub disk: Option<ByteSize>,
    pub files: Option<u64>,
    #[schema(value_type = Option<String>)]
    pub stdout: Option<ByteSize>,
    #[schema(value_type = Option<String>)]
    pub stderr: Option<ByteSize>,
    pub cpus: Option<f64>,
}

/// What a request may change in its profile.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyRequest {
    pub backend: Option<BackendName>,
    pub min_isolation: Option<IsolationName>,
    pub network: Option<NetworkRequest>,
    pub limits: Option<LimitsRequest>,
    /// Run even when a required layer is missing (only if the tenant's ceiling allows it);
    /// such runs are recorded in the audit log.
    pub allow_degraded: Option<bool>,
}

/// A policy ready to run, with the sandbox options it implies.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub profile: String,
    pub policy: Policy,
    pub options: SandboxOptions,
}

/// Something a request (or a profile) asks for beyond a ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub key: String,
    pub asked: String,
    pub ceiling: String,
}

/// Resolves `request` on top of one of the caller's profiles, or refuses it.
pub fn resolve(
    caller: &Principal,
    profile: Option<&str>,
    request: &PolicyRequest,
    base_options: &SandboxOptions,
) -> Result<Resolved, ApiError> {
    let tenant = &caller.tenant;
    let profile = profile.unwrap_or(&tenant.default_profile).to_string();
    let Some(base) = tenant.policies.get(&profile) else {
        let allowed: Vec<&str> = tenant.policies.keys().map(String::as_str).collect();
        return Err(refusal(
            caller,
            &Violation {
                key: "profile".into(),
                asked: profile.clone(),
                ceiling: format!("one of {}", allowed.join(", ")),
            },
        ));
    };
    let mut policy = base.clone();
    let allowlist = apply(&mut policy, request, &tenant.ceiling);
    let degraded = request.allow_degraded.unwrap_or(false);
    within_ceiling(
        &policy,
        allowlist.as_deref(),
        degraded,
        &tenant.ceiling,
        tenant.default_policy(),
    )
    .map_err(|v| refusal(caller, &v))?;
    if request
        .min_isolation
        .is_some_and(|m| m.level() < tenant.ceiling.min_isolation)
    {
        return Err(refusal(
            caller,
            &Violation {
                key: "min_isolation".into(),
                asked: level_name(request.min_isolation.map(IsolationName::level)),
                ceiling: format!(
                    "at least {}",
                    level_name(Some(tenant.ceiling.min_isolation))
                ),
            },
        ));
    }
    if request
        .network
        .as_ref()
        .is_some_and(|n| n.mode == NetworkLevel::Allowlist)
    {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_IMPLEMENTED,
            "network_allowlist_unavailable",
            "network mode \"allowlist\" needs the egress gate, which this daemon does not have yet",
            "ask for network mode \"none\", or \"host\" if your ceiling allows it",
        ));
    }
    policy.validate().map_err(|e| {
        ApiError::invalid(
            "invalid_policy",
            e.to_string(),
            "change the value as the message says",
        )
    })?;
    let mut options = base_options.clone();
    options.allow_degraded = degraded;
    options.trusted_profile = profile == "trusted";
    // The ceiling is the operator's opt-in to Tier 0: only a tenant whose minimum isolation is
    // `process` can get here with backend none.
    options.dev = policy.backend == BackendChoice::None;
    Ok(Resolved {
        profile,
        policy,
        options,
    })
}

/// Applies the request to `policy`; returns the asked allowlist (`Some` for mode allowlist).
fn apply(policy: &mut Policy, request: &PolicyRequest, ceiling: &Ceiling) -> Option<Vec<String>> {
    if let Some(backend) = request.backend {
        policy.backend = backend.choice();
    }
    let floor = request
        .min_isolation
        .map(IsolationName::level)
        .unwrap_or(ceiling.min_isolation)
        .max(ceiling.min_isolation);
    policy.min_isolation = Some(policy.min_isolation.map_or(floor, |m| m.max(floor)));
    let mut allowlist = None;
    if let Some(network) = &request.network {
        policy.network.mode = match network.mode {
            NetworkLevel::Host => NetworkMode::Host,
            NetworkLevel::None | NetworkLevel::Allowlist => NetworkMode::None,
        };
        if network.mode == NetworkLevel::Allowlist {
            allowlist = Some(network.allow.clone());
        }
    }
    if let Some(limits) = &request.limits {
        apply_limits(policy, limits);
    }
    allowlist
}

fn apply_limits(policy: &mut Policy, asked: &LimitsRequest) {
    let l = &mut policy.limits;
    macro_rules! set {
        ($($field:ident),*) => { $( if let Some(v) = asked.$field { l.$field = v; } )* };
    }
    set!(
        memory, cpu_time, wall_time, processes, open_files, file_size, disk, files, stdout, stderr,
        cpus
    );
}

fn network_level(policy: &Policy, allowlist: Option<&[String]>) -> NetworkLevel {
    match (policy.network.mode, allowlist) {
        (NetworkMode::Host, _) => NetworkLevel::Host,
        (NetworkMode::None, Some(_)) => NetworkLevel::Allowlist,
        (NetworkMode::None, None) => NetworkLevel::None,
    }
}

/// Checks `policy` against `ceiling`. Limits the ceiling leaves out are capped by `cap_profile`
/// (the tenant's default profile): a request can lower them, never raise them.
pub fn within_ceiling(
    policy: &Policy,
    allowlist: Option<&[String]>,
    allow_degraded: bool,
    ceiling: &Ceiling,
    cap_profile: &Policy,
) -> Result<(), Violation> {
    let network = network_level(policy, allowlist);
    if network > ceiling.network {
        return Err(violation(
            "network.mode",
            level_text(network),
            level_text(ceiling.network),
        ));
    }
    // A tenant allowed the host network may narrow it to any allowlist.
    let host_allowed = ceiling.network == NetworkLevel::Host;
    for entry in allowlist
        .unwrap_or_default()
        .iter()
        .filter(|_| !host_allowed)
    {
        if !ceiling.allowlist.iter().any(|c| pattern_covers(c, entry)) {
            return Err(violation(
                "network.allow",
                entry.clone(),
                format!("within [{}]", ceiling.allowlist.join(", ")),
            ));
        }
    }
    let floor = ceiling.min_isolation;
    let level = policy.backend.level().or(policy.min_isolation);
    if level.is_some_and(|l| l < floor) {
        return Err(violation(
            "backend",
            format!("{:?}", policy.backend).to_lowercase(),
            format!("isolation at least {}", level_name(Some(floor))),
        ));
    }
    if allow_degraded && !ceiling.allow_degraded {
        return Err(violation("allow_degraded", "true", "false"));
    }
    check_limits(policy, ceiling, cap_profile)
}

fn check_limits(policy: &Policy, ceiling: &Ceiling, cap: &Policy) -> Result<(), Violation> {
    let (l, c) = (&policy.limits, &cap.limits);
    let bytes = |key: &str, asked: ByteSize, max: Option<ByteSize>, default: ByteSize| {
        let max = max.unwrap_or(default);
        (asked > max).then(|| violation(&format!("limits.{key}"), asked, max))
    };
    let secs = |key: &str, asked: Seconds, max: Option<Seconds>, default: Seconds| {
        let max = max.unwrap_or(default);
        (asked > max).then(|| violation(&format!("limits.{key}"), asked, max))
    };
    let count = |key: &str, asked: u64, max: Option<u64>, default: u64| {
        let max = max.unwrap_or(default);
        (asked > max).then(|| violation(&format!("limits.{key}"), asked, max))
    };
    let cpus_max = ceiling.cpus.unwrap_or(c.cpus);
    // 0 cpus means "no quota": above any finite ceiling unless the ceiling is also 0.
    let cpus_over = cpus_max != 0.0 && (l.cpus == 0.0 || l.cpus > cpus_max);
    let first = [
        bytes("memory", l.memory, ceiling.memory, c.memory),
        secs("cpu_time", l.cpu_time, ceiling.cpu_time, c.cpu_time),
        secs("wall_time", l.wall_time, ceiling.wall_time, c.wall_time),
        count("processes", l.processes, ceiling.processes, c.processes),
        count("open_files", l.open_files, ceiling.open_files, c.open_files),
        bytes("file_size", l.file_size, ceiling.file_size, c.file_size),
        bytes("disk", l.disk, ceiling.disk, c.disk),
        count("files", l.files, ceiling.files, c.files),
        bytes("stdout", l.stdout, ceiling.stdout, c.stdout),
        bytes("stderr", l.stderr, ceiling.stderr, c.stderr),
        cpus_over.then(|| violation("limits.cpus", l.cpus, cpus_max)),
    ]
    .into_iter()
    .flatten()
    .next();
    first.map_or(Ok(()), Err)
}

fn violation(key: &str, asked: impl ToString, ceiling: impl ToString) -> Violation {
    Violation {
        key: key.into(),
        asked: asked.to_string(),
        ceiling: ceiling.to_string(),
    }
}

/// The 403 for a violation: names the key, the value asked and the ceiling.
pub fn refusal(caller: &Principal, v: &Violation) -> ApiError {
    ApiError::ceiling(
        format!(
            "key {:?} of tenant {:?} asked {} = {}, beyond the tenant's ceiling ({})",
            caller.key_name, caller.tenant.name, v.key, v.asked, v.ceiling
        ),
        format!(
            "ask for {} within the ceiling, or have an operator raise tenants.ceiling for {:?} in the airlockd configuration",
            v.key, caller.tenant.name
        ),
    )
}

fn level_text(level: NetworkLevel) -> &'static str {
    match level {
        NetworkLevel::None => "none",
        NetworkLevel::Allowlist => "allowlist",
        NetworkLevel::Host => "host",
    }
}

fn level_name(level: Option<IsolationLevel>) -> String {
    level.map_or_else(
        || "auto".into(),
        |l| {
            serde_json::to_value(l)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default()
        },
    )
}

/// Whether a ceiling's host pattern covers a requested one. Patterns: `*` (anything),
/// `a.com` (exactly), `*.a.com` (strict subdomains), `**.a.com` (a.com and subdomains); an
/// optional `:port` must match when the ceiling names one. Case and a trailing dot are ignored.
pub fn pattern_covers(ceiling: &str, asked: &str) -> bool {
    let (c_host, c_port) = split_port(ceiling);
    let (a_host, a_port) = split_port(asked);
    if c_port.is_some() && c_port != a_port {
        return false;
    }
    if c_host == "*" {
        return true;
    }
    let subdomain_of = |host: &str, base: &str| host.ends_with(&format!(".{base}"));
    let asked_base = |host: &str| {
        host.strip_prefix("**.")
            .map(|b| (b.to_string(), true))
            .or_else(|| host.strip_prefix("*.").map(|b| (format!("x.{b}"), false)))
            .unwrap_or((host.to_string(), false))
    };
    let (asked_host, asked_apex) = asked_base(&a_host);
    if let Some(base) = c_host.strip_prefix("**.") {
        asked_host == base || subdomain_of(&asked_host, base)
    } else if let Some(base) = c_host.strip_prefix("*.") {
        !asked_apex && subdomain_of(&asked_host, base)
    } else {
        !a_host.contains('*') && a_host == c_host
    }
}

fn split_port(pattern: &str) -> (String, Option<String>) {
    let lower = pattern.trim().trim_end_matches('.').to_ascii_lowercase();
    match lower.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => (
            host.trim_end_matches('.').to_string(),
            Some(port.to_string()),
        ),
        _ => (lower, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_patterns_cover_only_what_they_say() {
        assert!(pattern_covers("*", "anything.example"));
        assert!(pattern_covers("pypi.org", "PyPI.org."));
        assert!(!pattern_covers("pypi.org", "files.pypi.org"));
        assert!(pattern_covers("*.pypi.org", "files.pypi.org"));
        assert!(pattern_covers("*.pypi.org", "*.files.pypi.org"));
        assert!(!pattern_covers("*.pypi.org", "pypi.org"));
        assert!(!pattern_covers("*.pypi.org", "**.pypi.org"));
        assert!(!pattern_covers("*.pypi.org", "evilpypi.org"));
        assert!(pattern_covers("**.pypi.org", "pypi.org"));
        assert!(pattern_covers("**.pypi.org", "**.pypi.org"));
        assert!(pattern_covers("github.com:443", "github.com:443"));
        assert!(!pattern_covers("github.com:443", "github.com:22"));
        assert!(!pattern_covers("github.com", "*"));
    }

    #[test]
    fn limits_beyond_the_profile_are_refused_when_the_ceiling_is_silent() {
        let base = airlock::policy::load_profile("untrusted").unwrap();
        let mut asked = base.clone();
        asked.limits.memory = ByteSize(base.limits.memory.0 * 2);
        let v = within_ceiling(&asked, None, false, &Ceiling::default(), &base).unwrap_err();
        assert_eq!(v.key, "limits.memory");
        let ceiling = Ceiling {
            memory: Some(ByteSize(base.limits.memory.0 * 4)),
            ..Ceiling::default()
        };
        assert!(within_ceiling(&asked, None, false, &ceiling, &base).is_ok());
    }
}

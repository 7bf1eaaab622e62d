//! Turning a request's policy wishes into a resolved [`Policy`], within the tenant's ceiling.
//!
//! A request starts from one of its tenant's profiles and may change the backend, the minimum
//! isolation, the network (mode, allow and deny rules of the egress gate) and the limits. The
//! changes go through the library's [`Overrides`], so they mean and are checked exactly as on
//! the command line. Anything beyond the ceiling (a wider network or allow rule, a larger
//! limit, a weaker backend, accepting degradation when not allowed) is refused with 403 naming
//! the key, the value and the ceiling; the daemon never silently lowers a request. What only
//! an operator may choose (host paths, Unix sockets, the gate's resolver) is not in a request.

mod ceiling;
pub mod rules;

use airlock::policy::units::{ByteSize, Seconds};
use airlock::policy::{BackendChoice, InvalidValue, LimitsSection, Overrides};
use airlock::{IsolationLevel, Policy, SandboxOptions};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use ceiling::within_ceiling;

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

/// The network a run asks for (docs/network.md): each part within the tenant's ceiling.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// `none`, `allowlist` (only what the allow rules name, through the egress gate),
    /// `report` (any public address, every decision recorded) or `host`. Left out: the
    /// profile's mode, or `allowlist` when `allow` has rules.
    #[serde(default)]
    pub mode: Option<NetworkLevel>,
    /// Allow rules added to the profile's: `a.com`, `*.a.com` (subdomains), `**.a.com`
    /// (both), `a.com:8443`, `tcp://a.com:22`, `203.0.113.0/24:443`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Deny rules added to the profile's (deny wins over allow).
    #[serde(default)]
    pub deny: Vec<String>,
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
    let overrides = overrides(request);
    overrides.apply(&mut policy).map_err(invalid_policy)?;
    raise_isolation_floor(&mut policy, request, &tenant.ceiling);
    let degraded = request.allow_degraded.unwrap_or(false);
    within_ceiling(
        &policy,
        &overrides.allow_net,
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

/// The request's changes as the library's [`Overrides`] (what a request cannot name stays
/// at its default: no paths, sockets or resolver).
pub fn overrides(request: &PolicyRequest) -> Overrides {
    let network = request.network.clone().unwrap_or_default();
    Overrides {
        backend: request.backend.map(BackendName::choice),
        network: network.mode.map(NetworkLevel::mode),
        allow_net: network.allow,
        deny_net: network.deny,
        limits: request
            .limits
            .as_ref()
            .map(limits_section)
            .unwrap_or_default(),
        ..Overrides::default()
    }
}

/// The requested limits in the library's form.
pub fn limits_section(asked: &LimitsRequest) -> LimitsSection {
    LimitsSection {
        memory: asked.memory,
        cpu_time: asked.cpu_time,
        wall_time: asked.wall_time,
        processes: asked.processes,
        open_files: asked.open_files,
        file_size: asked.file_size,
        disk: asked.disk,
        files: asked.files,
        stdout: asked.stdout,
        stderr: asked.stderr,
        cpus: asked.cpus,
        ..LimitsSection::default()
    }
}

/// The policy's minimum isolation: at least the ceiling's and the request's.
fn raise_isolation_floor(policy: &mut Policy, request: &PolicyRequest, ceiling: &Ceiling) {
    let floor = request
        .min_isolation
        .map(IsolationName::level)
        .unwrap_or(ceiling.min_isolation)
        .max(ceiling.min_isolation);
    policy.min_isolation = Some(policy.min_isolation.map_or(floor, |m| m.max(floor)));
}

/// A value the library refused (a malformed rule, an impossible limit): 400 naming the key.
pub fn invalid_policy(e: InvalidValue) -> ApiError {
    ApiError::invalid(
        "invalid_policy",
        e.to_string(),
        format!("give {} as {}", e.key, e.allowed),
    )
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

//! Judging a run's plan: the layers it must have (the profile's, grown by what its limits
//! promise, narrowed by backend `none`), held against those the plan puts in force, once (see
//! [`crate::plan::judge`]); why any are missing, with the fix; and the limits this host cannot
//! honour.

use super::builder::Command;
use super::describe;
use super::prepare::{Network, Placement};
use crate::backend::{self, Backend, Selected};
use crate::layer::{self, Layer};
use crate::plan::Verdict;
use crate::policy::{BackendChoice, GitProtection, NetworkMode, Policy};
use crate::spec::Confinement;

/// The layers a run must have. The profile's list grows by what its limits promise: when the
/// sandbox creates the workdir, `limits.disk` and `limits.files` cap every writable area, so a
/// backend that cannot cap them is refused unless the caller accepts the degradation.
/// Backend `none` (which needs its own opt-in) narrows the list to Tier 0. The host network
/// does not: a policy that requires `net_ns` but asks for the host network (`--network host`
/// over `untrusted`) is refused unless the caller accepts running without it, since a flag
/// must not silently remove what the profile requires. (A profile that picks the host network
/// itself drops those layers from what it inherited, see `policy::profile::apply`.) A gated
/// network (`allowlist`, `report`) requires the gate itself; no network at all needs none.
fn required_layers(policy: &Policy, owns_workdir: bool) -> Vec<Layer> {
    let mut require = policy.require.clone();
    match policy.network.mode {
        mode if mode.is_gated() => require.push(Layer::EgressGate),
        NetworkMode::None => require.retain(|l| *l != Layer::EgressGate),
        _ => {}
    }
    require.sort();
    require.dedup();
    // A profile that requires nothing asks for no refusals.
    if owns_workdir && !require.is_empty() {
        require.extend([Layer::DiskQuota, Layer::InodeQuota]);
        require.sort();
        require.dedup();
    }
    // A policy that protects git requires the protection wherever the caller's directories
    // are writable, so a backend that cannot bind it read-only refuses instead of leaving
    // hooks and config writable.
    if writes_callers_paths(policy) && !require.is_empty() {
        require.push(Layer::GitReadOnly);
        require.sort();
        require.dedup();
    }
    if policy.backend == BackendChoice::None {
        let tier0 = backend::NoneBackend.probe().layers;
        require.retain(|l| tier0.contains(l) || *l == Layer::Cgroup);
    }
    require
}

fn writes_callers_paths(policy: &Policy) -> bool {
    let fs = &policy.filesystem;
    fs.protect_git == GitProtection::ReadOnly
        && ((fs.workdir.is_some() && !fs.workdir_read_only) || !fs.read_write.is_empty())
}

/// The required layers held against the plan, judged once (see [`crate::plan::judge`]).
pub(super) struct Judged {
    pub require: Vec<Layer>,
    /// The layers the plan puts in force.
    pub layers: Vec<Layer>,
    pub missing: Vec<Layer>,
    pub reason: Option<String>,
    pub verdict: Verdict,
    pub warnings: Vec<String>,
}

impl Judged {
    /// The missing layers the caller accepted and was told about, which the init, checking
    /// the layers really in force, does not warn about again.
    pub(super) fn accepted(&self) -> Vec<Layer> {
        match self.verdict {
            Verdict::RunsDegraded => self.missing.clone(),
            _ => Vec::new(),
        }
    }
}

pub(super) fn judge(
    command: &Command,
    selected: &Selected,
    confinement: &Confinement,
    placement: &Placement,
    network: &Network,
) -> Judged {
    let (policy, options) = (&command.sandbox.policy, &command.sandbox.options);
    let probe = selected.backend.quick_probe();
    let workdir = &placement.workdir;
    let gated = network.egress.is_some();
    let scratch = placement.scratch.as_ref();
    let layers = describe::planned_layers(confinement, &probe, scratch, workdir, gated);
    let require = required_layers(policy, workdir.owned);
    // The cgroup is left to the init, which knows whether one could be created (rlimits
    // stand in for it otherwise).
    let judged_require: Vec<Layer> = require
        .iter()
        .copied()
        .filter(|l| *l != Layer::Cgroup)
        .collect();
    let (missing, verdict) = crate::plan::judge(&judged_require, &layers, options.allow_degraded);
    let reason =
        (!missing.is_empty()).then(|| missing_reason(policy, &missing, &probe, confinement));
    let mut warnings = match (&reason, verdict) {
        (Some(reason), Verdict::RunsDegraded) => vec![format!(
            "degraded: running without {} ({reason})",
            layer::names(&missing)
        )],
        _ => Vec::new(),
    };
    if policy.network.mode == NetworkMode::Report {
        warnings.push(REPORT_MODE_WARNING.into());
    }
    Judged {
        require,
        layers,
        missing,
        reason,
        verdict,
        warnings,
    }
}

/// What a report-mode run warns about: it is not a boundary.
const REPORT_MODE_WARNING: &str = "network report: learning mode for trusted code, traffic flows to any public address (never to non-public ones); the result's network report lists what the allowlist would have refused and suggests allow rules";

/// Why required layers are missing: the backend's own problems on this host when it cannot
/// give them here at all, else what this run's plan leaves out (a wrapping tool's writable
/// areas are capped only by the init's tmpfs mounts).
fn missing_reason(
    policy: &Policy,
    missing: &[Layer],
    probe: &backend::Probe,
    confinement: &Confinement,
) -> String {
    let network_layer = |l: &Layer| matches!(l, Layer::NetNs | Layer::LandlockNet);
    if policy.has_network() && missing.iter().all(network_layer) {
        return "the network mode is host (--network host), which has no network namespace or \
                Landlock TCP rules; use a profile that does not require them (e.g. --profile \
                trusted, or one of your own)"
            .to_string();
    }
    let host_gap = missing.iter().any(|l| !probe.layers.contains(l));
    if host_gap || !matches!(confinement, Confinement::Wrapped(_)) {
        let why = match probe.problems.is_empty() {
            true => "it does not provide them".to_string(),
            false => probe.problems.join("; "),
        };
        return format!("{why}; fix the host (see `airlock doctor`) or choose another backend");
    }
    let caps = missing
        .iter()
        .any(|l| matches!(l, Layer::DiskQuota | Layer::InodeQuota));
    let hint = if caps {
        ": a wrapping tool's writable areas are capped by the init's tmpfs mounts, which need CAP_SYS_ADMIN (run as root) and an in-memory run directory (no --disk-run-dir)"
    } else {
        ""
    };
    // The tool's own notes on what this run lacks (e.g. gVisor's user namespace under the
    // egress gate).
    let noted: Vec<&str> = match confinement {
        Confinement::Wrapped(wrap) => wrap
            .notes
            .iter()
            .filter(|note| {
                missing
                    .iter()
                    .any(|l| note.contains(&layer::layer_name(*l)))
            })
            .map(String::as_str)
            .collect(),
        _ => Vec::new(),
    };
    let noted = match noted.is_empty() {
        true => String::new(),
        false => format!("; {}", noted.join("; ")),
    };
    format!(
        "this run's plan does not provide them{hint}{noted} (see the backend's row in docs/isolation.md)"
    )
}

/// Limits that this host cannot honour although they are valid: a memory limit above the
/// host's memory is no limit at all (the host runs out first).
pub(super) fn host_limit_warnings(policy: &Policy) -> Vec<String> {
    let Ok(info) = nix::sys::sysinfo::sysinfo() else {
        return Vec::new();
    };
    let host = info.ram_total().saturating_add(info.swap_total());
    let memory = policy.limits.memory;
    match memory.0 > host {
        true => vec![format!(
            "limits.memory {memory} is more than this host has ({:.1}GiB of memory and swap): \
             the host runs out before the limit applies",
            host as f64 / (1u64 << 30) as f64
        )],
        false => Vec::new(),
    }
}

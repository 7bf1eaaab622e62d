//! Checking a resolved policy against a tenant's ceiling: the network mode and the allow rules
//! it asked for, the isolation floor, degradation and every limit.

use airlock::policy::units::{ByteSize, Seconds};
use airlock::Policy;

use super::rules::ceiling_covers;
use super::Violation;
use crate::config::{Ceiling, NetworkLevel};

/// Checks `policy` against `ceiling`; `asked_allow` are the allow rules the request added (the
/// profile's own are the operator's). Limits the ceiling leaves out are capped by
/// `cap_profile` (the tenant's default profile): a request can lower them, never raise them.
pub fn within_ceiling(
    policy: &Policy,
    asked_allow: &[String],
    allow_degraded: bool,
    ceiling: &Ceiling,
    cap_profile: &Policy,
) -> Result<(), Violation> {
    check_network(policy, asked_allow, ceiling)?;
    let floor = ceiling.min_isolation;
    let level = policy.backend.level().or(policy.min_isolation);
    if level.is_some_and(|l| l < floor) {
        return Err(violation(
            "backend",
            format!("{:?}", policy.backend).to_lowercase(),
            format!("isolation at least {}", super::level_name(Some(floor))),
        ));
    }
    if allow_degraded && !ceiling.allow_degraded {
        return Err(violation("allow_degraded", "true", "false"));
    }
    check_limits(policy, ceiling, cap_profile)
}

/// The mode must be within the ceiling's; each asked allow rule within the ceiling's
/// allowlist, unless the tenant may have the host's whole network anyway.
fn check_network(
    policy: &Policy,
    asked_allow: &[String],
    ceiling: &Ceiling,
) -> Result<(), Violation> {
    let network = NetworkLevel::of(policy.network.mode);
    if network > ceiling.network {
        return Err(violation(
            "network.mode",
            network.name(),
            format!("at most {}", ceiling.network.name()),
        ));
    }
    if ceiling.network == NetworkLevel::Host {
        return Ok(());
    }
    match asked_allow
        .iter()
        .find(|rule| !ceiling_covers(&ceiling.allowlist, rule))
    {
        Some(rule) => Err(violation(
            "network.allow",
            rule,
            format!("rules within [{}]", ceiling.allowlist.join(", ")),
        )),
        None => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use airlock::policy::NetworkMode;

    use super::*;

    #[test]
    fn limits_beyond_the_profile_are_refused_when_the_ceiling_is_silent() {
        let base = airlock::policy::load_profile("untrusted").unwrap();
        let mut asked = base.clone();
        asked.limits.memory = ByteSize(base.limits.memory.0 * 2);
        let v = within_ceiling(&asked, &[], false, &Ceiling::default(), &base).unwrap_err();
        assert_eq!(v.key, "limits.memory");
        let ceiling = Ceiling {
            memory: Some(ByteSize(base.limits.memory.0 * 4)),
            ..Ceiling::default()
        };
        assert!(within_ceiling(&asked, &[], false, &ceiling, &base).is_ok());
    }

    #[test]
    fn a_network_beyond_the_ceiling_names_the_mode_and_the_rule() {
        let base = airlock::policy::load_profile("untrusted").unwrap();
        let mut asked = base.clone();
        asked.network.mode = NetworkMode::Report;
        let allowlist_only = Ceiling {
            network: NetworkLevel::Allowlist,
            allowlist: vec!["**.example.com".into()],
            ..Ceiling::default()
        };
        let v = within_ceiling(&asked, &[], false, &allowlist_only, &base).unwrap_err();
        assert_eq!(
            (v.key.as_str(), v.asked.as_str()),
            ("network.mode", "report")
        );
        asked.network.mode = NetworkMode::Allowlist;
        let rules = ["api.example.com".to_string(), "evil.test".to_string()];
        let v = within_ceiling(&asked, &rules, false, &allowlist_only, &base).unwrap_err();
        assert_eq!(
            (v.key.as_str(), v.asked.as_str()),
            ("network.allow", "evil.test")
        );
        assert!(within_ceiling(&asked, &rules[..1], false, &allowlist_only, &base).is_ok());
        let v = within_ceiling(&asked, &rules[..1], false, &Ceiling::default(), &base);
        assert_eq!(v.unwrap_err().ceiling, "at most none");
    }
}

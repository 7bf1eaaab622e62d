//! The built-in profiles and resource tiers, shipped as TOML so `profile show` and the docs
//! print exactly what the code uses.

use super::profile::{apply, apply_limits, parse_profile, LimitsSection};
use super::{Policy, PolicyOrigin};

/// The shipped `untrusted` profile, `untrusted.toml` rendered as JSON, which every cold run
/// reads: toml's parser builds a format-preserving document first and took ~0.1 ms of each
/// run's CPU (`perf record`, issue 19), serde_json reads the same values in microseconds. The
/// TOML stays the source (`profile show` and the docs print it); a test checks that the JSON
/// is its rendering, and prints the rendering to paste when it is not.
const UNTRUSTED_JSON: &str = include_str!("../../profiles/untrusted.json");
const TRUSTED: &str = include_str!("../../profiles/trusted.toml");

/// Names of the built-in profiles.
pub fn builtin_names() -> &'static [&'static str] {
    &["untrusted", "trusted"]
}

/// Names of the resource tiers.
pub fn tier_names() -> &'static [&'static str] {
    &["small", "standard"]
}

/// A built-in profile by name.
pub fn builtin(name: &str) -> Option<Policy> {
    let untrusted = untrusted();
    let policy = match name {
        "untrusted" => untrusted,
        "trusted" => apply(untrusted, parse_profile(TRUSTED, "trusted").ok()?),
        _ => return None,
    };
    Some(policy.with_origin(PolicyOrigin::Builtin(name.to_string())))
}

fn untrusted() -> Policy {
    // The shipped file is complete; a unit test proves it parses into a full policy, the same
    // from its JSON rendering as from the TOML.
    serde_json::from_str(UNTRUSTED_JSON)
        .unwrap_or_else(|e| panic!("built-in profile untrusted is invalid: {e}"))
}

/// Applies a named resource tier's limits to a policy.
pub fn tier(policy: &mut Policy, name: &str) -> bool {
    let (memory, cpu, wall, output) = match name {
        "small" => ("256MiB", "10s", "30s", "25MiB"),
        "standard" => ("512MiB", "60s", "180s", "100MiB"),
        _ => return false,
    };
    let limits = LimitsSection {
        memory: memory.parse().ok(),
        cpu_time: cpu.parse().ok(),
        wall_time: wall.parse().ok(),
        stdout: output.parse().ok(),
        stderr: output.parse().ok(),
        ..LimitsSection::default()
    };
    apply_limits(&mut policy.limits, limits);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{BackendChoice, NetworkMode};

    #[test]
    fn the_shipped_json_is_the_toml_profile_rendered() {
        let toml_text = include_str!("../../profiles/untrusted.toml");
        let value: toml::Value = toml::from_str(toml_text).expect("the TOML parses");
        let rendered = serde_json::to_value(&value).expect("TOML renders as JSON");
        let shipped: serde_json::Value = serde_json::from_str(UNTRUSTED_JSON).expect("JSON");
        assert_eq!(
            shipped,
            rendered,
            "profiles/untrusted.json is not profiles/untrusted.toml: write it again as\n{}",
            serde_json::to_string_pretty(&rendered).unwrap_or_default()
        );
        let from_toml: Policy = toml::from_str(toml_text).expect("the TOML is a policy");
        assert_eq!(untrusted(), from_toml);
    }

    #[test]
    fn builtins_parse_and_validate() {
        for name in builtin_names() {
            let policy = builtin(name).expect("builtin exists");
            policy.validate().expect("builtin is valid");
        }
    }

    #[test]
    fn untrusted_is_strict_and_trusted_is_tier0() {
        let untrusted = builtin("untrusted").unwrap();
        assert_eq!(untrusted.network.mode, NetworkMode::None);
        assert_eq!(untrusted.backend, BackendChoice::Auto);
        let trusted = builtin("trusted").unwrap();
        assert_eq!(trusted.backend, BackendChoice::None);
        assert_eq!(trusted.limits, untrusted.limits);
    }

    #[test]
    fn resolved_policy_round_trips_through_toml() {
        let policy = builtin("untrusted").unwrap();
        let back: Policy = toml::from_str(&policy.to_toml()).expect("rendered policy parses");
        assert_eq!(back, policy);
    }

    #[test]
    fn tiers_set_their_limits() {
        let mut policy = builtin("untrusted").unwrap();
        assert!(tier(&mut policy, "small"));
        assert_eq!(policy.limits.memory.0, 256 << 20);
        assert_eq!(policy.limits.wall_time.0.as_secs(), 30);
        assert!(!tier(&mut policy, "huge"));
    }
}

//! `[warm]`: prepared sandboxes and interpreter zygotes (docs/warm.md, "In the daemon").
//!
//! Off unless a profile is listed: each prepared sandbox holds a cgroup, two processes and
//! a root of its own, and a zygote's template holds an interpreter, whether or not anything
//! runs; an operator opts in per profile, knowing which profiles the tenants use.
//!
//! ```toml
//! [warm]
//! budget = 16            # prepared sandboxes on this node, ready or being prepared
//! idle_expiry = "10m"    # a ready sandbox older than this is replaced
//!
//! [warm.profiles.untrusted]
//! ready = 2                                   # prepared sandboxes kept ready
//! zygotes = { python = { preload = ["json", "re"] } }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use airlock::interp::{InterpreterRegistry, ZygoteConfig};
use airlock::policy::units::Seconds;
use serde::Deserialize;

use super::check::Problems;
use super::Config;

/// Prepared sandboxes and zygotes, per profile.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct WarmSection {
    /// Prepared sandboxes (ready or being prepared) across every profile's pools: the
    /// library's `WarmBudget`, one per node.
    pub budget: usize,
    /// A prepared sandbox ready this long is replaced (its root holds a snapshot of the
    /// host's `/etc` files).
    pub idle_expiry: Seconds,
    /// Profiles with prepared sandboxes or zygotes, by profile name.
    pub profiles: BTreeMap<String, WarmProfile>,
}

impl Default for WarmSection {
    fn default() -> Self {
        WarmSection {
            budget: 16,
            idle_expiry: Seconds(Duration::from_secs(600)),
            profiles: BTreeMap::new(),
        }
    }
}

/// One profile's warm start.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct WarmProfile {
    /// Prepared sandboxes kept ready for this profile (per distinct resolved policy: tenants
    /// whose ceilings resolve the profile differently get pools of their own).
    pub ready: usize,
    /// Sessions of this profile that keep one sandbox prepared for their next run, with the
    /// session's workspace as its workdir (the cold session run's plan); each holds one unit
    /// of `warm.budget` while it is ready. 0 runs every session run cold.
    pub sessions: usize,
    /// Interpreters (registry names) whose code runs fork from a zygote, with the modules
    /// it imports first: the interpreter registry's `zygote = { preload = [...] }` shape. A
    /// registry entry with its own `zygote` gets one too, in every profile listed here.
    pub zygotes: BTreeMap<String, ZygoteConfig>,
}

impl Default for WarmProfile {
    fn default() -> Self {
        WarmProfile {
            ready: 0,
            sessions: DEFAULT_SESSIONS,
            zygotes: BTreeMap::new(),
        }
    }
}

/// Sessions per warm profile with a sandbox prepared for their next run, unless configured.
const DEFAULT_SESSIONS: usize = 8;

/// Largest `ready` (and `sessions`) per profile: each is a cgroup, two processes and a root.
const MAX_READY: usize = 256;

impl Config {
    pub(super) fn check_warm(&self, problems: &mut Problems) {
        let warm = &self.warm;
        if !warm.profiles.is_empty() && warm.budget == 0 {
            problems.add(
                "warm.budget",
                "0 allows no prepared sandbox; give at least the sum of the profiles' `ready`, or remove [warm.profiles]",
            );
        }
        if warm.idle_expiry.0 < Duration::from_secs(1) {
            problems.add(
                "warm.idle_expiry",
                "must be at least 1s; write e.g. \"10m\"",
            );
        }
        let registry = self.registry_for_check();
        for (name, profile) in &warm.profiles {
            self.check_warm_profile(name, profile, registry.as_ref(), problems);
        }
    }

    fn check_warm_profile(
        &self,
        name: &str,
        profile: &WarmProfile,
        registry: Option<&InterpreterRegistry>,
        problems: &mut Problems,
    ) {
        let key = format!("warm.profiles.{name}");
        if airlock::policy::load_profile(name).is_err() {
            problems.add(
                &key,
                format!("{name:?} is not a profile; name one the tenants use (e.g. untrusted)"),
            );
        }
        if profile.ready > MAX_READY {
            problems.add(
                format!("{key}.ready"),
                format!("{} is more than {MAX_READY}; lower it", profile.ready),
            );
        }
        if profile.sessions > MAX_READY {
            problems.add(
                format!("{key}.sessions"),
                format!("{} is more than {MAX_READY}; lower it", profile.sessions),
            );
        }
        if profile.ready > self.warm.budget {
            problems.add(
                format!("{key}.ready"),
                format!(
                    "{} is more than warm.budget ({}); raise the budget or lower `ready`",
                    profile.ready, self.warm.budget
                ),
            );
        }
        for (interpreter, zygote) in &profile.zygotes {
            let key = format!("{key}.zygotes.{interpreter}");
            check_zygote(&key, interpreter, zygote, registry, problems);
        }
    }

    /// The interpreter registry the daemon will load (`None` when it cannot be read: that is
    /// reported where the daemon loads it).
    fn registry_for_check(&self) -> Option<InterpreterRegistry> {
        match &self.sandbox.interpreters {
            Some(path) => InterpreterRegistry::load(path).ok(),
            None => Some(InterpreterRegistry::builtin()),
        }
    }
}

fn check_zygote(
    key: &str,
    interpreter: &str,
    zygote: &ZygoteConfig,
    registry: Option<&InterpreterRegistry>,
    problems: &mut Problems,
) {
    if let Some(registry) = registry {
        match registry.get(interpreter) {
            None => problems.add(
                key,
                format!(
                    "{interpreter:?} is not in the interpreter registry; use one of {}",
                    registry.names().join(", ")
                ),
            ),
            Some((_, entry)) if !is_python(&entry.argv[0]) => problems.add(
                key,
                format!(
                    "a zygote embeds Python and {interpreter:?} runs {}; remove it",
                    entry.argv[0]
                ),
            ),
            Some(_) => {}
        }
    }
    if let Some(bad) = zygote
        .preload
        .iter()
        .find(|m| !airlock::warm::is_module_name(m))
    {
        problems.add(
            format!("{key}.preload"),
            format!("{bad:?} is not a module name; write names such as \"json\" or \"os.path\""),
        );
    }
}

fn is_python(program: &str) -> bool {
    program
        .rsplit('/')
        .next()
        .is_some_and(|name| name.starts_with("python"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{Config, ConfigError};

    /// The `warm.*` problems of a configuration.
    fn warm_problems(text: &str) -> Vec<(String, String)> {
        let config = Config::parse(text, Path::new("airlockd.toml")).unwrap();
        match config.check() {
            Ok(()) => Vec::new(),
            Err(ConfigError::Invalid(problems)) => problems
                .into_iter()
                .filter(|p| p.key.starts_with("warm"))
                .map(|p| (p.key, p.message))
                .collect(),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn warm_start_is_off_by_default_and_a_listed_profile_checks_clean() {
        let config = Config::parse("", Path::new("airlockd.toml")).unwrap();
        assert!(config.warm.profiles.is_empty());
        let text = "[warm]\nbudget = 4\nidle_expiry = \"5m\"\n[warm.profiles.untrusted]\nready = 2\nzygotes = { python = { preload = [\"json\", \"os.path\"] } }\n";
        assert_eq!(warm_problems(text), Vec::new());
    }

    #[test]
    fn each_bad_warm_value_names_its_key_and_the_fix() {
        let cases = [
            (
                "[warm.profiles.nosuch]\nready = 1\n",
                "warm.profiles.nosuch",
                "not a profile",
            ),
            (
                "[warm]\nbudget = 1\n[warm.profiles.untrusted]\nready = 2\n",
                "warm.profiles.untrusted.ready",
                "raise the budget",
            ),
            (
                "[warm]\nbudget = 0\n[warm.profiles.untrusted]\n",
                "warm.budget",
                "at least the sum",
            ),
            (
                "[warm]\nidle_expiry = \"0s\"\n",
                "warm.idle_expiry",
                "at least 1s",
            ),
            (
                "[warm.profiles.untrusted]\nzygotes = { cobol = {} }\n",
                "warm.profiles.untrusted.zygotes.cobol",
                "not in the interpreter registry",
            ),
            (
                "[warm.profiles.untrusted]\nzygotes = { bash = {} }\n",
                "warm.profiles.untrusted.zygotes.bash",
                "embeds Python",
            ),
            (
                "[warm.profiles.untrusted]\nzygotes = { python = { preload = [\"os; import x\"] } }\n",
                "warm.profiles.untrusted.zygotes.python.preload",
                "not a module name",
            ),
        ];
        for (text, key, fix) in cases {
            let problems = warm_problems(text);
            assert!(
                problems.iter().any(|(k, m)| k == key && m.contains(fix)),
                "{text}: {problems:?}"
            );
        }
    }

    #[test]
    fn unknown_warm_keys_are_refused_by_name() {
        let error = Config::parse(
            "[warm.profiles.untrusted]\nreddy = 2\n",
            Path::new("airlockd.toml"),
        )
        .unwrap_err();
        assert!(error.to_string().contains("reddy"), "{error}");
    }
}

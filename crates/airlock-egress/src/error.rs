//! The crate's typed errors: each names what is wrong and how to fix it.

use std::io;

/// A network rule that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network rule `{rule}`: {problem}; {fix}")]
pub struct RuleError {
    /// The rule as written.
    pub rule: String,
    /// What is wrong with it.
    pub problem: String,
    /// How to write it instead.
    pub fix: String,
}

impl RuleError {
    pub(crate) fn new(rule: &str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        RuleError {
            rule: rule.to_string(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

/// Everything that can go wrong in the egress gate.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// An `allow` or `deny` rule is malformed.
    #[error(transparent)]
    Rule(#[from] RuleError),
    /// A setting of `[network]` is malformed.
    #[error("network setting `{setting}` = `{value}`: {problem}; {fix}")]
    Setting {
        /// The setting's name (`resolver`, `limits.bytes_out`, ...).
        setting: String,
        /// Its value as written.
        value: String,
        /// What is wrong with it.
        problem: String,
        /// How to write it instead.
        fix: String,
    },
    /// A `unix_sockets` entry names nothing usable.
    #[error("network unix socket `{pattern}`: {problem}; {fix}")]
    UnixSocket {
        /// The path or glob as written.
        pattern: String,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: String,
    },
    /// Setting up the sandbox's network namespace failed.
    #[error("egress setup: {step}: {source}")]
    Setup {
        /// What was being done.
        step: String,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
    /// The descriptors sent between the sandbox and the gate were not what was expected.
    #[error("egress descriptor transfer: {0}")]
    Transfer(String),
}

impl EgressError {
    #[cfg(target_os = "linux")]
    pub(crate) fn setup(step: impl Into<String>) -> impl FnOnce(io::Error) -> EgressError {
        let step = step.into();
        move |source| EgressError::Setup { step, source }
    }

    pub(crate) fn setting(
        setting: &str,
        value: &str,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        EgressError::Setting {
            setting: setting.into(),
            value: value.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

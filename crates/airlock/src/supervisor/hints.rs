//! Hints for a run that failed: what probably went wrong when the cause is the sandbox rather
//! than the program, and the fix. Computed only after a failure, from facts of the plan, so a
//! successful run pays nothing.

use std::path::{Path, PathBuf};

use crate::plan::Plan;
use crate::policy::NetworkMode;
use crate::result::{RunResult, RunStatus};

/// What a run's hints are judged from, kept from its plan.
#[derive(Debug, Clone)]
pub(super) struct HintFacts {
    network_off: bool,
    argv: Vec<String>,
    /// Host paths the program sees; `None` when it sees the whole host (backend `none`).
    visible: Option<Vec<PathBuf>>,
}

/// What programs print when they cannot resolve a name or reach a host.
const NETWORK_ERRORS: &[&str] = &[
    "Temporary failure in name resolution",
    "Name or service not known",
    "Could not resolve host",
    "getaddrinfo",
    "EAI_AGAIN",
    "ENOTFOUND",
    "Network is unreachable",
    "ENETUNREACH",
    "Failed to establish a new connection",
    "Address family not supported",
];

impl HintFacts {
    pub fn of(plan: &Plan) -> HintFacts {
        let tier0 = plan.backend == "none";
        HintFacts {
            network_off: plan.network == NetworkMode::None,
            argv: plan.argv.clone(),
            visible: (!tier0).then(|| {
                plan.mounts
                    .iter()
                    .filter_map(|m| m.source.clone())
                    .collect()
            }),
        }
    }

    /// The same facts for a run of `argv` (a prepared sandbox's plan was made before its
    /// command was known).
    pub fn for_argv(self, argv: &[String]) -> HintFacts {
        HintFacts {
            argv: argv.to_vec(),
            ..self
        }
    }

    /// Adds the hints that fit a failed `result`.
    pub fn apply(&self, result: &mut RunResult) {
        if result.success() || result.status == RunStatus::Cancelled {
            return;
        }
        if self.network_off && (result.status == RunStatus::Timeout || mentions_network(result)) {
            result.hints.push(
                "the network is off for this run (network mode none): name lookups and \
                 connections fail, and a program that retries them (a package install, a \
                 download) waits until the wall-clock limit; allow what it needs with \
                 --allow-net HOST (the egress gate), give it the host's network with --network \
                 host, or provide what it fetches"
                    .into(),
            );
        }
        for path in self.invisible_paths() {
            result.hints.push(format!(
                "{} exists on the host but is not visible in the sandbox: expose it with --ro \
                 {}, or work in its directory with --workdir",
                path.display(),
                path.display()
            ));
        }
    }

    /// Arguments naming a host file the program cannot see (e.g. `python3 script.py` from the
    /// script's directory, which is not the sandbox's working directory).
    fn invisible_paths(&self) -> Vec<PathBuf> {
        let Some(visible) = &self.visible else {
            return Vec::new();
        };
        self.argv
            .iter()
            .skip(1)
            .filter(|arg| !arg.starts_with('-'))
            .filter_map(|arg| std::path::absolute(arg).ok())
            .filter(|path| path.is_file() && !is_under_any(path, visible))
            .take(3)
            .collect()
    }
}

fn is_under_any(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|root| path.starts_with(root))
}

fn mentions_network(result: &RunResult) -> bool {
    [&result.stderr, &result.stdout]
        .into_iter()
        .flatten()
        .any(|text| NETWORK_ERRORS.iter().any(|e| text.contains(e)))
}

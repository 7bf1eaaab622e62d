//! The egress gate's host side for one run (network `allowlist` or `report`): the plan made
//! from the policy before anything starts, the channel the sandbox's setup hands the gate its
//! sockets on, the gate serving the run from the supervisor's threads, and its report for the
//! result. The gate itself is the `airlock-egress` crate; this room ties it to a run. The
//! sandbox's side (configuring the namespace, sending the sockets) is the init's
//! (`init/egress.rs`).

use std::io::ErrorKind as IoKind;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use airlock_egress::{
    EgressError, EgressPolicy, EventSink, Gate, NetworkReport, RunningGate, SandboxPlan,
    SandboxSockets,
};

use crate::error::Error;
use crate::plan::PlannedEgress;
use crate::policy::Policy;

/// The gate's part of a prepared run.
#[derive(Debug, Clone)]
pub(crate) struct EgressPlan {
    /// What the gate enforces.
    pub policy: EgressPolicy,
    /// What the sandbox's network namespace holds (sent to the init in its spec).
    pub sandbox: SandboxPlan,
}

/// The gate's plan for a gated policy; `None` for `none` and `host`. The policy was validated
/// already, so an error here is one `Policy::validate` would have named.
pub(crate) fn plan(policy: &Policy) -> Result<Option<EgressPlan>, Error> {
    let Some(checked) = policy.network.egress_policy() else {
        return Ok(None);
    };
    let policy = checked?;
    let sandbox = policy.sandbox_plan().map_err(|e| invalid_network(&e))?;
    Ok(Some(EgressPlan { policy, sandbox }))
}

fn invalid_network(error: &EgressError) -> Error {
    Error::Invalid(crate::error::InvalidValue {
        key: "network",
        value: String::new(),
        allowed: error.to_string(),
    })
}

/// The host Unix sockets the run may reach, expanded now (globs included): a run never starts
/// with fewer sockets than asked, and the error names the entry and the fix.
pub(crate) fn unix_sockets(policy: &Policy) -> Result<Vec<PathBuf>, Error> {
    airlock_egress::expand_unix_sockets(&policy.network.unix_sockets).map_err(|e| match e {
        EgressError::UnixSocket {
            pattern,
            problem,
            fix,
        } => Error::BadPath {
            what: "network.unix_sockets entry",
            path: PathBuf::from(pattern),
            reason: format!("{problem}; {fix}"),
        },
        other => invalid_network(&other),
    })
}

/// The program's environment for a gated run: the proxy variables pointing proxy-aware
/// programs (and pip, npm, yarn, git, Node's fetch) at the in-sandbox endpoint.
pub(crate) fn program_env(plan: Option<&EgressPlan>) -> Vec<(String, String)> {
    plan.map(|p| p.sandbox.proxy_env()).unwrap_or_default()
}

/// The gate as the caller's plan shows it.
pub(crate) fn planned(plan: &EgressPlan) -> PlannedEgress {
    let sandbox = &plan.sandbox;
    PlannedEgress {
        mode: plan.policy.mode,
        allow: texts(&plan.policy.rules.allow),
        deny: texts(&plan.policy.rules.deny),
        resolver: plan.policy.resolver,
        limits: plan.policy.limits,
        capture_ports: sandbox.capture_ports.clone(),
        local_ranges: sandbox.local_ranges.iter().map(|r| r.to_string()).collect(),
        dns: "127.0.0.1:53".into(),
        proxy: format!("127.0.0.1:{}", sandbox.proxy_port),
    }
}

fn texts(rules: &[airlock_egress::rules::Rule]) -> Vec<String> {
    rules.iter().map(|rule| rule.text.clone()).collect()
}

/// The two ends of the gate's channel: the supervisor keeps one, the init gets the other at
/// `spec::GATE_FD`. Close-on-exec both: only the init's placement makes its end inheritable.
pub(crate) struct Channel {
    pub gate_end: UnixStream,
    pub sandbox_end: OwnedFd,
}

impl Channel {
    pub fn new() -> Result<Channel, Error> {
        let (gate_end, sandbox_end) = UnixStream::pair()
            .map_err(|e| Error::io("cannot create the egress gate's channel", e))?;
        Ok(Channel {
            gate_end,
            sandbox_end: sandbox_end.into(),
        })
    }
}

/// A gate serving one run.
pub(crate) struct RunGate {
    gate: RunningGate,
}

impl std::fmt::Debug for RunGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunGate")
    }
}

/// Waits for the sandbox's sockets and starts the gate on them. `Ok(None)` when the sandbox's
/// setup ended before handing them over (the init reports why, and the program never runs);
/// an error when they arrived but the gate cannot serve them (the caller then stops the run:
/// a program must never run with listeners nobody serves).
pub(crate) fn start(
    plan: EgressPlan,
    channel: &UnixStream,
    on_event: Option<EventSink>,
) -> Result<Option<RunGate>, Error> {
    let sockets = match SandboxSockets::receive(channel) {
        Ok(sockets) => sockets,
        Err(EgressError::Setup { source, .. }) if source.kind() == IoKind::UnexpectedEof => {
            return Ok(None)
        }
        Err(e) => return Err(gate_failed(e)),
    };
    let gate = Gate::start(plan.policy, sockets, on_event).map_err(gate_failed)?;
    Ok(Some(RunGate { gate }))
}

fn gate_failed(error: EgressError) -> Error {
    Error::io(
        "cannot start the egress gate",
        std::io::Error::other(error.to_string()),
    )
}

impl RunGate {
    /// Ends the gate once the run is over: every connection still open is closed, every gate
    /// thread joined, and the report returned.
    pub fn finish(self) -> NetworkReport {
        self.gate.finish()
    }
}

//! The sandbox's side of the egress gate (network `allowlist` or `report`): in the network
//! namespace the program will live in, while this process still holds CAP_NET_ADMIN there,
//! bring up loopback, make the placeholder and allowed ranges local and bind the gate's
//! sockets (`airlock_egress::sandbox_side::configure`), then send them to the supervisor on
//! the gate's channel and close it. The program never holds the channel: it is closed here,
//! before any exec.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use airlock_egress::SandboxPlan;
use nix::sched::{unshare, CloneFlags};

use super::{Setup, Step};
use crate::error::{SetupError, SetupErrorKind as Kind};

/// Configures the current network namespace for `plan` and hands the sockets to the gate.
pub(super) fn hand_over(plan: &SandboxPlan, channel: &OwnedFd) -> Setup<()> {
    let failed = |message: String| {
        SetupError::at(Step::Network, message)
            .of_kind(Kind::NetworkFailed)
            .with_fix("check `airlock doctor`; the egress gate needs a network namespace of the sandbox's own")
    };
    let sockets = airlock_egress::sandbox_side::configure(plan).map_err(|e| {
        failed(format!(
            "cannot prepare the sandbox's network for the egress gate: {e}"
        ))
    })?;
    let stream = channel
        .try_clone()
        .map(UnixStream::from)
        .map_err(|e| failed(format!("cannot use the egress gate's channel: {e}")))?;
    sockets
        .send(&stream)
        .map_err(|e| failed(format!("cannot hand the egress gate its sockets: {e}")))
}

/// For a wrapping tool: a new network namespace the tool will inherit, belonging to a new user
/// namespace of this process's own ids when `own_user_namespace` (a tool run without root),
/// else to the current one (a tool that keeps root, which needs CAP_SYS_ADMIN here).
pub(super) fn enter_namespace(own_user_namespace: bool) -> Setup<()> {
    if own_user_namespace {
        return super::native::enter_user_namespace(CloneFlags::CLONE_NEWNET);
    }
    unshare(CloneFlags::CLONE_NEWNET).map_err(|e| {
        SetupError::at(
            Step::Network,
            format!("cannot create the network namespace for the egress gate: {e}"),
        )
        .of_kind(Kind::NetworkFailed)
    })
}

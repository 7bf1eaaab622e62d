//! The egress gate of a prepared sandbox (see `supervisor::standby`), started while the
//! sandbox is prepared.

use std::os::fd::OwnedFd;
use std::thread::JoinHandle;

use super::handle::{self, NetworkSender};
use crate::error::Error;
use crate::net::{self, RunGate};

/// The egress gate of a prepared sandbox with network `allowlist` or `report`: it starts as
/// soon as the sandbox's setup hands it the sockets (as for a cold run, before the program
/// can exist), so a warm run is gated exactly as a cold one. Each sandbox has its own gate,
/// and it serves that sandbox's one run.
#[derive(Debug)]
pub(super) struct StandbyGate {
    /// Waits for the sandbox's sockets and starts the gate on them.
    starting: JoinHandle<Result<Option<RunGate>, Error>>,
    /// Where the gate's decisions go once a run has a handle to stream them to.
    events: NetworkSender,
}

impl StandbyGate {
    pub(super) fn launch(egress: net::EgressPlan) -> Result<(StandbyGate, OwnedFd), Error> {
        let channel = net::Channel::new()?;
        let (sink, events) = handle::network_slot();
        let gate_end = channel.gate_end;
        let starting = std::thread::Builder::new()
            .name("airlock-warm-gate".into())
            .spawn(move || net::start(egress, &gate_end, Some(sink)))
            .map_err(|e| Error::io("cannot start the egress gate's thread", e))?;
        Ok((StandbyGate { starting, events }, channel.sandbox_end))
    }

    /// The running gate. The sandbox is ready, so its setup has handed the sockets over and
    /// this does not wait; `Ok(None)` when the setup ended before it did.
    pub(super) fn running(self) -> Result<Option<(RunGate, NetworkSender)>, Error> {
        let gate = self.starting.join().map_err(|_| {
            Error::io(
                "the egress gate's thread panicked",
                std::io::Error::other("panic"),
            )
        })??;
        Ok(gate.map(|gate| (gate, self.events)))
    }
}

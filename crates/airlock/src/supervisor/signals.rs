//! Cancelling a run when the supervisor itself is asked to stop: SIGINT (Ctrl-C), SIGTERM (a
//! service manager, `kill`) and SIGHUP (a closed terminal). Without this the supervisor dies
//! of the signal with the run's result unwritten. The signals are blocked in the calling thread
//! for the run's length and read from a descriptor by the serve loop, which asks the init to
//! stop the run; the forked init inherits the blocked mask, so a signal sent to the whole
//! process group (Ctrl-C) cannot kill it before it has cleaned up either.

use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::error::Error;

/// The signals that cancel a run.
pub const CANCEL_SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// The cancel signals, blocked and readable, until dropped.
pub(super) struct CancelSignals {
    fd: SignalFd,
    previous: SigSet,
}

impl CancelSignals {
    /// Blocks the cancel signals in the calling thread and opens a descriptor that reads them.
    pub fn block() -> Result<CancelSignals, Error> {
        let set: SigSet = CANCEL_SIGNALS.into_iter().collect();
        let previous = set
            .thread_swap_mask(SigmaskHow::SIG_BLOCK)
            .map_err(|e| Error::io("cannot block the cancel signals", e.into()))?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(|e| {
                let _ = previous.thread_set_mask();
                Error::io("cannot read the cancel signals", e.into())
            })?;
        Ok(CancelSignals { fd, previous })
    }

    /// The signals received since the last call, by number.
    pub fn received(&self) -> Vec<i32> {
        let mut received = Vec::new();
        while let Ok(Some(info)) = self.fd.read_signal() {
            received.push(info.ssi_signo as i32);
        }
        received
    }
}

impl AsFd for CancelSignals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for CancelSignals {
    /// Takes what arrived after the run ended (it was about that run), then restores the mask.
    fn drop(&mut self) {
        self.received();
        let _ = self.previous.thread_set_mask();
    }
}

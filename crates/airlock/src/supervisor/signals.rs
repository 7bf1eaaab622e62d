//! Signals the supervisor of a blocking run reacts to instead of dying of them: SIGINT
//! (Ctrl-C), SIGTERM (a service manager, `kill`) and SIGHUP (a closed terminal) cancel the run
//! with its result written; SIGWINCH (the caller's terminal resized) resizes the program's
//! terminal. They are blocked in the calling thread for the run's length and read from a
//! descriptor by the serve loop; the forked init inherits the blocked mask, so a signal sent
//! to the whole process group (Ctrl-C) cannot kill it before it has cleaned up either.

use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::error::Error;

/// The signals that cancel a run.
pub const CANCEL_SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Signals blocked and readable, until dropped.
pub(super) struct BlockedSignals {
    fd: SignalFd,
    previous: SigSet,
}

impl BlockedSignals {
    /// Blocks `signals` in the calling thread and opens a descriptor that reads them.
    pub fn block(signals: &[Signal]) -> Result<BlockedSignals, Error> {
        let set: SigSet = signals.iter().copied().collect();
        let previous = set
            .thread_swap_mask(SigmaskHow::SIG_BLOCK)
            .map_err(|e| Error::io("cannot block signals", e.into()))?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(|e| {
                let _ = previous.thread_set_mask();
                Error::io("cannot read signals", e.into())
            })?;
        Ok(BlockedSignals { fd, previous })
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

/// Whether signal `number` cancels a run.
pub(super) fn cancels(number: i32) -> bool {
    CANCEL_SIGNALS.iter().any(|s| *s as i32 == number)
}

impl AsFd for BlockedSignals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for BlockedSignals {
    /// Takes what arrived after the run ended (it was about that run), then restores the mask.
    fn drop(&mut self) {
        self.received();
        let _ = self.previous.thread_set_mask();
    }
}

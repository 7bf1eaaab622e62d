//! A terminal of the program's own (`Command::tty`): a pseudo-terminal whose slave side is the
//! program's stdio and controlling terminal, in its own session, while the supervisor relays
//! the caller's terminal to the master side. The program never holds the caller's terminal,
//! so it cannot push input into it (TIOCSTI) or change its settings; the caller's terminal is
//! in raw mode while the run lasts, so keys (Ctrl-C included) reach the program as typed.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::{self, OptionalActions, Termios};

use crate::error::Error;

/// Both sides of a new pseudo-terminal, close-on-exec.
pub(super) struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Opens a pseudo-terminal the size of the caller's terminal (when stdin is one).
pub(super) fn open_pty() -> Result<Pty, Error> {
    let failed =
        |e: rustix::io::Errno| Error::io("cannot open a terminal for the program", e.into());
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags).map_err(failed)?;
    rustix::pty::grantpt(&master).map_err(failed)?;
    rustix::pty::unlockpt(&master).map_err(failed)?;
    let name = rustix::pty::ptsname(&master, Vec::new()).map_err(failed)?;
    let slave_flags = OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC;
    let slave = rustix::fs::open(name.as_c_str(), slave_flags, Mode::empty()).map_err(failed)?;
    copy_size(&master);
    Ok(Pty { master, slave })
}

/// Gives the program's terminal the caller's window size (nothing when stdin is no terminal).
pub(super) fn copy_size(master: impl AsFd) {
    if let Ok(size) = termios::tcgetwinsize(std::io::stdin()) {
        let _ = termios::tcsetwinsize(master, size);
    }
}

/// The caller's terminal in raw mode until dropped.
pub(super) struct RawTerminal {
    saved: Termios,
}

impl RawTerminal {
    /// Puts the caller's terminal (stdin) in raw mode; `None` when stdin is no terminal.
    pub fn enter() -> Option<RawTerminal> {
        let stdin = std::io::stdin();
        if !termios::isatty(&stdin) {
            return None;
        }
        let saved = termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Drain, &raw).ok()?;
        Some(RawTerminal { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Drain, &self.saved);
    }
}

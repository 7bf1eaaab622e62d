//! What the serve loop writes to the program: bytes into its stdin pipe as the pipe takes them,
//! or, on a terminal of its own, those bytes and then what the caller types, relayed to the
//! terminal's master side.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::PollFlags;

/// How the program's input is fed, as launched.
pub(super) enum StdinSource {
    /// The write end of a stdin pipe and the bytes to feed it, then EOF.
    Pipe(OwnedFd, Vec<u8>),
    /// The program's terminal (a duplicate of its master side): `bytes` first, then what the
    /// caller types when `relay` (the caller's stdin is copied to it).
    Terminal {
        master: OwnedFd,
        bytes: Vec<u8>,
        relay: bool,
    },
}

impl StdinSource {
    /// The same input without the caller's terminal relayed (a spawned run's: its caller
    /// keeps its own terminal).
    pub fn without_relay(self) -> StdinSource {
        match self {
            StdinSource::Terminal { master, bytes, .. } => StdinSource::Terminal {
                master,
                bytes,
                relay: false,
            },
            pipe => pipe,
        }
    }
}

/// The most written to a terminal at once: its master side stays blocking (it is also read),
/// so a write must fit what POLLOUT promised room for.
const TERMINAL_WRITE: usize = 256;

/// The end-of-file character of a terminal in canonical mode (Ctrl-D): what the program reads
/// as the end of its input when the caller's stdin ends (a pipe into `--tty`).
const END_OF_INPUT: u8 = 0x04;

/// Input being written to the program.
pub(super) struct Feeding {
    target: std::fs::File,
    pending: Vec<u8>,
    /// The caller's stdin, while it is relayed.
    source: Option<std::fs::File>,
    /// Writing to a pipe: done (and the pipe closed) once `pending` is empty.
    pipe: bool,
}

/// Which of a feed's descriptors to poll, and for what.
pub(super) struct Want<'a> {
    pub fd: BorrowedFd<'a>,
    pub flags: PollFlags,
    pub is_source: bool,
}

impl Feeding {
    /// The feed for `source`; `None` when there is nothing to write.
    pub fn start(source: StdinSource) -> Option<Feeding> {
        match source {
            StdinSource::Pipe(fd, bytes) => {
                // Non-blocking: the loop writes what the pipe takes, never waits on it.
                let _ = fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
                (!bytes.is_empty()).then(|| Feeding {
                    target: fd.into(),
                    pending: bytes,
                    source: None,
                    pipe: true,
                })
            }
            StdinSource::Terminal {
                master,
                bytes,
                relay,
            } => {
                let source = relay.then(|| std::io::stdin().as_fd().try_clone_to_owned().ok());
                Some(Feeding {
                    target: master.into(),
                    pending: bytes,
                    source: source.flatten().map(Into::into),
                    pipe: false,
                })
            }
        }
    }

    /// The terminal, for resizing; `None` when feeding a pipe.
    pub fn terminal(&self) -> Option<&std::fs::File> {
        (!self.pipe).then_some(&self.target)
    }

    /// What to wait for: room for pending bytes, else more from the caller.
    pub fn wants(&self) -> Option<Want<'_>> {
        if !self.pending.is_empty() {
            return Some(Want {
                fd: self.target.as_fd(),
                flags: PollFlags::POLLOUT,
                is_source: false,
            });
        }
        self.source.as_ref().map(|source| Want {
            fd: source.as_fd(),
            flags: PollFlags::POLLIN,
            is_source: true,
        })
    }

    /// Acts on readiness of what [`wants`](Self::wants) named; false when the feed is done.
    pub fn ready(&mut self, source_ready: bool, buffer: &mut [u8]) -> bool {
        if source_ready {
            self.take_from_source(buffer);
        } else {
            self.write_some();
        }
        !(self.pending.is_empty() && (self.pipe || self.source.is_none()))
    }

    fn take_from_source(&mut self, buffer: &mut [u8]) {
        let Some(source) = &mut self.source else {
            return;
        };
        match source.read(buffer) {
            Ok(0) | Err(_) => {
                self.source = None;
                self.pending.push(END_OF_INPUT);
            }
            Ok(n) => self.pending.extend_from_slice(&buffer[..n]),
        }
    }

    fn write_some(&mut self) {
        let limit = match self.pipe {
            true => self.pending.len(),
            false => self.pending.len().min(TERMINAL_WRITE),
        };
        match self.target.write(&self.pending[..limit]) {
            Ok(n) => drop(self.pending.drain(..n)),
            Err(e) if is_transient(&e) => {}
            // The program closed its end (or its terminal is gone): nothing more to write.
            Err(_) => {
                self.pending.clear();
                self.source = None;
            }
        }
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
    )
}

//! Draining the program's stdout and stderr: keep up to a cap, count everything, and ask the
//! init to stop the run when the cap is passed and the policy says so. The pipes are always
//! read to EOF, so nothing written before a timeout is lost and the program never blocks on
//! a full pipe.

use std::io::{Read, Write};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Where a stream's bytes go.
#[derive(Debug, Clone)]
pub enum OutputSink {
    /// Keep them for the result.
    Capture,
    /// Copy them to the supervisor's own stdout or stderr as they arrive.
    Forward,
    /// Send them as events to the run handle, once the gate is open.
    Stream(Sender<crate::supervisor::RunEvent>, Arc<StartGate>),
    /// Keep them for the result and send them as events too (a zygote run's).
    KeepAndStream(Sender<crate::supervisor::RunEvent>, Arc<StartGate>),
    /// Drop them (still counted).
    Discard,
}

/// Holds streamed output until the run's start has been sent, so that `Started` always
/// leads a run's events: the program's output and the init's start report come on different
/// pipes, read by different threads, and a program that writes at once could otherwise be
/// heard before its start. Opened by the init's first event, or the end of its events.
#[derive(Debug, Default)]
pub struct StartGate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl StartGate {
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.opened.notify_all();
    }

    pub fn wait(&self) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let _open = self
            .opened
            .wait_while(open, |open| !*open)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// Which of the two streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Stdout,
    Stderr,
}

/// What a drained stream produced.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    /// Bytes kept (Capture only).
    pub kept: Vec<u8>,
    /// Bytes the program wrote in all.
    pub total: u64,
    /// More than `cap` bytes were written.
    pub truncated: bool,
}

/// One stream's accounting as its chunks arrive: keeps up to `cap`, counts everything.
#[derive(Debug)]
pub struct Collector<'a> {
    kind: StreamKind,
    sink: &'a OutputSink,
    cap: u64,
    drained: Drained,
}

impl<'a> Collector<'a> {
    pub fn new(kind: StreamKind, sink: &'a OutputSink, cap: u64) -> Self {
        Collector {
            kind,
            sink,
            cap,
            drained: Drained::default(),
        }
    }

    /// Delivers what fits under the cap; true when this chunk is the first to pass it.
    pub fn take(&mut self, chunk: &[u8]) -> bool {
        let room = self.cap.saturating_sub(self.drained.total) as usize;
        let keep = chunk.len().min(room);
        self.drained.total += chunk.len() as u64;
        deliver(&chunk[..keep], self.kind, self.sink, &mut self.drained.kept);
        let first_overflow = chunk.len() > keep && !self.drained.truncated;
        self.drained.truncated |= first_overflow;
        first_overflow
    }

    pub fn finish(self) -> Drained {
        self.drained
    }
}

/// One read from a pipe: `None` at EOF (or on an error, which ends the stream too), an empty
/// chunk when interrupted.
pub fn read_chunk<'b>(source: &mut impl Read, buffer: &'b mut [u8]) -> Option<&'b [u8]> {
    match source.read(buffer) {
        Ok(0) => None,
        Ok(n) => Some(&buffer[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Some(&buffer[..0]),
        Err(_) => None,
    }
}

/// How much is read from a pipe at once.
pub const CHUNK: usize = 64 * 1024;

/// A pipe's read buffer: one page at first, [`CHUNK`] once a read fills it. A run that
/// prints little (its event lines, a short output) never touches, and so never page-faults
/// in, the other 60 KiB of zeroes: ~15 faults of the supervisor's, every run.
pub struct ReadBuffer {
    bytes: Vec<u8>,
    filled: bool,
}

impl Default for ReadBuffer {
    fn default() -> ReadBuffer {
        ReadBuffer {
            bytes: vec![0u8; 4096],
            filled: false,
        }
    }
}

impl ReadBuffer {
    /// One read from `source`, as [`read_chunk`].
    pub fn read_from(&mut self, source: &mut impl Read) -> Option<&[u8]> {
        if self.filled {
            self.bytes.resize(CHUNK, 0);
        }
        let n = read_chunk(source, &mut self.bytes)?.len();
        self.filled = n == self.bytes.len();
        Some(&self.bytes[..n])
    }

    /// The whole buffer at its full size (for a copy that reads as much as it can).
    pub fn full(&mut self) -> &mut [u8] {
        self.bytes.resize(CHUNK, 0);
        &mut self.bytes
    }
}

fn deliver(bytes: &[u8], kind: StreamKind, sink: &OutputSink, kept: &mut Vec<u8>) {
    if bytes.is_empty() {
        return;
    }
    match sink {
        OutputSink::Capture => kept.extend_from_slice(bytes),
        OutputSink::Forward => {
            let _ = match kind {
                StreamKind::Stdout => forward(std::io::stdout().lock(), bytes),
                StreamKind::Stderr => forward(std::io::stderr().lock(), bytes),
            };
        }
        OutputSink::KeepAndStream(events, start) => {
            kept.extend_from_slice(bytes);
            stream_chunk(bytes, kind, events, start);
        }
        OutputSink::Stream(events, start) => stream_chunk(bytes, kind, events, start),
        OutputSink::Discard => {}
    }
}

fn stream_chunk(
    bytes: &[u8],
    kind: StreamKind,
    events: &Sender<crate::supervisor::RunEvent>,
    start: &StartGate,
) {
    start.wait();
    let event = match kind {
        StreamKind::Stdout => crate::supervisor::RunEvent::Stdout(bytes.to_vec()),
        StreamKind::Stderr => crate::supervisor::RunEvent::Stderr(bytes.to_vec()),
    };
    let _ = events.send(event);
}

fn forward(mut target: impl Write, bytes: &[u8]) -> std::io::Result<()> {
    target.write_all(bytes)?;
    target.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One page at first, the full chunk once a read fills it; nothing lost on the way.
    #[test]
    fn the_read_buffer_grows_only_when_a_read_fills_it() {
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut source = std::io::Cursor::new(data.clone());
        let (mut buffer, mut read, mut sizes) = (ReadBuffer::default(), Vec::new(), Vec::new());
        while let Some(chunk) = buffer.read_from(&mut source) {
            sizes.push(chunk.len());
            read.extend_from_slice(chunk);
        }
        assert_eq!(read, data);
        assert_eq!(&sizes[..3], &[4096, CHUNK, CHUNK]);
        let mut short = std::io::Cursor::new(vec![1u8; 100]);
        let mut buffer = ReadBuffer::default();
        assert_eq!(buffer.read_from(&mut short).map(<[u8]>::len), Some(100));
        assert_eq!(
            buffer.bytes.len(),
            4096,
            "a short read leaves it at one page"
        );
    }

    #[test]
    fn keeps_up_to_the_cap_and_counts_everything() {
        let mut overflows = 0;
        let data = vec![b'x'; 200_000];
        let sink = OutputSink::Capture;
        let mut collector = Collector::new(StreamKind::Stdout, &sink, 1000);
        for chunk in data.chunks(CHUNK) {
            overflows += usize::from(collector.take(chunk));
        }
        let drained = collector.finish();
        assert_eq!(drained.kept.len(), 1000);
        assert_eq!(drained.total, 200_000);
        assert!(drained.truncated);
        assert_eq!(overflows, 1);
    }

    #[test]
    fn output_at_the_cap_is_not_truncated() {
        let sink = OutputSink::Capture;
        let mut collector = Collector::new(StreamKind::Stderr, &sink, 5);
        assert!(!collector.take(b"hello"), "no overflow");
        let drained = collector.finish();
        assert_eq!(
            (drained.kept.as_slice(), drained.truncated),
            (&b"hello"[..], false)
        );
    }
}

//! The worker contract: how a job is laid out for a sandboxed worker, what the worker may say on
//! stdout, and how its results are brought back to the host.
//!
//! Inside the sandbox a worker sees `in/` (its declared inputs, read-only), `options.json` and
//! `out/` (the only writable place besides tmp). It reports on stdout with NDJSON events
//! ([`protocol`]). The host prepares that layout ([`stage()`]) and afterwards copies `out/` back
//! under strict caps (`ingest()`), treating everything the sandbox wrote as hostile.
//!
//! The full contract is documented in `docs/worker-protocol.md`.

use std::io;
use std::path::PathBuf;

#[cfg(target_os = "linux")]
pub mod ingest;
pub mod protocol;
#[cfg(target_os = "linux")]
pub mod run;
pub mod stage;

#[cfg(target_os = "linux")]
pub use ingest::{ingest, IngestLimits, IngestReport, IngestedFile, SkipReason, Skipped};
pub use protocol::{parse_line, EventDecoder, WorkerEvent, PROTOCOL_VERSION};
pub use stage::{stage, validate_input_name, InputFile, StagedJob};

/// Longest file name (in bytes) accepted for inputs and outputs; the usual filesystem limit.
pub const MAX_NAME_BYTES: usize = 255;

/// Errors of the worker contract: staging a job, or ingesting its results.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    #[error(
        "invalid file name {name:?}: {problem}; use a single plain file name such as \"data.csv\""
    )]
    InvalidName { name: String, problem: &'static str },

    #[error("input {name:?} is declared twice; give each input a distinct name")]
    DuplicateInput { name: String },

    #[error("input {name:?}: cannot read source {}: {source}; check that the file exists and is readable", path.display())]
    MissingSource {
        name: String,
        path: PathBuf,
        source: io::Error,
    },

    #[error("input {name:?}: source {} is not a regular file; only regular files can be staged", path.display())]
    SourceNotRegular { name: String, path: PathBuf },

    #[error("job directory {} is not empty; stage each job into a fresh directory", path.display())]
    JobDirNotEmpty { path: PathBuf },

    #[error("destination {} already exists and is not an empty directory; ingest into a fresh directory", path.display())]
    DestNotEmpty { path: PathBuf },

    #[error("failed to serialise options to {}: {source}", path.display())]
    Options {
        path: PathBuf,
        source: serde_json::Error,
    },

    #[error("failed to {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl WorkerError {
    fn io(action: &'static str, path: impl Into<PathBuf>, source: impl Into<io::Error>) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source: source.into(),
        }
    }
}

/// Why `name` is not a safe single path component, or `None` if it is.
///
/// Shared by input staging, output ingestion and (mirrored) the Python helper, so a name that
/// one side accepts is accepted by all of them.
pub(crate) fn component_problem(name: &str, max_bytes: usize) -> Option<&'static str> {
    if name.is_empty() {
        Some("name is empty")
    } else if name == "." || name == ".." {
        Some("name is a directory reference")
    } else if name.contains('/') {
        Some("name contains '/'")
    } else if name.contains('\0') {
        Some("name contains a NUL byte")
    } else if name.chars().any(char::is_control) {
        Some("name contains a control character")
    } else if name.len() > max_bytes {
        Some("name is too long")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_problem_accepts_plain_names() {
        for name in [
            "a",
            "data.csv",
            "..x",
            "x..",
            ".hidden",
            "résumé.pdf",
            "a b",
        ] {
            assert_eq!(component_problem(name, MAX_NAME_BYTES), None, "{name:?}");
        }
    }

    #[test]
    fn component_problem_rejects_tricks() {
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        for name in [
            "", ".", "..", "a/b", "/", "a\0b", "a\nb", "a\rb", "\x1b[31m", "a\x7f", "\u{85}", &long,
        ] {
            assert!(
                component_problem(name, MAX_NAME_BYTES).is_some(),
                "{name:?}"
            );
        }
        assert_eq!(component_problem(&"x".repeat(255), MAX_NAME_BYTES), None);
    }
}

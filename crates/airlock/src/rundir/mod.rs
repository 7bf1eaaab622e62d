//! The run directory: one per run, in the runtime directory (see [`runtime_dir`]). The
//! supervisor names its paths and plans it; the init creates it, writes the files a wrapping
//! tool reads, and removes it; the sweep removes what a killed run left. Both sides of the
//! supervisor↔init pipe use this module, and nothing here knows either of them.
//!
//! ```text
//! <runtime dir>/                  0711, owned by the user airlock runs as
//!   .last-sweep                   when the last sweep ran (SWEEP_STAMP)
//!   .tool-versions/               `TOOL --version`, remembered per binary
//!   run-<pid>-<time>-<n>/         0711, one run (the id names the supervisor's pid)
//!     work/                       0700, the program's fresh workdir (absent: the caller's)
//!     tmp/                        0700, the program's /tmp
//!     shm/                        the program's /dev/shm (a capped tmpfs when in memory)
//!     .airlock-kept               the caller keeps the workdir (`--keep`): never swept
//!     bwrap-etc/, oci/, ...       files a wrapping tool reads, from the backend's plan
//! ```
//!
//! The run directory is in memory (see [`MemoryScratch`]) unless the run keeps its workdir,
//! the caller asks for disk, or airlock cannot mount.

mod create;
mod remove;
mod runtime;
mod scratch;
mod sweep;

use std::path::{Path, PathBuf};

pub use create::{write_file, NewRunDir, RunDirError, RunFile};
pub use remove::{remove, remove_tree};
pub use runtime::{default_runtime_dir, existing_runtime_dir, new_run_id, runtime_dir};
pub use scratch::{memory_scratch, MemoryScratch};
pub use sweep::{sweep, sweep_if_due, sweep_supervisor, SWEEP_STAMP};

/// The file in a run directory whose workdir the caller asked to keep (`--keep`): the sweep
/// never removes such a directory, whose supervisor is always gone once a caller reads it.
pub const KEPT_MARKER: &str = ".airlock-kept";

/// The program's workdir when the run makes a fresh one.
pub fn fresh_workdir(run_dir: &Path) -> PathBuf {
    run_dir.join("work")
}

/// The program's `/tmp` (and `TMPDIR` for a run without a boundary).
pub fn tmp_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("tmp")
}

/// The program's `/dev/shm`.
pub fn shm_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("shm")
}

/// The marker of a run whose workdir is kept.
pub fn kept_marker(run_dir: &Path) -> PathBuf {
    run_dir.join(KEPT_MARKER)
}

/// Whether `path` lies inside `run_dir` (no `..` anywhere): the init creates nothing else.
pub fn is_inside(run_dir: &Path, path: &Path) -> bool {
    path.starts_with(run_dir)
        && !path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
}

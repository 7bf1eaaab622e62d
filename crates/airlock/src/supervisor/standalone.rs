//! A wrapping tool's run without airlock: the plan's command line, files and descriptors, for
//! starting the same tool with the same configuration by hand (to debug a sandbox, or to
//! measure what airlock's own supervisor and init cost around it, as `airlock-bench` does).

use std::path::PathBuf;

use super::builder::Command;
use super::prepare::{self, Effects};
use crate::confine::seccomp;
use crate::confine::Credentials;
use crate::error::Error;
use crate::rundir::{self, NewRunDir, RunFile};
use crate::spec::{Confinement, HiddenFile, WrapSpec};

/// What airlock's init would write and hand a wrapping tool for one planned run.
#[derive(Debug, Clone)]
pub struct StandaloneWrapper {
    /// The tool's command line with the program; a host file the init would hide in its own
    /// mount namespace is hidden by the command line instead (`unshare`), and the status pipe
    /// only the init reads is left out.
    pub argv: Vec<String>,
    /// The run directory the files go in.
    pub run_dir: PathBuf,
    /// The program's fresh workdir in it.
    pub workdir: PathBuf,
    /// The owner of the program's directories (the sandbox user), when airlock drops root.
    pub owner: Option<Credentials>,
    /// Files the tool reads (an OCI bundle, bwrap's `/etc` files).
    pub files: Vec<RunFile>,
    /// Descriptors the tool expects open, by number, with their contents (airlock's seccomp
    /// filters as raw `struct sock_filter` arrays for bwrap's `--add-seccomp-fd`).
    pub descriptors: Vec<(i32, Vec<u8>)>,
}

impl Command {
    /// This command's wrapping tool as a standalone command, planned like a run (see
    /// [`Command::plan`]); an error for a backend that wraps no tool (native, none).
    pub fn standalone_wrapper(&self) -> Result<StandaloneWrapper, Error> {
        let prepared = prepare::prepare(self, Effects::None)?;
        let spec = prepared.spec;
        let Confinement::Wrapped(wrap) = &spec.confinement else {
            return Err(Error::Command(format!(
                "backend {} wraps no sandbox tool",
                prepared.plan.backend
            )));
        };
        Ok(StandaloneWrapper {
            argv: standalone_argv(wrap, &spec.argv)?,
            descriptors: seccomp_descriptors(wrap)?,
            files: wrap.files().cloned().collect(),
            run_dir: spec.run_dir.clone(),
            workdir: spec.workdir.clone(),
            owner: spec.credentials,
        })
    }
}

impl StandaloneWrapper {
    /// Creates the run directory as the init would (the workdir, `tmp` and `shm` owned by the
    /// sandbox user, as plain directories: nothing is mounted) and writes the tool's files.
    pub fn create_run_dir(&self) -> Result<(), Error> {
        let run_dir = NewRunDir {
            run_dir: &self.run_dir,
            fresh_workdir: Some(&self.workdir),
            owner: self.owner,
            keep_workdir: false,
        };
        let failed = |e| Error::io("cannot prepare the run directory", std::io::Error::other(e));
        run_dir.create().map_err(failed)?;
        run_dir
            .create_dir(&rundir::shm_dir(&self.run_dir))
            .map_err(failed)?;
        for file in &self.files {
            run_dir
                .check_inside(&file.path, "wrapper file")
                .map_err(failed)?;
            rundir::write_file(file).map_err(failed)?;
        }
        Ok(())
    }
}

fn standalone_argv(wrap: &WrapSpec, program: &[String]) -> Result<Vec<String>, Error> {
    let mut argv = without_status_fd(wrap.wrapper_argv.clone(), wrap.status_fd());
    let hidden: Vec<HiddenFile> = wrap.hidden_files().cloned().collect();
    if !hidden.is_empty() {
        argv = crate::backend::hide_files_with_unshare(argv, &hidden, false).ok_or_else(|| {
            Error::Command("hiding host files from the tool needs unshare (util-linux)".into())
        })?;
    }
    if !wrap.argv_in_files {
        argv.extend(program.iter().cloned());
    }
    Ok(argv)
}

/// Drops the option that names the status descriptor (bwrap's `--json-status-fd N`).
fn without_status_fd(argv: Vec<String>, status_fd: Option<i32>) -> Vec<String> {
    let Some(fd) = status_fd.map(|fd| fd.to_string()) else {
        return argv;
    };
    let mut kept: Vec<String> = Vec::with_capacity(argv.len());
    for arg in argv {
        if arg == fd && kept.last().is_some_and(|flag| flag.ends_with("status-fd")) {
            kept.pop();
        } else {
            kept.push(arg);
        }
    }
    kept
}

fn seccomp_descriptors(wrap: &WrapSpec) -> Result<Vec<(i32, Vec<u8>)>, Error> {
    let Some((config, fds)) = wrap.seccomp_fds() else {
        return Ok(Vec::new());
    };
    let programs = seccomp::build_filters(config)
        .map_err(|e| Error::Command(format!("cannot build the seccomp filters: {e}")))?;
    Ok(fds
        .iter()
        .zip(&programs)
        .map(|(fd, program)| (*fd, seccomp::filter_bytes(program)))
        .collect())
}

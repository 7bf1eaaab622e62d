//! What the init creates for a run before the program starts, and removes after: the signal
//! descriptor, the run directory (in memory when planned so, with the files a wrapping tool
//! reads), the run's cgroup and the host files hidden from a tool.

use std::os::fd::OwnedFd;
use std::path::Path;

use nix::sys::signal::Signal;
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::{Kind, Setup, Step};
use crate::confine::cgroup::{self, RunCgroup};
use crate::error::SetupError;
use crate::linux::sys;
use crate::rundir::{self, MemoryScratch, NewRunDir, RunDirError};
use crate::spec::{CgroupRequest, Confinement, InitSpec, WrapStep, GATE_FD};

/// What the init created for a run and must remove.
pub(crate) struct PreparedRun {
    pub cgroup: Option<RunCgroup>,
    pub cgroup_warning: Option<String>,
    pub signals: SignalFd,
    /// The egress gate's channel ([`crate::spec::GATE_FD`]) until the child is forked with
    /// it; the init keeps no copy after that, so the supervisor sees it close if the child
    /// fails before handing the sockets over.
    pub gate: Option<OwnedFd>,
}

impl PreparedRun {
    pub(super) fn create(spec: &InitSpec) -> Setup<PreparedRun> {
        // SIGCHLD for the watch loop; the stop signals so that a Ctrl-C to the terminal's
        // process group, which includes the init, cannot kill it before it has cleaned up
        // (see `watch::Watch::drain_signals`).
        let mut mask = super::stop_signals();
        mask.add(Signal::SIGCHLD);
        mask.thread_block()
            .map_err(|e| SetupError::at(Step::Init, format!("cannot block signals: {e}")))?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(|e| SetupError::at(Step::Init, format!("signalfd: {e}")))?;
        let gate = match spec.egress {
            Some(_) => Some(sys::claim_inherited_fd(GATE_FD).map_err(|e| {
                SetupError::at(
                    Step::Init,
                    format!("cannot take the egress gate's channel: {e}"),
                )
            })?),
            None => None,
        };
        let place = RunDirPlace::of(spec);
        if let RunDirPlace::InMemory(scratch) = place {
            crate::confine::rootfs::enter_private_runtime(&scratch.runtime_dir).map_err(|e| {
                SetupError::at(Step::RunDir, e.to_string()).of_kind(Kind::MountFailed)
            })?;
        }
        map_owners(spec, place)?;
        if !matches!(place, RunDirPlace::NotMade) {
            make_run_dirs(spec)?;
        }
        let mut run = PreparedRun {
            cgroup: None,
            cgroup_warning: None,
            signals,
            gate,
        };
        // A native run's is made after its child is forked (see `cgroup_handoff`).
        if !super::cgroup_handoff::deferred(spec) {
            run.make_cgroup(spec);
        }
        // After the cgroup: the init's own cgroup layout is read from the uncovered files.
        if let Confinement::Wrapped(wrap) = &spec.confinement {
            super::wrapped::prepare_for_tool(spec, wrap)?;
        }
        Ok(run)
    }

    /// The run's cgroup with its limits, if it has one; one that cannot be made leaves a
    /// warning, and the run falls back to rlimits.
    pub(super) fn make_cgroup(&mut self, spec: &InitSpec) {
        let Some(request) = &spec.cgroup else {
            return;
        };
        let limits = cgroup_limits(spec, request);
        match RunCgroup::create(&request.config, &request.run_id, &limits) {
            Ok(cgroup) => self.cgroup = Some(cgroup),
            Err(e) => self.cgroup_warning = Some(cgroup::no_cgroup_warning(&e)),
        }
    }

    pub(super) fn cleanup(&mut self, spec: &InitSpec) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Confinement::Wrapped(wrap) = &spec.confinement {
            warnings.extend(super::wrapped::clean_up_after_tool(wrap));
        }
        if let Some(cgroup) = self.cgroup.take() {
            if let Err(e) = cgroup.remove() {
                warnings.push(format!("cannot remove the run's cgroup: {e}"));
            }
        }
        // A run directory in memory goes with the init's mount namespace (or was not made).
        if matches!(RunDirPlace::of(spec), RunDirPlace::OnDisk) {
            warnings.extend(rundir::remove(&spec.run_dir, kept_workdir(spec)));
        }
        warnings
    }
}

/// Where the run directory is, which decides the init's own mount namespace.
#[derive(Clone, Copy)]
enum RunDirPlace<'a> {
    /// On the host's disk: the init removes it at the end.
    OnDisk,
    /// In a tmpfs covering the runtime directory, in the init's own mount namespace, which
    /// takes it away at the init's exit.
    InMemory(&'a MemoryScratch),
    /// Not made: nothing the sandbox binds reaches the runtime directory and its PID 1 mounts
    /// its own scratch (see `MemoryScratch::needed`).
    NotMade,
}

impl<'a> RunDirPlace<'a> {
    fn of(spec: &'a InitSpec) -> RunDirPlace<'a> {
        match &spec.scratch {
            None => RunDirPlace::OnDisk,
            Some(scratch) if scratch.needed => RunDirPlace::InMemory(scratch),
            Some(_) => RunDirPlace::NotMade,
        }
    }
}

/// The run's own workdir, when the caller keeps it.
fn kept_workdir(spec: &InitSpec) -> Option<&Path> {
    (spec.keep && !spec.workdir_is_callers).then_some(spec.workdir.as_path())
}

/// The run's cgroup limits, minus the pids limit when the wrapper tool's helpers would hit it.
fn cgroup_limits(spec: &InitSpec, request: &CgroupRequest) -> crate::confine::cgroup::CgroupLimits {
    let mut limits = request.limits.clone();
    if matches!(&spec.confinement, Confinement::Wrapped(w) if w.has(&WrapStep::NoCgroupPidsLimit)) {
        limits.pids = None;
    }
    limits
}

pub(super) fn new_run_dir(spec: &InitSpec) -> NewRunDir<'_> {
    NewRunDir {
        run_dir: &spec.run_dir,
        fresh_workdir: (!spec.workdir_is_callers).then_some(spec.workdir.as_path()),
        owner: spec.credentials,
        keep_workdir: spec.keep,
    }
}

/// Shows the caller's paths to the program as its own (see `confine::idmap`), in the init's
/// own mount namespace (entered here unless the run directory in memory made one).
fn map_owners(spec: &InitSpec, place: RunDirPlace) -> Setup<()> {
    if spec.mapped.is_empty() {
        return Ok(());
    }
    if !matches!(place, RunDirPlace::InMemory(_)) {
        crate::confine::rootfs::enter_private_mount_namespace().map_err(|e| {
            SetupError::at(Step::Workspace, e.to_string()).of_kind(Kind::MountFailed)
        })?;
    }
    crate::confine::idmap::map_owners(&spec.mapped).map_err(|e| {
        let kind = match e.unsupported() {
            true => Kind::WorkdirNotMappable,
            false => Kind::MountFailed,
        };
        let fix = format!(
            "give the program a directory on a filesystem with idmapped mounts (ext4, xfs, btrfs, tmpfs; Linux 5.12 or later), give it to the sandbox user (chown -R {}:{} {}), or run airlock as its owner",
            spec.credentials.map_or(0, |c| c.uid),
            spec.credentials.map_or(0, |c| c.gid),
            e.path.display(),
        );
        let message = match e.unsupported() {
            true => format!(
                "{} is on a filesystem (or a kernel) without idmapped mounts: its owner {}:{} cannot be shown to the program as its own ({})",
                e.path.display(),
                e.owner_uid,
                e.owner_gid,
                e.source
            ),
            false => e.to_string(),
        };
        SetupError::at(Step::Workspace, format!("{message}; {fix}"))
            .of_kind(kind)
            .with_fix(fix)
    })
}

fn make_run_dirs(spec: &InitSpec) -> Setup<()> {
    let run_dir = new_run_dir(spec);
    run_dir.create().map_err(run_dir_failed)?;
    if let Some(scratch) = &spec.scratch {
        mount_scratch(&run_dir, scratch)?;
    }
    Ok(())
}

/// The capped tmpfs mounts of an in-memory run directory, only ever inside it.
fn mount_scratch(run_dir: &NewRunDir, scratch: &MemoryScratch) -> Setup<()> {
    for mount in &scratch.mounts {
        run_dir
            .check_inside(&mount.path, "scratch mount")
            .map_err(run_dir_failed)?;
        crate::confine::rootfs::mount_scratch(mount)
            .map_err(|e| SetupError::at(Step::RunDir, e.to_string()).of_kind(Kind::MountFailed))?;
    }
    Ok(())
}

/// A run directory failure; a path outside it is a spec the init refuses.
pub(super) fn run_dir_failed(error: RunDirError) -> SetupError {
    let kind = match error {
        RunDirError::Outside { .. } => Kind::SpecInvalid,
        _ => Kind::RunDirFailed,
    };
    SetupError::at(Step::RunDir, error.to_string()).of_kind(kind)
}

//! A prepared (warm) sandbox, the init's half. The init sets the sandbox up exactly as for a
//! cold run; the sandbox's PID 1 then reports ready and waits on the command pipe (whose
//! write end the supervisor holds) instead of using the spec's command, or, for a started
//! interpreter, forks it at once to wait for its code on stdin. The init waits too, with no
//! clock running. When the supervisor has handed over the command ([`WarmGo`]) or the code, it
//! says `"started"` on the control pipe, and the init starts the run's clocks and accounting
//! then, so that the result is the run's, not the preparation's.
//!
//! A prepared sandbox the supervisor gives up (it closes its pipes unwritten) never starts:
//! PID 1 (or the interpreter) reads nothing and exits, and the init tears everything down as
//! after any run.

use std::borrow::Cow;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::child::{send_setup, SetupMessage};
use super::watch::{StopCause, Watch};
use super::{Kind, Setup, Step};
use crate::error::SetupError;
use crate::linux::sys;
use crate::spec::fds::{CHILD_GO_FD, CHILD_SHARED_ROOT_FDS, GO_FD, SHARED_ROOT_FDS};
use crate::spec::{InitEvent, InitSpec, StagedFile, StopReason, WarmGo, WARM_STARTED_LINE};

/// The largest command (argv, environment and staged files) PID 1 reads.
const MAX_GO_BYTES: u64 = 64 << 20;

/// A warm init's command pipe (read end), inherited from the supervisor for PID 1.
pub(super) fn inherited_go(spec: &InitSpec) -> Setup<Option<OwnedFd>> {
    if !spec.warm {
        return Ok(None);
    }
    sys::claim_inherited_fd(GO_FD)
        .map(Some)
        .map_err(|e| SetupError::at(Step::Init, format!("cannot take the command pipe: {e}")))
}

/// A warm sandbox's shared root: the user and mount namespaces that hold it, inherited from
/// the supervisor for the child (see `native::enter_shared_root`).
pub(super) fn inherited_shared_root(spec: &InitSpec) -> Setup<Vec<OwnedFd>> {
    if !spec.shared_root {
        return Ok(Vec::new());
    }
    let claim = |fd| {
        sys::claim_inherited_fd(fd)
            .map_err(|e| SetupError::at(Step::Init, format!("cannot take the shared root: {e}")))
    };
    SHARED_ROOT_FDS.into_iter().map(claim).collect()
}

/// Where the command pipe and a shared root's namespaces go in the child.
pub(super) fn placements(go: Option<&OwnedFd>, shared_root: &[OwnedFd]) -> Vec<(RawFd, RawFd)> {
    let go = go.map(|read| (read.as_raw_fd(), CHILD_GO_FD));
    let root = shared_root
        .iter()
        .map(AsRawFd::as_raw_fd)
        .zip(CHILD_SHARED_ROOT_FDS);
    go.into_iter().chain(root).collect()
}

/// In PID 1, after every confinement step: the command this run executes. A cold run's is in
/// its spec; a warm sandbox reports ready and waits for it. An empty command means the
/// sandbox was retired without a run: PID 1 exits, which ends the sandbox.
pub(super) fn command_for(spec: &InitSpec) -> Setup<Cow<'_, InitSpec>> {
    if !spec.warm {
        return Ok(Cow::Borrowed(spec));
    }
    send_setup(&SetupMessage::Ready);
    // The program (an interpreter) starts now and waits for its code on stdin.
    if spec.warm_prestart {
        return Ok(Cow::Borrowed(spec));
    }
    // Placed at CHILD_GO_FD by fork_child for this process alone.
    let mut pipe =
        std::fs::File::from(sys::claim_inherited_fd(CHILD_GO_FD).map_err(|e| {
            SetupError::at(Step::Init, format!("cannot take the command pipe: {e}"))
        })?);
    let mut body = Vec::new();
    let read = (&mut pipe)
        .take(MAX_GO_BYTES)
        .read_to_end(&mut body)
        .map_err(|e| SetupError::at(Step::Spec, format!("cannot read the command: {e}")))?;
    drop(pipe);
    if read == 0 {
        sys::exit_now(0);
    }
    let go: WarmGo = serde_json::from_slice(&body)
        .map_err(|e| SetupError::at(Step::Spec, format!("malformed command: {e}")))?;
    let mut run = spec.clone();
    run.argv = go.argv;
    run.env = go.env;
    run.files = go.files;
    Ok(Cow::Owned(run))
}

/// Writes the staged files into the fresh workdir, which nothing has touched yet. Paths were
/// checked by the supervisor and are checked again: relative, no `..`.
pub(super) fn stage_files(workdir: &Path, files: &[StagedFile]) -> Setup<()> {
    use std::os::unix::fs::OpenOptionsExt;
    for file in files {
        let failed = |e: &dyn std::fmt::Display| {
            SetupError::at(
                Step::RunDir,
                format!("cannot stage {} in the workdir: {e}", file.path.display()),
            )
        };
        if !file.has_plain_path() {
            return Err(
                failed(&"the path must be relative, without `..`").of_kind(Kind::SpecInvalid)
            );
        }
        let path = workdir.join(&file.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| failed(&e))?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode & 0o777)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut out| out.write_all(&file.contents))
            .map_err(|e| failed(&e))?;
    }
    Ok(())
}

impl Watch<'_> {
    /// A warm run's wait before it starts: reports the sandbox ready when PID 1 says so, then
    /// waits for the supervisor's word that the run started (it wrote the command or the
    /// code) and starts the run's clocks. What the setup pipe carries meanwhile (a started
    /// interpreter's layers) stays for the watch loop, which reports it once the run is on.
    /// Returns at once when the sandbox failed or was retired; the watch loop then sees it end
    /// as it would any run.
    pub(super) fn await_go(&mut self) {
        let mut setup_open = true;
        while self.main.is_none() && self.stop_cause().is_none() {
            let (signals, control, setup) = self.wait_while_idle(setup_open);
            if signals {
                self.drain_signals();
                self.reap_all();
            }
            if setup {
                setup_open = self.read_setup_while_idle();
            }
            if control && self.read_started_line() {
                self.start_run();
                return;
            }
        }
    }

    /// Reads what PID 1 sent (keeping it for the watch loop) and reports readiness; false at
    /// EOF, which the watch loop will see again.
    fn read_setup_while_idle(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        let read = match self.setup_pipe.as_mut().map(|pipe| pipe.read(&mut chunk)) {
            Some(Ok(n)) => n,
            _ => 0,
        };
        self.setup_buffer.extend_from_slice(&chunk[..read]);
        if self.take_ready_line() {
            super::send_event(&InitEvent::Ready);
        }
        read > 0
    }

    /// Reads the control pipe: true at the supervisor's "started"; EOF (the sandbox retired,
    /// or its supervisor died) and stop requests begin a stop.
    fn read_started_line(&mut self) -> bool {
        let mut line = [0u8; WARM_STARTED_LINE.len()];
        match self.control.read(&mut line) {
            Ok(n) if line[..n] == *WARM_STARTED_LINE => true,
            Ok(0) | Err(_) => {
                self.control_open = false;
                self.begin_stop(StopCause::SupervisorGone);
                false
            }
            Ok(_) => {
                self.begin_stop(StopCause::Requested(StopReason::Cancelled));
                false
            }
        }
    }

    fn wait_while_idle(&self, setup_open: bool) -> (bool, bool, bool) {
        let mut fds = vec![PollFd::new(self.run.signals.as_fd(), PollFlags::POLLIN)];
        if self.control_open {
            fds.push(PollFd::new(self.control.as_fd(), PollFlags::POLLIN));
        }
        let setup_index = fds.len();
        if let Some(pipe) = self.setup_pipe.as_ref().filter(|_| setup_open) {
            fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
        }
        if poll(&mut fds, PollTimeout::NONE).unwrap_or(0) <= 0 {
            return (false, false, false);
        }
        let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
        let control = self.control_open && ready(&fds[1]);
        let setup = fds.len() > setup_index && ready(&fds[setup_index]);
        (ready(&fds[0]), control, setup)
    }

    /// Removes PID 1's "ready" line from what the setup pipe carried; true when it was there.
    fn take_ready_line(&mut self) -> bool {
        const READY: &[u8] = b"\"ready\"\n";
        match self
            .setup_buffer
            .windows(READY.len())
            .position(|w| w == READY)
        {
            Some(at) => {
                self.setup_buffer.drain(at..at + READY.len());
                true
            }
            None => false,
        }
    }

    /// The run's wall clock, CPU budget and peak memory count from now, not from the
    /// preparation.
    fn start_run(&mut self) {
        self.start = Instant::now();
        self.next_cpu_check = self.start + super::watch::CPU_CHECK_INTERVAL;
        if let Some(cgroup) = &self.run.cgroup {
            self.cpu_base = Duration::from_nanos(cgroup.cpu_usage_ns().unwrap_or(0));
            cgroup.reset_peak_memory();
        }
    }
}

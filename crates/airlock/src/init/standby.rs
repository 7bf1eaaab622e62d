//! A prepared (warm) sandbox, the init's half. The init sets the sandbox up exactly as for a
//! cold run; the sandbox's PID 1 then reports ready and waits on a pipe for the command
//! instead of using the spec's. The init waits too (no clocks run), and when the supervisor
//! sends the command ([`WarmGo`]) it relays it to PID 1, starts the run's clocks and resets the
//! run's accounting, so that what the result reports is the run's, not the preparation's.
//!
//! A prepared sandbox the supervisor gives up (its control pipe closes) never starts: PID 1
//! reads an empty command, exits, and the init tears everything down as after any run.

use std::borrow::Cow;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::child::{send_setup, SetupMessage};
use super::watch::{StopCause, Watch};
use super::{Kind, Setup, Step};
use crate::error::SetupError;
use crate::spec::{InitEvent, InitSpec, StagedFile, WarmGo};

/// The read end of the command pipe in the sandbox's PID 1 (after the setup, report and
/// tool-status descriptors).
pub(super) const GO_FD: RawFd = 6;

/// The largest command (argv, environment and staged files) the init relays.
const MAX_GO_BYTES: u64 = 64 << 20;

/// The command pipe of a warm run: the read end goes to PID 1, the init keeps the write end.
pub(super) fn go_pipe(spec: &InitSpec) -> Setup<Option<(OwnedFd, OwnedFd)>> {
    if !spec.warm {
        return Ok(None);
    }
    nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .map(Some)
        .map_err(|e| SetupError::at(Step::Init, format!("pipe: {e}")))
}

/// In PID 1, after every confinement step: the command this run executes. A cold run's is in
/// its spec; a warm sandbox reports ready and waits for it. An empty command means the
/// sandbox was retired without a run: PID 1 exits, which ends the sandbox.
pub(super) fn command_for(spec: &InitSpec) -> Setup<Cow<'_, InitSpec>> {
    if !spec.warm {
        return Ok(Cow::Borrowed(spec));
    }
    send_setup(&SetupMessage::Ready);
    // Placed at GO_FD by fork_child for this process alone.
    let mut pipe = std::fs::File::from(
        crate::linux::sys::claim_inherited_fd(GO_FD)
            .map_err(|e| SetupError::at(Step::Init, format!("cannot take the command pipe: {e}")))?,
    );
    let mut body = Vec::new();
    let read = (&mut pipe)
        .take(MAX_GO_BYTES)
        .read_to_end(&mut body)
        .map_err(|e| SetupError::at(Step::Spec, format!("cannot read the command: {e}")))?;
    drop(pipe);
    if read == 0 {
        crate::linux::sys::exit_now(0);
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
            return Err(failed(&"the path must be relative, without `..`").of_kind(Kind::SpecInvalid));
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
    /// A warm run's wait before it starts: reports the sandbox ready, then relays the command
    /// and starts the clocks. Returns at once when the sandbox failed or was retired; the
    /// watch loop then sees it end as it would any run.
    pub(super) fn await_go(&mut self, go: OwnedFd) {
        let mut go = Some(go);
        while go.is_some() && self.main.is_none() && self.setup_pipe.is_some() {
            let (signals, control, setup) = self.wait_while_idle();
            if signals {
                self.drain_signals();
                self.reap_all();
            }
            if setup {
                self.read_setup();
                if self.take_ready_line() {
                    super::send_event(&InitEvent::Ready);
                }
            }
            if control {
                self.relay_command(go.take());
            }
        }
    }

    fn wait_while_idle(&self) -> (bool, bool, bool) {
        let mut fds = vec![
            PollFd::new(self.run.signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.control.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(pipe) = &self.setup_pipe {
            fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
        }
        if poll(&mut fds, PollTimeout::NONE).unwrap_or(0) <= 0 {
            return (false, false, false);
        }
        let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
        (ready(&fds[0]), ready(&fds[1]), fds.len() > 2 && ready(&fds[2]))
    }

    /// Removes PID 1's "ready" line from what the setup pipe carried; true when it was there.
    fn take_ready_line(&mut self) -> bool {
        const READY: &[u8] = b"\"ready\"\n";
        match self.setup_buffer.windows(READY.len()).position(|w| w == READY) {
            Some(at) => {
                self.setup_buffer.drain(at..at + READY.len());
                true
            }
            None => false,
        }
    }

    /// Reads the command from the control pipe and hands it to PID 1; on EOF (the supervisor
    /// retired the sandbox or died) PID 1 gets an empty command and ends the sandbox.
    fn relay_command(&mut self, go: Option<OwnedFd>) {
        let Some(go) = go else { return };
        let body = match read_command(self.control) {
            Ok(body) => body,
            Err(_) => {
                self.control_open = false;
                self.begin_stop(StopCause::SupervisorGone);
                return;
            }
        };
        self.start_clocks();
        let _ = std::fs::File::from(go).write_all(&body);
    }

    /// The run starts now: its wall clock, its CPU budget and its peak memory count from here.
    fn start_clocks(&mut self) {
        self.start = Instant::now();
        self.next_cpu_check = self.start + super::watch::CPU_CHECK_INTERVAL;
        if let Some(cgroup) = &self.run.cgroup {
            self.cpu_base = Duration::from_nanos(cgroup.usage().cpu_usage_ns.unwrap_or(0));
            cgroup.reset_peak_memory();
        }
    }
}

/// One length-prefixed command from the control pipe.
fn read_command(control: &mut std::fs::File) -> std::io::Result<Vec<u8>> {
    let mut header = [0u8; 8];
    control.read_exact(&mut header)?;
    let len = u64::from_le_bytes(header);
    if len == 0 || len > MAX_GO_BYTES {
        return Err(std::io::Error::other(format!("a command of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    control.read_exact(&mut body)?;
    Ok(body)
}

/// The placement of the command pipe's read end in the child.
pub(super) fn go_placement(go: Option<&(OwnedFd, OwnedFd)>) -> Option<(RawFd, RawFd)> {
    go.map(|(read, _)| (read.as_raw_fd(), GO_FD))
}

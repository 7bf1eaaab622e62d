//! Wrapped runs: after Tier 0 the init execs an external sandbox tool (bwrap, runsc, runc)
//! with the program's argv appended. The tool builds the boundary; the init keeps watching
//! the tree, the clocks and the cgroup exactly as for the other backends.
//!
//! A tool whose helpers daemonize (podman: conmon double-forks, and the container is
//! conmon's child) gets a guard: see [`split_off_guard`].

use std::convert::Infallible;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use super::child::{finish_and_exec_with, send_setup, ChildContext, SetupMessage, ToolExec};
use super::run::{new_run_dir, run_dir_failed};
use super::{Kind, Setup, Step};
use crate::confine::seccomp;
use crate::confine::seccomp::SeccompConfig;
use crate::error::SetupError;
use crate::layer::Layer;
use crate::linux::sys::{self, Forked};
use crate::linux::tree;
use crate::result::RunStatus;
use crate::rundir;
use crate::spec::{
    Confinement, GitBind, HiddenFile, InitSpec, Outcome, StartEvidence, WrapSpec, WrapStep,
};

/// Before the program's process is forked, after the run's cgroup exists: the files the tool
/// reads and the host files it must see empty, in the plan's order (a file is written before
/// it covers another).
pub(super) fn prepare_for_tool(spec: &InitSpec, wrap: &WrapSpec) -> Setup<()> {
    let run_dir = new_run_dir(spec);
    for step in &wrap.steps {
        match step {
            WrapStep::WriteFile(file) => {
                run_dir
                    .check_inside(&file.path, "wrapper file")
                    .map_err(run_dir_failed)?;
                rundir::write_file(file).map_err(run_dir_failed)?;
            }
            WrapStep::HideFile(hidden) => hide_file(spec, hidden)?,
            _ => {}
        }
    }
    Ok(())
}

/// Covers a host file the tool must see empty, in the init's own mount namespace (which only
/// an in-memory run directory gives it; the plan asks for this only then).
fn hide_file(spec: &InitSpec, hidden: &HiddenFile) -> Setup<()> {
    if spec.scratch.is_none() {
        return Err(SetupError::at(
            Step::Spec,
            "the plan hides host files, but the init has no mount namespace of its own \
                    (the run directory is not in memory)",
        ));
    }
    new_run_dir(spec)
        .check_inside(&hidden.empty, "hiding file")
        .map_err(run_dir_failed)?;
    crate::confine::rootfs::cover_with_empty_file(&hidden.empty, &hidden.target)
        .map_err(|e| SetupError::at(Step::Wrapper, e.to_string()).of_kind(Kind::MountFailed))
}

/// In the program's process after Tier 0: the steps that prepare the tool's process, then the
/// tool's exec.
pub(super) fn exec(
    spec: &InitSpec,
    wrap: &WrapSpec,
    mut layers: Vec<Layer>,
    ctx: &ChildContext,
) -> Setup<Infallible> {
    // Descriptors to place at the numbers the tool expects, and the filters' owners.
    let mut placed: Vec<(RawFd, RawFd)> = Vec::new();
    let mut filters: Vec<OwnedFd> = Vec::new();
    let tool_status = ctx.tool_status;
    let mut in_own_user_namespace = false;
    for step in &wrap.steps {
        match step {
            WrapStep::EgressNamespace { own_user_namespace } => {
                prepare_egress(spec, ctx.gate, *own_user_namespace)?;
                in_own_user_namespace |= *own_user_namespace;
            }
            WrapStep::ProcessCapInOwnUserNamespace if ctx.cgroup.is_none() => {
                cap_processes_in_own_user_namespace(spec, in_own_user_namespace)?
            }
            WrapStep::NoNewPrivs => {
                nix::sys::prctl::set_no_new_privs().map_err(|e| {
                    SetupError::at(Step::Privileges, format!("cannot set no_new_privs: {e}"))
                })?;
                layers.push(Layer::NoNewPrivs);
            }
            WrapStep::SeccompFds { config, fds } => {
                let made = seccomp_descriptors(config, fds.len())?;
                placed.extend(
                    made.iter()
                        .map(|fd| fd.as_raw_fd())
                        .zip(fds.iter().copied()),
                );
                filters.extend(made);
            }
            WrapStep::StatusFd(target) => placed.extend(tool_status.map(|fd| (fd, *target))),
            WrapStep::CheckFound(found) => drop(reopen_found(found)?),
            WrapStep::BindFoundPrivately { binds, staging } => {
                bind_found_privately(binds, staging)?
            }
            WrapStep::FoundFds { found, first } => {
                let opened = reopen_found(found)?;
                placed.extend((*first..).zip(&opened).map(|(n, fd)| (fd.as_raw_fd(), n)));
                filters.extend(opened);
            }
            _ => {}
        }
    }
    layers.extend(wrap.layers.iter().copied());
    for note in &wrap.notes {
        send_setup(&SetupMessage::Warning(note.clone()));
    }
    let mut argv = wrap.wrapper_argv.clone();
    if !wrap.argv_in_files {
        argv.extend(spec.argv.iter().cloned());
    }
    let tool = wrap.wrapper_argv.first().ok_or_else(|| {
        SetupError::at(Step::Wrapper, "the wrapper has an empty command line")
            .of_kind(Kind::SpecInvalid)
    })?;
    finish_and_exec_with(spec, layers, || {
        sys::place_fds_inheritable(&placed).map_err(|e| {
            SetupError::at(
                Step::Wrapper,
                format!("cannot pass the seccomp filters to {tool}: {e}"),
            )
            .of_kind(Kind::InitFailed)
        })?;
        for step in &wrap.steps {
            match step {
                // Only speed depends on it: a tool started without it runs the same.
                WrapStep::PresizeFdTable => drop(hold_presized_fd_table()),
                WrapStep::GuardToolTree => split_off_guard(spec)?,
                _ => {}
            }
        }
        Ok(ToolExec {
            program: Path::new(tool).to_path_buf(),
            argv: argv.clone(),
            tool_env: tool_env(wrap),
        })
    })
}

/// The variables the plan sets for the tool alone ([`WrapStep::ToolEnv`]).
fn tool_env(wrap: &WrapSpec) -> Vec<(String, String)> {
    wrap.steps
        .iter()
        .filter_map(|step| match step {
            WrapStep::ToolEnv { name, value } => Some((name.clone(), value.clone())),
            _ => None,
        })
        .collect()
}

/// What protect_git found, opened again and checked to be the same objects.
fn reopen_found(found: &[crate::confine::found::Found]) -> Setup<Vec<OwnedFd>> {
    found
        .iter()
        .map(|one| {
            one.reopen().map_err(|e| {
                SetupError::at(
                    Step::Wrapper,
                    crate::confine::rootfs::RootfsError::Changed {
                        path: one.path.clone(),
                        source: e.into(),
                    }
                    .to_string(),
                )
                .of_kind(Kind::MountFailed)
            })
        })
        .collect()
}

/// In a mount namespace of the tool's own, protect_git's objects bound from checked
/// descriptors onto `staging` (see [`WrapStep::BindFoundPrivately`]); a changed object
/// refuses the run.
fn bind_found_privately(binds: &[GitBind], staging: &Path) -> Setup<()> {
    use crate::confine::rootfs::{bind_found_at, enter_private_mount_namespace, RootfsError};
    let failed =
        |e: RootfsError| SetupError::at(Step::Wrapper, e.to_string()).of_kind(Kind::MountFailed);
    enter_private_mount_namespace().map_err(failed)?;
    // Root's own, searchable by the runtime's mapped root: no other program writes here.
    std::fs::DirBuilder::new()
        .mode(0o711)
        .create(staging)
        .map_err(|e| {
            SetupError::at(
                Step::Wrapper,
                format!("cannot create {}: {e}", staging.display()),
            )
            .of_kind(Kind::MountFailed)
        })?;
    for (n, bind) in binds.iter().enumerate() {
        bind_found_at(&bind.found, bind.read_only, &staging.join(n.to_string())).map_err(failed)?;
    }
    Ok(())
}

/// The network namespace the tool will inherit, configured for the egress gate, whose
/// sockets are handed over before the channel is closed (the tool never holds it).
fn prepare_egress(spec: &InitSpec, gate: Option<&OwnedFd>, own_user_namespace: bool) -> Setup<()> {
    let (Some(plan), Some(gate)) = (&spec.egress, gate) else {
        return Err(SetupError::at(
            Step::Spec,
            "the plan prepares a network for the egress gate, but the run has no gate",
        )
        .of_kind(Kind::SpecInvalid));
    };
    super::egress::enter_namespace(own_user_namespace)?;
    super::egress::hand_over(plan, gate)?;
    let _ = nix::unistd::close(gate.as_raw_fd());
    Ok(())
}

/// RLIMIT_NPROC for the tool and the program, set inside a user namespace of the process's
/// own, so that it counts only the processes started in it (see
/// `WrapStep::ProcessCapInOwnUserNamespace`); the namespace is made here unless the egress
/// step made one already.
fn cap_processes_in_own_user_namespace(spec: &InitSpec, in_own_user_namespace: bool) -> Setup<()> {
    if !in_own_user_namespace {
        super::native::enter_user_namespace(nix::sched::CloneFlags::empty())?;
    }
    super::child::cap_processes_in_this_user_namespace(spec)
}

/// Leaves `/dev/null` open (read-only, inherited across exec) at a high descriptor, so that
/// the tool and every process it forks start with a large descriptor table.
///
/// Why: a forked child gets a copy of its parent's table sized to the highest open
/// descriptor, so the presizing `exec_argv` does for the tool itself would not reach its
/// children. runsc's sandbox and gofer, threaded Go processes with 150-290 descriptors each,
/// grew their tables twice a run, which cost 25-30 ms of a 150 ms `runsc run` here (see
/// [`super::child::presized_fd`]). gVisor never passes host descriptors to the program (the
/// attack suite's `read_inherited_fd` checks every descriptor up to 1023).
fn hold_presized_fd_table() -> std::io::Result<()> {
    let Some(highest) = super::child::presized_fd() else {
        return Ok(());
    };
    let null = std::fs::File::open("/dev/null")?;
    sys::place_fds_inheritable(&[(null.as_raw_fd(), highest)])
}

/// The guard's parent-death signal: the init's death must wake it, not kill it.
const INIT_GONE: Signal = Signal::SIGUSR1;
/// How long a guard whose init died keeps killing a tree that keeps forking.
const KILL_DEADLINE: Duration = Duration::from_secs(5);

/// Forks the tool off this process, which stays behind as the tool's guard; returns in the
/// tool's process only.
///
/// Why: podman's conmon daemonizes and the container is conmon's child, so no parent-death
/// signal reaches them, and once the init is gone (SIGKILLed with the supervisor) nothing
/// else would stop them. The guard is a child subreaper, so conmon and the container are
/// reparented to it instead of escaping; when the init dies the guard kills every process
/// under it (the container's PID 1 takes its whole PID namespace along) and removes the run
/// directory, which holds podman's state. It runs as host root outside the container's
/// namespaces: the program can neither see nor signal it. While the init lives, the guard
/// only mirrors the tool's exit (128+N for a signal, as the tools themselves report it), so
/// the init sees the same child, status and output pipes as without it.
fn split_off_guard(spec: &InitSpec) -> Setup<()> {
    let failed = |message: String| SetupError::at(Step::Wrapper, message).of_kind(Kind::InitFailed);
    let init = nix::unistd::getppid();
    // The init's SIGTERM on a stop is meant for the tool, which gets it too.
    let mut blocked = super::stop_signals();
    blocked.add(Signal::SIGCHLD);
    blocked.add(INIT_GONE);
    blocked
        .thread_block()
        .map_err(|e| failed(format!("cannot block the guard's signals: {e}")))?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| failed(format!("prctl(PR_SET_CHILD_SUBREAPER): {e}")))?;
    // Replaces the SIGKILL set for the init's death, with no moment when neither is set.
    nix::sys::prctl::set_pdeathsig(INIT_GONE)
        .map_err(|e| failed(format!("cannot set the guard's parent-death signal: {e}")))?;
    match sys::fork_single_threaded().map_err(|e| failed(format!("cannot fork the tool: {e}")))? {
        Forked::Parent(tool) => guard(spec, init, tool),
        // The signal mask is reset right before the exec.
        Forked::Child => nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
            .map_err(|e| failed(format!("cannot set the tool's parent-death signal: {e}"))),
    }
}

fn guard(spec: &InitSpec, init: Pid, tool: Pid) -> ! {
    // The setup pipe must reach EOF at the tool's exec, the program's output when it ends.
    let _ = sys::close_from(0);
    let waited: SigSet = [Signal::SIGCHLD, INIT_GONE].into_iter().collect();
    loop {
        match waited.wait() {
            Ok(Signal::SIGCHLD) => {
                if let Some(code) = reap_children(tool) {
                    sys::exit_now(code)
                }
            }
            Ok(_) if nix::unistd::getppid() != init => {
                kill_descendants();
                if !spec.keep {
                    crate::rundir::remove_tree(&spec.run_dir);
                }
                sys::exit_now(1)
            }
            _ => {}
        }
    }
}

/// Reaps every ended child; the tool's exit code once the tool is among them.
fn reap_children(tool: Pid) -> Option<i32> {
    let mut code = None;
    super::reap_ended_children(|status| match status {
        WaitStatus::Exited(pid, exit) if pid == tool => code = Some(exit),
        WaitStatus::Signaled(pid, signal, _) if pid == tool => code = Some(128 + signal as i32),
        _ => {}
    });
    code
}

/// SIGKILLs every descendant and reaps until no child is left: whatever a death orphans
/// comes back to the guard, so no child means no descendant.
fn kill_descendants() {
    let guard = nix::unistd::getpid();
    let deadline = Instant::now() + KILL_DEADLINE;
    while Instant::now() < deadline {
        tree::signal_descendants(guard, Signal::SIGKILL);
        if no_child_left() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn no_child_left() -> bool {
    super::reap_ended_children(|_| {})
}

/// The pipe a wrapped tool reports its status on, when it has one: (read end, write end).
pub(super) fn status_pipe(spec: &InitSpec) -> Setup<Option<(OwnedFd, OwnedFd)>> {
    match &spec.confinement {
        Confinement::Wrapped(wrap) if wrap.status_fd().is_some() => {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map(Some)
                .map_err(|e| SetupError::at(Step::Init, format!("pipe: {e}")))
        }
        _ => Ok(None),
    }
}

/// A program that "exited" while its tool never reported starting it never ran: the tool
/// failed setting up (bad mount source, no user namespaces, unknown option, a program that
/// does not exist). Say so, instead of passing the tool's exit code off as the program's.
/// The evidence is bwrap's status stream (`status`) or an OCI runtime's pid file and log.
pub(super) fn check_tool_ran_program(
    spec: &InitSpec,
    status: Option<OwnedFd>,
    outcome: &Outcome,
) -> Setup<()> {
    let Confinement::Wrapped(wrap) = &spec.confinement else {
        return Ok(());
    };
    if outcome.status != RunStatus::Exited {
        return Ok(());
    }
    let (tool, started) = match (status, wrap.start_evidence()) {
        (Some(status), _) => {
            let mut bytes = Vec::new();
            // Every writer is dead by now, so this reads to the end without blocking; a pipe
            // has no size to ask for first (see `read_to_end_unsized`).
            let _ = crate::linux::read_to_end_unsized(std::fs::File::from(status), &mut bytes);
            let text = String::from_utf8_lossy(&bytes);
            let tool = wrap.wrapper_argv.first().cloned().unwrap_or_default();
            (tool, tool_reported_exit(&text))
        }
        (None, Some(evidence)) => (evidence.tool.clone(), program_started(evidence)),
        (None, None) => return Ok(()),
    };
    if started {
        return Ok(());
    }
    Err(SetupError::at(
        Step::Wrapper,
        format!(
            "{tool} failed before the program started (exit code {}); its message is in the run's stderr",
            outcome.exit_code.unwrap_or(-1)
        ),
    ))
}

/// The tool is gone, so its pid file and log are complete: a pid file and no failure logged.
fn program_started(evidence: &StartEvidence) -> bool {
    let failed = evidence.failure_log.as_ref().is_some_and(|(log, marker)| {
        std::fs::read_to_string(log).is_ok_and(|text| text.contains(marker.as_str()))
    });
    evidence.pid_file.exists() && !failed
}

/// Whether bwrap's JSON status stream has the document it writes when the program exits.
pub(crate) fn tool_reported_exit(status: &str) -> bool {
    serde_json::Deserializer::from_str(status)
        .into_iter::<serde_json::Value>()
        .map_while(Result::ok)
        .any(|doc| doc.get("exit-code").is_some())
}

/// Our seccomp filters (the first `count`) as raw `struct sock_filter` arrays in memfds, for
/// `--add-seccomp-fd`: the ones compiled ahead, as they are, where there are some.
fn seccomp_descriptors(config: &SeccompConfig, count: usize) -> Setup<Vec<OwnedFd>> {
    let images =
        seccomp::filter_images(config).map_err(|e| SetupError::at(Step::Seccomp, e.to_string()))?;
    images
        .iter()
        .take(count)
        .map(|image| filter_memfd(image))
        .collect()
}

fn filter_memfd(image: &[u8]) -> Setup<OwnedFd> {
    let failed = |message: String| SetupError::at(Step::Seccomp, message);
    let fd = nix::sys::memfd::memfd_create(
        c"airlock-seccomp",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(|e| failed(format!("memfd_create: {e}")))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(image)
        .map_err(|e| failed(format!("cannot write the seccomp filter: {e}")))?;
    nix::unistd::lseek(file.as_raw_fd(), 0, nix::unistd::Whence::SeekSet)
        .map_err(|e| failed(format!("lseek: {e}")))?;
    Ok(OwnedFd::from(file))
}

/// Removes the empty directories a tool may leave. Returns warnings for what could not be
/// removed.
pub(super) fn clean_up_after_tool(wrap: &WrapSpec) -> Vec<String> {
    let mut warnings = Vec::new();
    let dirs = wrap.steps.iter().filter_map(|step| match step {
        WrapStep::RemoveDir(dir) => Some(dir),
        _ => None,
    });
    for dir in dirs {
        match std::fs::remove_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // A parent shared with other runs is still in use: that is theirs to remove.
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    || e.raw_os_error() == Some(libc::ENOTEMPTY) => {}
            Err(e) => warnings.push(format!(
                "cannot remove {} left by the sandbox tool: {e}",
                dir.display()
            )),
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::{program_started, tool_reported_exit, StartEvidence};

    #[test]
    fn an_oci_runtime_started_the_program_only_with_a_pid_file_and_no_failure_logged() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runsc.log");
        let evidence = StartEvidence {
            tool: "runsc".into(),
            pid_file: dir.path().join("pid"),
            failure_log: Some((log.clone(), "running container: ".into())),
        };
        assert!(!program_started(&evidence), "no pid file");
        std::fs::write(&evidence.pid_file, "42").unwrap();
        assert!(program_started(&evidence), "no log at all");
        std::fs::write(&log, "").unwrap();
        assert!(program_started(&evidence), "an empty log");
        std::fs::write(
            &log,
            r#"{"msg":"running container: starting container: x","level":"error"}"#,
        )
        .unwrap();
        assert!(
            !program_started(&evidence),
            "the run command failed after the pid file"
        );
    }

    #[test]
    fn only_an_exit_document_means_the_program_ran() {
        let started = r#"{ "child-pid": 25144, "pid-namespace": 4026532254 }"#;
        assert!(!tool_reported_exit(""));
        assert!(!tool_reported_exit(started));
        assert!(tool_reported_exit(&format!(
            "{started}\n{{ \"exit-code\": 1 }}"
        )));
        assert!(!tool_reported_exit(&format!("{started}\n{{ \"exit-co")));
    }
}

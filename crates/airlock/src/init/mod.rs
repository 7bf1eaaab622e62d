//! The init: one per run, single-threaded, so it can fork freely. A single-threaded supervisor
//! (the CLI) forks it with the run's spec in memory; a threaded one (a library caller, the
//! pool) executes the airlock binary as `airlock __init` and sends the spec on the control
//! pipe (see `supervisor::launch`). It creates the run's directory and cgroup, forks the
//! child that hardens itself and execs the program, then watches: wall clock, CPU time,
//! cancellation, the supervisor's death. At the end it kills every process the run left,
//! removes what it created and reports one `Outcome`.
//!
//! Descriptors: 3 is the control pipe from the supervisor (the spec, unless the supervisor
//! forked the init with it in memory, then stop requests; EOF means the supervisor died), 4 is
//! the event pipe to the supervisor (one JSON line each).

mod cgroup_handoff;
mod child;
mod egress;
mod native;
mod prepared_cpu;
mod quiet;
mod run;
pub(crate) mod shared_root;
mod spawner;
mod standby;
mod status;
mod watch;
mod wrapped;
pub(crate) mod zygote;

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::WaitStatus;
use serde::{Deserialize, Serialize};

use crate::error::{SetupError, SetupErrorKind as Kind, SetupStep as Step};
use crate::linux::sys::{self, Forked};
use crate::spec::{Confinement, InitEvent, InitSpec, WrapStep, CONTROL_FD, EVENTS_FD};
use run::PreparedRun;

/// A setup step's outcome.
type Setup<T> = Result<T, SetupError>;

pub use child::resolve_program;
pub(crate) use child::SetupMessage;

/// The argument that makes the airlock binary act as the init.
pub const INIT_ARG: &str = "__init";

/// Runs the init and exits. Call this first thing in `main` when `argv[1] == INIT_ARG`,
/// before any thread is started.
pub fn init_main() -> ! {
    if std::env::args_os()
        .nth(2)
        .is_some_and(|arg| arg == crate::spec::SPAWNER_ARG)
    {
        spawner::serve()
    }
    if std::env::args_os()
        .nth(2)
        .is_some_and(|arg| arg == crate::spec::SHARED_ROOT_ARG)
    {
        shared_root::serve()
    }
    init_main_with(None)
}

/// Runs the init with `spec` when the supervisor forked it (the spec is already in memory),
/// or with the spec read from the control pipe, and exits.
pub(crate) fn init_main_with(spec: Option<&InitSpec>) -> ! {
    // Owned here until the process exits: closed any earlier, the supervisor's stop requests
    // would fail.
    let mut control = sys::claim_inherited_fd(CONTROL_FD).map(std::fs::File::from);
    let result = match &mut control {
        Ok(control) => run_init(spec, control),
        Err(e) => Err(SetupError::at(
            Step::Init,
            format!("cannot take the control pipe: {e}"),
        )),
    };
    let code = match result {
        Ok(()) => 0,
        Err(error) => {
            send_event(&InitEvent::SetupFailed { error });
            1
        }
    };
    sys::exit_now(code)
}

fn run_init(given: Option<&InitSpec>, control: &mut std::fs::File) -> Setup<()> {
    let failed = |message: String| SetupError::at(Step::Init, message);
    // The program may run as our own uid (Tier 0 without root): make our /proc entries
    // root-owned so it cannot open our descriptors and forge events.
    nix::sys::prctl::set_dumpable(false)
        .map_err(|e| failed(format!("prctl(PR_SET_DUMPABLE): {e}")))?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| failed(format!("prctl(PR_SET_CHILD_SUBREAPER): {e}")))?;
    let read;
    let spec = match given {
        Some(spec) => spec,
        None => {
            read = read_spec(control)?;
            &read
        }
    };
    let mut run = PreparedRun::create(spec)?;
    let result = watch::supervise(spec, &mut run, control);
    let cleanup_warnings = run.cleanup(spec);
    // None: a warm run's outcome went out before the teardown.
    if let Some(mut outcome) = result? {
        outcome.warnings.extend(cleanup_warnings);
        send_event(&InitEvent::Finished(outcome));
    }
    Ok(())
}

fn read_spec(control: &mut std::fs::File) -> Setup<InitSpec> {
    let invalid = |message: String| SetupError::at(Step::Spec, message);
    let mut header = [0u8; 8];
    control
        .read_exact(&mut header)
        .map_err(|e| invalid(format!("cannot read the run spec: {e}")))?;
    let len = u64::from_le_bytes(header);
    if len > 64 << 20 {
        return Err(invalid(format!("run spec of {len} bytes is too large")));
    }
    let mut body = vec![0u8; len as usize];
    control
        .read_exact(&mut body)
        .map_err(|e| invalid(format!("cannot read the run spec: {e}")))?;
    serde_json::from_slice(&body).map_err(|e| invalid(format!("malformed run spec: {e}")))
}

/// The signals that ask a process to stop gracefully (the init's SIGTERM to the whole tree,
/// and their terminal and hang-up cousins).
fn stop_signals() -> SigSet {
    [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ]
    .into_iter()
    .collect()
}

/// Reaps every child that has ended, handing each status to `on_reaped`; true when the
/// process has no child left at all.
fn reap_ended_children(mut on_reaped: impl FnMut(WaitStatus)) -> bool {
    use nix::sys::wait::{waitpid, WaitPidFlag};
    loop {
        match waitpid(None::<nix::unistd::Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return false,
            Ok(status) => on_reaped(status),
            Err(_) => return true,
        }
    }
}

/// Writes one event line to the supervisor. If the supervisor is gone there is nobody to tell.
pub(crate) fn send_event(event: &InitEvent) {
    if let Ok(mut line) = serde_json::to_vec(event) {
        line.push(b'\n');
        let _ = sys::write_all_to_fd(EVENTS_FD, &line);
    }
}

/// The program's own exit, as seen by whoever reaped it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ExitReport {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub file_size_hit: bool,
    /// The CPU time and largest resident size of the processes the native sandbox's PID 1
    /// reaped (the program and its descendants), which a warm run reports instead of the
    /// init's own children's (they include the sandbox's preparation).
    #[serde(default)]
    pub children_usage: Option<ChildrenUsage>,
}

/// `getrusage(RUSAGE_CHILDREN)` of the process that reaped the run's processes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ChildrenUsage {
    pub user_ms: u64,
    pub sys_ms: u64,
    pub max_rss_bytes: u64,
}

impl ChildrenUsage {
    pub fn now() -> Option<ChildrenUsage> {
        ChildrenUsage::now_less(prepared_cpu::CpuSpent::default())
    }

    /// What the reaped processes used beyond `before` (a started interpreter's preparation).
    fn now_less(before: prepared_cpu::CpuSpent) -> Option<ChildrenUsage> {
        use nix::sys::resource::{getrusage, UsageWho};
        let usage = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
        let duration = |tv: nix::sys::time::TimeVal| {
            Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
        };
        let millis = |spent: Duration| spent.as_millis() as u64;
        Some(ChildrenUsage {
            user_ms: millis(duration(usage.user_time()).saturating_sub(before.user)),
            sys_ms: millis(duration(usage.system_time()).saturating_sub(before.sys)),
            max_rss_bytes: usage.max_rss() as u64 * 1024,
        })
    }
}

impl ExitReport {
    pub fn from_status(status: WaitStatus, file_size_hit: bool) -> ExitReport {
        match status {
            WaitStatus::Exited(_, code) => ExitReport {
                exit_code: Some(code),
                file_size_hit,
                ..ExitReport::default()
            },
            WaitStatus::Signaled(_, signal, _) => ExitReport {
                signal: Some(signal as i32),
                file_size_hit,
                ..ExitReport::default()
            },
            _ => ExitReport {
                file_size_hit,
                ..ExitReport::default()
            },
        }
    }

    pub fn send(&self, fd: RawFd) {
        if let Ok(bytes) = serde_json::to_vec(self) {
            let _ = sys::write_all_to_fd(fd, &bytes);
        }
    }
}

/// Whether the way the program ended calls for [`any_file_at_least`]: a program that hit the
/// file-size limit either died of SIGXFSZ (which decides the status by itself) or, ignoring
/// the signal, saw EFBIG and failed (a non-zero status, or a signal it raised). A clean exit
/// 0 is a success whatever it wrote, and needs no walk of the workspace (up to 20,000
/// entries: ~37 ms in a 52,575-entry repository).
pub(crate) fn may_have_hit_file_size(status: &WaitStatus) -> bool {
    !matches!(
        status,
        WaitStatus::Exited(_, 0) | WaitStatus::Signaled(_, nix::sys::signal::Signal::SIGXFSZ, _)
    )
}

/// The file-size evidence of a Tier 0 or wrapped run (the native PID 1 looks itself, and
/// reports it): the workdir and the run's tmp, when the program's end suggests a hit.
pub(crate) fn file_size_hit_outside(spec: &InitSpec, end: Option<&WaitStatus>) -> bool {
    let native = matches!(spec.confinement, crate::spec::Confinement::Native(_));
    if native || !end.is_some_and(may_have_hit_file_size) {
        return false;
    }
    let dirs = [spec.workdir.clone(), crate::rundir::tmp_dir(&spec.run_dir)];
    any_file_at_least(&dirs, spec.limits.file_size_bytes)
}

/// Whether any regular file under `dirs` is at least `size` bytes (bounded walk, no symlinks).
pub(crate) fn any_file_at_least(dirs: &[PathBuf], size: u64) -> bool {
    let mut budget = 20_000usize;
    let mut stack: Vec<(PathBuf, u32)> = dirs.iter().map(|d| (d.clone(), 0)).collect();
    while let Some((dir, depth)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                return false;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_file() && meta.len() >= size {
                return true;
            }
            if meta.is_dir() && depth < 32 {
                stack.push((entry.path(), depth + 1));
            }
        }
    }
    false
}

/// Starts the child that becomes the program, with its pipes at the numbers of `spec::fds`
/// (setup, exit report, and the gate's channel, a tool's status, a warm run's command pipe and
/// shared root, or the cgroup hand-off when the run has them); every other inherited descriptor is closed.
///
/// A child that ends in its exec (Tier 0, a wrapping tool without a guard) shares the init's
/// memory until then ([`sys::spawn_sharing_memory`]): the init waits meanwhile, which costs it
/// nothing (it has nothing to do before the child's setup reports), and no page table is
/// copied for the child, no page copied on its writes, none torn down at its exec (~0.5 ms of
/// CPU a run). A native run's child stays (it becomes the sandbox's PID 1) while the init
/// makes the cgroup, and a guarded tool's child stays as the guard: both are forked.
///
/// The cost of sharing: the init's clocks wait with it. The child's setup is local (cgroup
/// join, rlimits, ids, memfds, `chdir`), but a workdir on a filesystem that stops answering
/// would hold the init, and so the wall-clock kill, until the `chdir` returns; a forked child
/// would be killed on time. The caller's workdir is the caller's, so that is accepted.
pub(crate) fn fork_child(
    spec: &InitSpec,
    run: &PreparedRun,
    setup: &OwnedFd,
    report: &OwnedFd,
    tool_status: Option<RawFd>,
    warm: &[(RawFd, RawFd)],
    cgroup_handoff: Option<RawFd>,
) -> Setup<nix::unistd::Pid> {
    let init_pid = nix::unistd::getpid();
    let child = || -> ! {
        let mut keep = vec![
            (setup.as_raw_fd(), child::SETUP_FD),
            (report.as_raw_fd(), child::REPORT_FD),
        ];
        keep.extend(run.gate.as_ref().map(|fd| (fd.as_raw_fd(), child::GATE_FD)));
        keep.extend(tool_status.map(|fd| (fd, child::TOOL_STATUS_FD)));
        keep.extend_from_slice(warm);
        keep.extend(cgroup_handoff.map(|fd| (fd, crate::spec::fds::CGROUP_HANDOFF_FD)));
        // Closes every other descriptor, the gaps between these included.
        if sys::place_fds(&keep).is_err() {
            sys::exit_now(125);
        }
        let ctx = child::ChildContext {
            init_pid,
            cgroup: run.cgroup.as_ref(),
            tool_status: tool_status.map(|_| child::TOOL_STATUS_FD),
            gate: run.gate.as_ref(),
            cgroup_handoff: cgroup_handoff.is_some(),
        };
        child::run_child(spec, &ctx)
    };
    let failed = |e: std::io::Error| SetupError::at(Step::Init, format!("cannot fork: {e}"));
    if child_execs_at_once(spec, run) {
        return sys::spawn_sharing_memory(&mut || child()).map_err(failed);
    }
    match sys::fork_single_threaded().map_err(failed)? {
        Forked::Parent(pid) => Ok(pid),
        Forked::Child => child(),
    }
}

/// Whether the run's child does nothing after its setup but exec (see [`fork_child`]), and
/// nothing during it that would reach the init through the memory they share: a child that
/// maps its own ids in a new user namespace makes the memory dumpable for a moment
/// (`native::map_own_ids`), which would make the init's /proc entries its own too.
fn child_execs_at_once(spec: &InitSpec, run: &PreparedRun) -> bool {
    let Confinement::Wrapped(wrap) = &spec.confinement else {
        return matches!(spec.confinement, Confinement::Tier0);
    };
    let maps_own_ids = wrap.steps.iter().any(|step| match step {
        WrapStep::EgressNamespace { own_user_namespace } => *own_user_namespace,
        WrapStep::ProcessCapInOwnUserNamespace => run.cgroup.is_none(),
        _ => false,
    });
    !maps_own_ids && !wrap.has(&WrapStep::GuardToolTree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_size_evidence_is_found_only_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/big"), vec![0u8; 4096]).unwrap();
        let dirs = vec![dir.path().to_path_buf()];
        assert!(any_file_at_least(&dirs, 4096));
        assert!(!any_file_at_least(&dirs, 4097));
    }

    #[test]
    fn exit_report_keeps_code_or_signal() {
        let pid = nix::unistd::Pid::from_raw(1);
        assert_eq!(
            ExitReport::from_status(WaitStatus::Exited(pid, 3), false).exit_code,
            Some(3)
        );
        let killed =
            ExitReport::from_status(WaitStatus::Signaled(pid, Signal::SIGKILL, false), true);
        assert_eq!((killed.signal, killed.file_size_hit), (Some(9), true));
    }

    #[test]
    fn only_a_failed_end_calls_for_the_file_size_walk() {
        let pid = nix::unistd::Pid::from_raw(1);
        assert!(!may_have_hit_file_size(&WaitStatus::Exited(pid, 0)));
        assert!(may_have_hit_file_size(&WaitStatus::Exited(pid, 1)));
        let signaled = |s| WaitStatus::Signaled(pid, s, false);
        assert!(!may_have_hit_file_size(&signaled(Signal::SIGXFSZ)));
        assert!(may_have_hit_file_size(&signaled(Signal::SIGKILL)));
    }
}

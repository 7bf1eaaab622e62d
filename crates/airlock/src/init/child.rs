//! The child side of a run: Tier 0 hardening in the order that keeps each step possible, then
//! either exec (Tier 0) or the native sandbox. Runs in a forked copy of the single-threaded
//! init, so a failure is reported on the setup pipe and ends this process only.

use std::convert::Infallible;
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::{Gid, Pid, Uid};
use serde::{Deserialize, Serialize};

use super::{Kind, Setup, Step};
use crate::confine::cgroup::{CgroupVersion, RunCgroup};
use crate::confine::Credentials;
use crate::error::SetupError;
use crate::layer::Layer;
use crate::linux::sys;
use crate::plan::Verdict;
use crate::spec::{Confinement, InitSpec, WrapStep};

use crate::spec::fds::PRESIZED_FD;
pub(super) use crate::spec::fds::{GATE_FD, REPORT_FD, SETUP_FD, TOOL_STATUS_FD};

/// One line on the setup pipe.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SetupMessage {
    Layers(Vec<Layer>),
    Warning(String),
    Error(SetupError),
    /// A warm sandbox's PID 1 is set up and waits for its command.
    Ready,
}

/// What the child needs from the init besides the spec.
pub(super) struct ChildContext<'a> {
    pub init_pid: Pid,
    pub cgroup: Option<&'a RunCgroup>,
    /// The write end of a wrapped tool's status pipe, placed at the tool's `status_fd`.
    pub tool_status: Option<RawFd>,
    /// The egress gate's channel, at [`GATE_FD`], for a run with `InitSpec::egress`.
    pub gate: Option<&'a OwnedFd>,
    /// The init makes the run's cgroup meanwhile, and hands it over (a native run: see
    /// `init::cgroup_handoff`).
    pub cgroup_handoff: bool,
}

/// Entry point of the forked child; never returns.
pub(super) fn run_child(spec: &InitSpec, ctx: &ChildContext) -> ! {
    let error = match prepare_and_exec(spec, ctx) {
        Ok(never) => match never {},
        Err(error) => error,
    };
    send_setup(&SetupMessage::Error(error));
    sys::exit_now(126)
}

/// Writes one message to the setup pipe. A failure to report is not recoverable here.
pub(super) fn send_setup(message: &SetupMessage) {
    if let Ok(mut line) = serde_json::to_vec(message) {
        line.push(b'\n');
        let _ = sys::write_all_to_fd(SETUP_FD, &line);
    }
}

fn prepare_and_exec(spec: &InitSpec, ctx: &ChildContext) -> Setup<Infallible> {
    SigSet::all()
        .thread_unblock()
        .map_err(|e| SetupError::at(Step::Init, format!("cannot reset the signal mask: {e}")))?;
    let mut layers = vec![Layer::EnvScrub, Layer::FdClose, Layer::TreeKill];
    if let Some(cgroup) = ctx.cgroup {
        join_cgroup(cgroup)?;
        layers.push(Layer::Cgroup);
    }
    // With a terminal, it is the program's own (see `supervisor::terminal`): a new session
    // either way. The native sandbox's PID 1 takes the terminal itself, in the PID namespace
    // where the shell's job control can see its process group.
    let native = matches!(spec.confinement, Confinement::Native(_));
    new_session(spec.tty && !native)?;
    layers.push(Layer::NewSession);
    let rlimits_by_tool =
        matches!(&spec.confinement, Confinement::Wrapped(w) if w.has(&WrapStep::RlimitsByTool));
    let has_cgroup = ctx.cgroup.is_some();
    // A cgroup still to come spares RLIMIT_AS; without one, the native sandbox sets it then.
    apply_rlimits(spec, has_cgroup || ctx.cgroup_handoff, rlimits_by_tool)?;
    layers.push(Layer::Rlimits);
    if let (Some(credentials), false) = (spec.credentials, wrap_keeps_root(spec)) {
        drop_root(credentials)?;
        layers.push(Layer::UidDrop);
    }
    // After the uid change: a credential change clears the parent-death signal.
    die_with_init(ctx.init_pid)?;
    match &spec.confinement {
        Confinement::Tier0 => {
            nix::sys::prctl::set_no_new_privs().map_err(|e| {
                SetupError::at(Step::Privileges, format!("cannot set no_new_privs: {e}"))
            })?;
            layers.extend([Layer::NoNewPrivs, Layer::Workdir]);
            let capped_workdir = spec
                .scratch
                .as_ref()
                .and_then(|s| s.mount_at(&spec.workdir));
            if capped_workdir.is_some() {
                layers.extend([Layer::DiskQuota, Layer::InodeQuota]);
            }
            finish_and_exec(spec, layers)
        }
        Confinement::Native(native) => {
            super::native::enter(spec, native, layers, ctx.gate, ctx.cgroup_handoff)
        }
        Confinement::Wrapped(wrap) => super::wrapped::exec(spec, wrap, layers, ctx),
    }
}

/// Moves this process into the run's cgroup. On cgroup v1 a write to `cgroup.procs` takes the
/// kernel's global threadgroup rwsem for writing, which waits for an RCU grace period (a 16 ms
/// median on a 2-core VM, see bench/cgroup_join.py); writing "0" to `tasks` moves only the
/// calling thread and takes no such lock (0.7 ms). This process was forked from the single-threaded init, so its one
/// thread is the whole process and every later thread or child inherits the membership.
/// Anything else (cgroup v2, a fixture tree without `tasks`) joins through `cgroup.procs`.
fn join_cgroup(cgroup: &RunCgroup) -> Setup<()> {
    if cgroup.version() == CgroupVersion::V1 && join_v1_as_thread(cgroup).is_ok() {
        return Ok(());
    }
    cgroup
        .join_self()
        .map_err(|e| SetupError::at(Step::Cgroup, format!("cannot join the run's cgroup: {e}")))
}

fn join_v1_as_thread(cgroup: &RunCgroup) -> std::io::Result<()> {
    for procs in cgroup.join_paths() {
        let tasks = procs.with_file_name("tasks");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&tasks)?
            .write_all(b"0")?;
    }
    Ok(())
}

/// A new session; with `tty`, the terminal on stdin becomes its controlling terminal.
pub(super) fn new_session(tty: bool) -> Setup<()> {
    let failed = |message: String| SetupError::at(Step::Session, message);
    nix::unistd::setsid().map_err(|e| failed(format!("setsid failed: {e}")))?;
    if tty {
        sys::set_controlling_tty(0).map_err(|e| {
            failed(format!(
                "cannot make the program's terminal its controlling terminal: {e}"
            ))
        })?;
    }
    Ok(())
}

/// The rlimits of Tier 0 and of every backend. Without a cgroup the process count falls back
/// to RLIMIT_NPROC, which counts every process of the uid in the user namespace where it was
/// set: the native sandbox sets it inside its own (see `native::enter`), so that concurrent
/// runs, all as the sandbox user, do not count against each other's limit.
pub(super) fn apply_rlimits(spec: &InitSpec, has_cgroup: bool, rlimits_by_tool: bool) -> Setup<()> {
    let l = &spec.limits;
    let cpu = l.cpu_time.as_secs().max(1);
    let mut limits = vec![
        (Resource::RLIMIT_CORE, 0, 0),
        (Resource::RLIMIT_CPU, cpu, cpu + 1),
    ];
    // A tool that applies the program's rlimits itself may need more descriptors (runsc fails
    // below ~512) or a larger file than the program gets.
    if rlimits_by_tool {
        return limits
            .into_iter()
            .try_for_each(|(resource, soft, hard)| lower_rlimit(resource, soft, hard));
    }
    limits.push((Resource::RLIMIT_NOFILE, l.open_files, l.open_files));
    limits.push((Resource::RLIMIT_FSIZE, l.file_size_bytes, l.file_size_bytes));
    // A cgroup limits the whole run precisely; rlimits are the per-process fallback. Address
    // space limits break runtimes that reserve big virtual ranges (node, Go), so only fall
    // back to them when nothing better exists.
    if !has_cgroup {
        limits.push((Resource::RLIMIT_AS, l.memory_bytes, l.memory_bytes));
    }
    // Without a cgroup the process cap is RLIMIT_NPROC; the native sandbox sets it in its own
    // user namespace (`native::enter`), and so does a tool that takes the step
    // (`init::wrapped`).
    let processes = match &spec.confinement {
        Confinement::Tier0 if !has_cgroup => Some(
            l.processes
                .saturating_add(tier0_tasks_already_running(spec)),
        ),
        Confinement::Wrapped(w)
            if !has_cgroup && !w.has(&WrapStep::ProcessCapInOwnUserNamespace) =>
        {
            Some(l.processes)
        }
        _ => None,
    };
    if let Some(processes) = processes {
        limits.push((Resource::RLIMIT_NPROC, processes, processes));
    }
    for (resource, soft, hard) in limits {
        lower_rlimit(resource, soft, hard)?;
    }
    Ok(())
}

/// Tier 0's RLIMIT_NPROC, set on the host, counts every task of the program's uid there, other
/// runs' and the caller's own included (a desktop user has hundreds). Its cap is meant to be
/// the run's own `processes`, so the tasks that uid already has are added as headroom: a fork
/// bomb stays bounded, and a busy host no longer makes an unrelated run fail with EAGAIN.
/// Wrapping tools keep the exact cap: the attack suite holds them to it, and their programs
/// run in a user namespace of the tool's, where the cap belongs (not done yet, see
/// docs/attacks.md).
fn tier0_tasks_already_running(spec: &InitSpec) -> u64 {
    let uid = spec.credentials.map_or_else(
        || nix::unistd::getuid().as_raw(),
        |credentials| credentials.uid,
    );
    crate::linux::tree::tasks_of_real_uid(uid)
}

fn wrap_keeps_root(spec: &InitSpec) -> bool {
    matches!(&spec.confinement, Confinement::Wrapped(w) if w.has(&WrapStep::KeepRoot))
}

/// The process cap as RLIMIT_NPROC, for a process that has just entered a user namespace of
/// its own (created before the limit was lowered), where it counts only that namespace's
/// processes: the native sandbox's and a wrapping tool's without a cgroup.
pub(super) fn cap_processes_in_this_user_namespace(spec: &InitSpec) -> Setup<()> {
    let processes = spec.limits.processes;
    lower_rlimit(Resource::RLIMIT_NPROC, processes, processes)
}

/// The limits of a native run without a cgroup, set in its own user namespace: the process
/// cap ([`cap_processes_in_this_user_namespace`]) and the address space (`apply_rlimits`
/// leaves it out while a cgroup may still come; lowering it again is harmless).
pub(super) fn fall_back_to_rlimits(spec: &InitSpec) -> Setup<()> {
    cap_processes_in_this_user_namespace(spec)?;
    let memory = spec.limits.memory_bytes;
    lower_rlimit(Resource::RLIMIT_AS, memory, memory)
}

/// Sets a limit, never above the current hard limit (raising needs CAP_SYS_RESOURCE).
pub(super) fn lower_rlimit(resource: Resource, soft: u64, hard: u64) -> Setup<()> {
    let failed = |message: String| SetupError::at(Step::Rlimits, message);
    let (_, current_hard) = nix::sys::resource::getrlimit(resource)
        .map_err(|e| failed(format!("getrlimit {resource:?}: {e}")))?;
    let hard = hard.min(current_hard);
    setrlimit(resource, soft.min(hard), hard)
        .map_err(|e| failed(format!("cannot set {resource:?} to {soft}: {e}")))
}

pub(crate) fn drop_root(credentials: Credentials) -> Setup<()> {
    let failed = |message: String| SetupError::at(Step::Credentials, message);
    let gid = Gid::from_raw(credentials.gid);
    let uid = Uid::from_raw(credentials.uid);
    nix::unistd::setgroups(&[gid]).map_err(|e| failed(format!("setgroups failed: {e}")))?;
    nix::unistd::setresgid(gid, gid, gid)
        .map_err(|e| failed(format!("cannot switch to gid {gid}: {e}")))?;
    nix::unistd::setresuid(uid, uid, uid)
        .map_err(|e| failed(format!("cannot switch to uid {uid}: {e}")))
}

fn die_with_init(init_pid: Pid) -> Setup<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| {
        SetupError::at(
            Step::Init,
            format!("cannot set the parent-death signal: {e}"),
        )
    })?;
    if nix::unistd::getppid() != init_pid {
        return Err(SetupError::at(
            Step::Init,
            "the airlock init exited during setup",
        ));
    }
    Ok(())
}

/// Checks the required layers, reports the layers in force and execs the program.
pub(super) fn finish_and_exec(spec: &InitSpec, layers: Vec<Layer>) -> Setup<Infallible> {
    check_required(spec, &layers)?;
    close_inherited()?;
    send_setup(&SetupMessage::Layers(layers));
    exec_program(spec)
}

/// What a wrapper tool is executed as: the program's environment plus `tool_env`.
pub(super) struct ToolExec {
    pub program: PathBuf,
    pub argv: Vec<String>,
    /// Variables for the tool alone (never for a tool that passes its environment on to
    /// the program).
    pub tool_env: Vec<(String, String)>,
}

/// Like [`finish_and_exec`] for a wrapper tool: `prepare` runs after inherited descriptors
/// are marked close-on-exec (so it can place the few the tool needs) and names what to exec.
pub(super) fn finish_and_exec_with(
    spec: &InitSpec,
    layers: Vec<Layer>,
    prepare: impl FnOnce() -> Setup<ToolExec>,
) -> Setup<Infallible> {
    check_required(spec, &layers)?;
    close_inherited()?;
    let tool = prepare()?;
    send_setup(&SetupMessage::Layers(layers));
    enter_workdir(spec)?;
    let mut env = spec.env.clone();
    env.extend(tool.tool_env);
    exec_argv(&tool.program, &tool.argv, &env)
}

fn close_inherited() -> Setup<()> {
    sys::cloexec_from(SETUP_FD).map_err(|e| {
        SetupError::at(
            Step::Exec,
            format!("cannot close inherited descriptors: {e}"),
        )
        .of_kind(Kind::InitFailed)
    })
}

fn enter_workdir(spec: &InitSpec) -> Setup<()> {
    nix::unistd::chdir(&spec.workdir).map_err(|e| {
        SetupError::at(
            Step::Exec,
            format!("cannot enter the workdir {}: {e}", spec.workdir.display()),
        )
    })
}

/// The layers really in force, judged by the same rule as the plan (see
/// [`crate::plan::judge`]): the host may have changed since it was probed.
pub(super) fn check_required(spec: &InitSpec, layers: &[Layer]) -> Setup<()> {
    let (missing, verdict) = crate::plan::judge(&spec.require, layers, spec.allow_degraded);
    match verdict {
        Verdict::Runs => Ok(()),
        Verdict::Refused => Err(SetupError::at(
            Step::Exec,
            format!(
                "required layers are not in force: {}; fix the host (see `airlock doctor`) or pass --allow-degraded",
                crate::layer::names(&missing)
            ),
        )
        .of_kind(Kind::LayersMissing)
        .with_fix("fix the host (see `airlock doctor`) or pass --allow-degraded")),
        Verdict::RunsDegraded => {
            // The supervisor already reported, with the reason, what it knew would be missing.
            let unreported: Vec<Layer> = missing
                .into_iter()
                .filter(|l| !spec.accepted_missing.contains(l))
                .collect();
            if !unreported.is_empty() {
                send_setup(&SetupMessage::Warning(format!(
                    "degraded: required layers not in force: {}",
                    crate::layer::names(&unreported)
                )));
            }
            Ok(())
        }
    }
}

/// Resolves argv[0] against the program's own PATH and execs it with the scrubbed environment.
pub(super) fn exec_program(spec: &InitSpec) -> Setup<Infallible> {
    enter_workdir(spec)?;
    let program = resolve_program(&spec.argv[0], path_of(&spec.env))
        .map_err(|message| SetupError::at(Step::Exec, message).of_kind(Kind::ProgramNotFound))?;
    exec_argv(&program, &spec.argv, &spec.env)
}

/// Execs `program` with `argv` and exactly the environment `env`.
pub(super) fn exec_argv(
    program: &Path,
    argv: &[String],
    env: &[(String, String)],
) -> Setup<Infallible> {
    let invalid = |e: &dyn std::fmt::Display| SetupError::at(Step::Exec, e.to_string());
    let argv = sys::c_strings(argv).map_err(|e| invalid(&e))?;
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let env = sys::c_strings(&env).map_err(|e| invalid(&e))?;
    let path = CString::new(program.as_os_str().as_encoded_bytes()).map_err(|e| invalid(&e))?;
    SigSet::all()
        .thread_unblock()
        .map_err(|e| SetupError::at(Step::Init, format!("cannot reset the signal mask: {e}")))?;
    sys::default_all_signal_actions();
    presize_fd_table();
    let error = nix::unistd::execve(&path, &argv, &env).unwrap_err();
    let kind = match error {
        nix::errno::Errno::ENOENT => Kind::ProgramNotFound,
        nix::errno::Errno::EACCES | nix::errno::Errno::EPERM => Kind::PermissionDeniedExec,
        _ => Kind::ExecFailed,
    };
    Err(SetupError::at(
        Step::Exec,
        format!("cannot execute {}: {error}", program.display()),
    )
    .of_kind(kind))
}

/// The highest descriptor a presized table holds: 1024 slots (8 KiB), or as many as the
/// process may open. None when that is no more than the 64 every table starts with.
///
/// Why presize: a descriptor table only grows, and growing one that threads share waits for
/// an RCU grace period first (`expand_fdtable`). On our 2-core VM that is 8-30 ms per growth
/// while another thread is running: a threaded program opening 200 descriptors took 14-22
/// ms under airlock against 0.3 ms with a presized table.
pub(super) fn presized_fd() -> Option<RawFd> {
    let (soft, _) = nix::sys::resource::getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let limit = RawFd::try_from(soft).unwrap_or(RawFd::MAX);
    let highest = PRESIZED_FD.min(limit.saturating_sub(1));
    (highest >= 64).then_some(highest)
}

/// Grows this (single-threaded) process's descriptor table, which the program keeps across
/// exec, and leaves no descriptor behind. Only speed depends on it.
fn presize_fd_table() {
    let Some(highest) = presized_fd() else {
        return;
    };
    if let Ok(copy) = nix::fcntl::fcntl(2, nix::fcntl::FcntlArg::F_DUPFD(highest)) {
        let _ = nix::unistd::close(copy);
    }
}

fn path_of(env: &[(String, String)]) -> &str {
    env.iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin")
}

/// Finds `name` like a shell would: as given when it contains a slash, else in each PATH entry.
pub fn resolve_program(name: &str, path: &str) -> Result<PathBuf, String> {
    if name.is_empty() {
        return Err("the program name is empty".to_string());
    }
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| format!("program {name:?} not found in PATH={path} inside the sandbox (expose it with a read_only path or use an absolute path)"))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_resolve_through_path() {
        assert_eq!(
            resolve_program("sh", "/nonexistent:/bin").unwrap(),
            PathBuf::from("/bin/sh")
        );
        assert_eq!(
            resolve_program("./x", "/bin").unwrap(),
            PathBuf::from("./x")
        );
        let err = resolve_program("no-such-program-xyz", "/bin").unwrap_err();
        assert!(
            err.contains("no-such-program-xyz") && err.contains("PATH=/bin"),
            "{err}"
        );
    }
}

//! A run forked from an interpreter zygote (see `crate::zygote`), the confinement half: the
//! same steps, by the same code, as a cold native run's child and PID 1, in the order a
//! process cloned straight into its namespaces allows — its ids mapped, the run's cgroup
//! joined, then the cgroup namespace, a new session and rlimits; then the root built from
//! scratch, the hostname, Landlock, `no_new_privs`, no capabilities and seccomp — so that the
//! layers PID 1 reports are a cold run's.
//!
//! Descriptors in a zygote child: 0-2 the run's stdio, [`SETUP_FD`] the run's report socket
//! (setup messages as in a cold run, then the program's exit: [`ChildLine`]), the request
//! pipe (the program's alone), then the cgroup's `tasks` files, which the host opened for it.

use std::os::fd::{AsFd, OwnedFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{Gid, Pid, Uid};
use serde::{Deserialize, Serialize};

use super::child::{send_setup, SetupMessage, SETUP_FD};
use super::{ExitReport, Setup, Step};
use crate::error::SetupError;
use crate::layer::Layer;
use crate::linux::sys;
use crate::spec::{InitSpec, NativeSpec};

/// One line on a zygote child's report socket.
#[derive(Serialize, Deserialize, Debug)]
#[serde(untagged)]
pub(crate) enum ChildLine {
    Setup(SetupMessage),
    Exit { exit: ExitReport },
}

/// The namespaces the template clones PID 1 straight into: user, mount, PID, IPC, UTS (and
/// network), as the cold child's `unshare` makes them. The cgroup namespace comes later, by
/// [`enter`], once PID 1 is in the run's cgroup (a cgroup namespace is rooted where it is
/// made).
pub(crate) fn pid1_namespaces(native: &NativeSpec) -> nix::sched::CloneFlags {
    use nix::sched::CloneFlags;
    let mut flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    if native.new_net {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    flags
}

/// In PID 1, just cloned into [`pid1_namespaces`]: its own ids (`ids`, the template's) mapped,
/// the run's cgroup joined and a cgroup namespace made there, a new session and the cold run's
/// rlimits — the cold child's steps, with the layers they give.
pub(crate) fn enter(
    spec: &InitSpec,
    native: &NativeSpec,
    tasks: &[OwnedFd],
    ids: (Uid, Gid),
) -> Setup<Vec<Layer>> {
    let mut layers = vec![Layer::EnvScrub, Layer::FdClose, Layer::TreeKill];
    super::native::map_own_ids(ids.0, ids.1)?;
    super::cgroup_handoff::join_through(tasks)?;
    if !tasks.is_empty() {
        layers.push(Layer::Cgroup);
    }
    super::native::enter_cgroup_namespace()?;
    super::child::new_session(false)?;
    layers.push(Layer::NewSession);
    super::child::apply_rlimits(spec, !tasks.is_empty(), false)?;
    layers.push(Layer::Rlimits);
    // The template dropped root before it started the interpreter.
    if spec.credentials.is_some() {
        layers.push(Layer::UidDrop);
    }
    if tasks.is_empty() {
        let processes = spec.limits.processes;
        let nproc = nix::sys::resource::Resource::RLIMIT_NPROC;
        super::child::lower_rlimit(nproc, processes, processes)?;
    }
    layers.extend(Layer::NAMESPACES_BUT_NET);
    if native.new_net {
        layers.push(Layer::NetNs);
    }
    Ok(layers)
}

/// The template's own confinement, before its interpreter starts: the sandbox user (root
/// dropped), its own user, mount, network, IPC and UTS namespaces (no network at all), the
/// runs' root prepared (over its own `/dev/shm`, which the template never uses), no
/// capabilities even in its user namespace, and `no_new_privs`. Its children create their
/// own namespaces from here: a new user namespace gives them the capabilities their mounts
/// need, so the template keeps none. A seccomp filter of its own refuses what no child's
/// setup needs (ptrace, bpf, keyrings, ...). Landlock is the children's alone: a Landlock
/// domain forbids mounts in every process under it.
pub(crate) fn enter_template(spec: &InitSpec, native: &NativeSpec) -> Setup<()> {
    use nix::sched::CloneFlags;
    if let Some(credentials) = spec.credentials {
        super::child::drop_root(credentials)?;
    }
    let others = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    super::native::enter_user_namespace(others)?;
    // The runs' shared, read-only part of the root, built while the template still holds its
    // user namespace's capabilities (each run adds its own /proc, /tmp, /dev/shm, workdir).
    crate::confine::rootfs::prepare(&native.rootfs)
        .map_err(|e| SetupError::at(Step::Rootfs, e.to_string()))?;
    let privileges =
        |e: crate::confine::caps::CapsError| SetupError::at(Step::Privileges, e.to_string());
    crate::confine::caps::set_no_new_privs().map_err(privileges)?;
    crate::confine::caps::drop_all_capabilities().map_err(privileges)?;
    crate::confine::seccomp::install_template_filter()
        .map_err(|e| SetupError::at(Step::Seccomp, e.to_string()))
}

/// In PID 1: every confinement step of a cold PID 1, then the required layers checked and
/// the layers in force reported.
pub(crate) fn confine(spec: &InitSpec, native: &NativeSpec, layers: &mut Vec<Layer>) -> Setup<()> {
    let root = crate::confine::rootfs::enter_prepared;
    super::native::confine_with_root(native, layers, root)?;
    super::child::check_required(spec, layers)?;
    send_setup(&SetupMessage::Layers(layers.clone()));
    Ok(())
}

/// Reports a setup failure on the report socket and ends the process.
pub(crate) fn fail(error: SetupError) -> ! {
    send_setup(&SetupMessage::Error(error));
    sys::exit_now(126)
}

/// PID 1's duty: reap every process of the namespace until the program exits, then report
/// its exit and end (which ends every process left in the namespace). The report socket
/// closing means the host is gone: PID 1 ends at once, and with it the run.
pub(crate) fn reap_and_report(program: Pid, spec: &InitSpec, native: &NativeSpec) -> ! {
    for fd in 0..=2 {
        let _ = nix::unistd::close(fd);
    }
    let mut children = SigSet::empty();
    children.add(Signal::SIGCHLD);
    let signals = children
        .thread_block()
        .ok()
        .and_then(|()| SignalFd::with_flags(&children, SfdFlags::SFD_NONBLOCK).ok());
    loop {
        if let Some(status) = reap_ended(program) {
            super::quiet::stop_the_rest_of_the_namespace();
            let report = ExitReport {
                children_usage: super::ChildrenUsage::now(),
                ..ExitReport::from_status(
                    status,
                    super::native::file_size_hit(spec, native, &status),
                )
            };
            send_exit(report);
            sys::exit_now(0);
        }
        if host_gone(signals.as_ref()) {
            sys::exit_now(1);
        }
    }
}

/// Reaps what has ended; the program's status once it has.
fn reap_ended(program: Pid) -> Option<WaitStatus> {
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(status) if status.pid() == Some(program) => return Some(status),
            Ok(WaitStatus::StillAlive) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// Waits for a child to end or the report socket to close; true when it closed.
fn host_gone(signals: Option<&SignalFd>) -> bool {
    let report = sys::borrow_fd(SETUP_FD);
    let mut fds = vec![PollFd::new(report, PollFlags::POLLIN)];
    if let Some(signals) = signals {
        fds.push(PollFd::new(signals.as_fd(), PollFlags::POLLIN));
    }
    // Without a signalfd, check for ended children every few milliseconds.
    let timeout = match signals {
        Some(_) => PollTimeout::NONE,
        None => PollTimeout::from(5u8),
    };
    let _ = poll(&mut fds, timeout);
    let closed = fds[0].revents().is_some_and(|r| !r.is_empty());
    if let Some(signals) = signals {
        while let Ok(Some(_)) = signals.read_signal() {}
    }
    closed
}

fn send_exit(exit: ExitReport) {
    if let Ok(mut line) = serde_json::to_vec(&ChildLine::Exit { exit }) {
        line.push(b'\n');
        let _ = sys::write_all_to_fd(SETUP_FD, &line);
    }
}

/// How a zygote run ended, decided by the cold run's rule (`status::decide_status`).
pub(crate) fn decide_status(
    timed_out: bool,
    output_limit_hit: bool,
    exit: ExitReport,
    usage: &crate::confine::cgroup::CgroupUsage,
    cpu_limit: std::time::Duration,
) -> crate::result::RunStatus {
    let cpu_used = usage
        .cpu_usage_ns
        .map(std::time::Duration::from_nanos)
        .unwrap_or_default();
    let output_limit = crate::spec::StopReason::OutputLimit;
    let stop = match (timed_out, output_limit_hit) {
        (true, _) => Some(super::watch::StopCause::Timeout),
        (false, true) => Some(super::watch::StopCause::Requested(output_limit)),
        (false, false) => None,
    };
    super::status::decide_status(&super::status::Evidence {
        stop,
        exit,
        oom_kills: usage.oom_kills,
        cpu_used,
        cpu_limit,
    })
}

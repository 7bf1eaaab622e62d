//! The native Linux sandbox, entered by the init's child after Tier 0:
//!
//! 1. unshare user, mount, PID, IPC, UTS (and network) namespaces in one call, so the new
//!    user namespace owns all the others, while the init makes the run's cgroup;
//! 2. map only our own (already unprivileged) uid and gid, which needs no privilege at all;
//!    join the run's cgroup when the init hands it over (`cgroup_handoff`), then make the
//!    cgroup namespace, rooted there;
//! 3. start PID 1 of the new PID namespace, sharing this process's memory (`CLONE_VM`); this
//!    process stays behind only to mirror its exit, touching none of that memory again;
//! 4. PID 1 builds the root filesystem, sets the hostname, applies Landlock, no_new_privs,
//!    drops every capability and installs seccomp last (it needs no privilege);
//! 5. PID 1 starts the program (sharing its memory until the exec, `CLONE_VM | CLONE_VFORK`)
//!    and reaps every process until the program exits, then stops whatever is left in the
//!    namespace and waits until none of it is in a system call (`quiet`), reports and exits,
//!    which makes the kernel kill it.

use std::convert::Infallible;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{getgid, getuid, Pid};

use super::child::{finish_and_exec, send_setup, SetupMessage, REPORT_FD, SETUP_FD};
use super::ExitReport;
use super::{Setup, Step};
use crate::confine::landlock::Enforcement;
use crate::confine::rootfs::Workdir;
use crate::confine::{caps, landlock, rootfs, seccomp};
use crate::error::SetupError;
use crate::layer::Layer;
use crate::linux::sys;
use crate::spec::fds::CHILD_SHARED_ROOT_FDS;
use crate::spec::{InitSpec, NativeSpec};

/// Enters the namespaces but the cgroup namespace while the init makes the run's cgroup
/// (`handed_cgroup`), joins it once the init hands it over, then makes the cgroup namespace
/// there; without a cgroup it limits the processes instead: RLIMIT_NPROC set in the new user
/// namespace counts that namespace's processes, not every process of the sandbox user on the
/// host, which other runs share.
pub(super) fn enter(
    spec: &InitSpec,
    native: &NativeSpec,
    mut layers: Vec<Layer>,
    gate: Option<&OwnedFd>,
    handed_cgroup: bool,
) -> Setup<Infallible> {
    let proc_self = match spec.shared_root {
        true => Some(enter_shared_root()?),
        false => None,
    };
    enter_namespaces_but_cgroup(native.new_net, proc_self.as_ref())?;
    drop(proc_self);
    match handed_cgroup && super::cgroup_handoff::join_when_made()? {
        true => layers.push(Layer::Cgroup),
        false => super::child::fall_back_to_rlimits(spec)?,
    }
    enter_cgroup_namespace()?;
    layers.extend(Layer::NAMESPACES_BUT_NET);
    if native.new_net {
        layers.push(Layer::NetNs);
    }
    if let (Some(plan), Some(gate)) = (&spec.egress, gate) {
        super::egress::hand_over(plan, gate)?;
        let _ = nix::unistd::close(gate.as_raw_fd());
        layers.push(Layer::EgressGate);
    }
    // The mirror process must outlive PID 1 and must not die of the graceful SIGTERM the init
    // sends to the whole tree, or PID 1's parent-death signal would skip the grace period.
    super::stop_signals()
        .thread_block()
        .map_err(|e| SetupError::at(Step::Init, format!("cannot block signals: {e}")))?;
    // PID 1 shares this process's memory (no page tables copied, no copy-on-write faults, one
    // teardown), and this process, which touches none of it again, mirrors PID 1's exit.
    let error = sys::clone_and_mirror(Box::new(move || pid1(spec, native, layers)));
    Err(SetupError::at(
        Step::Init,
        format!("cannot start the sandbox's PID 1: {error}"),
    ))
}

/// A warm pool's shared root (`rootfs::build_shared`): enters the user and mount namespaces
/// that hold it (inherited at [`CHILD_SHARED_ROOT_FDS`]), so that the sandbox's own, made next,
/// are their children, and its mount namespace a copy of the shared root's, every mount of
/// which the kernel locks in a less privileged user namespace's copy (no run can unmount,
/// remount or make writable what is shared, and its mounts propagate nowhere: the shared
/// root's are private). This process, as the sandbox user, owns the shared root's user
/// namespace (its builder made it as that user), which gives it the capabilities `setns`
/// needs there and nowhere else. Returns this process's own `/proc` directory, opened
/// before: the shared root's `/proc` belongs to another (ended) PID namespace, where
/// `/proc/self` names nothing.
fn enter_shared_root() -> Setup<OwnedFd> {
    let failed = |what: &str, e: std::io::Error| {
        SetupError::at(
            Step::Namespaces,
            format!("cannot enter the pool's shared root ({what}): {e}"),
        )
    };
    let flags =
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
    let proc_self = rustix::fs::open("/proc/self", flags, rustix::fs::Mode::empty())
        .map_err(|e| failed("/proc/self", e.into()))?;
    let [user, mnt] = CHILD_SHARED_ROOT_FDS.map(sys::claim_inherited_fd);
    let (user, mnt) = (
        user.map_err(|e| failed("descriptor", e))?,
        mnt.map_err(|e| failed("descriptor", e))?,
    );
    nix::sched::setns(&user, CloneFlags::CLONE_NEWUSER)
        .map_err(|e| failed("user namespace", e.into()))?;
    nix::sched::setns(&mnt, CloneFlags::CLONE_NEWNS)
        .map_err(|e| failed("mount namespace", e.into()))?;
    Ok(proc_self)
}

/// The user, mount, PID, IPC and UTS (and network) namespaces: the cgroup namespace waits
/// for the run's cgroup ([`enter_cgroup_namespace`]). `proc_self`: this process's `/proc`
/// directory where `/proc/self` would not name it.
fn enter_namespaces_but_cgroup(new_net: bool, proc_self: Option<&OwnedFd>) -> Setup<()> {
    let mut others = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    if new_net {
        others |= CloneFlags::CLONE_NEWNET;
    }
    enter_user_namespace_at(others, proc_self)
}

/// A cgroup namespace rooted in the cgroup this process is in (made in the user namespace
/// it owns): once in the run's cgroup, the run sees that cgroup as `/` in every hierarchy.
pub(super) fn enter_cgroup_namespace() -> Setup<()> {
    unshare(CloneFlags::CLONE_NEWCGROUP).map_err(|e| {
        SetupError::at(
            Step::Namespaces,
            format!("cannot create the cgroup namespace: {e}"),
        )
    })
}

/// Unshares a new user namespace together with `others`, so the new user namespace owns
/// them all, and maps only our own (already unprivileged) uid and gid in it, which needs no
/// privilege at all.
pub(super) fn enter_user_namespace(others: CloneFlags) -> Setup<()> {
    enter_user_namespace_at(others, None)
}

fn enter_user_namespace_at(others: CloneFlags, proc_self: Option<&OwnedFd>) -> Setup<()> {
    let (uid, gid) = (getuid(), getgid());
    let flags = CloneFlags::CLONE_NEWUSER | others;
    unshare(flags).map_err(|e| {
        SetupError::at(
            Step::Namespaces,
            format!("cannot create namespaces ({flags:?}): {e}; check `airlock doctor` for user namespace support"),
        )
        .with_fix("check `airlock doctor` for user namespace support")
    })?;
    map_own_ids_at(uid, gid, proc_self)
}

/// In a new user namespace: maps only `uid` and `gid`, our own ids in the parent namespace
/// (the process's ids before the namespace existed), which needs no privilege at all.
pub(super) fn map_own_ids(uid: nix::unistd::Uid, gid: nix::unistd::Gid) -> Setup<()> {
    map_own_ids_at(uid, gid, None)
}

/// [`map_own_ids`] through `proc_self` (this process's `/proc` directory) when given.
fn map_own_ids_at(
    uid: nix::unistd::Uid,
    gid: nix::unistd::Gid,
    proc_self: Option<&OwnedFd>,
) -> Setup<()> {
    // A uid change made us non-dumpable, which makes /proc/self/* root-owned; we need to write
    // our own id maps, then go back to non-dumpable so the sandbox cannot open our descriptors.
    let dumpable = |e: nix::errno::Errno| {
        SetupError::at(Step::Namespaces, format!("prctl(PR_SET_DUMPABLE): {e}"))
            .of_kind(crate::error::SetupErrorKind::InitFailed)
    };
    nix::sys::prctl::set_dumpable(true).map_err(dumpable)?;
    write_proc_self(proc_self, "setgroups", "deny")?;
    write_proc_self(proc_self, "uid_map", &format!("{uid} {uid} 1"))?;
    write_proc_self(proc_self, "gid_map", &format!("{gid} {gid} 1"))?;
    nix::sys::prctl::set_dumpable(false).map_err(dumpable)
}

fn write_proc_self(proc_self: Option<&OwnedFd>, file: &str, contents: &str) -> Setup<()> {
    let written = match proc_self {
        None => std::fs::write(format!("/proc/self/{file}"), contents),
        Some(dir) => {
            let flags = rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC;
            rustix::fs::openat(dir, file, flags, rustix::fs::Mode::empty())
                .map_err(std::io::Error::from)
                .and_then(|fd| std::fs::File::from(fd).write_all(contents.as_bytes()))
        }
    };
    written.map_err(|e| {
        SetupError::at(
            Step::Namespaces,
            format!("cannot write {contents:?} to /proc/self/{file}: {e}"),
        )
    })
}

fn pid1(spec: &InitSpec, native: &NativeSpec, mut layers: Vec<Layer>) -> ! {
    // The program's terminal is controlled from a session inside the PID namespace, so that an
    // interactive shell can see (and restore) the terminal's process group.
    let session = match spec.tty {
        true => super::child::new_session(true),
        false => Ok(()),
    };
    let enter_root = match spec.shared_root {
        true => rootfs::enter_shared,
        false => rootfs::enter,
    };
    let result = session
        .and_then(|()| confine_with_root(native, &mut layers, enter_root))
        .and_then(|()| {
            // A warm sandbox waits here for its command; a cold run has it in its spec.
            let spec = super::standby::command_for(spec)?;
            super::standby::stage_files(&spec.workdir, &spec.files)?;
            let program = spawn_program(&spec, layers)?;
            reap_until(program, &spec, native)
        });
    let Err(error) = result;
    send_setup(&SetupMessage::Error(error));
    sys::exit_now(126)
}

/// Every confinement step of PID 1, in the only order that works: mounts need capabilities,
/// Landlock and seccomp need no_new_privs, and seccomp would forbid the earlier steps; the
/// root entered by `enter_root` (built from scratch, a copy of a warm pool's shared root's
/// completed, or a zygote run's
/// copy of the root its template prepared).
pub(super) fn confine_with_root(
    native: &NativeSpec,
    layers: &mut Vec<Layer>,
    enter_root: fn(&rootfs::RootfsPlan) -> Result<rootfs::RootfsReport, rootfs::RootfsError>,
) -> Setup<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| {
        SetupError::at(
            Step::Init,
            format!("cannot set the parent-death signal: {e}"),
        )
    })?;
    let report =
        enter_root(&native.rootfs).map_err(|e| SetupError::at(Step::Rootfs, e.to_string()))?;
    // Absent optional host paths (e.g. /lib32) are normal; a /proc file that exists but could
    // not be masked is a weaker sandbox and must be said.
    for path in report.unprotected {
        send_setup(&SetupMessage::Warning(format!(
            "{} could not be masked or made read-only",
            path.display()
        )));
    }
    layers.extend([Layer::Rootfs, Layer::Workdir]);
    if native.rootfs.protect_git {
        layers.push(Layer::GitReadOnly);
    }
    if matches!(native.rootfs.workdir, Workdir::Tmpfs { .. }) {
        layers.extend([Layer::DiskQuota, Layer::InodeQuota]);
    }
    nix::unistd::sethostname(&native.hostname)
        .map_err(|e| SetupError::at(Step::Hostname, format!("cannot set the hostname: {e}")))?;
    apply_landlock(native, layers);
    let privileges = |e: caps::CapsError| SetupError::at(Step::Privileges, e.to_string());
    caps::set_no_new_privs().map_err(privileges)?;
    layers.push(Layer::NoNewPrivs);
    caps::drop_all_capabilities().map_err(privileges)?;
    layers.push(Layer::CapsDropped);
    seccomp::install(&native.seccomp).map_err(|e| SetupError::at(Step::Seccomp, e.to_string()))?;
    layers.push(Layer::Seccomp);
    Ok(())
}

/// Landlock is best effort: the layers list says exactly what the kernel enforced.
fn apply_landlock(native: &NativeSpec, layers: &mut Vec<Layer>) {
    match landlock::restrict_self(&native.landlock) {
        Ok(report) => {
            let enforced = |e: Enforcement| e != Enforcement::None;
            if enforced(report.filesystem) {
                layers.push(Layer::LandlockFs);
            }
            if enforced(report.network) {
                layers.push(Layer::LandlockNet);
            }
            if enforced(report.scope) {
                layers.push(Layer::LandlockScope);
            }
            if report.filesystem == Enforcement::Partial {
                send_setup(&SetupMessage::Warning(format!(
                    "landlock ABI {} enforces only part of the filesystem rules",
                    report.abi
                )));
            }
        }
        Err(error) => send_setup(&SetupMessage::Warning(format!(
            "landlock not applied: {error}"
        ))),
    }
}

/// Starts the program in a process that shares PID 1's memory until its exec (PID 1 is
/// single-threaded and waits meanwhile): no page tables copied for it, none torn down at
/// its exec.
fn spawn_program(spec: &InitSpec, mut layers: Vec<Layer>) -> Setup<Pid> {
    sys::spawn_sharing_memory(&mut || {
        let Err(error) = program(spec, std::mem::take(&mut layers));
        send_setup(&SetupMessage::Error(error));
        sys::exit_now(126)
    })
    .map_err(|e| SetupError::at(Step::Init, format!("cannot start the program: {e}")))
}

fn program(spec: &InitSpec, layers: Vec<Layer>) -> Setup<Infallible> {
    let _ = nix::unistd::close(REPORT_FD);
    finish_and_exec(spec, layers)
}

/// PID 1's duty: reap every process of the namespace until the program itself exits. A
/// started interpreter's CPU until it was prepared is not the run's ([`super::prepared_cpu`]).
fn reap_until(program: Pid, spec: &InitSpec, native: &NativeSpec) -> Setup<Infallible> {
    let _ = nix::unistd::close(SETUP_FD);
    for fd in 0..=2 {
        let _ = nix::unistd::close(fd);
    }
    let prepared = match spec.warm_prestart {
        true => match super::prepared_cpu::await_prepared(program) {
            Ok(spent) => spent,
            // The interpreter ended while preparing (a preload failed): nothing to subtract.
            Err(status) => report_exit(status, Default::default(), spec, native),
        },
        false => Default::default(),
    };
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(status) if status.pid() == Some(program) => {
                report_exit(status, prepared, spec, native)
            }
            Err(nix::errno::Errno::ECHILD) => sys::exit_now(0),
            _ => continue,
        }
    }
}

fn report_exit(
    status: WaitStatus,
    prepared: super::prepared_cpu::CpuSpent,
    spec: &InitSpec,
    native: &NativeSpec,
) -> ! {
    super::quiet::stop_the_rest_of_the_namespace();
    let report = ExitReport {
        children_usage: super::ChildrenUsage::now_less(prepared),
        ..ExitReport::from_status(status, file_size_hit(spec, native, &status))
    };
    report.send(REPORT_FD);
    sys::exit_now(0)
}

/// Whether a file in the writable areas reached the size limit: RLIMIT_FSIZE stops writes at
/// exactly the limit, and interpreters that ignore SIGXFSZ leave only that evidence behind.
/// Only looked for when the program's end suggests it ([`super::may_have_hit_file_size`]).
pub(super) fn file_size_hit(spec: &InitSpec, native: &NativeSpec, status: &WaitStatus) -> bool {
    if !super::may_have_hit_file_size(status) {
        return false;
    }
    let mut dirs = vec![spec.workdir.clone(), "/tmp".into()];
    dirs.extend(native.rootfs.read_write.iter().cloned());
    super::any_file_at_least(&dirs, spec.limits.file_size_bytes)
}

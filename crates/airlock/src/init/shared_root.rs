//! A warm pool's shared root (`airlock __init shared-root`): the read-only part of its
//! sandboxes' root, built once per plan and `/etc` snapshot instead of once per sandbox.
//!
//! Executed by the pool (it is threaded and must not fork), it reads one request on the
//! socket at [`CONTROL_FD`] (the root's plan and the sandbox user), becomes the sandbox user,
//! makes a user, mount and PID namespace of its own and forks their PID 1, which builds the
//! root there (`rootfs::build_shared`: the skeleton, generated files, system and `/etc`
//! binds, `/dev`, the caller's binds, sealed read-only, an empty `/proc`), pivots into it and
//! drops the host. It answers with the user and mount namespaces' descriptors
//! (`SCM_RIGHTS`) and both processes exit: the pool's descriptors alone keep the namespaces
//! (and so the root) alive, so nothing runs for it and dropping them drops it.
//!
//! Each sandbox's setup enters those two namespaces before it makes its own
//! (`native::enter_shared_root`): its mount namespace is then a copy of the shared root,
//! which the kernel locks (a copy into a less privileged user namespace), and its PID 1 adds
//! only what is the run's own.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::confine::rootfs;
use crate::linux::sys::{self, Forked};
use crate::spec::shared_root::{SharedRootRequest, BUILT, FAILED};
use crate::spec::CONTROL_FD;
use nix::sched::CloneFlags;
use nix::sys::socket::{recv, sendmsg, ControlMessage, MsgFlags};
use nix::sys::wait::{waitpid, WaitStatus};

/// The largest request read (a root's plan: paths and generated files).
const MAX_REQUEST: usize = 1 << 20;

/// Builds the root, answers, and exits.
pub(super) fn serve() -> ! {
    let Ok(socket) = sys::claim_inherited_fd(CONTROL_FD) else {
        sys::exit_now(1)
    };
    let sent = match build(&socket) {
        Ok(namespaces) => {
            let fds = namespaces.each_ref().map(AsRawFd::as_raw_fd);
            let rights = [ControlMessage::ScmRights(&fds)];
            let answer = [IoSlice::new(&[BUILT])];
            sendmsg::<()>(
                socket.as_raw_fd(),
                &answer,
                &rights,
                MsgFlags::empty(),
                None,
            )
        }
        Err(error) => {
            let mut answer = vec![FAILED];
            answer.extend_from_slice(error.as_bytes());
            nix::sys::socket::send(socket.as_raw_fd(), &answer, MsgFlags::empty())
        }
    };
    sys::exit_now(if sent.is_ok() { 0 } else { 1 })
}

/// The shared root's user and mount namespaces, once its PID 1 has built it.
fn build(socket: &OwnedFd) -> Result<[OwnedFd; 2], String> {
    let mut body = vec![0u8; MAX_REQUEST];
    let n = recv(socket.as_raw_fd(), &mut body, MsgFlags::empty())
        .map_err(|e| format!("cannot read the request: {e}"))?;
    let request: SharedRootRequest =
        serde_json::from_slice(&body[..n]).map_err(|e| format!("malformed request: {e}"))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    if let Some(credentials) = request.credentials {
        super::child::drop_root(credentials).map_err(|e| e.to_string())?;
    }
    super::native::enter_user_namespace(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID)
        .map_err(|e| e.to_string())?;
    let open = |name: &str| {
        std::fs::File::open(format!("/proc/self/ns/{name}"))
            .map(OwnedFd::from)
            .map_err(|e| format!("cannot open /proc/self/ns/{name}: {e}"))
    };
    let namespaces = [open("user")?, open("mnt")?];
    let (errors, error_pipe) =
        nix::unistd::pipe().map_err(|e| format!("cannot create a pipe: {e}"))?;
    match sys::fork_single_threaded().map_err(|e| format!("cannot fork: {e}"))? {
        Forked::Child => {
            drop(errors);
            let built = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(|e| e.to_string())
                .and_then(|()| rootfs::build_shared(&request.rootfs).map_err(|e| e.to_string()));
            if let Err(error) = built {
                let _ = sys::write_all_to_fd(error_pipe.as_raw_fd(), error.as_bytes());
                sys::exit_now(1)
            }
            sys::exit_now(0)
        }
        Forked::Parent(pid) => {
            drop(error_pipe);
            let status = loop {
                match waitpid(pid, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other,
                }
            };
            let mut said = String::new();
            let _ = std::io::Read::read_to_string(&mut std::fs::File::from(errors), &mut said);
            match status {
                Ok(WaitStatus::Exited(_, 0)) => Ok(namespaces),
                _ if !said.is_empty() => Err(said),
                other => Err(format!("the shared root's builder ended: {other:?}")),
            }
        }
    }
}

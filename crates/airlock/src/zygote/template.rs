//! The template's side of an interpreter zygote, run by the `airlock-zygote` binary (which
//! embeds the interpreter): [`Template::start`] before the interpreter exists, then
//! [`Template::serve`], which forks one child per run request. The interpreter itself is
//! behind [`Interpreter`], so this library never links it.
//!
//! A run's processes: the template clones the run's PID 1 straight into its new user,
//! mount, PID, IPC, UTS and network namespaces (a raw `clone`, the interpreter's own fork
//! work called around it: `Interpreter::before_fork` and the rest); PID 1 maps its ids,
//! joins the run's cgroup, makes its cgroup namespace there and applies every confinement
//! step of a cold PID 1 (`init::zygote`), then forks the program — all ahead of the run.
//! The host writes the run's request straight to the program's own pipe (PID 1 only reaps
//! and reports), which reseeds its generators and runs the code in the interpreter it
//! inherited.

use std::io::Read;
use std::os::fd::{AsFd, IntoRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

use super::wire::{self, RunRequest, TemplateSpec, TemplateStatus};
use crate::error::{Error, SetupError, SetupStep as Step};
use crate::init::zygote as confine;
use crate::linux::sys::{self, Forked};
use crate::spec::fds::{SETUP_FD, ZYGOTE_CONTROL_FD};
use crate::spec::{Confinement, NativeSpec};

/// The interpreter a template embeds.
pub trait Interpreter {
    /// The interpreter's before-fork work (its at-fork hooks, its import lock taken), for a
    /// fork made without it: [`Interpreter::after_fork_parent`] follows in this process.
    fn before_fork(&mut self);
    /// In the parent, after a fork [`Interpreter::before_fork`] prepared.
    fn after_fork_parent(&mut self);
    /// In a process forked (or forked from one forked) after [`Interpreter::before_fork`]
    /// without the interpreter's after-fork work: that work, before any Python runs here.
    fn after_fork_child(&mut self);
    /// Runs a request's code in this (confined) process, as `-c` would, and returns its exit
    /// status. `env` is the program's whole environment.
    fn run(&mut self, code: &str, args: &[String], env: &[(String, String)]) -> i32;
    /// A part of the path of the interpreter's shared library (`libpython`), whose code and
    /// constants every run executes: forks get its page-table entries copied, see
    /// [`Template::serve`]. `None`: none copied.
    fn library(&self) -> Option<&str> {
        None
    }
    /// In the program, forked ahead and waiting for its request: the runner run once on empty
    /// code, so that the pages a run writes whatever its code (the runner's frames, the
    /// interpreter's allocator pools, the module it makes) are copied now rather than while
    /// the request's code runs. Nothing of any request exists yet.
    fn rehearse(&mut self) {}
}

/// A started template: in its own namespaces as the sandbox user, holding the control socket.
#[derive(Debug)]
pub struct Template {
    control: OwnedFd,
    spec: TemplateSpec,
    /// The template's uid and gid (in its own user namespace), each PID 1's to map.
    ids: (nix::unistd::Uid, nix::unistd::Gid),
}

impl Template {
    /// Takes the control socket, reads the spec, drops root and enters the template's own
    /// namespaces (user, mount, network, IPC, UTS) with no capabilities and `no_new_privs`.
    pub fn start() -> Result<Template, Error> {
        let control = sys::claim_inherited_fd(ZYGOTE_CONTROL_FD)
            .map_err(|e| Error::io("cannot take the zygote's control socket", e))?;
        sys::close_from(ZYGOTE_CONTROL_FD + 1)
            .map_err(|e| Error::io("cannot close inherited descriptors", e))?;
        let (spec, _) = wire::receive::<TemplateSpec>(&control, 0)?
            .ok_or_else(|| Error::Command("the zygote's host sent no spec".into()))?;
        let Confinement::Native(native) = &spec.init.confinement else {
            return Err(Error::Command(
                "a zygote needs a native sandbox plan".into(),
            ));
        };
        confine::enter_template(&spec.init, native)
            .map_err(|e| Error::Command(format!("the zygote's template: {}", e.message)))?;
        let ids = (nix::unistd::getuid(), nix::unistd::getgid());
        Ok(Template { control, spec, ids })
    }

    /// The modules to import before serving.
    pub fn preload(&self) -> &[String] {
        &self.spec.preload
    }

    /// The plan's environment, every child's before its request's variables are added.
    pub fn environment(&self) -> &[(String, String)] {
        &self.spec.init.env
    }

    /// Says the template is ready (or why not), then forks a child per request until the host
    /// closes the control socket.
    pub fn serve(self, interpreter: &mut dyn Interpreter) -> Result<(), Error> {
        if let Some(library) = interpreter.library() {
            share_code_page_tables_with_forks(library);
        }
        wire::send(&self.control, &TemplateStatus::Ready, &[])?;
        // The host's messages here only carry a run's descriptors (its code and environment
        // go to PID 1 on the report socket), so the buffer never holds a run's data.
        let mut buffer = wire::MessageBuffer::new();
        loop {
            reap_ended();
            if !readable(&self.control, Duration::from_millis(500)) {
                continue;
            }
            let Some((_, fds)) = wire::receive_into::<RunRequest>(&self.control, 64, &mut buffer)?
            else {
                return Ok(());
            };
            self.clone_pid1(fds, interpreter);
        }
    }

    /// Clones the run's PID 1 straight into its new namespaces (one process per run besides
    /// the program; see `init::zygote`), the interpreter's fork work around it.
    fn clone_pid1(&self, fds: Vec<OwnedFd>, interpreter: &mut dyn Interpreter) {
        let namespaces = confine::pid1_namespaces(self.native());
        interpreter.before_fork();
        let cloned = sys::fork_with_flags(namespaces);
        if let Ok(Some(Forked::Child)) = cloned {
            self.pid1(fds, interpreter)
        }
        interpreter.after_fork_parent();
        // Otherwise (a thread, an error) the host sees the report socket close unread.
        drop(fds);
    }

    /// Tells the host why the template could not start.
    pub fn report_failure(control: Option<&Template>, error: &Error) {
        if let Some(template) = control {
            let failed = TemplateStatus::Failed(error.to_string());
            let _ = wire::send(&template.control, &failed, &[]);
        }
    }

    fn native(&self) -> &NativeSpec {
        match &self.spec.init.confinement {
            Confinement::Native(native) => native,
            _ => unreachable!("checked in start"),
        }
    }

    /// PID 1, cloned into its namespaces: its descriptors placed, confined, the program forked
    /// ahead; it then hands the program the request and reaps. Never returns.
    ///
    /// PID 1 runs only Rust, so it skips the interpreter's after-fork work (which would dirty
    /// pages of the template's heap in it): its copy of the interpreter stays as the template
    /// left it at `before_fork`, and the program, forked from it, does that work once.
    fn pid1(&self, fds: Vec<OwnedFd>, interpreter: &mut dyn Interpreter) -> ! {
        let (request, tasks) = match place_child_fds(fds) {
            Ok(placed) => placed,
            Err(e) => sys::exit_now(e.raw_os_error().unwrap_or(1).clamp(1, 125)),
        };
        // From here this process's (and the program's) small allocations come from fresh
        // pages, not the template's heap, whose free chunks each copied a page when the
        // allocator wrote them. Only for a run with a cgroup: one without falls back to
        // `RLIMIT_AS` (`confine::enter`), which the arena's reservation would eat into.
        // Without the arena (it fails, or the binary does not install it) as before.
        if !tasks.is_empty() {
            let _ = sys::use_fresh_arena();
        }
        let (spec, native) = (&self.spec.init, self.native());
        let mut layers =
            confine::enter(spec, native, &tasks, self.ids).unwrap_or_else(|e| confine::fail(e));
        drop(tasks);
        if let Err(e) = confine::confine(spec, native, &mut layers) {
            confine::fail(e);
        }
        // The program is forked ahead too, so its fork is off the run's path: confined, it
        // waits for the request on its own pipe, which the host writes straight to (PID 1 is
        // not woken on the run's path to pass it on); PID 1 meanwhile reaps and watches the
        // report socket (its closing means the host no longer wants the child, and ends it).
        match sys::fork_single_threaded() {
            Ok(Forked::Parent(program)) => {
                drop(request);
                confine::reap_and_report(program, spec, native)
            }
            Ok(Forked::Child) => {}
            Err(e) => confine::fail(forking("the program", e)),
        }
        interpreter.after_fork_child();
        let _ = nix::unistd::close(SETUP_FD);
        interpreter.rehearse();
        let Some(request) = receive_request(request) else {
            sys::exit_now(126) // the host closed the pipe without a request (or sent a bad one)
        };
        let status = interpreter.run(&request.code, &request.args, &request.env);
        // The output ends here (the runner flushed it), not after the kernel has torn this
        // address space down: the host's readers finish while PID 1 waits for the exit.
        let _ = sys::close_from(0);
        sys::exit_now(status)
    }
}

/// Makes every fork copy the page-table entries of the interpreter library's read-only
/// mappings (its code and constants), which the kernel otherwise skips for a file mapping
/// without private pages: each run's program then finds the code the template ran mapped,
/// instead of faulting it in again while it runs the request's code (~65 faults a run moved
/// off the run's path into the fork made ahead). Only the interpreter's library: the other
/// libraries' entries cost PID 1 (which runs none of them) more to copy and tear down than
/// the program's faults on them. Only while the template is single-threaded (as it must be
/// to fork its children); a mapping that cannot be changed is left as it is.
fn share_code_page_tables_with_forks(library: &str) {
    if !matches!(crate::linux::single_threaded(), Ok(true)) {
        return;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    for (start, len, prot, path) in maps.lines().filter_map(read_only_file_mapping) {
        if path.contains(library) {
            let _ = sys::give_file_mapping_a_private_page(start, len, prot);
        }
    }
}

/// A `/proc/self/maps` line's mapping when it is a private, readable, not writable mapping of
/// a file: its start, length, protection and path.
fn read_only_file_mapping(line: &str) -> Option<(usize, usize, libc::c_int, &str)> {
    let mut fields = line.split_whitespace();
    let (range, perms) = (fields.next()?, fields.next()?.as_bytes());
    let path = fields.nth(3)?;
    if !path.starts_with('/') || perms != b"r--p" && perms != b"r-xp" {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let exec = if perms[2] == b'x' { libc::PROT_EXEC } else { 0 };
    Some((start, end.checked_sub(start)?, libc::PROT_READ | exec, path))
}

/// The program: the request the host wrote on its pipe, read to its end (at most
/// [`wire::MAX_REQUEST`] bytes).
fn receive_request(from_host: OwnedFd) -> Option<RunRequest> {
    let mut body = Vec::new();
    let pipe = std::fs::File::from(from_host);
    pipe.take(wire::MAX_REQUEST).read_to_end(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

fn forking(what: &str, e: std::io::Error) -> SetupError {
    SetupError::at(Step::Init, format!("cannot fork {what}: {e}"))
}

/// Puts the run's stdio at 0-2 and its report socket at [`SETUP_FD`], and closes every other
/// descriptor (the control socket, other runs' pipes); returns the request pipe and the
/// cgroup's files, placed after it.
fn place_child_fds(fds: Vec<OwnedFd>) -> std::io::Result<(OwnedFd, Vec<OwnedFd>)> {
    const FIXED: usize = 5; // stdin, stdout, stderr, the report socket, the request pipe
    if fds.len() < FIXED {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let raw: Vec<RawFd> = fds.into_iter().map(IntoRawFd::into_raw_fd).collect();
    let pairs: Vec<(RawFd, RawFd)> = raw.iter().copied().zip(0..).collect();
    sys::place_fds_inheritable(&pairs)?;
    let end = raw.len() as RawFd;
    sys::close_from(end)?;
    let request = sys::claim_inherited_fd(SETUP_FD + 1)?;
    let tasks = (SETUP_FD + 2..end)
        .map(sys::claim_inherited_fd)
        .collect::<std::io::Result<_>>()?;
    Ok((request, tasks))
}

fn readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    poll(&mut fds, PollTimeout::from(millis)).unwrap_or(0) > 0
}

/// Reaps the children that have ended (each run's first process ends with its run).
fn reap_ended() {
    while let Ok(status) = waitpid(None::<nix::unistd::Pid>, Some(WaitPidFlag::WNOHANG)) {
        if matches!(status, WaitStatus::StillAlive) {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::read_only_file_mapping;

    #[test]
    fn only_private_read_only_file_mappings_get_a_private_page() {
        let lib = "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0";
        let code = format!("7f0000001000-7f0000003000 r-xp 00001000 08:01 42 {lib}");
        let exec = libc::PROT_READ | libc::PROT_EXEC;
        assert_eq!(
            read_only_file_mapping(&code),
            Some((0x7f00_0000_1000, 0x2000, exec, lib))
        );
        let constants = format!("7f0000003000-7f0000004000 r--p 00003000 08:01 42 {lib}");
        assert_eq!(
            read_only_file_mapping(&constants).map(|m| m.2),
            Some(libc::PROT_READ)
        );
        for other in [
            format!("7f0000004000-7f0000005000 rw-p 00004000 08:01 42 {lib}"),
            format!("7f0000005000-7f0000006000 r--s 00005000 08:01 42 {lib}"),
            format!("7f0000006000-7f0000007000 ---p 00006000 08:01 42 {lib}"),
            "7f0000007000-7f0000008000 r-xp 00000000 00:00 0 [vdso]".to_string(),
            "7f0000008000-7f0000009000 r--p 00000000 00:00 0".to_string(),
        ] {
            assert_eq!(read_only_file_mapping(&other), None, "{other}");
        }
    }
}

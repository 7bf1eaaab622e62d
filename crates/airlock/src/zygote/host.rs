//! The host's side of a zygote: the template process, started and recycled.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::unistd::Pid;

use super::wire::{self, RunRequest, TemplateSpec, TemplateStatus};
use crate::confine::cgroup::RunCgroup;
use crate::error::Error;
use crate::linux::sys;
use crate::spec::fds::ZYGOTE_CONTROL_FD;
use crate::supervisor::ZygotePlan;
use crate::{RunResult, Sandbox};

/// The template's program, looked up next to the running executable (and its parent
/// directory, for test binaries in `target/*/deps`) unless given.
const BINARY: &str = "airlock-zygote";

/// What a zygote embeds and when its template is replaced.
#[derive(Debug, Clone)]
pub struct ZygoteOptions {
    /// The interpreter the plan is made for (its path inside the sandbox); the template
    /// embeds the Python this `airlock-zygote` was built against (Debian's 3.11).
    pub program: PathBuf,
    /// Modules the template imports before it serves (e.g. `json`, `re`, `numpy`).
    pub preload: Vec<String>,
    /// A template is replaced after this many runs...
    pub max_forks: u64,
    /// ... or this long after it started (children share its hash seed and address-space
    /// layout: see `docs/warm.md`).
    pub max_age: Duration,
    /// The `airlock-zygote` binary (`AIRLOCK_ZYGOTE`, else next to the executable).
    pub binary: Option<PathBuf>,
    /// A template not ready by then is a failed start.
    pub ready_timeout: Duration,
}

impl ZygoteOptions {
    /// Debian's Python 3.11 importing `preload`, replaced after 1,000 runs or 5 minutes.
    pub fn python(preload: &[&str]) -> ZygoteOptions {
        ZygoteOptions {
            program: "/usr/bin/python3".into(),
            preload: preload.iter().map(|m| m.to_string()).collect(),
            max_forks: 1000,
            max_age: Duration::from_secs(300),
            binary: None,
            ready_timeout: Duration::from_secs(30),
        }
    }

    fn binary(&self) -> Result<PathBuf, Error> {
        let given = self
            .binary
            .clone()
            .or_else(|| std::env::var_os("AIRLOCK_ZYGOTE").map(PathBuf::from));
        if let Some(binary) = given {
            return Ok(binary);
        }
        let exe =
            std::env::current_exe().map_err(|e| Error::io("cannot find the executable", e))?;
        exe.ancestors()
            .skip(1)
            .take(2)
            .map(|dir| dir.join(BINARY))
            .find(|candidate| candidate.is_file())
            .ok_or_else(|| {
                Error::Command(format!(
                    "{BINARY} was not found next to {}; build it (cargo build -p airlock-zygote) or set AIRLOCK_ZYGOTE",
                    exe.display()
                ))
            })
    }
}

/// One code run on a zygote.
#[derive(Debug, Clone, Default)]
pub struct ZygoteRun {
    pub code: String,
    /// `sys.argv[1:]`.
    pub args: Vec<String>,
    /// Variables added to (or replacing) the plan's environment.
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
}

impl ZygoteRun {
    pub fn code(code: impl Into<String>) -> ZygoteRun {
        ZygoteRun {
            code: code.into(),
            ..ZygoteRun::default()
        }
    }
}

/// What a zygote has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZygoteStats {
    /// Templates started (the first and every replacement).
    pub templates: u64,
    /// Runs forked.
    pub runs: u64,
    /// The running template's pid, if one runs.
    pub template_pid: Option<u32>,
    /// Run cgroups that could not be removed (a later sweep removes them).
    pub cleanup_failures: u64,
}

/// Cgroup removals in flight, which shutting a zygote down waits for.
#[derive(Debug, Default)]
struct Teardowns {
    pending: Mutex<usize>,
    done: Condvar,
}

impl Teardowns {
    fn begin(&self) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    fn end(&self) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.done.notify_all();
    }

    fn wait_all(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        while *pending > 0 {
            pending = self.done.wait(pending).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        self.template.lock().map(|mut t| t.take()).ok();
        self.teardowns.wait_all();
    }
}

/// Runs Python code forked from a template (see [`crate::zygote`]). `Send + Sync`.
#[derive(Debug)]
pub struct Zygote {
    pub(super) plan: ZygotePlan,
    options: ZygoteOptions,
    binary: PathBuf,
    /// The policy's stdout and stderr caps.
    output_caps: (u64, u64),
    template: Mutex<Option<TemplateProcess>>,
    stats: Arc<Mutex<ZygoteStats>>,
    teardowns: Arc<Teardowns>,
}

impl Sandbox {
    /// A zygote for this sandbox's policy: refuses what a warm pool refuses (backends other
    /// than native, a plan missing a required layer) and a network gate (not built for
    /// zygotes). Starts the template before it returns.
    pub fn zygote(&self, options: ZygoteOptions) -> Result<Zygote, Error> {
        Zygote::new(self, options)
    }
}

impl Zygote {
    fn new(sandbox: &Sandbox, options: ZygoteOptions) -> Result<Zygote, Error> {
        if let Some(bad) = options
            .preload
            .iter()
            .find(|m| !crate::warm::is_module_name(m))
        {
            return Err(Error::Command(format!(
                "{bad:?} is not a module name (letters, digits, `_` and `.`)"
            )));
        }
        let plan = crate::supervisor::plan_zygote(sandbox, &options.program.display().to_string())?;
        if !plan.spec.mapped.is_empty() {
            return Err(Error::Command(
                "zygotes do not map a workspace's owner (idmapped mounts are the cold init's); use a warm pool or a cold run".into(),
            ));
        }
        if plan.spec.egress.is_some() {
            return Err(Error::Command(
                "zygotes run without network (`none`) only; use a warm pool or a cold run for `allowlist`/`report`".into(),
            ));
        }
        let zygote = Zygote {
            binary: options.binary()?,
            output_caps: (
                sandbox.policy().limits.stdout.0,
                sandbox.policy().limits.stderr.0,
            ),
            plan,
            options,
            template: Mutex::new(None),
            stats: Arc::default(),
            teardowns: Arc::default(),
        };
        zygote.with_template(|_| Ok(()))?;
        Ok(zygote)
    }

    /// Runs `run` in a child of the template, confined as a cold run of the plan.
    pub fn run(&self, run: &ZygoteRun) -> Result<RunResult, Error> {
        super::run::run(self, run)
    }

    pub(super) fn output_caps(&self) -> (u64, u64) {
        self.output_caps
    }

    /// The counters now.
    pub fn stats(&self) -> ZygoteStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops the template (runs in flight finish) and waits until every run's cgroup is
    /// removed. Dropping the zygote does the same.
    pub fn shutdown(self) {}

    /// Removes a finished run's cgroup off the caller's path: PID 1's exit ends the
    /// namespace, and its last processes (PID 1 itself, the process mirroring it) leave the
    /// cgroup within moments; an empty cgroup is removed without a kill round, and whatever
    /// stays is killed by `remove`.
    pub(super) fn tear_down(&self, cgroup: RunCgroup) {
        let (teardowns, stats) = (Arc::clone(&self.teardowns), Arc::clone(&self.stats));
        teardowns.begin();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(1);
            while Instant::now() < deadline && cgroup.pids().is_ok_and(|p| !p.is_empty()) {
                std::thread::sleep(Duration::from_micros(500));
            }
            if cgroup.remove().is_err() {
                if let Ok(mut stats) = stats.lock() {
                    stats.cleanup_failures += 1;
                }
            }
            teardowns.end();
        });
    }

    /// Hands a run's descriptors to the template, replacing it first when it is due.
    pub(super) fn fork_run(&self, fds: &[RawFd]) -> Result<(), Error> {
        self.with_template(|template| {
            template.forks += 1;
            wire::send(&template.control, &RunRequest::default(), fds)
        })?;
        if let Ok(mut stats) = self.stats.lock() {
            stats.runs += 1;
        }
        Ok(())
    }

    pub(super) fn request(&self, run: &ZygoteRun) -> RunRequest {
        let mut env = self.plan.spec.env.clone();
        for (key, value) in &run.env {
            env.retain(|(k, _)| k != key);
            env.push((key.clone(), value.clone()));
        }
        RunRequest {
            code: run.code.clone(),
            args: run.args.clone(),
            env,
        }
    }

    fn with_template<T>(
        &self,
        use_it: impl FnOnce(&mut TemplateProcess) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut slot = self.template.lock().unwrap_or_else(|p| p.into_inner());
        let due = slot.as_ref().is_none_or(|t| {
            t.forks >= self.options.max_forks || t.born.elapsed() >= self.options.max_age
        });
        if due {
            *slot = None; // the old template exits; its children run on
            let template = TemplateProcess::start(
                &self.binary,
                &self.spec_for_template(),
                self.options.ready_timeout,
            )?;
            if let Ok(mut stats) = self.stats.lock() {
                stats.templates += 1;
                stats.template_pid = Some(template.pid.as_raw() as u32);
            }
            *slot = Some(template);
        }
        match slot.as_mut() {
            Some(template) => use_it(template),
            None => unreachable!("started above"),
        }
    }

    fn spec_for_template(&self) -> TemplateSpec {
        TemplateSpec {
            init: self.plan.spec.clone(),
            preload: self.options.preload.clone(),
        }
    }
}

/// A running template and its control socket; dropping it closes the socket, on which the
/// template exits (its children do not depend on it), and reaps it.
#[derive(Debug)]
struct TemplateProcess {
    control: OwnedFd,
    pid: Pid,
    forks: u64,
    born: Instant,
}

impl TemplateProcess {
    fn start(
        binary: &std::path::Path,
        spec: &TemplateSpec,
        timeout: Duration,
    ) -> Result<TemplateProcess, Error> {
        let (control, template_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| Error::io("cannot create the zygote's control socket", e.into()))?;
        let pid = sys::spawn_with_fds(
            binary,
            &[],
            &[(template_end.as_raw_fd(), ZYGOTE_CONTROL_FD)],
        )
        .map_err(|e| Error::io(format!("cannot start {}", binary.display()), e))?;
        drop(template_end);
        let template = TemplateProcess {
            control,
            pid,
            forks: 0,
            born: Instant::now(),
        };
        wire::send(&template.control, spec, &[])?;
        template.wait_ready(timeout)?;
        Ok(template)
    }

    fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let mut fds = [PollFd::new(self.control.as_fd(), PollFlags::POLLIN)];
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let failed =
            |why: String| Error::Command(format!("the zygote's template did not start: {why}"));
        if poll(&mut fds, PollTimeout::from(millis)).unwrap_or(0) <= 0 {
            return Err(failed(format!("not ready after {timeout:?}")));
        }
        match wire::receive::<TemplateStatus>(&self.control, 0)? {
            Some((TemplateStatus::Ready, _)) => Ok(()),
            Some((TemplateStatus::Failed(why), _)) => Err(failed(why)),
            None => Err(failed("it exited".into())),
        }
    }
}

impl Drop for TemplateProcess {
    fn drop(&mut self) {
        let _ =
            nix::sys::socket::shutdown(self.control.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        // It exits as soon as it sees the socket close.
        while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(self.pid, None) {}
    }
}

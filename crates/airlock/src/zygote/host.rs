//! The host's side of a zygote: the template process, started and recycled.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::Pid;

use super::ready::{Maker, ReadyChild, ReadyPool};
use super::recycle::{Bounds, Forker};
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
    /// Run children forked ahead (each in its own fresh cgroup, confined, waiting for one
    /// run), off the caller's path.
    pub ready_children: usize,
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
            ready_children: 4,
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
    /// Stops the run when cancelled (status `cancelled`), as [`crate::Command::cancel_on`]
    /// does for a cold one.
    pub cancel: Option<crate::CancelToken>,
    /// Streams the run as it goes, as a cold [`crate::RunHandle`]'s events do: `Started`
    /// with the layers first, then each chunk of stdout and stderr as the program writes it
    /// (within the output caps, so at most the caps' bytes are ever sent). The result still
    /// holds the output.
    pub events: Option<std::sync::mpsc::Sender<crate::RunEvent>>,
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
    /// Run children forked (the runs done and the children waiting for one).
    pub runs: u64,
    /// The running template's pid, if one runs.
    pub template_pid: Option<u32>,
    /// Run cgroups that could not be removed (a later sweep removes them).
    pub cleanup_failures: u64,
    /// Times a run waited for a replacement template (one not started ahead, or not ready
    /// when the old one was due).
    pub template_waits: u64,
    /// A replacement template is being started in the background.
    pub replacing: bool,
    /// Runs that found no child ready and had one forked on their own path.
    pub forks_on_path: u64,
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // The waiting children end and every cgroup is removed, then the templates stop.
        self.children.take();
        self.forker.stop_all();
    }
}

/// Runs Python code forked from a template (see [`crate::zygote`]). `Send + Sync`.
#[derive(Debug)]
pub struct Zygote {
    pub(super) plan: ZygotePlan,
    /// The policy's stdout and stderr caps.
    output_caps: (u64, u64),
    /// The policy's `on_output_limit = kill`.
    kill_on_output_limit: bool,
    forker: Arc<Forker>,
    stats: Arc<Mutex<ZygoteStats>>,
    children: Option<ReadyPool>,
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
        let stats: Arc<Mutex<ZygoteStats>> = Arc::default();
        let bounds = Bounds {
            max_forks: options.max_forks,
            max_age: options.max_age,
        };
        let start = TemplateStart {
            binary: options.binary()?,
            spec: TemplateSpec {
                init: plan.spec.clone(),
                preload: options.preload.clone(),
            },
            timeout: options.ready_timeout,
            stats: Arc::clone(&stats),
        };
        let forker = Arc::new(Forker::new(bounds, start, Arc::clone(&stats)));
        forker.ensure_serving()?;
        let maker = Maker {
            forker: Arc::clone(&forker),
            cgroup: plan.spec.cgroup.clone(),
        };
        let children = ReadyPool::start(maker, options.ready_children, Arc::clone(&stats));
        let zygote = Zygote {
            output_caps: (
                sandbox.policy().limits.stdout.0,
                sandbox.policy().limits.stderr.0,
            ),
            kill_on_output_limit: plan.kill_on_output_limit,
            plan,
            forker,
            stats,
            children: Some(children),
        };
        Ok(zygote)
    }

    /// Runs `run` in a child of the template, confined as a cold run of the plan.
    pub fn run(&self, run: &ZygoteRun) -> Result<RunResult, Error> {
        super::run::run(self, run)
    }

    pub(super) fn output_caps(&self) -> (u64, u64) {
        self.output_caps
    }

    pub(super) fn kill_on_output_limit(&self) -> bool {
        self.kill_on_output_limit
    }

    /// The counters now.
    pub fn stats(&self) -> ZygoteStats {
        let replacing = self.forker.replacing();
        let mut stats = self.stats.lock().map(|s| s.clone()).unwrap_or_default();
        stats.replacing = replacing;
        stats
    }

    /// Stops the template (runs in flight finish) and waits until every run's cgroup is
    /// removed. Dropping the zygote does the same.
    pub fn shutdown(self) {}

    /// The run's child, taken ready from the pool (or forked now).
    pub(super) fn take_child(&self) -> Result<ReadyChild, Error> {
        match &self.children {
            Some(pool) => pool.take(),
            None => Err(Error::Command("the zygote is shutting down".into())),
        }
    }

    /// Removes a finished run's cgroup (once its PID 1 has closed `report`) and replaces its
    /// child, off the caller's path.
    pub(super) fn finished(&self, cgroup: Option<RunCgroup>, report: Option<UnixStream>) {
        if let Some(pool) = &self.children {
            pool.finished(cgroup, report);
        }
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
}

/// What starting a template takes (on the caller's thread or in the background).
#[derive(Debug, Clone)]
pub(super) struct TemplateStart {
    pub binary: PathBuf,
    pub spec: TemplateSpec,
    pub timeout: Duration,
    pub stats: Arc<Mutex<ZygoteStats>>,
}

impl TemplateStart {
    /// Starts a template and waits until it is ready; counted in the stats.
    pub fn start(&self) -> Result<TemplateProcess, Error> {
        let template = TemplateProcess::start(&self.binary, &self.spec, self.timeout)?;
        if let Ok(mut stats) = self.stats.lock() {
            stats.templates += 1;
        }
        Ok(template)
    }
}

/// A running template and its control socket; dropping it closes the socket, on which the
/// template exits (its children do not depend on it), and reaps it.
#[derive(Debug)]
pub(super) struct TemplateProcess {
    control: OwnedFd,
    pub pid: Pid,
    pub forks: u64,
    pub born: Instant,
}

impl TemplateProcess {
    /// Hands one run's descriptors to the template, which forks the run's child.
    pub fn fork_run(&self, fds: &[RawFd]) -> Result<(), Error> {
        wire::send(&self.control, &RunRequest::default(), fds)
    }

    fn start(
        binary: &std::path::Path,
        spec: &TemplateSpec,
        timeout: Duration,
    ) -> Result<TemplateProcess, Error> {
        let (control, template_end) = crate::linux::seqpacket_pair()
            .map_err(|e| Error::io("cannot create the zygote's control socket", e))?;
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

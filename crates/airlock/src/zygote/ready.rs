//! Run children forked ahead, off the caller's path: a keeper thread keeps `ready_children`
//! children of the template waiting, each in a fresh cgroup (created with the run's limits)
//! and already through every confinement step — namespaces, the root, Landlock, `no_new_privs`,
//! capabilities, seccomp — its PID 1 waiting for the run's request on its report socket. Each
//! serves exactly one run; a run that finds none ready forks its own. A thread of the
//! keeper's removes finished runs' cgroups, so no refill waits behind a removal. Cgroups carry
//! the `run-<pid>-…` name, so a dead owner's are swept like any abandoned run's, and a waiting
//! child ends when its report socket closes.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::host::ZygoteStats;
use super::recycle::Forker;
use crate::confine::cgroup::{self, CgroupError, RunCgroup};
use crate::error::Error;
use crate::spec::CgroupRequest;

/// A confined child waiting for its run, and the host's ends of its pipes and socket.
#[derive(Debug)]
pub(super) struct ReadyChild {
    pub cgroup: Option<RunCgroup>,
    /// Why the run has no cgroup (its limits fall back to rlimits), if so.
    pub warning: Option<String>,
    pub report: UnixStream,
    /// The write end of the pipe the program reads its request from (PID 1 never sees it).
    pub request: OwnedFd,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// What making a child takes: the template's forker and the run's cgroup request.
#[derive(Debug, Clone)]
pub(super) struct Maker {
    pub forker: Arc<Forker>,
    pub cgroup: Option<CgroupRequest>,
}

impl Maker {
    /// A fresh cgroup (or none, said), then a child forked into it.
    fn make(&self) -> Result<ReadyChild, Error> {
        let (cgroup, tasks, warning) = match &self.cgroup {
            None => (None, Vec::new(), None),
            Some(request) => match create(request) {
                Ok((cgroup, tasks)) => (Some(cgroup), tasks, None),
                Err(e) => (None, Vec::new(), Some(cgroup::no_cgroup_warning(&e))),
            },
        };
        match spawn(&self.forker, tasks) {
            Ok(child) => Ok(ReadyChild {
                cgroup,
                warning,
                ..child
            }),
            Err(e) => {
                if let Some(cgroup) = cgroup {
                    let _ = cgroup.remove();
                }
                Err(e)
            }
        }
    }
}

/// The run's pipes, request pipe and report socket, handed to a child forked from the
/// template (with the cgroup's `tasks` files, which it writes `0` to). The request goes
/// straight to the program, so PID 1 is not woken on the run's path to pass it on.
fn spawn(forker: &Forker, tasks: Vec<OwnedFd>) -> Result<ReadyChild, Error> {
    let (stdin_read, stdin_write) = pipe()?;
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let (request_read, request_write) = pipe()?;
    let (report, child_report) =
        UnixStream::pair().map_err(|e| Error::io("cannot create the report socket", e))?;
    let mut fds = vec![
        stdin_read.as_raw_fd(),
        stdout_write.as_raw_fd(),
        stderr_write.as_raw_fd(),
        child_report.as_raw_fd(),
        request_read.as_raw_fd(),
    ];
    fds.extend(tasks.iter().map(|f| f.as_raw_fd()));
    forker.fork(&fds)?;
    Ok(ReadyChild {
        cgroup: None,
        warning: None,
        report,
        request: request_write,
        stdin: stdin_write,
        stdout: stdout_read,
        stderr: stderr_read,
    })
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Error> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("cannot create a pipe", e.into()))
}

enum Job {
    Refill,
    /// A finished run's cgroup, and the host's end of its report socket (which ends when its
    /// PID 1 exits), when the run still has it.
    TearDown(RunCgroup, Option<UnixStream>),
}

/// Ready children and the keeper thread that forks them and tears runs' cgroups down.
#[derive(Debug)]
pub(super) struct ReadyPool {
    maker: Maker,
    stats: Arc<Mutex<ZygoteStats>>,
    ready: Arc<Mutex<VecDeque<ReadyChild>>>,
    jobs: Mutex<Option<Sender<Job>>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
}

impl ReadyPool {
    /// Starts the keeper, which keeps `target` children ready in the background.
    pub fn start(maker: Maker, target: usize, stats: Arc<Mutex<ZygoteStats>>) -> ReadyPool {
        let ready = Arc::new(Mutex::new(VecDeque::new()));
        let (jobs, inbox) = channel();
        let keeper = Keeper {
            maker: maker.clone(),
            ready: Arc::clone(&ready),
            target,
            stats: Arc::clone(&stats),
        };
        let handle = std::thread::spawn(move || keeper.serve(inbox));
        let _ = jobs.send(Job::Refill);
        ReadyPool {
            maker,
            stats,
            ready,
            jobs: Mutex::new(Some(jobs)),
            keeper: Mutex::new(Some(handle)),
        }
    }

    /// A child for one run: a ready one, else one forked now. The replacement is made when
    /// the run has ended (`finished`), so that making it does not take the CPU from the run,
    /// unless this took the last ready child.
    pub fn take(&self) -> Result<ReadyChild, Error> {
        let (pooled, left) = {
            let mut ready = lock(&self.ready);
            (ready.pop_front(), ready.len())
        };
        if left == 0 {
            self.send(Job::Refill);
        }
        match pooled {
            Some(ready) => Ok(ready),
            None => {
                lock(&self.stats).forks_on_path += 1;
                self.maker.make()
            }
        }
    }

    /// A run has ended: its cgroup is removed and the pool refilled, off the caller's path.
    pub fn finished(&self, cgroup: Option<RunCgroup>, report: Option<UnixStream>) {
        if let Some(cgroup) = cgroup {
            self.send(Job::TearDown(cgroup, report));
        }
        self.send(Job::Refill);
    }

    fn send(&self, job: Job) {
        if let Some(jobs) = lock(&self.jobs).as_ref() {
            let _ = jobs.send(job);
        }
    }
}

impl Drop for ReadyPool {
    /// Finishes every teardown sent, then ends the children no run took and removes their
    /// cgroups.
    fn drop(&mut self) {
        lock(&self.jobs).take();
        if let Some(keeper) = lock(&self.keeper).take() {
            let _ = keeper.join();
        }
    }
}

struct Keeper {
    maker: Maker,
    ready: Arc<Mutex<VecDeque<ReadyChild>>>,
    target: usize,
    stats: Arc<Mutex<ZygoteStats>>,
}

impl Keeper {
    fn serve(self, inbox: Receiver<Job>) {
        // Removals wait (for a run's PID 1 to end, then for its cgroup to empty, sleeping at
        // growing intervals): in a thread of their own, so that no refill ever waits behind
        // one. When the keeper did both, callers under saturation found no child ready while
        // it slept (runs forked on their own path).
        let (removals, pending) = channel::<(RunCgroup, Option<UnixStream>)>();
        let stats = Arc::clone(&self.stats);
        let remover = std::thread::spawn(move || {
            for (cgroup, report) in pending {
                if let Some(report) = report {
                    wait_for_pid1_exit(&report);
                }
                remove(cgroup, &stats);
            }
        });
        while let Ok(job) = inbox.recv() {
            if let Job::TearDown(cgroup, report) = job {
                let _ = removals.send((cgroup, report));
            }
            self.refill();
        }
        // Every unused child's socket and pipes are closed first: its PID 1 sees the report
        // socket close and ends, and the run with it, so the cgroups below are empty (or
        // nearly) when they are removed. (Closing them after each removal, as before, left
        // each removal polling a live PID 1 until its one-second deadline.)
        let cgroups: Vec<RunCgroup> = lock(&self.ready)
            .drain(..)
            .filter_map(|child| child.cgroup)
            .collect();
        for cgroup in cgroups {
            let _ = removals.send((cgroup, None));
        }
        drop(removals);
        let _ = remover.join();
    }

    /// Keeps the pool at its target; a failure leaves the run to fork its own (and report
    /// why when that fails too).
    fn refill(&self) {
        while lock(&self.ready).len() < self.target {
            match self.maker.make() {
                Ok(child) => lock(&self.ready).push_back(child),
                Err(_) => return,
            }
        }
    }
}

/// PID 1's exit ends the run's namespace; its last processes (PID 1 itself and what the code
/// left) leave the cgroup within moments. An empty cgroup is removed without a kill round;
/// whatever stays after a second is killed by `remove`.
fn remove(cgroup: RunCgroup, stats: &Mutex<ZygoteStats>) {
    cgroup.wait_for_exits(Duration::from_secs(1));
    if cgroup.remove().is_err() {
        lock(stats).cleanup_failures += 1;
    }
}

/// Waits (up to a second, without using the CPU) until the report socket's other end is
/// closed, which PID 1's exit does; data still unread ends the wait at once.
fn wait_for_pid1_exit(report: &UnixStream) {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(
        report.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1000u16));
}

/// A fresh run cgroup and its `tasks` files.
fn create(request: &CgroupRequest) -> Result<(RunCgroup, Vec<OwnedFd>), CgroupError> {
    let run_id = crate::rundir::new_run_id();
    let cgroup = RunCgroup::create(&request.config, &run_id, &request.limits)?;
    match cgroup.open_membership_files() {
        Ok(tasks) => Ok((cgroup, tasks)),
        Err(e) => {
            let _ = cgroup.remove();
            Err(e)
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confine::cgroup::{CgroupConfig, CgroupLimits};

    /// A ready child's cgroup that cannot be made is a cgroup failure, said as a cold run
    /// says it (it once read "invalid command: …", the kind of a caller's bad command).
    #[test]
    fn a_cgroup_that_cannot_be_made_is_said_as_a_cgroup_failure() {
        let request = CgroupRequest {
            config: CgroupConfig {
                parent: "../outside".into(),
                ..CgroupConfig::default()
            },
            run_id: String::new(),
            limits: CgroupLimits::default(),
        };
        let error = create(&request).unwrap_err();
        assert!(
            matches!(error, CgroupError::InvalidParent { .. }),
            "{error}"
        );
        let warning = cgroup::no_cgroup_warning(&error);
        assert!(warning.starts_with("no cgroup for this run ("), "{warning}");
        assert!(
            warning.ends_with("limits fall back to rlimits"),
            "{warning}"
        );
    }
}

//! The zygote's run cgroups, created and removed off the caller's path: a keeper thread keeps
//! a few fresh cgroups ready (created with the run's limits, their `tasks` files opened) and
//! removes finished runs' cgroups. Each ready cgroup serves exactly one run; a run that finds
//! none ready creates its own on the spot. Pooled cgroups carry the `run-<pid>-…` name, so a
//! dead owner's are swept like any abandoned run's.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::host::ZygoteStats;
use crate::confine::cgroup::{CgroupVersion, RunCgroup};
use crate::error::Error;
use crate::spec::CgroupRequest;

/// A fresh cgroup and the files its child writes `0` to (opened by the host's user).
#[derive(Debug)]
pub(super) struct ReadyCgroup {
    pub cgroup: RunCgroup,
    pub tasks: Vec<OwnedFd>,
}

enum Job {
    Refill,
    TearDown(RunCgroup),
}

/// Ready cgroups and the keeper thread that fills the pool and tears runs' cgroups down.
#[derive(Debug)]
pub(super) struct CgroupPool {
    request: CgroupRequest,
    ready: Arc<Mutex<VecDeque<ReadyCgroup>>>,
    jobs: Mutex<Option<Sender<Job>>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
}

impl CgroupPool {
    /// Starts the keeper, which fills the pool to `target` in the background.
    pub fn start(
        request: CgroupRequest,
        target: usize,
        stats: Arc<Mutex<ZygoteStats>>,
    ) -> CgroupPool {
        let ready = Arc::new(Mutex::new(VecDeque::new()));
        let (jobs, inbox) = channel();
        let keeper = Keeper {
            request: request.clone(),
            ready: Arc::clone(&ready),
            target,
            stats,
        };
        let handle = std::thread::spawn(move || keeper.serve(inbox));
        let _ = jobs.send(Job::Refill);
        CgroupPool {
            request,
            ready,
            jobs: Mutex::new(Some(jobs)),
            keeper: Mutex::new(Some(handle)),
        }
    }

    /// A fresh cgroup for one run: a ready one, else one created now.
    pub fn take(&self) -> Result<ReadyCgroup, Error> {
        let pooled = lock(&self.ready).pop_front();
        self.send(Job::Refill);
        match pooled {
            Some(ready) => Ok(ready),
            None => create(&self.request),
        }
    }

    /// Removes a finished run's cgroup off the caller's path.
    pub fn tear_down(&self, cgroup: RunCgroup) {
        self.send(Job::TearDown(cgroup));
    }

    fn send(&self, job: Job) {
        if let Some(jobs) = lock(&self.jobs).as_ref() {
            let _ = jobs.send(job);
        }
    }
}

impl Drop for CgroupPool {
    /// Finishes every teardown sent, then removes the ready cgroups no run took.
    fn drop(&mut self) {
        lock(&self.jobs).take();
        if let Some(keeper) = lock(&self.keeper).take() {
            let _ = keeper.join();
        }
    }
}

struct Keeper {
    request: CgroupRequest,
    ready: Arc<Mutex<VecDeque<ReadyCgroup>>>,
    target: usize,
    stats: Arc<Mutex<ZygoteStats>>,
}

impl Keeper {
    fn serve(self, inbox: Receiver<Job>) {
        while let Ok(job) = inbox.recv() {
            match job {
                Job::TearDown(cgroup) => self.remove(cgroup),
                Job::Refill => self.refill(),
            }
        }
        let unused: Vec<ReadyCgroup> = lock(&self.ready).drain(..).collect();
        for ready in unused {
            drop(ready.tasks);
            self.remove(ready.cgroup);
        }
    }

    /// Fills the pool up to its target; a creation that fails leaves the run to create its
    /// own (and report why when that fails too).
    fn refill(&self) {
        while lock(&self.ready).len() < self.target {
            match create(&self.request) {
                Ok(ready) => lock(&self.ready).push_back(ready),
                Err(_) => return,
            }
        }
    }

    /// PID 1's exit ends the run's namespace; its last processes (PID 1 itself, the process
    /// mirroring it) leave the cgroup within moments. An empty cgroup is removed without a
    /// kill round; whatever stays is killed by `remove`.
    fn remove(&self, cgroup: RunCgroup) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline && cgroup.pids().is_ok_and(|p| !p.is_empty()) {
            std::thread::sleep(Duration::from_micros(500));
        }
        if cgroup.remove().is_err() {
            lock(&self.stats).cleanup_failures += 1;
        }
    }
}

fn create(request: &CgroupRequest) -> Result<ReadyCgroup, Error> {
    let run_id = crate::rundir::new_run_id();
    let cgroup = RunCgroup::create(&request.config, &run_id, &request.limits)
        .map_err(|e| Error::Command(format!("no cgroup for this run ({e})")))?;
    match join_files(&cgroup) {
        Ok(tasks) => Ok(ReadyCgroup { cgroup, tasks }),
        Err(e) => {
            let _ = cgroup.remove();
            Err(e)
        }
    }
}

/// The files the child writes "0" to, opened here (by the host's user) for the child.
fn join_files(cgroup: &RunCgroup) -> Result<Vec<OwnedFd>, Error> {
    cgroup
        .join_paths()
        .into_iter()
        .map(|procs| match cgroup.version() {
            CgroupVersion::V1 => procs.with_file_name("tasks"),
            CgroupVersion::V2 => procs,
        })
        .map(|path| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map(OwnedFd::from)
                .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))
        })
        .collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The untrusted profile's cgroup request on this host, when cgroups can be created here.
    fn request() -> Option<CgroupRequest> {
        let policy = crate::policy::load_profile("untrusted").ok()?;
        let sandbox = crate::Sandbox::new(policy).ok()?;
        let plan = crate::supervisor::plan_zygote(&sandbox, "/usr/bin/python3").ok()?;
        let request = plan.spec.cgroup?;
        let probe = RunCgroup::create(&request.config, "run-probe-pool", &request.limits).ok()?;
        probe.remove().ok()?;
        Some(request)
    }

    #[test]
    fn no_two_runs_share_a_cgroup_and_none_is_left() {
        let Some(request) = request() else {
            eprintln!("skipped: no cgroup can be created here (needs root and cgroupfs)");
            return;
        };
        let pool = CgroupPool::start(request, 2, Arc::default());
        let taken: Vec<ReadyCgroup> = (0..6).map(|_| pool.take().unwrap()).collect();
        let mut paths: Vec<_> = taken.iter().flat_map(|r| r.cgroup.paths()).collect();
        let all = paths.clone();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), all.len(), "a cgroup was handed out twice");
        assert!(all.iter().all(|p| p.is_dir()));
        for ready in taken {
            pool.tear_down(ready.cgroup);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&pool.ready).len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let pooled: Vec<_> = lock(&pool.ready)
            .iter()
            .flat_map(|r| r.cgroup.paths())
            .collect();
        assert!(!pooled.is_empty(), "the keeper did not refill the pool");
        drop(pool);
        let left: Vec<_> = all.iter().chain(&pooled).filter(|p| p.exists()).collect();
        assert!(left.is_empty(), "cgroups left behind: {left:?}");
    }
}

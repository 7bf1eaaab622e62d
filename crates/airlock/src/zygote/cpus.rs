//! Where a zygote's work ahead of runs happens: on one CPU of those it may use (the last),
//! so that the template's clones, each PID 1's setup, the program's fork and the keeper's
//! cgroups never hold the CPU a run's process wakes up on. A kernel without full preemption
//! (`preempt=none`, this one) lets a task waking on a CPU that is busy in a long system call
//! (a clone into new namespaces, mounts, an exit) wait for that call to end, whatever the two
//! tasks' priorities; a CPU kept for that work leaves the others to the runs. A child moves
//! to every CPU before it waits for its run, and PID 1 back before its exit.

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPUs a thread may use and the one kept for work ahead of runs; nothing to keep apart
/// with fewer than two.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cpus(Option<Split>);

#[derive(Clone, Copy, Debug)]
struct Split {
    all: CpuSet,
    ahead: CpuSet,
}

impl Cpus {
    /// The calling thread's.
    pub fn of_this_thread() -> Cpus {
        Cpus(Split::of_this_thread())
    }

    /// Moves the calling thread to the CPU kept for work ahead of runs. Best effort: it
    /// only places work, so a refusal leaves the thread where it may run anyway.
    pub fn work_ahead(&self) {
        if let Some(split) = &self.0 {
            let _ = sched_setaffinity(Pid::from_raw(0), &split.ahead);
        }
    }

    /// Moves the calling thread back to every CPU it may use.
    pub fn work_on_runs(&self) {
        if let Some(split) = &self.0 {
            let _ = sched_setaffinity(Pid::from_raw(0), &split.all);
        }
    }
}

impl Split {
    fn of_this_thread() -> Option<Split> {
        let all = sched_getaffinity(Pid::from_raw(0)).ok()?;
        let allowed: Vec<usize> = (0..CpuSet::count())
            .filter(|&cpu| all.is_set(cpu).unwrap_or(false))
            .collect();
        let (&last, rest) = allowed.split_last()?;
        if rest.is_empty() {
            return None;
        }
        let mut ahead = CpuSet::new();
        ahead.set(last).ok()?;
        Some(Split { all, ahead })
    }
}

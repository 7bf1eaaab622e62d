//! The pool's filler: one thread that starts preparations up to the target, watches them
//! report ready (one poll over their event pipes and the wake pipe), replaces what was taken
//! and tears down what expired.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::Shared;
use crate::supervisor::{Readiness, Standby};

/// After this many preparations fail in a row, the filler waits before the next.
const FAILURES_BEFORE_BACKOFF: u32 = 3;
const BACKOFF: Duration = Duration::from_secs(1);
/// How often expiry is checked when nothing else happens.
const TICK: Duration = Duration::from_millis(500);

struct Preparing {
    standby: Standby,
    since: Instant,
}

pub(super) fn run(shared: &Shared) {
    let mut preparing: Vec<Preparing> = Vec::new();
    let mut failures_in_a_row = 0u32;
    let mut backoff_until: Option<Instant> = None;
    while !shared.lock().shutdown {
        expire_idle(shared);
        if backoff_until.is_none_or(|until| Instant::now() >= until) {
            backoff_until = None;
            start_preparations(shared, &mut preparing, &mut failures_in_a_row);
        }
        let readable = wait(shared, &preparing, backoff_until);
        for index in readable.into_iter().rev() {
            let mut entry = preparing.swap_remove(index);
            match entry.standby.read_readiness() {
                Readiness::Pending => preparing.push(entry),
                Readiness::Ready => {
                    failures_in_a_row = 0;
                    push_ready(shared, entry.standby);
                }
                Readiness::Failed(error) => {
                    failures_in_a_row += 1;
                    fail(shared, entry.standby, error.to_string());
                }
            }
        }
        abandon_slow(shared, &mut preparing, &mut failures_in_a_row);
        if failures_in_a_row >= FAILURES_BEFORE_BACKOFF && backoff_until.is_none() {
            backoff_until = Some(Instant::now() + BACKOFF);
        }
        shared.set_preparing(preparing.len());
    }
    for entry in preparing {
        shared.release_budget();
        shared.retire_standby(entry.standby);
    }
    shared.set_preparing(0);
}

fn start_preparations(shared: &Shared, preparing: &mut Vec<Preparing>, failures: &mut u32) {
    while preparing.len() < shared.options.parallel && shared.wants_more(preparing.len()) {
        if let Some(budget) = &shared.options.budget {
            if !budget.try_acquire() {
                return;
            }
        }
        match Standby::prepare(
            &shared.sandbox,
            shared.prestart.as_ref(),
            shared.spawner.as_deref(),
            (&shared.plans, Some(&shared.roots)),
        ) {
            Ok(standby) => {
                shared.lock().started += 1;
                preparing.push(Preparing {
                    standby,
                    since: Instant::now(),
                })
            }
            Err(error) => {
                shared.release_budget();
                *failures += 1;
                shared.record_failure(error.to_string());
                return;
            }
        }
    }
}

/// Polls the preparations' event pipes and the wake pipe; the indexes of readable ones.
fn wait(shared: &Shared, preparing: &[Preparing], backoff_until: Option<Instant>) -> Vec<usize> {
    let mut fds: Vec<PollFd> = preparing
        .iter()
        .map(|entry| PollFd::new(entry.standby.readiness_fd(), PollFlags::POLLIN))
        .collect();
    fds.push(PollFd::new(shared.wake.0.as_fd(), PollFlags::POLLIN));
    let mut timeout = TICK;
    if let Some(until) = backoff_until {
        timeout = timeout.min(until.saturating_duration_since(Instant::now()));
    }
    let timeout = PollTimeout::try_from(timeout.as_millis() as u64).unwrap_or(PollTimeout::MAX);
    if poll(&mut fds, timeout).unwrap_or(0) <= 0 {
        return Vec::new();
    }
    let flagged = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
    if flagged(&fds[preparing.len()]) {
        let mut sink = [0u8; 64];
        while matches!(
            nix::unistd::read(shared.wake.0.as_raw_fd(), &mut sink),
            Ok(1..)
        ) {}
    }
    (0..preparing.len()).filter(|&i| flagged(&fds[i])).collect()
}

fn abandon_slow(shared: &Shared, preparing: &mut Vec<Preparing>, failures: &mut u32) {
    let timeout = shared.options.ready_timeout;
    let (slow, fine): (Vec<Preparing>, Vec<Preparing>) = std::mem::take(preparing)
        .into_iter()
        .partition(|entry| entry.since.elapsed() >= timeout);
    *preparing = fine;
    for entry in slow {
        *failures += 1;
        let message = format!("a preparation took longer than {timeout:?}");
        fail(shared, entry.standby, message);
    }
}

fn fail(shared: &Shared, standby: Standby, message: String) {
    // A change on the host may explain it: the next sandbox is planned again.
    shared.plans.forget();
    shared.release_budget();
    shared.record_failure(message);
    shared.retire_standby(standby);
}

fn push_ready(shared: &Shared, standby: Standby) {
    let mut state = shared.lock();
    if state.shutdown {
        drop(state);
        shared.release_budget();
        shared.retire_standby(standby);
        return;
    }
    // Expiry counts from the `/etc` snapshot: a shared root's build, or this preparation.
    let since = standby.snapshot_taken().unwrap_or_else(Instant::now);
    state.ready.push_back((standby, since));
    drop(state);
    shared.changed.notify_all();
}

/// Tears down sandboxes whose `/etc` snapshot is older than the idle expiry (their
/// preparation, or the shared root they were prepared on: not always in queue order, since
/// a sandbox prepared on a root just replaced may become ready after one on its successor).
fn expire_idle(shared: &Shared) {
    let Some(expiry) = shared.options.idle_expiry else {
        return;
    };
    let mut state = shared.lock();
    let (expired, fresh): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut state.ready)
        .into_iter()
        .partition(|(_, since)| since.elapsed() >= expiry);
    state.ready = fresh;
    state.stats.expired += expired.len() as u64;
    drop(state);
    for (standby, _) in expired {
        shared.release_budget();
        shared.retire_standby(standby);
    }
}

impl Shared {
    fn wants_more(&self, preparing: usize) -> bool {
        let state = self.lock();
        let below_target = state.ready.len() + preparing < self.options.target;
        below_target && (self.options.refill || state.started < self.options.target)
    }

    fn set_preparing(&self, count: usize) {
        self.lock().stats.preparing = count;
    }

    fn record_failure(&self, message: String) {
        let mut state = self.lock();
        state.stats.failed += 1;
        state.stats.last_error = Some(message);
    }

    pub(super) fn retire_standby(&self, standby: Standby) {
        use crate::supervisor::StandbySource;
        self.retire(standby.retire());
    }
}

//! PID 1's last act before it reports the program's end: every other process of its
//! namespace stopped, and seen out of every system call, so that nothing of the run acts
//! after its result.
//!
//! `kill(-1, SIGSTOP)` alone keeps those processes out of user space, but a system call
//! already running when the stop arrives finishes first (a stop is taken on the way back to
//! user space; a regular file's write is not interrupted by it), so one large `write` begun
//! before the report could land after it. So PID 1 also waits until every other task of the
//! namespace is in group stop (`T`: at signal delivery, no system call of its in progress) or
//! a zombie (`Z`, past its last effect) or gone, as `/proc` shows it; a task still busy after
//! [`STOP_BOUND`] is killed (a fatal signal ends a write at its next page) and waited for.
//!
//! A stopped task is continued only by a running one (`SIGCONT`, or the kernel for an exiting
//! one's orphaned process group): the namespace counts as quiet only when two looks in a row
//! find every task stopped or dead with the same CPU accounting (`schedstat`) and no pid given
//! out in between (the second look reads the first one's tasks again), so that no task ran or
//! was made between them, and so none was continued after the first look (whatever continued
//! it would have run, or been continued, in between). `/proc` is mounted
//! `hidepid=invisible`, which hides a process that made itself non-dumpable from PID 1 (no
//! capabilities left): each look also probes every pid the namespace gave out (up to
//! `ns_last_pid`) with signal 0, and a process that exists but does not show makes PID 1 kill
//! the whole namespace and reap it to the last process instead.
//!
//! The common case costs little: with no other process, PID 1 has no child and nothing is read;
//! a started interpreter's holder (PID 1's child once the interpreter is reaped) wakes PID 1
//! by its stop's `SIGCHLD` and stays stopped, not killed (a killed holder tears the address
//! space down on the report's path).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// How long a process may take to stop before it is killed: far above the few tens of
/// microseconds a sleeping process takes to be woken and stop, and above a runnable one's
/// wait for a CPU under the load the bench sees (a slice or two); far below a write of
/// hundreds of MiB (~0.1-1 s), which this cuts short. Only its latency depends on it: what
/// a busy process does before the bound still lands before the report.
const STOP_BOUND: Duration = Duration::from_millis(5);

/// How long PID 1 waits between looks, in milliseconds, when no child of its changes state
/// (a busy process whose parent is not PID 1 wakes nothing of PID 1's): poll's resolution.
const LOOK_AGAIN_MS: u8 = 1;

/// Pids probed for processes `/proc` does not show, at most: a namespace that gave out more
/// is ended whole instead (a run that started thousands of processes).
const MAX_PROBED: i32 = 4096;

/// What one look at the namespace found: every task `/proc` shows but PID 1, by task id, and
/// the last pid the namespace gave out (a fork between two looks changes it).
#[derive(Debug, PartialEq, Eq)]
struct Look {
    tasks: Vec<Task>,
    last_pid: i32,
}

/// One task of the namespace as `/proc` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Task {
    process: i32,
    task: i32,
    /// Where its files were read: the process's own directory, or the thread's.
    dir: String,
    state: u8,
    /// Asleep (`S`) in a system call that only waits for a signal (`pause`), read from its
    /// `syscall` file: woken by the stop, it goes from there to the stop, no effect between.
    pausing: bool,
    /// A signal other than the stop (or a kill) waits for its delivery (`SigPnd`, the task's
    /// own, or `ShdPnd`, its process's, in `status`): the kernel delivers a thread's own signals
    /// and lower-numbered ones before the stop, so a task in `pause` with a handled one waiting
    /// would run its handler, and the handler's first system call, before it stops. Read only
    /// for a task that may be pausing (asleep, or woken and not yet run).
    other_signals: bool,
    /// `schedstat` (time on a CPU, time waiting for one, times run), or the context switch
    /// counts where the kernel keeps no `schedstat`: changes whenever the task ran.
    ran: String,
}

impl Task {
    /// In group stop (or a ptrace stop), a zombie or dead: no system call in progress; or
    /// asleep in one that has nothing to finish, now or, not having run since, in `before`
    /// (the look before the stop).
    fn quiet(&self, before: &[Task]) -> bool {
        let paused_since = || match before.binary_search_by_key(&self.task, |t| t.task) {
            Ok(i) => before[i].pausing && before[i].ran == self.ran && before[i].dir == self.dir,
            Err(_) => false,
        };
        let stopped_or_dead = matches!(self.state, b'T' | b't' | b'Z' | b'X' | b'x');
        stopped_or_dead || (!self.other_signals && (self.pausing || paused_since()))
    }
}

/// Stops every other process of PID 1's namespace and returns once none of them is in a
/// system call (see the module's comment). `kill(-1)` from any other process would reach
/// every process of the user: only PID 1 does anything.
pub(super) fn stop_the_rest_of_the_namespace() {
    if nix::unistd::getpid() != Pid::from_raw(1) {
        return;
    }
    // No other process in the namespace, nothing to stop or wait for.
    if !has_children() {
        return;
    }
    // Blocked before the stop, so each child's stop notification stays pending for the
    // signalfd (an unblocked SIGCHLD at its default action is discarded).
    let mut children = SigSet::empty();
    children.add(Signal::SIGCHLD);
    let _ = children.thread_block();
    // Who sleeps in `pause` before the stop: the stop wakes them (runnable, no longer
    // readable as pausing), but one that has not run since is still in that call.
    let before = look().map(|look| look.tasks).unwrap_or_default();
    if kill(Pid::from_raw(-1), Signal::SIGSTOP).is_err() {
        return;
    }
    wait_until_quiet(&children, &before);
}

/// Whether PID 1 has a child (running, stopped or a zombie, of any kind), which is whether
/// any other process is left in its namespace: every one is PID 1's descendant, and the
/// chain from it to PID 1 holds only live processes or zombies not yet reaped (an orphan
/// goes to PID 1 or to a subreaper below it). Asked of PID 1's own children rather than by
/// `kill(-1, 0)`, whose walk over every process of the host grows with the host (a pool's
/// idle sandboxes are three processes each) on every run's path. An error other than "no
/// child" counts as a child: the careful path follows.
fn has_children() -> bool {
    let flags = WaitPidFlag::WEXITED
        | WaitPidFlag::WSTOPPED
        | WaitPidFlag::WCONTINUED
        | WaitPidFlag::WNOHANG
        | WaitPidFlag::WNOWAIT
        | WaitPidFlag::__WALL;
    waitid(Id::All, flags) != Err(nix::errno::Errno::ECHILD)
}

fn wait_until_quiet(children: &SigSet, before: &[Task]) {
    let started = Instant::now();
    let mut signals = None;
    loop {
        // No /proc to look at, or a process it does not show: what is left is ended rather
        // than trusted.
        let Some(look) = look().filter(|look| !hides_a_process(look)) else {
            return end_everything(&mut signals, children);
        };
        let busy: Vec<i32> = look
            .tasks
            .iter()
            .filter(|t| !t.quiet(before))
            .map(|t| t.process)
            .collect();
        if busy.is_empty() {
            if unchanged_since(&look) {
                return;
            }
            continue;
        }
        if started.elapsed() >= STOP_BOUND {
            for process in busy {
                let _ = kill(Pid::from_raw(process), Signal::SIGKILL);
            }
        }
        wait_for_a_child(&mut signals, children);
    }
}

/// The second look: every task of `look` read again, as it was, and no pid given out since
/// (every new process or thread takes one), so no task was made, ran or was continued in
/// between.
fn unchanged_since(look: &Look) -> bool {
    look.tasks
        .iter()
        .all(|t| read_task(t.process, t.task, t.dir.clone()).as_ref() == Some(t))
        && read_last_pid() == Some(look.last_pid)
}

/// Whether a pid the namespace gave out belongs to a process `look` does not show (one that
/// made itself non-dumpable), or cannot be told (too many pids to probe, or pids given out
/// again from the start: a task above the last pid).
fn hides_a_process(look: &Look) -> bool {
    let shown: Vec<i32> = look.tasks.iter().map(|t| t.task).collect();
    let highest = shown.last().copied().unwrap_or(0);
    if highest > look.last_pid || look.last_pid - shown.len() as i32 > MAX_PROBED {
        return true;
    }
    (2..=look.last_pid)
        .filter(|pid| shown.binary_search(pid).is_err())
        .any(|pid| kill(Pid::from_raw(pid), None::<Signal>) != Err(nix::errno::Errno::ESRCH))
}

/// Kills every other process of the namespace and reaps them all: once PID 1 has no child
/// left, no process is left in its namespace (all are its descendants, and the orphans of
/// the killed are its children).
fn end_everything(signals: &mut Option<SignalFd>, children: &SigSet) {
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    loop {
        match waitpid(
            None::<Pid>,
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
        ) {
            Err(nix::errno::Errno::ECHILD) => return,
            Ok(WaitStatus::StillAlive) => wait_for_a_child(signals, children),
            _ => continue,
        }
    }
}

/// Until a child of PID 1 stops or ends (its SIGCHLD), or [`LOOK_AGAIN_MS`].
fn wait_for_a_child(signals: &mut Option<SignalFd>, children: &SigSet) {
    if signals.is_none() {
        let flags = SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC;
        *signals = SignalFd::with_flags(children, flags).ok();
    }
    let Some(signals) = signals else {
        std::thread::sleep(Duration::from_millis(LOOK_AGAIN_MS.into()));
        return;
    };
    let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
    let _ = poll(&mut fds, PollTimeout::from(LOOK_AGAIN_MS));
    while let Ok(Some(_)) = signals.read_signal() {}
}

/// The namespace as `/proc` shows it; `None` without a readable `/proc`. The last pid is read
/// after the tasks, so that every task shown has a pid up to it (unless pids were given out
/// again from the start).
fn look() -> Option<Look> {
    let mut tasks = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if pid != 1 {
            look_at_process(pid, &mut tasks);
        }
    }
    tasks.sort_by_key(|t| t.task);
    let last_pid = read_last_pid()?;
    Some(Look { tasks, last_pid })
}

fn read_last_pid() -> Option<i32> {
    read_in_one_call("/proc/sys/kernel/ns_last_pid")?
        .trim()
        .parse()
        .ok()
}

/// A process's tasks: the process's own files when it has one thread (the common case: two
/// reads), each thread's otherwise. A process or thread gone meanwhile is left out.
fn look_at_process(process: i32, tasks: &mut Vec<Task>) {
    let dir = format!("/proc/{process}");
    let Some((state, threads)) = read_stat(&dir) else {
        return;
    };
    if threads <= 1 {
        tasks.push(task_of(process, process, dir, state));
        return;
    }
    let Ok(entries) = std::fs::read_dir(format!("{dir}/task")) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(task) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        tasks.extend(read_task(process, task, format!("{dir}/task/{task}")));
    }
}

fn read_task(process: i32, task: i32, dir: String) -> Option<Task> {
    let (state, _) = read_stat(&dir)?;
    Some(task_of(process, task, dir, state))
}

/// The rest of a task's files, read after its `stat` gave its state.
fn task_of(process: i32, task: i32, dir: String, state: u8) -> Task {
    let pausing = state == b'S' && pausing(&dir);
    let other_signals = (pausing || state == b'R') && other_signals_pending(&dir);
    Task {
        process,
        task,
        state,
        pausing,
        other_signals,
        ran: read_ran(&dir),
        dir,
    }
}

/// Whether `dir/status` shows a signal other than `SIGSTOP` or `SIGKILL` pending; unreadable
/// counts as pending (not known to be quiet).
fn other_signals_pending(dir: &str) -> bool {
    read_in_one_call(&format!("{dir}/status")).is_none_or(|status| pending_besides_stop(&status))
}

fn pending_besides_stop(status: &str) -> bool {
    let bit = |signal: Signal| 1u64 << (signal as i32 - 1);
    let expected = bit(Signal::SIGSTOP) | bit(Signal::SIGKILL);
    let pending = ["SigPnd:", "ShdPnd:"].map(|field| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
    });
    pending
        .iter()
        .any(|mask| mask.is_none_or(|mask| mask & !expected != 0))
}

/// Whether the task is blocked in `pause` (or `rt_sigsuspend`), by its `syscall` file (the
/// kernel reads it only while the task is off a CPU, and checks it stayed so): a stop or kill
/// pending, it leaves that call only for the signal's delivery, where it stops. A started
/// interpreter's holder sleeps there for good, so PID 1 need not wait for it to be scheduled
/// and stop. Unreadable (another user's, non-dumpable): not known to be pausing.
fn pausing(dir: &str) -> bool {
    let Some(call) = read_in_one_call(&format!("{dir}/syscall")) else {
        return false;
    };
    let number = call
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<i64>().ok());
    #[cfg(target_arch = "x86_64")]
    if number == Some(libc::SYS_pause) {
        return true;
    }
    number == Some(libc::SYS_rt_sigsuspend)
}

/// The state (field 3) and thread count (field 20) of `dir/stat`.
fn read_stat(dir: &str) -> Option<(u8, usize)> {
    stat_fields(&read_in_one_call(&format!("{dir}/stat"))?)
}

fn stat_fields(stat: &str) -> Option<(u8, usize)> {
    let mut fields = crate::linux::tree::fields_after_name(stat)?;
    let state = *fields.next()?.as_bytes().first()?;
    let threads = fields.nth(16)?.parse().ok()?;
    Some((state, threads))
}

fn read_ran(dir: &str) -> String {
    read_in_one_call(&format!("{dir}/schedstat")).unwrap_or_else(|| {
        let status = std::fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
        status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .collect()
    })
}

/// A small kernel file (a task's `stat`, `schedstat`) in one `read`: no size probe, which
/// `read_to_string` makes first (a `statx` these files answer with 0), and, unlike
/// `linux::read_to_end_unsized`, no second `read` for the end: each of these fits one page.
fn read_in_one_call(path: &str) -> Option<String> {
    use std::io::Read;
    let mut buffer = [0u8; 4096];
    let read = std::fs::File::open(path).ok()?.read(&mut buffer).ok()?;
    String::from_utf8(buffer[..read].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_and_thread_count_are_read_after_the_command_name() {
        let stat = "42 (py thon) (x)) T 1 42 42 0 -1 4194560 1 0 0 0 3 1 2 5 20 0 3 0 7";
        assert_eq!(stat_fields(stat), Some((b'T', 3)));
        assert_eq!(stat_fields("42 (x) S 1"), None);
    }

    #[test]
    fn only_stopped_and_dead_tasks_are_quiet() {
        let task = |state| Task {
            process: 2,
            task: 2,
            dir: "/proc/2".into(),
            state,
            pausing: false,
            other_signals: false,
            ran: String::new(),
        };
        for state in [b'T', b't', b'Z', b'X'] {
            assert!(task(state).quiet(&[]), "{}", state as char);
        }
        for state in [b'R', b'S', b'D', b'I', b'W', b'P'] {
            assert!(!task(state).quiet(&[]), "{}", state as char);
        }
        // Woken by the stop but not run since it was seen in `pause`: still in that call.
        let pausing = Task {
            pausing: true,
            ..task(b'S')
        };
        assert!(task(b'R').quiet(std::slice::from_ref(&pausing)));
        // ... unless a signal besides the stop waits: its handler would run first.
        let signalled = Task {
            other_signals: true,
            ..task(b'R')
        };
        assert!(!signalled.quiet(&[pausing]));
        let ran = Task {
            ran: "1".into(),
            ..task(b'R')
        };
        assert!(!ran.quiet(&[Task {
            pausing: true,
            ..task(b'S')
        }]));
    }

    #[test]
    fn only_a_stop_or_a_kill_may_be_pending() {
        let status = |own: &str, shared: &str| {
            format!("Name:\tpython3\nSigQ:\t1/63\nSigPnd:\t{own}\nShdPnd:\t{shared}\nSigBlk:\t0\n")
        };
        let stop = "0000000000040000";
        let stop_and_kill = "0000000000040100";
        let none = "0000000000000000";
        assert!(!pending_besides_stop(&status(none, stop)));
        assert!(!pending_besides_stop(&status(none, stop_and_kill)));
        // SIGINT (2) waiting beside the stop, on the process or the thread.
        assert!(pending_besides_stop(&status(none, "0000000000040002")));
        assert!(pending_besides_stop(&status("0000000000000002", stop)));
        // Unreadable fields: not known to be quiet.
        assert!(pending_besides_stop("Name:\tpython3\n"));
    }
}

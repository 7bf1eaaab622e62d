//! A started interpreter's CPU before its run. The program PID 1 reaps in such a sandbox is
//! the interpreter started during the preparation, so what it reaps includes the
//! interpreter's start and its preloads' imports (~30-40 ms for `json` and `re`). The shim
//! stops itself (`SIGSTOP`) once it is prepared and before it says ready, so before any
//! request exists; PID 1 sees the stop, reads the CPU the interpreter has used from the
//! kernel (`/proc`, not the interpreter's word), lets it go on, and subtracts that from what
//! it reaps at the end. PID 1 looks for that one stop only: what the code does later (stop
//! itself, say) cannot move the figure.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// CPU time already spent, subtracted from the reaped processes' own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct CpuSpent {
    pub user: Duration,
    pub sys: Duration,
}

/// In PID 1 of a sandbox with a started interpreter: waits until the interpreter has stopped
/// itself, prepared, and returns the CPU it used until then (it has no children yet; any it
/// reaped are counted too). The program's status when it ended instead (a preload that
/// failed): nothing to subtract then, the caller reports the status.
pub(super) fn await_prepared(program: Pid) -> Result<CpuSpent, WaitStatus> {
    loop {
        match waitpid(program, Some(WaitPidFlag::WUNTRACED)) {
            Ok(WaitStatus::Stopped(..)) => {
                let spent = cpu_spent(program);
                // Failing, the interpreter would stay stopped and the pool's ready timeout
                // retires the sandbox.
                let _ = kill(program, Signal::SIGCONT);
                return Ok(spent);
            }
            Ok(status @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => return Err(status),
            Err(nix::errno::Errno::EINTR) | Ok(_) => continue,
            // Not our child (cannot be): nothing known to subtract.
            Err(_) => return Ok(CpuSpent::default()),
        }
    }
}

/// A stopped process's CPU: the total to the nanosecond from `schedstat`, split into user
/// and system time as `stat`'s clock-tick counts say (the only split the kernel gives for
/// another process, in ticks of 10 ms). Zero for what cannot be read.
fn cpu_spent(pid: Pid) -> CpuSpent {
    let read = |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok();
    let ticks = read("stat")
        .and_then(|s| stat_ticks(&s))
        .unwrap_or_default();
    let total = read("schedstat")
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default();
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&hz| hz > 0)
        .map_or(Duration::from_millis(10), |hz| {
            Duration::from_secs(1) / hz as u32
        });
    // Children's CPU (none before a run) is in ticks only.
    let children = tick * (ticks.children_user + ticks.children_sys) as u32;
    split(
        total + children,
        ticks.user + ticks.children_user,
        ticks.sys + ticks.children_sys,
        tick,
    )
}

/// `utime`, `stime`, `cutime` and `cstime` of `/proc/<pid>/stat`, in clock ticks.
#[derive(Debug, Default, PartialEq, Eq)]
struct StatTicks {
    user: u64,
    sys: u64,
    children_user: u64,
    children_sys: u64,
}

fn stat_ticks(stat: &str) -> Option<StatTicks> {
    // Field 3 (the state) comes first after the command name.
    let fields: Vec<&str> = crate::linux::tree::fields_after_name(stat)?.collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(StatTicks {
        user: field(14)?,
        sys: field(15)?,
        children_user: field(16)?,
        children_sys: field(17)?,
    })
}

/// Splits `total` into user and system time. The kernel's own split (the one the reaped
/// rusage uses, kept monotonic per process) lies within a tick above each count and sums to
/// the total; the remainder is shared in the counts' proportion within those bounds. A total
/// below the counts (unreadable) leaves the counts.
fn split(total: Duration, user_ticks: u64, sys_ticks: u64, tick: Duration) -> CpuSpent {
    let user = tick * user_ticks as u32;
    let sys = tick * sys_ticks as u32;
    let rest = total.saturating_sub(user + sys).min(tick * 2);
    let share = match user_ticks + sys_ticks {
        0 => rest / 2,
        all => rest.mul_f64(user_ticks as f64 / all as f64),
    };
    let user_rest = share.clamp(rest.saturating_sub(tick), rest.min(tick));
    CpuSpent {
        user: user + user_rest,
        sys: sys + (rest - user_rest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(10);

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "42 (py thon) (x)) S 1 42 42 0 -1 4194560 1 0 0 0 3 1 2 5 20 0 1 0";
        let ticks = stat_ticks(stat).unwrap();
        assert_eq!(
            ticks,
            StatTicks {
                user: 3,
                sys: 1,
                children_user: 2,
                children_sys: 5
            }
        );
        assert_eq!(stat_ticks("42 (python"), None);
    }

    #[test]
    fn the_total_is_kept_and_shared_within_a_tick_of_each_count() {
        let ms = Duration::from_millis;
        let spent = split(ms(37), 3, 0, TICK);
        assert_eq!(spent.user + spent.sys, ms(37));
        assert_eq!(spent.user, ms(37));
        // A remainder above one tick: each part gets at least what exceeds the other's tick.
        let spent = split(ms(45), 3, 0, TICK);
        assert_eq!((spent.user, spent.sys), (ms(40), ms(5)));
        let spent = split(ms(36), 2, 1, TICK);
        assert_eq!(spent.user + spent.sys, ms(36));
        assert!(spent.user >= ms(20) && spent.sys >= ms(10), "{spent:?}");
        assert_eq!(split(ms(4), 0, 0, TICK).user, ms(2));
        // An unreadable total: the counts.
        assert_eq!(split(Duration::ZERO, 2, 1, TICK).user, ms(20));
    }
}

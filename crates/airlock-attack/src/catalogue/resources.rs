//! Outliving the run and exhausting processes, memory, CPU, disk and inodes.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{attack, Attack, Baseline::*, Group::*, Threat::*};
use crate::host::processes_with;
use crate::plan::{escaped_line, status_in, survivors, Lifecycle, Outcome, Plan};
use crate::scene::Scene;

#[rustfmt::skip]
pub(super) fn attacks() -> Vec<Attack> {
    vec![
        attack("double_fork_setsid_survivor", (A, Lifetime, Bare),
            "marked daemon alive after the run",
            "PID namespace (PID 1's exit kills it), cgroup kill, subreaper",
            double_fork_setsid_survivor),
        attack("supervisor_killed_mid_run", (A, Lifetime, Bare),
            "marked daemon alive after SIGKILL of the CLI",
            "init kills the run on supervisor death, PID namespace",
            |s| killed_when_ready(s, false)),
        attack("supervisor_and_init_killed", (A, Lifetime, Tier0),
            "marked daemon alive after SIGKILL of the CLI's whole process group",
            "PID 1's parent-death signal tears the PID namespace down",
            |s| killed_when_ready(s, true)),
        attack("fork_bomb", (A, Pids, ContainedToo),
            "more than 36 of the bomb's processes on the host at once under `--pids 32` (counted while it runs); host can still fork; airlock returned a result",
            "pids cgroup (root) / RLIMIT_NPROC (unprivileged), wall clock",
            fork_bomb)
            .exclusive(),
        attack("many_processes", (A, Pids, Bare),
            "256 of the program's processes alive at once (counted on the host, or as it reports)",
            "pids cgroup (root) / RLIMIT_NPROC (unprivileged), the profile's `processes = 64`",
            many_processes)
            .exclusive(),
        attack("memory_bomb", (A, Resources, ContainedToo),
            "program allocated 1 GiB under `--mem 128MiB`",
            "memory cgroup (root) / RLIMIT_AS (unprivileged)",
            memory_bomb)
            .exclusive(),
        attack("cpu_loop", (A, Resources, ContainedToo),
            "status is not `cpu_limit`",
            "cgroup CPU accounting, RLIMIT_CPU",
            cpu_loop)
            .exclusive(),
        attack("disk_fill", (A, Resources, Tier0),
            "program wrote 48 MiB under `--disk 16MiB`",
            "size-capped tmpfs workdir",
            disk_fill)
            .exclusive(),
        attack("inode_bomb", (A, Resources, Tier0),
            "program made 3000 files under `--files 300`",
            "inode-capped tmpfs workdir",
            inode_bomb)
            .exclusive(),
    ]
}

fn double_fork_setsid_survivor(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("survivor.py", [s.marker.clone()]),
        survivors(&s.marker),
    )
    .expect(|o| status_in(o, &["exited"])))
}

/// The program leaves a daemon, says READY and waits; then its supervisor is SIGKILLed (with
/// `whole_group`: the supervisor's whole process group, the init included).
fn killed_when_ready(s: &mut Scene, whole_group: bool) -> Result<Plan, String> {
    let mut plan = Plan::new(
        s.python("survivor.py", [s.marker.clone(), "--wait".into()]),
        survivors(&s.marker),
    );
    plan.lifecycle = Lifecycle::KillWhenReady { whole_group };
    Ok(plan)
}

/// How many of the program's processes (its interpreter, forked) the host sees at once;
/// with `code_processes`, those too (the attack runs alone: they are its own).
fn count_on_host(marker: &str, python: &str, code_processes: Option<&str>) -> usize {
    let marked = processes_with(marker)
        .iter()
        .filter(|(_, cmdline)| cmdline.starts_with(python))
        .count();
    marked + code_processes.map_or(0, |needle| processes_with(needle).len())
}

fn fork_bomb(s: &mut Scene) -> Result<Plan, String> {
    const LIMIT: usize = 32;
    let started = Instant::now();
    let evidence = move |o: &Outcome| {
        if let Some(seen) = &o.watched {
            return Some(seen.clone());
        }
        let host_can_fork = Command::new("/bin/true")
            .status()
            .is_ok_and(|st| st.success());
        let took = started.elapsed();
        if !host_can_fork {
            return Some("the host could not fork after the bomb".into());
        }
        (o.status.is_none() || took > Duration::from_secs(30))
            .then(|| format!("no result from airlock within {took:?}"))
    };
    let plan = Plan::new(s.python("fork_bomb.py", [s.marker.clone()]), evidence);
    // The bomb's processes on the host, counted while it runs: a process limit (cgroup, or
    // RLIMIT_NPROC without one) keeps them at the limit; a few more for the runs' own.
    let (marker, python, code) = (
        s.marker.clone(),
        s.stage.python.clone(),
        s.stage.code_processes,
    );
    Ok(plan
        .watch(move || {
            let alive = count_on_host(&marker, &python, code);
            (alive > LIMIT + 4)
                .then(|| format!("{alive} bomb processes on the host at once (--pids {LIMIT})"))
        })
        .limits(["--pids", &LIMIT.to_string(), "--wall", "3s"])
        .expect(|o| status_in(o, &["timeout", "signaled", "exited"])))
}

/// Bounded, and judged against the profile's own process cap: safe to run anywhere.
fn many_processes(s: &mut Scene) -> Result<Plan, String> {
    const COUNT: usize = 256;
    let evidence = |o: &Outcome| o.watched.clone().or_else(|| escaped_line(o));
    let plan = Plan::new(
        s.python("many_processes.py", [s.marker.clone(), COUNT.to_string()]),
        evidence,
    );
    let (marker, python, code) = (
        s.marker.clone(),
        s.stage.python.clone(),
        s.stage.code_processes,
    );
    Ok(plan.watch(move || {
        let alive = count_on_host(&marker, &python, code);
        (alive >= COUNT).then(|| format!("{alive} of the program's processes on the host at once"))
    }))
}

fn memory_bomb(s: &mut Scene) -> Result<Plan, String> {
    let plan = Plan::new(
        s.python("memory_bomb.py", ["1024".to_string()]),
        escaped_line,
    );
    Ok(plan.limits(["--mem", "128MiB"]).expect(|o| {
        if o.cgroup {
            status_in(o, &["memory_limit"])
        } else {
            status_in(o, &["memory_limit", "exited", "signaled"])
        }
    }))
}

fn cpu_loop(s: &mut Scene) -> Result<Plan, String> {
    let evidence = |o: &Outcome| {
        (o.status.as_deref() != Some("cpu_limit")).then(|| {
            format!(
                "the loop was not stopped by the CPU limit (status {:?})",
                o.status
            )
        })
    };
    let plan = Plan::new(s.python("cpu_loop.py", Vec::<String>::new()), evidence);
    // Status cpu_limit (not timeout) proves the CPU budget, not the wall clock, ended it; the
    // wall time it takes depends on how busy the host is.
    Ok(plan
        .limits(["--cpu", "2s", "--wall", "30s"])
        .expect(|o| status_in(o, &["cpu_limit"])))
}

fn disk_fill(s: &mut Scene) -> Result<Plan, String> {
    let plan = Plan::new(s.python("disk_fill.py", ["48".to_string()]), escaped_line);
    Ok(plan
        .limits(["--disk", "16MiB", "--fsize", "8MiB"])
        .stopped_by("disk_quota")
        .expect(|o| status_in(o, &["exited"])))
}

fn inode_bomb(s: &mut Scene) -> Result<Plan, String> {
    let plan = Plan::new(
        s.python("inode_bomb.py", ["3000".to_string()]),
        escaped_line,
    );
    Ok(plan
        .limits(["--files", "300"])
        .stopped_by("inode_quota")
        .expect(|o| status_in(o, &["exited"])))
}

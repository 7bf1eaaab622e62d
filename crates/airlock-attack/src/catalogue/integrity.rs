//! Changing the host: writing outside the workdir, kernel knobs, the run's own cgroup limits,
//! and reaching host processes (signals, ptrace, the terminal).

use std::path::PathBuf;

use super::{attack, Attack, Baseline::*, Group::*, Threat::*};
use crate::plan::{escaped_line, file_exists, status_in, Lifecycle, Outcome, Plan};
use crate::scene::Scene;

#[rustfmt::skip]
pub(super) fn attacks() -> Vec<Attack> {
    vec![
        attack("write_host_tmp", (C, FsWrite, Tier0),
            "file `/tmp/airlock-pwned-…` on the host",
            "rootfs",
            write_host_tmp),
        attack("write_host_dev_shm", (C, FsWrite, Tier0),
            "file `/dev/shm/airlock-pwned-…` on the host",
            "rootfs (a private /dev/shm)",
            write_host_dev_shm),
        attack("write_caller_dir", (C, FsWrite, Tier0),
            "file in the caller's (world-writable) cwd",
            "rootfs, Landlock fs",
            write_caller_dir),
        attack("write_read_only_bind", (C, FsWrite, Tier0),
            "file in a `--ro` dir that is world-writable on the host",
            "read-only bind, Landlock fs (read-only rule)",
            write_read_only_bind),
        attack("write_proc_sys", (D, FsWrite, Bare),
            "host `kernel.domainname` changed",
            "/proc/sys read-only, UTS namespace, seccomp (setdomainname), uid",
            write_proc_sys),
        attack("write_sys", (D, FsWrite, Bare),
            "host `/sys/module/printk/parameters/time` flipped",
            "rootfs (no /sys)",
            write_sys),
        attack("raise_own_cgroup_limits", (D, Resources, Tier0AsRoot),
            "program held 192 MiB under a 96 MiB limit",
            "cgroup namespace, /sys/fs/cgroup absent, uid drop",
            raise_own_cgroup_limits)
            .exclusive()
            .root_only("without root there is no cgroup"),
        attack("signal_host_process", (D, Signal, Tier0),
            "same-uid host victim died",
            "PID namespace, Landlock signal scope",
            signal_host_process),
        attack("ptrace_host_process", (D, Signal, Tier0),
            "victim's TracerPid set (polled from the host)",
            "seccomp (ptrace refused), PID namespace",
            ptrace_host_process),
        attack("ptrace_own_parent", (D, Signal, Tier0AsRoot),
            "attached to its parent (airlock's init / the sandbox's PID 1)",
            "seccomp, non-dumpable PID 1, hidepid",
            ptrace_own_parent),
        attack("tiocsti_injection", (D, Signal, Bare),
            "text pushed into a host pty's input queue",
            "seccomp (TIOCSTI refused), setsid",
            tiocsti_injection),
    ]
}

/// `write_file.py PATH MARKER`, judged by `path` appearing on the host.
fn write_to(s: &Scene, path: PathBuf) -> Plan {
    Plan::new(
        s.python(
            "write_file.py",
            [path.display().to_string(), s.marker.clone()],
        ),
        file_exists(path),
    )
}

fn write_host_tmp(s: &mut Scene) -> Result<Plan, String> {
    let target = PathBuf::from(format!("/tmp/airlock-pwned-{}", s.marker));
    s.remove_later(&target);
    Ok(write_to(s, target))
}

/// The host's shared memory directory outlives every process: a file left there persists
/// after the run and is readable by whoever shares the host's /dev/shm.
fn write_host_dev_shm(s: &mut Scene) -> Result<Plan, String> {
    let target = PathBuf::from(format!("/dev/shm/airlock-pwned-{}", s.marker));
    s.remove_later(&target);
    Ok(write_to(s, target))
}

fn write_caller_dir(s: &mut Scene) -> Result<Plan, String> {
    let cwd = s.dir.join("caller-cwd");
    s.make_dir(&cwd, 0o777)?;
    let mut plan = write_to(s, cwd.join("pwned"));
    plan.cwd = Some(cwd);
    Ok(plan)
}

fn write_read_only_bind(s: &mut Scene) -> Result<Plan, String> {
    let exposed = s.dir.join("read-only");
    s.make_dir(&exposed, 0o777)?;
    let plan = write_to(s, exposed.join("pwned"));
    Ok(plan.flags(["--ro".to_string(), exposed.display().to_string()]))
}

fn write_proc_sys(s: &mut Scene) -> Result<Plan, String> {
    let knob = "/proc/sys/kernel/domainname";
    let original = std::fs::read_to_string(knob).map_err(|e| format!("cannot read {knob}: {e}"))?;
    let value = format!("pwned-{}", &s.marker[s.marker.len() - 8..]);
    s.on_cleanup(move || {
        if std::fs::read_to_string(knob).is_ok_and(|now| now != original) {
            let _ = std::fs::write(knob, original.trim_end());
        }
    });
    let expected = value.clone();
    let evidence = move |_: &Outcome| {
        let now = std::fs::read_to_string(knob).unwrap_or_default();
        (now.trim() == expected).then(|| format!("host {knob} is now {expected:?}"))
    };
    Ok(Plan::new(
        s.python("write_file.py", [knob.to_string(), value]),
        evidence,
    ))
}

fn write_sys(s: &mut Scene) -> Result<Plan, String> {
    let knob = "/sys/module/printk/parameters/time";
    let original = std::fs::read_to_string(knob)
        .map_err(|e| format!("cannot read {knob}: {e}"))?
        .trim()
        .to_string();
    let flipped = if original == "Y" { "N" } else { "Y" };
    let restore = original.clone();
    s.on_cleanup(move || {
        let _ = std::fs::write(knob, &restore);
    });
    let evidence = move |_: &Outcome| {
        let now = std::fs::read_to_string(knob).unwrap_or_default();
        (now.trim() != original)
            .then(|| format!("host {knob} flipped from {original} to {}", now.trim()))
    };
    Ok(Plan::new(
        s.python("write_file.py", [knob.to_string(), flipped.to_string()]),
        evidence,
    ))
}

fn raise_own_cgroup_limits(s: &mut Scene) -> Result<Plan, String> {
    let plan = Plan::new(
        s.python("cgroup_raise.py", ["192".to_string()]),
        escaped_line,
    );
    Ok(plan
        .limits(["--mem", "96MiB"])
        .expect(|o| status_in(o, &["exited", "memory_limit"])))
}

fn signal_host_process(s: &mut Scene) -> Result<Plan, String> {
    let victim = s.victim("", "")?;
    let pid = victim.pid;
    let evidence = move |_: &Outcome| (!victim.alive()).then(|| format!("victim {pid} is dead"));
    Ok(Plan::new(
        s.python("signal_pid.py", [pid.to_string()]),
        evidence,
    ))
}

fn ptrace_host_process(s: &mut Scene) -> Result<Plan, String> {
    let victim = s.victim("", "")?;
    let pid = victim.pid;
    let plan = Plan::new(
        s.python("ptrace_pid.py", [pid.to_string()]),
        |o: &Outcome| o.watched.clone(),
    );
    Ok(plan.watch(move || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let tracer = status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))?
            .trim()
            .to_string();
        (tracer != "0").then(|| format!("victim {pid} was traced by host pid {tracer}"))
    }))
}

fn ptrace_own_parent(s: &mut Scene) -> Result<Plan, String> {
    Ok(Plan::new(
        s.python("ptrace_pid.py", ["parent".to_string()]),
        escaped_line,
    ))
}

fn tiocsti_injection(s: &mut Scene) -> Result<Plan, String> {
    let command = format!("echo {}", s.marker);
    let marker = s.marker.clone();
    let evidence = move |o: &Outcome| {
        let input = o.pty_input.as_deref()?;
        input
            .contains(&marker)
            .then(|| format!("the terminal's input queue now holds {input:?}"))
    };
    let mut plan = Plan::new(s.python("tiocsti.py", [command]), evidence);
    plan.lifecycle = Lifecycle::Terminal;
    Ok(plan)
}

#!/usr/bin/python3
"""Where the time of one `airlock run` goes, from outside: strace with a seccomp-bpf filter
(--seccomp-bpf) stops only on a handful of marker syscalls, so the untraced work runs at full
speed; the gaps between markers are the phases. Repeats the run and prints the median of each
phase.

    bench/phases.py [--runs 30] [--airlock target/release/airlock] [-- airlock-run-flags...]

Examples:
    bench/phases.py                      # native backend, profile untrusted, /bin/true
    bench/phases.py -- --no-cgroup       # the same without cgroups
    bench/phases.py -- --dev --backend none
"""

import argparse
import os
import re
import statistics
import subprocess
import tempfile

MARKERS = (
    "execve,clone,clone3,setsid,unshare,pivot_root,landlock_restrict_self,seccomp,wait4,rmdir,"
    "exit_group"
)
LINE = re.compile(r"^(\d+) +(\d\d):(\d\d):(\d\d\.\d+) (.*)$")

# (name, start marker, end marker, backends); "native" phases need the unshare marker.
PHASES = [
    ("supervisor: exec, parse, plan, spawn init", "start", "spawn", "both"),
    ("init: start, read spec, run dirs, create cgroup", "spawn", "fork_child", "both"),
    ("child: join cgroup", "fork_child", "setsid", "both"),
    ("child: session, rlimits, uid drop", "setsid", "unshare", "native"),
    ("child: unshare, id maps, fork PID 1", "unshare", "pid1_fork", "native"),
    ("PID 1: build root fs (mounts, pivot_root)", "pid1_fork", "pivot_last", "native"),
    ("PID 1: hostname, Landlock", "pivot_last", "landlock", "native"),
    ("PID 1: no_new_privs, caps, seccomp", "landlock", "seccomp_last", "native"),
    ("PID 1: fork program, exec", "seccomp_last", "exec", "native"),
    ("child: session, rlimits, uid drop, exec (Tier 0)", "setsid", "exec", "tier0"),
    ("program runs", "exec", "prog_exit", "both"),
    ("PID 1: reap, file-size check, exit_group", "prog_exit", "pid1_exit", "native"),
    ("PID 1 exit (PID namespace teardown)", "pid1_exit", "pid1_gone", "native"),
    ("mirror exit (mount/user/net ns teardown)", "pid1_gone", "mirror_gone", "native"),
    ("init: reap, kill round, usage, cleanup", "mirror_gone", "init_exit", "native"),
    ("init: program exit to exit_group (kill round, cleanup)", "prog_exit", "init_exit", "tier0"),
    ("  of which: first cgroup rmdir to exit_group", "rmdir", "init_exit", "both"),
    ("init exit, supervisor joins threads, exits", "init_exit", "end", "both"),
]


def seconds(h: str, m: str, s: str) -> float:
    return int(h) * 3600 + int(m) * 60 + float(s)


def markers(trace_path: str, program: str) -> dict[str, float]:
    """Times (ms from the supervisor's exec) of the marker events of one traced run. Processes
    are told apart by what they do: the init execs `__init`, the child calls setsid, the mirror
    unshare, PID 1 pivot_root, the program execs the workload."""
    events: list[tuple[int, float, str]] = []
    with open(trace_path) as trace:
        for raw in trace:
            match = LINE.match(raw)
            if match:
                pid, h, m, s, rest = match.groups()
                events.append((int(pid), seconds(h, m, s) * 1000, rest))
    t0, sup = events[0][1], events[0][0]
    roles = {sup: "sup"}
    init = forked_init(events, sup)
    if init is not None:
        roles[init] = "init"
    found = {"start": 0.0}
    becomes = [
        ("init", 'execve("'),
        ("child", "setsid("),
        ("pid1", "pivot_root("),
        ("prog", f'execve("{program}"'),
    ]
    for pid, when, rest in events:
        for becomes_role, prefix in becomes:
            if rest.startswith(prefix) and (becomes_role != "init" or '"__init"' in rest):
                roles[pid] = becomes_role
        role, at = roles.get(pid, ""), when - t0  # "": no role (yet)
        call = rest.split("(", 1)[0]
        key = {
            ("sup", "clone"): "spawn",
            ("init", "clone"): "fork_child",
            ("init", "rmdir"): "rmdir",
            ("init", "exit_group"): "init_exit",
            ("child", "setsid"): "setsid",
            ("child", "unshare"): "unshare",
            ("child", "clone"): "pid1_fork",
            ("child", "+++ exited with 0 +++"): "mirror_gone",
            ("pid1", "landlock_restrict_self"): "landlock",
            ("pid1", "exit_group"): "pid1_exit",
            ("pid1", "+++ exited with 0 +++"): "pid1_gone",
            ("prog", "execve"): "exec",
            ("prog", "exit_group"): "prog_exit",
            ("sup", "+++ exited with 0 +++"): "end",
        }.get((role, call))
        if role == "sup" and call == "clone" and "CLONE_THREAD" in rest:
            key = None
        if key:
            found.setdefault(key, at)
        if role == "pid1" and call in ("pivot_root", "seccomp"):
            found["pivot_last" if call == "pivot_root" else "seccomp_last"] = at
    return found


def forked_init(events: list[tuple[int, float, str]], sup: int) -> int | None:
    """The init the supervisor forked (the CLI forks it; a threaded caller executes `__init`,
    which `markers` recognises by the exec): the pid its first process clone returned."""
    for pid, _, rest in events:
        if pid != sup or "CLONE_THREAD" in rest or "clone" not in rest.split("(", 1)[0]:
            continue
        returned = re.search(r"= (\d+)$", rest)
        if returned:
            return int(returned.group(1))
    return None


def one_run(airlock: str, flags: list[str], workload: list[str]) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(prefix="airlock-phases-", suffix=".strace") as trace:
        command = [
            "strace",
            "-f",
            "--seccomp-bpf",
            "-tt",
            "-e",
            "trace=" + MARKERS,
            "-o",
            trace.name,
            airlock,
            "run",
            *flags,
            "--",
            *workload,
        ]
        # The exit status is checked below, to show strace's and airlock's stderr.
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"run failed: {' '.join(command)}\n{done.stderr.decode()}")
        return markers(trace.name, workload[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--airlock",
        default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "airlock"),
    )
    parser.add_argument("--workload", default="/bin/true")
    parser.add_argument("flags", nargs="*")
    args = parser.parse_args()
    workload = args.workload.split()
    one_run(args.airlock, args.flags, workload)  # warmup
    runs = [one_run(args.airlock, args.flags, workload) for _ in range(args.runs)]
    print(
        f"airlock run {' '.join(args.flags)} -- {args.workload}:"
        f" median of {args.runs} traced runs (ms)"
    )
    native = all("unshare" in r for r in runs)
    for name, start, end, kind in PHASES:
        if kind == ("tier0" if native else "native"):
            continue
        spans = [r[end] - r[start] for r in runs if start in r and end in r]
        if len(spans) == len(runs):
            print(f"  {name:<50} {statistics.median(spans):7.2f}")
    totals = [r["end"] for r in runs]
    print(f"  {'total (traced)':<50} {statistics.median(totals):7.2f}")


if __name__ == "__main__":
    main()

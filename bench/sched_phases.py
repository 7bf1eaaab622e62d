#!/usr/bin/python3
"""Where a cold `airlock run -- /bin/true` spends its wall time, per process and phase, for two
builds interleaved (A B B A ...), from the kernel's process tracepoints recorded system-wide
(`perf record -a -e sched:sched_process_{fork,exec,exit}`): nothing is attached to the traced
processes, so unlike `phases.py` (strace stops, which make a ~10 ms run take ~35) the runs go
at their own speed. Needs root and perf.

    bench/sched_phases.py BUILD_A BUILD_B [--runs 25] [--backend bwrap]

Each phase is the median over the build's runs (ms from the CLI's exec):
  start -> CLI's fork       the CLI's start, arguments, profile, plan, and the fork of its init
  CLI's fork -> init's fork the init's start (its directories, cgroup, a wrapper's files)
  init's fork -> exec       the init's child until it executes bwrap (or, native, the program)
  tool exit -> init exit    the init's end (kill round, usage, clean-up); bwrap runs only
  init exit -> CLI exit     the CLI's end after its init's
A build whose CLI hands its init the run over a socket (`sendmsg`) gets two more rows, the CLI's
hand-over and the init's wake-up (`recvmsg` returning).
"""

import argparse
import re
import statistics
import subprocess
import tempfile
from typing import Any

EVENTS = (
    "sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit,"
    "syscalls:sys_enter_sendmsg,syscalls:sys_exit_recvmsg"
)
LINE = re.compile(r"\s*(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)")

Run = dict[str, Any]  # one run's marks: ms from the CLI's exec, its pids and build


def field(pattern: str, text: str) -> str:
    """The first group of `pattern` in a tracepoint's text, which perf always prints."""
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(f"no {pattern!r} in {text!r}")
    return found[1]


def record(builds: list[str], backend: str, runs: int, data: str) -> None:
    def one(build: str) -> str:
        return f"{build} run --backend {backend} -- /bin/true >/dev/null 2>&1"

    a, b = builds
    loop = f"for i in $(seq {runs}); do {one(a)}; {one(b)}; {one(b)}; {one(a)}; done"
    subprocess.run(
        [
            "perf",
            "record",
            "-q",
            "-a",
            "-o",
            data,
            "-e",
            EVENTS,
            "--",
            "sh",
            "-c",
            loop,
        ],
        check=True,
        stderr=subprocess.DEVNULL,
    )


def parse(data: str, builds: list[str]) -> dict[str, list[Run]]:
    """Each finished run's marks, by build: a run is the process tree of one exec of a build."""
    script = ["perf", "script", "-i", data, "-F", "pid,time,event,trace"]
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    done: dict[str, list[Run]] = {b: [] for b in builds}
    runs: dict[int, Run] = {}  # the CLI's pid -> its run's marks
    owner: dict[int, int] = {}  # every pid of a run -> the run's CLI
    for line in out.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        pid, ms, event, rest = int(match[1]), float(match[2]) * 1000, match[3], match[4]
        if event.endswith("exec") and pid not in owner:
            build = field(r"filename=(\S+)", rest)
            if build in done:
                runs[pid] = {"t0": ms, "build": build, "init": None, "child": None}
                owner[pid] = pid
            continue
        if pid not in owner:
            continue
        cli = owner[pid]
        run = runs[cli]
        at = ms - run["t0"]
        if event.endswith("fork"):
            child = int(field(r"child_pid=(\d+)", rest))
            owner[child] = cli
            if pid == cli and run["init"] is None:
                run["init"], run["cli_fork"] = child, at
            elif pid == run["init"] and run["child"] is None:
                run["child"], run["init_fork"] = child, at
        elif event.endswith("exec"):
            if "bwrap" in rest:
                run["exec"], run["tool"] = at, pid
            elif "/bin/true" in rest:
                run["program"] = at
                run.setdefault("exec", at)
        elif event.endswith("sendmsg") and pid == cli:
            run.setdefault("handoff", at)
        elif event.endswith("recvmsg") and pid == run["init"]:
            run.setdefault("received", at)
        elif event.endswith("exit"):
            if pid == run.get("tool"):
                run["tool_exit"] = at
            elif pid == run["init"]:
                run["init_exit"] = at
            elif pid == cli:
                run["end"] = at
                done[run["build"]].append(run)
    return done


PHASES = [
    ("start -> CLI's fork", "start", "cli_fork"),
    ("start -> CLI's hand-over (sendmsg)", "start", "handoff"),
    ("hand-over -> the init awake (recvmsg)", "handoff", "received"),
    ("CLI's fork -> init's fork", "cli_fork", "init_fork"),
    ("init's fork -> exec (bwrap or the program)", "init_fork", "exec"),
    ("start -> exec", "start", "exec"),
    ("tool exit -> init exit", "tool_exit", "init_exit"),
    ("init exit -> CLI exit", "init_exit", "end"),
    ("total", "start", "end"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("builds", nargs=2)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--backend", default="bwrap")
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile(prefix="airlock-sched-", suffix=".data") as data:
        record(args.builds, args.backend, args.runs, data.name)
        done = parse(data.name, args.builds)
    print(f"airlock run --backend {args.backend} -- /bin/true, medians (ms)")
    for build, runs in done.items():
        print(f"{build}: {len(runs)} runs")
        for name, start, end in PHASES:
            spans = [r[end] - r.get(start, 0.0) for r in runs if end in r]
            if spans and (start == "start" or all(start in r for r in runs)):
                print(f"  {name:<44} {statistics.median(spans):6.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Regenerates symbol-order.txt: the functions of the `airlock` binary that runs execute, cold
and on a warm pool's prepared sandbox.

build.rs passes the file to lld's --symbol-ordering-file, which places those functions
together at the start of `.text`: each process of a run (the CLI, its forked init, the
namespace child, PID 1) then maps its code in a few fault-around windows instead of faulting
pages spread over the whole text (BENCHMARKS.md, "Where the time goes").

Usage, as root (the native backend and perf need it), from the workspace root:

    cargo build --release --workspace --bins
    cp target/release/airlock /tmp/airlock-order/airlock
    crates/airlock-cli/link/order_symbols.py /tmp/airlock-order/airlock

`order_symbols.py --check <binary>` says how many of the listed functions a build has.

The binary must be the workspace's release build (the one README and airlock-bench use):
symbol names carry hashes of the build's crates, and a name the link no longer finds is
skipped (a stale file costs only the ordering of what changed). Needs `perf`; `valgrind`
adds the functions too brief for sampling to see (runs under valgrind stop at the
sandbox's descriptor limit, so it only sees the CLI's and the init's first steps).

Functions are found two ways: CPU samples with their DWARF-unwound callers in every process
of many runs, and callgrind's exact list for the CLI. They are grouped by the deepest
process that runs them (PID 1's first, then the namespace child's, the init's, the CLI's),
so each forked process finds its code in a prefix of the ordered text; hottest first within
a group.
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

RUNS = int(os.environ.get("RUNS", "200"))
PYTHON = "/usr/bin/python3"
ROLES = ["cli", "init", "nschild", "pid1"]
OUTPUT = Path(__file__).resolve().parent / "symbol-order.txt"


def workload(binary: str) -> list[list[str]]:
    """The cold runs users make: native with output forwarded or captured, a script on
    stdin, a failing program, Python; the bwrap backend's (its init forks a child that
    executes bwrap: the planning, set-up and watching that only wrapped runs do); and a
    warm run (`--warm`), whose processes run code no cold run does."""
    return [
        [binary, "run", "--", "/bin/true"],
        [binary, "run", "--json", "--", "/bin/true"],
        [binary, "run", "--", PYTHON, "-c", "pass"],
        [binary, "run", "--", "/bin/sh", "-c", "echo hi; exit 3"],
        [binary, "run", "--", "/bin/false"],
        [binary, "run", "--backend", "bwrap", "--", "/bin/true"],
        [binary, "run", "--backend", "bwrap", "--", PYTHON, "-c", "pass"],
        # A prepared sandbox's run (a pool of one): the init spawner, the forked init, the
        # namespace child entering the shared root and PID 1 completing its copy and waiting
        # for the command, the code a warm pool's every sandbox runs.
        [binary, "run", "--warm", "--", "/bin/true"],
    ]


def write_loop(binary: str, work: Path) -> Path:
    script = work / "loop.sh"
    lines = ["#!/bin/sh", f"for i in $(seq 1 {RUNS}); do"]
    lines += [
        "  " + " ".join(f"'{a}'" for a in cmd) + " >/dev/null 2>&1" for cmd in workload(binary)
    ]
    lines += ["done", "exit 0"]
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


def sampled(binary: str, work: Path) -> dict[str, tuple[int, int]]:
    """Function -> (deepest role index, samples), from perf over the workload."""
    data = work / "perf.data"
    subprocess.run(
        [
            "perf",
            "record",
            "-q",
            "-F",
            "20000",
            "-e",
            "cpu-clock",
            "--call-graph",
            "dwarf,16384",
            "-o",
            str(data),
            str(write_loop(binary, work)),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    script = subprocess.run(
        [
            "perf",
            "script",
            "-i",
            str(data),
            "-F",
            "pid,ip,sym,dso",
            "--no-demangle",
            "--show-task-events",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return parse_samples(script, Path(binary).name)


def parse_samples(script: str, name: str) -> dict[str, tuple[int, int]]:
    depth: dict[int, int] = {}
    found: dict[str, tuple[int, int]] = {}
    pid = 0
    for line in script.splitlines():
        fork = re.search(r"PERF_RECORD_FORK\((\d+):\d+\):\((\d+):\d+\)", line)
        if fork:
            child, parent = int(fork.group(1)), int(fork.group(2))
            if parent in depth:
                depth[child] = depth[parent] + 1
            continue
        execd = re.search(r"PERF_RECORD_COMM exec: (\S+):(\d+)/", line)
        if execd:
            if execd.group(1) == name[:15]:
                depth[int(execd.group(2))] = 0
            else:
                depth.pop(int(execd.group(2)), None)
            continue
        head = re.match(r"\s*(\d+)\s", line)
        if head:
            pid = int(head.group(1))
            continue
        frame = re.match(r"\s+[0-9a-f]+ (\S+) \((.*)\)$", line)
        if frame and frame.group(2).endswith("/" + name) and pid in depth:
            symbol = re.sub(r"\+0x[0-9a-f]+$", "", frame.group(1))
            if symbol != "[unknown]":
                role = min(depth[pid], len(ROLES) - 1)
                deepest, count = found.get(symbol, (0, 0))
                found[symbol] = (max(deepest, role), count + 1)
    return found


def traced(binary: str, work: Path) -> set[str]:
    """Functions callgrind saw execute (the CLI's few-instruction ones sampling misses)."""
    try:
        for index, cmd in enumerate(workload(binary)):
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    "--demangle=no",
                    "--trace-children=yes",
                    f"--callgrind-out-file={work}/cg.{index}.%p",
                    *cmd,
                ],
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=300,
            )
    except FileNotFoundError:
        print("valgrind not found: ordering from samples only", file=sys.stderr)
        return set()
    functions: set[str] = set()
    for path in work.glob("cg.*"):
        functions |= callgrind_functions(path.read_text(errors="replace"), Path(binary).name)
    return functions


def callgrind_functions(text: str, name: str) -> set[str]:
    objects: dict[str, str] = {}
    names: dict[str, str] = {}
    current = ""
    functions: set[str] = set()
    for line in text.splitlines():
        entry = re.match(r"^(c?ob|c?fn)=\((\d+)\)(?: (.*))?$", line)
        if not entry:
            continue
        kind, ident, label = entry.groups()
        table = objects if kind.endswith("ob") else names
        if label:
            table[ident] = label
        if kind == "ob":
            current = objects.get(ident, "")
        elif kind == "fn" and current.endswith("/" + name):
            # callgrind marks recursion levels (name'2) and names what has no symbol by its
            # address (0x...) or in parentheses ("(below main)"): no link can order those.
            function = re.sub(r"'\d+$", "", names[ident])
            if not function.startswith(("0x", "(")):
                functions.add(function)
    return functions


def check(binary: str) -> None:
    """How many of the file's functions a build still has (fewer: regenerate the file)."""
    listed = OUTPUT.read_text().split()
    nm = subprocess.run(
        ["nm", "--defined-only", binary], check=True, capture_output=True, text=True
    )
    present = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    found = sum(symbol in present for symbol in listed)
    print(f"{found} of the {len(listed)} functions in {OUTPUT.name} are in {binary}")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--check"] and len(args) == 2:
        check(args[1])
        return
    if len(args) != 1 or args[0].startswith("-"):
        sys.exit(__doc__)
    binary = str(Path(args[0]).resolve())
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary}: not an executable file; give the airlock release binary")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        found = sampled(binary, work)
        for symbol in traced(binary, work) - found.keys():
            found[symbol] = (0, 0)
    if not found:
        # Runs that failed or a binary without symbols: keep the file there is.
        sys.exit(f"no function of {binary} was seen running; {OUTPUT} left as it was")
    # Deepest role first, then hottest, then by name (a stable file between runs).
    order = sorted(found, key=lambda s: (-found[s][0], -found[s][1], s))
    OUTPUT.write_text("".join(f"{symbol}\n" for symbol in order))
    print(f"{len(order)} functions written to {OUTPUT}")


if __name__ == "__main__":
    main()

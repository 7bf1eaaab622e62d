"""Benchmark of the Python client (the figures go to BENCHMARKS.md).

- the overhead of ``Sandbox.run`` over running the same ``airlock run --json`` directly;
- the latency of a ``@tool`` call under PERMISSIVE, SUBPROCESS and SANDBOXED;
- with ``--url`` (an airlockd), ``Sandbox.run`` in daemon mode against local mode.

Runs are interleaved so that both sides see the same machine state. Usage:
``python bench.py [--runs N] [--url unix:///path/airlockd.sock --api-key KEY]`` (default 40).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airlock import (
    Sandbox,
    SandboxPolicy,
    Tool,
    ToolResult,
    find_binary,
    run_under_sandbox,
    tool,
)

TOOL_SOURCE = "def conjugate(verb, tense):\n    return {'yo': verb[:-2] + 'o', 'tense': tense}\n"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def summary(name: str, samples: list[float]) -> str:
    samples = sorted(samples)
    p90 = samples[int(len(samples) * 0.9) - 1]
    return f"{name:<34} p50 {statistics.median(samples):7.2f} ms   p90 {p90:7.2f} ms"


def bench_run(runs: int) -> None:
    binary = find_binary("airlock")
    argv = [binary, "run", "--json", "--profile", "untrusted", "--", "/bin/true"]
    sandbox = Sandbox(url="local")
    cli: list[float] = []
    client: list[float] = []
    sandbox.run(["/bin/true"])  # warm: the page cache
    for i in range(runs):
        # Alternate which side goes first, so neither always runs right after the other.
        pair = [
            (cli, lambda: subprocess.run(argv, capture_output=True, check=True)),
            (client, lambda: sandbox.run(["/bin/true"])),
        ]
        for samples, fn in pair if i % 2 else reversed(pair):
            samples.append(timed(fn))
    print(summary("airlock run --json /bin/true (CLI)", cli))
    print(summary("Sandbox.run(['/bin/true'])", client))
    overhead = statistics.median(client) - statistics.median(cli)
    print(f"{'Sandbox.run overhead over the CLI':<34} p50 {overhead:+7.2f} ms")


def bench_daemon(runs: int, url: str, api_key: str | None) -> None:
    local, daemon = Sandbox(url="local"), Sandbox(url=url, api_key=api_key)
    for sandbox in (local, daemon):
        warm = sandbox.run(["/bin/true"])
        assert warm.ok, warm
    local_ms: list[float] = []
    daemon_ms: list[float] = []
    for i in range(runs):
        pair = [
            (local_ms, lambda: local.run(["/bin/true"])),
            (daemon_ms, lambda: daemon.run(["/bin/true"])),
        ]
        for samples, fn in pair if i % 2 else reversed(pair):
            samples.append(timed(fn))
    print(summary("Sandbox.run, local mode", local_ms))
    print(summary("Sandbox.run, daemon mode", daemon_ms))
    difference = statistics.median(daemon_ms) - statistics.median(local_ms)
    print(f"{'daemon mode over local mode':<34} p50 {difference:+7.2f} ms")


def bench_tools(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        (root / "bench_tools.py").write_text(TOOL_SOURCE)
        sys.path.insert(0, tmp)
        import bench_tools

        for policy in (SandboxPolicy.PERMISSIVE, SandboxPolicy.SUBPROCESS, SandboxPolicy.SANDBOXED):
            t = tool(policy=policy, timeout="10s", url="local")(bench_tools.conjugate)
            first = t.call(verb="hablar", tense="present")
            assert isinstance(first, ToolResult), first

            def one_call(t: Tool[Any] = t) -> object:
                return run_under_sandbox(t, {"verb": "hablar", "tense": "x"})

            samples = [timed(one_call) for _ in range(runs)]
            print(summary(f"@tool call, {policy.name}", samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--url", help="an airlockd to compare daemon mode with local mode")
    parser.add_argument("--api-key")
    args = parser.parse_args()
    runs = max(10, args.runs)
    print(f"{runs} runs each, interleaved; python {sys.version.split()[0]}")
    bench_run(runs)
    bench_tools(runs)
    if args.url:
        bench_daemon(runs, args.url, args.api_key)


if __name__ == "__main__":
    main()

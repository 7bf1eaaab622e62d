"""Benchmark of the Python client in local mode (the figures go to BENCHMARKS.md).

- the overhead of ``Sandbox.run`` over running the same ``airlock run --json`` directly;
- the latency of a ``@tool`` call under PERMISSIVE, SUBPROCESS and SANDBOXED.

Runs are interleaved so that both sides see the same machine state. Usage:
``python bench.py [--runs N]`` (default 40).
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
    sandbox = Sandbox()
    cli: list[float] = []
    client: list[float] = []
    sandbox.run(["/bin/true"])  # warm: the flag probe and the page cache
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


def bench_tools(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        (root / "bench_tools.py").write_text(TOOL_SOURCE)
        sys.path.insert(0, tmp)
        import bench_tools

        for policy in (SandboxPolicy.PERMISSIVE, SandboxPolicy.SUBPROCESS, SandboxPolicy.SANDBOXED):
            t = tool(policy=policy, timeout="10s")(bench_tools.conjugate)
            first = t.call(verb="hablar", tense="present")
            assert isinstance(first, ToolResult), first

            def one_call(t: Tool[Any] = t) -> object:
                return run_under_sandbox(t, {"verb": "hablar", "tense": "x"})

            samples = [timed(one_call) for _ in range(runs)]
            print(summary(f"@tool call, {policy.name}", samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    runs = max(10, parser.parse_args().runs)
    print(f"{runs} runs each, interleaved; python {sys.version.split()[0]}")
    bench_run(runs)
    bench_tools(runs)


if __name__ == "__main__":
    main()

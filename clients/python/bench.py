"""Benchmark of the Python client (the figures go to BENCHMARKS.md).

- the overhead of ``Sandbox.run`` over running the same ``airlock run --json`` directly;
- the latency of a ``@tool`` call under PERMISSIVE, SUBPROCESS and SANDBOXED;
- with ``--url`` (an airlockd), ``Sandbox.run`` in daemon mode against local mode, and an
  MCP tool call over the daemon's ``/mcp`` (streamable HTTP) against ``airlock-mcp`` over stdio.

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


async def _mcp_latency(runs: int, url: str, api_key: str | None) -> dict[str, list[float]]:
    """Both MCP transports open at once, calls interleaved: ``describe_policy`` (the protocol
    and the server, no sandbox) and ``run_code`` of ``pass`` (a sandboxed Python run)."""
    import contextlib

    import httpx2
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    from airlock import mcp_server_command

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if url.startswith("unix://"):
        transport = httpx2.AsyncHTTPTransport(uds=url.removeprefix("unix://"))
        http = httpx2.AsyncClient(transport=transport, headers=headers, timeout=300)
        endpoint = "http://localhost/mcp"
    else:
        http = httpx2.AsyncClient(headers=headers, timeout=300)
        endpoint = url.rstrip("/") + "/mcp"
    command, *args = mcp_server_command("untrusted")
    samples: dict[str, list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        sessions = {}
        for name, streams in (
            ("stdio", stdio_client(StdioServerParameters(command=command, args=args))),
            ("http", streamable_http_client(endpoint, http_client=http)),
        ):
            read, write = await stack.enter_async_context(streams)
            sessions[name] = await stack.enter_async_context(ClientSession(read, write))
            await sessions[name].initialize()
        calls = [("describe_policy", {}), ("run_code", {"code": "pass"})]
        for i in range(runs + 2):
            order = list(sessions.items()) if i % 2 else list(reversed(sessions.items()))
            for transport_name, session in order:
                for tool_name, arguments in calls:
                    start = time.perf_counter()
                    result = await session.call_tool(tool_name, arguments)
                    elapsed = (time.perf_counter() - start) * 1000
                    assert not result.is_error, result
                    if i >= 2:  # the first two rounds warm both servers
                        samples.setdefault(f"{tool_name} over {transport_name}", []).append(elapsed)
    await http.aclose()
    return samples


def bench_mcp(runs: int, url: str, api_key: str | None) -> None:
    import asyncio

    for name, samples in asyncio.run(_mcp_latency(runs, url, api_key)).items():
        print(summary(f"MCP {name}", samples))


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
        bench_mcp(runs, args.url, args.api_key)


if __name__ == "__main__":
    main()

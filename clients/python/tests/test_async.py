"""The asyncio API without blocking: sessions and their files over ``httpx.AsyncClient`` in
daemon mode (the synchronous client is made unusable to prove it), and a cancelled task's
run or tool call ends ``cancelled`` on the daemon with nothing left running."""

from __future__ import annotations

import asyncio
import importlib
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Airlockd, Mode

from airlock import AsyncSandbox, SandboxPolicy, WorkspaceError, _daemon, tool


def test_async_sessions_and_files(mode: Mode, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_blocking_client(self: _daemon.Daemon) -> httpx.Client:
        raise AssertionError("the async API used the blocking HTTP client")

    monkeypatch.setattr(_daemon.Daemon, "client", no_blocking_client)

    async def main() -> tuple[str | None, list[str], bytes, str]:
        async with AsyncSandbox.session(wall="30s", **mode.kw) as s:
            await s.afiles.write("in/x.txt", "42")
            r = await s.run_code("print(int(open('in/x.txt').read()) + 1)")
            assert r.ok, r
            events = [e async for e in s.stream(["sh", "-c", "echo streamed > out.txt"])]
            assert events
            names = await s.afiles.list()
            with pytest.raises(WorkspaceError) as refused:
                await s.afiles.read("../etc/passwd")
            assert refused.value.reason == "outside_workspace"
            return s.id, names, await s.afiles.read("out.txt"), r.stdout

    session_id, names, out, stdout = asyncio.run(main())
    assert names == ["in", "out.txt"] and out == b"streamed\n" and stdout == "43\n"
    assert (session_id is not None) == (mode.name == "daemon")


def _client(daemon: Airlockd) -> httpx.Client:
    return httpx.Client(
        base_url=daemon.https_url,
        headers={"Authorization": f"Bearer {daemon.key}"},
        verify=ssl.create_default_context(cafile=daemon.ca_file),
    )


def _runs_since(daemon: Airlockd, since_ms: int, needle: str) -> list[dict[str, Any]]:
    with _client(daemon) as client:
        runs = client.get("/v1/runs", params={"since": str(since_ms)}).json()["runs"]
    return [r for r in runs if needle in str(r["request"])]


def _ended(daemon: Airlockd, since_ms: int, needle: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        runs = _runs_since(daemon, since_ms, needle)
        if runs and runs[0]["status"] not in ("queued", "running"):
            return runs[0]
        assert time.monotonic() < deadline, runs
        time.sleep(0.2)


async def _cancel_when_running(
    task: asyncio.Future[Any], daemon: Airlockd, since_ms: int, needle: str
) -> None:
    deadline = time.monotonic() + 20
    while not any(r["status"] == "running" for r in _runs_since(daemon, since_ms, needle)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_cancelled_async_run_ends_cancelled_on_the_daemon(airlockd: Airlockd) -> None:
    since = int(time.time() * 1000)
    needle = f"sleep {time.time_ns() % 1000 + 3000}.25"
    sandbox = AsyncSandbox(url=airlockd.url, api_key=airlockd.key)

    async def main() -> None:
        task = asyncio.ensure_future(sandbox.run(["sh", "-c", needle]))
        await _cancel_when_running(task, airlockd, since, needle)

    asyncio.run(main())
    assert _ended(airlockd, since, needle)["status"] == "cancelled"


def test_a_cancelled_async_tool_call_ends_cancelled_on_the_daemon(
    airlockd: Airlockd, tools_dir: Path
) -> None:
    tools = importlib.import_module("tutor_tools")
    since = int(time.time() * 1000)
    # The daemon holds POST /v1/calls until the call ends (up to server.max_wait): the
    # client has no run id to cancel, so closing the request must stop the call.
    loop = tool(
        policy=SandboxPolicy.SANDBOXED,
        toolset="tutor",
        timeout="120s",
        url=airlockd.url,
        api_key=airlockd.key,
    )(tools.evil_infinite_loop)

    async def main() -> None:
        task = asyncio.ensure_future(loop.acall())
        await _cancel_when_running(task, airlockd, since, "evil_infinite_loop")

    asyncio.run(main())
    assert _ended(airlockd, since, "evil_infinite_loop")["status"] == "cancelled"

"""airlockd's MCP endpoint (`/mcp`, streamable HTTP) end to end, driven by the official MCP
Python SDK's streamable HTTP client over the daemon's TLS listener, with the API's keys."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import httpx2
import pytest
from conftest import Airlockd
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

Call = Callable[[str, dict[str, Any]], Awaitable[tuple[bool, dict[str, Any]]]]
#: A program's attempt to hand the host a file out of its workspace.
LEAK = "ln -s /etc/passwd leak"
Scenario = Callable[[Call, ClientSession], Awaitable[None]]


def _http(daemon: Airlockd, key: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}"},
        verify=ssl.create_default_context(cafile=daemon.ca_file),
        timeout=httpx2.Timeout(60, read=300),
    )


async def in_mcp(daemon: Airlockd, scenario: Scenario, key: str | None = None) -> None:
    """Runs a scenario in one MCP session against the daemon's /mcp, as `key`; the MCP
    session ends (DELETE) when it returns."""
    url = f"{daemon.https_url}/mcp"
    async with (
        _http(daemon, key or daemon.key) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()

        async def call(name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
            result = await session.call_tool(name, arguments)
            text = result.content[0].text  # type: ignore[union-attr]
            assert json.loads(text) == result.structured_content
            return result.is_error, result.structured_content

        await scenario(call, session)


def run_mcp(daemon: Airlockd, scenario: Scenario, key: str | None = None) -> None:
    """[in_mcp], from synchronous code."""
    asyncio.run(in_mcp(daemon, scenario, key))


def _rest(daemon: Airlockd, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=daemon.https_url,
        headers={"Authorization": f"Bearer {key}"},
        verify=ssl.create_default_context(cafile=daemon.ca_file),
    )


def test_the_daemon_serves_the_same_tools_as_stdio(airlockd: Airlockd) -> None:
    async def scenario(call: Call, session: ClientSession) -> None:
        tools = sorted(t.name for t in (await session.list_tools()).tools)
        assert tools == [
            "describe_policy",
            "file_read",
            "file_write",
            "run_code",
            "run_command",
            "session_close",
            "session_create",
        ]
        error, r = await call("run_code", {"code": "print(6*7)", "language": "python"})
        assert not error and r["status"] == "exited" and r["exit_code"] == 0, r
        assert r["stdout"] == "42\n" and r["limits_hit"] == [] and r["run_id"]
        assert r["isolation"] and r["network"]["mode"] == "none"
        _, r = await call(
            "run_command",
            {
                "argv": ["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"],
                "stdin": "abc",
            },
        )
        assert r["stdout"] == "cba\n"

    run_mcp(airlockd, scenario)


def test_the_tenants_ceiling_decides_the_policy(airlockd: Airlockd) -> None:
    async def scenario(call: Call, session: ClientSession) -> None:
        _, policy = await call("describe_policy", {})
        assert policy["status"] == "ok" and policy["tenant"] == "pytest"
        assert policy["ceiling"]["network"] == "allowlist" and "no tool" in policy["widening"]
        _, r = await call("run_code", {"code": "x = bytearray(2 * 1024**3)"})
        assert r["status"] == "memory_limit" and r["limits_hit"] == ["memory"], r
        error, r = await call("run_code", {"code": "echo hi", "language": "cobol"})
        assert error and r["status"] == "invalid", r

    run_mcp(airlockd, scenario)


def test_sessions_are_the_tenants_and_refuse_escapes(airlockd: Airlockd) -> None:
    held: dict[str, str] = {}

    async def owner(call: Call, session: ClientSession) -> None:
        _, created = await call("session_create", {})
        sid = created["session"]["session_id"]
        held["sid"] = sid
        _, w = await call("file_write", {"session_id": sid, "path": "in/a.txt", "content": "hi"})
        assert w == {"status": "ok", "path": "in/a.txt", "bytes": 2}
        _, r = await call(
            "run_command",
            {
                "session_id": sid,
                "argv": ["sh", "-c", "tr a-z A-Z < in/a.txt > out.txt; ln -s /etc/passwd leak"],
            },
        )
        assert r["status"] == "exited" and r["exit_code"] == 0, r
        _, out = await call("file_read", {"session_id": sid, "path": "out.txt"})
        assert out["content"] == "HI" and out["encoding"] == "utf-8"
        error, leak = await call("file_read", {"session_id": sid, "path": "leak"})
        assert error and leak["denial"]["reason"] == "symlink", leak
        error, up = await call("file_write", {"session_id": sid, "path": "../x", "content": ""})
        assert error and up["denial"]["reason"] == "outside_workspace", up
        # The session is the tenant's: the HTTP API sees it with the same key.
        with _rest(airlockd, airlockd.key) as rest:
            assert rest.get(f"/v1/sessions/{sid}").json()["status"] == "active"
        # Another tenant's key, in an MCP session of its own, while this one holds the session.
        await in_mcp(airlockd, intruder, key=airlockd.other_key)
        await closer(call, session)
        _, kept = await call("session_create", {})
        held["kept"] = kept["session"]["session_id"]

    async def intruder(call: Call, session: ClientSession) -> None:
        sid = held["sid"]
        attempts: list[tuple[str, dict[str, Any]]] = [
            ("file_read", {"session_id": sid, "path": "out.txt"}),
            ("file_write", {"session_id": sid, "path": "x", "content": "x"}),
            ("run_command", {"session_id": sid, "argv": ["cat", "out.txt"]}),
            ("session_close", {"session_id": sid}),
        ]
        for name, args in attempts:
            error, r = await call(name, args)
            assert error and r["status"] == "not_found", (name, r)

    async def closer(call: Call, session: ClientSession) -> None:
        sid = held["sid"]
        _, closed = await call("session_close", {"session_id": sid})
        assert closed == {"status": "ok"}
        error, gone = await call("run_command", {"session_id": sid, "argv": ["true"]})
        assert error and gone["status"] == "not_found"

    run_mcp(airlockd, owner)
    # A session the MCP session created and left open ended with it.
    with _rest(airlockd, airlockd.key) as rest:
        deadline = time.monotonic() + 10
        while (row := rest.get(f"/v1/sessions/{held['kept']}").json())["status"] == "active":
            assert time.monotonic() < deadline, row
            time.sleep(0.1)
        assert row["status"] == "deleted" and "MCP session" in row["end_reason"], row


def _initialize(client: httpx.Client, **headers: str) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "pytest", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    return client.post("/mcp", json=body, headers={**accept, **headers})


def _error_kind(response: httpx.Response) -> str:
    return str(response.json()["error"]["kind"])


def test_the_endpoint_guards_keys_origins_and_sessions(airlockd: Airlockd) -> None:
    with _rest(airlockd, airlockd.key) as rest, _rest(airlockd, airlockd.other_key) as other:
        anonymous = rest.post("/mcp", json={}, headers={"Authorization": ""})
        assert anonymous.status_code == 401 and _error_kind(anonymous) == "unauthorized"
        browser = _initialize(rest, Origin="https://evil.example")
        assert browser.status_code == 403 and _error_kind(browser) == "forbidden"
        no_accept = rest.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert no_accept.status_code == 406 and "error" in no_accept.json()
        opened = _initialize(rest)
        assert opened.status_code == 200, opened.text
        session_id = opened.headers["mcp-session-id"]
        assert len(session_id) >= 16
        # Another tenant's key cannot use this MCP session: its service does not know it.
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        headers = {"Mcp-Session-Id": session_id, "Accept": "application/json, text/event-stream"}
        stolen = other.post("/mcp", json=ping, headers=headers)
        assert stolen.status_code == 404 and "error" in stolen.json()
        unknown = rest.post("/mcp", json=ping, headers={**headers, "Mcp-Session-Id": "nope"})
        assert unknown.status_code == 404 and "error" in unknown.json()
        assert rest.delete("/mcp", headers=headers).status_code in (200, 202, 204)


def test_a_cancelled_tool_call_cancels_its_run(airlockd: Airlockd) -> None:
    async def scenario(call: Call, session: ClientSession) -> None:
        task = asyncio.ensure_future(
            session.call_tool("run_code", {"code": "import time; time.sleep(120)"})
        )
        await asyncio.sleep(1.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    started = int(time.time() * 1000)
    run_mcp(airlockd, scenario)
    with _rest(airlockd, airlockd.key) as rest:
        deadline = time.monotonic() + 15
        while True:
            runs = rest.get("/v1/runs", params={"since": str(started)}).json()["runs"]
            sleeper = [r for r in runs if "time.sleep(120)" in json.dumps(r["request"])]
            if sleeper and sleeper[0]["status"] not in ("queued", "running"):
                break
            assert time.monotonic() < deadline, sleeper
            time.sleep(0.2)
    assert sleeper[0]["status"] == "cancelled", sleeper[0]

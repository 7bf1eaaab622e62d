"""airlock-mcp end to end, driven by the official MCP Python SDK over stdio."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from airlock import mcp_server_command

Call = Callable[[str, dict[str, Any]], Awaitable[tuple[bool, dict[str, Any]]]]


def with_server(
    profile: str = "untrusted", *extra: str
) -> Callable[[Callable[[Call], Awaitable[None]]], None]:
    """Runs a scenario against a fresh airlock-mcp started with a profile and flags."""

    def run(scenario: Callable[[Call], Awaitable[None]]) -> None:
        command, *rest = mcp_server_command(profile, *extra)
        params = StdioServerParameters(command=command, args=rest)

        async def main() -> None:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()

                async def call(name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
                    result = await s.call_tool(name, arguments)
                    text = result.content[0].text  # type: ignore[union-attr]
                    assert json.loads(text) == result.structured_content
                    return result.is_error, result.structured_content

                await scenario(call)

        asyncio.run(main())

    return run


def test_the_server_lists_its_tools() -> None:
    command, *rest = mcp_server_command()

    async def main() -> list[str]:
        params = StdioServerParameters(command=command, args=rest)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            init = await s.initialize()
            assert init.server_info.name == "airlock-mcp"
            assert init.instructions and "describe_policy" in init.instructions
            return sorted(t.name for t in (await s.list_tools()).tools)

    assert asyncio.run(main()) == [
        "describe_policy",
        "file_read",
        "file_write",
        "run_code",
        "run_command",
        "session_close",
        "session_create",
    ]


def test_run_code_and_run_command() -> None:
    @with_server()
    async def _(call: Call) -> None:
        error, r = await call("run_code", {"code": "print(6*7)", "language": "python"})
        assert not error and r["status"] == "exited" and r["exit_code"] == 0
        assert r["stdout"] == "42\n" and r["limits_hit"] == []
        assert "seccomp" in r["isolation"] and r["network"]["mode"] == "none"
        error, r = await call(
            "run_command",
            {
                "argv": ["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"],
                "stdin": "abc",
            },
        )
        assert r["stdout"] == "cba\n"


def test_limits_are_statuses_the_model_can_read(shared_dir: Path) -> None:
    profile = shared_dir / "tight.toml"
    profile.write_text('extends = "untrusted"\n[limits]\nwall_time = "1s"\nmemory = "64MiB"\n')

    @with_server(str(profile))
    async def _(call: Call) -> None:
        _, policy = await call("describe_policy", {})
        assert policy["status"] == "ok" and policy["network"] == {"mode": "none"}
        assert policy["limits"]["wall_time"] == "1s" and policy["limits"]["memory"] == "64MiB"
        assert "seccomp" in policy["isolation"] and "no tool" in policy["widening"]
        _, r = await call("run_code", {"code": "while True: pass"})
        assert r["status"] == "timeout" and r["limits_hit"] == ["wall_time"]
        _, r = await call("run_code", {"code": "x = bytearray(10**9)"})
        assert r["status"] == "memory_limit" and r["limits_hit"] == ["memory"]


def test_denials_carry_their_reason() -> None:
    @with_server("untrusted", "--allow", "python3")
    async def _(call: Call) -> None:
        error, r = await call("run_code", {"code": "echo hi", "language": "bash"})
        assert error and r["status"] == "denied"
        assert r["denial"]["reason"] == "interpreter_not_allowed"
        error, r = await call("run_command", {"argv": []})
        assert error and r["status"] == "invalid"
        error, r = await call("file_read", {"session_id": "nope", "path": "a"})
        assert error and r["status"] == "not_found"


def test_sessions_keep_files_between_runs_and_refuse_escapes() -> None:
    @with_server()
    async def _(call: Call) -> None:
        _, created = await call("session_create", {})
        sid = created["session"]["session_id"]
        _, w = await call(
            "file_write", {"session_id": sid, "path": "in/data.txt", "content": "hello"}
        )
        assert w == {"status": "ok", "path": "in/data.txt", "bytes": 5}
        _, r = await call(
            "run_command",
            {
                "session_id": sid,
                "argv": ["sh", "-c", "tr a-z A-Z < in/data.txt > out.txt; ln -s /etc/passwd leak"],
            },
        )
        assert r["status"] == "exited" and r["exit_code"] == 0, r
        _, out = await call("file_read", {"session_id": sid, "path": "out.txt"})
        assert out["content"] == "HELLO" and out["encoding"] == "utf-8"
        error, leak = await call("file_read", {"session_id": sid, "path": "leak"})
        assert error and leak["denial"]["reason"] == "symlink"
        error, up = await call("file_write", {"session_id": sid, "path": "../x", "content": ""})
        assert error and up["denial"]["reason"] == "outside_workspace"
        _, written = await call(
            "file_write",
            {"session_id": sid, "path": "b.bin", "content": "AAEC/w==", "encoding": "base64"},
        )
        assert written["bytes"] == 4
        _, back = await call("file_read", {"session_id": sid, "path": "b.bin"})
        assert back["encoding"] == "base64" and back["content"] == "AAEC/w=="
        _, r = await call(
            "run_code", {"session_id": sid, "code": "print(open('b.bin','rb').read())"}
        )
        assert r["stdout"] == "b'\\x00\\x01\\x02\\xff'\n"
        _, closed = await call("session_close", {"session_id": sid})
        assert closed == {"status": "ok"}
        error, gone = await call("run_command", {"session_id": sid, "argv": ["true"]})
        assert error and gone["status"] == "not_found"

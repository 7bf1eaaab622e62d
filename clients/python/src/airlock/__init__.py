"""airlock: run code you did not write behind an OS-enforced boundary, from Python.

Local mode drives the ``airlock`` binary installed with this package (no daemon needed);
with ``AIRLOCK_URL`` set (or ``Sandbox(url=...)``) the same API talks to airlockd::

    from airlock import Sandbox
    r = Sandbox(memory="256MiB", wall="30s").run(["python3", "-c", "print(6*7)"])
    assert r.ok and r.stdout == "42\\n"

See docs/python.md for sessions, streaming, tool calls, workers and the MCP server.
"""

from __future__ import annotations

from airlock._cli import AirlockError, AirlockNotFound, find_binary
from airlock._daemon import DaemonError
from airlock._workspace import AsyncFiles, Files, WorkspaceError
from airlock.result import ErrorKind, Event, Exit, Result, Status, Stderr, Stdout
from airlock.sandbox import AsyncSandbox, AsyncSession, Sandbox, Session
from airlock.tools import (
    SandboxPolicy,
    Tool,
    ToolError,
    ToolResult,
    arun_under_sandbox,
    run_under_sandbox,
    tool,
)
from airlock.worker import Progress, WorkerFailure, WorkerResult, WorkerRuntime, helper_path


def mcp_server_command(profile: str = "untrusted", *extra: str) -> list[str]:
    """The command line that starts airlock's MCP server over stdio, for an agent framework's
    MCP client configuration: ``[".../airlock-mcp", "--profile", profile, *extra]``."""
    return [find_binary("airlock-mcp"), "--profile", profile, *extra]


__all__ = [
    "AirlockError",
    "AirlockNotFound",
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncSession",
    "DaemonError",
    "ErrorKind",
    "Event",
    "Exit",
    "Files",
    "Progress",
    "Result",
    "Sandbox",
    "SandboxPolicy",
    "Session",
    "Status",
    "Stderr",
    "Stdout",
    "Tool",
    "ToolError",
    "ToolResult",
    "WorkerFailure",
    "WorkerResult",
    "WorkerRuntime",
    "WorkspaceError",
    "arun_under_sandbox",
    "find_binary",
    "helper_path",
    "mcp_server_command",
    "run_under_sandbox",
    "tool",
]

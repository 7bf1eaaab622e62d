"""The same cases in local mode (the bundled CLI) and daemon mode (a real airlockd on a
temporary Unix socket): the same Results, the same typed errors."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import pytest
from conftest import Mode

from airlock import (
    AsyncSandbox,
    ErrorKind,
    Event,
    Exit,
    Result,
    Sandbox,
    Status,
    Stderr,
    Stdout,
    WorkspaceError,
)

KERNEL_LAYERS = {"user_ns", "net_ns", "seccomp", "landlock_fs"}


def test_run(mode: Mode) -> None:
    r = Sandbox(memory="256MiB", wall="30s", **mode.kw).run(["python3", "-c", "print(6*7)"])
    assert r.status == Status.EXITED and r.ok, r
    assert r.stdout == "42\n" and r.stderr == ""
    assert r.limits_hit == () and r.error is None and r.error_kind is None
    assert set(r.isolation) >= KERNEL_LAYERS
    assert (r.run_id is not None) == (mode.name == "daemon")


def test_run_code_and_stdin(mode: Mode) -> None:
    sb = Sandbox(wall="30s", **mode.kw)
    r = sb.run_code("import sys; print(sys.argv[1], 6*7)", "python", args=["answer"])
    assert r.ok and r.stdout == "answer 42\n", r
    r = sb.run(["sh", "-c", "tr a-z A-Z"], stdin="hello\n", env={"X": "1"})
    assert r.ok and r.stdout == "HELLO\n", r


def test_exact_bytes_come_back(mode: Mode) -> None:
    r = Sandbox(**mode.kw).run(["printf", "caf\\303\\251 \\377"])
    assert r.ok and r.stdout == "café \ufffd", r


def test_stream(mode: Mode) -> None:
    events = list(Sandbox(**mode.kw).stream(["sh", "-c", "echo out; echo err >&2; echo more"]))
    out = b"".join(e.data for e in events if isinstance(e, Stdout))
    err = b"".join(e.data for e in events if isinstance(e, Stderr))
    assert out == b"out\nmore\n" and b"err\n" in err
    assert isinstance(events[-1], Exit) and events[-1].result.ok


def test_a_timeout_is_a_result(mode: Mode) -> None:
    r = Sandbox(wall="1s", **mode.kw).run(["sleep", "30"])
    assert r.status == Status.TIMEOUT and "wall_time" in r.limits_hit, r
    assert r.wall_ms < 15000


def test_a_memory_eater_hits_the_memory_limit(mode: Mode) -> None:
    code = "b = []\nwhile True: b.append(bytearray(16 << 20))"
    r = Sandbox(memory="128MiB", wall="30s", **mode.kw).run_code(code)
    assert r.status == Status.MEMORY_LIMIT and "memory" in r.limits_hit, r


def test_the_network_is_off_by_default(mode: Mode) -> None:
    code = "import socket; socket.create_connection(('127.0.0.1', 9), timeout=2)"
    r = Sandbox(**mode.kw).run(["python3", "-c", code])
    assert r.exit_code != 0 and "net_ns" in r.isolation


def test_allow_net_runs_behind_the_egress_gate(mode: Mode) -> None:
    # A name beyond the allowlist is refused by the gate's resolver (no traffic leaves).
    code = (
        "import socket\n"
        "try:\n    socket.getaddrinfo('other.example.org', 443)\n"
        "except OSError:\n    print('refused')\n"
    )
    r = Sandbox(allow_net=["api.example.com"], wall="30s", **mode.kw).run(["python3", "-c", code])
    if r.error_kind == "network_allowlist_unavailable":
        pytest.skip(f"this airlockd refuses allowlists with a typed error: {r.error}")
    assert r.ok and r.stdout == "refused\n", r
    assert r.network is not None and r.network.get("mode") == "allowlist", r.network


def test_an_unknown_interpreter_is_a_typed_refusal(mode: Mode) -> None:
    r = Sandbox(**mode.kw).run_code("DISPLAY 'HI'.", language="cobol")
    assert r.status == Status.SANDBOX_ERROR and r.error_kind == ErrorKind.INTERPRETER_UNKNOWN, r
    assert r.error and "cobol" in r.error


def test_a_missing_program_is_a_typed_refusal(mode: Mode) -> None:
    r = Sandbox(**mode.kw).run(["/nonexistent/program"])
    assert r.status == Status.SANDBOX_ERROR and r.error_kind is not None, r
    assert r.error_kind in (ErrorKind.PROGRAM_NOT_FOUND, ErrorKind.BAD_PATH), r


def test_a_session_keeps_its_workspace(mode: Mode) -> None:
    with Sandbox.session(**mode.kw) as s:
        s.files.write("data.csv", b"city,temp\nOslo,3\nLima,19\n")
        s.files.write(
            "analyse.py",
            "import csv, json\n"
            "rows = list(csv.DictReader(open('data.csv')))\n"
            "json.dump({'rows': len(rows), 'max': max(int(r['temp']) for r in rows)},"
            " open('report.json', 'w'))\n",
        )
        r = s.run(["python3", "analyse.py"])
        assert r.ok, r
        assert json.loads(s.files.read("report.json")) == {"rows": 2, "max": 19}
        assert s.files.list() == ["analyse.py", "data.csv", "report.json"]
        with pytest.raises(WorkspaceError) as err:
            s.files.read("missing.txt")
        assert err.value.reason == "not_found"


def test_session_files_never_follow_what_the_program_planted(mode: Mode) -> None:
    with Sandbox.session(**mode.kw) as s:
        r = s.run(["sh", "-c", "ln -s /etc/passwd report.json && mkdir d && ln -s / d/root"])
        assert r.ok, r
        with pytest.raises(WorkspaceError) as err:
            s.files.read("report.json")
        assert err.value.reason == "symlink"
        with pytest.raises(WorkspaceError):
            s.files.read("d/root/etc/passwd")
        for path in ("../escape", "/etc/passwd"):
            with pytest.raises(WorkspaceError) as err:
                s.files.write(path, b"x")
            assert err.value.reason == "outside_workspace"


def test_async_runs_stream_and_session(mode: Mode) -> None:
    async def main() -> tuple[list[Result], list[Event], Result, bytes]:
        sb = AsyncSandbox(wall="30s", **mode.kw)
        runs = await asyncio.gather(*(sb.run(["python3", "-c", f"print({i})"]) for i in range(3)))
        events = [e async for e in sb.stream(["sh", "-c", "echo a; echo b"])]
        async with AsyncSandbox.session(**mode.kw) as s:
            s.files.write("x.txt", "42")
            r = await s.run_code("print(open('x.txt').read())")
            out = s.files.read("x.txt")
        return runs, events, r, out

    runs, events, r, out = asyncio.run(main())
    assert [x.stdout for x in runs] == ["0\n", "1\n", "2\n"]
    assert isinstance(events[-1], Exit) and events[-1].result.ok
    assert r.stdout == "42\n" and out == b"42"


def _running(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def _gone(pattern: str) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _running(pattern):
        time.sleep(0.1)
    return not _running(pattern)


def test_leaving_a_stream_early_stops_the_run(mode: Mode) -> None:
    marker = f"sleep {time.time_ns() % 1000 + 3000}.25"
    for event in Sandbox(**mode.kw).stream(["sh", "-c", f"echo started; {marker}"]):
        assert isinstance(event, Stdout)
        break
    assert _gone(marker)


def test_cancelling_an_async_run_stops_it(mode: Mode) -> None:
    marker = f"sleep {time.time_ns() % 1000 + 5000}.75"

    async def main() -> None:
        task = asyncio.create_task(AsyncSandbox(**mode.kw).run(["sh", "-c", marker]))
        deadline = time.monotonic() + 20
        while not _running(marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _gone(marker)

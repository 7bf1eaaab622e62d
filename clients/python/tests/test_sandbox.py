"""Sandbox and AsyncSandbox: limits as results, streams, sessions, files; in local mode and
against a real airlockd (``mode``) where both apply."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from pathlib import Path

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
    Stdout,
    WorkspaceError,
)


def test_a_non_zero_exit_is_a_result(mode: Mode) -> None:
    r = Sandbox(**mode.kw).run(["sh", "-c", "echo oops >&2; exit 3"])
    assert r.status == Status.EXITED and r.exit_code == 3 and not r.ok
    assert r.stderr == "oops\n"


def test_a_runaway_loop_ends_at_the_wall_limit(mode: Mode) -> None:
    r = Sandbox(wall="1s", **mode.kw).run(["python3", "-c", "while True: pass"])
    assert r.status == Status.TIMEOUT and r.limits_hit == ("wall_time",)


def test_a_memory_eater_hits_the_memory_limit(mode: Mode) -> None:
    r = Sandbox(memory="64MiB", **mode.kw).run(["python3", "-c", "x = bytearray(10**9)"])
    assert r.status == Status.MEMORY_LIMIT and "memory" in r.limits_hit


def test_an_output_flood_is_cut_at_the_cap(mode: Mode) -> None:
    r = Sandbox(stdout_cap="64KiB", **mode.kw).run(
        ["python3", "-c", "while True: print('x' * 4096)"]
    )
    assert r.status == Status.OUTPUT_LIMIT and "stdout" in r.limits_hit
    assert len(r.stdout) <= 64 * 1024


def test_a_fork_bomb_is_contained(mode: Mode) -> None:
    bomb = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"
    r = Sandbox(wall="2s", pids=32, **mode.kw).run(["python3", "-c", bomb])
    assert r.status in (Status.TIMEOUT, Status.MEMORY_LIMIT, Status.CPU_LIMIT)
    assert Sandbox(**mode.kw).run(["true"]).ok


def test_stdin_and_env_reach_the_program(mode: Mode) -> None:
    r = Sandbox(env={"GREETING": "hola"}, **mode.kw).run(
        ["python3", "-c", "import os, sys; print(os.environ['GREETING'], sys.stdin.read())"],
        stdin="mundo",
    )
    assert r.stdout == "hola mundo\n"


def test_the_network_is_off_by_default(mode: Mode) -> None:
    code = "import socket; socket.create_connection(('127.0.0.1', 9), timeout=2)"
    r = Sandbox(**mode.kw).run(["python3", "-c", code])
    assert r.exit_code != 0 and "net_ns" in r.isolation


def test_a_bad_profile_is_a_sandbox_error_with_airlock_s_message(tmp_path: Path) -> None:
    profile = tmp_path / "bad.toml"
    profile.write_text("[limits]\nmemroy = '1GiB'\n")
    r = Sandbox(profile=str(profile)).run(["true"])
    assert r.status == Status.SANDBOX_ERROR
    assert r.error is not None and "memroy" in r.error


def test_sandbox_errors_carry_a_typed_kind() -> None:
    r = Sandbox(profile="/nonexistent/profile.toml").run(["true"])
    assert r.status == Status.SANDBOX_ERROR and r.error
    assert r.error_kind == ErrorKind.PROFILE_UNREADABLE, r


def test_large_code_goes_on_stdin() -> None:
    # Beyond one argument's 128 KiB: `airlock exec` reads the code on stdin.
    code = "x = 1\n" * 40000 + "print(x + 41)\n"
    r = Sandbox().run_code(code)
    assert r.ok and r.stdout == "42\n", r


def test_min_isolation_goes_through_a_profile_that_extends_the_chosen_one() -> None:
    # min_isolation has no flag: the client writes a profile file extending the chosen one.
    r = Sandbox(backend="native", min_isolation="kernel").run_code("print(1)")
    assert r.ok and r.backend == "native", r


def test_leaving_a_stream_early_stops_the_run(mode: Mode) -> None:
    marker = f"sleep {time.time_ns() % 1000 + 60}.5"
    sb = Sandbox(**mode.kw)
    for event in sb.stream(["sh", "-c", f"echo started; {marker}"]):
        assert isinstance(event, Stdout)
        break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(marker):
        time.sleep(0.1)
    assert not _running(marker)


def test_leaving_an_async_stream_early_stops_the_run(mode: Mode) -> None:
    marker = f"sleep {time.time_ns() % 1000 + 4000}.5"

    async def main() -> None:
        stream = AsyncSandbox(**mode.kw).stream(["sh", "-c", f"echo a; {marker}"])
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                assert isinstance(event, Stdout)
                break

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(marker):
        time.sleep(0.1)
    assert not _running(marker)


def _running(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def test_session_files_refuse_paths_out_of_the_workspace(mode: Mode) -> None:
    with Sandbox.session(**mode.kw) as s:
        for path in ("../escape", "/etc/passwd", "a/../../b"):
            with pytest.raises(WorkspaceError) as err:
                s.files.write(path, b"x")
            assert err.value.reason == "outside_workspace"


def test_session_files_never_follow_what_the_program_planted(tmp_path: Path, mode: Mode) -> None:
    canary = tmp_path / "canary"
    canary.write_text("host secret")
    with Sandbox.session(**mode.kw) as s:
        r = s.run(["sh", "-c", "ln -s /etc/passwd report.json && mkdir d && ln -s / d/root"])
        assert r.ok, r
        with pytest.raises(WorkspaceError) as err:
            s.files.read("report.json")
        assert err.value.reason == "symlink"
        with pytest.raises(WorkspaceError):
            s.files.read("d/root/etc/passwd")
        # A link planted from the host side (where the host holds the workspace) is replaced
        # by a write, never followed.
        if s.workdir is not None:
            os.symlink(canary, s.workdir / "planted")
        s.files.write("planted", b"mine")
        assert canary.read_text() == "host secret"
        assert s.files.read("planted") == b"mine"


def test_session_runs_can_change_what_the_host_wrote(mode: Mode) -> None:
    with Sandbox.session(**mode.kw) as s:
        s.files.write("notes/a.txt", "one\n")
        r = s.run(["sh", "-c", "echo two >> notes/a.txt && rm notes/a.txt && echo ok > b"])
        assert r.ok, r
        assert s.files.list() == ["b", "notes"]


def test_async_run_stream_and_session(mode: Mode) -> None:
    async def main() -> tuple[Result, list[Event], bytes]:
        sb = AsyncSandbox(wall="30s", **mode.kw)
        runs = await asyncio.gather(*(sb.run(["python3", "-c", f"print({i})"]) for i in range(3)))
        assert [r.stdout for r in runs] == ["0\n", "1\n", "2\n"]
        events = [e async for e in sb.stream(["sh", "-c", "echo a; echo b"])]
        async with AsyncSandbox.session(**mode.kw) as s:
            s.files.write("x.txt", "42")
            r = await s.run_code("print(open('x.txt').read())")
            out = s.files.read("x.txt")
        return r, events, out

    r, events, out = asyncio.run(main())
    assert r.stdout == "42\n" and out == b"42"
    assert isinstance(events[-1], Exit) and events[-1].result.ok


def test_cancelling_an_async_run_stops_it(mode: Mode) -> None:
    marker = f"sleep {time.time_ns() % 1000 + 2000}.5"

    async def main() -> None:
        task = asyncio.create_task(AsyncSandbox(**mode.kw).run(["sh", "-c", marker]))
        deadline = time.monotonic() + 20
        while not _running(marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(marker):
        time.sleep(0.1)
    assert not _running(marker)

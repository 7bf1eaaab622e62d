"""Local mode: finding the bundled ``airlock`` binary and running it.

The wheel installs ``airlock`` and ``airlock-mcp`` (built from the same commit as this package)
into the environment's scripts directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Seconds between SIGTERM and SIGKILL when the caller stops a run early.
STOP_GRACE = 5.0


class AirlockError(Exception):
    """airlock could not be used at all (for a run's own failures see ``Result.status``)."""


class AirlockNotFound(AirlockError):
    """The ``airlock`` (or ``airlock-mcp``) binary is not installed where we look."""


def _candidates(name: str) -> Iterator[Path]:
    env = "AIRLOCK_BIN" if name == "airlock" else "AIRLOCK_MCP_BIN"
    if os.environ.get(env):
        yield Path(os.environ[env])
    for scheme in (None, f"{os.name}_user"):
        with contextlib.suppress(KeyError):
            scripts = sysconfig.get_path("scripts", scheme) if scheme else None
            yield Path(scripts or sysconfig.get_path("scripts")) / name
    found = shutil.which(name)
    if found:
        yield Path(found)


def find_binary(name: str = "airlock") -> str:
    """The path of ``airlock`` or ``airlock-mcp``: ``$AIRLOCK_BIN`` / ``$AIRLOCK_MCP_BIN``,
    else the scripts directory the wheel installed it into, else ``PATH``."""
    for candidate in _candidates(name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise AirlockNotFound(
        f"cannot find the {name} binary: install the airlock-os wheel in this environment, "
        f"put {name} on PATH, or set {'AIRLOCK_BIN' if name == 'airlock' else 'AIRLOCK_MCP_BIN'}"
    )


@dataclass(frozen=True)
class Completed:
    """A finished CLI process."""

    returncode: int
    stdout: bytes
    stderr: bytes


def run_process(argv: list[str], stdin: bytes | None) -> Completed:
    """Runs the CLI to completion. An exception here (KeyboardInterrupt) kills the CLI, whose
    init then ends the sandboxed tree: nothing is left behind."""
    done = subprocess.run(
        argv,
        input=stdin if stdin is not None else None,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    return Completed(done.returncode, done.stdout, done.stderr)


async def arun_process(argv: list[str], stdin: bytes | None) -> Completed:
    """:func:`run_process` for asyncio; a cancelled task stops the run."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate(stdin)
    except BaseException:
        await astop(proc)
        raise
    return Completed(proc.returncode if proc.returncode is not None else -1, out, err)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends a CLI run early: SIGTERM (airlock stops the tree and cleans up), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def astop(proc: asyncio.subprocess.Process) -> None:
    """:func:`stop` for asyncio processes."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_GRACE)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

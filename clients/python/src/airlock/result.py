"""What a run gives back: one :class:`Result`, and events while it streams."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from airlock._cli import Completed


class Status(str, Enum):
    """How a run ended (the CLI's ``status``). Values a newer airlock adds are kept as is."""

    EXITED = "exited"
    SIGNALED = "signaled"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    CPU_LIMIT = "cpu_limit"
    OUTPUT_LIMIT = "output_limit"
    FILE_SIZE_LIMIT = "file_size_limit"
    CANCELLED = "cancelled"
    SANDBOX_ERROR = "sandbox_error"

    @classmethod
    def _missing_(cls, value: object) -> Status:
        member = str.__new__(cls, str(value))
        member._name_ = str(value).upper()
        member._value_ = str(value)
        return member

    def __str__(self) -> str:
        return str(self.value)


#: Limits named as in a profile's ``[limits]``, by the status that reports them.
_LIMIT_OF_STATUS = {
    Status.TIMEOUT: "wall_time",
    Status.MEMORY_LIMIT: "memory",
    Status.CPU_LIMIT: "cpu_time",
    Status.FILE_SIZE_LIMIT: "file_size",
}


def limits_hit(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The limits a CLI result shows were reached (the CLI's own list when it has one)."""
    if isinstance(raw.get("limits_hit"), list):
        return tuple(str(x) for x in raw["limits_hit"])
    status = Status(raw.get("status", "sandbox_error"))
    hit = [_LIMIT_OF_STATUS[status]] if status in _LIMIT_OF_STATUS else []
    hit += [s for s in ("stdout", "stderr") if raw.get(f"{s}_truncated")]
    if status == Status.OUTPUT_LIMIT and not hit:
        hit.append("output")
    return tuple(hit)


@dataclass(frozen=True)
class Result:
    """One run's outcome. Limits, crashes and sandbox failures are results, not exceptions."""

    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    limits_hit: tuple[str, ...] = ()
    #: The isolation layers that were in force (``user_ns``, ``seccomp``, ``landlock_fs``, ...).
    isolation: tuple[str, ...] = ()
    #: The run's network record (mode, decisions) when airlock reports one.
    network: Mapping[str, Any] | None = None
    #: Why the sandbox failed (``status == SANDBOX_ERROR``).
    error: str | None = None
    #: The typed kind of ``error`` when airlock gives one.
    error_kind: str | None = None
    backend: str | None = None
    wall_ms: int = 0
    cpu_ms: int = 0
    peak_memory_bytes: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    warnings: tuple[str, ...] = ()
    #: The CLI's result object as it was printed.
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The program exited with code 0 and no limit was hit."""
        return self.status == Status.EXITED and self.exit_code == 0

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Result:
        return cls(
            status=Status(raw.get("status", "sandbox_error")),
            exit_code=raw.get("exit_code"),
            signal=raw.get("signal"),
            stdout=raw.get("stdout") or "",
            stderr=raw.get("stderr") or "",
            limits_hit=limits_hit(raw),
            isolation=tuple(raw.get("isolation") or ()),
            network=raw.get("network"),
            error=raw.get("error"),
            error_kind=raw.get("error_kind"),
            backend=raw.get("backend"),
            wall_ms=int(raw.get("wall_ms") or 0),
            cpu_ms=int(raw.get("cpu_user_ms") or 0) + int(raw.get("cpu_sys_ms") or 0),
            peak_memory_bytes=raw.get("peak_memory_bytes"),
            stdout_truncated=bool(raw.get("stdout_truncated")),
            stderr_truncated=bool(raw.get("stderr_truncated")),
            warnings=tuple(raw.get("warnings") or ()),
            raw=dict(raw),
        )

    @classmethod
    def refused(cls, message: str, kind: str = "unsupported") -> Result:
        """A run the client refused before starting it, saying why."""
        return cls(status=Status.SANDBOX_ERROR, error=message, error_kind=kind)


def cli_error_line(stderr: bytes) -> str:
    """airlock's own error message from its stderr (from its last ``airlock: error:`` line)."""
    text = stderr.decode("utf-8", "replace").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("airlock: error:")]
    if starts:
        # The message may go on over several lines (a TOML error shows the line and the key).
        message = "\n".join(lines[starts[-1] :])
        return message.removeprefix("airlock: error:").strip()
    return "\n".join(lines[-5:]) or "airlock failed without a message"


def parse_result(done: Completed) -> Result:
    """The Result of a ``--json`` run: the object airlock printed. Before airlock printed JSON
    for every outcome (issue 15), a flag or profile error was only a line on stderr with exit
    code 125: that becomes a ``sandbox_error`` carrying airlock's own message."""
    try:
        raw = json.loads(done.stdout)
    except ValueError:
        raw = None
    if isinstance(raw, dict) and "status" in raw:
        return Result.from_json(raw)
    return Result(
        status=Status.SANDBOX_ERROR,
        error=cli_error_line(done.stderr),
        stderr=done.stderr.decode("utf-8", "replace"),
    )


@dataclass(frozen=True)
class Stdout:
    """A chunk of the program's stdout."""

    data: bytes


@dataclass(frozen=True)
class Stderr:
    """A chunk of the program's stderr (airlock's own warnings arrive here too)."""

    data: bytes


@dataclass(frozen=True)
class Exit:
    """The run ended; ``result`` has everything but the output, which came as events."""

    result: Result


#: What :meth:`Sandbox.stream` yields.
Event = Stdout | Stderr | Exit

"""What a run gives back: one :class:`Result`, and events while it streams."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from airlock._cli import Completed


class _OpenEnum(str, Enum):
    """A string enum that keeps values a newer airlock adds (as members of their own)."""

    @classmethod
    def _missing_(cls, value: object) -> _OpenEnum:
        member = str.__new__(cls, str(value))
        member._name_ = str(value).upper()
        member._value_ = str(value)
        return member

    def __str__(self) -> str:
        return str(self.value)


class Status(_OpenEnum):
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


class ErrorKind(_OpenEnum):
    """Why a run did not start (``Result.error_kind``): airlock's typed error kinds, the
    daemon's refusals, and the client's own. Kinds a newer airlock adds are kept as is."""

    # The library's and the CLI's (airlock::ErrorKind).
    PROFILE_INVALID = "profile_invalid"
    PROFILE_NOT_FOUND = "profile_not_found"
    PROFILE_UNREADABLE = "profile_unreadable"
    PROFILE_CYCLE = "profile_cycle"
    VALUE_INVALID = "value_invalid"
    UNISOLATED_REFUSED = "unisolated_refused"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    DEGRADED = "degraded"
    NETWORK_UNSUPPORTED = "network_unsupported"
    BAD_PATH = "bad_path"
    PROGRAM_NOT_ALLOWED = "program_not_allowed"
    PROGRAM_NOT_FOUND = "program_not_found"
    WORKDIR_UNUSABLE = "workdir_unusable"
    COMMAND_INVALID = "command_invalid"
    INIT_NOT_STARTED = "init_not_started"
    IO = "io"
    INTERPRETER_UNKNOWN = "interpreter_unknown"
    INTERPRETER_NOT_ALLOWED = "interpreter_not_allowed"
    INTERPRETER_NOT_INSTALLED = "interpreter_not_installed"
    INTERPRETER_REGISTRY_INVALID = "interpreter_registry_invalid"
    USAGE_INVALID = "usage_invalid"
    # The daemon's (ErrorBody.kind): a request beyond the tenant's ceiling, a full queue...
    CEILING = "ceiling"
    FORBIDDEN = "forbidden"
    BAD_REQUEST = "bad_request"
    INVALID_POLICY = "invalid_policy"
    QUEUE_FULL = "queue_full"
    SHUTTING_DOWN = "shutting_down"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    # The client's: an option this mode cannot carry (never dropped silently), and a daemon's
    # event stream that broke before the run ended (the run is cancelled).
    UNSUPPORTED = "unsupported"
    STREAM_BROKEN = "stream_broken"


def error_kind(value: object) -> ErrorKind | None:
    return ErrorKind(str(value)) if value else None


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
    #: The typed kind of ``error`` (an :class:`ErrorKind`, which compares equal to its name).
    error_kind: ErrorKind | None = None
    backend: str | None = None
    wall_ms: int = 0
    cpu_ms: int = 0
    peak_memory_bytes: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    warnings: tuple[str, ...] = ()
    #: The CLI's result object as it was printed (daemon mode: the record's ``result``).
    raw: Mapping[str, Any] = field(default_factory=dict)
    #: The daemon's id of the run (daemon mode).
    run_id: str | None = None

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
            error_kind=error_kind(raw.get("error_kind")),
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
        """A run refused before it started, saying why."""
        return cls(status=Status.SANDBOX_ERROR, error=message, error_kind=ErrorKind(kind))


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

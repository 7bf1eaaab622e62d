"""Sandbox options and how they become CLI arguments (local mode) or a request (daemon mode).

Every subcommand that runs a program (run, exec, call, worker) takes the same sandbox flags;
``min_isolation``, which has no flag, goes into a small profile file that ``extends`` the
chosen one.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

#: A size: bytes as an int, or text with a unit ("256MiB").
Size = int | str
#: A duration: seconds as a number, a timedelta, or text with a unit ("30s", "2m").
Duration = int | float | str | datetime.timedelta

BUILTIN_PROFILES = ("untrusted", "trusted")


def size_arg(value: Size) -> str:
    if isinstance(value, bool) or (isinstance(value, int) and value < 0):
        raise ValueError(f"invalid size {value!r}: give bytes (int >= 0) or text like '256MiB'")
    return str(value)


def duration_arg(value: Duration) -> str:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"invalid duration {value!r}: must be positive")
        return f"{round(value * 1000)}ms"
    return value


@dataclass(frozen=True)
class Options:
    """What a run may do and use. ``None`` keeps the profile's value."""

    profile: str = "untrusted"
    #: The caller named the profile (a daemon otherwise uses the tenant's default profile).
    profile_named: bool = False
    memory: Size | None = None
    wall: Duration | None = None
    cpu: Duration | None = None
    pids: int | None = None
    allow_net: tuple[str, ...] = ()
    deny_net: tuple[str, ...] = ()
    network: str | None = None
    backend: str | None = None
    min_isolation: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ro: tuple[str, ...] = ()
    rw: tuple[str, ...] = ()
    workdir: str | None = None
    stdout_cap: Size | None = None
    stderr_cap: Size | None = None
    disk: Size | None = None
    files: int | None = None
    file_size: Size | None = None
    allow_degraded: bool = False
    no_cgroup: bool = False
    dev: bool = False

    def with_changes(self, **changes: object) -> Options:
        return replace(self, **changes)  # type: ignore[arg-type]

    def profile_ref(self) -> str:
        """The profile as the CLI takes it: a built-in name or an absolute path."""
        if self.profile in BUILTIN_PROFILES or not self.profile:
            return self.profile
        return os.path.abspath(self.profile)


@dataclass
class Prepared:
    """CLI arguments for one subcommand and the files they name."""

    args: list[str] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)

    def cleanup(self) -> None:
        for path in self.temp_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _flags(o: Options) -> list[tuple[object, str]]:
    """(value, flag) for each single-valued option the shared sandbox flag set takes."""
    return [
        (o.memory, "--mem"),
        (o.wall, "--wall"),
        (o.cpu, "--cpu"),
        (o.pids, "--pids"),
        (o.stdout_cap, "--stdout-cap"),
        (o.stderr_cap, "--stderr-cap"),
        (o.disk, "--disk"),
        (o.files, "--files"),
        (o.file_size, "--fsize"),
        (o.network, "--network"),
        (o.backend, "--backend"),
        (o.workdir, "--workdir"),
    ]


def _format(flag: str, value: object) -> str:
    if flag in ("--wall", "--cpu"):
        return duration_arg(value)  # type: ignore[arg-type]
    if flag in ("--mem", "--stdout-cap", "--stderr-cap", "--disk", "--fsize"):
        return size_arg(value)  # type: ignore[arg-type]
    return str(value)


def prepare(options: Options, *, profile: str | None = None) -> Prepared:
    """The sandbox flags of ``airlock run/exec/call/worker`` for ``options``. ``profile``:
    the profile to name (default: the options' own); ``call`` passes the one its policy
    level implies, so that a profile file is named only when the level needs one."""
    out = Prepared()
    for value, flag in _flags(options):
        if value is not None:
            out.args += [flag, _format(flag, value)]
    for paths, flag in ((options.ro, "--ro"), (options.rw, "--rw")):
        for path in paths:
            out.args += [flag, os.path.abspath(path)]
    for key, value in options.env.items():
        out.args += ["--env", f"{key}={value}"]
    for rule in options.allow_net:
        out.args += ["--allow-net", rule]
    for rule in options.deny_net:
        out.args += ["--deny-net", rule]
    for on, flag in (
        (options.allow_degraded, "--allow-degraded"),
        (options.no_cgroup, "--no-cgroup"),
        (options.dev, "--dev"),
    ):
        if on:
            out.args.append(flag)
    base = profile or options.profile_ref()
    if options.min_isolation is not None:
        _overlay(out, base, options.min_isolation)
    elif profile is None:
        out.args += ["--profile", base]
    return out


def _overlay(out: Prepared, base: str, min_isolation: str) -> None:
    """``min_isolation`` has no flag: a profile file that extends ``base`` says it."""
    # JSON strings are valid TOML strings.
    text = f"extends = {json.dumps(base)}\nmin_isolation = {json.dumps(min_isolation)}\n"
    fd, path = tempfile.mkstemp(prefix="airlock-profile-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    out.temp_files.append(path)
    out.args += ["--profile", path]
    # The built-in `trusted` profile may use backend none; a file extending it must say so.
    if base == "trusted" and "--dev" not in out.args:
        out.args.append("--dev")


def options_from(
    profile: str | None = None,
    *,
    memory: Size | None = None,
    wall: Duration | None = None,
    cpu: Duration | None = None,
    pids: int | None = None,
    allow_net: Sequence[str] = (),
    deny_net: Sequence[str] = (),
    network: str | None = None,
    backend: str | None = None,
    min_isolation: str | None = None,
    env: Mapping[str, str] | None = None,
    ro: Sequence[str | Path] = (),
    rw: Sequence[str | Path] = (),
    stdout_cap: Size | None = None,
    stderr_cap: Size | None = None,
    disk: Size | None = None,
    files: int | None = None,
    file_size: Size | None = None,
    allow_degraded: bool = False,
    no_cgroup: bool = False,
    dev: bool = False,
) -> Options:
    """Checks and normalises the keyword arguments shared by Sandbox and WorkerRuntime."""
    if isinstance(allow_net, str) or isinstance(deny_net, str):
        raise TypeError("allow_net and deny_net are lists of rules, e.g. ['api.example.com']")
    for duration in (wall, cpu):
        if duration is not None:
            duration_arg(duration)
    for size in (memory, stdout_cap, stderr_cap, disk, file_size):
        if size is not None:
            size_arg(size)
    return Options(
        profile=str(profile) if profile is not None else "untrusted",
        profile_named=profile is not None,
        memory=memory,
        wall=wall,
        cpu=cpu,
        pids=pids,
        allow_net=tuple(allow_net),
        deny_net=tuple(deny_net),
        network=network,
        backend=backend,
        min_isolation=min_isolation,
        env=dict(env or {}),
        ro=tuple(str(p) for p in ro),
        rw=tuple(str(p) for p in rw),
        stdout_cap=stdout_cap,
        stderr_cap=stderr_cap,
        disk=disk,
        files=files,
        file_size=file_size,
        allow_degraded=allow_degraded,
        no_cgroup=no_cgroup,
        dev=dev,
    )

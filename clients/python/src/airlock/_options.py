"""Sandbox options and how they become CLI arguments.

Each option is a flag where the subcommand has one; otherwise it goes into a small profile
file that ``extends`` the chosen profile (profiles can say everything the flags can). An
option that neither can express (``allow_net`` before the CLI has network allowlists) refuses
the run with the reason: never a silently weaker or wider run.
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

from airlock._cli import Features

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
    memory: Size | None = None
    wall: Duration | None = None
    cpu: Duration | None = None
    pids: int | None = None
    allow_net: tuple[str, ...] = ()
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
    """CLI arguments for one subcommand, the files they name, or why it cannot run."""

    args: list[str] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)
    refusal: str | None = None

    def cleanup(self) -> None:
        for path in self.temp_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _scalar_options(o: Options) -> list[tuple[object, str, str | None, str]]:
    """(value, flag, profile section, profile key) for each single-valued option."""
    return [
        (o.memory, "--mem", "limits", "memory"),
        (o.wall, "--wall", "limits", "wall_time"),
        (o.cpu, "--cpu", "limits", "cpu_time"),
        (o.pids, "--pids", "limits", "processes"),
        (o.stdout_cap, "--stdout-cap", "limits", "stdout"),
        (o.stderr_cap, "--stderr-cap", "limits", "stderr"),
        (o.disk, "--disk", "limits", "disk"),
        (o.files, "--files", "limits", "files"),
        (o.file_size, "--fsize", "limits", "file_size"),
        (o.network, "--network", "network", "mode"),
        (o.backend, "--backend", None, "backend"),
        (o.min_isolation, "", None, "min_isolation"),
        (o.workdir, "--workdir", "filesystem", "workdir"),
    ]


def _format(flag: str, value: object) -> str:
    if flag in ("--wall", "--cpu"):
        return duration_arg(value)  # type: ignore[arg-type]
    if flag in ("--mem", "--stdout-cap", "--stderr-cap", "--disk", "--fsize"):
        return size_arg(value)  # type: ignore[arg-type]
    return str(value)


def _toml_value(value: object) -> str:
    # JSON strings, numbers and arrays of strings are valid TOML.
    return json.dumps(value)


def _overlay_text(base: str, overlay: Mapping[str | None, Mapping[str, object]]) -> str:
    lines = [f"extends = {_toml_value(base)}"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in overlay.get(None, {}).items()]
    for section, values in overlay.items():
        if section is None:
            continue
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _profile_value(flag: str, value: object) -> object:
    if flag in ("--pids", "--files"):
        return value
    return _format(flag, value) if flag else value


def prepare(sub: str, options: Options, feats: Features, *, name_profile: bool = True) -> Prepared:
    """The arguments of ``airlock SUB`` (before its positional arguments) for ``options``.
    ``name_profile=False``: pass ``--profile`` only when an overlay needs one (``call``,
    whose ``--policy`` names the profile)."""
    out = Prepared()
    overlay: dict[str | None, dict[str, object]] = {}
    for value, flag, section, key in _scalar_options(options):
        if value is None:
            continue
        if flag and feats.has(sub, flag):
            out.args += [flag, _format(flag, value)]
        else:
            overlay.setdefault(section, {})[key] = _profile_value(flag, value)
    _lists(sub, options, feats, out, overlay)
    _switches(sub, options, feats, out)
    if options.allow_net and out.refusal is None:
        if feats.has(sub, "--allow-net"):
            for rule in options.allow_net:
                out.args += ["--allow-net", rule]
        else:
            out.refusal = (
                f"allow_net needs network allowlists (`airlock {sub} --allow-net`, issue 16), "
                "which this airlock binary does not have; the run was refused rather than run "
                "with no network or the whole network"
            )
    if overlay or name_profile:
        _profile(sub, options, feats, out, overlay)
    return out


def _lists(
    sub: str,
    options: Options,
    feats: Features,
    out: Prepared,
    overlay: dict[str | None, dict[str, object]],
) -> None:
    for paths, flag, key in ((options.ro, "--ro", "read_only"), (options.rw, "--rw", "read_write")):
        if not paths:
            continue
        absolute = [os.path.abspath(p) for p in paths]
        if feats.has(sub, flag):
            for path in absolute:
                out.args += [flag, path]
        else:
            overlay.setdefault("filesystem", {})[key] = absolute
    if options.env:
        if feats.has(sub, "--env"):
            for k, v in options.env.items():
                out.args += ["--env", f"{k}={v}"]
        else:
            overlay.setdefault("env", {})["set"] = dict(options.env)


def _switches(sub: str, options: Options, feats: Features, out: Prepared) -> None:
    for on, flag in (
        (options.allow_degraded, "--allow-degraded"),
        (options.no_cgroup, "--no-cgroup"),
        (options.dev, "--dev"),
    ):
        if not on:
            continue
        if feats.has(sub, flag):
            out.args.append(flag)
        elif out.refusal is None:
            out.refusal = f"`airlock {sub}` has no {flag} flag in this airlock binary"


def _profile(
    sub: str,
    options: Options,
    feats: Features,
    out: Prepared,
    overlay: dict[str | None, dict[str, object]],
) -> None:
    has_profile = feats.has(sub, "--profile")
    if not overlay:
        if has_profile:
            out.args += ["--profile", options.profile_ref()]
        elif options.profile != "untrusted" and out.refusal is None:
            out.refusal = f"`airlock {sub}` takes no --profile in this airlock binary"
        return
    if not has_profile:
        if out.refusal is None:
            missing = ", ".join(sorted({k for values in overlay.values() for k in values}))
            out.refusal = (
                f"`airlock {sub}` in this airlock binary has no flag or --profile for: {missing} "
                "(issue 15 gives call and exec the flags of run)"
            )
        return
    fd, path = tempfile.mkstemp(prefix="airlock-profile-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(_overlay_text(options.profile_ref(), overlay))
    out.temp_files.append(path)
    out.args += ["--profile", path]
    # The built-in `trusted` profile may use backend none; a file extending it must say so.
    if options.profile == "trusted" and "--dev" not in out.args and feats.has(sub, "--dev"):
        out.args.append("--dev")


def options_from(
    profile: str = "untrusted",
    *,
    memory: Size | None = None,
    wall: Duration | None = None,
    cpu: Duration | None = None,
    pids: int | None = None,
    allow_net: Sequence[str] = (),
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
    if isinstance(allow_net, str):
        raise TypeError("allow_net is a list of rules, e.g. ['api.example.com']")
    for duration in (wall, cpu):
        if duration is not None:
            duration_arg(duration)
    for size in (memory, stdout_cap, stderr_cap, disk, file_size):
        if size is not None:
            size_arg(size)
    return Options(
        profile=str(profile),
        memory=memory,
        wall=wall,
        cpu=cpu,
        pids=pids,
        allow_net=tuple(allow_net),
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

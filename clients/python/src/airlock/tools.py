"""Tool calls for agents: a policy per tool, and failures as values.

``run_under_sandbox(tool, args, policy)`` and ``@tool(policy=...)`` call a Python function
with JSON arguments under one of four levels and return a :class:`ToolResult` or a
:class:`ToolError` — a hung, memory-eating, fork-bombing or crashing tool never raises into
the agent. Sandboxed levels go through ``airlock call``, whose result channel the tool cannot
forge by printing (see docs/tool-calls.md).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from airlock import _cli, _daemon
from airlock._options import (
    Duration,
    Options,
    Size,
    duration_arg,
    options_from,
    prepare,
    size_arg,
)

T = TypeVar("T")

#: Kinds of :class:`ToolError` (``airlock call``'s, plus ``bad_args`` for arguments that are
#: not JSON and ``unsupported`` for a level this airlock binary cannot provide).
ERROR_KINDS = (
    "timeout",
    "cpu_limit",
    "memory_limit",
    "output_limit",
    "file_size_limit",
    "cancelled",
    "crashed",
    "raised",
    "bad_output",
    "bad_tool",
    "bad_args",
    "sandbox_error",
)


class SandboxPolicy(enum.Enum):
    """How a tool is isolated (the levels of the tutor's design)."""

    #: In-process: for trusted pure functions. No boundary and no limits.
    PERMISSIVE = "permissive"
    #: A child process with limits, tree kill and a scrubbed environment (Tier 0): for trusted
    #: tools that may misbehave. The host filesystem and network stay visible.
    SUBPROCESS = "subprocess"
    #: The strongest OS boundary available here (airlock's ``untrusted`` profile).
    SANDBOXED = "sandboxed"
    #: At least container isolation (a container runtime or gVisor).
    CONTAINER = "container"


class ToolError(Exception):
    """A failed tool call, returned as a value (and raisable: ``raise error``).

    ``kind`` is one of :data:`ERROR_KINDS`; ``details`` holds airlock's extra fields
    (``wall_ms``, ``exit_code``, ``stderr_tail``, ``exception``, ``traceback``, ...).
    """

    def __init__(
        self, kind: str, message: str = "", details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    @property
    def stderr_tail(self) -> str:
        """The end of the tool's stderr (``crashed``)."""
        return str(self.details.get("stderr_tail") or "")

    def __repr__(self) -> str:
        return f"ToolError({self.kind!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolError) and (self.kind, self.message) == (
            other.kind,
            other.message,
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.message))


@dataclass(frozen=True)
class ToolResult(Generic[T]):
    """A successful tool call: its JSON value."""

    value: T
    policy: SandboxPolicy
    wall_ms: int = 0


Outcome = ToolResult[Any] | ToolError


@dataclass
class Tool(Generic[T]):
    """A function registered with its isolation policy and limits (see :func:`tool`)."""

    fn: Callable[..., T]
    policy: SandboxPolicy = SandboxPolicy.SANDBOXED
    timeout: Duration | None = None
    memory: Size | None = None
    cpu: Duration | None = None
    pids: int | None = None
    #: The interpreter for sandboxed levels (default: see :func:`_interpreter`).
    python: str | None = None
    allow_degraded: bool = False
    no_cgroup: bool = False
    binary: str | None = None
    name: str = field(default="")
    #: Network rules the tool may reach through the egress gate (``api.example.com``).
    allow_net: Sequence[str] = ()
    deny_net: Sequence[str] = ()
    #: The network mode (``none``, ``allowlist``, ``host``); default: the level's profile's.
    network: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: Host paths the tool may read (``ro``) or write (``rw``).
    ro: Sequence[str] = ()
    rw: Sequence[str] = ()
    backend: str | None = None
    min_isolation: str | None = None
    #: Daemon mode: the operator's toolset that holds this tool's module (``POST /v1/calls``).
    toolset: str | None = None
    #: The daemon (default: ``$AIRLOCK_URL``; ``"local"``: the bundled CLI) and its key.
    url: str | None = None
    api_key: str | None = None

    def __post_init__(self) -> None:
        self.name = self.name or getattr(self.fn, "__name__", "tool")
        functools.update_wrapper(self, self.fn)

    def sandbox_options(self) -> Options:
        """The sandbox options of this tool's calls (those of ``Sandbox(...)`` for a run)."""
        return options_from(
            "untrusted",
            memory=self.memory,
            wall=self.timeout,
            cpu=self.cpu,
            pids=self.pids,
            allow_net=self.allow_net,
            deny_net=self.deny_net,
            network=self.network,
            backend=self.backend,
            min_isolation=self.min_isolation,
            env=self.env,
            ro=self.ro,
            rw=self.rw,
            allow_degraded=self.allow_degraded,
            no_cgroup=self.no_cgroup,
        )

    def call(self, *args: Any, **kwargs: Any) -> ToolResult[T] | ToolError:
        """Calls the tool under its policy; never raises for the tool's failures."""
        return run_under_sandbox(self, _arguments(args, kwargs))

    async def acall(self, *args: Any, **kwargs: Any) -> ToolResult[T] | ToolError:
        return await arun_under_sandbox(self, _arguments(args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        """Calls the tool under its policy and returns its value, raising the ToolError."""
        outcome = self.call(*args, **kwargs)
        if isinstance(outcome, ToolError):
            raise outcome
        return outcome.value


@overload
def tool(fn: Callable[..., T], /) -> Tool[T]: ...


@overload
def tool(
    *,
    policy: SandboxPolicy = ...,
    timeout: Duration | None = ...,
    memory: Size | None = ...,
    cpu: Duration | None = ...,
    pids: int | None = ...,
    python: str | None = ...,
    allow_degraded: bool = ...,
    no_cgroup: bool = ...,
    allow_net: Sequence[str] = ...,
    deny_net: Sequence[str] = ...,
    network: str | None = ...,
    env: Mapping[str, str] | None = ...,
    ro: Sequence[str] = ...,
    rw: Sequence[str] = ...,
    backend: str | None = ...,
    min_isolation: str | None = ...,
    toolset: str | None = ...,
    url: str | None = ...,
    api_key: str | None = ...,
) -> Callable[[Callable[..., T]], Tool[T]]: ...


def tool(
    fn: Callable[..., T] | None = None,
    /,
    *,
    policy: SandboxPolicy = SandboxPolicy.SANDBOXED,
    timeout: Duration | None = None,
    memory: Size | None = None,
    cpu: Duration | None = None,
    pids: int | None = None,
    python: str | None = None,
    allow_degraded: bool = False,
    no_cgroup: bool = False,
    allow_net: Sequence[str] = (),
    deny_net: Sequence[str] = (),
    network: str | None = None,
    env: Mapping[str, str] | None = None,
    ro: Sequence[str] = (),
    rw: Sequence[str] = (),
    backend: str | None = None,
    min_isolation: str | None = None,
    toolset: str | None = None,
    url: str | None = None,
    api_key: str | None = None,
) -> Tool[T] | Callable[[Callable[..., T]], Tool[T]]:
    """Registers a function as a tool: ``@tool(policy=SandboxPolicy.SANDBOXED, timeout="5s")``.

    ``fn.call(**args)`` returns ``ToolResult`` or ``ToolError``; ``fn(**args)`` returns the
    value or raises the ToolError. Either way the function runs under its policy, with the
    sandbox options a :class:`~airlock.Sandbox` run takes (``allow_net=["api.example.com"]``,
    ``env``, ``ro``/``rw``, ``backend``...). It must be a top-level function of an importable
    module (sandboxed levels import it by name in a fresh interpreter). In daemon mode
    (``AIRLOCK_URL`` or ``url=``) the daemon calls it from the operator's ``toolset``.
    """

    def register(f: Callable[..., T]) -> Tool[T]:
        return Tool(
            f,
            policy=policy,
            timeout=timeout,
            memory=memory,
            cpu=cpu,
            pids=pids,
            python=python,
            allow_degraded=allow_degraded,
            no_cgroup=no_cgroup,
            allow_net=tuple(allow_net),
            deny_net=tuple(deny_net),
            network=network,
            env=dict(env or {}),
            ro=tuple(ro),
            rw=tuple(rw),
            backend=backend,
            min_isolation=min_isolation,
            toolset=toolset,
            url=url,
            api_key=api_key,
        )

    return register(fn) if fn is not None else register


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if args and kwargs:
        raise TypeError("pass arguments by name or by position, not both")
    return list(args) if args else kwargs


def _as_tool(target: Tool[Any] | Callable[..., Any]) -> Tool[Any]:
    return target if isinstance(target, Tool) else Tool(target)


def run_under_sandbox(
    target: Tool[Any] | Callable[..., Any],
    args: Mapping[str, Any] | Sequence[Any] | None = None,
    policy: SandboxPolicy | None = None,
) -> Outcome:
    """Calls ``target`` with ``args`` (a mapping: keyword arguments; a list: positional)
    under ``policy`` (default: the tool's own, else SANDBOXED). Never raises for the tool."""
    t = _as_tool(target)
    level = policy or t.policy
    started = time.monotonic()
    try:
        payload = json.dumps(args if args is not None else {})
    except (TypeError, ValueError) as e:
        return ToolError("bad_args", f"the arguments are not JSON: {e}")
    if level is SandboxPolicy.PERMISSIVE:
        return _in_process(t, args, started)
    remote = _remote_call(t, args, level)
    if remote is not None:
        if isinstance(remote, ToolError):
            return remote
        return _remote_outcome(_daemon.call(*remote), level, started)
    plan = _plan_call(t, payload, level)
    if isinstance(plan, ToolError):
        return plan
    argv, prepared = plan
    try:
        done = _cli.run_process(argv, None)
    finally:
        prepared.cleanup()
    return _outcome(done, level, started)


async def arun_under_sandbox(
    target: Tool[Any] | Callable[..., Any],
    args: Mapping[str, Any] | Sequence[Any] | None = None,
    policy: SandboxPolicy | None = None,
) -> Outcome:
    """:func:`run_under_sandbox` for asyncio; cancelling the task stops the call."""
    t = _as_tool(target)
    level = policy or t.policy
    if level is SandboxPolicy.PERMISSIVE:
        return await asyncio.to_thread(run_under_sandbox, t, args, level)
    started = time.monotonic()
    try:
        payload = json.dumps(args if args is not None else {})
    except (TypeError, ValueError) as e:
        return ToolError("bad_args", f"the arguments are not JSON: {e}")
    remote = _remote_call(t, args, level)
    if remote is not None:
        if isinstance(remote, ToolError):
            return remote
        return _remote_outcome(await _daemon.acall(*remote), level, started)
    plan = _plan_call(t, payload, level)
    if isinstance(plan, ToolError):
        return plan
    argv, prepared = plan
    try:
        done = await _cli.arun_process(argv, None)
    finally:
        prepared.cleanup()
    return _outcome(done, level, started)


def _in_process(t: Tool[Any], args: Any, started: float) -> Outcome:
    """PERMISSIVE: a plain call, with the same contract (JSON in and out, typed errors)."""
    try:
        value = t.fn(*args) if isinstance(args, list) else t.fn(**(args or {}))
    except Exception as e:
        return ToolError(
            "raised",
            f"{type(e).__name__}: {e}",
            {"exception": type(e).__name__, "traceback": traceback.format_exc()},
        )
    try:
        value = json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        return ToolError("bad_output", f"the result is not JSON: {e}")
    return ToolResult(value, SandboxPolicy.PERMISSIVE, _ms(started))


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _location(fn: Callable[..., Any]) -> tuple[str, str] | ToolError:
    """(module directory, ``module:function``) to import ``fn`` in a fresh interpreter."""
    module_name = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    module = sys.modules.get(module_name or "")
    file = getattr(module, "__file__", None)
    if not module_name or not file or "<" in qualname or "." in qualname:
        return ToolError(
            "bad_tool",
            f"{qualname or fn!r} is not a top-level function of an importable module; "
            "sandboxed tools are imported by name in a fresh interpreter",
        )
    path = Path(file).resolve()
    # Where @tool replaced the function in its module, the sandbox must call the function
    # itself, not the Tool (which would dispatch again).
    if isinstance(getattr(module, qualname, None), Tool):
        qualname += ".fn"
    if module_name == "__main__":
        return str(path.parent), f"{path.stem}:{qualname}"
    depth = module_name.count(".") + (1 if path.name == "__init__.py" else 0)
    root = path.parent
    for _ in range(depth):
        root = root.parent
    return str(root), f"{module_name}:{qualname}"


def _interpreter(t: Tool[Any], level: SandboxPolicy) -> tuple[str, tuple[str, ...]]:
    """The Python a sandboxed tool runs with, and what must be visible for it: this very
    environment (``sys.executable``), its packages exposed read-only. SUBPROCESS (Tier 0)
    sees the host filesystem, where this environment is as it is."""
    if t.python:
        return t.python, ()
    if level is SandboxPolicy.SUBPROCESS:
        return sys.executable, ()
    visible = {sys.prefix, sys.base_prefix} - {"/usr", "/"}
    return sys.executable, tuple(sorted(visible))


def _call_options(t: Tool[Any], level: SandboxPolicy, visible: tuple[str, ...]) -> Options:
    """The tool's sandbox: the same options as :class:`~airlock.Sandbox` takes for a run."""
    minimum = "container" if level is SandboxPolicy.CONTAINER else t.min_isolation
    return t.sandbox_options().with_changes(ro=(*visible, *t.ro), min_isolation=minimum)


def _plan_call(
    t: Tool[Any], payload: str, level: SandboxPolicy
) -> tuple[list[str], Any] | ToolError:
    location = _location(t.fn)
    if isinstance(location, ToolError):
        return location
    module_dir, target = location
    try:
        binary = t.binary or _cli.find_binary("airlock")
    except _cli.AirlockNotFound as e:
        return ToolError("sandbox_error", str(e))
    python, visible = _interpreter(t, level)
    base = "trusted" if level is SandboxPolicy.SUBPROCESS else "untrusted"
    prepared = prepare(_call_options(t, level, visible), profile=base)
    # `--policy` names the level's profile; a profile file (extending it) replaces it.
    chosen = [] if "--profile" in prepared.args else ["--policy", level.value]
    argv = [binary, "call", *chosen, "--path", module_dir, "--python", python]
    return [*argv, *prepared.args, "--args", payload, target], prepared


def _remote_call(
    t: Tool[Any], args: Any, level: SandboxPolicy
) -> tuple[_daemon.Daemon, dict[str, object]] | ToolError | None:
    """Daemon mode: (daemon, ``CallRequest``) of a call, or why it cannot go there; None in
    local mode."""
    daemon = _daemon.Daemon.configured(t.url, t.api_key)
    if daemon is None:
        return None
    why = _remote_unsupported(t, level)
    if why:
        return ToolError("sandbox_error", why, {"error_kind": "unsupported"})
    location = _location(t.fn)
    if isinstance(location, ToolError):
        return location
    limits: dict[str, object] = {}
    for key, duration in (("wall_time", t.timeout), ("cpu_time", t.cpu)):
        if duration is not None:
            limits[key] = duration_arg(duration)
    if t.memory is not None:
        limits["memory"] = size_arg(t.memory)
    if t.pids is not None:
        limits["processes"] = t.pids
    body: dict[str, object] = {
        "toolset": t.toolset,
        "target": location[1],
        "args": args if args is not None else {},
        "policy": "subprocess" if level is SandboxPolicy.SUBPROCESS else "sandboxed",
        "limits": limits,
    }
    return daemon, body


def _remote_unsupported(t: Tool[Any], level: SandboxPolicy) -> str | None:
    """Why a call cannot go to the daemon as asked (refused, never run differently)."""
    if t.toolset is None:
        return (
            "in daemon mode a tool runs from a toolset the daemon's operator configured: "
            "tool(toolset='name'), or url='local' to call it through the local CLI"
        )
    if level is SandboxPolicy.CONTAINER:
        return "the daemon's tool calls are SANDBOXED or SUBPROCESS (no min_isolation)"
    asked = [
        name
        for name, value in (
            ("allow_net", t.allow_net),
            ("deny_net", t.deny_net),
            ("network", t.network),
            ("env", t.env),
            ("ro", t.ro),
            ("rw", t.rw),
            ("backend", t.backend),
            ("min_isolation", t.min_isolation),
            ("python", t.python),
            ("allow_degraded", t.allow_degraded),
            ("no_cgroup", t.no_cgroup),
        )
        if value
    ]
    if asked:
        return (
            f"{', '.join(asked)}: a daemon's tool call takes limits only (timeout, cpu, "
            "memory, pids); the rest is its operator's toolset and tenant configuration"
        )
    return None


def _remote_outcome(outcome: Mapping[str, Any], level: SandboxPolicy, started: float) -> Outcome:
    if outcome.get("ok"):
        return ToolResult(outcome.get("value"), level, _ms(started))
    error = dict(outcome.get("error") or {})
    kind = str(error.pop("error", "sandbox_error"))
    return ToolError(kind, str(error.pop("message", "")), error)


def _outcome(done: _cli.Completed, level: SandboxPolicy, started: float) -> Outcome:
    text = done.stdout.decode("utf-8", "replace").strip()
    if done.returncode == 0:
        try:
            return ToolResult(json.loads(text), level, _ms(started))
        except ValueError:
            return ToolError("bad_output", "airlock call printed no JSON result")
    try:
        error = json.loads(text) if text else None
    except ValueError:
        error = None
    if isinstance(error, dict) and isinstance(error.get("error"), str):
        kind = error.pop("error")
        message = str(error.pop("message", ""))
        return ToolError(kind, message, error)
    from airlock.result import cli_error_line

    return ToolError("sandbox_error", cli_error_line(done.stderr), {"exit_code": done.returncode})

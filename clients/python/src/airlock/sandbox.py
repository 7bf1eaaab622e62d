"""``Sandbox`` and ``AsyncSandbox``: one call, an OS-enforced boundary, one :class:`Result`.

In local mode each run is one ``airlock`` CLI process (the binary the wheel installed): the
sandbox needs no daemon. Sessions keep a workspace directory between runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airlock import _cli
from airlock._options import Duration, Options, Prepared, Size, options_from, prepare
from airlock._workspace import Files
from airlock.result import Event, Exit, Result, Stderr, Stdout, cli_error_line, parse_result

#: Code is one argument of ``airlock exec``: at most this many bytes (the kernel's limit).
MAX_CODE_ARG_BYTES = 131071
#: Bytes of streamed stderr kept to explain a failure.
_STDERR_TAIL = 64 << 10


@dataclass
class _Plan:
    """One CLI invocation: its argv, stdin, temporary files, or why it was refused."""

    argv: list[str]
    stdin: bytes | None
    prepared: Prepared
    result_file: str | None = None
    refusal: str | None = None
    cleanup_paths: list[str] = field(default_factory=list)

    def cleanup(self) -> None:
        self.prepared.cleanup()
        for path in self.cleanup_paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _stdin_bytes(stdin: bytes | str | None) -> bytes | None:
    return stdin.encode() if isinstance(stdin, str) else stdin


class _SandboxBase:
    """Options and CLI planning shared by the sync and async sandboxes."""

    def __init__(
        self,
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
        binary: str | None = None,
    ) -> None:
        self.options = options_from(
            profile,
            memory=memory,
            wall=wall,
            cpu=cpu,
            pids=pids,
            allow_net=allow_net,
            network=network,
            backend=backend,
            min_isolation=min_isolation,
            env=env,
            ro=ro,
            rw=rw,
            stdout_cap=stdout_cap,
            stderr_cap=stderr_cap,
            disk=disk,
            files=files,
            file_size=file_size,
            allow_degraded=allow_degraded,
            no_cgroup=no_cgroup,
            dev=dev,
        )
        self._binary = binary

    @property
    def binary(self) -> str:
        """The ``airlock`` binary this sandbox drives."""
        if self._binary is None:
            self._binary = _cli.find_binary("airlock")
        return self._binary

    def _options_for(self, env: Mapping[str, str] | None) -> Options:
        if not env:
            return self.options
        return self.options.with_changes(env={**self.options.env, **env})

    def _plan_run(
        self,
        argv: Sequence[str],
        stdin: bytes | str | None,
        env: Mapping[str, str] | None,
        streaming: bool = False,
    ) -> _Plan:
        if isinstance(argv, str):
            raise TypeError("argv is a list: ['python3', '-c', 'print(1)'], not one string")
        if not argv:
            raise ValueError("argv is empty: give the program and its arguments")
        feats = _cli.features(self.binary)
        prepared = prepare("run", self._options_for(env), feats)
        plan = _Plan([], _stdin_bytes(stdin), prepared, refusal=prepared.refusal)
        if streaming:
            fd, plan.result_file = tempfile.mkstemp(prefix="airlock-result-", suffix=".json")
            os.close(fd)
            plan.cleanup_paths.append(plan.result_file)
            mode = ["--result", plan.result_file]
        else:
            mode = ["--json"]
        plan.argv = [self.binary, "run", *mode, *prepared.args, "--", *map(str, argv)]
        return plan

    def _plan_code(
        self, code: str, language: str, args: Sequence[str], env: Mapping[str, str] | None
    ) -> _Plan:
        prepared = prepare("exec", self._options_for(env), _cli.features(self.binary))
        plan = _Plan([], None, prepared, refusal=prepared.refusal)
        size = len(code.encode())
        if size > MAX_CODE_ARG_BYTES or "\0" in code:
            plan.refusal = plan.refusal or (
                f"code is {size} bytes or has a NUL byte; `airlock exec` takes code as one "
                f"argument of at most {MAX_CODE_ARG_BYTES} bytes (code on stdin: issue 15)"
            )
        plan.argv = [self.binary, "exec", "--json", *prepared.args, language, code, *args]
        return plan


def _finish_stream(plan: _Plan, stderr_tail: bytearray) -> Result:
    """The result of a streamed run, from the file airlock wrote, or airlock's message."""
    assert plan.result_file is not None
    try:
        with open(plan.result_file, "rb") as f:
            raw = json.load(f)
        if isinstance(raw, dict) and "status" in raw:
            return Result.from_json(raw)
    except ValueError:
        pass
    from airlock.result import Status

    return Result(status=Status.SANDBOX_ERROR, error=cli_error_line(bytes(stderr_tail)))


def _keep_tail(buffer: bytearray, data: bytes) -> None:
    buffer += data
    del buffer[:-_STDERR_TAIL]


class Sandbox(_SandboxBase):
    """A sandbox configuration; every call is a fresh run under it.

    ``Sandbox(profile="untrusted", memory="256MiB", wall="30s", allow_net=[...])``: the
    profile (built-in ``untrusted``/``trusted`` or a profile file) with overrides. Anything
    airlock cannot honour refuses the run (``status == "sandbox_error"``) with the reason.
    """

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        """Runs ``argv`` to completion and returns its Result (output captured)."""
        return _execute(self._plan_run(argv, stdin, env))

    def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Result:
        """Runs source code with an interpreter of airlock's registry (python, bash, node...)."""
        return _execute(self._plan_code(code, language, args, env))

    def stream(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Iterator[Event]:
        """Runs ``argv``, yielding ``Stdout``/``Stderr`` chunks as they come, then ``Exit``.
        Leaving the loop early stops the run."""
        plan = self._plan_run(argv, stdin, env, streaming=True)
        try:
            yield from _stream(plan)
        finally:
            plan.cleanup()

    @classmethod
    def session(cls, profile: str = "untrusted", **options: Any) -> Session:
        """A workspace that outlives one command: ``with Sandbox.session() as s: ...``."""
        return Session(cls(profile, **options))

    def new_session(self) -> Session:
        """A session with this sandbox's options."""
        return Session(self)


def _execute(plan: _Plan) -> Result:
    try:
        if plan.refusal:
            return Result.refused(plan.refusal)
        return parse_result(_cli.run_process(plan.argv, plan.stdin))
    finally:
        plan.cleanup()


def _feed(pipe: Any, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _stream(plan: _Plan) -> Iterator[Event]:
    if plan.refusal:
        yield Exit(Result.refused(plan.refusal))
        return
    proc = subprocess.Popen(
        plan.argv,
        stdin=subprocess.PIPE if plan.stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        if plan.stdin is not None:
            threading.Thread(target=_feed, args=(proc.stdin, plan.stdin), daemon=True).start()
        tail = bytearray()
        with selectors.DefaultSelector() as sel:
            assert proc.stdout is not None and proc.stderr is not None
            sel.register(proc.stdout, selectors.EVENT_READ, Stdout)
            sel.register(proc.stderr, selectors.EVENT_READ, Stderr)
            while sel.get_map():
                for key, _ in sel.select():
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    if key.data is Stderr:
                        _keep_tail(tail, data)
                    yield key.data(data)
        proc.wait()
        yield Exit(_finish_stream(plan, tail))
    finally:
        _cli.stop(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


class AsyncSandbox(_SandboxBase):
    """:class:`Sandbox` for asyncio: the same options, awaitable runs."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        return await _aexecute(self._plan_run(argv, stdin, env))

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Result:
        return await _aexecute(self._plan_code(code, language, args, env))

    async def stream(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Event]:
        plan = self._plan_run(argv, stdin, env, streaming=True)
        try:
            async for event in _astream(plan):
                yield event
        finally:
            plan.cleanup()

    @classmethod
    def session(cls, profile: str = "untrusted", **options: Any) -> AsyncSession:
        return AsyncSession(cls(profile, **options))

    def new_session(self) -> AsyncSession:
        return AsyncSession(self)


async def _aexecute(plan: _Plan) -> Result:
    try:
        if plan.refusal:
            return Result.refused(plan.refusal)
        return parse_result(await _cli.arun_process(plan.argv, plan.stdin))
    finally:
        plan.cleanup()


async def _pump(
    reader: asyncio.StreamReader, kind: type[Stdout] | type[Stderr], queue: asyncio.Queue[Any]
) -> None:
    while data := await reader.read(65536):
        await queue.put(kind(data))
    await queue.put(None)


async def _astream(plan: _Plan) -> AsyncIterator[Event]:
    if plan.refusal:
        yield Exit(Result.refused(plan.refusal))
        return
    proc = await asyncio.create_subprocess_exec(
        *plan.argv,
        stdin=asyncio.subprocess.PIPE if plan.stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=64)
    assert proc.stdout is not None and proc.stderr is not None
    tasks = [
        asyncio.create_task(_pump(proc.stdout, Stdout, queue)),
        asyncio.create_task(_pump(proc.stderr, Stderr, queue)),
    ]
    if plan.stdin is not None and proc.stdin is not None:
        proc.stdin.write(plan.stdin)
        tasks.append(asyncio.create_task(_aclose_stdin(proc.stdin)))
    try:
        tail, open_streams = bytearray(), 2
        while open_streams:
            event = await queue.get()
            if event is None:
                open_streams -= 1
                continue
            if isinstance(event, Stderr):
                _keep_tail(tail, event.data)
            yield event
        await proc.wait()
        yield Exit(_finish_stream(plan, tail))
    finally:
        await _cli.astop(proc)
        for task in tasks:
            task.cancel()


async def _aclose_stdin(stdin: asyncio.StreamWriter) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await stdin.drain()
    stdin.close()


_USER_KEY = re.compile(r"^(drop_root|uid|gid)\s*=\s*(\S+)", re.MULTILINE)


def sandbox_owner(binary: str, profile: str) -> tuple[int, int] | None:
    """The uid/gid the program runs as when that differs from ours (we are root and the profile
    drops root), so that a workspace can be handed to it; None otherwise."""
    if os.geteuid() != 0:
        return None
    shown = subprocess.run(
        [binary, "profile", "show", profile], capture_output=True, text=True, check=False
    )
    user_section = shown.stdout.partition("[user]")[2].partition("\n[")[0]
    keys = dict(_USER_KEY.findall(user_section))
    if keys.get("drop_root") != "true" or "uid" not in keys:
        return None
    uid = int(keys["uid"])
    return uid, int(keys.get("gid", uid))


class _SessionBase:
    def __init__(self, sandbox: _SandboxBase) -> None:
        owner = sandbox_owner(sandbox.binary, sandbox.options.profile_ref())
        self.workdir = Path(tempfile.mkdtemp(prefix="airlock-session-"))
        if owner is not None:
            os.chown(self.workdir, *owner)
        #: Read and write files of the workspace (``files.write``, ``files.read``, ``files.list``).
        self.files = Files(self.workdir, owner)
        self._closed = False

    def close(self) -> None:
        """Removes the workspace and everything in it (symlinks in it are not followed)."""
        if not self._closed:
            self._closed = True
            shutil.rmtree(self.workdir, ignore_errors=True)


class Session(_SessionBase):
    """Runs that share one workspace (their working directory), each in a fresh sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        super().__init__(sandbox)
        self.sandbox = Sandbox(binary=sandbox.binary)
        self.sandbox.options = sandbox.options.with_changes(workdir=str(self.workdir))

    def run(self, argv: Sequence[str], **kwargs: Any) -> Result:
        return self.sandbox.run(argv, **kwargs)

    def run_code(self, code: str, language: str = "python", **kwargs: Any) -> Result:
        return self.sandbox.run_code(code, language, **kwargs)

    def stream(self, argv: Sequence[str], **kwargs: Any) -> Iterator[Event]:
        return self.sandbox.stream(argv, **kwargs)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSession(_SessionBase):
    """:class:`Session` for asyncio (file operations stay synchronous: they are local)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        super().__init__(sandbox)
        self.sandbox = AsyncSandbox(binary=sandbox.binary)
        self.sandbox.options = sandbox.options.with_changes(workdir=str(self.workdir))

    async def run(self, argv: Sequence[str], **kwargs: Any) -> Result:
        return await self.sandbox.run(argv, **kwargs)

    async def run_code(self, code: str, language: str = "python", **kwargs: Any) -> Result:
        return await self.sandbox.run_code(code, language, **kwargs)

    def stream(self, argv: Sequence[str], **kwargs: Any) -> AsyncIterator[Event]:
        return self.sandbox.stream(argv, **kwargs)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

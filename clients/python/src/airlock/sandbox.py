"""``Sandbox`` and ``AsyncSandbox``: one call, an OS-enforced boundary, one :class:`Result`.

In local mode each run is one ``airlock`` CLI process (the binary the wheel installed): the
sandbox needs no daemon. Sessions keep a workspace directory between runs. In daemon mode
(``AIRLOCK_URL`` or ``url=``) the same calls go to airlockd's HTTP API (see ``_daemon``) and
give the same Results.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from airlock import _cli, _daemon
from airlock._options import Duration, Options, Prepared, Size, options_from, prepare
from airlock._workspace import AsyncFiles, Files, RemoteFiles
from airlock.result import Event, Exit, Result, Stderr, Stdout, cli_error_line, parse_result

#: Bytes of streamed stderr kept to explain a failure.
_STDERR_TAIL = 64 << 10


@dataclass
class _Plan:
    """One CLI invocation: its argv, stdin and temporary files."""

    argv: list[str]
    stdin: bytes | None
    prepared: Prepared
    result_file: str | None = None
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
        binary: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.options = options_from(
            profile,
            memory=memory,
            wall=wall,
            cpu=cpu,
            pids=pids,
            allow_net=allow_net,
            deny_net=deny_net,
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
        #: The daemon this sandbox talks to (``url``, else ``$AIRLOCK_URL``); None: local mode.
        self.daemon = _daemon.Daemon.configured(url, api_key)
        #: Where runs are created in daemon mode (a session's sandbox runs in its workspace).
        self._runs_path = "/v1/runs"

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

    def _remote(self, env: Mapping[str, str] | None, **what: Any) -> _daemon.Request:
        """Daemon mode: (daemon, path, request body) of a run, or why it is refused."""
        assert self.daemon is not None
        options = self._options_for(env)
        why = _daemon.unsupported(options, in_session=self._runs_path != "/v1/runs")
        if why:
            return Result.refused(why)
        return self.daemon, self._runs_path, _daemon.run_request(options, **what)

    def _remote_run(
        self, argv: Sequence[str], stdin: bytes | str | None, env: Mapping[str, str] | None
    ) -> _daemon.Request:
        return self._remote(env, command=_checked(argv), stdin=_stdin_bytes(stdin))

    def _remote_code(
        self, code: str, language: str, args: Sequence[str], env: Mapping[str, str] | None
    ) -> _daemon.Request:
        return self._remote(env, code=code, language=language, args=args)

    def _plan_run(
        self,
        argv: Sequence[str],
        stdin: bytes | str | None,
        env: Mapping[str, str] | None,
        streaming: bool = False,
    ) -> _Plan:
        argv = _checked(argv)
        prepared = prepare(self._options_for(env))
        plan = _Plan([], _stdin_bytes(stdin), prepared)
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
        prepared = prepare(self._options_for(env))
        # The code goes on stdin (`-`): any size, and never visible in the process list.
        argv = [self.binary, "exec", "--json", *prepared.args, "--", language, "-", *args]
        return _Plan(argv, code.encode(), prepared)


def _checked(argv: Sequence[str]) -> Sequence[str]:
    if isinstance(argv, str):
        raise TypeError("argv is a list: ['python3', '-c', 'print(1)'], not one string")
    if not argv:
        raise ValueError("argv is empty: give the program and its arguments")
    return argv


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
        if self.daemon is not None:
            return _daemon.result_of_request(self._remote_run(argv, stdin, env))
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
        if self.daemon is not None:
            return _daemon.result_of_request(self._remote_code(code, language, args, env))
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
        if self.daemon is not None:
            yield from _daemon.events_of_request(self._remote_run(argv, stdin, env))
            return
        plan = self._plan_run(argv, stdin, env, streaming=True)
        try:
            yield from _stream(plan)
        finally:
            plan.cleanup()

    @classmethod
    def session(cls, profile: str | None = None, **options: Any) -> Session:
        """A workspace that outlives one command: ``with Sandbox.session() as s: ...``."""
        return Session(cls(profile, **options))

    def new_session(self) -> Session:
        """A session with this sandbox's options."""
        return Session(self)


def _execute(plan: _Plan) -> Result:
    try:
        return parse_result(_cli.run_process(plan.argv, plan.stdin))
    finally:
        plan.cleanup()


def _feed(pipe: Any, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def _stream(plan: _Plan) -> Iterator[Event]:
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
        if self.daemon is not None:
            return await _daemon.aresult_of_request(self._remote_run(argv, stdin, env))
        return await _aexecute(self._plan_run(argv, stdin, env))

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Result:
        if self.daemon is not None:
            return await _daemon.aresult_of_request(self._remote_code(code, language, args, env))
        return await _aexecute(self._plan_code(code, language, args, env))

    async def stream(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[Event, None]:
        """:meth:`Sandbox.stream` for asyncio. To leave early, close it: ``async with
        contextlib.aclosing(sb.stream(...)) as events:`` (or ``await events.aclose()``), which
        stops the run at once; an abandoned generator is only closed when collected."""
        if self.daemon is not None:
            remote = _daemon.aevents_of_request(self._remote_run(argv, stdin, env))
            async with contextlib.aclosing(remote) as events:
                async for event in events:
                    yield event
            return
        plan = self._plan_run(argv, stdin, env, streaming=True)
        try:
            async for event in _astream(plan):
                yield event
        finally:
            plan.cleanup()

    @classmethod
    def session(cls, profile: str | None = None, **options: Any) -> AsyncSession:
        return AsyncSession(cls(profile, **options))

    def new_session(self) -> AsyncSession:
        return AsyncSession(self)


async def _aexecute(plan: _Plan) -> Result:
    try:
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
    """A workspace: a local directory, or a session of the daemon (``id``)."""

    def __init__(self, sandbox: _SandboxBase, open_remote: bool = True) -> None:
        self._closed = False
        #: The local workspace directory (local mode).
        self.workdir: Path | None = None
        #: The daemon's session id (daemon mode).
        self.id: str | None = None
        self._daemon = sandbox.daemon
        #: Read and write files of the workspace (``files.write``, ``files.read``, ``files.list``).
        self.files: Files | RemoteFiles
        if sandbox.daemon is not None:
            if open_remote:
                self._opened(sandbox.daemon, _open_remote_session(sandbox.daemon, sandbox.options))
        else:
            owner = sandbox_owner(sandbox.binary, sandbox.options.profile_ref())
            self.workdir = Path(tempfile.mkdtemp(prefix="airlock-session-"))
            if owner is not None:
                os.chown(self.workdir, *owner)
            self.files = Files(self.workdir, owner)

    def _opened(self, daemon: _daemon.Daemon, session_id: str) -> None:
        self.id = session_id
        self.files = RemoteFiles(daemon, session_id)

    def _runs_in_workspace(self, sandbox: _SandboxBase) -> None:
        """Points ``sandbox`` (a copy of the session's) at the workspace."""
        if self.id is not None:
            # The daemon's session holds the profile and policy; a run adds its environment.
            sandbox.options = Options(env=sandbox.options.env)
            sandbox._runs_path = f"/v1/sessions/{quote(self.id, safe='')}/runs"
        else:
            sandbox.options = sandbox.options.with_changes(workdir=str(self.workdir))

    def close(self) -> None:
        """Removes the workspace and everything in it (symlinks in it are not followed)."""
        if self._closed:
            return
        self._closed = True
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        elif self._daemon is not None and self.id is not None:
            _close_remote_session(self._daemon, self.id)


def _open_remote_session(daemon: _daemon.Daemon, options: Options) -> str:
    why = _daemon.unsupported(options)
    if why:
        raise _daemon.DaemonError("unsupported", why)
    try:
        with daemon.client() as client:
            response = client.post("/v1/sessions", json=_daemon.session_request(options))
    except httpx.HTTPError as e:
        raise _daemon.unreachable(daemon, e) from e
    if response.status_code not in (200, 201):
        raise _daemon.daemon_error(response)
    return str(response.json()["id"])


def _close_remote_session(daemon: _daemon.Daemon, session_id: str) -> None:
    """Ends the daemon's session (its runs are cancelled, its workspace removed). A daemon
    that cannot be reached ends it itself after its idle timeout."""
    with contextlib.suppress(httpx.HTTPError), daemon.client() as client:
        client.delete(_session_path(session_id))


def _session_path(session_id: str) -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}"


async def _aopen_remote_session(daemon: _daemon.Daemon, options: Options) -> str:
    """:func:`_open_remote_session` for asyncio. A task cancelled while the daemon answers
    still learns the session's id and ends the session before it stops."""
    why = _daemon.unsupported(options)
    if why:
        raise _daemon.DaemonError("unsupported", why)
    async with daemon.async_client() as client:
        post = asyncio.ensure_future(
            client.post("/v1/sessions", json=_daemon.session_request(options))
        )
        try:
            response = await asyncio.shield(post)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                created = await asyncio.wait_for(post, _daemon.REQUEST_TIMEOUT)
                if created.status_code in (200, 201):
                    await client.delete(_session_path(str(created.json()["id"])))
            raise
        except httpx.HTTPError as e:
            raise _daemon.unreachable(daemon, e) from e
    if response.status_code not in (200, 201):
        raise _daemon.daemon_error(response)
    return str(response.json()["id"])


async def _aclose_remote_session(daemon: _daemon.Daemon, session_id: str) -> None:
    """:func:`_close_remote_session` for asyncio."""
    with contextlib.suppress(httpx.HTTPError):
        async with daemon.async_client() as client:
            await client.delete(_session_path(session_id))


class Session(_SessionBase):
    """Runs that share one workspace (their working directory), each in a fresh sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        super().__init__(sandbox)
        self.sandbox = copy.copy(sandbox)
        self._runs_in_workspace(self.sandbox)

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
    """:class:`Session` for asyncio. In daemon mode the session is opened on the daemon by
    ``async with`` (or :meth:`open`, or the first run) and ended by leaving it (or
    :meth:`aclose`), each an ``httpx.AsyncClient`` request; ``afiles`` moves files without
    blocking the event loop (``files`` stays the synchronous view)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        super().__init__(sandbox, open_remote=False)
        self.sandbox = copy.copy(sandbox)
        self._options = sandbox.options
        self._opening = asyncio.Lock()  # runs started together open one session
        #: The workspace's files as coroutines (``await afiles.write(...)``, ``.read``, ``.list``).
        self.afiles: AsyncFiles
        if self._daemon is None:
            self._runs_in_workspace(self.sandbox)
            self.afiles = AsyncFiles(self.files)

    async def open(self) -> AsyncSession:
        """Opens the daemon's session (nothing to do in local mode or once open)."""
        async with self._opening:
            if self._daemon is not None and self.id is None and not self._closed:
                session_id = await _aopen_remote_session(self._daemon, self._options)
                self._opened(self._daemon, session_id)
                self._runs_in_workspace(self.sandbox)
                self.afiles = AsyncFiles(self.files)
        return self

    async def run(self, argv: Sequence[str], **kwargs: Any) -> Result:
        await self.open()
        return await self.sandbox.run(argv, **kwargs)

    async def run_code(self, code: str, language: str = "python", **kwargs: Any) -> Result:
        await self.open()
        return await self.sandbox.run_code(code, language, **kwargs)

    async def stream(self, argv: Sequence[str], **kwargs: Any) -> AsyncGenerator[Event, None]:
        await self.open()
        async with contextlib.aclosing(self.sandbox.stream(argv, **kwargs)) as events:
            async for event in events:
                yield event

    async def aclose(self) -> None:
        """Removes the workspace; in daemon mode ends the session without blocking."""
        if self._daemon is None or self.id is None:
            self.close()
            return
        if not self._closed:
            self._closed = True
            await _aclose_remote_session(self._daemon, self.id)

    async def __aenter__(self) -> AsyncSession:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

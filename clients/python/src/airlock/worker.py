"""``WorkerRuntime``: run a plugin platform's worker on input bytes, get output bytes back.

The worker follows airlock's worker protocol (docs/worker-protocol.md): it reads ``in/``
and ``options.json``, writes ``out/``, and reports progress as NDJSON through the helper
``airlock_worker`` (``progress()``, ``log()``, ``done()``, ``inputs()``, ``options()``,
``output_path()``), which the runtime makes importable inside the sandbox.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airlock import _cli, _daemon, _remote_worker
from airlock._options import Duration, Size, options_from, prepare
from airlock.result import Status, cli_error_line

_HELPER = Path(__file__).parent / "_worker" / "airlock_worker.py"
_STDERR_CAP = 1 << 20


def helper_path() -> Path:
    """The worker-side helper module shipped with this package (``airlock_worker.py``)."""
    return _HELPER


@dataclass(frozen=True)
class Progress:
    """A progress event: ``fraction`` in 0..1 and an optional message."""

    fraction: float
    message: str | None = None


@dataclass(frozen=True)
class WorkerFailure:
    """Why a worker job failed: ``kind`` is ``timeout``, ``memory_limit``, ``cpu_limit``,
    ``output_limit``, ``crashed`` (non-zero exit or signal), ``no_done`` (exit 0 without
    ``done``) or ``sandbox_error``; ``stderr_tail`` ends the worker's stderr."""

    kind: str
    message: str
    stderr_tail: str = ""


@dataclass
class WorkerResult:
    """A finished job: outputs as bytes by relative path, events, logs, typed failure."""

    success: bool
    status: Status
    exit_code: int | None
    outputs: dict[str, bytes] = field(default_factory=dict)
    progress: list[Progress] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    #: Lines of the worker's stdout that were not protocol events, with the reason.
    bad_lines: list[str] = field(default_factory=list)
    #: Entries of ``out/`` not ingested (symlinks, hardlinks, over caps...), with the reason.
    skipped: list[Mapping[str, Any]] = field(default_factory=list)
    stderr: str = ""
    failure: WorkerFailure | None = None
    #: airlock's result line as printed.
    raw: Mapping[str, Any] = field(default_factory=dict)


class WorkerRuntime:
    """Runs workers in airlock's sandbox: ``WorkerRuntime(backend="container").run(...)``.

    ``backend``: ``auto`` (the strongest fast boundary here), ``native``, ``bwrap``,
    ``container`` or ``gvisor``. Limits as for :class:`~airlock.Sandbox`; ``max_output_bytes``,
    ``max_output_files`` and ``max_file_bytes`` cap what is taken from ``out/``.
    """

    def __init__(
        self,
        backend: str = "auto",
        *,
        profile: str = "untrusted",
        memory: Size | None = None,
        wall: Duration | None = None,
        cpu: Duration | None = None,
        pids: int | None = None,
        allow_net: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        ro: Sequence[str | Path] = (),
        python: str = "/usr/bin/python3",
        max_output_bytes: Size | None = None,
        max_output_files: int | None = None,
        max_file_bytes: Size | None = None,
        allow_degraded: bool = False,
        no_cgroup: bool = False,
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
            backend=None if backend == "auto" else backend,
            env=env,
            ro=ro,
            allow_degraded=allow_degraded,
            no_cgroup=no_cgroup,
        )
        self.python = python
        self.caps = [
            (flag, str(value))
            for flag, value in (
                ("--max-total-bytes", max_output_bytes),
                ("--max-files", max_output_files),
                ("--max-file-bytes", max_file_bytes),
            )
            if value is not None
        ]
        self._binary = binary
        self._remote_caps: dict[str, Size | None] = {
            "max_output_bytes": max_output_bytes,
            "max_output_files": max_output_files,
            "max_file_bytes": max_file_bytes,
        }
        #: The daemon jobs go to (``url=`` or ``AIRLOCK_URL``); None runs them locally.
        self.daemon = _daemon.Daemon.configured(url, api_key)

    def run(
        self,
        worker: str | os.PathLike[str],
        inputs: Mapping[str, bytes] | None = None,
        options: Any = None,
        on_progress: Callable[[Progress], None] | None = None,
        *,
        on_log: Callable[[str], None] | None = None,
        args: Sequence[str] = (),
    ) -> WorkerResult:
        """Stages ``inputs`` as ``in/NAME``, ``options`` as ``options.json``, runs ``worker``
        (a Python file) and returns its ``out/`` as bytes. Callbacks run as events arrive."""
        if self.daemon is not None:
            return self._run_remote(
                self.daemon, Path(worker), inputs or {}, options, args, on_progress, on_log
            )
        with self._job(worker, inputs or {}, options, args) as (argv, out_dir):
            return _drive(argv, out_dir, on_progress, on_log)

    def _run_remote(
        self,
        daemon: _daemon.Daemon,
        script: Path,
        inputs: Mapping[str, bytes],
        options: Any,
        args: Sequence[str],
        on_progress: Callable[[Progress], None] | None,
        on_log: Callable[[str], None] | None,
    ) -> WorkerResult:
        """The job through the daemon (see ``_remote_worker``), as the same WorkerResult."""
        job = self._remote_request(script, options, args)
        if not isinstance(job, _remote_worker.RemoteJob):
            job = _remote_worker.run(daemon, job, inputs, *_callbacks(on_progress, on_log))
        return _remote_result(job)

    def _remote_request(
        self, script: Path, options: Any, args: Sequence[str]
    ) -> dict[str, object] | _remote_worker.RemoteJob:
        """The daemon's WorkerRequest, or the refusal of options a daemon cannot take."""
        why = _daemon.unsupported(self.options)
        if self._remote_caps["max_file_bytes"] is not None:
            why = "max_file_bytes: the daemon's operator sets it (sessions.max_file_bytes)"
        if why:
            return _remote_worker.refused("unsupported", why)
        return _remote_worker.request(
            self.options, self.python, script, options, args, self._remote_caps
        )

    async def arun(
        self,
        worker: str | os.PathLike[str],
        inputs: Mapping[str, bytes] | None = None,
        options: Any = None,
        on_progress: Callable[[Progress], None] | None = None,
        *,
        on_log: Callable[[str], None] | None = None,
        args: Sequence[str] = (),
    ) -> WorkerResult:
        """:meth:`run` for asyncio: in daemon mode on ``httpx.AsyncClient`` (a cancelled task
        cancels the job on the daemon; callbacks run in the event loop), locally in a worker
        thread (callbacks run in that thread)."""
        import asyncio

        if self.daemon is not None:
            job = self._remote_request(Path(worker), options, args)
            if not isinstance(job, _remote_worker.RemoteJob):
                job = await _remote_worker.arun(
                    self.daemon, job, inputs or {}, *_callbacks(on_progress, on_log)
                )
            return _remote_result(job)
        return await asyncio.to_thread(
            self.run, worker, inputs, options, on_progress, on_log=on_log, args=args
        )

    @contextlib.contextmanager
    def _job(
        self,
        worker: str | os.PathLike[str],
        inputs: Mapping[str, bytes],
        options: Any,
        args: Sequence[str],
    ) -> Iterator[tuple[list[str], Path]]:
        binary = self._binary or _cli.find_binary("airlock")
        script = Path(worker).resolve()
        stage = Path(tempfile.mkdtemp(prefix="airlock-job-"))
        try:
            os.chmod(stage, 0o755)
            staged = _stage(stage, inputs, options)
            helper_dir = stage / "helper"
            helper_dir.mkdir(mode=0o755)
            shutil.copy(_HELPER, helper_dir / "airlock_worker.py")
            opts = self.options.with_changes(
                ro=(*self.options.ro, str(script.parent), str(helper_dir)),
                env={**self.options.env, "PYTHONPATH": str(helper_dir)},
            )
            prepared = prepare(opts)
            try:
                out_dir = stage / "out"
                argv = [binary, "worker", *prepared.args, *staged, "--out", str(out_dir)]
                argv += [a for cap in self.caps for a in cap]
                yield [*argv, "--", self.python, str(script), *args], out_dir
            finally:
                prepared.cleanup()
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def _callbacks(
    on_progress: Callable[[Progress], None] | None, on_log: Callable[[str], None] | None
) -> tuple[Callable[[float, str | None], None], Callable[[str], None]]:
    def progress(fraction: float, message: str | None) -> None:
        if on_progress is not None:
            on_progress(Progress(fraction, message))

    def log(message: str) -> None:
        if on_log is not None:
            on_log(message)

    return progress, log


def _remote_result(job: _remote_worker.RemoteJob) -> WorkerResult:
    progress = [Progress(fraction, message) for fraction, message in job.progress]
    return _result(job.final, job.outputs, progress, job.logs, job.bad_lines, job.stderr)


def _stage(stage: Path, inputs: Mapping[str, bytes], options: Any) -> list[str]:
    """Writes inputs and options under ``stage``; returns the ``--in``/``--options`` flags.
    airlock checks the names (one component, no control characters)."""
    inputs_dir = stage / "inputs"
    inputs_dir.mkdir(mode=0o700)
    flags = []
    for index, (name, data) in enumerate(inputs.items()):
        path = inputs_dir / str(index)
        path.write_bytes(bytes(data))
        flags += ["--in", f"{name}={path}"]
    options_file = stage / "options.json"
    options_file.write_text(json.dumps(options if options is not None else {}))
    return [*flags, "--options", str(options_file)]


def _drive(
    argv: list[str],
    out_dir: Path,
    on_progress: Callable[[Progress], None] | None,
    on_log: Callable[[str], None] | None,
) -> WorkerResult:
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stderr = bytearray()
    reader = threading.Thread(target=_collect, args=(proc.stderr, stderr), daemon=True)
    reader.start()
    progress: list[Progress] = []
    logs: list[str] = []
    bad: list[str] = []
    final: dict[str, Any] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = _event(line)
            kind = event.get("event")
            if kind == "progress":
                p = Progress(float(event.get("fraction", 0)), event.get("message"))
                progress.append(p)
                if on_progress is not None:
                    on_progress(p)
            elif kind == "log":
                logs.append(str(event.get("message", "")))
                if on_log is not None:
                    on_log(logs[-1])
            elif kind == "error":
                bad.append(f"{event.get('reason')}: {event.get('line')}")
            elif kind == "result":
                final = event
        proc.wait()
    finally:
        _cli.stop(proc)
        reader.join()
    text = stderr.decode("utf-8", "replace")
    return _result(final, _outputs(out_dir), progress, logs, bad, text)


def _collect(pipe: Any, buffer: bytearray) -> None:
    for chunk in iter(lambda: pipe.read(65536), b""):
        buffer += chunk
        del buffer[:-_STDERR_CAP]


def _event(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _outputs(out_dir: Path) -> dict[str, bytes]:
    """The files airlock ingested from ``out/`` (already copied safely into our directory)."""
    if not out_dir.is_dir():
        return {}
    return {
        p.relative_to(out_dir).as_posix(): p.read_bytes()
        for p in sorted(out_dir.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _failure(final: Mapping[str, Any], stderr: str) -> WorkerFailure | None:
    if final.get("success"):
        return None
    tail = stderr[-2000:]
    if not final:
        return WorkerFailure("sandbox_error", cli_error_line(stderr.encode()), tail)
    status = str(final.get("status"))
    if status == "sandbox_error":
        return WorkerFailure("sandbox_error", str(final.get("error") or ""), tail)
    if status in ("timeout", "memory_limit", "cpu_limit", "output_limit", "file_size_limit"):
        return WorkerFailure(status, f"the worker hit its {status.replace('_', ' ')}", tail)
    if final.get("exit_code") == 0 and not final.get("done_seen"):
        return WorkerFailure("no_done", "the worker exited 0 without sending done", tail)
    how = (
        f"exit code {final.get('exit_code')}"
        if final.get("exit_code") is not None
        else (f"signal {final.get('signal')}")
    )
    return WorkerFailure("crashed", f"the worker failed with {how}", tail)


def _result(
    final: Mapping[str, Any],
    outputs: dict[str, bytes],
    progress: list[Progress],
    logs: list[str],
    bad: list[str],
    stderr: str,
) -> WorkerResult:
    ingest = final.get("ingest") or {}
    return WorkerResult(
        success=bool(final.get("success")),
        status=Status(final.get("status", "sandbox_error")),
        exit_code=final.get("exit_code"),
        outputs=outputs,
        progress=progress,
        logs=logs,
        bad_lines=bad,
        skipped=list(ingest.get("skipped") or []),
        stderr=stderr,
        failure=_failure(final, stderr),
        raw=dict(final),
    )

"""``WorkerRuntime`` in daemon mode: one worker job through airlockd's ``POST /v1/workers``.

The inputs go as multipart parts (named by their input names), the worker file as a
``program_files`` entry that the daemon writes read-only beside its own copy of the helper
``airlock_worker`` (on the program's ``PYTHONPATH``) and runs as ``python3 -m NAME``. The
run's event stream carries progress, logs and stderr as they happen; the outputs the daemon
ingested are downloaded from ``/v1/runs/{id}/outputs``. A stream that breaks, or a caller that
stops (Ctrl-C), cancels the job on the daemon.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from airlock import _daemon
from airlock._options import Options, Size, size_arg

#: The daemon's line for a worker stdout line that was not a protocol event.
_NOT_AN_EVENT = re.compile(r"^not a worker event \((?P<reason>[^)]*)\): (?P<line>.*)$", re.S)


@dataclass
class RemoteJob:
    """What a finished job gave back, shaped like the CLI's result line and output dir."""

    final: dict[str, Any]
    outputs: dict[str, bytes] = field(default_factory=dict)
    stderr: str = ""
    progress: list[tuple[float, str | None]] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)


def module_name(script: Path) -> str:
    """The import name the worker file is shipped under (its own, when it is one)."""
    stem = script.stem
    if stem.isidentifier() and stem != "airlock_worker":
        return stem
    return "airlock_job_worker"


def request(
    o: Options,
    python: str,
    script: Path,
    options: Any,
    args: Sequence[str],
    caps: Mapping[str, Size | None],
) -> dict[str, object]:
    """The ``WorkerRequest``: the worker run as a module, its file, options, policy, caps."""
    module = module_name(script)
    body: dict[str, object] = {
        "program": [python, "-m", module, *args],
        "options": options if options is not None else {},
        "env": dict(o.env),
        "program_files": [
            {
                "path": module + ".py",
                "content_base64": base64.b64encode(script.read_bytes()).decode("ascii"),
            }
        ],
    }
    if o.profile_named:
        body["profile"] = o.profile
    if policy := _daemon.policy_request(o):
        body["policy"] = policy
    if caps.get("max_output_bytes") is not None:
        body["max_output_bytes"] = size_arg(caps["max_output_bytes"])  # type: ignore[arg-type]
    if caps.get("max_output_files") is not None:
        body["max_output_files"] = int(caps["max_output_files"])  # type: ignore[arg-type]
    return body


def refused(kind: str, message: str) -> RemoteJob:
    """A job the daemon did not run (or could not be asked to)."""
    final = {"success": False, "status": "sandbox_error", "error": message, "error_kind": kind}
    return RemoteJob(final)


class _JobStream:
    """Turns NDJSON lines of a job's event stream into progress, logs and stderr, calling the
    callbacks as they come; remembers the record."""

    def __init__(
        self,
        run_id: str,
        on_progress: Callable[[float, str | None], None],
        on_log: Callable[[str], None],
    ) -> None:
        self.run_id = run_id
        self.job = RemoteJob(final={})
        self.ended: Mapping[str, Any] | None = None
        self._stderr = bytearray()
        self._on_progress = on_progress
        self._on_log = on_log

    def feed(self, line: str) -> None:
        if not line.strip():
            return
        event = json.loads(line)
        kind = event.get("event")
        if kind == "progress":
            fraction, message = float(event.get("fraction", 0)), event.get("message")
            self.job.progress.append((fraction, message))
            self._on_progress(fraction, message)
        elif kind == "log":
            self._log(str(event.get("message", "")))
        elif kind == "stderr":
            self._stderr += _daemon._chunk(event)
        elif kind == "ended":
            self.ended = event.get("run") or {}

    def _log(self, message: str) -> None:
        bad = _NOT_AN_EVENT.match(message)
        if bad:
            self.job.bad_lines.append(f"{bad['reason']}: {bad['line']}")
            return
        self.job.logs.append(message)
        self._on_log(message)

    def finish(self) -> RemoteJob:
        self.job.stderr = self._stderr.decode("utf-8", "replace")
        self.job.final = final_line(self.run_id, self.ended)
        return self.job


def _parts(
    body: Mapping[str, object], inputs: Mapping[str, bytes]
) -> list[tuple[str, tuple[str | None, bytes, str]]]:
    """The multipart form: the ``request`` part, then each input under its name."""
    parts: list[tuple[str, tuple[str | None, bytes, str]]] = [
        ("request", (None, json.dumps(body).encode(), "application/json"))
    ]
    parts += [
        (name, (name, bytes(data), "application/octet-stream")) for name, data in inputs.items()
    ]
    return parts


def _refusal(created: httpx.Response) -> RemoteJob:
    error = _daemon.daemon_error(created)
    return refused(error.kind, f"{error.message} ({error.fix})")


def run(
    daemon: _daemon.Daemon,
    body: Mapping[str, object],
    inputs: Mapping[str, bytes],
    on_progress: Callable[[float, str | None], None],
    on_log: Callable[[str], None],
) -> RemoteJob:
    try:
        with daemon.client() as client:
            created = _create(client, _parts(body, inputs))
            if created.status_code not in _daemon._CREATED:
                return _refusal(created)
            stream = _JobStream(str(created.json()["id"]), on_progress, on_log)
            try:
                with client.stream("GET", _daemon._events_path(stream.run_id), **_STREAM) as events:
                    for line in events.iter_lines():
                        stream.feed(line)
            except httpx.HTTPError:
                pass
            finally:
                if stream.ended is None:
                    _daemon._cancel(client, stream.run_id)
            job = stream.finish()
            for rel, path in _output_paths(stream.run_id, job.final):
                job.outputs[rel] = _output(client.get(path), rel)
            return job
    except httpx.HTTPError as e:
        return refused("unreachable", str(_daemon.unreachable(daemon, e)))


async def arun(
    daemon: _daemon.Daemon,
    body: Mapping[str, object],
    inputs: Mapping[str, bytes],
    on_progress: Callable[[float, str | None], None],
    on_log: Callable[[str], None],
) -> RemoteJob:
    """:func:`run` on ``httpx.AsyncClient``; a cancelled task cancels the job on the daemon."""
    try:
        async with daemon.async_client() as client:
            created = await _daemon._acreate(client, "/v1/workers", files=_parts(body, inputs))
            if created.status_code not in _daemon._CREATED:
                return _refusal(created)
            stream = _JobStream(str(created.json()["id"]), on_progress, on_log)
            try:
                async with client.stream(
                    "GET", _daemon._events_path(stream.run_id), **_STREAM
                ) as events:
                    async for line in events.aiter_lines():
                        stream.feed(line)
            except httpx.HTTPError:
                pass
            finally:
                if stream.ended is None:
                    await _daemon._acancel(client, stream.run_id)
            job = stream.finish()
            for rel, path in _output_paths(stream.run_id, job.final):
                job.outputs[rel] = _output(await client.get(path), rel)
            return job
    except httpx.HTTPError as e:
        return refused("unreachable", str(_daemon.unreachable(daemon, e)))


_STREAM: dict[str, Any] = {"params": _daemon._NDJSON, "timeout": _daemon._STREAM_TIMEOUT}


def _create(
    client: httpx.Client, parts: list[tuple[str, tuple[str | None, bytes, str]]]
) -> httpx.Response:
    # Under an idempotency key: interrupted while the daemon answers, the same request names
    # the same job, which is then cancelled.
    headers = {"Idempotency-Key": secrets.token_hex(16)}
    try:
        return client.post("/v1/workers", files=parts, headers=headers)
    except KeyboardInterrupt:
        again = client.post("/v1/workers", files=parts, headers=headers)
        if again.status_code in _daemon._CREATED:
            _daemon._cancel(client, str(again.json()["id"]))
        raise


def final_line(run_id: str, run: Mapping[str, Any] | None) -> dict[str, Any]:
    """The CLI's result line for a job's record (``RunView``)."""
    if run is None:
        return {
            "success": False,
            "status": "sandbox_error",
            "error": f"the event stream of job {run_id} broke before it ended (cancelled)",
            "error_kind": "stream_broken",
        }
    result: Mapping[str, Any] = run.get("result") or {}
    outputs: Mapping[str, Any] = run.get("outputs") or {}
    error: Mapping[str, Any] = run.get("error") or {}
    return {
        "run_id": run_id,
        "success": bool(outputs.get("success")),
        "done_seen": bool(outputs.get("done_seen")),
        "status": run.get("status") or "sandbox_error",
        "exit_code": result.get("exit_code"),
        "signal": result.get("signal"),
        "error": error.get("message") or result.get("error"),
        "error_kind": error.get("kind") or result.get("error_kind"),
        "events": outputs.get("events"),
        "ingest": outputs.get("ingest"),
        "isolation": result.get("isolation"),
        "backend": run.get("backend"),
    }


def _output_paths(run_id: str, final: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The files the daemon ingested from the worker's ``out/``, with their download paths."""
    ingest: Mapping[str, Any] = final.get("ingest") or {}
    base = f"/v1/runs/{quote(run_id, safe='')}/outputs/"
    rels = sorted(str(entry["rel_path"]) for entry in ingest.get("files") or [])
    return [(rel, base + "/".join(quote(p, safe="") for p in rel.split("/"))) for rel in rels]


def _output(response: httpx.Response, rel: str) -> bytes:
    if response.status_code != 200:
        raise httpx.HTTPError(f"output {rel!r}: HTTP {response.status_code}")
    return response.content

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


def run(
    daemon: _daemon.Daemon,
    body: Mapping[str, object],
    inputs: Mapping[str, bytes],
    on_progress: Callable[[float, str | None], None],
    on_log: Callable[[str], None],
) -> RemoteJob:
    try:
        with daemon.client() as client:
            created = _create(client, body, inputs)
            if created.status_code not in (200, 201, 202):
                error = _daemon.daemon_error(created)
                return refused(error.kind, f"{error.message} ({error.fix})")
            job = _follow(client, str(created.json()["id"]), on_progress, on_log)
            job.outputs = _download(client, job.final.get("run_id", ""), job.final)
            return job
    except httpx.HTTPError as e:
        return refused("unreachable", str(_daemon.unreachable(daemon, e)))


def _create(
    client: httpx.Client, body: Mapping[str, object], inputs: Mapping[str, bytes]
) -> httpx.Response:
    parts: list[tuple[str, tuple[str | None, bytes, str]]] = [
        ("request", (None, json.dumps(body).encode(), "application/json"))
    ]
    parts += [
        (name, (name, bytes(data), "application/octet-stream")) for name, data in inputs.items()
    ]
    # Under an idempotency key: interrupted while the daemon answers, the same request names
    # the same job, which is then cancelled.
    headers = {"Idempotency-Key": secrets.token_hex(16)}
    try:
        return client.post("/v1/workers", files=parts, headers=headers)
    except KeyboardInterrupt:
        again = client.post("/v1/workers", files=parts, headers=headers)
        if again.status_code in (200, 201, 202):
            _daemon._cancel(client, str(again.json()["id"]))
        raise


def _follow(
    client: httpx.Client,
    run_id: str,
    on_progress: Callable[[float, str | None], None],
    on_log: Callable[[str], None],
) -> RemoteJob:
    job = RemoteJob(final={})
    stderr = bytearray()
    ended: Mapping[str, Any] | None = None
    try:
        with client.stream(
            "GET",
            _daemon._events_path(run_id),
            params=_daemon._NDJSON,
            timeout=_daemon._STREAM_TIMEOUT,
        ) as stream:
            for line in stream.iter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("event")
                if kind == "progress":
                    fraction, message = float(event.get("fraction", 0)), event.get("message")
                    job.progress.append((fraction, message))
                    on_progress(fraction, message)
                elif kind == "log":
                    _log(job, str(event.get("message", "")), on_log)
                elif kind == "stderr":
                    stderr += _daemon._chunk(event)
                elif kind == "ended":
                    ended = event.get("run") or {}
    except httpx.HTTPError:
        pass
    finally:
        if ended is None:
            _daemon._cancel(client, run_id)
    job.stderr = stderr.decode("utf-8", "replace")
    job.final = final_line(run_id, ended)
    return job


def _log(job: RemoteJob, message: str, on_log: Callable[[str], None]) -> None:
    bad = _NOT_AN_EVENT.match(message)
    if bad:
        job.bad_lines.append(f"{bad['reason']}: {bad['line']}")
        return
    job.logs.append(message)
    on_log(message)


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


def _download(client: httpx.Client, run_id: str, final: Mapping[str, Any]) -> dict[str, bytes]:
    """The files the daemon ingested from the worker's ``out/``."""
    ingest: Mapping[str, Any] = final.get("ingest") or {}
    base = f"/v1/runs/{quote(run_id, safe='')}/outputs/"
    outputs = {}
    for entry in ingest.get("files") or []:
        rel = str(entry["rel_path"])
        response = client.get(base + "/".join(quote(p, safe="") for p in rel.split("/")))
        if response.status_code != 200:
            raise httpx.HTTPError(f"output {rel!r} of job {run_id}: HTTP {response.status_code}")
        outputs[rel] = response.content
    return dict(sorted(outputs.items()))

"""Daemon mode: the same API over airlockd's HTTP API (docs/daemon.md, its openapi.json).

``AIRLOCK_URL`` (or ``Sandbox(url=...)``) names the daemon: ``unix:///run/airlockd/airlockd.sock``
or ``http(s)://host:port``; ``AIRLOCK_API_KEY`` (or ``api_key=``) is sent as a bearer token.
A run is created with ``POST /v1/runs`` (or a session's ``/runs``) and followed through its
NDJSON event stream, which carries the output as exact bytes whether or not the daemon stores
it, and ends with the run's record. A run the caller abandons (an exception, a cancelled task,
leaving a stream early) is cancelled with ``DELETE /v1/runs/{id}``.

Everything the daemon refuses comes back as the same :class:`Result` a local refusal gives:
``status == "sandbox_error"`` with the daemon's ``kind`` as ``error_kind`` (``ceiling``,
``queue_full``, ``invalid_policy``...) and its message and fix as ``error``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import ipaddress
import json
import os
import secrets
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

import httpx

from airlock._cli import AirlockError
from airlock._options import Options, duration_arg, size_arg
from airlock.result import ErrorKind, Event, Exit, Result, Status, Stderr, Stdout

URL_ENV = "AIRLOCK_URL"
KEY_ENV = "AIRLOCK_API_KEY"
#: ``Sandbox(url=LOCAL)`` runs the bundled CLI even when ``AIRLOCK_URL`` is set.
LOCAL = "local"
#: Seconds to wait for the daemon to answer a request (not for a run: streams wait for it).
REQUEST_TIMEOUT = 60.0


class DaemonError(AirlockError):
    """The daemon refused or failed a request that has no run to report it in (creating a
    session, a session's file); ``kind`` is the daemon's (``unauthorized``, ``not_found``...)."""

    def __init__(self, kind: str, message: str, fix: str = "", status_code: int = 0) -> None:
        super().__init__(f"{kind}: {message}" + (f" (fix: {fix})" if fix else ""))
        self.kind = kind
        self.message = message
        self.fix = fix
        self.status_code = status_code


@dataclass(frozen=True)
class Daemon:
    """Where airlockd listens, and the key to use."""

    url: str
    api_key: str | None = None
    #: A transport of one's own for synchronous requests (tests, a proxy, custom TLS).
    transport: httpx.BaseTransport | None = field(default=None, compare=False, repr=False)

    @classmethod
    def configured(cls, url: str | None, api_key: str | None) -> Daemon | None:
        """The daemon named by ``url``, else by ``$AIRLOCK_URL``; None for local mode."""
        chosen = url if url is not None else os.environ.get(URL_ENV) or None
        if chosen is None or chosen == LOCAL:
            return None
        if not chosen.startswith(("unix://", "http://", "https://")):
            raise ValueError(
                f"daemon address {chosen!r}: give unix:///path/to/airlockd.sock, "
                "http(s)://host:port, or 'local' for the bundled CLI"
            )
        key = api_key if api_key is not None else os.environ.get(KEY_ENV)
        if key and chosen.startswith("http://") and not _is_loopback(chosen):
            raise ValueError(
                f"{chosen}: an API key would cross the network in clear text; use https:// "
                "(a TLS listener of airlockd, or a TLS-terminating proxy) or a Unix socket"
            )
        return cls(chosen, key)

    def _settings(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        timeout = httpx.Timeout(REQUEST_TIMEOUT)
        if self.url.startswith("unix://"):
            # The host name is a placeholder: the socket path says where to connect.
            return {"base_url": "http://airlockd", "headers": headers, "timeout": timeout}
        return {"base_url": self.url.rstrip("/"), "headers": headers, "timeout": timeout}

    def _socket(self) -> str | None:
        return self.url.removeprefix("unix://") if self.url.startswith("unix://") else None

    def _verify(self) -> ssl.SSLContext | bool:
        # httpx would load a fresh trust store for every client (30-60 ms measured here):
        # one context serves every https client; a Unix socket or plain http needs none.
        return _tls_context() if self.url.startswith("https://") else False

    def client(self) -> httpx.Client:
        transport = self.transport or httpx.HTTPTransport(uds=self._socket(), verify=self._verify())
        return httpx.Client(transport=transport, **self._settings())

    def async_client(self) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport(uds=self._socket(), verify=self._verify())
        return httpx.AsyncClient(transport=transport, **self._settings())


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The system's trust store (``SSL_CERT_FILE``/``SSL_CERT_DIR`` name another), loaded once."""
    return ssl.create_default_context()


def _is_loopback(url: str) -> bool:
    host = httpx.URL(url).host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- Requests -----------------------------------------------------------------------------


def _is_profile_file(profile: str) -> bool:
    return "/" in profile or profile.endswith(".toml")


def _limits(o: Options) -> dict[str, object]:
    sizes = {
        "memory": o.memory,
        "stdout": o.stdout_cap,
        "stderr": o.stderr_cap,
        "disk": o.disk,
        "file_size": o.file_size,
    }
    limits: dict[str, object] = {k: size_arg(v) for k, v in sizes.items() if v is not None}
    for key, duration in (("wall_time", o.wall), ("cpu_time", o.cpu)):
        if duration is not None:
            limits[key] = duration_arg(duration)
    for key, count in (("processes", o.pids), ("files", o.files)):
        if count is not None:
            limits[key] = count
    return limits


def _network(o: Options) -> dict[str, object] | None:
    network: dict[str, object] = {}
    if o.network or o.allow_net:
        network["mode"] = o.network or "allowlist"
    if o.allow_net:
        network["allow"] = list(o.allow_net)
    if o.deny_net:
        network["deny"] = list(o.deny_net)
    return network or None


def policy_request(o: Options) -> dict[str, object]:
    """The ``policy`` of a run or session request: only what the caller set."""
    policy: dict[str, object] = {}
    if o.backend is not None:
        policy["backend"] = o.backend
    if o.min_isolation is not None:
        policy["min_isolation"] = o.min_isolation
    if (network := _network(o)) is not None:
        policy["network"] = network
    if limits := _limits(o):
        policy["limits"] = limits
    if o.allow_degraded:
        policy["allow_degraded"] = True
    return policy


def unsupported(o: Options, in_session: bool = False) -> str | None:
    """Why ``o`` cannot go to a daemon, naming the options, or None. Refused, never dropped:
    a run without the asked-for host paths or cgroup setting would be another run."""
    local_only = [
        name
        for name, value in (
            ("ro", o.ro),
            ("rw", o.rw),
            ("workdir", o.workdir if not in_session else None),
            ("no_cgroup", o.no_cgroup),
            ("dev", o.dev),
        )
        if value
    ]
    if o.profile_named and _is_profile_file(o.profile):
        local_only.append(f"profile file {o.profile!r}")
    if not local_only:
        return None
    return (
        f"{', '.join(local_only)}: host paths, profile files and set-up switches belong to the "
        "machine that runs the sandbox; a daemon's operator sets them in its configuration "
        "(its tenants' profiles: name one with profile=...). Use url='local' for a local run"
    )


def _stdin_fields(stdin: bytes | None) -> dict[str, str]:
    if stdin is None:
        return {}
    try:
        return {"stdin": stdin.decode("utf-8")}
    except UnicodeDecodeError:
        return {"stdin_base64": base64.b64encode(stdin).decode("ascii")}


def run_request(
    o: Options,
    *,
    command: Sequence[str] | None = None,
    code: str | None = None,
    language: str | None = None,
    args: Sequence[str] = (),
    stdin: bytes | None = None,
) -> dict[str, object]:
    """A ``RunRequest`` body for ``o``: a command, or code with its language."""
    body: dict[str, object] = {"env": dict(o.env), **_stdin_fields(stdin)}
    if command is not None:
        body["command"] = [str(a) for a in command]
    else:
        body.update(code=code, language=language, args=list(args))
    if o.profile_named:
        body["profile"] = o.profile
    if policy := policy_request(o):
        body["policy"] = policy
    return body


def session_request(o: Options) -> dict[str, object]:
    body: dict[str, object] = {}
    if o.profile_named:
        body["profile"] = o.profile
    if policy := policy_request(o):
        body["policy"] = policy
    return body


# --- Responses ----------------------------------------------------------------------------


def _error_detail(response: httpx.Response) -> tuple[str, str, str]:
    """(kind, message, fix) of an error response (ErrorBody), or what can be said without."""
    try:
        detail = response.json()["error"]
        return str(detail["kind"]), str(detail["message"]), str(detail.get("fix") or "")
    except (ValueError, KeyError, TypeError):
        text = response.text.strip()[:500] or response.reason_phrase
        return f"http_{response.status_code}", text, ""


def refusal(response: httpx.Response) -> Result:
    """A refused request as a run's Result: ``sandbox_error`` with the daemon's kind."""
    kind, message, fix = _error_detail(response)
    text = f"{message} (fix: {fix})" if fix else message
    return Result(
        status=Status.SANDBOX_ERROR,
        error=text,
        error_kind=ErrorKind(kind),
        raw={"http_status": response.status_code, "kind": kind, "message": message, "fix": fix},
    )


def daemon_error(response: httpx.Response) -> DaemonError:
    kind, message, fix = _error_detail(response)
    return DaemonError(kind, message, fix, response.status_code)


def unreachable(daemon: Daemon, error: httpx.HTTPError) -> AirlockError:
    return AirlockError(f"cannot reach airlockd at {daemon.url}: {error}")


def result_of(run: Mapping[str, Any], stdout: bytes | None, stderr: bytes | None) -> Result:
    """The Result of a run's record (``RunView``), with the output the stream carried."""
    raw: dict[str, Any] = dict(run.get("result") or {})
    detail = run.get("error") or {}
    if not raw:
        raw = {"status": run.get("status") or "sandbox_error", "backend": run.get("backend")}
    if detail and not raw.get("error"):
        raw["error"] = detail.get("message")
        raw["error_kind"] = raw.get("error_kind") or detail.get("kind")
    if raw.get("network") is None and run.get("network") is not None:
        raw["network"] = run["network"]
    for name, data in (("stdout", stdout), ("stderr", stderr)):
        if data is not None:
            raw[name] = data.decode("utf-8", "replace")
    return replace(Result.from_json(raw), run_id=run.get("id"))


def broken_stream(run_id: str) -> Result:
    return Result(
        status=Status.SANDBOX_ERROR,
        error=f"the event stream of run {run_id} ended before the run did; it was cancelled",
        error_kind=ErrorKind("stream_broken"),
        run_id=run_id,
    )


def _chunk(event: Mapping[str, Any]) -> bytes:
    if event.get("base64"):
        return base64.b64decode(event["base64"])
    return str(event.get("text", "")).encode()


class _Follower:
    """Turns NDJSON lines of a run's stream into events; remembers the record and output."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.ended: Mapping[str, Any] | None = None
        self.stdout = bytearray()
        self.stderr = bytearray()

    def feed(self, line: str) -> Event | None:
        if not line.strip():
            return None
        event = json.loads(line)
        kind = event.get("event")
        if kind == "stdout":
            data = _chunk(event)
            self.stdout += data
            return Stdout(data)
        if kind == "stderr":
            data = _chunk(event)
            self.stderr += data
            return Stderr(data)
        if kind == "ended":
            self.ended = event.get("run") or {}
        return None

    def exit(self) -> Exit:
        if self.ended is None:
            return Exit(broken_stream(self.run_id))
        return Exit(result_of(self.ended, bytes(self.stdout), bytes(self.stderr)))


_STREAM_TIMEOUT = httpx.Timeout(REQUEST_TIMEOUT, read=None)
_NDJSON = {"format": "ndjson"}
_CREATED = (200, 201, 202)


def _events_path(run_id: str) -> str:
    return f"/v1/runs/{quote(run_id, safe='')}/events"


def follow(daemon: Daemon, path: str, body: Mapping[str, object]) -> Iterator[Event]:
    """Creates a run at ``path`` and yields its output, then :class:`Exit`. Closing the
    iterator (or an exception in the caller) before the end cancels the run."""
    with daemon.client() as client:
        try:
            created = _create(client, path, body)
        except httpx.HTTPError as e:
            raise unreachable(daemon, e) from e
        if created.status_code not in _CREATED:
            yield Exit(refusal(created))
            return
        follower = _Follower(str(created.json()["id"]))
        yield from _events(client, follower)
        yield follower.exit()


def _create(client: httpx.Client, path: str, body: Mapping[str, object]) -> httpx.Response:
    """Creates the run under an idempotency key: interrupted (Ctrl-C) while the daemon answers,
    the same request again names the same run, which is then cancelled."""
    headers = {"Idempotency-Key": secrets.token_hex(16)}
    try:
        return client.post(path, json=body, headers=headers)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            again = client.post(path, json=body, headers=headers)
            if again.status_code in _CREATED:
                _cancel(client, str(again.json()["id"]))
        raise


def _events(client: httpx.Client, follower: _Follower) -> Iterator[Event]:
    """The run's output events. A stream that ends (or a caller that stops) before the run
    did cancels it; a broken stream is reported by ``follower.exit()``."""
    try:
        with client.stream(
            "GET", _events_path(follower.run_id), params=_NDJSON, timeout=_STREAM_TIMEOUT
        ) as stream:
            for line in stream.iter_lines():
                event = follower.feed(line)
                if event is not None:
                    yield event
    except httpx.HTTPError:
        pass
    finally:
        if follower.ended is None:
            _cancel(client, follower.run_id)


async def afollow(
    daemon: Daemon, path: str, body: Mapping[str, object]
) -> AsyncGenerator[Event, None]:
    """:func:`follow` for asyncio; a cancelled task cancels the run."""
    async with daemon.async_client() as client:
        try:
            created = await _acreate(client, path, json=body)
        except httpx.HTTPError as e:
            raise unreachable(daemon, e) from e
        if created.status_code not in _CREATED:
            yield Exit(refusal(created))
            return
        follower = _Follower(str(created.json()["id"]))
        # Closed at once when the caller stops early, so the run is cancelled then.
        async with contextlib.aclosing(_aevents(client, follower)) as events:
            async for event in events:
                yield event
        yield follower.exit()


async def _acreate(client: httpx.AsyncClient, path: str, **request: Any) -> httpx.Response:
    """Creates the run (``request``: the body, as ``json=`` or ``files=``). A task cancelled
    while the daemon answers (the run may already be running) still learns the run's id, and
    cancels the run before it stops."""
    post = asyncio.ensure_future(client.post(path, **request))
    try:
        return await asyncio.shield(post)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            created = await asyncio.wait_for(post, REQUEST_TIMEOUT)
            if created.status_code in _CREATED:
                await _acancel(client, str(created.json()["id"]))
        raise


async def _aevents(client: httpx.AsyncClient, follower: _Follower) -> AsyncGenerator[Event, None]:
    """:func:`_events` for asyncio."""
    try:
        async with client.stream(
            "GET", _events_path(follower.run_id), params=_NDJSON, timeout=_STREAM_TIMEOUT
        ) as stream:
            async for line in stream.aiter_lines():
                event = follower.feed(line)
                if event is not None:
                    yield event
    except httpx.HTTPError:
        pass
    finally:
        if follower.ended is None:
            await _acancel(client, follower.run_id)


def _run_path(run_id: str) -> str:
    return f"/v1/runs/{quote(run_id, safe='')}"


def _cancel(client: httpx.Client, run_id: str) -> None:
    with contextlib.suppress(httpx.HTTPError):
        client.delete(_run_path(run_id))


async def _acancel(client: httpx.AsyncClient, run_id: str) -> None:
    with contextlib.suppress(httpx.HTTPError):
        await client.delete(_run_path(run_id))


def collect(events: Iterator[Event]) -> Result:
    """The Result of a followed run (its output is in the Result)."""
    last: Result | None = None
    for event in events:
        if isinstance(event, Exit):
            last = event.result
    assert last is not None
    return last


async def acollect(events: AsyncIterator[Event]) -> Result:
    last: Result | None = None
    async for event in events:
        if isinstance(event, Exit):
            last = event.result
    assert last is not None
    return last


#: A run ready to send (daemon, path, body), or the Result of its refusal.
Request = tuple[Daemon, str, dict[str, object]] | Result


def result_of_request(remote: Request) -> Result:
    if isinstance(remote, Result):
        return remote
    return collect(follow(*remote))


def events_of_request(
    remote: Request,
) -> Iterator[Event]:
    if isinstance(remote, Result):
        yield Exit(remote)
        return
    for event in follow(*remote):
        yield _without_output(event)


async def aresult_of_request(
    remote: Request,
) -> Result:
    if isinstance(remote, Result):
        return remote
    return await acollect(afollow(*remote))


async def aevents_of_request(
    remote: Request,
) -> AsyncGenerator[Event, None]:
    if isinstance(remote, Result):
        yield Exit(remote)
        return
    async with contextlib.aclosing(afollow(*remote)) as events:
        async for event in events:
            yield _without_output(event)


def _without_output(event: Event) -> Event:
    """A stream's Exit carries no output (it came as events), as in local mode."""
    if isinstance(event, Exit):
        return Exit(replace(event.result, stdout="", stderr=""))
    return event


# --- Tool calls (POST /v1/calls) ------------------------------------------------------------


def _call_failure(kind: str, message: str, **details: object) -> dict[str, Any]:
    return {"ok": False, "error": {"error": kind, "message": message, **details}}


def _call_outcome(response: httpx.Response) -> dict[str, Any]:
    """``{"ok": True, "value": ...}`` or ``{"ok": False, "error": {"error": kind, ...}}``."""
    if response.status_code == 200:
        return dict(response.json())
    kind, message, fix = _error_detail(response)
    text = f"{message} (fix: {fix})" if fix else message
    return _call_failure("sandbox_error", text, error_kind=kind, http_status=response.status_code)


def _call_of_record(run: Mapping[str, Any] | None) -> dict[str, Any]:
    if not run:
        return _call_failure("sandbox_error", "the call's event stream ended before the call did")
    if isinstance(run.get("result"), dict) and "ok" in run["result"]:
        return dict(run["result"])
    detail = run.get("error") or {}
    return _call_failure(
        "sandbox_error",
        str(detail.get("message") or f"the call ended {run.get('status')}"),
        error_kind=detail.get("kind"),
    )


def call(daemon: Daemon, body: Mapping[str, object]) -> dict[str, Any]:
    """Calls a tool of a toolset; the outcome as the daemon's ``CallResponse`` says it (a
    refusal or an unreachable daemon as a ``sandbox_error`` failure, never an exception)."""
    try:
        with daemon.client() as client:
            response = client.post("/v1/calls", json=body, timeout=_STREAM_TIMEOUT)
            if response.status_code != 202:
                return _call_outcome(response)
            # Still running after the daemon's longest wait: follow it to its end.
            follower = _Follower(str(response.json()["id"]))
            for _ in _events(client, follower):
                pass
            return _call_of_record(follower.ended)
    except httpx.HTTPError as e:
        return _call_failure("sandbox_error", str(unreachable(daemon, e)))


async def acall(daemon: Daemon, body: Mapping[str, object]) -> dict[str, Any]:
    """:func:`call` for asyncio. A task cancelled while the daemon still holds the request
    cannot name the run yet; one cancelled while following it cancels it."""
    try:
        async with daemon.async_client() as client:
            response = await client.post("/v1/calls", json=body, timeout=_STREAM_TIMEOUT)
            if response.status_code != 202:
                return _call_outcome(response)
            follower = _Follower(str(response.json()["id"]))
            async for _ in _aevents(client, follower):
                pass
            return _call_of_record(follower.ended)
    except httpx.HTTPError as e:
        return _call_failure("sandbox_error", str(unreachable(daemon, e)))

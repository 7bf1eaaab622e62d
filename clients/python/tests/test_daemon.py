"""Daemon mode only: what the daemon refuses, how the client is configured, and the requests
it sends checked against airlockd's checked-in OpenAPI document (the contract)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Airlockd

from airlock import AirlockError, DaemonError, ErrorKind, Sandbox, Status, _daemon
from airlock._options import options_from

OPENAPI = Path(
    os.environ.get("AIRLOCKD_OPENAPI")
    or Path(__file__).resolve().parents[3] / "crates" / "airlockd" / "openapi.json"
)


def test_beyond_the_ceiling_is_a_typed_refusal(airlockd: Airlockd) -> None:
    r = Sandbox(network="host", url=airlockd.url, api_key=airlockd.key).run(["true"])
    assert r.status == Status.SANDBOX_ERROR and r.error_kind == ErrorKind.CEILING, r
    assert r.error and "host" in r.error and "fix:" in r.error
    assert r.raw["http_status"] == 403


def test_a_bad_key_is_a_typed_refusal(airlockd: Airlockd) -> None:
    r = Sandbox(url=airlockd.url, api_key="alk_not-a-key").run(["true"])
    assert r.status == Status.SANDBOX_ERROR and r.error_kind == ErrorKind.UNAUTHORIZED, r
    with pytest.raises(DaemonError) as err:
        Sandbox.session(url=airlockd.url, api_key="alk_not-a-key")
    assert err.value.kind == "unauthorized" and err.value.status_code == 401


def test_host_paths_are_refused_not_dropped(airlockd: Airlockd) -> None:
    r = Sandbox(ro=["/etc"], url=airlockd.url, api_key=airlockd.key).run(["true"])
    assert r.status == Status.SANDBOX_ERROR and r.error_kind == ErrorKind.UNSUPPORTED, r
    assert r.error and "ro" in r.error and "url='local'" in r.error


def test_airlock_url_and_key_come_from_the_environment(
    airlockd: Airlockd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRLOCK_URL", airlockd.url)
    monkeypatch.setenv("AIRLOCK_API_KEY", airlockd.key)
    sb = Sandbox()
    assert sb.daemon is not None and sb.daemon.url == airlockd.url
    r = sb.run(["echo", "hi"])
    assert r.ok and r.stdout == "hi\n" and r.run_id, r
    assert Sandbox(url="local").daemon is None


def test_https_with_a_key(airlockd: Airlockd) -> None:
    # A fresh interpreter: the trust store is loaded once per process, here from SSL_CERT_FILE.
    code = (
        "import sys; from airlock import Sandbox\n"
        "r = Sandbox(url=sys.argv[1], api_key=sys.argv[2]).run(['echo', 'over tls'])\n"
        "print(r.status, r.stdout.strip(), r.run_id is not None)\n"
    )
    env = {**os.environ, "SSL_CERT_FILE": str(airlockd.ca_file)}
    env.pop("SSL_CERT_DIR", None)
    argv = [sys.executable, "-c", code, airlockd.https_url, airlockd.key]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout == "exited over tls True\n", done.stderr
    # Without trusting the daemon's certificate, nothing is sent.
    env.pop("SSL_CERT_FILE")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr


def test_an_unreachable_daemon_raises(tmp_path: Path) -> None:
    with pytest.raises(AirlockError, match="cannot reach airlockd"):
        Sandbox(url=f"unix://{tmp_path}/none.sock").run(["true"])


def test_an_address_that_is_no_daemon_is_refused() -> None:
    with pytest.raises(ValueError, match="unix://"):
        Sandbox(url="ftp://example.com")


def test_a_key_never_goes_over_plain_http_off_this_machine() -> None:
    with pytest.raises(ValueError, match="clear text"):
        Sandbox(url="http://airlock.example.com:8080", api_key="alk_x")
    for url in ("http://127.0.0.1:8080", "http://[::1]:8080", "http://localhost:8080"):
        assert Sandbox(url=url, api_key="alk_x").daemon is not None
    assert Sandbox(url="https://airlock.example.com", api_key="alk_x").daemon is not None


def test_a_broken_stream_cancels_the_run() -> None:
    # A daemon that accepts the run, then drops its event stream before `ended`.
    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.method == "POST":
            return httpx.Response(202, json={"id": "run_1", "status": "queued"})
        if request.url.path.endswith("/events"):
            return httpx.Response(200, content=b'{"event":"stdout","text":"par"}\n')
        return httpx.Response(202, json={"id": "run_1", "status": "running"})

    daemon = _daemon.Daemon("http://airlockd.test", transport=httpx.MockTransport(handler))
    result = _daemon.collect(_daemon.follow(daemon, "/v1/runs", {"command": ["true"]}))
    assert result.status == Status.SANDBOX_ERROR
    assert result.error_kind == ErrorKind.STREAM_BROKEN and result.run_id == "run_1"
    assert ("DELETE", "/v1/runs/run_1") in seen


# --- The contract: the bodies the client sends validate against the daemon's schema ----------


def _validator(schema_name: str) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    if not OPENAPI.is_file():
        pytest.skip(f"{OPENAPI} is not in this checkout")
    document = json.loads(OPENAPI.read_text())
    schema = {"$ref": f"#/components/schemas/{schema_name}", **document}
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"profile": "trusted", "memory": "256MiB", "wall": 2.5, "cpu": "10s", "pids": 32},
        {"allow_net": ["api.example.com"], "backend": "native", "min_isolation": "kernel"},
        {"network": "none", "stdout_cap": 1 << 20, "disk": "64MiB", "files": 100},
        {"allow_degraded": True, "file_size": "1MiB", "stderr_cap": "64KiB"},
        {"allow_net": ["**.example.com"], "deny_net": ["other.example.com"]},
        {"deny_net": ["203.0.113.0/24"]},
    ],
)
def test_run_and_session_requests_match_the_daemon_s_schema(options: dict[str, Any]) -> None:
    o = options_from(**options)
    runs = _validator("RunRequest")
    runs.validate(_daemon.run_request(o, command=["python3", "-c", "print(1)"], stdin=b"\xff"))
    runs.validate(_daemon.run_request(o, code="print(1)", language="python", args=["a"]))
    _validator("SessionRequest").validate(_daemon.session_request(o))

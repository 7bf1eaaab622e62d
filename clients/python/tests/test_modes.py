"""Cases beyond the examples, in local mode (the bundled CLI) and daemon mode (a real airlockd
on a temporary Unix socket): the same Results and the same typed errors. The examples
(test_examples), limits, streams, sessions and cancellation (test_sandbox) and tool calls
(test_tools) run in both modes too."""

from __future__ import annotations

import pytest
from conftest import Mode

from airlock import ErrorKind, Result, Sandbox, Status


def test_run_code_and_stdin(mode: Mode) -> None:
    sb = Sandbox(wall="30s", **mode.kw)
    r = sb.run_code("import sys; print(sys.argv[1], 6*7)", "python", args=["answer"])
    assert r.ok and r.stdout == "answer 42\n", r
    r = sb.run(["sh", "-c", "tr a-z A-Z"], stdin="hello\n", env={"X": "1"})
    assert r.ok and r.stdout == "HELLO\n", r


def test_exact_bytes_come_back(mode: Mode) -> None:
    r = Sandbox(**mode.kw).run(["printf", "caf\\303\\251 \\377"])
    assert r.ok and r.stdout == "café \ufffd", r


def _skip_without_gate(r: Result) -> None:
    if r.error_kind == "network_allowlist_unavailable":
        pytest.skip(f"this airlockd refuses allowlists with a typed error: {r.error}")


def test_allow_net_runs_behind_the_egress_gate(mode: Mode) -> None:
    # A name beyond the allowlist is refused by the gate's resolver (no traffic leaves).
    code = (
        "import socket\n"
        "try:\n    socket.getaddrinfo('other.example.org', 443)\n"
        "except OSError:\n    print('refused')\n"
    )
    r = Sandbox(allow_net=["api.example.com"], wall="30s", **mode.kw).run(["python3", "-c", code])
    _skip_without_gate(r)
    assert r.ok and r.stdout == "refused\n", r
    assert r.network is not None and r.network.get("mode") == "allowlist", r.network


def test_deny_net_wins_over_allow_net(mode: Mode) -> None:
    # Only the denied name is looked up: an allowed one would be resolved for real.
    code = (
        "import socket\n"
        "try:\n    socket.getaddrinfo('other.example.com', 443)\n"
        "except OSError:\n    print('refused')\n"
    )
    sb = Sandbox(allow_net=["**.example.com"], deny_net=["other.example.com"], **mode.kw)
    r = sb.run(["python3", "-c", code])
    _skip_without_gate(r)
    assert r.ok and r.stdout == "refused\n", r
    assert r.network is not None
    names = {d["name"]: d["decision"] for d in r.network["decisions"] if d.get("name")}
    assert names == {"other.example.com": "deny"}, r.network


def test_an_unknown_interpreter_is_a_typed_refusal(mode: Mode) -> None:
    r = Sandbox(**mode.kw).run_code("DISPLAY 'HI'.", language="cobol")
    assert r.status == Status.SANDBOX_ERROR and r.error_kind == ErrorKind.INTERPRETER_UNKNOWN, r
    assert r.error and "cobol" in r.error


def test_a_missing_program_is_a_typed_refusal(mode: Mode) -> None:
    r = Sandbox(**mode.kw).run(["/nonexistent/program"])
    assert r.status == Status.SANDBOX_ERROR and r.error_kind is not None, r
    assert r.error_kind in (ErrorKind.PROGRAM_NOT_FOUND, ErrorKind.BAD_PATH), r

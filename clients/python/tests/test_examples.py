"""Every example of issue 18's "What a Python user writes", in local mode and (``mode``)
against a real airlockd."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from conftest import Mode

from airlock import (
    Exit,
    Sandbox,
    SandboxPolicy,
    Status,
    Stderr,
    Stdout,
    ToolResult,
    WorkspaceError,
)


def test_run_returns_a_full_result(mode: Mode) -> None:
    sb = Sandbox(profile="untrusted", memory="256MiB", wall="30s", **mode.kw)
    r = sb.run(["python3", "-c", "print(6*7)"])
    assert r.status == Status.EXITED and r.exit_code == 0 and r.ok
    assert r.stdout == "42\n" and r.stderr == ""
    assert r.limits_hit == ()
    assert {"user_ns", "net_ns", "seccomp", "landlock_fs"} <= set(r.isolation)
    assert r.error is None and r.error_kind is None


def test_run_code_runs_a_string_with_the_interpreter_registry(mode: Mode) -> None:
    sb = Sandbox(memory="256MiB", wall="30s", **mode.kw)
    r = sb.run_code("print(6*7)", language="python")
    assert r.ok and r.stdout == "42\n"


def test_stream_yields_output_as_it_comes_then_the_result(mode: Mode) -> None:
    events = list(Sandbox(**mode.kw).stream(["bash", "-c", "echo out; echo err >&2; echo more"]))
    out = b"".join(e.data for e in events if isinstance(e, Stdout))
    err = b"".join(e.data for e in events if isinstance(e, Stderr))
    assert out == b"out\nmore\n" and b"err\n" in err
    assert isinstance(events[-1], Exit) and events[-1].result.ok
    assert events[-1].result.stdout == "" and events[-1].result.stderr == ""


def test_a_session_keeps_its_workspace_between_runs(mode: Mode) -> None:
    with Sandbox.session(profile="untrusted", **mode.kw) as s:
        s.files.write("data.csv", b"city,temp\nOslo,3\nLima,19\n")
        s.files.write(
            "analyse.py",
            "import csv, json\n"
            "rows = list(csv.DictReader(open('data.csv')))\n"
            "json.dump({'rows': len(rows), 'max': max(int(r['temp']) for r in rows)},"
            " open('report.json', 'w'))\n",
        )
        r = s.run(["python3", "analyse.py"])
        assert r.ok, r
        out = s.files.read("report.json")
        assert json.loads(out) == {"rows": 2, "max": 19}
        assert s.files.list() == ["analyse.py", "data.csv", "report.json"]
        with pytest.raises(WorkspaceError) as err:
            s.files.read("missing.txt")
        assert err.value.reason == "not_found"
        workdir = s.workdir
    assert workdir is None or not workdir.exists()


def test_a_decorated_tool_is_called_under_its_policy(tools_dir: Path) -> None:
    module = importlib.import_module("decorated_tools")
    result = module.conjugate.call(verb="hablar", tense="present")
    assert isinstance(result, ToolResult), result
    assert result.value == {"verb": "hablar", "tense": "present", "yo": "hablo"}
    assert result.policy is SandboxPolicy.SANDBOXED


def test_a_decorated_subprocess_tool_uses_this_environment(tools_dir: Path) -> None:
    module = importlib.import_module("decorated_tools")
    result = module.conjugate_trusted.call(verb="hablar", tense="present")
    assert isinstance(result, ToolResult), result
    assert result.value["yo"] == "hablo"

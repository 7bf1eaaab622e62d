"""The tool dispatcher: the tutor's adversarial tools come back as typed values."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import Airlockd, Mode

from airlock import (
    SandboxPolicy,
    ToolError,
    ToolResult,
    arun_under_sandbox,
    run_under_sandbox,
    tool,
)
from airlock.tools import _plan_call

ISOLATED = [SandboxPolicy.SUBPROCESS, SandboxPolicy.SANDBOXED]
LIMITS: dict[str, Any] = {"timeout": "2s", "memory": "256MiB", "pids": 32}


@pytest.fixture
def tools(tools_dir: Path) -> ModuleType:
    return importlib.import_module("tutor_tools")


def call(fn: Any, policy: SandboxPolicy, args: Any = None) -> Any:
    return run_under_sandbox(tool(policy=policy, **LIMITS)(fn), args or {})


@pytest.mark.parametrize("policy", [SandboxPolicy.PERMISSIVE, *ISOLATED])
def test_a_good_tool_returns_its_value(tools: ModuleType, policy: SandboxPolicy) -> None:
    r = call(tools.conjugate, policy, {"verb": "tener", "tense": "present"})
    assert isinstance(r, ToolResult) and r.policy is policy
    assert r.value == {"verb": "tener", "tense": "present", "yo": "tengo"}


def test_positional_arguments(tools: ModuleType) -> None:
    r = call(tools.conjugate, SandboxPolicy.SANDBOXED, ["hablar", "past"])
    assert isinstance(r, ToolResult) and r.value["tense"] == "past"


@pytest.mark.parametrize("policy", ISOLATED)
def test_an_infinite_loop_is_a_timeout(tools: ModuleType, policy: SandboxPolicy) -> None:
    r = call(tools.evil_infinite_loop, policy)
    assert isinstance(r, ToolError) and r.kind == "timeout", r
    assert str(r).startswith("timeout")


@pytest.mark.parametrize("policy", ISOLATED)
def test_a_memory_eater_is_a_memory_limit(tools: ModuleType, policy: SandboxPolicy) -> None:
    r = call(tools.evil_memory_eater, policy)
    assert isinstance(r, ToolError) and r.kind == "memory_limit", r


@pytest.mark.parametrize("policy", ISOLATED)
def test_a_fork_bomb_is_contained(tools: ModuleType, policy: SandboxPolicy) -> None:
    r = call(tools.evil_fork_bomb, policy)
    assert isinstance(r, ToolError) and r.kind in ("timeout", "memory_limit", "crashed"), r
    after = call(tools.conjugate, policy, {"verb": "ir", "tense": "present"})
    assert isinstance(after, ToolResult) and after.value["yo"] == "voy"


@pytest.mark.parametrize("policy", ISOLATED)
def test_an_output_flood_is_an_output_limit(tools: ModuleType, policy: SandboxPolicy) -> None:
    r = call(tools.evil_output_flood, policy)
    assert isinstance(r, ToolError) and r.kind == "output_limit", r


@pytest.mark.parametrize("policy", ISOLATED)
def test_a_crash_carries_the_stderr_tail(tools: ModuleType, policy: SandboxPolicy) -> None:
    r = call(tools.evil_crash, policy)
    assert isinstance(r, ToolError) and r.kind == "crashed", r
    assert "about to crash" in r.stderr_tail


@pytest.mark.parametrize("policy", [SandboxPolicy.PERMISSIVE, *ISOLATED])
def test_exceptions_and_bad_results_are_typed(tools: ModuleType, policy: SandboxPolicy) -> None:
    raised = call(tools.evil_raise, policy)
    assert isinstance(raised, ToolError) and raised.kind == "raised"
    assert "no such verb" in raised.message
    bad = call(tools.evil_not_json, policy)
    assert isinstance(bad, ToolError) and bad.kind == "bad_output"


def test_arguments_that_are_not_json_are_a_value(tools: ModuleType) -> None:
    r = run_under_sandbox(tools.conjugate, {"verb": object()})
    assert isinstance(r, ToolError) and r.kind == "bad_args"


def test_a_lambda_is_a_bad_tool() -> None:
    r = run_under_sandbox(lambda: 1, {}, SandboxPolicy.SANDBOXED)
    assert isinstance(r, ToolError) and r.kind == "bad_tool"


def test_the_agent_loop_survives_every_adversarial_tool(tools: ModuleType) -> None:
    """The tutor's lab: each misbehaving tool is a value and the loop goes on."""
    registry = {
        name: tool(policy=SandboxPolicy.SANDBOXED, **LIMITS)(getattr(tools, name))
        for name in (
            "evil_infinite_loop",
            "evil_memory_eater",
            "evil_fork_bomb",
            "evil_output_flood",
            "evil_crash",
            "conjugate",
        )
    }
    plan: list[tuple[str, dict[str, str]]] = [(n, {}) for n in registry if n != "conjugate"]
    plan.append(("conjugate", {"verb": "ser", "tense": "present"}))
    outcomes = [run_under_sandbox(registry[name], args) for name, args in plan]
    assert all(isinstance(o, ToolError) for o in outcomes[:-1])
    assert isinstance(outcomes[-1], ToolResult) and outcomes[-1].value["yo"] == "soy"


def test_calling_a_tool_raises_its_error_for_those_who_want_exceptions(
    tools: ModuleType,
) -> None:
    loop = tool(policy=SandboxPolicy.SANDBOXED, timeout="1s")(tools.evil_infinite_loop)
    with pytest.raises(ToolError) as err:
        loop()
    assert err.value.kind == "timeout"


def test_async_calls_run_concurrently(tools: ModuleType) -> None:
    conj = tool(policy=SandboxPolicy.SANDBOXED, **LIMITS)(tools.conjugate)

    async def main() -> list[Any]:
        calls = [conj.acall(verb=v, tense="present") for v in ("hablar", "comer", "vivir")]
        return [*await asyncio.gather(*calls), await arun_under_sandbox(tools.evil_raise)]

    *good, bad = asyncio.run(main())
    assert [r.value["yo"] for r in good] == ["hablo", "como", "vivo"]
    assert isinstance(bad, ToolError) and bad.kind == "raised"


def test_container_policy_runs_in_a_container(tools: ModuleType) -> None:
    r = call(tools.conjugate, SandboxPolicy.CONTAINER, {"verb": "hablar", "tense": "present"})
    assert isinstance(r, ToolResult), r


def test_a_tool_takes_the_sandbox_options_of_a_run(tools: ModuleType) -> None:
    # The same options as Sandbox(...): an allowlist (behind the egress gate), the environment.
    probe = tool(policy=SandboxPolicy.SANDBOXED, allow_net=["api.example.com"], **LIMITS)(
        tools.network_probe
    )
    plan = _plan_call(probe, "{}", SandboxPolicy.SANDBOXED)
    assert not isinstance(plan, ToolError)
    argv, prepared = plan
    prepared.cleanup()
    assert argv[argv.index("--allow-net") + 1] == "api.example.com"
    r = probe.call()
    assert isinstance(r, ToolResult), r
    # The gate refuses what the allowlist does not name: the host's loopback, other names.
    assert r.value["dns"] == "refused" and r.value["loopback"] != "connected", r.value


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        ("conjugate", None),
        ("evil_infinite_loop", "timeout"),
        ("evil_memory_eater", "memory_limit"),
        ("evil_raise", "raised"),
        ("evil_not_json", "bad_output"),
    ],
)
def test_sandboxed_calls_in_both_modes(
    tools: ModuleType, mode: Mode, fn: str, expected: str | None
) -> None:
    # Daemon mode calls the same module from the operator's toolset (POST /v1/calls).
    t = tool(policy=SandboxPolicy.SANDBOXED, toolset="tutor", **LIMITS, **mode.kw)
    r = t(getattr(tools, fn)).call(*(["tener", "present"] if fn == "conjugate" else []))
    if expected is None:
        assert isinstance(r, ToolResult), r
        assert r.value == {"verb": "tener", "tense": "present", "yo": "tengo"}
    else:
        assert isinstance(r, ToolError) and r.kind == expected, r


def test_async_calls_in_both_modes(tools: ModuleType, mode: Mode) -> None:
    t = tool(policy=SandboxPolicy.SANDBOXED, toolset="tutor", **LIMITS, **mode.kw)

    async def main() -> list[Any]:
        conj = t(tools.conjugate)
        calls = [conj.acall(verb=v, tense="present") for v in ("hablar", "comer")]
        return [*await asyncio.gather(*calls), await t(tools.evil_infinite_loop).acall()]

    hablo, como, loop = asyncio.run(main())
    assert [hablo.value["yo"], como.value["yo"]] == ["hablo", "como"]
    assert isinstance(loop, ToolError) and loop.kind == "timeout"


def test_daemon_calls_are_refused_as_values_not_run_differently(
    tools: ModuleType, airlockd: Airlockd
) -> None:
    at: dict[str, Any] = {"url": airlockd.url, "api_key": airlockd.key}
    # The tenant's ceiling has no host network; the `trusted` profile of SUBPROCESS has.
    r = tool(policy=SandboxPolicy.SUBPROCESS, toolset="tutor", **at)(tools.conjugate).call()
    assert isinstance(r, ToolError) and r.kind == "sandbox_error", r
    assert r.details["error_kind"] == "ceiling"
    refused: list[dict[str, Any]] = [
        {"toolset": None},
        {"toolset": "tutor", "allow_net": ["a.example.com"]},
        {"toolset": "tutor", "policy": SandboxPolicy.CONTAINER},
    ]
    for options in refused:
        r = tool(**{"policy": SandboxPolicy.SANDBOXED, **options, **at})(tools.conjugate).call()
        assert isinstance(r, ToolError) and r.details["error_kind"] == "unsupported", r
    r = tool(policy=SandboxPolicy.SANDBOXED, toolset="other", **at)(tools.conjugate).call()
    assert isinstance(r, ToolError) and r.details["error_kind"] == "ceiling", r

"""WorkerRuntime: the plugin platform's worker contract, in local mode (`airlock worker`) and
against airlockd (`POST /v1/workers`, the helper shipped by the daemon), with the same
assertions."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest
from conftest import FIXTURES, Airlockd, Mode

from airlock import Progress, Status, WorkerRuntime


@pytest.fixture
def worker(shared_dir: Path) -> Path:
    path = shared_dir / "worker.py"
    shutil.copy(FIXTURES / "worker.py", path)
    path.chmod(0o644)
    return path


def test_a_worker_turns_inputs_into_outputs_with_progress(worker: Path, mode: Mode) -> None:
    seen: list[Progress] = []
    result = WorkerRuntime(memory="256MiB", wall="30s", **mode.kw).run(
        worker=str(worker),
        inputs={"a.csv": b"x,y\n1,2\n", "b.txt": b"hello"},
        options={"mode": "fast"},
        on_progress=seen.append,
    )
    assert result.success and result.failure is None, (result.failure, result.stderr)
    assert result.outputs == {"a.csv.out": b"X,Y\n1,2\n", "b.txt.out": b"HELLO"}
    assert seen == result.progress and seen[-1] == Progress(1.0, "done")
    assert seen[0].message == "processing a.csv"
    assert result.logs == ["2 inputs, mode fast"]


def test_a_misbehaving_worker_cannot_smuggle_a_symlink_out(worker: Path, mode: Mode) -> None:
    result = WorkerRuntime(**mode.kw).run(worker, {"a": b"1"}, {"mode": "misbehave"})
    assert result.success
    assert "escape" not in result.outputs and result.outputs == {"a.out": b"1"}
    assert [s["reason"] for s in result.skipped] == ["symlink"]
    assert any("hello from a bare print" in line for line in result.bad_lines)


def test_a_failing_worker_is_a_typed_failure(worker: Path, mode: Mode) -> None:
    result = WorkerRuntime(**mode.kw).run(worker, {"a": b"1"}, {"mode": "fail"})
    assert not result.success and result.exit_code == 3
    assert result.failure is not None and result.failure.kind == "crashed"
    assert result.outputs == {"a.out": b"1"}


def test_a_hung_worker_times_out(worker: Path, mode: Mode) -> None:
    result = WorkerRuntime(wall="2s", **mode.kw).run(worker, {"a": b"1"}, {"mode": "hang"})
    assert result.status == Status.TIMEOUT
    assert result.failure is not None and result.failure.kind == "timeout"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_the_backend_is_chosen_by_the_platform(worker: Path, mode: Mode) -> None:
    result = WorkerRuntime(backend="bwrap", **mode.kw).run(worker, {"a": b"q"})
    assert result.success, (result.failure, result.stderr)
    assert result.outputs == {"a.out": b"Q"}


def test_bad_input_names_are_refused_before_anything_runs(worker: Path, mode: Mode) -> None:
    result = WorkerRuntime(**mode.kw).run(worker, {"../evil": b"1"})
    assert not result.success and result.failure is not None
    assert result.failure.kind == "sandbox_error" and "../evil" in result.failure.message


def test_arun_gives_the_same_result(worker: Path, mode: Mode) -> None:
    seen: list[Progress] = []
    runtime = WorkerRuntime(memory="256MiB", wall="30s", **mode.kw)
    result = asyncio.run(runtime.arun(worker, {"a.csv": b"x"}, {"mode": "fast"}, seen.append))
    assert result.success and result.outputs == {"a.csv.out": b"X"}
    assert seen == result.progress and seen[-1] == Progress(1.0, "done")


def test_a_cancelled_async_job_ends_cancelled_on_the_daemon(
    worker: Path, airlockd: Airlockd
) -> None:
    runtime = WorkerRuntime(wall="120s", url=airlockd.url, api_key=airlockd.key)
    started: list[Progress] = []

    async def main() -> None:
        task = asyncio.ensure_future(
            runtime.arun(worker, {"a": b"1"}, {"mode": "hang"}, started.append)
        )
        deadline = time.monotonic() + 30
        while not started and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    since = int(time.time() * 1000)
    asyncio.run(main())
    assert started, "the job never reported progress"
    headers = {"Authorization": f"Bearer {airlockd.key}"}
    transport = httpx.HTTPTransport(uds=str(airlockd.socket))
    with httpx.Client(transport=transport, base_url="http://airlockd", headers=headers) as c:
        deadline = time.monotonic() + 20
        while True:
            runs = c.get("/v1/runs", params={"since": str(since)}).json()["runs"]
            jobs = [r for r in runs if r["kind"] == "worker"]
            if jobs and jobs[0]["status"] not in ("queued", "running"):
                break
            assert time.monotonic() < deadline, jobs
            time.sleep(0.2)
    assert jobs[0]["status"] == "cancelled"

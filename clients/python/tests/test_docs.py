"""Every Python block and command of docs/python.md and docs/mcp.md runs as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Airlockd

DOCS = Path(__file__).resolve().parents[3] / "docs"
PAGES = ["python.md", "mcp.md"]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)
#: Shown commands CI runs itself (.ci/python builds and installs the wheel exactly so).
RUN_BY_CI = ("bash clients/python/build-wheel.sh",)


def blocks(language: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in PAGES:
        for lang, body in BLOCK.findall((DOCS / page).read_text()):
            if lang == language:
                found.append((f"{page}#{len(found) + 1}", body))
    return found


@pytest.fixture
def workdir(shared_dir: Path) -> Path:
    return shared_dir


def _daemon_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """What a block that talks to airlockd's /mcp reads: a started daemon's URL and key, and
    its certificate as the trust store."""
    daemon: Airlockd = request.getfixturevalue("airlockd")
    return {
        "AIRLOCK_MCP_URL": f"{daemon.https_url}/mcp",
        "AIRLOCK_API_KEY": daemon.key,
        "SSL_CERT_FILE": str(daemon.ca_file),
    }


@pytest.mark.parametrize(("where", "code"), blocks("python"), ids=lambda v: str(v)[:20])
def test_python_block_runs(
    where: str, code: str, workdir: Path, request: pytest.FixtureRequest
) -> None:
    script = workdir / "snippet.py"
    script.write_text(code)
    env = {**os.environ, **(_daemon_env(request) if "AIRLOCK_MCP_URL" in code else {})}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{where}:\n{code}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"


@pytest.mark.parametrize(("where", "command"), blocks("sh"), ids=lambda v: str(v)[:20])
def test_shell_command_runs(where: str, command: str, workdir: Path) -> None:
    if command.startswith(RUN_BY_CI):
        pytest.skip(".ci/python runs this command itself (build and install the wheel)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    assert shutil.which(command.split()[0], path=env["PATH"]), command
    # stdin closed: a server started this way sees its client leave and exits cleanly.
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{where}: {command}\n{done.stderr}"

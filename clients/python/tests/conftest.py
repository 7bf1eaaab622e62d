"""Shared fixtures: the installed airlock binary, its features, world-readable scratch."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airlock import _cli

FIXTURES = Path(__file__).parent / "fixtures"


def cli_features() -> _cli.Features:
    return _cli.features(_cli.find_binary("airlock"))


def needs(sub: str, flag: str, why: str) -> pytest.MarkDecorator:
    """Skips unless ``airlock SUB`` has ``FLAG``, naming the missing CLI feature."""
    return pytest.mark.skipif(
        not cli_features().has(sub, flag),
        reason=f"this airlock has no `airlock {sub} {flag}`: {why}",
    )


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the sandbox user can read (pytest's tmp_path is 0700 under root)."""
    path = Path(tempfile.mkdtemp(prefix="airlock-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tools_dir() -> Iterator[Path]:
    """The fixture tool modules, copied where the sandbox user can read them and importable."""
    path = Path(tempfile.mkdtemp(prefix="airlock-tools-"))
    path.chmod(0o755)
    for module in ("tutor_tools.py", "decorated_tools.py"):
        shutil.copy(FIXTURES / module, path / module)
        os.chmod(path / module, 0o644)
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))
    shutil.rmtree(path, ignore_errors=True)

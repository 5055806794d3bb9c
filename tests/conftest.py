"""Shared fixtures and skip helpers for the whole test suite."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def root_and_loop() -> bool:
    """True when the tests run as root on a machine with loop devices."""
    return os.geteuid() == 0 and Path("/dev/loop-control").exists()


def skip_unless_root() -> None:
    """Skip the calling test unless it runs as root with loop devices."""
    if not root_and_loop():
        pytest.skip("needs root and /dev/loop-control")


def require_tools(*tools: str) -> None:
    """Skip the calling test when one of the external tools is missing."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


@pytest.fixture
def needs_root() -> None:
    """Fixture form of skip_unless_root."""
    skip_unless_root()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests marked needs_root skip cleanly where there is no root or no loop device.
    if root_and_loop():
        return
    skip = pytest.mark.skip(reason="needs root and /dev/loop-control")
    for item in items:
        if "needs_root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def e2fsprogs() -> None:
    """Skip unless mke2fs, debugfs, dumpe2fs and e2freefrag are installed."""
    require_tools("mke2fs", "debugfs", "dumpe2fs", "e2freefrag")


@pytest.fixture
def fsage_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running ``python3 -m fsage`` from the source tree in a subprocess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("FSAGE_DB", None)
    env["HOME"] = str(tmp_path)
    return env

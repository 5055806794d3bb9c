"""Fixtures of the live-reader tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from snapshotter.livefs import scratch_dir


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """A scratch directory for a test module's file systems, removed after it."""
    with scratch_dir() as d:
        yield d

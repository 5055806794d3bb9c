"""`fsage snapshot` run as a user runs it (a fresh process), for the tests that compare what
two reads of one file system record."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO

_LINE = re.compile(r"snapshot \d+ of (.+): .*; (\d+) new, (\d+) changed, (\d+) deleted")


@dataclass
class Snapped:
    name: str  # the file system's name the snapshot went under
    counts: tuple[int, int, int]  # new, changed, deleted


def snapshot_cli(db: Path, source: str | Path, *extra: str) -> Snapped:
    """Run ``fsage snapshot SOURCE --db DB [EXTRA...]``; it must succeed and print its counts."""
    proc = subprocess.run(
        [sys.executable, "-m", "fsage", "snapshot", str(source), "--db", str(db), *extra],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    m = _LINE.search(proc.stdout)
    assert m is not None, proc.stdout
    return Snapped(m.group(1), (int(m.group(2)), int(m.group(3)), int(m.group(4))))

"""A mail-aged file system: fsage's ``mail`` preset (many small messages, a few large
mailboxes appended to, deletes and re-creates) run on a loop-mounted ext4 of a given block
size, whose free space ends in holes of a few blocks. A target the matcher did not make,
for the tests of ``fsage age --match`` and bench/match_targets.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ext4_image(path: Path, size: int, block_size: int = 4096) -> Path:
    """A fresh ext4 image of ``size`` bytes with ``block_size``-byte blocks."""
    path.unlink(missing_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", str(block_size), str(path)], check=True)
    return path


def mail_aged(
    path: Path,
    size: int,
    *,
    block_size: int = 1024,
    fill: float = 0.82,
    churn: float = 1.0,
    seed: int = 1,
) -> Path:
    """A fresh ext4 image at ``path`` aged by ``fsage age --profile mail --mount`` to
    ``fill`` with ``churn``."""
    ext4_image(path, size, block_size)
    subprocess.run(
        [sys.executable, "-m", "fsage", "age", str(path), "--profile", "mail",
         "--fill", str(fill), "--churn", str(churn), "--seed", str(seed), "--mount"],
        check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return path

"""Oracles for the ager tests: layout score from `filefrag -v`, free extents from e2freefrag."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_EXT = re.compile(r"^\s*\d+:\s*(\d+)\.\.\s*(\d+):\s*(\d+)\.\.\s*(\d+):\s*(\d+):")


def filefrag_score(paths: list[Path]) -> tuple[int, int]:
    """(contiguous blocks, blocks - 1 summed) over files of >= 2 blocks, from `filefrag -v`:
    the block-weighted aggregate layout score is their ratio."""
    contiguous = 0
    pairs = 0
    for i in range(0, len(paths), 200):
        out = subprocess.run(
            ["filefrag", "-v", "-b4096", *map(str, paths[i : i + 200])],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        for block in out.split("Filesystem type is")[1:]:
            exts = []
            for line in block.splitlines():
                m = _EXT.match(line)
                if m:
                    lstart, _lend, pstart, _pend, length = map(int, m.groups())
                    exts.append((lstart, pstart, length))
            blocks = sum(e[2] for e in exts)
            if blocks < 2:
                continue
            pairs += blocks - 1
            prev_end = None
            for _lstart, pstart, length in sorted(exts):
                contiguous += length - 1
                if prev_end is not None and pstart == prev_end + 1:
                    contiguous += 1
                prev_end = pstart + length - 1
    return contiguous, pairs


def e2freefrag(image: Path) -> tuple[int, int]:
    """(free extents, largest free extent in KiB) as e2freefrag prints them."""
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    count = int(re.search(r"Num. free extent:\s*(\d+)", out.stdout).group(1))  # type: ignore[union-attr]
    largest = re.search(r"Max. free extent:\s*(\d+)\s*KB", out.stdout)
    return count, int(largest.group(1)) if largest else 0


def tree_of(root: Path) -> dict[str, int]:
    """{relative path: size} of the files below ``root`` and {path + '/': -1} of its
    directories, lost+found left out: what a target holds, for comparing two of them."""
    import os

    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "lost+found"]
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.stat().st_size
        for d in dirs:
            out[str((Path(dirpath) / d).relative_to(root)) + "/"] = -1
    return out


def debugfs(image: Path, cmd: str) -> str:
    """What ``debugfs -R cmd`` prints about ``image``."""
    return subprocess.run(
        ["debugfs", "-R", cmd, str(image)], capture_output=True, text=True, check=True
    ).stdout


def fsck_clean(image: Path) -> None:
    """Assert that ``e2fsck -fn`` finds ``image`` clean."""
    proc = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def wait_until(cond: Callable[[], bool], proc: subprocess.Popen[Any], what: str) -> None:
    """Poll ``cond`` until it holds; fail if ``proc`` ends first. The wait has no time limit of
    its own (a loaded machine only makes it longer; pytest's timeout bounds the test)."""
    while not cond():
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr is not None else b""
            pytest.fail(f"the process ended ({proc.returncode}) before {what}: {err!r}")
        time.sleep(0.005)


def record_written_since(target: Path, since: float) -> bool:
    """True once a run on ``target`` has written its record after ``since`` (``time.time()``):
    it is then in its op loop, where Ctrl-C stops it between two ops."""
    try:
        rec = json.loads(target.with_name(target.name + ".fsage-age").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and float(rec.get("updated", 0)) >= since


@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted on the new directory ``mnt`` for the block."""
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "fsage-test", mnt], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)

"""A deliberately fragmented file on a real loop-mounted ext4, checked against filefrag -v."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fsage.analyzer import file_scores, filefrag_extents


def _can_mount() -> bool:
    return os.geteuid() == 0 and Path("/dev/loop-control").exists() and bool(shutil.which("mount"))


def _filefrag(path: Path) -> tuple[list[tuple[int, int, int]], int]:
    out = subprocess.run(
        ["filefrag", "-v", "-b4096", str(path)], check=True, capture_output=True, text=True
    ).stdout
    ext = [
        (int(a), int(c), int(e))
        for a, _b, c, _d, e in re.findall(
            r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):\s+(\d+):", out, re.M
        )
    ]
    found = int(re.search(r"(\d+) extents? found", out).group(1))  # type: ignore[union-attr]
    return ext, found


@pytest.mark.needs_root
def test_interleaved_writes_score_matches_filefrag(tmp_path: Path) -> None:
    if not _can_mount():
        pytest.skip("needs root and loop devices")
    snapshotter = pytest.importorskip("fsage.snapshotter")
    img = tmp_path / "fs.img"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", str(img), "64M"],
        check=True,
        capture_output=True,
    )
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True, capture_output=True)
    try:
        a, b = mnt / "a", mnt / "b"
        with open(a, "wb") as fa, open(b, "wb") as fb:
            for i in range(48):
                # bursts of 1-3 blocks, each forced to disk before the other file writes
                n = 1 + i % 3
                for f in (fa, fb):
                    f.write(os.urandom(4096 * n))
                    f.flush()
                    os.fsync(f.fileno())
        ref = {p.name: _filefrag(p) for p in (a, b)}
        inos = {p.name: p.stat().st_ino for p in (a, b)}
    finally:
        subprocess.run(["umount", str(mnt)], check=True, capture_output=True)
    layout = snapshotter.read_source(img)
    s = file_scores(layout.files)
    ff = filefrag_extents(layout.files)
    for name, (extents, found) in ref.items():
        i = int(np.searchsorted(layout.files.ino, inos[name]))
        assert int(layout.files.ino[i]) == inos[name]
        # the score computed straight from filefrag's extent list
        blocks = sum(e[2] for e in extents)
        cont = sum(e[2] - 1 for e in extents) + sum(
            1 for p, q in itertools.pairwise(extents) if q[1] == p[1] + p[2]
        )
        assert int(s.blocks[i]) == blocks == 96
        assert int(s.contiguous[i]) == cont
        assert s.score[i] == cont / (blocks - 1)
        assert s.score[i] < 1.0  # the interleaving did fragment it
        assert int(ff[i]) == found

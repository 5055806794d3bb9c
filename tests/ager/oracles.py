"""Oracles for a matched or aged image, read after unmount with the reference tools rather
than fsage's own readers: the free-space histogram and fullness by e2freefrag (ext4) or
``xfs_db freesp`` (xfs), the layout score per size bucket by ``filefrag -v``. The tests of
``fsage age --match`` and bench/match_targets.py judge with these."""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

from fsage.ager.images import loop_mount

_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_E2ROW = re.compile(r"^\s*(\d+)([KMGT])\.\.\.\s*\d+[KMGT]-\s*:\s*(\d+)\s+(\d+)\s+[\d.]+%")
_XFSROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+[\d.]+\s*$")
_EXT = re.compile(r"^\s*\d+:\s*(\d+)\.\.\s*\d+:\s*(\d+)\.\.\s*\d+:\s*(\d+):")


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _field(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    assert m is not None, (pattern, text[:500])
    return int(m.group(1))


def fs_kind(image: Path) -> str:
    """ "xfs" or "ext4", as blkid names the image's file system."""
    return (
        "xfs" if sh("blkid", "-o", "value", "-s", "TYPE", str(image)).strip() == "xfs" else "ext4"
    )


def free_histograms(image: Path) -> tuple[float, dict[int, int], dict[int, int]]:
    """(fullness, free blocks and free extents per log2 extent length in blocks) as
    e2freefrag (ext4) or xfs_db's freesp (xfs) counts them, from the unmounted image."""
    blocks: dict[int, int] = {}
    extents: dict[int, int] = {}
    if fs_kind(image) == "xfs":
        sb = sh("xfs_db", "-r", "-c", "sb 0", "-c", "p dblocks fdblocks", str(image))
        dblocks, fdblocks = _field(r"dblocks = (\d+)", sb), _field(r"fdblocks = (\d+)", sb)
        for line in sh("xfs_db", "-r", "-c", "freesp", str(image)).splitlines():
            m = _XFSROW.match(line)
            if m:
                k = int(m.group(1)).bit_length() - 1
                extents[k] = extents.get(k, 0) + int(m.group(3))
                blocks[k] = blocks.get(k, 0) + int(m.group(4))
        return 1 - fdblocks / dblocks, blocks, extents
    out = sh("e2freefrag", str(image))
    bs = _field(r"Blocksize:\s*(\d+)", out)
    total, free = _field(r"Total blocks:\s*(\d+)", out), _field(r"Free blocks:\s*(\d+)", out)
    for line in out.split("HISTOGRAM")[-1].splitlines():
        m = _E2ROW.match(line)
        if m:
            k = int(math.log2(int(m.group(1)) * _UNIT[m.group(2)] // bs))
            extents[k], blocks[k] = int(m.group(3)), int(m.group(4))
    return 1 - free / total, blocks, extents


def tv(a: dict[int, int], b: dict[int, int]) -> float:
    """Total variation distance between two histograms, each as shares of its total."""
    ta, tb = sum(a.values()) or 1, sum(b.values()) or 1
    return 0.5 * sum(abs(a.get(k, 0) / ta - b.get(k, 0) / tb) for k in set(a) | set(b))


def filefrag_buckets(image: Path, bs: int) -> dict[int, tuple[int, int, int]]:
    """Per size bucket (seed 000's powers of two of ``bs``-byte blocks): (files, contiguous
    blocks, blocks - 1) of the image's regular files of two blocks or more, from
    ``filefrag -v`` on a read-only mount."""
    out: dict[int, list[int]] = {}
    with loop_mount(image, options="ro") as mnt:
        paths = [
            os.path.join(d, f)
            for d, _dirs, files in os.walk(mnt)
            for f in files
            if os.path.isfile(os.path.join(d, f)) and not os.path.islink(os.path.join(d, f))
        ]
        for i in range(0, len(paths), 300):
            text = sh("filefrag", "-v", f"-b{bs}", *paths[i : i + 300])
            # One header per run of filefrag, then one block per file.
            for block in re.split(r"^File size of ", text, flags=re.M)[1:]:
                exts = sorted(
                    (int(m.group(1)), int(m.group(2)), int(m.group(3)))
                    for m in map(_EXT.match, block.splitlines())
                    if m
                )
                n = sum(e[2] for e in exts)
                if n < 2:
                    continue
                cont, prev = 0, None
                for _l, p, ln in exts:
                    cont += ln - 1 + (prev is not None and p == prev)
                    prev = p + ln
                row = out.setdefault((n - 1).bit_length(), [0, 0, 0])
                row[0] += 1
                row[1] += cont
                row[2] += n - 1
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}

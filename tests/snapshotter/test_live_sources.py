"""What the live reader reads besides files, and what it refuses: ext4's free space against
``e2freefrag``, pseudo file systems, tmpfs and paths that are no directory refused,
/proc/self/mountinfo's escaped names, and how FIEMAP extents are merged.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from snapshotter.livefs import MARKS, mount, run, scratch_dir, umount

from fsage.errors import SourceError
from fsage.layout import EXTENT_INLINE, EXTENT_UNWRITTEN
from fsage.snapshotter.live import merge_extents, read_live_layout, read_mountinfo

pytestmark = MARKS


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with scratch_dir() as d:
        yield d


def _e2freefrag(dev: str) -> tuple[int, int, int, dict[int, int]]:
    """Total blocks, free blocks, free extents and {bucket lower bound in bytes: extents}
    from e2freefrag."""
    out = run("e2freefrag", dev)
    total = int(re.search(r"Total blocks: (\d+)", out).group(1))  # type: ignore[union-attr]
    free_blocks = int(re.search(r"Free blocks: (\d+)", out).group(1))  # type: ignore[union-attr]
    extents = int(re.search(r"Num. free extent: (\d+)", out).group(1))  # type: ignore[union-attr]
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    hist = {}
    for m in re.finditer(r"^\s*(\d+)([KMGT])\.\.\.\s*\S+\s*:\s*(\d+)\s+(\d+)", out, re.M):
        hist[int(m.group(1)) * unit[m.group(2)]] = int(m.group(3))
    return total, free_blocks, extents, hist


def test_ext4_free_space_matches_e2freefrag(workdir: Path) -> None:
    m = mount(workdir, "ext4", "-free")
    try:
        rnd = random.Random(11)
        names = []
        for i in range(300):
            p = m.mnt / f"f{i}"
            p.write_bytes(b"d" * (4096 * rnd.randint(1, 40)))
            names.append(p)
        os.sync()
        for p in rnd.sample(names, 150):  # holes of many sizes in the free space
            p.unlink()
        os.sync()
        layout = read_live_layout(m.mnt)
        statvfs_blocks = os.statvfs(m.mnt).f_blocks
        os.sync()
        total, free_blocks, extents, hist = _e2freefrag(m.dev)
    finally:
        umount(m)
    bs = layout.facts.block_size
    assert layout.facts.free_space_known
    # The block count is the device's, metadata included (statvfs leaves that out), so that
    # fullness means the same in a live snapshot as in an offline one.
    assert layout.facts.blocks_total == total > statvfs_blocks
    assert layout.free.blocks == free_blocks
    assert len(layout.free) == extents
    got: dict[int, int] = {}
    for n in layout.free.length.tolist():
        low = bs << (int(n).bit_length() - 1)
        got[low] = got.get(low, 0) + 1
    assert got == hist
    assert len(hist) >= 3


def test_pseudo_file_systems_refused(workdir: Path) -> None:
    for p in ("/proc", "/sys", "/dev"):
        if os.path.isdir(p):
            with pytest.raises(SourceError, match="no block layout"):
                read_live_layout(Path(p))
    t = workdir / "tmpfs"
    t.mkdir()
    try:
        run("mount", "-t", "tmpfs", "-o", "size=1m", "fsage-test", str(t))
        with pytest.raises(SourceError, match=r"is on a tmpfs file system"):
            read_live_layout(t)
    finally:
        subprocess.run(["umount", str(t)], check=False)


def test_not_a_directory_refused(workdir: Path) -> None:
    with pytest.raises(SourceError, match="not a directory"):
        read_live_layout(Path("/etc/hostname"))
    with pytest.raises(SourceError, match="No such file"):
        read_live_layout(workdir / "missing")


def test_mountinfo_unescapes_names() -> None:
    line = b"36 25 8:1 / /mnt/a\\040b rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    (m,) = read_mountinfo(line)
    assert m.mount_point == b"/mnt/a b"
    assert (m.fstype, m.source, m.major, m.minor) == ("ext4", "/dev/sda1", 8, 1)


def test_merge_extents_rules() -> None:
    from fsage.snapshotter.live import FIEMAP_EXTENT_DTYPE

    raw = np.zeros(5, FIEMAP_EXTENT_DTYPE)
    # file 0: two contiguous (merge), then a gap; file 1: contiguous with file 0's end (no merge)
    rows = [
        (0, 40960, 4096, 0),
        (4096, 45056, 8192, 0x1000),  # MERGED flag is ignored when comparing
        (20480, 90000 * 4096, 4096, 0x801),  # unwritten, last
        (0, 90001 * 4096, 4096, 0),
        (4096, 90002 * 4096, 100, 0x301),  # inline, not aligned
    ]
    for i, (r_lo, r_po, r_ln, r_fl) in enumerate(rows):
        raw[i]["logical"], raw[i]["physical"] = r_lo, r_po
        raw[i]["length"], raw[i]["flags"] = r_ln, r_fl
    off, lo, po, ln, fl = merge_extents(raw, np.array([3, 2]), 4096)
    assert off.tolist() == [0, 2, 4]
    assert lo.tolist() == [0, 5, 0, 1]
    assert po.tolist() == [10, 90000, 90001, 90002]
    assert ln.tolist() == [3, 1, 1, 1]
    assert fl.tolist() == [0, EXTENT_UNWRITTEN, 0, EXTENT_INLINE]

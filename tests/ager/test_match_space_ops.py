"""The space ops the matcher journals, on every executor that runs them. allocate-near:
libext2fs places the blocks from the block it names (debugfs and e2freefrag as oracles), the
kernel takes no hint and runs it as a plain fallocate (filefrag), an LFS image refuses it in
one line. punch through the kernel: a hole in the file (filefrag) and a free extent of its
size on disk (e2freefrag after unmount)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fsage.ager.images import make_image
from fsage.errors import WorkloadError
from fsage.workload import Op

MIB = 1 << 20
BS = 4096


def _debugfs(image: Path, cmd: str) -> str:
    return subprocess.run(
        ["debugfs", "-R", cmd, str(image)], capture_output=True, text=True, check=True
    ).stdout


def _free_extents(image: Path) -> int:
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    m = re.search(r"Num. free extent: (\d+)", out.stdout)
    assert m, out.stdout
    return int(m.group(1))


def test_offline_allocate_near_places_the_blocks_from_the_goal(tmp_path: Path) -> None:
    from fsage.ager.offline import OfflineExtExecutor

    img = make_image(tmp_path / "e.img", "ext4", 64 * MIB)
    before = _free_extents(img)
    goal, n = 9000, 24
    with OfflineExtExecutor(img) as ex:
        ex.apply(Op("create", "near", 0))
        ex.apply(Op("allocate-near", "near", n * BS, 0, label=str(goal)))
        ex.apply(Op("create", "plain", 0))
        ex.apply(Op("fallocate", "plain", n * BS, 0))
    near = [int(b) for b in _debugfs(img, "blocks /near").split()]
    plain = [int(b) for b in _debugfs(img, "blocks /plain").split()]
    assert near == list(range(goal, goal + n))
    # Without the hint the allocator starts near the file's inode, far below the goal.
    assert len(plain) == n and max(plain) < goal
    # The placed run splits one free extent in two: one more free extent than before.
    assert _free_extents(img) == before + 1
    size = re.search(r"Size: (\d+)", _debugfs(img, "stat /near"))
    assert size and int(size.group(1)) == n * BS  # fallocate grows the size to the end
    fsck = subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout


@pytest.mark.needs_root
def test_posix_allocate_near_is_a_plain_fallocate(tmp_path: Path) -> None:
    from fsage.ager.images import loop_mount
    from fsage.ager.posix import PosixExecutor

    img = make_image(tmp_path / "e.img", "ext4", 64 * MIB)
    with loop_mount(img) as mnt:
        with PosixExecutor(mnt) as ex:
            ex.apply(Op("create", "near", 0))
            ex.apply(Op("allocate-near", "near", 24 * BS, 0, label="9000"))
        f = mnt / "near"
        out = subprocess.run(["filefrag", "-v", str(f)], capture_output=True, text=True).stdout
        # The kernel's view: 24 blocks allocated, unwritten, the size grown to their end.
        assert "unwritten" in out, out
        assert f.stat().st_size == 24 * BS and f.stat().st_blocks * 512 == 24 * BS


def test_lfs_refuses_allocate_near(tmp_path: Path) -> None:
    from fsage.lfs.executor import LfsExecutor
    from fsage.lfs.fs import mkfs

    img = tmp_path / "l.img"
    mkfs(img, size=16 * MIB)
    ex = LfsExecutor(img)
    try:
        ex.apply(Op("create", "f", size=8192))
        with pytest.raises(WorkloadError, match="not supported on an LFS image") as exc:
            ex.apply(Op("allocate-near", "f", 4096, 0, label="10"))
        assert "\n" not in str(exc.value)
    finally:
        ex.close()


def test_a_resume_counts_allocate_near_as_a_fallocate() -> None:
    from fsage.ager.reconcile import journal_tree

    ops = [Op("create", "f", 0), Op("allocate-near", "f", 5 * BS, BS, label="77")]
    assert journal_tree({}, ops)["f"].size == 6 * BS


@pytest.mark.needs_root
def test_posix_punch_leaves_a_free_extent_of_its_size(tmp_path: Path) -> None:
    from fsage.ager.images import loop_mount
    from fsage.ager.posix import PosixExecutor

    img = make_image(tmp_path / "e.img", "ext4", 64 * MIB)
    with loop_mount(img) as mnt:
        with PosixExecutor(mnt) as ex:
            # Two files written back to back, then 40 blocks punched out of the first one's
            # middle: a free extent of 40 blocks walled in by allocated blocks.
            ex.apply(Op("create", "a", 200 * BS))
            ex.apply(Op("create", "b", 200 * BS))
            ex.apply(Op("sync"))
            ex.apply(Op("punch", "a", 40 * BS, 80 * BS))
        out = subprocess.run(
            ["filefrag", "-v", str(mnt / "a")], capture_output=True, text=True, check=True
        ).stdout
        logical = [
            (int(m.group(1)), int(m.group(2)))
            for m in re.finditer(r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):", out, re.M)
        ]
        # The punched blocks are gone from the file's map; its size is kept.
        assert all(end < 80 or start >= 120 for start, end in logical), out
        assert (mnt / "a").stat().st_size == 200 * BS
    hist = subprocess.run(["e2freefrag", str(img)], capture_output=True, text=True, check=True)
    # e2freefrag's histogram: the 40-block hole is in its 128K...256K row.
    row = re.search(r"^\s*128K\.\.\.\s*256K-\s*:\s*(\d+)\s+(\d+)", hist.stdout, re.M)
    assert row and int(row.group(1)) >= 1 and int(row.group(2)) >= 40, hist.stdout

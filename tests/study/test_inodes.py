"""A study's ext file systems get the inodes its workload needs: a stream of many small files
would find mke2fs's default inode table full long before the blocks run out."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount
from fsage.study.members import member
from fsage.study.spec import default_ext_inodes, ext_inodes, peak_live_inodes
from fsage.workload import Op
from tests.conftest import require_tools


def test_peak_inodes_counts_creates_renames_links_and_deletes() -> None:
    steps = [
        [Op("mkdir", "d"), Op("create", "d/a", size=1), Op("create", "d/b", size=1)],  # 3
        [Op("link", "d/a", dest="d/a2"), Op("rename", "d/b", dest="d/c")],  # still 3
        [Op("symlink", "s", size=3), Op("delete", "d/a2")],  # 4: the link had no inode
        [Op("delete", "d/a"), Op("delete", "d/c"), Op("create", "e", size=0)],  # 3
    ]
    assert peak_live_inodes(steps) == 4


def test_inodes_are_asked_for_only_beyond_the_default() -> None:
    size = 16 << 20
    few = [[Op("create", f"f{i}", size=0) for i in range(100)]]
    many = [[Op("create", f"f{i}", size=0) for i in range(2 * default_ext_inodes(size))]]
    assert ext_inodes(few, size) is None
    need = ext_inodes(many, size)
    assert need is not None and need >= 2 * default_ext_inodes(size)


def _inode_count(image: Path) -> int:
    out = subprocess.run(["dumpe2fs", "-h", str(image)], capture_output=True, text=True).stdout
    m = re.search(r"^Inode count:\s+(\d+)", out, re.M)
    assert m, out
    return int(m.group(1))


def _fill_empty(root: Path, n: int) -> int:
    """Empty files made until ``n`` or the first ENOSPC: how many were made."""
    for i in range(n):
        try:
            os.close(os.open(root / f"f{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            return i
    return n


@pytest.mark.needs_root
def test_a_study_ext_image_holds_the_files_its_default_would_not(tmp_path: Path) -> None:
    require_tools("mkfs.ext4", "dumpe2fs", "losetup")
    size = 16 << 20
    n = default_ext_inodes(size) + 2000  # empty files: no blocks, only inodes
    steps = [[Op("create", f"f{i:05d}", size=0) for i in range(n)]]
    inodes = ext_inodes(steps, size)
    assert inodes is not None
    sized, default = (
        member(tmp_path / "a", "ext4", size, inodes),
        member(tmp_path / "b", "ext4", size),
    )
    for m in (sized, default):
        m.make()
    assert _inode_count(sized.image) >= inodes > _inode_count(default.image)
    with loop_mount(default.image) as mnt:
        assert _fill_empty(mnt, n) < n  # the default runs out of inodes
    with loop_mount(sized.image) as mnt:
        assert _fill_empty(mnt, n) == n
    # the LFS takes no inode count
    assert member(tmp_path / "c", "lfs", size, inodes).inodes is None

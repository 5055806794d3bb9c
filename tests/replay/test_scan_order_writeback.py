"""When a mounted replay writes back its dirty data: as ext4 does, once it is half of the free
space as it is now, not a quarter of what was free at the last writeback.

An interval that deletes files and then writes new ones (tar replacing a release's files, a
population churned) has the deletes' blocks free when ext4 allocates the new data at
writeback. A replay that wrote back earlier, against the free space measured before the
deletes, allocated each share of the new data before the interval's later deletes freed
their blocks: on a 1 KiB-block file system 0.89 full its large files came out in hundreds of
pieces where the original's had about ten, and its modeled cold scan was 12-19 % slower.

The oracle is ``filefrag -v`` on the mounted recreation: a file whose data is still in the
page cache shows its extent as ``delalloc`` (no block chosen yet)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fsage.replay.recreate import _Session
from fsage.workload import Op
from tests.conftest import require_tools

MIB = 1 << 20


def _delalloc(path: Path) -> bool:
    """Whether ``filefrag -v`` shows ``path``'s data still waiting for delayed allocation."""
    out = subprocess.run(
        ["filefrag", "-v", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert " found" in out, out
    return "delalloc" in out


@pytest.mark.needs_root
def test_a_replay_writes_back_against_the_free_space_its_deletes_left(tmp_path: Path) -> None:
    require_tools("mkfs.ext4", "filefrag")
    img = tmp_path / "rec.img"
    with open(img, "wb") as fh:
        fh.truncate(32 * MIB)
    subprocess.run(["mkfs.ext4", "-F", "-q", "-b", "4096", "-E", "nodiscard", str(img)], check=True)
    sess = _Session(img, "mount")
    try:
        assert sess.mnt is not None
        # the previous interval leaves the file system most of the way full
        for i in range(20):
            sess.ex.apply(Op("create", f"old{i:02d}", size=MIB))
        sess.end_interval("remount")
        # this interval deletes most of it, then writes a file: a fifth of what was free
        # before the deletes, far less than half of what is free after them
        for i in range(16):
            sess.ex.apply(Op("delete", f"old{i:02d}"))
        sess.ex.apply(Op("create", "new", size=3 * MIB))
        assert _delalloc(sess.mnt / "new"), "written back before the deletes' space counted"
        # the interval's end puts it on disk
        sess.end_interval("sync")
        assert not _delalloc(sess.mnt / "new")
    finally:
        sess.close()

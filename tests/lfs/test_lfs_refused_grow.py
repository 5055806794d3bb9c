"""The ager's executor leaves a file its old size when an append or an overwrite past its end
is refused for lack of space (in write(2), at fsync, or only at close, where a write-back
cache reports it): its model and journal take the op as never run. Oracle: stat of the file
on a small tmpfs that runs out of room part-way through the write."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsage.ager.images import umount
from fsage.ager.posix import NoSpaceError, PosixExecutor
from fsage.workload import Op

pytestmark = pytest.mark.needs_root


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mp = tmp_path / "mnt"
    mp.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "fsage-test", str(mp)], check=True)
    try:
        yield mp
    finally:
        umount(mp)


@pytest.mark.parametrize("fsync", [False, True])
@pytest.mark.parametrize("kind", ["append", "overwrite"])
def test_a_refused_growth_leaves_the_old_size(small_fs: Path, kind: str, fsync: bool) -> None:
    with PosixExecutor(small_fs, fsync=fsync) as ex:
        ex.apply(Op("create", "f", size=100 << 10))
        old = (small_fs / "f").stat().st_size
        with pytest.raises(NoSpaceError):  # 2 MiB into 1 MiB: written in part, then refused
            ex.apply(Op(kind, "f", size=2 << 20, offset=50 << 10))
            ex.drain()
    assert old == 100 << 10
    assert (small_fs / "f").stat().st_size == old
    # room again for a later op: what the refused one wrote in part was given back
    with PosixExecutor(small_fs) as ex:
        ex.apply(Op("create", "g", size=512 << 10))

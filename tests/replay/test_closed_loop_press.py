"""The closed loop's free-space shaping by extent counts: windows that join several small free
extents, and a full disk that refuses part of an inferred rewrite never shortening the file
the rewrite stands for."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fsage.ager.images import loop_mount, make_image
from fsage.ager.match_target import LayoutTarget
from fsage.replay.freeshape import count_distance, merge_windows
from fsage.snapshotter import read_source
from fsage.workload import Op

MIB = 1 << 20


def test_a_merge_window_takes_the_files_between_small_free_extents() -> None:
    # Free 0-2, 5-7, 10-12 (two blocks each) with files 2-5 and 7-10 between them, then a
    # free extent of 8 after a file of 20 blocks (too much file for one window).
    free_start = np.array([0, 5, 10, 32])
    free_len = np.array([2, 2, 2, 8])
    spans = [(2, 5, "a"), (7, 10, "b"), (12, 32, "big")]
    excess = {1: 3}
    windows = merge_windows(free_start, free_len, spans, excess, longest=15, share=0.85)
    # One window over the three free extents: both files move, one extent for three.
    assert windows == [["a", "b"]]
    assert excess == {1: 1}
    # One small free extent in excess beside one that is not: not worth a window.
    lone = merge_windows(np.array([0, 5]), np.array([2, 8]), [(2, 5, "a")], {1: 1}, longest=15)
    assert lone == []
    # Files at most 0.45 of a window: not the three (6 of 12 blocks would move), the first
    # two (3 of 7).
    assert merge_windows(free_start, free_len, spans, {1: 3}, longest=15, share=0.45) == [["a"]]
    # Nothing in excess: no window.
    assert merge_windows(free_start, free_len, spans, {}, longest=15) == []


def test_the_count_distance_sees_pieces_the_block_histogram_does_not() -> None:
    def target(free: dict[int, int], counts: dict[int, int]) -> LayoutTarget:
        return LayoutTarget(1024, 1000, 0.5, {1: (1, 1.0)}, free, free_counts=counts)

    one = target({2: 400}, {2: 100})
    # The same blocks in the same bucket, in half the extents: a third of all extents differ.
    half = target({2: 400}, {2: 50})
    assert count_distance(one, half) == pytest.approx(50 / 150)
    assert count_distance(one, one) == 0.0


def _fill(mnt: Path, keep: int) -> None:
    """Fill the mount with a ballast file until about ``keep`` bytes are left."""
    st = os.statvfs(mnt)
    with open(mnt / "ballast", "wb") as fh:
        fh.write(b"\0" * max(st.f_bavail * st.f_frsize - keep, 0))


@pytest.mark.needs_root
def test_a_rewrite_refused_for_lack_of_space_leaves_its_file_whole(tmp_path: Path) -> None:
    """Pairs of files rewritten in alternating pieces on a disk with room for a few of them:
    the refused ones are dropped, every file keeps its size (stat) and no temporary is left;
    e2fsck finds the file system clean."""
    from fsage.ager.posix import PosixExecutor
    from fsage.replay.changed import _File
    from fsage.replay.closedloop import TEMP_SUFFIX, IntervalChurn, Steerer

    img = make_image(tmp_path / "i.img", "ext4", 32 * MIB)
    names = [f"d/f{i:02d}" for i in range(16)]
    size = 256 * 1024
    with loop_mount(img) as mnt:
        (mnt / "d").mkdir()
        for n in names:
            (mnt / n).write_bytes(b"x" * size)
        _fill(mnt, 1 * MIB)
        os.sync()
        ex = PosixExecutor(mnt)
        try:
            steer = Steerer(ex.apply, lambda: read_source(img))
            files = [_File(n, size, 0o644, 0) for n in names]
            churn = IntervalChurn(1, 0)
            steer._interleaved([files[i : i + 2] for i in range(0, 16, 2)], 4096, churn)
            steer._op(Op("sync", inferred=True), churn)
        finally:
            ex.close()
        # Some were refused (the disk had room for a few), some went through.
        assert 0 < churn.kinds.get("interleaved", 0) < 16, churn.kinds
        assert [os.stat(mnt / n).st_size for n in names] == [size] * 16
        assert not [p for p in (mnt / "d").iterdir() if p.name.endswith(TEMP_SUFFIX)]
    subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, check=True)

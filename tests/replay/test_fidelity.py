"""The fidelity computation on hand-made Layouts with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from fsage.layout import FreeExtents, Layout
from fsage.replay.fidelity import fidelity, free_distances

from .synth import F, layout


def _with_free(entries: list[F], runs: list[tuple[int, int]]) -> Layout:
    lay = layout(entries)
    lay.free = FreeExtents(
        np.array([r[0] for r in runs], np.uint64), np.array([r[1] for r in runs], np.uint64)
    )
    return lay


def test_files_bytes_and_scores_by_path() -> None:
    orig = [
        F(20, [(2, b"d")], kind="dir"),
        F(21, [(20, b"a")], size=8192, ext=[(0, 100, 2)]),  # contiguous: 1/1
        F(22, [(2, b"b")], size=16384, ext=[(0, 200, 2), (2, 300, 2)]),  # 2/3
        F(23, [(2, b"c")], size=5),
    ]
    rec = [
        F(30, [(2, b"d")], kind="dir"),
        F(31, [(30, b"a")], size=8192, ext=[(0, 500, 1), (1, 700, 1)]),  # 0/1
        F(32, [(2, b"b")], size=16384, ext=[(0, 600, 4)]),  # 3/3
        F(33, [(2, b"c")], size=6),  # size differs
        F(34, [(2, b"extra")], size=1),
    ]
    fid = fidelity(_with_free(orig, [(0, 4)]), _with_free(rec, [(0, 4)]))
    assert (fid.files_original, fid.files_recreated, fid.files_matched) == (3, 4, 2)
    assert (fid.bytes_original, fid.bytes_recreated, fid.bytes_matched) == (
        8192 + 16384 + 5,
        8192 + 16384 + 6 + 1,
        8192 + 16384,
    )
    assert (fid.dirs_original, fid.dirs_recreated, fid.dirs_matched) == (1, 1, 1)
    assert fid.layout_score_original == pytest.approx(3 / 4)
    assert fid.layout_score_recreated == pytest.approx(3 / 4)
    assert fid.size_differs == ["c"] and fid.extra == ["extra"] and fid.missing == []
    # Buckets: 2 blocks (a) and 3-4 blocks (b).
    assert [(r["min_blocks"], r["max_blocks"]) for r in fid.by_size] == [(2, 2), (3, 4)]
    assert [r["layout_score_original"] for r in fid.by_size] == [1.0, pytest.approx(2 / 3)]
    assert [r["layout_score_recreated"] for r in fid.by_size] == [0.0, 1.0]
    assert fid.free_tv_distance == 0.0 and fid.free_emd_buckets == 0.0


def test_free_space_distances() -> None:
    a = _with_free([], [(0, 4), (10, 1)])
    b = _with_free([], [(20, 4), (30, 4), (40, 1), (50, 1)])
    assert free_distances(a, b) == (0.0, 0.0)  # 80 % of free blocks in 4-7, 20 % in 1
    # All free blocks one bucket apart (8 blocks in 8-15 vs 4+4 blocks in 4-7): TV 1, EMD 1.
    assert free_distances(_with_free([], [(0, 8)]), _with_free([], [(0, 4), (9, 4)])) == (
        1.0,
        1.0,
    )
    # 16 of 18 free blocks three buckets (2-3 -> 16-31) away from all of the other's.
    tv, emd = free_distances(_with_free([], [(0, 2), (10, 2)]), _with_free([], [(0, 2), (10, 16)]))
    assert (tv, emd) == pytest.approx((16 / 18, 16 / 18 * 3))

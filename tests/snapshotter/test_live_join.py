"""The C walk's join (fsage._live.sort_unique) against numpy, without a mounted tree."""

from __future__ import annotations

import numpy as np
import pytest

from fsage.snapshotter.live import c_walker_available

pytestmark = pytest.mark.skipif(not c_walker_available(), reason="fsage._live is not built")


def _first_of_each(inos: np.ndarray) -> np.ndarray:
    _, first = np.unique(inos, return_index=True)  # sorted by value, first occurrence
    return first.astype(np.uint32)


@pytest.mark.parametrize("use_table", [True, False])
def test_sort_unique_matches_numpy(use_table: bool) -> None:
    from fsage import _live

    rng = np.random.default_rng(5)
    cases = [
        np.zeros(0, np.uint64),
        np.array([7], np.uint64),
        rng.permutation(np.arange(11, 50_011, dtype=np.uint64)),  # dense: the table
        rng.integers(0, 2000, 5000, dtype=np.uint64),  # dense, many duplicates
        rng.integers(0, 1 << 62, 5000, dtype=np.uint64),  # sparse (xfs-like): radix
        np.array([1 << 63, 3, (1 << 64) - 1, 3, 0], np.uint64),  # extremes
    ]
    for inos in cases:
        got = np.frombuffer(_live.sort_unique(inos.tobytes(), use_table), np.uint32)
        assert np.array_equal(got, _first_of_each(inos)), inos[:5]

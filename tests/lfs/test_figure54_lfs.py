"""Seed 001 Figure 5-4 through the file system itself (not the simulator), small: the random
update workload on a 128-segment LFS of 256 KB segments and 8 KB blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsage.lfs.sim import random_update_lfs


def test_figure_5_4_shape_through_the_lfs(tmp_path: Path) -> None:
    cost = {}
    for u in (0.5, 0.9):
        for m in ("clean", "holeplug", "adaptive"):
            r = random_update_lfs(u, m, tmp_path / "f.img", segments=128, updates_per_block=4)
            assert r.utilization == pytest.approx(u, abs=0.01)
            # Every update is a new block written; the counters see them all.
            assert r.counters.new_blocks >= 4 * int(u * 125 * 31)
            cost[(u, m)] = r.metrics["overall_write_cost"]
    # Seed 001 §5.4.1: cleaning is cheaper at low utilization, hole-plugging at high; cleaning
    # soars while hole-plugging stays below 15; adaptive follows the cheaper mechanism.
    assert cost[(0.5, "clean")] < cost[(0.5, "holeplug")]
    assert cost[(0.9, "holeplug")] < 15
    assert cost[(0.9, "clean")] > 2 * cost[(0.9, "holeplug")]
    for u in (0.5, 0.9):
        cheaper = min(cost[(u, "clean")], cost[(u, "holeplug")])
        assert cost[(u, "adaptive")] <= cheaper * 1.1

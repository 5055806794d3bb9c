"""Layout scores on hand-built layouts, checked against the seeds' worked examples."""

from __future__ import annotations

import math

import numpy as np

from fsage.analyzer import aggregate_score, file_scores, filefrag_extents, xfs_frag_counts
from fsage.analyzer.analysis import bucket_range, size_bucket
from fsage.analyzer.scores import e4defrag_score
from fsage.layout import EXTENT_DELALLOC, EXTENT_INLINE, EXTENT_UNWRITTEN

from .layouts import table


def test_seed002_worked_example() -> None:
    # 4 blocks: (1,2) contiguous, seek, (3,4) contiguous -> 2/3 (seed 002: 0.67)
    s = file_scores(table([[(0, 100, 2), (2, 500, 2)]]))
    assert s.blocks.tolist() == [4]
    assert s.contiguous.tolist() == [2]
    assert round(float(s.score[0]), 2) == 0.67
    assert s.score[0] == 2 / 3
    assert s.fragments.tolist() == [2]


def test_extreme_scores_and_short_files() -> None:
    t = table(
        [
            [(0, 10, 8)],  # contiguous -> 1.0
            [(0, 10, 1), (1, 20, 1), (2, 30, 1)],  # no two successive blocks adjacent -> 0.0
            [(0, 40, 1)],  # one block: no score
            [],  # empty
        ]
    )
    s = file_scores(t)
    assert s.score[0] == 1.0
    assert s.score[1] == 0.0
    assert math.isnan(s.score[2]) and math.isnan(s.score[3])
    assert s.fragments.tolist() == [1, 3, 1, 0]
    assert s.first_block.tolist() == [10, 10, 40, -1]


def test_adjacent_extents_merge_into_one_fragment() -> None:
    # ext4 caps an extent at 32768 blocks; two touching extents are one fragment
    s = file_scores(table([[(0, 1000, 32768), (32768, 33768, 100)]]))
    assert s.fragments.tolist() == [1]
    assert s.extents.tolist() == [2]
    assert s.score[0] == 1.0


def test_holes_follow_the_physical_rule() -> None:
    t = table(
        [
            [(0, 100, 2), (10, 102, 2)],  # hole, physically adjacent -> contiguous
            [(0, 100, 2), (10, 110, 2)],  # hole, gap equal to the hole -> one break
        ]
    )
    s = file_scores(t)
    assert s.contiguous.tolist() == [3, 2]
    # filefrag treats the second file as one extent too (physical gap == logical gap)
    assert filefrag_extents(t).tolist() == [1, 1]
    # xfs_db's ideal counts one run per hole
    assert xfs_frag_counts(t) == (4, 4)


def test_unsorted_extents_and_flags() -> None:
    t = table(
        [
            [(2, 502, 2), (0, 500, 2)],  # stored out of logical order
            [(0, 0, 0, EXTENT_INLINE)],  # inline data: no blocks
            [(0, 700, 2, EXTENT_UNWRITTEN), (2, 0, 3, EXTENT_DELALLOC)],
        ]
    )
    s = file_scores(t)
    assert s.blocks.tolist() == [4, 0, 2]
    assert s.contiguous.tolist() == [3, 0, 1]


def test_block_weighted_aggregate_seed000() -> None:
    # Seed 000 §4.1: file scores averaged weighted by blocks. A 2-block file at 0.0 and a
    # 101-block file at 1.0 give 100/101, not the unweighted 0.5.
    t = table([[(0, 10, 1), (1, 50, 1)], [(0, 1000, 101)]])
    s = file_scores(t)
    assert aggregate_score(s.contiguous, s.denominator) == 100 / 101
    assert aggregate_score(np.zeros(0, np.int64), np.zeros(0, np.int64)) is None


def test_size_buckets_are_seed000_powers_of_two() -> None:
    b = np.array([0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 1 << 40, (1 << 40) + 1])
    assert size_bucket(b).tolist() == [-1, 0, 1, 2, 2, 3, 3, 4, 4, 5, 40, 41]
    assert [bucket_range(k) for k in (1, 2, 3, 4)] == [(2, 2), (3, 4), (5, 8), (9, 16)]


def test_filefrag_counts_breaks() -> None:
    t = table([[(0, 100, 2), (2, 300, 2), (4, 302, 1)], [(5, 900, 1)]])
    assert filefrag_extents(t).tolist() == [2, 1]


def test_e4defrag_score_formula() -> None:
    # ratio = (now - best) * 100 / blocks; score = 8 * ratio up to 10, then 80 + ratio / 5
    assert e4defrag_score(10, 10, 100) == 0.0
    assert e4defrag_score(15, 10, 100) == 40.0
    assert e4defrag_score(30, 10, 100) == 84.0
    assert e4defrag_score(0, 0, 0) is None


def test_xfs_counts_over_some_files_are_those_of_the_files_taken() -> None:
    rng = np.random.default_rng(5)
    extents = []
    for _ in range(200):
        k = int(rng.integers(0, 5))
        logical = np.sort(rng.choice(50, k, replace=False)) * 4
        extents.append([(int(lo), int(rng.integers(100, 10_000)), 2) for lo in logical[::-1]])
    t = table(extents)
    sel = rng.random(200) < 0.4
    assert xfs_frag_counts(t, sel) == xfs_frag_counts(t.take(np.flatnonzero(sel)))
    assert xfs_frag_counts(t, sel) != xfs_frag_counts(t)

"""The export's set of directories by rank (``RankedInodes``) against a sorted array of the
same inodes, and the walk's bucket starts counted a window at a time against running totals
of every directory at once."""

from __future__ import annotations

import numpy as np
import pytest

from fsage.analyzer import pathwalk, spill
from fsage.db import parts
from fsage.fleet import ranked
from fsage.fleet.ranked import RankedInodes


def _made(base: int, n: int, members: np.ndarray) -> RankedInodes:
    bits = parts._Bits(np.zeros((n + 7) >> 3, np.uint8), n, base)
    inside = members[(members >= base) & (members < base + n)]
    bits.add(inside)
    return RankedInodes(bits, members[(members < base) | (members >= base + n)])


@pytest.mark.parametrize(
    ("base", "n", "count"),
    [(0, 0, 0), (8, 1, 3), (16, 63, 40), (16, 64, 64), (1024, 5000, 900), (64, 200_000, 150_000)],
)
def test_ranks_and_members_are_those_of_the_sorted_inodes(
    monkeypatch: pytest.MonkeyPatch, base: int, n: int, count: int
) -> None:
    """Members below, inside and above the span, spans not a whole number of words: each
    member's rank is its index in the sorted inodes, each rank selects it back, and no other
    inode is a member."""
    monkeypatch.setattr(ranked, "SELECT_BATCH", 7)
    rng = np.random.default_rng(n + count)
    pool = np.arange(max(0, base - 20), base + n + 50, dtype=np.int64)
    members = np.unique(rng.choice(pool, size=min(count, pool.size), replace=False))
    got = _made(base, n, members)
    assert got.size == members.size
    shuffled = rng.permutation(members)
    assert got.rank(shuffled).tolist() == np.searchsorted(members, shuffled).tolist()
    ranks = rng.permutation(members.size).astype(np.int64)
    assert got.select(ranks).tolist() == members[ranks].tolist()
    asked = np.arange(pool[0] - 5, pool[-1] + 5, dtype=np.int64)
    assert got(asked).tolist() == np.isin(asked, members).tolist()


def test_the_counts_take_no_eight_bytes_a_member() -> None:
    """What the set keeps besides its bits: a 32-bit count a word of 64 inode numbers."""
    n = 1 << 20
    members = np.arange(0, n, 3, dtype=np.int64)
    got = _made(0, n, members)
    assert got.before.nbytes <= 4 * (n // 64 + 1)
    assert got.bits.bits.nbytes == n // 8
    assert got.rank(members[-3:]).tolist() == [members.size - 3, members.size - 2, members.size - 1]


@pytest.mark.parametrize("window", [1, 3, 10, 1000])
def test_bucket_starts_are_those_of_running_totals(
    monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """Directories of no entry, of one, of more than a window: where the running total of
    entries crosses a multiple of the window, counted a window of directories at a time."""
    monkeypatch.setattr(spill, "WINDOW", window)
    rng = np.random.default_rng(window)
    for size in (0, 1, 2, 37, 1001):
        entries = rng.choice([0, 1, 2, 5, 40, 3000], size=size).astype(np.uint32)
        total = np.cumsum(entries.astype(np.int64))
        want = np.flatnonzero(np.diff(total // window, prepend=0))
        assert pathwalk.bucket_starts(entries).tolist() == want.tolist()

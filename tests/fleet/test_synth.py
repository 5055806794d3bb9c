"""The synthetic fleet histories are physically possible file systems: no block is held by two
files or lies past the end, free and used space add up to the size, and the layout decays."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from fsage.analyzer.analysis import SnapshotAnalyzer
from fsage.db.store import Store
from fsage.fleet.synth import synthetic_history


def test_a_long_history_stays_inside_its_file_system(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with Store.open(db, create=True) as store:
        # 60 nights of 5% churn: a bump allocator ran past the end of the disk well before.
        ids = synthetic_history(store, "fs", files=2000, snapshots=60, seed=7, churn=0.05)
        scores = []
        for sid in (ids[0], ids[len(ids) // 2], ids[-1]):
            lay = store.load_layout(sid)
            total = lay.facts.blocks_total
            start = lay.files.ext_physical.astype(np.int64)
            length = lay.files.ext_length.astype(np.int64)
            order = np.argsort(start)
            start, length = start[order], length[order]
            assert (start[1:] >= (start + length)[:-1]).all(), "two files share blocks"
            assert int((start + length).max()) <= total
            free = int(lay.free.length.astype(np.int64).sum())
            assert free + int(length.sum()) == total
            assert free == lay.facts.blocks_free
            scores.append(SnapshotAnalyzer(lay, snapshot_id=sid).summary()["layout_score"])
    assert scores[0] > scores[1] > scores[2]


@pytest.mark.parametrize("fanout", [0, 8])
def test_the_names_and_parents_are_those_the_numbers_spell(
    monkeypatch: pytest.MonkeyPatch, fanout: int
) -> None:
    """Each directory ``d<i>`` and file ``f<inode>`` named in decimal, under the root or its
    place in the tree, whatever the number of digits (made as arrays, not strings)."""
    from fsage.fleet import synth

    monkeypatch.setattr(synth, "FANOUT", fanout)
    numbers = np.array([0, 7, 9, 10, 99, 100, 12345, 10**12, 10**18 - 1], np.int64)
    off, raw = synth._numbered(b"f", numbers)
    got = [raw[int(a) : int(b)] for a, b in itertools.pairwise(off.tolist())]
    assert got == [f"f{n}".encode() for n in numbers.tolist()]
    parents = synth._dir_parents(20).tolist()
    want = [2 if i < fanout or fanout <= 0 else 3 + i // fanout - 1 for i in range(20)]
    assert parents == want

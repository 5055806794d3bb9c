"""The synthetic fleet histories are physically possible file systems: no block is held by two
files or lies past the end, free and used space add up to the size, and the layout decays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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

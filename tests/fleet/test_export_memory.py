"""What export reads and holds: a snapshot read from the store a column at a time is the one
read whole and holds the extents debugfs reads from the image; a damaged column is one line;
the export's peak of memory stays within a few snapshots' worth (tracemalloc, own process)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fsage.db.store import Store
from fsage.errors import StoreError
from tests.fleet.test_chunked import _debugfs_extents, extents_of
from tests.fleet.test_chunked import history as history  # the fixture, shared

REPO = Path(__file__).resolve().parents[2]


def _same(a: Any, b: Any, where: str = "layout") -> None:
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, where
        assert np.array_equal(a, b), where
    else:
        assert a == b, where


def test_a_snapshot_read_by_column_is_the_snapshot_read_whole(history: tuple[Path, Path]) -> None:
    img, db = history
    with Store.open(db) as store:
        rows = store.snapshots("real")
        assert store.con.execute("SELECT count(*) FROM version_chunks").fetchone()[0] >= 2
        for row in rows:
            _same(store.load_layout(row.id), store.load_layout(row.id, by_column=True))
        layout = store.load_layout(rows[-1].id, by_column=True)
    # and against the image itself: the second snapshot spans two chunks (debugfs churn)
    files = layout.files
    reg = np.flatnonzero(files.is_regular() & (np.diff(files.ext_off.astype(np.int64)) > 0))
    sample = sorted(random.Random(8).sample(reg.tolist(), 40))
    want = _debugfs_extents(img, [int(files.ino[i]) for i in sample])
    for i in sample:
        got = extents_of(files, i)
        assert got == want[int(files.ino[i])], int(files.ino[i])


def test_a_damaged_column_is_one_line(history: tuple[Path, Path], tmp_path: Path) -> None:
    _, src = history
    db = tmp_path / "damaged.db"
    with sqlite3.connect(src) as a, sqlite3.connect(db) as b:
        a.backup(b)
    with sqlite3.connect(db) as con:
        chunk_id, body = con.execute("SELECT chunk_id, body FROM chunk_blobs LIMIT 1").fetchone()
        raw = bytearray(body)
        raw[len(raw) // 2] ^= 0xFF  # inside some column: its checksum no longer matches
        con.execute("UPDATE chunk_blobs SET body = ? WHERE chunk_id = ?", (bytes(raw), chunk_id))
    with Store.open(db) as store:
        first = store.snapshots("real")[0].id
        with pytest.raises(StoreError) as err:
            store.load_layout(first, by_column=True)
    assert "\n" not in str(err.value)
    assert f"snapshot {first} cannot be read" in str(err.value)


PROBE = """
import gc, json, sys, tracemalloc
from pathlib import Path
from fsage.db.store import Store
from fsage.fleet.export import export_parquet
from fsage.fleet.synth import synthetic_history
db, out, files = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
with Store.open(db, create=True) as store:
    synthetic_history(store, "big", files=files, snapshots=2, seed=3)
gc.collect()
tracemalloc.start()
with Store.open(db) as store:
    base = tracemalloc.get_traced_memory()[0]
    layout = store.load_layout(store.snapshots("big")[-1].id)
    snapshot = tracemalloc.get_traced_memory()[0] - base
    del layout
gc.collect()
base = tracemalloc.get_traced_memory()[0]
tracemalloc.reset_peak()
export_parquet(db, out, host="h")
print(json.dumps({"snapshot": snapshot, "peak": tracemalloc.get_traced_memory()[1] - base}))
"""


@pytest.mark.slow
def test_export_holds_about_one_snapshot_at_a_time(tmp_path: Path) -> None:
    """Every allocation numpy and Python make is traced (deterministic, unlike the resident
    set on a shared machine): the export of two snapshots peaks below three times what one
    loaded snapshot holds (about two today: the snapshot, the analyzer's per-file arrays and
    one column being gathered), so that holding a second snapshot, or a whole copy of one,
    fails."""
    pytest.importorskip("pyarrow")
    argv = [sys.executable, "-c", PROBE, str(tmp_path / "m.db"), str(tmp_path / "out"), "100000"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["snapshot"] > 10 << 20  # a snapshot of 100k files: the measure means something
    assert got["peak"] < 3 * got["snapshot"], got

"""The directories' prefixes of an export's first paths (``fsage.fleet.export_prefixes``),
against the layout's own path derivation (``derive_paths``), what they hold, and what the
export holds per directory."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from fsage.fleet.export_prefixes import Prefixes
from fsage.fleet.export_rows import FirstPaths
from fsage.layout import LinkTable, derive_paths

REPO = Path(__file__).resolve().parents[2]


def _tree(seed: int) -> LinkTable:
    """A random tree under inode 2 with what a damaged or odd one holds: a directory with
    two names, a loop, an orphaned subtree, names that are not UTF-8, files with several
    names."""
    rng = random.Random(seed)
    dirs = [2]
    parents, inos, names = [], [], []
    next_ino = 10
    for _ in range(rng.randrange(5, 60)):
        parent = rng.choice(dirs)
        parents.append(parent)
        inos.append(next_ino)
        names.append(rng.choice([b"d", b"e\xff", "\u00e9".encode(), b"z", b"a"]) + b"%d" % next_ino)
        dirs.append(next_ino)
        next_ino += 1
    for _ in range(rng.randrange(0, 4)):  # a second name of a directory (or a loop)
        parents.append(rng.choice(dirs))
        inos.append(rng.choice(dirs[1:]))
        names.append(b"again%d" % rng.randrange(100))
    parents.append(999)  # an orphaned subtree
    inos.append(1000)
    names.append(b"lost")
    dirs.append(1000)
    for _ in range(rng.randrange(20, 200)):
        parents.append(rng.choice(dirs))
        inos.append(rng.choice([next_ino, rng.randrange(10, next_ino + 1)]))
        names.append(rng.choice([b"f", b"g\xfe\xff", b"h"]) + b"%d" % rng.randrange(1000))
        next_ino += 1
    order = list(range(len(parents)))
    rng.shuffle(order)  # link order is not tree order
    return LinkTable.from_lists(
        [parents[i] for i in order], [inos[i] for i in order], [names[i] for i in order]
    )


@pytest.mark.parametrize("seed", range(40))
def test_first_paths_are_the_smallest_paths_derive_paths_finds(seed: int) -> None:
    links = _tree(seed)
    want = derive_paths(links, 2)
    inos = np.unique(np.concatenate([links.ino.astype(np.int64), [2, 5000]]))
    got = FirstPaths(links, root_ino=2).first(inos)
    assert got == [min(want[i]) if i in want else None for i in inos.tolist()]


def test_a_directory_costs_its_path_and_a_few_numbers() -> None:
    """100k directories (a tree of ~2M files): the prefixes held are their path bytes and
    24 bytes each, not a dict of strings (~150 bytes a directory more)."""
    n = 100_000
    parent = np.where(np.arange(n) < 100, 2, 10 + np.arange(n) // 1000).astype(np.int64)
    ino = (10 + np.arange(n)).astype(np.int64)
    raw = [b"dir%d" % i for i in range(n)]
    lens = np.array([len(r) for r in raw], np.int64)
    off = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    names = b"".join(raw)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        p = Prefixes.walk(parent, ino, off[:-1], off[1:], names, 2)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(p) == n + 1
    assert p.get(10 + 1234) == "/dir1/dir1234"
    assert p.get(7) is None
    path_bytes = len(p.buf)
    assert held <= path_bytes + 40 * (n + 1), (held, path_bytes)


PROBE = """
import json, sys, tracemalloc
from pathlib import Path
from fsage.db.store import Store
from fsage.fleet import synth
from fsage.fleet.export import export_parquet
import fsage.db.parts, fsage.analyzer.spill, fsage.fleet.export
import pyarrow.parquet, fsage.fleet.compact  # imported before the count starts
db, out, files, per_dir = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
synth.PER_DIR = per_dir
with Store.open(db, create=True) as store:
    synth.synthetic_history(store, "big", files=files, snapshots=2, seed=3)
fsage.db.parts.PART_ROWS = fsage.db.parts.NAME_ROWS = fsage.analyzer.spill.WINDOW = 4096
fsage.fleet.export.FILES_CHUNK = 4096
fsage.db.parts.MARK_ROWS = 4096
fsage.db.parts.CRC_PIECE = 1 << 15
import fsage.analyzer.pathwalk as pathwalk
walk_peaks = []
real_finish = pathwalk.PathWalk.finish
def finish(self, *a, **k):  # the walk's own peak, above what it starts from
    start = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    try:
        return real_finish(self, *a, **k)
    finally:
        walk_peaks.append(tracemalloc.get_traced_memory()[1] - start)
pathwalk.PathWalk.finish = finish
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
tracemalloc.reset_peak()
export_parquet(db, out, host="h")
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1] - base, "walk": max(walk_peaks)}))
"""


def _peaks(tmp_path: Path, files: int, per_dir: int) -> dict[str, int]:
    """The export's traced peak and its path walk's (``walk``: above what it starts from)."""
    argv = [sys.executable, "-c", PROBE, str(tmp_path / f"d{per_dir}.db"),
            str(tmp_path / f"out{per_dir}"), str(files), str(per_dir)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=300)
    return {k: int(v) for k, v in json.loads(done.stdout.splitlines()[-1]).items()}


def _peak(tmp_path: Path, files: int, per_dir: int) -> int:
    return _peaks(tmp_path, files, per_dir)["peak"]


@pytest.mark.slow
def test_export_holds_a_few_numbers_a_directory(tmp_path: Path) -> None:
    """Every allocation traced (deterministic): the same 80k files in 40k directories
    instead of 80, exported with parts of 4096 files, raise the export's peak by less than
    150 bytes a directory (about 50 measured; prefixes as a dict of strings and the names
    that build them as tuples cost about 370)."""
    pytest.importorskip("pyarrow")
    files = 80_000
    few, many = _peak(tmp_path, files, 1000), _peak(tmp_path, files, 2)
    dirs = files // 2
    assert many - few < 150 * dirs, (few, many)


@pytest.mark.slow
def test_path_walk_holds_a_few_numbers_a_directory(tmp_path: Path) -> None:
    """The walk's own peak (every allocation traced): 60k files in 20k directories instead
    of 60 raise it by less than 90 bytes a directory (about 55 measured; its directory
    records whole, 8-byte indices and a sorted copy of the root's bucket cost about 160).
    All the directories are the root's entries: its bucket is many windows, sorted with its
    records on disk."""
    pytest.importorskip("pyarrow")
    files = 60_000
    few, many = _peaks(tmp_path, files, 1000)["walk"], _peaks(tmp_path, files, 3)["walk"]
    dirs = files // 3
    assert many - few < 90 * dirs, (few, many, (many - few) / dirs)

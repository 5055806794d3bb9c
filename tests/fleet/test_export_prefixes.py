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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fsage.fleet.export_prefixes import DiskPrefixes, Prefixes
from fsage.fleet.export_rows import FirstPaths
from fsage.layout import LinkTable, derive_paths

REPO = Path(__file__).resolve().parents[2]


def _tree(seed: int, odd: bool = True) -> LinkTable:
    """A random tree under inode 2 with what a damaged or odd one holds: a directory with
    two names, a loop, an orphaned subtree, names that are not UTF-8, files with several
    names (``odd`` False: no second name of a directory, as in a sound tree)."""
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
    for _ in range(rng.randrange(0, 4) if odd else 0):  # a directory's second name (or a loop)
        parents.append(rng.choice(dirs))
        inos.append(rng.choice(dirs[1:]))
        names.append(b"again%d" % rng.randrange(100))
    parents.append(999)  # an orphaned subtree
    inos.append(1000)
    names.append(b"lost")
    dirs.append(1000)
    for _ in range(rng.randrange(20, 200)):
        parents.append(rng.choice(dirs))
        inos.append(rng.choice([next_ino, rng.randrange(10, next_ino + 1)]) if odd else next_ino)
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


def _directory_names(links: LinkTable) -> tuple[np.ndarray, ...]:
    """The names whose inode names entries, in link order: what an export's prefixes take."""
    parent = links.parent.astype(np.int64)
    ino = links.ino.astype(np.int64)
    keep = np.flatnonzero(np.isin(ino, parent))
    off = links.name_off.astype(np.int64)
    return keep, parent[keep], ino[keep], off[:-1][keep], off[1:][keep]


@pytest.mark.parametrize("odd", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_prefixes_on_disk_are_the_walks(seed: int, odd: bool, tmp_path: Path) -> None:
    """Against ``Prefixes.walk`` on trees with orphans and names that are not UTF-8, with
    (walked in memory) and without (derived on disk) second names and loops, the names
    added in pieces (as a snapshot's chunks come) and out of link order between pieces."""
    links = _tree(seed, odd)
    rows, parent, ino, lo, hi = _directory_names(links)
    names = links.names
    want = Prefixes.walk(parent, ino, lo, hi, names, 2)
    disk = DiskPrefixes(tmp_path / "p.sqlite")
    pieces = np.array_split(np.arange(rows.size), 3)
    for piece in reversed(pieces):
        disk.add(rows[piece], parent[piece], ino[piece], lo[piece], hi[piece], names)
    disk.finish(2)
    probe = np.unique(np.concatenate([links.ino.astype(np.int64), links.parent.astype(np.int64),
                                      [2, 5000]]))  # fmt: skip
    assert disk.heads(probe) == want.heads(probe)
    assert len(disk) == len(want)
    if not odd:
        assert disk.memory is None
    disk.close()


def test_prefixes_of_a_tree_are_derived_on_disk_and_of_others_in_memory(tmp_path: Path) -> None:
    """A tree's paths come from the recursive query (nothing held in memory); a directory
    with two names sends the names to the walk in memory (its order picks the path)."""
    parent = np.array([2, 2, 10, 11, 12], np.int64)
    ino = np.array([10, 11, 12, 13, 14], np.int64)
    raw = [b"a", b"b\xff", b"c", b"d", b"e"]
    off = np.cumsum([0, *map(len, raw)]).astype(np.int64)
    names = b"".join(raw)
    seq = np.arange(5, dtype=np.int64)
    tree = DiskPrefixes(tmp_path / "tree.sqlite")
    tree.add(seq, parent, ino, off[:-1], off[1:], names)
    tree.finish(2)
    assert tree.memory is None
    got = tree.heads(np.array([2, 12, 13, 14, 99], np.int64))
    assert got == ["", "/a/c", "/b\udcff/d", "/a/c/e", None]
    tree.close()
    twice = DiskPrefixes(tmp_path / "twice.sqlite")
    parent2, ino2 = np.array([2, 2, 10, 11, 11], np.int64), np.array([10, 11, 12, 13, 12])
    twice.add(seq, parent2, ino2, off[:-1], off[1:], names)
    twice.finish(2)
    assert twice.memory is not None
    # b is walked first (the last pushed): 12 takes its name there, as the walk does
    assert twice.get(12) == "/b\udcff/e"
    assert twice.get(12) == Prefixes.walk(parent2, ino2, off[:-1], off[1:], names, 2).get(12)
    twice.close()


def _sqlite_memory() -> Callable[[], int] | None:
    """SQLite's own count of the memory it holds (the library Python's sqlite3 uses)."""
    import ctypes
    import ctypes.util
    import sqlite3

    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    if lib.sqlite3_libversion_number() != sqlite3.sqlite_version_info[0] * 1_000_000 + (
        sqlite3.sqlite_version_info[1] * 1000 + sqlite3.sqlite_version_info[2]
    ):
        return None  # another copy of SQLite than the one the module links
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return lambda: int(lib.sqlite3_memory_used())


def test_looking_up_prefixes_keeps_no_statement_a_length(tmp_path: Path) -> None:
    """Each part looks up a different number of directories: SQLite's memory stays where
    the first lookups left it (a statement per number of parameters, cached by sqlite3 up
    to 128 of them, grew by 9 MiB over one snapshot's parts)."""
    memory = _sqlite_memory()
    if memory is None:
        pytest.skip("SQLite's memory count is not reachable through ctypes")
    n = 40_000
    i = np.arange(n, dtype=np.int64)
    raw = [b"d%d" % k for k in i.tolist()]
    off = np.cumsum([0, *map(len, raw)]).astype(np.int64)
    disk = DiskPrefixes(tmp_path / "p.sqlite")
    disk.add(i, np.where(i < 8, 2, 10 + i // 8 - 1), 10 + i, off[:-1], off[1:], b"".join(raw))
    disk.finish(2)
    rng = np.random.default_rng(3)

    def lookups(times: int) -> None:
        for _ in range(times):
            asked = 10 + rng.choice(n, int(rng.integers(2000, 9000)), replace=False)
            heads = disk.heads(asked.astype(np.int64))
            assert all(h is not None and h.endswith(f"/d{a - 10}") for h, a in
                       zip(heads, asked.tolist(), strict=True))  # fmt: skip

    lookups(5)
    before = memory()
    lookups(60)
    grown = memory() - before
    disk.close()
    assert grown < 2 << 20, f"SQLite holds {grown >> 10} KiB more after 60 lookups"


DISK_PROBE = """
import resource, sys
import numpy as np
from pathlib import Path
from fsage.fleet.export_prefixes import DiskPrefixes
n, out = int(sys.argv[1]), Path(sys.argv[2])
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
p = DiskPrefixes(out)
for lo in range(0, n, 50_000):  # nested 8 a directory: paths of some 7 levels
    i = np.arange(lo, min(lo + 50_000, n), dtype=np.int64)
    raw = [b"directory%d" % k for k in i.tolist()]
    off = np.cumsum([0, *map(len, raw)]).astype(np.int64)
    p.add(i, np.where(i < 8, 2, 10 + i // 8 - 1), 10 + i, off[:-1], off[1:], b"".join(raw))
p.finish(2)
heads = p.heads(10 + np.arange(0, n, 97, dtype=np.int64))
assert heads[-1] is not None and heads[-1].count("/") > 5, heads[-1]
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start)
"""


@pytest.mark.slow
def test_prefixes_on_disk_hold_no_memory_a_directory(tmp_path: Path) -> None:
    """The peak resident set of 50k and of 500k directories' prefixes differs by less than
    8 MiB (in memory, 500k paths of ~70 bytes and 24 bytes each beside them are over 45 MB;
    their walk's arrays more)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def grown(n: int) -> int:
        argv = [sys.executable, "-c", DISK_PROBE, str(n), str(tmp_path / f"p{n}.sqlite")]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True,
                              timeout=600)  # fmt: skip
        return int(done.stdout.split()[-1])  # KiB

    assert grown(500_000) - grown(50_000) < 8 * 1024


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
    40 bytes a directory (about 12 measured: the inodes that name entries and their counts;
    prefixes as a dict of strings and the names that build them as tuples cost about 370,
    the walk's numbers a directory and the parents gathered whole about 50)."""
    pytest.importorskip("pyarrow")
    files = 80_000
    few, many = _peak(tmp_path, files, 1000), _peak(tmp_path, files, 2)
    dirs = files // 2
    assert many - few < 40 * dirs, (few, many, (many - few) / dirs)


@pytest.mark.slow
def test_path_walk_holds_a_few_numbers_a_directory(tmp_path: Path) -> None:
    """The walk's own peak (every allocation traced): 60k files in 20k directories instead
    of 60 raise it by less than 40 bytes a directory (about 18 measured, the merge of the
    root's bucket's runs; the directories' depths, sizes and positions are in a scratch
    file, which tracing does not see and the RSS bench measures; kept in memory, they and
    each directory's scan totals cost about 55). All the directories are the root's entries:
    its bucket is many windows, sorted with its records on disk."""
    pytest.importorskip("pyarrow")
    files = 60_000
    few, many = _peaks(tmp_path, files, 1000)["walk"], _peaks(tmp_path, files, 3)["walk"]
    dirs = files // 3
    assert many - few < 40 * dirs, (few, many, (many - few) / dirs)


def test_an_older_sqlite_is_refused_with_what_it_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQLite before ``UPDATE ... FROM`` is named in a one-line error before any scratch
    file is made; the machine's own runs the scratch tables' statements."""
    import sqlite3

    from fsage.analyzer import spill
    from fsage.errors import FsageError

    con = spill.scratch_db(tmp_path / "ok.sqlite", 1024)
    con.executescript(
        "CREATE TABLE t (a INTEGER PRIMARY KEY, b INTEGER); INSERT INTO t VALUES (1, 0);"
        "UPDATE t SET b = s.v FROM (SELECT 1 AS k, 7 AS v) AS s WHERE t.a = s.k;"
    )
    assert con.execute("SELECT b FROM t").fetchone() == (7,)
    assert con.execute("SELECT sum(value) FROM json_each('[2, 3]')").fetchone() == (5,)
    con.close()
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    with pytest.raises(FsageError, match=r"SQLite 3\.33\.0 or newer.*has 3\.31\.1"):
        spill.scratch_db(tmp_path / "old.sqlite", 1024)
    assert not (tmp_path / "old.sqlite").exists()

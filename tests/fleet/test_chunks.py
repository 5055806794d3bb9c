"""Export and compaction work in chunks: progress from the first moment, file versions written
and gathered a bounded number of rows at a time, the same rows whatever the chunk."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")

import fsage.fleet.compact as compact_mod  # noqa: E402
import fsage.fleet.export as export_mod  # noqa: E402
from fsage.db.store import Store  # noqa: E402
from fsage.fleet import TABLES  # noqa: E402
from fsage.fleet.export_rows import FirstPaths  # noqa: E402
from fsage.fleet.synth import synthetic_history  # noqa: E402
from fsage.layout import LinkTable  # noqa: E402
from tests.terminal import run_on_terminal  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chunks") / "h.db"
    with Store.open(path, create=True) as store:
        synthetic_history(store, "a", files=500, snapshots=3, seed=1)
        synthetic_history(store, "b", files=200, snapshots=2, seed=2)
    return path


def _rows(root: Path, table: str) -> list[tuple[object, ...]]:
    files = sorted(p for p in (root / table).rglob("*.parquet"))
    t = pa.concat_tables([pq.read_table(p) for p in files])
    cols = [c for c in t.column_names if c not in ("host", "fs")]
    return sorted(
        tuple(repr(r[c]) for c in cols) for r in t.select(cols).to_pylist()
    )  # every value, order aside


def test_export_reports_progress_at_once_and_chunks_versions(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    whole = tmp_path / "whole"
    export_mod.export_parquet(db, whole, host="h", progress=lambda d, t: calls.append((d, t)))
    total = export_mod.STEPS * 5  # five snapshots
    done = [d for d, _ in calls]
    assert calls[0] == (0, total) and done[-1] == total and {t for _, t in calls} == {total}
    assert done == sorted(done) and len(set(done)) > 3 * 5  # moved within each snapshot

    monkeypatch.setattr(export_mod, "FILES_CHUNK", 64)
    chunked = tmp_path / "chunked"
    export_mod.export_parquet(db, chunked, host="h")
    for p in (chunked / "files").rglob("*.parquet"):
        meta = pq.read_metadata(p)
        assert meta.num_row_groups >= 2
        assert all(meta.row_group(i).num_rows <= 64 for i in range(meta.num_row_groups))
    for table in TABLES:
        assert _rows(chunked, table) == _rows(whole, table), table


def test_export_s_progress_moves_while_it_reads_a_free_map(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large free map takes a while before any file is read (47 s of a 44.8M-file
    snapshot's 400): the line moves as its blob is read, twice (its figures, its rows), in
    pieces (``CRC_PIECE``, made small here), up to the free map's share of the snapshot; the
    rows written are those of an export in whole pieces."""
    from fsage.db import parts
    from fsage.fleet import export_stream

    whole = tmp_path / "whole"
    export_mod.export_parquet(db, whole, host="h")
    monkeypatch.setattr(parts, "CRC_PIECE", 256)
    calls: list[int] = []
    at_names: list[int] = []  # the progress when each snapshot's free map is done
    real = export_stream._parents

    def parents(*args: object, **kw: object) -> object:
        at_names.append(calls[-1])
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(export_stream, "_parents", parents)
    small = tmp_path / "small"
    export_mod.export_parquet(db, small, host="h", progress=lambda d, t: calls.append(d))
    first = calls[: calls.index(at_names[0]) + 1]
    assert first == sorted(first) and at_names[0] == export_stream.FREE_SHARE * export_mod.STEPS
    assert len(set(first)) >= 6, first  # 0, then moving through the free map's share
    for table in TABLES:
        assert _rows(small, table) == _rows(whole, table), table


def test_export_s_progress_moves_while_it_opens_a_snapshot_of_many_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot of many chunks takes a while to open (each chunk's columns checked and its
    bits made) before its free map is read: the line moves chunk by chunk up to the
    opening's share of the snapshot."""
    from fsage.analyzer import streamed
    from fsage.db import versions
    from fsage.fleet import export_stream

    monkeypatch.setattr(versions, "CHUNK_MAX_ROWS", 300)
    db = tmp_path / "wide.db"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "w", files=3000, snapshots=1, seed=5)
    calls: list[int] = []
    at_free: list[int] = []  # the progress when the free map is first read
    real = streamed.free_figures

    def free_figures(*args: object, **kw: object) -> object:
        at_free.append(calls[-1])
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(export_stream, "free_figures", free_figures)
    export_mod.export_parquet(db, tmp_path / "out", host="h", progress=lambda d, t: calls.append(d))
    opening = calls[: calls.index(at_free[0]) + 1]
    assert at_free[0] == export_stream.OPEN_SHARE * export_mod.STEPS, opening
    assert opening == sorted(opening), opening
    assert set(opening) == set(range(int(export_stream.OPEN_SHARE * export_mod.STEPS) + 1))
    assert calls[-1] == export_mod.STEPS


def test_compaction_gathers_bounded_row_groups(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = tmp_path / "ds"
    export_mod.export_parquet(db, ds, host="h")
    before = {t: _rows(ds, t) for t in TABLES}
    monkeypatch.setattr(compact_mod, "ROW_GROUP", 300)
    monkeypatch.setattr(compact_mod, "ROW_GROUPS", {"files": 100})
    monkeypatch.setattr(compact_mod, "BATCH", 32)
    assert compact_mod.compact(ds).changed
    for table in TABLES:
        (out,) = (ds / table / "compacted").glob("*.parquet")
        meta = pq.read_metadata(out)
        limit = 100 if table == "files" else 300
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert all(n == limit for n in sizes[:-1]) and 0 < sizes[-1] <= limit, (table, sizes)
        assert _rows(ds, table) == before[table], table


# The export's rows of a fixed synthetic history as fsage wrote them before file versions
# were written a chunk at a time (row count and sha256 prefix of the sorted rows, every column
# but the store's own timing): streaming must not change a value.
REFERENCE = {
    "snapshots": (5, "7d8de5c6dcc5321f"),
    "metrics": (5, "51ab5784ed0ac7bb"),
    "size_buckets": (59, "fc3e03d5a8a44c41"),
    "free_buckets": (47, "f9ae0008bcc5b385"),
    "files": (3902, "42d795b634539fc3"),
    "file_ends": (196, "f13b1df4c1fa799e"),
    "free_extents": (9591, "a0ab9e0d5ed5f303"),
}


def test_export_rows_equal_the_whole_snapshot_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "h.db"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "a", files=3000, snapshots=3, seed=11)
        synthetic_history(store, "b", files=700, snapshots=2, seed=12)
    monkeypatch.setattr(export_mod, "FILES_CHUNK", 1000)  # several chunks a snapshot
    export_mod.export_parquet(db, tmp_path / "ds", host="h")
    for table, expected in REFERENCE.items():
        files = sorted((tmp_path / "ds" / table).rglob("*.parquet"))
        t = pa.concat_tables([pq.read_table(p) for p in files])
        cols = [c for c in t.column_names if c != "seconds"]
        rows = sorted(repr(tuple(r[c] for c in cols)) for r in t.select(cols).to_pylist())
        digest = hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]
        assert (len(rows), digest) == expected, table


def _links(entries: list[tuple[int, int, bytes]]) -> LinkTable:
    return LinkTable.from_lists(*(list(c) for c in zip(*entries, strict=True)))


def test_first_paths_resolve_a_chunk_of_inodes() -> None:
    links = _links(
        [
            (2, 20, b"usr"),
            (20, 21, b"lib"),
            (21, 30, b"z"),
            (2, 30, b"hard"),  # a second name: the smaller path is the first
            (21, 31, b"a\xff"),  # not UTF-8: escaped, as the paths of a layout are
            (99, 32, b"orphan"),  # in a directory no path reaches
            (20, 33, b"b"),
        ]
    )
    paths = FirstPaths(links, root_ino=2)
    got = paths.first(np.array([2, 20, 21, 30, 31, 32, 33, 40], np.int64))
    assert got == ["/", "/usr", "/usr/lib", "/hard", "/usr/lib/a\udcff", None, "/usr/b", None]


def test_export_shows_progress_on_a_terminal(db: Path, tmp_path: Path) -> None:
    """On a terminal a progress line comes before the first snapshot is read; in a pipe
    nothing but the result."""
    argv = [sys.executable, "-m", "fsage", "export", "--db", str(db), "--host", "h"]
    status, _, term = run_on_terminal([*argv, str(tmp_path / "tty")], cwd=REPO)
    assert status == 0
    assert "exporting (100 a snapshot)" in term and "500/500" in term, term
    piped = subprocess.run(
        [*argv, str(tmp_path / "pipe")], capture_output=True, cwd=REPO, timeout=120
    )
    assert piped.returncode == 0 and piped.stderr == b""


def _sorted_by_output_order(path: Path, table: str) -> bool:
    t = pq.read_table(path)
    cols = ["host", "fs", *(c.strip() for c in compact_mod.ORDER[table].split(","))]
    keys = list(zip(*(t.column(c).to_pylist() for c in cols), strict=True))
    return keys == sorted(keys)


def test_compaction_in_groups_of_partitions_keeps_rows_and_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partitions read one or two files at a time, a second compaction rewriting the first's
    files with new runs of some file systems: the rows of a plain export, in sorted order."""
    db = tmp_path / "h.db"
    names = ["b", "a", "c2", "c10"]  # the output order is not the order of creation
    with Store.open(db, create=True) as store:
        for i, name in enumerate(names):
            synthetic_history(store, name, files=150, snapshots=2, seed=20 + i)
    ds = tmp_path / "ds"
    export_mod.export_parquet(db, ds, host="h")
    monkeypatch.setattr(compact_mod, "FILES_PER_QUERY", 1)
    assert compact_mod.compact(ds).changed
    with Store.open(db) as store:
        for i, name in enumerate(names[:2]):
            synthetic_history(store, name, files=150, snapshots=4, seed=20 + i, skip=2)
    export_mod.export_parquet(db, ds, host="h")
    monkeypatch.setattr(compact_mod, "FILES_PER_QUERY", 2)
    monkeypatch.setattr(compact_mod, "MAX_LARGE_GENERATIONS", 1)  # the large tables rewritten too
    assert compact_mod.compact(ds).changed
    plain = tmp_path / "plain"
    export_mod.export_parquet(db, plain, host="h")
    for table in TABLES:
        (out,) = (ds / table / "compacted").glob("*.parquet")
        assert _sorted_by_output_order(out, table), table
        assert _rows(ds, table) == _rows(plain, table), table

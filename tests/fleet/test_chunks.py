"""Export and compaction work in chunks: progress from the first moment, file versions written
and gathered a bounded number of rows at a time, the same rows whatever the chunk."""

from __future__ import annotations

from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")

import fsage.fleet.compact as compact_mod  # noqa: E402
import fsage.fleet.export as export_mod  # noqa: E402
from fsage.db.store import Store  # noqa: E402
from fsage.fleet import TABLES  # noqa: E402
from fsage.fleet.synth import synthetic_history  # noqa: E402


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
    assert calls == [(i, total) for i in range(total + 1)]

    monkeypatch.setattr(export_mod, "FILES_CHUNK", 64)
    chunked = tmp_path / "chunked"
    export_mod.export_parquet(db, chunked, host="h")
    for p in (chunked / "files").rglob("*.parquet"):
        meta = pq.read_metadata(p)
        assert meta.num_row_groups >= 2
        assert all(meta.row_group(i).num_rows <= 64 for i in range(meta.num_row_groups))
    for table in TABLES:
        assert _rows(chunked, table) == _rows(whole, table), table


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

"""Fleet queries in bounded memory: DuckDB spills to a private directory that fsage makes and
always removes, and a query's peak resident set does not grow with the dataset."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

duckdb = pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")

import fsage.fleet.query as query_mod  # noqa: E402
from fsage.db.store import Store  # noqa: E402
from fsage.errors import FsageError  # noqa: E402
from fsage.fleet.export import export_parquet  # noqa: E402
from fsage.fleet.output import write_tables  # noqa: E402
from fsage.fleet.synth import synthetic_history  # noqa: E402
from tests.fleet.peaks import exported, lowest_peak  # noqa: E402


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    db, ds = tmp_path / "h.db", tmp_path / "ds"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "a", files=200, snapshots=2, seed=3)
    export_parquet(db, ds, host="h")
    return ds


@pytest.fixture
def spills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, int, str]]:
    """The spill directories the queries make (under a temporary directory of the test's
    own), with their mode and DuckDB's temp_directory setting when the views are made."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    monkeypatch.chdir(tmp_path)
    seen: list[tuple[Path, int, str]] = []
    real = query_mod._views

    def views(con: Any, root: Path, on_damage: str, warn: Any, spill: Path) -> int:
        fresh = real(con, root, on_damage, warn, spill)
        (setting,) = con.execute("SELECT current_setting('temp_directory')").fetchone()
        seen.append((spill, stat.S_IMODE(spill.stat().st_mode), setting))
        return fresh

    monkeypatch.setattr(query_mod, "_views", views)
    return seen


def _check(seen: list[tuple[Path, int, str]], tmp_path: Path) -> None:
    assert seen
    for spill, mode, setting in seen:
        assert spill.parent == tmp_path / "tmp" and spill.name.startswith("fsage-fleet-")
        assert mode == 0o700 and Path(setting) == spill
        assert not spill.exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / ".tmp").exists()  # DuckDB's default, in the working directory


def test_the_spill_directory_is_private_and_removed(
    dataset: Path, tmp_path: Path, spills: list[tuple[Path, int, str]]
) -> None:
    """Every query path (the tables, the printed tables, the report) spills to a 0700
    directory of its own that is gone when it returns; and a query larger than the memory
    limit completes there."""
    t = query_mod.fleet_tables(dataset, query_mod.ALL_TABLES)
    assert t["files_by_size"]
    out = tmp_path / "out.txt"
    with open(out, "w") as fh:
        write_tables(dataset, ("trend", "files_by_size"), "text", fh)
    assert "layout score over time:" in out.read_text()
    from fsage.fleet.report import write_fleet_report

    write_fleet_report(dataset, tmp_path / "r.html")
    with query_mod.opened(dataset) as con:
        # a million groups: several times DuckDB's limit, so they spill
        (n,) = con.execute(
            "SELECT count(*) FROM (SELECT range % 1000003 AS k, count(*) FROM range(4000000)"
            " GROUP BY k)"
        ).fetchone()
        assert n == 1000003
        assert con.execute("SELECT current_setting('threads')").fetchone() == (1,)
    _check(spills, tmp_path)
    assert len(spills) == 4


def test_the_spill_directory_is_removed_after_an_error(
    dataset: Path, tmp_path: Path, spills: list[tuple[Path, int, str]]
) -> None:
    """A query that fails, an error of the caller inside ``opened``, a failure while the
    views are made: one-line errors, and no directory left."""
    unreadable = pytest.raises(query_mod.FleetError, match="cannot be read")
    with unreadable, query_mod.opened(dataset) as c:
        c.execute("SELECT * FROM read_parquet('/nonexistent/x.parquet')")
    with pytest.raises(KeyError), query_mod.opened(dataset):
        raise KeyError("caller")
    out = tmp_path / "out.txt"
    with open(out, "w") as fh, pytest.raises(query_mod.FleetError):
        write_tables(dataset, ("filesystems", "nonexistent"), "json", fh)
    assert out.read_text() == ""  # nothing printed before every query succeeded
    _check(spills, tmp_path)
    (dataset / "metrics" / "host=h" / "fs=a" / "part.parquet").write_bytes(b"not parquet")
    before = len(spills)
    with pytest.raises(FsageError, match="not a readable Parquet file"):
        query_mod.fleet_tables(dataset)
    assert len(spills) == before  # refused before the views were made
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_the_peak_of_a_query_does_not_grow_with_the_dataset(tmp_path: Path) -> None:
    """`fsage fleet DIR --table files_by_size` (the query that reads every file's extents)
    and `fsage fleet report` over compacted datasets of 50k and of 300k files, each in a
    fresh process: the larger's peak within 8 MiB of the smaller's. A query that holds the
    files it reads (300k files' extents are about 25 MiB in DuckDB) fails. Each peak is the
    lower of two runs: a loaded machine only adds to a peak."""
    peaks: dict[str, dict[int, float]] = {"files_by_size": {}, "report": {}}
    for files in (50_000, 300_000):
        out = exported(tmp_path, files, compacted=True)
        query = ["fleet", str(out), "--table", "files_by_size", "--format", "json"]
        peaks["files_by_size"][files], shown = lowest_peak([query, query])
        assert all(shown), files
        report = ["fleet", "report", str(out), "-o", str(tmp_path / f"r{files}.html")]
        peaks["report"][files] = lowest_peak([report, report])[0]
    for p in peaks.values():
        assert p[300_000] - p[50_000] < 8, peaks


def _metrics_fleet(root: Path, filesystems: int, snapshots: int) -> Path:
    """A compacted dataset of metrics alone (the other tables empty): ``filesystems`` file
    systems of ``snapshots`` daily snapshots each, written in the export's schema."""
    import datetime as dt

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from fsage.fleet.compact import compact
    from fsage.fleet.export_schema import partition_dir, schemas, table_metadata

    sch = schemas()
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    for i in range(filesystems):
        host, fs = f"h{i // 4:04d}", f"f{i % 4}"
        n = snapshots
        cols = {"host": [host] * n, "fs": [fs] * n,
                "snapshot_id": list(range(i * n + 1, (i + 1) * n + 1)),
                "taken_at": [start + dt.timedelta(days=d) for d in range(n)],
                "block_size": [4096] * n, "blocks_total": [1 << 20] * n,
                "blocks_free": [(1 << 19) + d for d in range(n)],
                "layout_score": [0.99 - 1e-4 * d - 1e-6 * i for d in range(n)],
                "free_extent_count": [100 + d for d in range(n)]}  # fmt: skip
        for name in ("snapshots", "metrics"):
            t = pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in sch[name]},
                         schema=sch[name])  # fmt: skip
            t = t.replace_schema_metadata(table_metadata(name))
            part = partition_dir(root, name, host, fs)
            part.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, part / "part.parquet")
    for name in ("size_buckets", "free_buckets", "files", "file_ends", "free_extents"):
        part = partition_dir(root, name, "h0000", "f0")
        part.mkdir(parents=True, exist_ok=True)
        t = pa.table({f.name: pa.array([], f.type) for f in sch[name]}, schema=sch[name])
        file = "part.parquet" if name.endswith("buckets") else "s0-0.parquet"
        pq.write_table(t.replace_schema_metadata(table_metadata(name)), part / file)
    compact(root)
    return root


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_the_peak_of_the_trend_does_not_grow_with_its_rows(tmp_path: Path) -> None:
    """`fsage fleet DIR --table trend` over 72k and over 238k snapshots (both more than a
    sorted batch), each in a fresh process: the larger's peak within 6 MiB of the smaller's,
    and every row printed. A trend sorted whole (166k rows more of eight columns) fails.
    Each peak is the lower of two runs: on a loaded machine one run's peak rose 6 MiB above
    the other's (noise only adds)."""
    peaks = {}
    for filesystems in (100, 330):
        ds = _metrics_fleet(tmp_path / f"m{filesystems}", filesystems, 720)
        trend = ["fleet", str(ds), "--table", "trend", "--format", "csv"]
        peaks[filesystems], shown = lowest_peak([trend, trend])
        for out in shown:
            assert out.count("\n") == filesystems * 720 + 1
    assert peaks[330] - peaks[100] < 6, peaks

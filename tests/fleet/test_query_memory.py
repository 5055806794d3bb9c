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
from tests.fleet.peaks import exported, peak_mib  # noqa: E402


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
    files it reads (300k files' extents are about 25 MiB in DuckDB) fails."""
    peaks: dict[str, dict[int, float]] = {"files_by_size": {}, "report": {}}
    for files in (50_000, 300_000):
        out = exported(tmp_path, files, compacted=True)
        peak, shown = peak_mib(["fleet", str(out), "--table", "files_by_size", "--format", "json"])
        assert shown, files
        peaks["files_by_size"][files] = peak
        report = tmp_path / f"r{files}.html"
        peaks["report"][files] = peak_mib(["fleet", "report", str(out), "-o", str(report)])[0]
    for p in peaks.values():
        assert p[300_000] - p[50_000] < 8, peaks

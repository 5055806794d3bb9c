"""The streamed fleet tables print the bytes that json.dumps, csv.DictWriter and the CLI's
echo_table print for the same rows held whole."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from fsage.cli.common import echo_table
from fsage.fleet import output
from fsage.fleet.query import CHUNK

ROWS = [
    {"host": "h\u00e9", "fs": 'a"b\\c', "snapshot_id": 1, "taken_at": "2025-01-01T00:00:00+00:00",
     "layout_score": 0.1 + 0.2, "free_fraction": None},
    {"host": "h", "fs": "x\ny\x1b[31m", "snapshot_id": 2**40, "taken_at": None,
     "layout_score": float("nan"), "free_fraction": float("inf")},
    {"host": "h", "fs": "\U0001f600", "snapshot_id": -3, "taken_at": "t",
     "layout_score": 1e-300, "free_fraction": True},
]  # fmt: skip


def _streams(tables: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {k: iter(v) for k, v in tables.items()}


@pytest.mark.parametrize("n", [0, 1, 3, CHUNK + 5])
def test_json_csv_and_text_are_those_of_the_whole_rows(
    n: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [dict(ROWS[i % 3], snapshot_id=i) for i in range(n)]
    tables = {"trend": rows, "outliers": []}
    buf = io.StringIO()
    output._json(_streams(tables), buf)
    assert buf.getvalue() == json.dumps(tables, indent=2, default=str) + "\n"
    buf = io.StringIO()
    output._csv(iter(rows), buf)
    want = io.StringIO()
    if rows:
        w = csv.DictWriter(want, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    assert buf.getvalue() == want.getvalue()
    buf = io.StringIO()
    output._text(_streams({"trend": rows}), buf, tmp_path)
    _, cols = output.TEXT_COLUMNS["trend"]
    print("layout score over time:")
    if rows:
        echo_table(cols, [[r[c] for c in cols] for r in rows])
    else:
        print("  (none)")
    assert buf.getvalue() == capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # the cells' file is gone


@pytest.mark.parametrize("batch", [1, 7, 1 << 20])
def test_the_trend_in_batches_is_every_row_in_order(
    batch: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trend sorted a batch of file systems at a time holds every metrics row of the
    dataset once, by host, file system and snapshot, as pyarrow reads them from the files."""
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("duckdb")
    from fsage.db.store import Store
    from fsage.fleet import query
    from fsage.fleet.export import export_parquet
    from fsage.fleet.synth import synthetic_history

    ds = tmp_path / "ds"
    for host, names in {"h2": ("b", "a"), "h1": ("z", "a", "m")}.items():
        db = tmp_path / f"{host}.db"
        with Store.open(db, create=True) as store:
            for i, name in enumerate(names):
                synthetic_history(store, name, files=40, snapshots=3 + i, seed=i + 1)
        export_parquet(db, ds, host=host)
    want = []
    for p in sorted((ds / "metrics").rglob("*.parquet")):
        for r in pq.read_table(p).to_pylist():
            want.append((r["host"], r["fs"], r["snapshot_id"], r["layout_score"]))
    want.sort(key=lambda r: r[:3])
    monkeypatch.setattr(query, "TREND_BATCH_ROWS", batch)
    with query.opened(ds) as con:
        got = [(r["host"], r["fs"], r["snapshot_id"], r["layout_score"])
               for r in query.trend_rows(con)]  # fmt: skip
    assert got == want and len({r[:2] for r in got}) == 5


def test_many_uncompacted_files_bring_one_line_to_compact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset of many per-partition files: `fsage fleet` and `fsage fleet report` say in one
    line how many and how to compact them, the tables unchanged; compacted, nothing is said."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("duckdb")
    from click.testing import CliRunner

    from fsage.cli import main
    from fsage.db.store import Store
    from fsage.fleet import query
    from fsage.fleet.export import export_parquet
    from fsage.fleet.synth import synthetic_history

    db, ds = tmp_path / "h.db", tmp_path / "ds"
    with Store.open(db, create=True) as store:
        for name in ("a", "b"):
            synthetic_history(store, name, files=30, snapshots=2, seed=3)
    export_parquet(db, ds, host="h")
    files = len(list(ds.rglob("*.parquet")))
    runner = CliRunner()
    quiet = runner.invoke(main, ["fleet", str(ds), "--format", "json"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    monkeypatch.setattr(query, "ADVISE_COMPACT_FILES", files)
    told = runner.invoke(main, ["fleet", str(ds), "--format", "json"])
    assert told.exit_code == 0 and told.stdout == quiet.stdout
    (line,) = told.stderr.splitlines()
    assert line.startswith("fsage: warning: ") and f"{files:,} files not compacted" in line
    assert f"fsage fleet compact {ds}" in line
    report = runner.invoke(main, ["fleet", "report", str(ds), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0 and len(report.stderr.splitlines()) == 1
    assert "Damaged files" not in (tmp_path / "r.html").read_text()
    assert runner.invoke(main, ["fleet", "compact", str(ds)]).exit_code == 0
    after = runner.invoke(main, ["fleet", str(ds), "--format", "json"])
    assert after.exit_code == 0 and after.stderr == ""

"""fsage fleet compact: the same answers before and after, increments beside the compacted
files, re-collected sources not counted twice, and an interrupted compaction leaves a dataset
that reads as before (and the next run finishes it)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from fsage.db.store import Store
from fsage.fleet import TABLES
from fsage.fleet import compact as compact_mod
from fsage.fleet.compact import CompactError, compact
from fsage.fleet.dataset import MANIFEST, load_manifest
from fsage.fleet.export import export_parquet
from fsage.fleet.query import ALL_TABLES, connect, files_by_size, fleet_tables
from fsage.fleet.synth import synthetic_history
from tests.fleet.test_export import cli

HISTORIES = {  # host -> (fs, files, snapshots, seed)
    "h1": [("root", 250, 4, 31), ("home", 300, 3, 32)],
    "h2": [("root", 200, 3, 33)],
}


def make_dbs(tmp: Path, extra: int = 0) -> dict[str, Path]:
    """One database per host; ``extra`` more nights of every history when given again."""
    import datetime as dt

    dbs = {}
    for host, hist in HISTORIES.items():
        db = tmp / f"{host}.db"
        with Store.open(db, create=True) as store:
            for name, files, nights, seed in hist:
                synthetic_history(store, name, files=files, snapshots=nights + extra, seed=seed,
                                  churn=0.05, skip=nights if extra else 0,
                                  interval=dt.timedelta(days=4))  # fmt: skip
        dbs[host] = db
    return dbs


def export_all(dbs: dict[str, Path], ds: Path) -> None:
    for host, db in dbs.items():
        export_parquet(db, ds, host=host)


def raw(ds: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (export timings left out: they differ between runs)."""
    con = connect(ds)
    out = {}
    for t in TABLES:
        cols = "*"
        if t in ("snapshots", "metrics"):  # times as numbers (no pytz needed)
            drop = " EXCLUDE (seconds)" if t == "snapshots" else ""
            cols = f"*{drop} REPLACE (epoch_us(taken_at) AS taken_at)"
        out[t] = con.execute(f"SELECT {cols} FROM {t} ORDER BY ALL").fetchall()
    out["files_by_size"] = [tuple(r.values()) for r in files_by_size(con, every_snapshot=True)]
    con.close()
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def answers(ds: Path) -> dict[str, Any]:
    return {"tables": fleet_tables(ds, ALL_TABLES, threshold=0.5), "raw": raw(ds)}


def files_under(ds: Path) -> dict[str, int]:
    return {str(p.relative_to(ds)): p.stat().st_mtime_ns for p in ds.rglob("*") if p.is_file()}


def test_compaction_keeps_every_answer_and_merges_the_files(tmp_path: Path) -> None:
    dbs = make_dbs(tmp_path)
    ds = tmp_path / "ds"
    export_all(dbs, ds)
    before = answers(ds)
    assert len(before["raw"]["snapshots"]) == 10 and before["tables"]["size"]
    assert len(list((ds / "metrics").rglob("*.parquet"))) == 3
    s = compact(ds)
    assert s.generation == 1 and s.filesystems == 3 and set(s.tables) == set(TABLES)
    assert same(answers(ds), before)
    for t in TABLES:  # one sorted file per table, nothing left in the partitions
        (only,) = list((ds / t).rglob("*.parquet"))
        assert only.parent.name == "compacted"
    manifest = load_manifest(ds)
    assert manifest.watermark("h1", "home") == 7 and manifest.watermark("h2", "root") == 3
    con = connect(ds)
    keys = con.execute("SELECT host, fs, snapshot_id FROM metrics").fetchall()
    assert keys == sorted(keys)
    # idempotent: nothing new, nothing written
    files = files_under(ds)
    again = compact(ds)
    assert not again.changed and again.generation == 1 and files_under(ds) == files
    assert "nothing to compact" in again.line()


def test_a_run_in_many_files_reads_and_compacts_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose file versions fill several files (a large file system's, made here by
    row groups of 16 rows, 3 a file): its pieces are named after the run, in order, none
    empty; the dataset answers as one file a run does, after the next run (which reads the
    open versions from every piece) and after a compaction."""
    from fsage.fleet import export as export_mod
    from fsage.fleet import export_stream
    from fsage.fleet.dataset import run_range

    pq = pytest.importorskip("pyarrow.parquet")
    dbs = make_dbs(tmp_path)
    whole, ds = tmp_path / "whole", tmp_path / "ds"
    export_all(dbs, whole)
    with monkeypatch.context() as m:
        m.setattr(export_mod, "FILES_CHUNK", 16)
        m.setattr(export_stream, "FILE_GROUPS", 3)
        export_all(dbs, ds)
        pieces = sorted((ds / "files" / "host=h1" / "fs=home").glob("*.parquet"))
        assert len(pieces) > 4
        (one,) = (whole / "files" / "host=h1" / "fs=home").glob("*.parquet")
        assert pieces[0].name == one.name and {run_range(p) for p in pieces} == {run_range(one)}
        assert [p.name[-13:] for p in pieces[1:4]] == ["_0001.parquet", "_0002.parquet",
                                                       "_0003.parquet"]  # fmt: skip
        groups = [pq.ParquetFile(p).metadata.num_row_groups for p in pieces]
        assert max(groups) == 3 and min(groups) >= 1, groups
        assert same(answers(ds), answers(whole))
        make_dbs(tmp_path, extra=2)  # two more nights: the next run's open versions
        export_all(dbs, ds)
    export_all(dbs, whole)
    want = answers(whole)
    assert same(answers(ds), want)
    compact(ds)
    assert same(answers(ds), want)


def test_a_compaction_in_many_files_answers_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's rows of one compaction fill several files (a large fleet's, made here by
    row groups of 16 rows, 2 a file): named after the generation, in order, all in the
    manifest, the same answers; the next compaction adds beside them (they count as one
    generation, not as many files) and still answers as one export of everything."""
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setattr(compact_mod, "ROW_GROUPS", {"files": 16, "snapshots": 16, "metrics": 16})
    monkeypatch.setattr(compact_mod, "FILE_GROUPS", 2)
    dbs = make_dbs(tmp_path)
    ds, whole = tmp_path / "ds", tmp_path / "whole"
    export_all(dbs, ds)
    before = answers(ds)
    s = compact(ds)
    pieces = sorted(p.name for p in (ds / "files" / "compacted").glob("*.parquet"))
    assert len(pieces) > 3 and pieces[:2] == ["c000001.parquet", "c000001_0001.parquet"]
    assert s.tables["files"]["output_files"] == len(pieces)
    assert load_manifest(ds).tables["files"] == [f"compacted/{n}" for n in pieces]
    groups = [pq.ParquetFile(ds / "files" / "compacted" / n).metadata.num_row_groups
              for n in pieces]  # fmt: skip
    assert max(groups) == 2 and min(groups) >= 1, groups
    assert same(answers(ds), before)
    make_dbs(tmp_path, extra=2)
    export_all(dbs, ds)
    s2 = compact(ds)
    assert s2.tables["files"]["input_files"] == 3  # the new runs only: nothing rewritten
    export_all(dbs, whole)
    assert same(answers(ds), answers(whole))
    files = load_manifest(ds).tables["files"]
    assert files[: len(pieces)] == [f"compacted/{n}" for n in pieces] and len(files) > len(pieces)


def test_export_after_compaction_adds_beside_it_and_recompacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compact_mod, "MAX_LARGE_GENERATIONS", 1)  # the second run rewrites them too
    dbs = make_dbs(tmp_path)
    ds, whole = tmp_path / "ds", tmp_path / "whole"
    export_all(dbs, ds)
    compact(ds)
    make_dbs(tmp_path, extra=2)  # two more nights of every file system
    s = export_parquet(dbs["h1"], ds, host="h1")
    assert [(f.fs, f.new_snapshots, f.first) for f in s.filesystems] == [
        ("home", 2, 10),
        ("root", 2, 8),
    ]
    export_parquet(dbs["h2"], ds, host="h2")
    fresh = [p for p in ds.rglob("*.parquet") if p.parent.name != "compacted"]
    assert len(fresh) == 3 * len(TABLES)  # one partition file per table and file system
    export_all(dbs, whole)
    want = answers(whole)
    assert same(answers(ds), want)  # compacted + new rows == one export of everything
    assert export_parquet(dbs["h1"], ds, host="h1").new_snapshots == 0
    s2 = compact(ds)
    assert s2.generation == 2 and s2.removed >= len(fresh) + len(TABLES)
    assert same(answers(ds), want)
    for t in TABLES:
        assert [p.name for p in (ds / t).rglob("*.parquet")] == ["c000002.parquet"], t
    assert load_manifest(ds).watermark("h1", "root") == 9


def test_recollected_sources_are_not_counted_twice(tmp_path: Path) -> None:
    """rsync brings back the hosts' files after a compaction removed them, or they were kept
    (--keep-sources); only rows newer than the compaction count."""
    dbs = make_dbs(tmp_path)
    hosts = {h: tmp_path / f"export-{h}" for h in dbs}
    for h, db in dbs.items():
        export_parquet(db, hosts[h], host=h)
    central = tmp_path / "central"

    def collect() -> None:  # rsync -a without --delete: copies files missing or changed
        for d in hosts.values():
            shutil.copytree(d, central, dirs_exist_ok=True, copy_function=shutil.copy2,
                            ignore=shutil.ignore_patterns(".*"))  # fmt: skip

    collect()
    before = answers(central)
    compact(central)
    collect()  # the removed files come back
    assert same(answers(central), before)
    make_dbs(tmp_path, extra=1)
    for h, db in dbs.items():
        export_parquet(db, hosts[h], host=h)
    collect()
    whole = tmp_path / "whole"
    export_all(dbs, whole)
    want = answers(whole)
    assert same(answers(central), want)
    sources = sorted(p for p in central.rglob("*.parquet") if p.parent.name != "compacted")
    compact(central, keep_sources=True)
    # the large tables got a second compacted file (the new runs), the small ones were rewritten
    assert len(list((central / "files" / "compacted").glob("*.parquet"))) == 2
    assert len(list((central / "metrics" / "compacted").glob("*.parquet"))) == 1
    assert sorted(p for p in central.rglob("*.parquet") if p.parent.name != "compacted") == sources
    assert same(answers(central), want)
    collect()  # unchanged kept sources: skipped without being read
    assert same(answers(central), want)


@pytest.mark.parametrize("stage", ["before_commit", "after_commit"])
def test_interrupted_compaction_leaves_a_readable_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    dbs = make_dbs(tmp_path)
    ds = tmp_path / "ds"
    export_all(dbs, ds)
    before = answers(ds)

    def boom(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    target = "_commit" if stage == "before_commit" else "_clean"
    monkeypatch.setattr(compact_mod, target, boom)
    with pytest.raises(KeyboardInterrupt):
        compact(ds)
    monkeypatch.undo()
    # data files written (and, after the commit, a manifest); readers see the same rows
    assert list(ds.glob("*/compacted/c000001.parquet"))
    assert (ds / MANIFEST).exists() == (stage == "after_commit")
    assert same(answers(ds), before)
    s = compact(ds)  # the next run finishes the job
    assert same(answers(ds), before)
    assert not [p for p in ds.rglob("*.parquet") if p.parent.name != "compacted"]
    assert not list(ds.rglob(".*.tmp")) and not list(ds.glob(".compact-tmp-*"))
    assert s.generation == 1 and s.changed == (stage == "before_commit")
    assert compact(ds).changed is False


def test_cli_compact(tmp_path: Path) -> None:
    dbs = make_dbs(tmp_path)
    ds = tmp_path / "ds"
    r = cli("fleet", "compact", ds, ok=False)
    assert r.returncode != 0 and r.stderr.startswith("fsage: error:")
    export_all(dbs, ds)
    out = json.loads(cli("fleet", "compact", ds, "--json").stdout)
    assert out["generation"] == 1 and out["tables"]["metrics"]["rows"] == 10
    assert "nothing to compact" in cli("fleet", "compact", ds).stdout
    (ds / MANIFEST).write_text("{")
    r = cli("fleet", ds, ok=False)
    assert r.returncode != 0 and "manifest" in r.stderr and "Traceback" not in r.stderr
    r = cli("fleet", "compact", ds, ok=False)
    assert r.returncode != 0 and "manifest" in r.stderr
    with pytest.raises(CompactError):
        compact(ds)


def _file_order_keys(path: Path, table: str) -> list[tuple[Any, ...]]:
    import pyarrow.parquet as pq

    cols = ["host", "fs", *compact_mod.ORDER[table].split(", ")]
    t = pq.read_table(path, columns=cols)
    return list(zip(*(t.column(c).to_pylist() for c in cols), strict=True))


@pytest.mark.parametrize("pieces", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_large_tables_come_out_sorted_read_in_file_order_or_not(
    tmp_path: Path, shuffle: bool, pieces: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The large tables are streamed in file order when their runs are sorted (no sort in
    DuckDB); a run whose rows are not is noticed and the table sorted instead. ``pieces``:
    a row group of 16 rows a file, so that the disorder is found after some files are
    written: none of them is left behind."""
    import pyarrow.parquet as pq

    if pieces:
        monkeypatch.setattr(compact_mod, "ROW_GROUP", 16)
        monkeypatch.setattr(compact_mod, "ROW_GROUPS", {})
        monkeypatch.setattr(compact_mod, "FILE_GROUPS", 1)
        monkeypatch.setattr(compact_mod, "BATCH", 16)
    dbs = make_dbs(tmp_path)
    ds = tmp_path / "ds"
    export_all(dbs, ds)
    if shuffle:  # one run of free extents written backwards
        run = sorted((ds / "free_extents").rglob("s*.parquet"))[-1]
        t = pq.read_table(run)
        pq.write_table(t.take(list(range(t.num_rows - 1, -1, -1))), run)
    before = answers(ds)
    compact(ds)
    assert same(answers(ds), before)
    manifest = load_manifest(ds)
    for table in ("files", "file_ends", "free_extents"):
        outs = sorted((ds / table / "compacted").glob("*.parquet"))
        assert [f"compacted/{o.name}" for o in outs] == manifest.tables[table]
        assert (len(outs) > 2) == pieces
        keys = [k for out in outs for k in _file_order_keys(out, table)]
        assert keys and keys == sorted(keys)
    assert not [p for p in ds.rglob("*") if p.name.endswith(".tmp")]

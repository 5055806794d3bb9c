"""fsage export and fsage fleet: the dataset, its increments, and the figures DuckDB computes
from it, checked against `fsage analyze` on real ext4 images (mke2fs -d, debugfs churn)."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")

from fsage.db.store import Store  # noqa: E402
from fsage.fleet import LARGE_TABLES, METADATA_KEY, SCHEMA_VERSION, TABLES  # noqa: E402
from fsage.fleet.export import export_parquet  # noqa: E402
from fsage.fleet.query import connect, files_by_size, fleet_tables  # noqa: E402
from fsage.fleet.synth import synthetic_history  # noqa: E402
from tests.analyzer.images import make_image, need  # noqa: E402


def fsage(
    env: dict[str, str], *args: str | Path, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "fsage", *map(str, args)], env=env, capture_output=True, text=True
    )
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def cli(*args: str | Path, ok: bool = True) -> Any:
    """The command in process (CliRunner: same parsing and error handling as the console)."""
    from click.testing import CliRunner

    from fsage.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert r.exit_code == 0, (r.stderr, r.exception)
    r.returncode = r.exit_code
    return r


def analyze_by_size(env: dict[str, str], db: Path, snap: int) -> list[dict[str, Any]]:
    out = json.loads(
        fsage(env, "analyze", "--db", db, "--snapshot", snap, "--format", "json").stdout
    )
    (a,) = out["snapshots"]
    return [
        {"max_bytes": r["max_bytes"], "label": r["label"], "files": r["files"],
         "blocks": r["blocks"], "layout_score": r["layout_score"]}
        for r in a["by_size"]
    ]  # fmt: skip


def sql_by_size(rows: list[dict[str, Any]], snap: int) -> list[dict[str, Any]]:
    return [
        {"max_bytes": 1 << r["bucket"], "label": r["label"], "files": r["files"],
         "blocks": r["blocks"], "layout_score": r["layout_score"]}
        for r in rows
        if r["snapshot_id"] == snap
    ]  # fmt: skip


def churn(workdir: Path, img: Path, seed: int, files: int) -> None:
    """debugfs: delete every third file, write new ones into the holes (they fragment)."""
    rnd = random.Random(seed)
    cmds = [f"rm /d{i % 7}/e{i % 3}/f{i}" for i in range(seed % 3, files, 3)]
    for j in range(files // 10):
        part = workdir / f"blob{seed}_{j}"
        part.write_bytes(rnd.randbytes(rnd.randint(1, 200_000)))
        cmds.append(f"write {part} /d{j % 7}/new{seed}_{j}")
    script = workdir / f"cmds{seed}"
    script.write_text("\n".join(cmds) + "\n")
    subprocess.run(["debugfs", "-w", "-f", str(script), str(img)], check=True, capture_output=True)


@pytest.mark.slow
def test_sql_layout_score_from_extents_equals_analyze_bucket_by_bucket(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    need("mke2fs", "debugfs")
    img = make_image(tmp_path, seed=7, block_size=1024, size_mb=24, files=300,
                     max_bytes=60_000, churn=False)  # fmt: skip
    db = tmp_path / "real.db"
    ds = tmp_path / "ds"
    fsage(fsage_env, "snapshot", img, "--name", "real", "--db", db)
    churn(tmp_path, img, 1, 300)
    fsage(fsage_env, "snapshot", img, "--name", "real", "--db", db)
    fsage(fsage_env, "export", "--db", db, "--host", "h1", ds)
    churn(tmp_path, img, 2, 300)
    fsage(fsage_env, "snapshot", img, "--name", "real", "--db", db)
    fsage(fsage_env, "export", "--db", db, "--host", "h1", ds)  # the third, incrementally
    con = connect(ds)
    rows = files_by_size(con, every_snapshot=True)
    assert {r["snapshot_id"] for r in rows} == {1, 2, 3}
    scores = set()
    for snap in (1, 2, 3):
        want = analyze_by_size(fsage_env, db, snap)
        assert sql_by_size(rows, snap) == want, snap
        scores.add(tuple(r["layout_score"] for r in want))
        # the exported per-bucket metrics agree too
        mb = con.execute(
            "SELECT max_blocks, files, blocks, layout_score FROM size_buckets"
            " WHERE snapshot_id = ? ORDER BY bucket",
            [snap],
        ).fetchall()
        assert [(r["max_bytes"] // 1024, r["files"], r["blocks"], r["layout_score"])
                for r in want] == mb  # fmt: skip
    assert len(scores) == 3  # the churn changed the layout
    assert any(s < 1.0 for r in rows for s in [r["layout_score"]])
    # compacted, the dataset gives the same buckets (and so still equals fsage analyze)
    from fsage.fleet.compact import compact

    con.close()
    assert compact(ds).changed
    assert files_by_size(connect(ds), every_snapshot=True) == rows


def test_incremental_export_adds_only_new_snapshots(tmp_path: Path) -> None:
    db, ds, whole = tmp_path / "h.db", tmp_path / "ds", tmp_path / "whole"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "home", files=800, snapshots=4, seed=3, churn=0.05)
        synthetic_history(store, "var", files=300, snapshots=2, seed=4, churn=0.1)
    first = export_parquet(db, ds, host="h1")
    assert first.new_snapshots == 6
    before = {p: p.stat().st_mtime_ns for p in ds.rglob("s*.parquet")}
    assert len(before) == 6  # files, file_ends, free_extents for two file systems
    with Store.open(db) as store:
        synthetic_history(store, "home", files=800, snapshots=7, seed=3, churn=0.05, skip=4)
    again = export_parquet(db, ds, host="h1")
    assert [(f.fs, f.new_snapshots, f.first, f.last) for f in again.filesystems] == [
        ("home", 3, 7, 9),
        ("var", 0, None, None),
    ]
    assert {p: p.stat().st_mtime_ns for p in before} == before  # earlier files untouched
    assert len(list(ds.rglob("s*.parquet"))) == 9
    assert export_parquet(db, ds, host="h1").new_snapshots == 0
    # two increments describe the same history as one export of everything
    export_parquet(db, whole, host="h1")
    inc, full = connect(ds), connect(whole)
    assert files_by_size(inc, every_snapshot=True) == files_by_size(full, every_snapshot=True)
    for table in ("snapshots", "metrics", "size_buckets", "free_buckets", "free_extents"):
        q = f"SELECT * FROM {table} ORDER BY ALL"
        if table in ("snapshots", "metrics"):  # the time as a number; no export timings
            drop = "EXCLUDE (seconds)" if table == "snapshots" else ""
            q = f"SELECT * {drop} REPLACE (epoch_us(taken_at) AS taken_at) FROM {table}"
            q += " ORDER BY ALL"
        assert inc.execute(q).fetchall() == full.execute(q).fetchall(), table
    # versions: every snapshot's live files are the same set in both
    live = """SELECT w.snapshot_id, v.ino, v.digest FROM files v JOIN snapshots w
              ON v.first_snapshot <= w.snapshot_id AND v.fs = w.fs
              ANTI JOIN file_ends e ON e.fs = v.fs AND e.ino = v.ino
              AND e.first_snapshot = v.first_snapshot AND e.last_snapshot < w.snapshot_id
              ORDER BY ALL"""
    assert inc.execute(live).fetchall() == full.execute(live).fetchall()
    with Store.open(db) as store:
        layout = store.load_layout(9)
    n9 = inc.execute(f"SELECT count(*) FROM ({live}) WHERE snapshot_id = 9").fetchone()
    assert n9 == (len(layout.files),)


def test_dataset_metadata_and_schema_version(tmp_path: Path) -> None:
    db, ds = tmp_path / "h.db", tmp_path / "ds"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "a b/c", files=200, snapshots=2, seed=5)
    export_parquet(db, ds, host="host-1")
    for table in TABLES:
        (part,) = list((ds / table).rglob("*.parquet"))
        assert part.parent.name == "fs=a%20b%2Fc" and part.parent.parent.name == "host=host-1"
        meta = json.loads(pq.read_schema(part).metadata[METADATA_KEY])
        assert meta == {"schema_version": SCHEMA_VERSION, "table": table}
        if table in LARGE_TABLES:  # a dictionary only where values repeat (host and fs)
            md = pq.ParquetFile(part).metadata
            dictionary = {
                md.schema.column(i).path
                for g in range(md.num_row_groups)
                for i in range(md.num_columns)
                if md.row_group(g).column(i).has_dictionary_page
            }
            assert dictionary == ({"host", "fs"} if md.num_rows else set()), table
    con = connect(ds)
    assert con.execute("SELECT DISTINCT host, fs FROM files").fetchall() == [("host-1", "a b/c")]
    # a newer schema is refused with one clear error
    part = next((ds / "metrics").rglob("*.parquet"))
    t = pq.read_table(part)
    newer = {METADATA_KEY: json.dumps({"schema_version": SCHEMA_VERSION + 1}).encode()}
    pq.write_table(t.replace_schema_metadata(newer), part)
    from fsage.fleet.query import FleetError

    with pytest.raises(FleetError, match="schema version"):
        fleet_tables(ds)


def test_cli_errors_and_outputs(tmp_path: Path) -> None:
    db, ds = tmp_path / "h.db", tmp_path / "ds"
    r = cli("export", "--db", db, ds, ok=False)
    assert r.returncode != 0 and r.stderr.startswith("fsage: error:") and not ds.exists()
    assert "Traceback" not in r.stderr
    r = cli("fleet", tmp_path, ok=False)
    assert r.returncode != 0 and r.stderr.startswith("fsage: error: no fsage export")
    start = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    with Store.open(db, create=True) as store:
        for i, name in enumerate(("a", "b", "c")):
            synthetic_history(store, name, files=300, snapshots=3, seed=10 + i, start=start,
                              interval=dt.timedelta(days=5))  # fmt: skip
    cli("export", "--db", db, "--host", "h", "--fs", "a", ds)
    r = cli("fleet", ds, "--format", "json")
    assert [f["fs"] for f in json.loads(r.stdout)["filesystems"]] == ["a"]
    cli("export", "--db", db, "--host", "h", ds)
    out = json.loads(cli("fleet", "summary", ds, "--format", "json").stdout)
    fss = out["filesystems"]
    assert sorted(f["fs"] for f in fss) == ["a", "b", "c"]
    rates = [f["change_per_month"] for f in fss]
    assert all(r is not None for r in rates) and rates == sorted(rates)
    assert all(f["span_days"] == 10 for f in fss)
    csv_out = cli("fleet", ds, "--format", "csv", "--table", "size").stdout
    assert csv_out.splitlines()[0].startswith("bucket,min_bytes,max_bytes,label,")
    text = cli("fleet", ds).stdout
    assert "fastest decline first" in text and "outliers" in text
    html = tmp_path / "fleet.html"
    r = cli("fleet", "report", ds, "-o", html)
    body = html.read_text()
    # the trend figure draws losses of 0.001 or more (3 snapshots: no scatter to exceed)
    drawn = any(f["total_change"] <= -0.001 for f in fss)
    assert "fsage fleet report" in body and body.count("class='plot'") == 3 + drawn


def test_fleet_buckets_are_in_bytes_across_block_sizes(
    tmp_path: Path,
) -> None:
    """A fleet of file systems of 1 KiB and 4 KiB blocks: a size or free-extent bucket holds
    the same bytes on both, and the report labels buckets in bytes."""
    from fsage.analyzer.freespace import free_extent_label
    from fsage.text import size_range

    db, ds = tmp_path / "h.db", tmp_path / "ds"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "four", files=400, snapshots=2, seed=3)
        synthetic_history(store, "one", files=400, snapshots=2, seed=4, block_size=1024)
    export_parquet(db, ds, host="h")
    t = fleet_tables(ds, ("size", "free"))
    # what each file system's latest snapshot has, by bucket in bytes, from analyze
    files: dict[int, int] = {}
    free: dict[int, int] = {}
    for name in ("four", "one"):
        out = cli("analyze", "--db", db, "--fs", name, "--format", "json").stdout
        (a,) = json.loads(out)["snapshots"]
        for r in a["by_size"]:
            k = (r["max_bytes"] - 1).bit_length()  # over 2**(k-1), up to 2**k bytes
            files[k] = files.get(k, 0) + r["files"]
        for r in a["free_extents"]:
            free[r["min_bytes"]] = free.get(r["min_bytes"], 0) + r["blocks"] * a["block_size"]
    # (on 4 KiB blocks the first bucket, one block, holds every file up to 4 KiB: it shares
    # the fleet's bucket 12 with the files of 2 to 4 KiB on 1 KiB blocks)
    assert {r["bucket"]: r["files"] for r in t["size"]} == files
    assert all(r["max_bytes"] == 1 << r["bucket"] for r in t["size"])
    assert all(r["min_bytes"] == (1 << (r["bucket"] - 1)) + 1 for r in t["size"])
    labels = [r["label"] for r in t["size"]]
    assert labels == [size_range(r["min_bytes"], r["max_bytes"], 1) for r in t["size"]]
    assert len(set(labels)) == len(labels)
    got_free = {r["min_bytes"]: r["free_bytes"] for r in t["free"]}
    assert got_free == free
    assert math.isclose(sum(r["share_of_free_space"] for r in t["free"]), 1.0)
    html = tmp_path / "fleet.html"
    cli("fleet", "report", ds, "-o", html)
    body = html.read_text()
    assert "(blocks)" not in body
    for label in labels:
        assert json.dumps(label) in body
    for r in t["free"]:
        assert r["label"] == free_extent_label(r["min_bytes"], 2 * r["min_bytes"] - 1, 1)
        assert json.dumps(r["label"]).replace("<", "\\u003c") in body  # as the page writes it

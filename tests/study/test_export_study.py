"""A study's rows in the Parquet export: every stored result comes back, read with pyarrow and
compared with the database's rows read with sqlite3 (not through fsage)."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fsage.db.store import Store
from fsage.fleet.export import export_parquet
from fsage.study.store import create_study, save_result

pq = pytest.importorskip("pyarrow.parquet")


def _metrics(rng: random.Random, step: int) -> dict[str, Any]:
    aged = [rng.uniform(0.5, 2.0) for _ in range(6)]
    clean = [rng.uniform(0.5, 2.0) for _ in range(6)]
    return {
        "snapshot_id": None,
        "layout_score": rng.random(),
        "blocks_total": 262144,
        "blocks_free": rng.randrange(262144),
        "block_size": 4096,
        "largest_free_extent": rng.randrange(1, 32768),
        "locality": {"dynamic_layout_score_path": rng.random()},
        "modeled": {"hdd": {"aged_seconds": rng.random(), "ratio": 1 + rng.random()}},
        "age": {"nospace": rng.randrange(3)},
        "scan": {
            "aged_values": aged,
            "clean_values": clean,
            "aged_seconds": sorted(aged)[3],
            "clean_seconds": sorted(clean)[3],
            "ratio": rng.uniform(0.5, 3),
            "verdict": rng.choice(["slower", "same", "inconclusive"]),
            "rounds": 6,
            "bytes": rng.randrange(1, 2**30),
            "files": rng.randrange(1, 5000),
            "trace": {"score": rng.random()},
            "aged_s_per_gib": rng.random(),
        },
        "seconds": {"scan": 1.0 * step},
    }


def _read(out: Path) -> list[dict[str, Any]]:
    files = sorted((out / "study_results").glob("host=*/study=*/part.parquet"))
    assert files
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def test_study_rows_round_trip_through_the_export(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    rng = random.Random(7)
    with Store.open(db, create=True) as store:
        params = {"workload": "git:/r", "size": 2**30, "steps": 3, "seed": 5}
        sid = create_study(store, tmp_path / "out", params)
        for step in (1, 2, 3):
            for fs in ("ext4", "xfs"):
                save_result(store, sid, step, fs, _metrics(rng, step))
        save_result(store, sid, 3, "lfs", {"error": "measuring: mount failed"})
    out = tmp_path / "ds"
    export_parquet(db, out, host="h1")
    got = _read(out)

    con = sqlite3.connect(db)
    want = con.execute(
        "SELECT step, fs, layout_score, dynamic_score, aged_seconds, clean_seconds,"
        " aged_clean_ratio, blocks_free, metrics FROM study_results WHERE study_id = ?",
        (sid,),
    ).fetchall()
    con.close()
    assert len(got) == len(want) == 7
    by_key = {(r["step"], r["fs"]): r for r in got}
    for step, fs, ls, dyn, aged, clean, ratio, free, metrics in want:
        r = by_key[(step, fs)]
        assert r["host"] == "h1" and r["study_id"] == sid and r["workload"] == "git:/r"
        assert r["size"] == 2**30 and r["seed"] == 5
        stored = json.loads(metrics)
        assert json.loads(r["metrics"]) == json.loads(json.dumps(stored))
        if "error" in stored:
            assert r["error"] == stored["error"] and r["layout_score"] is None
            continue
        assert r["error"] is None
        assert r["layout_score"] == pytest.approx(ls)
        assert r["dynamic_score"] == pytest.approx(dyn)
        assert r["aged_seconds"] == pytest.approx(aged)
        assert r["clean_seconds"] == pytest.approx(clean)
        assert r["ratio"] == pytest.approx(ratio)
        assert r["free_share"] == pytest.approx(free / 262144)
        assert r["largest_free_mib"] == pytest.approx(stored["largest_free_extent"] * 4096 / 2**20)
        assert r["files"] == stored["scan"]["files"]
        assert r["gib"] == pytest.approx(stored["scan"]["bytes"] / 2**30)
        assert r["verdict"] == stored["scan"]["verdict"] and r["rounds"] == 6

    # a resumed study's new rows replace the partition on the next export
    with Store.open(db) as store:
        save_result(store, sid, 4, "ext4", _metrics(rng, 4))
    export_parquet(db, out, host="h1")
    again = _read(out)
    assert len(again) == 8
    assert sorted((r["step"], r["fs"]) for r in again) == sorted([*by_key, (4, "ext4")])

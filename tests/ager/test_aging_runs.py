"""Aging runs recorded in the database (table aging_runs) and `fsage runs`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age, aging_runs
from fsage.cli import main
from fsage.db.store import Store
from fsage.errors import FsageError
from fsage.lfs.fs import mkfs
from fsage.workload import Op, WorkloadHeader, write_workload


def _ops_file(path: Path, ops: list[Op]) -> Path:
    write_workload(path, WorkloadHeader(generator="test", params={}, seed=0), ops)
    return path


def test_directory_run_is_recorded(tmp_path: Path) -> None:
    target = tmp_path / "tree"
    target.mkdir()
    ops = [
        Op("mkdir", "a"),
        Op("create", "a/x", size=5000),
        Op("create", "a/y", size=70000),
        Op("snapshot", "", label="mid"),
        Op("append", "a/x", size=1000),
        Op("delete", "a/y"),
    ]
    wl = _ops_file(tmp_path / "w.jsonl", ops)
    db = tmp_path / "d.db"
    res = age(target, AgeOptions(ops_file=wl, db=db, name="tree"))
    assert res.finished and res.run_id == 1
    with Store.open(db) as store:
        runs = aging_runs(store)
        snaps = store.snapshots()
    assert len(runs) == 1
    r = runs[0]
    assert (r.id, r.fs, r.kind, r.status, r.target) == (1, "tree", "dir", "finished", str(target))
    assert (r.ops, r.bytes_written) == (6, 76000)
    assert [s.id for s in snaps] == res.snapshots == [1, 2, 3]
    assert (r.first_snap, r.last_snap) == (1, 3)
    assert [s.label for s in snaps] == ["start", "mid", "end"]
    assert r.params["workload"]["kind"] == "ops" and r.params["resumed_from"] == 0
    assert r.finished_at is not None and r.started_at <= r.finished_at
    # Not an LFS: no write cost, but the fullness of the target.
    assert "write_cost" not in r.metrics and r.metrics["nospace"] == 0
    assert 0.0 < r.utilization["fullness"] < 1.0


def test_failed_run_is_recorded_as_failed(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    wl = _ops_file(tmp_path / "w.jsonl", [Op("create", "f", size=10), Op("delete", "missing")])
    db = tmp_path / "d.db"
    with pytest.raises(FsageError):
        age(target, AgeOptions(ops_file=wl, db=db))
    with Store.open(db) as store:
        (r,) = aging_runs(store)
    assert r.status == "failed" and r.ops == 1 and r.bytes_written == 10
    assert r.finished_at is not None and "missing" in r.notes[0]


def test_lfs_run_records_write_cost_and_utilization(tmp_path: Path) -> None:
    img = tmp_path / "l.img"
    mkfs(img, segments=48, blocks_per_segment=32, block_size=4096, cleaning_policy="greedy")
    prof = get_preset("random-update").with_overrides(fill=0.6, update_factor=3.0)
    db = tmp_path / "l.db"
    res = age(img, AgeOptions(profile=prof, db=db, snapshot_every=1000, seed=2))
    assert res.finished and len(res.snapshots) >= 4  # the LFS was reopened for each
    with Store.open(db) as store:
        (r,) = aging_runs(store, kind="lfs")
        assert aging_runs(store, kind="dir") == []
    m, u, c = r.metrics, r.utilization, r.metrics["counters"]
    assert r.kind == "lfs" and r.status == "finished" and m["policy"] == "greedy"
    assert r.bytes_written == res.bytes_written > 0
    # Every octet the workload wrote went into a block written for new data: the counters
    # cover the whole run across the reopens of each snapshot.
    assert c["new_blocks"] * 4096 >= r.bytes_written
    assert c["clean_segs_read"] > 0  # random updates at 60% make the cleaner work
    # Seed 001 EQ 1-3 from the recorded counters (31 data blocks per 32-block segment).
    dps = m["data_blocks_per_segment"]
    assert dps == 31
    new = c["new_blocks"] / dps
    moved = c["clean_segs_read"] + c["holeplug_segs_read"] + c["clean_blocks_written"] / dps
    moved += c["holeplug_blocks"] / dps
    assert m["write_cost"] == pytest.approx((new + moved) / new)
    assert m["cleaner_overhead"] == pytest.approx(moved / new)
    seg = 31 * 4096
    assert m["transfer_inefficiency"] == pytest.approx((0.015 + seg / 5e6) / (seg / 5e6))
    assert m["disk"] == {"access_s": 0.015, "bandwidth_bps": 5e6}
    assert m["overall_write_cost"] > m["write_cost"]
    # Utilization against `fsage lfs info`, which reads the image on its own.
    shown = CliRunner().invoke(main, ["lfs", "info", str(img), "--format", "json"])
    info = json.loads(shown.output)
    assert u["live_blocks"] == info["utilization"]["live_blocks"]
    assert u["histogram"] == info["histogram"]
    assert sum(h["segments"] for h in u["histogram"]) == u["segments"] == 45
    assert u["fraction"] == pytest.approx(0.6, abs=0.03)
    # The part after the fill (one mkdir and one 3.4 MB create): seed 001 counts only that.
    a = m["after_fill"]
    assert a["from_op"] == 2
    ac = a["counters"]
    assert 0 < ac["new_blocks"] < c["new_blocks"]
    assert c["new_blocks"] - ac["new_blocks"] >= int(0.6 * 45 * 31) - 31  # the fill's blocks
    assert ac["clean_segs_read"] == c["clean_segs_read"]  # no cleaning while filling
    assert a["write_cost"] > m["write_cost"]


def test_runs_command(tmp_path: Path) -> None:
    img = tmp_path / "r.img"
    mkfs(img, segments=32, blocks_per_segment=32, block_size=4096, cleaning_policy="adaptive")
    prof = get_preset("random-update").with_overrides(fill=0.5, update_factor=1.0)
    db = tmp_path / "r.db"
    age(img, AgeOptions(profile=prof, db=db, name="lfs-a"))
    runner = CliRunner()
    out = runner.invoke(main, ["runs", "--db", str(db)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split()[:4] == ["id", "fs", "kind", "status"]
    assert lines[2].split()[:4] == ["1", "lfs-a", "lfs", "finished"]
    assert "adaptive" in lines[2]
    js = json.loads(runner.invoke(main, ["runs", "--db", str(db), "--format", "json"]).output)
    assert len(js) == 1 and js[0]["metrics"]["policy"] == "adaptive"
    assert js[0]["utilization"]["histogram"]
    none = runner.invoke(main, ["runs", "--db", str(db), "--kind", "dir"])
    assert (
        none.exit_code != 0 and "fsage: error: no aging runs" in none.output
    )  # a filter matching nothing
    bad = runner.invoke(main, ["runs", "--db", str(db), "--fs", "nope"])
    assert bad.exit_code != 0 and "no file system named 'nope'" in bad.output
    assert "Traceback" not in bad.output
    missing = runner.invoke(main, ["runs", "--db", str(tmp_path / "none.db")])
    assert missing.exit_code != 0 and "no database" in missing.output
    h = runner.invoke(main, ["runs", "--help"])
    assert h.exit_code == 0 and "Examples:" in h.output

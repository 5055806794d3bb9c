"""`fsage fleet` and `fsage analyze --history` give a file system the same total change and
change per month, and leave the same ones out for the same reason: one scored snapshot has no
change at all (not +0.0000), a history shorter than the rate needs has its total change only.
Its figures of sizes are in bytes beside the file system's own blocks (with its block size), so
that rows of 1 KiB- and 4 KiB-block file systems compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from fsage.db.store import Store
from fsage.fleet.export import export_parquet
from fsage.fleet.query import MIN_SPAN_DAYS, ONE_SCORED, SHORT_SPAN, fleet_tables
from fsage.fleet.synth import synthetic_history


def cli(*args: str | Path) -> Any:
    from click.testing import CliRunner

    from fsage.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Nightly histories of one snapshot, three (two days) and ten (nine days)."""
    tmp = tmp_path_factory.mktemp("rates")
    db, ds = tmp / "h.db", tmp / "ds"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "one", files=100, snapshots=1, seed=4)
        synthetic_history(store, "short", files=100, snapshots=3, seed=5)
        synthetic_history(store, "long", files=100, snapshots=MIN_SPAN_DAYS + 3, seed=6)
    export_parquet(db, ds, host="h")
    return db, ds


def trend(db: Path, fs: str) -> dict[str, Any]:
    out = cli("analyze", "--db", db, "--fs", fs, "--history", "--format", "json")
    assert out.exit_code == 0, out.output
    found: dict[str, Any] = json.loads(out.stdout)["trends"][fs]
    return found


def test_fleet_and_analyze_agree_on_change_and_why_none(histories: tuple[Path, Path]) -> None:
    db, ds = histories
    rows = {r["fs"]: r for r in fleet_tables(ds, ("filesystems",))["filesystems"]}
    for fs in ("one", "short", "long"):
        a, f = trend(db, fs), rows[fs]
        assert f["snapshots"] == a["scored_snapshots"], fs
        if a["total_change"] is None:
            assert f["total_change"] is None, fs
        else:
            assert f["total_change"] == pytest.approx(a["total_change"], abs=1e-12), fs
        if a["change_per_month"] is None:
            assert f["change_per_month"] is None, fs
        else:
            assert f["change_per_month"] == pytest.approx(a["change_per_month"], rel=1e-9), fs
    assert trend(db, "one")["total_change"] is None
    assert (
        rows["one"]["no_rate_reason"] == ONE_SCORED == trend(db, "one")["change_per_month_reason"]
    )
    assert rows["short"]["no_rate_reason"] == SHORT_SPAN
    assert rows["short"]["total_change"] is not None
    assert rows["long"]["no_rate_reason"] is None


def test_the_text_table_says_why_each_rate_is_missing(histories: tuple[Path, Path]) -> None:
    _, ds = histories
    out = cli("fleet", ds, "--table", "filesystems")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    one = next(ln for ln in lines if ln.split()[:2] == ["h", "one"])
    assert "+0.0000" not in one and one.split()[5:7] == ["-", "-"]
    notes = [ln for ln in lines if ln.startswith("change_per_month '-'")]
    assert notes == [
        f"change_per_month '-' for 1 file system: {SHORT_SPAN} (total_change given)",
        f"change_per_month '-' for 1 file system: {ONE_SCORED} (no change to measure: "
        "total_change '-' too)",
    ]
    assert "history spans under" not in out.output


def test_outliers_of_change_per_month_keep_two_significant_digits(tmp_path: Path) -> None:
    """An outlier's change per month and the fleet's mean read as changes (-0.0080, not
    -0.008 beside a layout score's three decimals)."""
    db, ds = tmp_path / "h.db", tmp_path / "ds"
    with Store.open(db, create=True) as store:
        for i in range(6):
            synthetic_history(store, f"f{i}", files=100, snapshots=10, seed=10 + i)
    export_parquet(db, ds, host="h")
    rows = fleet_tables(ds, ("outliers",), threshold=1.0)["outliers"]
    rates = [r for r in rows if r["metric"] == "change_per_month"]
    assert rates
    out = cli("fleet", ds, "--table", "outliers", "--threshold", "1")
    assert out.exit_code == 0, out.output
    for r in rates:
        line = next(
            ln for ln in out.output.splitlines() if ln.split()[1:3] == [r["fs"], r["metric"]]
        )
        value, mean = line.split()[3:5]
        assert float(value) == pytest.approx(r["value"], rel=0.01)
        assert float(mean) == pytest.approx(r["fleet_mean"], rel=0.01)


@pytest.fixture(scope="module")
def two_block_sizes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("bytes")
    db, ds = tmp / "h.db", tmp / "ds"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "k1", files=300, snapshots=2, seed=7, block_size=1024)
        synthetic_history(store, "k4", files=300, snapshots=2, seed=8)
    export_parquet(db, ds, host="h")
    return db, ds


def latest(db: Path, fs: str) -> dict[str, Any]:
    out = cli("analyze", "--db", db, "--fs", fs, "--format", "json")
    assert out.exit_code == 0, out.output
    (a,) = json.loads(out.stdout)["snapshots"]
    return dict(a)


def test_largest_free_extent_and_size_buckets_in_bytes(two_block_sizes: tuple[Path, Path]) -> None:
    db, ds = two_block_sizes
    t = fleet_tables(ds, ("filesystems", "files_by_size"))
    seen = set()
    for r in t["filesystems"]:
        a = latest(db, r["fs"])
        seen.add(r["block_size"])
        assert r["block_size"] == a["block_size"]
        assert r["largest_free_extent"] == a["largest_free_extent"]  # in its blocks
        assert r["largest_free_bytes"] == a["largest_free_extent"] * a["block_size"]
    assert seen == {1024, 4096}
    block = {r["fs"]: r["block_size"] for r in t["filesystems"]}
    for r in t["files_by_size"]:
        assert r["block_size"] == block[r["fs"]]
        assert r["bytes"] == r["blocks"] * r["block_size"]
        # a bucket's files hold more than its lower bound in bytes each, at most its upper
        assert r["files"] * (r["min_bytes"] - 1) < r["bytes"] <= r["files"] * r["max_bytes"]


def test_the_text_table_of_files_by_size_shows_bytes(two_block_sizes: tuple[Path, Path]) -> None:
    _, ds = two_block_sizes
    out = cli("fleet", ds, "--table", "files_by_size")
    assert out.exit_code == 0, out.output
    header = next(ln for ln in out.output.splitlines() if ln.startswith("host"))
    assert "bytes" in header.split() and "blocks" not in header.split()

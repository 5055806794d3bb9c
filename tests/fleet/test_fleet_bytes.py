"""The fleet's per-file-system figures of sizes are in bytes beside the file system's own
blocks (with its block size), so that rows of 1 KiB- and 4 KiB-block file systems compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from fsage.db.store import Store
from fsage.fleet.export import export_parquet
from fsage.fleet.query import fleet_tables
from fsage.fleet.synth import synthetic_history


def cli(*args: str | Path) -> Any:
    from click.testing import CliRunner

    from fsage.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


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

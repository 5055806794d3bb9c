"""File-size buckets speak bytes everywhere: the same files on 1 KiB and 4 KiB blocks land in
buckets with the same labels, and `fsage analyze` text, JSON, CSV and the report all use them."""

from __future__ import annotations

import csv
import io
import json
import random
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.analyzer.freespace import free_extent_label
from fsage.cli import main
from fsage.text import human_bytes, size_range
from tests.conftest import require_tools

KIB = 1024
# data sizes (bytes) and the bucket each falls in, worked out by hand: a bucket holds more
# than its first bound and at most its second
SIZES = {20 * KIB: "16 KiB-32 KiB", 100 * KIB: "64 KiB-128 KiB", 3 * 1024 * KIB: "2 MiB-4 MiB"}


def test_labels_read_as_bytes() -> None:
    assert human_bytes(8 * KIB) == "8 KiB" and human_bytes(1536) == "1.5 KiB"
    assert size_range(2, 2, 4096) == "4 KiB-8 KiB"
    assert size_range(3, 4, 4096) == "8 KiB-16 KiB"
    assert size_range(5, 8, 1024) == "4 KiB-8 KiB"
    assert size_range(1, 1, 4096) == "0 B-4 KiB"
    assert size_range(1025, 2048, 1024) == "1 MiB-2 MiB"


def _snapshot(tmp_path: Path, block_size: int, size: str, *mkfs: str) -> tuple[CliRunner, Path]:
    """An ext4 of ``size`` made by mke2fs (``mkfs``: more of its options), snapshotted into a
    new database: (the runner, the database)."""
    img = tmp_path / "fs.img"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", str(block_size), *mkfs, str(img), size],
        check=True, capture_output=True,
    )  # fmt: skip
    db = tmp_path / "s.db"
    runner = CliRunner()
    assert runner.invoke(main, ["snapshot", str(img), "--db", str(db)]).exit_code == 0
    return runner, db


@pytest.mark.parametrize("block_size", [1024, 4096])
def test_analyze_labels_buckets_in_bytes_in_every_format(tmp_path: Path, block_size: int) -> None:
    require_tools("mke2fs")
    rnd = random.Random(block_size)
    tree = tmp_path / "tree"
    tree.mkdir()
    for size, _ in SIZES.items():
        for k in range(3):
            (tree / f"f{size}-{k}").write_bytes(rnd.randbytes(size))
    runner, db = _snapshot(tmp_path, block_size, "64M", "-d", str(tree))

    r = runner.invoke(main, ["analyze", "--db", str(db), "--format", "json"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.output)["snapshots"]
    rows = {row["label"]: row for row in a["by_size"]}
    assert set(rows) == set(SIZES.values())
    for size, label in SIZES.items():
        row = rows[label]
        assert row["files"] == 3
        assert row["min_bytes"] <= size <= row["max_bytes"]
        assert row["min_blocks"] == (row["min_bytes"] - 1) // block_size + 1
        assert row["max_blocks"] * block_size == row["max_bytes"]
    for m in a["disk_model"]["models"].values():
        assert {row["label"] for row in m["by_size"]} == set(SIZES.values())

    r = runner.invoke(main, ["analyze", "--db", str(db)])
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert any(line.split()[:2] == ["file", "size"] for line in lines)
    for label in SIZES.values():
        by_size = [line for line in lines if line.startswith(label + " ")]
        assert by_size and by_size[0][len(label) :].split()[0] == "3", label  # then the count

    r = runner.invoke(main, ["analyze", "--db", str(db), "--format", "csv"])
    got = {row["label"]: row for row in csv.DictReader(io.StringIO(r.output))}
    assert set(got) == set(SIZES.values())
    assert all(int(got[k]["min_bytes"]) == rows[k]["min_bytes"] for k in got)

    out = tmp_path / "r.html"
    r = runner.invoke(main, ["report", "--db", str(db), "-o", str(out)])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    for label in SIZES.values():
        assert f"files of {label}" in html


def test_free_extent_labels_read_as_bytes() -> None:
    assert free_extent_label(1, 1, 4096) == "4 KiB-<8 KiB"  # e2freefrag: "4K...8K-"
    assert free_extent_label(4, 7, 1024) == "4 KiB-<8 KiB"
    assert free_extent_label(128, 255, 4096) == "512 KiB-<1 MiB"  # e2freefrag: "512K...1024K-"
    assert free_extent_label(1 << 30, None, 4096) == "4 TiB or more"


@pytest.mark.parametrize("block_size", [1024, 4096])
def test_free_extents_have_one_label_in_analyze_and_the_report(
    tmp_path: Path, block_size: int
) -> None:
    require_tools("mke2fs")
    runner, db = _snapshot(tmp_path, block_size, "16M")
    r = runner.invoke(main, ["analyze", "--db", str(db), "--format", "json"])
    (a,) = json.loads(r.output)["snapshots"]
    buckets = a["free_extents"]
    assert buckets
    for b in buckets:  # the label, and the bounds in bytes (to hold against e2freefrag's)
        assert b["label"] == free_extent_label(b["min_blocks"], b["max_blocks"], block_size)
        assert b["min_bytes"] == b["min_blocks"] * block_size
        assert b["max_bytes"] == b["max_blocks"] * block_size
    text = runner.invoke(main, ["analyze", "--db", str(db)]).output
    assert "..." not in text
    for b in buckets:
        assert any(line.split("  ")[0] == b["label"] for line in text.splitlines()), b
    out = tmp_path / "r.html"
    assert runner.invoke(main, ["report", "--db", str(db), "-o", str(out)]).exit_code == 0
    html = out.read_text()
    for b in buckets:  # as the page's script data writes it ("<" escaped)
        assert json.dumps(b["label"]).replace("<", "\\u003c") in html, b["label"]


def test_decimals_never_show_a_negative_zero() -> None:
    from fsage.analyzer.history import trend_line
    from fsage.text import decimal

    assert decimal(-0.00001, 4, signed=True) == "+0.0000"
    assert decimal(-0.0, 3) == "0.000"
    assert decimal(-0.00006, 4, signed=True) == "-0.0001"
    assert decimal(0.25, 3) == "0.250" and decimal(-1.5, 2) == "-1.50"
    # A history whose score fell by a hair shows the hair, never "-0.0000".
    line = trend_line(
        {"first_layout_score": 1.0, "last_layout_score": 0.99999, "total_change": -0.00001,
         "change_per_month": None, "change_per_month_reason": "snapshots span 3 s",
         "span_days": 3 / 86400}
    )  # fmt: skip
    assert "total change -0.000010" in line and "-0.0000 " not in line

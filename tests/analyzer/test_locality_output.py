"""Locality between files as `fsage analyze` prints it (text, JSON, CSV with --by dir), as the
report draws it and as the Parquet export stores it, checked against debugfs."""

from __future__ import annotations

import csv
import io
import json
import random
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main

from .images import need
from .test_locality import _bucket, _geometry, _pairs, _tree

HOSTILE = "<script>alert(1)"


@pytest.fixture(scope="module")
def db_and_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Three directories (one named like markup) of files copied in by mke2fs -d, then every
    other file of one directory deleted and new ones written there by debugfs."""
    need("mke2fs", "debugfs", "dumpe2fs")
    work = tmp_path_factory.mktemp("locout")
    rnd = random.Random(8)
    src = work / "src"
    for d in ("a", "b", HOSTILE):
        (src / d).mkdir(parents=True)
        for i in range(30):
            (src / d / f"f{i:02d}").write_bytes(rnd.randbytes(rnd.randint(1, 50_000)))
    img = work / "fs.img"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-d", str(src), str(img), "64M"],
        check=True,
        capture_output=True,
    )
    cmds = [f"rm /b/f{i:02d}" for i in range(0, 30, 2)]
    for j in range(10):
        part = work / f"new{j}"
        part.write_bytes(rnd.randbytes(rnd.randint(1, 90_000)))
        cmds.append(f"write {part} /b/g{j}")
    (work / "cmds").write_text("\n".join(cmds) + "\n")
    subprocess.run(
        ["debugfs", "-w", "-f", str(work / "cmds"), str(img)], check=True, capture_output=True
    )
    db = work / "t.db"
    res = CliRunner().invoke(main, ["snapshot", str(img), "--db", str(db), "--name", "t"])
    assert res.exit_code == 0, res.output
    return db, img


def _expected(img: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Gap counts by bucket over the file system, and neighbour pairs per directory name."""
    nodes, g = _tree(img), _geometry(img)
    names = {i: n.decode() for n in nodes[2].children for i in [nodes[2].children[n]]}
    want = {k: 0 for k in ("adjacent", "le_1mib", "le_group", "farther")}
    per_dir: dict[str, int] = {}
    for d, gap in _pairs(nodes):
        want[_bucket(gap, g)] += 1
        per_dir["/" + names[d]] = per_dir.get("/" + names[d], 0) + 1
    return want, per_dir


def test_analyze_prints_locality_in_every_format(db_and_image: tuple[Path, Path]) -> None:
    db, img = db_and_image
    want, per_dir = _expected(img)
    pairs = sum(want.values())
    runner = CliRunner()
    res = runner.invoke(main, ["analyze", "--db", str(db), "--format", "json"])
    assert res.exit_code == 0, res.output
    (a,) = json.loads(res.output)["snapshots"]
    nd = a["locality"]["neighbour_distance"]
    assert {k: nd[k] for k in want} == want
    assert nd["pairs"] == pairs == 29 + 29 + (15 + 10 - 1)  # b: 15 files left, 10 new
    assert a["locality"]["directory_scan"]["scans"] == 3
    text = runner.invoke(main, ["analyze", "--db", str(db)]).output
    assert (
        f"next file of the directory (path order, {pairs} pairs): "
        f"{want['adjacent'] / pairs:.1%} adjacent" in text
    )
    assert "directories' own scans (modeled dynamic layout score, 3 directories)" in text
    res = runner.invoke(main, ["analyze", "--db", str(db), "--by", "dir", "--format", "csv"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert {"scan_score", "own_scan_score", "pairs", "adjacent_share", "farther_share"} <= set(
        rows[0]
    )
    got = {r["path"]: int(r["pairs"]) for r in rows if r["path"] != "/"}
    assert got == {**per_dir, "/lost+found": 0}
    assert int(next(r for r in rows if r["path"] == "/")["pairs"]) == pairs
    text = runner.invoke(main, ["analyze", "--db", str(db), "--by", "dir"]).output
    assert "own scan score" in text and "<= 1 MiB" in text


def test_report_has_a_locality_section_with_escaped_names(
    db_and_image: tuple[Path, Path], tmp_path: Path
) -> None:
    db, img = db_and_image
    want, _ = _expected(img)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", "--db", str(db), "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "<section id='s-locality'><h2>Locality between files</h2>" in page
    assert HOSTILE not in page
    assert "/&lt;script&gt;alert(1)" in page  # the directory, in the by-directory table
    section = page.split("<section id='s-locality'>")[1].split("</section>")[0]
    assert f"<td>{sum(want.values())}</td>" in section


def test_parquet_export_carries_the_locality_columns(
    db_and_image: tuple[Path, Path], tmp_path: Path
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from fsage.fleet.export import export_parquet

    db, img = db_and_image
    want, _ = _expected(img)
    pairs = sum(want.values())
    export_parquet(db, tmp_path / "ds", host="h")
    (part,) = (tmp_path / "ds" / "metrics").rglob("*.parquet")
    (row,) = pq.read_table(part).to_pylist()
    assert row["neighbour_pairs"] == pairs
    for k, n in want.items():
        assert row[f"neighbour_{k}_share"] == n / pairs
    assert 0 < row["dir_scan_score_aggregate"] <= 1
    assert row["same_group_share"] is not None

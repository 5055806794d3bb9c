"""The disk map against dumpe2fs, and `report --compare`'s moved files against filefrag."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.analyzer.analysis import SnapshotAnalyzer
from fsage.analyzer.compare import compare_snapshots
from fsage.cli import main
from fsage.db.store import Store

from .images import make_image, need


def test_disk_map_matches_dumpe2fs(tmp_path: Path) -> None:
    need("dumpe2fs")
    img = make_image(tmp_path, seed=21, block_size=1024, size_mb=24, files=300, max_bytes=60_000)
    db = tmp_path / "m.db"
    assert CliRunner().invoke(main, ["snapshot", str(img), "--db", str(db)]).exit_code == 0
    with Store.open(db) as store:
        m = SnapshotAnalyzer(store.load_layout(1)).free()["map"]
    out = subprocess.run(["dumpe2fs", str(img)], capture_output=True, text=True, check=True)
    groups = re.findall(r"^Group (\d+): \(Blocks (\d+)-(\d+)", out.stdout, re.M)
    free = [int(x) for x in re.findall(r"^\s+(\d+) free blocks,", out.stdout, re.M)]
    assert m["unit"] == "group" and len(groups) == len(m["start"]) > 2
    assert [int(g[1]) for g in groups] == m["start"]
    assert [int(g[2]) - int(g[1]) + 1 for g in groups] == m["length"]
    assert free == m["free"]
    assert 0 < sum(m["free"]) < sum(m["length"])


def _extents(path: Path) -> list[str]:
    out = subprocess.run(
        ["filefrag", "-v", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return re.findall(r"^\s*\d+:\s+\d+\.\.\s*\d+:\s+(\d+\.\.\s*\d+):", out, re.M)


@pytest.mark.needs_root
def test_compare_counts_the_files_that_moved(tmp_path: Path) -> None:
    """Rewrite some files in place (same inode) while another file grows between them: the
    files filefrag sees on other blocks are the files the comparison counts as moved."""
    need("filefrag", "mke2fs")
    img, mnt, db = tmp_path / "fs.img", tmp_path / "mnt", tmp_path / "c.db"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", str(img), "32M"],
        check=True,
        capture_output=True,
    )
    mnt.mkdir()
    names = [f"f{i}" for i in range(12)]

    def mount() -> None:
        subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)

    def umount() -> None:
        subprocess.run(["umount", str(mnt)], check=True)

    mount()
    try:
        for n in names:
            (mnt / n).write_bytes(os.urandom(40_000))
        os.sync()
        before = {n: _extents(mnt / n) for n in names}
    finally:
        umount()
    runner = CliRunner()
    assert (
        runner.invoke(main, ["snapshot", str(img), "--db", str(db), "--name", "c"]).exit_code == 0
    )
    mount()
    try:
        with open(mnt / "grow", "wb") as g:
            for n in names[::3]:
                # empty the file and write it again while the other file takes blocks
                with open(mnt / n, "r+b") as f:
                    f.truncate(0)
                    f.flush()
                    os.fsync(f.fileno())
                    g.write(os.urandom(200_000))
                    g.flush()
                    os.fsync(g.fileno())
                    f.write(os.urandom(40_000))
                    f.flush()
                    os.fsync(f.fileno())
        os.sync()
        after = {n: _extents(mnt / n) for n in names}
    finally:
        umount()
    assert (
        runner.invoke(main, ["snapshot", str(img), "--db", str(db), "--name", "c"]).exit_code == 0
    )
    moved_by_filefrag = sum(before[n] != after[n] for n in names)
    assert moved_by_filefrag >= 1
    with Store.open(db) as store:
        cmp = compare_snapshots(store, 1, 2)
    f = cmp["files"]
    assert f["moved"] == moved_by_filefrag
    assert f["in_both"] == len(names) and f["only_in_b"] == 1 and f["only_in_a"] == 0
    assert f["moved_blocks"] == 10 * moved_by_filefrag  # 40,000 bytes: ten 4 KiB blocks

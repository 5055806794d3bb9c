"""The export's figures computed a chunk of files at a time equal those of the analyzer over
the whole snapshot, and a snapshot assembled from several stored chunks holds the extents
debugfs reads from the image (a real ext4 image: mke2fs -d, then debugfs churn)."""

from __future__ import annotations

import math
import random
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fsage.analyzer import dynamic, scores
from fsage.analyzer.analysis import analyze_layout
from fsage.db.store import Store
from fsage.fleet.export_metrics import metric_rows, without_unread
from fsage.layout import Layout
from tests.analyzer.images import make_image, need
from tests.fleet.test_export import churn, cli


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An image snapshotted, churned by debugfs (files deleted, fragmented ones written into
    the holes) and snapshotted again: the second snapshot spans two stored chunks."""
    need("mke2fs", "debugfs")
    tmp = tmp_path_factory.mktemp("chunked")
    img = make_image(tmp, seed=11, block_size=1024, size_mb=24, files=400,
                     max_bytes=40_000, churn=False)  # fmt: skip
    db = tmp / "real.db"
    cli("snapshot", img, "--name", "real", "--db", db)
    churn(tmp, img, 1, 400)
    cli("snapshot", img, "--name", "real", "--db", db)
    return img, db


def _layouts(db: Path) -> list[tuple[Any, Layout]]:
    with Store.open(db) as store:
        rows = store.snapshots("real")
        return [(r, store.load_layout(r.id)) for r in rows]


def test_figures_in_chunks_equal_the_whole_snapshot(
    history: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, db = history
    whole = []
    for row, layout in _layouts(db):
        whole.append((metric_rows("h", row, layout), analyze_layout(layout)))
    # chunks of a few dozen files: every carried state crosses many chunk boundaries
    monkeypatch.setattr(dynamic, "READS_CHUNK", 37)
    monkeypatch.setattr(scores, "SCORE_CHUNK", 29)
    # and as the export computes them: without the columns they do not read
    chunked = [
        (metric_rows("h", r, without_unread(lay)), analyze_layout(lay)) for r, lay in _layouts(db)
    ]
    assert len(whole) == 2
    for (wm, wa), (cm, ca) in zip(whole, chunked, strict=True):
        assert same(wm, cm)
        assert same(wa, ca)
    # the churn fragmented files, and the figures saw it
    assert whole[1][0][0]["layout_score"] < whole[0][0][0]["layout_score"] <= 1.0
    assert whole[1][0][0]["dynamic_layout_score_path"] is not None


def extents_of(files: Any, i: int) -> list[tuple[int, int, int]]:
    """File `i`'s extents as (logical, physical, length), as debugfs's `ex` lists them."""
    a, b = int(files.ext_off[i]), int(files.ext_off[i + 1])
    return list(
        zip(
            files.ext_logical[a:b].tolist(),
            files.ext_physical[a:b].tolist(),
            files.ext_length[a:b].tolist(),
            strict=True,
        )
    )


def _debugfs_extents(img: Path, inos: list[int]) -> dict[int, list[tuple[int, int, int]]]:
    """(logical, physical, length) of each inode's leaf extents, as debugfs lists them."""
    script = "\n".join(f"ex <{i}>" for i in inos) + "\n"
    out = subprocess.run(["debugfs", "-f", "-", str(img)], input=script, text=True,
                         capture_output=True, check=True).stdout  # fmt: skip
    found: dict[int, list[tuple[int, int, int]]] = {}
    current = -1
    for line in out.splitlines():
        m = re.match(r"debugfs:\s+ex <(\d+)>", line)
        if m:
            current = int(m.group(1))
            found[current] = []
            continue
        m = re.match(
            r"\s*(\d+)/\s*(\d+)\s+\d+/\s*\d+\s+(\d+)\s+-\s+\d+\s+(\d+)\s+-\s+\d+\s+(\d+)", line
        )
        if m and m.group(1) == m.group(2):  # a leaf: level == depth
            found[current].append((int(m.group(3)), int(m.group(4)), int(m.group(5))))
    return found


def test_a_snapshot_from_two_chunks_holds_what_debugfs_reads(history: tuple[Path, Path]) -> None:
    img, db = history
    with Store.open(db) as store:
        (_, last) = store.snapshots("real")
        assert store.con.execute("SELECT count(*) FROM version_chunks").fetchone()[0] >= 2
        layout = store.load_layout(last.id)
    files = layout.files
    reg = np.flatnonzero(files.is_regular() & (np.diff(files.ext_off.astype(np.int64)) > 0))
    sample = sorted(random.Random(5).sample(reg.tolist(), 40))
    want = _debugfs_extents(img, [int(files.ino[i]) for i in sample])
    multi = 0
    for i in sample:
        got = extents_of(files, i)
        assert got == want[int(files.ino[i])], int(files.ino[i])
        multi += len(got) > 1
    assert multi  # some sampled file is fragmented

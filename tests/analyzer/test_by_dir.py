"""`fsage analyze --by dir` against sums over every file's path: each directory down to the
depth asked holds the files whose path lies below it."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.analyzer.analysis import SnapshotAnalyzer
from fsage.analyzer.scores import file_scores
from fsage.cli import main
from fsage.db.store import Store
from fsage.layout import Layout

from .images import make_image


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """A churned ext4 image of 400 files in directories two levels deep."""
    tmp = tmp_path_factory.mktemp("by_dir")
    img = make_image(tmp, seed=11, block_size=1024, size_mb=24, files=400, max_bytes=30_000)
    db = tmp / "s.db"
    assert CliRunner().invoke(main, ["snapshot", str(img), "--db", str(db)]).exit_code == 0
    with Store.open(db, readonly=True) as store:
        return store.load_layout(1)


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_subtree_sums_match_sums_over_paths(layout: Layout, depth: int) -> None:
    files = layout.files
    s = file_scores(files)
    regular = files.is_regular()
    paths = layout.paths()
    want: dict[str, list[int]] = {}
    dirs = {p for i, ino in enumerate(files.ino.tolist()) if files.is_dir()[i]
            for p in paths.get(ino, [])}  # fmt: skip
    for d in dirs:
        if d.count("/") <= depth or d == "/":
            want[d] = [0, 0, 0, 0]
    for i, ino in enumerate(files.ino.tolist()):
        if not regular[i] or ino not in paths:
            continue
        (p,) = paths[ino]  # no hard links in these trees
        nums = [1, int(s.blocks[i]), int(s.contiguous[i]), int(s.denominator[i])]
        for d, acc in want.items():
            if d == "/" or p.startswith(d + "/"):
                for k in range(4):
                    acc[k] += nums[k]
    got = SnapshotAnalyzer(layout).by_dir(depth)
    assert [r["path"] for r in got] == sorted(want)
    for r in got:
        f, b, c, den = want[r["path"]]
        assert (r["files"], r["blocks"]) == (f, b), r["path"]
        assert r["depth"] == (0 if r["path"] == "/" else r["path"].count("/"))
        assert r["layout_score"] == (c / den if den else None)
    assert np.isclose(got[0]["files"], int(regular.sum()))

"""``fsage age --match`` on a target fsage's matcher did not make: the ``mail`` preset at
1 KiB blocks, whose free space is mostly holes of a few blocks (most of them 4-15), matched
loop-mounted on a fresh image of the same mkfs parameters. The state left on disk is judged
with e2freefrag (free-space histogram by blocks and by extent counts, fullness) and
``filefrag -v`` (layout score per size bucket) as oracles, not with fsage's own reader."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount
from fsage.ager.match import SCORE_TOL, match_layout, target_from_layout
from fsage.ager.match_target import DYNAMIC_TOL, FULLNESS_TOL
from fsage.snapshotter.ext import read_ext_layout
from tests.ager.helpers import fsck_clean
from tests.ager.test_match_git import _e2freefrag, _e2freefrag_extents, _tv

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
_EXT = re.compile(r"^\s*\d+:\s*(\d+)\.\.\s*\d+:\s*(\d+)\.\.\s*\d+:\s*(\d+):")


def _ext4_1k(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "1024", str(path)], check=True)
    return path


def _filefrag_buckets(image: Path, bs: int) -> dict[int, tuple[int, int, int]]:
    """Per size bucket: (files, contiguous blocks, blocks - 1) of the image's regular files of
    two blocks or more, from ``filefrag -v`` in units of the file system's block."""
    out: dict[int, list[int]] = {}
    with loop_mount(image, options="ro") as mnt:
        paths = [
            os.path.join(d, f)
            for d, _dirs, files in os.walk(mnt)
            for f in files
            if not os.path.islink(os.path.join(d, f))
        ]
        for i in range(0, len(paths), 300):
            text = subprocess.run(
                ["filefrag", "-v", f"-b{bs}", *paths[i : i + 300]],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            for block in re.split(r"^File size of ", text, flags=re.M)[1:]:
                exts = sorted(
                    (int(m.group(1)), int(m.group(2)), int(m.group(3)))
                    for m in map(_EXT.match, block.splitlines())
                    if m
                )
                blocks = sum(e[2] for e in exts)
                if blocks < 2:
                    continue
                cont, prev = 0, None
                for _l, p, n in exts:
                    cont += n - 1 + (prev is not None and p == prev)
                    prev = p + n
                row = out.setdefault((blocks - 1).bit_length(), [0, 0, 0])
                row[0] += 1
                row[1] += cont
                row[2] += blocks - 1
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


@pytest.mark.slow
@pytest.mark.needs_root
@pytest.mark.xfail(
    strict=False,
    reason="known gap: in 2 of 5 full-suite runs the match left too many 1-block holes"
    " (free-extent-count TV 0.142) or the mail target came out with fewer small holes",
)
def test_match_a_mail_aged_1k_ext4(tmp_path: Path) -> None:
    target_img = _ext4_1k(tmp_path / "target.img", 96 * MIB)
    subprocess.run(
        [sys.executable, "-m", "fsage", "age", str(target_img), "--profile", "mail",
         "--fill", "0.82", "--churn", "1", "--seed", "1", "--mount"],
        check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    want_full, want_free = _e2freefrag(target_img)
    want_n = _e2freefrag_extents(target_img)
    # A target of small holes: a large share of free blocks in holes under 16 blocks (about
    # half; the kernel's placement, and so the share, moves a little with the machine's load)
    # and many of 8-15 (the size a fill's spacers written side by side would not leave).
    assert sum(want_free.get(k, 0) for k in range(4)) > 0.4 * sum(want_free.values())
    assert want_n.get(3, 0) >= 300, want_n

    target = target_from_layout(read_ext_layout(target_img), "mail target")
    img = _ext4_1k(tmp_path / "matched.img", 96 * MIB)
    res = match_layout(img, target, seed=1, mode="mount", time_limit=300.0)
    assert res.measured_by == "the offline reader after unmount"
    fsck_clean(img)

    got_full, got_free = _e2freefrag(img)
    got_n = _e2freefrag_extents(img)
    assert _tv(want_free, got_free) <= 0.1, (want_free, got_free)
    assert _tv(want_n, got_n) <= 0.1, (want_n, got_n)
    # The holes of 8-15 blocks are there, about as many as the target's.
    assert abs(got_n.get(3, 0) / want_n[3] - 1) <= 0.2, (want_n, got_n)
    assert abs(got_full - want_full) <= FULLNESS_TOL, (got_full, want_full)

    want_b, got_b = _filefrag_buckets(target_img, 1024), _filefrag_buckets(img, 1024)
    judged = 0
    for k, (n, c, d) in want_b.items():
        if n < 50 or d == 0:
            continue
        _gn, gc, gd = got_b.get(k, (0, 0, 0))
        assert gd, (k, got_b)
        assert abs(gc / gd - c / d) <= SCORE_TOL, (k, gc / gd, c / d)
        judged += 1
    assert judged >= 3, want_b
    want_dyn = target.locality["dynamic_score"]
    assert abs(res.report["locality"]["dynamic_score"] - want_dyn) <= DYNAMIC_TOL
    assert res.matched, res.reasons

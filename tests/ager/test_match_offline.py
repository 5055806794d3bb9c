"""``fsage age IMAGE --match`` on an unmounted ext image (no root): the matcher's ops run
through the offline writer and its snapshots through the offline reader. The result is judged
by e2fsprogs' own reading of the image (debugfs block lists, e2freefrag, e2fsck -fn), not by
the reader the matcher steered with."""

from __future__ import annotations

import itertools
import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.ager.match import (
    AREA,
    FREE_TV,
    MIN_FILES,
    SCORE_TOL,
    LayoutTarget,
    free_tv,
    match_layout,
    target_from_layout,
)
from fsage.analyzer.analysis import size_bucket
from fsage.cli.age import match_lines

MIB = 1 << 20
SIZE = 128 * MIB

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("mkfs.ext4", "debugfs", "e2freefrag", "e2fsck")),
    reason="needs e2fsprogs (mkfs.ext4, debugfs, e2freefrag, e2fsck)",
)


def _fragmented_image(path: Path, seed: int) -> Path:
    """An ext4 image aged offline to 0.7 full: small files made four at a time, one block of
    each in turn (their blocks alternate), larger files written whole, then 30% of the larger
    files deleted (holes of their sizes in the free space)."""
    from fsage.ager.images import make_image
    from fsage.ager.offline import OfflineExtExecutor
    from fsage.workload import Op

    img = make_image(path, "ext4", SIZE)
    rng = random.Random(seed)
    big: list[str] = []
    with OfflineExtExecutor(img) as x:
        x.apply(Op("mkdir", "t"))
        n = 0
        while x.fullness() < 0.7:
            d = f"t/{n // 200:04d}"
            if n % 200 == 0:
                x.apply(Op("mkdir", d))
            if rng.random() < 0.75:
                sizes = [rng.randint(2, 16) for _ in range(4)]
                paths = [f"{d}/s{n}_{j}" for j in range(4)]
                for p in paths:
                    x.apply(Op("create", p, 0))
                for b in range(max(sizes)):
                    for p, sz in zip(paths, sizes, strict=True):
                        if b < sz:
                            x.apply(Op("append", p, 4096))
            else:
                big.append(f"{d}/l{n}")
                x.apply(Op("create", big[-1], 4096 * rng.randint(17, 256)))
            n += 1
        for p in big:
            if rng.random() < 0.3:
                x.apply(Op("delete", p))
        x.close()
    return img


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> LayoutTarget:
    from fsage.snapshotter.ext import read_ext_layout

    img = _fragmented_image(tmp_path_factory.mktemp("target") / "target.img", seed=3)
    t = target_from_layout(read_ext_layout(img), "offline-fragmented ext4")
    img.unlink()
    return t


def _debugfs(img: Path, commands: list[str]) -> str:
    out = subprocess.run(
        ["debugfs", "-f", "-", str(img)],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def _debugfs_scores(img: Path) -> dict[int, tuple[int, float]]:
    """Size bucket -> (files, layout score) of the matcher's regular files, from debugfs's
    block lists: a block is contiguous when it follows the file's previous block on disk."""
    dirs = [
        line.split("/")[5]
        for line in _debugfs(img, [f"ls -p /{AREA}"]).splitlines()
        if line.startswith("/") and line.split("/")[5].startswith("d")
    ]
    files = []
    for d in dirs:
        for line in _debugfs(img, [f"ls -p /{AREA}/{d}"]).splitlines():
            parts = line.split("/")
            if len(parts) > 5 and parts[5].startswith("f") and parts[2].startswith("100"):
                files.append(f"/{AREA}/{d}/{parts[5]}")
    out = _debugfs(img, [f"blocks {f}" for f in files])
    lists = [
        [int(b) for b in line.split()]
        for line in out.splitlines()
        if line.strip() and not line.startswith("debugfs")
    ]
    assert len(lists) == len(files)  # every file has blocks (none is empty)
    sums: dict[int, list[int]] = {}
    for blocks in lists:
        k = int(size_bucket(np.array([len(blocks)]))[0])
        cont = sum(b == a + 1 for a, b in itertools.pairwise(blocks))
        acc = sums.setdefault(k, [0, 0, 0])
        acc[0] += 1
        acc[1] += cont
        acc[2] += len(blocks) - 1
    return {k: (n, c / d if d else 1.0) for k, (n, c, d) in sums.items()}


def _e2freefrag(img: Path, block_size: int) -> dict[int, float]:
    """log2 free-extent bucket -> fraction of free blocks, from e2freefrag's histogram."""
    out = subprocess.run(["e2freefrag", str(img)], capture_output=True, text=True, check=True)
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    hist: dict[int, int] = {}
    for m in re.finditer(r"^\s*(\d+)([KMGT])\.\.\..*:\s+\d+\s+(\d+)\s", out.stdout, re.M):
        blocks = int(m.group(1)) * unit[m.group(2)] // block_size
        hist[blocks.bit_length() - 1] = int(m.group(3))
    total = sum(hist.values())
    return {k: v / total for k, v in hist.items()}


def test_offline_match_of_a_fragmented_target(tmp_path: Path, target: LayoutTarget) -> None:
    from fsage.ager.images import make_image

    # The target is fragmented: small-file buckets far from contiguous.
    small = [s for k, (n, s) in target.buckets.items() if 1 <= k <= 3 and n >= MIN_FILES]
    assert small and all(s is not None and s <= 0.8 for s in small)
    img = make_image(tmp_path / "aged.img", "ext4", SIZE)
    res = match_layout(img, target, seed=1, time_limit=300.0, mode="offline")
    text = "\n".join(match_lines(res.to_json()))
    assert res.matched and res.offline, text
    assert "via the offline writer" in text
    # e2fsprogs' own reading: consistent, the scores and the free space as targeted.
    fsck = subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    got = _debugfs_scores(img)
    for k, (n, s) in target.buckets.items():
        if k >= 1 and n >= MIN_FILES and s is not None:
            assert k in got, text
            assert abs(got[k][1] - s) <= SCORE_TOL + 0.01, (k, got[k], s, text)
    tv = free_tv(target.free_fractions(), _e2freefrag(img, target.block_size))
    assert tv <= FREE_TV + 0.02, (tv, text)


def test_offline_match_refuses_a_second_run_on_the_same_image(
    tmp_path: Path, target: LayoutTarget
) -> None:
    from fsage.ager.images import make_image
    from fsage.errors import UsageError

    img = make_image(tmp_path / "aged.img", "ext4", SIZE)
    match_layout(img, target, seed=1, time_limit=300.0, mode="offline")
    with pytest.raises(UsageError, match="earlier match"):
        match_layout(img, target, seed=1, time_limit=300.0, mode="offline")


def test_cli_match_offline_with_a_json_target(tmp_path: Path, target: LayoutTarget) -> None:
    from fsage.ager.images import make_image
    from fsage.cli import main

    spec = tmp_path / "target.json"
    spec.write_text(json.dumps(target.to_json()))
    img = make_image(tmp_path / "aged.img", "ext4", SIZE)
    r = CliRunner().invoke(main, ["age", str(img), "--match", str(spec), "--offline"])
    assert r.exit_code == 0, r.output
    assert ": matched after" in r.output and "via the offline writer" in r.output
    r = CliRunner().invoke(main, ["age", str(tmp_path), "--match", str(spec), "--offline"])
    assert r.exit_code != 0 and "needs an image file" in r.output


@pytest.mark.needs_root
def test_offline_match_of_a_target_aged_by_the_kernel(tmp_path: Path) -> None:
    """A target fragmented through a mount (the kernel's allocator) is reached offline too:
    libext2fs's allocator places blocks differently, but the matcher's steering (interleaved
    pieces, holes of the target's free-extent sizes, the largest free extent filled from its
    start) does not depend on it."""
    from fsage.ager.images import can_loop_mount, loop_mount, make_image
    from fsage.snapshotter.ext import read_ext_layout
    from tests.ager.fragmented import fragment as _fragment

    if not can_loop_mount():
        pytest.skip("needs root and loop devices")
    size = 256 * MIB
    src = make_image(tmp_path / "target.img", "ext4", size)
    with loop_mount(src) as mnt:
        _fragment(mnt, 0.7, seed=3)
    target = target_from_layout(read_ext_layout(src), "kernel-fragmented ext4")
    src.unlink()
    img = make_image(tmp_path / "aged.img", "ext4", size)
    res = match_layout(img, target, seed=1, time_limit=300.0, mode="offline")
    text = "\n".join(match_lines(res.to_json()))
    assert res.matched, text
    tv = free_tv(target.free_fractions(), _e2freefrag(img, target.block_size))
    assert tv <= FREE_TV + 0.02, (tv, text)

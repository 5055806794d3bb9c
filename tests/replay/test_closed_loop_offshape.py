"""The closed loop's offline free-space shaping: surplus small free extents plugged by files put
at their start through libext2fs's goal (``allocate-near``), checked with e2freefrag and
debugfs; large free extents split into the small ones a recreation lacks; and a replay session
that runs such ops offline between mounted ones."""

from __future__ import annotations

import random
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fsage.ager.match_target import LayoutTarget
from fsage.ager.offline import OfflineExtExecutor
from fsage.layout import Layout
from fsage.replay.changed import _File
from fsage.replay.closedloop import IntervalChurn, Steerer
from fsage.replay.recreate import run_op_stream
from fsage.snapshotter import read_source
from fsage.workload import Op

KIB = 1024


def _mkfs(path: Path, mib: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(mib << 20)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", str(path)],
                   capture_output=True, check=True)  # fmt: skip
    return path


def _small_free_extents(image: Path) -> int:
    """Free extents of fewer than 16 KiB (16 blocks), from e2freefrag's histogram."""
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    n = 0
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(\d+)([KMG])\.\.\.\s*\S+\s*:\s*(\d+)\s", line)
        if m and m.group(2) == "K" and int(m.group(1)) < 16:
            n += int(m.group(3))
    return n


def _first_block(image: Path, path: str) -> int:
    out = subprocess.run(["debugfs", "-R", f'blocks "/{path}"', str(image)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return int(out.stdout.split()[0])


def _extents(image: Path, path: str) -> str:
    out = subprocess.run(["debugfs", "-R", f'ex "/{path}"', str(image)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout


def _offline_steerer(img: Path) -> tuple[Steerer, Callable[[], None]]:
    """A closed-loop steerer over ``img`` through libext2fs (its ops run offline, and each
    measurement closes the executor, reads the image and opens it again), and what closes the
    executor at the end."""
    cur = {"ex": OfflineExtExecutor(img)}

    def run(op: Op) -> int:
        return cur["ex"].apply(op)

    def read() -> Layout:
        cur["ex"].close()
        try:
            return read_source(img)
        finally:
            cur["ex"] = OfflineExtExecutor(img)

    return Steerer(run, read), lambda: cur["ex"].close()


def test_offline_plugs_fill_surplus_small_free_extents(tmp_path: Path) -> None:
    """A recreation with a hole of a few blocks after every other small file (too many small
    free extents against a snapshot with a third of them): the offline shaping puts files into
    holes of exactly their length, each at its hole's start (debugfs), fewer small free
    extents remain (e2freefrag) and e2fsck finds the file system clean."""
    img = _mkfs(tmp_path / "r.img", 8)
    rng = random.Random(7)
    ex = OfflineExtExecutor(img)
    ex.apply(Op("mkdir", "d"))
    names = [f"d/f{i:03d}" for i in range(240)]
    sizes = {n: rng.randint(2, 6) * KIB for n in names}
    for n in names:
        ex.apply(Op("create", n, sizes[n]))
    for n in names[1::2]:  # every other file gone: a hole between each two left
        ex.apply(Op("delete", n))
    ex.close()
    kept = [_File(n, sizes[n], 0o644, 0) for n in names[::2]]
    before = _small_free_extents(img)
    assert before >= 100

    steer, close = _offline_steerer(img)
    state = steer._measure()
    have = state.target.free_counts
    # The snapshot: a third of the small free extents, the rest as measured.
    want = {k: (n // 3 if k < 4 else n) for k, n in have.items()}
    steer._target = LayoutTarget(KIB, state.target.blocks_total, 0.5, {}, dict(state.target.free),
                                 free_counts=want)  # fmt: skip
    steer._target_free, steer._target_free_counts = steer._target.free, want
    churn = IntervalChurn(1, 0)
    made = steer._shape_offline(state, kept, rng, churn, 1 << 30)
    steer._measure()
    landed = steer.landed()
    close()
    assert made >= 20, churn.kinds
    assert landed == made
    # The oracles: each plug starts at its goal and is written (no unwritten extent left).
    for path, goal, _n in steer.plugs[:10]:
        assert _first_block(img, path) == goal
        assert "Uninit" not in _extents(img, path)
    after = _small_free_extents(img)
    assert after < before - made // 2, (before, after, made)
    subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, check=True)


@pytest.mark.needs_root
def test_a_mounted_replay_runs_an_op_with_a_goal_offline(tmp_path: Path) -> None:
    """A stream of mounted ops with an ``allocate-near`` among them: the session unmounts for
    it (its file starts at the goal, debugfs), mounts again at the next interval end for the
    ops after it, and leaves the file system clean (e2fsck)."""
    from fsage.ager.images import can_loop_mount

    if not can_loop_mount():
        pytest.skip("needs loop devices")
    img = _mkfs(tmp_path / "m.img", 8)
    goal = 6000
    ops = [
        Op("mkdir", "d"),
        Op("create", "d/a", 20 * KIB),
        Op("create", "d/b", 0),
        Op("allocate-near", "d/b", 8 * KIB, 0, label=str(goal)),
        Op("overwrite", "d/b", 8 * KIB, 0),
        Op("snapshot", label="one"),
        Op("create", "d/c", 12 * KIB),
        Op("snapshot", label="two"),
    ]
    counts = run_op_stream(img, ops, mode="mount")
    assert counts.failed == 0 and counts.nospace == 0, counts
    assert _first_block(img, "d/b") == goal
    assert "Uninit" not in _extents(img, "d/b")
    assert _first_block(img, "d/c") > 0
    subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, check=True)


def test_the_interval_line_says_how_many_files_were_placed_offline() -> None:
    """The per-snapshot line a closed-loop replay prints names the offline placements (and how
    many landed) only for an interval where they ran."""
    from fsage.replay.interval import IntervalChurn
    from fsage.replay.recreate import _churn_line

    mounted_only = IntervalChurn(snapshot=3, visible_bytes=1 << 20, stopped="matched")
    assert "offline" not in _churn_line(mounted_only)
    placed = IntervalChurn(snapshot=4, visible_bytes=1 << 20, stopped="matched",
                           offline={"plugs": 1234, "landed": 1230, "rounds": 2})  # fmt: skip
    line = _churn_line(placed)
    assert line.startswith("fsage: snapshot 4: ")
    assert "1,234 files placed offline (1,230 landed)" in line


def test_offline_splits_make_the_small_free_extents_a_recreation_lacks(tmp_path: Path) -> None:
    """A recreation of small files packed end to end and one large free extent, against a
    snapshot with many more free extents of one block: the offline shaping moves files of one
    block into the large free extent a block apart, each at its goal (debugfs), so that their
    old places and the gaps become one-block free extents (e2freefrag counts them), and
    e2fsck finds the file system clean."""
    img = tmp_path / "s.img"
    with open(img, "wb") as fh:
        fh.truncate(16 << 20)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", str(img)],
                   capture_output=True, check=True)  # fmt: skip
    ex = OfflineExtExecutor(img)
    ex.apply(Op("mkdir", "d"))
    names = [f"d/f{i:03d}" for i in range(400)]
    for n in names:
        ex.apply(Op("create", n, 4 * KIB))
    ex.close()
    files = [_File(n, 4 * KIB, 0o644, 0) for n in names]
    before = _small_free_extents(img)

    steer, close = _offline_steerer(img)
    state = steer._measure()
    have = state.target.free_counts
    lack = 120
    want = dict(have)
    want[0] = want.get(0, 0) + lack
    steer._target = LayoutTarget(4 * KIB, state.target.blocks_total, 0.5, {},
                                 dict(state.target.free), free_counts=want)  # fmt: skip
    steer._target_free, steer._target_free_counts = steer._target.free, want
    churn = IntervalChurn(1, 0)
    made = steer._shape_offline(state, files, random.Random(3), churn, 1 << 30)
    steer._measure()
    landed = steer.landed()
    close()
    assert churn.kinds.get("split") == made and "plug" not in churn.kinds, churn.kinds
    assert made >= lack // 4
    assert landed == made
    for path, goal, _n in steer.plugs[:10]:
        assert _first_block(img, path) == goal
        assert "Uninit" not in _extents(img, path)
    after = _small_free_extents(img)
    # Each move leaves two one-block free extents: its old place and the gap before its new one.
    assert after >= before + 2 * made - 2, (before, after, made)
    assert after <= before + lack + 2, (before, after, made)
    subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, check=True)

"""``fsage age --match`` on a git-aged xfs target: a generated repository's history checked
out in three work trees in turn on a loop-mounted 512 MiB xfs (the smallest mkfs.xfs makes
is 300 MB), matched on a fresh image of the same size. The state left on disk is judged with
``xfs_db freesp`` (fullness, free-space histogram, each allocation group's free extents) and
``filefrag`` (layout score per size bucket) as oracles, and ``xfs_repair -n``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.images import loop_mount, make_image
from fsage.ager.match import FREE_TV, MIN_FILES, SCORE_TOL, match_layout
from fsage.ager.match_disk import Disk
from fsage.ager.match_target import DYNAMIC_TOL, FULLNESS_TOL, LayoutTarget
from fsage.ager.match_xfs import (
    files_per_directory,
    group_plan,
    path_neighbours,
    read_after_unmount,
)
from fsage.cli import main
from fsage.cli.age import match_lines
from tests.ager.gitaged import age_with_history, generated_repo
from tests.ager.oracles import filefrag_buckets, free_histograms, tv

MIB = 1 << 20


def _group_tails(image: Path) -> list[int]:
    """The log2 bucket of each allocation group's largest free extent (blocks), as ``xfs_db
    freesp -a`` counts them (-1: none free), the largest first."""
    sb = subprocess.run(
        ["xfs_db", "-r", "-c", "sb 0", "-c", "p agcount", str(image)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    tails = []
    for ag in range(int(sb.split("=")[1])):
        out = subprocess.run(
            ["xfs_db", "-r", "-c", f"freesp -a {ag}", str(image)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        # Rows "from to extents blocks pct", shortest first: the last is the longest.
        rows = [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]
        tails.append(int(rows[-1][0]).bit_length() - 1 if rows else -1)
    return sorted(tails, reverse=True)


class _Groups(Disk):
    """Four allocation groups of 32,768 blocks, the log (16,384 blocks) in the third."""

    kind = "xfs"
    groups, group_blocks = 4, 32768

    def group_capacity(self) -> list[int]:
        return [32768, 32768, 16384, 32768]


def _target(free: dict[int, tuple[int, int]]) -> LayoutTarget:
    """A target whose free space is ``free``: log2 bucket -> (blocks, extents)."""
    return LayoutTarget(
        4096, 131072, 0.34, {0: (600, None), 1: (300, 1.0)},
        {k: b for k, (b, _n) in free.items()}, "t", "xfs",
        {"pairs": 600}, {}, {k: n for k, (_b, n) in free.items()},
    )  # fmt: skip


def test_group_plan_gives_each_group_one_of_the_largest_free_extents() -> None:
    # A git-aged target's free space: three tails of 16,384+ blocks, the log's group's of
    # 8,192+, and small holes.
    plan = group_plan(_Groups(), _target({14: (75341, 3), 13: (10601, 1), 2: (356, 60)}))
    assert plan is not None and not plan.notes
    assert plan.tails[2] == 10601  # the log's group: the one tail it can hold
    assert sorted(plan.tails) == [10601, 25113, 25113, 25113]
    assert plan.rooms == [32768 - 25113, 32768 - 25113, 16384 - 10601, 32768 - 25113]
    assert plan.tail_blocks == {14: 3 * 25113, 13: 10601}  # no spacers for those


def test_group_plan_says_what_the_groups_cannot_give() -> None:
    plan = group_plan(_Groups(), _target({13: (60000, 6), 2: (400, 80)}))
    assert plan is not None and sum(t > 0 for t in plan.tails) == 4
    assert any("2 free extent(s) of 2048+ blocks more" in n for n in plan.notes), plan.notes
    # No tail where the target's free extent is more than a group holds.
    plan = group_plan(_Groups(), _target({15: (40000, 1), 14: (60000, 3), 2: (400, 80)}))
    assert plan is not None and sorted(plan.tails) == [0, 20000, 20000, 20000]
    assert any("longer than any allocation group" in n for n in plan.notes), plan.notes
    # Not xfs, or fewer free extents of a sixteenth of a group than groups less one (not a
    # tree written across the groups): no plan.
    assert group_plan(_Groups(), _target({2: (400, 80)})) is None
    assert group_plan(_Groups(), _target({14: (30606, 1), 13: (8192, 1), 8: (2416, 6)})) is None
    other = _Groups()
    other.kind = "ext4"
    assert group_plan(other, _target({14: (20000, 1)})) is None


def test_files_per_directory_counts_the_directories_holding_files() -> None:
    # 900 files, 600 pairs of consecutive files of one directory: 300 directories hold them.
    assert files_per_directory(_target({14: (20000, 1)})) == pytest.approx(3.0)


def test_path_neighbours() -> None:
    assert path_neighbours("d00012") == ["d00011", "d00013"]
    assert path_neighbours("n00001/d00000") == ["n00001/d00001"]
    assert path_neighbours(".g0-1") == []


@pytest.mark.slow
@pytest.mark.needs_root
def test_match_a_git_aged_xfs(tmp_path: Path) -> None:
    if shutil.which("mkfs.xfs") is None or shutil.which("xfs_db") is None:
        pytest.skip("mkfs.xfs and xfs_db needed")
    ids = generated_repo(tmp_path / "repo", commits=12, files=900, seed=7)
    size = 512 * MIB
    target_img = make_image(tmp_path / "target.img", "xfs", size)
    with loop_mount(target_img) as mnt:
        age_with_history(mnt, tmp_path / "repo", ids, trees=3)
    target = read_after_unmount(target_img).target
    img = make_image(tmp_path / "matched.img", "xfs", size)
    journal = tmp_path / "match.jsonl"
    res = match_layout(img, target, seed=1, mode="mount", time_limit=600.0, journal=journal)
    text = "\n".join(match_lines(res.to_json()))
    assert res.measured_by == "the live reader on a read-only mount after unmount", text
    assert res.matched, text
    repair = subprocess.run(["xfs_repair", "-n", str(img)], capture_output=True, text=True)
    assert repair.returncode == 0, repair.stdout[-2000:] + repair.stderr[-2000:]

    # Fullness and free space as xfs_db counts them, for both images.
    want_full, want_free, _want_n = free_histograms(target_img)
    got_full, got_free, _got_n = free_histograms(img)
    assert abs(got_full - want_full) <= FULLNESS_TOL, (got_full, want_full, text)
    free_tv = tv(want_free, got_free)
    assert free_tv <= FREE_TV, (want_free, got_free, text)
    assert res.report["free_tv"] == pytest.approx(free_tv, abs=0.01)
    # The target's free space is each group's unwritten tail; so is the match's, each in the
    # same log2 bucket as the target's, the largest first.
    want_tails, got_tails = _group_tails(target_img), _group_tails(img)
    assert got_tails == want_tails, (want_tails, got_tails, text)

    # Layout score per size bucket with enough files, as filefrag counts it.
    want_ff, got_ff = filefrag_buckets(target_img, 4096), filefrag_buckets(img, 4096)
    judged = [k for k, (n, _c, d) in want_ff.items() if n >= MIN_FILES and d]
    assert judged
    for k in judged:
        _n, c, d = want_ff[k]
        _gn, gc, gd = got_ff.get(k, (0, 0, 0))
        assert gd and abs(gc / gd - c / d) <= SCORE_TOL, (k, want_ff[k], got_ff.get(k), text)
    # The path-order read, modeled from the state left on disk.
    want_dyn = target.locality["dynamic_score"]
    assert abs(res.report["locality"]["dynamic_score"] - want_dyn) <= DYNAMIC_TOL, text

    # The match is an op stream: run again on a fresh image (the same kernel and mkfs
    # parameters), it leaves the same free space, group by group.
    replayed = make_image(tmp_path / "replayed.img", "xfs", size)
    r = CliRunner().invoke(main, ["age", str(replayed), "--ops", str(journal)])
    assert r.exit_code == 0, r.output
    again_full, again_free, _again_n = free_histograms(replayed)
    assert abs(again_full - got_full) <= 0.002, (again_full, got_full)
    assert tv(got_free, again_free) <= 0.02, (got_free, again_free)
    assert _group_tails(replayed) == got_tails

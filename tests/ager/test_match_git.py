"""``fsage age --match`` on a git-aged target: a generated repository's history checked out
in three work trees in turn on a loop-mounted 128 MiB ext4, matched on a fresh image of the
same size. The state left on disk is judged with e2freefrag (fullness, free-space histogram)
and filefrag (layout score per size bucket) as oracles, not with fsage's own reader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount, make_image
from fsage.ager.match import SCORE_TOL, match_layout, target_from_layout
from fsage.ager.match_target import DYNAMIC_TOL, FULLNESS_TOL, LayoutTarget
from fsage.snapshotter.ext import read_ext_layout
from tests.ager.gitaged import age_with_history, generated_repo
from tests.ager.helpers import fsck_clean
from tests.ager.oracles import filefrag_buckets, free_histograms
from tests.ager.oracles import tv as _tv

MIB = 1 << 20


def _e2freefrag(image: Path) -> tuple[float, dict[int, int]]:
    """(fullness, free blocks per log2 extent length in blocks) as e2freefrag counts them."""
    full, blocks, _extents = free_histograms(image)
    return full, blocks


def _e2freefrag_extents(image: Path) -> dict[int, int]:
    """Free extents per log2 extent length in blocks, as e2freefrag counts them."""
    return free_histograms(image)[2]


def _tree_shape(image: Path) -> tuple[int, int, int]:
    """(directories, regular files, deepest directory below the root) as ``os.walk`` finds
    them on a read-only mount."""
    dirs = files = deepest = 0
    with loop_mount(image, options="ro") as mnt:
        for d, subdirs, names in os.walk(mnt):
            rel = Path(d).relative_to(mnt)
            deepest = max(deepest, len(rel.parts))
            dirs += len(subdirs)
            files += sum(1 for n in names if os.path.isfile(os.path.join(d, n)))
    return dirs, files, deepest


def _filefrag_buckets(image: Path) -> dict[int, tuple[int, int, int]]:
    return filefrag_buckets(image, 4096)


def git_aged_target(tmp_path: Path) -> tuple[Path, LayoutTarget, Path]:
    """A 128 MiB ext4 aged by a generated history checked out in three work trees in turn:
    the image, its layout target, and a fresh image of the same size to match it on."""
    ids = generated_repo(tmp_path / "repo", commits=10, files=700, seed=5)
    size = 128 * MIB
    target_img = make_image(tmp_path / "target.img", "ext4", size)
    with loop_mount(target_img) as mnt:
        age_with_history(mnt, tmp_path / "repo", ids, trees=3)
    target = target_from_layout(read_ext_layout(target_img), "git-aged target")
    return target_img, target, make_image(tmp_path / "matched.img", "ext4", size)


@pytest.mark.slow
@pytest.mark.needs_root
def test_match_a_git_aged_ext4(tmp_path: Path) -> None:
    target_img, target, img = git_aged_target(tmp_path)
    res = match_layout(img, target, seed=1, mode="mount", time_limit=600.0)
    assert res.measured_by == "the offline reader after unmount"
    fsck_clean(img)

    # Fullness and free space as e2freefrag counts them, for both images.
    want_full, want_free = _e2freefrag(target_img)
    got_full, got_free = _e2freefrag(img)
    assert abs(got_full - want_full) <= FULLNESS_TOL, (got_full, want_full)
    assert abs(res.report["fullness"] - got_full) < 0.002  # the report is the disk's state
    tv = _tv(want_free, got_free)
    assert res.report["free_tv"] == pytest.approx(tv, abs=0.01)

    # Layout score per size bucket as filefrag sees the files of both images: what the
    # report says of each judged bucket is what is on disk, and a bucket it calls matched is.
    want_b, got_b = _filefrag_buckets(target_img), _filefrag_buckets(img)
    rows = {r["bucket"]: r for r in res.report["buckets"]}
    for k, (n, c, d) in want_b.items():
        if n < 50 or d == 0:
            continue
        assert rows[k]["target_score"] == pytest.approx(c / d, abs=1e-9)
        _gn, gc, gd = got_b.get(k, (0, 0, 0))
        assert gd and rows[k]["score"] == pytest.approx(gc / gd, abs=1e-9)
        if rows[k]["ok"]:
            assert abs(gc / gd - c / d) <= SCORE_TOL, (k, gc / gd, c / d)

    # The path-order scan: scattered as the target's (a plain copy would read in order).
    want_dyn = target.locality["dynamic_score"]
    assert want_dyn < 0.8
    assert abs(res.report["locality"]["dynamic_score"] - want_dyn) <= DYNAMIC_TOL
    # Fullness and the path-order read are reached on this target every time; the free space
    # and the size buckets not always (the kernel places the fill differently run to run), so
    # the verdict is held to the oracles' figures instead.
    assert res.matched == (tv <= 0.1 and res.report["matched"])


@pytest.fixture(scope="module")
def git_target_256(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 256 MiB ext4 with a generated history of 30 commits over about 1,500 files checked
    out in four work trees in turn: its free space is many holes of 1-255 blocks (git's
    rewrites) and the unwritten rest of a group split in two large extents."""
    from fsage.ager.images import can_loop_mount

    if not can_loop_mount():
        pytest.skip("needs root and loop devices")
    work = tmp_path_factory.mktemp("git256")
    ids = generated_repo(work / "repo", commits=30, files=1500, seed=5)
    img = make_image(work / "target.img", "ext4", 256 * MIB)
    with loop_mount(img) as mnt:
        age_with_history(mnt, work / "repo", ids, trees=4)
    return img


@pytest.fixture(scope="module")
def one_hole_target_256(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The history of ``git_target_256`` checked out around a file fallocated first and
    deleted last: the target's free space is one hole of two thirds of a group (more than
    half, as some checkouts leave the rest of group 0: 24,769 blocks) and the small holes
    git's rewrites leave."""
    from fsage.ager.images import can_loop_mount

    if not can_loop_mount():
        pytest.skip("needs root and loop devices")
    work = tmp_path_factory.mktemp("git256hole")
    ids = generated_repo(work / "repo", commits=30, files=1500, seed=5)
    img = make_image(work / "target.img", "ext4", 256 * MIB)
    with loop_mount(img) as mnt:
        fd = os.open(mnt / "hole", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.posix_fallocate(fd, 0, 22_000 * 4096)
        finally:
            os.close(fd)
        age_with_history(mnt, work / "repo", ids, trees=4)
        os.unlink(mnt / "hole")
    return img


@pytest.mark.slow
@pytest.mark.needs_root
@pytest.mark.parametrize(
    ("shape", "seed"),
    [("git", 1), ("git", 2), ("git", 3), ("one hole", 1), ("one hole", 2), ("one hole", 3)],
)
def test_match_holes_of_a_git_aged_ext4_on_the_kernel(
    request: pytest.FixtureRequest, tmp_path: Path, shape: str, seed: int
) -> None:
    """Matched loop-mounted, every seed: the free-space histogram within 0.1 of the
    target's as e2freefrag counts both images, the fullness within 0.01 and never above
    the target's by more, and the modeled path-order scan within 0.02. Also where the
    target's free space is one hole of more than half a group (the kernel's allocator puts
    files into such a hole unless the fill reserves it first)."""
    fixture = "git_target_256" if shape == "git" else "one_hole_target_256"
    git_target_256: Path = request.getfixturevalue(fixture)
    target = target_from_layout(read_ext_layout(git_target_256), "git-aged target")
    want_full, want_free = _e2freefrag(git_target_256)
    # Holes of the target's that a spacer of the fill has to make: the largest bucket is
    # 4,096 blocks and more, and most of the holes by count are under 16 blocks (their free
    # blocks: 880 to over 1,000 after git's checkouts on the kernel, with the machine's load;
    # fewer where one hole takes most of the free space).
    small = sum(want_free.get(k, 0) for k in range(4))
    assert max(want_free) >= 12 and small > 500
    want_n = _e2freefrag_extents(git_target_256)
    if shape == "one hole":
        assert max(want_n) == 14 and want_n[14] == 1, want_n
    img = make_image(tmp_path / "matched.img", "ext4", 256 * MIB)
    res = match_layout(img, target, seed=seed, mode="mount", time_limit=600.0)
    fsck_clean(img)
    got_full, got_free = _e2freefrag(img)
    assert _tv(want_free, got_free) <= 0.1, (want_free, got_free)
    # And by count: the holes are about as many and as small as the target's (spacers
    # written side by side make one hole: a few percent fewer), not a few larger.
    got_n = _e2freefrag_extents(img)
    assert _tv(want_n, got_n) <= 0.1, (want_n, got_n)
    assert abs(sum(got_n.values()) / sum(want_n.values()) - 1) <= 0.2, (want_n, got_n)
    assert abs(got_full - want_full) <= FULLNESS_TOL and got_full <= want_full + FULLNESS_TOL
    want_dyn = target.locality["dynamic_score"]
    assert abs(res.report["locality"]["dynamic_score"] - want_dyn) <= DYNAMIC_TOL
    assert res.matched, res.reasons
    # Every size bucket of 50 files or more as filefrag sees both images.
    want_b, got_b = _filefrag_buckets(git_target_256), _filefrag_buckets(img)
    for k, (n, c, d) in want_b.items():
        if n >= 50 and d:
            _gn, gc, gd_ = got_b.get(k, (0, 0, 0))
            assert gd_ and abs(gc / gd_ - c / d) <= SCORE_TOL, (k, gc / gd_, c / d)
    # The tree's shape as os.walk sees it: as deep, with as many files per directory.
    (wd, wf, wdeep), (gd, gf, gdeep) = _tree_shape(git_target_256), _tree_shape(img)
    assert gdeep == wdeep >= 4
    assert abs((gf / gd) / (wf / wd) - 1) <= 0.1, ((wd, wf), (gd, gf))

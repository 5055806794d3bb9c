"""The inode order a path-order read meets, in the layout target (``inode_switches``,
``inode_window``, ``in_directory_group``) and as the matcher reproduces it. The oracles are
e2fsprogs (debugfs's directory listings, dumpe2fs's geometry) and ``stat`` on a read-only
mount, never fsage's reader."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount
from fsage.ager.match import match_layout
from fsage.ager.match_locality import ahead_share
from fsage.ager.match_target import LayoutTarget, locality_of
from fsage.snapshotter.ext import read_ext_layout
from tests.ager.helpers import fsck_clean
from tests.ager.test_match_git import git_aged_target
from tests.images import TreeSpec, build_tree, debugfs, dumpe2fs_header, make_ext_image

MIB = 1 << 20
#: Objects (directories and files) in path order: (inode, is a directory, parent's inode).
Walk = list[tuple[int, bool, int]]


def _geometry(image: Path) -> tuple[int, int]:
    """(inodes per group, inodes per 32-block inode-table readahead window), by dumpe2fs."""
    h = dumpe2fs_header(image)
    per_block = int(h["Block size"]) // int(h["Inode size"])
    return int(h["Inodes per group"]), 32 * per_block


def _shares(walk: Walk, ipg: int, per_window: int) -> dict[str, float]:
    """The three shares, computed from a walk as the module doc defines them."""

    def window(ino: int) -> tuple[int, int]:
        return (ino - 1) // ipg, ((ino - 1) % ipg) // per_window

    objs = [window(i) for i, _d, _p in walk]
    switches = sum(a != b for a, b in itertools.pairwise(objs)) / (len(objs) - 1)
    files = [(i, p) for i, d, p in walk if not d]
    pairs = [window(a) == window(b) for (a, pa), (b, pb) in itertools.pairwise(files) if pa == pb]
    same = [(i - 1) // ipg == (p - 1) // ipg for i, p in files]
    return {
        "inode_switches": switches,
        "inode_window": sum(pairs) / len(pairs),
        "in_directory_group": sum(same) / len(same),
    }


def _debugfs_walk(image: Path) -> Walk:
    """Every directory and non-empty regular file in path order (depth first, entries by
    name), from debugfs's ``ls -p`` listings."""
    out: Walk = [(2, True, 2)]

    def visit(path: str, ino: int) -> None:
        (text,) = debugfs(image, [f"ls -p {path or '/'}"])
        rows = []
        for line in text.splitlines():
            m = re.match(r"^/(\d+)/(\d+)/\d+/\d+/(.*)/(\d*)/$", line.strip())
            if m and m.group(3) not in (".", ".."):
                rows.append((m.group(3).encode(), int(m.group(1)), int(m.group(2), 8), m.group(4)))
        for name, child, mode, size in sorted(rows):
            if mode & 0o170000 == 0o040000:
                out.append((child, True, ino))
                visit(f"{path}/{name.decode()}", child)
            elif mode & 0o170000 == 0o100000 and int(size or 0) > 0:
                out.append((child, False, ino))

    visit("", 2)
    return out


def _stat_walk(root: Path) -> Walk:
    """The same walk by ``stat`` on a mounted tree."""
    out: Walk = [(os.lstat(root).st_ino, True, os.lstat(root).st_ino)]

    def visit(d: Path, ino: int) -> None:
        for e in sorted(os.scandir(d), key=lambda e: os.fsencode(e.name)):
            st = e.stat(follow_symlinks=False)
            if e.is_dir(follow_symlinks=False):
                out.append((st.st_ino, True, ino))
                visit(Path(e.path), st.st_ino)
            elif e.is_file(follow_symlinks=False) and st.st_size > 0:
                out.append((st.st_ino, False, ino))

    visit(root, out[0][0])
    return out


def test_inode_order_of_a_layout_is_what_debugfs_lists(tmp_path: Path, e2fsprogs: None) -> None:
    spec = TreeSpec(files=400, dirs=25, hard_links=0, empty_files=0, symlinks=2)
    tree = build_tree(tmp_path / "tree", seed=11, spec=spec)
    img = make_ext_image(
        tmp_path, "ext4", block_size=1024, size="32M", tree=tree, extra=["-g", "1024", "-N", "512"]
    )
    ipg, per_window = _geometry(img)
    want = _shares(_debugfs_walk(img), ipg, per_window)
    got = locality_of(read_ext_layout(img))
    # several groups, and a tree whose files do not all share a window: a test that can fail
    assert ipg < 1000 and 0 < want["inode_switches"] < 1 and want["in_directory_group"] < 0.9
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key


def test_ahead_share_follows_the_targets_pairs() -> None:
    t = LayoutTarget(4096, 1000, 0.5, {1: (10, 1.0)}, {})
    assert ahead_share(t) == 1.0  # not said: every file made ahead
    t.locality["inode_window"] = 0.81
    assert ahead_share(t) == pytest.approx(0.9)
    t.locality["inode_window"] = 0.0
    assert ahead_share(t) == 0.0


@pytest.mark.slow
@pytest.mark.needs_root
def test_match_reproduces_a_checkouts_inode_order(tmp_path: Path) -> None:
    """A git-aged target (a generated history checked out in three work trees in turn)
    keeps a directory's inodes side by side while its data is scattered; the match does
    too, as ``stat`` finds both trees on read-only mounts."""
    target_img, target, img = git_aged_target(tmp_path)
    # The fill sets the inode order: judged after it and one round (the rounds that follow
    # on this small target, which delete files to make holes, let new files take the
    # inodes the deletes left, apart from their neighbours).
    res = match_layout(img, target, seed=1, mode="mount", time_limit=1.0)
    fsck_clean(img)
    ipg, per_window = _geometry(img)
    with loop_mount(target_img, options="ro") as mnt:
        want = _shares(_stat_walk(mnt), ipg, per_window)
    with loop_mount(img, options="ro") as mnt:
        got = _shares(_stat_walk(mnt), ipg, per_window)
    # the target's data is scattered, its inodes are not
    assert target.locality["dynamic_score"] < 0.9 and want["inode_window"] > 0.8
    # (without the fill's files made ahead: 0.75 against a 512 MiB git target's 0.95)
    assert abs(got["inode_window"] - want["inode_window"]) <= 0.05, (got, want)
    # A directory's inode sits by its files' in the match, not always in a checkout's: the
    # match reads fewer windows (0.02-0.04 against 0.08 here; 0.49 without made ahead).
    assert abs(got["inode_switches"] - want["inode_switches"]) <= 0.06, (got, want)
    assert abs(got["in_directory_group"] - want["in_directory_group"]) <= 0.1, (got, want)
    # what the report says of the image left on disk is what stat finds
    loc = res.report["locality"]
    assert loc["inode_window"] == pytest.approx(got["inode_window"], abs=0.01)

"""Where the matcher's inodes go: the inode order a path-order read meets.

A tool that writes a tree (a checkout, an unpack, a copy) makes each directory and then its
files, one after the other: ext4 puts a directory's files in its group's inode table side by
side, in path order, however scattered their data is. A path-order read (``grep -r``, tar, a
backup) then reads each inode-table readahead window once. The fill writes its files in a
scattered order, which places their data as the target's is; if their inodes followed that
order too, the read would jump between inode-table windows far more often than the
target's (a 512 MiB git-aged target: 6 % of the objects of its path-order read in another
window than the previous one's, its match 31 %), and read that many more inode-table
requests — which the dynamic layout score hides, since their blocks raise it as much as
their seeks lower it.

So the fill first makes every directory and, right after it, its files, empty, in path
order (``make_ahead``); the writes later keep those inodes (a create of an existing file
truncates it). The share of files made ahead follows the target's ``inode_window`` (the
share of consecutive files of a directory whose inodes share a window): the others take
their inodes when written, apart from their neighbours.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from fractions import Fraction

from fsage.ager.match_disk import Disk
from fsage.ager.match_target import LayoutTarget


def ahead_share(target: LayoutTarget) -> float:
    """The share of the fill's files made ahead, in path order: a pair of consecutive files
    shares an inode-table window when both were (the others' inodes come after all of
    theirs), so the square root of the target's share of such pairs; all where the target
    does not say."""
    share = target.locality.get("inode_window")
    if share is None:
        return 1.0
    return math.sqrt(min(max(float(share), 0.0), 1.0))


def make_ahead(
    disk: Disk,
    target: LayoutTarget,
    places: range,
    per_dir: Fraction | float,
    path_at: Callable[[int], str],
    seed: int,
) -> None:
    """Make the directories of ``places`` (places in path order, ``per_dir`` to a
    directory on average; ``path_at`` makes a place's directory on first use and names its file) in
    path order, each followed by a share (``ahead_share``) of its files, made empty; then
    commit, so that the writes are written back in their own order, not the creates'.
    ``seed``: which files (a generator of its own, so that the fill's draws stay as they
    were). Nothing where the disk makes directories when their first file is written
    (``lazy_dirs``: xfs, whose groups they are placed in by what they will hold)."""
    rng = random.Random(seed)
    share = ahead_share(target)
    if not places or disk.lazy_dirs:
        return
    first = int(places.start // per_dir)
    last = int((places.stop - 1) // per_dir)
    for d in range(first, last + 1):
        # Directory d holds the places from ceil(d * per_dir) to before ceil((d + 1) * per_dir).
        lo = max(math.ceil(d * per_dir), places.start)
        hi = min(math.ceil((d + 1) * per_dir), places.stop)
        path_at(lo)  # the directory, before its files
        disk.precreate([path_at(i) for i in range(lo, hi) if rng.random() < share])
    disk.commit()

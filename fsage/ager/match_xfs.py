"""How ``fsage age --match`` places an xfs target's files: allocation groups, not spacers.

xfs puts a new directory's inode in the next allocation group in turn (its rotor), a file's
inode in its directory's group and the file's data near its inode, first fit from the front
of the group. A tree written by checkouts (git, tar) therefore fills every group from its
front and leaves each one free extent, its unwritten tail: a 512 MiB git-aged target's four
groups had free tails of 26,754, 23,040, 10,601 (the group holding the 16,384-block log) and
25,547 blocks, 99.5 % of its free space. Made with spacers, the 10,601-block extent split a
group that had no log into two holes of 8,192-16,383 blocks, and the log's group took more
than its share (a free-space TV of 0.315).

So on xfs the largest free extents of the target, one per group, are the groups' tails
(``group_plan``): each group is given a share of the fill's blocks, its capacity (less the
log) less its tail, and the matcher's directories are placed in the group furthest below
its share as their first file is written (``MountedDisk.balance_groups``); only the free
extents that are no group's tail are made with spacers. Directories hold the target's
files per directory in a path-order read (``files_per_directory``: files over the
directories that hold them, not over every directory), since on xfs every step from one
directory to the next is a jump to another group.

``read_after_unmount`` reads the state left on an xfs image once unmounted: the live reader
on a read-only mount, without the reservations and speculative preallocations of a
read-write one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fsage.ager.match_target import LayoutTarget, MeasuredState, measure

if TYPE_CHECKING:
    from fsage.ager.match_disk import Disk

#: Free extents at least this share of a group may be a group's unwritten tail: the holes
#: between files are spacers (a fragmented target's holes of 256-511 blocks taken for tails
#: left two groups to be filled to their last 400 blocks, and its free-space TV at 0.4).
TAIL_SHARE = 1 / 16


@dataclass
class GroupPlan:
    """Each allocation group's planned free tail and its share of the fill (blocks)."""

    tails: list[int]
    rooms: list[int]
    #: log2 bucket -> blocks of the target's free extents that are group tails (no spacers).
    tail_blocks: dict[int, int]
    #: What the groups cannot give the target (said where the free space is not matched).
    notes: list[str]


def _large_extents(target: LayoutTarget, most: int, least: int) -> list[tuple[int, int]]:
    """The target's ``most`` largest free extents of buckets of ``least`` blocks or more, as
    (bucket, length): each bucket's extents at its mean length (the histogram keeps no
    more)."""
    out: list[tuple[int, int]] = []
    for k in sorted(target.free, reverse=True):
        n = target.free_counts.get(k, 0)
        if (1 << k) < least or not n:
            continue
        mean = target.free[k] // n
        out += [(k, mean)] * n
        if len(out) >= most:
            break
    return out[:most]


def group_plan(disk: Disk, target: LayoutTarget) -> GroupPlan | None:
    """The tails and shares of ``disk``'s allocation groups for ``target``, or None where not
    xfs, its groups are not known, or the target has no free extent large enough to be a
    tail in all groups but one. The largest tails go to the groups that can hold them (the
    log's group last)."""
    cap = disk.group_capacity()
    if disk.kind != "xfs" or not cap or not target.free_counts:
        return None
    least = max(1, int(max(cap) * TAIL_SHARE))
    ext = _large_extents(target, len(cap), least)
    if len(ext) < len(cap) - 1:
        # A tree written across the groups leaves each one a tail (the log's group may be
        # filled); a target with fewer was not (a fragmented ext4 target's two: 0.4 off in
        # free space planned so, matched by the spacers and a group kept empty).
        return None
    notes = []
    more = sum(target.free_counts.get(k, 0) for k in target.free if 1 << k >= least) - len(ext)
    if more > 0:
        notes.append(
            f"the target has {more} free extent(s) of {least}+ blocks more than this file"
            f" system has allocation groups ({len(cap)}): those are made with spacers, which"
            " the groups' allocator may split"
        )
    # The largest extents to the largest groups; a group whose capacity is below its extent's
    # bucket gets the next smaller extent instead.
    order = sorted(range(len(cap)), key=lambda g: -cap[g])
    tails = [0] * len(cap)
    left = sorted(ext, key=lambda e: -e[1])
    tail_blocks: dict[int, int] = {}
    for g in order:
        fit = next((e for e in left if e[1] < cap[g]), None)
        if fit is None:
            continue
        left.remove(fit)
        tails[g] = fit[1]
        tail_blocks[fit[0]] = tail_blocks.get(fit[0], 0) + fit[1]
    for k, length in left:
        notes.append(
            f"the target's free extent of about {length} blocks (bucket {1 << k}+) is longer"
            f" than any allocation group here can hold ({max(cap)} blocks)"
        )
    rooms = [max(c - t, 0) for c, t in zip(cap, tails, strict=True)]
    return GroupPlan(tails, rooms, tail_blocks, notes)


def expect_directories(
    disk: Disk, order: list[tuple[str, int, int]], places: list[int], dir_of: Callable[[int], str]
) -> None:
    """Tell ``disk`` the blocks each directory of the fill is to hold: ``order``'s items
    (kind, bucket, blocks) other than spacers take ``places`` in turn (``dir_of``: a place's
    directory); a spacer goes to the directory of the file before it (its directory's group
    holds its hole: a group given all the spacers holds as many fewer files, and spacers
    written one after the other make one hole)."""
    held: dict[str, int] = {}
    taken = iter(places)
    d = ""
    for kind, _v, blocks in order:
        if not kind.startswith("spacer"):
            d = dir_of(next(taken))
        if d:
            held[d] = held.get(d, 0) + (1 if kind == "wall+" else blocks)
    disk.expect(held)


def files_per_directory(target: LayoutTarget) -> float | None:
    """Files per directory as a path-order read meets them: the target's files over the
    directories holding at least one (files less pairs of consecutive files of one
    directory), where its locality says; None where not known."""
    pairs = target.locality.get("pairs")
    files = sum(n for n, _s in target.buckets.values())
    if pairs is None or files <= int(pairs):
        return None
    return max(1.0, files / (files - int(pairs)))


def path_neighbours(rel: str) -> list[str]:
    """The directories before and after ``rel`` in the matcher's path order (its names are
    a letter and a number: ``d00012`` has ``d00011`` and ``d00013``). A checkout's
    directories go to the groups in turn, so a path-order read jumps from one directory's
    files to the next one's: placed in the same group, the next directory's first file
    was written after the last one's (a git-aged target's reads jumped at 4,287 of its
    4,304 steps from one directory to the next, its match's at 3,680)."""
    head, name = rel.rpartition("/")[::2]
    if len(name) < 2 or not name[1:].isdigit():
        return []
    i, width = int(name[1:]), len(name) - 1
    pre = f"{head}/{name[0]}" if head else name[0]
    return [f"{pre}{j:0{width}d}" for j in (i - 1, i + 1) if j >= 0]


def read_after_unmount(image: Path) -> MeasuredState:
    """The state left on the unmounted xfs ``image``, read by the live reader on a read-only
    loop mount (FIEMAP and GETFSMAP see what is on disk, with none of a read-write mount's
    reservations or speculative preallocations)."""
    from fsage.ager.images import loop_mount
    from fsage.snapshotter.live import read_live_layout

    with loop_mount(image, options="ro") as mnt:
        return measure(read_live_layout(mnt))

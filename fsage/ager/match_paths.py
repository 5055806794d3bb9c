"""The matcher's path order (``fsage age T --match``): the paths its files and spacers get,
the directories made for them, and the places in path order of files written one after the
other (scattered as the target's consecutive files are).

A part of ``match_fill.MatchWriter``.
"""

from __future__ import annotations

import errno
import math
import random
from fractions import Fraction
from typing import Any

from fsage.ager.match_disk import Disk
from fsage.ager.match_locality import make_ahead
from fsage.ager.match_target import LayoutTarget
from fsage.ager.match_xfs import GroupPlan
from fsage.workload import NoSpaceError

#: Files per directory of the matcher's where the target does not say (see ``tree_shape``).
PER_DIR = 256


class PathOrder:
    """The paths of the matcher's files (a part of ``MatchWriter``)."""

    disk: Disk
    target: LayoutTarget
    rng: random.Random
    bs: int
    total: int
    serial: int
    spacer_serial: int
    dirs_made: set[str]
    levels: int
    per_dir: Fraction | float
    nest: Fraction | float
    groups_plan: GroupPlan | None
    _last_dir: str
    _spacer_share: float
    _inputs: dict[str, Any] | None

    def _path_at(self, pos: int, prefix: str = "d") -> str:
        """The path at place ``pos`` of the matcher's path order (its directory made on
        first use)."""
        j = int(pos // self.per_dir)
        # Each level's index from the one below it, so that a directory has one parent
        # (as j // nest**lv where nest is whole).
        up = [j]
        for _ in range(self.levels):
            up.append(int(up[-1] // self.nest))
        parts = [f"n{i:05d}" for i in reversed(up[1:])]
        d = ""
        for part in [*parts, f"{prefix}{j:05d}"]:
            d = f"{d}/{part}" if d else part
            if d not in self.dirs_made:
                self._mkdir(d)
        return f"{d}/f{pos:08d}"

    def _mkdir(self, d: str) -> None:
        try:
            self.disk.mkdir(d)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise NoSpaceError(f"no space left for directory {d} of the matcher's") from None
        self.dirs_made.add(d)

    def _new_path(self) -> str:
        i = self.serial
        self.serial += 1
        return self._path_at(i)

    def _spacer_path(self) -> str:
        """Spacers go to directories of their own (a few: they hold no files once the
        fill is done)."""
        self.spacer_serial += 1
        i = self.spacer_serial
        d = f"s{i // (PER_DIR * 4):05d}"
        if self.groups_plan is not None and self._last_dir:
            d = self._last_dir  # on xfs, beside the file it follows (see match_xfs)
        if d not in self.dirs_made:
            self._mkdir(d)
        return f"{d}/s{i:08d}"

    def _scattered_places(self, n: int, breaks: frozenset[int] = frozenset()) -> list[int]:
        """Places in path order for ``n`` files about to be written one after the other, so
        that a path-order read finds as many consecutive files adjacent as the target's: runs
        of files written in turn keep their order (the allocator puts them side by side), a
        new run starting with the odds of a target's pair not being adjacent; the runs are
        then shuffled, which scatters a directory's files over the disk as the target's are:
        the runs moved within about half a MiB of their place in write order stay near their
        neighbours; a run moved farther makes the pairs on both of its sides distant, so that
        a share ``d`` of runs moved leaves ``(1 - d) ** 2`` of the boundaries near: ``d`` is
        chosen for the target's share of non-adjacent pairs within 1 MiB, and the runs moved
        go within a group (between a MiB and a group away) or anywhere in the shares of the
        target's pairs within a group and farther. A target without locality keeps write
        order. ``breaks``: files (by write index) after which a spacer is written: a run ends
        there (a spacer inside a run leaves a hole between two files read one after the
        other), and the other ends are drawn fewer to make up for them."""
        loc = self.target.locality
        adjacent = float(loc.get("adjacent", 1.0))
        # On xfs a spacer lies between the file before it and the next one of its run: the
        # pairs it breaks, a hole apart, are near pairs the runs need not make.
        p = min(1.0, adjacent / (1.0 - self._spacer_share))
        rest = max(1.0 - p, 1e-9)
        near = min(1.0, max(float(loc.get("within_mib", rest)) - (p - adjacent), 0.0) / rest)
        in_group = float(loc.get("within_group", 0.0))
        farther = float(loc.get("farther", 0.0))
        moved = 1.0 - math.sqrt(near)
        # A run moved anywhere lands within a group of its neighbour with the odds of two
        # points of the disk being that close: the runs moved within a group make up the
        # rest of the target's share.
        gb = self.disk.group_blocks or 8 * self.bs
        g = min(1.0, gb / max(self.total, 1))
        by_chance = 2 * g - g * g
        share = in_group / max(in_group + farther, 1e-9)
        to_group = moved * max(0.0, (share - by_chance) / max(1.0 - by_chance, 1e-9))
        forced = len(breaks)
        if forced and n > forced:
            p = 1.0 - max(0.0, ((1.0 - p) * n - forced) / (n - forced))
        runs: list[list[int]] = []
        cur: list[int] = []
        for i in range(n):
            if cur and (i - 1 in breaks or self.rng.random() >= p):
                runs.append(cur)
                cur = []
            cur.append(i)
        if cur:
            runs.append(cur)
        t = self.target
        files = max(1, sum(c for c, _s in t.buckets.values()))
        per_file = max(1.0, t.fullness * t.blocks_total / files)
        per_run = per_file * n / max(len(runs), 1)
        window = max(1.0, (1 << 20) / self.bs / per_run / 4)
        group = max(4 * window, gb / per_run)
        if self.groups_plan is not None:
            # On xfs the writes go to all groups at once: a run moved by n places lands
            # about n / groups runs from its neighbours in its group.
            window, group = window * self.disk.groups, group * self.disk.groups
        keys: list[float] = []
        for i in range(len(runs)):
            u = self.rng.random()
            if u < to_group:
                side = 1 if self.rng.random() < 0.5 else -1
                keys.append(i + side * self.rng.uniform(4 * window, group))
            elif u < moved:
                keys.append(self.rng.uniform(0, len(runs)))
            else:
                keys.append(i + self.rng.uniform(-window, window))
        runs = [runs[i] for i in sorted(range(len(runs)), key=keys.__getitem__)]
        place = [0] * n
        for rank, i in enumerate(i for run in runs for i in run):
            place[i] = self.serial + rank
        # Directories made in path order, as a checkout makes them, each with its files
        # (empty: their inodes in path order; see match_locality).
        span = range(self.serial, self.serial + n)
        if self._inputs is None:  # a resumed fill's directories and files are there
            make_ahead(self.disk, self.target, span, self.per_dir, self._path_at, self.serial + n)
        self.serial += n
        return place

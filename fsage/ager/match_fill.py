"""The matcher's writes and its fill (``fsage age T --match``): the files it keeps track of,
the paths it gives them, and the first fill of the target's files and spacer holes.

``match_steer`` steers from here in rounds; ``match`` runs the rounds.
"""

from __future__ import annotations

import contextlib
import errno
import math
import random
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

from fsage.ager.match_dirs import tree_shape
from fsage.ager.match_disk import Disk
from fsage.ager.match_holes import SMALL, Item, SpacerOrder
from fsage.ager.match_locality import make_ahead
from fsage.ager.match_target import MIN_FILES, LayoutTarget, MeasuredState, measure
from fsage.ager.match_xfs import expect_directories, files_per_directory, group_plan
from fsage.analyzer.analysis import bucket_range
from fsage.workload import NoSpaceError

PER_DIR = 256
#: Directories of the matcher's per parent directory, where the target is deeper than its.
NEST = 8
#: The matcher fills a file system to at most this (it needs room to rewrite files).
MAX_FULLNESS = 0.97
#: With spacers in the holes of every size, the fill tops up to this before deleting them
#: (at 0.995, a mail target 0.842 full with 0.158 in holes was filled 0.005 short, and the
#: blocks allocated after to make up for it cut its largest hole).
FILL_CEILING = 0.999
#: Jumps a wall file adds to a path-order read, on average (see ``fill``).
WALL_JUMPS = 0.6


class MatchWriter(SpacerOrder):
    """The matcher's files on ``disk`` and the fill that writes them."""

    def __init__(
        self,
        disk: Disk,
        target: LayoutTarget,
        *,
        seed: int = 0,
        time_limit: float = 600.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.disk = disk
        self.target = target
        self.rng = random.Random(seed)
        self.time_limit = time_limit
        self.say = say or (lambda s: None)
        self.bs = disk.bs
        self.total = disk.total
        self.paths: dict[int, str] = {}  # inode -> path (relative to the area)
        self.sizes: dict[str, int] = {}
        self.serial = 0
        self.spacer_serial = 0
        self.dirs_made: set[str] = set()
        # The target's depth, as directories between the matcher's area (depth 1) and the
        # directories of its files; not on xfs, whose directories are placed one by one.
        depth = int(target.locality.get("max_depth") or 0)
        self.levels = max(0, min(depth - 2, 16)) if not disk.groups else 0
        #: Files per directory of files and directories per parent directory (fractions: a
        #: directory holds the places from ceil(j * per_dir) on; see ``_path_at``).
        self.per_dir: Fraction | float
        self.per_dir, self.nest = tree_shape(target, self.levels, PER_DIR, NEST)
        #: On xfs, the allocation groups' shares and free tails (see ``match_xfs``).
        self.groups_plan = group_plan(disk, target)
        self._last_dir = ""  # of the file written last
        #: Spacers per file of the fill, where each breaks a run (see ``_scattered_places``).
        self._spacer_share = 0.0
        if self.groups_plan is not None:
            disk.balance_groups(self.groups_plan.rooms)
            self.per_dir = files_per_directory(target) or self.per_dir
        self.last_actions: dict[str, str] = {}
        #: Files allocated (not written) to take blocks from the large free extents.
        self.fillers: list[str] = []
        #: The fill makes the largest holes with spacers too (see ``fill``): the first fill's
        #: way where spacers are allocated whole (``_allocate_spacer``), the second's else.
        self.top_spacer = self._spacer_limit() > 2 * self.bs and disk.can_punch
        #: Spacers allocated with a wall block after them: blocks to punch when they go.
        self.walled: dict[str, int] = {}
        #: What a read-write mount holds back, as a share of the disk (see ``fullness``).
        self._held_back: float | None = None
        #: Wall files written by the fill (see ``_walled``).
        self.walls = 0
        #: Share of the breaks of the buckets written in pieces left out (see ``fill``).
        self._piece_relief = 0.0
        self.files_written = 0
        self.bytes_written = 0
        #: Told what a fill's plan was drawn from, and "top-up" once its planned files are
        #: written (the record keeps it, so that ``--resume`` can go on with the fill).
        self.on_fill: Callable[[dict[str, Any]], None] | None = None
        #: A first fill stopped in its planned files, resumed: its inputs, and the files on
        #: disk (path -> size) that it keeps rather than writes (see ``resume_fill``).
        self._inputs: dict[str, Any] | None = None
        self._kept: dict[str, int] = {}
        self._kept_ino: dict[str, int] = {}
        self._largest: int | None = None
        self.fills = 0

    # -- primitives

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

    def _written(self, rel: str, ino: int, size: int) -> None:
        self._last_dir = rel.rpartition("/")[0]
        self.paths[ino] = rel
        self.sizes[rel] = size
        self.files_written += 1
        self.bytes_written += size

    @contextlib.contextmanager
    def _undone_if_no_space(self, rels: list[str]) -> Iterator[None]:
        """A write that runs out of space leaves no part of its files behind."""
        try:
            yield
        except (OSError, NoSpaceError) as exc:
            if isinstance(exc, OSError) and exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            for rel in rels:
                self.disk.unlink(rel)
            self.disk.commit()
            raise NoSpaceError(
                f"no space left writing {len(rels)} file(s) of the matcher's"
                " (their unfinished blocks freed again)"
            ) from None

    def write_whole(self, rel: str, size: int, at_once: bool = False) -> None:
        with self._undone_if_no_space([rel]):
            ino = self.disk.create(rel, size, at_once)
        self._written(rel, ino, size)

    def write_interleaved(self, items: list[tuple[str, int]], chunk: int) -> None:
        with self._undone_if_no_space([rel for rel, _ in items]):
            inos = self.disk.interleave(items, chunk)
        for (rel, size), ino in zip(items, inos, strict=True):
            self._written(rel, ino, size)

    def delete(self, ino: int) -> str | None:
        rel = self.paths.pop(ino, None)
        if rel is None:
            return None
        self.disk.unlink(rel)
        self.sizes.pop(rel, None)
        return rel

    def fullness(self) -> float:
        """The fullness the file system will have once unmounted: on xfs, the disk's
        (statvfs) less the reservations a read-write mount holds (measured once, as the
        difference from the free-space map; see ``measure``)."""
        if self.disk.kind == "xfs":
            # Written back first: until then statvfs counts each new extent's worst-case
            # btree blocks as used (a git-like fill of small files stopped a third of the
            # way, its files taking the budget a few times over).
            self.disk.commit()
        if self._held_back is None:
            self._held_back = 0.0
            if self.disk.kind == "xfs":
                self._held_back = self.disk.fullness() - self.snapshot().target.fullness
        return self.disk.fullness() - self._held_back

    def snapshot(self) -> MeasuredState:
        return measure(self.disk.layout())

    # -- fill

    def _draw_blocks(self, k: int) -> int:
        """A size in bucket ``k``, drawn with the mean of the target's files of that bucket
        where it is known: lo + (hi - lo) * u ** a has mean lo + (hi - lo) / (a + 1). Drawn
        evenly instead, a bucket of mostly small files (source code) comes out larger, and
        the fill reaches the target's fullness with fewer files than the target has (more
        blocks read per seek in a path-order read)."""
        lo, hi = bucket_range(k)
        n = self.target.buckets.get(k, (0, None))[0]
        held = self.target.bucket_blocks.get(k)
        if not held or not n or hi == lo:
            return self.rng.randint(lo, hi)
        mean = min(max(held / n, lo + 0.01), hi - 0.01)
        a = (hi - lo) / (mean - lo) - 1.0
        return lo + min(hi - lo, int((hi - lo + 1) * self.rng.random() ** a))

    def _draw_between(self, lo: int, hi: int, mean: float | None) -> int:
        """An integer in ``lo``-``hi`` drawn with mean about ``mean`` (even where not known):
        lo + (hi - lo) * u ** a has mean lo + (hi - lo) / (a + 1)."""
        if mean is None or hi <= lo:
            return self.rng.randint(lo, hi)
        mean = min(max(mean, lo + 0.01), hi - 0.01)
        a = (hi - lo) / (mean - lo) - 1.0
        return lo + min(hi - lo, int((hi - lo + 1) * self.rng.random() ** a))

    def _to_bucket_blocks(self, items: list[Item], scale: float) -> list[Item]:
        """The drawn sizes nudged a block at a time, within their buckets, until each
        bucket's files hold as many blocks as the target's (scaled): drawn sizes that come
        out larger leave the fill's budget short, and the files it then leaves out make a
        path-order read of fewer, larger files than the target's (fewer jumps, a higher
        dynamic layout score)."""
        by_k: dict[int, list[int]] = {}
        for i, (kind, v, _b) in enumerate(items):
            if kind != "spacer":
                by_k.setdefault(v, []).append(i)
        out = list(items)
        for k, idx in by_k.items():
            held = self.target.bucket_blocks.get(k)
            lo, hi = bucket_range(k)
            if not held or hi == lo:
                continue
            want = round(
                held * scale * len(idx) / max(len(idx), round(self.target.buckets[k][0] * scale), 1)
            )
            sizes = [out[i][2] for i in idx]
            diff = sum(sizes) - want
            step = -1 if diff > 0 else 1
            movable = [j for j, b in enumerate(sizes) if lo <= b + step <= hi]
            while diff and movable:
                j = movable[self.rng.randrange(len(movable))]
                sizes[j] += step
                diff += step
                if not lo <= sizes[j] + step <= hi:
                    movable.remove(j)
            for i, b in zip(idx, sizes, strict=True):
                out[i] = (out[i][0], out[i][1], b)
        return out

    def _size_of(self, blocks: int) -> int:
        return (blocks - 1) * self.bs + self.rng.randint(1, self.bs)

    def _keep_a_group_empty(self) -> None:
        """Where free extents are bounded by regions (xfs allocation groups) and files are
        spread over all of them, each region keeps a share of the free space: a target whose
        largest free extents are larger than that share is reached only by keeping one region
        free of new files (the last: the first holds the log)."""
        d = self.disk
        want = self.target.free_fractions()
        if not d.groups or d.groups < 2 or not want:
            return
        free_after = (1.0 - self.target.fullness) * self.total
        top = max(want)
        if not (
            want[top] * free_after >= 1 << top > free_after / d.groups
            and 1 << top <= d.group_blocks
        ):
            return
        d.keep_group_empty(d.groups - 1)

    def _spacer_limit(self) -> int:
        """The largest spacer (in blocks) the allocator keeps whole: written, a quarter of an
        ext block group (8 x block size blocks; writeback splits more); allocated at once
        (fallocate, on the kernel), half a group."""
        if self.disk.can_fallocate and not self.disk.can_place:
            return 4 * self.bs
        return 2 * self.bs

    def _top_as_spacer(self, k: int, blocks: float) -> bool:
        """Whether the holes of the largest bucket ``k`` (``blocks`` in all) can be spacers:
        where the allocator keeps a spacer of the bucket's largest size whole, or, allocated
        at once (the large spacers first) on an empty disk of a few block groups, one of the
        largest the plan draws (at most ``blocks``) fits in a group less a sixteenth (a
        1 KiB-block target's one hole of 5,000 blocks, a 4 KiB one's of 30,600: the unwritten
        rest of the disk is split among the groups the files go to, and no file of the
        matcher's is large enough to punch such a hole into)."""
        if 2 << k <= self._spacer_limit():
            return True
        largest = min((2 << k) - 1, round(blocks))
        group = 8 * self.bs
        if not (self.disk.can_fallocate and self.disk.can_punch and not self.disk.can_place):
            return False
        if self.total >= 3 * group:
            # Or larger than a group, where the empty disk has a free extent across groups
            # that holds it (a git-aged 1 GiB target's files in its first five groups, the
            # next two one hole of 65,407 blocks: the files went to every group): fallocated
            # first, the allocator gives it nearly whole (63,488 blocks, the rest nearby).
            return largest <= group - group // 16 or group < largest <= self._largest_free()
        # A disk of one or two groups (a 256 MiB ext4: its inode tables fill the start of the
        # first, its journal the start of the second): a hole of more than half a group is
        # left by the files going around it. The spacer is allocated first, whole, where the
        # empty disk has a free extent that holds it and its wall block with room to spare.
        return largest + 1 <= self._largest_free() - group // 16

    def _largest_free(self) -> int:
        """The disk's largest free extent when the fill began, in blocks."""
        if self._largest is None:
            free_len = self.snapshot().free_len
            self._largest = int(free_len.max()) if len(free_len) else 0
        return self._largest

    def _allocate_spacer(self, rel: str, blocks: int) -> bool:
        """On the kernel, a large spacer is allocated (fallocate) rather than written: the
        allocator serves it at once, whole, from the start of a free extent large enough,
        where writeback would split it a few MiB at a time among the files written with it.
        What was written before it is synced first, so that it lies between them and this
        spacer (two spacers side by side would make one hole). Only where the largest holes
        are spacers too: spacers allocated at once take the start of the unwritten rest, which
        the files written after them then split. The file written between two
        spacers may be placed elsewhere, so each spacer has a block more, its last, which
        stays when the rest is punched (``walled``). False where not done."""
        if self.disk.can_place or not self.disk.can_fallocate or not self.disk.can_punch:
            return False
        self.disk.commit()
        with self._undone_if_no_space([rel]):
            ino = self.disk.allocate(rel, (blocks + 1) * self.bs, None)
        if ino is None:
            return False
        self.paths[ino] = rel
        self.sizes[rel] = (blocks + 1) * self.bs
        self.walled[rel] = blocks
        self.files_written += 1
        return True

    def _piece(self, key: int, group: list[tuple[str, int]]) -> int:
        """Blocks per piece of files written in turn: 1 for a bucket's fragmented files
        (``key`` >= 0, score about 0), else (``-key``: a bucket written in pieces) the length
        that gives the bucket's score: ``n`` blocks in pieces of ``L`` have ``n - ceil(n / L)``
        contiguous blocks of ``n - 1``, about ``1 - 1 / L``; ``L`` is drawn between the two
        whole lengths around ``1 / (1 - score)`` with the odds that give that mean of
        ``1 / L``."""
        score = self.target.buckets.get(-key, (0, None))[1] if key < 0 else None
        if score is None or score >= 1.0:
            return 1
        score += (1.0 - score) * self._piece_relief
        n = sum(size for _rel, size in group) / len(group) / self.bs
        # ceil(n / L) pieces for (1 - score) * (n - 1) + 1 extents.
        pieces = max(1.0, (1.0 - score) * (n - 1) + 1)
        x = max(1.0, n / pieces)
        lo = int(x)
        if lo >= x:
            return lo
        hi = lo + 1
        p_lo = (1 / x - 1 / hi) / (1 / lo - 1 / hi)
        return lo if self.rng.random() < p_lo else hi

    def resume_fill(self, inputs: dict[str, Any]) -> None:
        """Go on with a first fill stopped in its planned files (``inputs``: what its plan
        was drawn from, as ``on_fill`` was told): the plan is drawn again from the same seed,
        and the files on disk that it holds whole are kept rather than written again."""
        self.adopt()
        self._kept = dict(self.sizes)
        self._kept_ino = {rel: ino for ino, rel in self.paths.items()}
        self.paths.clear()
        self.sizes.clear()
        self.serial = self.spacer_serial = 0
        # Made ahead and not written yet: written in place, keeping their inodes.
        self.disk.made_ahead([rel for rel, size in self._kept.items() if size == 0])
        self._inputs = inputs

    def _kept_whole(self, rel: str, least: int) -> bool:
        """Whether ``rel`` is a file of the resumed fill written whole (at least ``least``
        bytes) before it stopped: then it is the matcher's again, as it is."""
        size = self._kept.pop(rel, 0)
        if size < least:
            if size:
                self._kept[rel] = size  # cut short: written again, or deleted after
            return False
        self.paths[self._kept_ino[rel]] = rel
        self.sizes[rel] = size
        return True

    def _drop_unkept(self) -> None:
        """The resumed fill's files it did not keep (cut short and then left out of the
        plan) are deleted; those made ahead and never written go with ``drop_precreated``."""
        for rel, size in self._kept.items():
            if size and rel not in self.sizes:
                self.disk.unlink(rel)
        self._kept = {}
        self._inputs = None

    def fill(self) -> None:
        """Write the target's files, a share ``1 - score`` of each bucket's files with their
        blocks interleaved (score about 0) and the rest whole (about 1), mixed with spacer
        files sized like the target's free extents; top up to the target's fullness (with
        the spacers still there, so nearly full), then delete the spacers. Where free extents
        are bounded by regions (xfs allocation groups), the largest bucket is left to the
        unwritten rest of the disk instead (a region kept empty)."""
        t = self.target
        self.fills += 1
        inputs = self._inputs
        if inputs is not None:
            self.top_spacer = bool(inputs["top_spacer"])
            self._largest = inputs.get("largest")
        else:
            self._largest = None
        if self.groups_plan is None:
            self._keep_a_group_empty()
        tails = self.groups_plan.tail_blocks if self.groups_plan else {}
        scale = self.total / t.blocks_total if t.blocks_total else 1.0
        plan: list[tuple[str, int]] = []
        for k, (n, score) in t.buckets.items():
            count = max(0, round(n * scale))
            if score is not None and k >= 1 and n < MIN_FILES and score < 1.0:
                # A bucket the rounds do not steer (too few files to judge), whose blocks
                # still count in a path-order read (a mail target's few large files, each of
                # dozens of extents): every file written in pieces, so that the bucket's
                # score is the target's however few files it has.
                plan += [("chunk", k)] * count
                continue
            frag = round(count * (1.0 - score)) if score is not None and k >= 1 else 0
            plan += [("frag", k)] * frag + [("whole", k)] * (count - frag)
        free_after = (1.0 - t.fullness) * self.total
        want = t.free_fractions()
        top = -1
        if want:
            # The largest bucket is the unwritten rest of the disk, which the allocator may
            # split where it puts the last files (a 13,700-block extent of a 256 MiB target
            # came out as 8,450 + 2,860 blocks); with ``top_spacer`` its holes are spacers
            # too, placed first, at the cost of a fill that leaves no room (its shortfall in
            # fullness is made up after, from the large holes). Not offline (it cuts the
            # largest extent where it wants), nor where the largest holes are larger than
            # the allocator keeps a spacer whole (``_spacer_limit``).
            top = max(want, key=lambda k: want[k])
            alone = not (self.disk.groups or self.disk.can_place)
            if self.top_spacer and alone and self._top_as_spacer(top, want[top] * free_after):
                top = -1
            if top < max(want) or tails:
                # The bucket holding the most free blocks is not the largest extents (a mail
                # target's free space is mostly holes of a few blocks): no rest of the disk
                # can give it, its holes are spacers like the others'. On xfs the groups'
                # tails are the rest of the disk, and every other free extent a spacer.
                top = -1
            for k, f in want.items():
                if k == top:
                    continue
                # A hole of exactly 1 << k blocks is kept; the groups' tails are no spacers.
                left = round(f * free_after) - tails.get(k, 0)
                while left >= 1 << k:
                    # Every block of the bucket goes into a hole of its size: the last hole
                    # takes what is left when it fits, and no draw leaves less than a hole.
                    hi = (1 << (k + 1)) - 1
                    if left <= hi:
                        b = int(left)
                    else:
                        # With the mean of the target's holes of this bucket, where known: a
                        # mail target's 8-15-block holes are mostly of 8 or 9 blocks, and as
                        # many blocks in even draws make a quarter fewer holes.
                        top_b = min(hi, int(left) - (1 << k))
                        b = self._draw_between(1 << k, top_b, t.free_mean(k))
                    plan.append(("spacer", b))
                    left -= b
        # Sizes drawn now, so that the order below knows which files share the allocator's
        # small-file preallocations with which spacers.
        items = [(kind, v, v if kind == "spacer" else self._draw_blocks(v)) for kind, v in plan]
        items = self._to_bucket_blocks(items, scale)
        self.rng.shuffle(items)
        # Large spacers go first, while the disk is empty: written among the other files, the
        # allocator finds no free extent of their size in their group and splits them (an
        # 8,200-block spacer as 6,144 + 2,070 blocks), leaving two smaller holes. Each is
        # followed by a whole file, so that two of them never make one hole.
        big = sorted(
            (
                i
                for i, (kind, v, _b) in enumerate(items)
                if kind == "spacer" and v * self.bs >= 1 << 20
            ),
            key=lambda i: -items[i][1],
        )
        walls = iter([i for i, (kind, _v, _b) in enumerate(items) if kind == "whole"])
        first: list[int] = []
        for i in big:
            first += [i] + [w for w in [next(walls, None)] if w is not None]
        taken = set(first)
        rest = [item for i, item in enumerate(items) if i not in taken]
        # The plan's sizes are drawn within each bucket, so its files may hold more blocks
        # than the target's: files that would take the fill past the target's fullness
        # (spacers and walls counted on top) are left out before the order is made, rather
        # than run the disk out of space (or leave two spacers side by side) half way.
        pending_spacers = sum(b for kind, _v, b in items if kind == "spacer")
        ceiling = FILL_CEILING if top < 0 else MAX_FULLNESS
        budget = min(t.fullness * self.total + pending_spacers, ceiling * self.total)
        used = self.fullness() * self.total if inputs is None else float(inputs["used"])
        if self.on_fill is not None:
            self.on_fill(
                {"step": "files", "first": self.fills == 1, "used": used,
                 "largest": self._largest, "top_spacer": self.top_spacer}
            )  # fmt: skip
        head = [items[i] for i in first]
        rest = self._trim(head, rest, budget - used - pending_spacers)
        order = head + self._walled(rest)
        # The files written in turn four at a time get sizes near each other (a bucket's
        # sizes, sorted, in the order its groups are written): the blocks of the largest
        # past the next largest would be contiguous, a bucket's fragmented files at a score
        # of 0.03-0.06 rather than 0, and the bucket 0.01-0.03 above the target's.
        # A wall file is most often a jump more in a path-order read than the target's (it
        # lies between two holes; about 0.6 of a jump a wall on a mail target, the rest next
        # to a file read just before it); the buckets written in pieces, too few files to be
        # judged, make up for as many with fewer breaks between their pieces, so that the
        # path-order dynamic layout score, which is judged, comes out as the target's (a mail
        # target's 600 walls: 0.012 below it; counted a jump each, 0.007 above).
        piece_breaks = sum(
            (1.0 - (t.buckets[v][1] or 1.0)) * (b - 1) for kind, v, b in order if kind == "chunk"
        )
        n_walls = sum(1 for it in order if it[0] in ("wall", "wall+"))
        if self.fills == 1 and self.levels:
            # The tree's jumps are the target's less the walls', its directories of files
            # shared by the files of the plan, walls counted (made from here on, and kept by
            # the fills drawn after).
            n_places = sum(1 for it in order if not it[0].startswith("spacer"))
            self.per_dir, self.nest = tree_shape(
                t, self.levels, PER_DIR, NEST, WALL_JUMPS * n_walls, n_places
            )
        self._piece_relief = min(1.0, WALL_JUMPS * n_walls / piece_breaks) if piece_breaks else 0.0
        turns: dict[tuple[str, int], list[int]] = {}
        for i, (kind, v, _b) in enumerate(order):
            if kind in ("frag", "chunk"):
                turns.setdefault((kind, v), []).append(i)
        for idx in turns.values():
            for i, b in zip(idx, sorted(order[i][2] for i in idx), strict=True):
                order[i] = (order[i][0], order[i][1], b)
        pending: dict[int, list[tuple[str, int]]] = {}
        spacers: list[str] = []
        # Where the allocator will not put a file next to the one written before it: after
        # a spacer, and between the small files and the large (ext4 on the kernel puts them
        # in different places). On xfs a spacer lies beside the file it follows instead, and
        # the runs are made longer for the pairs it breaks (``_spacer_share``).
        breaks: set[int] = set()
        written = 0
        prev: Item | None = None
        for it in order:
            if it[0].startswith("spacer"):
                if written:
                    breaks.add(written - 1)
                continue
            if prev is not None and self._item_small(prev) != self._item_small(it):
                breaks.add(written - 1)
            prev = it
            written += 1
        if self.groups_plan is not None:
            breaks = set()
            self._spacer_share = min(0.5, (len(order) - written) / max(written, 1))
        placed = self._scattered_places(written, frozenset(breaks))
        if self.groups_plan is not None:  # levels 0: a place's directory is d<j>
            expect_directories(self.disk, order, placed, lambda p: f"d{int(p // self.per_dir):05d}")
        places = iter(placed)
        try:
            for i, (kind, v, blocks) in enumerate(order):
                if i % 256 == 255:
                    used = self.fullness() * self.total
                if kind == "spacer+":
                    rel = self._spacer_path()
                    if not self._kept_whole(rel, (SMALL + 1) * self.bs):
                        self.write_whole(rel, (SMALL + 1) * self.bs)
                        self.disk.punch(rel, v * self.bs, (SMALL + 1 - v) * self.bs)
                    spacers.append(rel)
                    used += v
                    pending_spacers -= v
                    continue
                if kind == "spacer":
                    rel = self._spacer_path()
                    if self._kept_whole(rel, v * self.bs):
                        if self.sizes[rel] > v * self.bs:
                            self.walled[rel] = v  # allocated with its wall block
                    elif v * self.bs >= 1 << 20 and top < 0 and self._allocate_spacer(rel, v):
                        pass
                    else:
                        # A large spacer split by writeback would leave smaller holes than
                        # asked.
                        self.write_whole(rel, v * self.bs, at_once=v * self.bs >= 1 << 20)
                    spacers.append(rel)
                    used += v
                    pending_spacers -= v
                    continue
                rel = self._path_at(next(places))
                if kind == "wall+":
                    if not self._kept_whole(rel, (SMALL + 1) * self.bs):
                        self.write_whole(rel, (SMALL + 1) * self.bs)
                        self.disk.punch(rel, self.bs, SMALL * self.bs)
                    self.sizes[rel] = self.bs
                    used += 1
                    self.walls += 1
                    continue
                if kind == "wall":
                    # Among the other files in path order: a directory read finds them where
                    # it finds the files they were written between.
                    if not self._kept_whole(rel, (blocks - 1) * self.bs + 1):
                        self.write_whole(rel, self._size_of(blocks))
                    used += blocks
                    self.walls += 1
                    continue
                if self._kept_whole(rel, (blocks - 1) * self.bs + 1):
                    continue  # written before the fill was stopped (``used`` counts it)
                if used + blocks + pending_spacers > budget:
                    continue
                used += blocks
                if kind == "whole":
                    self.write_whole(rel, self._size_of(blocks))
                else:
                    key = v if kind == "frag" else -v
                    group = pending.setdefault(key, [])
                    group.append((rel, blocks * self.bs))
                    if len(group) == 4:
                        self.write_interleaved(group, self._piece(key, group))
                        group.clear()
        except NoSpaceError:
            # Nearly full with the spacers in (the metadata grew more than counted): the file
            # that did not fit is gone again, the plan ends here.
            pending.clear()
        for key, group in pending.items():
            if group:
                try:
                    self.write_interleaved(group, self._piece(key, group))
                except NoSpaceError:
                    break  # as above: the plan ends here, and the spacers still go below
        self._drop_unkept()
        self.disk.commit()
        if self.on_fill is not None:
            self.on_fill({"step": "top-up"})
        # Top up with whole files of the buckets whose files are contiguous in the target
        # (whole files would raise the others' scores), before the spacers go: the allocator
        # would put the top-up files into the spacers' holes first.
        spacer_share = sum(self.sizes[rel] for rel in spacers) / self.bs / max(self.total, 1)
        keys = [k for k in t.buckets if k >= 1 and (t.buckets[k][1] or 1.0) >= 0.95]
        keys = keys or [k for k in t.buckets if k >= 1]
        weights = [t.buckets[k][0] for k in keys]
        goal = min(t.fullness + spacer_share, ceiling)
        n = 0
        while keys and self.fullness() < goal - 0.002:
            k = self.rng.choices(keys, weights)[0]
            room = int((goal - self.fullness()) * self.total) + 1
            try:
                self.write_whole(self._new_path(), self._size_of(min(self._draw_blocks(k), room)))
            except NoSpaceError:
                break  # nearly full: the file that did not fit is gone again, the rest stays
            n += 1
            if n % 256 == 0:
                self.disk.commit()
        self.disk.commit()
        for rel in spacers:
            walled = self.walled.pop(rel, 0)
            if walled and self.disk.punch(rel, 0, walled * self.bs):
                self.sizes[rel] = self.bs  # the wall block is all it holds
                continue
            self.disk.unlink(rel)
            self.sizes.pop(rel, None)
        self.paths = {ino: rel for ino, rel in self.paths.items() if rel in self.sizes}
        self.disk.drop_precreated()  # places the budget left out
        self.disk.commit()

    def adopt(self) -> None:
        """Take over the files in the matcher's area as its own (a match resumed in its
        rounds): their inodes and sizes as the disk holds them, and the next paths after the
        highest numbers taken."""
        from fsage.ager.match_disk import AREA

        layout = self.disk.layout()
        isdir = layout.files.is_dir()
        index = {int(ino): i for i, ino in enumerate(layout.files.ino)}
        for ino, paths in layout.paths().items():
            for p in paths:
                rel = p.lstrip("/")
                if not rel.startswith(AREA + "/"):
                    continue
                rel = rel[len(AREA) + 1 :]
                if isdir[index[int(ino)]]:
                    self.dirs_made.add(rel)
                    continue
                self.paths[int(ino)] = rel
                self.sizes[rel] = int(layout.files.size[index[int(ino)]])
                name = rel.rsplit("/", 1)[-1]
                if name[1:].isdigit() and name[0] == "f":
                    self.serial = max(self.serial, int(name[1:]) + 1)
                elif name[1:].isdigit() and name[0] == "s":
                    self.spacer_serial = max(self.spacer_serial, int(name[1:]))

    def clear(self) -> None:
        """Delete every file of the matcher's (its directories stay, emptied)."""
        for rel in list(self.sizes):
            self.disk.unlink(rel)
        self.paths.clear()
        self.sizes.clear()
        self.fillers.clear()
        self.walled.clear()
        self.walls = 0
        self.serial = 0  # the next fill takes the same places (its directories are there)
        self.disk.commit()

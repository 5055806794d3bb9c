"""The matcher's writes and its fill (``fsage age T --match``): the files it keeps track of
and the first fill of the target's files and spacer holes.

Its parts: the paths in ``match_paths``, the drawn sizes in ``match_sizes``, the room for the
largest holes in ``match_room``, the files a resumed match keeps in ``match_kept``, the order
of spacers and walls in ``match_holes``. ``match_steer`` steers from here in rounds;
``match`` runs the rounds.
"""

from __future__ import annotations

import contextlib
import errno
import random
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

from fsage.ager.match_dirs import tree_shape
from fsage.ager.match_disk import Disk
from fsage.ager.match_holes import SMALL, Item, SpacerOrder
from fsage.ager.match_kept import KeptFiles
from fsage.ager.match_paths import PER_DIR, PathOrder
from fsage.ager.match_room import SpacerRoom
from fsage.ager.match_sizes import SizeDraws
from fsage.ager.match_target import MIN_FILES, LayoutTarget, MeasuredState, measure
from fsage.ager.match_xfs import expect_directories, files_per_directory, group_plan
from fsage.workload import NoSpaceError

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


class MatchWriter(PathOrder, SizeDraws, SpacerRoom, KeptFiles, SpacerOrder):
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

    def _write_large_class(self, rel: str, blocks: int) -> None:
        """``rel`` of ``blocks`` blocks placed among the large files: written one block past
        the small files' limit and the rest punched before writeback (a resumed fill's file
        written whole before it stopped is kept as it is)."""
        if not self._kept_whole(rel, (SMALL + 1) * self.bs):
            self.write_whole(rel, (SMALL + 1) * self.bs)
            self.disk.punch(rel, blocks * self.bs, (SMALL + 1 - blocks) * self.bs)

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
                    self._write_large_class(rel, v)
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
                    self._write_large_class(rel, 1)
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

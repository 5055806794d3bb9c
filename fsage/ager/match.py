"""Age a mounted file system until its layout matches a target (``fsage age T --match``).

The target is a layout: files and layout score per size bucket (seed 000 buckets of blocks),
the free-space histogram (free blocks per log2 extent length, e2freefrag's buckets) and the
fullness — taken from a stored snapshot or a JSON file. The matcher

1. fills the target with files drawn from the target's size buckets (file counts scaled to
   the capacity) up to the target's fullness, each written whole;
2. then, in rounds, reads the mounted tree with fsage's live reader and steers:
   - a size bucket whose score is above the target's gets files rewritten as interleaved,
     fsync'ed appends of several files at once (their blocks alternate on disk);
   - a bucket below the target gets its most fragmented files rewritten whole;
   - free-extent sizes the target has more of get holes of those sizes: punched into the
     middle of large contiguous files (exact free extents; not on btrfs, which frees a
     punched range only with its whole extent), else contiguous files of that size that
     touch no free extent deleted; as many blocks are then allocated from the largest free
     extent when the target has less free space in extents of its size (the fill already
     leaves holes shaped like the target's free extents: it writes spacer files of those
     sizes, the large ones first, and deletes them once the rest is written);
   - where the live reader cannot see free space (btrfs: no GETFSMAP), free space is not
     judged, the run stops once the size buckets match, and it is never called matched.
3. It stops when every size bucket holding at least ``MIN_FILES`` files in the target is
   within ``SCORE_TOL`` of the target's score and the free-space histograms are within total
   variation ``FREE_TV``; or at the time limit, or when rounds stop making progress, and then
   reports the closest state reached (the size buckets first, then the distance) per bucket
   and why it could not get closer.
"""

from __future__ import annotations

import contextlib
import errno
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fsage.ager.match_disk import AREA, Disk, OfflineDisk, open_disk, probe
from fsage.ager.match_target import (
    FREE_TV,
    FULLNESS_TOL,
    MIN_FILES,
    SCORE_TOL,
    LayoutTarget,
    MeasuredState,
    bucket_excess,
    check_room,
    check_target,
    compare,
    distance,
    free_tv,
    load_target,
    measure,
    target_from_layout,
)
from fsage.ager.offline import OFFLINE_NOTICE
from fsage.analyzer.analysis import bucket_range
from fsage.analyzer.freespace import MAX_BUCKET
from fsage.errors import UsageError, WorkloadError
from fsage.workload import NoSpaceError

__all__ = [
    "AREA",
    "FREE_TV",
    "MIN_FILES",
    "SCORE_TOL",
    "LayoutTarget",
    "MatchResult",
    "Matcher",
    "compare",
    "free_tv",
    "load_target",
    "match_layout",
    "target_from_layout",
]

PER_DIR = 256
#: The matcher fills a file system to at most this (it needs room to rewrite files).
MAX_FULLNESS = 0.97
#: With spacers in the holes of every size, the fill tops up to this before deleting them.
FILL_CEILING = 0.995
STALL_ROUNDS = 6
#: Fills tried in all: a fill whose rounds stall is cleared and drawn again.
FILLS = 3


# ---------------------------------------------------------------------------- matching


@dataclass
class MatchResult:
    target: str
    source: str
    matched: bool = False
    elapsed: float = 0.0
    rounds: int = 0
    files_written: int = 0
    bytes_written: int = 0
    stop: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    closest: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    #: Aged through the offline writer (libext2fs's allocator, not the kernel's).
    offline: bool = False
    #: What read the state ``report`` describes (the state left on disk).
    measured_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class Matcher:
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
        fpd = float(target.locality.get("files_per_directory") or PER_DIR)
        self.per_dir = max(4, min(PER_DIR * 4, round(fpd)))
        self.last_actions: dict[str, str] = {}
        #: Files allocated (not written) to take blocks from the large free extents.
        self.fillers: list[str] = []
        #: The fill makes the largest holes with spacers too (see ``fill``).
        self.top_spacer = False
        self.files_written = 0
        self.bytes_written = 0

    # -- primitives

    def _path_at(self, pos: int, prefix: str = "d") -> str:
        """The path at place ``pos`` of the matcher's path order (its directory made on
        first use)."""
        d = f"{prefix}{pos // self.per_dir:05d}"
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
        if d not in self.dirs_made:
            self._mkdir(d)
        return f"{d}/s{i:08d}"

    def _scattered_places(self, n: int) -> list[int]:
        """Places in path order for ``n`` files about to be written one after the other, so
        that a path-order read finds as many consecutive files adjacent as the target's: runs
        of files written in turn keep their order (the allocator puts them side by side), a
        new run starting with the odds of a target's pair not being adjacent; the runs are
        then shuffled, which scatters a directory's files over the disk as the target's are:
        as many of them as the target's non-adjacent pairs within 1 MiB only among their
        neighbours in write order, the others anywhere. A target without locality keeps
        write order."""
        loc = self.target.locality
        p = float(loc.get("adjacent", 1.0))
        apart = float(loc.get("within_group", 0.0)) + float(loc.get("farther", 0.0))
        far = apart / max(1.0 - p, 1e-9)
        runs: list[list[int]] = []
        cur: list[int] = []
        for i in range(n):
            if cur and self.rng.random() >= p:
                runs.append(cur)
                cur = []
            cur.append(i)
        if cur:
            runs.append(cur)
        # A near run moves by about half the runs a MiB holds, a far one anywhere.
        t = self.target
        files = max(1, sum(c for c, _s in t.buckets.values()))
        per_file = max(1.0, t.fullness * t.blocks_total / files)
        window = max(1.0, (1 << 20) / self.bs / per_file / (n / max(len(runs), 1)) / 2)
        keys = [
            self.rng.uniform(0, len(runs))
            if self.rng.random() < far
            else i + self.rng.uniform(-window, window)
            for i in range(len(runs))
        ]
        runs = [runs[i] for i in sorted(range(len(runs)), key=keys.__getitem__)]
        place = [0] * n
        for rank, i in enumerate(i for run in runs for i in run):
            place[i] = self.serial + rank
        # Directories made in path order, as a checkout makes them.
        for d in range(self.serial // self.per_dir, (self.serial + n - 1) // self.per_dir + 1):
            self._path_at(d * self.per_dir)
        self.serial += n
        return place

    def _written(self, rel: str, ino: int, size: int) -> None:
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
        return self.disk.fullness()

    def snapshot(self) -> MeasuredState:
        return measure(self.disk.layout())

    # -- fill

    def _draw_blocks(self, k: int) -> int:
        lo, hi = bucket_range(k)
        return self.rng.randint(lo, hi)

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

    def fill(self) -> None:
        """Write the target's files, a share ``1 - score`` of each bucket's files with their
        blocks interleaved (score about 0) and the rest whole (about 1), mixed with spacer
        files sized like the target's free extents; top up to the target's fullness (with
        the spacers still there, so nearly full), then delete the spacers. Where free extents
        are bounded by regions (xfs allocation groups), the largest bucket is left to the
        unwritten rest of the disk instead (a region kept empty)."""
        t = self.target
        self._keep_a_group_empty()
        scale = self.total / t.blocks_total if t.blocks_total else 1.0
        plan: list[tuple[str, int]] = []
        for k, (n, score) in t.buckets.items():
            count = max(0, round(n * scale))
            frag = round(count * (1.0 - score)) if score is not None and k >= 1 else 0
            plan += [("frag", k)] * frag + [("whole", k)] * (count - frag)
        free_after = (1.0 - t.fullness) * self.total
        want = t.free_fractions()
        top = -1
        if want:
            # The largest bucket is the unwritten rest of the disk, which the allocator may
            # split where it puts the last files (a 13,700-block extent of a 256 MiB target
            # came out as 8,450 + 2,860 blocks); with ``top_spacer`` (a second fill's way)
            # its holes are spacers too, written first, at the cost of a fill that leaves
            # no room (its shortfall in fullness is made up after, from the large holes).
            # Not offline (it cuts the largest extent where it wants), nor where the largest
            # holes are more than a quarter of an ext block group (8 x block size blocks):
            # a spacer that large is split by the allocator, the unwritten rest is not.
            top = max(want, key=lambda k: want[k])
            alone = not (self.disk.groups or self.disk.can_place)
            if self.top_spacer and alone and 2 << top <= 2 * self.bs:
                top = -1
            for k, f in want.items():
                if k == top:
                    continue
                left = round(f * free_after)  # a hole of exactly 1 << k blocks is kept
                while left >= 1 << k:
                    b = min(self.rng.randint(1 << k, (1 << (k + 1)) - 1), int(left))
                    plan.append(("spacer", b))
                    left -= b
        self.rng.shuffle(plan)
        # Large spacers go first, while the disk is empty: written among the other files, the
        # allocator finds no free extent of their size in their group and splits them (an
        # 8,200-block spacer as 6,144 + 2,070 blocks), leaving two smaller holes. Each is
        # followed by a whole file, so that two of them never make one hole.
        big = [i for i, (kind, v) in enumerate(plan) if kind == "spacer" and v * self.bs >= 1 << 20]
        walls = iter([i for i, (kind, _) in enumerate(plan) if kind == "whole"])
        first: list[int] = []
        for i in big:
            first += [i] + [w for w in [next(walls, None)] if w is not None]
        taken = set(first)
        plan = [plan[i] for i in first] + [item for i, item in enumerate(plan) if i not in taken]
        pending: dict[int, list[tuple[str, int]]] = {}
        spacers: list[str] = []
        # The plan's sizes are drawn within each bucket, so its files may hold more blocks
        # than the target's: a file that would take the fill past the target's fullness
        # (spacers counted on top) is left out rather than run the disk out of space.
        pending_spacers = sum(v for kind, v in plan if kind == "spacer")
        ceiling = FILL_CEILING if top < 0 else MAX_FULLNESS
        budget = min(t.fullness * self.total + pending_spacers, ceiling * self.total)
        used = self.fullness() * self.total
        places = iter(self._scattered_places(sum(1 for kind, _ in plan if kind != "spacer")))
        try:
            for i, (kind, v) in enumerate(plan):
                if i % 256 == 255:
                    used = self.fullness() * self.total
                if kind == "spacer":
                    rel = self._spacer_path()
                    # A large spacer split by writeback would leave smaller holes than asked.
                    self.write_whole(rel, v * self.bs, at_once=v * self.bs >= 1 << 20)
                    spacers.append(rel)
                    used += v
                    pending_spacers -= v
                    continue
                blocks = self._draw_blocks(v)
                rel = self._path_at(next(places))
                if used + blocks + pending_spacers > budget:
                    continue
                used += blocks
                if kind == "whole":
                    self.write_whole(rel, self._size_of(blocks))
                else:
                    group = pending.setdefault(v, [])
                    group.append((rel, blocks * self.bs))
                    if len(group) == 4:
                        self.write_interleaved(group, 1)
                        group.clear()
        except NoSpaceError:
            # Nearly full with the spacers in (the metadata grew more than counted): the file
            # that did not fit is gone again, the plan ends here.
            pending.clear()
        for group in pending.values():
            if group:
                self.write_interleaved(group, 1)
        self.disk.commit()
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
            self.disk.unlink(rel)
            self.sizes.pop(rel, None)
        self.paths = {ino: rel for ino, rel in self.paths.items() if rel in self.sizes}
        self.disk.commit()

    def clear(self) -> None:
        """Delete every file of the matcher's (its directories stay, emptied)."""
        for rel in list(self.sizes):
            self.disk.unlink(rel)
        self.paths.clear()
        self.sizes.clear()
        self.fillers.clear()
        self.serial = 0  # the next fill takes the same places (its directories are there)
        self.disk.commit()

    # -- steering

    def steer_scores(self, st: MeasuredState) -> dict[str, str]:
        actions: dict[str, str] = {}
        by_bucket = st.bucket
        for k, (n, s) in self.target.buckets.items():
            if k == 0 or s is None or n < MIN_FILES:
                continue
            cs = st.target.buckets.get(k, (0, None))[1]
            if cs is None or abs(cs - s) <= SCORE_TOL * 0.5:
                continue
            den = st.den_k.get(k, 0)
            idx = np.flatnonzero(by_bucket == k)
            idx = np.array([i for i in idx.tolist() if int(st.ino[i]) in self.paths], np.int64)
            if idx.size == 0:
                actions[f"bucket {k}"] = "no files of fsage's in this bucket to rewrite"
                continue
            if cs > s:
                need = (cs - s) * den
                order_list = idx[st.cont[idx] > 0].tolist()
                self.rng.shuffle(order_list)
                chunk = 1
                victims: list[tuple[str, int]] = []
                done = 0.0
                for i in order_list:
                    if done >= 0.8 * need:
                        break
                    rel = self.delete(int(st.ino[i]))
                    if rel is None:
                        continue
                    b = int(st.blocks[i])
                    victims.append((rel, b * self.bs))
                    done += max(0.0, float(st.cont[i]) - (b - math.ceil(b / chunk)))
                # Freed blocks are reused only once the deletes are committed: commit them so
                # that the rewritten files take the holes the old ones leave.
                self.disk.commit()
                for g in range(0, len(victims), 4):
                    self.write_interleaved(victims[g : g + 4], chunk)
                actions[f"bucket {k}"] = f"fragmented by interleaving ({done:.0f} of {need:.0f})"
            else:
                need = (s - cs) * den
                gap = st.den[idx] - st.cont[idx]
                order = idx[np.argsort(-gap, kind="stable")]
                done = 0.0
                redo: list[tuple[str, int]] = []
                for i in order.tolist():
                    if done >= 0.8 * need or st.den[i] == st.cont[i]:
                        break
                    rel = self.delete(int(st.ino[i]))
                    if rel is None:
                        continue
                    redo.append((rel, int(st.blocks[i]) * self.bs))
                    done += float(st.den[i] - st.cont[i])
                self.disk.commit()
                for rel, size in redo:
                    self.write_whole(rel, size)
                actions[f"bucket {k}"] = (
                    f"rewrote fragmented files whole ({done:.0f} of {need:.0f})"
                )
        return actions

    def steer_free(self, st: MeasuredState) -> str:
        """Shape the free space toward the target's histogram. For each extent-size bucket
        short of free blocks, holes of that size: punched into the middle of contiguous
        files of the matcher's (a hole inside one extent is a free extent of exactly its
        length; a big file takes a few), else whole contiguous files of that size that touch
        no free extent deleted. As many blocks as the holes freed are then allocated
        (fallocate) as filler files, which take them from the large free extents the target
        has too much of, so the fullness stays where the fill put it."""
        want = self.target.free_fractions()
        have = st.target.free_fractions()
        tv = free_tv(want, have)
        if tv <= FREE_TV * 0.6:
            return ""
        free_total = int(st.free_len.sum())
        ends = set((st.free_start + st.free_len).tolist())
        starts = set(st.free_start.tolist())
        short = sorted(k for k in want if want[k] > have.get(k, 0.0))
        ours = np.array([int(i) in self.paths for i in st.ino.tolist()], bool)
        solo = (st.frags == 1) & ours
        used = np.zeros(st.ino.size, bool)  # files punched or deleted this round
        punched = deleted = made = 0
        missed: list[str] = []  # hole sizes short that no file of the matcher's could give
        for k in short:
            need = (want[k] - have.get(k, 0.0)) * free_total
            lo, hi = 1 << k, (1 << (k + 1)) - 1
            got = 0
            if self.disk.can_punch:
                # The largest contiguous files first: a hole costs a file one break in its
                # layout, which a file of many blocks hardly notices (one hole per 100 blocks
                # at most).
                idx = np.flatnonzero(solo & ~used & (st.blocks >= lo + 2))
                idx = idx[np.argsort(-st.blocks[idx], kind="stable")]
                for i in idx.tolist():
                    if got >= 0.9 * need or not self.disk.can_punch:
                        break
                    got += self._punch_holes(st, i, lo, hi, need - got)
                    used[i] = True
            if got < 0.9 * need:
                idx = np.flatnonzero(solo & ~used & (st.blocks >= lo) & (st.blocks <= hi))
                idx = idx[self.rng.sample(range(idx.size), idx.size)] if idx.size else idx
                for i in idx.tolist():
                    if got >= 0.9 * need:
                        break
                    a, b = int(st.first[i]), int(st.first[i] + st.blocks[i])
                    if a in ends or b in starts:
                        continue  # would join a free extent, not make a hole
                    if self.delete(int(st.ino[i])) is None:
                        continue
                    used[i] = True
                    got += int(st.blocks[i])
                    deleted += int(st.blocks[i])
                    ends.add(b)
                    starts.add(a)
            top_free = int(st.free_len.max()) if st.free_len.size else 0
            if got < 0.9 * need and 4 <= k <= 9 and top_free >= 8 << k:
                # No file of the matcher's can give a hole of 16-1023 blocks (a git-like
                # target has few large files): allocate one two blocks larger than the hole
                # from the large free extents (eight times the hole at least) and punch the
                # hole into it at once, which moves that many free blocks from the extent
                # it came from into a hole of this size for two blocks of fullness.
                m = self._carve_holes(lo, hi, need * 0.9 - got)
                made += m
                got += m
            punched += got
            if got == 0:
                missed.append(f"{lo}-{hi}")
        punched -= deleted + made
        self.disk.commit()
        # Give back as many blocks from the largest free extent (and those still short of the
        # target's fullness) when the target has too much free space in extents of its size,
        # never so many that what is left of it drops below its bucket, or below the target's
        # largest bucket when the target has none as large.
        filled = 0
        cut = ""
        if st.free_len.size:
            i = int(np.argmax(st.free_len))
            top = int(st.free_len[i])
            kt = min(top.bit_length() - 1, MAX_BUCKET)
            excess = (have.get(kt, 0.0) - want.get(kt, 0.0)) * free_total
            wanted = [k for k, f in want.items() if f > 0]
            floor = min(kt, max(wanted)) if wanted else kt
            room = top - (1 << floor) - 1
            lacking = int((self.target.fullness - st.target.fullness) * self.total)
            give = punched + deleted + max(lacking, 0)
            if kt > floor and self.disk.can_place and top > 2 << floor:
                # The target has no free extent this large: cut it in two with the filler
                # placed in its middle, both halves as large as the target's largest.
                n = max(1, min(give, top - (2 << floor)))
                filled = self._fill_large(n, int(st.free_start[i]) + (top - n) // 2)
                cut = f" (in its middle: cut in two, the target has no free extent of {top})"
            else:
                filled = self._fill_large(
                    max(min(give, int(excess), room), 0), int(st.free_start[i])
                )
            if self.disk.can_place or self.disk.groups:
                filled += self._shrink_extents(st, want, have, give - filled, free_total)
            if self.disk.kept_empty is not None and give > filled:
                # The largest free extent is the group kept empty, which the target wants as
                # large: the blocks punched go back where the allocator puts a new file (its
                # directory's group, never the one kept empty).
                filled += self._fill_large(give - filled, None)
        why = (
            f"; no contiguous file of the matcher's can give holes of {', '.join(missed)} blocks"
            if missed
            else ""
        )
        return (
            f"{punched} blocks punched, {deleted} deleted and {made} carved from new files "
            "as holes of the sizes short, "
            f"{filled} blocks of the largest free extent filled{cut}{why}"
        )

    def _punch_holes(self, st: MeasuredState, i: int, lo: int, hi: int, need: float) -> int:
        """Punch holes of ``lo``-``hi`` blocks into file ``i`` (one extent), each bounded by
        the file's own blocks, at most one per 100 blocks; returns the blocks freed."""
        rel = self.paths.get(int(st.ino[i]))
        if rel is None:
            return 0
        n = int(st.blocks[i])
        holes = max(1, min(n // 100, n // (lo + 2)))
        got = 0
        # Holes at evenly spaced places, each at least one block from the next.
        span = n // holes
        for h in range(holes):
            if got >= need:
                break
            room = span - 2
            if room < lo:
                break
            length = self.rng.randint(lo, min(hi, room))
            off = h * span + 1 + self.rng.randint(0, room - length)
            if not self.disk.punch(rel, off * self.bs, length * self.bs):
                break
            got += length
        return got

    def _carve_holes(self, lo: int, hi: int, need: float) -> int:
        """Holes of ``lo``-``hi`` blocks, as many as make ``need`` blocks (eight at most), each
        punched into a file allocated two blocks larger; returns the blocks of the holes."""
        got = 0
        for _ in range(8):
            if got >= need or not (self.disk.can_punch and self.disk.can_fallocate):
                break
            length = self.rng.randint(lo, max(lo, min(hi, int(need - got))))
            rel = self._new_path()
            with self._undone_if_no_space([rel]):
                ino = self.disk.allocate(rel, (length + 2) * self.bs, None)
            if ino is None:
                break
            self.paths[ino] = rel
            self.sizes[rel] = (length + 2) * self.bs
            self.files_written += 1
            self.disk.commit()
            if not self.disk.punch(rel, self.bs, length * self.bs):
                break
            self.sizes[rel] = 2 * self.bs  # what it holds once punched
            got += length
        self.disk.commit()
        return got

    def _shrink_extents(
        self,
        st: MeasuredState,
        want: dict[int, float],
        have: dict[int, float],
        spare: int,
        free_total: int,
    ) -> int:
        """Where the filler can be placed (offline: at a block; xfs: in an allocation group),
        drop the next largest free extents of a size the target has too much of into the
        size below, which it has too little of, by filling their ends: as many as ``spare``
        blocks (and half a percent of fullness more) pay for. Returns the blocks allocated."""
        have = dict(have)
        spare += int(0.005 * self.total)
        done = 0
        for j in np.argsort(-st.free_len, kind="stable")[1:9].tolist():
            e = int(st.free_len[j])
            k = min(e.bit_length() - 1, MAX_BUCKET)
            if k == 0 or have.get(k, 0.0) - want.get(k, 0.0) <= 0.01:
                continue
            if want.get(k - 1, 0.0) <= have.get(k - 1, 0.0):
                continue
            need = e - ((1 << k) - 1)  # what is left falls in bucket k - 1
            if need > spare:
                continue
            got = self._fill_large(need, int(st.free_start[j]))
            spare -= got
            done += got
            have[k] = have.get(k, 0.0) - e / free_total
            have[k - 1] = have.get(k - 1, 0.0) + (e - got) / free_total
        return done

    def _fill_large(self, blocks: int, start: int | None) -> int:
        """Allocate ``blocks`` blocks as filler files of at most 64 MiB (fallocate: the
        kernel's allocator serves a large request from the large free extents; the offline
        one is told to start at ``start``, the largest free extent); returns the blocks
        allocated."""
        done = 0
        step = (64 << 20) // self.bs
        while done < blocks and self.disk.can_fallocate:
            n = min(step, blocks - done)
            rel = self._new_path()
            with self._undone_if_no_space([rel]):
                ino = self.disk.allocate(rel, n * self.bs, None if start is None else start + done)
            if ino is None:
                break
            self.paths[ino] = rel
            self.sizes[rel] = n * self.bs
            self.fillers.append(rel)
            self.files_written += 1
            done += n
        self.disk.commit()
        return done

    def settle_fullness(self) -> str:
        """Bring the fullness within half of ``FULLNESS_TOL`` of the target's: fillers (then
        the largest files of the matcher's) deleted when above, a filler allocated when below
        (both from and to the large free extents, which changes the free-space histogram
        least). Returns what was done, "" if nothing."""
        self.disk.commit()
        goal, now = self.target.fullness, self.fullness()
        slack = FULLNESS_TOL / 2
        if abs(now - goal) <= slack:
            return ""
        if now < goal:
            got = self._fill_large(int((goal - now) * self.total), None)
            return f"{got} blocks allocated to reach the target's fullness"
        over = int((now - goal) * self.total)
        rels = [r for r in dict.fromkeys(reversed(self.fillers)) if r in self.sizes]
        rest = sorted(set(self.sizes) - set(rels), key=lambda r: -self.sizes[r])
        freed = 0
        for rel in rels + rest:
            if freed >= over:
                break
            freed += -(-self.sizes.pop(rel) // self.bs)
            self.disk.unlink(rel)
        self.paths = {ino: rel for ino, rel in self.paths.items() if rel in self.sizes}
        self.disk.commit()
        return f"{freed} blocks of the matcher's deleted to come down to the target's fullness"

    # -- the loop

    def run(self) -> MatchResult:
        t0 = time.perf_counter()
        res = MatchResult(target="", source=self.target.source)
        self.say(f"fsage: filling to {self.target.fullness:.3f} with the target's file sizes")
        try:
            self.fill()
        except NoSpaceError as exc:
            # The fill never plans past the target's fullness; a file system that still runs
            # out (its metadata grew more than counted) is said, and the rest left as it is.
            res.stop = f"the fill ran out of space ({exc})"
            self.settle_fullness()
            st = self.snapshot()
            res.report = res.closest = compare(self.target, st.target, st.free_known)
            res.reasons = _reasons(res.report, {})
            res.elapsed = time.perf_counter() - t0
            res.files_written, res.bytes_written = self.files_written, self.bytes_written
            return res
        best: tuple[float, dict[str, Any]] | None = None
        # The closest state reported: the size buckets first (a state with them matched beats
        # one nearer in free space only), then the distance.
        closest: tuple[tuple[float, float], dict[str, Any]] | None = None
        stalled = 0
        fills = 1
        fill_best: dict[bool, float] = {}
        last_actions: dict[str, str] = {}
        while True:
            st = self.snapshot()
            rep = compare(self.target, st.target, st.free_known)
            res.rounds += 1
            dist = distance(rep)
            tv = "unknown" if rep["free_tv"] is None else f"{rep['free_tv']:.3f}"
            self.say(
                f"fsage: round {res.rounds}: distance {dist:.3f}, free-space TV {tv}, "
                f"fullness {st.target.fullness:.3f}, path-order dynamic layout score "
                f"{st.target.locality.get('dynamic_score') or 0:.3f}, "
                f"{time.perf_counter() - t0:.0f} s"
            )
            rank = (bucket_excess(rep), dist)
            better = closest is None or rank[0] < closest[0][0] - 1e-4
            if closest is None or rank < closest[0]:
                closest = (rank, rep)
            if best is None or dist < best[0] - 1e-4:
                best = (dist, rep)
                better = True
            # Progress in the size buckets or in the distance as a whole keeps the rounds going.
            stalled = 0 if better else stalled + 1
            if rep["matched"]:
                res.matched, res.stop = True, "matched"
                break
            if rep["buckets_ok"] and rep["free_ok"] and rep["fullness_ok"]:
                # Only the path-order read is off, which the rounds do not steer (rewriting
                # files to move them undoes the free space): keep this state.
                res.stop = "all but the path-order dynamic layout score matched"
                break
            if not st.free_known and rep["buckets_ok"]:
                res.stop = "size buckets matched; free space unknown on this file system"
                break
            if time.perf_counter() - t0 > self.time_limit:
                res.stop = f"time limit ({self.time_limit:.0f} s)"
                break
            if stalled >= STALL_ROUNDS and fills < FILLS:
                # Holes punched cannot always be given back on the kernel's allocator (it
                # takes no hint where to put the filler), and the free extents a fill leaves
                # vary from run to run: a stalled fill is cleared and drawn again.
                # The fills take turns between the two ways of making the largest holes; the
                # last takes the way that came closer (it is the one left on disk).
                assert best is not None
                fill_best[self.top_spacer] = min(fill_best.get(self.top_spacer, 9.0), best[0])
                fills += 1
                self.top_spacer = (
                    fills % 2 == 0
                    if fills < FILLS
                    else fill_best.get(True, 9.0) < fill_best.get(False, 9.0)
                )
                self.say(f"fsage: no progress in {STALL_ROUNDS} rounds: fill {fills} of {FILLS}")
                self.clear()
                try:
                    self.fill()
                except NoSpaceError as exc:
                    res.stop = f"fill {fills} ran out of space ({exc})"
                    self.settle_fullness()
                    st = self.snapshot()
                    rep = compare(self.target, st.target, st.free_known)
                    break
                best, stalled = None, 0
                continue
            if stalled >= STALL_ROUNDS:
                res.stop = f"no progress in {STALL_ROUNDS} rounds of each of {FILLS} fills"
                break
            try:
                last_actions = self.steer_scores(st)
                free_action = self.steer_free(st) if st.free_known else ""
                if free_action:
                    last_actions["free space"] = free_action
                settled = self.settle_fullness()
                if settled:
                    last_actions["fullness"] = settled
            except NoSpaceError as exc:
                res.stop = f"round {res.rounds} ran out of space: {exc}"
                self.settle_fullness()
                st = self.snapshot()
                rep = compare(self.target, st.target, st.free_known)
                break
        assert best is not None and closest is not None
        res.report = rep
        res.closest = closest[1]
        self.last_actions = last_actions
        res.reasons = _reasons(rep, last_actions) if not res.matched else {}
        res.elapsed = time.perf_counter() - t0
        res.files_written = self.files_written
        res.bytes_written = self.bytes_written
        return res


def _reasons(rep: dict[str, Any], actions: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in rep["buckets"]:
        if r["ok"]:
            continue
        key = f"bucket {r['bucket']}"
        if r["score"] is None:
            out[key] = "no files of this size reached"
        else:
            way = "above" if r["score"] > r["target_score"] else "below"
            last = actions.get(key, "no rewrite possible")
            out[key] = f"still {way} target after the last round ({last})"
    if not rep.get("free_known", True):
        out["free space"] = (
            "not judged: the live reader cannot see this file system's free space (no GETFSMAP)"
        )
    elif not rep["free_ok"]:
        out["free space"] = actions.get(
            "free space", "no contiguous file of a needed hole size touches no free extent"
        )
    if not rep.get("dynamic_ok", True):
        have = rep["locality"].get("dynamic_score")
        want = rep["target_locality"]["dynamic_score"]
        out["locality"] = actions.get(
            "locality",
            f"path-order dynamic layout score {have if have is None else round(have, 3)}"
            f" against {want:.3f}",
        )
    if not rep.get("fullness_ok", True):
        out["fullness"] = actions.get(
            "fullness",
            f"{rep['fullness']:.3f} against {rep['target_fullness']:.3f}: not settled",
        )
    return out


def _write_journal(journal: Path, disk: Disk, target: LayoutTarget, seed: int) -> None:
    """The ops ``disk`` ran, as a Workload: what was done stays replayable even when the
    match failed half way."""
    from fsage.workload import WorkloadHeader, write_workload

    header = WorkloadHeader(
        "fsage age --match",
        {"target": target.source, "offline": isinstance(disk, OfflineDisk)},
        seed,
    )
    try:
        write_workload(journal, header, disk.ops)
    except OSError as exc:
        raise WorkloadError(f"cannot write the journal {journal}: {exc.strerror}") from None


def match_layout(
    path: Path,
    target: LayoutTarget,
    *,
    seed: int = 0,
    time_limit: float = 600.0,
    mode: str = "auto",
    say: Callable[[str], None] | None = None,
    journal: Path | None = None,
) -> MatchResult:
    """Age the mounted directory or image ``path`` until its layout matches ``target``
    (``mode``: see ``open_disk``). ``journal``: where to write the ops that took effect, as a
    Workload (``fsage age OTHER --ops JOURNAL`` runs them again)."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if not math.isfinite(time_limit) or time_limit <= 0:
        raise UsageError("the time limit must be a positive number of seconds")
    from fsage.ager.images import image_kind

    # An ext image is judged by the offline reader once unmounted: the state left on disk,
    # not what the kernel showed while mounted (its reservations and unflushed metadata).
    offline_after = path.is_file() and image_kind(path) == "ext"
    live: MeasuredState | None = None
    kind, block_size = probe(path)
    if block_size:  # else open_disk says what the path is not
        check_target(target, str(path), kind, block_size, MAX_FULLNESS)
    with open_disk(path, mode) as disk:
        check_room(target, str(path), disk.fullness())
        disk.prepare()
        if isinstance(disk, OfflineDisk) and say is not None:
            say(f"fsage: {OFFLINE_NOTICE}")
        matcher = Matcher(disk, target, seed=seed, time_limit=time_limit, say=say)
        try:
            res = matcher.run()
            if not offline_after:
                live = matcher.snapshot()
        except OSError as exc:
            raise WorkloadError(f"matching {path}: {exc}") from None
        except WorkloadError as exc:
            raise WorkloadError(f"matching {path}: {exc}") from None
        finally:
            if journal is not None:
                _write_journal(journal, disk, target, seed)
    if live is None:
        from fsage.snapshotter.ext import read_ext_layout

        final = measure(read_ext_layout(path))
        res.measured_by = "the offline reader after unmount"
    else:
        final = live
        res.measured_by = "the live reader" + (" before unmount" if path.is_file() else "")
    res.report = compare(target, final.target, final.free_known)
    was = res.matched
    res.matched = bool(res.report["matched"])
    if was and not res.matched:
        res.stop = f"matched while aging, not as measured by {res.measured_by}"
    elif res.matched and not was:
        res.stop = f"matched as measured by {res.measured_by}"
    res.reasons = {} if res.matched else _reasons(res.report, matcher.last_actions)
    res.target = str(path)
    res.offline = isinstance(disk, OfflineDisk)
    return res

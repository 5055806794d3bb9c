"""Free space shaped offline, where the mounted steering stalls: the kernel's allocator takes no
hint where a file goes, libext2fs's does (an ``allocate-near`` op: its blocks are searched from
a goal block on, so a file put at a free extent's start fills it from there).

A recreation that ends a mounted round with its free space in other pieces than the snapshot's
(too many small free extents where the original, fuller while its unseen temporaries lived,
filled them with pieces of the files it wrote; too few of 64-128 KiB) gets plugs: files of one
extent that lie between free extents are rewritten (under their temporary names, renamed over
them) into free extents of their length or the shortest longer one of some bucket, so those
go or shrink and the window the files leave joins the free extents in and beside it into one.
``plan_plugs`` takes a window only where it brings the free space nearer the snapshot's by
extent counts and blocks together. The closed loop runs a shaping round where a mounted round
did not bring the free space nearer. The ops run offline (``fsage.replay.recreate`` unmounts
the image for them and mounts it again at the next measurement); they are journaled as
inferred ops like every other move, and a journal replays them offline at the same point.
``landed`` checks, on the next measurement, which plugs took their free extent.

Plugs only ever join free extents. Where the recreation has too few small free extents (a
git checkout's many small files, rewritten out of sight, left holes of a block or two among
them; the kernel's allocator fills the spacers' holes again at the next round's rewrites),
``plan_splits`` splits large free extents instead: a file of one block or a few, with used
blocks on both sides, is put a hole's length past the start of a large free extent (or past
the last file put there), so its old place and the hole before its new one become two small
free extents, while what is left of the large extent stays in its bucket. A shaping round
splits where that brings the free space nearer and plugs otherwise.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable

import numpy as np

from fsage.ager.match_target import MeasuredState
from fsage.replay.changed import _File
from fsage.replay.freeshape import _chains, bucket_of_length
from fsage.replay.interval import IntervalChurn
from fsage.replay.moves import Mover, _temp_name
from fsage.workload import Op

#: Files a window moves at most (each into a free extent of its own length).
MAX_WINDOW_FILES = 8
#: Files a split shaping moves at most (each leaves two small free extents).
MAX_SPLIT_FILES = 512


class OfflineShaper(Mover):
    """Shapes the free space offline with files put at chosen free extents (see the module
    doc)."""

    def __init__(self, run: Callable[[Op], int]) -> None:
        super().__init__(run)
        #: Plugs of the last offline shaping: (path, goal block, blocks).
        self.plugs: list[tuple[str, int, int]] = []

    def _shape_offline(
        self,
        state: MeasuredState,
        everyone: list[_File],
        rng: random.Random,
        churn: IntervalChurn,
        allowed: int,
    ) -> int:
        """Put files of one extent at the start of free extents, window by window while each
        brings the free space nearer the snapshot's (``plan_plugs``), within the interval's
        ``allowed`` bytes; the number of files put."""
        self.plugs = []
        bs = state.target.block_size
        by_path = {f.path: f for f in everyone}
        # Only files the recreation holds as the snapshot does (as many blocks as its size).
        spans = [s for s in self._spans(state, everyone)
                 if -(-by_path[s[2]].size // bs) == s[1] - s[0]]  # fmt: skip
        want_n, want_b = self._target_free_counts, self._target_free
        # Too few small free extents: split large ones (plugs only ever join extents).
        # On a copy of the generator: where no split pays, the plugs draw as they did alone.
        fork = random.Random()
        fork.setstate(rng.getstate())
        plan = plan_splits(state.free_start, state.free_len, spans, want_n, want_b, fork)
        kind = "split"
        if not plan:
            plan = plan_plugs(state.free_start, state.free_len, spans, want_n, want_b, rng)
            kind = "plug"
        for path, goal, n in plan:
            if churn.inferred_bytes >= allowed:
                break
            f = by_path[path]
            tmp = _temp_name(f.path)
            if not self._op(Op("create", tmp, 0, inferred=True), churn):
                continue
            ok = self._op(Op("allocate-near", tmp, f.size, 0, label=str(goal), inferred=True),
                          churn)  # fmt: skip
            # Allocated unwritten: written in place, as a rewrite is (a read of it reads disk).
            ok = ok and self._op(Op("overwrite", tmp, f.size, 0, inferred=True), churn)
            if not ok:
                self._op(Op("delete", tmp, inferred=True), churn)
                continue
            churn.inferred_bytes += f.size
            self._replace(f, churn)
            self._count(churn, kind)
            self.plugs.append((f.path, goal, n))
        return len(self.plugs)

    def landed(self) -> int:
        """Plugs of the last offline shaping whose file starts at its goal block in the last
        measurement (``_measure``)."""
        state = self._state
        if self._last is None or state is None or not self.plugs:
            return 0
        ino_of = {p.lstrip("/"): ino for ino, ps in self._paths(self._last).items() for p in ps}
        first = dict(zip(state.ino.tolist(), state.first.tolist(), strict=True))
        return sum(1 for path, goal, _n in self.plugs
                   if first.get(ino_of.get(path, -1)) == goal)  # fmt: skip


def _objective(have_n: dict[int, int], have_b: dict[int, int], want_n: dict[int, int],
               want_b: dict[int, int]) -> float:  # fmt: skip
    """The free space's distance from the snapshot's: by extent counts (Bray-Curtis, as
    ``count_distance``) plus by blocks (total variation), as the closed loop judges both."""
    keys = set(have_n) | set(want_n) | set(have_b) | set(want_b)
    tn = sum(have_n.values()) + sum(want_n.values())
    hb, wb = sum(have_b.values()) or 1, sum(want_b.values()) or 1
    by_n = sum(abs(have_n.get(k, 0) - want_n.get(k, 0)) for k in keys) / (tn or 1)
    by_b = 0.5 * sum(abs(have_b.get(k, 0) / hb - want_b.get(k, 0) / wb) for k in keys)
    return by_n + by_b


def _histogram(free_len: np.ndarray) -> tuple[dict[int, int], dict[int, int]]:
    """Free extents and free blocks per bucket."""
    have_n: dict[int, int] = {}
    have_b: dict[int, int] = {}
    for n in free_len.tolist():
        k = bucket_of_length(int(n))
        have_n[k] = have_n.get(k, 0) + 1
        have_b[k] = have_b.get(k, 0) + int(n)
    return have_n, have_b


def plan_splits(
    free_start: np.ndarray,
    free_len: np.ndarray,
    spans: list[tuple[int, int, str]],
    want_n: dict[int, int],
    want_b: dict[int, int],
    rng: random.Random,
    most_files: int = MAX_SPLIT_FILES,
) -> list[tuple[str, int, int]]:
    """Moves (path, goal block, blocks) that make the small free extents the recreation lacks
    by count: a file of one extent with used blocks on both sides (``spans``: start, end,
    path), of a bucket the recreation lacks, is put inside a large free extent a hole's
    length past the last file put there (or the extent's start), so that its old place and
    the hole before its new one become two free extents of lacking sizes. An extent is split
    while what is left of it stays in its bucket (the large extents' counts do not move).
    Cut where it brings the free space nearest by counts and blocks (empty where no move
    brings it nearer)."""
    have_n, have_b = _histogram(free_len)
    short = {k: n - have_n.get(k, 0) for k, n in want_n.items() if n > have_n.get(k, 0)}
    if not short or not spans:
        return []
    ends = {int(a + n) for a, n in zip(free_start.tolist(), free_len.tolist(), strict=True)}
    starts = {int(a) for a in free_start.tolist()}
    # Only files whose place, left, becomes a free extent of their own length.
    movers = [s for s in spans if s[0] not in ends and s[1] not in starts
              and short.get(bucket_of_length(s[1] - s[0]), 0) > 0]  # fmt: skip
    rng.shuffle(movers)
    # Largest free extents first: cursor (next hole's start) and end of each.
    order = np.argsort(-free_len, kind="stable")
    large = [[int(free_start[i]), int(free_start[i] + free_len[i])] for i in order.tolist()]
    dn, db = dict(have_n), dict(have_b)
    taken: set[int] = set()  # blocks bordering a moved file's old place
    out: list[tuple[str, int, int]] = []
    # The plan is cut where it came nearest: the blocks the splits move may outweigh the
    # extents they make.
    best, keep = _objective(have_n, have_b, want_n, want_b) - 1e-9, 0
    li = 0
    for a, e, path in movers:
        if len(out) >= most_files or li >= len(large):
            break
        n = e - a
        kn = bucket_of_length(n)
        if short.get(kn, 0) <= 0 or a in taken or e in taken:
            continue
        holes = [k for k in sorted(short) if short[k] > 0 and (k != kn or short[k] > 1)]
        if not holes:
            continue
        # As long as the snapshot's extents of that bucket are on average.
        mean = want_b.get(holes[0], 0) // max(want_n.get(holes[0], 1), 1)
        g = min(max(mean, 1 << holes[0]), (2 << holes[0]) - 1)
        while li < len(large):
            cur, end = large[li]
            rest = end - cur - g - n
            if rest > 0 and bucket_of_length(rest) == bucket_of_length(end - cur):
                break
            li += 1
        else:
            break
        rest = end - cur - g - n
        for length, sign in ((g, 1), (n, 1), (end - cur, -1), (rest, 1)):
            k = bucket_of_length(length)
            dn[k] = dn.get(k, 0) + sign
            db[k] = db.get(k, 0) + sign * length
        short[holes[0]] -= 1
        short[kn] -= 1
        large[li][0] = cur + g + n
        taken.update((a - 1, a, e, e + 1))
        out.append((path, cur + g, n))
        now = _objective(dn, db, want_n, want_b)
        if now < best:
            best, keep = now, len(out)
    return out[:keep]


def plan_plugs(
    free_start: np.ndarray,
    free_len: np.ndarray,
    spans: list[tuple[int, int, str]],
    want_n: dict[int, int],
    want_b: dict[int, int],
    rng: random.Random,
    most_files: int = MAX_WINDOW_FILES,
) -> list[tuple[str, int, int]]:
    """Moves (path, goal block, blocks) that put files of one extent (``spans``: start, end,
    path) at the start of free extents, toward the snapshot's free space (``want_n`` extents
    and ``want_b`` blocks per bucket). Each window of the disk (one or more files with the
    free extents between and beside them) emptied becomes one free extent; each file goes to
    a free extent of its length or the shortest longer one of some bucket (what it leaves over
    stays free), whichever brings the free space nearest. A window is taken, in random order,
    when it brings the free space nearer by counts and blocks together."""
    have_n, have_b = _histogram(free_len)
    by_len: dict[int, list[int]] = {}
    for a, n in zip(free_start.tolist(), free_len.tolist(), strict=True):
        by_len.setdefault(int(n), []).append(int(a))
    for starts in by_len.values():
        rng.shuffle(starts)
    lengths = sorted(by_len)
    windows: list[list[tuple[int, int, str]]] = []
    for chain in _chains(free_start, free_len, spans):
        last = len(chain) - 1
        for s in range(len(chain)):
            if s and chain[s][2]:  # a window starts at a free extent or the chain's start
                continue
            for e in range(s, min(s + 2 * most_files + 1, len(chain))):
                if e < last and chain[e][2]:  # ... and ends at one or the chain's end
                    continue
                win = chain[s : e + 1]
                nfiles = sum(1 for it in win if it[2])
                if 0 < nfiles <= most_files and nfiles < len(win):
                    windows.append(win)
    rng.shuffle(windows)
    used: set[int] = set()  # free extents (their start) emptied into or joined
    moved: set[str] = set()
    out: list[tuple[str, int, int]] = []
    best = _objective(have_n, have_b, want_n, want_b)

    def free_at(length: int, skip: set[int]) -> int | None:
        return next((h for h in by_len[length] if h not in used and h not in skip), None)

    def choices(n: int, skip: set[int]) -> list[tuple[int, int]]:
        """Free extents a file of ``n`` blocks may go to: one of its length, and in each
        bucket the shortest at least as long (what it leaves over stays free)."""
        out_: list[tuple[int, int]] = []
        i = bisect.bisect_left(lengths, n)
        seen: set[int] = set()
        while i < len(lengths):
            length = lengths[i]
            k = bucket_of_length(length)
            h = None if k in seen else free_at(length, skip)
            if h is None:
                i += 1
                continue
            out_.append((h, length))
            seen.add(k)
            # on to the next bucket
            i = bisect.bisect_left(lengths, 2 << k, lo=i)
        return out_

    def add(dn: dict[int, int], db: dict[int, int], length: int, sign: int) -> None:
        k = bucket_of_length(length)
        dn[k] = dn.get(k, 0) + sign
        db[k] = db.get(k, 0) + sign * length

    for win in windows:
        frees = [it for it in win if not it[2]]
        movers = [it for it in win if it[2]]
        if any(it[0] in used for it in frees) or any(it[2] in moved for it in movers):
            continue
        skip = {it[0] for it in frees}
        dn, db = dict(have_n), dict(have_b)
        for it in frees:
            add(dn, db, it[1] - it[0], -1)
        add(dn, db, win[-1][1] - win[0][0], 1)
        holes: list[tuple[int, int]] = []  # (start, length) each mover is put at
        for it in movers:
            n = it[1] - it[0]
            pick: tuple[float, int, int] | None = None
            for h, length in choices(n, skip):
                add(dn, db, length, -1)
                if length > n:
                    add(dn, db, length - n, 1)
                score = _objective(dn, db, want_n, want_b)
                if pick is None or score < pick[0]:
                    pick = (score, h, length)
                if length > n:
                    add(dn, db, length - n, -1)
                add(dn, db, length, 1)
            if pick is None:
                break
            _, h, length = pick
            add(dn, db, length, -1)
            if length > n:
                add(dn, db, length - n, 1)
            holes.append((h, length))
            skip.add(h)
        if len(holes) < len(movers):
            continue
        now = _objective(dn, db, want_n, want_b)
        if now >= best - 1e-9:
            continue
        best, have_n, have_b = now, dn, db
        used.update(skip)
        for it, (h, _) in zip(movers, holes, strict=True):
            moved.add(it[2])
            out.append((it[2], h, it[1] - it[0]))
    return out

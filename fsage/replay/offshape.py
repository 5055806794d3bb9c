"""Free space shaped offline, where the mounted steering stalls: the kernel's allocator takes no
hint where a file goes, libext2fs's does (an ``allocate-near`` op: its blocks are searched from
a goal block on, so a file put at a free extent's start fills it from there).

A recreation with more small free extents than the snapshot (the original, fuller while its
unseen temporaries lived, filled them with pieces of the files it wrote) and fewer large ones
gets plugs: files of one extent that lie between free extents are rewritten (under their
temporary names, renamed over them) into surplus free extents of their length (or the shortest
longer one), so those go and the window the files leave joins the free extents in and beside
it into one. ``plan_plugs`` takes a window only where it brings the free space nearer the
snapshot's by extent counts and blocks together. The closed loop runs a shaping round where a
mounted round did not bring the free space nearer. The ops run offline
(``fsage.replay.recreate`` unmounts the image for them and mounts it again at the next
measurement); they are journaled as inferred ops like every other move, and a journal replays
them offline at the same point. ``landed`` checks, on the next measurement, which plugs took
their free extent.
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

#: A shaping runs where free extents of at most this many blocks outnumber the snapshot's (the
#: kernel's small-file allocation left too many of 2-8 blocks at the last snapshot measured).
PLUG_MAX_BLOCKS = 15
#: Files a window moves at most (each into a free extent of its own length).
MAX_WINDOW_FILES = 8


class OfflineShaper(Mover):
    """Plugs surplus small free extents offline (see the module doc)."""

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
        """Plug surplus small free extents while each plug brings the free space nearer the
        snapshot's (``plan_plugs``), within the interval's ``allowed`` bytes; the number of
        plugs made."""
        self.plugs = []
        excess = {k: n for k, n in self._excess(state).items() if (1 << k) <= PLUG_MAX_BLOCKS}
        if not excess:
            return 0
        bs = state.target.block_size
        by_path = {f.path: f for f in everyone}
        # Only files the recreation holds as the snapshot does (as many blocks as its size).
        spans = [s for s in self._spans(state, everyone)
                 if -(-by_path[s[2]].size // bs) == s[1] - s[0]]  # fmt: skip
        plan = plan_plugs(state.free_start, state.free_len, spans, self._target_free_counts,
                          self._target_free, rng)  # fmt: skip
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
            self._count(churn, "plug")
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
    path) into free extents of exactly their length, where the free extents of that length
    outnumber the snapshot's (``want_n`` extents and ``want_b`` blocks per bucket). Each move
    empties a window of the disk: one or more files with the free extents between and beside
    them, which become one free extent. A window is taken, windows and holes at random, when
    it brings the free space nearer the snapshot's by counts and blocks together."""
    have_n: dict[int, int] = {}
    have_b: dict[int, int] = {}
    by_len: dict[int, list[int]] = {}
    for a, n in zip(free_start.tolist(), free_len.tolist(), strict=True):
        k = bucket_of_length(int(n))
        have_n[k] = have_n.get(k, 0) + 1
        have_b[k] = have_b.get(k, 0) + int(n)
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
    for win in windows:
        frees = [it for it in win if not it[2]]
        movers = [it for it in win if it[2]]
        if any(it[0] in used for it in frees) or any(it[2] in moved for it in movers):
            continue
        inside = {it[0] for it in frees}
        holes: list[tuple[int, int]] = []  # (start, length) each mover is put at
        for it in movers:
            n = it[1] - it[0]
            # The free extent of the mover's length or, failing one, the shortest longer:
            # what it leaves over stays a free extent.
            h = None
            for length in lengths[bisect.bisect_left(lengths, n) :]:
                h = next((h for h in by_len[length] if h not in used and h not in inside
                          and all(h != g for g, _ in holes)), None)  # fmt: skip
                if h is not None:
                    holes.append((h, length))
                    break
            if h is None:
                break
        if len(holes) < len(movers):
            continue
        dn, db = dict(have_n), dict(have_b)
        for (_, length), it in zip(holes, movers, strict=True):
            k = bucket_of_length(length)
            dn[k] -= 1
            db[k] -= length
            rest = length - (it[1] - it[0])
            if rest:
                k = bucket_of_length(rest)
                dn[k] = dn.get(k, 0) + 1
                db[k] = db.get(k, 0) + rest
        for it in frees:
            k = bucket_of_length(it[1] - it[0])
            dn[k] -= 1
            db[k] -= it[1] - it[0]
        union = win[-1][1] - win[0][0]
        k = bucket_of_length(union)
        dn[k] = dn.get(k, 0) + 1
        db[k] = db.get(k, 0) + union
        now = _objective(dn, db, want_n, want_b)
        if now >= best - 1e-9:
            continue
        best, have_n, have_b = now, dn, db
        used.update(inside)
        used.update(h for h, _ in holes)
        for it, (h, _) in zip(movers, holes, strict=True):
            moved.add(it[2])
            out.append((it[2], h, it[1] - it[0]))
    return out

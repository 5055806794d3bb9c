"""Closed-loop replay: the churn no snapshot saw, inferred by steering toward each snapshot.

Between two snapshots a file may be rewritten several times; only its last version is
recorded, so an op stream inferred from the snapshots writes it once and leaves the recreation
less fragmented, its directories' files closer together and its free space less broken up than
the original's. Each snapshot's layout is a target all the same. After an interval's visible
ops, ``Steerer.steer`` measures the recreation (per size bucket layout score, path-order
dynamic layout score, free-space histogram: ``fsage.ager.match_target``'s comparison) against
the snapshot and, in rounds, adds rewrites of the files the interval changed — each written
whole under a temporary name and renamed over the old one (as git, editors and package
managers do), two at a time in alternating pieces where a size bucket is too contiguous;
where the free space lacks extents of some sizes, files between free extents are rewritten
elsewhere to join them, and spacers of the lacking sizes (short-lived temporaries in the
changed directories) are written between rewritten files and deleted, leaving holes; where
a size bucket is more fragmented than the snapshot's (the allocator overshot), its most
fragmented files, changed in the interval or not, are rewritten whole and put on disk at once.
The free space is judged by blocks and by the count of free extents per bucket (the blocks'
histogram is decided by the few largest extents). Where the recreation has too many small
free extents — the original, fuller while its unseen temporaries lived, filled them with
pieces of the files it wrote — a round is pressed: a short-lived plug takes the free space
but what ext4 keeps back and what the round moves, and the files between small free extents
(``merge_windows``) are rewritten, filling small free extents elsewhere and leaving one
free extent for several; the plug is deleted at the round's end. A round that moved files
for the buckets or the locality leaves the free space to the next round, which shapes it
from a fresh measurement. So on until every dimension is within the
matcher's tolerances, or the buckets and the free space are and the locality's excess is
smaller than a round's swing (``SETTLE_GAP``), or the interval's budget (bytes, ops,
seconds, rounds) is spent. The added ops are marked ``inferred`` so that a journal of the
whole recreation can be rerun and its assumptions told apart from what was seen.

The evidence of hidden rewrites is reported with each interval: files renewed (a new inode)
whose size and modification time are unchanged, modification times after the previous
snapshot, and the distance of the open-loop state from the snapshot.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fsage.ager.match_target import (
    DYNAMIC_TOL,
    FREE_TV,
    SCORE_TOL,
    LayoutTarget,
    MeasuredState,
    compare,
    distance,
    measure,
    target_from_layout,
)
from fsage.layout import Layout
from fsage.replay.changed import _File, changed_files, evidence
from fsage.replay.freeshape import bucket_of_length, count_distance, join_windows, merge_windows
from fsage.workload import NoSpaceError, Op, OpFailedError

#: A gap (summed excess over the tolerances) this large or larger gets a full first round.
PROBE_GAP = 0.1
#: Suffix of the temporary names inferred rewrites are written under.
TEMP_SUFFIX = ".fsage-inferred"
#: Files of fewer blocks ext4 packs in its per-CPU preallocation (mb_stream_req's default);
#: larger ones follow one another in the stream allocation.
STREAM_BLOCKS = 16
#: Rounds in a row without progress after which an interval's steering stops (a round's
#: moves land where the allocator puts them: one may undo the last's and the next mend it).
STALE_ROUNDS = 3
#: A locality excess this small, with the size buckets and the free space within their
#: tolerances, ends an interval's steering: a round's moves swing the free-space distance by
#: 0.03-0.1 and the excess by 0.01-0.05 (14 MiB ext4, measured round by round), so another
#: round is as likely to lose the free space as to mend the locality.
SETTLE_GAP = 0.02
#: Files may fill this share of a window whose small free extents are joined in a pressed
#: round (``merge_windows``): their new versions fill small free extents elsewhere.
MERGE_SHARE = 0.85
#: Spacers per round at most.
MAX_SPACERS = 64


@dataclass
class Budget:
    """What one interval's steering may spend: inferred bytes up to ``bytes_factor`` times the
    bytes its visible ops wrote (at least ``min_bytes``), ``ops`` ops, ``seconds`` of wall
    time and ``rounds`` measurements; the last interval (the snapshot a recreation is judged
    at) ``rounds`` times ``last_factor`` of them, and as many more rounds without progress
    before it gives up, every other interval ``rounds`` over that factor (a round costs a
    remount and an offline read: the time goes where the verdict is taken)."""

    bytes_factor: float = 3.0
    min_bytes: int = 1 << 20
    ops: int = 50_000
    seconds: float = 120.0
    rounds: int = 10
    last_factor: int = 2

    def rounds_for(self, last: bool) -> int:
        f = max(self.last_factor, 1)
        return self.rounds * f if last else max(self.rounds // f, 1)

    def bytes_for(self, visible: int) -> int:
        return max(int(self.bytes_factor * visible), self.min_bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes_factor": self.bytes_factor,
            "min_bytes": self.min_bytes,
            "ops": self.ops,
            "seconds": self.seconds,
            "rounds": self.rounds,
            "last_factor": self.last_factor,
        }


@dataclass
class IntervalChurn:
    """The unseen churn inferred for one snapshot interval."""

    snapshot: int
    visible_bytes: int
    inferred_bytes: int = 0
    inferred_ops: int = 0
    #: rewrite (by rename, whole), interleaved (rewrites in alternating pieces), mend (a
    #: fragmented file rewritten at once), join (moved to join free extents), spacer and
    #: neighbour (a short-lived file and the rewrite placed after it).
    kinds: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    #: The matcher's distance (worst excess over tolerance) before and after steering.
    distance_before: float = 0.0
    distance_after: float = 0.0
    matched: bool = False
    stopped: str = ""
    seconds: float = 0.0
    evidence: dict[str, int] = field(default_factory=dict)
    #: What is still off after steering (bucket labels, "free space", "locality").
    off: list[str] = field(default_factory=list)
    #: Each measurement (before the first round, then after each): inferred bytes so far,
    #: the free-space distance and the summed excess over the tolerances.
    trace: list[dict[str, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def judge(target: LayoutTarget, now: LayoutTarget) -> dict[str, Any]:
    """The matcher's comparison (``compare``), with the free space judged by the count of
    free extents per bucket as well as by blocks (``free_count``): the blocks' histogram
    is decided by the few largest extents, and a recreation in twice the pieces passed it."""
    rep = compare(target, now)
    rep["free_count"] = count_distance(target, now)
    rep["free_ok"] = bool(rep["free_ok"] and rep["free_count"] <= FREE_TV)
    rep["matched"] = bool(rep["matched"] and rep["free_ok"])
    return rep


def _free_excess(rep: dict[str, Any]) -> float:
    """The free space's distance beyond its tolerance: the worse of by blocks and by counts."""
    tv = rep["free_tv"]
    if tv is None:
        return 0.0
    return float(max(0.0, tv - FREE_TV, rep.get("free_count", 0.0) - FREE_TV))


def _distance(rep: dict[str, Any]) -> float:
    """The matcher's distance, the free space's by counts included."""
    return float(max(distance(rep), _free_excess(rep)))


def _gap(rep: dict[str, Any]) -> float:
    """Every dimension's excess over its tolerance, summed: progress in one bucket counts
    even while another decides the matcher's distance."""
    gap = 0.0
    for r in rep["buckets"]:
        if r["judged"]:
            d = 1.0 if r["score"] is None else abs(r["score"] - r["target_score"])
            gap += max(0.0, d - SCORE_TOL)
    gap += _free_excess(rep)
    want = rep["target_locality"].get("dynamic_score")
    have = rep["locality"].get("dynamic_score")
    if want is not None and have is not None and not rep["dynamic_ok"]:
        gap += max(0.0, abs(have - want) - DYNAMIC_TOL)
    return gap


def _point(churn: IntervalChurn, rep: dict[str, Any], gap: float) -> dict[str, float]:
    tv = rep["free_tv"]
    return {"bytes": churn.inferred_bytes, "free_tv": -1.0 if tv is None else round(tv, 4),
            "free_count": round(rep.get("free_count", 0.0), 4), "gap": round(gap, 4)}  # fmt: skip


def _off(rep: dict[str, Any]) -> list[str]:
    out = [r["label"] for r in rep["buckets"] if not r["ok"]]
    if not rep["free_ok"]:
        out.append("free space")
    if not rep["dynamic_ok"]:
        out.append("locality")
    return out


class Steerer:
    """Steers a recreation, interval by interval, toward each snapshot (see the module doc).

    ``run`` applies an op to the recreation (and journals it); ``read`` returns the
    recreation's layout once the ops so far are on disk."""

    def __init__(
        self,
        run: Callable[[Op], int],
        read: Callable[[], Layout],
        budget: Budget | None = None,
        seed: int = 0,
    ) -> None:
        self.run = run
        self.read = read
        self.budget = budget or Budget()
        self.seed = seed
        self.intervals: list[IntervalChurn] = []
        #: Nothing run since the last measurement, which unmounted and mounted the recreation.
        self.remounted = False
        #: The snapshot's free-space histogram (fractions of its free blocks) and the
        #: recreation's last measured state.
        self._want: dict[int, float] = {}
        self._target = LayoutTarget(0, 0, 0.0, {}, {})
        self._target_free: dict[int, int] = {}
        self._target_free_counts: dict[int, int] = {}
        self._state: MeasuredState | None = None
        #: The last round moved files and left the free space to the next.
        self._free_turn = False
        #: Temporaries a full disk refused (deleted; never renamed over their file).
        self._lost: set[str] = set()
        self._path_cache: list[tuple[Layout, dict[int, list[str]]]] = []

    # ------------------------------------------------------------------ one interval

    def steer(
        self,
        snapshot_id: int,
        snap: Layout,
        prev: Layout | None,
        prev_ns: int | None,
        visible_bytes: int,
        last: bool = False,
    ) -> IntervalChurn:
        """Steer the recreation toward snapshot ``snapshot_id`` (``snap``) after its interval's
        visible ops; ``last``: the snapshot the recreation ends at (see ``Budget``)."""
        t0 = time.perf_counter()
        rounds = self.budget.rounds_for(last)
        stale_rounds = STALE_ROUNDS * (max(self.budget.last_factor, 1) if last else 1)
        rng = random.Random(self.seed * 1_000_003 + snapshot_id)
        target = target_from_layout(snap, f"snapshot {snapshot_id}")
        self._want = target.free_fractions()
        self._target = target
        self._target_free, self._target_free_counts = target.free, target.free_counts
        churn = IntervalChurn(snapshot_id, visible_bytes)
        self._free_turn = False
        churn.evidence = evidence(prev, snap, prev_ns, self._paths)
        files = changed_files(prev, snap, prev_ns, self._paths)
        everyone = changed_files(None, snap, None, self._paths)
        allowed = self.budget.bytes_for(visible_bytes)
        state = self._measure()
        rep = judge(target, state.target)
        churn.distance_before = _distance(rep)
        gap = _gap(rep)
        churn.trace.append(_point(churn, rep, gap))
        # Small first, and smaller the nearer the snapshot: added churn cannot be taken back,
        # so the first round probes the rate.
        near = min(1.0, gap / PROBE_GAP)
        step = max(int(allowed / max(2 * rounds, 1) * near), 1)
        stale = 0
        while True:
            if rep["buckets_ok"] and rep["free_ok"] and rep["dynamic_ok"]:
                churn.stopped = "matched"
                break
            if churn.rounds and rep["free_ok"] and rep["buckets_ok"] and gap <= SETTLE_GAP:
                churn.stopped = "settled: buckets and free space matched, locality within a swing"
                break
            if not files:
                churn.stopped = "no file changed in the interval"
                break
            if churn.inferred_bytes >= allowed:
                churn.stopped = "bytes budget spent"
                break
            if churn.inferred_ops >= self.budget.ops:
                churn.stopped = "ops budget spent"
                break
            if churn.rounds >= rounds:
                churn.stopped = "rounds budget spent"
                break
            if time.perf_counter() - t0 >= self.budget.seconds:
                churn.stopped = "time budget spent"
                break
            if not self._steerable(rep):
                # Only a read less sequential or free space more broken up than the
                # snapshot's: added churn only takes them farther.
                churn.stopped = "recreation already past the snapshot"
                break
            self._round(rep, state, files, everyone, min(step, allowed - churn.inferred_bytes),
                        rng, churn, allowed)  # fmt: skip
            churn.rounds += 1
            state = self._measure()
            rep = judge(target, state.target)
            new_gap = _gap(rep)
            churn.trace.append(_point(churn, rep, new_gap))
            if new_gap < gap - 1e-4:
                # Newton-like: as many bytes as the rest of the gap needs at this rate.
                rate = (gap - new_gap) / max(step, 1)
                step = int(min(max(new_gap / rate, step / 2), step * 2))
                stale = 0
            else:
                stale += 1
                if stale >= stale_rounds:
                    churn.stopped = "no progress"
                    break
            gap = new_gap
        churn.distance_after = _distance(rep)
        churn.matched = churn.stopped == "matched"
        churn.off = _off(rep)
        churn.seconds = time.perf_counter() - t0
        self.intervals.append(churn)
        return churn

    @staticmethod
    def _hi(r: dict[str, Any]) -> bool:
        return bool(r["judged"] and not r["ok"] and r["score"] is not None
                    and r["score"] > r["target_score"])  # fmt: skip

    @staticmethod
    def _lo(r: dict[str, Any]) -> bool:
        return bool(r["judged"] and not r["ok"] and r["score"] is not None
                    and r["score"] < r["target_score"])  # fmt: skip

    def _steerable(self, rep: dict[str, Any]) -> bool:
        """Whether what is off can be moved by added churn: a size bucket more contiguous
        (rewrites in alternating pieces) or less (files rewritten whole at once), a path-order
        read more sequential, or free space more whole than the snapshot's."""
        if any(self._hi(r) or self._lo(r) for r in rep["buckets"]):
            return True
        want = rep["target_locality"].get("dynamic_score")
        have = rep["locality"].get("dynamic_score")
        if not rep["dynamic_ok"] and want is not None and have is not None and have > want:
            return True
        state = self._state
        if rep["free_ok"] or state is None:
            return False
        return bool(self._short(state)) or bool(self._excess(state))

    def _short(self, state: MeasuredState | None) -> dict[int, int]:
        """Free blocks the recreation lacks per free-extent bucket (log2 of the extent's
        length) against the snapshot, where the lack is worth a hole."""
        if state is None or not state.free_len.size:
            return {}
        have = state.target.free_fractions()
        total = int(state.free_len.sum())
        out = {}
        for k, w in self._want.items():
            lack = (w - have.get(k, 0.0)) * total
            if w - have.get(k, 0.0) > FREE_TV / 8 and lack >= 1 << k:
                out[k] = int(lack)
        if self._counts_off(state):
            # In pieces of other sizes than the snapshot's: the extents of the sizes it
            # lacks by count (as long as the snapshot's are).
            want_n = self._target_free_counts
            have_n = state.target.free_counts
            for k, n in want_n.items():
                lack_n = n - have_n.get(k, 0)
                if lack_n > 0:
                    mean = self._target_free.get(k, 0) / n
                    out[k] = max(out.get(k, 0), int(lack_n * mean))
        return out

    def _counts_off(self, state: MeasuredState) -> bool:
        """The recreation's free extents per bucket are farther from the snapshot's by count
        than the tolerance."""
        return count_distance(self._target, state.target) > FREE_TV

    def _excess(self, state: MeasuredState) -> dict[int, int]:
        """Free extents per bucket the recreation has more of than the snapshot, where its
        counts are off and it is in more pieces in all ({} where not, or the excess is a few
        extents): joining them would take a free space in fewer pieces farther."""
        want_n = self._target_free_counts
        have = sum(state.target.free_counts.values())
        if not self._counts_off(state) or have <= sum(want_n.values()):
            return {}
        out = {k: n - want_n.get(k, 0) for k, n in state.target.free_counts.items()
               if n > want_n.get(k, 0)}  # fmt: skip
        return out if sum(out.values()) >= max(sum(want_n.values()) // 50, 2) else {}

    _last: Layout | None = None

    def _paths(self, layout: Layout) -> dict[int, list[str]]:
        """``layout.paths()``, kept for the layouts in use (the snapshot, the one before, the
        last measurement): each is asked for several times an interval or round."""
        for lay, paths in self._path_cache:
            if lay is layout:
                return paths
        paths = layout.paths()
        self._path_cache = [*self._path_cache[-2:], (layout, paths)]
        return paths

    def _measure(self) -> MeasuredState:
        # Measured as the snapshot was taken: unmounted, read offline (the live reader counts
        # ext4's preallocations as used). The marker makes a rerun remount at the same point.
        self.run(Op("snapshot", label="closed-loop measure", inferred=True))
        self._last = self.read()
        self.remounted = True
        self._state = measure(self._last, "recreation")
        return self._state

    # ------------------------------------------------------------------ one round

    def _round(
        self,
        rep: dict[str, Any],
        state: MeasuredState,
        files: list[_File],
        everyone: list[_File],
        nbytes: int,
        rng: random.Random,
        churn: IntervalChurn,
        allowed: int,
    ) -> None:
        bs = state.target.block_size
        if self._free_turn and not rep["free_ok"]:
            # The last round moved files and left the free space to this one (below): its
            # turn, or rounds that move files for the buckets or the locality every time
            # would never shape it while each moves it farther.
            self._free_turn = False
            self._shape_free(state, files, everyone, rng, churn, allowed)
            return

        def bucket_of(f: _File) -> int:
            return int((max(-(-f.size // bs), 1) - 1).bit_length())

        # A size bucket's score moves by one break (or one mended) per Σ (blocks - 1) of the
        # bucket: as many breaks as the gap needs, no more (added churn cannot be taken back).
        ops_before = churn.inferred_ops
        pairs: list[list[_File]] = []
        # Free space in more pieces than the snapshot's goes first: the files its pressed
        # rounds move break as they fill the small free extents (as the original's did while
        # it was that full), where rewrites in alternating pieces free small extents more.
        # Only while far (twice the tolerance): a bucket the presses leave too contiguous
        # is then broken by rewrites in pieces.
        press = rep["free_count"] > 2 * FREE_TV and bool(self._excess(state))
        for r in rep["buckets"]:
            k = r["bucket"]
            if not (self._hi(r) or self._lo(r)):
                continue
            breaks = int(np.ceil(abs(r["score"] - r["target_score"]) * state.den_k.get(k, 0)))
            if self._hi(r) and not press:
                pool = [f for f in files if bucket_of(f) == k and f.size > bs]
                # Each file of a pair gets one break (two pieces).
                pool = rng.sample(pool, min(len(pool), breaks + breaks % 2))
                pairs += [pool[i : i + 2] for i in range(0, len(pool) - 1, 2)]
            elif self._lo(r):
                self._mend([f for f in everyone if bucket_of(f) == k], state, breaks, churn)
        self._interleaved(pairs, bs, churn, int(state.free_len.sum()) * bs // 4)
        if any(self._lo(r) for r in rep["buckets"]):
            # A bucket already more fragmented than the snapshot's: whole rewrites into this
            # free space would break it further.
            return
        want = rep["target_locality"].get("dynamic_score")
        have = rep["locality"].get("dynamic_score")
        if not rep["dynamic_ok"] and want is not None and have is not None and have > want:
            # Whole rewrites of the changed files: each moves a file away from its neighbours.
            # Each also takes its blocks from a free extent and frees its old ones: no more
            # bytes a round than moves the free-space distance by half its tolerance (rounds
            # of megabytes once split the largest free extents at the last snapshot).
            cap = int(FREE_TV / 2 * int(state.free_len.sum()) * bs)
            total = 0
            for f in rng.sample(files, len(files)):
                if total >= min(nbytes, cap):
                    break
                self._rewrite(f, churn)
                total += f.size
        # Free space is shaped from this round's measurement: after moves that freed and took
        # blocks it is stale, and shaping it would mend lacks those moves already changed (a
        # round's distance then swings by more than the tolerance). The next round shapes it.
        self._free_turn = churn.inferred_ops != ops_before
        if not rep["free_ok"] and not self._free_turn:
            self._shape_free(state, files, everyone, rng, churn, allowed)

    def _shape_free(
        self,
        state: MeasuredState,
        files: list[_File],
        everyone: list[_File],
        rng: random.Random,
        churn: IntervalChurn,
        allowed: int,
    ) -> None:
        """Free extents of the sizes the recreation lacks against the snapshot, as the
        original's unseen churn left them. First where a file's blocks lie between free
        extents whose union is of a size lacking: the file is rewritten elsewhere (put on disk
        before the old one goes), which joins them (a hole grows as files around it are
        renewed). Then, where the recreation has free extents larger than the snapshot's to
        spare, spacers: short-lived temporaries of the lacking sizes, each put on disk and
        followed by a rewritten file of the same allocation class (ext4 packs small files
        apart from large ones) so that each spacer lies between allocated blocks, and all
        deleted at the round's end, their blocks left as holes of their size. No more than
        the interval's ``allowed`` bytes are written."""
        short = self._short(state)
        excess = self._excess(state)
        if not (short or excess) or self._last is None:
            return
        bs = state.target.block_size
        by_path = {f.path: f for f in everyone}
        ino_of: dict[str, int] = {}
        for ino, ps in self._paths(self._last).items():
            for p in ps:
                ino_of[p.lstrip("/")] = ino
        idx = {int(i): k for k, i in enumerate(state.ino.tolist())}
        spans = []
        for f in everyone:
            k_i = idx.get(ino_of.get(f.path, -1))
            if k_i is not None and int(state.frags[k_i]) == 1 and int(state.blocks[k_i]):
                a = int(state.first[k_i])
                spans.append((a, a + int(state.blocks[k_i]), f.path))
        #: Rewrites written under their temporary name, renamed once all are on disk.
        pending: list[_File] = []
        spacers: list[str] = []
        if excess:
            # Too many free extents of some sizes: windows that join several of them, their
            # files moved while a plug holds the larger free extents (a pressed round).
            longest = (2 << max(self._target_free_counts, default=0)) - 1
            # The blocks of the small extents in excess: what the movers can fill, no more.
            fill = sum(n * state.target.free.get(k, 0) // max(state.target.free_counts[k], 1)
                       for k, n in excess.items())  # fmt: skip
            windows = merge_windows(state.free_start, state.free_len, spans, excess, longest,
                                    MERGE_SHARE)  # fmt: skip
            movers = []
            for f in (by_path[p] for w in windows for p in w):
                if fill <= 0:
                    break
                movers.append(f)
                fill -= -(-f.size // bs)
            plug = self._plug(state, movers, files or everyone, rng, churn)
            for f in movers:
                if churn.inferred_bytes >= allowed:
                    break
                pending.append(self._write_temp(f, churn, "merge"))
            if plug:
                # Nothing else this round: what it would write finds no room but the plug's.
                self._finish(pending, [plug], churn)
                return
            moved_now = {f.path for f in pending}
            spans = [t for t in spans if t[2] not in moved_now]
        for window in join_windows(state.free_start, state.free_len, spans, short):
            if churn.inferred_bytes >= allowed:
                break
            for path in window:
                pending.append(self._write_temp(by_path[path], churn, "join"))
        # Then single files beside a free extent, the interval's files first, for the sizes
        # still lacking (a small free space has few windows of little filling).
        moved = {f.path for f in pending}
        ends = {int(a + n): int(n) for a, n in zip(state.free_start, state.free_len, strict=True)}
        starts = {int(a): int(n) for a, n in zip(state.free_start, state.free_len, strict=True)}
        changed = {f.path for f in files}
        taken: set[int] = set()  # free extents (their start) joined this way
        for a, b, path in sorted(rng.sample(spans, len(spans)), key=lambda t: t[2] not in changed):
            if churn.inferred_bytes >= allowed:
                break
            if path in moved:
                continue
            left, right = ends.get(a, 0), starts.get(b, 0)
            if not (left or right) or (a - left) in taken or b in taken:
                continue
            k = bucket_of_length(left + b - a + right)
            if short.get(k, 0) <= 0:
                continue
            pending.append(self._write_temp(by_path[path], churn, "join"))
            short[k] -= left + b - a + right
            taken.update({a - left, b})
        have = state.target.free_fractions()
        spare = [k for k, v in have.items() if v > self._want.get(k, 0.0)]
        small = [f for f in files if -(-f.size // bs) < STREAM_BLOCKS]
        large = [f for f in everyone if -(-f.size // bs) >= STREAM_BLOCKS]
        for k in sorted(short, reverse=True):
            if not any(j > k for j in spare):
                continue
            lo, hi = 1 << k, (1 << (k + 1)) - 1
            done = {f.path for f in pending}
            neighbours = [f for f in (small if hi < STREAM_BLOCKS else large)
                          if f.path not in done]  # fmt: skip
            rng.shuffle(neighbours)
            need = short[k]
            while (need >= lo and neighbours and len(spacers) < MAX_SPACERS
                   and churn.inferred_bytes < allowed):  # fmt: skip
                n = rng.randint(lo, max(lo, min(hi, need)))
                host = rng.choice(files or neighbours)
                head = host.path.rpartition("/")[0]
                name = f".spc{rng.randrange(1 << 30):08x}{TEMP_SUFFIX}"
                path = f"{head}/{name}" if head else name
                self._op(Op("create", path, n * bs, inferred=True), churn)
                self._count(churn, "spacer")
                spacers.append(path)
                g = neighbours.pop()
                pending.append(self._write_temp(by_path.get(g.path, g), churn, "neighbour"))
                need -= n
        self._finish(pending, spacers, churn)

    def _finish(self, pending: list[_File], spacers: list[str], churn: IntervalChurn) -> None:
        if not pending and not spacers:
            return
        # One sync puts them all on disk, allocated in the order written (writeback takes
        # the inodes in the order they were dirtied): each spacer between the rewrites
        # around it, each new version before its old one is freed. One sync, not an fsync
        # each: a journal commit costs milliseconds.
        self._op(Op("sync", inferred=True), churn)
        for f in pending:
            self._replace(f, churn)
        for path in spacers:
            if path in self._lost:  # refused by a full disk: already gone
                self._lost.discard(path)
                continue
            self._op(Op("delete", path, inferred=True), churn)

    def _plug(
        self,
        state: MeasuredState,
        movers: list[_File],
        hosts: list[_File],
        rng: random.Random,
        churn: IntervalChurn,
    ) -> str | None:
        """A short-lived file that takes the free space but what ``movers`` need and what
        ext4 keeps back (2% of the blocks, 4096 at most), allocated before them: as the
        original's temporaries did while it was that full, it leaves the movers the small
        free extents (the allocator takes the largest first). Deleted at the round's end."""
        bs = state.target.block_size
        free = int(state.free_len.sum())
        keep = min(state.target.blocks_total // 50, 4096)
        need = sum(-(-f.size // bs) for f in movers)
        n = free - keep - need - max(free // 50, 64)
        if n <= 0 or not movers:
            return None
        head = rng.choice(hosts).path.rpartition("/")[0]
        name = f".plug{rng.randrange(1 << 30):08x}{TEMP_SUFFIX}"
        path = f"{head}/{name}" if head else name
        # Allocated, not written (fallocate takes its blocks at once, as writeback would):
        # space held for a moment is not churn, and megabytes a round cost time.
        if not self._op(Op("create", path, 0, inferred=True), churn):
            return None
        self._count(churn, "plug")
        if not self._op(Op("fallocate", path, n * bs, offset=0, inferred=True), churn):
            self._op(Op("delete", path, inferred=True), churn)
            return None
        return path

    def _mend(
        self, files: list[_File], state: MeasuredState, breaks: int, churn: IntervalChurn
    ) -> None:
        """Rewrite the most fragmented of ``files`` whole, put on disk at once (fsync) before
        it replaces the old version, until about ``breaks`` breaks are mended: a size bucket
        more fragmented than the snapshot's."""
        if self._last is None:
            return
        frags = dict(zip(state.ino.tolist(), state.frags.tolist(), strict=True))
        by_path = {p.lstrip("/"): frags.get(ino, 0) for ino, ps in self._paths(self._last).items()
                   for p in ps}  # fmt: skip
        worst = sorted(files, key=lambda f: -int(by_path.get(f.path, 0)))
        mended = 0
        for f in worst:
            if mended >= breaks or by_path.get(f.path, 0) <= 1:
                break
            tmp = _temp_name(f.path)
            if self._op(Op("create", tmp, f.size, inferred=True), churn):
                self._op(Op("fsync", tmp, inferred=True), churn)
            self._replace(f, churn)
            self._count(churn, "mend")
            mended += int(by_path[f.path]) - 1

    def _op(self, op: Op, churn: IntervalChurn) -> bool:
        """Run ``op``; False if it failed. An inferred file a full disk refused is deleted and
        remembered (``_lost``): its rename over the file it stands for is never run, so a
        short temporary never replaces a file of the snapshot."""
        self.remounted = False
        churn.inferred_ops += 1
        churn.inferred_bytes += op.size if op.op in ("create", "append") else 0
        # Journaled as run: a rerun meets the same failure.
        try:
            self.run(op)
        except NoSpaceError:
            if op.op in ("create", "append"):
                self._lost.add(op.path)
                # No part of an inferred file is left behind (the recreation would hold a
                # file the snapshot does not).
                with contextlib.suppress(NoSpaceError, OpFailedError):
                    self.run(Op("delete", op.path, inferred=True))
            return False
        except OpFailedError:
            return False
        return True

    def _replace(self, f: _File, churn: IntervalChurn) -> bool:
        """The temporary of ``f`` renamed over it and given its mode and time back, unless a
        full disk refused part of it (then it is gone already)."""
        tmp = _temp_name(f.path)
        if tmp in self._lost:
            self._lost.discard(tmp)
            return False
        if self._op(Op("rename", tmp, dest=f.path, inferred=True), churn):
            self._op(Op("setattr", f.path, mode=f.mode, mtime_ns=f.mtime_ns, inferred=True),
                     churn)  # fmt: skip
            return True
        return False

    def _count(self, churn: IntervalChurn, kind: str) -> None:
        churn.kinds[kind] = churn.kinds.get(kind, 0) + 1

    def _rewrite(self, f: _File, churn: IntervalChurn) -> None:
        """``f`` written whole under a temporary name and renamed over the old one."""
        self._op(Op("create", _temp_name(f.path), f.size, inferred=True), churn)
        self._replace(f, churn)
        self._count(churn, "rewrite")

    def _write_temp(self, f: _File, churn: IntervalChurn, kind: str) -> _File:
        """The new version of ``f`` written under its temporary name (the caller renames it)."""
        self._op(Op("create", _temp_name(f.path), f.size, inferred=True), churn)
        self._count(churn, kind)
        return f

    def _interleaved(
        self, pairs: list[list[_File]], bs: int, churn: IntervalChurn, room: int | None = None
    ) -> None:
        """Each pair's two files rewritten in alternating pieces, so that their blocks
        alternate as two writers' do. The pieces go to disk in layers: every file's first
        piece, in pair order, then one sync, then every file's second piece, and so on.
        Writeback allocates the files of a layer one after another in the order written, so
        each file's next piece finds the blocks after its last taken by its partner's; one
        sync per layer, not one fsync per piece (a journal commit each). Every temporary of a
        batch exists until the batch is renamed: batches hold at most ``room`` bytes (a
        nearly full disk refused the pieces of hundreds of pairs written at once)."""
        batch: list[list[_File]] = []
        held = 0
        for pair in pairs:
            size = sum(f.size for f in pair)
            if batch and room is not None and held + size > room:
                self._interleave_batch(batch, bs, churn)
                batch, held = [], 0
            batch.append(pair)
            held += size
        if batch:
            self._interleave_batch(batch, bs, churn)

    def _interleave_batch(self, pairs: list[list[_File]], bs: int, churn: IntervalChurn) -> None:
        files = [f for pair in pairs for f in pair]
        tmps = [_temp_name(f.path) for f in files]
        for t in tmps:
            self._op(Op("create", t, 0, inferred=True), churn)
        pieces = [max(-(-f.size // bs) // 2, 1) * bs for f in files]
        done = [0] * len(files)
        while any(d < f.size and t not in self._lost
                  for d, f, t in zip(done, files, tmps, strict=True)):  # fmt: skip
            for i, f in enumerate(files):
                if done[i] < f.size and tmps[i] not in self._lost:
                    n = min(pieces[i], f.size - done[i])
                    self._op(Op("append", tmps[i], n, inferred=True), churn)
                    done[i] += n
            self._op(Op("sync", inferred=True), churn)
        for f in files:
            if self._replace(f, churn):
                self._count(churn, "interleaved")

    # ------------------------------------------------------------------ summary

    def to_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget.to_json(),
            "seed": self.seed,
            "intervals": [c.to_json() for c in self.intervals],
            "inferred_bytes": sum(c.inferred_bytes for c in self.intervals),
            "inferred_ops": sum(c.inferred_ops for c in self.intervals),
        }


def _temp_name(path: str) -> str:
    head, _, name = path.rpartition("/")
    tmp = f".{name}{TEMP_SUFFIX}"
    return f"{head}/{tmp}" if head else tmp


__all__ = [
    "TEMP_SUFFIX",
    "Budget",
    "IntervalChurn",
    "Steerer",
    "changed_files",
    "evidence",
    "join_windows",
]

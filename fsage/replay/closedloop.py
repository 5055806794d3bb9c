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
histogram is decided by the few largest extents). Where the recreation has too many small free
extents — the original, fuller while its unseen temporaries lived, filled them with pieces of
the files it wrote — a round is pressed: a short-lived plug takes the free space but what ext4
keeps back and what the round moves, and the files between small free extents
(``merge_windows``) are rewritten, filling small free extents elsewhere and leaving one free
extent for several; the plug is deleted at the round's end. A round that moved files for the
buckets or the locality leaves the free space to the next round, which shapes it from a fresh
measurement. After a round that did not bring the free space nearer, the next shapes it offline
where the kernel cannot: files put at chosen free extents through libext2fs's goal
(``fsage.replay.offshape``), joining small free extents where there are too many, splitting
large ones into the small ones lacking where there are too few. So on until every dimension is
within the matcher's tolerances, or the buckets and the free space are and the locality's excess
is smaller than a round's swing (``SETTLE_GAP``), or the interval's budget (bytes, ops, seconds,
rounds) is spent, or, in a fresh file system's first interval, a round leaves only the free
space off and no nearer. The added ops are marked ``inferred`` so that a journal of the whole
recreation can be rerun and its assumptions told apart from what was seen.

The evidence of hidden rewrites is reported with each interval: files renewed (a new inode)
whose size and modification time are unchanged, modification times after the previous
snapshot, and the distance of the open-loop state from the snapshot.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fsage.ager.match_target import (
    FREE_TV,
    MeasuredState,
    measure,
    target_from_layout,
)
from fsage.layout import Layout
from fsage.replay.changed import _File, changed_files, evidence
from fsage.replay.freeshape import join_windows
from fsage.replay.interval import Budget, IntervalChurn, _distance, _gap, _off, _point, judge
from fsage.replay.moves import TEMP_SUFFIX
from fsage.replay.offshape import OfflineShaper
from fsage.workload import Op

#: A gap (summed excess over the tolerances) this large or larger gets a full first round.
PROBE_GAP = 0.1
#: moves land where the allocator puts them: one may undo the last's and the next mend it).
STALE_ROUNDS = 3
#: A locality excess this small, with the size buckets and the free space within their
#: tolerances, ends an interval's steering: a round's moves swing the free-space distance by
#: 0.03-0.1 and the excess by 0.01-0.05 (14 MiB ext4, measured round by round), so another
#: round is as likely to lose the free space as to mend the locality.
SETTLE_GAP = 0.02


class Steerer(OfflineShaper):
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
        super().__init__(run)
        self.read = read
        self.budget = budget or Budget()
        self.seed = seed
        self.intervals: list[IntervalChurn] = []
        #: The last round moved files and left the free space to the next.
        self._free_turn = False

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
        self.spacer_room = step
        # Progress is judged against the nearest state reached, not the round before: rounds
        # that each mend a little of what the one before lost would otherwise drift away
        # from the snapshot for the whole budget.
        best = gap
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
            kinds = dict(churn.kinds)
            # A mounted round that did not bring the free space nearer: the small free extents
            # the kernel's allocator leaves are plugged offline this round (``OfflineShaper``).
            made = 0
            if stale and not rep["free_ok"]:
                made = self._shape_offline(state, everyone, rng, churn, allowed)
            if not made:
                nbytes = min(step, allowed - churn.inferred_bytes)
                self._round(rep, state, files, everyone, nbytes, rng, churn, allowed)
            churn.rounds += 1
            state = self._measure()
            rep = judge(target, state.target)
            new_gap = _gap(rep)
            churn.trace.append(_point(churn, rep, new_gap, kinds))
            if made:
                off = churn.offline
                off["plugs"] = off.get("plugs", 0) + made
                off["landed"] = off.get("landed", 0) + self.landed()
                off["rounds"] = off.get("rounds", 0) + 1
            if new_gap < gap - 1e-4 and not made:
                # Newton-like: as many bytes as the rest of the gap needs at this rate.
                rate = (gap - new_gap) / max(step, 1)
                step = int(min(max(new_gap / rate, step / 2), step * 2))
            if new_gap < best - 1e-4:
                best = new_gap
                stale = 0
            else:
                stale += 1
                if stale >= stale_rounds:
                    churn.stopped = "no progress"
                    break
                if prev is None and not last and rep["buckets_ok"] and rep["dynamic_ok"]:
                    # A fresh file system's first interval, only its free space off and a
                    # round that did not bring it nearer: the rounds after it added more
                    # churn than the interval's hidden writes, and the next interval's ops
                    # reshape the free space anyway. Later intervals keep their rounds: one
                    # left off makes the next harder to match.
                    churn.stopped = "no progress on a fresh file system: only the free space off"
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

    # ------------------------------------------------------------------ summary

    def to_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget.to_json(),
            "seed": self.seed,
            "intervals": [c.to_json() for c in self.intervals],
            "inferred_bytes": sum(c.inferred_bytes for c in self.intervals),
            "inferred_ops": sum(c.inferred_ops for c in self.intervals),
        }


__all__ = [
    "TEMP_SUFFIX",
    "Budget",
    "IntervalChurn",
    "Steerer",
    "changed_files",
    "evidence",
    "join_windows",
    "judge",
]

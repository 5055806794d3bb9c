"""The sizes the matcher's fill draws (``fsage age T --match``): files within their size
buckets with the target's mean, spacers within their free-extent buckets, and the pieces a
bucket's files are interleaved in.

A part of ``match_fill.MatchWriter``.
"""

from __future__ import annotations

import random

from fsage.ager.match_holes import Item
from fsage.ager.match_target import LayoutTarget
from fsage.analyzer.analysis import bucket_range


class SizeDraws:
    """The fill's drawn sizes (a part of ``MatchWriter``)."""

    target: LayoutTarget
    rng: random.Random
    bs: int
    _piece_relief: float

    def _draw_blocks(self, k: int) -> int:
        """A size in bucket ``k``, drawn with the mean of the target's files of that bucket
        where it is known: lo + (hi - lo) * u ** a has mean lo + (hi - lo) / (a + 1). Drawn
        evenly instead, a bucket of mostly small files (source code) comes out larger, and
        the fill reaches the target's fullness with fewer files than the target has (more
        blocks read per seek in a path-order read)."""
        lo, hi = bucket_range(k)
        n = self.target.buckets.get(k, (0, None))[0]
        held = self.target.bucket_blocks.get(k)
        return self._draw_between(lo, hi, held / n if held and n else None)

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

"""A set of inode numbers that also says where each member stands among them in ascending
order (its rank) and which member holds a rank: the export's directories (the inodes that
name entries) are kept this way instead of as a sorted array.

The members among the user files' inode numbers are a bit each (``_Bits``), the bits
counted a 64-bit word at a time (half a bit an inode number), the few members outside that
span (reserved inodes, names in directories the snapshot does not hold) sorted. The sorted
array took eight bytes a directory, and each array indexed by it (entries a directory, named
or not) as many again; indexed by rank, they take what their values need."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import paged

I64 = npt.NDArray[np.int64]

#: Ranks ``select`` looks up at once: each takes a row of 64 bytes while it is found.
SELECT_BATCH = 1 << 16

_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


class RankedInodes:
    """``bits``: a ``_Bits`` over the span (kept, its array padded to whole words);
    ``outside``: the sorted members outside it."""

    def __init__(self, bits: Any, outside: I64) -> None:
        self.bits = bits
        self.base, self.n = int(bits.base), int(bits.n)
        self.low = outside[outside < self.base]
        self.high = outside[outside >= self.base]
        words = (self.n + 63) >> 6
        if bits.bits.size != 8 * words:
            padded = paged.zeros(8 * words)
            padded[: min(bits.bits.size, padded.size)] = bits.bits[: padded.size]
            bits.bits = padded
        # bit i of the span is bit 63 - (i & 63) of word i >> 6 read big-endian
        self.words = bits.bits.view(">u8")
        self.before = paged.zeros(words + 1, np.uint32)  # members in the words before each
        np.cumsum(np.bitwise_count(self.words), dtype=np.uint32, out=self.before[1:])
        self.inside = int(self.before[-1])
        self.size = self.low.size + self.inside + self.high.size

    def __call__(self, ino: I64) -> npt.NDArray[np.bool_]:
        """Which of ``ino`` are members."""
        out: npt.NDArray[np.bool_] = self.bits.at(ino)
        if self.low.size or self.high.size:
            out |= np.isin(ino, self.low) | np.isin(ino, self.high)
        return out

    def rank(self, ino: I64) -> I64:
        """Each of ``ino``'s (members, any order) place among the members in ascending order."""
        out = np.empty(ino.size, np.int64)
        j = ino - self.base
        below, above = j < 0, j >= self.n
        out[below] = np.searchsorted(self.low, ino[below])
        out[above] = self.low.size + self.inside + np.searchsorted(self.high, ino[above])
        mid = np.flatnonzero(~(below | above))
        jm = j[mid]
        w = jm >> 6
        ahead = ~(_ALL >> (jm & 63).astype(np.uint64))  # the word's bits before bit j
        within = np.bitwise_count(self.words[w] & ahead).astype(np.int64)
        out[mid] = self.low.size + self.before[w].astype(np.int64) + within
        return out

    def select(self, ranks: I64) -> I64:
        """The members holding ``ranks`` (each below ``size``)."""
        out = np.empty(ranks.size, np.int64)
        k = ranks - self.low.size
        below, above = k < 0, k >= self.inside
        out[below] = self.low[ranks[below]]
        out[above] = self.high[k[above] - self.inside]
        mid = np.flatnonzero(~(below | above))
        raw = self.bits.bits
        for lo in range(0, mid.size, SELECT_BATCH):
            at = mid[lo : lo + SELECT_BATCH]
            km = k[at]
            w = np.searchsorted(self.before, km, side="right") - 1
            # the (km - before[w])-th set bit of word w, counted from its first bit
            row = np.unpackbits(raw[(8 * w)[:, None] + np.arange(8)], axis=1)
            seen = np.cumsum(row, axis=1)
            pos = np.argmax(seen > (km - self.before[w].astype(np.int64))[:, None], axis=1)
            out[at] = self.base + 64 * w + pos
        return out

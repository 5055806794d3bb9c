"""Free-space fragmentation with the buckets and totals of ``e2freefrag``.

e2freefrag scans the block bitmap from ``first_data_block`` to the end of the file system and
counts maximal runs of free blocks; runs do not stop at group boundaries. A run of ``n`` blocks
goes to bucket ``floor(log2 n)``, i.e. ``[2**k, 2**(k+1) - 1]`` blocks. e2freefrag prints
bucket 0 of a file system of 4 KiB blocks as "4K...8K-"; fsage, in every command and report,
as "4 KiB-<8 KiB" (:func:`free_extent_label`: the "<" says the upper bound is not in it, where a
file-size label's "4 KiB-8 KiB" holds files over 4 KiB and up to 8 KiB), and its JSON gives each
bucket's bounds in bytes too. Buckets above 2**30 blocks are folded into the last one, as
e2freefrag does with its 32-entry histogram.

A free *chunk* is an aligned ``chunk_bytes`` window (1 MiB by default) whose blocks are all
free: window ``c`` covers blocks ``[c*B, (c+1)*B)``. Window 0 on a file system whose first data
block is 1 (1 KiB blocks) is never free, because e2freefrag does not scan block 0; a window cut
short by the end of the file system is never free either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.layout import FreeExtents
from fsage.text import human_bytes

I64 = npt.NDArray[np.int64]

MAX_BUCKET = 30  # e2freefrag MAX_HIST = 32 entries, index = log2(n) + 1


@dataclass
class FreeSpace:
    block_size: int
    blocks_total: int
    blocks_free: int
    extents: int
    largest: int  # blocks
    smallest: int
    chunk_blocks: int
    chunks_total: int
    chunks_free: int
    # (bucket k, count, blocks) for non-empty buckets, ascending
    buckets: list[tuple[int, int, int]]

    def to_json(self) -> dict[str, Any]:
        return {
            "blocks_free": self.blocks_free,
            "free_extent_count": self.extents,
            "largest_free_extent": self.largest,
            "smallest_free_extent": self.smallest,
            "average_free_extent": (self.blocks_free / self.extents if self.extents else 0.0),
            "chunk_bytes": self.chunk_blocks * self.block_size,
            "chunks_total": self.chunks_total,
            "free_chunks": self.chunks_free,
            "free_extents": [
                {
                    "min_blocks": 1 << k,
                    "max_blocks": (1 << (k + 1)) - 1 if k < MAX_BUCKET else None,
                    "min_bytes": (1 << k) * self.block_size,
                    "max_bytes": ((1 << (k + 1)) - 1) * self.block_size if k < MAX_BUCKET else None,
                    "count": c,
                    "blocks": b,
                    "label": free_extent_label(
                        1 << k, (1 << (k + 1)) - 1 if k < MAX_BUCKET else None, self.block_size
                    ),
                }
                for k, c, b in self.buckets
            ],
        }


def merge_runs(free: FreeExtents) -> tuple[I64, I64]:
    """Sort free extents and merge the ones that touch; returns (start, length)."""
    start = free.start.astype(np.int64)
    length = free.length.astype(np.int64)
    keep = length > 0
    start, length = start[keep], length[keep]
    if start.size == 0:
        return start, length
    order = np.argsort(start, kind="stable")
    start, length = start[order], length[order]
    end = start + length
    # A run begins where the extent does not touch the furthest end seen so far.
    reach = np.maximum.accumulate(end)
    new = np.ones(start.size, bool)
    new[1:] = start[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    run_start = start[idx]
    run_end = np.maximum.reduceat(end, idx)
    return run_start, run_end - run_start


def _log2_floor(n: I64) -> I64:
    _, exp = np.frexp(n.astype(np.float64))
    return (exp - 1).astype(np.int64)


def free_extent_label(min_blocks: int, max_blocks: int | None, block_size: int) -> str:
    """The label of a free-extent bucket, in bytes: extents of ``min_blocks`` up to
    ``max_blocks`` blocks are at least the first and under the second number of bytes
    ("4 KiB-<8 KiB": the "<" tells them from file-size buckets, which hold their upper
    bound); the last bucket, open above (``max_blocks`` None), "4 TiB or more".
    Every command and report labels free-extent buckets with this."""
    low = human_bytes(min_blocks * block_size)
    if max_blocks is None:
        return f"{low} or more"
    return f"{low}-<{human_bytes((max_blocks + 1) * block_size)}"


def free_space(
    free: FreeExtents,
    block_size: int,
    blocks_total: int,
    first_data_block: int = 0,
    chunk_bytes: int = 1 << 20,
) -> FreeSpace:
    start, length = merge_runs(free)
    k = np.minimum(_log2_floor(length), MAX_BUCKET) if length.size else np.zeros(0, np.int64)
    counts = np.bincount(k, minlength=MAX_BUCKET + 1)
    blocks = np.bincount(k, weights=length, minlength=MAX_BUCKET + 1)
    buckets = [(int(i), int(counts[i]), round(float(blocks[i]))) for i in np.flatnonzero(counts)]
    chunk_blocks = max(chunk_bytes // block_size, 1)
    # Fully free aligned windows inside each run.
    first = -(-start // chunk_blocks)
    last = (start + length) // chunk_blocks
    if first_data_block > 0:
        first = np.maximum(first, 1)
    chunks_free = int(np.maximum(last - first, 0).sum())
    return FreeSpace(
        block_size=block_size,
        blocks_total=blocks_total,
        blocks_free=int(length.sum()),
        extents=int(length.size),
        largest=int(length.max()) if length.size else 0,
        smallest=int(length.min()) if length.size else 0,
        chunk_blocks=chunk_blocks,
        chunks_total=(blocks_total + chunk_blocks) // chunk_blocks,
        chunks_free=chunks_free,
        buckets=buckets,
    )


def group_map(
    free: FreeExtents, groups: list[dict[str, int]], blocks_total: int, max_cells: int = 4096
) -> dict[str, Any]:
    """Free blocks of each block group (ext) or segment (LFS) — the disk as a map. Without
    groups, the disk is cut into at most ``max_cells`` equal ranges. Ranges come as
    ``start`` / ``length`` lists in blocks beside ``free`` (free blocks in each)."""
    if groups:
        starts = np.array([int(g["start"]) for g in groups], np.int64)
        lengths = np.array([int(g["length"]) for g in groups], np.int64)
        unit = "group"
    else:
        step = max(1, -(-blocks_total // max_cells))
        starts = np.arange(0, blocks_total, step, dtype=np.int64)
        lengths = np.minimum(step, blocks_total - starts)
        unit = "range"
    if starts.size > max_cells:  # very large file systems: merge neighbouring groups
        k = -(-starts.size // max_cells)
        idx = np.arange(0, starts.size, k)
        lengths = np.add.reduceat(lengths, idx)
        starts = starts[idx]
        unit = f"{k} groups"
    fs, fl = merge_runs(free)
    ends = np.concatenate([[0], np.cumsum(fl)])

    def free_before(x: I64) -> I64:
        # free blocks in [0, x): whole runs that end before x, plus the part of the run at x
        i = np.searchsorted(fs, x, side="right")  # runs starting at or before x
        prev = np.maximum(i - 1, 0)
        partial = np.where(i > 0, np.clip(x - fs[prev], 0, fl[prev] if fl.size else 0), 0)
        whole = np.where(i > 0, ends[prev], 0)
        return (whole + partial).astype(np.int64)

    if fs.size:
        free_blocks = free_before(starts + lengths) - free_before(starts)
    else:
        free_blocks = np.zeros(starts.size, np.int64)
    return {
        "unit": unit,
        "start": starts.tolist(),
        "length": lengths.tolist(),
        "free": free_blocks.tolist(),
    }

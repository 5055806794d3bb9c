"""Per-file layout scores and fragment counts, vectorised over a FileTable.

Definitions (DESIGN.md "Definitions", seed 000 §4.1, seed 002):

* The data blocks of a file are taken in logical order. Extents flagged inline (data in the
  inode) or delalloc (no physical block yet) have no blocks on disk and are ignored; unwritten
  (preallocated) and shared extents count like any other allocated block.
* A block *follows its predecessor* when its physical address is the previous block's plus
  one. The first block never does (a seek is assumed before it).
* **Holes**: a hole between two extents is skipped. The block after a hole is contiguous
  when it sits physically right after the last block before the hole — the same rule
  ``e2fsck`` uses for its non-contiguous count. A hole therefore costs nothing when the
  extents around it are physically adjacent, and one break otherwise. (``filefrag``
  additionally treats an extent as contiguous when the physical gap equals the hole's
  logical length; :func:`filefrag_extents` reproduces that rule separately.)
* layout score = contiguous blocks / (blocks - 1); files of fewer than two blocks have none.
* fragments = runs of physically contiguous blocks after merging adjacent extents.

How this relates to the numbers other tools print (checked in tests/analyzer):

* ``e2fsck -fnv`` "non-contiguous files/directories": an inode is non-contiguous when some
  extent does not start right after the previous one — the same physical rule — but e2fsck
  (a) leaves out inodes holding ``blocks_per_group`` blocks or more (data + extent-tree blocks),
  (b) counts every inode with blocks, special inodes such as the journal included, and (c) for
  block-mapped (ext2/3) files walks indirect blocks in line with the data, so a contiguous
  ext2 file whose indirect block sits between its data blocks is contiguous to e2fsck but
  scores below 1 here (fsage scores data blocks only). On extent-mapped files below the size
  limit, "layout score < 1" and "non-contiguous" are the same set.
* ``filefrag``: see :func:`filefrag_extents` (hole-aware contiguity, see above).
* ``e4defrag -c``: per regular file of non-zero size, *now* = extent records, *best* =
  ``(blocks - 1) // (blocks_per_group * groups_per_flex) + 1``; ratio = (Σnow - Σbest) * 100 /
  Σblocks; score = 8 * ratio, or 80 + ratio / 5 above ratio 10 (e2fsprogs misc/e4defrag.c).
  e4defrag also skips lost+found; fsage does not know paths here and does not.
* ``xfs_db frag``: actual = extent records; ideal = logically contiguous runs (one per file
  plus one per hole); factor = (actual - ideal) * 100 / actual. Computed on the stored extent
  records, so ext4's 32768-block cap on an extent shows up as "actual" extents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fsage.layout import EXTENT_DELALLOC, EXTENT_INLINE, FileTable

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

NO_BLOCK_FLAGS = EXTENT_INLINE | EXTENT_DELALLOC


@dataclass
class Runs:
    """Physical runs (fragments) of every file, ordered by file then logical offset.

    ``off`` is a CSR index: file ``i`` owns runs ``off[i]:off[i+1]``.
    """

    off: I64
    start: I64  # physical block of the run's first block
    length: I64

    def owner(self) -> I64:
        return np.repeat(np.arange(len(self.off) - 1, dtype=np.int64), self.off[1:] - self.off[:-1])


@dataclass
class FileScores:
    """One entry per file of the table the scores were computed from."""

    blocks: I64  # allocated data blocks
    contiguous: I64  # blocks that follow their predecessor
    extents: I64  # stored extent records with blocks on disk
    fragments: I64  # physical runs after merging adjacent extents
    first_block: I64  # physical address of the logically first block, -1 if none
    runs: Runs

    @property
    def denominator(self) -> I64:
        """blocks - 1 for files with at least two blocks, else 0."""
        return np.where(self.blocks >= 2, self.blocks - 1, 0)

    @property
    def score(self) -> F64:
        """Per-file layout score; NaN for files of fewer than two blocks."""
        den = self.denominator
        out = np.full(den.shape, np.nan)
        ok = den > 0
        out[ok] = self.contiguous[ok] / den[ok]
        return out


def _bincount(idx: I64, weights: npt.NDArray[np.int64] | None, n: int) -> I64:
    if weights is None:
        return np.bincount(idx, minlength=n).astype(np.int64)
    # bincount with weights works in float64: exact below 2**53 blocks.
    return np.rint(np.bincount(idx, weights=weights, minlength=n)).astype(np.int64)


def _sorted_extents(files: FileTable) -> tuple[I64, I64, I64, I64]:
    """Owner, logical, physical, length of the extents that have blocks, by (owner, logical)."""
    n = len(files)
    eo = files.ext_off.astype(np.int64)
    counts = eo[1:] - eo[:-1]
    owner = np.repeat(np.arange(n, dtype=np.int64), counts)
    keep = ((files.ext_flags & NO_BLOCK_FLAGS) == 0) & (files.ext_length > 0)
    if not keep.all():
        owner = owner[keep]
    logical = files.ext_logical[keep].astype(np.int64)
    physical = files.ext_physical[keep].astype(np.int64)
    length = files.ext_length[keep].astype(np.int64)
    if owner.size > 1:
        same = owner[1:] == owner[:-1]
        if np.any(same & (logical[1:] < logical[:-1])):
            order = np.lexsort((logical, owner))
            owner, logical, physical, length = (
                owner[order],
                logical[order],
                physical[order],
                length[order],
            )
    return owner, logical, physical, length


# Files scored at a time: a file's scores depend on its own extents only, and the sorted
# copies of the extents (four arrays per extent) are then a chunk's, not the table's.
SCORE_CHUNK = 1 << 16


def file_scores(files: FileTable) -> FileScores:
    """Layout score ingredients for every file of ``files`` (no per-block Python loop), a
    chunk of ``SCORE_CHUNK`` files at a time."""
    n = len(files)
    if n <= SCORE_CHUNK:
        return _file_scores(files)
    # each chunk's per-file numbers copied into place as it is scored: the chunks' arrays
    # and the joined ones are not held at once (only the runs, of unknown count, are joined)
    per_file = [np.empty(n, np.int64) for _ in range(5)]
    run_off = np.zeros(n + 1, np.int64)
    starts: list[I64] = []
    lengths: list[I64] = []
    base = 0
    for lo in range(0, n, SCORE_CHUNK):
        hi = min(lo + SCORE_CHUNK, n)
        part = _file_scores(files.slice(lo, hi))
        for out, got in zip(per_file, _per_file(part), strict=True):
            out[lo:hi] = got
        run_off[lo + 1 : hi + 1] = part.runs.off[1:] + base
        base += int(part.runs.off[-1])
        starts.append(part.runs.start)
        lengths.append(part.runs.length)
        del part
    runs = Runs(run_off, np.concatenate(starts), np.concatenate(lengths))
    blocks, contiguous, extents, fragments, first_block = per_file
    return FileScores(blocks, contiguous, extents, fragments, first_block, runs)


def _per_file(s: FileScores) -> tuple[I64, I64, I64, I64, I64]:
    return s.blocks, s.contiguous, s.extents, s.fragments, s.first_block


def _file_scores(files: FileTable) -> FileScores:
    n = len(files)
    owner, _logical, physical, length = _sorted_extents(files)
    blocks = _bincount(owner, length, n)
    extents = _bincount(owner, None, n)
    within = _bincount(owner, length - 1, n)
    if owner.size > 1:
        same = owner[1:] == owner[:-1]
        join = same & (physical[1:] == physical[:-1] + length[:-1])
        joins = _bincount(owner[1:][join], None, n)
    else:
        join = np.zeros(0, bool)
        joins = np.zeros(n, np.int64)
    contiguous = within + joins
    fragments = extents - joins
    first_block = np.full(n, -1, np.int64)
    if owner.size:
        head = np.ones(owner.size, bool)
        head[1:] = owner[1:] != owner[:-1]
        first_block[owner[head]] = physical[head]
    # Runs: an extent starts a new run unless it joins its predecessor.
    starts_run = np.ones(owner.size, bool)
    if owner.size > 1:
        starts_run[1:] = ~join
    run_idx = np.flatnonzero(starts_run)
    run_owner = owner[run_idx]
    run_len = np.add.reduceat(length, run_idx) if run_idx.size else np.zeros(0, np.int64)
    run_off = np.zeros(n + 1, np.int64)
    np.cumsum(_bincount(run_owner, None, n), out=run_off[1:])
    runs = Runs(run_off, physical[run_idx], run_len.astype(np.int64))
    return FileScores(blocks, contiguous, extents, fragments, first_block, runs)


def aggregate_score(contiguous: I64, denominator: I64) -> float | None:
    """Block-weighted aggregate: Σ contiguous / Σ (blocks - 1); None when nothing to score."""
    den = int(denominator.sum())
    if den == 0:
        return None
    return int(contiguous.sum()) / den


def filefrag_extents(files: FileTable) -> I64:
    """The extent count ``filefrag`` prints ("N extents found"), per file.

    filefrag counts an extent only when it continues neither densely (physical right after
    the previous extent) nor across a hole (physical gap equal to the logical gap).
    """
    n = len(files)
    owner, logical, physical, length = _sorted_extents(files)
    count = np.zeros(n, np.int64)
    if owner.size == 0:
        return count
    head = np.ones(owner.size, bool)
    head[1:] = owner[1:] != owner[:-1]
    brk = np.zeros(owner.size, bool)
    if owner.size > 1:
        dense = physical[1:] == physical[:-1] + length[:-1]
        sparse = physical[1:] == physical[:-1] + (logical[1:] - logical[:-1])
        brk[1:] = ~(dense | sparse)
    counted = head | brk
    return _bincount(owner[counted], None, n)


def xfs_frag_counts(files: FileTable, sel: npt.NDArray[np.bool_] | None = None) -> tuple[int, int]:
    """(actual, ideal) extent counts the way ``xfs_db frag`` counts them, over the files
    ``sel`` flags (all: None).

    actual = extent records of every file with any; ideal = logically discontiguous runs
    (one per file plus one per hole). Physical placement plays no part in xfs_db's ideal.
    """
    owner, logical, _physical, length = _sorted_extents(files)
    if sel is not None:
        mine = sel[owner]
        owner, logical, length = owner[mine], logical[mine], length[mine]
    if owner.size == 0:
        return 0, 0
    head = np.ones(owner.size, bool)
    head[1:] = (owner[1:] != owner[:-1]) | (logical[1:] != logical[:-1] + length[:-1])
    return int(owner.size), int(head.sum())


def e4defrag_counts(
    scores: FileScores, blocks_per_group: int, groups_per_flex: int
) -> tuple[int, int, int]:
    """(now extents, best extents, blocks) summed the way ``e4defrag -c`` sums them."""
    b = scores.blocks
    sel = b > 0
    span = blocks_per_group * max(groups_per_flex, 1)
    best = np.ones(int(sel.sum()), np.int64)
    if span > 0:
        best = (b[sel] - 1) // span + 1
    return int(scores.extents[sel].sum()), int(best.sum()), int(b[sel].sum())


def e4defrag_score(now: int, best: int, blocks: int) -> float | None:
    """e4defrag's fragmentation score from its totals (0-30 fine, 56+ "needs defrag")."""
    if blocks == 0:
        return None
    ratio = (now - best) * 100.0 / blocks
    return 80.0 + 20.0 * ratio / 100.0 if ratio > 10 else 8.0 * ratio

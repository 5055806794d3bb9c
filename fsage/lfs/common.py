"""Definitions shared by the parts of the log-structured file system (seed 003): the error of a
failed file operation, timestamps, block addresses and the log's tuning constants.
"""

from __future__ import annotations

import time

from fsage.errors import FsageError
from fsage.lfs import format as fmt
from fsage.lfs.format import (
    INO_ROOT,
    INO_UNLINKED,
    Geometry,
)

_NAMED_SYSTEM = (INO_ROOT, INO_UNLINKED)
#: Clean segments that writes of new data never take: they are left for the metadata that
#: deletes commit and for the cleaner's output, so a full log can still shrink. The least;
#: an image with large directories keeps more (:func:`reserve_segments`).
_RESERVE = 2
#: Metadata blocks (estimated) that may wait in memory for a commit.
_MAX_PENDING = 1024


class LfsOpError(FsageError):
    """A file operation that cannot be done (no such file, not empty, exists...)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def linear_block(geo: Geometry, addr: int) -> int:
    seg, blk = fmt.sbn_split(addr)
    return seg * geo.blocks_per_segment + blk


def tree_nodes(blocks: int, per: int) -> int:
    """Indirect blocks a file of ``blocks`` blocks has at most (``per`` pointers a block)."""
    n, left = 0, max(0, blocks - fmt.N_DIRECT)
    for level in range(1, 4):
        span = per**level
        take = min(left, span)
        if take <= 0:
            break
        # the level's root, and the nodes under it that are partly used
        n += sum(-(-take // per**k) for k in range(1, level + 1))
        left -= take
    return n


def delete_blocks(dir_blocks: int, per: int) -> int:
    """The most log blocks one delete (unlink, rmdir, truncate to 0) commits, when the largest
    directory holds ``dir_blocks`` blocks: its change record (2 blocks at most); the parent
    directory rewritten from the removed entry on, with its indirect blocks, and as much for
    the directory of unlinked open files (an open file's last name moves there); and for each
    of the parent and the victim a block of the inode table and of the inode vector, and a
    block of the inode map, each with the indirect blocks above it in its system file. The
    data the delete frees takes nothing: it only dies."""
    directory = dir_blocks + tree_nodes(dir_blocks, per)
    system = 5 * (1 + 3)
    return 2 + 2 * directory + system


def reserve_segments(dir_blocks: int, per: int, data_blocks: int) -> int:
    """Clean segments kept back from writes so that a delete always finds room: its blocks
    (:func:`delete_blocks`) from the start of a fresh segment (a checkpoint seals the
    segment being written), plus the segment the log takes ahead as its next one."""
    return max(_RESERVE, -(-delete_blocks(dir_blocks, per) // data_blocks) + 1)

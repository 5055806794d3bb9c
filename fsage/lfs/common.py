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
#: deletes commit and for the cleaner's output, so a full log can still shrink.
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

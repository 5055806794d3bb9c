"""Large arrays held in a scratch file's pages instead of the process's own memory.

A snapshot's bit a file or inode number grows with the file system (some 6 MiB a bit at 49M
inode numbers, and the export keeps several); mapped from an unlinked scratch file, those
pages are the page cache's, and ``release`` drops them from the resident set between pieces
of work (the kernel writes them back or keeps them cached; the next touch maps them again).
Arrays under ``PAGED_BYTES`` stay ordinary: a mapping costs a file and page faults.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import scratch

#: Arrays of at least this many bytes are paged: a chunk's bit a row (128 KiB at
#: ``CHUNK_MAX_ROWS``) among them, as the chunks' bits together grow with the database (at
#: 1 MiB, the 48 chunks of a first snapshot of 44.8M files kept 5.6 MiB of them in the heap).
PAGED_BYTES = 1 << 16

_live: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()


def zeros(count: int, dtype: Any = np.uint8) -> npt.NDArray[Any]:
    """``count`` zeros of ``dtype``; paged when large and a scratch file can hold them
    (its blocks reserved first: a page that finds the file system full would kill the
    process when touched), else in memory. The scratch file goes where ``fsage.scratch``
    says: on disk, as a tmpfs's pages would be memory the kernel cannot reclaim."""
    dt = np.dtype(dtype)
    nbytes = count * dt.itemsize
    if nbytes < PAGED_BYTES:
        return np.zeros(count, dt)
    try:
        with tempfile.TemporaryFile(prefix="fsage-paged-", dir=scratch.base()) as f:
            os.posix_fallocate(f.fileno(), 0, nbytes)
            mm = mmap.mmap(f.fileno(), nbytes)
    except OSError:  # no room in the scratch directory, or no mapping: memory will do
        return np.zeros(count, dt)
    _live.add(mm)
    return np.frombuffer(mm, dt, count)


def full(count: int, value: int, dtype: Any = np.uint8) -> npt.NDArray[Any]:
    out = zeros(count, dtype)
    out.fill(value)
    return out


def _mapping(array: npt.NDArray[Any]) -> mmap.mmap | None:
    base: Any = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def is_paged(array: npt.NDArray[Any]) -> bool:
    """Whether ``array`` (or the array it views) lies in a scratch file's pages."""
    return _mapping(array) is not None


def release(*arrays: npt.NDArray[Any]) -> int:
    """Drop the pages of ``arrays`` (those of them paged; with none given, every paged
    array's) from the resident set, their contents kept; how many arrays were paged."""
    live = [m for m in map(_mapping, arrays) if m is not None] if arrays else list(_live)
    for mm in live:
        mm.madvise(mmap.MADV_DONTNEED)
    return len(live)

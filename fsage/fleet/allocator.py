"""How the export and the compaction hold their buffers: the peak of a long run should be
that of its largest phase, not the sum of its phases nor what fragments between them."""

from __future__ import annotations

import os

from fsage.heap import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, glibc_mallopt

#: Buffers of at least this many bytes are mapped on their own and unmapped when freed.
MMAP_THRESHOLD = 64 * 1024
#: Free memory at the top of the heap past this is given back.
TRIM_THRESHOLD = 128 * 1024


def system_memory_pool() -> None:
    """Arrow's buffers from the C library's allocator: Arrow's default keeps what it freed,
    so the peak of a long run would be the sum of its phases, not the largest of them. The
    environment reaches Arrow's own C++ allocations too, if Arrow is not loaded yet."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def map_large_buffers() -> bool:
    """Buffers of ``MMAP_THRESHOLD`` bytes or more mapped on their own, and the heap's free
    top given back past ``TRIM_THRESHOLD``; whether the C library took it (glibc).

    glibc raises its mapping threshold to the largest mapped buffer freed (up to 32 MiB), so
    that the compaction's later batches and row groups came from the heap, and the free
    pieces left between longer-lived ones stayed: its peak grew 12 MiB from 2.8M to 22.4M
    files, 6 MiB of it less this way at 11.2M, in about the same time. Not for the export:
    its many short-lived arrays take half as long again when each is mapped."""
    mallopt = glibc_mallopt()
    if mallopt is None:
        return False
    took = [mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD), mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    return took == [1, 1]

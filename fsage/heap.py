"""The C heap of commands that make and drop many large numpy arrays.

glibc hands a freed block of more than ``M_MMAP_THRESHOLD`` back to the kernel (or trims the
heap top above ``M_TRIM_THRESHOLD``), so the next array of that size is page-faulted in again:
at 700k files `fsage analyze` spent 0.5 s of system time in that. Keeping freed memory for
reuse costs no more peak memory (the same arrays are alive at the peak either way).
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_HEAP_BLOCKS_UP_TO = 1 << 30


def keep_freed_memory(*, one_arena: bool = False) -> None:
    """Let blocks up to 1 GiB come from the heap, and never trim it (glibc only).

    ``one_arena`` (before any thread starts): threads allocate from the main heap too, so that
    what a thread frees (the live walk's buffers) is reused by the main thread's arrays."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(_M_MMAP_THRESHOLD, _HEAP_BLOCKS_UP_TO)
    mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    if one_arena:
        mallopt(_M_ARENA_MAX, 1)

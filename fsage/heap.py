"""The C heap of commands that make and drop many large numpy arrays.

glibc hands a freed block of more than ``M_MMAP_THRESHOLD`` back to the kernel (or trims the
heap top above ``M_TRIM_THRESHOLD``), so the next array of that size is page-faulted in again:
at 700k files `fsage analyze` spent 0.5 s of system time in that. Keeping freed memory for
reuse costs no more peak memory (the same arrays are alive at the peak either way).
"""

from __future__ import annotations

import functools
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
_HEAP_BLOCKS_UP_TO = 1 << 30


def keep_freed_memory(*, one_arena: bool = False) -> None:
    """Let blocks up to 1 GiB come from the heap, and never trim it (glibc only).

    ``one_arena`` (before any thread starts): threads allocate from the main heap too, so that
    what a thread frees (the live walk's buffers) is reused by the main thread's arrays."""
    if not sys.platform.startswith("linux"):
        return
    mallopt = glibc_mallopt()
    if mallopt is None:
        return
    mallopt(M_MMAP_THRESHOLD, _HEAP_BLOCKS_UP_TO)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    if one_arena:
        mallopt(M_ARENA_MAX, 1)


def glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's mallopt: from fsage._live where it is built (no ctypes to import), else
    through ctypes; None without glibc."""
    try:
        from fsage._live import mallopt as built

        return built
    except ImportError:
        pass
    import ctypes

    try:
        call = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int]
    call.restype = ctypes.c_int
    result: Callable[[int, int], int] = call
    return result


def give_back_freed() -> None:
    """glibc's ``malloc_trim(0)``: the heap's free pages given back to the system, those
    between live blocks too (nothing without glibc)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes

    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim

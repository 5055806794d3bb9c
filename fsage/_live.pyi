"""Typed stub of the live reader's tree walk in C (fsage/_live.c)."""

from collections.abc import Callable, Sequence
from typing import Any

MODE_WALK: int
MODE_RECORD: int
MAX_THREADS: int
EXTENT_UNWRITTEN: int
EXTENT_DELALLOC: int
EXTENT_INLINE: int
EXTENT_SHARED: int
EXTENT_ENCODED: int

def walk(
    base: bytes,
    tasks: Sequence[tuple[bytes, int | None]],
    *,
    mode: int,
    dev: int,
    submounts: Sequence[bytes],
    sync: bool,
    batch: int,
    dir_fiemap: bool,
    getversion: bool,
    block_size: int,
    threads: int = 1,
    expect: int = 0,
    progress: Callable[[int], object] | None = None,
    progress_base: int = 0,
) -> dict[str, Any]:
    """Walk ``tasks`` ((path from the mount root, parent inode) pairs) below ``base``.

    Keys: the FileTable columns ino, generation, mode, nlink, uid, gid, size, atime, mtime,
    ctime, crtime, ext_off, ext_logical, ext_physical, ext_length, ext_flags (buffers, sorted
    by inode, extents merged and in blocks of ``block_size``); l_parent, l_ino, name_off
    (buffers) and names (bytes): the link table; skipped and no_fiemap (lists of (path,
    errno)); not_crossed (list of paths); fiemap_ok (int); dir_fiemap, getversion (bool);
    top_ino (per task, its directory's inode or None). ``threads`` workers share the
    directories; every 4096 records the calling thread calls ``progress`` while the walk
    waits, and it runs signal handlers every 100 ms (an exception ends the walk).
    """

def sort_unique(inos: bytes | bytearray | memoryview, use_table: bool) -> bytes:
    """The positions (uint32) of the first occurrence of each inode, in increasing order."""

def mallopt(param: int, value: int) -> int:
    """glibc's mallopt (1 on success)."""

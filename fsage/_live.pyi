"""Typed stub of the live reader's tree walk in C (fsage/_live.c)."""

from collections.abc import Callable, Sequence
from typing import Any

MODE_WALK: int
MODE_DEFER: int
MODE_RECORD: int
META_COLS: int

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
    progress: Callable[[int], object] | None = None,
    progress_base: int = 0,
    stop: bytearray | None = None,
) -> dict[str, Any]:
    """Walk ``tasks`` ((path from the mount root, parent inode) pairs) below ``base``.

    Keys: meta, counts, raw, l_parent, l_ino, name_off, names (bytes); skipped and no_fiemap
    (lists of (path, errno)); not_crossed (list of paths); fiemap_ok (int); deferred (list of
    (path, parent inode)); dir_fiemap, getversion (bool). Every 4096 records the walk takes
    the GIL to call ``progress`` and run signal handlers (an exception ends it); a non-zero
    ``stop[0]``, set by another thread, ends it with InterruptedError.
    """

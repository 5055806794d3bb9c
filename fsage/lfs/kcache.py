"""What the kernel caches of a mounted LFS, and how the mount drops it when a write fails:
the inode's pages and attributes (``invalidate``), its name (``Invalidator.forget``), and the
size the kernel keeps of an open file (``SizeFixer``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import threading
from typing import TYPE_CHECKING

from fsage.lfs.format import INO_ROOT

if TYPE_CHECKING:
    from fsage import _fuse

FUSE_ROOT = 1  # the kernel's number of the root directory

#: How long a failed request's reply waits for the kernel to drop the file's name (s).
FORGET_WAIT = 1.0


class Invalidator:
    """Drops the kernel's cache of inodes whose writes failed, and their names, from a
    thread of its own: the kernel may hold the failed request's pages until its reply, which
    the loop sends only after the method that failed returns, and a request waiting in the
    queue may hold the directory whose name is dropped."""

    def __init__(self, session: _fuse.Session) -> None:
        self._session = session
        self._queue: queue.SimpleQueue[int | tuple[int, bytes, threading.Event]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name="fsage-inval", daemon=True).start()

    def push(self, ino: int) -> None:
        self._queue.put(ino)

    def forget(self, parent: int, name: bytes, wait: bool) -> None:
        done = threading.Event()
        self._queue.put((parent, name, done))
        if wait:
            done.wait(FORGET_WAIT)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, int):
                invalidate(self._session, item)
                continue
            parent, name, done = item
            with contextlib.suppress(OSError):
                self._session.inval_entry(parent, name)
            done.set()


def invalidate(session: _fuse.Session, ino: int) -> None:
    with contextlib.suppress(OSError):
        session.inval_inode(FUSE_ROOT if ino == INO_ROOT else ino)


class SizeFixer:
    """Makes the kernel show the stored size of a file whose write-back failed.

    With the writeback cache the kernel keeps its own size of a regular file and takes none
    from ``getattr``, not even after ``invalidate``: an open file whose data was refused
    (ENOSPC at fsync or close) goes on showing the size its writes grew it to through
    ``fstat``. A truncate is the one request whose reply sets that size: a thread of the
    mount truncates the file through the mount point to ``token``, a size no one asks for,
    and ``setattr`` answers a truncate to it with the stored attributes, changing nothing.
    The truncate waits for the inode lock the failed fsync holds, so it lands as that fsync
    returns; pages the kernel kept past the stored end are dropped with it, and so would be
    data the application wrote past that end in the moment between the two."""

    def __init__(self, mountpoint: str) -> None:
        self._mp = mountpoint
        self.tokens: dict[int, int] = {}  # LFS ino -> the size its fixing truncate asks for

    def fix(self, ino: int, path: str) -> None:
        if ino in self.tokens:
            return  # one on its way
        token = (1 << 62) | secrets.randbits(40)
        self.tokens[ino] = token
        full = os.path.join(self._mp, path)
        threading.Thread(
            target=self._run, args=(ino, full, token), name="fsage-size", daemon=True
        ).start()

    def _run(self, ino: int, path: str, token: int) -> None:
        try:
            with contextlib.suppress(OSError):  # gone, renamed meanwhile: nothing to fix
                os.truncate(path, token)
        finally:
            self.tokens.pop(ino, None)

    def is_fix(self, ino: int, size: int) -> bool:
        return self.tokens.get(ino) == size

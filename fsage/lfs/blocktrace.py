"""A block trace of the file data an LFS mount reads (``fsage lfs mount --trace FILE``).

The LFS's I/O is the FUSE server's reads of its image, which no block tracer sees as a
device's. The server records instead, for every read the kernel sends it, the image offsets of
the data blocks it fetched, as read requests of blkparse's text form ("0,0 0 N T PID D R
SECTOR + SECTORS [fsage-lfs]"; sectors of 512 octets from the start of the image): one request
per run of contiguous blocks, in the order they were read. ``fsage trace import`` and
:func:`fsage.trace.parse_blkparse` read it, so a scan of the mount gets the dynamic layout score
a kernel file system's block trace gives. Blocks served from the segment buffer (written but not
yet on disk) are recorded too: their place in the log is their layout.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from fsage.errors import UsageError

SECTOR = 512
#: blkparse's device field for the image (no real device: 0,0).
DEVICE = "0,0"
#: ``fsage lfs mount --trace``'s value when the option is not given: how a program that
#: starts mount processes it cannot pass options to has them traced (:func:`traced_mounts`).
ENV = "FSAGE_LFS_TRACE"


def runs(offsets: list[int], block_size: int) -> list[tuple[int, int]]:
    """(first octet, octets) of each run of contiguous blocks, in order."""
    out: list[tuple[int, int]] = []
    for off in offsets:
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + block_size)
        else:
            out.append((off, block_size))
    return out


class ReadTracer:
    """Writes the read requests of one mount to a text file, line by line."""

    def __init__(self, path: Path, block_size: int) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise UsageError(f"--trace {path}: {exc.strerror}") from None
        self.path = path
        self._f: TextIO = os.fdopen(fd, "w", buffering=1 << 16)
        self._bs = block_size
        self._n = 0
        self._t0 = time.monotonic()

    def __call__(self, offsets: list[int]) -> None:
        t = time.monotonic() - self._t0
        pid = os.getpid()  # the server's (a daemon forks after the file is opened)
        for off, length in runs(offsets, self._bs):
            self._n += 1
            self._f.write(
                f"{DEVICE} 0 {self._n} {t:.9f} {pid} D R "
                f"{off // SECTOR} + {length // SECTOR} [fsage-lfs]\n"
            )

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


@contextlib.contextmanager
def traced_mounts(path: Path) -> Iterator[Path]:
    """``fsage lfs mount`` processes started inside record their reads in ``path``."""
    old = os.environ.get(ENV)
    os.environ[ENV] = str(path.resolve())
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def score_file(path: Path, image: Path) -> dict[str, Any]:
    """Conway's dynamic layout score of a trace a mount of ``image`` wrote, in the image's
    blocks (the keys of :meth:`fsage.trace.Trace.score`, and ``tool``)."""
    from fsage.lfs import format as fmt
    from fsage.trace import parse_blkparse

    fd = os.open(image, os.O_RDONLY)
    try:
        geo = fmt.read_geometry(fd, os.fstat(fd).st_size, str(image))
    finally:
        os.close(fd)
    with open(path) as f:
        tr = parse_blkparse(f, source=str(path), device_sectors=os.path.getsize(image) // SECTOR)
    return {**tr.score(geo.block_size), "tool": "fsage lfs mount --trace"}

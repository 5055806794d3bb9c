"""Who holds the kernel's blk tracer. There is one per machine, and a trace killed while it
ran leaves it on: without a record of its holder, every later trace would have to refuse it.

fsage takes an exclusive flock on a holder file for as long as it uses the tracer and writes
its pid and command there, clearing them when it is done. The kernel drops the flock of a
process that dies, so a later run that gets the lock and finds a holder recorded knows that
holder died mid-trace and may take the tracer over. A tracer that is on with no holder
recorded belongs to someone outside fsage and is left alone."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from fsage.errors import FsageError
from fsage.imagelock import _command, _lock_dir


class TracerBusyError(FsageError):
    """Another live fsage process is tracing."""


def holder_file() -> Path:
    return _lock_dir() / "blk-tracer"


@contextlib.contextmanager
def tracer_holder() -> Iterator[str | None]:
    """Hold the tracer for fsage's own use. Yields the command of a dead fsage process that
    was recorded as holding it (its trace was killed: the tracer may be taken over), or None.
    Refuses in one line when another live fsage process holds it."""
    path = holder_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TracerBusyError(
                f"the kernel's blk tracer is in use by another fsage trace ({_read(fd)})"
            ) from None
        # The flock is ours now, so a holder still recorded died mid-trace.
        dead = _read(fd) or None
        _write(fd, f"{os.getpid()} {_command()}")
        try:
            yield dead
        finally:
            _write(fd, "")
    finally:
        os.close(fd)


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace").strip()


def _write(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    os.fsync(fd)

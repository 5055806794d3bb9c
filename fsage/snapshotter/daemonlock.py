"""One daemon per database: the exclusive ``flock`` on ``<database>.lock`` and who holds it."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from fsage.errors import FsageError


class DaemonLockedError(FsageError):
    """Another daemon holds the database's lock."""


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + ".lock")


class DatabaseLock:
    """An exclusive flock on ``<database>.lock``; the file holds the holder's pid."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.path = lock_path(database)
        self.fd: int | None = None

    def acquire(self, wait: float = 1.0, stopped: Callable[[], bool] | None = None) -> None:
        """Take the lock, waiting up to ``wait`` seconds for another holder (``stopped``:
        gives up at once when it says so)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise FsageError(f"cannot create lock file {self.path}: {exc.strerror}") from None
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # `fsage status` may hold a shared lock for an instant: retry briefly.
                if time.monotonic() >= deadline or (stopped is not None and stopped()):
                    pid = _read_pid(fd)
                    os.close(fd)
                    holder = f" (pid {pid})" if pid else ""
                    raise DaemonLockedError(
                        f"another fsage daemon{holder} is using {self.database}"
                        f" (lock {self.path} is held)"
                    ) from None
                time.sleep(0.05)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk, a quota: one line, not a traceback
            os.close(fd)
            raise FsageError(
                f"cannot write the pid into the lock file {self.path}: {exc.strerror}"
            ) from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays (unlinking races)
            self.fd = None

    def __enter__(self) -> DatabaseLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def lock_holder(database: Path) -> int | None:
    """The pid of the daemon holding the database's lock (0 if unknown), or None if free."""
    path = lock_path(database)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)

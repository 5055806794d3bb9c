"""An image attached to one loop device for a whole replay, mounted and unmounted with the
system calls.

A replay ends every snapshot interval with an unmount and a mount. Through mount(8) and
umount(8) each of those starts a process, and ``mount -o loop`` also finds, sets up and (on
unmount) tears down a loop device every time: about 30 ms an interval, most of the cost of
ending it. Here the device is set up once (``losetup --find --show``) and each remount is an
``umount2`` and a ``mount`` of that device. What the allocator sees is the same: unmounting
drops the file system's in-memory state (preallocations, the allocation goals) and the last
close of the device drops its cached metadata, whichever way the mount was made.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsage.ager.images import clear_stale_mounts
from fsage.errors import FsageError

_MNT_DETACH = 2
_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mount.argtypes = [
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p,
        ]  # fmt: skip
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return _libc


def _tool(argv: list[str], what: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise FsageError(f"{what}: {tail[0]}")
    return proc.stdout.strip()


class LoopDevice:
    """``image`` on a loop device until ``detach``; ``fstype`` is what ``mount`` is asked for
    (ext2 and ext3 fall back to the ext4 driver when the kernel has no driver of that name)."""

    def __init__(
        self, image: Path, fstype: str = "ext4", say: Callable[[str], None] | None = None
    ) -> None:
        self.image = Path(image)
        self.fstype = fstype
        # a second loop device over an image a killed run left mounted would be a second
        # file system instance over the same blocks: clear it first, and say so
        clear_stale_mounts(self.image, say or (lambda s: print(f"fsage: {s}", file=sys.stderr)))
        self.dev = _tool(["losetup", "--find", "--show", str(self.image)], f"attaching {image}")

    def mount(self, mountpoint: Path) -> None:
        c = _c()
        src, dst = os.fsencode(self.dev), os.fsencode(mountpoint)
        for fstype in dict.fromkeys((self.fstype, "ext4")):
            if c.mount(src, dst, fstype.encode(), 0, None) == 0:
                return
            err = ctypes.get_errno()
            if err != errno.ENODEV:
                break
        raise FsageError(f"mounting {self.image} ({self.dev}) on {mountpoint}: {os.strerror(err)}")

    def umount(self, mountpoint: Path) -> None:
        """Unmount, retrying while busy, and lazily as a last resort (never leave it mounted)."""
        c = _c()
        dst = os.fsencode(mountpoint)
        for attempt in range(10):
            if c.umount2(dst, 0) == 0:
                return
            err = ctypes.get_errno()
            if err == errno.EINVAL:  # not mounted
                return
            if err != errno.EBUSY:
                raise FsageError(f"unmounting {mountpoint}: {os.strerror(err)}")
            time.sleep(0.1 * (attempt + 1))
        c.umount2(dst, _MNT_DETACH)

    def wait_released(self, seconds: float = 15.0) -> None:
        """Return once no file system holds the loop device (an exclusive open succeeds): a
        lazy unmount leaves the file system alive until its last user goes, and libext2fs
        opening the image before then finds a journal that needs recovery. Raises
        FsageError (nothing written) if it is still held after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                fd = os.open(self.dev, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise FsageError(f"opening {self.dev}: {exc.strerror}") from None
                if time.monotonic() >= deadline:
                    raise FsageError(
                        f"{self.image}: its file system is still in use {seconds:.0f} s after"
                        f" unmounting it ({self.dev} busy); nothing was written offline"
                    ) from None
                time.sleep(0.1)
            else:
                os.close(fd)
                return

    def detach(self) -> None:
        with contextlib.suppress(FsageError):
            _tool(["losetup", "-d", self.dev], f"detaching {self.dev}")

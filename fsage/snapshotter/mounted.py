"""An ext source that is mounted read-write: read it where its current state is.

libext2fs reads what is on the disk, which lags the journal and the page cache of a mounted
file system: files written since the last commit show with size 0 and no blocks. So when the
source of a snapshot (a block device, or an image file behind a loop device) is mounted
read-write, fsage reads it one of two ways:

* by default through the live reader on the mount point (FIEMAP with its sync flag, so that
  dirty data is placed before it is mapped, and GETFSMAP for free space). The snapshot keeps
  the device's identity: the ext facts (uuid, label, features, groups, mkfs parameters) and the
  reserved inodes come from the superblock and inode table, its kind is the ext kind, and the
  store records it under the same file system and name as an offline read. Its records are
  those an offline read of the same state yields: after a syncfs, what only the inode table
  holds (inode flags, extent-tree, indirect and xattr blocks, the generation of a symlink,
  FIFO, socket or device node, a symlink's target block) is taken from it for every inode
  that is the same there, inline data has no extent, and free space is the block bitmap's;
* with ``freeze=True``, by freezing the file system (FIFREEZE: the kernel writes everything out,
  checkpoints the journal and holds new writes) for the offline read, and thawing it
  (FITHAW) on every way out. SIGINT, SIGTERM and SIGHUP are held back while it is frozen and
  act once it is thawed, and a small watchdog process thaws it should fsage itself die.

A read-only mount is read offline as an unmounted source is.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fsage import _ext2fs
from fsage.errors import SourceError
from fsage.layout import EXTENT_DELALLOC, EXTENT_INLINE, FileTable, FreeExtents, Layout
from fsage.snapshotter.ext import _facts, read_ext_layout
from fsage.snapshotter.live import (
    MountInfo,
    of_inodes_in_use,
    read_live_layout,
    read_mountinfo,
)
from fsage.text import shown

FIFREEZE = 0xC0045877  # _IOWR('X', 119, int)
FITHAW = 0xC0045878  # _IOWR('X', 120, int)

Notice = Callable[[str], None]


@dataclass(frozen=True)
class Mounted:
    """Where the file system of a source is mounted."""

    device: str  # the block device mounted (the source itself, or its loop device)
    mount_point: bytes  # a mount of the whole file system (root "/"), if there is one
    read_write: bool
    fstype: str


def _loop_devices_of(st: os.stat_result) -> set[tuple[int, int]]:
    """Device numbers of the loop devices whose backing file is this file (at offset 0)."""
    found: set[tuple[int, int]] = set()
    try:
        names = [n for n in os.listdir("/sys/block") if n.startswith("loop")]
    except OSError:
        return found
    for name in names:
        base = f"/sys/block/{name}/loop"
        try:
            with open(f"{base}/backing_file", "rb") as f:
                backing = f.read().rstrip(b"\n")
            with open(f"{base}/offset") as f:
                offset = int(f.read().strip() or 0)
            with open(f"/sys/block/{name}/dev") as f:
                major, minor = (int(x) for x in f.read().strip().split(":"))
        except (OSError, ValueError):
            continue
        if offset != 0:
            continue
        try:
            bst = os.stat(backing)
        except OSError:
            continue
        if (bst.st_dev, bst.st_ino) == (st.st_dev, st.st_ino):
            found.add((major, minor))
    return found


def find_mounted(
    path: Path, st: os.stat_result, mounts: list[MountInfo] | None = None
) -> Mounted | None:
    """Where the ext file system of ``path`` (a block device, or an image file attached to a
    loop device) is mounted, or None if it is not mounted."""
    if stat.S_ISBLK(st.st_mode):
        devs = {(os.major(st.st_rdev), os.minor(st.st_rdev))}
        device = str(path)
    elif stat.S_ISREG(st.st_mode):
        devs = _loop_devices_of(st)
        device = ""
    else:
        return None
    if not devs:
        return None
    mounts = read_mountinfo() if mounts is None else mounts
    hits = [m for m in mounts if (m.major, m.minor) in devs and m.fstype.startswith("ext")]
    if not hits:
        return None
    read_write = any("rw" in m.super_options.split(",") for m in hits)
    whole = [m for m in hits if m.root == b"/"]
    chosen = whole[-1] if whole else hits[-1]
    if not device:
        device = chosen.source
    return Mounted(
        device=device,
        mount_point=chosen.mount_point if whole else b"",
        read_write=read_write,
        fstype=chosen.fstype,
    )


def read_mounted(
    path: Path,
    where: Mounted,
    *,
    freeze: bool = False,
    notice: Notice | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Layout:
    """The layout of a source mounted read-write (see the module docstring); ``progress``
    as for ``fsage.snapshotter.sources.read_source``."""
    say = notice or (lambda _text: None)
    mp = os.fsdecode(where.mount_point)
    if not where.mount_point:
        raise SourceError(
            f"{path} is mounted read-write, but only below its root (a bind mount); "
            "mount its root somewhere or unmount it to take a snapshot"
        )
    if freeze:
        with frozen(where.mount_point) as held:
            layout = read_ext_layout(path, progress=progress)
        line = (
            f"{path} is mounted read-write at {mp}: froze it for the offline read; writers "
            f"were held for {held():.2f} s"
        )
        layout.notes.append(line)
        layout.facts.extra["frozen_seconds"] = round(held(), 3)
        say(shown(line))
        return layout
    line = (
        f"{path} is mounted read-write at {mp}: read through the mount point"
        " (FIEMAP, GETFSMAP); --freeze reads it offline instead"
    )
    say(shown(line))
    report = of_inodes_in_use(progress, where.mount_point) if progress else None
    live = read_live_layout(Path(mp), sync=True, progress=report)
    return joined_with_device(path, live, line)


def joined_with_device(path: Path, live: Layout, line: str) -> Layout:
    """The live layout under the device's identity: the superblock's facts, the reserved
    inodes of the inode table, the ext kind; files and names as read live, joined with what
    only the inode table holds (see ``_joined``). Free space is the block bitmap's, as an
    offline read and e2freefrag count it, unless the bitmap on disk is behind the mount."""
    special = FileTable.empty()
    files = _without_inline(live.files)
    free = live.free
    free_note = ""
    _syncfs(live.facts.extra.get("mount_point"))
    try:
        offline = read_ext_layout(path)
        facts = offline.facts
        special = offline.special
        files = _joined(files, offline.files)
        if live.facts.free_space_known:
            free, free_note = _free_of(files, offline.free, live.free)
        else:
            free = offline.free
    except SourceError:  # the on-disk inode table may be too far behind to be read
        try:
            scanner = _ext2fs.Scanner(str(path))
        except _ext2fs.Ext2fsError as exc:
            raise SourceError(
                f"{path}: not a readable ext2/3/4 file system ({exc.args[2]})"
            ) from None
        try:
            facts = _facts(scanner.facts())
        finally:
            scanner.close()
    if live.facts.block_size != facts.block_size:
        raise SourceError(
            f"{path}: the mount reports {live.facts.block_size} B blocks, the superblock "
            f"{facts.block_size} B"
        )
    if live.facts.free_space_known or free is not live.free:
        facts.blocks_free = free.blocks
    facts.inodes_free = live.facts.inodes_free
    facts.free_space_known = live.facts.free_space_known or free is not live.free
    facts.extra = {
        **facts.extra,
        "read_through": "mount point",
        "mount_point": live.facts.extra.get("mount_point"),
        "walk": live.facts.extra.get("walk"),
        "fiemap_sync": True,
    }
    notes = [line] + ([free_note] if free_note else [])
    return replace(
        live, facts=facts, files=files, free=free, special=special, notes=notes + live.notes
    )


def _syncfs(mount_point: object) -> None:
    """Write the mounted file system's metadata out, so that the inode table and bitmaps
    read next are those of the state the walk saw."""
    if not isinstance(mount_point, str):
        os.sync()
        return
    try:
        fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        os.sync()
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _without_inline(files: FileTable) -> FileTable:
    """The table without FIEMAP's inline extents: ext4 keeps inline data in the inode, and
    the ext reader records such a file with no extent (it owns no block of its own)."""
    inline = (files.ext_flags & EXTENT_INLINE) != 0
    if not inline.any():
        return files
    counts = np.diff(files.ext_off).astype(np.int64)
    owner = np.repeat(np.arange(len(files)), counts)
    keep = ~inline
    ext_off = np.zeros(len(files) + 1, np.uint64)
    np.cumsum(np.bincount(owner[keep], minlength=len(files)), out=ext_off[1:])
    return replace(
        files,
        ext_off=ext_off,
        ext_logical=files.ext_logical[keep],
        ext_physical=files.ext_physical[keep],
        ext_length=files.ext_length[keep],
        ext_flags=files.ext_flags[keep],
    )


def _joined(files: FileTable, disk: FileTable) -> FileTable:
    """The live table with what only the inode table gives, for every inode that is the same
    on disk (same number, type and mode, change time and, but for the files the walk does not
    open, generation): inode flags, damage marks and metadata blocks (extent-tree, indirect
    and xattr blocks); for what cannot be opened for an ioctl (symlinks, FIFOs, sockets,
    device nodes: opening a device can act on it) the generation, and the block of a slow
    symlink's target. Other inodes keep flags 0 and no metadata blocks."""
    n = len(files)
    if n == 0 or len(disk) == 0:
        return replace(files, flags=np.zeros(n, np.uint32))
    order = np.argsort(disk.ino, kind="stable")
    ino = disk.ino[order]
    at = np.minimum(np.searchsorted(ino, files.ino), len(ino) - 1)
    pos = order[at]
    kind = files.mode & 0o170000
    symlink = kind == stat.S_IFLNK
    unopened = (kind != stat.S_IFREG) & (kind != stat.S_IFDIR)
    same = (
        (ino[at] == files.ino)
        & (disk.mode[pos] == files.mode)
        & (disk.ctime[pos] == files.ctime)
        & (unopened | (disk.generation[pos] == files.generation))
    )
    both = FileTable.concat([files, disk])
    from_disk = np.where(same, n + pos, np.arange(n))
    ext_rows = np.where(same & symlink, from_disk, np.arange(n))
    with_ext = both.take(ext_rows)
    with_meta = both.take(from_disk)
    none = np.zeros(n, np.uint32)
    return replace(
        files,
        generation=np.where(same, disk.generation[pos], files.generation).astype(np.uint32),
        flags=np.where(same, disk.flags[pos], none).astype(np.uint32),
        damaged=np.where(same, disk.damaged[pos], files.damaged).astype(np.uint32),
        ext_off=with_ext.ext_off,
        ext_logical=with_ext.ext_logical,
        ext_physical=with_ext.ext_physical,
        ext_length=with_ext.ext_length,
        ext_flags=with_ext.ext_flags,
        meta_off=with_meta.meta_off,
        meta_physical=with_meta.meta_physical,
        meta_kind=with_meta.meta_kind,
    )


def _free_of(files: FileTable, bitmap: FreeExtents, fsmap: FreeExtents) -> tuple[FreeExtents, str]:
    """The bitmap's free extents (GETFSMAP also counts the blocks ext4 holds in memory for
    its preallocations as used), or GETFSMAP's with a note when a block the walk found in a
    file is free in the bitmap on disk."""
    start = files.ext_physical[(files.ext_flags & EXTENT_DELALLOC) == 0]
    length = files.ext_length[(files.ext_flags & EXTENT_DELALLOC) == 0]
    if bitmap.start.size and start.size:
        last = np.searchsorted(bitmap.start, start + length, side="left").astype(np.int64) - 1
        hit = (last >= 0) & (bitmap.start[last] + bitmap.length[last] > start)
        if hit.any():
            return fsmap, (
                f"free space as GETFSMAP maps it: {int(np.count_nonzero(hit))} extent(s) the"
                " walk found in files are free in the block bitmap on disk"
            )
    return bitmap, ""


# ---------------------------------------------------------------- freezing

_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The watchdog: thaws the file system if fsage goes away while it is frozen (a crash,
# SIGKILL). It reads its standard input; "done" means fsage thawed it itself.
_WATCHDOG = """
import fcntl, os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
sys.stdout.write("ready\\n")
sys.stdout.flush()
if sys.stdin.read() != "done":
    try:
        fcntl.ioctl(fd, int(sys.argv[2]), 0)
    except OSError:
        pass
"""


def _thaw(fd: int) -> None:
    try:
        fcntl.ioctl(fd, FITHAW, 0)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: not frozen (any more)
            raise


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then deliver them. In the main
    thread Python handlers catch them whichever thread the kernel picks (a signal mask only
    covers the thread that sets it); elsewhere the calling thread's mask has to do."""
    if threading.current_thread() is not threading.main_thread():
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)

    old = {s: signal.signal(s, hold) for s in _HELD}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


@contextmanager
def frozen(mount_point: bytes) -> Iterator[Callable[[], float]]:
    """Freeze the file system mounted at ``mount_point`` for the block; yields a function
    that tells how long it has been (or was) frozen. Thawed on every way out."""
    name = os.fsdecode(mount_point)
    try:
        fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise SourceError(f"{name}: {exc.strerror}") from None
    watchdog: subprocess.Popen[str] | None = None
    with _signals_held():
        try:
            watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, mount_point, str(FITHAW)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            assert watchdog.stdout is not None
            watchdog.stdout.readline()
            try:
                fcntl.ioctl(fd, FIFREEZE, 0)
            except OSError as exc:
                why = {
                    errno.EBUSY: "it is frozen already",
                    errno.EOPNOTSUPP: "the file system cannot be frozen",
                    errno.EPERM: "freezing needs root (CAP_SYS_ADMIN)",
                }.get(exc.errno or 0, exc.strerror)
                raise SourceError(f"cannot freeze {name}: {why}") from None
            t0 = time.monotonic()
            t1: list[float] = []
            try:
                yield lambda: (t1[0] if t1 else time.monotonic()) - t0
            finally:
                _thaw(fd)
                t1.append(time.monotonic())
        finally:
            os.close(fd)
            if watchdog is not None:
                try:
                    assert watchdog.stdin is not None
                    watchdog.stdin.write("done")
                    watchdog.stdin.close()
                except OSError:
                    pass
                watchdog.wait()

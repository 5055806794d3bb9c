"""Pick the reader for a snapshot source: ext image or device, LFS image, mounted directory.

An ext source that is mounted read-write is read through its mount point (or frozen and read
offline): see ``fsage.snapshotter.mounted``. An image file or device that changes while it is
read (its size or change time differ afterwards, or reads of it fail) yields a SourceError,
never a layout, so that nothing is recorded.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from fsage.errors import SourceError
from fsage.layout import Layout
from fsage.snapshotter.ext import has_ext_magic, read_ext_layout

Notice = Callable[[str], None]
#: ``progress(done, total)``: inodes read so far, of about ``total`` (the inodes in use).
Progress = Callable[[int, int], None]


def read_source(
    path: Path | str,
    *,
    freeze: bool = False,
    notice: Notice | None = None,
    progress: Progress | None = None,
    expected: int | None = None,
) -> Layout:
    """Read any supported source into a Layout; SourceError with one clear line otherwise.

    ``freeze``: an ext source mounted read-write is frozen for an offline read instead of
    being read through its mount point. ``notice`` is called with a line that says how a
    mounted source was read. ``progress`` is called now and then while a directory tree or an
    ext file system is read: inodes read so far, and the inodes in use (from statvfs, or the
    group descriptors; for a directory below a mount point, ``expected``, the inodes its last
    snapshot read, else 0: not known).
    """
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SourceError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise SourceError(f"{path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        return _read_directory(path, progress, expected)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise SourceError(f"{path}: not an image file, block device or directory")
    if not os.access(path, os.R_OK):
        raise SourceError(f"{path}: permission denied")
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
        raise SourceError(f"{path}: empty file, not a file system")
    if has_ext_magic(path):
        from fsage.snapshotter.mounted import find_mounted, read_mounted

        where = find_mounted(path, st)
        if where is not None and where.read_write:
            return read_mounted(path, where, freeze=freeze, notice=notice, progress=progress)
        return _unchanged(path, st, lambda: read_ext_layout(path, progress=progress))
    if _is_lfs_image(path):
        from fsage.lfs.reader import read_lfs_layout

        return _unchanged(path, st, lambda: read_lfs_layout(path))
    raise SourceError(f"{path}: not a recognised file system (ext2/3/4 or fsage LFS)")


def _changes(before: os.stat_result, after: os.stat_result) -> str:
    """What differs between two stats of a source ("" if nothing that matters)."""
    if (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino):
        return "it was replaced by another file"
    if stat.S_ISBLK(before.st_mode):
        return "" if before.st_rdev == after.st_rdev else "it is another device now"
    if before.st_size != after.st_size:
        return f"its size went from {before.st_size} to {after.st_size} bytes"
    if (before.st_mtime_ns, before.st_ctime_ns) != (after.st_mtime_ns, after.st_ctime_ns):
        return "it was written to"
    return ""


def _unchanged(path: Path, before: os.stat_result, read: Callable[[], Layout]) -> Layout:
    """``read()``, provided that the source is the same before and after it."""
    failure: Exception | None = None
    try:
        layout = read()
    except Exception as exc:  # a reader may fail in any way on a file cut short under it
        failure = exc
    try:
        after = path.stat()
    except OSError as exc:
        raise SourceError(
            f"{path} went away while it was read ({exc.strerror}); nothing recorded"
        ) from None
    changed = _changes(before, after)
    if changed:
        raise SourceError(f"{path} changed while it was read ({changed}); nothing recorded")
    if failure is not None:
        raise failure
    return layout


def _read_directory(
    path: Path, progress: Progress | None = None, expected: int | None = None
) -> Layout:
    try:
        from fsage.snapshotter.live import read_live_layout
    except ImportError:
        raise SourceError(
            f"{path}: is a directory; live snapshots of mounted trees are not supported yet"
        ) from None
    from fsage.snapshotter.live import LFS_FSTYPE, find_mount, of_inodes_in_use

    mount = find_mount(os.path.realpath(os.fsencode(path)))
    if mount.fstype == LFS_FSTYPE:  # fsage lfs mount: FUSE has no FIEMAP; read the image
        from fsage.lfs.mounted import read_mounted_lfs  # the LFS code only for an LFS

        return read_mounted_lfs(str(path), os.fsdecode(mount.mount_point), mount.source)
    report = of_inodes_in_use(progress, path, expected) if progress else None
    from fsage.snapshotter.livedevice import with_device

    return with_device(path, read_live_layout(path, progress=report), mount)


def _is_lfs_image(path: Path) -> bool:
    try:
        from fsage.lfs.executor import is_lfs_image
    except ImportError:
        return False
    return is_lfs_image(path)

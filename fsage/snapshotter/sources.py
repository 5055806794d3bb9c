"""Pick the reader for a snapshot source: ext image or device, LFS image, mounted directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fsage.errors import SourceError
from fsage.layout import Layout
from fsage.snapshotter.ext import has_ext_magic, read_ext_layout


def read_source(path: Path | str) -> Layout:
    """Read any supported source into a Layout; SourceError with one clear line otherwise."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SourceError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise SourceError(f"{path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        return _read_directory(path)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise SourceError(f"{path}: not an image file, block device or directory")
    if not os.access(path, os.R_OK):
        raise SourceError(f"{path}: permission denied")
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
        raise SourceError(f"{path}: empty file, not a file system")
    if has_ext_magic(path):
        return read_ext_layout(path)
    if _is_lfs_image(path):
        from fsage.lfs.reader import read_lfs_layout

        return read_lfs_layout(path)
    raise SourceError(f"{path}: not a recognised file system (ext2/3/4 or fsage LFS)")


def _read_directory(path: Path) -> Layout:
    try:
        from fsage.snapshotter.live import read_live_layout
    except ImportError:
        raise SourceError(
            f"{path}: is a directory; live snapshots of mounted trees are not supported yet"
        ) from None
    from fsage.lfs.mounted import FSTYPE, read_mounted_lfs
    from fsage.snapshotter.live import find_mount

    mount = find_mount(os.path.realpath(os.fsencode(path)))
    if mount.fstype == FSTYPE:  # fsage lfs mount: FUSE has no FIEMAP; read the image
        return read_mounted_lfs(str(path), os.fsdecode(mount.mount_point), mount.source)
    return read_live_layout(path)


def _is_lfs_image(path: Path) -> bool:
    try:
        from fsage.lfs.executor import is_lfs_image
    except ImportError:
        return False
    return is_lfs_image(path)

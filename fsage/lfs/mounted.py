"""The layout of an LFS that is mounted through FUSE (``fsage lfs mount``), for the live reader.

FUSE passes no FIEMAP to its file systems, so a mounted LFS cannot be mapped file by file the
way the live reader maps ext4 or xfs. Its layout is in its image instead, and the image says
more (segments, their usage, the log's metadata blocks). ``read_mounted_lfs`` therefore:

1. asks the mount process to commit what it holds (``fsync`` on the mount's root directory
   reaches the LFS as a sync: its buffer is written to the log);
2. reads the image read-only as ``fsage snapshot IMAGE`` would: the newer checkpoint, then a
   roll-forward over the units committed after it;
3. reads the two checkpoint timestamps before and after and starts again (up to five times)
   when they differ. Between two checkpoints the mount only appends to the log: segments
   emptied since the last checkpoint are reused only after the next one, so every block the
   reader reached still held what it read.

The Layout is the image's (kind ``lfs``), with a note naming the mount.
"""

from __future__ import annotations

import os

from fsage.errors import SourceError
from fsage.layout import Layout
from fsage.lfs import format as fmt
from fsage.lfs.reader import read_lfs_layout
from fsage.snapshotter.live import LFS_FSTYPE

#: The file system type of a mount made by ``fsage lfs mount`` (/proc/self/mountinfo).
FSTYPE = LFS_FSTYPE
_TRIES = 5


def _checkpoint_stamps(image: str) -> tuple[bytes, ...]:
    fd = os.open(image, os.O_RDONLY)
    try:
        geo = fmt.read_geometry(fd, os.fstat(fd).st_size, image)
        out = []
        for which in (0, 1):
            start, length = fmt.checkpoint_region(geo, which)
            out.append(os.pread(fd, 8, start + length - geo.block_size))
        return tuple(out)
    finally:
        os.close(fd)


def read_mounted_lfs(path: str, mount_point: str, image: str) -> Layout:
    """The layout of the LFS image ``image`` mounted at ``mount_point`` (``path`` is on it)."""
    if not os.path.isfile(image):
        raise SourceError(
            f"{path}: an fsage LFS mounted through FUSE, but its image {image!r} is not a "
            "file this process can see"
        )
    try:
        fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SourceError(f"{path}: cannot sync the mount: {exc.strerror}") from None
    for _ in range(_TRIES):
        before = _checkpoint_stamps(image)
        try:
            layout = read_lfs_layout(image, lock=False)  # the mount holds it
        except (fmt.LfsError, SourceError):
            if _checkpoint_stamps(image) != before:
                continue  # the mount checkpointed while we read: read again
            raise
        if _checkpoint_stamps(image) == before:
            layout.notes.append(
                f"an fsage LFS mounted through FUSE at {mount_point}: read from its image "
                f"{image} (FUSE has no FIEMAP); the whole file system is recorded"
            )
            return layout
    raise SourceError(
        f"{path}: the mounted LFS checkpointed during each of {_TRIES} reads of {image}; "
        "try again when it is quieter, or unmount it and snapshot the image"
    )

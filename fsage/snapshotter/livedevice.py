"""A mount directory that is the root of an ext file system, read as its device is read.

The mount shows neither the reserved inodes (journal, resize inode), nor the extent-tree
blocks, nor a slow symlink's target block, nor the generation and inode flags of what cannot
be opened for an ioctl (symlinks, FIFOs, sockets, device nodes). A snapshot of the mount
directory taken under the same name as one of the device would then record all of those as
changed or deleted although nothing changed. So, where the device can be read (root, as a
device snapshot needs anyway), the walk's records are joined with the device's inode table
as for a device mounted read-write (``fsage.snapshotter.mounted``): both commands then
record the same file system the same way. A subtree (its own name), a bind mount, another
file system type or a device that cannot be read keeps the plain live read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fsage.errors import SourceError
from fsage.layout import Layout
from fsage.snapshotter.livewalk import MountInfo
from fsage.text import shown

__all__ = ["device_of", "with_device"]


def device_of(mount: MountInfo) -> str | None:
    """The block device behind ``mount`` that this process can read, or None."""
    for cand in (mount.source, f"/dev/block/{mount.major}:{mount.minor}"):
        try:
            st = os.stat(cand)
        except OSError:
            continue
        if (
            stat.S_ISBLK(st.st_mode)
            and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (mount.major, mount.minor)
            and os.access(cand, os.R_OK)
        ):
            return cand
    return None


def with_device(path: Path, live: Layout, mount: MountInfo) -> Layout:
    """``live`` (a read of ``path``) joined with its device's inode table when ``path`` is the
    root of a whole ext file system whose device can be read; else ``live`` as it is."""
    whole = live.facts.extra.get("subtree") == "/" and mount.root == b"/"
    if not (whole and mount.fstype.startswith("ext")):
        return live
    device = device_of(mount)
    if device is None:
        return live
    line = (
        f"{path} is the root of {device}: read through the mount, with the reserved inodes, "
        "inode flags, extent-tree blocks and symlinks' blocks from the device's inode table"
    )
    from fsage.snapshotter.mounted import joined_with_device  # its imports only for an ext root

    try:
        return joined_with_device(Path(device), live, shown(line))
    except SourceError as exc:  # a device it cannot make sense of: the mount's view alone
        live.notes.append(f"{device} not joined: {exc}")
        return live

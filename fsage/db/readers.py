"""What `fsage snapshot` says when a file system's last two snapshots were read two ways.

A read through the mount (kind ``live:ext4``) cannot see what only the inode table holds: the
reserved inodes, extent-tree blocks, and a symlink's generation, flags and target block. Where
the device could not be read to fill those in (without root), a history that alternates the
device and its mount directory would record them as changes; the line names them and counts
how many of the new, changed and deleted files differ only in that.
"""

from __future__ import annotations

import stat
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from fsage.db import codec
from fsage.db.rows import SnapshotRow
from fsage.db.store import Store
from fsage.layout import FileTable, Layout

UNSEEN = "reserved inodes, extent-tree blocks, or symlinks' generations, flags and blocks"


def _reader_kinds(prev: str, cur: str) -> bool:
    """True for an offline and a live read of one kind of file system, in either order."""
    return prev != cur and (prev == f"live:{cur}" or cur == f"live:{prev}")


def _seen_by_both(files: FileTable) -> FileTable:
    """The records as a read through the mount gives them."""
    link = (files.mode & 0o170000) == stat.S_IFLNK
    counts = np.diff(files.ext_off).astype(np.int64)
    keep = np.repeat(~link, counts)
    ext_off = np.zeros(len(files) + 1, np.uint64)
    np.cumsum(np.where(link, 0, counts), out=ext_off[1:])
    return replace(
        files,
        generation=np.where(link, 0, files.generation).astype(np.uint32),
        flags=np.where(link, 0, files.flags).astype(np.uint32),
        ext_off=ext_off,
        ext_logical=files.ext_logical[keep],
        ext_physical=files.ext_physical[keep],
        ext_length=files.ext_length[keep],
        ext_flags=files.ext_flags[keep],
        meta_off=np.zeros(len(files) + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )


def _digests(layout: Layout, files: FileTable) -> npt.NDArray[np.uint64]:
    return codec.file_digests(files, layout.links, codec.link_files(files, layout.links))


def _only_unseen(before: Layout, after: Layout) -> tuple[int, int, int]:
    """Of the files new, changed and deleted between two layouts, those equal but for what a
    read through the mount cannot see."""
    a, b = before.files, after.files
    real_a, real_b = _digests(before, a), _digests(after, b)
    seen_a, seen_b = _digests(before, _seen_by_both(a)), _digests(after, _seen_by_both(b))
    order = np.argsort(a.ino, kind="stable")
    at = np.minimum(np.searchsorted(a.ino[order], b.ino), max(len(a) - 1, 0))
    pos = order[at] if len(a) else at
    found = (a.ino[pos] == b.ino) if len(a) else np.zeros(len(b), bool)
    differs = found & (real_a[pos] != real_b)
    alike = found & (seen_a[pos] == seen_b)
    link = (b.mode & 0o170000) == stat.S_IFLNK
    regen = differs & alike & link & (a.generation[pos] != b.generation)
    changed = int(np.count_nonzero(differs & alike & ~regen))
    # A symlink whose generation only one reader sees counts as deleted and new again; so do
    # the reserved inodes, which only the offline read records.
    recreated = int(np.count_nonzero(regen))
    reserved = len(before.special) if len(after.special) == 0 else 0
    return recreated, changed, recreated + reserved


def reader_notice(store: Store, snapshot_id: int, layout: Layout) -> str | None:
    """The line to print after the counts of snapshot ``snapshot_id`` (``layout``), when the
    previous snapshot of its file system was read by the other reader; else None."""
    snap = store.snapshot(snapshot_id)
    if not (snap.new_files or snap.changed_files or snap.deleted_files):
        return None
    earlier = [s for s in store.snapshots(snap.fs_name) if s.id < snapshot_id]
    if not earlier or not _reader_kinds(earlier[-1].kind, snap.kind):
        return None
    prev: SnapshotRow = earlier[-1]
    new, changed, deleted = _only_unseen(store.load_layout(prev.id), layout)
    parts = [
        f"{n} of the {total} {what}"
        for n, total, what in (
            (changed, snap.changed_files, "changed"),
            (new, snap.new_files, "new"),
            (deleted, snap.deleted_files, "deleted"),
        )
        if total
    ]
    return (
        f"snapshot {prev.id} of {snap.fs_name} was read {_how(prev.kind)}, this one "
        f"{_how(snap.kind)}; a read through the mount cannot see {UNSEEN}: "
        f"{', '.join(parts)} differ only in that"
    )


def _how(kind: str) -> str:
    return (
        f"through the mount ({kind})" if kind.startswith("live:") else f"from the device ({kind})"
    )

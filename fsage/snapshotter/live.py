"""The live reader: the layout of a mounted directory tree, read through FIEMAP.

``read_live_layout(path)`` walks a mounted tree (ext4, xfs, btrfs or any other file system on a
block device whose driver answers FIEMAP) and yields a :class:`fsage.layout.Layout` of kind
``live:<fstype>``. Its numpy-free first half (mountinfo, the checks before the walk, the C
walk itself, and the walk ``fsage snapshot DIR`` starts before its imports) is in
``fsage.snapshotter.livewalk``. What it does, and the choices behind it:

* **Which file systems.** The file system type comes from ``/proc/self/mountinfo``. Pseudo file
  systems have no block layout and are refused with a :class:`SourceError`: every type that
  ``/proc/filesystems`` marks ``nodev`` (proc, sysfs, tmpfs, ramfs, devtmpfs, devpts, cgroup,
  cgroup2, overlay, nfs, fuse, 9p, virtiofs, zfs, ...) plus a built-in list for when that file
  cannot be read. A file system that answers FIEMAP with "not supported" on every regular
  file is refused as well; where only some files are refused, those are recorded without
  extents and a note names them.
* **The walk.** In C (``fsage._live``, built by setup.py): getdents64 on each directory, its
  entries taken in inode order (the inodes are then read as they lie, not in hash order),
  ``openat``/``statx``/ioctls relative to the directory's descriptor (so any name survives
  and paths may exceed PATH_MAX), pending directories on an explicit stack (no depth limit, at
  most three descriptors open per thread), interrupted calls retried, the GIL released.
  ``workers`` threads take directories from that one stack, so a lopsided tree keeps them all
  busy; each has its own descriptor table, which spares the kernel a shared lock on every
  open and close. The C walk merges extents, sorts the records by inode and hands back the
  columns of the FileTable as buffers that numpy wraps without a copy or a per-file Python
  object. Where the extension is not built, the same walk runs in Python
  (``os.scandir`` on byte paths, forked workers); ``engine=`` picks one, and the tests hold
  the two to the same Layout. Directories on another device (another mount, a btrfs
  subvolume) and mount points listed in mountinfo are not entered; they are counted in
  ``layout.notes``. A hard-linked inode is recorded once, with every name in the link table.
  Entries that vanish or change type between the listing and their opening are skipped and
  noted as such.
* **Paths.** The layout's root is the root of the mount. When ``path`` is a directory below
  it, the directories from the mount root down to ``path`` are recorded too (each with the one
  name on the way), so paths read from the mount root (``/sub/dir/file``) and
  ``facts.extra["subtree"]`` names the part that was walked.
* **Extents.** ``FS_IOC_FIEMAP`` on every regular file and every directory (where the file
  system maps directories; xfs and btrfs do not, and those directories get no extents), with
  ``FIEMAP_FLAG_SYNC`` off unless ``sync=True`` (so dirty data shows as delalloc). Files with
  more extents than one buffer holds are read in several calls. The C walk first asks for the
  extents up to the file's size and asks for the rest only when those cover fewer bytes than
  stat's block count (space allocated past the end, such as ``fallocate --keep-size``, is
  then read too); the Python walk asks for everything at once. Adjacent extents (logically
  and physically contiguous, same flags) are merged. Byte offsets become blocks of
  ``statvfs().f_frsize``; an extent that does not fill its last block is rounded up. FIEMAP
  flags map to ``EXTENT_UNWRITTEN``, ``EXTENT_DELALLOC``, ``EXTENT_INLINE`` (data-inline,
  data-tail), ``EXTENT_SHARED`` and ``EXTENT_ENCODED`` (encoded, data-encrypted). On btrfs,
  physical addresses are in btrfs's logical address space (before its chunk mapping), which
  ``facts.extra["physical_space"]`` says.
* **Free space.** ``FS_IOC_GETFSMAP`` where the file system has it (ext4, xfs); records owned by
  ``FMR_OWN_FREE`` on the data device are the free extents (adjacent records merged). Where
  the call is refused (older kernels kept it to CAP_SYS_ADMIN on xfs) or missing (btrfs),
  ``facts.free_space_known`` is False, the free extents are empty and a note says why.
* **Without root.** Whatever cannot be opened (a file without read permission, a directory
  without read or search permission) is left out of the layout together with what lies below
  it; ``layout.notes`` gives the count and the first few paths.
* **Facts.** ``kind`` is ``live:<fstype>``; ``uuid`` comes from ``FS_IOC_GETFSUUID`` (Linux 6.5+,
  unprivileged), else ``blkid`` on the mounted device, else ``statfs().f_fsid`` written as
  ``fsid:<16 hex digits>`` (``facts.extra["uuid_source"]`` says which); ``label`` from
  ``FS_IOC_GETFSLABEL`` where answered; the block count is the device's as GETFSMAP maps it
  (metadata included, as the offline readers and e2freefrag count it: statvfs on ext4 leaves
  out the space the file system keeps for its own metadata), else statvfs's; free blocks
  (as the file system reports them) and inode counts from ``statvfs``.
* **Per file.** ino, generation (``FS_IOC_GETVERSION`` where supported, else 0), inode flags
  (``FS_IOC_GETFLAGS`` on the regular files and directories the walk opens anyway, as the
  offline reader records them; 0 for what is not opened, such as symlinks), mode, nlink,
  uid, gid, size, times in nanoseconds; crtime from statx's birth time where the file system
  keeps one (C walk; ext4, xfs and btrfs do), else 0 (the Python walk has it only through
  ``st_birthtime``, which Python offers on Linux from 3.13). ``facts.extra["walk"]`` says
  which walk read the tree.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fsage.errors import SourceError
from fsage.layout import (
    FILE_COLUMNS,
    FileTable,
    FreeExtents,
    FsFacts,
    Layout,
    LinkTable,
)
from fsage.snapshotter.liveioctl import (
    FIEMAP_EXTENT_DTYPE,
    fiemap_extents,
    fs_label,
    fs_uuid,
    getfsmap_free,
    merge_extents,
)
from fsage.snapshotter.livepywalk import (
    DirTask,
    PyWalk,
    concat_links,
    files_of,
    merge_parts,
    part_of,
    skip_reason,
    walk_parallel,
)
from fsage.snapshotter.livewalk import (
    LFS_FSTYPE,
    PSEUDO_FS_TYPES,
    CWalk,
    MountInfo,
    WalkScope,
    c_walker_available,
    find_mount,
    is_pseudo_fs,
    read_mountinfo,
    run_c_walk,
    scope_of,
    take_background_walk,
)

__all__ = [
    "FIEMAP_EXTENT_DTYPE",
    "LFS_FSTYPE",
    "PSEUDO_FS_TYPES",
    "MountInfo",
    "c_walker_available",
    "fiemap_extents",
    "find_mount",
    "getfsmap_free",
    "is_pseudo_fs",
    "merge_extents",
    "of_inodes_in_use",
    "read_live_layout",
    "read_mountinfo",
    "scope_of",
]


_SKIPPED_SHOWN = 5  # paths named in a note; the rest are counted


@dataclass
class _Seen:
    """What a walk saw, ready for the Layout: files sorted by inode, one record each."""

    files: FileTable
    links: LinkTable
    skipped: list[tuple[bytes, str]]
    not_crossed: list[bytes]
    no_fiemap: list[tuple[bytes, str]]
    fiemap_ok: int
    root_ino: int


def _listed(items: list[bytes]) -> str:
    shown = ", ".join(os.fsdecode(r or b"/") for r in items[:_SKIPPED_SHOWN])
    more = f" and {len(items) - _SKIPPED_SHOWN} more" if len(items) > _SKIPPED_SHOWN else ""
    return shown + more


def _by_reason(pairs: list[tuple[bytes, str]]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for rel, reason in pairs:
        out.setdefault(reason, []).append(rel)
    return out


def _notes(w: _Seen, extra_notes: list[str]) -> list[str]:
    notes = []
    for reason, rels in _by_reason(sorted(w.skipped)).items():
        noun = "path" if len(rels) == 1 else "paths"
        notes.append(f"skipped {len(rels)} {noun} ({reason}): {_listed(rels)}")
    if w.not_crossed:
        notes.append(
            f"did not cross {len(w.not_crossed)} mount point(s) or subvolume(s): "
            f"{_listed(sorted(w.not_crossed))}"
        )
    for reason, rels in _by_reason(sorted(w.no_fiemap)).items():
        noun = "file" if len(rels) == 1 else "files"
        notes.append(
            f"recorded {len(rels)} {noun} without extents (FIEMAP: {reason}): {_listed(rels)}"
        )
    return notes + extra_notes


def _c_files(res: dict[str, Any]) -> FileTable:
    """The FileTable over the columns fsage._live.walk returned (no copies)."""
    n = len(res["ino"]) // 8
    cols: dict[str, Any] = {
        name: np.frombuffer(res[name], dtype)
        for name, dtype in FILE_COLUMNS.items()
        if name != "damaged"
    }
    return FileTable(
        **cols,
        damaged=np.zeros(n, np.uint32),
        ext_off=np.frombuffer(res["ext_off"], np.uint64),
        ext_logical=np.frombuffer(res["ext_logical"], np.uint64),
        ext_physical=np.frombuffer(res["ext_physical"], np.uint64),
        ext_length=np.frombuffer(res["ext_length"], np.uint64),
        ext_flags=np.frombuffer(res["ext_flags"], np.uint32),
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )


def _c_links(res: dict[str, Any]) -> LinkTable:
    return LinkTable(
        np.frombuffer(res["l_parent"], np.uint64),
        np.frombuffer(res["l_ino"], np.uint64),
        np.frombuffer(res["name_off"], np.uint64),
        res["names"],
    )


def _walk_python(sc: WalkScope) -> _Seen:
    """The walk in Python (os.scandir, fcntl.ioctl); the fallback and the tests' oracle."""
    w = PyWalk(
        dev=sc.dev, submounts=sc.submounts, sync=sc.sync, batch=sc.batch, progress=sc.progress
    )
    comps = sc.comps
    if comps:
        # The directories from the mount root down to the given one, each with its one name.
        parent: int | None = None
        walked = sc.mount_point
        for i, comp in enumerate([b"", *comps[:-1]]):
            walked = os.path.join(walked, comp) if comp else walked
            relp = b"/" + b"/".join(comps[:i]) if i else b""
            opened = w.open_dir(walked, relp, parent, comp or None, check_dev=False)
            if opened is None:
                raise SourceError(f"{sc.path}: cannot open {os.fsdecode(walked)}")
            os.close(opened[0])
            parent = opened[1]
        top: DirTask = (sc.real, sc.sub, parent, comps[-1])
    else:
        top = (sc.mount_point, b"", None, None)
    first = len(w.counts)
    if sc.workers > 1:
        deferred: list[DirTask] = []
        w.walk(*top, defer=deferred)
        parts = walk_parallel(w, deferred, sc.workers)
    else:
        w.walk(*top)
        parts = []
    if not w.counts:
        raise SourceError(f"{sc.path}: cannot open the mount root {os.fsdecode(sc.mount_point)}")
    if len(w.counts) == first:
        raise SourceError(f"{sc.path}: cannot open this directory")
    root_ino = int(w.meta[0])
    seen = merge_parts([part_of(w), *parts])
    return _Seen(
        files_of(seen, sc.block_size),
        seen.links,
        seen.skipped,
        seen.not_crossed,
        seen.no_fiemap,
        seen.fiemap_ok,
        root_ino,
    )


def _walk_c(sc: WalkScope) -> _Seen:
    """The walk in C: the one started in the background for this scope, or a new one."""
    started = take_background_walk(sc)
    return _seen_of_c(started.result() if started is not None else run_c_walk(sc))


def _seen_of_c(walk: CWalk) -> _Seen:
    results = walk.results
    files = FileTable.concat([_c_files(r) for r in results])
    if len(results) > 1:
        files = files.sorted_by_ino()
    return _Seen(
        files,
        concat_links([_c_links(r) for r in results]),
        [(rel, skip_reason(err)) for r in results for rel, err in r["skipped"]],
        [rel for r in results for rel in r["not_crossed"]],
        [(rel, skip_reason(err)) for r in results for rel, err in r["no_fiemap"]],
        sum(int(r["fiemap_ok"]) for r in results),
        walk.root_ino,
    )


def of_inodes_in_use(
    progress: Callable[[int, int], None], path: Path | bytes, expected: int | None = None
) -> Callable[[int], None]:
    """``read_live_layout``'s ``progress(done)`` as ``progress(done, total)``, the total being
    the inodes in use on the file system (statvfs) when ``path`` is its mount point; for a
    directory below it, whose share of them nothing tells ahead, ``expected`` (what the last
    snapshot of that directory read), else 0: not known."""
    real = os.path.realpath(os.fsencode(path))
    if find_mount(real).mount_point == real:
        vfs = os.statvfs(path)
        in_use = max(int(vfs.f_files) - int(vfs.f_ffree), 0)
    else:
        in_use = expected or 0

    def report(done: int) -> None:
        progress(done, in_use)

    return report


def read_live_layout(
    path: Path,
    *,
    sync: bool = False,
    fiemap_batch: int = 256,
    workers: int = 0,
    progress: Callable[[int], None] | None = None,
    engine: str = "auto",
) -> Layout:
    """Read the layout of the mounted tree at ``path`` (see the module docstring).

    ``workers`` > 1 walks in that many threads (C walk; they share the pending directories)
    or forked processes (Python walk: the top levels are read first, then the subdirectories
    are shared out); the result is the same as with one (but for the order of the link
    table). ``workers=0`` (the default)
    is one thread per CPU this process may run on, up to 4, for the C walk and 1 for the
    Python walk. ``progress`` is called now and then with the number of inodes read
    so far. ``engine`` is "c" (fsage._live), "python" or "auto" (C where it is built).
    """
    scope = scope_of(
        path,
        sync=sync,
        fiemap_batch=fiemap_batch,
        workers=workers,
        progress=progress,
        engine=engine,
    )
    mount, vfs, block_size = scope.mount, scope.vfs, scope.block_size
    mp, sub = scope.mount_point, scope.sub
    seen = (_walk_c if scope.engine == "c" else _walk_python)(scope)
    if seen.no_fiemap and not seen.fiemap_ok:
        rel, reason = seen.no_fiemap[0]
        raise SourceError(
            f"{os.fsdecode(rel)}: the file system does not answer FIEMAP "
            f"({reason}); the live reader cannot map its files"
        )
    extra_notes: list[str] = []
    try:
        fd = os.open(scope.real, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise SourceError(f"{path}: {e.strerror}") from None
    try:
        free, device_blocks, why = getfsmap_free(fd, block_size, scope.dev)
        uuid, uuid_source = fs_uuid(fd, mount, vfs)
        label = fs_label(fd)
    finally:
        os.close(fd)
    if free is None:
        extra_notes.append(f"free space unknown: {why}")

    files = seen.files
    links = seen.links

    scale = block_size
    facts = FsFacts(
        kind=f"live:{mount.fstype}",
        uuid=uuid,
        label=label,
        block_size=block_size,
        # The on-disk block count, as the offline readers and e2freefrag give it, where
        # GETFSMAP maps the device; else what statvfs counts (without the metadata).
        blocks_total=device_blocks or int(vfs.f_blocks) * int(vfs.f_frsize or block_size) // scale,
        blocks_free=int(vfs.f_bfree) * int(vfs.f_frsize or block_size) // scale,
        inodes_total=int(vfs.f_files),
        inodes_free=int(vfs.f_ffree),
        extra={
            "mount_point": os.fsdecode(mp),
            "mount_root": os.fsdecode(mount.root),
            "source": mount.source,
            "mount_options": mount.options,
            "super_options": mount.super_options,
            "subtree": os.fsdecode(sub) if sub else "/",
            "uuid_source": uuid_source,
            "blocks_available": int(vfs.f_bavail),
            "fiemap_sync": sync,
            "skipped": len(seen.skipped),
            "no_fiemap": len(seen.no_fiemap),
            "walk": scope.engine,
            "not_crossed": len(seen.not_crossed),
            "physical_space": ("btrfs logical addresses" if mount.fstype == "btrfs" else "device"),
        },
        free_space_known=free is not None,
    )
    return Layout(
        facts=facts,
        files=files,
        links=links,
        free=free if free is not None else FreeExtents.empty(),
        root_ino=seen.root_ino,
        notes=_notes(seen, extra_notes),
    )

"""The live reader's walk in Python, for where the C walk (``fsage._live``) is not built:
``os.scandir`` on byte paths, entries in inode order, FIEMAP, GETVERSION and GETFLAGS per
file, whole subtrees handed to forked workers; the parts they return merged into one FileTable.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fsage.layout import (
    FileTable,
    LinkTable,
)
from fsage.snapshotter.liveioctl import (
    FIEMAP_EXT_SIZE,
    FIEMAP_EXTENT_DTYPE,
    FIEMAP_FLAG_SYNC,
    FIEMAP_HEAD,
    FIEMAP_MAX_OFFSET,
    FS_IOC_FIEMAP,
    FS_IOC_GETFLAGS,
    FS_IOC_GETVERSION,
    fiemap_into,
    merge_extents,
)

_NO_FIEMAP = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL})


def skip_reason(err: int | None) -> str:
    """Why a path was left out, for the notes."""
    if err in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
        return "vanished or changed during the walk"
    if err in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return os.strerror(err) if err else "unknown error"


_HAS_BIRTHTIME = hasattr(os.stat_result, "st_birthtime_ns")
DirTask = tuple[bytes, bytes, int | None, bytes | None]  # path, rel, parent ino, name
# ino, generation, mode, nlink, uid, gid, size, atime, mtime, ctime, crtime, inode flags
_META_COLS = 12


@dataclass
class PyWalk:
    """Accumulates records while walking; one instance per read."""

    dev: int
    submounts: set[bytes]
    sync: bool
    batch: int
    progress: Callable[[int], None] | None = None
    meta: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    raw: bytearray = field(default_factory=bytearray)
    l_parent: list[int] = field(default_factory=list)
    l_ino: list[int] = field(default_factory=list)
    l_name: list[bytes] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # inodes with several links, once recorded
    skipped: list[tuple[bytes, str]] = field(default_factory=list)
    not_crossed: list[bytes] = field(default_factory=list)
    no_fiemap: list[tuple[bytes, str]] = field(default_factory=list)  # recorded without extents
    fiemap_ok: int = 0  # regular files FIEMAP answered
    dir_fiemap: bool = True
    getversion: bool = True
    getflags: bool = True
    fiemap_checked: bool = False

    def __post_init__(self) -> None:
        self.buf = bytearray(FIEMAP_HEAD.size + FIEMAP_EXT_SIZE * self.batch)
        self.gbuf = bytearray(8)
        self.fbuf = bytearray(8)
        self.fflags = FIEMAP_FLAG_SYNC if self.sync else 0

    def _generation(self, fd: int) -> int:
        if not self.getversion:
            return 0
        try:
            fcntl.ioctl(fd, FS_IOC_GETVERSION, self.gbuf, True)
        except OSError:
            self.getversion = False
            return 0
        return int.from_bytes(self.gbuf[:4], "little")

    def _inode_flags(self, fd: int) -> int:
        if not self.getflags:
            return 0
        try:
            fcntl.ioctl(fd, FS_IOC_GETFLAGS, self.fbuf, True)
        except OSError:
            self.getflags = False
            return 0
        return int.from_bytes(self.fbuf[:4], "little")

    def _record(self, st: os.stat_result, gen: int, iflags: int, nraw: int) -> None:
        self.meta += (
            st.st_ino,
            gen,
            st.st_mode,
            st.st_nlink,
            st.st_uid,
            st.st_gid,
            st.st_size,
            st.st_atime_ns,
            st.st_mtime_ns,
            st.st_ctime_ns,
            getattr(st, "st_birthtime_ns", 0) if _HAS_BIRTHTIME else 0,
            iflags,
        )
        self.counts.append(nraw)
        n = len(self.counts)
        if self.progress is not None and n & 0xFFF == 0:
            self.progress(n)

    def _fiemap(self, fd: int, st: os.stat_result, is_dir: bool, rel: bytes) -> int:
        if not is_dir and st.st_size == 0 and st.st_blocks == 0:
            return 0
        if is_dir and not self.dir_fiemap:
            return 0
        try:
            return fiemap_into(fd, self.buf, self.batch, self.fflags, self.raw)
        except OSError as e:
            if is_dir and e.errno in _NO_FIEMAP:
                self.dir_fiemap = False
            else:
                self.no_fiemap.append((rel, skip_reason(e.errno)))
            return 0

    def open_dir(
        self,
        path: bytes,
        rel: bytes,
        parent: int | None,
        name: bytes | None,
        *,
        check_dev: bool = True,
    ) -> tuple[int, int] | None:
        """Open and record a directory; return (fd, ino), or None if it is skipped."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            self._skip(rel, e)
            return None
        try:
            st = os.fstat(fd)
            if check_dev and (st.st_dev != self.dev or rel in self.submounts):
                self.not_crossed.append(rel)
                os.close(fd)
                return None
            gen = self._generation(fd)
            iflags = self._inode_flags(fd)
            n = self._fiemap(fd, st, True, rel)
        except BaseException:
            os.close(fd)
            raise
        self._record(st, gen, iflags, n)
        if parent is not None and name is not None:
            self._link(parent, st.st_ino, name)
        return fd, st.st_ino

    def _link(self, parent: int, ino: int, name: bytes) -> None:
        self.l_parent.append(parent)
        self.l_ino.append(ino)
        self.l_name.append(name)

    def _skip(self, rel: bytes, e: OSError) -> None:
        self.skipped.append((rel, skip_reason(e.errno)))

    def _other(self, entry: os.DirEntry[bytes], rel: bytes, dino: int) -> None:
        """Record a directory entry that is neither a directory nor a regular file."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as e:
            self._skip(rel + b"/" + entry.name, e)
            return
        if st.st_nlink > 1:
            if st.st_ino in self.seen:
                self._link(dino, st.st_ino, entry.name)
                return
            self.seen.add(st.st_ino)
        self._record(st, 0, 0, 0)
        self._link(dino, st.st_ino, entry.name)

    def walk(
        self,
        top: bytes,
        top_rel: bytes,
        parent: int | None,
        name: bytes | None,
        defer: list[DirTask] | None = None,
    ) -> None:
        """Walk the tree below ``top`` (recording ``top`` itself under ``parent``/``name``).

        With ``defer``, only ``top`` is read and its subdirectories are appended to ``defer``.
        """
        stack: list[DirTask] = [(top, top_rel, parent, name)]
        sub_dirs = stack if defer is None else defer
        # The per-file path is inlined and its names bound locally: it runs once per file.
        o_flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
        ioctl = fcntl.ioctl
        fstat = os.fstat
        close = os.close
        opn = os.open
        seen = self.seen
        meta_extend = self.meta.extend
        counts_append = self.counts.append
        lp_append = self.l_parent.append
        li_append = self.l_ino.append
        ln_append = self.l_name.append
        raw = self.raw
        buf = self.buf
        gbuf = self.gbuf
        fbuf = self.fbuf
        batch = self.batch
        fflags = self.fflags
        pack_head = FIEMAP_HEAD.pack_into
        unpack_u32 = struct.Struct("<I").unpack_from
        is_reg = stat.S_ISREG
        ext_size = FIEMAP_EXT_SIZE
        max_off = FIEMAP_MAX_OFFSET
        req_fiemap = FS_IOC_FIEMAP
        req_version = FS_IOC_GETVERSION
        req_flags = FS_IOC_GETFLAGS
        birth = _HAS_BIRTHTIME
        progress = self.progress
        while stack:
            path, rel, par, nm = stack.pop()
            opened = self.open_dir(path, rel, par, nm)
            if opened is None:
                continue
            dfd, dino = opened
            try:
                try:
                    it = os.scandir(path)
                except OSError as e:
                    self._skip(rel + b"/", e)
                    continue
                with it:
                    for entry in sorted(it, key=_inode_of):  # as the C walk
                        ename = entry.name
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                sub_dirs.append((entry.path, rel + b"/" + ename, dino, ename))
                                continue
                            if not entry.is_file(follow_symlinks=False):
                                self._other(entry, rel, dino)
                                continue
                        except OSError as e:
                            self._skip(rel + b"/" + ename, e)
                            continue
                        eino = entry.inode()
                        if eino in seen:
                            lp_append(dino)
                            li_append(eino)
                            ln_append(ename)
                            continue
                        try:
                            fd = opn(ename, o_flags, dir_fd=dfd)
                        except OSError as e:
                            self._skip(rel + b"/" + ename, e)
                            continue
                        n = 0
                        try:
                            st = fstat(fd)
                            if not is_reg(st.st_mode):
                                self._skip(rel + b"/" + ename, OSError(errno.ENOENT, ""))
                                continue
                            gen = 0
                            if self.getversion:
                                try:
                                    ioctl(fd, req_version, gbuf, True)
                                    gen = unpack_u32(gbuf)[0]
                                except OSError:
                                    self.getversion = False
                            iflags = 0
                            if self.getflags:
                                try:
                                    ioctl(fd, req_flags, fbuf, True)
                                    iflags = unpack_u32(fbuf)[0]
                                except OSError:
                                    self.getflags = False
                            if st.st_size or st.st_blocks:
                                pack_head(buf, 0, 0, max_off, fflags, 0, batch, 0)
                                try:
                                    ioctl(fd, req_fiemap, buf, True)
                                    n = unpack_u32(buf, 20)[0]
                                    if n == batch:
                                        n = fiemap_into(fd, buf, batch, fflags, raw)
                                    elif n:
                                        raw += buf[32 : 32 + ext_size * n]
                                    self.fiemap_ok += 1
                                except OSError as e:
                                    n = 0
                                    if e.errno not in _NO_FIEMAP:
                                        self._skip(rel + b"/" + ename, e)
                                        continue
                                    self.no_fiemap.append(
                                        (rel + b"/" + ename, skip_reason(e.errno))
                                    )
                        finally:
                            close(fd)
                        ino = st.st_ino
                        if st.st_nlink > 1:
                            if ino in seen:  # another name was recorded while we looked
                                if n:
                                    del raw[len(raw) - n * ext_size :]
                                lp_append(dino)
                                li_append(ino)
                                ln_append(ename)
                                continue
                            seen.add(ino)
                        meta_extend(
                            (
                                ino,
                                gen,
                                st.st_mode,
                                st.st_nlink,
                                st.st_uid,
                                st.st_gid,
                                st.st_size,
                                st.st_atime_ns,
                                st.st_mtime_ns,
                                st.st_ctime_ns,
                                st.st_birthtime_ns if birth else 0,  # type: ignore[attr-defined]
                                iflags,
                            )
                        )
                        counts_append(n)
                        lp_append(dino)
                        li_append(ino)
                        ln_append(ename)
                        if progress is not None and not len(self.counts) & 0xFFF:
                            progress(len(self.counts))
            finally:
                close(dfd)


@dataclass
class WalkPart:
    """What one walk (or one worker) saw: the columns, ready to concatenate."""

    meta: npt.NDArray[np.int64]  # (n, _META_COLS)
    counts: npt.NDArray[np.int64]
    raw: npt.NDArray[np.void]  # FIEMAP_EXTENT_DTYPE, unmerged
    links: LinkTable
    skipped: list[tuple[bytes, str]]
    not_crossed: list[bytes]
    no_fiemap: list[tuple[bytes, str]]
    fiemap_ok: int


def part_of(w: PyWalk) -> WalkPart:
    return WalkPart(
        np.array(w.meta, dtype=np.int64).reshape(len(w.counts), _META_COLS),
        np.array(w.counts, dtype=np.int64),
        np.frombuffer(bytes(w.raw), FIEMAP_EXTENT_DTYPE),
        LinkTable.from_lists(w.l_parent, w.l_ino, w.l_name),
        w.skipped,
        w.not_crossed,
        w.no_fiemap,
        w.fiemap_ok,
    )


_WORKER_WALK: PyWalk | None = None  # the template a forked worker copies its settings from


def _inode_of(entry: os.DirEntry[bytes]) -> int:
    return entry.inode()


def _walk_tasks(tasks: list[DirTask]) -> WalkPart:
    tpl = _WORKER_WALK
    assert tpl is not None
    w = PyWalk(dev=tpl.dev, submounts=tpl.submounts, sync=tpl.sync, batch=tpl.batch)
    w.dir_fiemap, w.getversion, w.getflags = tpl.dir_fiemap, tpl.getversion, tpl.getflags
    for task in tasks:
        w.walk(*task)
    return part_of(w)


def walk_parallel(w: PyWalk, tasks: list[DirTask], workers: int) -> list[WalkPart]:
    """Walk ``tasks`` (whole subtrees) in ``workers`` forked processes."""
    import multiprocessing

    global _WORKER_WALK
    # Go down a level or two until there are enough subtrees to share out.
    for _ in range(2):
        if len(tasks) >= 2 * workers:
            break
        deeper: list[DirTask] = []
        for task in tasks:
            w.walk(*task, defer=deeper)
        tasks = deeper
    if not tasks:
        return []
    n_chunks = min(len(tasks), 8 * workers)
    chunks = [tasks[i::n_chunks] for i in range(n_chunks)]
    _WORKER_WALK = w
    try:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers) as pool:
            parts = []
            for part in pool.imap_unordered(_walk_tasks, chunks):
                parts.append(part)
                if w.progress is not None:
                    w.progress(len(w.counts) + sum(len(p.counts) for p in parts))
            return parts
    finally:
        _WORKER_WALK = None


def concat_links(tables: list[LinkTable]) -> LinkTable:
    if len(tables) == 1:
        return tables[0]
    offs: list[npt.NDArray[np.uint64]] = []
    base = 0
    for t in tables:
        offs.append(t.name_off[:-1] + np.uint64(base))
        base += len(t.names)
    offs.append(np.array([base], np.uint64))
    return LinkTable(
        np.concatenate([t.parent for t in tables]).astype(np.uint64),
        np.concatenate([t.ino for t in tables]).astype(np.uint64),
        np.concatenate(offs).astype(np.uint64),
        b"".join(t.names for t in tables),
    )


def merge_parts(parts: list[WalkPart]) -> WalkPart:
    """Concatenate parts; an inode several parts recorded (hard links) is kept once."""
    if len(parts) == 1:
        return parts[0]
    meta = np.concatenate([p.meta for p in parts])
    counts = np.concatenate([p.counts for p in parts])
    raw = np.concatenate([p.raw for p in parts])
    _, first = np.unique(meta[:, 0], return_index=True)
    if first.shape[0] < meta.shape[0]:
        keep = np.zeros(meta.shape[0], bool)
        keep[first] = True
        ext_keep = np.repeat(keep, counts)
        raw = raw[ext_keep]
        meta, counts = meta[keep], counts[keep]
    return WalkPart(
        meta,
        counts,
        raw,
        concat_links([p.links for p in parts]),
        [x for p in parts for x in p.skipped],
        [x for p in parts for x in p.not_crossed],
        [x for p in parts for x in p.no_fiemap],
        sum(p.fiemap_ok for p in parts),
    )


def files_of(part: WalkPart, block_size: int) -> FileTable:
    """The Python walk's columns as a FileTable (extents merged, in blocks), sorted by inode."""
    meta, counts = part.meta, part.counts
    n = int(counts.shape[0])
    ext_off, e_log, e_phys, e_len, e_flags = merge_extents(part.raw, counts, block_size)
    return FileTable(
        ino=meta[:, 0].astype(np.uint64),
        generation=meta[:, 1].astype(np.uint32),
        mode=meta[:, 2].astype(np.uint32),
        nlink=meta[:, 3].astype(np.uint32),
        uid=meta[:, 4].astype(np.uint32),
        gid=meta[:, 5].astype(np.uint32),
        size=meta[:, 6].astype(np.uint64),
        atime=meta[:, 7].copy(),
        mtime=meta[:, 8].copy(),
        ctime=meta[:, 9].copy(),
        crtime=meta[:, 10].copy(),
        flags=meta[:, 11].astype(np.uint32),
        damaged=np.zeros(n, np.uint32),
        ext_off=ext_off,
        ext_logical=e_log,
        ext_physical=e_phys,
        ext_length=e_len,
        ext_flags=e_flags,
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    ).sorted_by_ino()

"""The mounted-directory executor: runs ops through POSIX calls, writing real data.

Every path is resolved one component at a time from an open descriptor of the target root with
``O_NOFOLLOW``, so a symlink (planted or recorded) never leads outside the target. Data is a
fixed pseudo-random buffer (not zeros, so no file system can elide or compress it away), written
with ``write``/``pwrite`` — or, with ``data="fallocate"``, only allocated (Geriatrix's mode).
The ops and the directory descriptor cache run in C (``fsage/_posixexec.c``: one call per op,
its journal line included), with these semantics.

An op that fails leaves the file as it was (the journal and the ager's model then drop it): a
create removes what it made, an append or a truncate puts the old size back, and an overwrite
inside a file, which can run out of space half way (a hole it fills, an unwritten extent, a
copy-on-write extent), puts back the old bytes and holes of its range
(``fsage/_posixexec_undo.c``). Near full (or on btrfs) it keeps them first: the old bytes,
read into memory (an overwrite of written blocks in place needs no new space, so putting
them back succeeds); on btrfs, where the rewrite would be copy-on-write too, a clone of the
range's extents into an unnamed file (no data space), cloned back. Far from full nothing is
kept, so that an overwrite costs no read.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fsage import _posixexec
from fsage.errors import FsageError, UnsafeTargetError, WorkloadError
from fsage.workload import (
    SPECIAL_MODES,
    Executor,
    NoSpaceError,
    Op,
    OpFailedError,
    symlink_target,
)

_CHUNK = 1 << 20
#: The data written: pseudo-random, so no file system can elide or compress it away.
_DATA_BYTES = random.Random(0x5EED).randbytes(_CHUNK)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DIR_FDS = 256
#: How file data reaches the disk: written (the default: real data), or only allocated with
#: fallocate (unwritten extents, as Geriatrix ages).
DATA_MODES = ("write", "fallocate")

#: A directory's resume record lives beside it, as ``<directory>.fsage-age`` (never inside the
#: aged file system, where it would be one of its files); older runs kept it inside as this
#: dotfile, which still marks a directory as an fsage working directory.
MARKER = ".fsage-age"
RECORD_SUFFIX = ".fsage-age"
#: Names in a target root that do not count against "empty".
IGNORED_NAMES = frozenset({MARKER, "lost+found"})


class InFlightError(FsageError):
    """An op run ahead of the generator (``PosixExecutor.journaled(..., ahead=True)``) failed:
    it and the ops queued after it did not run. ``lost_ops`` and ``lost_bytes``: what the
    caller had counted for them."""

    lost_ops: int = 0
    lost_bytes: int = 0


class OpJournal(Protocol):
    """Where ``PosixExecutor.journaled`` appends the lines of the ops that took effect."""

    fd: int
    path: Path

    def add(self, op: Op) -> None: ...


def record_path_for(target: Path) -> Path:
    """Where the resume record of ``target`` (a directory or an image) lives: beside it."""
    return target.with_name(target.name + RECORD_SUFFIX)


_libc: ctypes.CDLL | None = None


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


_falloc: Any = None


def _libc_fn() -> ctypes.CDLL:
    global _libc, _falloc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _falloc = _libc.fallocate
    return _libc


def _fallocate(fd: int, mode: int, offset: int, size: int) -> None:
    if _falloc is None:
        _libc_fn()
    if _falloc(fd, mode, offset, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def punch_hole(fd: int, offset: int, size: int) -> None:
    """fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE): free the range, keep the size."""
    _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, size)


def _syncfs(fd: int) -> None:
    if _libc_fn().syncfs(fd) != 0:
        os.sync()


# ------------------------------------------------------------ one CPU, own writeback
#
# ext4 places small files (below mb_stream_req, 16 blocks) in the preallocation of a per-CPU
# locality group, and with delayed allocation it places data when its pages are written back.
# Run as it comes, the same op stream then gives other blocks each time: the executor's
# threads move between CPUs, and the flusher threads that write back (on a sync, and when the
# dirty data reaches half the free space) run on any CPU, at times of their own. So a mounted
# run keeps its threads on one CPU (the lowest it may use; the worker thread that runs ops
# ahead inherits it), and writes back the files it dirtied from that thread, in the order it
# dirtied them, waiting for the I/O: on every sync, and before what it wrote since reaches a
# quarter of the free space. What the kernel still decides on its own (data left dirty for
# 30 s, one op larger than half the free space, commits of the journal that make freed blocks
# free again) stays timing-dependent.


_pins = 0
_unpinned: set[int] | None = None


def _pin() -> None:
    """Keep the calling thread (and the threads it starts) on one CPU, the lowest it may use,
    until every executor that pinned it is closed."""
    global _pins, _unpinned
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = os.sched_getaffinity(0)
    if _pins == 0:
        _unpinned = cpus
    os.sched_setaffinity(0, {min(cpus)})
    _pins += 1


def _unpin() -> None:
    global _pins
    if _pins == 0:
        return
    _pins -= 1
    if _pins == 0 and _unpinned is not None:
        os.sched_setaffinity(0, _unpinned)


#: sync_file_range: wait for writeback under way, write, wait for it.
_SYNC_FILE_RANGE_WRITE_AND_WAIT = 7
#: ext4's own rule (``ext4_nonda_switch``): its flusher threads start writing back once the
#: dirty data is half of the free space, which counts the blocks reserved for it.
EXT4_WRITEBACK_SHARE = 0.5
#: Ops whose data ext4 allocates only on writeback.
_DIRTYING = frozenset({"create", "append", "overwrite"})
#: Ops that allocate at once, taking free space from the dirty data's share.
_ALLOCATING = frozenset({"fallocate", "allocate-near"})


#: Ops that make an inode.
_INODE_OPS = frozenset({"create", "mkdir", "symlink", "mknod"})


class PosixExecutor(Executor):
    """Runs ops below ``root`` (a directory, typically a mounted file system)."""

    def __init__(
        self,
        root: Path,
        *,
        fsync: bool = False,
        data: str = "write",
        writeback_share: float | None = None,
    ) -> None:
        if data not in DATA_MODES:
            raise WorkloadError(f"unknown data mode {data!r} (one of {', '.join(DATA_MODES)})")
        self.root = Path(root)
        self.fsync = fsync
        #: None: write back at a quarter of the free space found at the last writeback;
        #: a share: once the dirty data is that share of the free space now (``_due``).
        self.writeback_share = writeback_share
        #: "fallocate": creates and appends allocate their blocks instead of writing them.
        self.allocate_only = data == "fallocate"
        try:
            self._root_fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise UnsafeTargetError(f"cannot open target {root}: {exc.strerror}") from None
        self._clear_dirty()
        #: Bytes dirtied and fallocated since the last writeback, and the free space then.
        self._dirty_bytes = self._allocated = self._free = 0
        # The ops and the directory descriptor cache are in C (fsage/_posixexec.c); kinds it
        # does not run come back to ``_apply_other``.
        self._c = _posixexec.Executor(
            self._root_fd,
            _DATA_BYTES,
            self.allocate_only,
            fsync,
            _MAX_DIR_FDS,
            self._apply_other,
            (NoSpaceError, OpFailedError, UnsafeTargetError, FsageError, InFlightError),
            self._check_inodes,
        )
        st = os.fstatvfs(self._root_fd)
        self._free = st.f_bfree * st.f_frsize
        _pin()
        self.description = (
            f"mounted directory {self.root} through POSIX calls"
            + (" (fsync after every op)" if fsync else "")
            + (" (data allocated with fallocate, not written)" if self.allocate_only else "")
            + f", block size {st.f_frsize}"
        )

    @property
    def _dir_fds(self) -> list[str]:
        """The directories whose descriptors are cached, least recently used first."""
        return self._c.cached()

    def _split(self, path: str) -> tuple[int, str]:
        head, _, name = path.rpartition("/")
        return self._c.dir_fd(head), name

    # ------------------------------------------------------------------ ops

    def apply(self, op: Op) -> int:
        n = self._c.apply(op)
        self._track(op)
        return n

    def _clear_dirty(self) -> None:
        #: Files dirtied since the last writeback (``_track``): path -> its place in the
        #: writeback order, and place -> path (places only grow, so the dict keeps their
        #: order); a rename or a delete changes one entry rather than rebuilding the order.
        self._dirty: dict[str, int] = {}
        self._order: dict[int, str] = {}
        self._place = 0
        #: Directory -> dirty files below it: a rename of one moves them all.
        self._below: dict[str, int] = {}

    def _track(self, op: Op) -> None:
        """Keep the files ``op`` left dirty, in order; write them back before what they hold
        reaches a quarter of the free space (ext4 has its flusher threads write back once
        the dirty data is half of it), or with ``writeback_share`` when ``_due`` says."""
        kind = op.op
        if kind in _DIRTYING:
            self._dirtied(op.path)
            self._dirty_bytes += op.size
        elif kind in _ALLOCATING:
            self._allocated += op.size
        elif kind == "delete":
            place = self._dirty.pop(op.path, None)
            if place is not None:
                del self._order[place]
                self._count_below(op.path, -1)
        elif kind == "rename" and self._dirty:
            self._renamed(op.path, op.dest)
        if self._dirty and 4 * self._dirty_bytes + self._allocated >= self._free and self._due():
            self._write_back()

    def _due(self) -> bool:
        """Under ``writeback_share``: whether the dirty data has reached that share of the
        free space as it is now (the space deletes freed since the last writeback counted,
        the dirty data's reserved blocks in it as in ext4's counter); else always."""
        share = self.writeback_share
        if share is None:
            return True
        st = os.fstatvfs(self._root_fd)
        self._free = st.f_bfree * st.f_frsize + self._dirty_bytes
        return self._dirty_bytes + share * self._allocated >= share * self._free

    def _count_below(self, path: str, step: int) -> None:
        """Count ``path`` in (or, ``step`` -1, out of) each directory above it."""
        below = self._below
        i = path.find("/")
        while i >= 0:
            d = path[:i]
            below[d] = below.get(d, 0) + step
            i = path.find("/", i + 1)

    def _dirtied(self, path: str) -> None:
        """``path`` goes last in the writeback order (written again: moved there)."""
        place = self._dirty.pop(path, None)
        if place is None:
            self._count_below(path, 1)
        else:
            del self._order[place]
        self._last(path)

    def _last(self, path: str) -> None:
        self._dirty[path] = self._place
        self._order[self._place] = path
        self._place += 1

    def _renamed(self, src: str, dest: str) -> None:
        """``src`` is ``dest`` now, at its place in the writeback order; renamed over a dirty
        file, the one entry left takes the earlier of their places."""
        if self._below.get(src):
            self._renamed_tree(src, dest)
            return
        place = self._dirty.pop(src, None)
        if place is None:
            return
        self._count_below(src, -1)
        other = self._dirty.get(dest)
        if other is None:
            self._count_below(dest, 1)
        elif other < place:
            del self._order[place]
            place = other
        else:
            del self._order[other]
        self._dirty[dest] = place
        self._order[place] = dest

    def _renamed_tree(self, src: str, dest: str) -> None:
        """A directory renamed with dirty files below it: every path under ``src`` moves to
        ``dest``, the order rebuilt (a path met twice keeps its first place)."""
        head = src + "/"
        paths = [
            dest if p == src else dest + p[len(src) :] if p.startswith(head) else p
            for p in self._order.values()
        ]
        self._clear_dirty()
        for p in paths:
            if p not in self._dirty:
                self._count_below(p, 1)
                self._last(p)

    def _write_back(self) -> None:
        """Write back the files dirtied since the last writeback from this thread, so that
        delayed allocation runs here, and wait for it (the unwritten extents an overwrite
        filled are converted, merging extents and freeing extent blocks, when the I/O ends:
        not waited for, that happens among the next ops, at times of the kernel's)."""
        self._c.drain()
        sfr = _libc_fn().sync_file_range
        for path in self._order.values():
            try:
                dfd, name = self._split(path)
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except (OSError, FsageError):
                continue  # gone, or renamed with a directory above it
            try:
                sfr(fd, ctypes.c_int64(0), ctypes.c_int64(0), _SYNC_FILE_RANGE_WRITE_AND_WAIT)
            finally:
                os.close(fd)
        self._clear_dirty()
        self._dirty_bytes = self._allocated = 0
        st = os.fstatvfs(self._root_fd)
        self._free = st.f_bfree * st.f_frsize

    def journaled(self, journal: OpJournal, *, ahead: bool = False) -> Callable[[Op], int]:
        """``apply`` that also appends the op's line to ``journal`` once the op took effect,
        in the same C call (unless ``apply`` was replaced, by a subclass or a test's fault
        injection: then that ``apply`` runs, and ``journal.add``).

        ``ahead``: ops are queued to a worker thread that runs them while the caller generates
        the next ones. Only ops that cannot run out of space (their data and metadata fit in
        what the last ``capacity_blocks`` found free, less a margin) are queued; any other op
        runs at once, after the queue, so the caller hears of ENOSPC on the op that hit it.
        ``capacity_blocks``, ``sync`` and ``drain`` wait for the queue; a queued op that
        failed is raised there, or by the next call, as InFlightError."""
        if type(self).apply is not _APPLY_IN_C:

            def step(op: Op) -> int:
                n = self.apply(op)
                journal.add(op)
                return n

            return step
        if ahead:
            self._c.start(journal)
            run = functools.partial(self._c.submit, journal)
        else:
            run = functools.partial(self._c.apply_logged, journal)

        def tracked(op: Op) -> int:
            n = run(op)
            self._track(op)
            return n

        return tracked

    def drain(self) -> None:
        """Wait for the ops queued by a ``journaled(..., ahead=True)`` apply; raises
        InFlightError if one failed."""
        self._c.drain()

    @property
    def busy_s(self) -> float:
        """Seconds spent running ops (on this thread or the worker's: with ops run ahead, the
        time the executor worked, overlapped or not with generating the next ones)."""
        return self._c.busy_s

    def _apply_other(self, op: Op) -> int:
        """The kinds the C side leaves to Python (symlink, mknod, fsync, sync, snapshot)."""
        try:
            return self._apply(op)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                if op.op in _INODE_OPS:
                    self._check_inodes(op.op, op.path)
                raise NoSpaceError(f"{op.op} {op.path}: no space left") from None
            raise OpFailedError(f"{op.op} {op.path!r}: {exc.strerror}") from None

    def _check_inodes(self, kind: str, path: str) -> None:
        """An op that makes an inode failed for lack of space: when the inodes ran out (not
        the blocks), the ager, which steers by blocks, would delete and create again forever
        without reaching its fill; stop with the cause."""
        st = os.fstatvfs(self._root_fd)
        if st.f_files and not st.f_ffree:  # btrfs reports no inode count (f_files 0)
            full = 1 - st.f_bfree / st.f_blocks if st.f_blocks else 0.0
            raise OpFailedError(
                f"{kind} {path!r}: all {st.f_files:,} inodes of the file system are in use "
                f"at {full:.0%} full; a workload of this many small files needs a file system "
                "made with more inodes (mkfs.ext4 -T news, or -i BYTES_PER_INODE)"
            )

    def _apply(self, op: Op) -> int:
        kind = op.op
        if kind == "symlink":
            dfd, name = self._split(op.path)
            os.symlink(symlink_target(op), name, dir_fd=dfd)
            return 0
        if kind == "mknod":
            dfd, name = self._split(op.path)
            os.mknod(name, SPECIAL_MODES[op.label] | 0o644, 0, dir_fd=dfd)
            return 0
        if kind == "allocate-near":  # the kernel takes no hint where: a plain fallocate
            dfd, name = self._split(op.path)
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                os.posix_fallocate(fd, op.offset, op.size)
            finally:
                os.close(fd)
            return 0
        if kind == "fsync":
            dfd, name = self._split(op.path)
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return 0
        if kind == "sync":
            self.sync()
            return 0
        if kind == "snapshot":
            return 0
        raise WorkloadError(f"unknown op {kind!r}")

    def sync(self) -> None:
        self._c.drain()
        self._write_back()
        _syncfs(self._root_fd)

    def capacity_blocks(self) -> tuple[int, int, int]:
        self._c.drain()
        st = os.fstatvfs(self._root_fd)
        # What ops queued from now on may use: what an unprivileged writer has left, less a
        # margin (1% of the file system, at least 4 MiB) for what the estimate misses.
        total = st.f_blocks * st.f_frsize
        margin = max(total // 100, 4 << 20)
        inodes = st.f_favail - 64 if st.f_files else 1 << 62  # 0 files: no inode limit (btrfs)
        self._c.set_budget(st.f_bavail * st.f_frsize - margin, inodes)
        return st.f_frsize, st.f_blocks, st.f_blocks - st.f_bfree

    def close(self) -> None:
        if self._root_fd >= 0:
            self._c.stop()
            try:
                self.sync()
            finally:
                # After the sync: its writeback opens directories through the cache.
                self._c.drop()
                os.close(self._root_fd)
                self._root_fd = -1
                _unpin()


_APPLY_IN_C = PosixExecutor.apply


# ---------------------------------------------------------------------- target checks


def check_target_dir(path: Path, *, force: bool = False, record: Path | None = None) -> Path:
    """Refuse '/', a non-directory, and a directory that is neither empty nor an fsage working
    directory (its record ``record`` exists, or an older run's marker inside it) unless
    ``force``. Nothing is written into the directory. Returns the resolved path."""
    real = Path(os.path.realpath(path))
    if real == Path("/"):
        raise UnsafeTargetError("refusing to age '/'")
    if not real.is_dir():
        raise UnsafeTargetError(f"{path} is not a directory")
    try:
        names = set(os.listdir(real))
    except OSError as exc:
        raise UnsafeTargetError(f"cannot list {path}: {exc.strerror}") from None
    known = MARKER in names or (record is not None and record.exists())
    if names - IGNORED_NAMES and not known and not force:
        raise UnsafeTargetError(
            f"{path} is not empty and not an fsage working directory (use --force to age it anyway)"
        )
    marker = real / MARKER
    if marker.is_symlink():
        raise UnsafeTargetError(f"{marker} is a symlink")
    if record is not None and record.is_symlink():
        raise UnsafeTargetError(f"{record} is a symlink")
    return real

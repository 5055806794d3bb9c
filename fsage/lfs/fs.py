"""The log-structured file system of seed 003 on an image file: mkfs, open, file operations,
checkpoints, roll-forward and cleaning.

Writes go to the end of the log. A data block gets its address when it is put into the
current segment's buffer (a block of the same file still in the buffer is changed in place);
indirect blocks, directories, inodes (in the inode table file, 18), the inode vector (17) and
inode bitmap (16) are written when a *unit* is committed. Operations are buffered in memory
and committed together: on ``sync`` (fsync), when the changes waiting are older than
``commit_interval`` seconds or their metadata grows past ``_MAX_PENDING`` blocks, when clean
segments run short, at checkpoints and on close; a full segment is written as it fills. The order
inside a unit is: data, directory change records, directory files, indirect blocks,
inode-table/vector/bitmap blocks, their indirect blocks; the segment write that ends the unit
carries the commit flag (``format.SEGFLAG_COMMIT``). A crash loses the operations not yet
committed, whole. A checkpoint is written after every ``checkpoint_interval`` segments, every
``checkpoint_seconds`` and on close. Segments emptied after a checkpoint become clean only at
the next one, so roll-forward never meets a reused segment.

Address mapping for readers: a segment-block number ``(seg << 32) | blk`` is also given as the
linear block ``seg * blocks_per_segment + blk`` (``linear_block``).
"""

from __future__ import annotations

import dataclasses
import os
import stat as stat_mod
import time
import uuid as uuid_mod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from fsage import imagelock
from fsage.lfs import cleaner as cl
from fsage.lfs import format as fmt
from fsage.lfs.cleaning import _CleaningMixin
from fsage.lfs.common import LfsOpError, linear_block, now_ms
from fsage.lfs.data import _DataMixin
from fsage.lfs.dirs import _DirMixin
from fsage.lfs.fileops import Stat, _FileOpsMixin
from fsage.lfs.format import (
    INO_INOMAP,
    INO_INOTBL,
    INO_INOVEC,
    INO_ROOT,
    INO_UNLINKED,
    S_IFDIR,
    S_IFMT,
    S_IFREG,
    Geometry,
    LfsError,
)
from fsage.lfs.inodes import _InodeMixin
from fsage.lfs.log import _LogMixin
from fsage.lfs.savepoint import _SavepointMixin
from fsage.lfs.state import Inode, OpenOptions, Savepoint

__all__ = [
    "LFS",
    "Inode",
    "LfsOpError",
    "OpenOptions",
    "Stat",
    "linear_block",
    "mkfs",
    "now_ms",
]


def mkfs(
    path: str | os.PathLike[str],
    *,
    segments: int | None = None,
    size: int | None = None,
    blocks_per_segment: int = 256,
    block_size: int = 4096,
    sector_size: int = 512,
    cleaning_policy: str = "greedy",
    checkpoint_interval: int = 8,
) -> Geometry:
    """Make an empty LFS on ``path`` (created or overwritten): superblock, two checkpoints,
    a log holding the root directory (2), the unlinked directory (20) and the system files."""
    if block_size % sector_size:
        raise LfsError(f"block size {block_size} is not a multiple of sector size {sector_size}")
    seg_bytes = block_size * blocks_per_segment
    if segments is None:
        if size is None:
            raise LfsError("give a segment count or an image size")
        segments = size // seg_bytes
    geo = fmt.make_geometry(
        sector_size=sector_size,
        sectors_per_block=block_size // sector_size,
        blocks_per_segment=blocks_per_segment,
        segments=segments,
        disk_sectors=(size // sector_size) if size is not None else None,
        cleaning_policy=cleaning_policy,
        checkpoint_interval=checkpoint_interval,
    )
    geo = dataclasses.replace(geo, uuid=str(uuid_mod.uuid4()))
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LfsError(f"cannot create {p}: {exc.strerror}") from None
    try:
        # nothing is written while another command holds the image (a mount's server)
        key = imagelock.acquire(p, exclusive=True)
    except BaseException:
        os.close(fd)
        raise
    try:
        _write_empty(fd, geo)
    finally:
        os.close(fd)
    try:
        fs = LFS._create_fresh(p, geo)
        fs.close()
    finally:
        imagelock.release(key)
    return geo


def _write_empty(fd: int, geo: Geometry) -> None:
    os.ftruncate(fd, 0)
    os.ftruncate(fd, geo.image_size)  # block 0 is never touched: it stays a hole
    os.pwrite(fd, fmt.MAGIC, geo.block_size)
    os.pwrite(fd, fmt.superblock_bytes(geo), 2 * geo.block_size)


class LFS(
    _FileOpsMixin, _LogMixin, _DataMixin, _InodeMixin, _DirMixin, _SavepointMixin, _CleaningMixin
):
    """One open LFS image. Paths are '/'-separated, relative to the root ('' is the root)."""

    _lock_key: tuple[int, int] | None  # the image's lock (fsage.imagelock), held until close

    def __init__(self) -> None:  # use LFS.open / mkfs
        raise TypeError("use LFS.open(path)")

    # ------------------------------------------------------------------ open / close
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        policy: str | None = None,
        checkpoint_interval: int | None = None,
        readonly: bool = False,
        disk: cl.DiskModel | None = None,
        cache_segments: int = 16,
        commit_interval: float = 5.0,
        lock: bool = True,
    ) -> LFS:
        """Open an image. Changes are buffered in memory and reach the log in whole segments:
        when a segment fills, on ``sync``, every ``commit_interval`` seconds (0: after every
        operation), at checkpoints and on ``close``. A crash loses what was not committed.
        The image's lock (:mod:`fsage.imagelock`) is held until ``close``: exclusive, shared
        when ``readonly``; ``lock=False`` for a reader that the holder lets in (a mount's own
        image read between its checkpoints)."""
        opts = OpenOptions(
            policy,
            checkpoint_interval,
            disk or cl.DiskModel(),
            cache_segments,
            readonly,
            commit_interval=commit_interval,
        )
        key = imagelock.acquire(path, exclusive=not readonly) if lock else None
        self = object.__new__(cls)
        try:
            self._init_common(Path(path), opts)
        except BaseException:
            if key is not None:
                imagelock.release(key)
            raise
        self._lock_key = key  # released at close
        try:
            with fmt.damaged_as_error(str(path)):
                self._mount()
        except BaseException:
            self._unlock()
            os.close(self.fd)
            raise
        return self

    def _unlock(self) -> None:
        key = self._lock_key
        self._lock_key = None
        if key is not None:
            imagelock.release(key)

    @classmethod
    def _create_fresh(cls, path: Path, geo: Geometry) -> LFS:
        self = object.__new__(cls)
        self._init_common(path, OpenOptions())
        self.geo = geo
        self._setup_geo()
        self.cp_which = 1  # the first checkpoint goes to region 0
        self.clean = set(range(geo.first_log_segment, geo.segments))
        self._start_segment(self._alloc_segment())
        for ino in fmt.SYSTEM_FILES:
            self.sys[ino] = Inode(ino, S_IFREG | 0o600)
        self._sysdata = {INO_INOMAP: bytearray(), INO_INOVEC: bytearray(), INO_INOTBL: bytearray()}
        for i in range(fmt.FIRST_USER_INO):
            self._bitmap_set(i, True)
        t = now_ms()
        for ino in (INO_ROOT, INO_UNLINKED):
            inode = Inode(ino, S_IFDIR | 0o755, 1)
            inode.nlink = 2
            inode.mtime = inode.ctime = inode.atime = t
            self._icache[ino] = inode
            self._dirs[ino] = {}
            self._dirty_dirs.add(ino)
            self._mark(inode)
        self._checkpoint()
        return self

    def _init_common(self, path: Path, opts: OpenOptions) -> None:
        self.path = path
        self._lock_key = None
        self.opts = opts
        self.readonly = opts.readonly
        try:
            self.fd = os.open(path, os.O_RDONLY if opts.readonly else os.O_RDWR)
        except OSError as exc:
            raise LfsError(f"cannot open {path}: {exc.strerror}") from None
        self.closed = False
        self.sys: dict[int, Inode] = {}
        self._sysdata: dict[int, bytearray] = {}
        self._sys_dirty: dict[int, set[int]] = {
            INO_INOMAP: set(),
            INO_INOVEC: set(),
            INO_INOTBL: set(),
        }
        self._icache: dict[int, Inode] = {}
        self._dirty: dict[int, Inode] = {}
        self._dirs: dict[int, dict[str, int]] = {}
        self._dirty_dirs: set[int] = set()
        self._dirch: list[bytes] = []
        self._free_hint: int = fmt.FIRST_USER_INO
        self.counters = cl.Counters()
        self._cleaning = False
        self._last_stamp: int = 0
        self._segs_since_cp = 0
        self._seg_cache: OrderedDict[int, bytes] = OrderedDict()
        self._sum_crcs: OrderedDict[int, list[int]] = OrderedDict()
        self.damaged_sys: dict[tuple[int, int], str] = {}
        self.notes: list[str] = []
        self.rolled_forward = 0
        self.cur_seg = -1
        self.cp_next = -1
        self.cp_stamp: int = 0
        self.cur_pos = 0
        self.next_seg = -1
        self._last_flush_commit = False
        self._plug_summ: dict[int, fmt.Summary] = {}
        self.read_trace: Callable[[list[int]], None] | None = None
        self._dir_max = -1
        self._holeplug = False
        self._txn: Savepoint | None = None
        self._pending_since: float | None = None
        self._last_cp_time = time.monotonic()

    def _setup_geo(self) -> None:
        geo = self.geo
        self.bs = geo.block_size
        self.P = geo.pointers_per_block
        self.ndata = geo.data_blocks_per_segment
        self.live = [0] * geo.segments
        self.mtime = [0] * geo.segments
        self.policy = self.opts.policy or geo.cleaning_policy
        if self.policy not in cl.POLICIES:
            raise LfsError(f"unknown cleaning policy {self.policy!r}")
        self.cp_interval = self.opts.checkpoint_interval or geo.checkpoint_interval
        self._lw = max(4, geo.log_segments // 50)  # clean segments below which cleaning runs
        self._zero = bytes(self.bs)

    def _mount(self) -> None:
        where = str(self.path)
        size = os.fstat(self.fd).st_size
        self.geo = fmt.read_geometry(self.fd, size, where)
        self._setup_geo()
        which, cp, notes = fmt.preferred_checkpoint(self.fd, self.geo, where)
        self.notes.extend(notes)
        self.cp_which: int = which
        self.cp_stamp = cp.timestamp
        self.cp_next = cp.next_seg
        self._last_stamp = cp.timestamp
        for i, rec in enumerate(cp.segusage):
            self.live[i] = rec.nblks_live
            self.mtime[i] = rec.mtime
        for ino, simp in (
            (INO_INOMAP, cp.inode_inomap),
            (INO_INOVEC, cp.inode_inovec),
            (INO_INOTBL, cp.inode_inotbl),
        ):
            inode = Inode(ino, S_IFREG | 0o600, simp.ver)
            inode.size = simp.size
            if simp.size > size:
                raise LfsError(f"{where}: system file {ino} claims {simp.size} octets")
            inode.ptr = list(simp.blkptr)
            for a in inode.ptr:
                self._check_addr(a, f"checkpoint inode {ino}")
            self.sys[ino] = inode
        rolled = self._roll_forward(cp.next_seg)
        for ino in fmt.SYSTEM_FILES:
            self._sysdata[ino] = self._read_whole(self.sys[ino])
        if rolled:
            self.rolled_forward = len(rolled)
            self._recount_live(rolled)
        self.clean: set[int] = {
            s for s in range(self.geo.first_log_segment, self.geo.segments) if self.live[s] == 0
        }
        if not self.readonly:
            if rolled:
                self._start_segment(self._alloc_segment())
                self._checkpoint()
            elif self.live[cp.next_seg] == 0:
                self.clean.discard(cp.next_seg)
                self._start_segment(cp.next_seg)
            else:
                self._resume_segment(cp.next_seg)
            self._purge_unlinked()

    def _check_addr(self, addr: int, what: str) -> None:
        if addr and not self.geo.valid_data_addr(addr):
            raise LfsError(f"{self.path}: {what}: block pointer {addr:#x} outside the log")

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self.readonly:
                self._checkpoint()
        finally:
            self.closed = True
            os.close(self.fd)
            self._unlock()

    def __enter__(self) -> LFS:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None and not self.closed:
            self.closed = True
            os.close(self.fd)
            self._unlock()
            return
        self.close()

    def sync(self) -> None:
        """Commit and write the buffer (a partial segment write)."""
        self._commit()

    def checkpoint(self) -> None:
        self._checkpoint()

    def _purge_unlinked(self) -> None:
        d = self._dir(INO_UNLINKED)
        if not d:
            return
        for name in list(d):
            inode = self._iget(self._unlink_name(INO_UNLINKED, name))
            if inode.mode & S_IFMT != S_IFDIR:
                self._free_inode(inode)
        self._end_op()

    # ------------------------------------------------------------------ inspection
    def usage(self) -> tuple[int, int]:
        """(data blocks in the log, live blocks)."""
        total = self.geo.log_segments * self.ndata
        return total, sum(self.live[self.geo.first_log_segment :])

    def fix_usage_times(self, segments: Sequence[int]) -> None:
        """Set the usage-table time of ``segments`` to their newest block's (older fsage set
        it later after roll-forward and hole-plugging); the next checkpoint writes it."""
        for seg in segments:
            summ = fmt.read_summary(self.fd, self.geo, seg)
            self.mtime[seg] = max(
                (r.ctime for r in summ.recs if r is not None and r.btype != fmt.BT_SUMMARY),
                default=0,
            )
        self._checkpoint()

    def max_fullness(self) -> float:
        """The highest fraction of the log's data blocks live data can reach: an operation
        that writes needs the clean segments kept for deletes (``_reserve``) plus three of its
        own (see ``_ensure_space``), and the segment being written and the next one hold no
        old data."""
        log = self.geo.log_segments
        return max(0.0, (log - self._reserve() - 3 - 2) / log)

    def writable_blocks(self) -> int:
        """Blocks of new data the log can still take, as statfs's available blocks: those of
        the clean segments a write may take (``_ensure_space`` keeps ``_reserve`` and three
        back), and what cleaning can add from there, emptiest segments first: a segment's
        dead blocks less room for its live blocks and their metadata (a quarter as many
        again). Never more than ``max_fullness`` allows."""
        total, live_total = self.usage()
        nd = self.ndata
        free_now = (len(self.clean) - self._reserve() - 3) * nd  # below 0: cleaning must make up
        room = max(0, len(self.clean) - 1) * nd // 2
        gained = 0
        head = (self.cur_seg, self.next_seg)
        dirty = [
            self.live[s]
            for s in range(self.geo.first_log_segment, self.geo.segments)
            if s not in self.clean and s not in head
        ]
        for lv in sorted(dirty):
            moved = lv + (lv + 3) // 4  # its live blocks and their metadata
            if moved >= nd or moved > room:
                break
            room += nd - moved
            gained += nd - moved
        cap = int(self.max_fullness() * total) - live_total
        return max(0, min(free_now + gained, cap))

    def file_blocks(self, ino: int) -> Iterator[tuple[int, int, int]]:
        """(address, kind, offset) of every block of inode ``ino`` (see ``_walk``)."""
        inode = self.sys[ino] if ino in self.sys else self._iget(ino)
        return self._walk(inode)

    def inodes(self) -> Iterator[int]:
        """Every inode in use (root, unlinked directory and inodes >= 64)."""
        return self._used_inos()

    def directory(self, ino: int) -> dict[str, int]:
        return dict(self._dir(ino))

    def inode(self, ino: int) -> Inode:
        return self.sys[ino] if ino in self.sys else self._iget(ino)

    def system_data(self, ino: int) -> bytes:
        return bytes(self._sysdata[ino])

    def is_dir(self, ino: int) -> bool:
        return stat_mod.S_ISDIR(self._iget(ino).mode)

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fsage import imagelock
from fsage.lfs import cleaner as cl
from fsage.lfs import format as fmt
from fsage.lfs.cleaning import _CleaningMixin
from fsage.lfs.common import _RESERVE, LfsOpError, linear_block, now_ms
from fsage.lfs.data import _DataMixin
from fsage.lfs.dirs import _dir_file_size, _DirMixin
from fsage.lfs.format import (
    BT_DATA,
    INO_INOMAP,
    INO_INOTBL,
    INO_INOVEC,
    INO_ROOT,
    INO_UNLINKED,
    N_DIRECT,
    S_IFDIR,
    S_IFLNK,
    S_IFMT,
    S_IFREG,
    BlockRec,
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


@dataclass
class Stat:
    ino: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    blocks: int
    mtime_ms: int
    ctime_ms: int
    atime_ms: int
    version: int


def _plain(name: str) -> bool:
    """A name that linking can take without failing part way: valid UTF-8 (the directory
    change record's protocol buffer needs it) of at most 255 octets."""
    try:
        return len(name.encode("utf-8")) <= 255
    except UnicodeEncodeError:
        return False


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


class LFS(_LogMixin, _DataMixin, _InodeMixin, _DirMixin, _SavepointMixin, _CleaningMixin):
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
        self.notes: list[str] = []
        self.rolled_forward = 0
        self.cur_seg = -1
        self.cp_next = -1
        self.cp_stamp: int = 0
        self.cur_pos = 0
        self.next_seg = -1
        self._last_flush_commit = False
        self._plug_summ: dict[int, fmt.Summary] = {}
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

    # ------------------------------------------------------------------ public API
    # Each operation on a name has a form that takes the directory's inode and the name
    # (``*_at``, what the FUSE layer calls) and one that takes a path.
    def create(self, path: str, mode: int = 0o644) -> int:
        return self.create_at(*self._parent(path), mode)

    def create_at(self, dino: int, name: str, mode: int = 0o644) -> int:
        if name in self._dir(dino):
            raise LfsOpError(f"file exists: {name!r}")
        if _plain(name) and self._in_memory_ok():
            # Nothing below can fail once the directory's inode is at hand: no savepoint.
            self._iget(dino)
            ino = self._create(dino, name, mode)
            self._changed_in_memory()
            return ino
        with self.atomic(1):
            ino = self._create(dino, name, mode)
            self._end_op()
        return ino

    def _create(self, dino: int, name: str, mode: int) -> int:
        inode = self._alloc_inode(S_IFREG | (mode & 0o7777))
        inode.nlink = 1
        self._link(dino, name, inode.ino)
        return inode.ino

    def _regular(self, ino: int, what: str) -> Inode:
        inode = self._iget(ino)
        if inode.mode & S_IFMT != S_IFREG:
            raise LfsOpError(f"not a regular file: {what!r}")
        return inode

    def _in_memory_ok(self) -> bool:
        """Whether an operation whose changes stay in memory may skip its savepoint: it is
        not inside a group, no commit is due and the clean segments are not running short
        (so what it changes waits for a later commit, as everything buffered does). A commit
        that is due is made first, as ``sync`` would, before the operation changes anything:
        made inside the operation's savepoint instead, it would have to keep every inode
        waiting for it."""
        if (
            self._txn is not None
            or self.opts.commit_interval <= 0
            or len(self.clean) < 3 + self._lw
        ):
            return False
        if not self._commit_due():
            return True
        self._commit()
        return len(self.clean) >= 3 + self._lw and not self._commit_due()

    def write(self, path: str, offset: int, data: bytes | bytearray | memoryview) -> int:
        return self._write(self._regular(self._lookup(path), path), offset, data)

    def write_ino(self, ino: int, offset: int, data: bytes | bytearray | memoryview) -> int:
        """``write`` to inode ``ino``."""
        return self._write(self._regular(ino, f"inode {ino}"), offset, data)

    def _write(self, inode: Inode, offset: int, data: bytes | bytearray | memoryview) -> int:
        mv = memoryview(data)
        n = mv.nbytes
        # _in_memory_ok first: the commit it may make moves the segment buffer on.
        if n and self._in_memory_ok():
            more = (offset + n - 1) // self.bs - offset // self.bs  # blocks past the first
            if self.cur_pos + more < self.ndata and self.seq + more <= fmt.SEQ_MAX:
                if self._icache.get(inode.ino) is not inode:  # that commit dropped it
                    inode = self._iget(inode.ino)
                self._write_buffered(inode, offset, mv)
                return n
        nblk = -(-len(mv) // self.bs) + 1
        with self.atomic(nblk + nblk // 64 + 2):
            inode = self._iget(inode.ino)
            self._write_data(inode, offset, mv)  # one unit, however long
            inode.mtime = inode.ctime = now_ms()
            self._end_op()
        return len(mv)

    def _write_buffered(self, inode: Inode, offset: int, mv: memoryview) -> None:
        """A write whose new blocks all fit in the segment buffer, when no commit is due:
        everything that can fail (reading the block map and the old blocks it changes in
        part) comes before the first change, and the rest is in memory, so no savepoint is
        needed (the kernel's writeback cache sends a small file's pages as one such write)."""
        bs = self.bs
        end = offset + mv.nbytes
        first, last = offset // bs, (end - 1) // bs
        ct = time.time_ns() // 1_000_000
        # Per block: (block, offset in it, the piece of mv, its old address, whether that is
        # in the segment buffer and may be changed there, the old content if it is rewritten
        # in part and is not). Puts of earlier blocks leave what was in the buffer there.
        plan: list[tuple[int, int, memoryview, int, bool, bytes | None]] = []
        for blk in range(first, last + 1):
            lo = offset if blk == first else blk * bs
            hi = end if blk == last else (blk + 1) * bs
            # (past the direct blocks, _get_ptr reads and keeps the indirect blocks on the way)
            old = inode.ptr[blk] if blk < N_DIRECT else self._get_ptr(inode, blk)
            in_buffer = old != 0 and self._buffered(old, inode, blk)
            base = None
            if hi - lo < bs and old and not in_buffer:
                self._check_addr(old, f"inode {inode.ino} block pointer")
                base = self._read_block(old)
            if first == last:  # one block (most small writes): no plan to go through
                if in_buffer:
                    self._overwrite_in_buffer(old, lo - blk * bs, mv, ct)
                else:
                    self._write_block(inode, blk, lo - blk * bs, mv, old, in_buffer, base, ct)
                break
            plan.append((blk, lo - blk * bs, mv[lo - offset : hi - offset], old, in_buffer, base))
        for step in plan:
            self._write_block(inode, *step, ct)
        if end > inode.size:
            inode.size = end
        inode.mtime = inode.ctime = ct
        self._mark(inode)
        self._changed_in_memory()

    def _write_block(
        self,
        inode: Inode,
        blk: int,
        within: int,
        piece: memoryview,
        old: int,
        in_buffer: bool,
        base: bytes | None,
        ct: int,
    ) -> None:
        """One block of ``_write_buffered``: changed in the segment buffer, or put anew."""
        if in_buffer:
            self._overwrite_in_buffer(old, within, piece, ct)
            return
        if piece.nbytes == self.bs:
            data: bytes | bytearray | memoryview = piece
        else:
            block = bytearray(base) if base is not None else bytearray(self.bs)
            block[within : within + piece.nbytes] = piece
            data = block
        addr = self._put(data, BlockRec(BT_DATA, 0, inode.ino, inode.version, blk, ct))
        self._set_ptr(inode, blk, addr)

    def _changed_in_memory(self) -> None:
        """The end of an operation that took no savepoint (``_in_memory_ok``)."""
        if self._pending_since is None:
            self._pending_since = time.monotonic()
        self._after_op()

    def writev(
        self, path: str, pieces: Sequence[tuple[int, bytes | bytearray | memoryview]]
    ) -> int:
        """Several writes ``(offset, data)`` to one file as one unit: they reach the log
        together, with one commit, as writes followed by a sync would. Pieces are limited to
        what one cleaning step can make room for (32 segments); returns the octets written."""
        inode = self._iget(self._lookup(path))
        if inode.mode & S_IFMT != S_IFREG:
            raise LfsOpError(f"not a regular file: {path!r}")
        nblocks = sum(-(-len(d) // self.bs) + 1 for _, d in pieces)
        if nblocks > 32 * self.ndata:
            raise LfsOpError(f"writev of {nblocks} blocks: at most {32 * self.ndata}")
        with self.atomic(nblocks + 2):
            inode = self._iget(inode.ino)
            for off, d in pieces:
                self._write_data(inode, off, d)
            inode.mtime = inode.ctime = now_ms()
            self._end_op()
        return sum(len(d) for _, d in pieces)

    def append(self, path: str, data: bytes | bytearray | memoryview) -> int:
        return self.write(path, self.stat(path).size, data)

    def read(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        return self._read(self._lookup(path), offset, size, path)

    def read_ino(self, ino: int, offset: int = 0, size: int = -1) -> bytes:
        """``read`` of inode ``ino``."""
        return self._read(ino, offset, size, f"inode {ino}")

    def _read(self, ino: int, offset: int, size: int, what: str) -> bytes:
        inode = self._iget(ino)
        if inode.mode & S_IFMT == S_IFDIR:
            raise LfsOpError(f"is a directory: {what!r}")
        if size < 0:
            size = inode.size
        return self._read_data(inode, offset, size)

    def truncate(self, path: str, size: int) -> None:
        self._truncate(self._regular(self._lookup(path), path), size)

    def truncate_ino(self, ino: int, size: int) -> None:
        """``truncate`` of inode ``ino``."""
        self._truncate(self._regular(ino, f"inode {ino}"), size)

    def _truncate(self, inode: Inode, size: int) -> None:
        # Shrinking frees blocks: like a delete it may use the clean segments kept back.
        with self.atomic(4 if size > inode.size else 0):
            inode = self._iget(inode.ino)
            if size > inode.size:
                inode.size = size  # a hole; reads give zeros
                inode.mtime = inode.ctime = now_ms()
                self._mark(inode)
            else:
                self._truncate_inode(inode, size)
            self._end_op()

    def unlink(self, path: str) -> None:
        self.unlink_at(*self._parent(path))

    def unlink_at(self, dino: int, name: str) -> None:
        if name not in self._dir(dino):
            raise LfsOpError(f"no such file: {name!r}")
        inode = self._iget(self._dirs[dino][name])
        if inode.mode & S_IFMT == S_IFDIR:
            raise LfsOpError(f"is a directory: {name!r}")
        if (
            inode.body is not None or not (any(inode.ptr[N_DIRECT:]) or inode.tree)
        ) and self._in_memory_ok():
            # No indirect blocks to read or write: nothing below can fail once the
            # directory's inode is at hand, so no savepoint.
            self._iget(dino)
            self._unlink(dino, name, inode.ino)
            self._changed_in_memory()
            return
        with self.atomic():
            self._unlink(dino, name, inode.ino)
            self._end_op()

    def _unlink(self, dino: int, name: str, ino: int) -> None:
        self._unlink_name(dino, name)
        inode = self._iget(ino)
        inode.nlink -= 1
        inode.ctime = now_ms()
        if inode.nlink <= 0:
            self._free_inode(inode)
        else:
            self._mark(inode)

    def mkdir(self, path: str, mode: int = 0o755) -> int:
        return self.mkdir_at(*self._parent(path), mode)

    def mkdir_at(self, dino: int, name: str, mode: int = 0o755) -> int:
        if name in self._dir(dino):
            raise LfsOpError(f"file exists: {name!r}")
        with self.atomic(1):
            inode = self._alloc_inode(S_IFDIR | (mode & 0o7777))
            inode.nlink = 2
            self._dirs[inode.ino] = {}
            self._dirty_dirs.add(inode.ino)
            self._link(dino, name, inode.ino)
            parent = self._iget(dino)
            parent.nlink += 1
            self._end_op()
        return inode.ino

    def rmdir(self, path: str) -> None:
        self.rmdir_at(*self._parent(path))

    def rmdir_at(self, dino: int, name: str) -> None:
        if name not in self._dir(dino):
            raise LfsOpError(f"no such directory: {name!r}")
        inode = self._iget(self._dirs[dino][name])
        if inode.mode & S_IFMT != S_IFDIR:
            raise LfsOpError(f"not a directory: {name!r}")
        if self._dir(inode.ino):
            raise LfsOpError(f"directory not empty: {name!r}")
        with self.atomic():
            self._unlink_name(dino, name)
            parent = self._iget(dino)
            parent.nlink -= 1
            self._dirty_dirs.discard(inode.ino)
            self._free_inode(self._iget(inode.ino))
            self._end_op()

    def rename(self, src: str, dst: str) -> None:
        sd, sname = self._parent(src)
        if sname not in self._dirs[sd]:
            raise LfsOpError(f"no such file or directory: {src!r}")
        dd, dname = self._parent(dst)
        ino = self._dirs[sd][sname]
        inode = self._iget(ino)
        is_dir = inode.mode & S_IFMT == S_IFDIR
        if is_dir:
            # Refuse moving a directory below itself.
            sp, dp = self._parts(src), self._parts(dst)
            if dp[: len(sp)] == sp:
                raise LfsOpError(f"cannot move {src!r} inside itself")
        if (sd, sname) == (dd, dname):
            return
        with self.atomic(1):
            self._rename(sd, sname, dd, dname, ino, is_dir, dst)
            self._end_op()

    def _rename(
        self, sd: int, sname: str, dd: int, dname: str, ino: int, is_dir: bool, dst: str
    ) -> None:
        if dname in self._dir(dd):
            victim = self._iget(self._dir(dd)[dname])
            if victim.mode & S_IFMT == S_IFDIR:
                if not is_dir or self._dir(victim.ino):
                    raise LfsOpError(f"cannot replace directory {dst!r}")
                self._unlink_name(dd, dname)
                self._iget(dd).nlink -= 1
                self._dirty_dirs.discard(victim.ino)
                self._free_inode(victim)
            else:
                if is_dir:
                    raise LfsOpError(f"cannot replace file {dst!r} with a directory")
                self._unlink_name(dd, dname)
                victim.nlink -= 1
                if victim.nlink <= 0:
                    self._free_inode(victim)
                else:
                    self._mark(victim)
        self._unlink_name(sd, sname)
        self._link(dd, dname, ino)
        if is_dir and sd != dd:
            self._iget(sd).nlink -= 1
            self._iget(dd).nlink += 1
            self._mark(self._iget(sd))
            self._mark(self._iget(dd))
        inode = self._iget(ino)
        inode.ctime = now_ms()
        self._mark(inode)

    def symlink(self, target: str, path: str) -> int:
        dino, name = self._parent(path)
        if name in self._dirs[dino]:
            raise LfsOpError(f"file exists: {path!r}")
        raw = target.encode("utf-8", "surrogateescape")
        with self.atomic(len(raw) // self.bs + 1):
            inode = self._alloc_inode(S_IFLNK | 0o777)
            inode.nlink = 1
            if len(raw) <= fmt.BODY_MAX:
                inode.body = raw
                inode.size = len(raw)
            else:
                self._write_data(inode, 0, raw)
            self._link(dino, name, inode.ino)
            self._end_op()
        return inode.ino

    def readlink(self, path: str) -> str:
        inode = self._iget(self._lookup(path))
        if inode.mode & S_IFMT != S_IFLNK:
            raise LfsOpError(f"not a symbolic link: {path!r}")
        return self._read_data(inode, 0, inode.size).decode("utf-8", "surrogateescape")

    def link(self, existing: str, path: str) -> None:
        inode = self._iget(self._lookup(existing))
        if inode.mode & S_IFMT == S_IFDIR:
            raise LfsOpError("hard links to directories are not allowed")
        dino, name = self._parent(path)
        if name in self._dirs[dino]:
            raise LfsOpError(f"file exists: {path!r}")
        with self.atomic():
            inode = self._iget(inode.ino)
            inode.nlink += 1
            inode.ctime = now_ms()
            self._mark(inode)
            self._link(dino, name, inode.ino)
            self._end_op()

    def stat(self, path: str) -> Stat:
        return self.stat_ino(self._lookup(path))

    def lookup(self, dino: int, name: str) -> Stat | None:
        """The attributes of ``name`` in directory ``dino``; None if it has no such name."""
        ino = self._dir(dino).get(name)
        return None if ino is None else self.stat_ino(ino)

    def stat_ino(self, ino: int) -> Stat:
        i = self._iget(ino)
        size, blocks = i.size, i.blocks
        if ino in self._dirty_dirs:  # what the next commit will write (``_write_dir``)
            size = _dir_file_size(self._dirs[ino])
            blocks = -(-size // self.bs)
        return Stat(
            i.ino,
            i.mode,
            i.nlink,
            i.uid,
            i.gid,
            size,
            blocks,
            i.mtime,
            i.ctime,
            i.atime,
            i.version,
        )

    def exists(self, path: str) -> bool:
        try:
            self._lookup(path)
        except LfsOpError:
            return False
        return True

    def readdir(self, path: str = "") -> list[tuple[str, int]]:
        ino = self._lookup(path)
        if self._iget(ino).mode & S_IFMT != S_IFDIR:
            raise LfsOpError(f"not a directory: {path!r}")
        return list(self._dir(ino).items())

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
        that writes needs ``_RESERVE`` clean segments kept back plus three of its own (see
        ``_ensure_space``), and the segment being written and the next one hold no old data."""
        log = self.geo.log_segments
        return max(0.0, (log - _RESERVE - 3 - 2) / log)

    def writable_blocks(self) -> int:
        """Blocks of new data the log can still take, as statfs's available blocks: those of
        the clean segments a write may take (``_ensure_space`` keeps ``_RESERVE`` and three
        back), and what cleaning can add from there, emptiest segments first: a segment's
        dead blocks less room for its live blocks and their metadata (a quarter as many
        again). Never more than ``max_fullness`` allows."""
        total, live_total = self.usage()
        nd = self.ndata
        free_now = (len(self.clean) - _RESERVE - 3) * nd  # below 0: cleaning must make up
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

    # ------------------------------------------------------------------ for the FUSE layer
    # (fsage/lfs/mount.py): attribute changes that POSIX has and the operations above do not.
    def setattr(
        self,
        path: str,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ms: int | None = None,
        mtime_ms: int | None = None,
    ) -> Stat:
        """chmod (permission bits of ``mode``), chown and utimens in one unit; the change
        time becomes now. Returns the new attributes."""
        return self.setattr_ino(self._lookup(path), mode, uid, gid, atime_ms, mtime_ms)

    def setattr_ino(
        self,
        ino: int,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ms: int | None = None,
        mtime_ms: int | None = None,
        size: int | None = None,
    ) -> Stat:
        """``setattr`` of inode ``ino``; with ``size``, a truncate too, in the same
        operation (both or neither)."""
        self._iget(ino)  # the only step that can fail, before any change
        change = (mode, uid, gid, atime_ms, mtime_ms)
        if size is not None:
            inode = self._regular(ino, f"inode {ino}")
            with self.atomic(4 if size > inode.size else 0):
                self._truncate(inode, size)
                self._set_attrs(self._iget(ino), *change)
            return self.stat_ino(ino)
        if self._in_memory_ok():
            # Got again: a commit made first may have dropped the inode from the cache.
            self._set_attrs(self._iget(ino), *change)
            self._changed_in_memory()
        else:
            with self.atomic(1):
                self._set_attrs(self._iget(ino), *change)
                self._end_op()
        return self.stat_ino(ino)

    def _set_attrs(
        self,
        inode: Inode,
        mode: int | None,
        uid: int | None,
        gid: int | None,
        atime_ms: int | None,
        mtime_ms: int | None,
    ) -> None:
        if mode is not None:
            inode.mode = (inode.mode & S_IFMT) | (mode & 0o7777)
        if uid is not None:
            inode.uid = uid
        if gid is not None:
            inode.gid = gid
        if atime_ms is not None:
            inode.atime = atime_ms
        if mtime_ms is not None:
            inode.mtime = mtime_ms
        inode.ctime = now_ms()
        self._mark(inode)

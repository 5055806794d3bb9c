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

import contextlib
import dataclasses
import os
import stat as stat_mod
import struct
import time
import uuid as uuid_mod
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from fsage.errors import FsageError
from fsage.lfs import cleaner as cl
from fsage.lfs import format as fmt
from fsage.lfs import lfs_pb2
from fsage.lfs.format import (
    BT_DATA,
    BT_DIRCH,
    BT_INDIRECT,
    INO_INOMAP,
    INO_INOTBL,
    INO_INOVEC,
    INO_ROOT,
    INO_UNLINKED,
    N_BLKPTR,
    N_DIRECT,
    S_IFDIR,
    S_IFLNK,
    S_IFMT,
    S_IFREG,
    BlockRec,
    Geometry,
    LfsError,
    LfsNoSpace,
)

_NAMED_SYSTEM = (INO_ROOT, INO_UNLINKED)
#: Clean segments that writes of new data never take: they are left for the metadata that
#: deletes commit and for the cleaner's output, so a full log can still shrink.
_RESERVE = 2
#: Metadata blocks (estimated) that may wait in memory for a commit.
_MAX_PENDING = 1024


class LfsOpError(FsageError):
    """A file operation that cannot be done (no such file, not empty, exists...)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def linear_block(geo: Geometry, addr: int) -> int:
    seg, blk = fmt.sbn_split(addr)
    return seg * geo.blocks_per_segment + blk


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


class _Node:
    __slots__ = ("addr", "dirty", "ptrs")

    def __init__(self, ptrs: list[int], addr: int) -> None:
        self.ptrs = ptrs
        self.addr = addr
        self.dirty = False


class Inode:
    __slots__ = (
        "atime",
        "blocks",
        "body",
        "ctime",
        "dirty",
        "gid",
        "ino",
        "mode",
        "mtime",
        "nlink",
        "ptr",
        "size",
        "tree",
        "tree_dirty",
        "uid",
        "version",
    )

    def __init__(self, ino: int, mode: int = 0, version: int = 0) -> None:
        self.ino = ino
        self.mode = mode
        self.nlink = 0
        self.uid = 0
        self.gid = 0
        self.size = 0
        self.blocks = 0
        self.mtime = 0
        self.ctime = 0
        self.atime = 0
        self.ptr = [0] * N_BLKPTR
        self.body: bytes | None = None
        self.version = version
        self.tree: dict[tuple[int, int], _Node] = {}
        self.tree_dirty = False
        self.dirty = False


def _varint_len(n: int) -> int:
    return max(1, -(-n.bit_length() // 7))


def _dir_file_size(d: dict[str, int]) -> int:
    """Octets of a directory file holding ``d`` (seed 003 §2.7: a length-prefixed DirFile of
    DirFileRec{ino, name}), without encoding it."""
    total = 4
    for name, ino in d.items():
        n = len(name.encode("utf-8", "surrogateescape"))
        rec = 2 + _varint_len(ino) + _varint_len(n) + n
        total += 1 + _varint_len(rec) + rec
    return total


def _simp(inode: Inode) -> lfs_pb2.InodeSimp:
    return lfs_pb2.InodeSimp(size=inode.size, blkptr=list(inode.ptr), ver=inode.version)


def _clone_inode(inode: Inode) -> Inode:
    c = Inode(inode.ino, inode.mode, inode.version)
    for name in Inode.__slots__:
        setattr(c, name, getattr(inode, name))
    c.ptr = list(inode.ptr)
    c.tree = {}
    for key, node in inode.tree.items():
        n = _Node(list(node.ptrs), node.addr)
        n.dirty = node.dirty
        c.tree[key] = n
    return c


@dataclass
class _Savepoint:
    """What an operation may change in memory, taken before it starts (see ``LFS.atomic``).
    System-file blocks are saved as they are first changed (``sys_blocks``)."""

    live: list[int]
    mtime: list[int]
    clean: set[int]
    sys: dict[int, Inode]
    sys_len: dict[int, int]
    free_hint: int
    cur_seg: int
    cur_pos: int
    flushed_pos: int
    seq: int
    buf: bytearray
    recs: list[BlockRec | None]
    next_seg: int
    seg_flags: int
    last_flush_commit: bool
    segs_since_cp: int
    dirty: dict[int, Inode]
    dirty_dirs: set[int]
    dirch: list[bytes]
    sys_dirty: dict[int, set[int]]
    pending_since: float | None
    sys_blocks: dict[tuple[int, int], bytes] = field(default_factory=dict)
    #: Inodes (and directory tables) as they were when the operation first touched them:
    #: a clone if they had changes not yet committed, None if the inode table has them.
    inodes: dict[int, tuple[Inode | None, dict[str, int] | None]] = field(default_factory=dict)
    #: Blocks of the segment buffer overwritten in place: their content before.
    buf_blocks: dict[int, bytes] = field(default_factory=dict)


@dataclass
class OpenOptions:
    policy: str | None = None
    checkpoint_interval: int | None = None
    disk: cl.DiskModel = field(default_factory=cl.DiskModel)
    cache_segments: int = 16
    readonly: bool = False
    #: Seconds changes may wait in memory before they are committed to the log (0: commit
    #: after every operation).
    commit_interval: float = 5.0
    #: Seconds between checkpoints (besides every ``checkpoint_interval`` segments).
    checkpoint_seconds: float = 30.0


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
        os.ftruncate(fd, 0)
        os.ftruncate(fd, geo.image_size)  # block 0 is never touched: it stays a hole
        os.pwrite(fd, fmt.MAGIC, block_size)
        os.pwrite(fd, fmt.superblock_bytes(geo), 2 * block_size)
    finally:
        os.close(fd)
    fs = LFS._create_fresh(p, geo)
    fs.close()
    return geo


class LFS:
    """One open LFS image. Paths are '/'-separated, relative to the root ('' is the root)."""

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
    ) -> LFS:
        """Open an image. Changes are buffered in memory and reach the log in whole segments:
        when a segment fills, on ``sync``, every ``commit_interval`` seconds (0: after every
        operation), at checkpoints and on ``close``. A crash loses what was not committed."""
        opts = OpenOptions(
            policy,
            checkpoint_interval,
            disk or cl.DiskModel(),
            cache_segments,
            readonly,
            commit_interval=commit_interval,
        )
        self = object.__new__(cls)
        self._init_common(Path(path), opts)
        try:
            with fmt.damaged_as_error(str(path)):
                self._mount()
        except BaseException:
            os.close(self.fd)
            raise
        return self

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
        self._free_hint = fmt.FIRST_USER_INO
        self.counters = cl.Counters()
        self._cleaning = False
        self._last_stamp = 0
        self._segs_since_cp = 0
        self._seg_cache: OrderedDict[int, bytes] = OrderedDict()
        self.notes: list[str] = []
        self.rolled_forward = 0
        self.cur_seg = -1
        self.cp_next = -1
        self.cp_stamp = 0
        self.cur_pos = 0
        self.next_seg = -1
        self._last_flush_commit = False
        self._plug_summ: dict[int, fmt.Summary] = {}
        self._holeplug = False
        self._txn: _Savepoint | None = None
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
        self.cp_which = which
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
        self.clean = {
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

    def __enter__(self) -> LFS:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None and not self.closed:
            self.closed = True
            os.close(self.fd)
            return
        self.close()

    # ------------------------------------------------------------------ roll-forward
    def _roll_forward(self, seg: int) -> list[int]:
        """Seed 003 §2.4.1: follow next-segment pointers from the checkpoint's next segment
        while each summary's timestamp grows; apply the system-file blocks of complete units."""
        rolled: list[int] = []
        committed = 0
        last = self.cp_stamp
        pending: list[tuple[int, int, int]] = []
        seen: set[int] = set()
        geo = self.geo
        while geo.first_log_segment <= seg < geo.segments and seg not in seen:
            seen.add(seg)
            try:
                summ = fmt.read_summary(self.fd, geo, seg)
            except LfsError:
                break
            if summ.stamp <= last:
                break
            last = summ.stamp
            rolled.append(seg)
            recs = sorted(
                ((r.seq, i, r) for i, r in enumerate(summ.recs) if r is not None),
                key=lambda t: t[0],
            )
            has_commit = bool(summ.flags & fmt.SEGFLAG_COMMIT)
            count = summ.flags & fmt.SEGFLAG_COUNT
            applied = False
            for sq, blk, r in recs:
                if has_commit and not applied and sq >= count:
                    self._apply_rolled(pending, seg)
                    applied = True
                if r.btype == BT_DATA and r.ino in self.sys:
                    pending.append((r.ino, r.offset, fmt.sbn(seg, blk)))
            if has_commit:
                if not applied:
                    self._apply_rolled(pending, seg)
                committed = len(rolled)
                self._last_stamp = max(self._last_stamp, summ.stamp)
            seg = summ.next_seg
        return rolled[:committed]

    def _apply_rolled(self, pending: list[tuple[int, int, int]], seg: int) -> None:
        for ino, off, addr in pending:
            inode = self.sys[ino]
            if off > 1 << 24:
                raise LfsError(f"{self.path}: summary of segment {seg}: offset {off}")
            self._set_ptr(inode, off, addr, account=False)
            inode.size = max(inode.size, (off + 1) * self.bs)
            if inode.size > self.geo.image_size:
                raise LfsError(f"{self.path}: segment {seg}: system file too large")
        pending.clear()

    def _recount_live(self, rolled: list[int]) -> None:
        """After roll-forward: live blocks per segment from a walk of every reachable block."""
        live = [0] * self.geo.segments
        for ino in fmt.SYSTEM_FILES:
            for addr, _, _ in self._walk(self.sys[ino]):
                live[addr >> 32] += 1
        for ino in self._used_inos():
            inode = self._iget(ino)
            for addr, _, _ in self._walk(inode):
                live[addr >> 32] += 1
        self.live = live
        for seg in rolled:
            summ = fmt.read_summary(self.fd, self.geo, seg)
            self.mtime[seg] = max(self.mtime[seg], summ.stamp)

    # ------------------------------------------------------------------ segments
    def _stamp(self) -> int:
        self._last_stamp = max(now_ms(), self._last_stamp + 1)
        return self._last_stamp

    def _alloc_segment(self) -> int:
        if not self.clean:
            raise LfsNoSpace(f"{self.path}: no clean segment left (the file system is full)")
        cur = self.cur_seg
        after = [s for s in self.clean if s > cur]
        seg = min(after) if after else min(self.clean)
        self.clean.discard(seg)
        self.mtime[seg] = 0  # a reused segment's data time starts over (seed 003 §2.3.2)
        return seg

    def _start_segment(self, seg: int) -> None:
        self.cur_seg = seg
        self.cur_pos = 0
        self.flushed_pos = 0
        self.seq = 0
        self.buf = bytearray(self.geo.segment_size)
        self.recs: list[BlockRec | None] = [None] * self.ndata
        self.next_seg = -1
        self._seg_flags = 0
        self._last_flush_commit = False

    def _resume_segment(self, seg: int) -> None:
        summ = fmt.read_summary(self.fd, self.geo, seg)
        self._start_segment(seg)
        used = [i for i, r in enumerate(summ.recs) if r is not None]
        self.cur_pos = self.flushed_pos = (max(used) + 1) if used else 0
        self.recs = list(summ.recs)
        self.seq = max((r.seq for r in summ.recs if r is not None), default=-1) + 1
        self._seg_flags = summ.flags
        self.buf[: self.cur_pos * self.bs] = os.pread(
            self.fd, self.cur_pos * self.bs, self.geo.seg_offset(seg)
        )

    def _put(self, data: bytes | bytearray | memoryview, rec: BlockRec) -> int:
        if self.cur_pos >= self.ndata or self.seq > fmt.SEQ_MAX:
            self._seal()
        pos = self.cur_pos
        off = pos * self.bs
        n = len(data)
        self.buf[off : off + n] = data
        if n < self.bs:
            self.buf[off + n : off + self.bs] = self._zero[: self.bs - n]
        rec.seq = self.seq
        self.seq += 1
        self.recs[pos] = rec
        self.cur_pos = pos + 1
        seg = self.cur_seg
        if rec.btype != BT_DIRCH:  # change records are dead once their unit is committed
            self.live[seg] += 1
        if rec.ctime > self.mtime[seg]:
            self.mtime[seg] = rec.ctime
        if self._cleaning:
            self.counters.clean_blocks_written += 1
        else:
            self.counters.new_blocks += 1
        return (seg << 32) | pos

    def _die(self, addr: int) -> None:
        if addr:
            self.live[addr >> 32] -= 1

    def _flush(self, commit: bool) -> None:
        """Write the buffered blocks and the summary of the current segment."""
        if self.cur_pos == self.flushed_pos and (not commit or self._last_flush_commit):
            return
        self._last_flush_commit = commit
        if self.next_seg < 0:
            self.next_seg = self._alloc_segment()
        base = self.geo.seg_offset(self.cur_seg)
        a, b = self.flushed_pos * self.bs, self.cur_pos * self.bs
        if b > a:
            os.pwrite(self.fd, memoryview(self.buf)[a:b], base + a)
        if commit:
            self._seg_flags = fmt.SEGFLAG_COMMIT | self.seq
        summ = fmt.pack_summary(self.geo, self.recs, self.next_seg, self._stamp(), self._seg_flags)
        os.pwrite(self.fd, summ, base + self.ndata * self.bs)
        if b > a:
            if self._cleaning:
                self.counters.clean_requests += 1
            else:
                self.counters.new_requests += 1
        self.flushed_pos = self.cur_pos

    def _seal(self) -> None:
        """The current segment is full: write it and move to the next one."""
        self._flush(commit=False)
        self._seg_cache[self.cur_seg] = bytes(self.buf)
        while len(self._seg_cache) > self.opts.cache_segments:
            self._seg_cache.popitem(last=False)
        if self._cleaning:
            self.counters.clean_segments += 1
        else:
            self.counters.new_segments += 1
        self._segs_since_cp += 1
        nxt = self.next_seg
        self._start_segment(nxt)

    def _read_block(self, addr: int) -> bytes:
        seg, blk = addr >> 32, addr & 0xFFFFFFFF
        if seg == self.cur_seg and blk < self.cur_pos and not self.closed:
            return bytes(self.buf[blk * self.bs : (blk + 1) * self.bs])
        cached = self._seg_cache.get(seg)
        if cached is not None:
            return cached[blk * self.bs : (blk + 1) * self.bs]
        data = os.pread(self.fd, self.bs, self.geo.addr_offset(addr))
        if len(data) < self.bs:
            raise LfsError(f"{self.path}: truncated image: block {addr:#x} cut off")
        return data

    # ------------------------------------------------------------------ block maps
    def _path(self, off: int) -> tuple[int, list[tuple[int, int, int]]]:
        """Root slot and the (level, first offset, index) of each indirect node on the way."""
        P = self.P
        if off < N_DIRECT:
            return off, []
        o = off - N_DIRECT
        if o < P:
            return 12, [(0, N_DIRECT, o)]
        o -= P
        base2 = N_DIRECT + P
        if o < P * P:
            i = o // P
            return 13, [(1, base2, i), (0, base2 + i * P, o % P)]
        o -= P * P
        base3 = base2 + P * P
        if o < P * P * P:
            i = o // (P * P)
            j = (o // P) % P
            return 14, [
                (2, base3, i),
                (1, base3 + i * P * P, j),
                (0, base3 + i * P * P + j * P, o % P),
            ]
        raise LfsOpError(f"file offset {off} blocks is beyond the triply indirect pointer")

    def _load_node(self, inode: Inode, key: tuple[int, int], addr: int) -> _Node:
        node = inode.tree.get(key)
        if node is None:
            self._check_addr(addr, f"inode {inode.ino} indirect pointer")
            raw = self._read_block(addr)
            ptrs = list(struct.unpack(f">{self.P}Q", raw[: 8 * self.P]))
            node = _Node(ptrs, addr)
            inode.tree[key] = node
        return node

    def _get_ptr(self, inode: Inode, off: int) -> int:
        if off < N_DIRECT:
            return inode.ptr[off]
        slot, path = self._path(off)
        addr = inode.ptr[slot]
        for level, first, idx in path:
            node = inode.tree.get((level, first))
            if node is None:
                if addr == 0:
                    return 0
                node = self._load_node(inode, (level, first), addr)
            addr = node.ptrs[idx]
        return addr

    def _set_ptr(self, inode: Inode, off: int, new: int, account: bool = True) -> int:
        if off < N_DIRECT:
            old = inode.ptr[off]
            inode.ptr[off] = new
        else:
            slot, path = self._path(off)
            addr = inode.ptr[slot]
            node = None
            for level, first, idx in path:
                key = (level, first)
                node = inode.tree.get(key)
                if node is None:
                    node = self._load_node(inode, key, addr) if addr else _Node([0] * self.P, 0)
                    inode.tree[key] = node
                node.dirty = True
                addr = node.ptrs[idx]
            assert node is not None
            old = node.ptrs[path[-1][2]]
            node.ptrs[path[-1][2]] = new
            inode.tree_dirty = True
        if old and account:
            self._die(old)
        if old and not new:
            inode.blocks -= 1
        elif new and not old:
            inode.blocks += 1
        self._mark(inode)
        return old

    def _commit_tree(self, inode: Inode) -> None:
        """Write dirty indirect blocks, leaves first; parents and the inode get the addresses."""
        if not inode.tree_dirty:
            return
        dirty = sorted((k for k, n in inode.tree.items() if n.dirty), key=lambda k: (k[0], k[1]))
        for key in dirty:
            node = inode.tree[key]
            level, first = key
            self._die(node.addr)
            if any(node.ptrs):
                raw = struct.pack(f">{self.P}Q", *node.ptrs)
                node.addr = self._put(
                    raw, BlockRec(BT_INDIRECT, 0, inode.ino, inode.version, first, 0, level)
                )
                node.dirty = False
                new = node.addr
            else:
                del inode.tree[key]
                new = 0
            slot, path = self._path(first)
            pos = [(lv, f) for lv, f, _ in path].index(key)
            if pos == 0:
                inode.ptr[slot] = new
            else:
                plv, pfirst, _ = path[pos - 1]
                pidx = path[pos - 1][2]
                parent = inode.tree[(plv, pfirst)]
                parent.ptrs[pidx] = new
                parent.dirty = True
        inode.tree_dirty = False

    def _walk(self, inode: Inode) -> Iterator[tuple[int, int, int]]:
        """Every block of a file: (address, kind, offset); kind -1 is data, 0-2 an indirect
        block of that level (offset = the file offset of its first block pointer)."""
        if inode.body is not None:
            return
        for i in range(N_DIRECT):
            if inode.ptr[i]:
                yield inode.ptr[i], -1, i
        P = self.P
        roots = ((12, 0, N_DIRECT), (13, 1, N_DIRECT + P), (14, 2, N_DIRECT + P + P * P))
        for slot, level, first in roots:
            if inode.ptr[slot] or (level, first) in inode.tree:
                yield from self._walk_node(inode, level, first, inode.ptr[slot])

    def _walk_node(
        self, inode: Inode, level: int, first: int, addr: int
    ) -> Iterator[tuple[int, int, int]]:
        """An indirect block and what is below it, as the block map stands in memory: nodes
        changed since the last commit (not yet written, or written at ``node.addr`` before
        the change) are walked from memory."""
        node = self._load_node(inode, (level, first), addr)
        if node.addr:
            yield node.addr, level, first
        span = self.P**level
        for i, a in enumerate(node.ptrs):
            if level == 0:
                if a:
                    self._check_addr(a, f"inode {inode.ino} block pointer")
                    yield a, -1, first + i
            elif a or (level - 1, first + i * span) in inode.tree:
                yield from self._walk_node(inode, level - 1, first + i * span, a)

    def _free_from(self, inode: Inode, first_block: int) -> None:
        """Drop every data block at file offset >= first_block."""
        for addr, kind, off in list(self._walk(inode)):
            if kind == -1 and off >= first_block:
                self._set_ptr(inode, off, 0)
                del addr

    # ------------------------------------------------------------------ file content
    def _read_whole(self, inode: Inode) -> bytearray:
        out = bytearray(inode.size)
        nblk = -(-inode.size // self.bs)
        for off in range(nblk):
            a = self._get_ptr(inode, off)
            if a:
                self._check_addr(a, f"system file {inode.ino}")
                chunk = self._read_block(a)
                end = min(inode.size, (off + 1) * self.bs)
                out[off * self.bs : end] = chunk[: end - off * self.bs]
        return out

    def _write_data(self, inode: Inode, offset: int, data: bytes | bytearray | memoryview) -> None:
        bs = self.bs
        mv = memoryview(data)
        n = len(mv)
        pos = 0
        ct = now_ms()
        ino, ver = inode.ino, inode.version
        while pos < n:
            fo = offset + pos
            blk, within = divmod(fo, bs)
            take = min(bs - within, n - pos)
            old = self._get_ptr(inode, blk)
            if old >> 32 == self.cur_seg and self._overwrite_buffered(
                old, inode, blk, within, mv[pos : pos + take], ct
            ):
                pos += take
                continue
            if take == bs:
                piece: bytes | bytearray | memoryview = mv[pos : pos + bs]
            else:
                base = bytearray(self._read_block(old)) if old else bytearray(bs)
                if not old and blk * bs >= inode.size:
                    base = bytearray(bs)
                base[within : within + take] = mv[pos : pos + take]
                piece = base
            addr = self._put(piece, BlockRec(BT_DATA, 0, ino, ver, blk, ct))
            self._set_ptr(inode, blk, addr)
            pos += take
        if offset + n > inode.size:
            inode.size = offset + n
        self._mark(inode)

    def _overwrite_buffered(
        self,
        addr: int,
        inode: Inode,
        blk: int,
        within: int,
        piece: bytes | bytearray | memoryview,
        ctime: int,
    ) -> bool:
        """Write buffering: a data block of this file that is still in the segment buffer
        (put since the last flush, so no committed unit refers to it) is changed in place
        instead of taking a new block."""
        pos = addr & 0xFFFFFFFF
        if not (self.flushed_pos <= pos < self.cur_pos) or self._cleaning or addr == 0:
            return False
        rec = self.recs[pos]
        if (
            rec is None
            or rec.btype != BT_DATA
            or rec.ino != inode.ino
            or rec.offset != blk
            or rec.version != inode.version
        ):
            return False
        sp = self._txn
        start = pos * self.bs
        if sp is not None and sp.cur_seg == self.cur_seg and pos < sp.cur_pos:
            # The savepoint shares this record and this block: keep both as they were.
            if pos not in sp.buf_blocks:
                sp.buf_blocks[pos] = bytes(self.buf[start : start + self.bs])
            rec = dataclasses.replace(rec)
            self.recs[pos] = rec
        self.buf[start + within : start + within + len(piece)] = piece
        rec.ctime = ctime
        if ctime > self.mtime[self.cur_seg]:
            self.mtime[self.cur_seg] = ctime
        self.counters.buffered_overwrites += 1
        return True

    def _read_data(self, inode: Inode, offset: int, size: int) -> bytes:
        if inode.body is not None:
            return inode.body[offset : offset + size]
        end = min(inode.size, offset + size)
        if offset >= end:
            return b""
        bs = self.bs
        parts = []
        pos = offset
        while pos < end:
            blk, within = divmod(pos, bs)
            take = min(bs - within, end - pos)
            a = self._get_ptr(inode, blk)
            if a:
                self._check_addr(a, f"inode {inode.ino} block pointer")
                parts.append(self._read_block(a)[within : within + take])
            else:
                parts.append(bytes(take))
            pos += take
        return b"".join(parts)

    def _truncate_inode(self, inode: Inode, size: int) -> None:
        bs = self.bs
        if size < inode.size:
            keep = -(-size // bs)
            self._free_from(inode, keep)
            if size % bs:
                last = self._get_ptr(inode, size // bs)
                if last:
                    data = bytearray(self._read_block(last))
                    data[size % bs :] = bytes(bs - size % bs)
                    addr = self._put(
                        data, BlockRec(BT_DATA, 0, inode.ino, inode.version, size // bs, now_ms())
                    )
                    self._set_ptr(inode, size // bs, addr)
        inode.size = size
        inode.mtime = inode.ctime = now_ms()
        self._mark(inode)

    # ------------------------------------------------------------------ inodes
    def _bitmap_get(self, ino: int) -> bool:
        m = self._sysdata[INO_INOMAP]
        return ino // 8 < len(m) and bool(m[ino // 8] >> (ino % 8) & 1)

    def _bitmap_set(self, ino: int, on: bool) -> None:
        m = self._sysdata[INO_INOMAP]
        byte = ino // 8
        if byte >= len(m):
            m.extend(bytes(self.bs))
            self.sys[INO_INOMAP].size = len(m)
        self._jsys(INO_INOMAP, byte // self.bs)
        if on:
            m[byte] |= 1 << (ino % 8)
        else:
            m[byte] &= ~(1 << (ino % 8)) & 0xFF
        self._sys_dirty[INO_INOMAP].add(byte // self.bs)

    def _used_inos(self) -> Iterator[int]:
        m = self._sysdata[INO_INOMAP]
        for byte, v in enumerate(m):
            if v:
                for bit in range(8):
                    ino = byte * 8 + bit
                    if v >> bit & 1 and (ino >= fmt.FIRST_USER_INO or ino in _NAMED_SYSTEM):
                        yield ino

    def _iget(self, ino: int) -> Inode:
        if self._txn is not None and ino not in self._txn.inodes:
            self._touch(ino)
        inode = self._icache.get(ino)
        if inode is not None:
            return inode
        if not self._bitmap_get(ino):
            raise LfsOpError(f"inode {ino} is not in use")
        tbl = self._sysdata[INO_INOTBL]
        off = ino * fmt.INODE_SLOT
        if off + 4 > len(tbl):
            raise LfsError(f"{self.path}: inode {ino} beyond the inode table")
        (n,) = fmt.U32.unpack_from(tbl, off)
        if n == 0 or n > fmt.INODE_SLOT - 4:
            raise LfsError(f"{self.path}: inode table slot {ino} is damaged (length {n})")
        ent = lfs_pb2.InodeTblEntry()
        try:
            ent.ParseFromString(bytes(tbl[off + 4 : off + 4 + n]))
        except DecodeError:
            raise LfsError(f"{self.path}: inode table slot {ino} does not decode") from None
        vec = self._sysdata[INO_INOVEC]
        voff = ino * fmt.INOVEC_SLOT
        version = fmt.U32.unpack_from(vec, voff)[0] if voff + 16 <= len(vec) else 0
        inode = Inode(ino, ent.mode, version)
        inode.nlink = ent.nlink
        inode.uid, inode.gid = ent.uid, ent.gid
        inode.size, inode.blocks = ent.size, ent.blocks
        inode.mtime, inode.ctime = ent.mtime, ent.ctime
        inode.atime = fmt.U64.unpack_from(vec, voff + 8)[0] if voff + 16 <= len(vec) else 0
        if ent.HasField("body"):
            inode.body = bytes(ent.body)
        else:
            if len(ent.blkptr) != N_BLKPTR:
                raise LfsError(f"{self.path}: inode {ino} has {len(ent.blkptr)} block pointers")
            inode.ptr = list(ent.blkptr)
            for a in inode.ptr:
                self._check_addr(a, f"inode {ino}")
        if inode.mode & S_IFMT not in (S_IFDIR, S_IFREG, S_IFLNK):
            raise LfsError(f"{self.path}: inode {ino} has unsupported mode {inode.mode:o}")
        self._icache[ino] = inode
        return inode

    def _touch(self, ino: int) -> None:
        """Inside an operation, before inode ``ino`` (or its directory table) first changes:
        keep what rollback needs to put it back."""
        sp = self._txn
        if sp is None or ino in sp.inodes:
            return
        inode = self._icache.get(ino)
        if inode is None or not (inode.dirty or ino in self._dirty_dirs):
            sp.inodes[ino] = (None, None)  # the inode table and the directory file have it
            return
        d = self._dirs.get(ino)
        sp.inodes[ino] = (_clone_inode(inode), None if d is None else dict(d))

    def _mark(self, inode: Inode) -> None:
        if inode.ino in self.sys:
            return
        inode.dirty = True
        self._dirty[inode.ino] = inode

    def _alloc_inode(self, mode: int) -> Inode:
        ino = self._free_hint
        while self._bitmap_get(ino):
            ino += 1
        self._free_hint = ino + 1
        self._touch(ino)
        vec = self._sysdata[INO_INOVEC]
        voff = ino * fmt.INOVEC_SLOT
        version = (fmt.U32.unpack_from(vec, voff)[0] if voff + 16 <= len(vec) else 0) + 1
        self._bitmap_set(ino, True)
        inode = Inode(ino, mode, version & 0xFFFFFFFF)
        t = now_ms()
        inode.mtime = inode.ctime = inode.atime = t
        self._icache[ino] = inode
        self._mark(inode)
        return inode

    def _free_inode(self, inode: Inode) -> None:
        self._free_from(inode, 0)
        self._commit_tree(inode)
        self._bitmap_set(inode.ino, False)
        self._free_hint = min(self._free_hint, inode.ino)
        inode.nlink = 0
        inode.mode = 0
        self._mark(inode)

    def _store_inode(self, inode: Inode) -> None:
        ino = inode.ino
        tbl = self._sysdata[INO_INOTBL]
        vec = self._sysdata[INO_INOVEC]
        off = ino * fmt.INODE_SLOT
        voff = ino * fmt.INOVEC_SLOT
        while len(tbl) < off + fmt.INODE_SLOT:
            tbl.extend(bytes(self.bs))
        while len(vec) < voff + fmt.INOVEC_SLOT:
            vec.extend(bytes(self.bs))
        self.sys[INO_INOTBL].size = len(tbl)
        self.sys[INO_INOVEC].size = len(vec)
        if inode.mode == 0:
            slot = bytes(fmt.INODE_SLOT)
        else:
            ent = lfs_pb2.InodeTblEntry(
                mode=inode.mode,
                nlink=inode.nlink,
                uid=inode.uid,
                gid=inode.gid,
                size=inode.size,
                blocks=inode.blocks,
                mtime=inode.mtime,
                ctime=inode.ctime,
                blkptr=list(inode.ptr),
            )
            if inode.body is not None:
                ent.body = inode.body
            slot = fmt.encode_pb(ent).ljust(fmt.INODE_SLOT, b"\0")
        if tbl[off : off + fmt.INODE_SLOT] != slot:
            self._jsys(INO_INOTBL, off // self.bs)
            tbl[off : off + fmt.INODE_SLOT] = slot
            self._sys_dirty[INO_INOTBL].add(off // self.bs)
        vrec = struct.pack(">I4xQ", inode.version, inode.atime)
        if vec[voff : voff + 16] != vrec:
            self._jsys(INO_INOVEC, voff // self.bs)
            vec[voff : voff + 16] = vrec
            self._sys_dirty[INO_INOVEC].add(voff // self.bs)
        inode.dirty = False

    # ------------------------------------------------------------------ directories
    def _dir(self, ino: int) -> dict[str, int]:
        d = self._dirs.get(ino)
        if d is None:
            inode = self._iget(ino)
            if inode.mode & S_IFMT != S_IFDIR:
                raise LfsOpError(f"inode {ino} is not a directory")
            if inode.size > self.geo.image_size:
                raise LfsError(f"{self.path}: directory {ino} claims {inode.size} octets")
            raw = self._read_data(inode, 0, inode.size)
            d = {}
            if raw:
                (n,) = fmt.U32.unpack_from(raw) if len(raw) >= 4 else (len(raw),)
                if n > len(raw) - 4:
                    raise LfsError(f"{self.path}: directory {ino} is damaged (length {n})")
                msg = lfs_pb2.DirFile()
                try:
                    msg.ParseFromString(raw[4 : 4 + n])
                except DecodeError:
                    raise LfsError(f"{self.path}: directory {ino} does not decode") from None
                for rec in msg.list:
                    d[rec.name] = rec.ino
            self._dirs[ino] = d
        return d

    def _dir_change(self, dino: int, name: str, ino: int, op: lfs_pb2.DirChRec.Operation) -> None:
        del dino
        self._dirch.append(fmt.encode_pb(lfs_pb2.DirChRec(ino=ino, name=name, op=op)))

    def _write_dirch(self) -> None:
        if not self._dirch:
            return
        block = bytearray()
        for rec in self._dirch:
            if len(rec) + 1 > self.bs:
                continue  # a name this long cannot be journalled; the directory still is
            if len(block) + len(rec) + 1 > self.bs:
                self._put(bytes(block), BlockRec(BT_DIRCH, 0))
                block = bytearray()
            block += rec
        if block:
            self._put(bytes(block), BlockRec(BT_DIRCH, 0))
        self._dirch.clear()

    def _write_dir(self, ino: int) -> None:
        d = self._dirs[ino]
        inode = self._iget(ino)
        msg = lfs_pb2.DirFile(list=[lfs_pb2.DirFileRec(ino=i, name=n) for n, i in d.items()])
        raw = fmt.encode_pb(msg)
        old = self._read_data(inode, 0, inode.size)
        bs = self.bs
        for blk in range(-(-len(raw) // bs)):
            piece = raw[blk * bs : (blk + 1) * bs]
            if old[blk * bs : (blk + 1) * bs] != piece:
                self._write_data(inode, blk * bs, piece)
        if len(raw) < inode.size:
            self._truncate_inode(inode, len(raw))
        inode.size = len(raw)

    def _lookup(self, path: str, follow_last: bool = False) -> int:
        del follow_last
        ino = INO_ROOT
        for part in self._parts(path):
            d = self._dir(ino)
            if part not in d:
                raise LfsOpError(f"no such file or directory: {path!r}")
            ino = d[part]
        return ino

    @staticmethod
    def _parts(path: str) -> list[str]:
        parts = [p for p in path.strip("/").split("/") if p]
        for p in parts:
            if p in (".", ".."):
                raise LfsOpError(f"path components '.' and '..' are not supported: {path!r}")
        return parts

    def _parent(self, path: str) -> tuple[int, str]:
        parts = self._parts(path)
        if not parts:
            raise LfsOpError("the root directory has no parent")
        dino = INO_ROOT
        for part in parts[:-1]:
            d = self._dir(dino)
            if part not in d:
                raise LfsOpError(f"no such directory: {path!r}")
            dino = d[part]
            if self._iget(dino).mode & S_IFMT != S_IFDIR:
                raise LfsOpError(f"not a directory: {part!r} in {path!r}")
        self._dir(dino)
        return dino, parts[-1]

    def _link(self, dino: int, name: str, ino: int) -> None:
        if len(name.encode("utf-8", "surrogateescape")) > 255:
            raise LfsOpError(f"name too long: {name[:40]!r}...")
        self._touch(dino)
        self._dir(dino)[name] = ino
        self._dirty_dirs.add(dino)
        self._dir_change(dino, name, ino, lfs_pb2.DirChRec.ADD)
        d = self._iget(dino)
        d.mtime = d.ctime = now_ms()
        self._mark(d)

    def _unlink_name(self, dino: int, name: str) -> int:
        self._touch(dino)
        ino = self._dir(dino).pop(name)
        self._dirty_dirs.add(dino)
        self._dir_change(dino, name, ino, lfs_pb2.DirChRec.REMOVE)
        d = self._iget(dino)
        d.mtime = d.ctime = now_ms()
        self._mark(d)
        return ino

    # ------------------------------------------------------------------ commit / checkpoint
    def _commit(self) -> None:
        """End a unit: everything changed so far reaches the log, the last write flagged."""
        if self._txn is not None:
            for ino in list(self._dirty):  # the commit changes their trees: keep them first
                self._touch(ino)
        self._pending_since = None
        self._write_dirch()
        for dino in sorted(self._dirty_dirs):
            if self._bitmap_get(dino):
                self._write_dir(dino)
        self._dirty_dirs.clear()
        while self._dirty:
            batch = list(self._dirty.values())
            self._dirty.clear()
            for inode in batch:
                self._commit_tree(inode)
            for inode in batch:
                self._store_inode(inode)
                if inode.mode == 0:
                    self._icache.pop(inode.ino, None)
                    self._dirs.pop(inode.ino, None)
        for sino in fmt.SYSTEM_FILES:
            inode = self.sys[sino]
            data = self._sysdata[sino]
            inode.size = len(data)
            for blk in sorted(self._sys_dirty[sino]):
                piece = data[blk * self.bs : (blk + 1) * self.bs]
                addr = self._put(piece, BlockRec(BT_DATA, 0, sino, inode.version, blk, now_ms()))
                self._set_ptr(inode, blk, addr)
            self._sys_dirty[sino].clear()
            self._commit_tree(inode)
        self._flush(commit=True)
        if len(self._icache) > 8192:
            self._icache = {k: v for k, v in self._icache.items() if v.dirty}
            self._dirs = {k: v for k, v in self._dirs.items() if k in self._icache}

    def _checkpoint(self) -> None:
        self._commit()
        if self.cur_pos > 0:
            # Seed 003 §2.3.2: next_seg is the next segment to be written after this
            # checkpoint, so the partly written one is closed (roll-forward starts after it).
            self._seal()
        stamp = self._stamp()
        cp = lfs_pb2.Checkpoint(
            timestamp=stamp,
            next_seg=self.cur_seg,
            inode_inomap=_simp(self.sys[INO_INOMAP]),
            inode_inovec=_simp(self.sys[INO_INOVEC]),
            inode_inotbl=_simp(self.sys[INO_INOTBL]),
            segusage=[
                lfs_pb2.SegUsageRec(nblks_live=max(0, lv), mtime=mt)
                for lv, mt in zip(self.live, self.mtime, strict=True)
            ],
        )
        which = 1 - self.cp_which
        fmt.write_checkpoint(self.fd, self.geo, which, cp)
        self.cp_which = which
        self.cp_stamp = stamp
        self.cp_next = self.cur_seg
        self._segs_since_cp = 0
        self._last_cp_time = time.monotonic()
        # Segments emptied since the last checkpoint become clean only now.
        for s in range(self.geo.first_log_segment, self.geo.segments):
            if self.live[s] == 0 and s != self.cur_seg and s != self.next_seg:
                self.clean.add(s)
        self.clean.discard(self.cur_seg)

    def _end_op(self) -> None:
        """An operation's changes are done (in memory): they wait there for the next commit
        (``_commit_due``), which an operation outside any group makes at once."""
        if self._pending_since is None:
            self._pending_since = time.monotonic()
        if self._txn is None:
            self._commit()
            self._after_op()

    def _pending_blocks(self) -> int:
        """A generous estimate of the metadata blocks the next commit writes."""
        sd = self._sys_dirty
        return (
            3 * (len(self._dirty) + len(self._dirty_dirs))
            + len(self._dirch) // 16
            + len(sd[INO_INOMAP])
            + len(sd[INO_INOVEC])
            + len(sd[INO_INOTBL])
        )

    def _commit_due(self) -> bool:
        """Whether the changes waiting in memory are committed now: always with a
        ``commit_interval`` of 0; else when they are older than it, when their metadata
        would take more than ``_MAX_PENDING`` blocks, or when clean segments run short (so
        that a commit never needs more room than there is: twice the estimate is kept)."""
        if self._pending_since is None:
            return False
        interval = self.opts.commit_interval
        if interval <= 0 or time.monotonic() - self._pending_since >= interval:
            return True
        est = self._pending_blocks()
        return est > _MAX_PENDING or len(self.clean) < self._lw + 3 + 2 * est // self.ndata

    def _after_op(self) -> None:
        """Checkpoint and clean when due: never inside an operation, so that an operation that
        fails can be undone (segments it emptied are not reused before it ends)."""
        if (
            self._segs_since_cp >= self.cp_interval
            or time.monotonic() - self._last_cp_time >= self.opts.checkpoint_seconds
        ):
            self._checkpoint()
        if not self._cleaning and len(self.clean) < self._low_water():
            self.clean_now()

    # ------------------------------------------------------------------ atomic operations
    @contextlib.contextmanager
    def atomic(self, nblocks: int = 0) -> Iterator[None]:
        """Run a group of operations as one: room for ``nblocks`` blocks is made first
        (cleaning if needed, ``LfsNoSpace`` if it cannot be made, with nothing changed);
        if anything inside fails, the file system is left exactly as it was before (the
        blocks written meanwhile are dead and the current segment's summary is rewritten
        without them). Checkpoints and cleaning wait until the group ends. Nested groups
        join the outermost one."""
        if self._txn is not None:
            if nblocks:
                self._ensure_space(nblocks)
            yield
            return
        if nblocks:
            self._ensure_space(nblocks)
        self._txn = self._savepoint()
        try:
            yield
            if self._commit_due():
                self._commit()
            if nblocks and len(self.clean) < _RESERVE:
                raise LfsNoSpace(
                    f"{self.path}: no space left (the operation would take the "
                    f"{_RESERVE} clean segments kept for deletes and cleaning)"
                )
        except BaseException:
            sp, self._txn = self._txn, None
            if not self.closed:
                self._rollback(sp)
            raise
        self._txn = None
        self._after_op()

    def _savepoint(self) -> _Savepoint:
        return _Savepoint(
            live=list(self.live),
            mtime=list(self.mtime),
            clean=set(self.clean),
            sys={ino: _clone_inode(i) for ino, i in self.sys.items()},
            sys_len={ino: len(d) for ino, d in self._sysdata.items()},
            free_hint=self._free_hint,
            cur_seg=self.cur_seg,
            cur_pos=self.cur_pos,
            flushed_pos=self.flushed_pos,
            seq=self.seq,
            buf=self.buf,  # blocks below cur_pos are never changed in a segment's buffer
            recs=list(self.recs),
            next_seg=self.next_seg,
            seg_flags=self._seg_flags,
            last_flush_commit=self._last_flush_commit,
            segs_since_cp=self._segs_since_cp,
            dirty=dict(self._dirty),
            dirty_dirs=set(self._dirty_dirs),
            dirch=list(self._dirch),
            sys_dirty={k: set(v) for k, v in self._sys_dirty.items()},
            pending_since=self._pending_since,
        )

    def _jsys(self, sino: int, blk: int) -> None:
        """Before a system-file block changes inside an operation: keep its old content."""
        sp = self._txn
        if sp is not None and (sino, blk) not in sp.sys_blocks:
            data = self._sysdata[sino]
            sp.sys_blocks[(sino, blk)] = bytes(data[blk * self.bs : (blk + 1) * self.bs])

    def _rollback(self, sp: _Savepoint) -> None:
        for seg in [s for s in self._seg_cache if s in sp.clean or s == sp.cur_seg]:
            del self._seg_cache[seg]
        self.live, self.mtime, self.clean = sp.live, sp.mtime, sp.clean
        self.sys = sp.sys
        for sino, n in sp.sys_len.items():
            del self._sysdata[sino][n:]
        for (sino, blk), old in sp.sys_blocks.items():
            data = self._sysdata[sino]
            if blk * self.bs < len(data):
                data[blk * self.bs : blk * self.bs + len(old)] = old[: len(data) - blk * self.bs]
        self._sys_dirty = sp.sys_dirty
        for sino in fmt.SYSTEM_FILES:
            self.sys[sino].size = len(self._sysdata[sino])
        # Inodes and directories the operation touched are put back as they were (or read
        # again from the inode table); changes made before it still wait for their commit.
        for ino, (inode, d) in sp.inodes.items():
            if inode is None:
                self._icache.pop(ino, None)
            else:
                self._icache[ino] = inode
            if d is None:
                self._dirs.pop(ino, None)
            else:
                self._dirs[ino] = d
        self._dirty = {ino: self._icache[ino] for ino in sp.dirty}
        self._dirty_dirs = sp.dirty_dirs
        self._dirch = sp.dirch
        self._pending_since = sp.pending_since
        self._free_hint = sp.free_hint
        self._plug_summ = {}
        self._holeplug = False
        self._cleaning = False
        self.cur_seg, self.cur_pos, self.flushed_pos = sp.cur_seg, sp.cur_pos, sp.flushed_pos
        self.seq, self.buf, self.recs = sp.seq, sp.buf, sp.recs
        for pos, old in sp.buf_blocks.items():
            self.buf[pos * self.bs : (pos + 1) * self.bs] = old
        self.next_seg, self._seg_flags = sp.next_seg, sp.seg_flags
        self._segs_since_cp = sp.segs_since_cp
        # The summary on disk may describe blocks of the undone operation: write it again,
        # newer than any summary the operation wrote, so roll-forward stops here.
        if self.next_seg < 0 and self.clean:
            self.next_seg = self._alloc_segment()
        base = self.geo.seg_offset(self.cur_seg)
        a, b = self.flushed_pos * self.bs, self.cur_pos * self.bs
        if b > a:
            os.pwrite(self.fd, memoryview(self.buf)[a:b], base + a)
            self.flushed_pos = self.cur_pos
        summ = fmt.pack_summary(
            self.geo, self.recs, max(self.next_seg, 0), self._stamp(), self._seg_flags
        )
        os.pwrite(self.fd, summ, base + self.ndata * self.bs)
        self._last_flush_commit = sp.last_flush_commit

    def _low_water(self) -> int:
        return self._lw

    def sync(self) -> None:
        """Commit and write the buffer (a partial segment write)."""
        self._commit()

    def checkpoint(self) -> None:
        self._checkpoint()

    # ------------------------------------------------------------------ space
    def _ensure_space(self, nblocks: int) -> None:
        need = -(-nblocks // self.ndata) + 2
        if self._txn is not None:
            return  # made before the operation began (``atomic``); no cleaning inside it
        if self._cleaning or len(self.clean) >= need + self._low_water():
            return
        self.clean_now(want=need + self._low_water() - len(self.clean))
        if len(self.clean) < need + _RESERVE:
            raise LfsNoSpace(
                f"{self.path}: no space left ({len(self.clean)} clean segments, "
                f"{need} needed and {_RESERVE} kept for deletes and cleaning)"
            )

    # ------------------------------------------------------------------ cleaning
    def clean_now(self, want: int | None = None) -> int:
        """Run garbage collection until ``want`` more segments are clean (default: twice the
        low-water mark). Returns the number of segments freed."""
        if self._txn is not None or self._cleaning:
            return 0  # never inside an operation (see ``atomic``)
        target = len(self.clean) + (want or 2 * self._low_water())
        start = best = len(self.clean)
        stalls = 0
        # Stop after three passes that bring the clean count to no new high: passes that
        # free one segment and fill another would otherwise go on for ever.
        while len(self.clean) < target and stalls < 3:
            got = self._gc_pass(target - len(self.clean))
            if got < 0:
                break  # the pass cost more than it freed: do not eat into the reserve
            if len(self.clean) > best:
                best, stalls = len(self.clean), 0
            else:
                stalls += 1
        return len(self.clean) - start

    def _gc_pass(self, want: int) -> int:
        first = self.geo.first_log_segment
        if any(
            self.live[s] == 0 and s not in self.clean and s not in (self.cur_seg, self.next_seg)
            for s in range(first, self.geo.segments)
        ):
            self._checkpoint()  # segments that emptied on their own become clean first
        else:
            self._commit()
        before = len(self.clean)
        cands = [
            s
            for s in range(self.geo.first_log_segment, self.geo.segments)
            if s not in self.clean and s != self.cur_seg and s != self.next_seg and self.live[s] > 0
        ]
        # Room for the live blocks moved: what is left of the current segment and of the next
        # one (already taken from the clean set) and all clean segments but one (the segment
        # after those needs it). The pass also commits metadata for what it moved (indirect
        # and inode-table blocks, up to one per block moved for small files): the live blocks
        # moved get half of the room.
        room_blocks = (
            (self.ndata - self.cur_pos)
            + (self.ndata if self.next_seg >= 0 else 0)
            + max(0, len(self.clean) - 1) * self.ndata
            - 8
        ) // 2
        if not cands or room_blocks < 1:
            return 0
        room = room_blocks / self.ndata
        p = cl.plan(
            self.policy,
            cands,
            self.live,
            self.mtime,
            now_ms(),
            capacity=self.ndata,
            blocks_per_segment=self.geo.blocks_per_segment,
            block_size=self.bs,
            want_segments=max(1, want),
            room_segments=room,
            disk=self.opts.disk,
            cached=frozenset(self._seg_cache),
        )
        if p is None or not p.sources:
            return 0
        self._cleaning = True
        try:
            # One operation: a pass that runs out of room is undone (the blocks it moved
            # stay where they were) and frees nothing.
            with self.atomic():
                self._cleaning = True
                if p.mechanism == "clean":
                    self.counters.cleaning_passes += 1
                    for s in p.sources:
                        self._relocate_segment(s, None)
                else:
                    self.counters.holeplug_passes += 1
                    holes = self._find_holes(p.targets)
                    self._holeplug = True
                    try:
                        for s in p.sources:
                            self._relocate_segment(s, holes)
                    finally:
                        self._holeplug = False
                    self._write_plugged()
        except LfsNoSpace:
            return 0
        finally:
            self._cleaning = False
        self._checkpoint()
        freed = len(self.clean) - before
        self.counters.segments_freed += max(0, freed)
        return freed

    def _block_live(self, seg: int, blk: int, rec: BlockRec) -> tuple[Inode, int] | None:
        """If block (seg, blk) is live: the owning inode and the file offset / node key."""
        addr = fmt.sbn(seg, blk)
        if rec.btype not in (BT_DATA, BT_INDIRECT):
            return None
        if rec.ino in self.sys:
            inode = self.sys[rec.ino]
        else:
            if not self._bitmap_get(rec.ino):
                return None
            vec = self._sysdata[INO_INOVEC]
            voff = rec.ino * fmt.INOVEC_SLOT
            if voff + 16 > len(vec) or fmt.U32.unpack_from(vec, voff)[0] != rec.version:
                return None
            inode = self._iget(rec.ino)
        if rec.btype == BT_DATA:
            if rec.offset * self.bs >= max(inode.size, 1) and inode.ino not in self.sys:
                return None
            try:
                return (inode, rec.offset) if self._get_ptr(inode, rec.offset) == addr else None
            except LfsOpError:
                return None
        try:
            slot, path = self._path(rec.offset)
        except LfsOpError:
            return None
        key = (rec.level, rec.offset)
        keys = [(lv, f) for lv, f, _ in path]
        if key not in keys:
            return None
        pos = keys.index(key)
        if pos == 0:
            return (inode, -1) if inode.ptr[slot] == addr else None
        parent_addr = inode.ptr[slot]
        node = None
        for lv, f, idx in path[:pos]:
            node = inode.tree.get((lv, f))
            if node is None:
                if not parent_addr:
                    return None
                node = self._load_node(inode, (lv, f), parent_addr)
            parent_addr = node.ptrs[idx]
        return (inode, -1) if parent_addr == addr else None

    def _segment_bytes(self, seg: int) -> bytes:
        cached = self._seg_cache.get(seg)
        if cached is not None:
            self.counters.clean_segs_cached += 1
            return cached
        if self._holeplug:
            self.counters.holeplug_segs_read += 1
        else:
            self.counters.clean_segs_read += 1
        return os.pread(self.fd, self.geo.segment_size, self.geo.seg_offset(seg))

    def _relocate_segment(self, seg: int, holes: list[int] | None) -> None:
        summ = fmt.read_summary(self.fd, self.geo, seg)
        raw = self._segment_bytes(seg)
        for blk, rec in enumerate(summ.recs):
            if rec is None:
                continue
            owner = self._block_live(seg, blk, rec)
            if owner is None:
                continue
            inode, off = owner
            data = raw[blk * self.bs : (blk + 1) * self.bs]
            if rec.btype == BT_INDIRECT:
                node = self._load_node(inode, (rec.level, rec.offset), fmt.sbn(seg, blk))
                node.dirty = True
                inode.tree_dirty = True
                if inode.ino in self.sys:
                    continue
                self._mark(inode)
                continue
            if holes is not None and holes:
                addr = holes.pop()
                self._plug(addr, data, rec)
            else:
                addr = self._put(data, BlockRec(BT_DATA, 0, rec.ino, rec.version, off, rec.ctime))
            self._set_ptr(inode, off, addr)
            if inode.ino in self.sys:
                continue

    # hole-plugging: blocks go into dead slots of well-used segments, one write each
    def _find_holes(self, targets: list[int]) -> list[int]:
        holes: list[int] = []
        self._plug_summ = {}
        for seg in targets:
            summ = fmt.read_summary(self.fd, self.geo, seg)
            self._plug_summ[seg] = summ
            for blk in range(self.ndata):
                rec = summ.recs[blk]
                if rec is None or self._block_live(seg, blk, rec) is None:
                    holes.append(fmt.sbn(seg, blk))
        holes.reverse()
        return holes

    def _plug(self, addr: int, data: bytes, rec: BlockRec) -> None:
        seg, blk = fmt.sbn_split(addr)
        os.pwrite(self.fd, data, self.geo.addr_offset(addr))
        summ = self._plug_summ[seg]
        seq = max((r.seq for r in summ.recs if r is not None), default=-1) + 1
        summ.recs[blk] = BlockRec(
            BT_DATA, min(seq, fmt.SEQ_MAX), rec.ino, rec.version, rec.offset, rec.ctime
        )
        self.live[seg] += 1
        self.mtime[seg] = max(self.mtime[seg], rec.ctime)
        self.counters.holeplug_blocks += 1
        self._seg_cache.pop(seg, None)

    def _write_plugged(self) -> None:
        for seg, summ in self._plug_summ.items():
            raw = fmt.pack_summary(self.geo, summ.recs, summ.next_seg, summ.stamp, summ.flags)
            os.pwrite(self.fd, raw, self.geo.seg_offset(seg) + self.ndata * self.bs)
        self._plug_summ = {}

    # ------------------------------------------------------------------ public API
    def create(self, path: str, mode: int = 0o644) -> int:
        dino, name = self._parent(path)
        if name in self._dirs[dino]:
            raise LfsOpError(f"file exists: {path!r}")
        with self.atomic(1):
            inode = self._alloc_inode(S_IFREG | (mode & 0o7777))
            inode.nlink = 1
            self._link(dino, name, inode.ino)
            self._end_op()
        return inode.ino

    def write(self, path: str, offset: int, data: bytes | bytearray | memoryview) -> int:
        inode = self._iget(self._lookup(path))
        if inode.mode & S_IFMT != S_IFREG:
            raise LfsOpError(f"not a regular file: {path!r}")
        mv = memoryview(data)
        if (
            mv.nbytes
            and offset // self.bs == (offset + mv.nbytes - 1) // self.bs
            and self._txn is None
            and self.opts.commit_interval > 0
            and self.cur_pos < self.ndata
            and self.seq <= fmt.SEQ_MAX
            and len(self.clean) >= 3 + self._lw
            and not self._commit_due()
        ):
            self._write_small(inode, offset, mv)
            return mv.nbytes
        nblk = -(-len(mv) // self.bs) + 1
        with self.atomic(nblk + nblk // 64 + 2):
            inode = self._iget(inode.ino)
            self._write_data(inode, offset, mv)  # one unit, however long
            inode.mtime = inode.ctime = now_ms()
            self._end_op()
        return len(mv)

    def _write_small(self, inode: Inode, offset: int, mv: memoryview) -> None:
        """A write within one block when the segment buffer has room and no commit is due:
        everything that can fail (reading the block map and the old block) comes before the
        first change, and the rest is in memory, so no savepoint is needed."""
        bs = self.bs
        blk, within = divmod(offset, bs)
        old = inode.ptr[blk] if blk < N_DIRECT else self._get_ptr(inode, blk)
        ct = time.time_ns() // 1_000_000
        if old >> 32 == self.cur_seg and self._overwrite_buffered(old, inode, blk, within, mv, ct):
            pass
        else:
            if mv.nbytes == bs:
                piece: bytes | bytearray | memoryview = mv
            else:
                base = bytearray(bs)
                if old:
                    self._check_addr(old, f"inode {inode.ino} block pointer")
                    base[:] = self._read_block(old)
                base[within : within + mv.nbytes] = mv
                piece = base
            addr = self._put(piece, BlockRec(BT_DATA, 0, inode.ino, inode.version, blk, ct))
            self._set_ptr(inode, blk, addr)
        if offset + mv.nbytes > inode.size:
            inode.size = offset + mv.nbytes
        inode.mtime = inode.ctime = ct
        self._mark(inode)
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
        inode = self._iget(self._lookup(path))
        if inode.mode & S_IFMT == S_IFDIR:
            raise LfsOpError(f"is a directory: {path!r}")
        if size < 0:
            size = inode.size
        return self._read_data(inode, offset, size)

    def truncate(self, path: str, size: int) -> None:
        inode = self._iget(self._lookup(path))
        if inode.mode & S_IFMT != S_IFREG:
            raise LfsOpError(f"not a regular file: {path!r}")
        with self.atomic(4):
            inode = self._iget(inode.ino)
            if size > inode.size:
                inode.size = size  # a hole; reads give zeros
                inode.mtime = inode.ctime = now_ms()
                self._mark(inode)
            else:
                self._truncate_inode(inode, size)
            self._end_op()

    def unlink(self, path: str) -> None:
        dino, name = self._parent(path)
        if name not in self._dirs[dino]:
            raise LfsOpError(f"no such file: {path!r}")
        inode = self._iget(self._dirs[dino][name])
        if inode.mode & S_IFMT == S_IFDIR:
            raise LfsOpError(f"is a directory: {path!r}")
        with self.atomic():
            self._unlink_name(dino, name)
            inode = self._iget(inode.ino)
            inode.nlink -= 1
            inode.ctime = now_ms()
            if inode.nlink <= 0:
                self._free_inode(inode)
            else:
                self._mark(inode)
            self._end_op()

    def mkdir(self, path: str, mode: int = 0o755) -> int:
        dino, name = self._parent(path)
        if name in self._dirs[dino]:
            raise LfsOpError(f"file exists: {path!r}")
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
        dino, name = self._parent(path)
        if name not in self._dirs[dino]:
            raise LfsOpError(f"no such directory: {path!r}")
        inode = self._iget(self._dirs[dino][name])
        if inode.mode & S_IFMT != S_IFDIR:
            raise LfsOpError(f"not a directory: {path!r}")
        if self._dir(inode.ino):
            raise LfsOpError(f"directory not empty: {path!r}")
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

    def max_fullness(self) -> float:
        """The highest fraction of the log's data blocks live data can reach: an operation
        that writes needs ``_RESERVE`` clean segments kept back plus three of its own (see
        ``_ensure_space``), and the segment being written and the next one hold no old data."""
        log = self.geo.log_segments
        return max(0.0, (log - _RESERVE - 3 - 2) / log)

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
        ino = self._lookup(path)
        with self.atomic(1):
            inode = self._iget(ino)
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
            self._end_op()
        return self.stat_ino(ino)

"""What the parts of the LFS share: the in-memory inode, the options of an open image, the
savepoint of an operation, and :class:`LfsState`, the state of an open image with the
operations each part offers the others.

:class:`fsage.lfs.fs.LFS` is made of mixins, one per part of seed 003 (:mod:`~fsage.lfs.log`,
:mod:`~fsage.lfs.inodes`, :mod:`~fsage.lfs.dirs`, :mod:`~fsage.lfs.data`,
:mod:`~fsage.lfs.savepoint`, :mod:`~fsage.lfs.cleaning`, and the file operations over them in
:mod:`~fsage.lfs.fileops`). Each derives from :class:`LfsState`, whose attribute types and
abstract methods declare, once, what one part may use of another: mypy checks every use
against them and every implementation too.
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fsage.lfs import cleaner as cl
from fsage.lfs import format as fmt
from fsage.lfs.format import N_BLKPTR, BlockRec, Geometry


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
        "dircrc",
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
        self.dircrc = 0  # a directory's checksum (``fmt.dir_checksum``); 0: none kept


def _clone_inode(inode: Inode) -> Inode:
    """A copy that shares nothing that changes (block pointers, indirect nodes)."""
    c = Inode(inode.ino, inode.mode, inode.version)
    c.nlink, c.uid, c.gid = inode.nlink, inode.uid, inode.gid
    c.size, c.blocks, c.body = inode.size, inode.blocks, inode.body
    c.mtime, c.ctime, c.atime = inode.mtime, inode.ctime, inode.atime
    c.dircrc = inode.dircrc
    c.tree_dirty, c.dirty = inode.tree_dirty, inode.dirty
    c.ptr = list(inode.ptr)
    for key, node in inode.tree.items():
        n = _Node(list(node.ptrs), node.addr)
        n.dirty = node.dirty
        c.tree[key] = n
    return c


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


@dataclass
class Savepoint:
    """What an operation may change in memory, taken before it starts (see ``atomic``).
    Cheap to take: what most operations leave alone or only append to is kept as a length or
    copied when first changed (``None`` until then)."""

    live: list[int]
    mtime: list[int]
    free_hint: int
    cur_seg: int
    cur_pos: int
    flushed_pos: int
    seq: int
    buf: bytearray
    recs: list[BlockRec | None]
    crcs: list[int]
    next_seg: int
    seg_flags: int
    last_flush_commit: bool
    segs_since_cp: int
    dirty_dirs: set[int]
    sys_len: dict[int, int]
    sys_dirty: dict[int, set[int]]
    pending_since: float | None
    #: Inodes waiting for a commit and directory change records: only appended to until a
    #: commit, before which they are copied (``dirty``, ``dirch``).
    dirty_count: int
    dirch_count: int
    dirty: list[int] | None = None
    dirch: list[bytes] | None = None
    #: Clean segments: copied before the first is taken (``_alloc_segment``).
    clean: set[int] | None = None
    #: System-file inodes: their block maps change only in a commit or a cleaning pass,
    #: before which they are cloned.
    sys: dict[int, Inode] | None = None
    #: System-file blocks as they were before their first change (``_jsys``).
    sys_blocks: dict[tuple[int, int], bytes] = field(default_factory=dict)
    #: Inodes (and directory tables) as they were when the operation first touched them:
    #: a clone if they had changes not yet committed, None if the inode table has them.
    inodes: dict[int, tuple[Inode | None, dict[str, int] | None]] = field(default_factory=dict)
    #: Blocks of the segment buffer overwritten in place: their content before.
    buf_blocks: dict[int, bytes] = field(default_factory=dict)


class LfsState:
    """An open LFS, as its parts see it (no behaviour of its own: the abstract methods are
    implemented by the mixin named in :mod:`fsage.lfs.state`'s docstring for that part)."""

    # the image
    path: Path
    opts: OpenOptions
    readonly: bool
    fd: int
    closed: bool
    geo: Geometry
    bs: int
    P: int  # block pointers per indirect block
    ndata: int  # data blocks per segment
    _zero: bytes
    notes: list[str]
    counters: cl.Counters
    # the log: segments, the segment buffer, checkpoints
    live: list[int]
    mtime: list[int]
    clean: set[int]
    cur_seg: int
    cur_pos: int
    flushed_pos: int
    seq: int
    buf: bytearray
    recs: list[BlockRec | None]
    crcs: list[int]  # block_crc of the current segment's blocks, as of their last flush
    _sum_crcs: OrderedDict[int, list[int]]  # the block CRCs of summaries read from disk
    #: read-only opens: system-file blocks (inode, block) whose checksum does not match
    damaged_sys: dict[tuple[int, int], str]
    next_seg: int
    _seg_flags: int
    _last_flush_commit: bool
    _seg_cache: OrderedDict[int, bytes]
    _last_stamp: int
    cp_which: int
    cp_stamp: int
    cp_next: int
    cp_interval: int
    _segs_since_cp: int
    _last_cp_time: float
    _pending_since: float | None
    rolled_forward: int
    # inodes, the system files, directories
    sys: dict[int, Inode]
    _sysdata: dict[int, bytearray]
    _sys_dirty: dict[int, set[int]]
    _icache: dict[int, Inode]
    _dirty: dict[int, Inode]
    _free_hint: int
    _dirs: dict[int, dict[str, int]]
    _dirty_dirs: set[int]
    _dirch: list[bytes]
    # operations and cleaning
    _txn: Savepoint | None
    policy: str
    _lw: int
    _cleaning: bool
    _holeplug: bool
    _plug_summ: dict[int, fmt.Summary]
    # the image offsets of file data blocks read, one list per read (``fsage lfs mount --trace``)
    read_trace: Callable[[list[int]], None] | None
    # the largest directory in blocks, -1 until the inode table is looked through
    _dir_max: int

    @abstractmethod
    def _after_op(self) -> None: ...
    @abstractmethod
    def _reserve(self) -> int: ...
    @abstractmethod
    def _alloc_inode(self, mode: int) -> Inode: ...
    @abstractmethod
    def _alloc_segment(self) -> int: ...
    @abstractmethod
    def _bitmap_get(self, ino: int) -> bool: ...
    @abstractmethod
    def _buffered(self, addr: int, inode: Inode, blk: int) -> bool: ...
    @abstractmethod
    def _check_addr(self, addr: int, what: str) -> None: ...
    @abstractmethod
    def _checkpoint(self) -> None: ...
    @abstractmethod
    def _commit(self) -> None: ...
    @abstractmethod
    def _commit_due(self) -> bool: ...
    @abstractmethod
    def _commit_tree(self, inode: Inode) -> None: ...
    @abstractmethod
    def _die(self, addr: int) -> None: ...
    @abstractmethod
    def _dir(self, ino: int) -> dict[str, int]: ...
    @abstractmethod
    def _end_op(self) -> None: ...
    @abstractmethod
    def _ensure_space(self, nblocks: int) -> None: ...
    @abstractmethod
    def _free_from(self, inode: Inode, first_block: int) -> None: ...
    @abstractmethod
    def _free_inode(self, inode: Inode) -> None: ...
    @abstractmethod
    def _get_ptr(self, inode: Inode, off: int) -> int: ...
    @abstractmethod
    def _iget(self, ino: int) -> Inode: ...
    @abstractmethod
    def _jsys(self, sino: int, blk: int) -> None: ...
    @abstractmethod
    def _keep_clean(self) -> None: ...
    @abstractmethod
    def _keep_for_commit(self) -> None: ...
    @abstractmethod
    def _keep_sys(self) -> None: ...
    @abstractmethod
    def _link(self, dino: int, name: str, ino: int) -> None: ...
    @abstractmethod
    def _load_node(self, inode: Inode, key: tuple[int, int], addr: int) -> _Node: ...
    @abstractmethod
    def _lookup(self, path: str, follow_last: bool = False) -> int: ...
    @abstractmethod
    def _low_water(self) -> int: ...
    @abstractmethod
    def _mark(self, inode: Inode) -> None: ...
    @abstractmethod
    def _overwrite_in_buffer(
        self, addr: int, within: int, piece: bytes | bytearray | memoryview, ctime: int
    ) -> None: ...
    @abstractmethod
    def _parent(self, path: str) -> tuple[int, str]: ...
    @staticmethod
    @abstractmethod
    def _parts(path: str) -> list[str]: ...
    @abstractmethod
    def _path(self, off: int) -> tuple[int, list[tuple[int, int, int]]]: ...
    @abstractmethod
    def _put(self, data: bytes | bytearray | memoryview, rec: BlockRec) -> int: ...
    @abstractmethod
    def _read_block(self, addr: int) -> bytes: ...
    @abstractmethod
    def _crc_range(self, a: int, b: int) -> None: ...
    @abstractmethod
    def _verify_block(self, addr: int, data: bytes | bytearray | memoryview, crc: int) -> None: ...
    @abstractmethod
    def _read_data(self, inode: Inode, offset: int, size: int) -> bytes: ...
    @abstractmethod
    def _set_ptr(self, inode: Inode, off: int, new: int, account: bool = True) -> int: ...
    @abstractmethod
    def _stamp(self) -> int: ...
    @abstractmethod
    def _store_inode(self, inode: Inode) -> None: ...
    @abstractmethod
    def _touch(self, ino: int) -> None: ...
    @abstractmethod
    def _truncate_inode(self, inode: Inode, size: int) -> None: ...
    @abstractmethod
    def _unlink_name(self, dino: int, name: str) -> int: ...
    @abstractmethod
    def _used_inos(self) -> Iterator[int]: ...
    @abstractmethod
    def _walk(self, inode: Inode) -> Iterator[tuple[int, int, int]]: ...
    @abstractmethod
    def _write_data(
        self, inode: Inode, offset: int, data: bytes | bytearray | memoryview
    ) -> None: ...
    @abstractmethod
    def _write_dir(self, ino: int) -> None: ...
    @abstractmethod
    def _write_dirch(self) -> None: ...
    @abstractmethod
    def atomic(self, nblocks: int = 0) -> contextlib.AbstractContextManager[None]: ...
    @abstractmethod
    def clean_now(self, want: int | None = None) -> int: ...
